//! The resilient runner on a paused tokio clock: backoff schedule and jitter bounds, Retry-After,
//! breaker transitions, bulkhead limit, budget cut-off, idempotent replay, validation.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight::taxonomy::{ErrorClass, FailureCategory};
use hindsight::tools::{
    BreakerConfig, BreakerState, Budget, CallContext, CallOptions, Clock, CostModel,
    IdempotencyStore, MemoryIdempotency, ResiliencePolicy, RetryPolicy, StopReason, TokioClock,
    Tool, ToolError, ToolFuture, ToolOutput, ToolRegistry, ToolRunner, ToolSpec, VirtualClock,
};
use serde_json::{Value, json};

/// A tool that plays a script of outcomes (then repeats the last), counting calls and tracking
/// how many run at once.
struct Scripted {
    spec: ToolSpec,
    script: Mutex<VecDeque<Result<ToolOutput, ToolError>>>,
    last: Mutex<Option<Result<ToolOutput, ToolError>>>,
    calls: AtomicU32,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    sleep_ms: u64,
}

impl Scripted {
    fn new(name: &str, script: Vec<Result<ToolOutput, ToolError>>) -> Scripted {
        let mut spec = ToolSpec::new(name, "scripted test tool");
        spec.idempotent = true;
        spec.input_schema = json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}, "text": {"type": "string"}},
            "required": ["n"],
        });
        Scripted {
            spec,
            script: Mutex::new(script.into()),
            last: Mutex::new(None),
            calls: AtomicU32::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            sleep_ms: 0,
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Tool for Scripted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            if self.sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let next = self.script.lock().unwrap().pop_front();
            let r = match next {
                Some(r) => {
                    *self.last.lock().unwrap() = Some(r.clone());
                    r
                }
                None => self
                    .last
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or(Ok(ok(args.clone()))),
            };
            r.map(|mut o| {
                if o.value.is_null() {
                    o.value = args;
                }
                o
            })
        })
    }
}

fn ok(value: Value) -> ToolOutput {
    ToolOutput {
        value,
        latency_ms: 5.0,
        cost: 0.001,
    }
}

fn infra(class: ErrorClass) -> ToolError {
    ToolError::new(class, FailureCategory::Infrastructure, "boom").with_usage(5.0, 0.001)
}

fn runner_with(tool: Arc<Scripted>, policy: ResiliencePolicy) -> ToolRunner {
    let mut reg = ToolRegistry::new();
    reg.register(tool.clone()).unwrap();
    ToolRunner::new(Arc::new(reg), Arc::new(TokioClock::new()), 7)
        .with_policy(&tool.spec.name, policy)
}

fn policy(max_attempts: u32, base_ms: u64, max_ms: u64) -> ResiliencePolicy {
    ResiliencePolicy {
        retry: RetryPolicy {
            max_attempts,
            base_ms,
            max_ms,
            ..RetryPolicy::default()
        },
        breaker: BreakerConfig {
            enabled: false,
            ..BreakerConfig::default()
        },
        ..ResiliencePolicy::default()
    }
}

/// How a call of a tool that first fails with `error`, then succeeds, stops under five
/// attempts, and how many times the tool was called.
async fn after_one_failure(error: ToolError) -> (StopReason, u32) {
    let tool = Arc::new(Scripted::new("t", vec![Err(error), Ok(ok(Value::Null))]));
    let runner = runner_with(tool.clone(), policy(5, 10, 10));
    let r = runner
        .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    (r.stop, tool.calls())
}

fn ctx() -> CallContext {
    CallContext {
        run_id: "run-1".into(),
        stage: "s".into(),
        ..CallContext::default()
    }
}

#[tokio::test(start_paused = true)]
async fn backoff_schedule_is_jittered_within_bounds_and_really_waits() {
    let script = vec![
        Err(infra(ErrorClass::TransientNetwork)),
        Err(infra(ErrorClass::TransientNetwork)),
        Err(infra(ErrorClass::Timeout)),
        Ok(ok(Value::Null)),
    ];
    let tool = Arc::new(Scripted::new("t", script.clone()));
    let runner = runner_with(tool.clone(), policy(5, 100, 250));
    let start = tokio::time::Instant::now();
    let report = runner
        .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    let elapsed = start.elapsed().as_millis() as u64;
    assert_eq!(report.stop, StopReason::Succeeded);
    assert_eq!(report.attempts.len(), 4);
    assert_eq!(tool.calls(), 4);
    let ceilings = [0, 100, 200, 250];
    let mut waited = 0;
    for (a, ceiling) in report.attempts.iter().zip(ceilings) {
        assert!(
            a.wait_ms <= ceiling,
            "wait {} > ceiling {ceiling}",
            a.wait_ms
        );
        waited += a.wait_ms;
    }
    assert_eq!(
        report.attempts.iter().map(|a| a.call).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(elapsed, waited, "the real (paused) clock slept the backoff");
    assert!((report.total_latency_ms - (waited as f64 + 20.0)).abs() < 1e-9);
    assert_eq!(report.next_call, 4);

    // Same seed and coordinates: the same schedule.
    let tool2 = Arc::new(Scripted::new("t", script));
    let again = runner_with(tool2, policy(5, 100, 250))
        .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    let w =
        |r: &hindsight::tools::CallReport| r.attempts.iter().map(|a| a.wait_ms).collect::<Vec<_>>();
    assert_eq!(w(&report), w(&again));
}

#[test]
fn full_jitter_spans_the_ceiling() {
    let p = RetryPolicy {
        base_ms: 100,
        max_ms: 1000,
        ..RetryPolicy::default()
    };
    assert_eq!(
        [
            p.ceiling_ms(0),
            p.ceiling_ms(1),
            p.ceiling_ms(3),
            p.ceiling_ms(4),
            p.ceiling_ms(80)
        ],
        [100, 200, 800, 1000, 1000]
    );
    let mut rng = fastrand::Rng::with_seed(1);
    let draws: Vec<u64> = (0..5000).map(|_| p.delay_ms(2, None, &mut rng)).collect();
    assert!(draws.iter().all(|d| *d <= 400));
    let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
    assert!((mean - 200.0).abs() < 10.0, "mean {mean}");
    assert!(draws.iter().any(|d| *d < 40) && draws.iter().any(|d| *d > 360));
    assert!((0..100).all(|_| p.delay_ms(0, Some(700), &mut rng) == 700));
    let no = RetryPolicy {
        honour_retry_after: false,
        ..p
    };
    assert!((0..100).all(|_| no.delay_ms(0, Some(700), &mut rng) <= 100));
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    let script = vec![
        Err(infra(ErrorClass::RateLimit).with_retry_after(Some(700))),
        Ok(ok(Value::Null)),
    ];
    let tool = Arc::new(Scripted::new("t", script));
    let runner = runner_with(tool.clone(), policy(3, 10, 50));
    let start = tokio::time::Instant::now();
    let report = runner
        .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    assert_eq!(report.stop, StopReason::Succeeded);
    assert_eq!(report.attempts[1].wait_ms, 700);
    assert_eq!(start.elapsed(), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn breaker_opens_refuses_then_half_opens_and_closes() {
    let tool = Arc::new(Scripted::new(
        "t",
        vec![Err(infra(ErrorClass::TransientNetwork))],
    ));
    let mut p = policy(1, 10, 10);
    p.breaker = BreakerConfig {
        enabled: true,
        window: 4,
        min_calls: 4,
        failure_rate: 0.5,
        open_ms: 1000,
        half_open_probes: 1,
    };
    let runner = runner_with(tool.clone(), p);
    let o = CallOptions::default();
    for _ in 0..4 {
        assert_eq!(runner.breaker_state("t"), BreakerState::Closed);
        runner.call("t", json!({"n": 1}), &ctx(), &o).await;
    }
    assert_eq!(runner.breaker_state("t"), BreakerState::Open);
    let refused = runner.call("t", json!({"n": 1}), &ctx(), &o).await;
    assert_eq!(tool.calls(), 4, "an open breaker does not call the tool");
    let e = refused.result.unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (
            ErrorClass::TransientNetwork,
            FailureCategory::Infrastructure
        )
    );
    assert!(e.message.contains("circuit breaker open"), "{}", e.message);
    assert!(e.retry_after_ms.is_some_and(|ms| ms <= 1000));

    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(runner.breaker_state("t"), BreakerState::HalfOpen);
    // A failing probe opens it again.
    runner.call("t", json!({"n": 1}), &ctx(), &o).await;
    assert_eq!(tool.calls(), 5);
    assert_eq!(runner.breaker_state("t"), BreakerState::Open);
    tokio::time::advance(Duration::from_millis(1000)).await;
    tool.script.lock().unwrap().push_back(Ok(ok(Value::Null)));
    let probe = runner.call("t", json!({"n": 1}), &ctx(), &o).await;
    assert!(probe.result.is_ok());
    assert_eq!(runner.breaker_state("t"), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn bulkhead_limits_concurrency_and_rejects_after_waiting() {
    let mut t = Scripted::new("t", vec![Ok(ok(Value::Null))]);
    t.sleep_ms = 100;
    let tool = Arc::new(t);
    let mut p = policy(1, 10, 10);
    p.max_concurrency = Some(2);
    let runner = Arc::new(runner_with(tool.clone(), p));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let r = runner.clone();
        set.spawn(async move {
            r.call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
                .await
        });
    }
    let start = tokio::time::Instant::now();
    while let Some(r) = set.join_next().await {
        assert!(r.unwrap().result.is_ok());
    }
    assert_eq!(tool.max_in_flight.load(Ordering::SeqCst), 2);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(300),
        "6 calls of 100 ms, 2 at a time"
    );

    let mut t = Scripted::new("u", vec![Ok(ok(Value::Null))]);
    t.sleep_ms = 100;
    let tool = Arc::new(t);
    let mut p = policy(1, 10, 10);
    p.max_concurrency = Some(1);
    p.bulkhead_wait_ms = Some(10);
    let runner = Arc::new(runner_with(tool.clone(), p));
    let (c, o) = (ctx(), CallOptions::default());
    let (a, b) = tokio::join!(
        runner.call("u", json!({"n": 1}), &c, &o),
        runner.call("u", json!({"n": 2}), &c, &o),
    );
    let errors: Vec<_> = [a, b].into_iter().filter_map(|r| r.result.err()).collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].class, ErrorClass::RateLimit);
    assert!(errors[0].message.contains("bulkhead"));
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_cannot_pay() {
    let fail = ToolError::new(
        ErrorClass::TransientNetwork,
        FailureCategory::Infrastructure,
        "down",
    )
    .with_usage(400.0, 0.01);
    let mut t = Scripted::new("t", vec![Err(fail)]);
    t.spec.cost = CostModel {
        per_call: 0.01,
        expected_latency_ms: 400.0,
    };
    let tool = Arc::new(t);
    let runner = runner_with(tool.clone(), policy(10, 100, 100));
    let opts = CallOptions {
        budget: Budget {
            latency_ms: Some(1000.0),
            cost: None,
        },
        idempotency_key: None,
    };
    let r = runner.call("t", json!({"n": 1}), &ctx(), &opts).await;
    // 400 + wait(<=100) + 400 fits in 1000; a third attempt would not.
    assert_eq!(r.stop, StopReason::BudgetExhausted);
    assert_eq!(r.attempts.len(), 2);
    assert!(r.total_latency_ms <= 1000.0);

    let opts = CallOptions {
        budget: Budget {
            latency_ms: None,
            cost: Some(0.035),
        },
        idempotency_key: None,
    };
    let r = runner.call("t", json!({"n": 1}), &ctx(), &opts).await;
    assert_eq!(r.stop, StopReason::BudgetExhausted);
    assert_eq!(
        r.attempts.len(),
        3,
        "0.03 spent, a fourth call would pass 0.035"
    );
    assert!((r.total_cost - 0.03).abs() < 1e-12);
}

#[tokio::test(start_paused = true)]
async fn idempotent_replay_returns_the_recorded_result_without_calling() {
    let tool = Arc::new(Scripted::new(
        "t",
        vec![Ok(ToolOutput {
            value: json!({"id": 42}),
            latency_ms: 12.0,
            cost: 0.5,
        })],
    ));
    let store = Arc::new(MemoryIdempotency::new());
    let runner = runner_with(tool.clone(), policy(3, 10, 10)).with_idempotency(store.clone());
    let opts = CallOptions {
        idempotency_key: Some("k1".into()),
        ..CallOptions::default()
    };
    let first = runner.call("t", json!({"n": 1}), &ctx(), &opts).await;
    assert!(!first.replayed);
    assert_eq!(tool.calls(), 1);
    assert_eq!(
        store.get("k1").await.unwrap().unwrap()["value"],
        json!({"id": 42})
    );
    // The tool would now answer something else; the record wins.
    tool.script
        .lock()
        .unwrap()
        .push_back(Ok(ok(json!({"id": 43}))));
    let second = runner.call("t", json!({"n": 1}), &ctx(), &opts).await;
    assert!(second.replayed);
    assert_eq!(second.stop, StopReason::Replayed);
    assert_eq!(tool.calls(), 1, "not called again");
    assert_eq!(second.result.unwrap().value, json!({"id": 42}));
    assert!(second.attempts.is_empty());
    // Another key calls.
    let other = CallOptions {
        idempotency_key: Some("k2".into()),
        ..CallOptions::default()
    };
    runner.call("t", json!({"n": 1}), &ctx(), &other).await;
    assert_eq!(tool.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn strategy_failures_and_non_idempotent_tools_are_not_retried() {
    let strat = ToolError::new(ErrorClass::SchemaMismatch, FailureCategory::Strategy, "bad");
    assert_eq!(
        after_one_failure(strat).await,
        (StopReason::StrategyFailure, 1)
    );

    let mut t = Scripted::new(
        "w",
        vec![
            Err(infra(ErrorClass::TransientNetwork)),
            Ok(ok(Value::Null)),
        ],
    );
    t.spec.idempotent = false;
    let tool = Arc::new(t);
    let runner = runner_with(tool.clone(), policy(5, 10, 10));
    let r = runner
        .call("w", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    assert_eq!(r.stop, StopReason::NotRetryable);
    // With an idempotency key it may be retried.
    let opts = CallOptions {
        idempotency_key: Some("k".into()),
        ..CallOptions::default()
    };
    tool.script.lock().unwrap().clear();
    tool.script.lock().unwrap().extend([
        Err(infra(ErrorClass::TransientNetwork)),
        Ok(ok(Value::Null)),
    ]);
    let r = runner.call("w", json!({"n": 1}), &ctx(), &opts).await;
    assert_eq!(r.stop, StopReason::Succeeded);
    assert_eq!(r.attempts.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn bad_arguments_and_unknown_tools_are_rejected_before_calling() {
    let tool = Arc::new(Scripted::new("t", vec![]));
    let runner = runner_with(tool.clone(), policy(3, 10, 10));
    let r = runner
        .call("t", json!({"n": "one"}), &ctx(), &CallOptions::default())
        .await;
    let e = r.result.unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::SchemaMismatch, FailureCategory::Strategy)
    );
    assert!(e.message.contains("/n"), "{}", e.message);
    let e = runner
        .call("t", json!({"text": "x"}), &ctx(), &CallOptions::default())
        .await
        .result
        .unwrap_err();
    assert!(
        e.message.contains("/n") && e.message.contains("required"),
        "{}",
        e.message
    );
    assert_eq!(tool.calls(), 0);
    let r = runner
        .call("nope", json!({}), &ctx(), &CallOptions::default())
        .await;
    assert_eq!(r.stop, StopReason::Rejected);
    assert_eq!(r.result.unwrap_err().class, ErrorClass::NotFound);
}

#[tokio::test(start_paused = true)]
async fn a_hung_call_times_out() {
    let mut t = Scripted::new("t", vec![Ok(ok(Value::Null))]);
    t.sleep_ms = 60_000;
    let tool = Arc::new(t);
    let mut p = policy(2, 10, 10);
    p.timeout_ms = Some(1000);
    let runner = runner_with(tool.clone(), p);
    let start = tokio::time::Instant::now();
    let r = runner
        .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
        .await;
    let e = r.result.unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::Timeout, FailureCategory::Infrastructure)
    );
    assert_eq!(r.attempts.len(), 2);
    assert!(start.elapsed() >= Duration::from_millis(2000));
    assert!(start.elapsed() < Duration::from_millis(2100));
}

/// An async-capable store, as the redb store is (a yield before answering).
#[derive(Default)]
struct SlowStore(MemoryIdempotency);

impl IdempotencyStore for SlowStore {
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> hindsight::tools::idempotency::IdempotencyFuture<'a, Option<Value>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.0.get(key).await
        })
    }
    fn put<'a>(
        &'a self,
        key: &'a str,
        value: &'a Value,
    ) -> hindsight::tools::idempotency::IdempotencyFuture<'a, ()> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            self.0.put(key, value).await
        })
    }
}

#[tokio::test]
async fn virtual_clock_adds_waits_to_latency_and_never_sleeps() {
    let env = hindsight::tools::sim::SimEnv::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/envs/bank_statements.toml"
    )))
    .unwrap()
    .with_seed(3);
    let mut reg = ToolRegistry::new();
    for t in env.tools() {
        reg.register(t).unwrap();
    }
    let clock = Arc::new(VirtualClock::new());
    let runner = ToolRunner::new(Arc::new(reg), clock.clone(), 1)
        .with_default_policy(policy(4, 1000, 8000))
        .with_idempotency(Arc::new(SlowStore::default()));
    let wall = std::time::Instant::now();
    let mut retried = 0;
    let mut sum_latency = 0.0;
    for i in 0..300 {
        let task = env.draw_task(3, i);
        let c = CallContext {
            run_id: format!("r{i}"),
            task_index: i,
            stage: "extract".into(),
            features: task.features.clone(),
            ..CallContext::default()
        };
        let opts = CallOptions {
            idempotency_key: Some(format!("k{i}")),
            ..CallOptions::default()
        };
        let r = runner
            .call("pdfminer", json!({"strategy": "direct"}), &c, &opts)
            .await;
        sum_latency += r.total_latency_ms;
        if r.attempts.len() > 1 {
            retried += 1;
            let waits: u64 = r.attempts.iter().map(|a| a.wait_ms).sum();
            let lat: f64 = r.attempts.iter().map(|a| a.latency_ms).sum();
            assert!((r.total_latency_ms - (lat + waits as f64)).abs() < 1e-6);
            assert!(r.attempts[0].category == Some(FailureCategory::Infrastructure));
        }
        let again = runner
            .call("pdfminer", json!({"strategy": "direct"}), &c, &opts)
            .await;
        assert_eq!(again.replayed, r.result.is_ok());
    }
    assert!(
        retried > 0,
        "4% infra faults over 300 tasks give some retries"
    );
    assert!(clock.now_ms() as f64 >= sum_latency - 300.0);
    assert!(wall.elapsed() < Duration::from_secs(5), "nothing was slept");
}

#[tokio::test(start_paused = true)]
async fn the_spec_rate_limit_spaces_calls() {
    let mut t = Scripted::new("t", vec![Ok(ok(Value::Null))]);
    t.spec.rate_limit = Some(hindsight::tools::RateLimit {
        calls: 2,
        per_ms: 1000,
    });
    let tool = Arc::new(t);
    let runner = runner_with(tool.clone(), policy(1, 10, 10));
    let start = tokio::time::Instant::now();
    let mut waits = Vec::new();
    for _ in 0..5 {
        let r = runner
            .call("t", json!({"n": 1}), &ctx(), &CallOptions::default())
            .await;
        waits.push(r.attempts[0].wait_ms);
    }
    // Two calls per second: calls 3-4 wait for the first window, call 5 for the second.
    assert_eq!(waits, [0, 0, 1000, 0, 1000]);
    assert_eq!(start.elapsed(), Duration::from_millis(2000));
}

/// A timeout a tool reports in words is retried, unless its message asks for another argument:
/// the same call would time out again.
#[tokio::test(start_paused = true)]
async fn a_timeout_that_asks_for_another_argument_is_not_retried() {
    let asks = ToolError::classified(
        Some("TimeoutError"),
        "copy timed out after 300 s: apac clickstream days are large, pass timeout_s=3600",
    );
    assert_eq!(asks.class, ErrorClass::Timeout);
    assert_eq!(
        after_one_failure(asks).await,
        (StopReason::StrategyFailure, 1)
    );
    let plain = ToolError::classified(Some("TimeoutError"), "request timed out after 30000 ms");
    assert_eq!(after_one_failure(plain).await, (StopReason::Succeeded, 2));
}
