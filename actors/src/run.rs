//! One run's driver: carries a run through the lifecycle of DESIGN.md by messages to the actors of
//! the tree (plan, execute stage by stage with a checkpoint after each step, validate, triage and
//! recover, ReflectRetry), then logs the experience and feeds the learners. Every state transition
//! goes through the Orchestrator, which persists it before answering.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use hindsight::learn::bandit::Arm;
use hindsight::store::{KvTable, Store, WriteOp};

/// Runs whose experience is logged.
pub const LOGGED: KvTable = KvTable::new("experience_logged");
use hindsight::{
    ArmChoice, Checkpoint, ErrorClass, ExperienceTuple, FailureCategory, FailureType,
    RecoveryAction, Run, RunResult, RunState, Step, Task, Trajectory, now_ms,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::directory::CallError;
use crate::executor::{CallOutcome, ExecutorMsg, StageCall};
use crate::memory::MemoryMsg;
use crate::orchestrator::{OrchestratorMsg, RunPatch};
use crate::plugin::{PLUGIN_TIMEOUT, PluginMsg, RunEvent, RunReport, Verdict};
use crate::policy::{PlanChoice, PolicyMsg};
use crate::reflector::ReflectorMsg;
use crate::tree::{Directory, TreeConfig};
use crate::validator::ValidatorMsg;
use crate::workflow::Workflow;

/// Everything a run's driver needs: the store, the live actors, the workflow and configuration.
pub struct TreeCtx {
    /// The database.
    pub store: Store,
    /// The live actors.
    pub dir: Directory,
    /// Runs that have a live driver.
    pub live: LiveRuns,
    /// The stages and arms tasks are planned from.
    pub workflow: Arc<Workflow>,
    /// Limits and switches.
    pub config: TreeConfig,
}

/// The set of runs that have a live driver, so that no run is ever driven twice.
#[derive(Clone, Default)]
pub struct LiveRuns(Arc<Mutex<HashSet<String>>>);

impl LiveRuns {
    /// Marks `run_id` as driven; false if it already was.
    pub fn claim(&self, run_id: &str) -> bool {
        match self.0.lock() {
            Ok(mut set) => set.insert(run_id.to_string()),
            Err(poisoned) => poisoned.into_inner().insert(run_id.to_string()),
        }
    }

    /// Marks `run_id` as no longer driven.
    pub fn release(&self, run_id: &str) {
        match self.0.lock() {
            Ok(mut set) => set.remove(run_id),
            Err(poisoned) => poisoned.into_inner().remove(run_id),
        };
    }

    /// How many runs are being driven.
    pub fn len(&self) -> usize {
        match self.0.lock() {
            Ok(set) => set.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        }
    }

    /// Whether no run is being driven.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The run id of a task (one run per task id: resubmitting a task joins its run).
pub fn run_id_for(task: &Task) -> String {
    format!("run-{}", task.task_id)
}

/// A recovery the triage loop chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// The failure type.
    pub failure: FailureType,
    /// The action kind (`retry`, `replan`, ...).
    pub action: String,
}

/// How a run ended, with its provenance: what the caller gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: String,
    /// The task.
    pub task_id: String,
    /// The terminal state.
    pub state: RunState,
    /// Whether the output passed validation.
    pub passed: bool,
    /// Attempts made (all rounds).
    pub attempts: u32,
    /// ReflectRetry rounds that sent the run back.
    pub reflect_retries: u32,
    /// The plan of the last attempt.
    pub plan_id: Option<String>,
    /// The SOP used, if any.
    pub sop_id: Option<String>,
    /// The arms of the first attempt, with propensities.
    pub arms: Vec<ArmChoice>,
    /// The arms of the last attempt.
    pub final_arms: Vec<ArmChoice>,
    /// The reward.
    pub reward: f64,
    /// Latency summed over every call.
    pub latency_ms: f64,
    /// Cost summed over every call.
    pub cost: f64,
    /// The final output, stage by stage.
    pub output: Option<Value>,
    /// Why it did not succeed, if it did not.
    pub reason: Option<String>,
    /// The recoveries made.
    pub recoveries: Vec<RecoveryRecord>,
    /// Tool calls made (retries included; replays excluded).
    pub tool_calls: u32,
    /// Tool errors by class.
    pub tool_errors: BTreeMap<ErrorClass, u32>,
    /// Whether the run was resumed after a crash.
    pub resumed: bool,
    /// Whether the first plan was an exploration (not the policy's greedy choice).
    pub explored: bool,
    /// Citations of the memory items retrieved for the run.
    #[serde(default)]
    pub citations: Vec<String>,
    /// The policy's greedy plan when it chose the first plan (empty when the plan was given):
    /// what its beliefs alone would have planned.
    #[serde(default)]
    pub greedy_arms: Vec<Arm>,
}

impl RunOutcome {
    /// The outcome of a run that could not even be recorded.
    pub fn rejected(run: &Run, reason: String) -> RunOutcome {
        RunOutcome {
            run_id: run.run_id.clone(),
            task_id: run.task_id.clone(),
            state: RunState::Failed,
            passed: false,
            attempts: 0,
            reflect_retries: 0,
            plan_id: None,
            sop_id: None,
            arms: Vec::new(),
            final_arms: Vec::new(),
            reward: 0.0,
            latency_ms: 0.0,
            cost: 0.0,
            output: None,
            reason: Some(reason),
            recoveries: Vec::new(),
            tool_calls: 0,
            tool_errors: BTreeMap::new(),
            resumed: false,
            explored: false,
            citations: Vec::new(),
            greedy_arms: Vec::new(),
        }
    }
}

/// What a driver persists in every checkpoint, so that a run resumes where it was.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct DriverState {
    /// 0-based attempt over all rounds.
    attempt: u32,
    /// 1-based ReflectRetry round.
    round: u32,
    /// Recovery attempts in the current round.
    recoveries_in_round: u32,
    /// The plan in force.
    plan: Option<PlanChoice>,
    /// The first attempt's arms.
    first_arms: Vec<ArmChoice>,
    /// Whether the first plan explored.
    explored: bool,
    /// The policy's greedy plan when it chose the first plan.
    #[serde(default)]
    first_greedy: Vec<Arm>,
    /// The first plan's id (`sop:<id>@<version>` when it followed an SOP).
    first_plan_id: String,
    /// The next stage to run in this attempt.
    next_stage: usize,
    /// Outputs of the completed stages of this attempt.
    outputs: BTreeMap<String, Value>,
    /// The step (index into `steps`) that produced each output.
    output_step: BTreeMap<String, usize>,
    /// A stage of a non-idempotent tool whose call was started and not seen to end.
    in_flight: Option<usize>,
    /// Arms ruled out by recoveries in this round.
    excluded: Vec<(String, String, String)>,
    /// The reflection or hint to plan with.
    guidance: Option<String>,
    /// Totals over every call.
    latency_ms: f64,
    cost: f64,
    tool_calls: u32,
    tool_errors: BTreeMap<ErrorClass, u32>,
    recoveries: Vec<RecoveryRecord>,
    reflect_retries: u32,
    /// The run state the orchestrator last acknowledged.
    state: Option<RunState>,
    /// The failure policy's per-run counters.
    policy_state: hindsight::triage::policy::PolicyState,
    /// Citations of what memory retrieved for the run.
    citations: Vec<String>,
    /// Events of the current round (for ReflectRetry).
    events: Vec<RunEvent>,
    /// Retries each of the embedder's plugins asked for, by name.
    #[serde(default)]
    plugin_retries: BTreeMap<String, u32>,
    /// Every step of every attempt.
    steps: Vec<Step>,
}

impl DriverState {
    /// Records an event of the current round and shows it to the embedder's plugins (one that
    /// is down misses it: a run never waits for an observer).
    fn event(&mut self, ctx: &TreeCtx, run_id: &str, event: RunEvent) {
        for plugin in &ctx.dir.plugins {
            plugin
                .slot
                .tell(PluginMsg::Event(run_id.to_string(), event.clone()));
        }
        self.events.push(event);
    }

    /// Goes back to stage `at` of `plan`: the outputs of the stages before it stand.
    fn rewind_to(&mut self, plan: &PlanChoice, at: usize) {
        let later: Vec<&str> = plan
            .arms
            .iter()
            .skip(at)
            .map(|a| a.stage.as_str())
            .collect();
        self.outputs
            .retain(|stage, _| !later.contains(&stage.as_str()));
        self.output_step
            .retain(|stage, _| !later.contains(&stage.as_str()));
        self.next_stage = at;
    }
}

use crate::recovery::AttemptFailure;

/// Starts the driver of `run` on its own task.
pub fn spawn_driver(ctx: Arc<TreeCtx>, run: Run, task: Task, resume: bool) {
    tokio::spawn(async move {
        let run_id = run.run_id.clone();
        let outcome = match drive(&ctx, run, task, resume).await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "run driver failed; the run ends failed");
                let run = Run {
                    run_id: run_id.clone(),
                    ..Run::new(run_id.clone(), &Task::default(), now_ms())
                };
                RunOutcome::rejected(&run, e.to_string())
            }
        };
        let finished = ctx
            .dir
            .orchestrator
            .call_with(
                |reply| OrchestratorMsg::Finished {
                    outcome: Box::new(outcome.clone()),
                    reply,
                },
                crate::directory::DEFAULT_CALL_TIMEOUT,
                1_000,
            )
            .await;
        match finished {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(run_id = %run_id, error = %e, "the end of the run was not recorded")
            }
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "the orchestrator did not take the end of the run")
            }
        }
    });
}

/// Errors that end a driver early (the run then ends failed, with this reason).
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// An actor of the tree could not be reached.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] hindsight::store::StoreError),
    /// The orchestrator refused a transition.
    #[error("{0}")]
    Transition(String),
}

/// Asks the orchestrator for a transition; `st.state` is the state it last acknowledged.
async fn transition(
    ctx: &TreeCtx,
    run_id: &str,
    st: &mut DriverState,
    next: RunState,
    patch: RunPatch,
) -> Result<Run, DriveError> {
    let from = st.state.unwrap_or(RunState::Received);
    let answer = ctx
        .dir
        .orchestrator
        .call(|reply| OrchestratorMsg::Transition {
            run_id: run_id.to_string(),
            from,
            next,
            patch: patch.clone(),
            reply,
        })
        .await?;
    let run = answer.map_err(DriveError::Transition)?;
    st.state = Some(run.state);
    Ok(run)
}

async fn checkpoint(ctx: &TreeCtx, run_id: &str, st: &DriverState) -> Result<(), DriveError> {
    let state = serde_json::to_value(st).map_err(|e| DriveError::Transition(e.to_string()))?;
    let cp = Checkpoint {
        run_id: run_id.to_string(),
        step_index: st.steps.len() as u32,
        name: None,
        state,
        completed_steps: Vec::new(),
        created_ms: now_ms(),
    };
    ctx.store.put_checkpoint(&cp).await?;
    Ok(())
}

/// Drives one run to its end.
async fn drive(
    ctx: &TreeCtx,
    run: Run,
    task: Task,
    resume: bool,
) -> Result<RunOutcome, DriveError> {
    let run_id = run.run_id.clone();
    let task = Arc::new(task);
    let mut st = DriverState {
        round: 1,
        ..DriverState::default()
    };
    let mut resumed = false;
    if resume
        && let Some(cp) = ctx.store.latest_checkpoint(&run_id)?
        && let Ok(saved) = serde_json::from_value::<DriverState>(cp.state)
    {
        st = saved;
        resumed = true;
    }
    let _ = ctx
        .dir
        .reflect_retry
        .cast(PluginMsg::BeforeRun(Box::new((*task).clone())))
        .await;
    for plugin in &ctx.dir.plugins {
        plugin
            .slot
            .tell(PluginMsg::BeforeRun(Box::new((*task).clone())));
    }
    let mut bundle = ctx
        .dir
        .memory
        .call(|reply| MemoryMsg::Retrieve {
            task: task.clone(),
            reply,
        })
        .await?;
    // The lessons of the task's scope, fenced, join the retrieval (a reflector that cannot
    // answer leaves the run without them rather than failing it).
    bundle.strategy_context = ctx
        .dir
        .reflector
        .call_with_timeout(
            |reply| ReflectorMsg::Context {
                task: task.clone(),
                reply,
            },
            crate::plugin::PLUGIN_TIMEOUT,
        )
        .await
        .ok()
        .flatten();
    st.citations = bundle.citations();
    if st.guidance.is_none() {
        st.guidance = bundle.guidance();
    }
    if st.plan.is_none() && st.first_arms.is_empty() {
        // A plan given with the task (the API's `/execute`) is run as given.
        let forced: Option<Vec<ArmChoice>> =
            ctx.store.get(crate::orchestrator::FORCED_PLANS, &run_id)?;
        if let Some(arms) = forced {
            let plan = PlanChoice::new(arms, None, true);
            st.first_arms = plan.arms.clone();
            st.first_plan_id = plan.plan_id.clone();
            st.plan = Some(plan);
        }
    }
    loop {
        let (state, reason) = run_round(ctx, &run_id, &task, &mut st).await?;
        if state != RunState::Succeeded {
            settle_unvalidated(ctx, &mut st).await?;
        }
        let report = RunReport {
            run_id: run_id.clone(),
            round: st.round,
            passed: state == RunState::Succeeded,
            events: st.events.clone(),
        };
        // A crashing plugin never fails the run: no verdict means the result stands.
        let verdict = ctx
            .dir
            .reflect_retry
            .call_with_timeout(
                |reply| PluginMsg::AfterRun(Box::new(report.clone()), reply),
                PLUGIN_TIMEOUT,
            )
            .await
            .unwrap_or(Verdict::Accept);
        // The embedder's plugins see every round's report; one of them may send the run back
        // when ReflectRetry did not.
        let theirs = plugins_verdict(ctx, &report, verdict == Verdict::Accept, &mut st).await;
        let verdict = match verdict {
            Verdict::Accept => theirs,
            retry => retry,
        };
        match verdict {
            Verdict::Retry { reflection, .. } if state != RunState::Aborted => {
                st.reflect_retries += 1;
                st.round += 1;
                st.recoveries_in_round = 0;
                st.attempt += 1;
                st.guidance = Some(reflection);
                st.events.clear();
                st.excluded.clear();
                st.plan = None;
                st.next_stage = 0;
                st.outputs.clear();
                if state == RunState::Succeeded {
                    // The run passed its stages but its validator rejected it: back to recovering.
                    transition(
                        ctx,
                        &run_id,
                        &mut st,
                        RunState::Recovering,
                        RunPatch::default(),
                    )
                    .await?;
                }
                checkpoint(ctx, &run_id, &st).await?;
            }
            _ => return finish(ctx, &run_id, &task, st, state, reason, resumed).await,
        }
    }
}

/// The embedder's plugins' answer to a round: the first `Retry` of a plugin that has retries
/// left (counted in `st`) when `may_retry` (ReflectRetry accepted the round), else `Accept`.
/// Every running plugin sees the report; one that is down, fails or does not answer in time
/// accepts.
async fn plugins_verdict(
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
async fn run_round(
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
        let cap = ctx.config.max_recovery_attempts;
        if st.recoveries_in_round > cap {
            return Ok((
                RunState::Escalated,
                Some(format!(
                    "max_recovery_attempts ({cap}) exceeded; last failure {} at stage {}: {}",
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
                let restored =
                    restored.and_then(|cp| serde_json::from_value::<DriverState>(cp.state).ok());
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
async fn learn_first_attempt(ctx: &TreeCtx, run_id: &str, task: &Task, st: &DriverState) {
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
async fn repair(
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

/// The idempotency key of one stage call of one attempt.
pub(crate) fn idempotency_key(run_id: &str, attempt: u32, stage: &str) -> String {
    hindsight::store::idempotency::call_key(run_id, attempt, stage)
}

/// Runs the plan's stages from `st.next_stage`, checkpointing after each step. Returns the
/// failure that ended the attempt, if one did.
async fn execute_stages(
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
fn attempt_trajectory(st: &DriverState) -> Trajectory {
    let mut t = Trajectory::default();
    for s in st.steps.iter().filter(|s| {
        s.metadata.get("attempt").and_then(Value::as_u64) == Some(u64::from(st.attempt))
    }) {
        t.push(s.clone());
    }
    t
}

/// Validates every output of the attempt, marks each producing step `valid` or `invalid` (what
/// the learners read), and returns the first invalid stage as the failure.
async fn validate(
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
async fn settle_unvalidated(ctx: &TreeCtx, st: &mut DriverState) -> Result<(), DriveError> {
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
async fn validate_and_mark(
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

/// Ends the run: the experience is logged durably, the learners are fed, a diary note written.
async fn finish(
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
