//! What one attempt of a run sees: the `RunContext` handle (record steps, update state, declare
//! subgoals, claim artifacts, checkpoint), the `TriageContext` of a recovery, and `RunError`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::record::Checkpoint;
use crate::taxonomy::{FailureType, RecoveryAction, Step, Trajectory};

use super::checkpoint::{CheckpointError, CheckpointStore};
use super::clock::Clock;

/// Metadata key of a subgoal step (`{"subgoal": name, "status": "declared"|"done"}`).
pub const SUBGOAL_KEY: &str = "subgoal";
/// Metadata key of a subgoal step's status.
pub const STATUS_KEY: &str = "status";
/// Metadata key naming the artifact a step produced.
pub const ARTIFACT_KEY: &str = "artifact";

/// The error an attempt ends with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunError {
    /// The message.
    pub message: String,
    /// The error type name (`TimeoutError`, `reqwest::Error`), if known.
    pub error_type: Option<String>,
    /// How long the server asked to wait (`Retry-After`), if it did.
    pub retry_after_ms: Option<u64>,
}

impl RunError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> RunError {
        RunError {
            message: message.into(),
            ..RunError::default()
        }
    }

    /// Sets the error type name.
    pub fn with_type(mut self, error_type: impl Into<String>) -> RunError {
        self.error_type = Some(error_type.into());
        self
    }

    /// Sets the server's `Retry-After`, in milliseconds.
    pub fn retry_after(mut self, ms: u64) -> RunError {
        self.retry_after_ms = Some(ms);
        self
    }
}

impl From<&str> for RunError {
    fn from(m: &str) -> RunError {
        RunError::new(m)
    }
}

impl From<String> for RunError {
    fn from(m: String) -> RunError {
        RunError::new(m)
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error_type {
            Some(t) => write!(f, "{t}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// What a recovery tells the next attempt. Built fresh for each recovery: nothing of an earlier
/// recovery (hint, manifest, subgoal, restored checkpoint) leaks into a later one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriageContext {
    /// The 0-based call this context is given to.
    pub attempt: u32,
    /// The failure being recovered from.
    pub failure_type: FailureType,
    /// Its message.
    pub failure_message: String,
    /// The recovery chosen.
    pub action: RecoveryAction,
    /// Guidance for this attempt (retry or replan hint, a human's answer).
    pub hint: Option<String>,
    /// Text to put into the model's context (a tool manifest).
    pub inject: Option<String>,
    /// The subgoal to resume from.
    pub resume_from: Option<String>,
    /// The checkpoint restored (name, or `None` for an unnamed one), if any.
    pub restored_checkpoint: Option<Option<String>>,
}

/// The state of one attempt, behind the `RunContext` handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttemptState {
    pub state: Value,
    pub trajectory: Trajectory,
    pub claims: Vec<Claim>,
    pub tokens: u64,
    pub cost: f64,
    pub pending: Vec<Checkpoint>,
}

/// Something the run says it did (a step or an artifact), checked against the trajectory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// `step` or `artifact`.
    pub kind: String,
    /// The step (tool or action) or artifact name.
    pub name: String,
}

/// The handle an attempt records through. Cheap to clone; each attempt of each run has its own.
#[derive(Clone)]
pub struct RunContext {
    run_id: Arc<str>,
    attempt: u32,
    auto_checkpoint: bool,
    inner: Arc<Mutex<AttemptState>>,
    clock: Arc<dyn Clock>,
    store: Arc<dyn CheckpointStore>,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("run_id", &self.run_id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl RunContext {
    pub(crate) fn new(
        run_id: Arc<str>,
        attempt: u32,
        auto_checkpoint: bool,
        start: AttemptState,
        clock: Arc<dyn Clock>,
        store: Arc<dyn CheckpointStore>,
    ) -> RunContext {
        RunContext {
            run_id,
            attempt,
            auto_checkpoint,
            inner: Arc::new(Mutex::new(start)),
            clock,
            store,
        }
    }

    fn lock(&self) -> MutexGuard<'_, AttemptState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take(&self) -> AttemptState {
        std::mem::take(&mut *self.lock())
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The 0-based call of the run this attempt is.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    fn snapshot(&self, g: &AttemptState, name: Option<&str>) -> Checkpoint {
        Checkpoint {
            run_id: self.run_id.to_string(),
            step_index: g.trajectory.len().saturating_sub(1) as u32,
            name: name.map(str::to_string),
            state: g.state.clone(),
            completed_steps: g.trajectory.steps.clone(),
            created_ms: self.clock.now_ms(),
        }
    }

    fn auto(&self, g: &mut AttemptState) {
        if self.auto_checkpoint {
            let cp = self.snapshot(g, None);
            g.pending.push(cp);
        }
    }

    /// Records a step (its index is set; its timestamp too, when 0). Returns the index.
    pub fn record_step(&self, mut step: Step) -> u32 {
        if step.timestamp_ms == 0 {
            step.timestamp_ms = self.clock.now_ms();
        }
        let mut g = self.lock();
        g.cost += step.cost;
        let index = g.trajectory.push(step).index;
        self.auto(&mut g);
        index
    }

    /// Records a tool call step (`action` "tool_call").
    pub fn tool_step(&self, tool: &str, input: Value, output: Option<Value>) -> u32 {
        self.record_step(Step {
            action: "tool_call".into(),
            tool_called: Some(tool.into()),
            tool_input: Some(input),
            tool_output: output,
            ..Step::default()
        })
    }

    /// The current state.
    pub fn state(&self) -> Value {
        self.lock().state.clone()
    }

    /// Replaces the state.
    pub fn set_state(&self, state: Value) {
        let mut g = self.lock();
        g.state = state;
        self.auto(&mut g);
    }

    /// Sets one key of an object state (making the state an object if it is not).
    pub fn update_state(&self, key: &str, value: Value) {
        let mut g = self.lock();
        if !g.state.is_object() {
            g.state = Value::Object(serde_json::Map::new());
        }
        if let Some(o) = g.state.as_object_mut() {
            o.insert(key.to_string(), value);
        }
        self.auto(&mut g);
    }

    fn subgoal_step(&self, name: &str, status: &str) {
        let mut metadata = BTreeMap::new();
        metadata.insert(SUBGOAL_KEY.to_string(), Value::from(name));
        metadata.insert(STATUS_KEY.to_string(), Value::from(status));
        self.record_step(Step {
            action: "subgoal".into(),
            metadata,
            idempotent: true,
            ..Step::default()
        });
    }

    /// Declares a subgoal (recorded in the trajectory).
    pub fn declare_subgoal(&self, name: &str) {
        self.subgoal_step(name, "declared");
    }

    /// Marks a subgoal done (recorded in the trajectory).
    pub fn complete_subgoal(&self, name: &str) {
        self.subgoal_step(name, "done");
    }

    /// Records a step that produced an artifact.
    pub fn produce_artifact(&self, name: &str) {
        let mut metadata = BTreeMap::new();
        metadata.insert(ARTIFACT_KEY.to_string(), Value::from(name));
        self.record_step(Step {
            action: "artifact".into(),
            metadata,
            idempotent: true,
            ..Step::default()
        });
    }

    /// Claims that the run did a step (`kind` "step") or produced an artifact ("artifact");
    /// a claim the trajectory does not back is a hallucinated state.
    pub fn claim(&self, kind: &str, name: &str) {
        self.lock().claims.push(Claim {
            kind: kind.into(),
            name: name.into(),
        });
    }

    /// Accounts model tokens and cost against the run's budgets.
    pub fn spend(&self, tokens: u64, cost: f64) {
        let mut g = self.lock();
        g.tokens += tokens;
        g.cost += cost;
    }

    /// A copy of the trajectory so far.
    pub fn trajectory(&self) -> Trajectory {
        self.lock().trajectory.clone()
    }

    /// Writes a checkpoint (named, or unnamed) of the state and trajectory, after any pending
    /// automatic ones; returns when the store acknowledged it.
    pub async fn checkpoint(&self, name: Option<&str>) -> Result<(), CheckpointError> {
        let (pending, cp) = {
            let mut g = self.lock();
            let cp = self.snapshot(&g, name);
            (std::mem::take(&mut g.pending), cp)
        };
        for p in &pending {
            self.store.put(p).await?;
        }
        self.store.put(&cp).await
    }
}

/// The subgoals a trajectory declares, in declaration order, with whether each was done.
pub fn subgoals(steps: &[Step]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    for s in steps {
        let Some(name) = s.metadata.get(SUBGOAL_KEY).and_then(Value::as_str) else {
            continue;
        };
        let done = s.metadata.get(STATUS_KEY).and_then(Value::as_str) == Some("done");
        match out.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 |= done,
            None => out.push((name.to_string(), done)),
        }
    }
    out
}

/// The first declared subgoal not done, if any.
pub fn first_incomplete_subgoal(trajectory: &Trajectory) -> Option<String> {
    subgoals(&trajectory.steps)
        .into_iter()
        .find(|(_, done)| !done)
        .map(|(n, _)| n)
}
