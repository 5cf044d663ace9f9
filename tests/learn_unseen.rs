//! Learning on environments nobody tuned for: seeded random environments from
//! `examples/random_env.rs` (three to five stages, specialists, infrastructure faults on each
//! stage's best arm, a drift), run on the core's interpreter of the run machine (the tree's
//! decisions at one task in flight). Each (environment, seed) pair
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
/// No environment's regret ratio above this (the worst of these eight at seed 1: random-6,
/// 0.162).
const WORST: f64 = 0.22;
/// The mean regret ratio at most this (0.082 at seed 1; one seed, so it moves by a few
/// hundredths with any change to the random stream).
const MEAN: f64 = 0.12;

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
