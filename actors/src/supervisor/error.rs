//! Errors of the supervisor: start failures, unknown or duplicate children, and the restart
//! intensity being exceeded (the reason a supervisor escalates to its parent).

use std::time::Duration;

/// What went wrong in a supervisor operation or why a supervisor gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SupervisorError {
    /// More restarts happened within the period than the intensity allows: the supervisor
    /// stopped its children and itself, escalating to its parent.
    #[error(
        "supervisor '{supervisor}': restart intensity exceeded ({max_restarts} restarts within {period:?}), last failing child '{child}': {reason}"
    )]
    IntensityExceeded {
        /// The supervisor's label.
        supervisor: String,
        /// The child whose exit crossed the limit.
        child: String,
        /// The configured maximum number of restarts within `period`.
        max_restarts: u32,
        /// The configured period.
        period: Duration,
        /// The exit reason of that child.
        reason: String,
    },
    /// A child's start function failed.
    #[error("supervisor '{supervisor}': child '{child}' failed to start: {reason}")]
    StartFailed {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
        /// The error the start function returned.
        reason: String,
    },
    /// A child with this id is already supervised.
    #[error("supervisor '{supervisor}': a child with id '{child}' already exists")]
    DuplicateChild {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
    },
    /// No child with this id is supervised.
    #[error("supervisor '{supervisor}': no child with id '{child}'")]
    UnknownChild {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
    },
}
