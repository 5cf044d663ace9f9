//! round: one round of a run: plan (or take the plan given), execute, validate, the plugins'
//! verdict, triage and repair, and what the first attempt teaches the policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use hindsight::{ArmChoice, FailureType, RecoveryAction, RunState, Task};

use crate::orchestrator::RunPatch;
use crate::plugin::{PLUGIN_TIMEOUT, PluginMsg, RunEvent, RunReport, Verdict};
use crate::policy::{PlanChoice, PolicyMsg};

use super::stages::execute_stages;
use super::validate::validate;
use super::{DriveError, DriverState, RecoveryRecord, TreeCtx, checkpoint, transition};

/// The embedder's plugins' answer to a round: the first `Retry` of a plugin that has retries
/// left (counted in `st`) when `may_retry` (ReflectRetry accepted the round), else `Accept`.
/// Every running plugin sees the report; one that is down, fails or does not answer in time
/// accepts.
pub(super) async fn plugins_verdict(
    ctx: &TreeCtx,
    report: &RunReport,
    may_retry: bool,
    st: &mut DriverState,
) -> Verdict {
    let mut verdict = Verdict::Accept;
    for plugin in &ctx.dir.plugins {
        if plugin.slot.current().is_none() {
            continue;
        }
        let answer = plugin
            .slot
            .call_with(
                |reply| PluginMsg::AfterRun(Box::new(report.clone()), reply),
                PLUGIN_TIMEOUT,
                1,
            )
            .await;
        let Ok(Verdict::Retry {
            attempt,
            reflection,
        }) = answer
        else {
            continue;
        };
        if !may_retry {
            continue;
        }
        let used = st.plugin_retries.entry(plugin.name.clone()).or_default();
        if verdict == Verdict::Accept && *used < plugin.max_retries {
            *used += 1;
            verdict = Verdict::Retry {
                attempt,
                reflection,
            };
        } else if *used >= plugin.max_retries {
            tracing::info!(plugin = %plugin.name, run_id = %report.run_id, "retry verdict over the plugin's max_retries; the result stands");
        }
    }
    verdict
}

/// One ReflectRetry round: attempts under the triage loop until success or a terminal recovery.
pub(super) async fn run_round(
    ctx: &TreeCtx,
    run_id: &str,
    task: &Arc<Task>,
    st: &mut DriverState,
) -> Result<(RunState, Option<String>), DriveError> {
    loop {
        if st.plan.is_none() {
            let choice = ctx
                .dir
                .policy
                .call(|reply| PolicyMsg::Choose {
                    task: task.clone(),
                    base: None,
                    exclude: Vec::new(),
                    reply,
                })
                .await?;
            match choice {
                Ok(plan) => {
                    if st.first_arms.is_empty() {
                        st.first_arms = plan.arms.clone();
                        st.explored = !plan.greedy;
                        st.first_greedy = plan.greedy_arms.clone();
                        st.first_plan_id = plan.plan_id.clone();
                    }
                    st.plan = Some(plan);
                }
                Err(reason) => return Ok((RunState::Failed, Some(reason))),
            }
        }
        let Some(plan) = st.plan.clone() else {
            return Ok((RunState::Failed, Some("no plan could be made".to_string())));
        };
        // A run resumed from a checkpoint taken while it executed goes on executing: its plan
        // was acknowledged before the crash and planning it again is no transition the state
        // machine allows.
        if !matches!(st.state, Some(RunState::Planned | RunState::Executing)) {
            transition(
                ctx,
                run_id,
                st,
                RunState::Planned,
                RunPatch {
                    attempts: Some(st.attempt + 1),
                    plan_id: Some(plan.plan_id.clone()),
                    sop_id: plan.sop_id.clone(),
                    reason: None,
                },
            )
            .await?;
        }
        if st.state != Some(RunState::Executing) {
            transition(ctx, run_id, st, RunState::Executing, RunPatch::default()).await?;
        }
        let failure = match execute_stages(ctx, run_id, task, &plan, st).await? {
            Some(f) => f,
            None => {
                transition(ctx, run_id, st, RunState::Validating, RunPatch::default()).await?;
                match validate(ctx, run_id, &plan, st).await? {
                    None => {
                        learn_first_attempt(ctx, run_id, task, st).await;
                        return Ok((RunState::Succeeded, None));
                    }
                    Some(f) => f,
                }
            }
        };
        learn_first_attempt(ctx, run_id, task, st).await;
        transition(ctx, run_id, st, RunState::Recovering, RunPatch::default()).await?;
        let mut rng = fastrand::Rng::with_seed(
            crate::workflow::stable_hash(run_id)
                ^ u64::from(st.attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let counts: BTreeMap<FailureType, u32> =
            st.recoveries.iter().fold(BTreeMap::new(), |mut m, r| {
                *m.entry(r.failure).or_insert(0) += 1;
                m
            });
        let decision = ctx.config.triage.decide(
            task,
            &failure,
            &mut st.policy_state,
            |ft| counts.get(&ft).copied().unwrap_or(0),
            &mut rng,
        );
        st.recoveries.push(RecoveryRecord {
            failure: decision.failure,
            action: decision.action.kind().to_string(),
        });
        st.event(
            ctx,
            run_id,
            RunEvent::Recovery {
                failure: decision.failure.to_string(),
                action: decision.action.kind().to_string(),
            },
        );
        st.recoveries_in_round += 1;
        st.attempt += 1;
        let (cap, total) = (
            ctx.config.max_recovery_attempts,
            ctx.config.max_total_attempts,
        );
        let over = if st.recoveries_in_round > cap {
            Some(format!("max_recovery_attempts ({cap}) exceeded"))
        } else if total > 0 && st.attempt >= total {
            Some(format!("max_total_attempts ({total}) reached"))
        } else {
            None
        };
        if let Some(over) = over {
            return Ok((
                RunState::Escalated,
                Some(format!(
                    "{over}; last failure {} at stage {}: {}",
                    decision.failure, plan.arms[failure.stage].stage, failure.message
                )),
            ));
        }
        let failed_arm = plan.arms[failure.stage].clone();
        match decision.action {
            RecoveryAction::Retry {
                inject: None,
                delay_ms,
                ..
            } => {
                // The same plan again, from the stage that failed; earlier outputs stand. The
                // wait is virtual in a simulated environment and counts as latency.
                st.latency_ms += delay_ms as f64;
                st.rewind_to(&plan, failure.stage);
            }
            RecoveryAction::Retry {
                inject: Some(_),
                hint,
                ..
            } => {
                // Retry with the tool manifest: only arms that fit remain.
                let hint = hint.unwrap_or_else(|| "use only tools that fit".to_string());
                if let Some(end) =
                    repair(ctx, task, st, &plan, &failed_arm, failure.stage, hint).await?
                {
                    return Ok(end);
                }
            }
            RecoveryAction::Replan { hint } => {
                if let Some(end) =
                    repair(ctx, task, st, &plan, &failed_arm, failure.stage, hint).await?
                {
                    return Ok(end);
                }
            }
            RecoveryAction::Resume { from_subgoal } => {
                let at = plan
                    .arms
                    .iter()
                    .position(|a| a.stage == from_subgoal)
                    .unwrap_or(failure.stage);
                st.rewind_to(&plan, at);
            }
            RecoveryAction::Rollback { checkpoint_id } => {
                let restored = match &checkpoint_id {
                    Some(name) => ctx.store.checkpoint_named(run_id, name)?,
                    None => ctx.store.latest_checkpoint(run_id)?,
                };
                let restored = restored.map(super::decode_checkpoint).transpose()?;
                match restored {
                    Some(saved) => {
                        // State and trajectory come back together: the plan, the stage to go
                        // on from, the outputs so far and the steps that produced them.
                        st.plan = saved.plan;
                        st.next_stage = saved.next_stage;
                        st.outputs = saved.outputs;
                        st.output_step = saved.output_step;
                    }
                    None => {
                        return Ok((
                            RunState::Escalated,
                            Some(format!(
                                "rollback asked for checkpoint {} of run {run_id}, which does not exist",
                                checkpoint_id.as_deref().unwrap_or("(latest)")
                            )),
                        ));
                    }
                }
            }
            RecoveryAction::Escalate { message } => {
                return Ok((RunState::Escalated, Some(message)));
            }
            RecoveryAction::Suspend { message, .. } => {
                return Ok((
                    RunState::Escalated,
                    Some(format!("suspended for human approval: {message}")),
                ));
            }
            RecoveryAction::Abort { reason } => return Ok((RunState::Aborted, Some(reason))),
        }
        checkpoint(ctx, run_id, st).await?;
    }
}

/// When the run's first attempt has just ended (passed, failed or rejected by its validator),
/// sends its settled stage outcomes to the policy, which learns them now rather than when the
/// run ends ([`crate::first_attempt`]). A policy that cannot be reached learns them from the
/// logged experience instead.
pub(super) async fn learn_first_attempt(
    ctx: &TreeCtx,
    run_id: &str,
    task: &Task,
    st: &DriverState,
) {
    if st.attempt != 0 {
        return;
    }
    let steps = crate::first_attempt::settled_steps(&st.steps, 0);
    if steps.is_empty() {
        return;
    }
    let _ = ctx
        .dir
        .policy
        .cast(PolicyMsg::FirstAttempt {
            run_id: run_id.to_string(),
            task_id: task.task_id.clone(),
            features: task.features.clone(),
            steps,
        })
        .await;
}

/// Repairs the plan after a failure: the failed arm is ruled out for this run and replaced by
/// the policy's best untried arm of its stage; the stages before it stand. Returns the run's end
/// when no arm is left.
pub(super) async fn repair(
    ctx: &TreeCtx,
    task: &Arc<Task>,
    st: &mut DriverState,
    plan: &PlanChoice,
    failed: &ArmChoice,
    stage: usize,
    hint: String,
) -> Result<Option<(RunState, Option<String>)>, DriveError> {
    st.excluded.push((
        failed.stage.clone(),
        failed.tool.clone(),
        failed.strategy.clone(),
    ));
    st.guidance = Some(hint);
    let repaired = ctx
        .dir
        .policy
        .call(|reply| PolicyMsg::Choose {
            task: task.clone(),
            base: Some(plan.arms.clone()),
            exclude: st.excluded.clone(),
            reply,
        })
        .await?;
    match repaired {
        Ok(p) => {
            st.plan = Some(p);
            st.rewind_to(plan, stage);
            Ok(None)
        }
        Err(reason) => Ok(Some((RunState::Failed, Some(reason)))),
    }
}
