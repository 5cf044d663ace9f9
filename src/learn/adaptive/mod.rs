//! Adaptive strategies: failures logged with their classification (infrastructure ones
//! dropped), lessons synthesised per scope once enough strategy failures gathered, vetted,
//! decayed and retrieved by the task's features and tools, injected as a fenced block, and
//! human corrections that are sanitised, redacted, rate-limited per authenticated principal and
//! verified against evidence. One synthesiser per scope through a lease kept in the state.

pub mod context;
pub mod correction;
pub mod failure;
pub mod limiter;
pub mod synth;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use context::{escape_fence, render_strategy_context};
pub use correction::{
    Correction, CorrectionError, ModelVerifier, OfflineVerifier, PreparedCorrection, Verdict,
    Verifier,
};
pub use failure::{FailureObservation, FailureRecord};
pub use limiter::RateLimiter;
pub use synth::{
    LessonDraft, ModelSynthesiser, OfflineSynthesiser, SynthesisInput, Synthesiser, VetRejection,
    vet_lesson,
};

use crate::guard::injection::scan_injection;
use crate::guard::pii::redact;
use crate::guard::sanitize::sanitize;
use crate::model::cosine;
use crate::model::embed::embed_one;
use crate::record::{Lesson, Task};
use crate::taxonomy::{ErrorClassification, FailureCategory};
use crate::triage::classify_error;

/// Default upper bound on a lesson's length.
pub const DEFAULT_LESSON_MAX_CHARS: usize = 300;
/// Version of [`AdaptiveSnapshot`].
pub const SNAPSHOT_VERSION: u32 = 1;

/// Whose lessons a task sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeMode {
    /// One scope per user (the default).
    #[default]
    PerUser,
    /// One scope per tenant.
    PerTenant,
    /// One scope for everyone.
    Shared,
    /// One scope per session.
    PerSession,
}

/// Configuration of adaptive strategies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdaptiveConfig {
    /// How scopes are keyed.
    pub scope: ScopeMode,
    /// Strategy failures in a scope that trigger a synthesis.
    pub synthesis_threshold: usize,
    /// Pending failures kept per scope (and consumed failures kept as evidence); must be at
    /// least `synthesis_threshold`.
    pub failure_retention: usize,
    /// Failures given to one synthesis; only those are consumed.
    pub max_failures_per_synthesis: usize,
    /// Lessons kept per scope.
    pub max_strategies: usize,
    /// Lessons not reinforced for this long are removed; 0 = never.
    pub strategy_ttl_ms: u64,
    /// Lessons below this confidence are removed and never injected.
    pub min_confidence: f64,
    /// Confidence an unreinforced lesson loses per synthesis cycle.
    pub decay_per_cycle: f64,
    /// Confidence of a synthesised lesson.
    pub synthesised_confidence: f64,
    /// Confidence of a verified correction.
    pub correction_confidence: f64,
    /// Lessons injected before a run.
    pub top_k: usize,
    /// Shortest lesson or correction accepted.
    pub lesson_min_chars: usize,
    /// Longest lesson or correction accepted.
    pub lesson_max_chars: usize,
    /// Corrections per principal per window.
    pub corrections_per_window: u32,
    /// The rate-limit window.
    pub correction_window_ms: u64,
    /// How long a synthesis lease lasts.
    pub lease_ms: u64,
    /// Cosine above which a synthesised lesson reinforces an existing one instead of adding.
    pub duplicate_cosine: f32,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            scope: ScopeMode::PerUser,
            synthesis_threshold: 5,
            failure_retention: 50,
            max_failures_per_synthesis: 10,
            max_strategies: 20,
            strategy_ttl_ms: 0,
            min_confidence: 0.3,
            decay_per_cycle: 0.1,
            synthesised_confidence: 0.8,
            correction_confidence: 1.0,
            top_k: 3,
            lesson_min_chars: 12,
            lesson_max_chars: DEFAULT_LESSON_MAX_CHARS,
            corrections_per_window: 10,
            correction_window_ms: 3_600_000,
            lease_ms: 120_000,
            duplicate_cosine: 0.92,
        }
    }
}

/// Errors of adaptive strategies.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdaptiveError {
    /// The configuration is inconsistent.
    #[error("adaptive config field {field}: {reason}")]
    Config {
        /// The field at fault.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The scope mode needs an identity the task does not have.
    #[error("scope mode {mode:?} needs a {missing} on task {task_id}")]
    MissingScopeIdentity {
        /// The mode.
        mode: ScopeMode,
        /// `user_id`, `tenant` or `session_id`.
        missing: &'static str,
        /// The task.
        task_id: String,
    },
    /// Not enough strategy failures for a synthesis.
    #[error("scope {scope}: {pending} strategy failures pending, synthesis needs {threshold}")]
    NotDue {
        /// The scope.
        scope: String,
        /// Strategy failures pending.
        pending: usize,
        /// The threshold.
        threshold: usize,
    },
    /// Another worker holds the scope's synthesis lease.
    #[error("scope {scope}: synthesis lease held by {owner} until {expires_ms}")]
    LeaseHeld {
        /// The scope.
        scope: String,
        /// The holder.
        owner: String,
        /// When it expires.
        expires_ms: u64,
    },
    /// The job's lease expired or was taken over; nothing was written.
    #[error("scope {scope}: synthesis lease of {owner} (token {token}) is no longer held")]
    LeaseLost {
        /// The scope.
        scope: String,
        /// The job's owner.
        owner: String,
        /// The job's token.
        token: u64,
    },
    /// A snapshot of an unknown version.
    #[error("adaptive snapshot version {0} is not supported (expected {SNAPSHOT_VERSION})")]
    SnapshotVersion(u32),
}

/// A lease on a scope's synthesis: only its owner may complete a synthesis there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The worker holding it.
    pub owner: String,
    /// The job token it was granted with.
    pub token: u64,
    /// When it expires (ms).
    pub expires_ms: u64,
}

/// Check-and-set of a scope's synthesis lease: grants `owner` a lease with `token` unless
/// another owner holds an unexpired one. A caller that keeps the lease as its own record (for
/// example under its own key in the store) calls this with the record it read and writes the
/// result back in the same serialised step.
pub fn acquire_lease(
    scope: &str,
    current: Option<&Lease>,
    owner: &str,
    token: u64,
    now_ms: u64,
    lease_ms: u64,
) -> Result<Lease, AdaptiveError> {
    if let Some(lease) = current
        && lease.owner != owner
        && lease.expires_ms > now_ms
    {
        return Err(AdaptiveError::LeaseHeld {
            scope: scope.to_string(),
            owner: lease.owner.clone(),
            expires_ms: lease.expires_ms,
        });
    }
    Ok(Lease {
        owner: owner.to_string(),
        token,
        expires_ms: now_ms.saturating_add(lease_ms),
    })
}

/// Everything kept for one scope.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScopeState {
    /// Failures not yet used by a synthesis, oldest first.
    pub pending: Vec<FailureRecord>,
    /// Failures a synthesis used, kept as evidence for verifying corrections, oldest first.
    pub evidence: Vec<FailureRecord>,
    /// The scope's lessons.
    pub lessons: Vec<Lesson>,
    /// The synthesis lease, if one is held.
    pub lease: Option<Lease>,
    /// Synthesis cycles completed.
    pub cycles: u64,
    /// Infrastructure failures dropped (never learned from).
    pub dropped_infrastructure: u64,
}

impl ScopeState {
    /// Strategy failures pending.
    pub fn pending_strategy(&self) -> usize {
        self.pending.iter().filter(|f| f.is_strategy()).count()
    }
}

/// The persisted state of [`AdaptiveStrategies`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveSnapshot {
    /// Format version.
    pub version: u32,
    /// The configuration (JSON text when stored, so that a setting added in a later build does
    /// not make the snapshot unreadable).
    #[serde(with = "crate::store::envelope::as_json")]
    pub config: AdaptiveConfig,
    /// Per-scope state.
    pub scopes: BTreeMap<String, ScopeState>,
    /// The correction rate limiter.
    pub limiter: RateLimiter,
    /// Next id for failures, lessons and leases.
    pub next_id: u64,
}

/// What happened to a recorded failure.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureOutcome {
    /// An infrastructure failure: not stored, never learned from.
    Dropped {
        /// The classifier's verdict.
        classification: ErrorClassification,
    },
    /// Stored for synthesis.
    Stored {
        /// Its id.
        id: u64,
        /// The classifier's verdict.
        classification: ErrorClassification,
        /// Whether the scope now has enough strategy failures for a synthesis.
        synthesis_due: bool,
    },
}

/// A synthesis in progress: the batch and the lease it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SynthesisJob {
    /// The worker.
    pub owner: String,
    /// The lease token.
    pub token: u64,
    /// The batch for the synthesiser.
    pub input: SynthesisInput,
}

/// What a completed synthesis did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SynthesisReport {
    /// Lessons added.
    pub added: Vec<String>,
    /// Existing lessons reinforced.
    pub reinforced: Vec<String>,
    /// Drafts refused, with the reason.
    pub rejected: Vec<(String, VetRejection)>,
    /// Lessons removed (decayed below the floor, expired, or over `max_strategies`).
    pub removed: Vec<String>,
    /// Failures consumed (exactly the batch).
    pub consumed: Vec<u64>,
}

/// A lesson with its relevance score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredLesson {
    /// The lesson.
    pub lesson: Lesson,
    /// Relevance times confidence.
    pub score: f64,
}

/// What a task brings to relevance ranking.
#[derive(Debug, Clone, Copy)]
pub struct RelevanceQuery<'a> {
    /// The task's features.
    pub features: &'a BTreeMap<String, String>,
    /// The tools the plan may use.
    pub tools: &'a [String],
    /// The goal words (a minor signal).
    pub goal: &'a str,
}

/// Adaptive strategies over all scopes (a pure struct: the actor owns it and persists its
/// [`AdaptiveSnapshot`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveStrategies {
    state: AdaptiveSnapshot,
}

fn config_error(field: &'static str, reason: impl Into<String>) -> AdaptiveError {
    AdaptiveError::Config {
        field,
        reason: reason.into(),
    }
}

impl AdaptiveConfig {
    /// Checks the configuration; in particular `failure_retention` below
    /// `synthesis_threshold` is an error (synthesis could never fire).
    pub fn validate(&self) -> Result<(), AdaptiveError> {
        if self.synthesis_threshold == 0 {
            return Err(config_error("synthesis_threshold", "must be at least 1"));
        }
        if self.failure_retention < self.synthesis_threshold {
            return Err(config_error(
                "failure_retention",
                format!(
                    "{} is below synthesis_threshold {}: synthesis would never fire",
                    self.failure_retention, self.synthesis_threshold
                ),
            ));
        }
        if self.max_failures_per_synthesis == 0 {
            return Err(config_error(
                "max_failures_per_synthesis",
                "must be at least 1",
            ));
        }
        if self.max_strategies == 0 {
            return Err(config_error("max_strategies", "must be at least 1"));
        }
        for (field, v) in [
            ("min_confidence", self.min_confidence),
            ("decay_per_cycle", self.decay_per_cycle),
            ("synthesised_confidence", self.synthesised_confidence),
            ("correction_confidence", self.correction_confidence),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(config_error(field, format!("{v} is outside [0, 1]")));
            }
        }
        if self.synthesised_confidence < self.min_confidence {
            return Err(config_error(
                "synthesised_confidence",
                "below min_confidence: lessons would be deleted on arrival",
            ));
        }
        if self.lesson_min_chars > self.lesson_max_chars {
            return Err(config_error("lesson_min_chars", "above lesson_max_chars"));
        }
        if self.corrections_per_window == 0 || self.correction_window_ms == 0 {
            return Err(config_error(
                "corrections_per_window",
                "rate limit and window must be positive",
            ));
        }
        if self.lease_ms == 0 {
            return Err(config_error("lease_ms", "must be positive"));
        }
        Ok(())
    }

    /// The scope key of a task under this configuration (`user:<id>`, `tenant:<id>`,
    /// `session:<id>` or `shared`).
    pub fn scope_of(&self, task: &Task) -> Result<String, AdaptiveError> {
        let need = |v: &Option<String>, missing: &'static str, prefix: &str| {
            v.as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| format!("{prefix}:{s}"))
                .ok_or_else(|| AdaptiveError::MissingScopeIdentity {
                    mode: self.scope,
                    missing,
                    task_id: task.task_id.clone(),
                })
        };
        match self.scope {
            ScopeMode::PerUser => need(&task.user_id, "user_id", "user"),
            ScopeMode::PerTenant => need(&task.tenant, "tenant", "tenant"),
            ScopeMode::PerSession => need(&task.session_id, "session_id", "session"),
            ScopeMode::Shared => Ok("shared".to_string()),
        }
    }
}

/// Lowercased words of a text, for the minor word-overlap signal.
fn word_set(text: &str) -> BTreeSet<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(str::to_string)
        .collect()
}

impl AdaptiveStrategies {
    /// Empty state under a validated configuration.
    pub fn new(config: AdaptiveConfig) -> Result<AdaptiveStrategies, AdaptiveError> {
        config.validate()?;
        let limiter = RateLimiter::new(config.corrections_per_window, config.correction_window_ms);
        Ok(AdaptiveStrategies {
            state: AdaptiveSnapshot {
                version: SNAPSHOT_VERSION,
                config,
                scopes: BTreeMap::new(),
                limiter,
                next_id: 1,
            },
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AdaptiveConfig {
        &self.state.config
    }

    /// Replaces the configuration (validated first) and keeps the state: a restored snapshot
    /// takes the configuration in force now, not the one it was written under. The correction
    /// limiter keeps its recorded events under the new limit and window.
    pub fn set_config(&mut self, config: AdaptiveConfig) -> Result<(), AdaptiveError> {
        config.validate()?;
        self.state.limiter.limit = config.corrections_per_window;
        self.state.limiter.window_ms = config.correction_window_ms;
        self.state.config = config;
        Ok(())
    }

    /// The persisted state.
    pub fn snapshot(&self) -> AdaptiveSnapshot {
        self.state.clone()
    }

    /// Rebuilds from a snapshot (validating its version and configuration).
    pub fn restore(snapshot: AdaptiveSnapshot) -> Result<AdaptiveStrategies, AdaptiveError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(AdaptiveError::SnapshotVersion(snapshot.version));
        }
        snapshot.config.validate()?;
        Ok(AdaptiveStrategies { state: snapshot })
    }

    /// The state of one scope, if it has any.
    pub fn scope(&self, scope: &str) -> Option<&ScopeState> {
        self.state.scopes.get(scope)
    }

    /// Every scope key with state.
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        self.state.scopes.keys().map(String::as_str)
    }

    /// The lessons of a scope (active or not).
    pub fn lessons(&self, scope: &str) -> &[Lesson] {
        self.state
            .scopes
            .get(scope)
            .map(|s| s.lessons.as_slice())
            .unwrap_or(&[])
    }

    fn next_id(&mut self) -> u64 {
        let id = self.state.next_id;
        self.state.next_id += 1;
        id
    }

    /// Classifies a failure with [`classify_error`] and stores it unless it is an
    /// infrastructure failure, which is dropped and never learned from. Keeps at most
    /// `failure_retention` pending failures (oldest dropped).
    pub fn record_failure(
        &mut self,
        scope: &str,
        obs: &FailureObservation,
        now_ms: u64,
    ) -> FailureOutcome {
        let classification = classify_error(obs.error_type.as_deref(), &obs.message);
        if classification.category == FailureCategory::Infrastructure {
            self.state
                .scopes
                .entry(scope.to_string())
                .or_default()
                .dropped_infrastructure += 1;
            return FailureOutcome::Dropped { classification };
        }
        let id = self.next_id();
        let record = FailureRecord::new(id, obs, classification.clone(), now_ms);
        let retention = self.state.config.failure_retention;
        let threshold = self.state.config.synthesis_threshold;
        let s = self.state.scopes.entry(scope.to_string()).or_default();
        s.pending.push(record);
        if s.pending.len() > retention {
            let excess = s.pending.len() - retention;
            s.pending.drain(..excess);
        }
        FailureOutcome::Stored {
            id,
            classification,
            synthesis_due: s.pending_strategy() >= threshold,
        }
    }

    /// Whether a scope has enough strategy failures for a synthesis.
    pub fn synthesis_due(&self, scope: &str) -> bool {
        self.scope(scope)
            .is_some_and(|s| s.pending_strategy() >= self.state.config.synthesis_threshold)
    }

    /// Starts a synthesis in `scope` for worker `owner`: takes the scope's lease (refused while
    /// another owner holds an unexpired one) and returns the batch (the oldest
    /// `max_failures_per_synthesis` pending failures). The caller persists the snapshot right
    /// after, so a second worker loading the store sees the lease.
    pub fn begin_synthesis(
        &mut self,
        scope: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<SynthesisJob, AdaptiveError> {
        let threshold = self.state.config.synthesis_threshold;
        let pending = self.scope(scope).map_or(0, ScopeState::pending_strategy);
        if pending < threshold {
            return Err(AdaptiveError::NotDue {
                scope: scope.to_string(),
                pending,
                threshold,
            });
        }
        let current = self.scope(scope).and_then(|s| s.lease.clone());
        let token = self.next_id();
        let lease = acquire_lease(
            scope,
            current.as_ref(),
            owner,
            token,
            now_ms,
            self.state.config.lease_ms,
        )?;
        let max = self.state.config.max_failures_per_synthesis;
        let known_tools: BTreeSet<String> = self
            .scope(scope)
            .map(|s| {
                s.pending
                    .iter()
                    .chain(s.evidence.iter())
                    .map(|f| f.tool.clone())
                    .chain(s.lessons.iter().filter_map(|l| l.tool.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let s = self.state.scopes.entry(scope.to_string()).or_default();
        s.lease = Some(lease);
        let failures: Vec<FailureRecord> = s.pending.iter().take(max).cloned().collect();
        Ok(SynthesisJob {
            owner: owner.to_string(),
            token,
            input: SynthesisInput {
                scope: scope.to_string(),
                failures,
                known_tools,
                lesson_chars: (
                    self.state.config.lesson_min_chars,
                    self.state.config.lesson_max_chars,
                ),
            },
        })
    }

    fn check_lease(&self, job: &SynthesisJob, now_ms: u64) -> Result<(), AdaptiveError> {
        let held = self
            .scope(&job.input.scope)
            .and_then(|s| s.lease.as_ref())
            .is_some_and(|l| l.owner == job.owner && l.token == job.token && l.expires_ms > now_ms);
        if held {
            Ok(())
        } else {
            Err(AdaptiveError::LeaseLost {
                scope: job.input.scope.clone(),
                owner: job.owner.clone(),
                token: job.token,
            })
        }
    }

    /// Gives up a synthesis (for example after a model error): releases the lease if the job
    /// still holds it, consumes nothing.
    pub fn abort_synthesis(&mut self, job: &SynthesisJob, now_ms: u64) {
        if self.check_lease(job, now_ms).is_ok()
            && let Some(s) = self.state.scopes.get_mut(&job.input.scope)
        {
            s.lease = None;
        }
    }

    /// Completes a synthesis: refused unless the job still holds the lease. Vets the drafts,
    /// adds new lessons (or reinforces near-duplicates), decays every lesson not reinforced in
    /// this cycle, removes those below the floor, expired ones and the excess over
    /// `max_strategies`, consumes exactly the batch's failures and releases the lease.
    pub fn complete_synthesis(
        &mut self,
        job: &SynthesisJob,
        drafts: Vec<LessonDraft>,
        now_ms: u64,
    ) -> Result<SynthesisReport, AdaptiveError> {
        self.check_lease(job, now_ms)?;
        let cfg = self.state.config.clone();
        let failing = job.input.failing_tools();
        let mut report = SynthesisReport::default();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for draft in drafts {
            if let Err(why) = vet_lesson(
                &draft,
                &failing,
                &job.input.known_tools,
                cfg.lesson_min_chars,
                cfg.lesson_max_chars,
            ) {
                report.rejected.push((draft.tool.clone(), why));
                continue;
            }
            let tool_failures: Vec<&FailureRecord> = job
                .input
                .failures
                .iter()
                .filter(|f| f.tool == draft.tool)
                .collect();
            let preconditions = if draft.preconditions.is_empty() {
                synth::common_features(tool_failures.iter().copied())
            } else {
                draft.preconditions.clone()
            };
            let mut evidence: Vec<String> =
                tool_failures.iter().map(|f| f.run_id.clone()).collect();
            evidence.sort();
            evidence.dedup();
            let text = draft.lesson.trim().to_string();
            let vector = embed_one(&text);
            let id = self.next_id();
            let s = self
                .state
                .scopes
                .entry(job.input.scope.clone())
                .or_default();
            let existing = s.lessons.iter_mut().find(|l| {
                l.superseded_by.is_none()
                    && l.tool.as_deref() == Some(draft.tool.as_str())
                    && l.preconditions == preconditions
                    && (l.action == text
                        || cosine(&embed_one(&l.action), &vector) > cfg.duplicate_cosine)
            });
            match existing {
                Some(l) => {
                    l.confidence = (l.confidence + cfg.decay_per_cycle)
                        .max(cfg.synthesised_confidence)
                        .min(1.0);
                    l.reinforced_ms = now_ms;
                    for r in evidence {
                        if !l.evidence.contains(&r) {
                            l.evidence.push(r);
                        }
                    }
                    touched.insert(l.lesson_id.clone());
                    report.reinforced.push(l.lesson_id.clone());
                }
                None => {
                    let lesson_id = format!("adaptive-{id}");
                    s.lessons.push(Lesson {
                        lesson_id: lesson_id.clone(),
                        preconditions,
                        tool: Some(draft.tool.clone()),
                        action: text,
                        confidence: cfg.synthesised_confidence,
                        evidence,
                        source: "synthesis".into(),
                        scope: job.input.scope.clone(),
                        created_ms: now_ms,
                        reinforced_ms: now_ms,
                        superseded_by: None,
                    });
                    touched.insert(lesson_id.clone());
                    report.added.push(lesson_id);
                }
            }
        }
        let s = self
            .state
            .scopes
            .entry(job.input.scope.clone())
            .or_default();
        for l in s.lessons.iter_mut() {
            if !touched.contains(&l.lesson_id) {
                l.confidence = (l.confidence - cfg.decay_per_cycle).max(0.0);
            }
        }
        // Floating-point: 0.8 - 5 * 0.1 must count as below 0.3.
        let floor = cfg.min_confidence - 1e-9;
        let mut removed = Vec::new();
        s.lessons.retain(|l| {
            let expired = cfg.strategy_ttl_ms > 0
                && now_ms.saturating_sub(l.reinforced_ms) > cfg.strategy_ttl_ms;
            let keep = l.confidence >= floor && !expired;
            if !keep {
                removed.push(l.lesson_id.clone());
            }
            keep
        });
        if s.lessons.len() > cfg.max_strategies {
            s.lessons.sort_by(|a, b| {
                b.confidence
                    .total_cmp(&a.confidence)
                    .then(b.reinforced_ms.cmp(&a.reinforced_ms))
                    .then(a.lesson_id.cmp(&b.lesson_id))
            });
            for l in s.lessons.drain(cfg.max_strategies..) {
                removed.push(l.lesson_id);
            }
        }
        report.removed = removed;
        let used: BTreeSet<u64> = job.input.failures.iter().map(|f| f.id).collect();
        let mut consumed = Vec::new();
        let mut kept = Vec::new();
        for f in s.pending.drain(..) {
            if used.contains(&f.id) {
                consumed.push(f.id);
                s.evidence.push(f);
            } else {
                kept.push(f);
            }
        }
        s.pending = kept;
        if s.evidence.len() > cfg.failure_retention {
            let excess = s.evidence.len() - cfg.failure_retention;
            s.evidence.drain(..excess);
        }
        report.consumed = consumed;
        s.cycles += 1;
        s.lease = None;
        Ok(report)
    }

    /// Runs a whole synthesis with the offline synthesiser (begin, derive, complete).
    pub fn synthesise_offline(
        &mut self,
        scope: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<SynthesisReport, AdaptiveError> {
        let job = self.begin_synthesis(scope, owner, now_ms)?;
        let drafts = OfflineSynthesiser.derive(&job.input, self.state.config.lesson_max_chars);
        self.complete_synthesis(&job, drafts, now_ms)
    }

    /// Removes lessons past their TTL in every scope; returns their ids.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let ttl = self.state.config.strategy_ttl_ms;
        let mut removed = Vec::new();
        if ttl == 0 {
            return removed;
        }
        for s in self.state.scopes.values_mut() {
            s.lessons.retain(|l| {
                let keep = now_ms.saturating_sub(l.reinforced_ms) <= ttl;
                if !keep {
                    removed.push(l.lesson_id.clone());
                }
                keep
            });
        }
        removed
    }

    /// The most relevant active lessons of a scope for a task, best first (at most `top_k`).
    /// Relevance comes from the task's tools (a lesson about a planned tool), its features (a
    /// lesson whose preconditions hold; a lesson with a contradicted precondition is never
    /// returned) and, weakly, the goal's words; it is multiplied by the confidence. Lessons
    /// below the floor, expired or superseded are never returned.
    pub fn relevant(
        &self,
        scope: &str,
        query: RelevanceQuery<'_>,
        now_ms: u64,
    ) -> Vec<ScoredLesson> {
        let cfg = &self.state.config;
        let goal_words = word_set(query.goal);
        let mut scored: Vec<ScoredLesson> = self
            .lessons(scope)
            .iter()
            .filter(|l| l.superseded_by.is_none())
            .filter(|l| l.confidence >= cfg.min_confidence - 1e-9)
            .filter(|l| {
                cfg.strategy_ttl_ms == 0
                    || now_ms.saturating_sub(l.reinforced_ms) <= cfg.strategy_ttl_ms
            })
            .filter_map(|l| {
                let mut matched = 0usize;
                for (k, v) in &l.preconditions {
                    match query.features.get(k) {
                        Some(x) if x == v => matched += 1,
                        Some(_) => return None,
                        None => {}
                    }
                }
                let tool_score = match &l.tool {
                    Some(t) if query.tools.iter().any(|q| q == t) => 2.0,
                    _ => 0.0,
                };
                let feature_score = matched as f64 / (l.preconditions.len().max(1)) as f64;
                let lesson_words = word_set(&l.action);
                let inter = goal_words.intersection(&lesson_words).count() as f64;
                let union = goal_words.union(&lesson_words).count().max(1) as f64;
                let word_score = 0.5 * inter / union;
                let raw = tool_score + feature_score + word_score;
                (raw > 0.0).then(|| ScoredLesson {
                    lesson: l.clone(),
                    score: raw * l.confidence,
                })
            })
            .collect();
        scored.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.lesson.lesson_id.cmp(&b.lesson.lesson_id))
        });
        scored.truncate(cfg.top_k);
        scored
    }

    /// The fenced `<strategy_context>` block for a task (see [`render_strategy_context`]).
    pub fn context_for(
        &self,
        scope: &str,
        query: RelevanceQuery<'_>,
        now_ms: u64,
    ) -> Option<String> {
        let lessons: Vec<Lesson> = self
            .relevant(scope, query, now_ms)
            .into_iter()
            .map(|s| s.lesson)
            .collect();
        render_strategy_context(&lessons)
    }

    /// First half of a correction: refuses an unauthenticated one, counts it against the
    /// principal's rate limit, sanitises it (multi-pass, NFKC, invisible characters removed),
    /// refuses injection patterns, redacts PII, checks its length and attaches the scope's
    /// failure evidence for the verifier.
    pub fn prepare_correction(
        &mut self,
        correction: &Correction,
        now_ms: u64,
    ) -> Result<PreparedCorrection, CorrectionError> {
        let principal = correction
            .principal
            .as_deref()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .ok_or(CorrectionError::Unauthenticated)?
            .to_string();
        self.state
            .limiter
            .check_and_record(&principal, now_ms)
            .map_err(|retry_after_ms| CorrectionError::RateLimited {
                principal: principal.clone(),
                retry_after_ms,
            })?;
        if let Some(f) = scan_injection(&correction.text).into_iter().next() {
            return Err(CorrectionError::Injection {
                rule: f.rule,
                excerpt: f.excerpt,
            });
        }
        let clean = sanitize(&correction.text);
        if let Some(f) = scan_injection(&clean).into_iter().next() {
            return Err(CorrectionError::Injection {
                rule: f.rule,
                excerpt: f.excerpt,
            });
        }
        let red = redact(&clean);
        let chars = red.text.chars().count();
        let cfg = &self.state.config;
        if chars < cfg.lesson_min_chars || chars > cfg.lesson_max_chars {
            return Err(CorrectionError::Length {
                chars,
                min: cfg.lesson_min_chars,
                max: cfg.lesson_max_chars,
            });
        }
        let evidence = self
            .scope(&correction.scope)
            .map(|s| s.evidence.iter().chain(s.pending.iter()).cloned().collect())
            .unwrap_or_default();
        Ok(PreparedCorrection {
            principal,
            scope: correction.scope.clone(),
            tool: correction.tool.as_deref().map(sanitize),
            text: red.text,
            redacted: red.found,
            evidence,
            run_id: correction.run_id.clone(),
        })
    }

    /// Second half: stores a verified correction as a lesson at `correction_confidence`; a
    /// rejected one is an error and nothing is stored.
    pub fn commit_correction(
        &mut self,
        prepared: PreparedCorrection,
        verdict: Verdict,
        now_ms: u64,
    ) -> Result<Lesson, CorrectionError> {
        let (tool, mut evidence) = match verdict {
            Verdict::Rejected { reason } => return Err(CorrectionError::Rejected { reason }),
            Verdict::Verified {
                tool,
                evidence_run_ids,
            } => (tool.or(prepared.tool.clone()), evidence_run_ids),
        };
        if let Some(r) = &prepared.run_id
            && !evidence.contains(r)
        {
            evidence.push(r.clone());
        }
        let id = self.next_id();
        let preconditions = {
            let s = self.scope(&prepared.scope);
            let fails: Vec<&FailureRecord> = s
                .map(|s| {
                    s.evidence
                        .iter()
                        .chain(s.pending.iter())
                        .filter(|f| tool.as_ref().is_none_or(|t| &f.tool == t))
                        .filter(|f| evidence.contains(&f.run_id))
                        .collect()
                })
                .unwrap_or_default();
            synth::common_features(fails)
        };
        let lesson = Lesson {
            lesson_id: format!("correction-{id}"),
            preconditions,
            tool,
            action: prepared.text,
            confidence: self.state.config.correction_confidence,
            evidence,
            source: "correction".into(),
            scope: prepared.scope.clone(),
            created_ms: now_ms,
            reinforced_ms: now_ms,
            superseded_by: None,
        };
        let max = self.state.config.max_strategies;
        let s = self.state.scopes.entry(prepared.scope).or_default();
        s.lessons.push(lesson.clone());
        if s.lessons.len() > max {
            s.lessons.sort_by(|a, b| {
                b.confidence
                    .total_cmp(&a.confidence)
                    .then(b.reinforced_ms.cmp(&a.reinforced_ms))
            });
            s.lessons.truncate(max);
        }
        Ok(lesson)
    }

    /// A whole correction with the offline verifier (prepare, check, commit).
    pub fn submit_correction_offline(
        &mut self,
        correction: &Correction,
        now_ms: u64,
    ) -> Result<Lesson, CorrectionError> {
        let prepared = self.prepare_correction(correction, now_ms)?;
        let verdict = OfflineVerifier.check(&prepared);
        self.commit_correction(prepared, verdict, now_ms)
    }

    /// The correction rate limiter (persisted in the snapshot).
    pub fn limiter(&self) -> &RateLimiter {
        &self.state.limiter
    }
}
