//! Tests of the policy: choices, updates, pooling, drift, snapshots; the helpers they share.

mod choices;
mod drift;
mod learning;
mod niches;

use std::collections::BTreeMap;

use crate::taxonomy::FailureCategory;

use super::*;

fn feats(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One stage's outcome (valid, or a strategy failure) as an observation.
fn stage_obs(
    features: BTreeMap<String, String>,
    stage: &str,
    arm: Arm,
    ok: bool,
    latency_ms: f64,
    cost: f64,
) -> Observation {
    Observation {
        features,
        stages: vec![StageObservation {
            stage: stage.into(),
            arm,
            outcome: if ok {
                StageOutcome::Valid
            } else {
                StageOutcome::Failed(FailureCategory::Strategy)
            },
            latency_ms,
            cost,
        }],
    }
}

/// `n` stages `s0..` of `m` arms `t0/x..` each.
fn uniform_stages(n: usize, m: usize) -> Vec<StageArms> {
    (0..n)
        .map(|s| StageArms {
            stage: format!("s{s}"),
            arms: (0..m).map(|a| Arm::new(format!("t{a}"), "x")).collect(),
        })
        .collect()
}

/// One outcome of `arm` at a "search" stage (1 s, cost 0.005).
/// The share of 4,000 choices (seeded) for `features` that are `plan`.
fn draw_share(p: &Policy, features: &BTreeMap<String, String>, plan: &[usize], seed: u64) -> f64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    p.plan_distribution(features, 4000, &mut rng)
        .into_iter()
        .find(|(chosen, _)| chosen.as_slice() == plan)
        .map_or(0.0, |(_, share)| share)
}

/// The share of 4,000 fallbacks (seeded) for `features`, after arm 0 of stage 0 failed, that
/// are `arm`.
fn fallback_share(p: &Policy, features: &BTreeMap<String, String>, arm: usize, seed: u64) -> f64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let draws = 4000;
    let hits = (0..draws)
        .filter(|_| p.fallback(features, 0, &[0], &mut rng) == Some(arm))
        .count();
    hits as f64 / draws as f64
}

/// One "search" stage whose arms are `tools`, each with strategy "x".
fn search_stage(tools: &[&str]) -> Vec<StageArms> {
    vec![StageArms {
        stage: "search".into(),
        arms: tools.iter().map(|t| Arm::new(*t, "x")).collect(),
    }]
}

fn search_obs(p: &mut Policy, features: &BTreeMap<String, String>, arm: Arm, ok: bool) {
    p.update(&stage_obs(
        features.clone(),
        "search",
        arm,
        ok,
        1000.0,
        0.005,
    ));
}

/// Teaches `arm` (strategy "x") `successes` and `failures` in `features`, the successes
/// spread evenly (a run of failures would be a change).
fn search_spread(
    p: &mut Policy,
    features: &BTreeMap<String, String>,
    arm: &str,
    successes: usize,
    failures: usize,
) {
    let n = successes + failures;
    for i in 0..n {
        let ok = (i + 1) * successes / n > i * successes / n;
        search_obs(p, features, Arm::new(arm, "x"), ok);
    }
}

/// The default configuration with Thompson sampling instead of information-directed
/// sampling: for the tests of how broad the draws are (a rare cell's, after a few unlucky
/// tries), which information-directed sampling reads through its regret as well (an arm
/// far behind gets no first attempts there, however broad its posterior).
fn thompson() -> PolicyConfig {
    PolicyConfig {
        choice: ChoiceRule::Thompson,
        ..PolicyConfig::default()
    }
}

/// Information-directed sampling alone (no share of Thompson sampling).
fn ids_alone() -> PolicyConfig {
    PolicyConfig {
        choice: ChoiceRule::InformationDirected {
            samples: 32,
            thompson_share: 0.0,
        },
        ..PolicyConfig::default()
    }
}

/// A policy over `stages` with `config` and the tuning `tune` leaves it.
fn tuned(config: PolicyConfig, stages: Vec<StageArms>, tune: impl FnOnce(&mut Tuning)) -> Policy {
    let mut p = Policy::new(config, stages).expect("a valid policy");
    tune(&mut p.tuning);
    p
}

/// A policy over "good" and "poor" (strategy "x") that saw `rounds` tasks of each in a
/// busy cell (good succeeding 90% of the time, poor 50%), then one success of good in a
/// rare cell; with the rare cell's features.
fn rare_cell_policy(
    config: PolicyConfig,
    tune: impl FnOnce(&mut Tuning),
    rounds: usize,
) -> (Policy, BTreeMap<String, String>) {
    let busy = feats(&[("kind", "common")]);
    let rare = feats(&[("kind", "rare")]);
    rare_cell_policy_in(config, tune, rounds, busy, rare)
}

/// [`rare_cell_policy`] with the busy and the rare cell's features given.
fn rare_cell_policy_in(
    config: PolicyConfig,
    tune: impl FnOnce(&mut Tuning),
    rounds: usize,
    busy: BTreeMap<String, String>,
    rare: BTreeMap<String, String>,
) -> (Policy, BTreeMap<String, String>) {
    let stages = search_stage(&["good", "poor"]);
    let mut p = tuned(config, stages, tune);
    for i in 0..rounds {
        search_obs(&mut p, &busy, Arm::new("good", "x"), i % 10 != 0);
        search_obs(&mut p, &busy, Arm::new("poor", "x"), i % 2 == 0);
    }
    search_obs(&mut p, &rare, Arm::new("good", "x"), true);
    (p, rare)
}

/// Stage 1: "cheap" (p 0.9, fast, cheap) vs "premium" (p 0.99, slow, expensive);
/// stage 2: "a" (p 0.95) vs "b" (p 0.6).
fn policy() -> Policy {
    Policy::new(
        PolicyConfig::default(),
        vec![
            StageArms {
                stage: "extract".into(),
                arms: vec![Arm::new("cheap", "x"), Arm::new("premium", "x")],
            },
            StageArms {
                stage: "normalize".into(),
                arms: vec![Arm::new("a", "s"), Arm::new("b", "s")],
            },
        ],
    )
    .unwrap()
}

fn simulate(p: &mut Policy, f: &BTreeMap<String, String>, rng: &mut fastrand::Rng) -> Choice {
    let c = p.choose(f, rng);
    let truth = [
        [(0.9, 400.0, 0.001), (0.99, 12000.0, 0.08)],
        [(0.95, 200.0, 0.001), (0.6, 200.0, 0.001)],
    ];
    let mut stages = Vec::new();
    for (s, &a) in c.indices.iter().enumerate() {
        let (ps, lat, cost) = truth[s][a];
        let outcome = if rng.f64() < 0.1 {
            StageOutcome::Failed(FailureCategory::Infrastructure)
        } else if rng.f64() < ps {
            StageOutcome::Valid
        } else {
            StageOutcome::Failed(FailureCategory::Strategy)
        };
        stages.push(StageObservation {
            stage: p.stages()[s].stage.clone(),
            arm: p.stages()[s].arms[a].clone(),
            outcome,
            latency_ms: lat,
            cost,
        });
    }
    p.update(&Observation {
        features: f.clone(),
        stages,
    });
    c
}
