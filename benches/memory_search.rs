//! Memory's search, which every run's retrieval makes: the `k` items most like the task among
//! the shared items (SOPs, postmortems) and those of the task's own scopes, in an index shaped
//! like `hindsight bench overhead`'s (10,000 lessons in 500 users' scopes, 1,000 SOPs and 200
//! postmortems shared). Against the same search done by scoring every item the task may read on
//! its full vector (the baseline, in the same run); both give the same items. And a burst of 64
//! searches made together (`VectorIndex::search_many`, as memory answers the retrievals queued
//! behind one another), against the same 64 made one by one; then the same burst when its
//! tasks share 12 texts, as bank statements' do. And the embedding of a reflection lesson's
//! text, which memory makes for each lesson a consolidation changed: an ASCII text, against the
//! same text with one accented letter, which takes the Unicode normaliser's path.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hindsight::memory::{ItemKind, Scopes, VectorIndex, VectorItem};
use hindsight::model::cosine;
use hindsight::model::embed::embed_one;

const TOOLS: [&str; 6] = [
    "ocr_v3",
    "pdfminer",
    "tabula",
    "strict_table",
    "csv_writer",
    "validator",
];
const STRATEGIES: [&str; 5] = ["chunk_1mb", "whole_file", "lenient", "strict", "retry_3"];
const FEATURES: [&str; 7] = [
    "filetype=pdf",
    "filetype=png",
    "size_bucket=0-10MB",
    "size_bucket=10-50MB",
    "size_bucket=50-100MB",
    "tenant=A",
    "tenant=B",
];

fn pick<'a>(rng: &mut fastrand::Rng, of: &[&'a str]) -> &'a str {
    of[rng.usize(..of.len())]
}

fn item(kind: ItemKind, id: String, text: String, scope: Option<String>) -> VectorItem {
    VectorItem {
        kind,
        id,
        vector: embed_one(&text),
        text,
        cluster: None,
        time_ms: 0,
        scope,
    }
}

/// The index, and every item's (scope, vector) for the baseline.
fn index() -> (VectorIndex, Vec<VectorItem>) {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut items = Vec::new();
    for u in 0..500 {
        for l in 0..20 {
            let text = format!(
                "for {}, {} {} with {}: {} failed with Timeout on large files",
                pick(&mut rng, &FEATURES),
                pick(&mut rng, &FEATURES),
                pick(&mut rng, &TOOLS),
                pick(&mut rng, &STRATEGIES),
                pick(&mut rng, &TOOLS),
            );
            items.push(item(
                ItemKind::Lesson,
                format!("lesson-{u}-{l}"),
                text,
                Some(format!("user:u{u}")),
            ));
        }
    }
    for s in 0..1_000 {
        let plan: Vec<String> = ["extract", "normalize", "write", "check"]
            .iter()
            .map(|stage| {
                format!(
                    "{stage} with {}/{}",
                    pick(&mut rng, &TOOLS),
                    pick(&mut rng, &STRATEGIES)
                )
            })
            .collect();
        let text = format!("SOP sop-{s} v1: {}", plan.join(", then "));
        items.push(item(ItemKind::Sop, format!("sop-{s}"), text, None));
    }
    for p in 0..200 {
        let text = format!(
            "run-{p} failed: {} with {} returned SchemaMismatch for {}",
            pick(&mut rng, &TOOLS),
            pick(&mut rng, &STRATEGIES),
            pick(&mut rng, &FEATURES),
        );
        items.push(item(ItemKind::Postmortem, format!("pm-{p}"), text, None));
    }
    let mut index = VectorIndex::new(items[0].vector.len());
    for it in &items {
        index.upsert(it.clone()).ok();
    }
    (index, items)
}

/// The baseline: every item the scopes allow scored on its full vector, the `k` best.
fn exhaustive<'a>(items: &'a [VectorItem], query: &[f32], k: usize, scope: &str) -> Vec<&'a str> {
    let mut scored: Vec<(f32, &str)> = items
        .iter()
        .filter(|it| it.scope.as_deref().is_none_or(|s| s == scope))
        .map(|it| (cosine(query, &it.vector), it.id.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().take(k).map(|(_, id)| id).collect()
}

/// 64 tasks' queries and their users' scopes; with `distinct`, each text names its statement.
fn queries(distinct: bool) -> Vec<(Vec<f32>, String)> {
    (0..64)
        .map(|i| {
            let text = format!(
                "Convert the {} bank statement ({}) of tenant {} to CSV{}",
                ["pdf", "png"][i % 2],
                ["0-10MB", "10-50MB", "50-100MB"][i % 3],
                ["A", "B"][i % 4 / 2],
                if distinct {
                    format!(", statement {i}")
                } else {
                    String::new()
                },
            );
            (embed_one(&text), format!("user:u{}", i * 7 % 500))
        })
        .collect()
}

/// The searches of `queries` in their scopes, as one burst.
fn burst<'a>(
    queries: &'a [(Vec<f32>, String)],
    scopes: &'a [[String; 1]],
) -> Vec<(&'a [f32], Scopes<'a>)> {
    queries
        .iter()
        .zip(scopes)
        .map(|((q, _), s)| (q.as_slice(), Scopes::Only(s)))
        .collect()
}

fn search(c: &mut Criterion) {
    let (index, items) = index();
    let k = 15;
    let (distinct, shared) = (queries(true), queries(false));
    let scopes_of = |queries: &[(Vec<f32>, String)]| -> Vec<[String; 1]> {
        queries.iter().map(|(_, s)| [s.clone()]).collect()
    };
    let (distinct_scopes, shared_scopes) = (scopes_of(&distinct), scopes_of(&shared));
    let (distinct_burst, shared_burst) = (
        burst(&distinct, &distinct_scopes),
        burst(&shared, &shared_scopes),
    );
    for (queries, burst) in [(&distinct, &distinct_burst), (&shared, &shared_burst)] {
        let together = index.search_many(burst, k, &[]);
        for ((q, scope), found) in queries.iter().zip(together) {
            let scopes = [scope.clone()];
            let alone: Vec<&str> = index
                .search(q, k, &[], Scopes::Only(&scopes))
                .into_iter()
                .map(|(it, _)| it.id.as_str())
                .collect();
            let found: Vec<&str> = found.into_iter().map(|(it, _)| it.id.as_str()).collect();
            assert_eq!(alone, exhaustive(&items, q, k, scope), "the same items");
            assert_eq!(found, alone, "the same items together");
        }
    }
    let mut group = c.benchmark_group("memory_search");
    group.throughput(Throughput::Elements(1));
    group.bench_function("index", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % distinct.len();
            let (q, scope) = &distinct[i];
            let scopes = [scope.clone()];
            black_box(index.search(q, k, &[], Scopes::Only(&scopes)).len())
        })
    });
    group.bench_function("exhaustive", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % distinct.len();
            let (q, scope) = &distinct[i];
            black_box(exhaustive(&items, q, k, scope).len())
        })
    });
    group.throughput(Throughput::Elements(64));
    group.bench_function("index, 64 one by one", |b| {
        b.iter(|| {
            distinct_burst
                .iter()
                .map(|(q, s)| black_box(index.search(q, k, &[], *s).len()))
                .sum::<usize>()
        })
    });
    group.bench_function("index, 64 together", |b| {
        b.iter(|| black_box(index.search_many(&distinct_burst, k, &[]).len()))
    });
    group.bench_function("index, 64 together, 12 texts", |b| {
        b.iter(|| black_box(index.search_many(&shared_burst, k, &[]).len()))
    });
    group.finish();
}

fn embed(c: &mut Criterion) {
    let text = "for bank=acme, doc=pdf prefer pdfminer/chunk_1mb at stage extract: passed 14 of 15";
    let accented = text.replace("acme", "acmé");
    let mut group = c.benchmark_group("memory_embed");
    group.throughput(Throughput::Elements(1));
    group.bench_function("ascii lesson", |b| {
        b.iter(|| black_box(embed_one(black_box(text))))
    });
    group.bench_function("one accent (normaliser)", |b| {
        b.iter(|| black_box(embed_one(black_box(&accented))))
    });
    group.finish();
}

criterion_group!(benches, search, embed);
criterion_main!(benches);
