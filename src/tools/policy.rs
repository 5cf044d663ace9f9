//! Per-tool resilience settings (timeout, retries with backoff, circuit breaker, bulkhead) and
//! the backoff schedule (exponential, full jitter, honouring Retry-After).

use serde::{Deserialize, Serialize};

/// How calls to one tool are protected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResiliencePolicy {
    /// Per-attempt deadline in milliseconds (real time; on a virtual clock a reported latency
    /// above it also counts as a timeout).
    pub timeout_ms: Option<u64>,
    /// Retries of infrastructure failures.
    pub retry: RetryPolicy,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
    /// The bulkhead: at most this many calls of the tool in flight.
    pub max_concurrency: Option<usize>,
    /// How long a call may wait for a bulkhead slot before it is rejected (`None`: as long as it
    /// takes).
    pub bulkhead_wait_ms: Option<u64>,
}

impl Default for ResiliencePolicy {
    fn default() -> Self {
        ResiliencePolicy {
            timeout_ms: Some(30_000),
            retry: RetryPolicy::default(),
            breaker: BreakerConfig::default(),
            max_concurrency: None,
            bulkhead_wait_ms: None,
        }
    }
}

/// Exponential backoff with full jitter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// The backoff ceiling before the first retry, in milliseconds.
    pub base_ms: u64,
    /// The largest ceiling, in milliseconds.
    pub max_ms: u64,
    /// Wait at least what the tool asked for (Retry-After).
    pub honour_retry_after: bool,
    /// Retry a non-idempotent tool even without an idempotency key.
    pub retry_non_idempotent: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_ms: 100,
            max_ms: 10_000,
            honour_retry_after: true,
            retry_non_idempotent: false,
        }
    }
}

impl RetryPolicy {
    /// The ceiling of the delay before retry number `retry` (0-based):
    /// `min(max_ms, base_ms * 2^retry)`.
    pub fn ceiling_ms(&self, retry: u32) -> u64 {
        let factor = 1u64.checked_shl(retry.min(63)).unwrap_or(u64::MAX);
        self.base_ms.saturating_mul(factor).min(self.max_ms)
    }

    /// The delay before retry number `retry`: uniform in `[0, ceiling]` (full jitter), raised to
    /// the tool's Retry-After when it gave one and the policy honours it.
    pub fn delay_ms(
        &self,
        retry: u32,
        retry_after_ms: Option<u64>,
        rng: &mut fastrand::Rng,
    ) -> u64 {
        let jittered = rng.u64(0..=self.ceiling_ms(retry));
        match retry_after_ms {
            Some(ra) if self.honour_retry_after => jittered.max(ra),
            _ => jittered,
        }
    }
}

/// When the circuit opens and how it recovers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BreakerConfig {
    /// Whether the breaker is used at all.
    pub enabled: bool,
    /// How many recent outcomes the failure rate is computed over.
    pub window: usize,
    /// The fewest outcomes in the window before the rate is judged.
    pub min_calls: usize,
    /// The infrastructure-failure rate at or above which the circuit opens.
    pub failure_rate: f64,
    /// How long the circuit stays open before probing, in milliseconds.
    pub open_ms: u64,
    /// How many probe calls are let through while half-open.
    pub half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            window: 20,
            min_calls: 10,
            failure_rate: 0.5,
            open_ms: 5_000,
            half_open_probes: 1,
        }
    }
}
