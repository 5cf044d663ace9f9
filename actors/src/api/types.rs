//! The request and response bodies of the HTTP API (serde; requests reject unknown fields) and
//! the field-level checks ([`Validate`]) the API runs before a request reaches the backend.

use std::collections::BTreeMap;

use hindsight::{ArmChoice, Constraints, ErrorClass, Run, RunState, Sop, Step, Task};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest accepted free text (goal, query, correction), in bytes.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;

/// A request field that is well-formed JSON but not acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The dotted path of the field (`constraints.max_cost`, `plan[0].tool`).
    pub field: String,
    /// Why it is not acceptable.
    pub reason: String,
}

impl FieldError {
    /// A field error.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Semantic checks on a decoded request body.
pub trait Validate {
    /// `Ok` when every field is acceptable, else the first field that is not.
    fn validate(&self) -> Result<(), FieldError>;
}

fn text(field: &str, value: &str, required: bool) -> Result<(), FieldError> {
    if required && value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.len() > MAX_TEXT_BYTES {
        return Err(FieldError::new(
            field,
            format!("longer than {MAX_TEXT_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn features(field: &str, f: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for (k, v) in f {
        if k.trim().is_empty() {
            return Err(FieldError::new(field, "feature names must not be empty"));
        }
        text(&format!("{field}.{k}"), v, false)?;
    }
    Ok(())
}

fn unit(field: &str, v: f64) -> Result<(), FieldError> {
    if !(0.0..=1.0).contains(&v) {
        return Err(FieldError::new(
            field,
            format!("must be in [0, 1], found {v}"),
        ));
    }
    Ok(())
}

/// Latency and cost ceilings of a submitted task.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConstraintsRequest {
    /// Maximum total latency in milliseconds.
    #[serde(default)]
    pub max_latency_ms: Option<f64>,
    /// Maximum total cost.
    #[serde(default)]
    pub max_cost: Option<f64>,
}

/// A task submitted through the API (`/orchestrate`, `/plan`, and inside `/execute`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// Caller-chosen task id; generated when absent.
    #[serde(default)]
    pub task_id: Option<String>,
    /// What the task is for, in words.
    pub goal: String,
    /// The task's features (`file_type = "pdf"`, ...).
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Latency and cost ceilings.
    #[serde(default)]
    pub constraints: ConstraintsRequest,
    /// The user on whose behalf the task runs.
    #[serde(default)]
    pub user_id: Option<String>,
    /// The session the task belongs to.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Makes a resubmission return the first submission's run instead of running twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

impl TaskRequest {
    /// The core task, owned by `tenant`; `task_id` is used when the request names none.
    pub fn into_task(self, tenant: &str, task_id: impl FnOnce() -> String) -> Task {
        Task {
            task_id: self.task_id.unwrap_or_else(task_id),
            goal: self.goal,
            features: self.features,
            constraints: Constraints {
                max_latency_ms: self.constraints.max_latency_ms,
                max_cost: self.constraints.max_cost,
            },
            user_id: self.user_id,
            tenant: Some(tenant.to_string()),
            session_id: self.session_id,
        }
    }

    fn validate_at(&self, prefix: &str) -> Result<(), FieldError> {
        let f = |name: &str| format!("{prefix}{name}");
        if let Some(id) = &self.task_id {
            text(&f("task_id"), id, true)?;
        }
        text(&f("goal"), &self.goal, true)?;
        features(&f("features"), &self.features)?;
        for (name, v) in [
            (
                "constraints.max_latency_ms",
                self.constraints.max_latency_ms,
            ),
            ("constraints.max_cost", self.constraints.max_cost),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return Err(FieldError::new(
                    f(name),
                    format!("must be a non-negative number, found {v}"),
                ));
            }
        }
        if let Some(k) = &self.idempotency_key {
            text(&f("idempotency_key"), k, true)?;
        }
        Ok(())
    }
}

impl Validate for TaskRequest {
    fn validate(&self) -> Result<(), FieldError> {
        self.validate_at("")
    }
}

/// The result of `/orchestrate`: how the task ended, with provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrchestrateResponse {
    /// The run.
    pub run_id: String,
    /// The task.
    pub task_id: String,
    /// The plan of the last attempt.
    pub plan_id: Option<String>,
    /// The SOP the plan came from, if any.
    pub sop_id: Option<String>,
    /// Terminal state.
    pub state: RunState,
    /// Whether validation passed.
    pub passed: bool,
    /// Attempts made (recoveries and reflections included).
    pub attempts: u32,
    /// ReflectRetry reflections made.
    pub reflect_retries: u32,
    /// The arms of the first attempt with their propensities.
    pub arms: Vec<ArmChoice>,
    /// The reward in [0, 1].
    pub reward: Option<f64>,
    /// The final output.
    pub output: Option<Value>,
    /// Why it did not succeed, if it did not.
    pub reason: Option<String>,
    /// Total latency of every call, retries included.
    pub latency_ms: f64,
    /// Total cost of every call, retries included.
    pub cost: f64,
    /// Citations of the memory items (lessons, SOPs) the plan used.
    pub citations: Vec<String>,
}

/// The result of `/plan`: the plan the orchestrator would run, without running it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanResponse {
    /// The plan's id.
    pub plan_id: String,
    /// The SOP it follows, if any.
    pub sop_id: Option<String>,
    /// The task's cluster.
    pub cluster: String,
    /// One arm per stage, in order, with propensities.
    pub arms: Vec<ArmChoice>,
    /// The fenced `<strategy_context>` block of lessons injected before a run, if any.
    pub strategy_context: Option<String>,
    /// Citations of the memory items used.
    pub citations: Vec<String>,
}

/// One `(stage, tool, strategy)` step of a caller-given plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanArm {
    /// The stage.
    pub stage: String,
    /// The tool (must be registered).
    pub tool: String,
    /// The strategy.
    pub strategy: String,
}

/// `/execute`: run a caller-given plan for a task (no policy choice).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The task.
    pub task: TaskRequest,
    /// The plan, one arm per stage.
    pub plan: Vec<PlanArm>,
}

impl Validate for ExecuteRequest {
    fn validate(&self) -> Result<(), FieldError> {
        self.task.validate_at("task.")?;
        if self.plan.is_empty() {
            return Err(FieldError::new("plan", "must have at least one step"));
        }
        for (i, arm) in self.plan.iter().enumerate() {
            text(&format!("plan[{i}].stage"), &arm.stage, true)?;
            text(&format!("plan[{i}].tool"), &arm.tool, true)?;
            text(&format!("plan[{i}].strategy"), &arm.strategy, true)?;
        }
        Ok(())
    }
}

/// The result of `/execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    /// The run.
    pub run_id: String,
    /// Terminal state.
    pub state: RunState,
    /// Whether validation passed.
    pub passed: bool,
    /// Every step executed.
    pub steps: Vec<Step>,
    /// The final output.
    pub output: Option<Value>,
    /// Total latency.
    pub latency_ms: f64,
    /// Total cost.
    pub cost: f64,
}

/// `/validate`: check one stage's output against its contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateRequest {
    /// The stage whose contract applies.
    pub stage: String,
    /// The output to check.
    pub output: Value,
    /// The run it belongs to, if any (must be the caller's).
    #[serde(default)]
    pub run_id: Option<String>,
}

impl Validate for ValidateRequest {
    fn validate(&self) -> Result<(), FieldError> {
        text("stage", &self.stage, true)
    }
}

/// The result of `/validate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidateResponse {
    /// Whether the output passes.
    pub valid: bool,
    /// Why not, if it does not.
    pub reason: Option<String>,
}

/// `/memory/retrieve`: the retrieval bundle for a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRetrieveRequest {
    /// Words describing the task.
    pub query: String,
    /// The task's features (retrieval keys on them, not only on words).
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Tools the task may use.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Items wanted (1..=100, default 5).
    #[serde(default = "default_k")]
    pub k: usize,
    /// The user (for per-user scopes).
    #[serde(default)]
    pub user_id: Option<String>,
    /// The session (for per-session scopes).
    #[serde(default)]
    pub session_id: Option<String>,
}

fn default_k() -> usize {
    5
}

impl Validate for MemoryRetrieveRequest {
    fn validate(&self) -> Result<(), FieldError> {
        text("query", &self.query, false)?;
        features("features", &self.features)?;
        if !(1..=100).contains(&self.k) {
            return Err(FieldError::new(
                "k",
                format!("must be in 1..=100, found {}", self.k),
            ));
        }
        Ok(())
    }
}

/// One item of a retrieval bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryItem {
    /// `lesson`, `sop`, `postmortem`, `diary` or `graph`.
    pub kind: String,
    /// The item's id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Relevance score.
    pub score: f64,
    /// Where it came from (run ids, table and key).
    pub citation: String,
}

/// The result of `/memory/retrieve`: one deduplicated bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryBundle {
    /// Items, best first.
    pub items: Vec<MemoryItem>,
}

/// `/policy/suggest`: ranked arms for a task's features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySuggestRequest {
    /// The task's features.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Only this stage (all stages when absent).
    #[serde(default)]
    pub stage: Option<String>,
    /// Arms per stage (1..=100, default 3).
    #[serde(default = "default_arms")]
    pub k: usize,
}

fn default_arms() -> usize {
    3
}

impl Validate for PolicySuggestRequest {
    fn validate(&self) -> Result<(), FieldError> {
        features("features", &self.features)?;
        if let Some(s) = &self.stage {
            text("stage", s, true)?;
        }
        if !(1..=100).contains(&self.k) {
            return Err(FieldError::new(
                "k",
                format!("must be in 1..=100, found {}", self.k),
            ));
        }
        Ok(())
    }
}

/// One ranked arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankedArm {
    /// The tool.
    pub tool: String,
    /// The strategy.
    pub strategy: String,
    /// Posterior mean reward.
    pub mean: f64,
    /// Posterior standard deviation (uncertainty).
    pub std_dev: f64,
    /// Probability the policy chooses this arm.
    pub propensity: f64,
    /// Observations behind the posterior.
    pub n: u64,
}

/// The ranked arms of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageArms {
    /// The stage.
    pub stage: String,
    /// Arms, best first.
    pub arms: Vec<RankedArm>,
}

/// The result of `/policy/suggest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySuggestResponse {
    /// The task's cluster.
    pub cluster: String,
    /// Per stage, in order.
    pub stages: Vec<StageArms>,
}

/// `/policy/update`: report the outcome of an arm chosen outside hindsight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdateRequest {
    /// The task's features.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// The stage.
    pub stage: String,
    /// The tool.
    pub tool: String,
    /// The strategy.
    pub strategy: String,
    /// Reward in [0, 1].
    pub reward: f64,
    /// Whether the stage passed.
    pub passed: bool,
    /// The class of the error, if it failed; infrastructure classes are never learned from.
    #[serde(default)]
    pub error_class: Option<ErrorClass>,
    /// The probability with which the arm was chosen, if known (for off-policy evaluation).
    #[serde(default)]
    pub propensity: Option<f64>,
}

impl Validate for PolicyUpdateRequest {
    fn validate(&self) -> Result<(), FieldError> {
        features("features", &self.features)?;
        text("stage", &self.stage, true)?;
        text("tool", &self.tool, true)?;
        text("strategy", &self.strategy, true)?;
        unit("reward", self.reward)?;
        if let Some(p) = self.propensity
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(FieldError::new(
                "propensity",
                format!("must be in (0, 1], found {p}"),
            ));
        }
        Ok(())
    }
}

/// The result of `/policy/update`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyUpdateResponse {
    /// The task's cluster.
    pub cluster: String,
    /// Whether the posterior changed (false for infrastructure failures).
    pub applied: bool,
    /// Why not, if it did not.
    pub reason: Option<String>,
}

/// `/feedback`: a human correction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    /// The correction, in words.
    pub correction: String,
    /// The run it is about (must be the caller's).
    #[serde(default)]
    pub run_id: Option<String>,
    /// The tool it is about.
    #[serde(default)]
    pub tool: Option<String>,
    /// The features it applies to.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// The user giving it (for per-user scopes).
    #[serde(default)]
    pub user_id: Option<String>,
}

impl Validate for FeedbackRequest {
    fn validate(&self) -> Result<(), FieldError> {
        text("correction", &self.correction, true)?;
        features("features", &self.features)?;
        if let Some(r) = &self.run_id {
            text("run_id", r, true)?;
        }
        if let Some(t) = &self.tool {
            text("tool", t, true)?;
        }
        Ok(())
    }
}

/// The result of `/feedback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackResponse {
    /// Whether it became a lesson that can be injected.
    pub accepted: bool,
    /// The lesson, if it did.
    pub lesson_id: Option<String>,
    /// Its confidence.
    pub confidence: Option<f64>,
    /// Why it was rejected, if it was.
    pub reason: Option<String>,
}

/// A run as `/runs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    /// The run record (its `tenant` is the owner).
    pub run: Run,
    /// The arms of its first attempt.
    pub arms: Vec<ArmChoice>,
    /// Its steps so far.
    pub steps: Vec<Step>,
}

/// An SOP with its owner, as `/sop/{id}` and `/sops` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantSop {
    /// The tenant that owns it.
    pub tenant: String,
    /// The SOP.
    pub sop: Sop,
}

/// The result of `/sops`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SopList {
    /// The caller's SOPs.
    pub sops: Vec<TenantSop>,
}

/// The result of `/healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` (200) or anything else (503).
    pub status: String,
    /// The daemon's version.
    pub version: String,
    /// Per component (`store`, `orchestrator`, ...) its status.
    pub components: BTreeMap<String, String>,
}

impl Health {
    /// Whether the daemon is healthy.
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}
