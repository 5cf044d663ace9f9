//! call: one stage's tool call as the run machine asks for it, and how its outcome is measured
//! through the resilient runner (every attempt's latency, cost and error class; the arm's own
//! share apart from the infrastructure faults retried inside the call).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::{CallContext, CallOptions, ToolError, ToolRunner};
use crate::{Constraints, ErrorClass, FailureCategory};

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
    /// In an agent stage, the model turn that asked for the call, and the call's number within
    /// the stage (0 in a tool stage).
    #[serde(default)]
    pub turn: u32,
    /// The call's number within the stage of this attempt.
    #[serde(default)]
    pub call: u32,
    /// The task's input object, if it has one.
    #[serde(default)]
    pub input: Option<Value>,
    /// The task's tenant.
    #[serde(default)]
    pub tenant: Option<String>,
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
    /// Latency of the attempts that did not fail for infrastructure reasons (no backoff): what
    /// the arm itself took, the only latency the policy may learn from.
    pub own_latency_ms: f64,
    /// Cost of the attempts that did not fail for infrastructure reasons.
    pub own_cost: f64,
    /// Calls actually made (0 when replayed).
    pub calls: u32,
    /// The class of every failed attempt.
    pub error_classes: Vec<ErrorClass>,
    /// How many attempts failed for infrastructure reasons.
    pub infra_errors: u32,
    /// Whether the result was replayed from the idempotency record.
    pub replayed: bool,
}

/// Runs one call through the resilient tool layer.
pub async fn execute(runner: &ToolRunner, call: StageCall) -> CallOutcome {
    let StageCall {
        run_id,
        task_index,
        attempt,
        stage,
        tool,
        args,
        features,
        idempotency_key,
        budget,
        turn,
        call,
        input,
        tenant,
    } = call;
    let ctx = CallContext {
        run_id,
        task_index,
        attempt,
        stage,
        call,
        features,
        turn,
        input,
        tenant,
    };
    let report = runner
        .call(
            &tool,
            args,
            &ctx,
            &CallOptions {
                idempotency_key: Some(idempotency_key),
                budget: crate::tools::Budget {
                    latency_ms: budget.latency_ms,
                    cost: budget.cost,
                },
            },
        )
        .await;
    let mut error_classes = Vec::new();
    let mut infra_errors = 0;
    let (mut own_latency_ms, mut own_cost) = (0.0, 0.0);
    for attempt in &report.attempts {
        let infra = attempt.category == Some(FailureCategory::Infrastructure);
        if infra {
            infra_errors += 1;
        } else {
            own_latency_ms += attempt.latency_ms;
            own_cost += attempt.cost;
        }
        error_classes.extend(attempt.error);
    }
    // A failure after infrastructure retries is reported as the last attempt's error: when
    // every attempt failed for the environment, the stage's failure is the environment's too.
    CallOutcome {
        result: report.result.map(|o| o.value),
        // The report's total already holds every attempt's wait.
        latency_ms: report.total_latency_ms,
        cost: report.total_cost,
        own_latency_ms,
        own_cost,
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use crate::tools::{Tool, ToolFuture, ToolOutput, ToolRegistry, ToolSpec, VirtualClock};

    use super::*;

    /// Fails its first call for the environment (700 ms, 0.5, asks for a 2 s wait), then
    /// answers in 100 ms for 0.01.
    struct FlakyOnce {
        spec: ToolSpec,
        calls: AtomicU32,
    }

    impl Tool for FlakyOnce {
        fn spec(&self) -> &ToolSpec {
            &self.spec
        }

        fn call<'a>(&'a self, _args: Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
            Box::pin(async move {
                if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(ToolError {
                        class: ErrorClass::TransientNetwork,
                        category: FailureCategory::Infrastructure,
                        message: "connection reset".into(),
                        retry_after_ms: Some(2000),
                        latency_ms: 700.0,
                        cost: 0.5,
                    });
                }
                Ok(ToolOutput {
                    value: serde_json::json!({"ok": true}),
                    latency_ms: 100.0,
                    cost: 0.01,
                })
            })
        }
    }

    #[tokio::test]
    async fn a_retried_fault_is_paid_once_and_not_charged_to_the_arm() {
        let mut spec = ToolSpec::new("flaky", "fails once for the environment");
        spec.idempotent = true;
        let mut registry = ToolRegistry::new();
        registry
            .register(Arc::new(FlakyOnce {
                spec,
                calls: AtomicU32::new(0),
            }))
            .unwrap();
        let runner = ToolRunner::new(Arc::new(registry), Arc::new(VirtualClock::new()), 1);
        let out = execute(
            &runner,
            StageCall {
                run_id: "run-1".into(),
                task_index: 0,
                attempt: 1,
                stage: "fetch".into(),
                tool: "flaky".into(),
                args: serde_json::json!({}),
                features: BTreeMap::new(),
                idempotency_key: "run-1/fetch/1".into(),
                budget: Budget::default(),
                turn: 0,
                call: 0,
                input: None,
                tenant: None,
            },
        )
        .await;
        assert!(out.result.is_ok(), "{:?}", out.result);
        assert_eq!(out.infra_errors, 1);
        assert_eq!(out.calls, 2);
        // The task pays for both attempts and the wait between them, once.
        assert!((out.latency_ms - 2800.0).abs() < 1e-9, "{}", out.latency_ms);
        assert!((out.cost - 0.51).abs() < 1e-9, "{}", out.cost);
        // The arm is judged by its own attempt only.
        assert!((out.own_latency_ms - 100.0).abs() < 1e-9);
        assert!((out.own_cost - 0.01).abs() < 1e-9);
    }
}
