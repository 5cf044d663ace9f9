//! validate: the validator's verdict on a round's outputs, and the stages it marks valid or not.

use hindsight::{ErrorClass, FailureCategory};
use serde_json::Value;

use crate::plugin::RunEvent;
use crate::policy::PlanChoice;
use crate::recovery::AttemptFailure;
use crate::validator::ValidatorMsg;

use super::stages::attempt_trajectory;
use super::{DriveError, DriverState, TreeCtx};

/// Validates every output of the attempt, marks each producing step `valid` or `invalid` (what
/// the learners read), and returns the first invalid stage as the failure.
pub(super) async fn validate(
    ctx: &TreeCtx,
    run_id: &str,
    plan: &PlanChoice,
    st: &mut DriverState,
) -> Result<Option<AttemptFailure>, DriveError> {
    let outputs: Vec<(String, Value)> = plan
        .arms
        .iter()
        .filter_map(|a| {
            st.outputs
                .get(&a.stage)
                .map(|v| (a.stage.clone(), v.clone()))
        })
        .collect();
    let verdicts = validate_and_mark(ctx, st, outputs).await?;
    let mut first_invalid: Option<(String, String)> = None;
    for (stage, verdict) in verdicts {
        if let (Err(reason), None) = (verdict, &first_invalid) {
            first_invalid = Some((stage, reason));
        }
    }
    let Some((stage, reason)) = first_invalid else {
        st.event(
            ctx,
            run_id,
            RunEvent::Validation {
                passed: true,
                reason: None,
            },
        );
        return Ok(None);
    };
    st.event(
        ctx,
        run_id,
        RunEvent::Validation {
            passed: false,
            reason: Some(reason.clone()),
        },
    );
    let at = plan.arms.iter().position(|a| a.stage == stage).unwrap_or(0);
    Ok(Some(AttemptFailure {
        trajectory: attempt_trajectory(st),
        stage: at,
        message: format!("validation failed: {reason}"),
        error_type: Some("ValidationError".to_string()),
        class: Some(ErrorClass::SchemaMismatch),
        category: FailureCategory::Strategy,
        retry_after_ms: None,
    }))
}

/// Validates the outputs of a round that ended before its validation (escalated or failed at a
/// later stage) and marks their steps `valid` or `invalid`, for the learners only: the round's
/// end and its events stay as they are. Without it a call that succeeded in a run that later
/// failed says nothing about its arm, and the arms tried in troubled runs (fallbacks, mostly)
/// are learned from only half as often as they are called.
pub(super) async fn settle_unvalidated(
    ctx: &TreeCtx,
    st: &mut DriverState,
) -> Result<(), DriveError> {
    let pending: Vec<(String, Value)> = st
        .outputs
        .iter()
        .filter(|(stage, _)| {
            st.output_step
                .get(*stage)
                .and_then(|&i| st.steps.get(i))
                .is_some_and(|step| {
                    step.metadata.get("outcome").and_then(Value::as_str) == Some("success")
                })
        })
        .map(|(stage, v)| (stage.clone(), v.clone()))
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    validate_and_mark(ctx, st, pending).await?;
    Ok(())
}

/// Has the validator judge `outputs` (stage, output) and marks each producing step `valid` or
/// `invalid` (what the learners read), with the validator's reason as its error; returns the
/// verdicts.
pub(super) async fn validate_and_mark(
    ctx: &TreeCtx,
    st: &mut DriverState,
    outputs: Vec<(String, Value)>,
) -> Result<Vec<(String, Result<(), String>)>, DriveError> {
    let verdicts = ctx
        .dir
        .validator
        .call(|reply| ValidatorMsg::Validate {
            outputs: outputs.clone(),
            reply,
        })
        .await?;
    for (stage, verdict) in &verdicts {
        let Some(step) = st.output_step.get(stage).and_then(|&i| st.steps.get_mut(i)) else {
            continue;
        };
        let mark = if verdict.is_ok() { "valid" } else { "invalid" };
        step.metadata.insert("outcome".into(), Value::from(mark));
        if let Err(reason) = verdict {
            step.error = Some(reason.clone());
            step.error_class = Some(ErrorClass::SchemaMismatch);
        }
    }
    Ok(verdicts)
}
