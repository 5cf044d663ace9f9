//! The request and response bodies of the HTTP API (serde; requests reject unknown fields) and
//! the field-level checks ([`Validate`]) the API runs before a request reaches the backend.

use std::collections::BTreeMap;

use hindsight::{ArmChoice, Constraints, ErrorClass, Run, RunState, Sop, Step, Task};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest accepted free text (goal, query, correction), in characters (as JSON Schema's
/// `maxLength` counts). A goal is further bounded by the guard's `max_goal_chars`.
pub const MAX_TEXT_CHARS: usize = 16 * 1024;

/// Longest accepted identifier (task, user, session, run ids, idempotency keys, stage, tool and
/// strategy names, feature names and values), in characters (as JSON Schema's `maxLength`
/// counts); the same bound as a path id.
pub const MAX_ID_CHARS: usize = 256;

/// Most features of one request, and most tools of a retrieval.
pub const MAX_ENTRIES: usize = 64;

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

/// A nested request object, decoded only from a JSON object: serde's derived structs also
/// accept an array of their fields in order (`"constraints": [null, null]`), which the API
/// does not.
struct ObjectOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Only<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Only(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

fn object<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    ObjectOnly::<T>::deserialize(d).map(|o| o.0)
}

fn objects<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Vec::<ObjectOnly<T>>::deserialize(d).map(|v| v.into_iter().map(|o| o.0).collect())
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
    if value.chars().count() > MAX_TEXT_CHARS {
        return Err(FieldError::new(
            field,
            format!("longer than {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(())
}

/// A task's input: a JSON object of at most [`MAX_TEXT_CHARS`] characters written out.
fn task_input(field: &str, value: &serde_json::Value) -> Result<(), FieldError> {
    if !value.is_object() {
        return Err(FieldError::new(field, "must be a JSON object"));
    }
    if value.to_string().chars().count() > MAX_TEXT_CHARS {
        return Err(FieldError::new(
            field,
            format!("longer than {MAX_TEXT_CHARS} characters written as JSON"),
        ));
    }
    Ok(())
}

/// An identifier: 1 to [`MAX_ID_CHARS`] characters, not blank, and no control character (a newline
/// or an escape sequence would forge lines or move the terminal where it is printed).
pub fn identifier(field: &str, value: &str) -> Result<(), FieldError> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.chars().count() > MAX_ID_CHARS {
        return Err(FieldError::new(
            field,
            format!("longer than {MAX_ID_CHARS} characters"),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(FieldError::new(
            field,
            format!(
                "must not contain control characters (found U+{:04X})",
                c as u32
            ),
        ));
    }
    Ok(())
}

fn optional_identifier(field: &str, value: Option<&str>) -> Result<(), FieldError> {
    value.map_or(Ok(()), |v| identifier(field, v))
}

fn features(field: &str, f: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if f.len() > MAX_ENTRIES {
        return Err(FieldError::new(
            field,
            format!("more than {MAX_ENTRIES} features"),
        ));
    }
    for (k, v) in f {
        identifier(field, k)
            .map_err(|e| FieldError::new(field, format!("feature name: {}", e.reason)))?;
        let name = format!("{field}.{k}");
        if v.chars().count() > MAX_ID_CHARS {
            return Err(FieldError::new(
                name,
                format!("longer than {MAX_ID_CHARS} characters"),
            ));
        }
        if v.chars().any(char::is_control) {
            return Err(FieldError::new(name, "must not contain control characters"));
        }
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
    #[serde(default, deserialize_with = "object")]
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
    /// The task's input object: an agent sees it, and its arguments and prompts refer to it.
    #[serde(default)]
    pub input: Option<serde_json::Value>,
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
            input: self.input,
        }
    }

    fn validate_at(&self, prefix: &str) -> Result<(), FieldError> {
        let f = |name: &str| format!("{prefix}{name}");
        optional_identifier(&f("task_id"), self.task_id.as_deref())?;
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
        optional_identifier(&f("user_id"), self.user_id.as_deref())?;
        optional_identifier(&f("session_id"), self.session_id.as_deref())?;
        if let Some(input) = &self.input {
            task_input(&f("input"), input)?;
        }
        optional_identifier(&f("idempotency_key"), self.idempotency_key.as_deref())?;
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
    #[serde(deserialize_with = "object")]
    pub task: TaskRequest,
    /// The plan, one arm per stage.
    #[serde(deserialize_with = "objects")]
    pub plan: Vec<PlanArm>,
}

impl Validate for ExecuteRequest {
    fn validate(&self) -> Result<(), FieldError> {
        self.task.validate_at("task.")?;
        if self.plan.is_empty() {
            return Err(FieldError::new("plan", "must have at least one step"));
        }
        if self.plan.len() > MAX_ENTRIES {
            return Err(FieldError::new(
                "plan",
                format!("more than {MAX_ENTRIES} steps"),
            ));
        }
        for (i, arm) in self.plan.iter().enumerate() {
            identifier(&format!("plan[{i}].stage"), &arm.stage)?;
            identifier(&format!("plan[{i}].tool"), &arm.tool)?;
            identifier(&format!("plan[{i}].strategy"), &arm.strategy)?;
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
        identifier("stage", &self.stage)?;
        optional_identifier("run_id", self.run_id.as_deref())
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
    #[serde(default = "default_k", deserialize_with = "whole")]
    pub k: usize,
    /// The user (for per-user scopes).
    #[serde(default)]
    pub user_id: Option<String>,
    /// The session (for per-session scopes).
    #[serde(default)]
    pub session_id: Option<String>,
}

/// A count given as a JSON number with no fractional part: JSON Schema's `integer` (which the
/// document promises) holds `8.0` as well as `8`, and serde's `usize` would refuse the former.
fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    use serde::de::Error as _;
    let n = serde_json::Number::deserialize(d)?;
    if let Some(u) = n.as_u64() {
        return usize::try_from(u).map_err(|_| D::Error::custom(format!("{u} is too large")));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= 1e15 => Ok(f as usize),
        _ => Err(D::Error::custom(format!(
            "expected a whole non-negative number, found {n}"
        ))),
    }
}

fn default_k() -> usize {
    5
}

impl Validate for MemoryRetrieveRequest {
    fn validate(&self) -> Result<(), FieldError> {
        text("query", &self.query, false)?;
        features("features", &self.features)?;
        if self.tools.len() > MAX_ENTRIES {
            return Err(FieldError::new(
                "tools",
                format!("more than {MAX_ENTRIES} tools"),
            ));
        }
        for (i, t) in self.tools.iter().enumerate() {
            identifier(&format!("tools[{i}]"), t)?;
        }
        optional_identifier("user_id", self.user_id.as_deref())?;
        optional_identifier("session_id", self.session_id.as_deref())?;
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
    #[serde(default = "default_arms", deserialize_with = "whole")]
    pub k: usize,
}

fn default_arms() -> usize {
    3
}

impl Validate for PolicySuggestRequest {
    fn validate(&self) -> Result<(), FieldError> {
        features("features", &self.features)?;
        optional_identifier("stage", self.stage.as_deref())?;
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
        identifier("stage", &self.stage)?;
        identifier("tool", &self.tool)?;
        identifier("strategy", &self.strategy)?;
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
        optional_identifier("run_id", self.run_id.as_deref())?;
        optional_identifier("tool", self.tool.as_deref())?;
        optional_identifier("user_id", self.user_id.as_deref())
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

/// One variant of an agent, as `GET /agents` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentVariantView {
    /// The variant's name.
    pub name: String,
    /// The model endpoint it runs on.
    pub model: String,
    /// The tools it offers the model, by the names the model sees.
    pub tools: Vec<String>,
}

/// An agent the daemon hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentView {
    /// Its name (`POST /agents/{name}/runs`).
    pub name: String,
    /// What it is for.
    pub description: String,
    /// Its variants.
    pub variants: Vec<AgentVariantView>,
    /// Model turns per attempt.
    pub max_turns: u32,
}

/// The result of `/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentList {
    /// The agents the daemon hosts.
    pub agents: Vec<AgentView>,
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
