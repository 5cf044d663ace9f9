//! The Executor actor: runs one stage's tool call per message, each on a worker task of its own,
//! through the tool layer's resilience (validation, timeout, backoff, circuit breaker, bulkhead,
//! budget, idempotency keys), and reports every attempt's latency, cost and error class.

use std::collections::BTreeMap;
use std::sync::Arc;

use hindsight::tools::{CallContext, CallOptions, ToolError, ToolRunner};
use hindsight::{Constraints, ErrorClass, FailureCategory};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;

/// What is left of a task's latency and cost ceilings.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// Milliseconds left, if the task has a ceiling.
    pub latency_ms: Option<f64>,
    /// Cost left, if the task has a ceiling.
    pub cost: Option<f64>,
}

impl Budget {
    /// The budget left after `spent_ms` and `spent_cost`.
    pub fn remaining(c: &Constraints, spent_ms: f64, spent_cost: f64) -> Budget {
        Budget {
            latency_ms: c.max_latency_ms.map(|m| (m - spent_ms).max(0.0)),
            cost: c.max_cost.map(|m| (m - spent_cost).max(0.0)),
        }
    }
}

/// One stage's call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageCall {
    /// The run.
    pub run_id: String,
    /// The task's index (simulated environments draw from it).
    pub task_index: u64,
    /// The attempt.
    pub attempt: u32,
    /// The stage.
    pub stage: String,
    /// The tool.
    pub tool: String,
    /// The arguments.
    pub args: Value,
    /// The task's features.
    pub features: BTreeMap<String, String>,
    /// The call's idempotency key.
    pub idempotency_key: String,
    /// What is left of the task's budget.
    pub budget: Budget,
}

/// What came of a stage's call, every retry included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    /// The output, or the error that ended the call.
    pub result: Result<Value, ToolError>,
    /// Latency over every attempt (backoff included).
    pub latency_ms: f64,
    /// Cost over every attempt.
    pub cost: f64,
    /// Calls actually made (0 when replayed).
    pub calls: u32,
    /// The class of every failed attempt.
    pub error_classes: Vec<ErrorClass>,
    /// How many attempts failed for infrastructure reasons.
    pub infra_errors: u32,
    /// Whether the result was replayed from the idempotency record.
    pub replayed: bool,
}

/// Messages of the executor.
pub enum ExecutorMsg {
    /// Run one stage's call.
    Execute {
        /// The call.
        call: Box<StageCall>,
        /// What came of it.
        reply: RpcReplyPort<CallOutcome>,
    },
}

/// The executor actor.
pub struct Executor;

/// Start-up arguments.
pub struct ExecutorArgs {
    /// The call journal, if one is kept.
    pub journal: Option<crate::journal::CallJournal>,
    /// The resilient tool caller.
    pub runner: Arc<ToolRunner>,
    /// Where it publishes itself.
    pub slot: Arc<Slot<ExecutorMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// State: the tool caller.
pub struct ExecutorState {
    journal: Option<crate::journal::CallJournal>,
    runner: Arc<ToolRunner>,
    chaos: Option<ChaosHook>,
}

impl Actor for Executor {
    type Msg = ExecutorMsg;
    type State = ExecutorState;
    type Arguments = ExecutorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.slot.publish(myself);
        Ok(ExecutorState {
            journal: args.journal,
            runner: args.runner,
            chaos: args.chaos,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        match msg {
            ExecutorMsg::Execute { call, reply } => {
                // A worker per call: the actor stays free, and a call in flight survives a
                // restart of the actor (its reply goes straight to the run's driver).
                let runner = state.runner.clone();
                let journal = state.journal.clone();
                tokio::spawn(async move {
                    let key = call.idempotency_key.clone();
                    let outcome = execute(&runner, *call).await;
                    if let (Some(j), Ok(_), false) = (&journal, &outcome.result, outcome.replayed) {
                        // The runner records the result before it returns.
                        j.line("recorded", &key);
                    }
                    let _ = reply.send(outcome);
                });
            }
        }
        Ok(())
    }
}

/// Runs one call through the resilient tool layer.
pub async fn execute(runner: &ToolRunner, call: StageCall) -> CallOutcome {
    let ctx = CallContext {
        run_id: call.run_id.clone(),
        task_index: call.task_index,
        attempt: call.attempt,
        stage: call.stage.clone(),
        call: 0,
        features: call.features.clone(),
    };
    let report = runner
        .call(
            &call.tool,
            call.args.clone(),
            &ctx,
            &CallOptions {
                idempotency_key: Some(call.idempotency_key.clone()),
                budget: hindsight::tools::Budget {
                    latency_ms: call.budget.latency_ms,
                    cost: call.budget.cost,
                },
            },
        )
        .await;
    let mut error_classes = Vec::new();
    let mut infra_errors = 0;
    let mut waits = 0.0;
    for attempt in &report.attempts {
        waits += attempt.wait_ms as f64;
        if let Some(class) = attempt.error {
            error_classes.push(class);
            if attempt.category == Some(FailureCategory::Infrastructure) {
                infra_errors += 1;
            }
        }
    }
    // A failure after infrastructure retries is reported as the last attempt's error: when
    // every attempt failed for the environment, the stage's failure is the environment's too.
    CallOutcome {
        result: report.result.map(|o| o.value),
        latency_ms: report.total_latency_ms + waits,
        cost: report.total_cost,
        calls: if report.replayed {
            0
        } else {
            report.attempts.len() as u32
        },
        error_classes,
        infra_errors,
        replayed: report.replayed,
    }
}
