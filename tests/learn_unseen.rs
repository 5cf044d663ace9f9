//! Learning on environments nobody tuned for: seeded random environments from
//! `examples/random_env.rs` (three to five stages, specialists, infrastructure faults on each
//! stage's best arm, a drift), run through the core learning loop. Each (environment, seed) pair
//! is deterministic, so the figures below are exact, and a change to the learner that loses
//! ground on unseen environments shows here. And bank statements with noise features added, as
//! a task's metadata often has (region, priority, channel, language): many features must not
//! cost the bar.

#[allow(dead_code)]
#[path = "../examples/random_env.rs"]
mod random_env;

use hindsight::tools::sim::SimEnv;

mod common;
use common::core_learning::learn as learn_core;

/// Runs 1,000 tasks of random environment `env_seed` with run seed 1: `(stages, regret ratio)`.
fn learn(env_seed: u64) -> (usize, f64) {
    let text = random_env::generate(env_seed);
    let env = SimEnv::parse(&text, &format!("random-{env_seed}.toml"))
        .unwrap_or_else(|e| panic!("random environment {env_seed} does not parse: {e}\n{text}"));
    let (b, _) = learn_core(&env, 1000, 1);
    let r = &b.summary;
    eprintln!(
        "random-{env_seed}: {} stages, regret ratio {:.3}, oracle {:.3}, random {:.3}",
        env.stages().len(),
        r.regret_ratio,
        r.oracle_mean_reward,
        r.random_mean_reward
    );
    assert_eq!(b.infra_failures_learned_from, 0);
    assert!(b.infra_failures_ignored > 0, "random-{env_seed} has faults");
    (env.stages().len(), r.regret_ratio)
}

#[test]
fn the_policy_learns_random_environments_it_was_never_tuned_on() {
    let results: Vec<(usize, f64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = (1..=ENVS)
            .map(|env_seed| scope.spawn(move || learn(env_seed)))
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a learning run"))
            .collect()
    });
    for (i, &(stages, ratio)) in results.iter().enumerate() {
        assert!(stages >= 3, "random-{}: {stages} stages", i + 1);
        assert!(ratio <= WORST, "random-{}: regret ratio {ratio:.3}", i + 1);
    }
    let mean = results.iter().map(|r| r.1).sum::<f64>() / results.len() as f64;
    assert!(mean <= MEAN, "mean regret ratio {mean:.3} over {results:?}");
}

/// Environments run.
const ENVS: u64 = 8;
/// No environment's regret ratio above this (the core loop's worst of these eight, seed 1, is
/// 0.153 since fallbacks take the arm with the highest upper bound, 2026-11-29; it was
/// 0.252 with information-directed sampling and its tenth of Thompson sampling's choices, the
/// default, though over seeds 1-8 the eight went 0.120 (6 of 64 runs above 0.2) -> 0.115 (4)
/// with that tenth; 0.222 with information-directed sampling alone, 0.229 with Thompson sampling and the
/// likelihood-ratio change detector; it was 0.216 with Page-Hinkley and
/// fallbacks drawn from the plain posterior, 0.198 before, 0.270 before one-stage exploration;
/// over seeds 1-8 the fallback change moved the eight's mean from 0.163 to 0.160; the core loop
/// learns less per task than the tree, which runs ReflectRetry rounds through the later stages
/// too).
const WORST: f64 = 0.26;
/// The mean regret ratio at most this (0.098 since fallbacks take the arm with the highest
/// upper bound; 0.128 with information-directed sampling, with or without
/// its tenth of Thompson sampling's choices; under Thompson
/// sampling 0.159 with the likelihood-ratio change detector, 0.167
/// with plain-posterior fallbacks, 0.146 before, 0.173 before one-stage exploration; one seed,
/// so these move by a few hundredths with any change to the random stream).
const MEAN: f64 = 0.16;

/// Bank statements with the first `noise` of four features that no arm's odds turn on.
fn bank_with_noise(noise: usize) -> SimEnv {
    const NOISE: [&str; 4] = [
        "region = { values = [\"eu\", \"us\", \"apac\"] }",
        "priority = { values = [\"low\", \"high\"] }",
        "channel = { values = [\"api\", \"web\", \"batch\"] }",
        "lang = { values = [\"en\", \"de\", \"fr\", \"es\"] }",
    ];
    let base = include_str!("../config/envs/bank_statements.toml");
    let tenant = "tenant = { values = [\"A\", \"B\"] }";
    assert!(
        base.contains(tenant),
        "bank statements has its tenant feature"
    );
    let text = base.replacen(
        tenant,
        &format!("{tenant}\n{}", NOISE[..noise].join("\n")),
        1,
    );
    SimEnv::parse(&text, &format!("bank-noise-{noise}.toml")).unwrap()
}

#[test]
fn many_features_do_not_cost_the_bar() {
    // Five to seven features in all. Before the hierarchy kept the pairs of features and
    // detected changes below the exact cluster, these went 0.28-0.30 over seeds 1-8 (seed 1,
    // two noise features: 0.260) and their drift was hardly followed: 0.33-0.40 after
    // recovery (seed 1: 0.237).
    let results: Vec<(usize, f64, f64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = (2..=4)
            .map(|noise| {
                scope.spawn(move || {
                    let env = bank_with_noise(noise);
                    let (r, _) = learn_core(&env, 1000, 1);
                    assert_eq!(r.infra_failures_learned_from, 0);
                    let drift = r.drift.map_or(f64::NAN, |d| d.regret_ratio_after_recovery);
                    (noise, r.summary.regret_ratio, drift)
                })
            })
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a learning run"))
            .collect()
    });
    for (noise, ratio, drift) in results {
        eprintln!(
            "bank statements + {noise} noise features: regret ratio {ratio:.3}, drift {drift:.3}"
        );
        assert!(ratio <= 0.2, "+{noise} features: regret ratio {ratio:.3}");
        assert!(
            drift <= 0.2,
            "+{noise} features: drifted tasks after recovery {drift:.3}"
        );
    }
}
