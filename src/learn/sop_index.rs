//! sop_index: which SOPs of a book a task's features could match, and which were made for a
//! cluster, found without reading every SOP. Each SOP is filed under one of its preconditions
//! (its anchor): a task can match it only if the task has that feature with that value, so a
//! lookup reads the SOPs filed under the task's own features and no other; and under its
//! preconditions' cluster key. SOPs are only ever added to a book (a new version is a new
//! SOP, a retired one keeps its place), so the index covers a prefix of the book and the SOPs
//! added since it was last brought up to date are read one by one.

use std::collections::{BTreeMap, HashMap};

use crate::learn::cluster::cluster_key;
use crate::record::Sop;

/// An index of a book's first SOPs by anchor (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub struct SopIndex {
    /// SOPs indexed: the book's first `covered`.
    covered: usize,
    /// Precondition key -> value -> the SOPs anchored there, in book order.
    anchored: HashMap<String, HashMap<String, Vec<usize>>>,
    /// SOPs without preconditions (they match every task), in book order.
    unconditioned: Vec<usize>,
    /// The cluster key of the SOPs' preconditions -> the SOPs, in book order.
    by_cluster: HashMap<String, Vec<usize>>,
}

/// An index is derived from its book's SOPs: two books with the same SOPs are equal whatever
/// their indexes cover.
impl PartialEq for SopIndex {
    fn eq(&self, _: &SopIndex) -> bool {
        true
    }
}

impl SopIndex {
    /// Files every SOP of `sops` past the ones already indexed.
    pub fn extend(&mut self, sops: &[Sop]) {
        if sops.len() < self.covered {
            // Another book's SOPs (an index is never shrunk otherwise): start again.
            *self = SopIndex::default();
        }
        for (i, sop) in sops.iter().enumerate().skip(self.covered) {
            self.by_cluster
                .entry(cluster_key(&sop.preconditions))
                .or_default()
                .push(i);
            // The anchor: the precondition with the fewest SOPs filed under it so far, so that
            // no lookup reads many SOPs that share a common feature.
            let anchor = sop.preconditions.iter().min_by_key(|(k, v)| {
                self.anchored
                    .get(k.as_str())
                    .and_then(|values| values.get(v.as_str()))
                    .map_or(0, Vec::len)
            });
            match anchor {
                Some((k, v)) => self
                    .anchored
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i),
                None => self.unconditioned.push(i),
            }
        }
        self.covered = sops.len();
    }

    /// The positions in `sops` (the book this index was built from, perhaps grown since) of
    /// every SOP that could match `features`, in book order: those filed under one of the
    /// features, those without preconditions, and those added since the index was brought up
    /// to date.
    pub fn candidates(&self, sops: &[Sop], features: &BTreeMap<String, String>) -> Vec<usize> {
        if sops.len() < self.covered {
            return (0..sops.len()).collect();
        }
        let mut out = self.unconditioned.clone();
        for (k, v) in features {
            if let Some(filed) = self
                .anchored
                .get(k.as_str())
                .and_then(|values| values.get(v.as_str()))
            {
                out.extend_from_slice(filed);
            }
        }
        out.sort_unstable();
        out.extend(self.covered..sops.len());
        out
    }

    /// The positions in `sops` of the SOPs whose preconditions' cluster key is `cluster`, in
    /// book order (those added since the index was brought up to date read one by one).
    pub fn of_cluster(&self, sops: &[Sop], cluster: &str) -> Vec<usize> {
        let (mut out, unindexed) = if sops.len() < self.covered {
            (Vec::new(), 0)
        } else {
            let filed = self.by_cluster.get(cluster).map_or(&[][..], Vec::as_slice);
            (filed.to_vec(), self.covered)
        };
        out.extend(
            (unindexed..sops.len()).filter(|&i| cluster_key(&sops[i].preconditions) == cluster),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::sop::{SopBook, SopConfig};
    use crate::record::SopStatus;

    fn features(rng: &mut fastrand::Rng, keys: usize) -> BTreeMap<String, String> {
        let mut f = BTreeMap::new();
        for k in 0..keys {
            if rng.bool() {
                f.insert(format!("k{k}"), format!("v{}", rng.usize(..3)));
            }
        }
        f
    }

    fn sop(rng: &mut fastrand::Rng, i: usize) -> Sop {
        Sop {
            sop_id: format!("sop-{}", rng.usize(..50)),
            version: rng.u32(1..4),
            preconditions: features(rng, 5),
            status: if rng.bool() {
                SopStatus::Stable
            } else {
                SopStatus::Candidate
            },
            plan: Vec::new(),
            successes: 0,
            trials: 0,
            baseline_successes: 0,
            baseline_trials: 0,
            p_value: None,
            evidence: Vec::new(),
            created_ms: 0,
            updated_ms: 0,
            // A candidate without a procedure is not on trial.
            procedure: if i.is_multiple_of(3) {
                Vec::new()
            } else {
                vec![crate::learn::procedure::Procedure {
                    stage: "s".to_string(),
                    calls: Vec::new(),
                    answer: None,
                }]
            },
        }
    }

    /// The SOPs of `sops` that match `f`, read one by one.
    fn matching_by_reading(sops: &[Sop], f: &BTreeMap<String, String>) -> Vec<usize> {
        (0..sops.len())
            .filter(|&i| crate::learn::sop::matches(&sops[i].preconditions, f))
            .collect()
    }

    #[test]
    fn a_clusters_sops_are_those_read_one_by_one() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut sops: Vec<Sop> = Vec::new();
        let mut index = SopIndex::default();
        for i in 0..400 {
            sops.push(sop(&mut rng, i));
            if rng.usize(..4) == 0 {
                index.extend(&sops);
            }
            let cluster = cluster_key(&features(&mut rng, 5));
            let read: Vec<usize> = (0..sops.len())
                .filter(|&i| cluster_key(&sops[i].preconditions) == cluster)
                .collect();
            assert_eq!(index.of_cluster(&sops, &cluster), read, "{cluster}");
        }
        // An index of a longer book (another book's) reads the whole of this one.
        let short = &sops[..10];
        let cluster = cluster_key(&short[3].preconditions);
        assert!(index.of_cluster(short, &cluster).contains(&3));
        assert!(index.of_cluster(short, &cluster).iter().all(|&i| i < 10));
    }

    #[test]
    fn the_candidates_hold_every_matching_sop_in_book_order() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut sops: Vec<Sop> = Vec::new();
        let mut index = SopIndex::default();
        let mut read = 0;
        for i in 0..600 {
            sops.push(sop(&mut rng, i));
            // Brought up to date now and then: the SOPs added since are candidates all the same.
            if rng.usize(..4) == 0 {
                index.extend(&sops);
            }
            let f = features(&mut rng, 5);
            let candidates = index.candidates(&sops, &f);
            assert!(candidates.windows(2).all(|w| w[0] < w[1]), "{candidates:?}");
            for m in matching_by_reading(&sops, &f) {
                assert!(candidates.contains(&m), "SOP {m} matches {f:?}");
            }
            read += candidates.len();
        }
        // It reads a fraction of the book (600 lookups of a book of 300 SOPs on average).
        assert!(read < 600 * 300 / 3, "{read}");
        // An index of a longer book (another book's) reads the whole of this one.
        let short = &sops[..10];
        assert_eq!(index.candidates(short, &BTreeMap::new()).len(), 10);
        index.extend(short);
        assert_eq!(index.covered, 10);
    }

    #[test]
    fn a_book_finds_the_same_sops_through_its_index_as_by_reading_them_all() {
        let mut rng = fastrand::Rng::with_seed(4);
        let mut book = SopBook::new(SopConfig::default());
        book.sops = (0..400).map(|i| sop(&mut rng, i)).collect();
        // A book read back from a snapshot has no index until it is restored.
        let unindexed = book.clone();
        let restored = SopBook::restore(book);
        assert_eq!(restored.index.covered, 400);
        assert_eq!(unindexed.index.covered, 0);
        for _ in 0..500 {
            let f = features(&mut rng, 5);
            assert_eq!(restored.matching(&f), unindexed.matching(&f), "{f:?}");
        }
    }
}
