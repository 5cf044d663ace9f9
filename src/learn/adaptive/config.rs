//! config: what adaptive strategies are set up with (scopes, thresholds, decay, limits) and
//! its checks.

use serde::{Deserialize, Serialize};

use super::{AdaptiveError, DEFAULT_LESSON_MAX_CHARS};
use crate::record::Task;

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
    /// Lessons injected before a run, at most: raise it when an agent's plans call more tools
    /// that each have their own rules; lower it when the model's context is small and the
    /// lessons crowd out the task.
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
            top_k: 6,
            lesson_min_chars: 12,
            lesson_max_chars: DEFAULT_LESSON_MAX_CHARS,
            corrections_per_window: 10,
            correction_window_ms: 3_600_000,
            lease_ms: 120_000,
            duplicate_cosine: 0.92,
        }
    }
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
