//! planner: what chooses plans and learns from runs, as one value: the contextual bandit, the SOP
//! book and its A/B router, the ranker distilled from the log (and the window of the newest
//! experiences its fit reads), the explorations in flight and the first attempts learned ahead
//! of their experience. The policy actor owns one and persists it (all but the window, which
//! is read again from the log at a start); the core's run interpreter owns one in memory. Both
//! feed it the same events in the same order, so both choose alike.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::learn::bandit::{
    DrawTables, Observation, Policy, RewardParams, Routing, StageObservation, UpdateSummary,
};
use crate::learn::distill::{DistillOutcome, Distiller};
use crate::learn::first_attempt::{FirstAttempts, step_observations};
use crate::learn::fit_window::FitWindow;
use crate::learn::ope::LogRecord;
use crate::learn::procedure::{PROCEDURE_KEY, Procedure};
use crate::learn::sop::{SopBook, SopEvent, SopRun};
use crate::run::{PlanChoice, parse_sop_plan_id, sop_plan_id};
use crate::{ArmChoice, ExperienceTuple, Task};

/// Why no plan can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The plan given to repair has fewer arms than the workflow has stages.
    #[error("the plan to repair has no arm for stage {stage}")]
    MissingStage {
        /// The stage without an arm.
        stage: String,
    },
    /// Every arm of a stage was ruled out for this task.
    #[error("every arm of stage {stage} failed for this task ({tried} tried)")]
    Exhausted {
        /// The stage.
        stage: String,
        /// Arms ruled out.
        tried: usize,
    },
}

/// Choices after which an exploration still in flight no longer holds its arms back.
pub const IN_FLIGHT_CHOICES: u64 = 64;

/// The planner's state. See the module's documentation.
#[derive(Debug, Clone)]
pub struct Planner {
    /// The bandit.
    pub policy: Policy,
    /// The SOPs and their A/B router.
    pub sops: SopBook,
    /// SOP promotions and rollbacks not yet taken by [`Planner::take_sop_events`].
    sop_events: Vec<SopEvent>,
    rng: fastrand::Rng,
    /// Every experience with `seq <= watermark` has been learned.
    watermark: u64,
    /// Experiences above the watermark already learned.
    applied: BTreeSet<u64>,
    /// The ranker distilled from the log and its schedule.
    pub distiller: Distiller,
    /// Choices whose plan came from the ranker.
    ranked_choices: u64,
    /// Explorations in flight: the task, the choice count when it was chosen, and the arms it
    /// explores (flat indices). Cleared when the task's experience is observed, or after
    /// [`IN_FLIGHT_CHOICES`] more choices (a run that never ends, a crash).
    in_flight: Vec<(String, u64, Vec<usize>)>,
    /// Plans chosen by the router.
    choices: u64,
    /// Runs whose first attempt was learned before their experience.
    first_attempts: FirstAttempts,
    /// Stage observations learned from first attempts.
    learned_at_first_attempt: u64,
    /// Whether SOPs are proposed, promoted and routed to (off for an ablation).
    sops_on: bool,
    /// The policy's draws per task features since it last learned, which choices pick from.
    draws: DrawTables,
    /// The newest experiences as the ranker's fit reads them.
    window: FitWindow,
}

/// A ranker refit taken from a [`Planner`] ([`Planner::refit_job`]), to run away from it.
#[derive(Debug, Clone)]
pub struct RefitJob {
    watermark: u64,
    distiller: Distiller,
    policy: Policy,
    /// The fit reads the experiences after this one.
    from: u64,
    /// Their records, from the planner's window; `None` when the window does not hold them all
    /// yet (see [`RefitJob::reads_from`]).
    log: Option<Vec<Arc<LogRecord>>>,
}

/// What a [`RefitJob`] did, for [`Planner::install`].
#[derive(Debug, Clone)]
pub struct Refit {
    distiller: Distiller,
    outcome: Option<DistillOutcome>,
    /// The experiences it read from the log, for the planner's window.
    read: Option<FitWindow>,
}

impl RefitJob {
    /// The sequence number after which the job must be given the experience log's rows (to
    /// [`RefitJob::run`]): `None` when the planner's window held them all.
    pub fn reads_from(&self) -> Option<u64> {
        self.log.is_none().then_some(self.from)
    }

    /// Fits and evaluates a ranker on the experiences after [`Planner::distill_from`],
    /// rewarded by their first attempt: from the planner's window, or from `read` (the log's
    /// rows after [`RefitJob::reads_from`] with their sequence numbers) when it needs them.
    pub fn run<'a>(mut self, read: impl IntoIterator<Item = (u64, &'a ExperienceTuple)>) -> Refit {
        let (log, read) = match self.log.take() {
            Some(log) => (log, None),
            None => {
                let window = FitWindow::read(self.from, read, &self.policy.config().reward);
                (window.after(self.from), Some(window))
            }
        };
        let mut rng = fastrand::Rng::with_seed(self.watermark ^ 0xd157_111e);
        let outcome = self
            .distiller
            .refit(self.watermark, &log, &self.policy, &mut rng);
        Refit {
            distiller: self.distiller,
            outcome,
            read,
        }
    }
}

impl Planner {
    /// A planner from its learned parts, up to experience `watermark` (plus `applied` above
    /// it). Its choices draw from a stream derived from `seed` and the watermark, so a restart
    /// does not replay the same choices.
    pub fn new(
        policy: Policy,
        sops: SopBook,
        distiller: Distiller,
        watermark: u64,
        applied: BTreeSet<u64>,
        first_attempts: FirstAttempts,
        seed: u64,
    ) -> Planner {
        Planner {
            policy,
            sops,
            sop_events: Vec::new(),
            rng: fastrand::Rng::with_seed(seed ^ watermark.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            watermark,
            applied,
            distiller,
            ranked_choices: 0,
            in_flight: Vec::new(),
            choices: 0,
            first_attempts,
            learned_at_first_attempt: 0,
            sops_on: true,
            draws: DrawTables::default(),
            window: FitWindow::default(),
        }
    }

    /// The same planner with SOPs switched off: none is proposed, promoted or routed to (to
    /// measure what procedures contribute; see [`crate::learn::Mechanism::Sops`]).
    pub fn without_sops(mut self) -> Planner {
        self.sops_on = false;
        self
    }

    /// Every experience with a sequence number up to this one has been learned.
    pub fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Experiences above the watermark already learned.
    pub fn applied(&self) -> &BTreeSet<u64> {
        &self.applied
    }

    /// The first attempts learned ahead of their experience.
    pub fn first_attempts(&self) -> &FirstAttempts {
        &self.first_attempts
    }

    /// Choices whose plan came from the ranker.
    pub fn ranked_choices(&self) -> u64 {
        self.ranked_choices
    }

    /// Stage observations learned from first attempts.
    pub fn learned_at_first_attempt(&self) -> u64 {
        self.learned_at_first_attempt
    }

    /// Whether SOP events wait to be taken.
    pub fn has_sop_events(&self) -> bool {
        !self.sop_events.is_empty()
    }

    /// The SOP promotions and rollbacks since the last call.
    pub fn take_sop_events(&mut self) -> Vec<SopEvent> {
        std::mem::take(&mut self.sop_events)
    }

    /// Records experience `seq` as learned without learning it (a record that cannot be read).
    pub fn mark_applied(&mut self, seq: u64) {
        self.applied.insert(seq);
        while self.applied.remove(&(self.watermark + 1)) {
            self.watermark += 1;
        }
    }

    /// Learns logged experience `seq` (what its first attempt taught was learned when that
    /// attempt ended: only the rest now) and records its run for the SOPs. False when it was
    /// learned before.
    pub fn observe(&mut self, seq: u64, exp: &ExperienceTuple) -> bool {
        if self.distiller.config.every > 0 {
            self.window.insert(seq, exp, &self.policy.config().reward);
        }
        if seq <= self.watermark || self.applied.contains(&seq) {
            return false;
        }
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
        if self.sops_on {
            let procedure = if via_sop.is_none() && first_passed {
                procedures_of(exp)
            } else {
                Vec::new()
            };
            self.sops.record_run(&SopRun {
                features: &exp.context_features,
                plan: &exp.arms,
                passed: first_passed,
                reward: exp.reward,
                run_id: &exp.run_id,
                via_sop,
                procedure: &procedure,
            });
            if seq.is_multiple_of(10) {
                let events = self.sops.consolidate(exp.time_ms);
                self.sop_events.extend(events);
            }
        }
        self.mark_applied(seq);
        self.window.start_after(self.fit_from());
        true
    }

    /// Learns part of a task's outcomes: as the rest of the task when an earlier part already
    /// counted its clusters as visited.
    fn learn_part(&mut self, observation: &Observation, visited: bool) -> UpdateSummary {
        if visited {
            self.policy.update_rest(observation)
        } else {
            self.policy.update(observation)
        }
    }

    /// Learns the settled steps of a run's first attempt that were not learned before.
    pub fn learn_first_attempt(
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

    /// When a ranker fit is due: the sequence number after which the experiences to fit on
    /// start (the newest `window` of them).
    pub fn distill_from(&self) -> Option<u64> {
        self.distiller.due(self.watermark).then(|| self.fit_from())
    }

    /// The sequence number after which a fit now would read the experiences.
    fn fit_from(&self) -> u64 {
        self.watermark
            .saturating_sub(self.distiller.config.window as u64)
    }

    /// Fits and evaluates a ranker on the experiences after [`Planner::distill_from`] of `log`
    /// (the whole experience log, oldest first: experience `i + 1` at index `i`), rewarded by
    /// their first attempt.
    pub fn refit(&mut self, log: &[ExperienceTuple]) -> Option<DistillOutcome> {
        let job = self.refit_job();
        let from = job
            .reads_from()
            .map_or(log.len(), |f| usize::try_from(f).unwrap_or(usize::MAX));
        let read = log.iter().enumerate().skip(from);
        let refit = job.run(read.map(|(i, e)| (i as u64 + 1, e)));
        self.install(refit)
    }

    /// [`Planner::refit`] as a job that can run elsewhere (it may read the log, and it fits,
    /// which takes a while): the distiller, the policy and the window of experiences as they
    /// are now. What it did is put in force by [`Planner::install`].
    pub fn refit_job(&self) -> RefitJob {
        let from = self.fit_from();
        RefitJob {
            watermark: self.watermark,
            distiller: self.distiller.clone(),
            policy: self.policy.clone(),
            from,
            log: self.window.covers(from).then(|| self.window.after(from)),
        }
    }

    /// Puts in force the distiller a [`RefitJob`] fitted, and keeps what it read of the log in
    /// the window of experiences; returns what the fit decided.
    pub fn install(&mut self, refit: Refit) -> Option<DistillOutcome> {
        self.distiller = refit.distiller;
        if let Some(read) = refit.read {
            self.window.merge(read);
        }
        refit.outcome
    }

    /// Where the log must be read from to fill the window of experiences that the ranker's
    /// next fit reads, when it does not hold them yet (after a start): the rows after this,
    /// read into [`FitWindow::read`] with [`Planner::reward`] and given to
    /// [`Planner::fill_window`]. `None` when distillation is off or the window holds them.
    pub fn window_reads_from(&self) -> Option<u64> {
        let from = self.fit_from();
        (self.distiller.config.every > 0 && !self.window.covers(from)).then_some(from)
    }

    /// Takes in a window of experiences read from the log ([`Planner::window_reads_from`]):
    /// the next fit reads it instead of the log.
    pub fn fill_window(&mut self, read: FitWindow) {
        self.window.merge(read);
    }

    /// How a run's first attempt is rewarded, for [`FitWindow::read`].
    pub fn reward(&self) -> &RewardParams {
        &self.policy.config().reward
    }

    /// The window of the newest experiences that the ranker's fit reads.
    pub fn fit_window(&self) -> &FitWindow {
        &self.window
    }

    /// A plan for `task`: a new one (`base: None`, [`Planner::route`]), or `base` repaired: each
    /// of its arms that `exclude` rules out (stage, tool, strategy) is replaced by the policy's
    /// fallback among the arms not ruled out.
    pub fn choose(
        &mut self,
        task: &Task,
        base: Option<Vec<ArmChoice>>,
        exclude: &[(String, String, String)],
    ) -> Result<PlanChoice, PlanError> {
        let Some(mut arms) = base else {
            return Ok(self.route(task));
        };
        for (s, stage) in self.policy.stages().to_vec().iter().enumerate() {
            let Some(current) = arms.get(s) else {
                return Err(PlanError::MissingStage {
                    stage: stage.stage.clone(),
                });
            };
            let is_out = |tool: &str, strategy: &str| {
                exclude
                    .iter()
                    .any(|(st, t, g)| st == &stage.stage && t == tool && g == strategy)
            };
            if !is_out(&current.tool, &current.strategy) {
                continue;
            }
            let tried: Vec<usize> = stage
                .arms
                .iter()
                .enumerate()
                .filter(|(_, a)| is_out(&a.tool, &a.strategy))
                .map(|(i, _)| i)
                .collect();
            let Some((pick, propensity)) =
                self.policy
                    .fallback_with_propensity(&task.features, s, &tried, &mut self.rng)
            else {
                return Err(PlanError::Exhausted {
                    stage: stage.stage.clone(),
                    tried: tried.len(),
                });
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
        // The ranker's and the SOP's plans are weighed on the beliefs the choice draws from.
        let (policy, draws) = (&self.policy, &mut self.draws);
        let exploit = self.distiller.exploit_plan(policy, features, |plan| {
            draws.shortfall(policy, features, plan)
        });
        // The SOP in force, with its plan's arm indices and its share: one that matches, fits
        // the stages, and that the policy's own evidence since the promotion (a drift, say) has
        // not overtaken. A stable procedure first, then a candidate procedure on trial, then a
        // stable plan.
        let (stable, candidate) = if self.sops_on {
            self.sops.matching(features)
        } else {
            (None, None)
        };
        let pick = match (stable, candidate) {
            (Some(s), _) if !s.procedure.is_empty() => Some((s, self.sops.sop_share())),
            (_, Some(c)) => Some((c, self.sops.config.trial_share.clamp(0.0, 1.0))),
            (s, None) => s.map(|s| (s, self.sops.sop_share())),
        };
        let in_force = pick.and_then(|(sop, share)| {
            let indices = self.policy.choice_indices(&sop.plan)?;
            let gap = self.draws.shortfall(&self.policy, features, &indices)?;
            (gap <= self.sops.config.defer_margin).then_some((sop, indices, share))
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
                .map(|(_, indices, share)| (indices.as_slice(), *share)),
            exploring: &exploring,
        };
        let choice = self
            .policy
            .choose_tabled(features, routing, &mut self.draws, &mut self.rng);
        self.ranked_choices += u64::from(choice.ranked);
        if !choice.explored.is_empty() {
            self.in_flight
                .push((task.task_id.clone(), self.choices, choice.explored.clone()));
        }
        let arms = choice.arm_choices();
        let mut plan = match in_force {
            Some((sop, ..)) if choice.sop => {
                let mut plan = PlanChoice::new(arms, Some(sop.sop_id.clone()), true);
                plan.plan_id = sop_plan_id(&sop.sop_id, sop.version);
                plan.sop_version = Some(sop.version);
                plan.procedure = sop.procedure.clone();
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
}

/// The procedures a run's agent stages made, from its answer steps ([`PROCEDURE_KEY`]); empty
/// when a stage left none (a step whose record does not read is no procedure).
pub fn procedures_of(exp: &ExperienceTuple) -> Vec<Procedure> {
    exp.steps
        .iter()
        .filter_map(|s| s.metadata.get(PROCEDURE_KEY))
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect()
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
