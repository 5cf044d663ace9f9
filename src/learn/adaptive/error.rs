//! error: what can go wrong in adaptive strategies, each error naming its field or scope.

use super::{SNAPSHOT_VERSION, ScopeMode};

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
