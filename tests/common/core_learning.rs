//! Runs a simulated environment's tasks through the core's interpreter of the run machine (what
//! `hindsight bench learning --engine core` runs), for the learning tests.

use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::bench::{self, Engine, LearningBench, LearningPlan};
use hindsight_actors::app::workload::{TaskRecord, Window};

/// `tasks` tasks of `env` on seed `seed`, learned from nothing with the embedded defaults.
pub fn learn(env: &SimEnv, tasks: u64, seed: u64) -> (LearningBench, Vec<TaskRecord>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plan = LearningPlan {
        tasks,
        seed,
        concurrency: 1,
        engine: Engine::Core,
        keep: None,
        settings: None,
    };
    rt.block_on(bench::learning(env, plan))
        .unwrap_or_else(|e| panic!("{}: {e}", env.name()))
}

/// A window's regret ratio: the chosen plans' regret over the random baseline's.
pub fn window_ratio(w: &Window) -> f64 {
    let random = w.oracle_mean_reward - w.random_mean_reward;
    if random > 1e-12 {
        (w.oracle_mean_reward - w.chosen_expected_reward) / random
    } else {
        0.0
    }
}
