//! finish: the end of a run: its final state, the experience logged, the learners fed.

use std::sync::Arc;

use hindsight::store::WriteOp;
use hindsight::{ExperienceTuple, RunResult, RunState, Task, now_ms};
use serde_json::Value;

use crate::memory::MemoryMsg;
use crate::policy::PolicyMsg;
use crate::reflector::ReflectorMsg;

use super::{DriveError, DriverState, LOGGED, RunOutcome, TreeCtx};

/// Ends the run: the experience is logged durably, the learners are fed, a diary note written.
pub(super) async fn finish(
    ctx: &TreeCtx,
    run_id: &str,
    task: &Arc<Task>,
    st: DriverState,
    state: RunState,
    reason: Option<String>,
    resumed: bool,
) -> Result<RunOutcome, DriveError> {
    let passed = state == RunState::Succeeded;
    let reward = ctx.workflow.reward(passed, st.latency_ms, st.cost);
    let plan = st.plan.clone();
    let output = if passed {
        Some(Value::Object(st.outputs.clone().into_iter().collect()))
    } else {
        None
    };
    let outcome = RunOutcome {
        run_id: run_id.to_string(),
        task_id: task.task_id.clone(),
        state,
        passed,
        attempts: st.attempt + 1,
        reflect_retries: st.reflect_retries,
        plan_id: plan.as_ref().map(|p| p.plan_id.clone()),
        sop_id: plan.as_ref().and_then(|p| p.sop_id.clone()),
        arms: st.first_arms.clone(),
        final_arms: plan.as_ref().map(|p| p.arms.clone()).unwrap_or_default(),
        reward,
        latency_ms: st.latency_ms,
        cost: st.cost,
        output: output.clone(),
        reason: reason.clone(),
        recoveries: st.recoveries.clone(),
        tool_calls: st.tool_calls,
        tool_errors: st.tool_errors.clone(),
        resumed,
        explored: st.explored,
        citations: st.citations.clone(),
        greedy_arms: st.first_greedy.clone(),
    };
    let experience = ExperienceTuple {
        run_id: run_id.to_string(),
        task_id: task.task_id.clone(),
        plan_id: st.first_plan_id.clone(),
        user_id: task.user_id.clone(),
        context_features: task.features.clone(),
        arms: st.first_arms.clone(),
        steps: st.steps,
        result: RunResult {
            state,
            passed,
            output,
            latency_ms: st.latency_ms,
            cost: st.cost,
            attempts: st.attempt + 1,
        },
        reward,
        user_feedback: None,
        time_ms: now_ms(),
    };
    // The experience is logged once per run: a run resumed after a crash that fell between
    // logging it and recording the run's end finds its marker and does not log it again (the
    // learners already replayed it from the log at start).
    if ctx.store.get::<u64>(LOGGED, run_id)?.is_some() {
        return Ok(outcome);
    }
    let written = ctx
        .store
        .write_batch(vec![
            WriteOp::experience(&experience)?,
            WriteOp::put(LOGGED, run_id, &st.attempt)?,
        ])
        .await?;
    let Some(seq) = written.first().copied().flatten() else {
        return Ok(outcome);
    };
    let experience = Arc::new(experience);
    let _ = ctx
        .dir
        .policy
        .cast(PolicyMsg::Observe {
            seq,
            experience: experience.clone(),
        })
        .await;
    let _ = ctx
        .dir
        .reflector
        .cast(ReflectorMsg::Consolidate {
            seq,
            experience: experience.clone(),
            task: task.clone(),
        })
        .await;
    let _ = ctx
        .dir
        .memory
        .cast(MemoryMsg::Record {
            seq,
            experience,
            task: task.clone(),
        })
        .await;
    Ok(outcome)
}
