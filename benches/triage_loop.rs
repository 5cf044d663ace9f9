//! Overhead of the recovery loop: a no-op run that succeeds at once, and a run that fails twice
//! with "HTTP 503" then succeeds with zero backoff (virtual clock, in-memory checkpoints).
//! triage-agent 1.0.1 takes 8.8 µs and 267 µs for the same two runs.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use hindsight::FailureType;
use hindsight::triage::{
    Agent, AgentConfig, Backoff, FailurePolicy, RunError, Strategy, VirtualClock,
};
use serde_json::Value;

/// Polls a future that never waits (virtual clock, in-memory store) to completion.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

fn agent() -> Agent {
    let policy = FailurePolicy::new()
        .on(
            FailureType::ExternalFault,
            Strategy::BackoffAndRetry(Backoff {
                max_attempts: 5,
                base_ms: 0,
                cap_ms: 0,
            }),
        )
        .otherwise(Strategy::escalate_by_default());
    Agent::new(policy, AgentConfig::default()).with_clock(Arc::new(VirtualClock::new(0)))
}

fn bench(c: &mut Criterion) {
    let a = agent();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("triage_loop");
    g.bench_function("noop_success", |b| {
        b.iter(|| {
            let r = ready(a.run("bench", None, Value::Null, |_, _| async {
                Ok::<_, RunError>(1u32)
            }));
            black_box(r.unwrap().calls)
        })
    });
    g.bench_function("two_503_then_success", |b| {
        b.iter(|| {
            let r = ready(a.run("bench", None, Value::Null, |ctx, _| async move {
                if ctx.attempt() < 2 {
                    return Err(RunError::new("HTTP 503"));
                }
                Ok(1u32)
            }));
            let r = r.unwrap();
            assert_eq!(r.calls, 3);
            black_box(r.calls)
        })
    });
    g.bench_function("two_503_then_success_tokio_block_on", |b| {
        b.iter(|| {
            let r = rt.block_on(a.run("bench", None, Value::Null, |ctx, _| async move {
                if ctx.attempt() < 2 {
                    return Err(RunError::new("HTTP 503"));
                }
                Ok(1u32)
            }));
            black_box(r.unwrap().calls)
        })
    });
    g.bench_function("classify_error_503", |b| {
        b.iter(|| {
            black_box(hindsight::triage::classify_error(
                None,
                black_box("HTTP 503"),
            ))
        })
    });
    g.bench_function("normalise_503", |b| {
        b.iter(|| black_box(hindsight::triage::error::normalise(black_box("HTTP 503"))))
    });
    g.bench_function("http_status_503", |b| {
        b.iter(|| black_box(hindsight::triage::error::http_status(black_box("http 503"))))
    });
    g.bench_function("classify_error_unknown", |b| {
        b.iter(|| {
            black_box(hindsight::triage::classify_error(
                None,
                black_box("the model produced an empty answer"),
            ))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
