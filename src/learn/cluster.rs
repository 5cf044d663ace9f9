//! cluster: task clusters from a task's features and the hierarchy that pools them (the exact
//! cluster, coarser feature subsets, the global node), with stable keys for persistence.

use std::collections::BTreeMap;

/// The name of the global node (no feature fixed).
pub const GLOBAL_KEY: &str = "*";

/// The most features a node of a sparse lattice fixes, short of the exact cluster (see
/// [`Lattice::new`]): with many features the full lattice would have too many nodes, but an
/// arm's odds often turn on one feature or on two together (a file type at a size), and
/// without the pairs the exact cluster is the only node that sees them, one task in many.
pub const SPARSE_ORDER: u32 = 2;

/// FNV-1a, 64 bits: a stable hash (the same on every build) for node keys.
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// One node of the hierarchy for a task: a subset of its features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatticeNode {
    /// Bit `i` set: the task's `i`-th feature (in name order) is fixed.
    pub mask: u32,
    /// Stable hash of the fixed `name=value` pairs.
    pub hash: u64,
    /// Stable hash of the fixed feature names (the node's level: which features it keeps).
    pub signature: u64,
    /// Indices (into the lattice's node list) of the parents: the coarser nodes it pools from.
    pub parents: Vec<usize>,
}

/// The hierarchy of a task's clusters, coarsest first: node 0 is global, the last node is the
/// exact cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lattice {
    /// Nodes ordered by the number of fixed features (parents always come first).
    pub nodes: Vec<LatticeNode>,
}

impl Lattice {
    /// The hierarchy for `features`: every subset when there are at most `full_max` features,
    /// else every subset of at most [`SPARSE_ORDER`] features and the exact cluster.
    pub fn new(features: &BTreeMap<String, String>, full_max: usize) -> Lattice {
        let pairs: Vec<(&str, &str)> = features
            .iter()
            .take(31)
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let k = pairs.len();
        let order = if k <= full_max {
            k as u32
        } else {
            SPARSE_ORDER
        };
        let mut masks = subsets_up_to(k, order);
        if (order as usize) < k {
            masks.push(((1u64 << k) - 1) as u32);
        }
        let mut nodes: Vec<LatticeNode> = Vec::with_capacity(masks.len());
        for &mask in &masks {
            let hash = mask_hash(&pairs, mask);
            let signature = signature_hash(&pairs, mask);
            let parents = if mask == 0 {
                Vec::new()
            } else {
                // Parents: the strict subsets in the lattice with the most features.
                let best = nodes
                    .iter()
                    .filter(|n| n.mask & mask == n.mask && n.mask != mask)
                    .map(|n| n.mask.count_ones())
                    .max()
                    .unwrap_or(0);
                nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| {
                        n.mask & mask == n.mask && n.mask != mask && n.mask.count_ones() == best
                    })
                    .map(|(i, _)| i)
                    .collect()
            };
            nodes.push(LatticeNode {
                mask,
                hash,
                signature,
                parents,
            });
        }
        Lattice { nodes }
    }

    /// The size (features fixed) of this lattice's `level`-th finest level: 1 = the exact
    /// cluster's, 2 = the next size down the lattice has, and so on; the coarsest size when it
    /// has fewer levels.
    pub fn level_size(&self, level: u32) -> u32 {
        // Nodes are ordered by size, so the distinct sizes come finest first from the end.
        let (mut last, mut seen) = (None, 0);
        for size in self.nodes.iter().rev().map(|n| n.mask.count_ones()) {
            if last != Some(size) {
                last = Some(size);
                seen += 1;
                if seen == level {
                    return size;
                }
            }
        }
        last.unwrap_or(0)
    }

    /// The readable signature of node `i` (the feature names it fixes: `"filetype|tenant"`,
    /// `"*"` for global).
    pub fn signature(&self, features: &BTreeMap<String, String>, i: usize) -> String {
        let mask = self.nodes.get(i).map(|n| n.mask).unwrap_or(0);
        if mask == 0 {
            return GLOBAL_KEY.to_string();
        }
        features
            .keys()
            .enumerate()
            .filter(|(i, _)| *i < 32 && mask & (1u32 << i) != 0)
            .map(|(_, k)| k.as_str())
            .collect::<Vec<_>>()
            .join("|")
    }

    /// The readable key of node `i` for `features` (`"filetype=pdf|tenant=B"`, `"*"` for global).
    pub fn key(&self, features: &BTreeMap<String, String>, i: usize) -> String {
        let mask = self.nodes.get(i).map(|n| n.mask).unwrap_or(0);
        mask_key(features, mask)
    }
}

/// Every subset of the `k` features fixing at most `order` of them, as masks ordered by size,
/// then mask (so that a node's parents come before it).
fn subsets_up_to(k: usize, order: u32) -> Vec<u32> {
    let mut all = vec![0u32];
    let mut frontier = vec![0u32];
    for _ in 0..order.min(k as u32) {
        // Each subset of the last size, grown by one feature above its highest.
        frontier = frontier
            .iter()
            .flat_map(|&m| (u32::BITS - m.leading_zeros()..k as u32).map(move |b| m | (1 << b)))
            .collect();
        all.extend(&frontier);
    }
    all.sort_by_key(|m| (m.count_ones(), *m));
    all
}

/// The readable key of a feature subset.
pub fn mask_key(features: &BTreeMap<String, String>, mask: u32) -> String {
    if mask == 0 {
        return GLOBAL_KEY.to_string();
    }
    let parts: Vec<String> = features
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < 32 && mask & (1u32 << i) != 0)
        .map(|(_, (k, v))| format!("{k}={v}"))
        .collect();
    parts.join("|")
}

/// The stable hash of a readable key (the same as the lattice's node hash).
pub fn key_hash(key: &str) -> u64 {
    if key == GLOBAL_KEY {
        return FNV_OFFSET;
    }
    let mut h = FNV_OFFSET;
    for (i, part) in key.split('|').enumerate() {
        if i > 0 {
            h = fnv(b"|", h);
        }
        h = fnv(part.as_bytes(), h);
    }
    h
}

fn signature_hash(pairs: &[(&str, &str)], mask: u32) -> u64 {
    let mut h = FNV_OFFSET;
    let mut first = true;
    for (i, (k, _)) in pairs.iter().enumerate() {
        if mask & (1u32 << i) == 0 {
            continue;
        }
        if !first {
            h = fnv(b"|", h);
        }
        first = false;
        h = fnv(k.as_bytes(), h);
    }
    h
}

fn mask_hash(pairs: &[(&str, &str)], mask: u32) -> u64 {
    let mut h = FNV_OFFSET;
    let mut first = true;
    for (i, (k, v)) in pairs.iter().enumerate() {
        if mask & (1u32 << i) == 0 {
            continue;
        }
        if !first {
            h = fnv(b"|", h);
        }
        first = false;
        h = fnv(k.as_bytes(), h);
        h = fnv(b"=", h);
        h = fnv(v.as_bytes(), h);
    }
    h
}

/// The exact cluster's readable key for `features`.
pub fn cluster_key(features: &BTreeMap<String, String>) -> String {
    let k = features.len().min(31);
    mask_key(features, ((1u64 << k) - 1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn full_lattice_orders_parents_first_and_hashes_match_keys() {
        let f = feats(&[("filetype", "pdf"), ("size", "big"), ("tenant", "B")]);
        let lat = Lattice::new(&f, 4);
        assert_eq!(lat.nodes.len(), 8);
        assert_eq!(lat.nodes[0].mask, 0);
        assert_eq!(lat.nodes[7].parents.len(), 3);
        for (i, n) in lat.nodes.iter().enumerate() {
            for &p in &n.parents {
                assert!(p < i);
            }
            assert_eq!(n.hash, key_hash(&lat.key(&f, i)), "node {i}");
            assert_eq!(n.signature, key_hash(&lat.signature(&f, i)), "node {i}");
        }
        assert_eq!(lat.key(&f, 7), "filetype=pdf|size=big|tenant=B");
        assert_eq!(cluster_key(&f), "filetype=pdf|size=big|tenant=B");
    }

    #[test]
    fn wide_features_use_a_sparse_lattice() {
        let f = feats(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")]);
        let lat = Lattice::new(&f, 4);
        // Global, five singles, ten pairs, the exact cluster.
        assert_eq!(lat.nodes.len(), 1 + 5 + 10 + 1);
        let exact = &lat.nodes[16];
        assert_eq!(exact.mask, 0b11111);
        assert_eq!(exact.parents.len(), 10);
        for (i, n) in lat.nodes.iter().enumerate().take(16) {
            assert!(n.mask.count_ones() <= SPARSE_ORDER);
            // A pair's parents are its two single features; a single's, the global node.
            let want = if n.mask == 0 {
                0
            } else if n.mask.count_ones() == 1 {
                1
            } else {
                2
            };
            assert_eq!(n.parents.len(), want, "node {i}");
            for &p in &n.parents {
                assert!(p < i);
            }
            assert_eq!(n.hash, key_hash(&lat.key(&f, i)), "node {i}");
        }
        // Its levels, finest first: the exact cluster, the pairs, the singles, the global node.
        let sizes: Vec<u32> = (1..=5).map(|l| lat.level_size(l)).collect();
        assert_eq!(sizes, [5, 2, 1, 0, 0]);
        let empty = Lattice::new(&BTreeMap::new(), 4);
        assert_eq!(empty.nodes.len(), 1);
        assert_eq!(empty.level_size(1), 0);
    }
}
