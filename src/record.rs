//! The core records that flow through hindsight and are stored durably: tasks, runs and their
//! state machine, checkpoints, diary entries, experience tuples, lessons and SOPs.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::taxonomy::Step;

/// Milliseconds since the Unix epoch, from the wall clock (the shell's clock, not the core's
/// decisions: the core takes times as inputs).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Ceilings a task must stay within.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Constraints {
    /// Maximum total latency in milliseconds, if any.
    pub max_latency_ms: Option<f64>,
    /// Maximum total cost, if any.
    pub max_cost: Option<f64>,
}

/// A unit of work submitted to hindsight.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Task {
    /// Caller-chosen or generated identifier.
    pub task_id: String,
    /// What the task is for, in words.
    pub goal: String,
    /// The task's features (file type, size bucket, tenant, ...), ordered by name.
    pub features: BTreeMap<String, String>,
    /// Latency and cost ceilings.
    pub constraints: Constraints,
    /// The user on whose behalf the task runs.
    pub user_id: Option<String>,
    /// The tenant the task belongs to.
    pub tenant: Option<String>,
    /// The session the task belongs to.
    pub session_id: Option<String>,
    /// The task's input object, which an agent sees and its arguments and prompts refer to.
    /// Stored apart from the task record (so that task records of earlier builds stay
    /// readable): the orchestrator writes it with the task and puts it back on resume.
    #[serde(skip)]
    pub input: Option<serde_json::Value>,
}

impl Task {
    /// The lesson scopes a run of this task may read: `shared`, and the scope of each identity
    /// it carries (`user:…`, `tenant:…`, `session:…`), whichever scope mode wrote them.
    pub fn lesson_scopes(&self) -> Vec<String> {
        let mut scopes = vec!["shared".to_string()];
        for (prefix, id) in [
            ("user", &self.user_id),
            ("tenant", &self.tenant),
            ("session", &self.session_id),
        ] {
            if let Some(id) = id.as_deref().filter(|id| !id.is_empty()) {
                scopes.push(format!("{prefix}:{id}"));
            }
        }
        scopes
    }
}

/// The state machine of a run.
///
/// `Received -> Planned -> Executing -> Validating -> (Recovering -> Planned ...) -> terminal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Accepted and recorded; nothing done yet.
    Received,
    /// A plan was chosen.
    Planned,
    /// Steps are being executed.
    Executing,
    /// Outputs are being validated.
    Validating,
    /// A failure is being recovered from.
    Recovering,
    /// Ended well.
    Succeeded,
    /// Ended badly after recovery was exhausted.
    Failed,
    /// Handed to a human.
    Escalated,
    /// Given up by policy.
    Aborted,
}

impl RunState {
    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Succeeded | RunState::Failed | RunState::Escalated | RunState::Aborted
        )
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Received => "received",
            RunState::Planned => "planned",
            RunState::Executing => "executing",
            RunState::Validating => "validating",
            RunState::Recovering => "recovering",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Escalated => "escalated",
            RunState::Aborted => "aborted",
        }
    }

    /// Whether the state machine allows going from `self` to `next`.
    pub fn can_transition_to(self, next: RunState) -> bool {
        use RunState::*;
        if self.is_terminal() {
            return false;
        }
        matches!(
            (self, next),
            (_, Failed | Escalated | Aborted)
                | (Received, Planned)
                | (Planned, Executing)
                | (Executing, Validating | Recovering)
                | (Validating, Succeeded | Recovering)
                | (Recovering, Planned | Executing)
        )
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error returned when a run is asked to make a transition its state machine forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run {run_id} cannot go from {from} to {to}")]
pub struct TransitionError {
    /// The run.
    pub run_id: String,
    /// Its current state.
    pub from: RunState,
    /// The state asked for.
    pub to: RunState,
}

/// One execution of a task, with its state and provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Unique run identifier.
    pub run_id: String,
    /// The task it runs.
    pub task_id: String,
    /// Current state.
    pub state: RunState,
    /// Attempts started so far (1 for the first).
    pub attempts: u32,
    /// When the run was received (ms since epoch).
    pub created_ms: u64,
    /// When the state last changed (ms since epoch).
    pub updated_ms: u64,
    /// The tenant, for isolation.
    pub tenant: Option<String>,
    /// The plan in force, if any.
    pub plan_id: Option<String>,
    /// The SOP used, if any.
    pub sop_id: Option<String>,
    /// The final reward, once terminal.
    pub reward: Option<f64>,
    /// Why the run ended, if it did not succeed.
    pub reason: Option<String>,
}

impl Run {
    /// A new run in state `Received`.
    pub fn new(run_id: impl Into<String>, task: &Task, now_ms: u64) -> Run {
        Run {
            run_id: run_id.into(),
            task_id: task.task_id.clone(),
            state: RunState::Received,
            attempts: 0,
            created_ms: now_ms,
            updated_ms: now_ms,
            tenant: task.tenant.clone(),
            plan_id: None,
            sop_id: None,
            reward: None,
            reason: None,
        }
    }

    /// Moves the run to `next`, or says why it cannot.
    pub fn transition(&mut self, next: RunState, now_ms: u64) -> Result<(), TransitionError> {
        if !self.state.can_transition_to(next) {
            return Err(TransitionError {
                run_id: self.run_id.clone(),
                from: self.state,
                to: next,
            });
        }
        self.state = next;
        self.updated_ms = now_ms;
        Ok(())
    }
}

/// A snapshot of a run's progress from which it can resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run.
    pub run_id: String,
    /// Index of the last completed step (or a caller-chosen position).
    pub step_index: u32,
    /// Optional name ("before-write") so a policy can roll back to it.
    pub name: Option<String>,
    /// The run's state as JSON.
    pub state: serde_json::Value,
    /// The steps completed up to here.
    pub completed_steps: Vec<Step>,
    /// When it was taken (ms since epoch).
    pub created_ms: u64,
}

/// One entry of the episodic diary (append-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiaryEntry {
    /// Monotonically increasing sequence number, assigned by the store.
    pub seq: u64,
    /// When it was written (ms since epoch).
    pub time_ms: u64,
    /// The run it is about, if any.
    pub run_id: Option<String>,
    /// What kind of note ("run_finished", "lesson", "recovery", ...).
    pub kind: String,
    /// The note.
    pub text: String,
    /// Tags for retrieval.
    pub tags: Vec<String>,
}

/// How a run ended, as recorded in the experience log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The terminal state.
    pub state: RunState,
    /// Whether validation passed.
    pub passed: bool,
    /// The final output, if any.
    pub output: Option<serde_json::Value>,
    /// Total latency of every call, retries included.
    pub latency_ms: f64,
    /// Total cost of every call, retries included.
    pub cost: f64,
    /// Attempts made.
    pub attempts: u32,
}

/// The arm chosen for one stage, with the propensity of that choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmChoice {
    /// The stage.
    pub stage: String,
    /// The tool.
    pub tool: String,
    /// The strategy.
    pub strategy: String,
    /// Probability the policy had of choosing this arm.
    pub propensity: f64,
}

/// The probability a plan had of being chosen: the product of its arms' per-stage propensities
/// (each conditional on the earlier stages).
pub fn plan_propensity(arms: &[ArmChoice]) -> f64 {
    arms.iter().map(|a| a.propensity).product()
}

/// One row of the experience log: everything learned from one run (append-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperienceTuple {
    /// The run.
    pub run_id: String,
    /// The task.
    pub task_id: String,
    /// The plan of the first attempt.
    pub plan_id: String,
    /// The user.
    pub user_id: Option<String>,
    /// The task's features.
    pub context_features: BTreeMap<String, String>,
    /// The arms chosen on the first attempt, with propensities.
    pub arms: Vec<ArmChoice>,
    /// Every step of every attempt.
    pub steps: Vec<Step>,
    /// How it ended.
    pub result: RunResult,
    /// The reward, in [0, 1].
    pub reward: f64,
    /// A human's feedback, if any.
    pub user_feedback: Option<String>,
    /// When it was logged (ms since epoch).
    pub time_ms: u64,
}

/// A learned rule: when the preconditions hold, take the action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lesson {
    /// Unique identifier.
    pub lesson_id: String,
    /// Feature conditions (`feature -> value`) under which the lesson applies.
    pub preconditions: BTreeMap<String, String>,
    /// The tool the lesson is about, if any.
    pub tool: Option<String>,
    /// What to do (or avoid).
    pub action: String,
    /// Confidence in [0, 1].
    pub confidence: f64,
    /// Runs that support the lesson.
    pub evidence: Vec<String>,
    /// Where it came from ("synthesis", "correction", "reflection").
    pub source: String,
    /// The scope key (user, tenant, session or shared).
    pub scope: String,
    /// When it was created (ms since epoch).
    pub created_ms: u64,
    /// When it was last reinforced (ms since epoch).
    pub reinforced_ms: u64,
    /// The lesson that replaced this one, if a contradiction superseded it.
    pub superseded_by: Option<String>,
}

/// Lifecycle of a standard operating procedure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SopStatus {
    /// Seen often enough to be tracked; not yet proven.
    Candidate,
    /// Promoted on statistical evidence; the planner uses it.
    Stable,
    /// Demoted after its success fell below its evidence.
    RolledBack,
    /// Replaced by a newer version.
    Retired,
}

/// A standard operating procedure: a plan proven to work for a cluster of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sop {
    /// Identifier, stable across versions.
    pub sop_id: String,
    /// Version, starting at 1.
    pub version: u32,
    /// Feature conditions under which it applies.
    pub preconditions: BTreeMap<String, String>,
    /// The plan: one `(stage, tool, strategy)` per stage.
    pub plan: Vec<ArmChoice>,
    /// Lifecycle state.
    pub status: SopStatus,
    /// Runs that used the plan and passed.
    pub successes: u64,
    /// Runs that used the plan.
    pub trials: u64,
    /// The cluster baseline's successes over trials at promotion.
    pub baseline_successes: u64,
    /// The cluster baseline's trials at promotion.
    pub baseline_trials: u64,
    /// One-sided p-value of the uplift at promotion.
    pub p_value: Option<f64>,
    /// Evidence run ids.
    pub evidence: Vec<String>,
    /// When it was created (ms since epoch).
    pub created_ms: u64,
    /// When it was last changed (ms since epoch).
    pub updated_ms: u64,
    /// For agent stages, the calls that replace the model (empty for a plan of tool stages).
    pub procedure: Vec<crate::learn::procedure::Procedure>,
}
