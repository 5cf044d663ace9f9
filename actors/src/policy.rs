//! The Policy actor: owns the contextual bandit (and the SOPs the planner may follow, and the
//! ranker it distils from its log and puts in force only while off-policy evaluation allows),
//! chooses a plan per task, and learns from every logged experience (a run's first attempt as
//! soon as it ends, [`crate::first_attempt`], the rest from the log). Its state is event-sourced:
//! a snapshot persisted every few updates plus the experience log since the snapshot's watermark,
//! replayed in `pre_start`, so a restart loses nothing and never learns an experience twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hindsight::learn::bandit::{
    Arm, Observation, Policy, PolicySnapshot, Routing, StageObservation,
};
use hindsight::learn::distill::{DistillConfig, DistillOutcome, Distiller, Promotion};
use hindsight::learn::ope::{Objective, log_for};
use hindsight::learn::sop::{SopBook, SopConfig, SopEvent};
use hindsight::store::{KvTable, Store};
use hindsight::{ArmChoice, ExperienceTuple, Sop, SopStatus, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::applied::read_snapshot;
use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::first_attempt::{FirstAttempts, step_observations};
use crate::memory::MemoryMsg;

/// The table of the policy's snapshot.
pub const POLICY: KvTable = KvTable::new("policy");
/// Every SOP version, keyed `sop_id@version` (what the API and reports read).
pub const SOPS: KvTable = KvTable::new("sops");

/// How many SOP versions are stable, from the store.
pub fn sops_promoted(store: &Store) -> Result<u64, hindsight::store::StoreError> {
    Ok(store
        .scan::<Sop>(SOPS)?
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .filter(|s| s.status != SopStatus::Candidate)
        .count() as u64)
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

/// The plan id of a run that followed an SOP.
pub fn sop_plan_id(sop_id: &str, version: u32) -> String {
    format!("sop:{sop_id}@{version}")
}

/// The SOP (id, version) a plan id names, if it names one.
pub fn parse_sop_plan_id(plan_id: &str) -> Option<(&str, u32)> {
    let rest = plan_id.strip_prefix("sop:")?;
    let (id, v) = rest.rsplit_once('@')?;
    Some((id, v.parse().ok()?))
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
}

/// A plan chosen for one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanChoice {
    /// Identifies the plan (its arms, joined).
    pub plan_id: String,
    /// The SOP followed, if any.
    pub sop_id: Option<String>,
    /// One arm per stage, with the propensity of its choice.
    pub arms: Vec<ArmChoice>,
    /// Whether the plan is the policy's greedy choice (not an exploration).
    pub greedy: bool,
    /// The SOP's version, when the plan follows an SOP.
    #[serde(default)]
    pub sop_version: Option<u32>,
    /// The policy's greedy plan for the task when it chose (empty for a plan it did not
    /// choose): what its beliefs alone would have planned, against which the bench splits the
    /// regret into ignorance and exploration.
    #[serde(default)]
    pub greedy_arms: Vec<Arm>,
}

impl PlanChoice {
    /// A plan from its arms.
    pub fn new(arms: Vec<ArmChoice>, sop_id: Option<String>, greedy: bool) -> PlanChoice {
        let plan_id = arms
            .iter()
            .map(|a| format!("{}/{}", a.tool, a.strategy))
            .collect::<Vec<_>>()
            .join("+");
        PlanChoice {
            plan_id,
            sop_id,
            arms,
            greedy,
            sop_version: None,
            greedy_arms: Vec::new(),
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
        reply: RpcReplyPort<Result<PlanChoice, String>>,
    },
    /// Learn from a logged experience (its sequence number in the experience log).
    Observe {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
    },
    /// Learn a run's first attempt as soon as it ends ([`crate::first_attempt`]): its settled
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
    /// How the ranker is distilled from the log and when it is put in force.
    pub distill: DistillConfig,
    /// Where it publishes itself.
    pub slot: Arc<Slot<PolicyMsg>>,
    /// The memory actor, which indexes promoted SOPs (and forgets rolled-back ones).
    pub memory: Arc<Slot<MemoryMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// The policy actor's state.
pub struct PolicyState {
    store: Store,
    memory: Arc<Slot<MemoryMsg>>,
    policy: Policy,
    sops: SopBook,
    sop_events: Vec<SopEvent>,
    rng: fastrand::Rng,
    watermark: u64,
    applied: BTreeSet<u64>,
    since_snapshot: u64,
    snapshot_every: u64,
    chaos: Option<ChaosHook>,
    distiller: Distiller,
    /// Whether the distiller changed since it was persisted.
    distiller_dirty: bool,
    /// Diary notes of the distiller's decisions, written with the next snapshot.
    distill_notes: Vec<hindsight::store::NewDiaryEntry>,
    ranked_choices: u64,
    /// Explorations in flight: the task, the choice count when it was chosen, and the arms it
    /// explores (flat indices). Cleared when the task's experience is observed, or after
    /// [`IN_FLIGHT_CHOICES`] more choices (a run that never ends, a crash).
    in_flight: Vec<(String, u64, Vec<usize>)>,
    /// Plans chosen by the router since start.
    choices: u64,
    /// Runs whose first attempt was learned before their experience.
    first_attempts: FirstAttempts,
    /// Stage observations learned from first attempts since start.
    learned_at_first_attempt: u64,
}

/// Choices after which an exploration still in flight no longer holds its arms back.
pub const IN_FLIGHT_CHOICES: u64 = 64;

impl Actor for PolicyActor {
    type Msg = PolicyMsg;
    type State = PolicyState;
    type Arguments = PolicyArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let stored: Option<Persisted> = read_snapshot(&args.store, POLICY, SNAPSHOT_KEY);
        let (policy, sops, watermark, applied, first_attempts) = match stored {
            Some(p) if p.policy.stages == args.initial.stages() => {
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
                (policy, sops, p.watermark, p.applied, first_attempts)
            }
            _ => (
                args.initial,
                SopBook::new(args.sop),
                0,
                BTreeSet::new(),
                FirstAttempts::default(),
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
            policy,
            sops,
            sop_events: Vec::new(),
            // Each incarnation draws from its own stream, derived from the seed and how much has
            // been learned, so a restart does not replay the same choices.
            rng: fastrand::Rng::with_seed(
                args.seed ^ watermark.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            watermark,
            applied,
            since_snapshot: 0,
            snapshot_every: args.snapshot_every.max(1),
            chaos: args.chaos,
            distiller,
            distiller_dirty: false,
            distill_notes: Vec::new(),
            ranked_choices: 0,
            in_flight: Vec::new(),
            choices: 0,
            first_attempts,
            learned_at_first_attempt: 0,
        };
        // Replay what was logged after the snapshot.
        for (seq, exp) in state.store.experience_since(state.watermark)? {
            match exp {
                Ok(exp) => state.observe(seq, &exp),
                Err(e) => {
                    tracing::error!(seq, error = %e, "an experience record cannot be read; skipped");
                    state.mark_applied(seq);
                }
            }
        }
        // One fit after the replay if one is due (replaying itself never fits).
        state.maybe_distill();
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
        match msg {
            PolicyMsg::Choose {
                task,
                base,
                exclude,
                reply,
            } => {
                let _ = reply.send(state.choose(&task, base, &exclude));
            }
            PolicyMsg::Observe { seq, experience } => {
                state.observe(seq, &experience);
                state.maybe_distill();
                if (state.since_snapshot >= state.snapshot_every
                    || !state.sop_events.is_empty()
                    || state.distiller_dirty)
                    && let Err(e) = state.persist().await
                {
                    tracing::warn!(error = %e, "the policy snapshot was not written; the log still holds everything");
                }
            }
            PolicyMsg::FirstAttempt {
                run_id,
                task_id,
                features,
                steps,
            } => state.learn_first_attempt(&run_id, &task_id, features, steps),
            PolicyMsg::Learn { observation, reply } => {
                let summary = state.policy.update(&observation);
                let _ = reply.send(summary);
            }
            PolicyMsg::Suggest { features, reply } => {
                let _ = reply.send(state.suggest(&features));
            }
            PolicyMsg::Stats { reply } => {
                let p = &state.policy;
                let _ = reply.send(LearningStats {
                    learned: p.learned(),
                    infra_ignored: p.infra_ignored(),
                    infra_learned: p.infra_learned(),
                    changes_detected: p.changes_detected(),
                    learned_at_first_attempt: state.learned_at_first_attempt,
                });
            }
            PolicyMsg::Greedy { features, reply } => {
                let (plan, value) = state.policy.greedy(&features);
                let arms = plan
                    .iter()
                    .zip(state.policy.stages())
                    .filter_map(|(&a, st)| st.arms.get(a))
                    .map(|a| format!("{}/{}", a.tool, a.strategy))
                    .collect();
                let _ = reply.send((arms, value));
            }
            PolicyMsg::Sops { reply } => {
                let _ = reply.send(state.sops.sops.clone());
            }
            PolicyMsg::Distillation { reply } => {
                let d = &state.distiller;
                let _ = reply.send(DistillStatus {
                    fits: d.fits,
                    promotions: d.promotions,
                    in_force: d.active.is_some(),
                    ranked_choices: state.ranked_choices,
                    last: d.last.clone(),
                });
            }
            PolicyMsg::Flush { reply } => {
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
        if state.since_snapshot > 0 {
            state.persist().await?;
        }
        Ok(())
    }
}

impl PolicyState {
    fn mark_applied(&mut self, seq: u64) {
        self.applied.insert(seq);
        while self.applied.remove(&(self.watermark + 1)) {
            self.watermark += 1;
        }
    }

    fn observe(&mut self, seq: u64, exp: &ExperienceTuple) {
        if seq <= self.watermark || self.applied.contains(&seq) {
            return;
        }
        // What the run's first attempt taught was learned when it ended: only the rest now.
        match self.first_attempts.take(&exp.run_id) {
            Some(learned) => {
                let rest = observation_of_steps(exp, |i| !learned.steps.contains(&i));
                self.learn_part(&rest, learned.visited);
            }
            None => {
                self.policy.update(&observation_of(exp));
            }
        }
        self.in_flight.retain(|(task, ..)| task != &exp.task_id);
        let via_sop = parse_sop_plan_id(&exp.plan_id);
        let first_passed = exp.result.passed && exp.result.attempts == 1;
        self.sops.record_run(
            &exp.context_features,
            &exp.arms,
            first_passed,
            &exp.run_id,
            via_sop,
        );
        if seq.is_multiple_of(10) {
            let events = self.sops.consolidate(exp.time_ms);
            self.sop_events.extend(events);
        }
        self.mark_applied(seq);
        self.since_snapshot += 1;
    }

    /// Learns part of a task's outcomes: as the rest of the task when an earlier part already
    /// counted its clusters as visited.
    fn learn_part(
        &mut self,
        observation: &Observation,
        visited: bool,
    ) -> hindsight::learn::bandit::UpdateSummary {
        if visited {
            self.policy.update_rest(observation)
        } else {
            self.policy.update(observation)
        }
    }

    /// Learns the settled steps of a run's first attempt that were not learned before.
    fn learn_first_attempt(
        &mut self,
        run_id: &str,
        task_id: &str,
        features: BTreeMap<String, String>,
        steps: Vec<(u32, Vec<StageObservation>)>,
    ) {
        // Its explorations' results are back.
        self.in_flight.retain(|(task, ..)| task != task_id);
        let (stages, visited) = self.first_attempts.admit(run_id, steps);
        if stages.is_empty() {
            return;
        }
        let summary = self.learn_part(&Observation { features, stages }, visited);
        if summary.learned > 0 {
            self.first_attempts.visited(run_id);
        }
        self.learned_at_first_attempt += u64::from(summary.learned);
    }

    /// Fits and evaluates a ranker when one is due: on the newest `window` experiences,
    /// rewarded by their first attempt.
    fn maybe_distill(&mut self) {
        if !self.distiller.due(self.watermark) {
            return;
        }
        let window = self.distiller.config.window as u64;
        let from = self.watermark.saturating_sub(window);
        let reward = self.policy.config().reward.clone();
        let log = match self.store.experience_since(from) {
            Ok(rows) => {
                let tuples: Vec<ExperienceTuple> =
                    rows.into_iter().filter_map(|(_, e)| e.ok()).collect();
                log_for(&tuples, Objective::FirstAttempt, &reward).0
            }
            Err(e) => {
                tracing::warn!(error = %e, "the experience log cannot be read; the ranker is not fitted now");
                return;
            }
        };
        let mut rng = fastrand::Rng::with_seed(self.watermark ^ 0xd157_111e);
        let outcome = self
            .distiller
            .refit(self.watermark, &log, &self.policy, &mut rng);
        self.distiller_dirty = true;
        if let Some(o) = outcome {
            self.note_distillation(&o);
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

    async fn persist(&mut self) -> Result<(), hindsight::store::StoreError> {
        // SOP changes go to their own table (and a diary note) in the same transaction as the
        // snapshot, so the API and reports see exactly what the planner uses.
        let mut ops = Vec::new();
        let events = std::mem::take(&mut self.sop_events);
        for event in &events {
            let (sop, what) = match &event {
                SopEvent::Promoted(s) => (s, "promoted"),
                SopEvent::RolledBack(s) => (s, "rolled back"),
            };
            ops.push(hindsight::store::WriteOp::put(
                SOPS,
                &format!("{}@{}", sop.sop_id, sop.version),
                sop,
            )?);
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
                    ),
                    tags: vec!["sop".to_string()],
                },
            )?);
        }
        for note in std::mem::take(&mut self.distill_notes) {
            ops.push(hindsight::store::WriteOp::diary(&note)?);
        }
        if self.distiller_dirty {
            ops.push(hindsight::store::WriteOp::put(
                POLICY,
                RANKER_KEY,
                &self.distiller,
            )?);
        }
        let p = Persisted {
            policy: self.policy.snapshot(),
            sops: self.sops.snapshot(),
            watermark: self.watermark,
            applied: self.applied.clone(),
        };
        ops.push(hindsight::store::WriteOp::put(POLICY, SNAPSHOT_KEY, &p)?);
        ops.push(hindsight::store::WriteOp::put(
            POLICY,
            FIRST_ATTEMPTS_KEY,
            &self.first_attempts,
        )?);
        self.store.write_batch(ops).await?;
        self.since_snapshot = 0;
        self.distiller_dirty = false;
        // On disk: memory indexes the promoted SOPs and forgets the rolled-back ones. Without
        // waiting for it: a memory down now reads the SOP table when it starts again.
        for event in events {
            self.memory.tell(match event {
                SopEvent::Promoted(s) => MemoryMsg::IndexSop(Box::new(s)),
                SopEvent::RolledBack(s) => MemoryMsg::ForgetSop(s.sop_id),
            });
        }
        Ok(())
    }

    fn choose(
        &mut self,
        task: &Task,
        base: Option<Vec<ArmChoice>>,
        exclude: &[(String, String, String)],
    ) -> Result<PlanChoice, String> {
        let Some(mut arms) = base else {
            return Ok(self.route(task));
        };
        for (s, stage) in self.policy.stages().to_vec().iter().enumerate() {
            let Some(current) = arms.get(s) else {
                return Err(format!(
                    "the plan to repair has no arm for stage {}",
                    stage.stage
                ));
            };
            let is_out = |a: &Arm| {
                exclude
                    .iter()
                    .any(|(st, t, g)| st == &stage.stage && t == &a.tool && g == &a.strategy)
            };
            if !is_out(&Arm::new(current.tool.clone(), current.strategy.clone())) {
                continue;
            }
            let tried: Vec<usize> = stage
                .arms
                .iter()
                .enumerate()
                .filter(|(_, a)| is_out(a))
                .map(|(i, _)| i)
                .collect();
            let Some((pick, propensity)) =
                self.policy
                    .fallback_with_propensity(&task.features, s, &tried, &mut self.rng)
            else {
                return Err(format!(
                    "every arm of stage {} failed for this task ({} tried)",
                    stage.stage,
                    tried.len()
                ));
            };
            let arm = &stage.arms[pick];
            arms[s] = ArmChoice {
                stage: stage.stage.clone(),
                tool: arm.tool.clone(),
                strategy: arm.strategy.clone(),
                propensity,
            };
        }
        Ok(PlanChoice::new(arms, None, false))
    }

    /// A new plan for `task`. The policy draws a plan (a promoted ranker plans its exploit
    /// share, the policy explores); where a stable SOP is in force, the A/B router gives
    /// the SOP the draws that land on the greedy plan, except a holdout share that stays with
    /// the policy as the baseline. Exploration is never routed away: an SOP promoted before the
    /// cluster's best arm was found would otherwise take the tries that find it. Every run's
    /// propensities are the whole mixture's, whichever way it went, so that off-policy
    /// evaluation weighs SOP and holdout runs alike by what chose them.
    fn route(&mut self, task: &Task) -> PlanChoice {
        let features = &task.features;
        let exploit = self.distiller.exploit_plan(&self.policy, features);
        // The SOP in force, with its plan's arm indices: one that matches, fits the stages, and
        // that the policy's own evidence since the promotion (a drift, say) has not overtaken.
        let in_force = self.sops.matching_stable_sop(features).and_then(|sop| {
            let indices = self.policy.choice_indices(&sop.plan)?;
            let gap = self.policy.shortfall(features, &sop.plan)?;
            (gap <= self.sops.config.defer_margin).then_some((sop, indices))
        });
        self.choices += 1;
        let oldest = self.choices.saturating_sub(IN_FLIGHT_CHOICES);
        self.in_flight.retain(|(_, at, _)| *at > oldest);
        let exploring: Vec<usize> = self
            .in_flight
            .iter()
            .flat_map(|(_, _, arms)| arms.iter().copied())
            .collect();
        let routing = Routing {
            ranker: exploit.as_deref(),
            sop: in_force
                .as_ref()
                .map(|(_, indices)| (indices.as_slice(), self.sops.sop_share())),
            exploring: &exploring,
        };
        let choice = self.policy.choose_routed(features, routing, &mut self.rng);
        self.ranked_choices += u64::from(choice.ranked);
        if !choice.explored.is_empty() {
            self.in_flight
                .push((task.task_id.clone(), self.choices, choice.explored.clone()));
        }
        let arms = choice.arm_choices();
        let mut plan = match in_force {
            Some((sop, _)) if choice.sop => {
                let mut plan = PlanChoice::new(arms, Some(sop.sop_id.clone()), true);
                plan.plan_id = sop_plan_id(&sop.sop_id, sop.version);
                plan.sop_version = Some(sop.version);
                plan
            }
            _ => PlanChoice::new(arms, None, choice.greedy),
        };
        plan.greedy_arms = self
            .policy
            .plan_arms(&choice.greedy_plan)
            .unwrap_or_default();
        plan
    }

    fn suggest(&self, features: &BTreeMap<String, String>) -> Vec<RankedStage> {
        self.policy
            .stages()
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                let ranked = self
                    .policy
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

/// The bandit observation of an experience: one entry per stage call, its outcome taken from the
/// step's `outcome` mark (`valid`, `invalid`, or a failure category); a call whose output was
/// never validated says nothing about validity and is left out. Infrastructure faults retried
/// inside a call are reported too (the policy counts and ignores them).
pub fn observation_of(exp: &ExperienceTuple) -> Observation {
    observation_of_steps(exp, |_| true)
}

/// [`observation_of`] over the steps whose index `keep` accepts.
fn observation_of_steps(exp: &ExperienceTuple, keep: impl Fn(u32) -> bool) -> Observation {
    let stages = exp
        .steps
        .iter()
        .enumerate()
        .filter(|(i, _)| u32::try_from(*i).is_ok_and(&keep))
        .flat_map(|(_, step)| step_observations(step))
        .collect();
    Observation {
        features: exp.context_features.clone(),
        stages,
    }
}
