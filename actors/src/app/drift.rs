//! drift: how the policy followed an environment's drift, measured on the tasks a drift entry
//! applies to (the learning bench's `drift` figures).

use std::collections::BTreeMap;

use hindsight::tools::sim::SimEnv;
use serde::{Deserialize, Serialize};

/// How the policy followed the drift of the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftRecovery {
    /// The first drift point.
    pub after_task: u64,
    /// Tasks a drift entry applies to, after the drift point.
    pub affected_tasks: u64,
    /// Of those, the ones at least `recovery_tasks` after every drift point that applies.
    pub affected_after_recovery: u64,
    /// Regret ratio of the affected tasks after the recovery allowance.
    pub regret_ratio_after_recovery: f64,
    /// Mean regret of the affected tasks after the recovery allowance.
    pub mean_regret_after_recovery: f64,
    /// Regret ratio of the affected tasks during the recovery allowance.
    pub regret_ratio_during_recovery: f64,
}

/// Follows the tasks a drift entry of an environment applies to, to measure how the policy
/// recovered ([`DriftRecovery`]): those within `recovery_tasks` of a drift point that applies
/// to them count as "during recovery", the later ones as "after recovery".
#[derive(Debug, Clone)]
pub struct DriftTracker {
    /// Per drift entry: its start and its feature conditions.
    points: Vec<(u64, BTreeMap<String, String>)>,
    recovery_tasks: u64,
    affected: u64,
    /// The affected tasks during and after the recovery allowance.
    during: Acc,
    after: Acc,
}

impl DriftTracker {
    /// A tracker for `env`'s drift entries with a recovery allowance of `recovery_tasks`.
    pub fn new(env: &SimEnv, recovery_tasks: u64) -> DriftTracker {
        DriftTracker {
            points: env
                .spec()
                .drift
                .iter()
                .map(|d| (d.after_task, d.matcher.clone()))
                .collect(),
            recovery_tasks,
            affected: 0,
            during: Acc::default(),
            after: Acc::default(),
        }
    }

    /// Adds task `index` with `features`, the regret of its first plan and the random baseline's.
    pub fn add(
        &mut self,
        index: u64,
        features: &BTreeMap<String, String>,
        regret: f64,
        random_regret: f64,
    ) {
        let applying: Vec<u64> = self
            .points
            .iter()
            .filter(|(after, m)| {
                index >= *after && m.iter().all(|(k, v)| features.get(k) == Some(v))
            })
            .map(|(after, _)| *after)
            .collect();
        if applying.is_empty() {
            return;
        }
        self.affected += 1;
        let acc = if applying.iter().any(|a| index < a + self.recovery_tasks) {
            &mut self.during
        } else {
            &mut self.after
        };
        acc.add_regret(regret, random_regret);
    }

    /// The recovery figures, when the environment drifts within the first `tasks` tasks.
    pub fn finish(&self, tasks: u64) -> Option<DriftRecovery> {
        let first = self.points.iter().map(|(after, _)| *after).min()?;
        (first < tasks).then(|| DriftRecovery {
            after_task: first,
            affected_tasks: self.affected,
            affected_after_recovery: self.after.n,
            regret_ratio_after_recovery: self.after.ratio(),
            mean_regret_after_recovery: self.after.div(self.after.regret),
            regret_ratio_during_recovery: self.during.ratio(),
        })
    }
}

/// Regret sums of a set of tasks.
#[derive(Debug, Clone, Default)]
struct Acc {
    n: u64,
    regret: f64,
    random_regret: f64,
}

impl Acc {
    /// Counts a task by its regret.
    fn add_regret(&mut self, regret: f64, random_regret: f64) {
        self.n += 1;
        self.regret += regret;
        self.random_regret += random_regret;
    }

    /// The regret over the random baseline's (0 when the baseline has none).
    fn ratio(&self) -> f64 {
        if self.random_regret > 1e-12 {
            self.regret / self.random_regret
        } else {
            0.0
        }
    }

    /// `x` per task.
    fn div(&self, x: f64) -> f64 {
        if self.n == 0 { 0.0 } else { x / self.n as f64 }
    }
}
