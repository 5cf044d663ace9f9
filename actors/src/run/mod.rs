//! One run's driver: carries a run through the lifecycle of DESIGN.md by messages to the actors of
//! the tree (plan, execute stage by stage with a checkpoint after each step, validate, triage and
//! recover, ReflectRetry), then logs the experience and feeds the learners. Every state transition
//! goes through the Orchestrator, which persists it before answering.

mod finish;
mod round;
mod stages;
mod validate;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use hindsight::learn::bandit::Arm;
use hindsight::store::{KvTable, Store};
use hindsight::{
    ArmChoice, Checkpoint, ErrorClass, FailureType, Run, RunState, Step, Task, now_ms,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::directory::CallError;
use crate::memory::MemoryMsg;
use crate::orchestrator::{OrchestratorMsg, RunPatch};
use crate::plugin::{PLUGIN_TIMEOUT, PluginMsg, RunEvent, RunReport, Verdict};
use crate::policy::PlanChoice;
use crate::reflector::ReflectorMsg;
use crate::tree::{Directory, TreeConfig};
use crate::workflow::Workflow;

use finish::finish;
use round::{plugins_verdict, run_round};
pub(crate) use stages::idempotency_key;
use validate::settle_unvalidated;

/// Runs whose experience is logged.
pub const LOGGED: KvTable = KvTable::new("experience_logged");

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
    /// Fault injection into the drivers (actor name `run_driver`, one message per driver
    /// start), if any.
    pub chaos: Option<crate::chaos_hook::ChaosHook>,
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

/// Starts the driver of `run` on its own task, supervised: a driver that returns an error or
/// panics ends its run `failed` with the reason recorded, and the run's callers are answered at
/// once. A driver cancelled because the process is stopping leaves its run to be resumed.
pub fn spawn_driver(ctx: Arc<TreeCtx>, run: Run, task: Task, resume: bool) {
    tokio::spawn(async move {
        let ended = run.clone();
        let run_id = run.run_id.clone();
        let driver = tokio::spawn({
            let ctx = ctx.clone();
            async move { drive(&ctx, run, task, resume).await }
        });
        let outcome = match driver.await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                tracing::error!(run_id = %run_id, error = %e, "run driver failed; the run ends failed");
                RunOutcome::rejected(&ended, e.to_string())
            }
            Err(join) if join.is_panic() => {
                let reason = format!(
                    "the driver of run {run_id} panicked: {}",
                    hindsight::panic_text(join.into_panic().as_ref())
                );
                tracing::error!(run_id = %run_id, "{reason}; the run ends failed");
                RunOutcome::rejected(&ended, reason)
            }
            Err(_) => {
                tracing::debug!(run_id = %run_id, "run driver cancelled; the run resumes at the next start");
                return;
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
    /// A checkpoint of the run does not decode (the run is not restarted from scratch, which
    /// could repeat calls that were made).
    #[error("checkpoint {step} of run {run_id} does not decode: {reason}")]
    Checkpoint {
        /// The run.
        run_id: String,
        /// The checkpoint's step index.
        step: u32,
        /// The decoder's message.
        reason: String,
    },
}

/// Decodes a driver state from a checkpoint.
fn decode_checkpoint(cp: Checkpoint) -> Result<DriverState, DriveError> {
    serde_json::from_value(cp.state).map_err(|e| DriveError::Checkpoint {
        run_id: cp.run_id,
        step: cp.step_index,
        reason: e.to_string(),
    })
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
    if resume && let Some(cp) = ctx.store.latest_checkpoint(&run_id)? {
        st = decode_checkpoint(cp)?;
        resumed = true;
    }
    if let Some(chaos) = &ctx.chaos {
        chaos.on_message();
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
        // Every attempt the run may still make is spent: the last result stands.
        let total = ctx.config.max_total_attempts;
        let spent = total > 0 && st.attempt + 1 >= total;
        match verdict {
            Verdict::Retry { reflection, .. } if state != RunState::Aborted && !spent => {
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
