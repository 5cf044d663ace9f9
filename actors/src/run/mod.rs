//! The tree's run interpreter: performs the commands of one run's [`RunMachine`] by messages to
//! the actors of the tree (the policy plans, the executor calls, the validator judges, the
//! orchestrator applies every transition and queues its write, ReflectRetry and the plugins
//! review each round) and feeds their answers back, until the run ends; then logs the experience
//! and feeds the learners. Every decision is the machine's; this module only performs effects.
//!
//! A run's writes (its acceptance, transitions and checkpoints) go to the store in order, and
//! the driver waits for them to land only before a command that a crash losing them could not
//! repeat ([`RunMachine::may_run_ahead`]): a model turn or an idempotent tool's call starts
//! while the writes before it are being synced, and nothing a crash could not repeat (a
//! non-idempotent call, a validation, a review, the end) follows until they are on disk.

mod finish;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use hindsight::run::{Command, Event, PluginAnswer, RunError, RunMachine, RunProgress};
use hindsight::store::{Commit, KvTable, Store};
use hindsight::{Run, Task, now_ms};

use crate::directory::CallError;
use crate::memory::MemoryMsg;
use crate::orchestrator::OrchestratorMsg;
use crate::plugin::{PLUGIN_TIMEOUT, PluginMsg, Verdict};
use crate::policy::PolicyMsg;
use crate::tree::{Directory, TreeConfig};
use crate::validator::ValidatorMsg;
use hindsight::run::Workflow;

use finish::finish;
pub use hindsight::run::{RecoveryRecord, RunOutcome};

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
    /// Calls from drivers to each of the tree's shared actors in flight
    /// ([`SHARED_CALLS_IN_FLIGHT`] each).
    pub gates: Gates,
    /// The reflector's lessons as last published, which a run reads for its task's context.
    pub lessons: Arc<crate::lesson_board::LessonBoard>,
    /// Set when the tree is being stopped: a driver whose actors went away then leaves its run
    /// to be resumed at the next start instead of ending it.
    pub stopping: std::sync::atomic::AtomicBool,
}

/// Calls from run drivers to each of the tree's shared actors (policy, memory, orchestrator,
/// validator, ReflectRetry) in flight at once. Each of them answers one message
/// at a time: a burst of drivers (10,000 runs resumed after a crash, a flood of submissions)
/// would otherwise queue in their mailboxes past the calls' timeouts and end runs failed for
/// no fault of theirs. A driver waits for its turn here, where no timeout runs; a call's timeout
/// starts when it is sent. Each actor has its own gate, so that runs at different steps keep
/// every actor busy at once (the retrievals of a burst do not hold its choices and transitions
/// back). The width is the store's group commit ([`hindsight::store::MAX_BATCH`]): the
/// transitions in flight are written in one commit, and the actors answer a burst's messages
/// together (memory searches the queries that reach it at once in one pass), so a narrower gate
/// only cuts a burst into more commits and passes; at tens of microseconds a message, a full
/// gate waits well under a second in any one mailbox. Tool calls and model turns are not gated:
/// they wait on the world, not on the tree.
pub const SHARED_CALLS_IN_FLIGHT: usize = hindsight::store::MAX_BATCH;

/// One [`Gate`] per shared actor a driver calls (see [`SHARED_CALLS_IN_FLIGHT`]).
pub struct Gates {
    /// Memory's retrievals.
    pub memory: Gate,
    /// The policy's choices.
    pub policy: Gate,
    /// The orchestrator's transitions and finishes.
    pub orchestrator: Gate,
    /// The validator's checks.
    pub validator: Gate,
    /// ReflectRetry's reviews.
    pub reflect_retry: Gate,
}

impl Gates {
    /// Gates that each let `n` calls through at once.
    pub fn new(n: usize) -> Gates {
        Gates {
            memory: Gate::new(n),
            policy: Gate::new(n),
            orchestrator: Gate::new(n),
            validator: Gate::new(n),
            reflect_retry: Gate::new(n),
        }
    }
}

/// At most so many futures in flight at once; the others wait their turn, first come first
/// served.
pub struct Gate(tokio::sync::Semaphore);

impl Gate {
    /// A gate that lets `n` through at once.
    pub fn new(n: usize) -> Gate {
        Gate(tokio::sync::Semaphore::new(n))
    }

    /// Performs `work` in its turn.
    pub async fn run<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        // The semaphore is never closed; were it, the work goes ahead ungated.
        let _turn = self.0.acquire().await.ok();
        work.await
    }
}

/// The set of runs that have a live driver, so that no run is ever driven twice.
#[derive(Clone, Default)]
pub struct LiveRuns(Arc<Mutex<HashSet<String>>>);

impl LiveRuns {
    fn runs(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        match self.0.lock() {
            Ok(runs) => runs,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Marks `run_id` as driven; false if it already was.
    pub fn claim(&self, run_id: &str) -> bool {
        self.runs().insert(run_id.to_string())
    }

    /// Marks `run_id` as no longer driven.
    pub fn release(&self, run_id: &str) {
        self.runs().remove(run_id);
    }

    /// How many runs are being driven.
    pub fn len(&self) -> usize {
        self.runs().len()
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

/// A new run's acceptance, which its driver may get ahead of: it retrieves, plans and does what a
/// crash may repeat while the run's record is written ([`RunMachine::may_run_ahead`]).
pub struct Acceptance {
    /// The plan given with the task, if any (the store's copy may not be written yet).
    pub forced: Option<Vec<hindsight::ArmChoice>>,
    /// Answers once the run's record and task are on disk, or why they could not be written.
    pub written: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

/// How a driver starts.
pub enum Start {
    /// A run just received, whose record is being written.
    New(Acceptance),
    /// A run on disk, resumed from its last checkpoint.
    Resume,
}

/// Starts the driver of `run` on its own task, supervised: a driver that returns an error or
/// panics ends its run `failed` with the reason recorded, and the run's callers are answered at
/// once. A driver cancelled because the process is stopping leaves its run to be resumed; one
/// whose run could not be recorded ends quietly (the orchestrator answers its callers).
pub fn spawn_driver(ctx: Arc<TreeCtx>, run: Run, task: Task, start: Start) {
    let ended = run.clone();
    let run_id = run.run_id.clone();
    // Spawned here rather than by the supervising task below, whose state then need not hold
    // room for the driver's future: with 10,000 runs resumed at once, each byte of the tasks
    // waiting on their drivers is 10 KB of fresh memory to fault in and zero.
    let driver = tokio::spawn({
        let ctx = ctx.clone();
        async move { drive(&ctx, run, task, start).await }
    });
    tokio::spawn(async move {
        let outcome = match driver.await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(DriveError::NotAccepted(e))) => {
                tracing::debug!(run_id = %run_id, error = %e, "the run was not recorded; its driver ends");
                return;
            }
            Ok(Err(e)) if ctx.stopping.load(std::sync::atomic::Ordering::SeqCst) => {
                tracing::debug!(run_id = %run_id, error = %e, "the tree is stopping; the run resumes at the next start");
                return;
            }
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
        let outcome = Arc::new(outcome);
        // Boxed: its state is allocated once the run has ended, not held while it runs.
        let finished = Box::pin(ctx.gates.orchestrator.run(ctx.dir.orchestrator.call_with(
            |reply| OrchestratorMsg::Finished {
                outcome: outcome.clone(),
                reply,
            },
            crate::directory::DEFAULT_CALL_TIMEOUT,
            1_000,
        )))
        .await;
        match finished {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) if ctx.stopping.load(std::sync::atomic::Ordering::SeqCst) => {
                tracing::debug!(run_id = %run_id, "the tree stopped before the end of the run was recorded; the run resumes at the next start");
            }
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
    /// The run's record could not be written when it was received.
    #[error("the run was not recorded: {0}")]
    NotAccepted(String),
    /// The run's machine cannot go on (a checkpoint that does not decode, say: the run is not
    /// restarted from scratch, which could repeat calls that were made; or one that cannot be
    /// encoded).
    #[error(transparent)]
    Machine(#[from] RunError),
}

/// A run's write on its way to disk: resolves once it is there, or with why it could not be.
type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DriveError>> + Send>>;

/// Waits until every write in `pending` is on disk (they land in the order queued).
async fn settle(pending: &mut Vec<Pending>) -> Result<(), DriveError> {
    for write in pending.drain(..) {
        write.await?;
    }
    Ok(())
}

/// Adds `write` to `pending`, after letting go of the writes already on disk (a run of only
/// repeatable steps, an agent's turns and idempotent calls, never settles: its list holds only
/// what is in flight). Fails with the first of those that could not be written.
fn queue(pending: &mut Vec<Pending>, write: Pending) -> Result<(), DriveError> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut failed = None;
    pending.retain_mut(|w| match w.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(())) => false,
        std::task::Poll::Ready(Err(e)) => {
            failed.get_or_insert(e);
            false
        }
        std::task::Poll::Pending => true,
    });
    match failed {
        Some(e) => Err(e),
        None => {
            pending.push(write);
            Ok(())
        }
    }
}

/// Queues the checkpoint of `progress`, in order behind the run's earlier writes.
fn checkpoint(ctx: &TreeCtx, run_id: &str, progress: &RunProgress) -> Result<Pending, DriveError> {
    let write = RunMachine::checkpoint_write(run_id, progress, now_ms())?;
    let commit = ctx.store.queue_batch(vec![write], Commit::Synced);
    Ok(Box::pin(async move {
        commit.await?;
        Ok(())
    }))
}

/// Drives one run to its end: the machine decides, this performs. The futures it awaits that
/// are over a kilobyte (a preparation, a choice, a transition, a validation, a review, the
/// end) are boxed for their await only: a driver is held for its run's whole life, most of it
/// waiting on a call (with them inline its future was 4,288 bytes; boxed, 2,464).
async fn drive(
    ctx: &TreeCtx,
    run: Run,
    task: Task,
    start: Start,
) -> Result<RunOutcome, DriveError> {
    // Writes on their way to disk: a new run's starts with its record's. Only what a crash
    // that loses them may repeat goes on before they land (`RunMachine::may_run_ahead`).
    let mut pending: Vec<Pending> = Vec::new();
    let (resume, mut forced) = match start {
        // A new run's plan given with the task comes with it; a resumed one's is read back.
        Start::New(acceptance) => {
            let written = acceptance.written;
            pending.push(Box::pin(async move {
                written
                    .await
                    .map_err(|_| DriveError::NotAccepted("the writer did not answer".to_string()))?
                    .map_err(DriveError::NotAccepted)
            }));
            (false, Some(acceptance.forced))
        }
        Start::Resume => (true, None),
    };
    let run_id = run.run_id.clone();
    let task = Arc::new(task);
    let rules = Arc::new(ctx.config.rules.clone());
    let saved = if resume {
        ctx.store.latest_checkpoint(&run_id)?
    } else {
        None
    };
    let mut machine = match saved {
        Some(cp) => RunMachine::resume(
            run_id.clone(),
            task.clone(),
            ctx.workflow.clone(),
            rules,
            cp,
        )?,
        None => RunMachine::new(run_id.clone(), task.clone(), ctx.workflow.clone(), rules),
    };
    if let Some(chaos) = &ctx.chaos {
        chaos.on_message();
    }
    loop {
        let Some(command) = machine.poll() else {
            return Err(RunError::Stalled(run_id).into());
        };
        if !machine.may_run_ahead(&command) {
            settle(&mut pending).await?;
        }
        let event = match command {
            Command::Prepare => {
                let preparing = prepare(ctx, &run_id, &task, forced.take());
                Box::pin(preparing).await?
            }
            Command::Choose { base, exclude } => {
                let choosing =
                    ctx.gates
                        .policy
                        .run(ctx.dir.policy.call(|reply| PolicyMsg::Choose {
                            task: task.clone(),
                            base: base.clone(),
                            exclude: exclude.clone(),
                            reply,
                        }));
                Event::Planned(Box::pin(choosing).await?)
            }
            Command::Transition {
                from,
                next,
                patch,
                then,
                checkpoint,
            } => {
                let checkpoint = if checkpoint {
                    Some(RunMachine::checkpoint_write(
                        &run_id,
                        machine.progress(),
                        now_ms(),
                    )?)
                } else {
                    None
                };
                let moving = ctx
                    .gates
                    .orchestrator
                    .run(
                        ctx.dir
                            .orchestrator
                            .call(|reply| OrchestratorMsg::Transition {
                                run_id: run_id.clone(),
                                from,
                                next,
                                patch: patch.clone(),
                                then,
                                checkpoint: checkpoint.clone(),
                                reply,
                            }),
                    );
                let answer = Box::pin(moving).await?;
                let transitioned = answer.map_err(DriveError::Transition)?;
                let written = transitioned.written;
                queue(
                    &mut pending,
                    Box::pin(async move { written.await.map_err(DriveError::Transition) }),
                )?;
                Event::Transitioned(transitioned.run.state)
            }
            Command::Checkpoint => {
                queue(&mut pending, checkpoint(ctx, &run_id, machine.progress())?)?;
                continue;
            }
            Command::Notify(event) => {
                // A plugin that is down misses it: a run never waits for an observer.
                for plugin in &ctx.dir.plugins {
                    plugin
                        .slot
                        .tell(PluginMsg::Event(run_id.clone(), event.clone()));
                }
                continue;
            }
            Command::LearnFirstAttempt(steps) => {
                // A policy that cannot be reached learns them from the logged experience.
                let _ = ctx
                    .dir
                    .policy
                    .cast(PolicyMsg::FirstAttempt {
                        run_id: run_id.clone(),
                        task_id: task.task_id.clone(),
                        features: task.features.clone(),
                        steps,
                    })
                    .await;
                continue;
            }
            Command::Call(call) => {
                let outcome = ctx
                    .dir
                    .executor
                    .call_with_timeout(
                        |reply| crate::executor::ExecutorMsg::Execute {
                            call: call.clone(),
                            reply,
                        },
                        ctx.config.stage_timeout,
                    )
                    .await?;
                Event::Called {
                    outcome,
                    at_ms: now_ms(),
                }
            }
            Command::Turn(turn) => {
                let outcome = ctx
                    .dir
                    .executor
                    .call_with_timeout(
                        |reply| crate::executor::ExecutorMsg::Turn {
                            turn: turn.clone(),
                            reply,
                        },
                        ctx.config.stage_timeout,
                    )
                    .await?;
                Event::Turned {
                    outcome,
                    at_ms: now_ms(),
                }
            }
            Command::Validate(outputs) => {
                let outputs: Arc<[(String, serde_json::Value)]> = outputs.into();
                let validating = ctx.gates.validator.run(ctx.dir.validator.call(|reply| {
                    ValidatorMsg::Validate {
                        task: task.clone(),
                        outputs: outputs.clone(),
                        reply,
                    }
                }));
                Event::Validated(Box::pin(validating).await?)
            }
            Command::LoadCheckpoint(name) => Event::CheckpointLoaded(match name {
                Some(name) => ctx.store.checkpoint_named(&run_id, &name)?,
                None => ctx.store.latest_checkpoint(&run_id)?,
            }),
            Command::Review(report) => Box::pin(review(ctx, report)).await,
            Command::Finish(finished) => {
                let ending = finish(ctx, &task, *finished);
                return Box::pin(ending).await;
            }
        };
        machine.handle(event)?;
    }
}

/// Announces the run to ReflectRetry and the plugins, retrieves what memory holds for the task
/// with the lessons of its scope, and looks up a plan given with the task (`forced`, when the
/// driver was given it; else in the store).
async fn prepare(
    ctx: &TreeCtx,
    run_id: &str,
    task: &Arc<Task>,
    forced: Option<Option<Vec<hindsight::ArmChoice>>>,
) -> Result<Event, DriveError> {
    let _ = ctx
        .dir
        .reflect_retry
        .cast(PluginMsg::BeforeRun(task.clone()))
        .await;
    for plugin in &ctx.dir.plugins {
        plugin.slot.tell(PluginMsg::BeforeRun(task.clone()));
    }
    let mut bundle = ctx
        .gates
        .memory
        .run(ctx.dir.memory.call(|reply| MemoryMsg::Retrieve {
            task: task.clone(),
            reply,
        }))
        .await?;
    // The lessons of the task's scope, fenced, join the retrieval: read from the lesson board,
    // not asked of the reflector, which may be busy learning (or restarting).
    bundle.strategy_context = ctx.lessons.context_for(task);
    // A plan given with the task (the API's `/execute`) is run as given.
    let forced = match forced {
        Some(forced) => forced,
        None => ctx.store.get(crate::orchestrator::FORCED_PLANS, run_id)?,
    };
    Ok(Event::Prepared {
        citations: bundle.citations(),
        guidance: bundle.guidance(),
        forced,
    })
}

/// ReflectRetry's verdict on a round and every running plugin's answer (each sees the report;
/// one that is down, fails or does not answer in time accepts). A crashing plugin never fails
/// the run.
async fn review(ctx: &TreeCtx, report: hindsight::run::RunReport) -> Event {
    let report = Arc::new(report);
    let reflect_retry = ctx
        .gates
        .reflect_retry
        .run(ctx.dir.reflect_retry.call_with_timeout(
            |reply| PluginMsg::AfterRun(report.clone(), reply),
            PLUGIN_TIMEOUT,
        ))
        .await
        .unwrap_or(Verdict::Accept);
    let mut plugins = Vec::new();
    for plugin in &ctx.dir.plugins {
        if plugin.slot.current().is_none() {
            continue;
        }
        let verdict = plugin
            .slot
            .call_with(
                |reply| PluginMsg::AfterRun(report.clone(), reply),
                PLUGIN_TIMEOUT,
                1,
            )
            .await
            .ok();
        plugins.push(PluginAnswer {
            name: plugin.name.clone(),
            max_retries: plugin.max_retries,
            verdict,
        });
    }
    Event::Reviewed {
        reflect_retry,
        plugins,
        at_ms: now_ms(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn the_gate_lets_through_its_number_at_once_and_every_one_in_turn() {
        let gate = Arc::new(Gate::new(64));
        let now = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..1_000 {
            let (gate, now, max, done) = (gate.clone(), now.clone(), max.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                gate.run(async {
                    let inside = now.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(inside, Ordering::SeqCst);
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                    now.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(done.load(Ordering::SeqCst), 1_000);
        assert_eq!(max.load(Ordering::SeqCst), 64);
    }

    /// A write that landed leaves the list as the next is queued; one that failed fails the
    /// queueing; one in flight stays.
    #[tokio::test]
    async fn queueing_a_write_lets_go_of_those_on_disk_and_reports_a_failed_one() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let in_flight: Pending = Box::pin(async move {
            let _ = rx.await;
            Ok(())
        });
        let mut pending: Vec<Pending> = vec![Box::pin(async { Ok(()) }), in_flight];
        queue(&mut pending, Box::pin(async { Ok(()) })).unwrap();
        assert_eq!(
            pending.len(),
            2,
            "the landed write is gone, the one in flight stays"
        );
        pending.insert(
            0,
            Box::pin(async { Err(DriveError::Transition("disk full".to_string())) }),
        );
        let failed = queue(&mut pending, Box::pin(async { Ok(()) }));
        assert!(
            matches!(failed, Err(DriveError::Transition(ref e)) if e == "disk full"),
            "{failed:?}"
        );
        let _ = tx.send(());
        settle(&mut pending).await.unwrap();
        assert!(pending.is_empty());
    }
}
