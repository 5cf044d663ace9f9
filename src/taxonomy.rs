//! The shared vocabulary of failure: failure types, error classes and categories, the steps of a
//! trajectory, and the recovery actions a policy can choose.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What went wrong with a run, as a whole (the trajectory classifier's verdict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FailureType {
    /// The agent called a tool that does not exist or does not fit.
    WrongToolCalled,
    /// The output broke a configured constraint.
    ConstraintIgnored,
    /// The agent repeated the same call (or the same error) over and over.
    LoopDetected,
    /// The run claims a step or artifact the trajectory does not have.
    HallucinatedState,
    /// Subgoals were declared but not all were done.
    PlanIncomplete,
    /// Arguments or output did not match the expected schema.
    SchemaMismatch,
    /// The context window of the model was exceeded.
    ContextOverflow,
    /// The output is unrelated to the goal.
    GoalDrift,
    /// The environment failed (network, 5xx, rate limits): not the agent's choice.
    ExternalFault,
    /// A deadline passed.
    Timeout,
    /// Nothing more specific is known.
    Unknown,
}

impl FailureType {
    /// All eleven members, in declaration order.
    pub const ALL: [FailureType; 11] = [
        FailureType::WrongToolCalled,
        FailureType::ConstraintIgnored,
        FailureType::LoopDetected,
        FailureType::HallucinatedState,
        FailureType::PlanIncomplete,
        FailureType::SchemaMismatch,
        FailureType::ContextOverflow,
        FailureType::GoalDrift,
        FailureType::ExternalFault,
        FailureType::Timeout,
        FailureType::Unknown,
    ];

    /// The snake_case name used in configuration files and reports (`wrong_tool_called`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureType::WrongToolCalled => "wrong_tool_called",
            FailureType::ConstraintIgnored => "constraint_ignored",
            FailureType::LoopDetected => "loop_detected",
            FailureType::HallucinatedState => "hallucinated_state",
            FailureType::PlanIncomplete => "plan_incomplete",
            FailureType::SchemaMismatch => "schema_mismatch",
            FailureType::ContextOverflow => "context_overflow",
            FailureType::GoalDrift => "goal_drift",
            FailureType::ExternalFault => "external_fault",
            FailureType::Timeout => "timeout",
            FailureType::Unknown => "unknown",
        }
    }

    /// Parses a snake_case or SCREAMING_SNAKE_CASE name.
    pub fn parse(name: &str) -> Option<FailureType> {
        let lower = name.trim().to_ascii_lowercase();
        FailureType::ALL.into_iter().find(|t| t.as_str() == lower)
    }
}

impl fmt::Display for FailureType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class of one tool error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ErrorClass {
    /// A deadline passed (408, 504, timed out).
    Timeout,
    /// Throttled: 429, quota, too many requests.
    RateLimit,
    /// Credentials missing, expired or insufficient (401, 403).
    Auth,
    /// Arguments or output did not match the schema (400, 422, validation, parse errors).
    SchemaMismatch,
    /// The resource or tool does not exist (404, unknown tool).
    NotFound,
    /// The tool cannot handle this input (unsupported type or size).
    ToolNotFit,
    /// The network or the server failed transiently (DNS, refused, reset, 5xx).
    TransientNetwork,
    /// The tool failed the same way it would fail again.
    DeterministicFailure,
}

impl ErrorClass {
    /// All eight classes, in declaration order.
    pub const ALL: [ErrorClass; 8] = [
        ErrorClass::Timeout,
        ErrorClass::RateLimit,
        ErrorClass::Auth,
        ErrorClass::SchemaMismatch,
        ErrorClass::NotFound,
        ErrorClass::ToolNotFit,
        ErrorClass::TransientNetwork,
        ErrorClass::DeterministicFailure,
    ];

    /// The canonical name (`TransientNetwork`), as in FORMAT.md.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "Timeout",
            ErrorClass::RateLimit => "RateLimit",
            ErrorClass::Auth => "Auth",
            ErrorClass::SchemaMismatch => "SchemaMismatch",
            ErrorClass::NotFound => "NotFound",
            ErrorClass::ToolNotFit => "ToolNotFit",
            ErrorClass::TransientNetwork => "TransientNetwork",
            ErrorClass::DeterministicFailure => "DeterministicFailure",
        }
    }

    /// Parses the canonical name (case-insensitive, `_` ignored).
    pub fn parse(name: &str) -> Option<ErrorClass> {
        let norm: String = name
            .chars()
            .filter(|c| *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str().to_ascii_lowercase() == norm)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a failure says something about the agent's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCategory {
    /// The environment failed; never learned from.
    Infrastructure,
    /// The agent's choice of tool or arguments was wrong; learned from.
    Strategy,
    /// Genuinely ambiguous.
    Unknown,
}

impl FailureCategory {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCategory::Infrastructure => "infrastructure",
            FailureCategory::Strategy => "strategy",
            FailureCategory::Unknown => "unknown",
        }
    }
}

impl fmt::Display for FailureCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error classifier's verdict on one error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorClassification {
    /// Infrastructure, strategy or unknown.
    pub category: FailureCategory,
    /// The error class.
    pub error_class: ErrorClass,
    /// How sure the rule is, in [0, 1].
    pub confidence: f64,
    /// The name of the rule that decided.
    pub rule: String,
}

/// One step of a trajectory (the fields of triage-agent's `Step`, plus cost accounting).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Step {
    /// 0-based position in the trajectory.
    pub index: u32,
    /// What the agent did ("tool_call", "llm", "subgoal", ...).
    pub action: String,
    /// The tool called, if any.
    pub tool_called: Option<String>,
    /// The tool's input.
    pub tool_input: Option<serde_json::Value>,
    /// The tool's output.
    pub tool_output: Option<serde_json::Value>,
    /// Text the model produced at this step.
    pub llm_output: Option<String>,
    /// The error message, if the step failed.
    pub error: Option<String>,
    /// The exception / error type name (`TimeoutError`, `reqwest::Error`).
    pub exception_type: Option<String>,
    /// The class of the error, when known.
    pub error_class: Option<ErrorClass>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Virtual or real latency of the step.
    pub latency_ms: f64,
    /// Cost of the step.
    pub cost: f64,
    /// Whether repeating the step is harmless.
    pub idempotent: bool,
    /// The idempotency key of the tool call, if any.
    pub idempotency_key: Option<String>,
    /// Free-form metadata (subgoal declarations, stage names, ...).
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Step {
    /// The latency and cost of the arm's own attempt (metadata `own_latency_ms` and `own_cost`,
    /// without the infrastructure faults retried inside the call); a step logged before they
    /// were recorded falls back to its totals.
    pub fn own_latency_cost(&self) -> (f64, f64) {
        let own = |key: &str, all: f64| {
            self.metadata
                .get(key)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(all)
        };
        (
            own("own_latency_ms", self.latency_ms),
            own("own_cost", self.cost),
        )
    }
}

/// The ordered steps of one attempt of a run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Trajectory {
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Trajectory {
    /// Appends a step, setting its index.
    pub fn push(&mut self, mut step: Step) -> &Step {
        step.index = self.steps.len() as u32;
        self.steps.push(step);
        &self.steps[self.steps.len() - 1]
    }

    /// The last step, if any.
    pub fn last(&self) -> Option<&Step> {
        self.steps.last()
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether there are no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// What a failure policy decided to do about a failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecoveryAction {
    /// Run again, optionally with a hint, after a delay.
    Retry {
        /// Guidance for the next attempt.
        hint: Option<String>,
        /// Text injected into the next attempt's context (a tool manifest).
        inject: Option<String>,
        /// How long to wait first.
        delay_ms: u64,
    },
    /// Build a new plan, guided by a hint.
    Replan {
        /// Guidance for the new plan.
        hint: String,
    },
    /// Restore a checkpoint (state and trajectory) and go on from there.
    Rollback {
        /// The checkpoint to restore; `None` means the latest.
        checkpoint_id: Option<String>,
    },
    /// Go on from the first subgoal not done.
    Resume {
        /// The subgoal to resume from.
        from_subgoal: String,
    },
    /// Hand the run to a human; it ends escalated.
    Escalate {
        /// Why.
        message: String,
    },
    /// Pause until a human approves; the caller resumes it.
    Suspend {
        /// What the human is asked.
        message: String,
        /// Anything the human needs to decide.
        metadata: BTreeMap<String, serde_json::Value>,
    },
    /// Give up; the run ends aborted.
    Abort {
        /// Why.
        reason: String,
    },
}

impl RecoveryAction {
    /// The snake_case kind name (`retry`, `replan`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            RecoveryAction::Retry { .. } => "retry",
            RecoveryAction::Replan { .. } => "replan",
            RecoveryAction::Rollback { .. } => "rollback",
            RecoveryAction::Resume { .. } => "resume",
            RecoveryAction::Escalate { .. } => "escalate",
            RecoveryAction::Suspend { .. } => "suspend",
            RecoveryAction::Abort { .. } => "abort",
        }
    }
}
