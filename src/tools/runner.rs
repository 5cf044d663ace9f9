//! The resilient caller: every tool call goes through [`ToolRunner::call`], which validates the
//! arguments, answers from the idempotency record when there is one, and otherwise calls the tool
//! through its rate limit, circuit breaker, bulkhead and timeout, retrying infrastructure
//! failures with seeded, jittered exponential backoff while the budget can pay for another try.
//! Strategy failures are returned at once (they go back to triage).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::breaker::{BreakerState, CircuitBreaker};
use super::clock::Clock;
use super::idempotency::{IdempotencyStore, MemoryIdempotency};
use super::policy::ResiliencePolicy;
use super::registry::{ToolRegistry, unknown_tool};
use super::sim::rng::SeedHasher;
use super::tool::{CallContext, ToolError, ToolOutput};
use crate::taxonomy::{ErrorClass, FailureCategory};

/// What the caller can still spend on this call (retries included).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// Remaining latency in milliseconds (`None`: unlimited).
    pub latency_ms: Option<f64>,
    /// Remaining cost (`None`: unlimited).
    pub cost: Option<f64>,
}

/// Options of one call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallOptions {
    /// What the call may spend.
    pub budget: Budget,
    /// Records the result under this key; a later call with the key is answered from the record.
    pub idempotency_key: Option<String>,
}

/// One attempt of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The call number the tool saw (`ctx.call` + attempt).
    pub call: u32,
    /// Time waited before the attempt (backoff, rate limit), in milliseconds.
    pub wait_ms: u64,
    /// The attempt's latency in milliseconds.
    pub latency_ms: f64,
    /// The attempt's cost.
    pub cost: f64,
    /// The error class, if it failed.
    pub error: Option<ErrorClass>,
    /// The failure category, if it failed.
    pub category: Option<FailureCategory>,
    /// The error message, if it failed.
    pub message: Option<String>,
}

/// Why the runner stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The tool succeeded.
    Succeeded,
    /// The result came from the idempotency record; the tool was not called.
    Replayed,
    /// The arguments were rejected before any call.
    Rejected,
    /// A strategy (or unknown-category) failure: not retried here.
    StrategyFailure,
    /// Every allowed attempt failed.
    AttemptsExhausted,
    /// The budget could not pay for another attempt.
    BudgetExhausted,
    /// A non-idempotent tool without an idempotency key is not retried.
    NotRetryable,
}

/// Everything that happened in one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallReport {
    /// The tool called.
    pub tool: String,
    /// The final result.
    pub result: Result<ToolOutput, ToolError>,
    /// Every attempt, in order (empty when rejected or replayed).
    pub attempts: Vec<AttemptRecord>,
    /// Whether the result came from the idempotency record.
    pub replayed: bool,
    /// Why the runner stopped.
    pub stop: StopReason,
    /// Latency of every attempt plus every wait, in milliseconds.
    pub total_latency_ms: f64,
    /// Cost of every attempt.
    pub total_cost: f64,
    /// The call number the next call of the same stage should use.
    pub next_call: u32,
    /// Set when the success could not be recorded in the idempotency store.
    pub record_error: Option<String>,
}

impl CallReport {
    fn finish(
        tool: &str,
        result: Result<ToolOutput, ToolError>,
        attempts: Vec<AttemptRecord>,
        stop: StopReason,
        base_call: u32,
    ) -> CallReport {
        let total_latency_ms = attempts
            .iter()
            .map(|a| a.latency_ms + a.wait_ms as f64)
            .sum();
        let total_cost = attempts.iter().map(|a| a.cost).sum();
        let next_call = base_call + attempts.len() as u32;
        CallReport {
            tool: tool.to_string(),
            result,
            attempts,
            replayed: stop == StopReason::Replayed,
            stop,
            total_latency_ms,
            total_cost,
            next_call,
            record_error: None,
        }
    }
}

/// The resilient caller of the tools of a registry.
pub struct ToolRunner {
    registry: Arc<ToolRegistry>,
    clock: Arc<dyn Clock>,
    seed: u64,
    default_policy: ResiliencePolicy,
    policies: HashMap<String, ResiliencePolicy>,
    idempotency: Arc<dyn IdempotencyStore>,
    breakers: Mutex<HashMap<String, CircuitBreaker>>,
    bulkheads: Mutex<HashMap<String, Arc<Semaphore>>>,
    rate_windows: Mutex<HashMap<String, VecDeque<u64>>>,
}

impl std::fmt::Debug for ToolRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRunner")
            .field("registry", &self.registry)
            .field("clock", &self.clock)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl ToolRunner {
    /// A runner over `registry` with `clock`, default policies, in-memory idempotency records,
    /// and jitter drawn from RNGs seeded by `seed` and the call's coordinates.
    pub fn new(registry: Arc<ToolRegistry>, clock: Arc<dyn Clock>, seed: u64) -> ToolRunner {
        ToolRunner {
            registry,
            clock,
            seed,
            default_policy: ResiliencePolicy::default(),
            policies: HashMap::new(),
            idempotency: Arc::new(MemoryIdempotency::new()),
            breakers: Mutex::new(HashMap::new()),
            bulkheads: Mutex::new(HashMap::new()),
            rate_windows: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the policy of tools that have none of their own.
    pub fn with_default_policy(mut self, policy: ResiliencePolicy) -> ToolRunner {
        self.default_policy = policy;
        self
    }

    /// Sets one tool's policy.
    pub fn with_policy(mut self, tool: &str, policy: ResiliencePolicy) -> ToolRunner {
        self.policies.insert(tool.to_string(), policy);
        self
    }

    /// Records idempotent results in `store`.
    pub fn with_idempotency(mut self, store: Arc<dyn IdempotencyStore>) -> ToolRunner {
        self.idempotency = store;
        self
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<ToolRegistry> {
        &self.registry
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The policy in force for `tool`.
    pub fn policy(&self, tool: &str) -> &ResiliencePolicy {
        self.policies.get(tool).unwrap_or(&self.default_policy)
    }

    /// The state of `tool`'s circuit breaker now.
    pub fn breaker_state(&self, tool: &str) -> BreakerState {
        let now = self.clock.now_ms();
        self.breakers
            .lock()
            .ok()
            .and_then(|b| b.get(tool).map(|b| b.state(now)))
            .unwrap_or(BreakerState::Closed)
    }

    fn with_breaker<T>(&self, tool: &str, f: impl FnOnce(&mut CircuitBreaker) -> T) -> Option<T> {
        let mut map = self.breakers.lock().ok()?;
        let b = map
            .entry(tool.to_string())
            .or_insert_with(|| CircuitBreaker::new(self.policy(tool).breaker.clone()));
        Some(f(b))
    }

    fn bulkhead(&self, tool: &str) -> Option<Arc<Semaphore>> {
        let limit = self.policy(tool).max_concurrency?;
        let mut map = self.bulkheads.lock().ok()?;
        Some(
            map.entry(tool.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(limit.max(1))))
                .clone(),
        )
    }

    /// How long to wait for the tool's rate limit, taking a slot at `now + wait`.
    fn rate_wait(&self, tool: &str) -> u64 {
        let Some(limit) = self.registry.get(tool).and_then(|t| t.spec().rate_limit) else {
            return 0;
        };
        let Ok(mut map) = self.rate_windows.lock() else {
            return 0;
        };
        let now = self.clock.now_ms();
        let q = map.entry(tool.to_string()).or_default();
        while q
            .front()
            .is_some_and(|t| t.saturating_add(limit.per_ms) <= now)
        {
            q.pop_front();
        }
        let calls = limit.calls.max(1) as usize;
        let wait = if q.len() >= calls {
            q.get(q.len() - calls)
                .map(|t| t.saturating_add(limit.per_ms).saturating_sub(now))
                .unwrap_or(0)
        } else {
            0
        };
        q.push_back(now + wait);
        wait
    }

    /// Calls `tool` with `args` in `ctx`, resiliently; see the module docs.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        ctx: &CallContext,
        opts: &CallOptions,
    ) -> CallReport {
        let base = ctx.call;
        if let Err(e) = self.registry.validate(tool, &args) {
            return CallReport::finish(tool, Err(e), Vec::new(), StopReason::Rejected, base);
        }
        let Some(handle) = self.registry.get(tool) else {
            return CallReport::finish(
                tool,
                Err(unknown_tool(tool)),
                Vec::new(),
                StopReason::Rejected,
                base,
            );
        };
        if let Some(key) = &opts.idempotency_key {
            match self.idempotency.get(key).await {
                Ok(Some(record)) => {
                    let value = record.get("value").cloned().unwrap_or(record);
                    let out = ToolOutput {
                        value,
                        latency_ms: 0.0,
                        cost: 0.0,
                    };
                    return CallReport::finish(
                        tool,
                        Ok(out),
                        Vec::new(),
                        StopReason::Replayed,
                        base,
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    // Unknown whether it already ran: calling again could repeat it.
                    let err = ToolError::new(
                        ErrorClass::TransientNetwork,
                        FailureCategory::Infrastructure,
                        format!("{tool}: cannot read idempotency record `{key}`: {e}"),
                    );
                    return CallReport::finish(
                        tool,
                        Err(err),
                        Vec::new(),
                        StopReason::AttemptsExhausted,
                        base,
                    );
                }
            }
        }

        let policy = self.policy(tool);
        let spec = handle.spec();
        let mut rng = SeedHasher::new()
            .str("backoff")
            .u64(self.seed)
            .str(tool)
            .str(&ctx.run_id)
            .u64(ctx.task_index)
            .u64(u64::from(ctx.attempt))
            .str(&ctx.stage)
            .u64(u64::from(ctx.call))
            .rng();
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        let mut wait_ms = 0u64;
        let max_attempts = policy.retry.max_attempts.max(1);
        let mut k = 0u32;
        loop {
            let rate_wait = self.rate_wait(tool);
            if rate_wait > 0 {
                self.clock.sleep(rate_wait).await;
            }
            wait_ms += rate_wait;
            // A retry is the stage's next call; the first attempt is the call as given.
            let actx = if k == 0 {
                Cow::Borrowed(ctx)
            } else {
                let mut retry = ctx.clone();
                retry.call = base + k;
                Cow::Owned(retry)
            };
            let result = self
                .attempt(tool, &handle, args.clone(), &actx, policy)
                .await;
            let (latency_ms, cost) = match &result {
                Ok(o) => (o.latency_ms, o.cost),
                Err(e) => (e.latency_ms, e.cost),
            };
            attempts.push(AttemptRecord {
                call: actx.call,
                wait_ms,
                latency_ms,
                cost,
                error: result.as_ref().err().map(|e| e.class),
                category: result.as_ref().err().map(|e| e.category),
                message: result.as_ref().err().map(|e| e.message.clone()),
            });
            let err = match result {
                Ok(out) => {
                    let mut record_error = None;
                    let out = match &opts.idempotency_key {
                        Some(key) => {
                            let ToolOutput {
                                value,
                                latency_ms,
                                cost,
                            } = out;
                            // Built by hand: `json!` would copy the output (`to_value`), and
                            // the record hands it back once written.
                            let mut record = Value::Object(serde_json::Map::from_iter([
                                ("value".to_string(), value),
                                ("latency_ms".to_string(), Value::from(latency_ms)),
                                ("cost".to_string(), Value::from(cost)),
                            ]));
                            if let Err(e) = self.idempotency.put(key, &record).await {
                                record_error = Some(e.to_string());
                            }
                            ToolOutput {
                                value: record.get_mut("value").map(Value::take).unwrap_or_default(),
                                latency_ms,
                                cost,
                            }
                        }
                        None => out,
                    };
                    let mut report =
                        CallReport::finish(tool, Ok(out), attempts, StopReason::Succeeded, base);
                    report.record_error = record_error;
                    return report;
                }
                Err(e) => e,
            };
            let stop = if !err.is_infrastructure() {
                Some(StopReason::StrategyFailure)
            } else if k + 1 >= max_attempts {
                Some(StopReason::AttemptsExhausted)
            } else if !spec.idempotent
                && opts.idempotency_key.is_none()
                && !policy.retry.retry_non_idempotent
            {
                Some(StopReason::NotRetryable)
            } else {
                None
            };
            if let Some(stop) = stop {
                return CallReport::finish(tool, Err(err), attempts, stop, base);
            }
            let delay = policy.retry.delay_ms(k, err.retry_after_ms, &mut rng);
            let spent_latency: f64 = attempts
                .iter()
                .map(|a| a.latency_ms + a.wait_ms as f64)
                .sum();
            let spent_cost: f64 = attempts.iter().map(|a| a.cost).sum();
            let next_latency = if spec.cost.expected_latency_ms > 0.0 {
                spec.cost.expected_latency_ms
            } else {
                latency_ms
            };
            let next_cost = if spec.cost.per_call > 0.0 {
                spec.cost.per_call
            } else {
                cost
            };
            let over_latency = opts
                .budget
                .latency_ms
                .is_some_and(|b| spent_latency + delay as f64 + next_latency > b);
            let over_cost = opts.budget.cost.is_some_and(|b| spent_cost + next_cost > b);
            if over_latency || over_cost {
                return CallReport::finish(
                    tool,
                    Err(err),
                    attempts,
                    StopReason::BudgetExhausted,
                    base,
                );
            }
            self.clock.sleep(delay).await;
            wait_ms = delay;
            k += 1;
        }
    }

    /// One attempt through breaker, bulkhead and timeout.
    async fn attempt(
        &self,
        tool: &str,
        handle: &Arc<dyn super::tool::Tool>,
        args: Value,
        ctx: &CallContext,
        policy: &ResiliencePolicy,
    ) -> Result<ToolOutput, ToolError> {
        let now = self.clock.now_ms();
        if let Some(Err(wait)) = self.with_breaker(tool, |b| b.acquire(now)) {
            return Err(ToolError::new(
                ErrorClass::TransientNetwork,
                FailureCategory::Infrastructure,
                format!("{tool}: circuit breaker open (next probe in {wait} ms)"),
            )
            .with_retry_after(Some(wait)));
        }
        let _permit = match self.bulkhead(tool) {
            None => None,
            Some(sem) => {
                let acquired = match policy.bulkhead_wait_ms {
                    None => sem.acquire_owned().await.ok(),
                    Some(ms) => {
                        tokio::time::timeout(Duration::from_millis(ms), sem.acquire_owned())
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                };
                match acquired {
                    Some(p) => Some(p),
                    None => {
                        self.with_breaker(tool, CircuitBreaker::release);
                        return Err(ToolError::new(
                            ErrorClass::RateLimit,
                            FailureCategory::Infrastructure,
                            format!(
                                "{tool}: bulkhead full ({} calls in flight)",
                                policy.max_concurrency.unwrap_or(0)
                            ),
                        ));
                    }
                }
            }
        };
        let result = match policy.timeout_ms {
            None => handle.call(args, ctx).await,
            Some(ms) => {
                match tokio::time::timeout(Duration::from_millis(ms), handle.call(args, ctx)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(timeout_error(tool, ms, 0.0)),
                }
            }
        };
        // On a virtual clock, a reported latency past the deadline is a timeout too.
        let result = match (result, policy.timeout_ms) {
            (Ok(out), Some(ms)) if self.clock.is_virtual() && out.latency_ms > ms as f64 => {
                Err(timeout_error(tool, ms, out.cost))
            }
            (r, _) => r,
        };
        let latency = match &result {
            Ok(o) => o.latency_ms,
            Err(e) => e.latency_ms,
        };
        self.clock.elapsed(latency);
        let failed = result
            .as_ref()
            .err()
            .is_some_and(ToolError::is_infrastructure);
        let now = self.clock.now_ms();
        self.with_breaker(tool, |b| b.record(failed, now));
        result
    }
}

fn timeout_error(tool: &str, ms: u64, cost: f64) -> ToolError {
    let c =
        crate::triage::classify_error(Some("Timeout"), &format!("{tool}: timed out after {ms} ms"));
    ToolError::new(
        ErrorClass::Timeout,
        c.category,
        format!("{tool}: timed out after {ms} ms"),
    )
    .with_usage(ms as f64, cost)
}
