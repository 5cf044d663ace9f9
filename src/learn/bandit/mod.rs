//! bandit: the policy: a contextual bandit over `(tool, strategy)` arms per stage that chooses a
//! whole plan (one arm per stage) to maximise the expected reward, by information-directed
//! sampling over Bayesian posteriors (or Thompson sampling), with hierarchical pooling across
//! task clusters, discounting and change detection for drift, exact propensities given its draws, and
//! snapshots that survive restarts.

mod arm;
mod beliefs;
mod choice;
mod config;
mod draws;
mod error;
mod snapshot;
mod update;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::learn::cluster::Lattice;
use crate::learn::posterior::ArmStats;
use crate::record::ArmChoice;

pub use arm::{Arm, StageArms};
pub use beliefs::Beliefs;
pub use choice::{Choice, ChosenArm, Routing};
pub(crate) use config::Tuning;
pub use config::{ChoiceRule, MAX_IDS_SAMPLES, PolicyConfig, RewardParams, prior_pseudo_count};
pub use draws::DrawTables;
pub use error::PolicyError;
pub use snapshot::{PolicySnapshot, SNAPSHOT_VERSION};
pub use update::{Observation, StageObservation, StageOutcome, UpdateSummary};

use config::check_config;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Node {
    key: String,
    visits: u64,
    arms: Vec<ArmStats>,
}

/// The predictive evidence of one hierarchy level (a set of feature names) per arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ModelEvidence {
    signature: String,
    log_evidence: Vec<f64>,
}

/// The contextual bandit policy (information-directed or Thompson sampling).
#[derive(Debug, Clone)]
pub struct Policy {
    config: PolicyConfig,
    tuning: Tuning,
    stages: Vec<StageArms>,
    /// Flat arm index of stage `s`, arm `a` = offsets[s] + a.
    offsets: Vec<usize>,
    n_arms: usize,
    arm_index: HashMap<(String, Arm), usize>,
    nodes: HashMap<u64, Node>,
    models: HashMap<u64, ModelEvidence>,
    learned: u64,
    infra_ignored: u64,
    infra_learned: u64,
    changes: u64,
    /// Changes at every change of the beliefs or the configuration (see [`DrawTables`]).
    version: u64,
}

/// A change detected on one arm at one lattice node.
#[derive(Debug, Clone, Copy)]
struct Change {
    /// The node's hash.
    node: u64,
    /// The arm's flat index.
    arm: usize,
    /// The arm's success rate at the node before the change point.
    before: f64,
    /// Its success rate since the change point.
    after: f64,
}

impl Policy {
    /// Per node of `lattice`, its cell's counts and its level's evidence (`None` where there are
    /// none yet).
    fn lattice_state(
        &self,
        lattice: &Lattice,
    ) -> (Vec<Option<&Node>>, Vec<Option<&ModelEvidence>>) {
        let found = lattice
            .nodes
            .iter()
            .map(|n| self.nodes.get(&n.hash))
            .collect();
        let models = lattice
            .nodes
            .iter()
            .map(|n| self.models.get(&n.signature))
            .collect();
        (found, models)
    }

    /// A policy with no evidence over `stages`.
    pub fn new(config: PolicyConfig, stages: Vec<StageArms>) -> Result<Policy, PolicyError> {
        check_config(&config)?;
        if stages.is_empty() {
            return Err(PolicyError::BadStages("no stage".into()));
        }
        let mut offsets = Vec::with_capacity(stages.len());
        let mut arm_index = HashMap::new();
        let mut n = 0;
        for s in &stages {
            if s.arms.is_empty() {
                return Err(PolicyError::BadStages(format!(
                    "stage `{}` has no arm",
                    s.stage
                )));
            }
            offsets.push(n);
            for (i, a) in s.arms.iter().enumerate() {
                if arm_index
                    .insert((s.stage.clone(), a.clone()), n + i)
                    .is_some()
                {
                    return Err(PolicyError::BadStages(format!(
                        "stage `{}` lists {}/{} twice",
                        s.stage, a.tool, a.strategy
                    )));
                }
            }
            n += s.arms.len();
        }
        Ok(Policy {
            config,
            tuning: Tuning::default(),
            stages,
            offsets,
            n_arms: n,
            arm_index,
            nodes: HashMap::new(),
            models: HashMap::new(),
            learned: 0,
            infra_ignored: 0,
            infra_learned: 0,
            changes: 0,
            version: draws::next_version(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Replaces the configuration and keeps the evidence (a restored snapshot takes the
    /// configuration in force now, not the one it was written under).
    pub fn set_config(&mut self, config: PolicyConfig) -> Result<(), PolicyError> {
        check_config(&config)?;
        self.config = config;
        self.version = draws::next_version();
        Ok(())
    }

    /// The stages and their arms.
    pub fn stages(&self) -> &[StageArms] {
        &self.stages
    }

    /// Stage observations learned from so far.
    pub fn learned(&self) -> u64 {
        self.learned
    }

    /// Infrastructure failures seen and ignored so far.
    pub fn infra_ignored(&self) -> u64 {
        self.infra_ignored
    }

    /// Infrastructure failures learned from (the `infra_failures_learned_from` KPI; always 0).
    pub fn infra_learned(&self) -> u64 {
        self.infra_learned
    }

    /// Changes detected so far (evidence forgotten).
    pub fn changes_detected(&self) -> u64 {
        self.changes
    }

    /// Number of plans (product of the arm counts per stage), saturating.
    pub fn plan_count(&self) -> usize {
        self.stages
            .iter()
            .fold(1usize, |acc, s| acc.saturating_mul(s.arms.len()))
    }

    /// The arms of a plan given as indices (`None` if an index is out of range).
    pub fn plan_arms(&self, plan: &[usize]) -> Option<Vec<Arm>> {
        if plan.len() != self.stages.len() {
            return None;
        }
        plan.iter()
            .zip(&self.stages)
            .map(|(&a, s)| s.arms.get(a).cloned())
            .collect()
    }

    /// The arm indices of a plan given as arms (`None` if one is unknown or a stage is missing):
    /// the inverse of [`Policy::plan_arms`].
    pub fn plan_indices(&self, plan: &[Arm]) -> Option<Vec<usize>> {
        if plan.len() != self.stages.len() {
            return None;
        }
        self.stages
            .iter()
            .zip(plan)
            .map(|(s, arm)| s.arms.iter().position(|a| a == arm))
            .collect()
    }

    /// The arm index per stage of `plan` (the arms of an SOP, say): `None` if it names an unknown
    /// stage or arm, or does not have one arm per stage in the stages' order.
    pub fn choice_indices(&self, plan: &[ArmChoice]) -> Option<Vec<usize>> {
        if plan.len() != self.stages.len() {
            return None;
        }
        plan.iter()
            .enumerate()
            .map(|(s, c)| {
                if c.stage != self.stages[s].stage {
                    return None;
                }
                let j = self.arm_index(&c.stage, &Arm::new(c.tool.clone(), c.strategy.clone()))?;
                Some(j - self.offsets[s])
            })
            .collect()
    }

    /// The flat index of `(stage, arm)`, if known.
    pub fn arm_index(&self, stage: &str, arm: &Arm) -> Option<usize> {
        self.arm_index
            .get(&(stage.to_string(), arm.clone()))
            .copied()
    }
}
