//! machine: the run machine. It carries one run through the lifecycle of DESIGN.md (plan,
//! execute stage by stage, validate, triage and recover, ReflectRetry, the experience) as plain
//! data: [`RunMachine::handle`] takes an [`Event`] (the answer to the last command) and the
//! machine queues the [`Command`]s to perform next, which [`RunMachine::poll`] hands out in order.
//! Commands that need an answer (choose a plan, call a tool, validate, ...) are answered with the
//! matching event; the others (checkpoint, notify, learn) are performed and forgotten. The
//! machine performs no I/O and reads no clock: the tree's driver and the core's
//! [`super::local`] interpreter perform its commands, and given the same answers and the same
//! seed they take the same decisions.

mod agent;
mod procedure;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::learn::bandit::{Arm, StageObservation};
use crate::learn::first_attempt::settled_steps;
use crate::learn::planner::PlanError;
use crate::store::WriteOp;
use crate::{
    ArmChoice, Checkpoint, ErrorClass, ExperienceTuple, FailureCategory, FailureType,
    RecoveryAction, RunResult, RunState, Step, Task, Trajectory,
};

use super::agent::{ModelTurn, TurnOutcome};
use super::call::{Budget, CallOutcome, StageCall};
use super::outcome::{RecoveryRecord, RunOutcome};
use super::plan::PlanChoice;
use super::recovery::{AttemptFailure, TriageSetup};
use super::report::{RunEvent, RunReport, Verdict};
use super::workflow::{Workflow, stable_hash, task_index};

/// The rules a run is carried by: how failures are classified and recovered, and the caps.
#[derive(Debug, Clone)]
pub struct RunRules {
    /// The failure classifier and policy.
    pub triage: Arc<TriageSetup>,
    /// Recoveries per ReflectRetry round before the run is escalated.
    pub max_recovery_attempts: u32,
    /// Attempts per run, all causes together (the first, each recovery, each round ReflectRetry
    /// or a plugin sent back): a recovery past it escalates the run, a round past it is not
    /// started and the last result stands. 0 = no cap; the default, 12, is every attempt the
    /// other defaults allow (three rounds of four), so it binds only when an embedder's plugins
    /// add rounds.
    pub max_total_attempts: u32,
}

impl Default for RunRules {
    fn default() -> Self {
        // The caps' defaults are the configuration's (`[triage]`), stated once there.
        let caps = crate::config::TriageConfig::default();
        RunRules {
            triage: Arc::new(TriageSetup::default()),
            max_recovery_attempts: caps.max_recovery_attempts,
            max_total_attempts: caps.max_total_attempts,
        }
    }
}

impl RunRules {
    /// These rules for runs of `workflow`: a wrong tool is recovered from by retrying with the
    /// manifest of the tools that fit (the failed arm ruled out), the workflow's own unless the
    /// triage setup brought one.
    pub fn for_workflow(mut self, workflow: &Workflow) -> RunRules {
        if !self.triage.has_manifest() {
            self.triage = Arc::new(
                self.triage
                    .as_ref()
                    .clone()
                    .with_manifest(workflow.manifest()),
            );
        }
        self
    }
}

/// Changes asked for along with a transition of the run's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPatch {
    /// Attempts started so far.
    pub attempts: Option<u32>,
    /// The plan in force.
    pub plan_id: Option<String>,
    /// The SOP in force.
    pub sop_id: Option<String>,
    /// Why the run ended.
    pub reason: Option<String>,
}

/// One plugin's answer to a round's report.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginAnswer {
    /// The plugin's name.
    pub name: String,
    /// Retries it may ask for per run.
    pub max_retries: u32,
    /// Its verdict (`None`: it was down, failed or did not answer in time, which accepts).
    pub verdict: Option<Verdict>,
}

/// What the machine asks its interpreter to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Announce the run to the plugins, retrieve what memory holds for it and look up a plan
    /// given with the task; answered by [`Event::Prepared`].
    Prepare,
    /// Choose a plan (`base: None`), or repair `base` by replacing its arms that `exclude` rules
    /// out (stage, tool, strategy); answered by [`Event::Planned`].
    Choose {
        /// The plan to repair.
        base: Option<Vec<ArmChoice>>,
        /// Arms ruled out for this run.
        exclude: Vec<(String, String, String)>,
    },
    /// Move the run from `from` to `next` durably; answered by [`Event::Transitioned`] with the
    /// state recorded.
    Transition {
        /// The state the machine last saw acknowledged.
        from: RunState,
        /// The state to move to.
        next: RunState,
        /// Changes to record with it.
        patch: RunPatch,
        /// A state to go on to from `next` in the same durable write, if any: one the run only
        /// passes through (planned on the way to executing), so that it costs no write of its
        /// own. A performer that records only `next` answers with it, and the machine asks for
        /// the rest.
        then: Option<RunState>,
        /// Whether to write the checkpoint of [`RunMachine::progress`] in the same durable
        /// write (as [`Command::Checkpoint`] would before the next event): the transition to
        /// executing marks the first call in flight in it, when that call is not idempotent,
        /// so that the call needs no write of its own.
        checkpoint: bool,
    },
    /// Write a checkpoint of [`RunMachine::progress`] as it stands when this command is
    /// performed (no answer). Commands are performed in order before the next event, and the
    /// machine changes only on events, so that is the state of the last checkpoint asked for:
    /// one asked for twice before an event is queued once.
    Checkpoint,
    /// Show an event to the plugins (no answer).
    Notify(RunEvent),
    /// Teach the policy the settled stage outcomes of the run's first attempt, as soon as it
    /// ended (no answer).
    LearnFirstAttempt(Vec<(u32, Vec<StageObservation>)>),
    /// Call a tool (a tool stage's, or one an agent's model asked for); answered by
    /// [`Event::Called`].
    Call(Box<StageCall>),
    /// Ask an agent stage's model for its next turn; answered by [`Event::Turned`].
    Turn(Box<ModelTurn>),
    /// Validate these stage outputs; answered by [`Event::Validated`].
    Validate(Vec<(String, Value)>),
    /// Read the run's checkpoint of this name (the latest when `None`); answered by
    /// [`Event::CheckpointLoaded`].
    LoadCheckpoint(Option<String>),
    /// Have ReflectRetry and the plugins judge the round; answered by [`Event::Reviewed`].
    Review(RunReport),
    /// The run is over: record its end, log the experience, answer the callers.
    Finish(Box<Finished>),
}

/// The end of a run: what the caller gets and the experience the learners get.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// What the caller gets.
    pub outcome: RunOutcome,
    /// The experience tuple to log.
    pub experience: ExperienceTuple,
}

/// What the interpreter answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The answer to [`Command::Prepare`].
    Prepared {
        /// Citations of the memory items retrieved.
        citations: Vec<String>,
        /// What memory and the lessons suggest for the first attempt.
        guidance: Option<String>,
        /// A plan given with the task, to be run as given.
        forced: Option<Vec<ArmChoice>>,
    },
    /// The answer to [`Command::Choose`].
    Planned(Result<PlanChoice, PlanError>),
    /// The answer to [`Command::Transition`]: the state now recorded.
    Transitioned(RunState),
    /// The answer to [`Command::Call`].
    Called {
        /// What the call did.
        outcome: CallOutcome,
        /// When it ended (ms since the epoch).
        at_ms: u64,
    },
    /// The answer to [`Command::Turn`].
    Turned {
        /// What the model did.
        outcome: TurnOutcome,
        /// When it ended (ms since the epoch).
        at_ms: u64,
    },
    /// The answer to [`Command::Validate`]: a verdict per stage.
    Validated(Vec<(String, Result<(), String>)>),
    /// The answer to [`Command::LoadCheckpoint`].
    CheckpointLoaded(Option<Checkpoint>),
    /// The answer to [`Command::Review`].
    Reviewed {
        /// ReflectRetry's verdict (`Accept` when it did not answer).
        reflect_retry: Verdict,
        /// The embedder's plugins' answers, in their order.
        plugins: Vec<PluginAnswer>,
        /// When the round was judged (ms since the epoch).
        at_ms: u64,
    },
}

/// Why the machine cannot go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
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
    /// A checkpoint could not be encoded.
    #[error("checkpoint of run {run_id} cannot be encoded: {reason}")]
    Encode {
        /// The run.
        run_id: String,
        /// The encoder's message.
        reason: String,
    },
    /// A transition the run's state machine forbids.
    #[error(transparent)]
    Transition(#[from] crate::TransitionError),
    /// The machine waits for an answer to no command (a fault in the machine or its
    /// interpreter).
    #[error("run {0}: the run machine stopped without ending the run")]
    Stalled(String),
    /// An event came that answers no command the machine is waiting on.
    #[error("run {run_id}: {event} does not answer what the run waits for ({waiting})")]
    Unexpected {
        /// The run.
        run_id: String,
        /// The event's kind.
        event: &'static str,
        /// What the machine waits for.
        waiting: &'static str,
    },
}

/// What a run has done so far: everything a checkpoint holds, so that a run resumes where it
/// was.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunProgress {
    /// 0-based attempt over all rounds.
    pub attempt: u32,
    /// 1-based ReflectRetry round.
    pub round: u32,
    /// Recovery attempts in the current round.
    #[serde(default, skip_serializing_if = "is_default")]
    pub recoveries_in_round: u32,
    /// The plan in force.
    pub plan: Option<PlanChoice>,
    /// The first attempt's arms.
    pub first_arms: Vec<ArmChoice>,
    /// Whether the first plan explored.
    pub explored: bool,
    /// The policy's greedy plan when it chose the first plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_greedy: Vec<Arm>,
    /// The first plan's id (`sop:<id>@<version>` when it followed an SOP).
    pub first_plan_id: String,
    /// The next stage to run in this attempt.
    pub next_stage: usize,
    /// The step (index into `steps`) that produced each completed stage's output in this
    /// attempt: the output is that step's `tool_output` ([`RunProgress::output`]), kept once.
    /// Written as `outputs_at`; a checkpoint of an earlier build has it as `output_step`, next
    /// to a copy of the outputs ([`decode`]).
    #[serde(
        default,
        rename = "outputs_at",
        alias = "output_step",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub output_step: BTreeMap<String, usize>,
    /// A stage of a non-idempotent tool whose call was started and not seen to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<usize>,
    /// Arms ruled out by recoveries in this round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<(String, String, String)>,
    /// The reflection or hint to plan with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guidance: Option<String>,
    /// Latency over every call.
    #[serde(default, skip_serializing_if = "is_default")]
    pub latency_ms: f64,
    /// Cost over every call.
    #[serde(default, skip_serializing_if = "is_default")]
    pub cost: f64,
    /// Tool calls made (retries included; replays excluded).
    #[serde(default, skip_serializing_if = "is_default")]
    pub tool_calls: u32,
    /// Tool errors by class.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_errors: BTreeMap<ErrorClass, u32>,
    /// The recoveries made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<RecoveryRecord>,
    /// ReflectRetry rounds that sent the run back.
    #[serde(default, skip_serializing_if = "is_default")]
    pub reflect_retries: u32,
    /// The run state last acknowledged.
    pub state: Option<RunState>,
    /// The failure policy's per-run counters.
    #[serde(default, skip_serializing_if = "is_default")]
    pub policy_state: crate::triage::policy::PolicyState,
    /// Citations of what memory retrieved for the run. Not checkpointed, as `context`.
    #[serde(default, skip_serializing)]
    pub citations: Vec<String>,
    /// Events of the current round (for ReflectRetry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<RunEvent>,
    /// Retries each of the embedder's plugins asked for, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugin_retries: BTreeMap<String, u32>,
    /// Every step of every attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// What memory and the lessons say about the task (the fenced lessons and the cited
    /// retrieval), which an agent's system message carries. Not checkpointed (about half of a
    /// planned run's checkpoint): a resumed run is prepared again and takes what memory and
    /// the lessons say then, and an agent stage in progress has it in its conversation.
    #[serde(default, skip_serializing)]
    pub context: Option<String>,
    /// The conversation of the agent stage in progress (empty between stages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<crate::model::ChatMessage>,
    /// Tool calls of the model's last turn not made yet, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_calls: Vec<crate::model::ToolCall>,
    /// Model turns of the agent stage in progress.
    #[serde(default, skip_serializing_if = "is_default")]
    pub turn: u32,
    /// Tool calls of the agent stage in progress.
    #[serde(default, skip_serializing_if = "is_default")]
    pub stage_calls: u32,
    /// Where the agent stage in progress is in the procedure its plan follows, if it follows
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub following: Option<Following>,
    /// Whether the run's procedure stopped (a step failed) and the model carries on from there.
    #[serde(default, skip_serializing_if = "is_default")]
    pub procedure_dropped: bool,
}

/// Whether a value is its type's default: a zero count or sum, a flag off, counters untouched
/// (left out of a checkpoint, and read back as such).
fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Where an agent stage is in the procedure it follows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Following {
    /// The next call (0-based).
    pub next: usize,
    /// The results of the calls made so far.
    pub results: Vec<Value>,
}

impl RunProgress {
    /// The output of `stage` in this attempt, if it completed.
    pub fn output(&self, stage: &str) -> Option<&Value> {
        self.output_step
            .get(stage)
            .and_then(|&i| self.steps.get(i))
            .and_then(|step| step.tool_output.as_ref())
    }

    /// The outputs of the completed stages of this attempt, by stage name.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.output_step.iter().filter_map(|(stage, &i)| {
            let output = self.steps.get(i)?.tool_output.as_ref()?;
            Some((stage.as_str(), output))
        })
    }

    /// Goes back to stage `at` of `plan`: the outputs of the stages before it stand.
    fn rewind_to(&mut self, plan: &PlanChoice, at: usize) {
        let later: Vec<&str> = plan
            .arms
            .iter()
            .skip(at)
            .map(|a| a.stage.as_str())
            .collect();
        self.output_step
            .retain(|stage, _| !later.contains(&stage.as_str()));
        self.next_stage = at;
        self.conversation.clear();
        self.pending_calls.clear();
    }

    /// The steps of the current attempt, as a trajectory for the classifier.
    fn attempt_trajectory(&self) -> Trajectory {
        let mut t = Trajectory::default();
        for s in self.steps.iter().filter(|s| {
            s.metadata.get("attempt").and_then(Value::as_u64) == Some(u64::from(self.attempt))
        }) {
            t.push(s.clone());
        }
        t
    }

    /// Marks each producing step of `verdicts` `valid` or `invalid` (what the learners read),
    /// with the validator's reason as its error.
    fn mark(&mut self, verdicts: &[(String, Result<(), String>)]) {
        for (stage, verdict) in verdicts {
            let Some(step) = self
                .output_step
                .get(stage)
                .and_then(|&i| self.steps.get_mut(i))
            else {
                continue;
            };
            let mark = if verdict.is_ok() { "valid" } else { "invalid" };
            step.metadata.insert("outcome".into(), Value::from(mark));
            if let Err(reason) = verdict {
                step.error = Some(reason.clone());
                step.error_class = Some(ErrorClass::SchemaMismatch);
            }
        }
    }

    /// Outputs that succeeded and were not validated yet.
    fn unvalidated(&self) -> Vec<(String, Value)> {
        self.output_step
            .iter()
            .filter_map(|(stage, &i)| {
                let step = self.steps.get(i)?;
                let succeeded =
                    step.metadata.get("outcome").and_then(Value::as_str) == Some("success");
                succeeded.then_some((stage.clone(), step.tool_output.clone()?))
            })
            .collect()
    }
}

/// Where the machine waits, and what it goes on with when the answer comes.
#[derive(Debug, Clone, Default)]
enum Phase {
    /// Not started.
    #[default]
    Idle,
    /// For [`Event::Prepared`].
    Preparing,
    /// For the first plan of an attempt.
    Planning,
    /// For a repaired plan after the failure of stage `stage` of `old`.
    Repairing { old: PlanChoice, stage: usize },
    /// For a transition, then `then`.
    Moving(After),
    /// For the call of stage `stage`.
    Calling { stage: usize, call: Box<StageCall> },
    /// For the model's turn at agent stage `stage`.
    Turning { stage: usize },
    /// For the validation of an attempt's outputs.
    Validating,
    /// For the validation of outputs left unvalidated by a round that ended in `end`.
    Settling { end: RoundEnd },
    /// For the checkpoint to roll back to (the latest when `None`).
    RollingBack { checkpoint: Option<String> },
    /// For the round's verdicts.
    Reviewing { end: RoundEnd },
    /// The run is over.
    Done,
}

/// What comes after an acknowledged transition.
#[derive(Debug, Clone)]
enum After {
    Planned,
    Executing,
    Validating,
    Recovering(Box<AttemptFailure>),
    NextRound,
}

/// How a round ended.
#[derive(Debug, Clone)]
struct RoundEnd {
    state: RunState,
    reason: Option<String>,
}

/// One run's machine. See the module's documentation.
pub struct RunMachine {
    run_id: String,
    task: Arc<Task>,
    workflow: Arc<Workflow>,
    rules: Arc<RunRules>,
    st: RunProgress,
    resumed: bool,
    /// The stage this incarnation marked in flight in the checkpoint written with its
    /// transition to executing, and has not called yet (so it is not taken for a call in doubt).
    marked: Option<usize>,
    phase: Phase,
    out: VecDeque<Command>,
}

impl RunMachine {
    /// A machine for a new run of `task`.
    pub fn new(
        run_id: impl Into<String>,
        task: Arc<Task>,
        workflow: Arc<Workflow>,
        rules: Arc<RunRules>,
    ) -> RunMachine {
        RunMachine {
            run_id: run_id.into(),
            task,
            workflow,
            rules,
            st: RunProgress {
                round: 1,
                ..RunProgress::default()
            },
            resumed: false,
            marked: None,
            phase: Phase::Idle,
            out: VecDeque::new(),
        }
    }

    /// A machine that goes on from `checkpoint` (a run resumed after a crash).
    pub fn resume(
        run_id: impl Into<String>,
        task: Arc<Task>,
        workflow: Arc<Workflow>,
        rules: Arc<RunRules>,
        checkpoint: Checkpoint,
    ) -> Result<RunMachine, RunError> {
        let mut m = RunMachine::new(run_id, task, workflow, rules);
        m.st = decode(checkpoint)?;
        m.resumed = true;
        Ok(m)
    }

    /// What the run has done so far.
    pub fn progress(&self) -> &RunProgress {
        &self.st
    }

    /// The checkpoint record of `progress` for this run at `created_ms`.
    pub fn checkpoint_of(
        run_id: &str,
        progress: &RunProgress,
        created_ms: u64,
    ) -> Result<Checkpoint, RunError> {
        let state = serde_json::to_value(progress).map_err(|e| RunError::Encode {
            run_id: run_id.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Checkpoint {
            run_id: run_id.to_string(),
            step_index: progress.steps.len() as u32,
            name: None,
            state,
            completed_steps: Vec::new(),
            created_ms,
        })
    }

    /// The store's write of the checkpoint [`RunMachine::checkpoint_of`] makes, encoded straight
    /// from `progress` (no JSON value is built on the way; it reads back as that checkpoint).
    pub fn checkpoint_write(
        run_id: &str,
        progress: &RunProgress,
        created_ms: u64,
    ) -> Result<WriteOp, RunError> {
        WriteOp::checkpoint_of_state(run_id, progress.steps.len() as u32, progress, created_ms)
            .map_err(|e| RunError::Encode {
                run_id: run_id.to_string(),
                reason: e.to_string(),
            })
    }

    /// The next command to perform, if any; `None` while the machine waits for an answer (or
    /// when the run is over). Starts the run on its first call.
    pub fn poll(&mut self) -> Option<Command> {
        if matches!(self.phase, Phase::Idle) {
            self.phase = Phase::Preparing;
            self.out.push_back(Command::Prepare);
        }
        self.out.pop_front()
    }

    /// Whether `command` may be performed before the writes asked for ahead of it (the run's
    /// acceptance, transitions, checkpoints) are on disk. Only what a crash that loses those
    /// writes may have done again: a retrieval and a choice, which read; a model turn; the call
    /// of an idempotent tool (a non-idempotent one is marked in flight by a checkpoint that
    /// must be on disk first, so that a crash leaves it in doubt instead of repeated); and a
    /// transition or a checkpoint, which the store writes after them. Whatever else follows
    /// (a non-idempotent call, a notice, a lesson taught, a validation, a review, the end) waits
    /// until they are on disk.
    pub fn may_run_ahead(&self, command: &Command) -> bool {
        match command {
            Command::Prepare
            | Command::Choose { .. }
            | Command::Turn(_)
            | Command::Transition { .. }
            | Command::Checkpoint => true,
            Command::Call(call) => self.workflow.is_idempotent(&call.tool),
            _ => false,
        }
    }

    /// Whether the run is over (its [`Command::Finish`] was issued).
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Takes the answer to the command the machine waits on.
    pub fn handle(&mut self, event: Event) -> Result<(), RunError> {
        let phase = std::mem::take(&mut self.phase);
        match (phase, event) {
            (
                Phase::Preparing,
                Event::Prepared {
                    citations,
                    guidance,
                    forced,
                },
            ) => {
                self.st.citations = citations;
                self.st.context = guidance;
                if let Some(arms) = forced
                    && self.st.plan.is_none()
                    && self.st.first_arms.is_empty()
                {
                    // A plan given with the task (the API's `/execute`) is run as given.
                    let plan = PlanChoice::new(arms, None, true);
                    self.st.first_arms = plan.arms.clone();
                    self.st.first_plan_id = plan.plan_id.clone();
                    self.st.plan = Some(plan);
                }
                self.attempt_start();
            }
            (Phase::Planning, Event::Planned(choice)) => match choice {
                Ok(plan) => {
                    if self.st.first_arms.is_empty() {
                        self.st.first_arms = plan.arms.clone();
                        self.st.explored = !plan.greedy;
                        self.st.first_greedy = plan.greedy_arms.clone();
                        self.st.first_plan_id = plan.plan_id.clone();
                    }
                    self.st.plan = Some(plan);
                    self.attempt_start();
                }
                Err(reason) => self.round_end(RunState::Failed, Some(reason.to_string())),
            },
            (Phase::Repairing { old, stage }, Event::Planned(choice)) => match choice {
                Ok(plan) => {
                    self.st.plan = Some(plan);
                    self.st.rewind_to(&old, stage);
                    self.checkpoint();
                    self.attempt_start();
                }
                Err(reason) => self.round_end(RunState::Failed, Some(reason.to_string())),
            },
            (Phase::Moving(after), Event::Transitioned(state)) => {
                self.st.state = Some(state);
                match after {
                    After::Planned => self.after_planned(),
                    After::Executing => self.run_stages(),
                    After::Validating => self.validate(),
                    After::Recovering(failure) => self.recover(*failure),
                    After::NextRound => {
                        self.checkpoint();
                        self.attempt_start();
                    }
                }
            }
            (Phase::Calling { stage, call }, Event::Called { outcome, at_ms }) => {
                self.called(stage, *call, outcome, at_ms)
            }
            (Phase::Turning { stage }, Event::Turned { outcome, at_ms }) => {
                self.turned(stage, outcome, at_ms)
            }
            (Phase::Validating, Event::Validated(verdicts)) => self.validated(verdicts),
            (Phase::Settling { end }, Event::Validated(verdicts)) => {
                self.st.mark(&verdicts);
                self.review(end);
            }
            (Phase::RollingBack { checkpoint }, Event::CheckpointLoaded(found)) => match found {
                Some(cp) => {
                    // State and trajectory come back together: the plan, the stage to go on
                    // from, the outputs so far and the steps that produced them.
                    let saved = decode(cp)?;
                    self.st.plan = saved.plan;
                    self.st.next_stage = saved.next_stage;
                    self.st.output_step = saved.output_step;
                    self.st.conversation = saved.conversation;
                    self.st.pending_calls = saved.pending_calls;
                    self.st.turn = saved.turn;
                    self.st.stage_calls = saved.stage_calls;
                    self.checkpoint();
                    self.attempt_start();
                }
                None => {
                    self.round_end(
                        RunState::Escalated,
                        Some(format!(
                            "rollback asked for checkpoint {} of run {}, which does not exist",
                            checkpoint.as_deref().unwrap_or("(latest)"),
                            self.run_id
                        )),
                    );
                }
            },
            (
                Phase::Reviewing { end },
                Event::Reviewed {
                    reflect_retry,
                    plugins,
                    at_ms,
                },
            ) => self.reviewed(end, reflect_retry, plugins, at_ms),
            (phase, event) => {
                let waiting = phase.name();
                self.phase = phase;
                return Err(RunError::Unexpected {
                    run_id: self.run_id.clone(),
                    event: event.name(),
                    waiting,
                });
            }
        }
        Ok(())
    }

    fn wait(&mut self, phase: Phase, command: Command) {
        self.phase = phase;
        self.out.push_back(command);
    }

    fn checkpoint(&mut self) {
        self.out.retain(|c| !matches!(c, Command::Checkpoint));
        self.out.push_back(Command::Checkpoint);
    }

    fn event(&mut self, event: RunEvent) {
        self.out.push_back(Command::Notify(event.clone()));
        self.st.events.push(event);
    }

    fn transition(&mut self, next: RunState, patch: RunPatch, after: After) {
        self.transition_on(next, None, patch, after);
    }

    /// A transition to `next` that goes on to `then` in the same write, if given; one that
    /// goes on to executing writes the checkpoint of the next call with it, when that call
    /// needs one (see [`RunMachine::mark_next_call`]).
    fn transition_on(
        &mut self,
        next: RunState,
        then: Option<RunState>,
        patch: RunPatch,
        after: After,
    ) {
        let from = self.st.state.unwrap_or(RunState::Received);
        let checkpoint = then == Some(RunState::Executing) && self.mark_next_call();
        self.wait(
            Phase::Moving(after),
            Command::Transition {
                from,
                next,
                patch,
                then,
                checkpoint,
            },
        );
    }

    /// Marks the plan's next stage in flight ahead of the transition to executing when it is a
    /// tool stage whose call is not idempotent (the checkpoint that must precede such a call is
    /// then written with the transition); true when it did. A stage found in flight already
    /// (a resumed run's) is left to [`RunMachine::run_stages`], which holds it in doubt.
    fn mark_next_call(&mut self) -> bool {
        let i = self.st.next_stage;
        let Some(arm) = self.st.plan.as_ref().and_then(|p| p.arms.get(i)) else {
            return false;
        };
        if self.workflow.agent(&arm.stage).is_some()
            || self.workflow.is_idempotent(&arm.tool)
            || self.st.in_flight == Some(i)
        {
            return false;
        }
        self.st.in_flight = Some(i);
        self.marked = Some(i);
        true
    }

    /// An attempt begins (or goes on after a resume): a plan, then its transitions.
    fn attempt_start(&mut self) {
        let Some(plan) = self.st.plan.clone() else {
            self.wait(
                Phase::Planning,
                Command::Choose {
                    base: None,
                    exclude: Vec::new(),
                },
            );
            return;
        };
        // A run resumed from a checkpoint taken while it executed goes on executing: its plan
        // was acknowledged before the crash and planning it again is no transition the state
        // machine allows.
        if !matches!(self.st.state, Some(RunState::Planned | RunState::Executing)) {
            let patch = RunPatch {
                attempts: Some(self.st.attempt + 1),
                plan_id: Some(plan.plan_id.clone()),
                sop_id: plan.sop_id.clone(),
                reason: None,
            };
            // Planned on the way to executing, in one write.
            self.transition_on(
                RunState::Planned,
                Some(RunState::Executing),
                patch,
                After::Planned,
            );
            return;
        }
        self.after_planned();
    }

    fn after_planned(&mut self) {
        if self.st.state != Some(RunState::Executing) {
            self.transition(RunState::Executing, RunPatch::default(), After::Executing);
            return;
        }
        self.run_stages();
    }

    /// Calls the plan's next stage, or validates when every stage ran.
    fn run_stages(&mut self) {
        let Some(plan) = self.st.plan.clone() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        let i = self.st.next_stage;
        let Some(arm) = plan.arms.get(i).cloned() else {
            self.transition(RunState::Validating, RunPatch::default(), After::Validating);
            return;
        };
        if let Some(agent) = self.workflow.agent(&arm.stage).cloned() {
            self.run_agent(i, arm, &agent);
            return;
        }
        let idempotent = self.workflow.is_idempotent(&arm.tool);
        // Marked in flight by this incarnation with its transition to executing: checkpointed
        // already, and not called yet.
        let marked = self.marked.take() == Some(i);
        if self.st.in_flight == Some(i) && !idempotent && !marked {
            self.in_doubt(i, &arm.stage, &arm.tool, "");
            return;
        }
        if !idempotent && !marked {
            self.st.in_flight = Some(i);
            self.checkpoint();
        }
        let call = StageCall {
            run_id: self.run_id.clone(),
            task_index: task_index(&self.task),
            attempt: self.st.attempt,
            stage: arm.stage.clone(),
            tool: arm.tool.clone(),
            args: self.workflow.args(&arm.stage, &arm.tool, &arm.strategy),
            features: self.task.features.clone(),
            idempotency_key: crate::store::idempotency::call_key(
                &self.run_id,
                self.st.attempt,
                &arm.stage,
            ),
            budget: Budget::remaining(&self.task.constraints, self.st.latency_ms, self.st.cost),
            turn: 0,
            call: 0,
            input: self.task.input.clone(),
            tenant: self.task.tenant.clone(),
        };
        self.wait(
            Phase::Calling {
                stage: i,
                call: Box::new(call.clone()),
            },
            Command::Call(Box::new(call)),
        );
    }

    fn called(&mut self, i: usize, call: StageCall, outcome: CallOutcome, at_ms: u64) {
        let Some(arm) = self.st.plan.as_ref().and_then(|p| p.arms.get(i)).cloned() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        if let Some(agent) = self.workflow.agent(&arm.stage).cloned() {
            self.agent_called(i, arm, &agent, call, outcome, at_ms);
            return;
        }
        let mut step = self.call_step(&arm, &call, &outcome, at_ms);
        let st = &mut self.st;
        st.in_flight = None;
        match outcome.result {
            Ok(value) => {
                step.tool_output = Some(value);
                step.metadata
                    .insert("outcome".into(), Value::from("success"));
                st.steps.push(step);
                st.output_step.insert(arm.stage.clone(), st.steps.len() - 1);
                st.next_stage += 1;
                self.event(RunEvent::StepSucceeded {
                    stage: arm.stage.clone(),
                    tool: arm.tool.clone(),
                });
                self.checkpoint();
                self.run_stages();
            }
            Err(err) => {
                step.error = Some(err.message.clone());
                step.error_class = Some(err.class);
                step.exception_type = Some(err.class.to_string());
                step.metadata
                    .insert("outcome".into(), Value::from(err.category.as_str()));
                st.steps.push(step);
                self.event(RunEvent::Error {
                    stage: arm.stage.clone(),
                    tool: arm.tool.clone(),
                    class: err.class,
                    message: err.message.clone(),
                });
                self.checkpoint();
                self.attempt_failed(AttemptFailure {
                    trajectory: self.st.attempt_trajectory(),
                    stage: i,
                    message: err.message,
                    error_type: Some(err.class.to_string()),
                    class: Some(err.class),
                    category: err.category,
                    retry_after_ms: err.retry_after_ms,
                    classified: None,
                });
            }
        }
    }

    /// A non-idempotent call of stage `i` was started before a crash and its end was never seen:
    /// it is in doubt, and repeating it silently could do it twice. The failure policy decides.
    fn in_doubt(&mut self, i: usize, stage: &str, tool: &str, when: &str) {
        self.st.in_flight = None;
        self.st.pending_calls.clear();
        let message = format!(
            "the call of {tool} at stage {stage}{when} was in flight when the process stopped; its outcome is in doubt"
        );
        self.event(RunEvent::Error {
            stage: stage.to_string(),
            tool: tool.to_string(),
            class: ErrorClass::DeterministicFailure,
            message: message.clone(),
        });
        self.attempt_failed(AttemptFailure {
            trajectory: self.st.attempt_trajectory(),
            stage: i,
            message,
            error_type: Some("InDoubt".to_string()),
            class: None,
            category: FailureCategory::Unknown,
            retry_after_ms: None,
            classified: None,
        });
    }

    /// The step of a call's outcome; the run's latency, cost, calls and errors count it.
    fn call_step(
        &mut self,
        arm: &ArmChoice,
        call: &StageCall,
        outcome: &CallOutcome,
        at_ms: u64,
    ) -> Step {
        let st = &mut self.st;
        st.latency_ms += outcome.latency_ms;
        st.cost += outcome.cost;
        st.tool_calls += outcome.calls;
        for class in &outcome.error_classes {
            *st.tool_errors.entry(*class).or_insert(0) += 1;
        }
        let mut step = Step {
            index: st.steps.len() as u32,
            action: "tool_call".to_string(),
            tool_called: Some(call.tool.clone()),
            tool_input: Some(call.args.clone()),
            timestamp_ms: at_ms,
            latency_ms: outcome.latency_ms,
            cost: outcome.cost,
            idempotent: self.workflow.is_idempotent(&call.tool),
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
        step
    }

    fn validate(&mut self) {
        let Some(plan) = &self.st.plan else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        let outputs: Vec<(String, Value)> = plan
            .arms
            .iter()
            .filter_map(|a| {
                self.st
                    .output(&a.stage)
                    .map(|v| (a.stage.clone(), v.clone()))
            })
            .collect();
        self.wait(Phase::Validating, Command::Validate(outputs));
    }

    fn validated(&mut self, verdicts: Vec<(String, Result<(), String>)>) {
        self.st.mark(&verdicts);
        let first_invalid = verdicts
            .into_iter()
            .find_map(|(stage, v)| v.err().map(|reason| (stage, reason)));
        let Some((stage, reason)) = first_invalid else {
            self.event(RunEvent::Validation {
                passed: true,
                reason: None,
            });
            self.learn_first_attempt();
            self.round_end(RunState::Succeeded, None);
            return;
        };
        self.event(RunEvent::Validation {
            passed: false,
            reason: Some(reason.clone()),
        });
        let at = self
            .st
            .plan
            .as_ref()
            .and_then(|p| p.arms.iter().position(|a| a.stage == stage))
            .unwrap_or(0);
        self.attempt_failed(AttemptFailure {
            trajectory: self.st.attempt_trajectory(),
            stage: at,
            message: format!("validation failed: {reason}"),
            error_type: Some("ValidationError".to_string()),
            class: Some(ErrorClass::SchemaMismatch),
            category: FailureCategory::Strategy,
            retry_after_ms: None,
            classified: None,
        });
    }

    /// When the run's first attempt has just ended (passed, failed or rejected by its
    /// validator), its settled stage outcomes go to the policy, which learns them now rather
    /// than when the run ends ([`crate::learn::first_attempt`]).
    fn learn_first_attempt(&mut self) {
        if self.st.attempt != 0 {
            return;
        }
        let steps = settled_steps(&self.st.steps, 0);
        if !steps.is_empty() {
            self.out.push_back(Command::LearnFirstAttempt(steps));
        }
    }

    fn attempt_failed(&mut self, failure: AttemptFailure) {
        self.learn_first_attempt();
        self.transition(
            RunState::Recovering,
            RunPatch::default(),
            After::Recovering(Box::new(failure)),
        );
    }

    /// Triage: the failure is classified and the failure policy picks the recovery, within the
    /// caps.
    fn recover(&mut self, failure: AttemptFailure) {
        let Some(plan) = self.st.plan.clone() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        let mut rng = fastrand::Rng::with_seed(
            stable_hash(&self.run_id)
                ^ u64::from(self.st.attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let counts: BTreeMap<FailureType, u32> =
            self.st.recoveries.iter().fold(BTreeMap::new(), |mut m, r| {
                *m.entry(r.failure).or_insert(0) += 1;
                m
            });
        let decision = self.rules.triage.decide(
            &self.task,
            &failure,
            &mut self.st.policy_state,
            |ft| counts.get(&ft).copied().unwrap_or(0),
            &mut rng,
        );
        self.st.recoveries.push(RecoveryRecord {
            failure: decision.failure,
            action: decision.action.kind().to_string(),
        });
        self.event(RunEvent::Recovery {
            failure: decision.failure.to_string(),
            action: decision.action.kind().to_string(),
        });
        self.st.recoveries_in_round += 1;
        self.st.attempt += 1;
        let (cap, total) = (
            self.rules.max_recovery_attempts,
            self.rules.max_total_attempts,
        );
        let over = if self.st.recoveries_in_round > cap {
            Some(format!("max_recovery_attempts ({cap}) exceeded"))
        } else if total > 0 && self.st.attempt >= total {
            Some(format!("max_total_attempts ({total}) reached"))
        } else {
            None
        };
        let stage_name = plan
            .arms
            .get(failure.stage)
            .map(|a| a.stage.clone())
            .unwrap_or_default();
        if let Some(over) = over {
            self.round_end(
                RunState::Escalated,
                Some(format!(
                    "{over}; last failure {} at stage {stage_name}: {}",
                    decision.failure, failure.message
                )),
            );
            return;
        }
        let Some(failed_arm) = plan.arms.get(failure.stage).cloned() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        if self.workflow.agent(&failed_arm.stage).is_some()
            && self.recover_agent(&plan, &failed_arm, &failure, &decision.action)
        {
            return;
        }
        match decision.action {
            RecoveryAction::Retry {
                inject: None,
                delay_ms,
                ..
            } => {
                // The same plan again, from the stage that failed; earlier outputs stand. The
                // wait is virtual in a simulated environment and counts as latency.
                self.st.latency_ms += delay_ms as f64;
                self.st.rewind_to(&plan, failure.stage);
            }
            RecoveryAction::Retry {
                inject: Some(_),
                hint,
                ..
            } => {
                // Retry with the tool manifest: only arms that fit remain.
                let hint = hint.unwrap_or_else(|| "use only tools that fit".to_string());
                self.repair(plan, &failed_arm, failure.stage, Some(hint));
                return;
            }
            RecoveryAction::Replan { hint } => {
                self.repair(plan, &failed_arm, failure.stage, Some(hint));
                return;
            }
            RecoveryAction::Resume { from_subgoal } => {
                let at = plan
                    .arms
                    .iter()
                    .position(|a| a.stage == from_subgoal)
                    .unwrap_or(failure.stage);
                self.st.rewind_to(&plan, at);
            }
            RecoveryAction::Rollback { checkpoint_id } => {
                self.wait(
                    Phase::RollingBack {
                        checkpoint: checkpoint_id.clone(),
                    },
                    Command::LoadCheckpoint(checkpoint_id),
                );
                return;
            }
            RecoveryAction::Escalate { message } => {
                self.round_end(RunState::Escalated, Some(message));
                return;
            }
            RecoveryAction::Suspend { message, .. } => {
                self.round_end(
                    RunState::Escalated,
                    Some(format!("suspended for human approval: {message}")),
                );
                return;
            }
            RecoveryAction::Abort { reason } => {
                self.round_end(RunState::Aborted, Some(reason));
                return;
            }
        }
        self.checkpoint();
        self.attempt_start();
    }

    /// Repairs the plan after a failure: the failed arm is ruled out for this run and replaced
    /// by the policy's best untried arm of its stage; the stages before it stand.
    fn repair(&mut self, plan: PlanChoice, failed: &ArmChoice, stage: usize, hint: Option<String>) {
        self.st.excluded.push((
            failed.stage.clone(),
            failed.tool.clone(),
            failed.strategy.clone(),
        ));
        self.st.guidance = hint;
        let command = Command::Choose {
            base: Some(plan.arms.clone()),
            exclude: self.st.excluded.clone(),
        };
        self.wait(Phase::Repairing { old: plan, stage }, command);
    }

    /// The round is over: outputs left unvalidated are validated for the learners, then
    /// ReflectRetry and the plugins judge the round.
    fn round_end(&mut self, state: RunState, reason: Option<String>) {
        let end = RoundEnd { state, reason };
        if state != RunState::Succeeded {
            // Without it a call that succeeded in a run that later failed says nothing about its
            // arm, and the arms tried in troubled runs (fallbacks, mostly) are learned from only
            // half as often as they are called.
            let pending = self.st.unvalidated();
            if !pending.is_empty() {
                self.wait(Phase::Settling { end }, Command::Validate(pending));
                return;
            }
        }
        self.review(end);
    }

    fn review(&mut self, end: RoundEnd) {
        let report = RunReport {
            run_id: self.run_id.clone(),
            round: self.st.round,
            passed: end.state == RunState::Succeeded,
            events: self.st.events.clone(),
        };
        self.wait(Phase::Reviewing { end }, Command::Review(report));
    }

    /// ReflectRetry's verdict, else the first `Retry` of a plugin with retries left, sends the
    /// run back for another round while attempts remain; otherwise the run ends.
    fn reviewed(
        &mut self,
        end: RoundEnd,
        reflect_retry: Verdict,
        plugins: Vec<PluginAnswer>,
        at_ms: u64,
    ) {
        let may_retry = reflect_retry == Verdict::Accept;
        let mut theirs = Verdict::Accept;
        for answer in plugins {
            let Some(Verdict::Retry {
                attempt,
                reflection,
            }) = answer.verdict
            else {
                continue;
            };
            if !may_retry {
                continue;
            }
            let used = self.st.plugin_retries.entry(answer.name).or_default();
            if theirs == Verdict::Accept && *used < answer.max_retries {
                *used += 1;
                theirs = Verdict::Retry {
                    attempt,
                    reflection,
                };
            }
        }
        let verdict = match reflect_retry {
            Verdict::Accept => theirs,
            retry => retry,
        };
        // Every attempt the run may still make is spent: the last result stands.
        let total = self.rules.max_total_attempts;
        let spent = total > 0 && self.st.attempt + 1 >= total;
        match verdict {
            Verdict::Retry { reflection, .. } if end.state != RunState::Aborted && !spent => {
                let st = &mut self.st;
                st.reflect_retries += 1;
                st.round += 1;
                st.recoveries_in_round = 0;
                st.attempt += 1;
                st.guidance = Some(reflection);
                st.events.clear();
                st.excluded.clear();
                st.plan = None;
                st.next_stage = 0;
                st.output_step.clear();
                st.conversation.clear();
                st.pending_calls.clear();
                if end.state == RunState::Succeeded {
                    // The run passed its stages but its validator rejected it: back to
                    // recovering.
                    self.transition(RunState::Recovering, RunPatch::default(), After::NextRound);
                } else {
                    self.checkpoint();
                    self.attempt_start();
                }
            }
            _ => self.finish(end, at_ms),
        }
    }

    fn finish(&mut self, end: RoundEnd, at_ms: u64) {
        // The run is over: its steps move into what it ends with, its outputs are copied
        // from them (the steps keep theirs for the experience log).
        let passed = end.state == RunState::Succeeded;
        let output = passed.then(|| {
            Value::Object(
                self.st
                    .outputs()
                    .map(|(stage, v)| (stage.to_string(), v.clone()))
                    .collect(),
            )
        });
        let steps = std::mem::take(&mut self.st.steps);
        let st = &self.st;
        let reward = self.workflow.reward(passed, st.latency_ms, st.cost);
        let plan = st.plan.as_ref();
        let outcome = RunOutcome {
            run_id: self.run_id.clone(),
            task_id: self.task.task_id.clone(),
            state: end.state,
            passed,
            attempts: st.attempt + 1,
            reflect_retries: st.reflect_retries,
            plan_id: plan.map(|p| p.plan_id.clone()),
            sop_id: plan.and_then(|p| p.sop_id.clone()),
            arms: st.first_arms.clone(),
            final_arms: plan.map(|p| p.arms.clone()).unwrap_or_default(),
            reward,
            latency_ms: st.latency_ms,
            cost: st.cost,
            output: output.clone(),
            reason: end.reason,
            recoveries: st.recoveries.clone(),
            tool_calls: st.tool_calls,
            tool_errors: st.tool_errors.clone(),
            resumed: self.resumed,
            explored: st.explored,
            citations: st.citations.clone(),
            greedy_arms: st.first_greedy.clone(),
        };
        let experience = ExperienceTuple {
            run_id: self.run_id.clone(),
            task_id: self.task.task_id.clone(),
            plan_id: st.first_plan_id.clone(),
            user_id: self.task.user_id.clone(),
            context_features: self.task.features.clone(),
            arms: st.first_arms.clone(),
            steps,
            result: RunResult {
                state: end.state,
                passed,
                output,
                latency_ms: st.latency_ms,
                cost: st.cost,
                attempts: st.attempt + 1,
            },
            reward,
            user_feedback: None,
            time_ms: at_ms,
        };
        self.wait(
            Phase::Done,
            Command::Finish(Box::new(Finished {
                outcome,
                experience,
            })),
        );
    }
}

/// Decodes a run's progress from a checkpoint.
fn decode(cp: Checkpoint) -> Result<RunProgress, RunError> {
    // A checkpoint of an earlier build names the producing steps `output_step` and holds the
    // outputs themselves as `outputs` (left out when empty); a retried round cleared those and
    // not the steps' names, so a stage without an output there has none.
    let held: Option<BTreeSet<String>> = cp.state.get("output_step").map(|_| {
        cp.state
            .get("outputs")
            .and_then(Value::as_object)
            .map(|outputs| outputs.keys().cloned().collect())
            .unwrap_or_default()
    });
    let mut st: RunProgress =
        serde_json::from_value(cp.state).map_err(|e| RunError::Checkpoint {
            run_id: cp.run_id,
            step: cp.step_index,
            reason: e.to_string(),
        })?;
    if let Some(held) = held {
        st.output_step.retain(|stage, _| held.contains(stage));
    }
    Ok(st)
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "nothing (not started)",
            Phase::Preparing => "preparation",
            Phase::Planning | Phase::Repairing { .. } => "a plan",
            Phase::Moving(_) => "a transition",
            Phase::Calling { .. } => "a tool call",
            Phase::Turning { .. } => "a model turn",
            Phase::Validating | Phase::Settling { .. } => "a validation",
            Phase::RollingBack { .. } => "a checkpoint",
            Phase::Reviewing { .. } => "the round's verdicts",
            Phase::Done => "nothing (the run is over)",
        }
    }
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Prepared { .. } => "prepared",
            Event::Planned(_) => "planned",
            Event::Transitioned(_) => "transitioned",
            Event::Called { .. } => "called",
            Event::Turned { .. } => "turned",
            Event::Validated(_) => "validated",
            Event::CheckpointLoaded(_) => "checkpoint loaded",
            Event::Reviewed { .. } => "reviewed",
        }
    }
}
