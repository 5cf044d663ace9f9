//! The lookup of the SOP a task's features match (the stable one and the candidate on trial),
//! which every first attempt's choice makes: through the book's index, against reading every
//! SOP (the same book read back without its index), in books of 1,000 and 10,000 SOPs where one
//! in ten applies to every tenant and the rest to a tenant of their own.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use hindsight::learn::sop::{SopBook, SopConfig};
use hindsight::{Sop, SopStatus};

fn features(i: usize) -> BTreeMap<String, String> {
    [
        ("filetype", ["pdf", "png", "docx"][i % 3]),
        ("language", ["en", "de", "fr", "es"][i % 4]),
        ("layout", ["single", "multi"][i % 2]),
        ("pages", ["few", "many"][(i / 2) % 2]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn sop(i: usize) -> Sop {
    let mut preconditions = features(i);
    if !i.is_multiple_of(10) {
        preconditions.insert("tenant".to_string(), format!("T{i}"));
    }
    Sop {
        sop_id: format!("sop-{i}"),
        version: 1,
        preconditions,
        plan: Vec::new(),
        status: SopStatus::Stable,
        successes: 40,
        trials: 42,
        baseline_successes: 30,
        baseline_trials: 42,
        p_value: Some(0.01),
        evidence: Vec::new(),
        created_ms: 0,
        updated_ms: 0,
        procedure: Vec::new(),
    }
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("sop_lookup");
    for n in [1_000, 10_000] {
        let mut read_back = SopBook::new(SopConfig::default());
        read_back.sops = (0..n).map(sop).collect();
        let indexed = SopBook::restore(read_back.clone());
        let tasks: Vec<BTreeMap<String, String>> = (0..64).map(features).collect();
        for (name, book) in [("indexed", &indexed), ("every_sop", &read_back)] {
            group.bench_with_input(BenchmarkId::new(name, n), &tasks, |b, tasks| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % tasks.len();
                    black_box(book.matching(&tasks[i]))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
