//! Shared by the correction tests: 60 support-desk tasks of user `u` (the scope's failure
//! evidence), then the file's right correction from an operator.

use hindsight::Task;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::Runtime;
use hindsight_actors::reflector::{FeedbackRefused, ReflectorMsg};

/// The support desk's right correction.
pub const RIGHT: &str = "For pro customers, list_invoices needs since set to the start of the year";

/// User `u`'s task `i` of `env`.
pub fn task(env: &AgentEnv, i: u64) -> Task {
    Task {
        user_id: Some("u".into()),
        ..env.task(i)
    }
}

/// Runs 60 tasks of user `u` through `rt`, then submits [`RIGHT`] about `list_invoices`.
pub async fn run_and_correct(
    rt: &Runtime,
    env: &AgentEnv,
) -> Result<hindsight::Lesson, FeedbackRefused> {
    for i in 0..60 {
        rt.orchestrate(task(env, i)).await.unwrap();
    }
    rt.ctx()
        .dir
        .reflector
        .call(|reply| ReflectorMsg::Feedback {
            principal: Some("operator".into()),
            scope_of: Box::new(task(env, 60)),
            tool: Some("list_invoices".into()),
            text: RIGHT.into(),
            run_id: None,
            reply,
        })
        .await
        .unwrap()
}
