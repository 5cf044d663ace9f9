//! A policy's choice draws each arm's posterior hundreds of times (every information-directed
//! draw samples every arm 32 times, and the first choice after a result makes 33 draws): a Beta
//! prepared once (`BetaDraw`) against `sample_beta` preparing it at every variate, on the three
//! kinds of posterior an arm can have (both shapes large: the normal approximation; small: two
//! gammas; below 1: boosted gammas). Both give the same variates from the same stream.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use hindsight::learn::posterior::{BetaDraw, sample_beta};

const DRAWS: usize = 1_000;

fn draws(c: &mut Criterion) {
    let mut group = c.benchmark_group("beta_draws");
    for (name, a, b) in [
        ("normal", 40.0, 60.0),
        ("gammas", 3.0, 5.0),
        ("boosted", 0.5, 2.0),
    ] {
        group.bench_with_input(
            BenchmarkId::new("prepared", name),
            &(a, b),
            |bench, &(a, b)| {
                let mut rng = fastrand::Rng::with_seed(7);
                let beta = BetaDraw::new(a, b);
                bench.iter(|| {
                    let mut s = 0.0;
                    for _ in 0..DRAWS {
                        s += beta.sample(&mut rng);
                    }
                    black_box(s)
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("each_time", name),
            &(a, b),
            |bench, &(a, b)| {
                let mut rng = fastrand::Rng::with_seed(7);
                bench.iter(|| {
                    let mut s = 0.0;
                    for _ in 0..DRAWS {
                        s += sample_beta(&mut rng, black_box(a), black_box(b));
                    }
                    black_box(s)
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, draws);
criterion_main!(benches);
