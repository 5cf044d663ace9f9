//! stages: executing a plan stage by stage through the executor, with a checkpoint after each
//! step and an idempotency key for each call.

use std::sync::Arc;

use hindsight::{ErrorClass, FailureCategory, Step, Task, Trajectory, now_ms};
use serde_json::Value;

use crate::executor::{CallOutcome, ExecutorMsg, StageCall};
use crate::plugin::RunEvent;
use crate::policy::PlanChoice;
use crate::recovery::AttemptFailure;

use super::{DriveError, DriverState, TreeCtx, checkpoint};

/// The idempotency key of one stage call of one attempt.
pub(crate) fn idempotency_key(run_id: &str, attempt: u32, stage: &str) -> String {
    hindsight::store::idempotency::call_key(run_id, attempt, stage)
}

/// Runs the plan's stages from `st.next_stage`, checkpointing after each step. Returns the
/// failure that ended the attempt, if one did.
pub(super) async fn execute_stages(
    ctx: &TreeCtx,
    run_id: &str,
    task: &Arc<Task>,
    plan: &PlanChoice,
    st: &mut DriverState,
) -> Result<Option<AttemptFailure>, DriveError> {
    let task_index = crate::workflow::task_index(task);
    while st.next_stage < plan.arms.len() {
        let i = st.next_stage;
        let arm = plan.arms[i].clone();
        let idempotent = ctx.workflow.is_idempotent(&arm.tool);
        if st.in_flight == Some(i) && !idempotent {
            // A non-idempotent call was started before a crash and its end was never seen: it is
            // in doubt, and repeating it silently could do it twice. The failure policy decides.
            st.in_flight = None;
            let message = format!(
                "the call of {} at stage {} was in flight when the process stopped; its outcome is in doubt",
                arm.tool, arm.stage
            );
            st.event(
                ctx,
                run_id,
                RunEvent::Error {
                    stage: arm.stage.clone(),
                    tool: arm.tool.clone(),
                    class: ErrorClass::DeterministicFailure,
                    message: message.clone(),
                },
            );
            return Ok(Some(AttemptFailure {
                trajectory: attempt_trajectory(st),
                stage: i,
                message,
                error_type: Some("InDoubt".to_string()),
                class: None,
                category: FailureCategory::Unknown,
                retry_after_ms: None,
            }));
        }
        if !idempotent {
            st.in_flight = Some(i);
            checkpoint(ctx, run_id, st).await?;
        }
        let call = StageCall {
            run_id: run_id.to_string(),
            task_index,
            attempt: st.attempt,
            stage: arm.stage.clone(),
            tool: arm.tool.clone(),
            args: ctx
                .workflow
                .args(&arm.stage, &arm.tool, &arm.strategy, &st.outputs),
            features: task.features.clone(),
            idempotency_key: idempotency_key(run_id, st.attempt, &arm.stage),
            budget: crate::executor::Budget::remaining(&task.constraints, st.latency_ms, st.cost),
        };
        let outcome: CallOutcome = ctx
            .dir
            .executor
            .call_with_timeout(
                |reply| ExecutorMsg::Execute {
                    call: Box::new(call.clone()),
                    reply,
                },
                ctx.config.stage_timeout,
            )
            .await?;
        st.in_flight = None;
        st.latency_ms += outcome.latency_ms;
        st.cost += outcome.cost;
        st.tool_calls += outcome.calls;
        for class in &outcome.error_classes {
            *st.tool_errors.entry(*class).or_insert(0) += 1;
        }
        let mut step = Step {
            index: st.steps.len() as u32,
            action: "tool_call".to_string(),
            tool_called: Some(arm.tool.clone()),
            tool_input: Some(call.args.clone()),
            timestamp_ms: now_ms(),
            latency_ms: outcome.latency_ms,
            cost: outcome.cost,
            idempotent,
            idempotency_key: Some(call.idempotency_key.clone()),
            ..Step::default()
        };
        step.metadata
            .insert("stage".into(), Value::from(arm.stage.clone()));
        step.metadata
            .insert("strategy".into(), Value::from(arm.strategy.clone()));
        step.metadata
            .insert("attempt".into(), Value::from(st.attempt));
        step.metadata
            .insert("infra_errors".into(), Value::from(outcome.infra_errors));
        // What the arm itself took, without the infrastructure faults retried inside the call
        // and their backoff: the policy learns latency and cost from these, never from faults.
        step.metadata
            .insert("own_latency_ms".into(), Value::from(outcome.own_latency_ms));
        step.metadata
            .insert("own_cost".into(), Value::from(outcome.own_cost));
        step.metadata
            .insert("replayed".into(), Value::from(outcome.replayed));
        match outcome.result {
            Ok(value) => {
                step.tool_output = Some(value.clone());
                step.metadata
                    .insert("outcome".into(), Value::from("success"));
                st.steps.push(step);
                st.event(
                    ctx,
                    run_id,
                    RunEvent::StepSucceeded {
                        stage: arm.stage.clone(),
                        tool: arm.tool.clone(),
                    },
                );
                st.outputs.insert(arm.stage.clone(), value);
                st.output_step.insert(arm.stage.clone(), st.steps.len() - 1);
                st.next_stage += 1;
                checkpoint(ctx, run_id, st).await?;
            }
            Err(err) => {
                step.error = Some(err.message.clone());
                step.error_class = Some(err.class);
                step.exception_type = Some(err.class.to_string());
                step.metadata
                    .insert("outcome".into(), Value::from(err.category.as_str()));
                st.steps.push(step);
                st.event(
                    ctx,
                    run_id,
                    RunEvent::Error {
                        stage: arm.stage.clone(),
                        tool: arm.tool.clone(),
                        class: err.class,
                        message: err.message.clone(),
                    },
                );
                checkpoint(ctx, run_id, st).await?;
                return Ok(Some(AttemptFailure {
                    trajectory: attempt_trajectory(st),
                    stage: i,
                    message: err.message,
                    error_type: Some(err.class.to_string()),
                    class: Some(err.class),
                    category: err.category,
                    retry_after_ms: err.retry_after_ms,
                }));
            }
        }
    }
    Ok(None)
}

/// The steps of the current attempt, as a trajectory for the classifier.
pub(super) fn attempt_trajectory(st: &DriverState) -> Trajectory {
    let mut t = Trajectory::default();
    for s in st.steps.iter().filter(|s| {
        s.metadata.get("attempt").and_then(Value::as_u64) == Some(u64::from(st.attempt))
    }) {
        t.push(s.clone());
    }
    t
}
