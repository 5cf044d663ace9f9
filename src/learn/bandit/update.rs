//! update: what a policy learns from (the observation of an attempt, stage by stage) and how it
//! learns it: posterior counts up the hierarchy, infrastructure faults left out, the levels'
//! evidence, and change detection with forgetting for drift.

use super::beliefs::{Cell, level_evidence};
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::learn::cluster::Lattice;
use crate::learn::drift::BernoulliGlr;
use crate::learn::posterior::ArmStats;
use crate::taxonomy::FailureCategory;

use super::{Arm, Change, ModelEvidence, Node, Policy};

/// How one stage of an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageOutcome {
    /// The tool returned and the output passed validation.
    Valid,
    /// The tool returned but validation found the output invalid.
    Invalid,
    /// The call failed; the category says whose fault (infrastructure is never learned from).
    Failed(FailureCategory),
}

/// What happened on one stage the attempt reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageObservation {
    /// The stage.
    pub stage: String,
    /// The arm used.
    pub arm: Arm,
    /// How it ended.
    pub outcome: StageOutcome,
    /// Latency of the call (ms).
    pub latency_ms: f64,
    /// Cost of the call.
    pub cost: f64,
}

/// What the orchestrator reports after an attempt (or a whole run): the task's features and one
/// entry per stage call it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The task's features.
    pub features: BTreeMap<String, String>,
    /// Per stage call, in order.
    pub stages: Vec<StageObservation>,
}

/// What an update did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateSummary {
    /// Stage observations learned from.
    pub learned: u32,
    /// Infrastructure failures ignored.
    pub infra_ignored: u32,
    /// Observations naming an unknown stage or arm (ignored).
    pub unknown_arm: u32,
    /// Changes detected (evidence forgotten) across the cluster nodes.
    pub changes_detected: u32,
}

/// The evidence a level starts with when it first appears (per arm): its lowest parent's. A
/// level with none scores 0, the best that a sum of log-likelihoods can, so a level that appears
/// late (a new feature in the tasks, a daemon restarted with a wider hierarchy) would otherwise
/// outweigh the levels that have been predicting all along until its own sum caught up.
fn new_level_evidence(
    models: &HashMap<u64, ModelEvidence>,
    lattice: &Lattice,
    i: usize,
    n_arms: usize,
) -> Vec<f64> {
    let parents: Vec<&ModelEvidence> = lattice.nodes[i]
        .parents
        .iter()
        .filter_map(|&p| models.get(&lattice.nodes[p].signature))
        .collect();
    (0..n_arms)
        .map(|j| {
            parents
                .iter()
                .filter_map(|m| m.log_evidence.get(j).copied())
                .fold(0.0, f64::min)
        })
        .collect()
}

impl Policy {
    /// Learns from an observation. Infrastructure failures never touch the posterior: they are
    /// counted and ignored. Unknown stages or arms are counted and ignored.
    pub fn update(&mut self, obs: &Observation) -> UpdateSummary {
        self.update_with(obs, true)
    }

    /// Learns the rest of a task whose first part was learned already (by [`Policy::update`]):
    /// the same as `update`, except that the task's clusters are not counted as visited again,
    /// so discounting ages the evidence once per task however its outcomes arrive.
    pub fn update_rest(&mut self, obs: &Observation) -> UpdateSummary {
        self.update_with(obs, false)
    }

    pub(super) fn update_with(&mut self, obs: &Observation, visit: bool) -> UpdateSummary {
        self.version = super::draws::next_version();
        let mut summary = UpdateSummary::default();
        let mut items: Vec<(usize, f64, f64, f64, f64)> = Vec::with_capacity(obs.stages.len());
        for so in &obs.stages {
            let weight_fail = match so.outcome {
                StageOutcome::Valid => 0.0,
                StageOutcome::Invalid | StageOutcome::Failed(FailureCategory::Strategy) => 1.0,
                StageOutcome::Failed(FailureCategory::Unknown) => self.config.unknown_weight,
                StageOutcome::Failed(FailureCategory::Infrastructure) => {
                    summary.infra_ignored += 1;
                    continue;
                }
            };
            let Some(j) = self.arm_index(&so.stage, &so.arm) else {
                summary.unknown_arm += 1;
                continue;
            };
            let x = if so.outcome == StageOutcome::Valid {
                1.0
            } else {
                0.0
            };
            if weight_fail == 0.0 && x == 0.0 {
                continue;
            }
            items.push((j, x, weight_fail, so.latency_ms, so.cost));
            summary.learned += 1;
        }
        self.infra_ignored += u64::from(summary.infra_ignored);
        if items.is_empty() {
            return summary;
        }
        let lattice = Lattice::new(&obs.features, self.tuning.full_lattice_max_features);
        let (c, t) = (self.config.clone(), self.tuning.clone());
        // Each level's predictive probability of success for each item, before this update.
        let preds: Vec<Vec<f64>> = {
            let (found, models) = self.lattice_state(&lattice);
            let mut cells = vec![Cell::default(); lattice.nodes.len()];
            let mut logw = vec![0.0; lattice.nodes.len()];
            items
                .iter()
                .map(|&(j, ..)| {
                    // Only the parents' relative weights are read here, and a cell's parents
                    // share a level: the structure prior would cancel, so it is left out.
                    level_evidence(&c, false, &lattice, &models, j, &mut logw);
                    // Every level's cells pool from their parents here, whatever
                    // `pool_from_global` says for sampling: a level is judged on which features
                    // matter for the arm, not handicapped for starting from a flat prior (which
                    // would hand the early evidence to the coarser levels, and with it the
                    // niche the arm was never tried in).
                    self.cell_posteriors(&lattice, &found, &logw, true, j, &mut cells);
                    cells.iter().map(|x| x.mean).collect()
                })
                .collect()
        };
        let mut fired: Vec<Change> = Vec::new();
        // Change detection on the finest `change_levels` levels of this lattice only: coarser
        // nodes mix clusters whose share moves as the policy learns, which would look like
        // change. Levels are counted over the node sizes the lattice has, so that a sparse
        // lattice (many features) detects at its single features and pairs too, not at the
        // exact cluster alone, which sees too few tasks to find a change in time.
        let finest = lattice.level_size(t.change_levels);
        // Levels seen for the first time start from their lowest parent's evidence as it stood
        // before this update (nothing is allocated when every level is known).
        let new_levels: Vec<(usize, Vec<f64>)> = lattice
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, ln)| !self.models.contains_key(&ln.signature))
            .map(|(i, _)| {
                (
                    i,
                    new_level_evidence(&self.models, &lattice, i, self.n_arms),
                )
            })
            .collect();
        for (i, log_evidence) in new_levels {
            let model = ModelEvidence {
                signature: lattice.signature(&obs.features, i),
                log_evidence,
            };
            self.models.insert(lattice.nodes[i].signature, model);
        }
        for (i, ln) in lattice.nodes.iter().enumerate() {
            let detect = t.change_levels > 0 && ln.mask.count_ones() >= finest;
            let n_arms = self.n_arms;
            let node = self.nodes.entry(ln.hash).or_insert_with(|| Node {
                key: lattice.key(&obs.features, i),
                visits: 0,
                arms: vec![ArmStats::default(); n_arms],
            });
            if visit || node.visits == 0 {
                node.visits += 1;
            }
            let visits = node.visits;
            let model = self
                .models
                .entry(ln.signature)
                .or_insert_with(|| ModelEvidence {
                    signature: lattice.signature(&obs.features, i),
                    log_evidence: vec![0.0; n_arms],
                });
            for (item, &(j, x, weight_fail, lat, cost)) in items.iter().enumerate() {
                let Some(a) = node.arms.get_mut(j) else {
                    continue;
                };
                a.age_to(visits, c.discount);
                // The level's predictive evidence: how well its cell predicted this outcome.
                if let Some(ev) = model.log_evidence.get_mut(j) {
                    let pred = preds[item][i];
                    let ll = if x > 0.0 {
                        pred.ln()
                    } else {
                        weight_fail * (1.0 - pred).ln()
                    };
                    *ev = *ev * t.model_discount + ll;
                }
                a.observe_recent(x, t.recent_rate);
                if detect
                    && let Some(change) = a.detector.observe(
                        x > 0.0,
                        c.change_threshold,
                        c.change_threshold_up,
                        t.change_min_obs,
                        t.change_min_before,
                    )
                {
                    fired.push(Change {
                        node: ln.hash,
                        arm: j,
                        before: change.before,
                        after: change.after(),
                    });
                    a.forget(t.change_keep_for(change.before, change.after()));
                    summary.changes_detected += 1;
                }
                if x > 0.0 {
                    a.successes += 1.0;
                } else {
                    a.failures += weight_fail;
                }
                a.observations += 1;
                a.add_latency_cost(lat, cost, t.latency_discount);
            }
        }
        for change in fired {
            self.forget_descendants(&change);
        }
        self.learned += u64::from(summary.learned);
        self.changes += u64::from(summary.changes_detected);
        summary
    }

    /// After a change on an arm at a node, the finer clusters under it forget the arm too (their
    /// own counts would otherwise outweigh the pooled evidence for a long time), except those
    /// whose recent success is still closer to the node's rate before the change than after
    /// it: a coarse node mixes clusters, and the change may be in some of them only (a tool
    /// that starts failing for one tenant keeps its evidence for the others).
    pub(super) fn forget_descendants(&mut self, change: &Change) {
        let (hash, j) = (change.node, change.arm);
        let Some(parent_key) = self.nodes.get(&hash).map(|n| n.key.clone()) else {
            return;
        };
        let parent_pairs: Vec<&str> = if parent_key == crate::learn::cluster::GLOBAL_KEY {
            Vec::new()
        } else {
            parent_key.split('|').collect()
        };
        let keep = self.tuning.change_keep_for(change.before, change.after);
        for (h, node) in self.nodes.iter_mut() {
            if *h == hash || node.key == crate::learn::cluster::GLOBAL_KEY {
                continue;
            }
            let is_descendant = parent_pairs
                .iter()
                .all(|p| node.key.split('|').any(|q| q == *p));
            if is_descendant && let Some(a) = node.arms.get_mut(j) {
                let unchanged = a.observations > 0
                    && (a.recent - change.before).abs() < (a.recent - change.after).abs();
                if unchanged {
                    continue;
                }
                a.forget(keep);
                // The change point is the parent's: this node's detector starts again now.
                a.detector = BernoulliGlr::default();
            }
        }
    }
}
