//! The Orchestrator actor: accepts tasks, owns every run's state machine (the single source of
//! truth of run state transitions, each answered with its write on the way to disk, which the
//! driver awaits before anything a crash could not repeat), starts a driver per
//! run, and answers callers once their run has ended. At start it resumes every run that is not
//! terminal from its last checkpoint. It holds in memory only the runs under way (and a finished
//! one until its end is on disk); the store answers for every run that ended, so a long-lived
//! daemon's memory does not grow with its history.

use std::collections::HashMap;
use std::sync::Arc;

use hindsight::guard::{Guard, redact};
use hindsight::store::{Commit, KvTable, NewDiaryEntry, RunKey, RunRecords, WriteOp};
use hindsight::{Run, RunState, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::chaos_hook::ChaosHook;
use crate::run::{Acceptance, RunOutcome, Start, TreeCtx};

/// A write queued to the store: resolves once it is on disk, or with why it could not be.
pub type Written = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// A transition applied: the run as it now is, and its write on the way to disk.
pub struct Transitioned {
    /// The run after the transition.
    pub run: Run,
    /// The transition's write (with the checkpoint given with it).
    pub written: Written,
}

/// A task's input object as it is stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TaskInput(#[serde(with = "hindsight::store::envelope::as_json")] pub serde_json::Value);

/// Tasks by id, so that a task submitted twice is run once.
pub const TASKS: KvTable = KvTable::new("tasks");
/// Plans given with a task (the API's `/execute`), by run.
pub const FORCED_PLANS: KvTable = KvTable::new("forced_plans");
/// The input objects of tasks that have one, by task id (JSON text: a task record of an earlier
/// build has no input, so it is kept apart from [`TASKS`]).
pub const TASK_INPUTS: KvTable = KvTable::new("task_inputs");
/// The final outcome of every finished run, as the tree of its JSON form
/// ([`WriteOp::put_json`]).
pub const OUTCOMES: KvTable = KvTable::new("outcomes");
/// The outcomes of the runs finished by builds before [`OUTCOMES`], as JSON text: read, no
/// longer written.
pub const OUTCOMES_TEXT: KvTable = KvTable::new("run_outcomes");

/// The per-run records that go with a finished run when the store's run TTL removes it
/// ([`hindsight::store::Store::compact_with`]): its task, its outcome, the plan it was given,
/// its ReflectRetry count and its experience-logged mark.
pub const RUN_RECORDS: [RunRecords; 7] = [
    RunRecords {
        table: TASKS,
        key: RunKey::TaskId,
    },
    RunRecords {
        table: TASK_INPUTS,
        key: RunKey::TaskId,
    },
    RunRecords {
        table: OUTCOMES,
        key: RunKey::RunId,
    },
    RunRecords {
        table: OUTCOMES_TEXT,
        key: RunKey::RunId,
    },
    RunRecords {
        table: FORCED_PLANS,
        key: RunKey::RunId,
    },
    RunRecords {
        table: crate::reflect_retry::RETRY_COUNTS,
        key: RunKey::RunId,
    },
    RunRecords {
        table: crate::run::LOGGED,
        key: RunKey::RunId,
    },
];

/// Reads a stored outcome (kept as the tree of its JSON form: outcomes carry JSON outputs, which
/// postcard cannot decode by themselves), or one an earlier build kept as JSON text.
pub fn read_outcome(
    store: &hindsight::store::Store,
    run_id: &str,
) -> Result<Option<RunOutcome>, String> {
    if let Some(outcome) = store
        .get_json(OUTCOMES, run_id)
        .map_err(|e| e.to_string())?
    {
        return Ok(Some(outcome));
    }
    let text: Option<String> = store
        .get(OUTCOMES_TEXT, run_id)
        .map_err(|e| e.to_string())?;
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| {
            format!("the stored outcome of run {run_id} (table run_outcomes) cannot be read: {e}")
        })
    })
    .transpose()
}

/// Why a submitted task got no outcome.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The guard refused the task at ingress (nothing was run or stored but a diary note).
    #[error("{reason}")]
    Refused {
        /// The task's field at fault (`goal`, `constraints.max_cost`, ...).
        field: String,
        /// Why, in words (redacted like the task).
        reason: String,
    },
    /// The run's record or its end could not be written or read: the store failed.
    #[error("{0}")]
    Store(String),
}

/// What a caller is told when its task could not be run at all.
pub type SubmitResult = Result<RunOutcome, SubmitError>;

pub use hindsight::run::RunPatch;

/// Messages of the orchestrator.
pub enum OrchestratorMsg {
    /// Run a task; answered when its run has ended (or at once if it ended before).
    Submit {
        /// The task.
        task: Box<Task>,
        /// A plan to run instead of asking the policy (the API's `/execute`), if any.
        plan: Option<Vec<hindsight::ArmChoice>>,
        /// Where the outcome goes.
        reply: RpcReplyPort<SubmitResult>,
    },
    /// A driver asks to move its run to `next`; answered once the transition is applied, with
    /// its write, queued to the store in the order of the orchestrator's messages.
    Transition {
        /// The run.
        run_id: String,
        /// The state the driver last had acknowledged.
        from: RunState,
        /// The state asked for.
        next: RunState,
        /// Fields to update with it.
        patch: RunPatch,
        /// A state to go on to from `next` in the same write, if any.
        then: Option<RunState>,
        /// The write of a checkpoint of the run to make in the same transaction, if any.
        checkpoint: Option<WriteOp>,
        /// `Err` when the state machine forbids it or the write cannot be queued.
        reply: RpcReplyPort<Result<Transitioned, String>>,
    },
    /// A driver reports its run's final outcome; answered once it is on disk.
    Finished {
        /// The outcome (its state is terminal), shared: a call re-sent to a restarted
        /// orchestrator sends it again.
        outcome: Arc<RunOutcome>,
        /// Acknowledgement.
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// The run record, if the run exists.
    Get {
        /// The run.
        run_id: String,
        /// The answer.
        reply: RpcReplyPort<Option<Run>>,
    },
    /// The outcome of a finished run, if it finished.
    Outcome {
        /// The run.
        run_id: String,
        /// The answer.
        reply: RpcReplyPort<Option<RunOutcome>>,
    },
    /// How many runs the orchestrator holds in memory: those under way, and those ended whose
    /// end is not on disk yet (the store answers for the others).
    Held {
        /// The answer.
        reply: RpcReplyPort<usize>,
    },
    /// Internal: a finished run's end is on disk; from now on the store answers for it.
    Settled {
        /// The run.
        run_id: String,
    },
}

/// The orchestrator actor.
pub struct Orchestrator;

/// Start-up arguments.
pub struct OrchestratorArgs {
    /// Everything a run needs.
    pub ctx: Arc<TreeCtx>,
    /// Fault injection, if any.
    pub chaos: Option<ChaosHook>,
}

/// The orchestrator's state, reloaded from the store at every (re)start.
pub struct OrchestratorState {
    ctx: Arc<TreeCtx>,
    chaos: Option<ChaosHook>,
    /// The runs under way, and the finished ones whose end is not on disk yet.
    runs: HashMap<String, Run>,
    waiters: HashMap<String, Vec<RpcReplyPort<SubmitResult>>>,
    /// Outcomes of the finished runs still in `runs`.
    outcomes: HashMap<String, Arc<RunOutcome>>,
}

impl Actor for Orchestrator {
    type Msg = OrchestratorMsg;
    type State = OrchestratorState;
    type Arguments = OrchestratorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let ctx = args.ctx;
        crate::applied::after_queued_writes(&ctx.store, "orchestrator").await;
        // Only the unfinished runs, from the store's index of them: a finished run stays on
        // disk (the store answers for it), and a start costs what is under way, not history.
        let mut runs = HashMap::new();
        for run in ctx.store.unfinished_runs()? {
            match run {
                Ok(run) => {
                    runs.insert(run.run_id.clone(), run);
                }
                Err(e) => tracing::error!(error = %e, "a run record cannot be read; skipped"),
            }
        }
        ctx.dir.orchestrator.publish(myself);
        Ok(OrchestratorState {
            ctx,
            chaos: args.chaos,
            runs,
            waiters: HashMap::new(),
            outcomes: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Resume every unfinished run that no live driver is carrying (all of them after a
        // process restart; none of them after a mere restart of this actor).
        let unfinished: Vec<Run> = state
            .runs
            .values()
            .filter(|r| !r.state.is_terminal())
            .cloned()
            .collect();
        for run in unfinished {
            if !state.claim_for_resume(&run.run_id) {
                continue;
            }
            let task: Option<Task> = state.ctx.store.get(TASKS, &run.task_id)?;
            match task {
                Some(mut task) => {
                    task.input = state
                        .ctx
                        .store
                        .get::<TaskInput>(TASK_INPUTS, &run.task_id)?
                        .map(|i| i.0);
                    crate::run::spawn_driver(state.ctx.clone(), run, task, Start::Resume)
                }
                None => {
                    state.ctx.live.release(&run.run_id);
                    tracing::error!(run_id = %run.run_id, "unfinished run has no stored task; left as is");
                }
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        match msg {
            OrchestratorMsg::Submit { task, plan, reply } => {
                state.submit(myself, *task, plan, reply)?
            }
            OrchestratorMsg::Transition {
                run_id,
                from,
                next,
                patch,
                then,
                checkpoint,
                reply,
            } => state.transition(run_id, from, (next, then), patch, checkpoint, reply),
            OrchestratorMsg::Finished { outcome, reply } => state.finished(outcome, reply),
            OrchestratorMsg::Settled { run_id } => state.settled(&run_id),
            OrchestratorMsg::Held { reply } => {
                let _ = reply.send(state.runs.len());
            }
            OrchestratorMsg::Get { run_id, reply } => {
                let run = match state.runs.get(&run_id) {
                    Some(r) => Some(r.clone()),
                    None => state.ctx.store.get_run(&run_id).ok().flatten(),
                };
                let _ = reply.send(run);
            }
            OrchestratorMsg::Outcome { run_id, reply } => {
                let outcome = match state.outcomes.get(&run_id) {
                    Some(o) => Some(RunOutcome::clone(o)),
                    None => read_outcome(&state.ctx.store, &run_id).ok().flatten(),
                };
                let _ = reply.send(outcome);
            }
        }
        Ok(())
    }
}

impl OrchestratorState {
    fn submit(
        &mut self,
        myself: ActorRef<OrchestratorMsg>,
        task: Task,
        plan: Option<Vec<hindsight::ArmChoice>>,
        reply: RpcReplyPort<SubmitResult>,
    ) -> Result<(), ActorProcessingErr> {
        let run_id = crate::run::run_id_for(&task);
        // Whether the task has a run, and whether it ended: in memory for the runs under way,
        // in the store for the ended ones (and for those an earlier incarnation wrote after
        // this one loaded its runs, which this one now holds).
        let ended = match self.runs.get(&run_id) {
            Some(r) => Some(r.state.is_terminal()),
            None => match self.ctx.store.get_run(&run_id) {
                Ok(Some(stored)) => {
                    let ended = stored.state.is_terminal();
                    if !ended {
                        self.runs.insert(run_id.clone(), stored);
                    }
                    Some(ended)
                }
                Ok(None) => None,
                Err(e) => {
                    let _ = reply.send(Err(SubmitError::Store(format!(
                        "cannot read run {run_id} of task {}: {e}",
                        task.task_id
                    ))));
                    return Ok(());
                }
            },
        };
        match ended {
            Some(true) => {
                let outcome = match self.outcomes.get(&run_id) {
                    Some(o) => Ok(Some(RunOutcome::clone(o))),
                    None => read_outcome(&self.ctx.store, &run_id),
                };
                let _ = reply.send(
                    outcome
                        .and_then(|o| {
                            o.ok_or_else(|| {
                                format!(
                                    "run {run_id} of task {} ended but its outcome is not stored",
                                    task.task_id
                                )
                            })
                        })
                        .map_err(SubmitError::Store),
                );
                return Ok(());
            }
            Some(false) => {
                self.waiters.entry(run_id.clone()).or_default().push(reply);
                // A run that is not finished and that no driver carries (its driver was lost)
                // is resumed from its last checkpoint.
                if self.claim_for_resume(&run_id) {
                    if let Some(run) = self.runs.get(&run_id).cloned() {
                        crate::run::spawn_driver(self.ctx.clone(), run, task, Start::Resume);
                    } else {
                        self.ctx.live.release(&run_id);
                    }
                }
                return Ok(());
            }
            None => {}
        }
        // Ingress: a new task is checked (budget ceilings, tool scopes, goal limits, injection)
        // and stored with its PII redacted; a refused one gets the reason and a diary note.
        let task = match Guard::new().check_task(&task, &self.ctx.config.guard) {
            Ok(checked) => checked.task,
            Err(e) => {
                // The reason may quote the task (an injection's excerpt): redacted like it.
                let reason = redact(&format!("refused at ingress: {e}")).text;
                let field = e.field();
                tracing::warn!(task_id = %task.task_id, field = %e.field(), "{reason}");
                let note = NewDiaryEntry {
                    time_ms: now_ms(),
                    run_id: None,
                    kind: "task_refused".to_string(),
                    text: reason.clone(),
                    tags: vec!["ingress".to_string(), e.field()],
                };
                // Answered once the note is on disk (or could not be written).
                let store = self.ctx.store.clone();
                tokio::spawn(async move {
                    let written =
                        async { store.write_batch(vec![WriteOp::diary(&note)?]).await }.await;
                    if let Err(e) = written {
                        tracing::warn!(error = %e, "the refused task's diary note was not written");
                    }
                    let _ = reply.send(Err(SubmitError::Refused { field, reason }));
                });
                return Ok(());
            }
        };
        let run = Run::new(run_id.clone(), &task, now_ms());
        self.runs.insert(run_id.clone(), run.clone());
        self.waiters.entry(run_id.clone()).or_default().push(reply);
        // Its driver starts now, and waits for the record below before its first transition.
        let (accepted, written) = tokio::sync::oneshot::channel();
        if self.ctx.live.claim(&run_id) {
            let acceptance = Acceptance {
                forced: plan.clone(),
                written,
            };
            crate::run::spawn_driver(
                self.ctx.clone(),
                run.clone(),
                task.clone(),
                Start::New(acceptance),
            );
        }
        // Queued now, in the order of the orchestrator's messages: the end of a run whose driver
        // failed at once is queued after its record, never committed before it.
        let queued = (|| {
            let mut ops = vec![
                WriteOp::put(TASKS, &task.task_id, &task)?,
                WriteOp::run(&run)?,
            ];
            if let Some(plan) = &plan {
                ops.push(WriteOp::put(FORCED_PLANS, &run.run_id, plan)?);
            }
            if let Some(input) = &task.input {
                ops.push(WriteOp::put(
                    TASK_INPUTS,
                    &task.task_id,
                    &TaskInput(input.clone()),
                )?);
            }
            Ok::<_, hindsight::store::StoreError>(self.ctx.store.queue_batch(ops, Commit::Synced))
        })();
        tokio::spawn(async move {
            let written = match queued {
                Ok(commit) => commit.await.map(|_| ()),
                Err(e) => Err(e),
            };
            let _ = accepted.send(written.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            if let Err(e) = written {
                // Nothing was acknowledged: the caller learns the task was not accepted.
                tracing::error!(task_id = %task.task_id, error = %e, "cannot record a new run");
                let _ = myself.cast(OrchestratorMsg::Finished {
                    outcome: Arc::new(RunOutcome::rejected(
                        &run,
                        format!("cannot record the run: {e}"),
                    )),
                    reply: ractor::concurrency::oneshot().0.into(),
                });
            }
        });
        Ok(())
    }

    /// Moves a run from `from` to `next`, and on to `then` if given, in one write.
    fn transition(
        &mut self,
        run_id: String,
        from: RunState,
        (next, then): (RunState, Option<RunState>),
        patch: RunPatch,
        checkpoint: Option<WriteOp>,
        reply: RpcReplyPort<Result<Transitioned, String>>,
    ) {
        if !self.runs.contains_key(&run_id) {
            // Written by an earlier incarnation after this one loaded its runs.
            if let Ok(Some(stored)) = self.ctx.store.get_run(&run_id) {
                self.runs.insert(run_id.clone(), stored);
            }
        }
        let Some(run) = self.runs.get_mut(&run_id) else {
            let _ = reply.send(Err(format!("unknown run {run_id}")));
            return;
        };
        // A driver re-sending a transition that already happened (its first answer was lost in
        // a restart) gets the run as it is. A driver's `from` was acknowledged, hence queued
        // for the writer: this incarnation may have loaded the run before that write landed, so
        // the driver's acknowledged history is what the transition is checked against.
        if run.state != next && Some(run.state) != then {
            if run.state != from && from.can_transition_to(next) {
                run.state = from;
            }
            if let Err(e) = run.transition(next, now_ms()) {
                let _ = reply.send(Err(e.to_string()));
                return;
            }
        }
        if let Some(then) = then.filter(|t| *t != run.state)
            && let Err(e) = run.transition(then, now_ms())
        {
            let _ = reply.send(Err(e.to_string()));
            return;
        }
        if let Some(a) = patch.attempts {
            run.attempts = a;
        }
        if patch.plan_id.is_some() {
            run.plan_id = patch.plan_id;
        }
        if patch.sop_id.is_some() {
            run.sop_id = patch.sop_id;
        }
        if patch.reason.is_some() {
            run.reason = patch.reason;
        }
        let snapshot = run.clone();
        // Queued now, in the order of the orchestrator's messages (see `submit`).
        let queued = WriteOp::run(&snapshot).map(|op| {
            let mut ops = vec![op];
            ops.extend(checkpoint);
            self.ctx.store.queue_batch(ops, Commit::Synced)
        });
        let answer = match queued {
            Ok(commit) => Ok(Transitioned {
                written: Box::pin(async move {
                    commit
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("cannot persist run {run_id}: {e}"))
                }),
                run: snapshot,
            }),
            Err(e) => Err(format!("cannot persist run {run_id}: {e}")),
        };
        let _ = reply.send(answer);
    }

    fn finished(&mut self, outcome: Arc<RunOutcome>, reply: RpcReplyPort<Result<(), String>>) {
        let run_id = outcome.run_id.clone();
        // The driver's outcome is authoritative: this incarnation may know the run only from
        // the store, in an earlier state, or not at all yet.
        let mut run = match self.runs.get(&run_id) {
            Some(r) => r.clone(),
            None => match self.ctx.store.get_run(&run_id) {
                Ok(Some(r)) => r,
                _ => {
                    let mut r = Run::new(run_id.clone(), &Task::default(), now_ms());
                    r.task_id = outcome.task_id.clone();
                    r
                }
            },
        };
        if !run.state.is_terminal() {
            if run.transition(outcome.state, now_ms()).is_err() {
                tracing::debug!(run_id = %run_id, from = %run.state, to = %outcome.state, "terminal state recorded from the driver's outcome");
                run.state = outcome.state;
                run.updated_ms = now_ms();
            }
        } else if run.state != outcome.state {
            tracing::warn!(run_id = %run_id, "a run already ended reports another end; the first stands");
        }
        run.attempts = outcome.attempts;
        run.reward = Some(outcome.reward);
        run.plan_id = outcome.plan_id.clone().or(run.plan_id);
        run.sop_id = outcome.sop_id.clone().or(run.sop_id);
        run.reason = outcome.reason.clone();
        self.runs.insert(run_id.clone(), run.clone());
        self.outcomes.insert(run_id.clone(), outcome.clone());
        let waiters = self.waiters.remove(&run_id).unwrap_or_default();
        let store = self.ctx.store.clone();
        let live = self.ctx.live.clone();
        let orchestrator = self.ctx.dir.orchestrator.clone();
        // Queued now, in the order of the orchestrator's messages (see `submit`).
        let queued = (|| {
            // The run's end (`finish_run`) removes its calls' idempotency records in the same
            // commit: once it is on disk they are never repeated, and the table would otherwise
            // grow with every run ever made.
            let ops = vec![
                WriteOp::put_json(OUTCOMES, &run_id, outcome.as_ref())
                    .map_err(|e| e.to_string())?,
                WriteOp::finish_run(&run).map_err(|e| e.to_string())?,
            ];
            Ok::<_, String>(store.queue_batch(ops, Commit::Synced))
        })();
        tokio::spawn(async move {
            let written = match queued {
                Ok(commit) => commit.await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let answer = written
                .map(|_| ())
                .map_err(|e| format!("cannot persist the end of run {run_id}: {e}"));
            live.release(&run_id);
            let _ = reply.send(answer.clone());
            for w in waiters {
                let _ = w.send(match &answer {
                    Ok(()) => Ok(RunOutcome::clone(&outcome)),
                    Err(e) => Err(SubmitError::Store(e.clone())),
                });
            }
            if answer.is_ok() {
                // To the orchestrator running now, not necessarily the one that took the end:
                // a successor that loaded the run before this write still holds it unfinished,
                // and may hold callers waiting for it. One that publishes itself later may also
                // have loaded the run before the write, but the claim is released by then: it
                // finds the run ended when it claims it.
                orchestrator.tell(OrchestratorMsg::Settled { run_id });
            }
        });
    }

    /// Claims a run this incarnation holds unfinished, for a driver to resume it. An earlier
    /// incarnation may have ended it after this one loaded it; an end is written before its
    /// claim is released, so a claim that finds the run ended on disk settles it instead
    /// (its callers get the stored outcome) and returns false.
    fn claim_for_resume(&mut self, run_id: &str) -> bool {
        if !self.ctx.live.claim(run_id) {
            return false;
        }
        match self.ctx.store.get_run(run_id) {
            Ok(Some(stored)) if stored.state.is_terminal() => {
                self.ctx.live.release(run_id);
                self.settled(run_id);
                false
            }
            _ => true,
        }
    }

    /// A finished run's end is on disk: it leaves memory (this incarnation's copy may be one
    /// loaded before the end was written), the store answers for it, and callers still
    /// waiting here get the stored outcome.
    fn settled(&mut self, run_id: &str) {
        self.runs.remove(run_id);
        let held = self.outcomes.remove(run_id);
        let Some(waiters) = self.waiters.remove(run_id) else {
            return;
        };
        let answer = match held {
            Some(outcome) => Ok(Arc::unwrap_or_clone(outcome)),
            None => read_outcome(&self.ctx.store, run_id)
                .and_then(|o| {
                    o.ok_or_else(|| format!("run {run_id} ended but its outcome is not stored"))
                })
                .map_err(SubmitError::Store),
        };
        for w in waiters {
            let _ = w.send(answer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight::store::{Store, StoreOptions};

    fn outcome(run_id: &str) -> RunOutcome {
        let run = Run::new(run_id, &Task::default(), 1);
        RunOutcome {
            state: RunState::Succeeded,
            passed: true,
            reward: 0.75,
            latency_ms: 12.5,
            output: Some(serde_json::json!({
                "extract": {"rows": [1, -2, 2.5, "x", null, true], "id": u64::MAX},
            })),
            ..RunOutcome::rejected(&run, String::new())
        }
    }

    #[tokio::test]
    async fn an_outcome_reads_back_and_so_does_one_an_earlier_build_kept_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let (now, before) = (outcome("run-now"), outcome("run-before"));
        let op = WriteOp::put_json(OUTCOMES, "run-now", &now).unwrap();
        store.queue_batch(vec![op], Commit::Synced).await.unwrap();
        let text = serde_json::to_string(&before).unwrap();
        store.put(OUTCOMES_TEXT, "run-before", &text).await.unwrap();
        assert_eq!(read_outcome(&store, "run-now"), Ok(Some(now)));
        assert_eq!(read_outcome(&store, "run-before"), Ok(Some(before)));
        assert_eq!(read_outcome(&store, "run-never"), Ok(None));
        // A damaged record is an error that names its table and key, not a missing outcome.
        store.put(OUTCOMES, "run-bad", &"not a tree").await.unwrap();
        let err = read_outcome(&store, "run-bad").unwrap_err();
        assert!(
            err.contains("kv.outcomes") && err.contains("run-bad"),
            "{err}"
        );
    }
}
