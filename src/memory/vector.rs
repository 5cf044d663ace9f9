//! The vector index of lessons, SOPs and postmortems: brute-force cosine top-k over vectors of
//! one fixed dimension (the offline embedder's by default).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::MemoryError;
use crate::model::cosine;
use crate::model::embed::DEFAULT_DIMENSION;

/// What an indexed item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A lesson.
    Lesson,
    /// A standard operating procedure.
    Sop,
    /// A postmortem of a failed run.
    Postmortem,
}

impl ItemKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Lesson => "lesson",
            ItemKind::Sop => "sop",
            ItemKind::Postmortem => "postmortem",
        }
    }
}

/// One indexed item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorItem {
    /// What it is.
    pub kind: ItemKind,
    /// Its id (lesson id, SOP id, run id of the postmortem).
    pub id: String,
    /// The text that was embedded.
    pub text: String,
    /// Its embedding.
    pub vector: Vec<f32>,
    /// The cluster it is about, if any.
    pub cluster: Option<String>,
    /// When it was indexed.
    pub time_ms: u64,
}

/// Brute-force cosine index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorIndex {
    dimension: usize,
    items: BTreeMap<String, VectorItem>,
}

impl Default for VectorIndex {
    fn default() -> Self {
        VectorIndex::new(DEFAULT_DIMENSION)
    }
}

fn key(kind: ItemKind, id: &str) -> String {
    format!("{}:{id}", kind.as_str())
}

impl VectorIndex {
    /// An empty index of vectors of `dimension`.
    pub fn new(dimension: usize) -> VectorIndex {
        VectorIndex {
            dimension,
            items: BTreeMap::new(),
        }
    }

    /// The dimension.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Items indexed.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Inserts or replaces an item (same kind and id).
    pub fn upsert(&mut self, item: VectorItem) -> Result<(), MemoryError> {
        if item.vector.len() != self.dimension {
            return Err(MemoryError::Dimension {
                id: key(item.kind, &item.id),
                expected: self.dimension,
                got: item.vector.len(),
            });
        }
        self.items.insert(key(item.kind, &item.id), item);
        Ok(())
    }

    /// Removes an item; returns it if it was there.
    pub fn remove(&mut self, kind: ItemKind, id: &str) -> Option<VectorItem> {
        self.items.remove(&key(kind, id))
    }

    /// Removes the items of `kind` whose id `keep` refuses; returns how many went.
    pub fn retain_kind(&mut self, kind: ItemKind, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.items.len();
        self.items.retain(|_, it| it.kind != kind || keep(&it.id));
        before - self.items.len()
    }

    /// An item by kind and id.
    pub fn get(&self, kind: ItemKind, id: &str) -> Option<&VectorItem> {
        self.items.get(&key(kind, id))
    }

    /// The `k` items most similar to `query` among `kinds` (all kinds when empty), best
    /// first; ties by key.
    pub fn search(&self, query: &[f32], k: usize, kinds: &[ItemKind]) -> Vec<(&VectorItem, f32)> {
        let mut scored: Vec<(&String, &VectorItem, f32)> = self
            .items
            .iter()
            .filter(|(_, it)| kinds.is_empty() || kinds.contains(&it.kind))
            .map(|(k, it)| (k, it, cosine(query, &it.vector)))
            .collect();
        scored.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(b.0)));
        scored
            .into_iter()
            .take(k)
            .map(|(_, it, s)| (it, s))
            .collect()
    }

    /// The most similar item of a kind.
    pub fn nearest(&self, query: &[f32], kind: ItemKind) -> Option<(&VectorItem, f32)> {
        self.search(query, 1, &[kind]).into_iter().next()
    }
}
