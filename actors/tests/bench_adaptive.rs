//! `hindsight bench adaptive` through the whole tree: lessons cut repeated errors against the
//! same run with lessons ablated, a poisoned correction is refused, infrastructure faults teach
//! nothing, and switching corrections off refuses them at the reflector.

use hindsight::learn::Mechanism;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::app::adaptive::{AdaptivePlan, adaptive};

fn support_desk() -> AgentEnv {
    AgentEnv::load(std::path::Path::new("../config/envs/support_desk.toml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lessons_cut_repeated_errors_against_their_ablation() {
    let plan = AdaptivePlan {
        tasks: 400,
        seed: 3,
        ablate: Some(Mechanism::Lessons),
    };
    let b = adaptive(&support_desk(), plan).await.unwrap();
    let on = &b.figures;
    let off = b.ablated.as_ref().unwrap();
    println!("{}", serde_json::to_string_pretty(&b).unwrap());
    assert!(
        on.lessons > off.lessons,
        "{} vs {}",
        on.lessons,
        off.lessons
    );
    assert!(
        on.repeat_error_rate < 0.6 * off.repeat_error_rate,
        "repeat error rate {} with lessons, {} without",
        on.repeat_error_rate,
        off.repeat_error_rate
    );
    assert!(on.lessons_injected_per_run > off.lessons_injected_per_run);
    assert_eq!(on.infra_failures_learned_from, 0);
    assert_eq!(off.infra_failures_learned_from, 0);
    // Before task 300 the file sends a right correction (task 150) and a poisoned one.
    assert_eq!(on.corrections_submitted, 2);
    assert_eq!(on.right_corrections_accepted, 1);
    assert_eq!(on.poisoned_corrections_accepted, 0);
    assert!((on.oracle_first_try_success - 0.922).abs() < 0.01);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrections_switched_off_are_refused_by_the_reflector() {
    let plan = AdaptivePlan {
        tasks: 200,
        seed: 3,
        ablate: Some(Mechanism::Corrections),
    };
    let b = adaptive(&support_desk(), plan).await.unwrap();
    let off = b.ablated.as_ref().unwrap();
    assert_eq!(b.figures.right_corrections_accepted, 1);
    assert_eq!(off.corrections_submitted, 1);
    assert_eq!(
        off.right_corrections_accepted + off.poisoned_corrections_accepted,
        0
    );
}

/// Procedures from the agent's trajectories: where one was promoted, a run through it needs no
/// model turn at all (the sim's answers agree on a template), passes as often as the model's
/// own runs there, and switching SOPs off proposes none. (1,000 tasks: a promotion needs its
/// trials and its baseline's; in 600 tasks three or four seeds of six promote one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_procedures_replace_the_model_at_no_loss_of_success() {
    let plan = AdaptivePlan {
        tasks: 1000,
        seed: 1,
        ablate: Some(Mechanism::Sops),
    };
    let b = adaptive(&support_desk(), plan).await.unwrap();
    let (on, off) = (&b.figures, b.ablated.as_ref().unwrap());
    let p = &on.procedures;
    println!("{}", serde_json::to_string_pretty(&b).unwrap());
    assert!(p.promoted >= 1 && p.sop_runs > 0, "{p:?}");
    assert!(
        p.model_calls_per_task_sop <= 0.5 * p.model_calls_per_task_model,
        "{p:?}"
    );
    assert!(p.success_rate_sop >= p.success_rate_model, "{p:?}");
    assert!(
        p.first_try_success_sop >= p.first_try_success_model,
        "{p:?}"
    );
    assert!(on.sop_coverage_last_100 > 0.0);
    assert!(on.model_calls_per_task < off.model_calls_per_task);
    assert_eq!(off.procedures.proposed, 0);
    assert_eq!(off.sop_coverage_last_100, 0.0);
}

/// The lessons the tree learns on the ops runbook: each about a tool (an answer the validator
/// refused is no tool's failure), one per cause, each with the condition its failures share
/// and no chance one, and the timeouts whose message asks for another argument learned like
/// any other refusal (infrastructure timeouts still teach nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_learns_one_lesson_per_cause_under_its_true_condition() {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use hindsight::Task;
    use hindsight::run::workflow::SIM_MODEL;
    use hindsight::store::Durability;
    use hindsight_actors::app::adaptive::BENCH_USER;
    use hindsight_actors::reflector::ReflectorMsg;
    use hindsight_actors::runtime::{Runtime, RuntimeOptions};

    let env = AgentEnv::load(std::path::Path::new("../config/envs/ops_runbook.toml"))
        .unwrap()
        .with_seed(1);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = RuntimeOptions::new(dir.path(), env.clone());
    opts.durability = Durability::None;
    opts.seed = 1;
    opts.models.insert(SIM_MODEL, Arc::new(env.model()));
    let rt = Runtime::start(opts).await.unwrap();
    for index in 0..300 {
        let task = Task {
            user_id: Some(BENCH_USER.into()),
            ..env.task(index)
        };
        rt.orchestrate(task).await.unwrap();
    }
    let lessons = rt
        .ctx()
        .dir
        .reflector
        .call(|reply| ReflectorMsg::Lessons {
            scope_prefix: Some(format!("user:{BENCH_USER}")),
            reply,
        })
        .await
        .unwrap();
    rt.shutdown().await;
    let learned: BTreeMap<String, BTreeMap<String, String>> = lessons
        .iter()
        .filter(|l| l.source == "synthesis" && l.superseded_by.is_none())
        .map(|l| (l.tool.clone().unwrap_or_default(), l.preconditions.clone()))
        .collect();
    let count = lessons
        .iter()
        .filter(|l| l.source == "synthesis" && l.superseded_by.is_none())
        .count();
    println!("{learned:?}");
    assert_eq!(count, learned.len(), "one lesson per tool: {lessons:#?}");
    assert!(!learned.contains_key(""), "{learned:?}");
    let condition = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        learned.get("list_files"),
        Some(&condition(&[("host_class", "legacy")])),
        "a timeout asking for recursive=false, on legacy hosts only: {learned:?}"
    );
    assert_eq!(learned.get("compress_file"), Some(&condition(&[])));
}
