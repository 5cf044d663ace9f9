//! Triangulated retrieval: one deduplicated bundle for a task from the vector index (lessons,
//! SOPs, postmortems by similarity), the graph (best strategies and failure modes of the task's
//! cluster) and recent diary notes, with a citation on every item.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::graph::KnowledgeGraph;
use super::vector::{ItemKind, Scopes, VectorIndex, VectorItem};
use crate::model::cosine;
use crate::record::DiaryEntry;

/// What a bundle item comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CitationKind {
    /// A lesson of the vector index.
    Lesson,
    /// An SOP of the vector index.
    Sop,
    /// A postmortem of the vector index.
    Postmortem,
    /// A BEST_WITH edge of the graph.
    Strategy,
    /// A FAILS_WITH edge of the graph.
    FailureMode,
    /// A diary entry.
    Diary,
}

impl From<ItemKind> for CitationKind {
    fn from(k: ItemKind) -> Self {
        match k {
            ItemKind::Lesson => CitationKind::Lesson,
            ItemKind::Sop => CitationKind::Sop,
            ItemKind::Postmortem => CitationKind::Postmortem,
        }
    }
}

/// Where an item came from and how strongly it was retrieved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    /// The source kind.
    pub kind: CitationKind,
    /// The source id (lesson id, SOP id, `cluster|strategy`, `tool|class`, diary seq).
    pub id: String,
    /// The retrieval score (cosine, p_success, failure share or recency).
    pub score: f64,
}

/// One item of a bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleItem {
    /// What it says.
    pub text: String,
    /// Where it came from.
    pub citation: Citation,
}

/// The retrieval bundle for one task.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Bundle {
    /// The cluster whose graph statistics were used, if any.
    pub cluster: Option<String>,
    /// The items, grouped by kind in the order lessons/SOPs/postmortems, strategies, failure
    /// modes, diary; each group best first.
    pub items: Vec<BundleItem>,
}

impl Bundle {
    /// The items of one kind.
    pub fn of_kind(&self, kind: CitationKind) -> impl Iterator<Item = &BundleItem> {
        self.items.iter().filter(move |i| i.citation.kind == kind)
    }
}

/// What a task brings to retrieval.
#[derive(Debug, Clone, Copy)]
pub struct RetrievalQuery<'a> {
    /// The task's features.
    pub features: &'a BTreeMap<String, String>,
    /// The embedding of the task (goal and features) by the index's embedder.
    pub vector: &'a [f32],
    /// Tools the task may use (their failure modes are included).
    pub tools: &'a [String],
    /// Recent diary notes, newest first.
    pub diary: &'a [DiaryEntry],
    /// Items per source.
    pub k: usize,
    /// Near-duplicate threshold between retrieved texts.
    pub duplicate_cosine: f32,
    /// The lesson scopes the task may read.
    pub scopes: Scopes<'a>,
}

/// Builds the bundle. Deduplicated: an id appears once; a vector hit whose embedding is a
/// near-duplicate of a better one is dropped; a diary note with the same text as another item
/// is dropped.
pub fn retrieve(graph: &KnowledgeGraph, index: &VectorIndex, q: RetrievalQuery<'_>) -> Bundle {
    retrieve_many(graph, index, &[q]).pop().unwrap_or_default()
}

/// [`retrieve`] for each of `queries`, whose searches of the index are made together
/// ([`VectorIndex::search_many`]): a burst of runs' retrievals reads the shared items' codes
/// once. The bundles are the ones [`retrieve`] gives for each query alone.
pub fn retrieve_many(
    graph: &KnowledgeGraph,
    index: &VectorIndex,
    queries: &[RetrievalQuery<'_>],
) -> Vec<Bundle> {
    // Searched together by the number of hits they ask for (the same for a burst of runs).
    let mut by_k: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, q) in queries.iter().enumerate() {
        by_k.entry(q.k.saturating_mul(3)).or_default().push(i);
    }
    let mut hits: Vec<Vec<(&VectorItem, f32)>> = vec![Vec::new(); queries.len()];
    for (k, of) in by_k {
        let searches: Vec<(&[f32], Scopes<'_>)> = of
            .iter()
            .map(|i| (queries[*i].vector, queries[*i].scopes))
            .collect();
        for (i, found) in of.into_iter().zip(index.search_many(&searches, k, &[])) {
            hits[i] = found;
        }
    }
    queries
        .iter()
        .zip(hits)
        .map(|(q, hits)| bundle(graph, hits, *q))
        .collect()
}

/// The bundle for `q` from its search's `hits`, best first.
fn bundle(graph: &KnowledgeGraph, hits: Vec<(&VectorItem, f32)>, q: RetrievalQuery<'_>) -> Bundle {
    let mut bundle = Bundle::default();
    let mut seen: BTreeSet<(CitationKind, String)> = BTreeSet::new();
    let mut texts: BTreeSet<String> = BTreeSet::new();
    let mut kept: Vec<&[f32]> = Vec::new();
    for (item, score) in hits {
        if kept.len() >= q.k {
            break;
        }
        if score <= 0.0 {
            continue;
        }
        let kind = CitationKind::from(item.kind);
        if !seen.insert((kind, item.id.clone())) {
            continue;
        }
        if kept
            .iter()
            .any(|v| cosine(v, &item.vector) > q.duplicate_cosine)
        {
            continue;
        }
        kept.push(&item.vector);
        texts.insert(item.text.trim().to_lowercase());
        bundle.items.push(BundleItem {
            text: item.text.clone(),
            citation: Citation {
                kind,
                id: item.id.clone(),
                score: f64::from(score),
            },
        });
    }
    let cluster = graph.nearest_cluster(q.features);
    let mut tools: Vec<String> = q.tools.to_vec();
    if let Some(c) = &cluster {
        for (strategy, stats) in graph.best_strategies(c, q.k) {
            let id = format!("{c}|{strategy}");
            if !seen.insert((CitationKind::Strategy, id.clone())) {
                continue;
            }
            if let Some(tool) = strategy
                .split(':')
                .nth(1)
                .and_then(|ts| ts.split('/').next())
                && !tools.iter().any(|t| t == tool)
            {
                tools.push(tool.to_string());
            }
            let p95 = stats
                .p95_latency_ms()
                .map_or_else(|| "unknown".to_string(), |v| format!("{v:.0} ms"));
            bundle.items.push(BundleItem {
                text: format!(
                    "{c} BEST_WITH {strategy}: p_success {:.2}, p95 latency {p95}, n {}",
                    stats.p_success(),
                    stats.n
                ),
                citation: Citation {
                    kind: CitationKind::Strategy,
                    id,
                    score: stats.p_success(),
                },
            });
        }
    }
    bundle.cluster = cluster;
    let mut modes = Vec::new();
    for tool in &tools {
        let total: u64 = graph.failure_modes(tool).iter().map(|(_, f)| f.count).sum();
        for (class, f) in graph.failure_modes(tool) {
            modes.push((
                f.count as f64 / total.max(1) as f64,
                tool.clone(),
                class,
                f.count,
            ));
        }
    }
    modes.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (share, tool, class, count) in modes.into_iter().take(q.k) {
        let id = format!("{tool}|{class}");
        if !seen.insert((CitationKind::FailureMode, id.clone())) {
            continue;
        }
        bundle.items.push(BundleItem {
            text: format!("{tool} FAILS_WITH {class}: {count} times"),
            citation: Citation {
                kind: CitationKind::FailureMode,
                id,
                score: share,
            },
        });
    }
    let mut diary_kept = 0;
    for (i, e) in q.diary.iter().enumerate() {
        if diary_kept >= q.k {
            break;
        }
        let norm = e.text.trim().to_lowercase();
        if norm.is_empty() || !texts.insert(norm) {
            continue;
        }
        if !seen.insert((CitationKind::Diary, e.seq.to_string())) {
            continue;
        }
        diary_kept += 1;
        bundle.items.push(BundleItem {
            text: e.text.clone(),
            citation: Citation {
                kind: CitationKind::Diary,
                id: e.seq.to_string(),
                score: 1.0 / (1.0 + i as f64),
            },
        });
    }
    bundle
}
