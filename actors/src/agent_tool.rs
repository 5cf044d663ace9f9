//! agent_tool: another agent as a tool (`agent:NAME`). Each call is a child run of that agent,
//! submitted to its tree and supervised there with its own trajectory, checkpoints and learning;
//! the child's task id is the parent's run and the call's place in it, so that the child is
//! linked to its parent by id, and a call made again (a retry, or a parent resumed after a
//! crash) attaches to the same child run instead of starting a second one.

use hindsight::tools::{CallContext, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec};
use hindsight::{ErrorClass, FailureCategory, RunState, Task};
use serde_json::{Value, json};

use crate::runtime::{RuntimeError, Submitter};

/// The tool that runs agent `name` (in the tree `submitter` submits to) as a child run.
pub struct AgentTool {
    spec: ToolSpec,
    agent: String,
    submitter: Submitter,
}

impl AgentTool {
    /// The tool `agent:NAME` over the tree of agent `name`, described to the calling model by
    /// `description` (what the agent is for).
    pub fn new(name: &str, description: &str, submitter: Submitter) -> AgentTool {
        let description = if description.trim().is_empty() {
            format!("Asks the agent `{name}` to do a task and returns its answer")
        } else {
            format!("Asks the agent `{name}` to do a task and returns its answer: {description}")
        };
        let mut spec = ToolSpec::new(
            format!("{}{name}", hindsight::run::workflow::AGENT_TOOL_PREFIX),
            description,
        );
        spec.input_schema = json!({
            "type": "object",
            "properties": {
                "goal": {"type": "string", "description": "What the agent is to do, in words"},
                "input": {"type": "object", "description": "The input object the agent's task carries"}
            },
            "required": ["goal"]
        });
        // A call made again attaches to the child run the first one started.
        spec.idempotent = true;
        AgentTool {
            spec,
            agent: name.to_string(),
            submitter,
        }
    }

    /// The child task of a call: its id names the parent run, the attempt, the stage, the turn
    /// and the call, and it runs in the parent's tenant with the parent's features.
    fn child_task(&self, args: &Value, ctx: &CallContext) -> Task {
        let parent = ctx.run_id.strip_prefix("run-").unwrap_or(&ctx.run_id);
        Task {
            task_id: format!(
                "{parent}/{}/a{}.t{}.c{}/{}",
                ctx.stage, ctx.attempt, ctx.turn, ctx.call, self.agent
            ),
            goal: args
                .get("goal")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            features: ctx.features.clone(),
            tenant: ctx.tenant.clone(),
            input: args.get("input").cloned(),
            ..Task::default()
        }
    }
}

impl Tool for AgentTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let task = self.child_task(&args, ctx);
            let outcome = self.submitter.orchestrate(task).await.map_err(|e| {
                // The child's tree not answering is the environment's fault; a task the child's
                // guard refuses is the call's.
                match e {
                    RuntimeError::Submit(crate::orchestrator::SubmitError::Refused {
                        field,
                        reason,
                    }) => ToolError::new(
                        ErrorClass::SchemaMismatch,
                        FailureCategory::Strategy,
                        format!("agent `{}` refused the task: {field}: {reason}", self.agent),
                    ),
                    other => ToolError::new(
                        ErrorClass::TransientNetwork,
                        FailureCategory::Infrastructure,
                        format!("agent `{}` could not be reached: {other}", self.agent),
                    ),
                }
            })?;
            if outcome.state != RunState::Succeeded {
                return Err(ToolError::new(
                    ErrorClass::DeterministicFailure,
                    FailureCategory::Strategy,
                    format!(
                        "agent `{}`'s run {} ended {}: {}",
                        self.agent,
                        outcome.run_id,
                        outcome.state.as_str(),
                        outcome.reason.as_deref().unwrap_or("no reason given")
                    ),
                )
                .with_usage(outcome.latency_ms, outcome.cost));
            }
            let answer = outcome
                .output
                .as_ref()
                .and_then(|o| o.get(&self.agent))
                .cloned()
                .or_else(|| outcome.output.clone())
                .unwrap_or(Value::Null);
            Ok(ToolOutput {
                value: json!({
                    "agent": self.agent,
                    "run_id": outcome.run_id,
                    "answer": answer,
                }),
                latency_ms: outcome.latency_ms,
                cost: outcome.cost,
            })
        })
    }
}
