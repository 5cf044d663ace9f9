//! codes: the vector index's first pass. Every vector is kept again as 16-bit integer codes
//! with one scale, in one contiguous block, so that a search reads half the bytes of the full
//! vectors, in order, and multiplies integers. Each approximate score comes with a bound on its error (Cauchy-Schwarz on
//! what the codes leave out of the vector and of the query), so the items that could be among
//! the k best are known exactly: only those are scored again on the full vectors, and the
//! search's answer is the exhaustive search's.

use std::collections::HashMap;

use super::vector::ItemKind;

/// The largest code for vectors of `dimension`: a dot product of two rows of codes adds
/// `dimension` products of at most `levels^2`, which must fit in an `i32` (2,364 at 384).
fn levels(dimension: usize) -> f32 {
    ((i32::MAX as f64 / dimension.max(1) as f64).sqrt().floor()).min(i16::MAX as f64) as f32
}
/// Slack added to every bound, relative to the two norms: far above the rounding of the
/// scores in `f32`, so that the exact score is always inside its bound.
const SLACK: f32 = 1e-4;

/// A vector's codes: `round(v / scale)`, and what they leave out.
struct Coded {
    codes: Vec<i16>,
    scale: f32,
    /// ||v - scale * codes||.
    error: f32,
    /// ||scale * codes||.
    norm: f32,
}

fn code(v: &[f32], levels: f32) -> Coded {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 && max.is_finite() {
        max / levels
    } else {
        0.0
    };
    let codes: Vec<i16> = v
        .iter()
        .map(|x| {
            if scale > 0.0 {
                (x / scale).round().clamp(-levels, levels) as i16
            } else {
                0
            }
        })
        .collect();
    let (mut error, mut norm) = (0.0f32, 0.0f32);
    for (x, c) in v.iter().zip(&codes) {
        let y = scale * f32::from(*c);
        error += (x - y) * (x - y);
        norm += y * y;
    }
    Coded {
        codes,
        scale,
        error: error.sqrt(),
        norm: norm.sqrt(),
    }
}

/// The integer dot product of two code rows (exact: see [`levels`]), in sixteen independent
/// lanes, which the compiler turns into vector instructions.
fn dot(a: &[i16], b: &[i16]) -> i32 {
    let mut lanes = [0i32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: i32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            lanes[i] += i32::from(x[i]) * i32::from(y[i]);
        }
    }
    lanes.iter().sum::<i32>() + tail
}

/// [`dot`] in AVX2's multiply-and-add-pairs instruction (`vpmaddwd`: sixteen products of
/// 16-bit codes added in pairs into eight 32-bit lanes), which the compiler does not choose
/// for [`dot`]'s loop: the same sum (no pair of codes reaches `i16::MIN`, see [`levels`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_avx2(a: &[i16], b: &[i16]) -> i32 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_setzero_si256,
        _mm256_storeu_si256,
    };
    let n = a.len().min(b.len());
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` elements of both slices are read; unaligned loads.
        let (x, y) = unsafe {
            (
                _mm256_loadu_si256(a.as_ptr().add(i).cast::<__m256i>()),
                _mm256_loadu_si256(b.as_ptr().add(i).cast::<__m256i>()),
            )
        };
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
        i += 16;
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` is 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), acc) };
    lanes.iter().sum::<i32>() + dot(&a[i..n], &b[i..n])
}

/// What one row describes.
#[derive(Clone)]
struct Row {
    key: String,
    kind: ItemKind,
    scale: f32,
    error: f32,
    coded_norm: f32,
    /// The full vector's norm (the one the exact score divides by).
    norm: f32,
}

/// The codes of every indexed vector, row by row.
#[derive(Clone, Default)]
pub(super) struct Codes {
    dimension: usize,
    levels: f32,
    codes: Vec<i16>,
    rows: Vec<Row>,
    row_of: HashMap<String, usize>,
}

impl std::fmt::Debug for Codes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Codes({} rows of {})", self.rows.len(), self.dimension)
    }
}

impl Codes {
    /// No rows, of vectors of `dimension`.
    pub(super) fn new(dimension: usize) -> Codes {
        Codes {
            dimension,
            levels: levels(dimension),
            ..Codes::default()
        }
    }

    /// Codes `vector` (of the codes' dimension) under `key`, replacing its earlier row.
    pub(super) fn insert(&mut self, key: &str, kind: ItemKind, vector: &[f32], norm: f32) {
        let d = self.dimension;
        // A vector of another length (read from a stored index, which does not check) cannot be
        // coded: its bound is unbounded, so it is always scored on the full vector.
        let coded = if vector.len() == d {
            code(vector, self.levels)
        } else {
            Coded {
                codes: vec![0; d],
                scale: 0.0,
                error: f32::INFINITY,
                norm: 0.0,
            }
        };
        let row = Row {
            key: key.to_string(),
            kind,
            scale: coded.scale,
            error: coded.error,
            coded_norm: coded.norm,
            norm,
        };
        match self.row_of.get(key) {
            Some(&r) => {
                self.codes[r * d..(r + 1) * d].copy_from_slice(&coded.codes);
                self.rows[r] = row;
            }
            None => {
                self.row_of.insert(key.to_string(), self.rows.len());
                self.codes.extend_from_slice(&coded.codes);
                self.rows.push(row);
            }
        }
    }

    /// Whether it holds no row.
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Drops the row of `key` (the last row takes its place).
    pub(super) fn remove(&mut self, key: &str) {
        let Some(r) = self.row_of.remove(key) else {
            return;
        };
        let (d, last) = (self.dimension, self.rows.len() - 1);
        if r != last {
            self.codes.copy_within(last * d..(last + 1) * d, r * d);
            self.rows.swap(r, last);
            self.row_of.insert(self.rows[r].key.clone(), r);
        }
        self.rows.pop();
        self.codes.truncate(last * d);
    }

    /// For each query, the keys of the items among `kinds` (all when empty) that may be among
    /// the `k` most similar to it by cosine: every item whose score's upper bound reaches the
    /// k-th best lower bound. A query of another dimension, or with a zero norm (`None`),
    /// scores every item 0 and keeps them all. The rows are read once for all the queries, a
    /// block at a time, so that a burst of searches reads the codes from the cache rather
    /// than from memory once each.
    pub(super) fn candidates(
        &self,
        queries: &[Option<&Query>],
        k: usize,
        kinds: &[ItemKind],
    ) -> Vec<Vec<&str>> {
        if k == 0 {
            return queries.iter().map(|_| Vec::new()).collect();
        }
        let wanted: Vec<bool> = self
            .rows
            .iter()
            .map(|row| kinds.is_empty() || kinds.contains(&row.kind))
            .collect();
        let coded: Vec<&Query> = queries
            .iter()
            .flatten()
            .filter(|q| q.coded.codes.len() == self.dimension)
            .copied()
            .collect();
        let mut bounds = self.bounds(&coded, &wanted).into_iter();
        queries
            .iter()
            .map(|q| {
                if !q.is_some_and(|q| q.coded.codes.len() == self.dimension) {
                    return self
                        .rows
                        .iter()
                        .zip(&wanted)
                        .filter(|(_, w)| **w)
                        .map(|(r, _)| r.key.as_str())
                        .collect();
                }
                let bounds = bounds.next().unwrap_or_default();
                let threshold = if k < bounds.len() {
                    let mut lower: Vec<f32> = bounds.iter().map(|b| b.1).collect();
                    let (_, kth, _) = lower.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
                    *kth
                } else {
                    f32::NEG_INFINITY
                };
                bounds
                    .into_iter()
                    .filter(|&(_, _, upper)| upper >= threshold)
                    .map(|(r, _, _)| self.rows[r].key.as_str())
                    .collect()
            })
            .collect()
    }

    /// For each query, the (row, lower, upper) bounds of the cosine of every wanted row with
    /// it: on a CPU with AVX2, the same arithmetic in wider vector instructions.
    fn bounds(&self, qs: &[&Query], wanted: &[bool]) -> Vec<Vec<(usize, f32, f32)>> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { self.bounds_avx2(qs, wanted) };
        }
        self.bounds_of(qs, wanted)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn bounds_avx2(&self, qs: &[&Query], wanted: &[bool]) -> Vec<Vec<(usize, f32, f32)>> {
        self.bounds_with(qs, wanted, |a, b| dot_avx2(a, b))
    }

    fn bounds_of(&self, qs: &[&Query], wanted: &[bool]) -> Vec<Vec<(usize, f32, f32)>> {
        self.bounds_with(qs, wanted, dot)
    }

    #[inline(always)]
    fn bounds_with(
        &self,
        qs: &[&Query],
        wanted: &[bool],
        dot: impl Fn(&[i16], &[i16]) -> i32,
    ) -> Vec<Vec<(usize, f32, f32)>> {
        let d = self.dimension;
        let mut out: Vec<Vec<(usize, f32, f32)>> = qs
            .iter()
            .map(|_| Vec::with_capacity(self.rows.len()))
            .collect();
        if d == 0 {
            return out;
        }
        for (block, codes) in self.codes.chunks(BLOCK * d).enumerate() {
            let first = block * BLOCK;
            for (q, bounds) in qs.iter().zip(&mut out) {
                for (i, codes) in codes.chunks_exact(d).enumerate() {
                    let (r, row) = (first + i, &self.rows[first + i]);
                    if !wanted[r] {
                        continue;
                    }
                    if row.norm == 0.0 {
                        bounds.push((r, 0.0, 0.0));
                        continue;
                    }
                    let approx = q.coded.scale * row.scale * dot(&q.coded.codes, codes) as f32;
                    let bound = q.norm * row.error
                        + q.coded.error * row.coded_norm
                        + SLACK * q.norm * row.norm;
                    let denominator = q.norm * row.norm;
                    bounds.push((
                        r,
                        (approx - bound) / denominator,
                        (approx + bound) / denominator,
                    ));
                }
            }
        }
        out
    }
}

/// Rows read at a time for every query of a search: 16 rows of 384 codes are 12 KB, which
/// stay in the first-level cache while each query passes over them.
const BLOCK: usize = 16;

/// A query coded once for every scope's codes of one search.
pub(super) struct Query {
    coded: Coded,
    /// Its Euclidean norm.
    norm: f32,
}

impl Query {
    /// `query` coded for codes of `dimension`; `None` when its norm is zero.
    pub(super) fn new(query: &[f32], norm: f32, dimension: usize) -> Option<Query> {
        (query.len() == dimension && norm > 0.0).then(|| Query {
            coded: code(query, levels(dimension)),
            norm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_and_what_it_leaves_out_make_the_vector() {
        let v = [0.5f32, -0.25, 0.0, 1e-3, -1.0];
        let c = code(&v, 127.0);
        assert_eq!(c.codes[4], -127);
        assert_eq!(c.codes[0], 64);
        let back: Vec<f32> = c.codes.iter().map(|x| c.scale * f32::from(*x)).collect();
        let error: f32 = v
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt();
        assert!((error - c.error).abs() < 1e-7);
        assert!(c.error <= 0.5 * c.scale * (v.len() as f32).sqrt());
        let zero = code(&[0.0; 4], 127.0);
        assert_eq!((zero.scale, zero.error, zero.norm), (0.0, 0.0, 0.0));
    }

    #[test]
    fn the_lanes_add_up_to_the_dot_product() {
        let a: Vec<i16> = (0..37).map(|i| (i * 7 % 255 - 127) as i16).collect();
        let b: Vec<i16> = (0..37).map(|i| (127 - i * 5 % 255) as i16).collect();
        let plain: i32 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| i32::from(*x) * i32::from(*y))
            .sum();
        assert_eq!(dot(&a, &b), plain);
        // The largest codes of the default dimension do not overflow.
        let top = levels(384) as i16;
        assert_eq!(top, 2364);
        assert_eq!(
            i64::from(dot(&[-top; 384], &[-top; 384])),
            384 * i64::from(top) * i64::from(top)
        );
        assert_eq!(levels(1), f32::from(i16::MAX));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_dot_product_is_the_same_sum() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        // The largest code for the longest rows tried, so that even their extreme sum fits.
        let top = levels(385) as i16;
        let mut rng = fastrand::Rng::with_seed(3);
        for len in [0, 1, 15, 16, 17, 100, 384, 385] {
            for _ in 0..50 {
                let a: Vec<i16> = (0..len).map(|_| rng.i16(-top..=top)).collect();
                let b: Vec<i16> = (0..len).map(|_| rng.i16(-top..=top)).collect();
                // SAFETY: the CPU has AVX2, checked above.
                assert_eq!(unsafe { dot_avx2(&a, &b) }, dot(&a, &b), "length {len}");
            }
            let extreme = vec![-top; len];
            // SAFETY: as above.
            assert_eq!(
                unsafe { dot_avx2(&extreme, &extreme) },
                dot(&extreme, &extreme)
            );
        }
    }

    #[test]
    fn rows_are_replaced_and_removed_in_place() {
        let mut codes = Codes::new(2);
        codes.levels = 127.0;
        codes.insert("a", ItemKind::Lesson, &[1.0, 0.0], 1.0);
        codes.insert("b", ItemKind::Sop, &[0.0, 1.0], 1.0);
        codes.insert("c", ItemKind::Lesson, &[1.0, 1.0], 2f32.sqrt());
        codes.insert("a", ItemKind::Lesson, &[0.0, -1.0], 1.0);
        assert_eq!(codes.rows.len(), 3);
        codes.remove("a");
        codes.remove("missing");
        assert_eq!(codes.rows.len(), 2);
        assert_eq!(codes.codes.len(), 4);
        // The last row moved into the hole, and its key still finds it.
        let r = codes.row_of["c"];
        assert_eq!(&codes.codes[2 * r..2 * r + 2], &[127, 127]);
        let q = Query::new(&[1.0, 1.0], 2f32.sqrt(), 2);
        assert_eq!(codes.candidates(&[q.as_ref()], 5, &[])[0].len(), 2);
        assert_eq!(
            codes.candidates(&[q.as_ref()], 5, &[ItemKind::Sop]),
            vec![vec!["b"]]
        );
        // A vector of another length keeps the rows' shape and is always a candidate.
        codes.insert("odd", ItemKind::Lesson, &[1.0, 0.0, 5.0], 26f32.sqrt());
        assert_eq!(codes.codes.len(), 6);
        assert!(codes.candidates(&[q.as_ref()], 1, &[])[0].contains(&"odd"));
    }
}
