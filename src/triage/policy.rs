//! Failure policies: one recovery strategy per failure type (else a default, else escalate),
//! the strategies themselves, and the per-run counters they keep.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::taxonomy::{FailureType, RecoveryAction, Trajectory};

use super::classify::Classification;
use super::context::first_incomplete_subgoal;

/// The hint of `retry_with_tool_manifest`.
pub const MANIFEST_HINT: &str = "Re-run using only tools in the current manifest.";

/// Exponential backoff with full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// Retries allowed per failure type.
    pub max_attempts: u32,
    /// Delay ceiling of the first retry, in ms.
    pub base_ms: u64,
    /// Largest delay ceiling, in ms.
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            max_attempts: 5,
            base_ms: 1_000,
            cap_ms: 30_000,
        }
    }
}

impl Backoff {
    /// The delay of the `k`-th (0-based) retry: uniform in `[0, min(cap, base * 2^k)]`, drawn
    /// from `rng`, and never below the server's `Retry-After`.
    pub fn delay_ms(&self, k: u32, retry_after_ms: Option<u64>, rng: &mut fastrand::Rng) -> u64 {
        let ceiling = self
            .base_ms
            .saturating_mul(1u64.checked_shl(k.min(62)).unwrap_or(u64::MAX))
            .min(self.cap_ms);
        let jitter = if ceiling == 0 {
            0
        } else {
            rng.u64(0..=ceiling)
        };
        jitter.max(retry_after_ms.unwrap_or(0))
    }
}

/// A recovery strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case")]
pub enum Strategy {
    /// Retry with the tool manifest injected and a hint; at most `max_attempts` per type.
    RetryWithToolManifest {
        /// Retries allowed per failure type.
        max_attempts: u32,
    },
    /// Retry after an exponential, fully jittered, capped delay (Retry-After honoured).
    BackoffAndRetry(Backoff),
    /// Build a new plan with a hint; at most `max_replans` per failure type.
    Replan {
        /// The hint.
        hint: String,
        /// Replans allowed per failure type.
        max_replans: u32,
    },
    /// Go on from the first declared subgoal not done (derived from the trajectory).
    ResumeFromSubgoal,
    /// Restore a checkpoint (the named one, or the latest): state and trajectory.
    RollbackToCheckpoint {
        /// The checkpoint name; `None` means the latest.
        checkpoint: Option<String>,
    },
    /// Hand the run to a human.
    Escalate {
        /// Why; defaults to "Unhandled failure: `<type>` at step `<i>`".
        message: Option<String>,
    },
    /// Give up.
    Abort {
        /// Why; defaults to the failure.
        reason: Option<String>,
    },
    /// Pause for a human's approval; the caller resumes the run.
    Suspend {
        /// What the human is asked.
        message: String,
    },
    /// The primary's action, unless its kind is in `after_kinds` (default `escalate`): then
    /// the fallback's.
    Chain {
        /// Tried first.
        primary: Box<Strategy>,
        /// Tried when the primary gives up.
        fallback: Box<Strategy>,
        /// Action kinds of the primary that hand over to the fallback.
        after_kinds: Vec<String>,
    },
    /// The k-th strategy on the k-th failure of a type; escalate after the last.
    Sequence {
        /// The strategies, in order.
        steps: Vec<Strategy>,
    },
}

impl Strategy {
    /// `retry_with_tool_manifest(max_attempts)`.
    pub fn retry_with_tool_manifest(max_attempts: u32) -> Strategy {
        Strategy::RetryWithToolManifest { max_attempts }
    }
    /// `backoff_and_retry(max_attempts)` with base 1 s and cap 30 s.
    pub fn backoff_and_retry(max_attempts: u32) -> Strategy {
        Strategy::BackoffAndRetry(Backoff {
            max_attempts,
            ..Backoff::default()
        })
    }
    /// `replan(hint, max_replans)`.
    pub fn replan(hint: impl Into<String>, max_replans: u32) -> Strategy {
        Strategy::Replan {
            hint: hint.into(),
            max_replans,
        }
    }
    /// `rollback_to_checkpoint(name)`.
    pub fn rollback_to_checkpoint(name: Option<&str>) -> Strategy {
        Strategy::RollbackToCheckpoint {
            checkpoint: name.map(str::to_string),
        }
    }
    /// `chain(primary, fallback)` handing over after `escalate`.
    pub fn chain(primary: Strategy, fallback: Strategy) -> Strategy {
        Strategy::Chain {
            primary: Box::new(primary),
            fallback: Box::new(fallback),
            after_kinds: vec!["escalate".into()],
        }
    }
    /// `sequence(steps)`.
    pub fn sequence(steps: Vec<Strategy>) -> Strategy {
        Strategy::Sequence { steps }
    }
    /// `escalate_by_default`.
    pub fn escalate_by_default() -> Strategy {
        Strategy::Escalate { message: None }
    }
    /// `abort_by_default`.
    pub fn abort_by_default() -> Strategy {
        Strategy::Abort { reason: None }
    }
    /// `suspend(message)`.
    pub fn suspend(message: impl Into<String>) -> Strategy {
        Strategy::Suspend {
            message: message.into(),
        }
    }
}

/// What a strategy sees of a failure.
#[derive(Debug, Clone, Copy)]
pub struct FailureContext<'a> {
    /// The verdict.
    pub failure: &'a Classification,
    /// The trajectory of the failed attempt.
    pub trajectory: &'a Trajectory,
    /// How many failures of this type the run has had, this one included (1-based).
    pub occurrence: u32,
    /// The server's `Retry-After`, in ms, if known.
    pub retry_after_ms: Option<u64>,
    /// The tool manifest to inject on `retry_with_tool_manifest`.
    pub manifest: Option<&'a str>,
}

/// Per-run counters of the strategies (retries and replans are counted per failure type).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    used: BTreeMap<String, u32>,
}

impl PolicyState {
    fn bump(&mut self, ft: FailureType, kind: &str, limit: u32) -> Option<u32> {
        let n = self.used.entry(format!("{ft}/{kind}")).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(*n - 1)
    }

    /// How many times `kind` acted on failures of `ft` in this run.
    pub fn used(&self, ft: FailureType, kind: &str) -> u32 {
        self.used.get(&format!("{ft}/{kind}")).copied().unwrap_or(0)
    }
}

fn escalate(message: String) -> RecoveryAction {
    RecoveryAction::Escalate { message }
}

fn unhandled(f: &FailureContext<'_>) -> String {
    match f.failure.step_index {
        Some(i) => format!("Unhandled failure: {} at step {i}", f.failure.failure_type),
        None => format!("Unhandled failure: {}", f.failure.failure_type),
    }
}

impl Strategy {
    /// The action for this failure; counters and jitter come from the run's state and RNG.
    pub fn decide(
        &self,
        f: &FailureContext<'_>,
        st: &mut PolicyState,
        rng: &mut fastrand::Rng,
    ) -> RecoveryAction {
        let ft = f.failure.failure_type;
        match self {
            Strategy::RetryWithToolManifest { max_attempts } => {
                match st.bump(ft, "retry_with_tool_manifest", *max_attempts) {
                    Some(_) => RecoveryAction::Retry {
                        hint: Some(MANIFEST_HINT.into()),
                        inject: f.manifest.map(str::to_string),
                        delay_ms: 0,
                    },
                    None => escalate(format!("max_attempts ({max_attempts}) reached")),
                }
            }
            Strategy::BackoffAndRetry(b) => {
                match st.bump(ft, "backoff_and_retry", b.max_attempts) {
                    Some(k) => RecoveryAction::Retry {
                        hint: None,
                        inject: None,
                        delay_ms: b.delay_ms(k, f.retry_after_ms, rng),
                    },
                    None => escalate(format!("max_attempts ({}) reached", b.max_attempts)),
                }
            }
            Strategy::Replan { hint, max_replans } => match st.bump(ft, "replan", *max_replans) {
                Some(_) => RecoveryAction::Replan { hint: hint.clone() },
                None => escalate(format!("max_replans ({max_replans}) reached")),
            },
            Strategy::ResumeFromSubgoal => match first_incomplete_subgoal(f.trajectory) {
                Some(from_subgoal) => RecoveryAction::Resume { from_subgoal },
                None => escalate("no incomplete subgoal to resume from".into()),
            },
            Strategy::RollbackToCheckpoint { checkpoint } => RecoveryAction::Rollback {
                checkpoint_id: checkpoint.clone(),
            },
            Strategy::Escalate { message } => {
                escalate(message.clone().unwrap_or_else(|| unhandled(f)))
            }
            Strategy::Abort { reason } => RecoveryAction::Abort {
                reason: reason.clone().unwrap_or_else(|| {
                    format!("{}: {}", f.failure.failure_type, f.failure.message)
                }),
            },
            Strategy::Suspend { message } => {
                let mut metadata = BTreeMap::new();
                metadata.insert("failure_type".into(), ft.as_str().into());
                metadata.insert("failure".into(), f.failure.message.clone().into());
                RecoveryAction::Suspend {
                    message: message.clone(),
                    metadata,
                }
            }
            Strategy::Chain {
                primary,
                fallback,
                after_kinds,
            } => {
                let a = primary.decide(f, st, rng);
                if after_kinds.iter().any(|k| k == a.kind()) {
                    fallback.decide(f, st, rng)
                } else {
                    a
                }
            }
            Strategy::Sequence { steps } => {
                match steps.get(f.occurrence.saturating_sub(1) as usize) {
                    Some(s) => s.decide(f, st, rng),
                    None => escalate(format!("sequence of {} strategies exhausted", steps.len())),
                }
            }
        }
    }
}

/// One strategy per failure type, else the default, else escalate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailurePolicy {
    /// The strategy of each failure type.
    pub strategies: BTreeMap<FailureType, Strategy>,
    /// The strategy of types without one.
    pub default: Option<Strategy>,
}

impl FailurePolicy {
    /// An empty policy (everything escalates).
    pub fn new() -> FailurePolicy {
        FailurePolicy::default()
    }

    /// Sets the strategy of a failure type.
    pub fn on(mut self, ft: FailureType, s: Strategy) -> FailurePolicy {
        self.strategies.insert(ft, s);
        self
    }

    /// Sets the default strategy.
    pub fn otherwise(mut self, s: Strategy) -> FailurePolicy {
        self.default = Some(s);
        self
    }

    /// The action for a failure.
    pub fn decide(
        &self,
        f: &FailureContext<'_>,
        st: &mut PolicyState,
        rng: &mut fastrand::Rng,
    ) -> RecoveryAction {
        match self
            .strategies
            .get(&f.failure.failure_type)
            .or(self.default.as_ref())
        {
            Some(s) => s.decide(f, st, rng),
            None => escalate(format!(
                "No strategy registered for {} ({})",
                f.failure.failure_type,
                unhandled(f)
            )),
        }
    }
}

static RETRY_AFTER: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)]
    Regex::new(r"(?i)(?:retry[- ]after|retry after|try again in|retry in|please wait)\s*[:=]?\s*([0-9]{1,7}(?:\.[0-9]{1,3})?)\s*(ms|milliseconds?|s|sec|secs|seconds?|m|mins?|minutes?)?\b")
        .expect("built-in Retry-After pattern compiles")
});

/// The wait a message asks for ("Retry-After: 30", "try again in 20 seconds", "retry in 1.5s"),
/// in milliseconds. Only the first 16 KiB are searched.
pub fn retry_after_ms(message: &str) -> Option<u64> {
    let mut end = message.len().min(16 * 1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let text = &message[..end];
    // `is_match` runs the DFA only; captures are built only when there is something to read.
    if !RETRY_AFTER.is_match(text) {
        return None;
    }
    let c = RETRY_AFTER.captures(text)?;
    let n: f64 = c.get(1)?.as_str().parse().ok()?;
    let unit = c.get(2).map(|u| u.as_str().to_ascii_lowercase());
    let ms = match unit.as_deref() {
        Some(u) if u.starts_with("ms") || u.starts_with("milli") => n,
        Some(u) if u.starts_with('m') => n * 60_000.0,
        _ => n * 1_000.0,
    };
    Some(ms.round() as u64)
}
