//! The Policy actor: owns the contextual bandit (and the SOPs the planner may follow, and the
//! ranker it distils from its log and puts in force only while off-policy evaluation allows),
//! chooses a plan per task, and learns from every logged experience (a run's first attempt as
//! soon as it ends, [`hindsight::learn::first_attempt`], the rest from the log). Its state is event-sourced:
//! a snapshot persisted every few updates plus the experience log since the snapshot's watermark,
//! replayed in `pre_start`, so a restart loses nothing and never learns an experience twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hindsight::learn::bandit::{Observation, Policy, PolicySnapshot, StageObservation};
use hindsight::learn::distill::{DistillConfig, DistillOutcome, Distiller, Promotion};
use hindsight::learn::first_attempt::FirstAttempts;
use hindsight::learn::fit_window::FitWindow;
use hindsight::learn::planner::{Planner, Refit};
use hindsight::learn::sop::{SopBook, SopConfig, SopEvent};
use hindsight::store::{Commit, KvTable, Store};
use hindsight::{ArmChoice, ExperienceTuple, Sop, SopStatus, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::applied::{read_snapshot, write_behind};
use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::memory::MemoryMsg;

mod sop_rows;
use sop_rows::SopRows;

pub use hindsight::learn::planner::{IN_FLIGHT_CHOICES, observation_of};

/// The table of the policy's snapshot.
pub const POLICY: KvTable = KvTable::new("policy");
/// Every SOP version of the policy's book, keyed by its place in the book (what the API and
/// reports read; see [`sop_rows`]).
pub const SOPS: KvTable = KvTable::new("sops");

/// How many of these SOP versions were promoted (every one that is not a candidate).
pub fn sops_promoted(sops: &[Sop]) -> u64 {
    sops.iter()
        .filter(|s| s.status != SopStatus::Candidate)
        .count() as u64
}

/// Why the stored policy cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum StoredPolicyError {
    /// The store could not be read, or the snapshot did not decode.
    #[error("table `policy` key `snapshot`: {0}")]
    Store(#[from] hindsight::store::StoreError),
    /// The snapshot decoded but is not a policy this build can restore.
    #[error("table `policy` key `snapshot`: {0}")]
    Restore(#[from] hindsight::learn::bandit::PolicyError),
    /// The SOP book's rows could not be read back.
    #[error(transparent)]
    SopRows(#[from] sop_rows::SopRowsError),
    /// The store holds no policy snapshot.
    #[error(
        "table `policy` key `snapshot`: there is none (start and stop a tree on the store first)"
    )]
    Missing,
}

/// The live policy as the policy actor last persisted it (`None` when it never has): what
/// `hindsight policy evaluate` evaluates.
pub fn stored_policy(store: &Store) -> Result<Option<Policy>, StoredPolicyError> {
    let stored: Option<Persisted> = store.get(POLICY, SNAPSHOT_KEY)?;
    match stored {
        Some(p) => Ok(Some(Policy::restore(p.policy)?)),
        None => Ok(None),
    }
}

pub use hindsight::run::{PlanChoice, parse_sop_plan_id, sop_plan_id};

/// Adds SOPs to the stored policy, for a store prepared offline (an import, or the overhead
/// bench's): each joins the end of the SOP book of the persisted snapshot (a row of the SOP
/// table), in one transaction; the policy (and memory's index) read them at the next start.
/// Fails when the store holds no policy snapshot (start and stop a tree on it first).
pub async fn add_stored_sops(store: &Store, sops: &[Sop]) -> Result<(), StoredPolicyError> {
    let Some(mut persisted) = store.get::<Persisted>(POLICY, SNAPSHOT_KEY)? else {
        return Err(StoredPolicyError::Missing);
    };
    let (mut rows, mut book) = SopRows::load(store, std::mem::take(&mut persisted.sops.sops))?;
    book.extend_from_slice(sops);
    let mut ops = rows.writes(&book)?;
    ops.push(hindsight::store::WriteOp::put(
        POLICY,
        SNAPSHOT_KEY,
        &persisted,
    )?);
    store.write_batch(ops).await?;
    Ok(())
}

/// The policy's snapshot with its SOP book's rows read back into it, and what the table holds
/// of them; `None` (logged) when either cannot be read: the policy then rebuilds from the log.
fn read_persisted(store: &Store) -> Option<(Persisted, SopRows)> {
    let mut p: Persisted = read_snapshot(store, POLICY, SNAPSHOT_KEY)?;
    match SopRows::load(store, std::mem::take(&mut p.sops.sops)) {
        Ok((rows, sops)) => {
            p.sops.sops = sops;
            Some((p, rows))
        }
        Err(e) => {
            tracing::error!(error = %e, "the SOP book cannot be read back; rebuilding the policy from the experience log");
            None
        }
    }
}

const SNAPSHOT_KEY: &str = "snapshot";
/// The key of the distiller (the ranker in force and its schedule) in [`POLICY`].
const RANKER_KEY: &str = "ranker";
/// The key of the runs whose first attempt was learned ahead of their experience (written with
/// every snapshot, in the same transaction).
const FIRST_ATTEMPTS_KEY: &str = "first_attempts";

/// The distiller as the policy actor last persisted it (`None` when it never has).
pub fn stored_distiller(store: &Store) -> Result<Option<Distiller>, hindsight::store::StoreError> {
    store.get(POLICY, RANKER_KEY)
}

/// What the distillation has done (the `Distillation` message's reply).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DistillStatus {
    /// Rankers fitted and evaluated.
    pub fits: u64,
    /// Fits that put their ranker in force.
    pub promotions: u64,
    /// Whether a ranker is in force now.
    pub in_force: bool,
    /// Choices whose plan came from the ranker in this incarnation.
    pub ranked_choices: u64,
    /// The last decision.
    pub last: Option<Promotion>,
    /// Experiences in the window the next fit reads, kept as they are learned (none until
    /// the window is read from the log, at a start).
    #[serde(default)]
    pub window: u64,
}

impl DistillStatus {
    /// The distillation of `planner` as it is now.
    pub fn of(planner: &Planner) -> DistillStatus {
        let d = &planner.distiller;
        DistillStatus {
            fits: d.fits,
            promotions: d.promotions,
            in_force: d.active.is_some(),
            ranked_choices: planner.ranked_choices(),
            last: d.last.clone(),
            window: planner.fit_window().len() as u64,
        }
    }
}

/// One stage's arms ranked for a task: `(tool, strategy, p_success mean, std, expected value)`.
pub type RankedStage = (String, Vec<(String, String, f64, f64, f64)>);

/// Messages of the policy.
pub enum PolicyMsg {
    /// Choose a plan for a task. With `base`, keep its arms except those in `exclude`, which are
    /// replaced by the best untried arm of their stage (a replan after a failure).
    Choose {
        /// The task.
        task: Arc<Task>,
        /// The plan to repair, if any.
        base: Option<Vec<ArmChoice>>,
        /// `(stage, tool, strategy)` ruled out.
        exclude: Vec<(String, String, String)>,
        /// The plan, or why none can be made.
        reply: RpcReplyPort<Result<PlanChoice, hindsight::learn::planner::PlanError>>,
    },
    /// Learn from a logged experience (its sequence number in the experience log).
    Observe {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
    },
    /// Learn a run's first attempt as soon as it ends ([`hindsight::learn::first_attempt`]): its settled
    /// steps, which the run's logged experience will not teach again.
    FirstAttempt {
        /// The run.
        run_id: String,
        /// Its task (its explorations are no longer in flight).
        task_id: String,
        /// The task's features.
        features: BTreeMap<String, String>,
        /// `(index in the run's steps, observations)` of the settled steps.
        steps: Vec<(u32, Vec<StageObservation>)>,
    },
    /// Learn from an observation given directly (the API's `/policy/update`).
    Learn {
        /// The observation.
        observation: Box<Observation>,
        /// What was learned.
        reply: RpcReplyPort<hindsight::learn::bandit::UpdateSummary>,
    },
    /// Ranked arms per stage for some features (the API's `/policy/suggest`).
    Suggest {
        /// The features.
        features: BTreeMap<String, String>,
        /// The ranking.
        reply: RpcReplyPort<Vec<RankedStage>>,
    },
    /// What has been learned: stage observations, infrastructure failures ignored and learned
    /// from, changes detected.
    Stats {
        /// The counters.
        reply: RpcReplyPort<LearningStats>,
    },
    /// The greedy plan (posterior means) for some features, and its estimated reward.
    Greedy {
        /// The features.
        features: BTreeMap<String, String>,
        /// `(arms as tool/strategy, estimated reward)`.
        reply: RpcReplyPort<(Vec<String>, f64)>,
    },
    /// The stable SOPs and every version ever made.
    Sops {
        /// Every SOP version.
        reply: RpcReplyPort<Vec<Sop>>,
    },
    /// What the distillation of the ranker has done.
    Distillation {
        /// Its status.
        reply: RpcReplyPort<DistillStatus>,
    },
    /// Persist the snapshot now (at shutdown).
    Flush {
        /// Acknowledged once it is on disk.
        reply: RpcReplyPort<Result<(), String>>,
    },
}

/// The policy's learning counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearningStats {
    /// Stage observations learned from (persisted with the posteriors).
    pub learned: u64,
    /// Infrastructure failures seen and ignored.
    pub infra_ignored: u64,
    /// Infrastructure failures learned from (0 unless something is wrong).
    pub infra_learned: u64,
    /// Changes the drift detector fired on.
    pub changes_detected: u64,
    /// Of `learned`, those learned when their run's first attempt ended, ahead of the run's
    /// experience, since this incarnation of the policy started.
    pub learned_at_first_attempt: u64,
}

/// The persisted state: the bandit and which experiences it has learned.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Persisted {
    policy: PolicySnapshot,
    sops: SopBook,
    /// Every experience with `seq <= watermark` has been learned.
    watermark: u64,
    /// Experiences above the watermark already learned.
    applied: BTreeSet<u64>,
}

/// The policy actor.
pub struct PolicyActor;

/// Start-up arguments.
pub struct PolicyArgs {
    /// The store.
    pub store: Store,
    /// The policy to start from when nothing is stored.
    pub initial: Policy,
    /// Seed of the choice RNG.
    pub seed: u64,
    /// Persist the snapshot every this many experiences.
    pub snapshot_every: u64,
    /// SOP promotion and rollback rules.
    pub sop: SopConfig,
    /// Whether SOPs are proposed, promoted and routed to (off for an ablation).
    pub sops: bool,
    /// How the ranker is distilled from the log and when it is put in force.
    pub distill: DistillConfig,
    /// Where it publishes itself.
    pub slot: Arc<Slot<PolicyMsg>>,
    /// The memory actor, which indexes promoted SOPs (and forgets rolled-back ones).
    pub memory: Arc<Slot<MemoryMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// The policy actor's state: the planner and what persisting it needs.
pub struct PolicyState {
    store: Store,
    memory: Arc<Slot<MemoryMsg>>,
    /// What the SOP table holds of the planner's book.
    sop_rows: SopRows,
    planner: Planner,
    since_snapshot: u64,
    snapshot_every: u64,
    chaos: Option<ChaosHook>,
    /// Whether the distiller changed since it was persisted.
    distiller_dirty: bool,
    /// Diary notes of the distiller's decisions, written with the next snapshot.
    distill_notes: Vec<hindsight::store::NewDiaryEntry>,
    /// A ranker refit running on a blocking thread (it reads the log and fits: tens of
    /// milliseconds that choices would otherwise wait behind), if one is.
    refit: Option<tokio::task::JoinHandle<RefitResult>>,
    /// The ranker's window of experiences being read from the log after a start, on a blocking
    /// thread, if it is: the first fit after a start would otherwise read it while runs go on.
    fill: Option<tokio::task::JoinHandle<Result<FitWindow, String>>>,
}

/// The experiences of the log after `from` that can be read, with their sequence numbers, for
/// the ranker's fit and its window (a damaged row is left out); why the log could not be read
/// otherwise.
fn readable_experiences(store: &Store, from: u64) -> Result<Vec<(u64, ExperienceTuple)>, String> {
    Ok(store
        .experience_since(from)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(|(seq, e)| e.ok().map(|e| (seq, e)))
        .collect())
}

/// What a refit returns: what it fitted and decided, or why the log could not be read.
type RefitResult = Result<Refit, String>;

impl Actor for PolicyActor {
    type Msg = PolicyMsg;
    type State = PolicyState;
    type Arguments = PolicyArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        crate::applied::after_queued_writes(&args.store, "policy").await;
        let stored =
            read_persisted(&args.store).filter(|(p, _)| p.policy.stages == args.initial.stages());
        let (policy, sops, watermark, applied, first_attempts, sop_rows) = match stored {
            Some((p, sop_rows)) => {
                // The evidence comes back; the configuration is the one in force now (a changed
                // setting or reward takes effect at the next start, not at the next relearn).
                let mut policy = Policy::restore(p.policy)?;
                policy.set_config(args.initial.config().clone())?;
                let mut sops = SopBook::restore(p.sops);
                sops.config = args.sop.clone();
                // Written with the snapshot: the first attempts it already holds.
                let first_attempts = match args.store.get(POLICY, FIRST_ATTEMPTS_KEY) {
                    Ok(f) => f.unwrap_or_default(),
                    Err(e) => {
                        tracing::error!(error = %e, "table `policy` key `first_attempts` cannot be read; the steps it names may be learned a second time");
                        FirstAttempts::default()
                    }
                };
                (
                    policy,
                    sops,
                    p.watermark,
                    p.applied,
                    first_attempts,
                    sop_rows,
                )
            }
            None => (
                args.initial,
                SopBook::new(args.sop),
                0,
                BTreeSet::new(),
                FirstAttempts::default(),
                SopRows::fresh(&args.store),
            ),
        };
        // A configuration out of range (from an embedder that skipped `Runtime::start`'s check)
        // turns distillation off rather than stop the policy.
        let distill = match args.distill.validate() {
            Ok(()) => args.distill.clone(),
            Err(e) => {
                tracing::error!(error = %e, "distillation is off");
                DistillConfig {
                    every: 0,
                    ..DistillConfig::default()
                }
            }
        };
        // The ranker in force comes back with its schedule, under the configuration in force
        // now; a distiller that cannot be read starts afresh (the next fit rebuilds it).
        let distiller = match args.store.get::<Distiller>(POLICY, RANKER_KEY) {
            Ok(Some(mut d)) if watermark > 0 => {
                d.config = distill.clone();
                if d.config.every == 0 {
                    d.active = None;
                }
                d
            }
            Ok(_) => Distiller::new(distill),
            Err(e) => {
                tracing::error!(error = %e, "the distilled ranker cannot be read; it is fitted again");
                Distiller::new(distill)
            }
        };
        let mut state = PolicyState {
            store: args.store,
            memory: args.memory,
            sop_rows,
            planner: {
                let planner = Planner::new(
                    policy,
                    sops,
                    distiller,
                    watermark,
                    applied,
                    first_attempts,
                    args.seed,
                );
                if args.sops {
                    planner
                } else {
                    planner.without_sops()
                }
            },
            since_snapshot: 0,
            snapshot_every: args.snapshot_every.max(1),
            chaos: args.chaos,
            distiller_dirty: false,
            distill_notes: Vec::new(),
            refit: None,
            fill: None,
        };
        // Replay what was logged after the snapshot.
        for (seq, exp) in state.store.experience_since(state.planner.watermark())? {
            match exp {
                Ok(exp) => state.observe(seq, &exp),
                Err(e) => {
                    tracing::error!(seq, error = %e, "an experience record cannot be read; skipped");
                    state.planner.mark_applied(seq);
                }
            }
        }
        // One fit after the replay if one is due (replaying itself never fits); otherwise the
        // window the next fit reads is filled from the log now, while the tree starts.
        state.maybe_distill().await;
        if state.refit.is_none() {
            state.fill_window();
        }
        args.slot.publish(myself);
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        // A refit that finished is put in force before anything else is answered, and a window
        // read from the log is taken in.
        if state.refit.as_ref().is_some_and(|h| h.is_finished()) {
            state.finish_refit().await;
        }
        if state.fill.as_ref().is_some_and(|h| h.is_finished()) {
            state.finish_fill().await;
        }
        match msg {
            PolicyMsg::Choose {
                task,
                base,
                exclude,
                reply,
            } => {
                let _ = reply.send(state.planner.choose(&task, base, &exclude));
            }
            PolicyMsg::Observe { seq, experience } => {
                state.observe(seq, &experience);
                state.maybe_distill().await;
                if state.since_snapshot >= state.snapshot_every
                    || state.planner.has_sop_events()
                    || state.distiller_dirty
                {
                    state.persist_later();
                }
            }
            PolicyMsg::FirstAttempt {
                run_id,
                task_id,
                features,
                steps,
            } => state
                .planner
                .learn_first_attempt(&run_id, &task_id, features, steps),
            PolicyMsg::Learn { observation, reply } => {
                let summary = state.planner.policy.update(&observation);
                let _ = reply.send(summary);
            }
            PolicyMsg::Suggest { features, reply } => {
                let _ = reply.send(state.suggest(&features));
            }
            PolicyMsg::Stats { reply } => {
                let p = &state.planner.policy;
                let _ = reply.send(LearningStats {
                    learned: p.learned(),
                    infra_ignored: p.infra_ignored(),
                    infra_learned: p.infra_learned(),
                    changes_detected: p.changes_detected(),
                    learned_at_first_attempt: state.planner.learned_at_first_attempt(),
                });
            }
            PolicyMsg::Greedy { features, reply } => {
                let policy = &state.planner.policy;
                let (plan, value) = policy.greedy(&features);
                let arms = plan
                    .iter()
                    .zip(policy.stages())
                    .filter_map(|(&a, st)| st.arms.get(a))
                    .map(|a| format!("{}/{}", a.tool, a.strategy))
                    .collect();
                let _ = reply.send((arms, value));
            }
            PolicyMsg::Sops { reply } => {
                let _ = reply.send(state.planner.sops.sops.clone());
            }
            PolicyMsg::Distillation { reply } => {
                // Every fit due so far is counted, and a window read at start is in.
                state.finish_fill().await;
                state.finish_refit().await;
                let _ = reply.send(DistillStatus::of(&state.planner));
            }
            PolicyMsg::Flush { reply } => {
                state.finish_refit().await;
                let _ = reply.send(state.persist().await.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.finish_refit().await;
        if state.since_snapshot > 0 {
            state.persist().await?;
        }
        Ok(())
    }
}

impl PolicyState {
    /// Learns logged experience `seq` (once).
    fn observe(&mut self, seq: u64, exp: &ExperienceTuple) {
        if self.planner.observe(seq, exp) {
            self.since_snapshot += 1;
        }
    }

    /// Starts fitting and evaluating a ranker when one is due, on the newest experiences of
    /// the log, on a blocking thread: choices go on with the ranker in force until
    /// [`PolicyState::finish_refit`] puts the new one in force.
    async fn maybe_distill(&mut self) {
        if self.refit.is_some() {
            return;
        }
        if self.planner.distill_from().is_none() {
            return;
        }
        // A fit due while the window is read from the log after a start waits for it.
        self.finish_fill().await;
        let job = self.planner.refit_job();
        let store = self.store.clone();
        self.refit = Some(tokio::task::spawn_blocking(move || {
            // The log is read only while the planner's window does not hold its newest rows
            // (a fit due before the window was read at start).
            let read = match job.reads_from() {
                Some(from) => readable_experiences(&store, from)?,
                None => Vec::new(),
            };
            Ok(job.run(read.iter().map(|(seq, e)| (*seq, e))))
        }));
    }

    /// Reads the window of experiences the ranker's next fit reads from the log, on a blocking
    /// thread, when the planner does not hold it (after a start, with distillation on).
    fn fill_window(&mut self) {
        let Some(from) = self.planner.window_reads_from() else {
            return;
        };
        let store = self.store.clone();
        let reward = self.planner.reward().clone();
        self.fill = Some(tokio::task::spawn_blocking(move || {
            let read = readable_experiences(&store, from)?;
            Ok(FitWindow::read(
                from,
                read.iter().map(|(seq, e)| (*seq, e)),
                &reward,
            ))
        }));
    }

    /// Waits for the window being read, if it is, and gives it to the planner.
    async fn finish_fill(&mut self) {
        let Some(fill) = self.fill.take() else {
            return;
        };
        match fill.await {
            Ok(Ok(window)) => self.planner.fill_window(window),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the experience log cannot be read; the next fit reads it")
            }
            Err(e) => tracing::warn!(error = %e, "the ranker's window was not read"),
        }
    }

    /// Waits for the refit under way, if any, and puts its distiller in force, written behind
    /// with its diary note: a snapshot of the whole policy waits for its turn (it only bounds
    /// the replay at start, and taking it here held the next choice for its encoding).
    async fn finish_refit(&mut self) {
        let Some(refit) = self.refit.take() else {
            return;
        };
        match refit.await {
            Ok(Ok(refit)) => {
                let outcome = self.planner.install(refit);
                self.distiller_dirty = true;
                if let Some(o) = outcome {
                    self.note_distillation(&o);
                }
                self.write_distiller_later();
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the experience log cannot be read; the ranker is not fitted now")
            }
            Err(e) => tracing::warn!(error = %e, "the ranker's refit did not finish"),
        }
    }

    /// A diary note when the ranker is put in force or withdrawn.
    fn note_distillation(&mut self, o: &DistillOutcome) {
        let kind = match (o.was_active, o.promotion.promote) {
            (false, true) => "ranker_promoted",
            (true, false) => "ranker_withdrawn",
            _ => return,
        };
        tracing::info!(kind, reason = %o.promotion.reason, "distilled ranker");
        self.distill_notes.push(hindsight::store::NewDiaryEntry {
            time_ms: now_ms(),
            run_id: None,
            kind: kind.to_string(),
            text: format!(
                "distilled ranker (fitted on {} runs, evaluated on {} against the policy's greedy plan): {}",
                o.fitted_on, o.evaluated_on, o.promotion.reason
            ),
            tags: vec!["ranker".to_string()],
        });
    }

    /// Hands the distiller and the distillation's diary notes to the store's writer as a write
    /// behind, without a snapshot.
    fn write_distiller_later(&mut self) {
        match self.distiller_writes() {
            Ok(ops) => {
                self.distiller_dirty = false;
                write_behind(&self.store, ops, "the ranker");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the ranker was not written; it is with the next snapshot")
            }
        }
    }

    /// The writes of the distillation's diary notes (taken) and of the distiller when it
    /// changed since it was last written.
    fn distiller_writes(
        &mut self,
    ) -> Result<Vec<hindsight::store::WriteOp>, hindsight::store::StoreError> {
        let mut ops = std::mem::take(&mut self.distill_notes)
            .iter()
            .map(hindsight::store::WriteOp::diary)
            .collect::<Result<Vec<_>, _>>()?;
        if self.distiller_dirty {
            ops.push(hindsight::store::WriteOp::put(
                POLICY,
                RANKER_KEY,
                &self.planner.distiller,
            )?);
        }
        Ok(ops)
    }

    /// Writes the snapshot and waits for it (at shutdown and when asked to flush).
    async fn persist(&mut self) -> Result<(), hindsight::store::StoreError> {
        self.queue_snapshot(Commit::Synced)?.await
    }

    /// Hands the snapshot to the store's writer as a write behind, without waiting for it: the
    /// choices asked for meanwhile are not held up by a commit, nor the runs' writes by its
    /// sync (the experience log rebuilds it after a crash).
    fn persist_later(&mut self) {
        let warn = |e: hindsight::store::StoreError| {
            tracing::warn!(error = %e, "the policy snapshot was not written; the log still holds everything");
        };
        match self.queue_snapshot(Commit::Behind) {
            Ok(written) => {
                tokio::spawn(async move { written.await.unwrap_or_else(warn) });
            }
            Err(e) => warn(e),
        }
    }

    /// Queues the snapshot now (so that snapshots are committed in the order they were taken),
    /// synced to disk or written behind as `commit` says; the future answers once it is
    /// committed, and memory has then been told of the SOPs (what memory writes of them is
    /// committed after, so a crash never keeps it without them).
    fn queue_snapshot(
        &mut self,
        commit: Commit,
    ) -> Result<
        impl std::future::Future<Output = Result<(), hindsight::store::StoreError>> + Send + 'static,
        hindsight::store::StoreError,
    > {
        let (ops, told) = self.snapshot_writes()?;
        let written = self.store.queue_batch(ops, commit);
        let memory = self.memory.clone();
        let failed = self.sop_rows.on_failure();
        Ok(async move {
            if let Err(e) = written.await {
                failed.store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(e);
            }
            for msg in told {
                memory.tell(msg);
            }
            Ok(())
        })
    }

    /// The writes of a snapshot as the planner stands, and what memory is to be told once they
    /// are on disk.
    fn snapshot_writes(
        &mut self,
    ) -> Result<(Vec<hindsight::store::WriteOp>, Vec<MemoryMsg>), hindsight::store::StoreError>
    {
        // The SOPs that changed go to their own table (and each event to the diary) in the
        // same transaction as the snapshot, so the API and reports see exactly what the planner
        // uses.
        let mut ops = self.sop_rows.writes(&self.planner.sops.sops)?;
        let events = self.planner.take_sop_events();
        for event in &events {
            let (sop, what) = match &event {
                SopEvent::Promoted(s) => (s, "promoted"),
                SopEvent::RolledBack(s) => (s, "rolled back"),
                SopEvent::Proposed(s) => (s, "proposed"),
            };
            ops.push(hindsight::store::WriteOp::diary(
                &hindsight::store::NewDiaryEntry {
                    time_ms: now_ms(),
                    run_id: sop.evidence.last().cloned(),
                    kind: format!("sop_{}", what.replace(' ', "_")),
                    text: format!(
                        "SOP {} v{} {what}: plan {} for {:?} ({} of {} runs passed; p = {})",
                        sop.sop_id,
                        sop.version,
                        sop.plan
                            .iter()
                            .map(|a| format!("{}/{}", a.tool, a.strategy))
                            .collect::<Vec<_>>()
                            .join(" + "),
                        sop.preconditions,
                        sop.successes,
                        sop.trials,
                        sop.p_value
                            .map(|p| format!("{p:.4}"))
                            .unwrap_or_else(|| "n/a".into())
                    ) + &sop
                        .procedure
                        .iter()
                        .map(|p| format!("; procedure of stage {}:\n{p}", p.stage))
                        .collect::<String>(),
                    tags: vec!["sop".to_string()],
                },
            )?);
        }
        ops.extend(self.distiller_writes()?);
        let p = Persisted {
            policy: self.planner.policy.snapshot(),
            sops: self.planner.sops.snapshot_without_sops(),
            watermark: self.planner.watermark(),
            applied: self.planner.applied().clone(),
        };
        ops.push(hindsight::store::WriteOp::put(POLICY, SNAPSHOT_KEY, &p)?);
        ops.push(hindsight::store::WriteOp::put(
            POLICY,
            FIRST_ATTEMPTS_KEY,
            self.planner.first_attempts(),
        )?);
        self.since_snapshot = 0;
        self.distiller_dirty = false;
        // Once on disk, memory indexes the promoted SOPs and forgets the rolled-back ones,
        // without waiting for it: a memory down then reads the SOP table when it starts again.
        // A candidate is not indexed; a version rolled back leaves the index to the version of
        // its SOP still stable, if one is.
        let told = events
            .into_iter()
            .filter_map(|event| match event {
                SopEvent::Promoted(s) => Some(MemoryMsg::IndexSop(Box::new(s))),
                SopEvent::RolledBack(s) => Some(
                    match self.planner.sops.stable().find(|x| x.sop_id == s.sop_id) {
                        Some(stable) => MemoryMsg::IndexSop(Box::new(stable.clone())),
                        None => MemoryMsg::ForgetSop(s.sop_id),
                    },
                ),
                SopEvent::Proposed(_) => None,
            })
            .collect();
        Ok((ops, told))
    }

    fn suggest(&self, features: &BTreeMap<String, String>) -> Vec<RankedStage> {
        let policy = &self.planner.policy;
        policy
            .stages()
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                let ranked = policy
                    .rank_stage(features, s)
                    .into_iter()
                    .map(|(a, m, sd, v)| {
                        let arm = &stage.arms[a];
                        (arm.tool.clone(), arm.strategy.clone(), m, sd, v)
                    })
                    .collect();
                (stage.stage.clone(), ranked)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Runtime, RuntimeOptions};
    use hindsight::tools::sim::SimEnv;

    fn bank_statements() -> SimEnv {
        SimEnv::load(
            &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../config/envs/bank_statements.toml"),
        )
        .unwrap()
    }

    /// A tree over `env` in `dir` without fsync, seeded, distilling as `distill` says.
    fn options(dir: &std::path::Path, env: &SimEnv, distill: DistillConfig) -> RuntimeOptions {
        let mut opts = RuntimeOptions::new(dir, env.clone());
        opts.durability = hindsight::store::Durability::None;
        opts.seed = 11;
        opts.distill = distill;
        opts
    }

    /// A refit puts its ranker in force and writes it (with its diary note) on its own: the
    /// snapshot of the whole policy waits for its turn, every `SNAPSHOT_EVERY` experiences.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refit_writes_its_ranker_without_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let env = bank_statements();
        // Every ranker passes the gate (a reward per task is in [0, 1]).
        let distill = DistillConfig {
            every: 40,
            min_rows: 40,
            margin: 1.0,
            min_effective_n: 0.0,
            ..Default::default()
        };
        let rt = Runtime::start(options(dir.path(), &env, distill))
            .await
            .unwrap();
        crate::app::workload::run_tasks(&rt, &env, 11, 120, 1, |_| {})
            .await
            .unwrap();
        let status = rt
            .ctx()
            .dir
            .policy
            .call(|reply| PolicyMsg::Distillation { reply })
            .await
            .unwrap();
        rt.store().settled().await.unwrap();
        assert!(status.fits >= 2 && status.in_force, "{status:?}");
        let stored = stored_distiller(rt.store()).unwrap().unwrap();
        assert_eq!(
            (stored.fits, stored.promotions),
            (status.fits, status.promotions)
        );
        assert!(
            rt.store()
                .diary_tail(1_000)
                .unwrap()
                .into_iter()
                .filter_map(Result::ok)
                .any(|e| e.kind == "ranker_promoted")
        );
        let snapshot: Option<Persisted> = rt.store().get(POLICY, SNAPSHOT_KEY).unwrap();
        assert!(
            snapshot.is_none(),
            "a snapshot at watermark {:?} before {} experiences",
            snapshot.map(|s| s.watermark),
            crate::applied::SNAPSHOT_EVERY
        );
        rt.shutdown().await;
    }

    /// After a start, the window the ranker's next fit reads is read from the log while the
    /// tree starts, not by that fit while runs go on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_reads_the_rankers_window() {
        let dir = tempfile::tempdir().unwrap();
        let env = bank_statements();
        let options = || {
            let distill = DistillConfig {
                every: 40,
                min_rows: 40,
                window: 50,
                ..Default::default()
            };
            options(dir.path(), &env, distill)
        };
        let status = |rt: &Runtime| {
            let policy = rt.ctx().dir.policy.clone();
            async move {
                policy
                    .call(|reply| PolicyMsg::Distillation { reply })
                    .await
                    .unwrap()
            }
        };
        let rt = Runtime::start(options()).await.unwrap();
        assert_eq!(status(&rt).await.window, 0, "nothing learned yet");
        crate::app::workload::run_tasks(&rt, &env, 11, 60, 1, |_| {})
            .await
            .unwrap();
        let before = status(&rt).await;
        assert!(before.fits >= 1 && before.window > 0, "{before:?}");
        rt.shutdown().await;
        let rt = Runtime::start(options()).await.unwrap();
        let after = status(&rt).await;
        assert_eq!(
            (after.fits, after.window),
            (before.fits, before.window),
            "the window is read at start, before any fit"
        );
        rt.shutdown().await;
    }
}
