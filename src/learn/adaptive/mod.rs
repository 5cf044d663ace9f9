//! Adaptive strategies: failures logged with their classification (infrastructure ones
//! dropped), lessons synthesised per scope once enough strategy failures gathered, vetted,
//! decayed and retrieved by the task's features and tools, injected as a fenced block, and
//! human corrections that are sanitised, redacted, rate-limited per authenticated principal and
//! verified against evidence. One synthesiser per scope through a lease kept in the state.

mod config;
pub mod context;
pub mod correction;
mod cycle;
mod error;
pub mod failure;
pub mod limiter;
mod relevance;
pub mod synth;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use config::{AdaptiveConfig, ScopeMode};
pub use context::{escape_fence, render_strategy_context};
pub use correction::{
    Correction, CorrectionError, ModelVerifier, OfflineVerifier, PreparedCorrection, Verdict,
    Verifier,
};
pub use cycle::{Lease, acquire_lease};
pub use error::AdaptiveError;
pub use failure::{FailureObservation, FailureRecord};
pub use limiter::RateLimiter;
pub use relevance::strategy_context;
pub use synth::{
    LessonDraft, ModelSynthesiser, OfflineSynthesiser, SynthesisInput, Synthesiser, VetRejection,
    vet_lesson,
};

use crate::record::Lesson;
use crate::taxonomy::{ErrorClassification, FailureCategory};
use crate::triage::classify_error;

/// Default upper bound on a lesson's length.
pub const DEFAULT_LESSON_MAX_CHARS: usize = 300;
/// Version of [`AdaptiveSnapshot`].
pub const SNAPSHOT_VERSION: u32 = 1;

/// Everything kept for one scope: its lessons themselves (`L` = [`Lesson`]), or named by id
/// (`L` = `String`) where an owner keeps each lesson apart ([`ScopeState::named`],
/// [`ScopeState::resolve`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScopeState<L = Lesson> {
    /// Failures not yet used by a synthesis, oldest first.
    pub pending: Vec<FailureRecord>,
    /// Failures a synthesis used, kept as evidence for verifying corrections, oldest first.
    pub evidence: Vec<FailureRecord>,
    /// The scope's lessons.
    pub lessons: Vec<L>,
    /// The synthesis lease, if one is held.
    pub lease: Option<Lease>,
    /// Synthesis cycles completed.
    pub cycles: u64,
    /// Infrastructure failures dropped (never learned from).
    pub dropped_infrastructure: u64,
}

/// A scope with nothing in it yet.
impl<L> Default for ScopeState<L> {
    fn default() -> ScopeState<L> {
        ScopeState {
            pending: Vec::new(),
            evidence: Vec::new(),
            lessons: Vec::new(),
            lease: None,
            cycles: 0,
            dropped_infrastructure: 0,
        }
    }
}

impl<L> ScopeState<L> {
    /// Strategy failures pending.
    pub fn pending_strategy(&self) -> usize {
        self.pending.iter().filter(|f| f.is_strategy()).count()
    }
}

impl ScopeState {
    /// The state with its lessons named by id, for an owner that writes each lesson apart
    /// (and only those that changed: [`AdaptiveStrategies::take_changed_lessons`]).
    pub fn named(&self) -> ScopeState<String> {
        ScopeState {
            pending: self.pending.clone(),
            evidence: self.evidence.clone(),
            lessons: self.lessons.iter().map(|l| l.lesson_id.clone()).collect(),
            lease: self.lease.clone(),
            cycles: self.cycles,
            dropped_infrastructure: self.dropped_infrastructure,
        }
    }
}

impl ScopeState<String> {
    /// The state with each named lesson looked up by `lesson`; a name it has no lesson for is
    /// returned apart (the lesson is not in the state).
    pub fn resolve(
        self,
        mut lesson: impl FnMut(&str) -> Option<Lesson>,
    ) -> (ScopeState, Vec<String>) {
        let mut missing = Vec::new();
        let lessons = self
            .lessons
            .into_iter()
            .filter_map(|id| {
                let found = lesson(&id);
                if found.is_none() {
                    missing.push(id);
                }
                found
            })
            .collect();
        let state = ScopeState {
            pending: self.pending,
            evidence: self.evidence,
            lessons,
            lease: self.lease,
            cycles: self.cycles,
            dropped_infrastructure: self.dropped_infrastructure,
        };
        (state, missing)
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
/// [`AdaptiveSnapshot`], whole or as [`AdaptiveStrategies::snapshot_without_scopes`] with each
/// scope changed since it was last taken apart: [`AdaptiveStrategies::take_changed_scopes`]).
#[derive(Debug, Clone)]
pub struct AdaptiveStrategies {
    state: AdaptiveSnapshot,
    /// Scopes changed since they were last taken ([`AdaptiveStrategies::take_changed_scopes`]).
    changed: BTreeSet<String>,
    /// Scopes changed since they were last published
    /// ([`AdaptiveStrategies::take_unpublished_scopes`]).
    unpublished: BTreeSet<String>,
    /// Lessons made or changed since they were last taken
    /// ([`AdaptiveStrategies::take_changed_lessons`]).
    changed_lessons: BTreeSet<String>,
}

/// Equal when the states are (what is still to persist aside).
impl PartialEq for AdaptiveStrategies {
    fn eq(&self, other: &AdaptiveStrategies) -> bool {
        self.state == other.state
    }
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
            changed: BTreeSet::new(),
            unpublished: BTreeSet::new(),
            changed_lessons: BTreeSet::new(),
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

    /// The persisted state but the scopes, which the owner persists one by one as they change
    /// ([`AdaptiveStrategies::take_changed_scopes`]) and puts back into it before
    /// [`AdaptiveStrategies::restore`]: what a consolidation writes stays small however many
    /// users' scopes there are.
    pub fn snapshot_without_scopes(&self) -> AdaptiveSnapshot {
        AdaptiveSnapshot {
            version: self.state.version,
            config: self.state.config.clone(),
            scopes: BTreeMap::new(),
            limiter: self.state.limiter.clone(),
            next_id: self.state.next_id,
        }
    }

    /// The scopes changed since the last call, each once with its state as it is now, and
    /// forgets them.
    pub fn take_scope_changes(&mut self) -> Vec<(String, ScopeState)> {
        self.take_changed_scopes()
            .into_iter()
            .filter_map(|k| {
                let s = self.state.scopes.get(&k)?.clone();
                Some((k, s))
            })
            .collect()
    }

    /// The names of the scopes changed since the last call (or the last
    /// [`AdaptiveStrategies::take_scope_changes`]), and forgets them: for an owner that writes
    /// them later, as they are then ([`AdaptiveStrategies::scope`]).
    pub fn take_changed_scopes(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed)
    }

    /// Notes `scope` and each of its lessons as changed, so that the next
    /// [`AdaptiveStrategies::take_changed_scopes`] and
    /// [`AdaptiveStrategies::take_changed_lessons`] hand them over: for an owner that must
    /// write a scope again (one it read from a snapshot that held its scopes inline).
    pub fn note_changed(&mut self, scope: &str) {
        if let Some(s) = self.state.scopes.get(scope) {
            self.changed_lessons
                .extend(s.lessons.iter().map(|l| l.lesson_id.clone()));
            self.changed.insert(scope.to_string());
        }
    }

    /// The ids of the lessons made or changed since the last call (a lesson that left its
    /// scope since may be among them), and forgets them: for an owner that writes each lesson
    /// apart from its scope ([`ScopeState::named`]), only when it changed.
    pub fn take_changed_lessons(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed_lessons)
    }

    /// The names of the scopes changed since the last call, and forgets them: for an owner that
    /// shows each scope's lessons to readers of its own ([`AdaptiveStrategies::lessons`]), apart
    /// from what it writes.
    pub fn take_unpublished_scopes(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.unpublished)
    }

    /// Notes `scope` as changed, to be written and published.
    fn touch(&mut self, scope: &str) {
        for set in [&mut self.changed, &mut self.unpublished] {
            if !set.contains(scope) {
                set.insert(scope.to_string());
            }
        }
    }

    /// Rebuilds from a snapshot (validating its version and configuration).
    pub fn restore(snapshot: AdaptiveSnapshot) -> Result<AdaptiveStrategies, AdaptiveError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(AdaptiveError::SnapshotVersion(snapshot.version));
        }
        snapshot.config.validate()?;
        Ok(AdaptiveStrategies {
            state: snapshot,
            changed: BTreeSet::new(),
            unpublished: BTreeSet::new(),
            changed_lessons: BTreeSet::new(),
        })
    }

    /// A scope's state to change (created empty when it has none), noted as changed.
    fn scope_mut(&mut self, scope: &str) -> &mut ScopeState {
        self.touch(scope);
        self.state.scopes.entry(scope.to_string()).or_default()
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
    /// infrastructure failure, which is dropped and never learned from (a message that asks
    /// for another argument is the call's doing, a strategy failure: see [`classify_error`]).
    /// Keeps at most `failure_retention` pending failures (oldest dropped).
    pub fn record_failure(
        &mut self,
        scope: &str,
        obs: &FailureObservation,
        now_ms: u64,
    ) -> FailureOutcome {
        let classification = classify_error(obs.error_type.as_deref(), &obs.message);
        if classification.category == FailureCategory::Infrastructure {
            self.scope_mut(scope).dropped_infrastructure += 1;
            return FailureOutcome::Dropped { classification };
        }
        let id = self.next_id();
        let record = FailureRecord::new(id, obs, classification.clone(), now_ms);
        let retention = self.state.config.failure_retention;
        let threshold = self.state.config.synthesis_threshold;
        let s = self.scope_mut(scope);
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

    /// Removes lessons past their TTL in every scope; returns their ids.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let ttl = self.state.config.strategy_ttl_ms;
        let mut removed = Vec::new();
        if ttl == 0 {
            return removed;
        }
        let mut touched = Vec::new();
        for (scope, s) in self.state.scopes.iter_mut() {
            let before = removed.len();
            s.lessons.retain(|l| {
                let keep = now_ms.saturating_sub(l.reinforced_ms) <= ttl;
                if !keep {
                    removed.push(l.lesson_id.clone());
                }
                keep
            });
            if removed.len() > before {
                touched.push(scope.clone());
            }
        }
        for scope in touched {
            self.touch(&scope);
        }
        removed
    }
}
