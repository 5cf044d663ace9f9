//! An agent through the whole tree: the simulated agent environment `support_desk` served by the
//! supervision tree, its simulated model wrapped to record every request it is sent. What the
//! runs teach (lessons in the task's scope) and what ReflectRetry says reach the model's
//! context, and every task ends once.

use std::sync::{Arc, Mutex};

use hindsight::model::{ChatRequest, LanguageModel, ModelFuture, ModelReply, TurnContext};
use hindsight::run::workflow::SIM_MODEL;
use hindsight::store::Durability;
use hindsight::tools::sim::agent::{AgentEnv, SimModel};
use hindsight_actors::runtime::{Runtime, RuntimeOptions};

/// The simulated model, recording what it is sent.
struct Recorder {
    inner: SimModel,
    seen: Arc<Mutex<Vec<ChatRequest>>>,
}

impl LanguageModel for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String> {
        self.inner.complete(request)
    }

    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(request.clone());
        }
        self.inner.turn(request, ctx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lessons_and_reflections_reach_the_model_through_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 11;
    let env = AgentEnv::load(std::path::Path::new("../config/envs/support_desk.toml"))
        .unwrap()
        .with_seed(seed);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut opts = RuntimeOptions::new(dir.path(), env.clone());
    opts.durability = Durability::None;
    opts.seed = seed;
    opts.models.insert(
        SIM_MODEL,
        Arc::new(Recorder {
            inner: env.model(),
            seen: seen.clone(),
        }),
    );
    let rt = Runtime::start(opts).await.unwrap();
    let n = 300;
    let mut passed = 0;
    for index in 0..n {
        // Lessons are kept per user (the default scope).
        let task = hindsight::Task {
            user_id: Some("desk".into()),
            ..env.task(index)
        };
        let out = rt.orchestrate(task).await.unwrap();
        assert!(out.state.is_terminal());
        passed += u64::from(out.passed);
    }
    // Every run ended, and its calls (the model's tool calls turn by turn as well as a
    // procedure's) are never repeated: the store keeps no idempotency record of them.
    let idempotency = rt.store().stats().unwrap().records("idempotency");
    assert_eq!(
        idempotency,
        Some(0),
        "idempotency records left by ended runs"
    );
    rt.shutdown().await;
    let seen = seen.lock().unwrap();
    let system = |r: &ChatRequest| r.messages[0].content.clone();
    let with_lessons = seen
        .iter()
        .filter(|r| system(r).contains("<strategy_context>"))
        .count();
    let reflected = seen
        .iter()
        .filter(|r| system(r).contains("[Reflect & Retry"))
        .count();
    println!(
        "passed {passed}/{n}; {} requests, {with_lessons} with lessons, {reflected} with a reflection",
        seen.len()
    );
    assert!(passed > n / 2, "passed {passed}/{n}");
    assert!(with_lessons > 0, "no request carried the lessons");
}
