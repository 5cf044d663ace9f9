//! The storage forms of records that hold JSON values: the same fields, with every
//! `serde_json::Value` kept as a [`JsonTree`] so that postcard can decode it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::json::JsonTree;
use crate::record::{ArmChoice, Checkpoint, ExperienceTuple, RunResult, RunState};
use crate::taxonomy::{ErrorClass, Step};

fn tree(v: &Option<serde_json::Value>) -> Option<JsonTree> {
    v.as_ref().map(JsonTree::from)
}

fn value(t: Option<JsonTree>) -> Result<Option<serde_json::Value>, String> {
    t.map(JsonTree::into_value).transpose()
}

/// Storage form of [`Step`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredStep {
    index: u32,
    action: String,
    tool_called: Option<String>,
    tool_input: Option<JsonTree>,
    tool_output: Option<JsonTree>,
    llm_output: Option<String>,
    error: Option<String>,
    exception_type: Option<String>,
    error_class: Option<ErrorClass>,
    timestamp_ms: u64,
    latency_ms: f64,
    cost: f64,
    idempotent: bool,
    idempotency_key: Option<String>,
    metadata: Vec<(String, JsonTree)>,
}

impl From<&Step> for StoredStep {
    fn from(s: &Step) -> StoredStep {
        StoredStep {
            index: s.index,
            action: s.action.clone(),
            tool_called: s.tool_called.clone(),
            tool_input: tree(&s.tool_input),
            tool_output: tree(&s.tool_output),
            llm_output: s.llm_output.clone(),
            error: s.error.clone(),
            exception_type: s.exception_type.clone(),
            error_class: s.error_class,
            timestamp_ms: s.timestamp_ms,
            latency_ms: s.latency_ms,
            cost: s.cost,
            idempotent: s.idempotent,
            idempotency_key: s.idempotency_key.clone(),
            metadata: s
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), JsonTree::from(v)))
                .collect(),
        }
    }
}

impl StoredStep {
    fn into_step(self) -> Result<Step, String> {
        let mut metadata = BTreeMap::new();
        for (k, v) in self.metadata {
            metadata.insert(k, v.into_value()?);
        }
        Ok(Step {
            index: self.index,
            action: self.action,
            tool_called: self.tool_called,
            tool_input: value(self.tool_input)?,
            tool_output: value(self.tool_output)?,
            llm_output: self.llm_output,
            error: self.error,
            exception_type: self.exception_type,
            error_class: self.error_class,
            timestamp_ms: self.timestamp_ms,
            latency_ms: self.latency_ms,
            cost: self.cost,
            idempotent: self.idempotent,
            idempotency_key: self.idempotency_key,
            metadata,
        })
    }
}

fn steps(steps: Vec<StoredStep>) -> Result<Vec<Step>, String> {
    steps.into_iter().map(StoredStep::into_step).collect()
}

/// Storage form of [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredCheckpoint {
    run_id: String,
    step_index: u32,
    name: Option<String>,
    state: JsonTree,
    completed_steps: Vec<StoredStep>,
    created_ms: u64,
}

impl From<&Checkpoint> for StoredCheckpoint {
    fn from(c: &Checkpoint) -> StoredCheckpoint {
        StoredCheckpoint {
            run_id: c.run_id.clone(),
            step_index: c.step_index,
            name: c.name.clone(),
            state: JsonTree::from(&c.state),
            completed_steps: c.completed_steps.iter().map(StoredStep::from).collect(),
            created_ms: c.created_ms,
        }
    }
}

impl StoredCheckpoint {
    /// Back to the record; fails on a JSON number that JSON cannot hold.
    pub(crate) fn into_checkpoint(self) -> Result<Checkpoint, String> {
        Ok(Checkpoint {
            run_id: self.run_id,
            step_index: self.step_index,
            name: self.name,
            state: self.state.into_value()?,
            completed_steps: steps(self.completed_steps)?,
            created_ms: self.created_ms,
        })
    }
}

/// Storage form of [`RunResult`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StoredRunResult {
    state: RunState,
    passed: bool,
    output: Option<JsonTree>,
    latency_ms: f64,
    cost: f64,
    attempts: u32,
}

/// Storage form of [`ExperienceTuple`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredExperience {
    run_id: String,
    task_id: String,
    plan_id: String,
    user_id: Option<String>,
    context_features: BTreeMap<String, String>,
    arms: Vec<ArmChoice>,
    steps: Vec<StoredStep>,
    result: StoredRunResult,
    reward: f64,
    user_feedback: Option<String>,
    time_ms: u64,
}

impl From<&ExperienceTuple> for StoredExperience {
    fn from(e: &ExperienceTuple) -> StoredExperience {
        StoredExperience {
            run_id: e.run_id.clone(),
            task_id: e.task_id.clone(),
            plan_id: e.plan_id.clone(),
            user_id: e.user_id.clone(),
            context_features: e.context_features.clone(),
            arms: e.arms.clone(),
            steps: e.steps.iter().map(StoredStep::from).collect(),
            result: StoredRunResult {
                state: e.result.state,
                passed: e.result.passed,
                output: tree(&e.result.output),
                latency_ms: e.result.latency_ms,
                cost: e.result.cost,
                attempts: e.result.attempts,
            },
            reward: e.reward,
            user_feedback: e.user_feedback.clone(),
            time_ms: e.time_ms,
        }
    }
}

impl StoredExperience {
    /// When the tuple was logged (for TTL compaction).
    pub(crate) fn time_ms(&self) -> u64 {
        self.time_ms
    }

    /// Back to the record; fails on a JSON number that JSON cannot hold.
    pub(crate) fn into_experience(self) -> Result<ExperienceTuple, String> {
        Ok(ExperienceTuple {
            run_id: self.run_id,
            task_id: self.task_id,
            plan_id: self.plan_id,
            user_id: self.user_id,
            context_features: self.context_features,
            arms: self.arms,
            steps: steps(self.steps)?,
            result: RunResult {
                state: self.result.state,
                passed: self.result.passed,
                output: value(self.result.output)?,
                latency_ms: self.result.latency_ms,
                cost: self.result.cost,
                attempts: self.result.attempts,
            },
            reward: self.reward,
            user_feedback: self.user_feedback,
            time_ms: self.time_ms,
        })
    }
}
