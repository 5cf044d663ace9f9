//! Salience-gated writes: for one experience, whether the graph and the vector index need
//! writing (novelty: a new edge or an embedding far from every existing one; material change:
//! p_success moved by more than a delta since last persisted, or n crossed a threshold). The
//! experience log itself is always written, by the caller.

use serde::{Deserialize, Serialize};

use super::graph::{Edge, GraphDelta, KnowledgeGraph};
use super::vector::{ItemKind, VectorIndex};

/// Thresholds of salience.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SalienceConfig {
    /// A BEST_WITH edge is rewritten when p_success moved by more than this.
    pub p_delta: f64,
    /// Sample sizes whose crossing makes an edge worth rewriting.
    pub n_thresholds: Vec<u64>,
    /// An embedding whose nearest neighbour of its kind is at most this similar is novel.
    pub novelty_cosine: f32,
}

impl Default for SalienceConfig {
    fn default() -> Self {
        SalienceConfig {
            p_delta: 0.05,
            n_thresholds: vec![1, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000],
            novelty_cosine: 0.92,
        }
    }
}

/// Why something is worth writing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SalienceReason {
    /// An edge that did not exist.
    NewEdge(Edge),
    /// p_success moved by more than the delta since the edge was persisted.
    PSuccessMoved {
        /// The edge.
        edge: Edge,
        /// p_success when persisted (None: never).
        from: Option<f64>,
        /// p_success now.
        to: f64,
    },
    /// The sample size crossed a threshold since the edge was persisted.
    SampleThreshold {
        /// The edge.
        edge: Edge,
        /// The threshold crossed.
        threshold: u64,
    },
    /// An embedding far from everything indexed of its kind.
    NovelEmbedding {
        /// Its kind.
        kind: ItemKind,
        /// Similarity of its nearest neighbour (None: the kind is empty).
        nearest: Option<f32>,
    },
}

/// The decision for one experience.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SalienceDecision {
    /// Write the graph (the touched edges).
    pub write_graph: bool,
    /// Write the embedding into the vector index.
    pub write_vectors: bool,
    /// Why.
    pub reasons: Vec<SalienceReason>,
    /// The edges worth writing.
    pub edges: Vec<Edge>,
}

fn crossed(thresholds: &[u64], from: u64, to: u64) -> Option<u64> {
    thresholds
        .iter()
        .copied()
        .filter(|t| from < *t && *t <= to)
        .max()
}

/// Decides which touched edges are worth persisting (the graph has already been updated by
/// [`KnowledgeGraph::apply`]; its edges remember what was last persisted).
pub fn assess_graph(
    graph: &KnowledgeGraph,
    delta: &GraphDelta,
    config: &SalienceConfig,
) -> SalienceDecision {
    let mut d = SalienceDecision::default();
    for e in &delta.created {
        if !d.edges.contains(e) {
            d.reasons.push(SalienceReason::NewEdge(e.clone()));
            d.edges.push(e.clone());
        }
    }
    for e in &delta.touched {
        if d.edges.contains(e) {
            continue;
        }
        let reason = match e {
            Edge::BestWith { cluster, strategy } => graph.arm(cluster, strategy).and_then(|a| {
                let p = a.p_success();
                match a.written_p_success {
                    None => Some(SalienceReason::PSuccessMoved {
                        edge: e.clone(),
                        from: None,
                        to: p,
                    }),
                    Some(w) if (p - w).abs() > config.p_delta => {
                        Some(SalienceReason::PSuccessMoved {
                            edge: e.clone(),
                            from: Some(w),
                            to: p,
                        })
                    }
                    _ => crossed(&config.n_thresholds, a.written_n, a.n).map(|threshold| {
                        SalienceReason::SampleThreshold {
                            edge: e.clone(),
                            threshold,
                        }
                    }),
                }
            }),
            Edge::FailsWith { tool, class } => graph
                .fails_with
                .get(tool)
                .and_then(|m| m.get(class))
                .and_then(|f| crossed(&config.n_thresholds, f.written_count, f.count))
                .map(|threshold| SalienceReason::SampleThreshold {
                    edge: e.clone(),
                    threshold,
                }),
            other => graph
                .unwritten
                .contains(other)
                .then(|| SalienceReason::NewEdge(other.clone())),
        };
        if let Some(r) = reason {
            d.reasons.push(r);
            d.edges.push(e.clone());
        }
    }
    d.write_graph = !d.edges.is_empty();
    d
}

/// Whether an embedding is novel: its nearest indexed neighbour of the same kind is at most
/// `novelty_cosine` similar (or there is none).
pub fn assess_vector(
    index: &VectorIndex,
    kind: ItemKind,
    vector: &[f32],
    config: &SalienceConfig,
) -> Option<SalienceReason> {
    let nearest = index.nearest(vector, kind).map(|(_, s)| s);
    match nearest {
        Some(s) if s > config.novelty_cosine => None,
        _ => Some(SalienceReason::NovelEmbedding { kind, nearest }),
    }
}

/// Both decisions together: graph edges, and an optional candidate embedding.
pub fn assess(
    graph: &KnowledgeGraph,
    delta: &GraphDelta,
    index: &VectorIndex,
    candidate: Option<(ItemKind, &[f32])>,
    config: &SalienceConfig,
) -> SalienceDecision {
    let mut d = assess_graph(graph, delta, config);
    if let Some((kind, v)) = candidate
        && let Some(r) = assess_vector(index, kind, v, config)
    {
        d.write_vectors = true;
        d.reasons.push(r);
    }
    d
}
