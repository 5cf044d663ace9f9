//! Learning on environments written independently of the learner and of `random_env`: the
//! sixteen files of `tests/fixtures/grader/`, written by `scripts/grader_envs.py 1 16` from the
//! words of the learning issue (2-4 features, 3-5 stages of 5-10 arms with one-value niches and
//! weaknesses, each stage's best arm at `p_infra` 0.3-0.6, one drift at task 600), run on the
//! core's interpreter of the run machine (the tree's decisions at one task in flight). Each run
//! is deterministic, so the figures below are exact, and a change to the learner that loses
//! ground on this family shows here.

use std::path::PathBuf;

use hindsight::tools::sim::SimEnv;

mod common;
use common::core_learning::learn as learn_core;

/// Files run (`g1.toml` ..).
const FILES: usize = 16;
/// The mean regret ratio at most this (0.159 at seed 1, 5 of 16 above 0.2).
const MEAN: f64 = 0.20;
/// No file's regret ratio above this (the worst at seed 1: g12, 0.253; g7 0.251: five stages
/// of close arms, where a learner told which features matter measured 0.16-0.26).
const WORST: f64 = 0.30;
/// The mean regret ratio of the drifted tasks after the recovery allowance at most this (0.120
/// at seed 1; the slow ones are drifts on a value seen one task in seven: g5 0.562, g12 0.252).
const DRIFT_MEAN: f64 = 0.15;

/// Runs 1,000 tasks of fixture `g{i}` with run seed 1: `(regret ratio, drift after recovery)`.
fn learn(i: usize) -> (f64, f64) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/grader/g{i}.toml"));
    let env = SimEnv::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (r, _) = learn_core(&env, 1000, 1);
    let drift = r
        .drift
        .map(|d| d.regret_ratio_after_recovery)
        .unwrap_or_else(|| panic!("g{i} has a drift, so the run reports it"));
    eprintln!(
        "g{i}: regret ratio {:.3}, drifted tasks after recovery {drift:.3}",
        r.summary.regret_ratio
    );
    assert_eq!(
        r.infra_failures_learned_from, 0,
        "g{i} learned from an infrastructure fault"
    );
    assert!(
        r.infra_failures_ignored > 0,
        "g{i} has faults on its best arms"
    );
    (r.summary.regret_ratio, drift)
}

#[test]
fn the_policy_learns_an_independently_written_family() {
    let results: Vec<(f64, f64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = (1..=FILES).map(|i| scope.spawn(move || learn(i))).collect();
        runs.into_iter()
            .map(|h| h.join().expect("a learning run"))
            .collect()
    });
    for (i, &(ratio, _)) in results.iter().enumerate() {
        assert!(ratio <= WORST, "g{}: regret ratio {ratio:.3}", i + 1);
    }
    let n = results.len() as f64;
    let mean = results.iter().map(|r| r.0).sum::<f64>() / n;
    let drift = results.iter().map(|r| r.1).sum::<f64>() / n;
    assert!(mean <= MEAN, "mean regret ratio {mean:.3} over {results:?}");
    assert!(
        drift <= DRIFT_MEAN,
        "mean drift after recovery {drift:.3} over {results:?}"
    );
}
