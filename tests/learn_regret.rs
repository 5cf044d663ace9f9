//! Learning on the simulated environments through the core's interpreter of the run machine (the
//! tree's decisions at one task in flight): the policy's regret against the oracle, drift
//! recovery, and that infrastructure faults are never learned from.

use std::path::PathBuf;

use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::bench::LearningBench;
use hindsight_actors::app::workload::TaskRecord;

mod common;
use common::core_learning::{learn, window_ratio};

fn env(name: &str) -> SimEnv {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("config/envs")
        .join(name);
    SimEnv::load(&path).unwrap()
}

fn run(name: &str, seed: u64, tasks: u64) -> (LearningBench, Vec<TaskRecord>) {
    let (b, records) = learn(&env(name), tasks, seed);
    let r = &b.summary;
    eprintln!(
        "{name} seed {seed}: regret_ratio {:.3} mean_reward {:.3} oracle {:.3} random {:.3} success {:.3} explore_last_100 {:.2} infra_seen {} sops {} drift {:?}",
        r.regret_ratio,
        r.mean_reward,
        r.oracle_mean_reward,
        r.random_mean_reward,
        r.success_rate,
        r.exploration_rate_last_100,
        b.infra_failures_ignored,
        b.sops_promoted,
        b.drift
    );
    (b, records)
}

/// Runs 1,000 tasks per seed and holds the policy to `bar`: the regret ratio overall, in the
/// last window, and on the drifted clusters once `recovery_tasks` (150) have passed since each
/// drift point.
fn check(name: &str, seeds: &[u64], bar: f64) {
    let reports: Vec<LearningBench> = seeds.iter().map(|&s| run(name, s, 1000).0).collect();
    for (r, &seed) in reports.iter().zip(seeds) {
        assert_eq!(r.summary.tasks, 1000);
        assert_eq!(r.infra_failures_learned_from, 0);
        assert!(
            r.infra_failures_ignored > 0,
            "{name}: the environment has faults"
        );
        assert!(
            r.summary.regret_ratio <= bar,
            "{name} seed {seed}: regret ratio {}",
            r.summary.regret_ratio
        );
        if let Some(d) = &r.drift {
            assert!(
                d.regret_ratio_after_recovery <= bar,
                "{name} seed {seed}: after the drift at {} the drifted clusters are not back near the oracle: {d:?}",
                d.after_task
            );
        }
        let last = r.summary.windows.last().unwrap();
        assert!(
            window_ratio(last) <= bar,
            "{name} seed {seed}: last window {last:?}"
        );
    }
}

// The bar (regret ratio <= 0.2, drifted clusters back near the oracle) holds on
// bank_statements, flaky_ocr and etl_pipeline (4 stages, 72 plans, 24 clusters, two drifts).
// web_research (7 search arms, 21 plans, 24 clusters, 3/8 of the traffic drifting at task 500)
// and support_triage (3 stages, 100 plans, 24 clusters, the best arm of each stage behind
// 30-35% infrastructure faults, two drifts) meet it at these seeds (0.124 and 0.116; 0.075 and
// 0.102), but a run that finds a specialist's niche late can end above it (on the tree, one run
// in eight of each at four tasks in flight): their bar below leaves that room.

#[test]
fn bank_statements_regret_and_drift_recovery() {
    check("bank_statements.toml", &[1, 2, 3], 0.2);
}

#[test]
fn flaky_ocr_infrastructure_noise_on_the_best_arm() {
    check("flaky_ocr.toml", &[1, 2, 3], 0.2);
}

#[test]
fn etl_pipeline_four_stages_two_drifts() {
    check("etl_pipeline.toml", &[1, 2], 0.2);
}

#[test]
fn web_research_many_arms() {
    check("web_research.toml", &[1, 2], 0.3);
}

#[test]
fn support_triage_three_stages_flaky_best_arms() {
    check("support_triage.toml", &[1, 2], 0.3);
}

// code_review (4 stages, 108 plans, 48 clusters, a feature that matters to nothing, and an upward
// drift: at task 700 the sandbox's smoke tests, long abandoned at 60% valid, become the best test
// arm). An arm written off is rarely tried again, so the upward drift is found late or not at
// all; its bar leaves room for that.

#[test]
fn code_review_distractor_feature_and_an_upward_drift() {
    check("code_review.toml", &[1, 2], 0.3);
}

#[test]
fn runs_are_reproducible() {
    let (_, a) = run("bank_statements.toml", 9, 200);
    let (_, b) = run("bank_statements.toml", 9, 200);
    assert_eq!(a, b);
}

/// An arm's own `RateLimit` errors (a quota cut, here from the drift on) are the arm's fault:
/// the policy learns from them and leaves the arm, while infrastructure faults stay ignored.
#[test]
fn a_quota_cut_that_fails_with_rate_limits_is_learned_from() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/envs/bank_statements.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let drift = "p_success = 0.15\nerrors = { NotFound = 1 }";
    assert!(text.contains(drift), "the bank environment's drift changed");
    let text = text.replace(drift, "p_success = 0.15\nerrors = { RateLimit = 1 }");
    let env = SimEnv::parse(&text, "bank_quota.toml").unwrap();
    for seed in [1, 2] {
        let (r, _) = learn(&env, 1000, seed);
        assert_eq!(r.infra_failures_learned_from, 0);
        let d = r.drift.unwrap();
        assert!(
            d.regret_ratio_after_recovery <= 0.2,
            "seed {seed}: the drifted clusters stay on the rate-limited arm: {d:?}"
        );
        let ratio = r.summary.regret_ratio;
        assert!(ratio <= 0.2, "seed {seed}: {ratio}");
    }
}

/// The regret splits into what the policy's greedy plans would have cost (its beliefs) and
/// what departing from them cost; the trace's per-task figures add up to the report's, and the
/// beliefs improve: the greedy plans' regret falls from the first window to the last.
#[test]
fn the_regret_splits_into_the_greedy_plans_and_the_departures() {
    for name in ["bank_statements.toml", "support_triage.toml"] {
        let (b, trace) = run(name, 1, 1000);
        let r = &b.summary;
        assert!(
            (r.greedy_regret + r.exploration_regret - r.cumulative_regret).abs() < 1e-9,
            "{name}: {} + {} != {}",
            r.greedy_regret,
            r.exploration_regret,
            r.cumulative_regret
        );
        let traced: f64 = trace.iter().map(|t| t.greedy_regret()).sum();
        assert!((traced - r.greedy_regret).abs() < 1e-9, "{name}");
        let window = |from: u64| -> f64 {
            trace
                .iter()
                .filter(|t| (from..from + 100).contains(&t.task))
                .map(|t| t.greedy_regret())
                .sum()
        };
        let (first, last) = (window(0), window(900));
        eprintln!(
            "{name}: greedy regret {:.1}, departures {:.1}; first window {first:.2}, last {last:.2}",
            r.greedy_regret, r.exploration_regret
        );
        assert!(first > 3.0 * last, "{name}: first {first}, last {last}");
    }
}
