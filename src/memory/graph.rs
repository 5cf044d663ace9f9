//! The knowledge graph: cluster BEST_WITH strategy {p_success, p95_latency, n}, tool FAILS_WITH
//! error class {count}, SOP APPLIES_TO cluster, strategy USES tool, with what was last
//! persisted of each edge so that writes can be salience-gated.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::quantile::P2Quantile;
use crate::learn::reflector::RunOutcome;
use crate::record::ExperienceTuple;
use crate::taxonomy::{ErrorClass, FailureCategory};

/// Features that describe the request, not the input; left out of cluster keys.
const IGNORED_FEATURES: [&str; 1] = ["tools"];

/// The graph's cluster key of a feature map: `k=v,k=v` in key order (the `tools` feature left
/// out). Not the policy's exact cluster key ([`crate::learn::cluster::cluster_key`], which keeps
/// every feature and joins them with `|`).
pub fn graph_cluster_key(features: &BTreeMap<String, String>) -> String {
    features
        .iter()
        .filter(|(k, _)| !IGNORED_FEATURES.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The strategy node of an arm: `stage:tool/strategy`.
pub fn strategy_key(stage: &str, tool: &str, strategy: &str) -> String {
    format!("{stage}:{tool}/{strategy}")
}

/// Statistics of a BEST_WITH edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmStats {
    /// Outcomes counted (infrastructure failures excluded).
    pub n: u64,
    /// Successes.
    pub successes: u64,
    /// Streaming p95 of the arm's latency.
    pub latency: P2Quantile,
    /// `p_success` when the edge was last persisted.
    pub written_p_success: Option<f64>,
    /// `n` when the edge was last persisted.
    pub written_n: u64,
}

impl Default for ArmStats {
    fn default() -> Self {
        ArmStats {
            n: 0,
            successes: 0,
            latency: P2Quantile::p95(),
            written_p_success: None,
            written_n: 0,
        }
    }
}

impl ArmStats {
    /// Observed success rate (0 with no outcome).
    pub fn p_success(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.successes as f64 / self.n as f64
        }
    }

    /// p95 latency estimate in ms.
    pub fn p95_latency_ms(&self) -> Option<f64> {
        self.latency.estimate()
    }
}

/// Statistics of a FAILS_WITH edge.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FailStats {
    /// Failures of this class.
    pub count: u64,
    /// How many of them were infrastructure failures.
    pub infrastructure: u64,
    /// `count` when the edge was last persisted.
    pub written_count: u64,
}

/// An edge of the graph.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Edge {
    /// cluster BEST_WITH strategy.
    BestWith {
        /// The cluster key.
        cluster: String,
        /// The strategy key (`stage:tool/strategy`).
        strategy: String,
    },
    /// tool FAILS_WITH error class.
    FailsWith {
        /// The tool.
        tool: String,
        /// The class.
        class: ErrorClass,
    },
    /// SOP APPLIES_TO cluster.
    AppliesTo {
        /// The SOP.
        sop_id: String,
        /// The cluster key.
        cluster: String,
    },
    /// strategy USES tool.
    Uses {
        /// The strategy key.
        strategy: String,
        /// The tool.
        tool: String,
    },
}

/// The edges an update touched, and which of them are new.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GraphDelta {
    /// Edges touched.
    pub touched: Vec<Edge>,
    /// Edges created by this update.
    pub created: Vec<Edge>,
}

/// The knowledge graph.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KnowledgeGraph {
    /// cluster -> strategy -> stats.
    pub best_with: BTreeMap<String, BTreeMap<String, ArmStats>>,
    /// tool -> error class -> stats.
    pub fails_with: BTreeMap<String, BTreeMap<ErrorClass, FailStats>>,
    /// SOP -> clusters it applies to.
    pub applies_to: BTreeMap<String, BTreeSet<String>>,
    /// strategy -> tools it uses.
    pub uses: BTreeMap<String, BTreeSet<String>>,
    /// USES / APPLIES_TO edges not yet persisted.
    pub unwritten: BTreeSet<Edge>,
}

impl KnowledgeGraph {
    /// An empty graph.
    pub fn new() -> KnowledgeGraph {
        KnowledgeGraph::default()
    }

    /// Updates the graph with a run: per chosen arm, BEST_WITH statistics (success and
    /// latency; infrastructure failures are not counted), FAILS_WITH counts, USES edges.
    pub fn apply(&mut self, exp: &ExperienceTuple) -> GraphDelta {
        let cluster = graph_cluster_key(&exp.context_features);
        let outcome = RunOutcome::from_experience(exp);
        let mut delta = GraphDelta::default();
        for st in &outcome.stages {
            let skey = strategy_key(&st.stage, &st.tool, &st.strategy);
            let uses = Edge::Uses {
                strategy: skey.clone(),
                tool: st.tool.clone(),
            };
            if self
                .uses
                .entry(skey.clone())
                .or_default()
                .insert(st.tool.clone())
            {
                self.unwritten.insert(uses.clone());
                delta.created.push(uses.clone());
            }
            delta.touched.push(uses);
            let infra = st.category == Some(FailureCategory::Infrastructure);
            if let Some(class) = st.error_class {
                let classes = self.fails_with.entry(st.tool.clone()).or_default();
                let edge = Edge::FailsWith {
                    tool: st.tool.clone(),
                    class,
                };
                if !classes.contains_key(&class) {
                    delta.created.push(edge.clone());
                }
                let f = classes.entry(class).or_default();
                f.count += 1;
                if infra {
                    f.infrastructure += 1;
                }
                delta.touched.push(edge);
            }
            if infra {
                continue;
            }
            let latency: f64 = exp
                .steps
                .iter()
                .filter(|s| s.tool_called.as_deref() == Some(st.tool.as_str()))
                .filter(|s| {
                    s.metadata
                        .get("stage")
                        .and_then(|v| v.as_str())
                        .is_none_or(|x| x == st.stage)
                })
                .map(|s| s.latency_ms)
                .sum();
            let arms = self.best_with.entry(cluster.clone()).or_default();
            let edge = Edge::BestWith {
                cluster: cluster.clone(),
                strategy: skey.clone(),
            };
            if !arms.contains_key(&skey) {
                delta.created.push(edge.clone());
            }
            let a = arms.entry(skey).or_default();
            a.n += 1;
            if st.passed {
                a.successes += 1;
            }
            a.latency.observe(latency);
            delta.touched.push(edge);
        }
        delta
    }

    /// Links an SOP to a cluster (APPLIES_TO).
    pub fn link_sop(&mut self, sop_id: &str, cluster: &str) -> GraphDelta {
        let edge = Edge::AppliesTo {
            sop_id: sop_id.to_string(),
            cluster: cluster.to_string(),
        };
        let mut delta = GraphDelta {
            touched: vec![edge.clone()],
            created: vec![],
        };
        if self
            .applies_to
            .entry(sop_id.to_string())
            .or_default()
            .insert(cluster.to_string())
        {
            self.unwritten.insert(edge.clone());
            delta.created.push(edge);
        }
        delta
    }

    /// Removes an SOP's APPLIES_TO edges (a rolled-back SOP applies nowhere); true when it
    /// had any.
    pub fn unlink_sop(&mut self, sop_id: &str) -> bool {
        self.unwritten
            .retain(|e| !matches!(e, Edge::AppliesTo { sop_id: s, .. } if s == sop_id));
        self.applies_to.remove(sop_id).is_some()
    }

    /// The statistics of a BEST_WITH edge.
    pub fn arm(&self, cluster: &str, strategy: &str) -> Option<&ArmStats> {
        self.best_with.get(cluster).and_then(|m| m.get(strategy))
    }

    /// The cluster whose statistics describe `features` best: the exact cluster if known,
    /// else the known cluster sharing the most `k=v` pairs (ties: the larger sample).
    pub fn nearest_cluster(&self, features: &BTreeMap<String, String>) -> Option<String> {
        let exact = graph_cluster_key(features);
        if self.best_with.contains_key(&exact) {
            return Some(exact);
        }
        let want: BTreeSet<String> = exact.split(',').map(str::to_string).collect();
        self.best_with
            .iter()
            .map(|(c, arms)| {
                let overlap = c.split(',').filter(|kv| want.contains(*kv)).count();
                let n: u64 = arms.values().map(|a| a.n).sum();
                (overlap, n, c)
            })
            .filter(|(overlap, _, _)| *overlap > 0)
            .max_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(a.2)))
            .map(|(_, _, c)| c.clone())
    }

    /// The best strategy per stage of a cluster, by success rate (ties: more samples), each
    /// with its statistics, at most `k`, best first.
    pub fn best_strategies(&self, cluster: &str, k: usize) -> Vec<(String, &ArmStats)> {
        let Some(arms) = self.best_with.get(cluster) else {
            return Vec::new();
        };
        let mut per_stage: BTreeMap<&str, (&String, &ArmStats)> = BTreeMap::new();
        for (s, a) in arms {
            let stage = s.split(':').next().unwrap_or("");
            let better = per_stage.get(stage).is_none_or(|(_, b)| {
                a.p_success()
                    .total_cmp(&b.p_success())
                    .then(a.n.cmp(&b.n))
                    .is_gt()
            });
            if better {
                per_stage.insert(stage, (s, a));
            }
        }
        let mut out: Vec<(String, &ArmStats)> = per_stage
            .into_values()
            .map(|(s, a)| (s.clone(), a))
            .collect();
        out.sort_by(|a, b| {
            b.1.p_success()
                .total_cmp(&a.1.p_success())
                .then(a.0.cmp(&b.0))
        });
        out.truncate(k);
        out
    }

    /// The failure modes of a tool, most frequent first.
    pub fn failure_modes(&self, tool: &str) -> Vec<(ErrorClass, &FailStats)> {
        let mut out: Vec<(ErrorClass, &FailStats)> = self
            .fails_with
            .get(tool)
            .map(|m| m.iter().map(|(c, f)| (*c, f)).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
        out
    }

    /// Records that every edge was persisted with its current values.
    pub fn mark_all_written(&mut self) {
        for arms in self.best_with.values_mut() {
            for a in arms.values_mut() {
                a.written_p_success = Some(a.p_success());
                a.written_n = a.n;
            }
        }
        for classes in self.fails_with.values_mut() {
            for f in classes.values_mut() {
                f.written_count = f.count;
            }
        }
        self.unwritten.clear();
    }

    /// Records that the given edges were persisted with their current values.
    pub fn mark_written(&mut self, edges: &[Edge]) {
        for e in edges {
            match e {
                Edge::BestWith { cluster, strategy } => {
                    if let Some(a) = self
                        .best_with
                        .get_mut(cluster)
                        .and_then(|m| m.get_mut(strategy))
                    {
                        a.written_p_success = Some(a.p_success());
                        a.written_n = a.n;
                    }
                }
                Edge::FailsWith { tool, class } => {
                    if let Some(f) = self.fails_with.get_mut(tool).and_then(|m| m.get_mut(class)) {
                        f.written_count = f.count;
                    }
                }
                other => {
                    self.unwritten.remove(other);
                }
            }
        }
    }
}
