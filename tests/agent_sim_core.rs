//! An agent stage on a simulated agent environment (`config/envs/support_desk.toml`), run by the
//! core's interpreter: the simulated model calls the simulated tools through the run machine's
//! loop, and what the runs record agrees with the environment's own validation.

use std::sync::Arc;

use hindsight::FailureType;
use hindsight::config::ReflectRetryConfig;
use hindsight::learn::bandit::PolicyConfig;
use hindsight::learn::distill::{DistillConfig, Distiller};
use hindsight::learn::ope::{LogRecord, Objective, log_for};
use hindsight::learn::planner::Planner;
use hindsight::learn::sop::{SopBook, SopConfig};
use hindsight::model::Models;
use hindsight::run::local::LocalRunner;
use hindsight::run::workflow::SIM_MODEL;
use hindsight::run::{RunRules, Workflow, default_validator};
use hindsight::tools::sim::agent::AgentEnv;
use hindsight::tools::{ToolRegistry, ToolRunner, VirtualClock};

fn runner(env: &AgentEnv, seed: u64) -> LocalRunner {
    runner_distilling(env, seed, DistillConfig::default())
}

fn runner_distilling(env: &AgentEnv, seed: u64, distill: DistillConfig) -> LocalRunner {
    let mut registry = ToolRegistry::new();
    for tool in env.tools() {
        registry.register(tool).unwrap();
    }
    let registry = Arc::new(registry);
    let workflow = Arc::new(Workflow::from_agent_env(env, &registry).unwrap());
    let planner = Planner::new(
        workflow.policy(PolicyConfig::default()).unwrap(),
        SopBook::new(SopConfig::default()),
        Distiller::new(distill),
        0,
        Default::default(),
        Default::default(),
        seed,
    );
    let rules = RunRules::default().for_workflow(&workflow);
    LocalRunner::new(
        workflow,
        ToolRunner::new(registry, Arc::new(VirtualClock::new()), seed),
        rules,
        planner,
        ReflectRetryConfig::default(),
        default_validator(),
    )
    .with_models(Models::new().with(SIM_MODEL, Arc::new(env.model())))
}

#[tokio::test]
async fn the_simulated_model_works_through_the_run_machine() {
    let env = AgentEnv::load(std::path::Path::new("config/envs/support_desk.toml"))
        .unwrap()
        .with_seed(3);
    let mut runner = runner(&env, 3);
    let (mut passed, mut first_try, mut agree) = (0, 0, 0);
    let mut failures = std::collections::BTreeMap::<FailureType, u32>::new();
    let n = 200;
    for index in 0..n {
        let task = env.task(index);
        let out = runner.run(task).await.unwrap();
        if out.passed {
            passed += 1;
            let answer = out
                .output
                .as_ref()
                .and_then(|o| o["agent"]["answer"].as_str());
            if env.validate(index, answer.unwrap_or("")).is_ok() {
                agree += 1;
            }
        }
        if out.passed && out.attempts == 1 {
            first_try += 1;
        }
        assert!(out.state.is_terminal());
        for r in &out.recoveries {
            *failures.entry(r.failure).or_default() += 1;
        }
    }
    println!(
        "passed {passed}/{n}, first try {first_try} (oracle {:.3}), recoveries {failures:?}",
        env.oracle_first_try_success()
    );
    // What the run machine calls a pass is what the environment calls one.
    assert_eq!(agree, passed);
    assert!(passed > n / 2, "passed {passed}/{n}");
    // The simulated model's quirks are found in its trajectories and recovered from.
    assert!(
        failures.contains_key(&FailureType::LoopDetected),
        "{failures:?}"
    );
    let steps = &runner.experiences()[0].steps;
    assert!(steps.iter().any(|s| s.action == "model_turn"));
    assert!(steps.iter().any(|s| s.action == "tool_call"));
}

/// The ranker's fit reads the experience log the first time only: from then on it fits on the
/// planner's window, which holds exactly the records a read of the log's newest rows gives.
#[tokio::test]
async fn the_rankers_fit_reads_the_log_once_then_fits_on_the_planners_window() {
    let env = AgentEnv::load(std::path::Path::new("config/envs/support_desk.toml"))
        .unwrap()
        .with_seed(5);
    let window = 90;
    let distill = DistillConfig {
        every: 30,
        window,
        min_rows: 30,
        ..DistillConfig::default()
    };
    let mut runner = runner_distilling(&env, 5, distill);
    let first = runner.planner().refit_job();
    assert_eq!(
        first.reads_from(),
        Some(0),
        "nothing was fitted yet: the log is read"
    );
    for index in 0..240 {
        runner.run(env.task(index)).await.unwrap();
    }
    let planner = runner.planner();
    assert!(
        planner.distiller.fits >= 5,
        "fits: {}",
        planner.distiller.fits
    );
    assert_eq!(planner.refit_job().reads_from(), None);
    let from = planner.watermark() - window as u64;
    let log = runner.experiences();
    let read = log_for(
        &log[from as usize..],
        Objective::FirstAttempt,
        &planner.policy.config().reward,
    )
    .0;
    let kept: Vec<LogRecord> = planner
        .fit_window()
        .after(from)
        .iter()
        .map(|r| LogRecord::clone(r))
        .collect();
    assert!(!read.is_empty());
    assert_eq!(kept, read);
    // Nothing older than the fit's window is kept.
    assert_eq!(planner.fit_window().after(0).len(), read.len());
}
