//! The storage forms of records that hold JSON values: the same fields, with every
//! `serde_json::Value` kept as a [`JsonTree`] so that postcard can decode it; each is written
//! from a borrowed form (`*Ref`) that produces the same bytes without copying the record.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::json::{JsonEncoded, JsonRef, JsonTree};
use crate::record::{ArmChoice, Checkpoint, ExperienceTuple, RunResult, RunState};
use crate::taxonomy::{ErrorClass, Step};

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

/// Write form of [`Step`]: written as [`StoredStep`] is, straight from the step.
#[derive(Serialize)]
pub(crate) struct StepRef<'a> {
    index: u32,
    action: &'a str,
    tool_called: Option<&'a str>,
    tool_input: Option<JsonRef<'a>>,
    tool_output: Option<JsonRef<'a>>,
    llm_output: Option<&'a str>,
    error: Option<&'a str>,
    exception_type: Option<&'a str>,
    error_class: Option<ErrorClass>,
    timestamp_ms: u64,
    latency_ms: f64,
    cost: f64,
    idempotent: bool,
    idempotency_key: Option<&'a str>,
    metadata: Metadata<'a>,
}

/// A step's metadata, as `Vec<(String, JsonTree)>` is written.
struct Metadata<'a>(&'a BTreeMap<String, serde_json::Value>);

impl Serialize for Metadata<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, v)| (k, JsonRef(v))))
    }
}

impl<'a> From<&'a Step> for StepRef<'a> {
    fn from(s: &'a Step) -> StepRef<'a> {
        StepRef {
            index: s.index,
            action: &s.action,
            tool_called: s.tool_called.as_deref(),
            tool_input: s.tool_input.as_ref().map(JsonRef),
            tool_output: s.tool_output.as_ref().map(JsonRef),
            llm_output: s.llm_output.as_deref(),
            error: s.error.as_deref(),
            exception_type: s.exception_type.as_deref(),
            error_class: s.error_class,
            timestamp_ms: s.timestamp_ms,
            latency_ms: s.latency_ms,
            cost: s.cost,
            idempotent: s.idempotent,
            idempotency_key: s.idempotency_key.as_deref(),
            metadata: Metadata(&s.metadata),
        }
    }
}

/// Steps, as `Vec<StoredStep>` is written.
struct Steps<'a>(&'a [Step]);

impl Serialize for Steps<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(StepRef::from))
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

/// Write form of [`Checkpoint`]: written as [`StoredCheckpoint`] is, straight from the record
/// or from a state's encoded tree (no JSON value is built).
#[derive(Serialize)]
pub(crate) struct CheckpointRef<'a> {
    run_id: &'a str,
    step_index: u32,
    name: Option<&'a str>,
    state: StateRef<'a>,
    completed_steps: Steps<'a>,
    created_ms: u64,
}

/// A checkpoint's state as it is written: a value, or its encoded tree.
enum StateRef<'a> {
    Value(JsonRef<'a>),
    Encoded(JsonEncoded<'a>),
}

impl Serialize for StateRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StateRef::Value(v) => v.serialize(s),
            StateRef::Encoded(t) => t.serialize(s),
        }
    }
}

impl<'a> From<&'a Checkpoint> for CheckpointRef<'a> {
    fn from(c: &'a Checkpoint) -> CheckpointRef<'a> {
        CheckpointRef {
            run_id: &c.run_id,
            step_index: c.step_index,
            name: c.name.as_deref(),
            state: StateRef::Value(JsonRef(&c.state)),
            completed_steps: Steps(&c.completed_steps),
            created_ms: c.created_ms,
        }
    }
}

impl<'a> CheckpointRef<'a> {
    /// An unnamed checkpoint without completed steps whose state is `state`, the postcard
    /// bytes of a [`JsonTree`] ([`super::transcode::tree_bytes`]).
    pub(crate) fn of_tree(
        run_id: &'a str,
        step_index: u32,
        state: &'a [u8],
        created_ms: u64,
    ) -> CheckpointRef<'a> {
        CheckpointRef {
            run_id,
            step_index,
            name: None,
            state: StateRef::Encoded(JsonEncoded(state)),
            completed_steps: Steps(&[]),
            created_ms,
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

/// Write form of [`RunResult`], as [`StoredRunResult`] is written.
#[derive(Serialize)]
struct RunResultRef<'a> {
    state: RunState,
    passed: bool,
    output: Option<JsonRef<'a>>,
    latency_ms: f64,
    cost: f64,
    attempts: u32,
}

/// Write form of [`ExperienceTuple`]: written as [`StoredExperience`] is, straight from the
/// record.
#[derive(Serialize)]
pub(crate) struct ExperienceRef<'a> {
    run_id: &'a str,
    task_id: &'a str,
    plan_id: &'a str,
    user_id: Option<&'a str>,
    context_features: &'a BTreeMap<String, String>,
    arms: &'a [ArmChoice],
    steps: Steps<'a>,
    result: RunResultRef<'a>,
    reward: f64,
    user_feedback: Option<&'a str>,
    time_ms: u64,
}

impl<'a> From<&'a ExperienceTuple> for ExperienceRef<'a> {
    fn from(e: &'a ExperienceTuple) -> ExperienceRef<'a> {
        ExperienceRef {
            run_id: &e.run_id,
            task_id: &e.task_id,
            plan_id: &e.plan_id,
            user_id: e.user_id.as_deref(),
            context_features: &e.context_features,
            arms: &e.arms,
            steps: Steps(&e.steps),
            result: RunResultRef {
                state: e.result.state,
                passed: e.result.passed,
                output: e.result.output.as_ref().map(JsonRef),
                latency_ms: e.result.latency_ms,
                cost: e.result.cost,
                attempts: e.result.attempts,
            },
            reward: e.reward,
            user_feedback: e.user_feedback.as_deref(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(index: u32) -> Step {
        Step {
            index,
            action: "call".into(),
            tool_called: Some("ocr".into()),
            tool_input: Some(json!({"path": "a.pdf", "pages": [1, 2, -3], "x": 0.5})),
            tool_output: None,
            error: Some("Timeout".into()),
            error_class: Some(ErrorClass::Timeout),
            latency_ms: 12.5,
            metadata: [
                ("stage".to_string(), json!("extract")),
                ("n".to_string(), json!(null)),
            ]
            .into_iter()
            .collect(),
            ..Step::default()
        }
    }

    #[test]
    fn a_checkpoint_is_written_as_its_storage_form_and_reads_back() {
        let cp = Checkpoint {
            run_id: "run-1".into(),
            step_index: 2,
            name: Some("before-write".into()),
            state: json!({"outputs": {"extract": {"rows": 3}}, "u": u64::MAX, "s": "é"}),
            completed_steps: vec![step(0), step(1)],
            created_ms: 7,
        };
        let bytes = postcard::to_allocvec(&CheckpointRef::from(&cp)).unwrap();
        let stored: StoredCheckpoint = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(postcard::to_allocvec(&stored).unwrap(), bytes);
        assert_eq!(stored.into_checkpoint().unwrap(), cp);
    }

    #[test]
    fn an_experience_is_written_as_its_storage_form_and_reads_back() {
        let e = ExperienceTuple {
            run_id: "run-1".into(),
            task_id: "t".into(),
            plan_id: "p".into(),
            user_id: Some("u".into()),
            context_features: [("tenant".to_string(), "A".to_string())]
                .into_iter()
                .collect(),
            arms: vec![ArmChoice {
                stage: "extract".into(),
                tool: "ocr".into(),
                strategy: "fast".into(),
                propensity: 0.25,
            }],
            steps: vec![step(0)],
            result: RunResult {
                state: RunState::Succeeded,
                passed: true,
                output: Some(json!([1, "two", {"three": 3.5}])),
                latency_ms: 1.0,
                cost: 0.01,
                attempts: 1,
            },
            reward: 0.9,
            user_feedback: None,
            time_ms: 42,
        };
        let bytes = postcard::to_allocvec(&ExperienceRef::from(&e)).unwrap();
        let stored: StoredExperience = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(postcard::to_allocvec(&stored).unwrap(), bytes);
        assert_eq!(stored.into_experience().unwrap(), e);
    }
}
