//! The `Tool` trait and the values that cross it: the tool's spec, the call context, the output
//! and the classified error.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::taxonomy::{ErrorClass, FailureCategory};

/// The future a tool call returns.
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + 'a>>;

/// A callable tool: a spec and an async call.
pub trait Tool: Send + Sync {
    /// What the tool is and how it may be called.
    fn spec(&self) -> &ToolSpec;
    /// Calls the tool with arguments already validated against `spec().input_schema`.
    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a>;
}

/// How much a call costs, in the same unit as budgets (for budget-aware retries).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CostModel {
    /// Expected cost of one call.
    pub per_call: f64,
    /// Expected latency of one call in milliseconds (used to judge whether a retry fits).
    pub expected_latency_ms: f64,
}

/// A ceiling on the call rate of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// How many calls ...
    pub calls: u32,
    /// ... per this many milliseconds.
    pub per_ms: u64,
}

/// What a tool is and how it may be called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The unique name in the registry.
    pub name: String,
    /// What the tool does, for planners and manifests.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
    /// Whether calling it twice with the same arguments is harmless.
    pub idempotent: bool,
    /// Expected cost and latency of a call.
    pub cost: CostModel,
    /// Call-rate ceiling, if any.
    pub rate_limit: Option<RateLimit>,
}

impl ToolSpec {
    /// A spec with a permissive object schema, not idempotent, no cost, no rate limit.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: serde_json::json!({"type": "object"}),
            idempotent: false,
            cost: CostModel::default(),
            rate_limit: None,
        }
    }
}

/// Where a call happens: the run, task, attempt, stage and the call's number within them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallContext {
    /// The run making the call.
    pub run_id: String,
    /// The task's 0-based index (simulated environments draw from it).
    pub task_index: u64,
    /// The attempt of the run (0-based).
    pub attempt: u32,
    /// The plan stage the call serves.
    pub stage: String,
    /// The call's number within the stage of this attempt (retries count up).
    pub call: u32,
    /// The task's features.
    pub features: BTreeMap<String, String>,
    /// The model turn that asked for the call, in an agent stage (0 in a tool stage).
    pub turn: u32,
    /// The task's input object, if it has one.
    pub input: Option<Value>,
    /// The tenant the task belongs to (a tool that starts runs of its own, such as
    /// `agent:NAME`, starts them in the same tenant).
    #[serde(default)]
    pub tenant: Option<String>,
}

/// A successful call's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The tool's answer.
    pub value: Value,
    /// How long the call took (virtual or measured), in milliseconds.
    pub latency_ms: f64,
    /// What the call cost.
    pub cost: f64,
}

/// A failed call, classified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub struct ToolError {
    /// The error class.
    pub class: ErrorClass,
    /// Whether the environment or the choice was at fault.
    pub category: FailureCategory,
    /// What happened, in words.
    pub message: String,
    /// How long the tool asked us to wait before trying again.
    pub retry_after_ms: Option<u64>,
    /// How long the failed call took, in milliseconds.
    pub latency_ms: f64,
    /// What the failed call cost.
    pub cost: f64,
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.class, self.category, self.message)?;
        if let Some(ms) = self.retry_after_ms {
            write!(f, " (retry after {ms} ms)")?;
        }
        Ok(())
    }
}

impl ToolError {
    /// An error whose class and category the tool knows.
    pub fn new(class: ErrorClass, category: FailureCategory, message: impl Into<String>) -> Self {
        ToolError {
            class,
            category,
            message: message.into(),
            retry_after_ms: None,
            latency_ms: 0.0,
            cost: 0.0,
        }
    }

    /// An error the tool did not classify: classified by
    /// [`crate::triage::classify_error`] from its type name and message.
    pub fn classified(error_type: Option<&str>, message: impl Into<String>) -> Self {
        let message = message.into();
        let c = crate::triage::classify_error(error_type, &message);
        ToolError::new(c.error_class, c.category, message)
    }

    /// The same error with a Retry-After hint.
    pub fn with_retry_after(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }

    /// The same error with its latency and cost.
    pub fn with_usage(mut self, latency_ms: f64, cost: f64) -> Self {
        self.latency_ms = latency_ms;
        self.cost = cost;
        self
    }

    /// Whether the environment, not the choice, failed (the runner retries only these).
    pub fn is_infrastructure(&self) -> bool {
        self.category == FailureCategory::Infrastructure
    }
}
