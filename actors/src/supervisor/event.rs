//! What a supervisor reports through its event hook: child exits, scheduled and performed
//! restarts, and escalation.

use std::time::Duration;

use ractor::SupervisionEvent;

use super::spec::Restart;

/// How a child ended, as the restart types see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// Stopped on its own or by request (`stop`, drained): not restarted if transient.
    Normal(Option<String>),
    /// Panicked or returned an error from a handler.
    Failed(String),
    /// Killed (`Signal::Kill`, or its task was cancelled): counts as abnormal.
    Killed(String),
}

impl ExitReason {
    /// Whether the exit is abnormal (a transient child is restarted after it).
    pub fn is_abnormal(&self) -> bool {
        !matches!(self, ExitReason::Normal(_))
    }

    /// Classifies a ractor supervision event about a child; `None` for events that are not exits.
    pub fn from_event(event: &SupervisionEvent) -> Option<ExitReason> {
        match event {
            SupervisionEvent::ActorFailed(_, err) => Some(ExitReason::Failed(err.to_string())),
            SupervisionEvent::ActorTerminated(_, _, reason) => match reason.as_deref() {
                Some(r @ ("killed" | "actor_task_cancelled")) => {
                    Some(ExitReason::Killed(r.to_string()))
                }
                _ => Some(ExitReason::Normal(reason.clone())),
            },
            _ => None,
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReason::Normal(None) => f.write_str("normal"),
            ExitReason::Normal(Some(r)) => write!(f, "normal ({r})"),
            ExitReason::Failed(r) => write!(f, "failed: {r}"),
            ExitReason::Killed(r) => write!(f, "killed ({r})"),
        }
    }
}

/// One observable thing a supervisor did, passed to its [`super::EventHook`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisorEvent {
    /// A child was started (first start or restart).
    ChildStarted {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
        /// Whether this start is a restart.
        restart: bool,
    },
    /// A child exited on its own (not stopped by the supervisor).
    ChildExited {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
        /// The child's restart type.
        restart_type: Restart,
        /// How it ended.
        reason: ExitReason,
        /// Whether the supervisor will restart it.
        will_restart: bool,
    },
    /// A restart was delayed by the backoff.
    RestartScheduled {
        /// The supervisor's label.
        supervisor: String,
        /// The children to be started when the delay is over, in start order.
        children: Vec<String>,
        /// The delay.
        delay: Duration,
    },
    /// A child's restart failed to start (another attempt follows, counted by the intensity).
    RestartFailed {
        /// The supervisor's label.
        supervisor: String,
        /// The child id.
        child: String,
        /// The start error.
        reason: String,
    },
    /// The restart intensity was exceeded: the children were stopped and the supervisor fails.
    Escalated {
        /// The supervisor's label.
        supervisor: String,
        /// The reason the supervisor fails with.
        reason: String,
    },
}
