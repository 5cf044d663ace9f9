//! error: what can go wrong when a policy is built, reconfigured or restored.

/// Errors of the policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The stage list is empty or a stage has no arms.
    #[error("policy stages: {0}")]
    BadStages(String),
    /// A configuration value is out of range.
    #[error("policy config field `{field}`: {reason}")]
    BadConfig {
        /// The field.
        field: &'static str,
        /// What was expected.
        reason: String,
    },
    /// A snapshot does not fit.
    #[error("policy snapshot: {0}")]
    BadSnapshot(String),
}
