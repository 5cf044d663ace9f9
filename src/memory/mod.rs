//! Triangulated memory: the knowledge graph with its statistics ([`graph`], streaming p95 in
//! [`quantile`]), the vector index of lessons, SOPs and postmortems ([`vector`]), retrieval of
//! one cited, deduplicated bundle per task ([`retrieve`]) and salience-gated writes
//! ([`salience`]). [`Memory`] holds graph and index together and snapshots them for the store.

mod codes;
pub mod graph;
pub mod quantile;
pub mod retrieve;
pub mod salience;
pub mod vector;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use graph::{ArmStats, Edge, FailStats, GraphDelta, KnowledgeGraph, graph_cluster_key};
pub use quantile::P2Quantile;
pub use retrieve::{Bundle, BundleItem, Citation, CitationKind, RetrievalQuery};
pub use salience::{SalienceConfig, SalienceDecision, SalienceReason};
pub use vector::{IndexChange, ItemKind, Scopes, VectorIndex, VectorItem};

use crate::model::embed::embed_with_dimension;
use crate::record::{DiaryEntry, ExperienceTuple};

/// Version of [`MemorySnapshot`] (2: the vector items are persisted one by one, apart from it;
/// 3: each item carries its lesson scope, so the items of a version 2 snapshot are rebuilt).
pub const SNAPSHOT_VERSION: u32 = 3;

/// Errors of the memory.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    /// A vector of the wrong dimension.
    #[error("vector of {id} has dimension {got}, the index expects {expected}")]
    Dimension {
        /// The item (`kind:id`).
        id: String,
        /// The index's dimension.
        expected: usize,
        /// The vector's.
        got: usize,
    },
    /// A snapshot of an unknown version.
    #[error("memory snapshot version {0} is not supported (expected {SNAPSHOT_VERSION})")]
    SnapshotVersion(u32),
}

/// The persisted state of [`Memory`] but its vector items, which are persisted one by one as
/// they change ([`Memory::take_index_changes`]): a snapshot stays the size of the graph however
/// many lessons, SOPs and postmortems are indexed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// Format version.
    pub version: u32,
    /// The graph.
    pub graph: KnowledgeGraph,
    /// The vector index's dimension.
    pub dimension: usize,
    /// Salience thresholds (JSON text when stored, so that a setting added in a later build
    /// does not make the snapshot unreadable).
    #[serde(with = "crate::store::envelope::as_json")]
    pub salience: SalienceConfig,
}

/// A text to index for an experience (a postmortem, a lesson, an SOP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexCandidate {
    /// Its kind.
    pub kind: ItemKind,
    /// Its id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Its embedding (same embedder as the index).
    pub vector: Vec<f32>,
}

/// Graph and vector index together (a pure struct the Memory actor owns).
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    graph: KnowledgeGraph,
    index: VectorIndex,
    salience: SalienceConfig,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new(
            VectorIndex::default().dimension(),
            SalienceConfig::default(),
        )
    }
}

impl Memory {
    /// An empty memory whose index holds vectors of `dimension`.
    pub fn new(dimension: usize, salience: SalienceConfig) -> Memory {
        Memory {
            graph: KnowledgeGraph::new(),
            index: VectorIndex::new(dimension),
            salience,
        }
    }

    /// The persisted state but the vector items (see [`Memory::take_index_changes`]).
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            version: SNAPSHOT_VERSION,
            graph: self.graph.clone(),
            dimension: self.index.dimension(),
            salience: self.salience.clone(),
        }
    }

    /// Rebuilds from a snapshot and the vector items persisted with it.
    pub fn restore(
        snapshot: MemorySnapshot,
        items: impl IntoIterator<Item = VectorItem>,
    ) -> Result<Memory, MemoryError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(MemoryError::SnapshotVersion(snapshot.version));
        }
        Ok(Memory {
            graph: snapshot.graph,
            index: VectorIndex::with_items(snapshot.dimension, items)?,
            salience: snapshot.salience,
        })
    }

    /// The vector items indexed, replaced or removed since the last call, each key once
    /// (`None` when removed): what to write with the next snapshot.
    pub fn take_index_changes(&mut self) -> Vec<IndexChange> {
        self.index.take_changes()
    }

    /// The graph.
    pub fn graph(&self) -> &KnowledgeGraph {
        &self.graph
    }

    /// The vector index.
    pub fn index(&self) -> &VectorIndex {
        &self.index
    }

    /// Embeds a text with the offline embedder at the index's dimension.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        embed_with_dimension(text, self.index.dimension())
    }

    /// The text a task is embedded from: its goal and its features.
    pub fn task_text(goal: &str, features: &BTreeMap<String, String>) -> String {
        let f: Vec<String> = features.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{goal} {}", f.join(" "))
    }

    /// Takes in one experience: updates the in-memory graph, decides by salience what needs
    /// writing, and indexes the candidate only if it is novel. The caller always appends the
    /// experience to the log, persists [`Memory::snapshot`] when `write_graph` or
    /// `write_vectors` is set, then calls [`Memory::mark_written`] with the decision.
    pub fn ingest(
        &mut self,
        exp: &ExperienceTuple,
        candidate: Option<IndexCandidate>,
    ) -> Result<SalienceDecision, MemoryError> {
        let delta = self.graph.apply(exp);
        let cluster = graph_cluster_key(&exp.context_features);
        let decision = salience::assess(
            &self.graph,
            &delta,
            &self.index,
            candidate.as_ref().map(|c| (c.kind, c.vector.as_slice())),
            &self.salience,
        );
        if decision.write_vectors
            && let Some(c) = candidate
        {
            self.index.upsert(VectorItem {
                kind: c.kind,
                id: c.id,
                text: c.text,
                vector: c.vector,
                cluster: Some(cluster),
                time_ms: exp.time_ms,
                scope: None,
            })?;
        }
        Ok(decision)
    }

    /// Indexes an item unconditionally (a promoted SOP; a lesson goes through
    /// [`Memory::index_lesson`]).
    pub fn index_item(&mut self, item: VectorItem) -> Result<(), MemoryError> {
        self.index.upsert(item)
    }

    /// Indexes a lesson's text in its scope, and says what that did: nothing when it holds the
    /// lesson with this text and scope already (sent again after a restart, say). A lesson
    /// whose text changed only in its numbers takes the new text and keeps the vector it has:
    /// a reflection lesson's counts ("passed 14 of 15") move at every consolidation, they
    /// weigh a few of a sentence's grams, and embedding the 17-21 lessons a consolidation
    /// changes again held the next run's retrieval about 0.2 ms.
    pub fn index_lesson(
        &mut self,
        id: &str,
        text: String,
        scope: &str,
        time_ms: u64,
    ) -> Result<LessonIndexed, MemoryError> {
        if let Some(held) = self.index.get(ItemKind::Lesson, id)
            && held.scope.as_deref() == Some(scope)
        {
            if held.text == text {
                return Ok(LessonIndexed::Held);
            }
            if differ_only_in_numbers(&held.text, &text) {
                self.index.retext(ItemKind::Lesson, id, text, time_ms);
                return Ok(LessonIndexed::Retexted);
            }
        }
        let vector = self.embed(&text);
        self.index.upsert(VectorItem {
            kind: ItemKind::Lesson,
            id: id.to_string(),
            text,
            vector,
            cluster: None,
            time_ms,
            scope: Some(scope.to_string()),
        })?;
        Ok(LessonIndexed::Embedded)
    }

    /// Whether the index holds the item `kind`/`id` with this text and scope (so that
    /// indexing it again would change nothing).
    pub fn holds(&self, kind: ItemKind, id: &str, text: &str, scope: Option<&str>) -> bool {
        self.index
            .get(kind, id)
            .is_some_and(|item| item.text == text && item.scope.as_deref() == scope)
    }

    /// Removes an indexed item (a superseded lesson, a retired SOP).
    pub fn forget(&mut self, kind: ItemKind, id: &str) -> Option<VectorItem> {
        self.index.remove(kind, id)
    }

    /// Links an SOP to a cluster in the graph; returns the salience decision for it.
    pub fn link_sop(&mut self, sop_id: &str, cluster: &str) -> SalienceDecision {
        let delta = self.graph.link_sop(sop_id, cluster);
        salience::assess_graph(&self.graph, &delta, &self.salience)
    }

    /// Keeps only the lessons named in `active` in the index (the reflector's and adaptive
    /// strategies' lessons in force: a decayed, expired or superseded lesson is no longer
    /// retrieved); returns how many were forgotten.
    pub fn retain_lessons(&mut self, active: &BTreeSet<String>) -> usize {
        self.index
            .retain_kind(ItemKind::Lesson, |id| active.contains(id))
    }

    /// Forgets a rolled-back SOP: its vector and its APPLIES_TO edges. True when memory held
    /// either.
    pub fn forget_sop(&mut self, sop_id: &str) -> bool {
        let vector = self.index.remove(ItemKind::Sop, sop_id).is_some();
        let edges = self.graph.unlink_sop(sop_id);
        vector || edges
    }

    /// Records that the decision's edges were persisted.
    pub fn mark_written(&mut self, decision: &SalienceDecision) {
        self.graph.mark_written(&decision.edges);
    }

    /// The retrieval bundle for a task with the offline embedder: top-k lessons (of `scopes`),
    /// SOPs and postmortems by similarity, the graph's best strategies and failure modes for
    /// the task's cluster, and the given recent diary notes (newest first), each cited.
    pub fn retrieve_for(
        &self,
        goal: &str,
        features: &BTreeMap<String, String>,
        tools: &[String],
        diary: &[DiaryEntry],
        k: usize,
        scopes: Scopes<'_>,
    ) -> Bundle {
        self.retrieve_for_many(&[TaskQuery {
            goal,
            features,
            tools,
            diary,
            k,
            scopes,
        }])
        .pop()
        .unwrap_or_default()
    }

    /// [`Memory::retrieve_for`] for each of `tasks`, retrieved together (see
    /// [`retrieve::retrieve_many`]); a text is embedded once however many tasks share it.
    pub fn retrieve_for_many(&self, tasks: &[TaskQuery<'_>]) -> Vec<Bundle> {
        let mut vectors: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        let texts: Vec<String> = tasks
            .iter()
            .map(|t| Memory::task_text(t.goal, t.features))
            .collect();
        for text in &texts {
            if !vectors.contains_key(text) {
                vectors.insert(text.clone(), self.embed(text));
            }
        }
        let queries: Vec<RetrievalQuery<'_>> = tasks
            .iter()
            .zip(&texts)
            .map(|(t, text)| RetrievalQuery {
                features: t.features,
                vector: vectors.get(text).map_or(&[], Vec::as_slice),
                tools: t.tools,
                diary: t.diary,
                k: t.k,
                duplicate_cosine: self.salience.novelty_cosine,
                scopes: t.scopes,
            })
            .collect();
        retrieve::retrieve_many(&self.graph, &self.index, &queries)
    }

    /// The retrieval bundle for a query whose vector the caller computed.
    pub fn retrieve(&self, query: RetrievalQuery<'_>) -> Bundle {
        retrieve::retrieve(&self.graph, &self.index, query)
    }
}

/// What [`Memory::index_lesson`] did with a lesson.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LessonIndexed {
    /// It held the lesson as it is: nothing changed.
    Held,
    /// It took the lesson's new numbers and kept its vector.
    Retexted,
    /// It embedded the lesson and indexed it, new or reworded.
    Embedded,
}

/// Whether two texts are the same but for the values of their numbers (runs of ASCII digits):
/// `passed 14 of 15` and `passed 15 of 16` are, `passed 14 of 15` and `passed 14 of 15 runs`
/// are not.
fn differ_only_in_numbers(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (da, db) = (a[i].is_ascii_digit(), b[j].is_ascii_digit());
        if da && db {
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
        } else if da || db || a[i] != b[j] {
            return false;
        } else {
            i += 1;
            j += 1;
        }
    }
    i == a.len() && j == b.len()
}

/// A task to retrieve for ([`Memory::retrieve_for_many`]).
#[derive(Debug, Clone, Copy)]
pub struct TaskQuery<'a> {
    /// Its goal.
    pub goal: &'a str,
    /// Its features.
    pub features: &'a BTreeMap<String, String>,
    /// Tools it may use (their failure modes are included).
    pub tools: &'a [String],
    /// Recent diary notes, newest first.
    pub diary: &'a [DiaryEntry],
    /// Items per source.
    pub k: usize,
    /// The lesson scopes it may read.
    pub scopes: Scopes<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_alone_may_differ() {
        assert!(differ_only_in_numbers(
            "prefer a/b at stage s: passed 14 of 15",
            "prefer a/b at stage s: passed 150 of 2"
        ));
        assert!(differ_only_in_numbers("", ""));
        assert!(!differ_only_in_numbers(
            "prefer a/b at stage s: passed 14 of 15",
            "prefer a/b at stage s: passed 14 of 15 runs"
        ));
        assert!(!differ_only_in_numbers("stage 1", "stage x"));
        assert!(!differ_only_in_numbers("stage 1", "stage "));
        assert!(!differ_only_in_numbers("avoid a", "prefer a"));
    }

    #[test]
    fn a_lesson_whose_numbers_alone_changed_keeps_its_vector() {
        let mut m = Memory::default();
        let first = "prefer a/b at stage parse: passed 3 of 3";
        let first_time = m.index_lesson("l1", first.into(), "shared", 1).unwrap();
        assert_eq!(first_time, LessonIndexed::Embedded);
        let vector = m
            .index()
            .get(ItemKind::Lesson, "l1")
            .unwrap()
            .vector
            .clone();
        assert_eq!(vector, m.embed(first));
        m.take_index_changes();
        // The same text again changes nothing.
        let again = m.index_lesson("l1", first.into(), "shared", 2).unwrap();
        assert_eq!(again, LessonIndexed::Held);
        assert!(m.take_index_changes().is_empty());
        // New counts: the new text, the first vector, and a change to persist.
        let counted = "prefer a/b at stage parse: passed 14 of 15";
        let recounted = m.index_lesson("l1", counted.into(), "shared", 3).unwrap();
        assert_eq!(recounted, LessonIndexed::Retexted);
        let held = m.index().get(ItemKind::Lesson, "l1").unwrap();
        assert_eq!((held.text.as_str(), held.time_ms), (counted, 3));
        assert_eq!(held.vector, vector);
        let changes = m.take_index_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(
            changes[0].1.as_ref().map(|i| i.text.as_str()),
            Some(counted)
        );
        // Other words, or another scope: embedded again.
        let reworded = "avoid a/b at stage parse: timeout 14 of 15";
        let reworded_as = m.index_lesson("l1", reworded.into(), "shared", 4).unwrap();
        assert_eq!(reworded_as, LessonIndexed::Embedded);
        let held = m.index().get(ItemKind::Lesson, "l1").unwrap();
        assert_eq!(held.vector, m.embed(reworded));
        let rescoped = m.index_lesson("l1", reworded.into(), "user:a", 5).unwrap();
        assert_eq!(rescoped, LessonIndexed::Embedded);
        let held = m.index().get(ItemKind::Lesson, "l1").unwrap();
        assert_eq!(held.scope.as_deref(), Some("user:a"));
        let found = m.index().search(&m.embed(reworded), 1, &[], Scopes::All);
        assert_eq!(found.len(), 1);
    }
}
