//! The recovery loop: `Agent` runs an async attempt function, classifies each failure, asks the
//! policy for a recovery, and runs again within the caps, budgets and time limit.

use std::future::Future;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::record::Checkpoint;
use crate::taxonomy::{FailureType, RecoveryAction, Trajectory};

use super::checkpoint::{CheckpointError, CheckpointStore, MemoryCheckpoints};
use super::classify::{
    Classification, Classifier, ClassifierConfig, FailureInput, RulesClassifier,
};
use super::clock::{Clock, TokioClock};
use super::context::{AttemptState, RunContext, RunError, TriageContext};
use super::policy::{FailureContext, FailurePolicy, PolicyState, retry_after_ms};

/// Caps and switches of the loop (the `[limits]` table of `config/policy.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// Recoveries allowed per run (so at most this + 1 calls).
    pub max_recovery_attempts: u32,
    /// Failures allowed in the run's history before it escalates.
    pub max_total_attempts: Option<u32>,
    /// Time allowed from the first failure to the end of recovery, in ms.
    pub max_recovery_ms: Option<u64>,
    /// Model tokens allowed per run.
    pub max_tokens: Option<u64>,
    /// Cost allowed per run.
    pub max_cost: Option<f64>,
    /// Checkpoint after every recorded step and state change.
    pub auto_checkpoint: bool,
    /// Escalate instead of re-running a non-idempotent tool call that already ran.
    pub strict_idempotency: bool,
    /// Seed of the per-run RNG (mixed with the run id).
    pub seed: u64,
    /// The tool manifest injected by `retry_with_tool_manifest`.
    pub tool_manifest: Option<String>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_recovery_attempts: 3,
            max_total_attempts: None,
            max_recovery_ms: None,
            max_tokens: None,
            max_cost: None,
            auto_checkpoint: false,
            strict_idempotency: false,
            seed: 0,
            tool_manifest: None,
        }
    }
}

/// One failure of a run, with the recovery chosen for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The 0-based call that failed.
    pub attempt: u32,
    /// The classifier's verdict.
    pub classification: Classification,
    /// The raised error, if any.
    pub error: Option<RunError>,
    /// The recovery chosen (`None` when a cap ended the run first).
    pub action: Option<RecoveryAction>,
}

/// The full context of a run that ended escalated or aborted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    /// The run.
    pub run_id: String,
    /// Why it ended.
    pub reason: String,
    /// Every failure, in order.
    pub failures: Vec<FailureRecord>,
    /// The trajectory of the last attempt.
    pub trajectory: Trajectory,
    /// The state at the end of the last attempt.
    pub state: Value,
    /// Calls made.
    pub calls: u32,
    /// Tokens spent.
    pub tokens: u64,
    /// Cost spent.
    pub cost: f64,
}

/// A run paused for a human; give it back to [`Agent::resume`] with the human's decision.
#[derive(Debug, Clone)]
pub struct SuspendedRun {
    /// What the human is asked.
    pub message: String,
    /// The failure context so far.
    pub report: FailureReport,
    state: LoopState,
}

/// How a run ended, when not with a result.
#[derive(Debug, thiserror::Error)]
pub enum TriageError {
    /// Handed to a human.
    #[error("run {} escalated: {}", .0.run_id, .0.reason)]
    Escalated(Box<FailureReport>),
    /// Given up by policy.
    #[error("run {} aborted: {}", .0.run_id, .0.reason)]
    Aborted(Box<FailureReport>),
    /// Paused for a human's approval.
    #[error("run {} suspended: {}", .0.report.run_id, .0.message)]
    Suspended(Box<SuspendedRun>),
    /// Writing or reading a checkpoint failed.
    #[error("run {run_id}: {source}")]
    Checkpoint {
        /// The run.
        run_id: String,
        /// Why.
        source: CheckpointError,
    },
}

impl TriageError {
    /// The failure context, when the run escalated, aborted or was suspended.
    pub fn report(&self) -> Option<&FailureReport> {
        match self {
            TriageError::Escalated(r) | TriageError::Aborted(r) => Some(r),
            TriageError::Suspended(s) => Some(&s.report),
            TriageError::Checkpoint { .. } => None,
        }
    }
}

/// A run that ended with a result.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport<T> {
    /// The run.
    pub run_id: String,
    /// The result.
    pub output: T,
    /// Calls made.
    pub calls: u32,
    /// Every failure recovered from, in order.
    pub failures: Vec<FailureRecord>,
    /// Every delay slept, in ms.
    pub delays_ms: Vec<u64>,
    /// The trajectory of the successful attempt.
    pub trajectory: Trajectory,
    /// The final state.
    pub state: Value,
    /// Tokens spent.
    pub tokens: u64,
    /// Cost spent.
    pub cost: f64,
}

impl<T> RunReport<T> {
    /// The failure types recovered from, in order.
    pub fn failure_types(&self) -> Vec<FailureType> {
        self.failures
            .iter()
            .map(|f| f.classification.failure_type)
            .collect()
    }
}

/// Everything a run carries between attempts (and across a suspension).
#[derive(Debug, Clone)]
struct LoopState {
    run_id: Arc<str>,
    goal: Option<String>,
    calls: u32,
    recoveries: u32,
    failures: Vec<FailureRecord>,
    delays_ms: Vec<u64>,
    policy: PolicyState,
    rng: fastrand::Rng,
    tokens: u64,
    cost: f64,
    first_failure_ms: Option<u64>,
    initial_state: Value,
    next_start: AttemptState,
    next_triage: Option<TriageContext>,
    last: AttemptState,
}

/// The recovery loop. One value serves any number of concurrent runs; each run's state lives in
/// its own call of [`Agent::run`].
#[derive(Clone)]
pub struct Agent {
    classifier: Arc<dyn Classifier>,
    policy: Arc<FailurePolicy>,
    config: Arc<AgentConfig>,
    store: Arc<dyn CheckpointStore>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("policy", &self.policy)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn mix(seed: u64, run_id: &str) -> u64 {
    // FNV-1a of the run id, mixed into the seed: each run has its own reproducible stream.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in run_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    seed ^ h
}

impl Agent {
    /// An agent with the rules classifier (default settings), in-memory checkpoints and tokio
    /// time.
    pub fn new(policy: FailurePolicy, config: AgentConfig) -> Agent {
        let classifier = RulesClassifier::new(&ClassifierConfig::default()).unwrap_or_default();
        Agent {
            classifier: Arc::new(classifier),
            policy: Arc::new(policy),
            config: Arc::new(config),
            store: Arc::new(MemoryCheckpoints::default()),
            clock: Arc::new(TokioClock::new(0)),
        }
    }

    /// Replaces the classifier.
    pub fn with_classifier(mut self, c: Arc<dyn Classifier>) -> Agent {
        self.classifier = c;
        self
    }

    /// Replaces the checkpoint store.
    pub fn with_store(mut self, s: Arc<dyn CheckpointStore>) -> Agent {
        self.store = s;
        self
    }

    /// Replaces the clock (a `VirtualClock` makes every delay instant).
    pub fn with_clock(mut self, c: Arc<dyn Clock>) -> Agent {
        self.clock = c;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Runs `attempt` until it succeeds or the policy or a cap ends the run.
    ///
    /// `attempt` gets a fresh [`RunContext`] each call, and the [`TriageContext`] of the
    /// recovery that led to the call (none on the first).
    pub async fn run<T, F, Fut>(
        &self,
        run_id: &str,
        goal: Option<&str>,
        initial_state: Value,
        attempt: F,
    ) -> Result<RunReport<T>, TriageError>
    where
        T: Serialize,
        F: FnMut(RunContext, Option<TriageContext>) -> Fut,
        Fut: Future<Output = Result<T, RunError>>,
    {
        let st = LoopState {
            run_id: Arc::from(run_id),
            goal: goal.map(str::to_string),
            calls: 0,
            recoveries: 0,
            failures: Vec::new(),
            delays_ms: Vec::new(),
            policy: PolicyState::default(),
            rng: fastrand::Rng::with_seed(mix(self.config.seed, run_id)),
            tokens: 0,
            cost: 0.0,
            first_failure_ms: None,
            next_start: AttemptState {
                state: initial_state.clone(),
                ..AttemptState::default()
            },
            initial_state,
            next_triage: None,
            last: AttemptState::default(),
        };
        self.drive(st, attempt).await
    }

    /// Resumes a suspended run with the human's decision (a retry with the human's hint, a
    /// replan, a rollback, an abort, ...).
    pub async fn resume<T, F, Fut>(
        &self,
        suspended: SuspendedRun,
        decision: RecoveryAction,
        attempt: F,
    ) -> Result<RunReport<T>, TriageError>
    where
        T: Serialize,
        F: FnMut(RunContext, Option<TriageContext>) -> Fut,
        Fut: Future<Output = Result<T, RunError>>,
    {
        let mut st = suspended.state;
        let Some(last) = st.failures.last_mut() else {
            return Err(self.end(&st, "resume of a run with no failure".into(), true));
        };
        last.action = Some(decision.clone());
        let failure = last.classification.clone();
        if let Some(e) = self.apply(&mut st, &failure, decision).await {
            return Err(e);
        }
        self.drive(st, attempt).await
    }

    fn end(&self, st: &LoopState, reason: String, escalate: bool) -> TriageError {
        let report = Box::new(self.report(st, reason));
        if escalate {
            TriageError::Escalated(report)
        } else {
            TriageError::Aborted(report)
        }
    }

    fn report(&self, st: &LoopState, reason: String) -> FailureReport {
        FailureReport {
            run_id: st.run_id.to_string(),
            reason,
            failures: st.failures.clone(),
            trajectory: st.last.trajectory.clone(),
            state: st.last.state.clone(),
            calls: st.calls,
            tokens: st.tokens,
            cost: st.cost,
        }
    }

    async fn flush(&self, st: &LoopState, pending: &[Checkpoint]) -> Result<(), TriageError> {
        for cp in pending {
            self.store
                .put(cp)
                .await
                .map_err(|source| TriageError::Checkpoint {
                    run_id: st.run_id.to_string(),
                    source,
                })?;
        }
        Ok(())
    }

    async fn drive<T, F, Fut>(
        &self,
        mut st: LoopState,
        mut attempt: F,
    ) -> Result<RunReport<T>, TriageError>
    where
        T: Serialize,
        F: FnMut(RunContext, Option<TriageContext>) -> Fut,
        Fut: Future<Output = Result<T, RunError>>,
    {
        loop {
            let ctx = RunContext::new(
                st.run_id.clone(),
                st.calls,
                self.config.auto_checkpoint,
                std::mem::take(&mut st.next_start),
                self.clock.clone(),
                self.store.clone(),
            );
            let result = attempt(ctx.clone(), st.next_triage.take()).await;
            st.calls += 1;
            let mut done = ctx.take();
            let pending = std::mem::take(&mut done.pending);
            self.flush(&st, &pending).await?;
            st.tokens += done.tokens;
            st.cost += done.cost;
            st.last = done;
            let (output, error) = match result {
                Ok(o) => (Some(o), None),
                Err(e) => (None, Some(e)),
            };
            let out_json = match (&output, self.classifier.wants_output()) {
                (Some(o), true) => serde_json::to_value(o).ok(),
                _ => None,
            };
            let input = FailureInput {
                trajectory: &st.last.trajectory,
                error: error.as_ref(),
                claims: &st.last.claims,
                goal: st.goal.as_deref(),
                output: out_json.as_ref(),
            };
            let verdict = self.classifier.classify(&input);
            let failure = match (output, verdict) {
                (Some(output), None) => {
                    return Ok(RunReport {
                        run_id: st.run_id.to_string(),
                        output,
                        calls: st.calls,
                        failures: st.failures,
                        delays_ms: st.delays_ms,
                        trajectory: st.last.trajectory,
                        state: st.last.state,
                        tokens: st.tokens,
                        cost: st.cost,
                    });
                }
                (_, Some(c)) => c,
                (None, None) => Classification {
                    failure_type: FailureType::Unknown,
                    error: None,
                    rule: "classifier_declined".into(),
                    step_index: None,
                    message: error
                        .as_ref()
                        .map(|e| e.message.clone())
                        .unwrap_or_default(),
                },
            };
            if st.first_failure_ms.is_none() {
                st.first_failure_ms = Some(self.clock.now_ms());
            }
            let retry_after = error
                .as_ref()
                .and_then(|e| e.retry_after_ms.or_else(|| retry_after_ms(&e.message)));
            st.failures.push(FailureRecord {
                attempt: st.calls - 1,
                classification: failure.clone(),
                error,
                action: None,
            });
            // Caps and budgets, before asking the policy.
            let cap = if let Some(max) = self.config.max_tokens.filter(|m| st.tokens > *m) {
                Some(format!("token budget ({max}) exceeded: {} used", st.tokens))
            } else if let Some(max) = self.config.max_cost.filter(|m| st.cost > *m) {
                Some(format!("cost budget ({max}) exceeded: {} used", st.cost))
            } else if let Some(max) = self
                .config
                .max_total_attempts
                .filter(|m| st.failures.len() as u32 > *m)
            {
                Some(format!("max_total_attempts ({max}) exceeded"))
            } else if st.recoveries >= self.config.max_recovery_attempts {
                Some(format!(
                    "max_recovery_attempts ({}) exceeded",
                    self.config.max_recovery_attempts
                ))
            } else {
                None
            };
            if let Some(reason) = cap {
                return Err(self.end(&st, reason, true));
            }
            let occurrence = st
                .failures
                .iter()
                .filter(|f| f.classification.failure_type == failure.failure_type)
                .count() as u32;
            let fc = FailureContext {
                failure: &failure,
                trajectory: &st.last.trajectory,
                occurrence,
                retry_after_ms: retry_after,
                manifest: self.config.tool_manifest.as_deref(),
            };
            let action = self.policy.decide(&fc, &mut st.policy, &mut st.rng);
            if let Some(last) = st.failures.last_mut() {
                last.action = Some(action.clone());
            }
            if let Some(e) = self.apply(&mut st, &failure, action).await {
                return Err(e);
            }
        }
    }

    /// Prepares the next attempt for `action`, or ends the run.
    async fn apply(
        &self,
        st: &mut LoopState,
        failure: &Classification,
        action: RecoveryAction,
    ) -> Option<TriageError> {
        let mut tc = TriageContext {
            attempt: st.calls,
            failure_type: failure.failure_type,
            failure_message: failure.message.clone(),
            action: action.clone(),
            hint: None,
            inject: None,
            resume_from: None,
            restored_checkpoint: None,
        };
        // What the next attempt starts from, and which recorded steps it would run again.
        let fresh = AttemptState {
            state: st.initial_state.clone(),
            ..AttemptState::default()
        };
        let (start, rerun_from) = match &action {
            RecoveryAction::Escalate { message } => {
                return Some(self.end(st, message.clone(), true));
            }
            RecoveryAction::Abort { reason } => return Some(self.end(st, reason.clone(), false)),
            RecoveryAction::Suspend { message, .. } => {
                return Some(TriageError::Suspended(Box::new(SuspendedRun {
                    message: message.clone(),
                    report: self.report(st, message.clone()),
                    state: st.clone(),
                })));
            }
            RecoveryAction::Retry { hint, inject, .. } => {
                tc.hint = hint.clone();
                tc.inject = inject.clone();
                (fresh, 0)
            }
            RecoveryAction::Replan { hint } => {
                tc.hint = Some(hint.clone());
                (fresh, 0)
            }
            RecoveryAction::Resume { from_subgoal } => {
                tc.resume_from = Some(from_subgoal.clone());
                let mut t = st.last.trajectory.clone();
                t.steps.retain(|s| s.error.is_none());
                let n = t.len();
                (
                    AttemptState {
                        state: st.last.state.clone(),
                        trajectory: t,
                        ..AttemptState::default()
                    },
                    n,
                )
            }
            RecoveryAction::Rollback { checkpoint_id } => {
                let found = match checkpoint_id {
                    Some(name) => self.store.named(&st.run_id, name),
                    None => self.store.latest(&st.run_id),
                };
                let cp = match found {
                    Ok(Some(cp)) => cp,
                    Ok(None) => {
                        let reason = match checkpoint_id {
                            Some(name) => format!(
                                "rollback failed: checkpoint {name:?} not found for run {}",
                                st.run_id
                            ),
                            None => "rollback failed: no checkpoint is available".to_string(),
                        };
                        return Some(self.end(st, reason, true));
                    }
                    Err(source) => {
                        return Some(TriageError::Checkpoint {
                            run_id: st.run_id.to_string(),
                            source,
                        });
                    }
                };
                tc.restored_checkpoint = Some(cp.name.clone());
                let n = cp.completed_steps.len();
                (
                    AttemptState {
                        state: cp.state,
                        trajectory: Trajectory {
                            steps: cp.completed_steps,
                        },
                        ..AttemptState::default()
                    },
                    n,
                )
            }
        };
        if self.config.strict_idempotency
            && let Some(s) =
                st.last.trajectory.steps.iter().skip(rerun_from).find(|s| {
                    s.tool_called.is_some() && !s.idempotent && s.idempotency_key.is_none()
                })
        {
            let reason = format!(
                "strict idempotency: step {} ({}) is not idempotent and would run again",
                s.index,
                s.tool_called.as_deref().unwrap_or("")
            );
            return Some(self.end(st, reason, true));
        }
        let delay = match &action {
            RecoveryAction::Retry { delay_ms, .. } => *delay_ms,
            _ => 0,
        };
        if let (Some(max), Some(first)) = (self.config.max_recovery_ms, st.first_failure_ms) {
            let spent = self.clock.now_ms().saturating_sub(first);
            if spent.saturating_add(delay) > max {
                let reason = format!(
                    "max recovery time ({max} ms) exceeded: {spent} ms spent, next delay {delay} ms"
                );
                return Some(self.end(st, reason, true));
            }
        }
        if delay > 0 {
            self.clock.sleep(delay).await;
        }
        st.delays_ms.push(delay);
        st.recoveries += 1;
        st.next_start = start;
        st.next_triage = Some(tc);
        None
    }
}
