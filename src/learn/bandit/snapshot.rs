//! snapshot: a policy's persistent state, versioned, and its restoration after a restart.

use serde::{Deserialize, Serialize};

use crate::learn::cluster::key_hash;
use crate::learn::posterior::ArmStats;

use super::{ModelEvidence, Node, Policy, PolicyConfig, PolicyError, StageArms};

/// The format version of [`PolicySnapshot`] this build writes and reads (2: the configuration
/// is stored as JSON text; 3: the change detector is a likelihood-ratio test).
pub const SNAPSHOT_VERSION: u32 = 3;

/// The persistent state of a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySnapshot {
    /// Format version ([`SNAPSHOT_VERSION`]).
    pub version: u32,
    /// The configuration it was written under (JSON text). A restored policy runs under the
    /// configuration in force, so one written by another build (a setting since removed or
    /// renamed) reads as the defaults rather than making the evidence unreadable.
    #[serde(
        serialize_with = "crate::store::envelope::as_json::serialize",
        deserialize_with = "written_config"
    )]
    pub config: PolicyConfig,
    /// The stages and their arms.
    pub stages: Vec<StageArms>,
    /// Per cluster node: key, visits, per-arm evidence (flat arm order).
    pub nodes: Vec<(String, u64, Vec<ArmStats>)>,
    /// Per hierarchy level (its feature names): per-arm log predictive evidence.
    pub levels: Vec<(String, Vec<f64>)>,
    /// Stage observations learned from.
    pub learned: u64,
    /// Infrastructure failures ignored.
    pub infra_ignored: u64,
    /// Infrastructure failures learned from (always 0; kept as a checked KPI).
    pub infra_learned: u64,
    /// Changes detected.
    pub changes: u64,
}

impl Policy {
    /// The persistent state (serde).
    pub fn snapshot(&self) -> PolicySnapshot {
        let mut nodes: Vec<(String, u64, Vec<ArmStats>)> = self
            .nodes
            .values()
            .map(|n| (n.key.clone(), n.visits, n.arms.clone()))
            .collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut levels: Vec<(String, Vec<f64>)> = self
            .models
            .values()
            .map(|m| (m.signature.clone(), m.log_evidence.clone()))
            .collect();
        levels.sort_by(|a, b| a.0.cmp(&b.0));
        PolicySnapshot {
            levels,
            version: SNAPSHOT_VERSION,
            config: self.config.clone(),
            stages: self.stages.clone(),
            nodes,
            learned: self.learned,
            infra_ignored: self.infra_ignored,
            infra_learned: self.infra_learned,
            changes: self.changes,
        }
    }

    /// A policy from a snapshot.
    pub fn restore(snapshot: PolicySnapshot) -> Result<Policy, PolicyError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(PolicyError::BadSnapshot(format!(
                "version {} (expected {SNAPSHOT_VERSION})",
                snapshot.version
            )));
        }
        let mut p = Policy::new(snapshot.config, snapshot.stages)?;
        for (key, visits, arms) in snapshot.nodes {
            if arms.len() != p.n_arms {
                return Err(PolicyError::BadSnapshot(format!(
                    "node `{key}` has {} arms, the stages have {}",
                    arms.len(),
                    p.n_arms
                )));
            }
            p.nodes.insert(key_hash(&key), Node { key, visits, arms });
        }
        for (signature, log_evidence) in snapshot.levels {
            if log_evidence.len() != p.n_arms {
                return Err(PolicyError::BadSnapshot(format!(
                    "level `{signature}` has {} arms, the stages have {}",
                    log_evidence.len(),
                    p.n_arms
                )));
            }
            p.models.insert(
                key_hash(&signature),
                ModelEvidence {
                    signature,
                    log_evidence,
                },
            );
        }
        p.learned = snapshot.learned;
        p.infra_ignored = snapshot.infra_ignored;
        p.infra_learned = snapshot.infra_learned;
        p.changes = snapshot.changes;
        Ok(p)
    }
}

/// The configuration a snapshot was written under, or the defaults when this build cannot read
/// it (see [`PolicySnapshot::config`]).
fn written_config<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PolicyConfig, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    Ok(serde_json::from_str(&text).unwrap_or_default())
}
