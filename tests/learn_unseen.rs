//! Learning on environments nobody tuned for: seeded random environments from
//! `examples/random_env.rs` (three to five stages, specialists, infrastructure faults on each
//! stage's best arm, a drift), run through the core learning loop. Each (environment, seed) pair
//! is deterministic, so the figures below are exact, and a change to the learner that loses
//! ground on unseen environments shows here.

#[allow(dead_code)]
#[path = "../examples/random_env.rs"]
mod random_env;

use hindsight::learn::PolicyConfig;
use hindsight::learn::sim_run::run_learning;
use hindsight::tools::sim::SimEnv;

/// Runs 1,000 tasks of random environment `env_seed` with run seed 1: `(stages, regret ratio)`.
fn learn(env_seed: u64) -> (usize, f64) {
    let text = random_env::generate(env_seed);
    let env = SimEnv::parse(&text, &format!("random-{env_seed}.toml"))
        .unwrap_or_else(|e| panic!("random environment {env_seed} does not parse: {e}\n{text}"));
    let r = run_learning(&env, PolicyConfig::default(), 1000, 1).unwrap();
    eprintln!(
        "random-{env_seed}: {} stages, regret ratio {:.3}, oracle {:.3}, random {:.3}",
        env.stages().len(),
        r.regret_ratio,
        r.oracle_mean_reward,
        r.random_mean_reward
    );
    assert_eq!(r.infra_failures_learned_from, 0);
    assert!(r.infra_failures_seen > 0, "random-{env_seed} has faults");
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
/// 0.252 with information-directed sampling and its tenth of Thompson sampling's choices, the
/// default, though over seeds 1-8 the eight went 0.120 (6 of 64 runs above 0.2) -> 0.115 (4)
/// with that tenth; 0.222 with information-directed sampling alone, 0.229 with Thompson sampling and the
/// likelihood-ratio change detector; it was 0.216 with Page-Hinkley and
/// fallbacks drawn from the plain posterior, 0.198 before, 0.270 before one-stage exploration;
/// over seeds 1-8 the fallback change moved the eight's mean from 0.163 to 0.160; the core loop
/// learns less per task than the tree, which runs ReflectRetry rounds through the later stages
/// too).
const WORST: f64 = 0.26;
/// The mean regret ratio at most this (0.128 with information-directed sampling, with or without
/// its tenth of Thompson sampling's choices; under Thompson
/// sampling 0.159 with the likelihood-ratio change detector, 0.167
/// with plain-posterior fallbacks, 0.146 before, 0.173 before one-stage exploration; one seed,
/// so these move by a few hundredths with any change to the random stream).
const MEAN: f64 = 0.16;
