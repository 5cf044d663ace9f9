//! The vector index of lessons, SOPs and postmortems: exact cosine top-k over vectors of one
//! fixed dimension (the offline embedder's by default), read scope by scope, so that a run's
//! search reads its own lessons and never another user's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::MemoryError;
use super::codes::{Codes, Query};
use crate::model::dot;
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
    /// Its text: the text that was embedded, or for a lesson one that differs from it only in
    /// its numbers ([`crate::memory::Memory::index_lesson`]).
    pub text: String,
    /// Its embedding.
    pub vector: Vec<f32>,
    /// The cluster it is about, if any.
    pub cluster: Option<String>,
    /// When it was indexed.
    pub time_ms: u64,
    /// The lesson scope whose runs may read it (`user:…`, `tenant:…`, `session:…` or
    /// `shared`); `None` for an item every run may read (an SOP, a postmortem).
    pub scope: Option<String>,
}

/// Which scoped items a search reads; items without a scope are always read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scopes<'a> {
    /// Every item, whatever its scope (the API's queries over a whole store).
    All,
    /// The items of these scopes (a run's: see [`crate::Task::lesson_scopes`]).
    Only(&'a [String]),
}

/// Exact cosine index. Each item's norm is kept with it, so that a search computes one dot
/// product per item (in eight lanes, which the compiler turns into vector instructions) rather
/// than the dot product and both norms; the codes of the search's first pass are kept apart
/// for each scope, so that a search reads only the scopes it may. It notes the keys it
/// changes, so that its owner can persist items one by one ([`VectorIndex::take_changes`]).
#[derive(Debug, Clone)]
pub struct VectorIndex {
    dimension: usize,
    /// Items by key (`kind:id`); a search looks up each of its candidates here.
    items: HashMap<String, Indexed>,
    /// The vectors again as 16-bit integer codes, the search's first pass, by scope.
    codes: BTreeMap<Option<String>, Codes>,
    changed: BTreeSet<String>,
}

/// Two indexes are equal when they hold the same items (what is still to persist aside).
impl PartialEq for VectorIndex {
    fn eq(&self, other: &VectorIndex) -> bool {
        self.dimension == other.dimension && self.items == other.items
    }
}

/// A change to persist: the item now under a key, or `None` when it was removed.
pub type IndexChange = (String, Option<VectorItem>);

/// An item and its Euclidean norm.
#[derive(Debug, Clone, PartialEq)]
struct Indexed {
    item: VectorItem,
    norm: f32,
}

impl Indexed {
    fn new(item: VectorItem) -> Indexed {
        let norm = dot(&item.vector, &item.vector).sqrt();
        Indexed { item, norm }
    }
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
            items: HashMap::new(),
            codes: BTreeMap::new(),
            changed: BTreeSet::new(),
        }
    }

    /// An index of vectors of `dimension` holding `items` as persisted (nothing to persist);
    /// an item of another dimension is a typed error.
    pub fn with_items(
        dimension: usize,
        items: impl IntoIterator<Item = VectorItem>,
    ) -> Result<VectorIndex, MemoryError> {
        let mut index = VectorIndex::new(dimension);
        for item in items {
            index.upsert(item)?;
        }
        index.changed.clear();
        Ok(index)
    }

    /// The items changed since the last call (each key once, its item as it is now), and
    /// forgets them: what the owner writes to persist the index.
    pub fn take_changes(&mut self) -> Vec<IndexChange> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|k| {
                let item = self.items.get(&k).map(|i| i.item.clone());
                (k, item)
            })
            .collect()
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
        let k = key(item.kind, &item.id);
        let indexed = Indexed::new(item);
        if let Some(earlier) = self.items.get(&k)
            && earlier.item.scope != indexed.item.scope
        {
            uncode(&mut self.codes, &earlier.item.scope, &k);
        }
        self.codes
            .entry(indexed.item.scope.clone())
            .or_insert_with(|| Codes::new(self.dimension))
            .insert(&k, indexed.item.kind, &indexed.item.vector, indexed.norm);
        self.changed.insert(k.clone());
        self.items.insert(k, indexed);
        Ok(())
    }

    /// Gives the item `kind`/`id` a new text and time and keeps its vector, and so its norm and
    /// codes; false when no such item is indexed.
    pub fn retext(&mut self, kind: ItemKind, id: &str, text: String, time_ms: u64) -> bool {
        let k = key(kind, id);
        let Some(indexed) = self.items.get_mut(&k) else {
            return false;
        };
        indexed.item.text = text;
        indexed.item.time_ms = time_ms;
        self.changed.insert(k);
        true
    }

    /// Removes an item; returns it if it was there.
    pub fn remove(&mut self, kind: ItemKind, id: &str) -> Option<VectorItem> {
        let k = key(kind, id);
        let removed = self.items.remove(&k).map(|i| i.item);
        if let Some(item) = &removed {
            uncode(&mut self.codes, &item.scope, &k);
            self.changed.insert(k);
        }
        removed
    }

    /// Removes the items of `kind` whose id `keep` refuses; returns how many went.
    pub fn retain_kind(&mut self, kind: ItemKind, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.items.len();
        let (changed, codes) = (&mut self.changed, &mut self.codes);
        self.items.retain(|k, it| {
            let stays = it.item.kind != kind || keep(&it.item.id);
            if !stays {
                uncode(codes, &it.item.scope, k);
                changed.insert(k.clone());
            }
            stays
        });
        before - self.items.len()
    }

    /// An item by kind and id.
    pub fn get(&self, kind: ItemKind, id: &str) -> Option<&VectorItem> {
        self.items.get(&key(kind, id)).map(|i| &i.item)
    }

    /// The `k` items most similar to `query` among `kinds` (all kinds when empty) and
    /// `scopes`, best first; ties by key. The similarity is the cosine (0 for a zero vector, or
    /// a query of another dimension).
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        kinds: &[ItemKind],
        scopes: Scopes<'_>,
    ) -> Vec<(&VectorItem, f32)> {
        self.search_many(&[(query, scopes)], k, kinds)
            .pop()
            .unwrap_or_default()
    }

    /// [`VectorIndex::search`] for each of `queries` (a vector and the scopes it reads), in one
    /// pass over each scope's codes for every query that reads it; queries with the same vector
    /// share that pass. The answers are the ones the searches one by one give.
    pub fn search_many(
        &self,
        queries: &[(&[f32], Scopes<'_>)],
        k: usize,
        kinds: &[ItemKind],
    ) -> Vec<Vec<(&VectorItem, f32)>> {
        // The distinct vectors, by their bits, and each query's.
        let mut distinct: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut vectors: Vec<&[f32]> = Vec::new();
        let of_query: Vec<usize> = queries
            .iter()
            .map(|(v, _)| {
                *distinct
                    .entry(v.iter().map(|x| x.to_bits()).collect())
                    .or_insert_with(|| {
                        vectors.push(v);
                        vectors.len() - 1
                    })
            })
            .collect();
        let norms: Vec<f32> = vectors
            .iter()
            .map(|v| {
                if v.len() == self.dimension {
                    dot(v, v).sqrt()
                } else {
                    0.0
                }
            })
            .collect();
        let coded: Vec<Option<Query>> = vectors
            .iter()
            .zip(&norms)
            .map(|(v, n)| Query::new(v, *n, self.dimension))
            .collect();
        // The scope groups each query reads, and for each group the distinct vectors reading it.
        let groups_of: Vec<Vec<&Option<String>>> = queries
            .iter()
            .map(|(_, scopes)| match scopes {
                Scopes::All => self.codes.keys().collect(),
                Scopes::Only(scopes) => {
                    let named: BTreeSet<Option<String>> = std::iter::once(None)
                        .chain(scopes.iter().map(|s| Some(s.clone())))
                        .collect();
                    named
                        .iter()
                        .filter_map(|s| self.codes.get_key_value(s).map(|(key, _)| key))
                        .collect()
                }
            })
            .collect();
        let mut readers: BTreeMap<&Option<String>, BTreeSet<usize>> = BTreeMap::new();
        for (groups, v) in groups_of.iter().zip(&of_query) {
            for g in groups {
                readers.entry(*g).or_default().insert(*v);
            }
        }
        // Each group's candidates for each distinct vector reading it, scored once for all the
        // queries with that vector: each scope's k best are among its candidates, so the k best
        // of all are among theirs together.
        let mut scored: HashMap<(&Option<String>, usize), Vec<Scored<'_>>> = HashMap::new();
        for (group, vs) in readers {
            let Some(codes) = self.codes.get(group) else {
                continue;
            };
            let vs: Vec<usize> = vs.into_iter().collect();
            let qs: Vec<Option<&Query>> = vs.iter().map(|v| coded[*v].as_ref()).collect();
            for (v, keys) in vs.into_iter().zip(codes.candidates(&qs, k, kinds)) {
                let (query, query_norm) = (vectors[v], norms[v]);
                let of = keys
                    .into_iter()
                    .filter_map(|key| self.items.get_key_value(key))
                    .map(|(key, it)| {
                        let score = if query_norm == 0.0 || it.norm == 0.0 {
                            0.0
                        } else {
                            dot(query, &it.item.vector) / (query_norm * it.norm)
                        };
                        (key, &it.item, score)
                    })
                    .collect();
                scored.insert((group, v), of);
            }
        }
        let order = |a: &Scored<'_>, b: &Scored<'_>| b.2.total_cmp(&a.2).then(a.0.cmp(b.0));
        groups_of
            .iter()
            .zip(&of_query)
            .map(|(groups, &v)| {
                let mut best: Vec<Scored<'_>> = groups
                    .iter()
                    .filter_map(|g| scored.get(&(*g, v)))
                    .flatten()
                    .copied()
                    .collect();
                if k < best.len() {
                    best.select_nth_unstable_by(k, order);
                    best.truncate(k);
                }
                best.sort_by(order);
                best.into_iter().map(|(_, it, s)| (it, s)).collect()
            })
            .collect()
    }

    /// The most similar item of a kind, whatever its scope.
    pub fn nearest(&self, query: &[f32], kind: ItemKind) -> Option<(&VectorItem, f32)> {
        self.search(query, 1, &[kind], Scopes::All)
            .into_iter()
            .next()
    }
}

/// An item found for a query, with its key and exact score.
type Scored<'a> = (&'a String, &'a VectorItem, f32);

/// Drops the codes of `key` from its scope's, and the scope's when it held nothing else.
fn uncode(codes: &mut BTreeMap<Option<String>, Codes>, scope: &Option<String>, key: &str) {
    if let Some(group) = codes.get_mut(scope) {
        group.remove(key);
        if group.is_empty() {
            codes.remove(scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cosine;

    fn item(kind: ItemKind, id: &str, text: &str) -> VectorItem {
        VectorItem {
            kind,
            id: id.to_string(),
            text: text.to_string(),
            vector: crate::model::embed::embed_one(text),
            cluster: None,
            time_ms: 0,
            scope: None,
        }
    }

    #[test]
    fn a_search_ranks_as_the_dense_cosine_does() {
        let mut index = VectorIndex::default();
        let texts = [
            "search failed: the date range is required",
            "refund issued after the lookup by email",
            "the search tool needs a date range",
            "ticket closed without an answer",
            "the lookup needs the customer's email",
            "ticket closed without an answer",
        ];
        for (i, t) in texts.iter().enumerate() {
            let kind = if i % 2 == 0 {
                ItemKind::Lesson
            } else {
                ItemKind::Postmortem
            };
            index.upsert(item(kind, &format!("x{i}"), t)).unwrap();
        }
        let query = crate::model::embed::embed_one("the search needs a date range");
        for k in [0, 1, 3, 6, 10] {
            let got: Vec<(String, f32)> = index
                .search(&query, k, &[], Scopes::All)
                .into_iter()
                .map(|(it, s)| (it.id.clone(), s))
                .collect();
            let mut want: Vec<(String, String, f32)> = index
                .items
                .iter()
                .map(|(key, it)| {
                    (
                        key.clone(),
                        it.item.id.clone(),
                        cosine(&query, &it.item.vector),
                    )
                })
                .collect();
            want.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
            want.truncate(k);
            assert_eq!(got.len(), want.len());
            for ((id, s), (_, wid, ws)) in got.iter().zip(&want) {
                assert_eq!(id, wid);
                assert!((s - ws).abs() < 1e-5, "{s} against {ws}");
            }
        }
        // Only the kinds asked for; a zero query or one of another dimension scores 0.
        assert!(
            index
                .search(&query, 10, &[ItemKind::Lesson], Scopes::All)
                .iter()
                .all(|(it, _)| it.kind == ItemKind::Lesson)
        );
        assert!(
            index
                .search(&[0.0; DEFAULT_DIMENSION], 3, &[], Scopes::All)
                .iter()
                .all(|(_, s)| *s == 0.0)
        );
        assert!(
            index
                .search(&[1.0], 3, &[], Scopes::All)
                .iter()
                .all(|(_, s)| *s == 0.0)
        );
    }

    #[test]
    fn the_index_hands_over_each_changed_key_once_with_its_item_as_it_is_now() {
        let mut index = VectorIndex::default();
        index.upsert(item(ItemKind::Lesson, "a", "first")).unwrap();
        index.upsert(item(ItemKind::Lesson, "b", "second")).unwrap();
        index
            .upsert(item(ItemKind::Sop, "s", "a procedure"))
            .unwrap();
        index
            .upsert(item(ItemKind::Lesson, "b", "second, reworded"))
            .unwrap();
        assert!(index.remove(ItemKind::Lesson, "a").is_some());
        assert!(index.remove(ItemKind::Lesson, "never").is_none());
        let changes = index.take_changes();
        let summary: Vec<(&str, Option<&str>)> = changes
            .iter()
            .map(|(k, it)| (k.as_str(), it.as_ref().map(|i| i.text.as_str())))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("lesson:a", None),
                ("lesson:b", Some("second, reworded")),
                ("sop:s", Some("a procedure")),
            ]
        );
        assert!(index.take_changes().is_empty(), "handed over once");
        // Retaining notes what it removes; an index read back has nothing to persist.
        assert_eq!(index.retain_kind(ItemKind::Lesson, |_| false), 1);
        assert_eq!(index.take_changes(), vec![("lesson:b".to_string(), None)]);
        let back =
            VectorIndex::with_items(index.dimension(), [item(ItemKind::Sop, "s", "a procedure")])
                .unwrap();
        assert_eq!(back, index);
        assert!(
            VectorIndex::with_items(index.dimension(), [])
                .unwrap()
                .take_changes()
                .is_empty()
        );
        assert!(matches!(
            VectorIndex::with_items(3, [item(ItemKind::Sop, "s", "x")]),
            Err(MemoryError::Dimension { .. })
        ));
    }

    /// 600 items, small perturbations of four texts and exact copies (as lessons from one
    /// template are), of three kinds, most in one of three users' scopes, some removed and some
    /// moved to another scope; and the four texts' vectors.
    fn perturbed_index(rng: &mut fastrand::Rng) -> (VectorIndex, Vec<Vec<f32>>) {
        let bases: Vec<Vec<f32>> = (0..4)
            .map(|b| {
                crate::model::embed::embed_one(&format!(
                    "when the bank is b{b}, check the date format"
                ))
            })
            .collect();
        let mut index = VectorIndex::default();
        for i in 0..600 {
            let base = &bases[i % bases.len()];
            let noise = if i % 7 == 0 { 0.0 } else { 0.02 };
            let vector: Vec<f32> = base.iter().map(|x| x + noise * (rng.f32() - 0.5)).collect();
            let kind = [ItemKind::Lesson, ItemKind::Sop, ItemKind::Postmortem][i % 3];
            index
                .upsert(VectorItem {
                    kind,
                    id: format!("x{i}"),
                    text: String::new(),
                    vector,
                    cluster: None,
                    time_ms: 0,
                    scope: (i % 4 != 0).then(|| format!("user:u{}", i % 3)),
                })
                .unwrap();
        }
        for i in (0..600).step_by(5) {
            index.remove(ItemKind::Lesson, &format!("x{i}"));
        }
        // Items moved to another scope are read from it only.
        for i in (1..600).step_by(11) {
            let kind = [ItemKind::Lesson, ItemKind::Sop, ItemKind::Postmortem][i % 3];
            if let Some(mut item) = index.get(kind, &format!("x{i}")).cloned() {
                item.scope = Some("user:u2".to_string());
                index.upsert(item).unwrap();
            }
        }
        assert!(index.codes.values().all(|c| !c.is_empty()));
        (index, bases)
    }

    /// The k best items for `query` scored one by one on their full vectors.
    fn exhaustive(
        index: &VectorIndex,
        query: &[f32],
        k: usize,
        kinds: &[ItemKind],
        scopes: Scopes<'_>,
    ) -> Vec<(String, f32)> {
        let query_norm = if query.len() == index.dimension {
            dot(query, query).sqrt()
        } else {
            0.0
        };
        let readable = |scope: &Option<String>| match (scopes, scope) {
            (Scopes::All, _) | (_, None) => true,
            (Scopes::Only(named), Some(s)) => named.contains(s),
        };
        let mut want: Vec<(&String, String, f32)> = index
            .items
            .iter()
            .filter(|(_, it)| kinds.is_empty() || kinds.contains(&it.item.kind))
            .filter(|(_, it)| readable(&it.item.scope))
            .map(|(key, it)| {
                let score = if query_norm == 0.0 || it.norm == 0.0 {
                    0.0
                } else {
                    dot(query, &it.item.vector) / (query_norm * it.norm)
                };
                (key, it.item.id.clone(), score)
            })
            .collect();
        want.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(b.0)));
        want.into_iter().take(k).map(|(_, id, s)| (id, s)).collect()
    }

    fn ids(found: Vec<(&VectorItem, f32)>) -> Vec<(String, f32)> {
        found
            .into_iter()
            .map(|(it, s)| (it.id.clone(), s))
            .collect()
    }

    /// The first pass over the codes keeps every item that could be among the k best, so the
    /// answer is the exhaustive search's, ties and near-ties included.
    #[test]
    fn the_search_over_codes_answers_as_the_exhaustive_search() {
        let mut rng = fastrand::Rng::with_seed(9);
        let (index, bases) = perturbed_index(&mut rng);
        for q in 0..20 {
            let query: Vec<f32> = bases[q % bases.len()]
                .iter()
                .map(|x| x + 0.05 * (rng.f32() - 0.5))
                .collect();
            let own = vec![format!("user:u{}", q % 3), "user:u1".to_string()];
            for (k, kinds, scopes) in [
                (1, vec![], Scopes::All),
                (5, vec![], Scopes::All),
                (15, vec![], Scopes::All),
                (40, vec![ItemKind::Lesson], Scopes::All),
                (5, vec![], Scopes::Only(&own)),
                (15, vec![ItemKind::Sop], Scopes::Only(&own)),
                (40, vec![], Scopes::Only(&[])),
            ] {
                assert_eq!(
                    ids(index.search(&query, k, &kinds, scopes)),
                    exhaustive(&index, &query, k, &kinds, scopes),
                    "query {q}, k {k}, scopes {scopes:?}"
                );
            }
        }
    }

    /// A burst of searches made together answers each as the exhaustive search does: queries
    /// that repeat a vector (sharing its pass) with other scopes, a zero vector and one of
    /// another dimension among them.
    #[test]
    fn searches_made_together_answer_as_each_alone() {
        let mut rng = fastrand::Rng::with_seed(11);
        let (index, bases) = perturbed_index(&mut rng);
        let scopes: Vec<Vec<String>> = (0..3)
            .map(|u| vec![format!("user:u{u}")])
            .chain([vec![], vec!["user:u0".to_string(), "user:u2".to_string()]])
            .collect();
        let mut vectors: Vec<Vec<f32>> = (0..6)
            .map(|q| {
                bases[q % bases.len()]
                    .iter()
                    .map(|x| x + 0.05 * (rng.f32() - 0.5))
                    .collect()
            })
            .collect();
        vectors.push(vec![0.0; DEFAULT_DIMENSION]);
        vectors.push(vec![1.0; 3]);
        let mut burst: Vec<(&[f32], Scopes<'_>)> = Vec::new();
        for i in 0..40 {
            let scopes = if i % 9 == 0 {
                Scopes::All
            } else {
                Scopes::Only(&scopes[i % scopes.len()])
            };
            burst.push((&vectors[(i * 7) % vectors.len()], scopes));
        }
        for (k, kinds) in [(1, vec![]), (15, vec![]), (5, vec![ItemKind::Postmortem])] {
            let found = index.search_many(&burst, k, &kinds);
            assert_eq!(found.len(), burst.len());
            for (i, (found, (query, scopes))) in found.into_iter().zip(&burst).enumerate() {
                assert_eq!(
                    ids(found),
                    exhaustive(&index, query, k, &kinds, *scopes),
                    "search {i}, k {k}"
                );
            }
        }
        assert!(index.search_many(&[], 5, &[]).is_empty());
    }
}
