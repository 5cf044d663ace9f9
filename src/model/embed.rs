//! The offline deterministic embedder: hashed word unigrams, word bigrams and character 3-5-grams
//! folded into a fixed dimension with a stable hash (FNV-1a), sublinear term frequency and L2
//! normalisation, so that cosine similarity detects near-duplicates without any model.

use unicode_normalization::UnicodeNormalization;

use super::{Embedder, ModelError, ModelFuture};

/// The default dimension of [`HashEmbedder`] vectors.
pub const DEFAULT_DIMENSION: usize = 384;

/// Weight of a word unigram relative to a character n-gram.
const WORD_WEIGHT: f32 = 0.5;
/// Weight of a word bigram.
const BIGRAM_WEIGHT: f32 = 0.3;
/// Weight of a character n-gram.
const CHAR_WEIGHT: f32 = 0.35;

/// FNV-1a over bytes, 64 bits: stable across runs, platforms and processes.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// An offline, deterministic [`Embedder`] over hashed n-grams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashEmbedder {
    dimension: usize,
}

impl Default for HashEmbedder {
    fn default() -> Self {
        HashEmbedder {
            dimension: DEFAULT_DIMENSION,
        }
    }
}

impl HashEmbedder {
    /// An embedder of the given dimension (at least 1; 0 is raised to 1).
    pub fn new(dimension: usize) -> HashEmbedder {
        HashEmbedder {
            dimension: dimension.max(1),
        }
    }

    /// Embeds one text synchronously (the embedder is pure).
    pub fn embed_text(&self, text: &str) -> Vec<f32> {
        embed_with_dimension(text, self.dimension)
    }
}

impl Embedder for HashEmbedder {
    fn dimension(&self) -> usize {
        self.dimension
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> ModelFuture<'a, Vec<Vec<f32>>> {
        Box::pin(
            async move { Ok::<_, ModelError>(texts.iter().map(|t| self.embed_text(t)).collect()) },
        )
    }
}

/// Embeds one text with the default dimension ([`DEFAULT_DIMENSION`]).
pub fn embed_one(text: &str) -> Vec<f32> {
    embed_with_dimension(text, DEFAULT_DIMENSION)
}

/// The normalised text: NFKC, lowercased, its words (runs of alphanumeric characters) joined by
/// single spaces.
fn normalised(text: &str) -> String {
    // NFKC leaves ASCII as it is: an ASCII text is only lowercased, without the normaliser.
    let norm: String = if text.is_ascii() {
        text.to_ascii_lowercase()
    } else {
        text.nfkc().collect::<String>().to_lowercase()
    };
    let mut joined = String::with_capacity(norm.len());
    for w in norm
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !joined.is_empty() {
            joined.push(' ');
        }
        joined.push_str(w);
    }
    joined
}

/// FNV-1a of `kind` followed by `parts`, as [`fnv1a`] of their concatenation.
fn fnv1a_parts(kind: u8, parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(&kind).chain(parts.iter().flat_map(|p| p.iter())) {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Embeds `text` into `dimension` buckets. An empty text gives the zero vector.
///
/// Each distinct gram (a word, a pair of adjacent words, or 3 to 5 characters of the words
/// joined by single spaces and padded with one at both ends, not all spaces) is hashed with
/// FNV-1a over its kind byte and its UTF-8 bytes, and adds its weight times `1 + ln(tf)` to the
/// bucket of its hash, signed by the hash's top bit. The grams are hashed in place and counted
/// by sorting their hashes: no string is built per gram.
pub fn embed_with_dimension(text: &str, dimension: usize) -> Vec<f32> {
    let dimension = dimension.max(1);
    let joined = normalised(text);
    // (hash, weight) of every gram occurrence.
    let mut grams: Vec<(u64, f32)> = Vec::with_capacity(6 * joined.len() + 8);
    let mut prev: Option<&str> = None;
    for w in joined.split(' ').filter(|w| !w.is_empty()) {
        grams.push((fnv1a_parts(b'w', &[w.as_bytes()]), WORD_WEIGHT));
        if let Some(p) = prev {
            grams.push((
                fnv1a_parts(b'b', &[p.as_bytes(), b" ", w.as_bytes()]),
                BIGRAM_WEIGHT,
            ));
        }
        prev = Some(w);
    }
    // Character n-grams over " joined ", by byte offsets of its characters.
    let padded = format!(" {joined} ");
    let starts: Vec<usize> = padded
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(padded.len()))
        .collect();
    let chars = starts.len() - 1;
    for n in 3..=5 {
        if chars < n {
            continue;
        }
        for i in 0..=chars - n {
            let gram = &padded[starts[i]..starts[i + n]];
            if gram.bytes().all(|b| b == b' ') {
                continue;
            }
            grams.push((fnv1a_parts(b'c', &[gram.as_bytes()]), CHAR_WEIGHT));
        }
    }
    grams.sort_unstable_by_key(|a| a.0);
    let mut v = vec![0.0f32; dimension];
    let mut i = 0;
    while i < grams.len() {
        let (h, weight) = grams[i];
        let mut tf = 1u32;
        while i + (tf as usize) < grams.len() && grams[i + tf as usize].0 == h {
            tf += 1;
        }
        i += tf as usize;
        let bucket = (h % dimension as u64) as usize;
        let sign = if (h >> 63) & 1 == 1 { -1.0 } else { 1.0 };
        // ln(1) is 0: most grams occur once, and skip the logarithm.
        let sublinear = if tf == 1 { 1.0 } else { 1.0 + (tf as f32).ln() };
        v[bucket] += sign * weight * sublinear;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x /= norm;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cosine;

    #[test]
    fn deterministic_and_normalised() {
        let a = embed_one("avoid pdfminer for png files");
        let b = embed_one("avoid pdfminer for png files");
        assert_eq!(a, b);
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
        assert_eq!(a.len(), DEFAULT_DIMENSION);
        assert!(embed_one("").iter().all(|x| *x == 0.0));
    }

    #[tokio::test]
    async fn trait_matches_sync_helper() {
        let e = HashEmbedder::default();
        let texts = vec!["avoid pdfminer".to_string(), "use ocr".to_string()];
        let got = e.embed(&texts).await.unwrap();
        assert_eq!(got, vec![embed_one(&texts[0]), embed_one(&texts[1])]);
        assert_eq!(e.dimension(), DEFAULT_DIMENSION);
        assert_eq!(HashEmbedder::new(64).embed_text("x y").len(), 64);
    }

    /// The embedder as first written (a map of gram strings), to hold the in-place hashing to.
    fn reference(text: &str, dimension: usize) -> Vec<f32> {
        use std::collections::HashMap;
        let norm: String = text.nfkc().collect::<String>().to_lowercase();
        let words: Vec<String> = norm
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        let mut counts: HashMap<(u8, String), u32> = HashMap::new();
        for w in &words {
            *counts.entry((b'w', w.clone())).or_insert(0) += 1;
        }
        for pair in words.windows(2) {
            *counts
                .entry((b'b', format!("{} {}", pair[0], pair[1])))
                .or_insert(0) += 1;
        }
        let joined: Vec<char> = format!(" {} ", words.join(" ")).chars().collect();
        for n in 3..=5 {
            if joined.len() < n {
                continue;
            }
            for gram in joined.windows(n) {
                let g: String = gram.iter().collect();
                if g.trim().is_empty() {
                    continue;
                }
                *counts.entry((b'c', g)).or_insert(0) += 1;
            }
        }
        let mut v = vec![0.0f32; dimension];
        for ((kind, gram), tf) in &counts {
            let weight = match kind {
                b'w' => WORD_WEIGHT,
                b'b' => BIGRAM_WEIGHT,
                _ => CHAR_WEIGHT,
            };
            let mut bytes = vec![*kind];
            bytes.extend_from_slice(gram.as_bytes());
            let h = fnv1a(&bytes);
            let sign = if (h >> 63) & 1 == 1 { -1.0 } else { 1.0 };
            v[(h % dimension as u64) as usize] += sign * weight * (1.0 + (*tf as f32).ln());
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x /= norm;
            }
        }
        v
    }

    #[test]
    fn hashing_in_place_gives_the_map_of_grams_vectors() {
        let texts = [
            "",
            "a",
            "ab",
            "Convert the pdf bank statement (10-50MB) of tenant B to CSV",
            "the the the the cat sat on the the mat",
            "Ünïcödé ﬁle naïve café — ＦＵＬＬＷＩＤＴＨ 123 x",
            "  leading and trailing   spaces  ",
            "run run-1 of filetype=pdf size_bucket=0-10MB ended failed: ocr_v3 at extract (Timeout)",
        ];
        for text in texts {
            for dim in [1, 7, DEFAULT_DIMENSION] {
                let (a, b) = (embed_with_dimension(text, dim), reference(text, dim));
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() < 1e-5, "{text:?} at {dim}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn fnv_known_vector() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn paraphrase_high_unrelated_low() {
        let pairs = [
            (
                "For PNG files avoid pdfminer direct extraction: it fails with ToolNotFit 9 of 10",
                "For png files, avoid pdfminer direct extraction; it fails with ToolNotFit 9 of 10 times",
            ),
            (
                "Check the date argument format before calling the statement parser tool",
                "check the date argument format before calling the statement-parser tool!",
            ),
            (
                "Use camelot lattice for scanned PDF statements larger than 10 MB",
                "Use camelot lattice for scanned PDF statement larger than 10 MB",
            ),
        ];
        for (a, b) in pairs {
            let s = cosine(&embed_one(a), &embed_one(b));
            assert!(s > 0.92, "{s} for {a:?} / {b:?}");
        }
        let reworded = cosine(
            &embed_one("Check the date argument format before calling the statement parser tool"),
            &embed_one("Check the date argument format before you call the statement parser tool"),
        );
        assert!(reworded > 0.8, "{reworded}");
        let s = cosine(
            &embed_one("For PNG files avoid pdfminer direct extraction"),
            &embed_one("The weather in Lisbon is sunny and warm today"),
        );
        assert!(s < 0.5, "{s}");
    }
}
