//! sim_run: the core-level learning simulation: runs tasks of a simulated environment through
//! the policy (no actors), with infrastructure retries and one fallback per failed stage, and
//! computes the learning KPIs of FORMAT.md (regret against the oracle and the random baseline,
//! per-window series, drift recovery). `feedback_delay` chooses tasks before earlier ones are
//! learned, as the tree does with several tasks in flight.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::learn::bandit::{
    Arm, Observation, Policy, PolicyConfig, PolicyError, RewardParams, StageArms, StageObservation,
    StageOutcome,
};
use crate::learn::distill::{DistillConfig, Distiller};
use crate::learn::ope::LogRecord;
use crate::learn::sop::{SopBook, SopConfig, SopEvent};
use crate::record::ArmChoice;
use crate::taxonomy::FailureCategory;
use crate::tools::sim::SimEnv;
use crate::tools::tool::{CallContext, Tool, ToolError, ToolOutput};

/// Errors of the simulation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimRunError {
    /// The policy could not be built for the environment.
    #[error("environment `{env}`: {source}")]
    Policy {
        /// The environment.
        env: String,
        /// Why.
        source: PolicyError,
    },
    /// The environment names a tool it does not provide, or a tool call did not complete.
    #[error("environment `{env}`: {reason}")]
    Env {
        /// The environment.
        env: String,
        /// Why.
        reason: String,
    },
}

/// How the simulation runs tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SimRunConfig {
    /// Retries of a call after an infrastructure fault (same arm).
    pub infra_retries: u32,
    /// Fallback arms tried after a stage's arm failed on its own (strategy failure, invalid).
    pub stage_fallbacks: u32,
    /// Tasks per window of the KPI series.
    pub window: u64,
    /// Tasks after a drift point within which the drifted clusters must have recovered.
    pub recovery_tasks: u64,
    /// Whether to keep the per-task trace.
    pub trace: bool,
    /// The ranker distilled from the run's log as it goes (as the policy actor does).
    pub distill: DistillConfig,
    /// Tasks chosen before an earlier task's outcome is learned (0: each outcome is learned
    /// before the next task is chosen; `k`: as with `k + 1` tasks in flight at once).
    #[serde(default)]
    pub feedback_delay: u32,
}

impl Default for SimRunConfig {
    fn default() -> Self {
        SimRunConfig {
            infra_retries: 3,
            stage_fallbacks: 1,
            window: 100,
            recovery_tasks: 150,
            trace: false,
            distill: DistillConfig::default(),
            feedback_delay: 0,
        }
    }
}

/// KPIs of one window of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowKpi {
    /// First task index.
    pub start: u64,
    /// One past the last task index.
    pub end: u64,
    /// Share of tasks that passed.
    pub success_rate: f64,
    /// Mean reward earned.
    pub mean_reward: f64,
    /// Mean regret of the first attempt's plan.
    pub mean_regret: f64,
    /// Regret over the random baseline's regret in the window.
    pub regret_ratio: f64,
    /// Share of choices that were not the greedy plan.
    pub exploration_rate: f64,
}

/// How the policy followed the drift of the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftRecovery {
    /// The first drift point.
    pub after_task: u64,
    /// Tasks a drift entry applies to, after the drift point.
    pub affected_tasks: u64,
    /// Of those, the ones at least `recovery_tasks` after every drift point that applies.
    pub affected_after_recovery: u64,
    /// Regret ratio of the affected tasks after the recovery allowance.
    pub regret_ratio_after_recovery: f64,
    /// Mean regret of the affected tasks after the recovery allowance.
    pub mean_regret_after_recovery: f64,
    /// Regret ratio of the affected tasks during the recovery allowance.
    pub regret_ratio_during_recovery: f64,
}

/// Follows the tasks a drift entry of an environment applies to, to measure how the policy
/// recovered ([`DriftRecovery`]): those within `recovery_tasks` of a drift point that applies
/// to them count as "during recovery", the later ones as "after recovery".
#[derive(Debug, Clone)]
pub struct DriftTracker {
    /// Per drift entry: its start and its feature conditions.
    points: Vec<(u64, BTreeMap<String, String>)>,
    recovery_tasks: u64,
    affected: u64,
    /// The affected tasks during and after the recovery allowance.
    during: Acc,
    after: Acc,
}

impl DriftTracker {
    /// A tracker for `env`'s drift entries with a recovery allowance of `recovery_tasks`.
    pub fn new(env: &SimEnv, recovery_tasks: u64) -> DriftTracker {
        DriftTracker {
            points: env
                .spec()
                .drift
                .iter()
                .map(|d| (d.after_task, d.matcher.clone()))
                .collect(),
            recovery_tasks,
            affected: 0,
            during: Acc::default(),
            after: Acc::default(),
        }
    }

    /// Adds task `index` with `features`, the regret of its first plan and the random baseline's.
    pub fn add(
        &mut self,
        index: u64,
        features: &BTreeMap<String, String>,
        regret: f64,
        random_regret: f64,
    ) {
        let applying: Vec<u64> = self
            .points
            .iter()
            .filter(|(after, m)| {
                index >= *after && m.iter().all(|(k, v)| features.get(k) == Some(v))
            })
            .map(|(after, _)| *after)
            .collect();
        if applying.is_empty() {
            return;
        }
        self.affected += 1;
        let acc = if applying.iter().any(|a| index < a + self.recovery_tasks) {
            &mut self.during
        } else {
            &mut self.after
        };
        acc.add_regret(regret, random_regret);
    }

    /// The recovery figures, when the environment drifts within the first `tasks` tasks.
    pub fn finish(&self, tasks: u64) -> Option<DriftRecovery> {
        let first = self.points.iter().map(|(after, _)| *after).min()?;
        (first < tasks).then(|| DriftRecovery {
            after_task: first,
            affected_tasks: self.affected,
            affected_after_recovery: self.after.n,
            regret_ratio_after_recovery: self.after.ratio(),
            mean_regret_after_recovery: self.after.div(self.after.regret),
            regret_ratio_during_recovery: self.during.ratio(),
        })
    }
}

/// One task of the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskTrace {
    /// Task index.
    pub task: u64,
    /// Its features.
    pub features: BTreeMap<String, String>,
    /// The first attempt's arms as `tool/strategy`, in stage order.
    pub plan: Vec<String>,
    /// The first attempt's arms with their propensities.
    pub arms: Vec<ArmChoice>,
    /// Whether it passed.
    pub passed: bool,
    /// Reward earned.
    pub reward: f64,
    /// Regret of the first attempt's plan.
    pub regret: f64,
    /// Regret the policy's greedy plan would have had.
    pub greedy_regret: f64,
}

/// What a learning simulation measured (FORMAT.md's KPIs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearningReport {
    /// The environment's name.
    pub env: String,
    /// The seed.
    pub seed: u64,
    /// Tasks run.
    pub tasks: u64,
    /// Share of tasks that passed.
    pub success_rate: f64,
    /// Mean reward earned.
    pub mean_reward: f64,
    /// Mean expected reward of the oracle's plans.
    pub oracle_mean_reward: f64,
    /// Mean expected reward of a uniformly random plan.
    pub random_mean_reward: f64,
    /// Sum over tasks of oracle minus the chosen plan's expected reward.
    pub cumulative_regret: f64,
    /// The same for the random baseline.
    pub random_cumulative_regret: f64,
    /// `cumulative_regret / random_cumulative_regret`.
    pub regret_ratio: f64,
    /// Sum over tasks of oracle minus the expected reward of the policy's greedy plan when it
    /// chose: the regret of what the policy believed (its ignorance).
    pub greedy_regret: f64,
    /// `cumulative_regret - greedy_regret`: what departing from its beliefs cost (exploration,
    /// and a promoted ranker's plan in place of the greedy one; negative when they did better).
    pub exploration_regret: f64,
    /// Share of the last 100 choices that were not the greedy plan.
    pub exploration_rate_last_100: f64,
    /// Infrastructure failures the policy learned from (must be 0).
    pub infra_failures_learned_from: u64,
    /// Infrastructure failures seen (and ignored).
    pub infra_failures_seen: u64,
    /// Changes detected by the policy.
    pub changes_detected: u64,
    /// SOPs promoted (shadow book: recorded, not routed).
    pub sops_promoted: u64,
    /// Distillations of the ranker (fit and off-policy evaluation).
    #[serde(default)]
    pub ranker_fits: u64,
    /// Distillations that put the ranker in force.
    #[serde(default)]
    pub ranker_promotions: u64,
    /// Share of the last 100 choices whose plan came from the ranker.
    #[serde(default)]
    pub ranker_share_last_100: f64,
    /// KPIs per window.
    pub windows: Vec<WindowKpi>,
    /// Drift recovery, when the environment drifts.
    pub drift: Option<DriftRecovery>,
    /// Per-task trace, when asked for.
    pub trace: Vec<TaskTrace>,
}

/// The policy's stages and arms for an environment.
pub fn stage_arms(env: &SimEnv) -> Vec<StageArms> {
    env.stages()
        .iter()
        .map(|s| StageArms {
            stage: s.name.clone(),
            arms: s
                .arms
                .iter()
                .map(|a| Arm::new(a.tool.clone(), a.strategy.clone()))
                .collect(),
        })
        .collect()
}

/// The policy's reward for an environment.
pub fn reward_params(env: &SimEnv) -> RewardParams {
    let r = env.reward_config();
    RewardParams {
        success: r.success,
        latency: r.latency,
        cost: r.cost,
        max_cost: r.max_cost,
        sla_ms: r.sla_ms,
    }
}

/// Polls a tool future that completes without waiting (simulated tools do).
fn call_now(
    tool: &dyn Tool,
    args: Value,
    ctx: &CallContext,
) -> Option<Result<ToolOutput, ToolError>> {
    let mut fut = tool.call(args, ctx);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

struct Exec {
    /// The first attempt's reward (every stage's first arm valid, priced by their own latency
    /// and cost; 0 when one failed on its own; `None` after an infrastructure fault).
    first: Option<f64>,
    passed: bool,
    latency: f64,
    cost: f64,
    obs: Vec<StageObservation>,
}

struct Runner<'a> {
    env: &'a SimEnv,
    tools: HashMap<String, Arc<dyn Tool>>,
    cfg: &'a SimRunConfig,
}

impl Runner<'_> {
    fn err(&self, reason: String) -> SimRunError {
        SimRunError::Env {
            env: self.env.name().to_string(),
            reason,
        }
    }

    /// Runs a task: per stage the chosen arm (infrastructure faults retried on the same arm),
    /// then up to `stage_fallbacks` other arms chosen by the policy if it failed on its own.
    fn run_task(
        &self,
        policy: &Policy,
        index: u64,
        features: &BTreeMap<String, String>,
        plan: &[usize],
        rng: &mut fastrand::Rng,
    ) -> Result<Exec, SimRunError> {
        let mut ex = Exec {
            first: None,
            passed: true,
            latency: 0.0,
            cost: 0.0,
            obs: Vec::new(),
        };
        // The first attempt: `Some(true)` while every first arm was valid.
        let mut first_ok: Option<bool> = Some(true);
        let (mut first_latency, mut first_cost) = (0.0, 0.0);
        for (s, stage) in self.env.stages().iter().enumerate() {
            let mut tried = vec![plan[s]];
            let mut arm_i = plan[s];
            let mut attempt = 0u32;
            let mut call = 0u32;
            let stage_ok = loop {
                let arm = stage
                    .arms
                    .get(arm_i)
                    .ok_or_else(|| self.err(format!("stage `{}` arm {arm_i}", stage.name)))?;
                let tool = self
                    .tools
                    .get(&arm.tool)
                    .ok_or_else(|| self.err(format!("no tool `{}`", arm.tool)))?;
                let mut args = arm.params.clone();
                args.insert("strategy".into(), Value::String(arm.strategy.clone()));
                let mut infra_left = self.cfg.infra_retries;
                let outcome = loop {
                    let ctx = CallContext {
                        run_id: format!("sim-{index}"),
                        task_index: index,
                        attempt,
                        stage: stage.name.clone(),
                        call,
                        features: features.clone(),
                    };
                    call += 1;
                    let r = call_now(tool.as_ref(), Value::Object(args.clone()), &ctx)
                        .ok_or_else(|| self.err(format!("tool `{}` did not complete", arm.tool)))?;
                    let (outcome, lat, cost) = match r {
                        Ok(out) => {
                            let o = if self.env.validate(&stage.name, &out.value).is_ok() {
                                StageOutcome::Valid
                            } else {
                                StageOutcome::Invalid
                            };
                            (o, out.latency_ms, out.cost)
                        }
                        Err(e) => (StageOutcome::Failed(e.category), e.latency_ms, e.cost),
                    };
                    ex.latency += lat;
                    ex.cost += cost;
                    ex.obs.push(StageObservation {
                        stage: stage.name.clone(),
                        arm: Arm::new(arm.tool.clone(), arm.strategy.clone()),
                        outcome,
                        latency_ms: lat,
                        cost,
                    });
                    if outcome == StageOutcome::Failed(FailureCategory::Infrastructure)
                        && infra_left > 0
                    {
                        infra_left -= 1;
                        continue;
                    }
                    break outcome;
                };
                if tried.len() == 1 && first_ok == Some(true) {
                    match outcome {
                        StageOutcome::Valid => {
                            if let Some(o) = ex.obs.last() {
                                first_latency += o.latency_ms;
                                first_cost += o.cost;
                            }
                        }
                        StageOutcome::Failed(FailureCategory::Infrastructure) => first_ok = None,
                        _ => first_ok = Some(false),
                    }
                }
                if outcome == StageOutcome::Valid {
                    break true;
                }
                if outcome == StageOutcome::Failed(FailureCategory::Infrastructure)
                    || tried.len() > self.cfg.stage_fallbacks as usize
                {
                    break false;
                }
                match policy.fallback(features, s, &tried, rng) {
                    Some(next) => {
                        tried.push(next);
                        arm_i = next;
                        attempt += 1;
                        call = 0;
                    }
                    None => break false,
                }
            };
            if !stage_ok {
                ex.passed = false;
                break;
            }
        }
        let reward = reward_params(self.env);
        ex.first = first_ok.map(|ok| {
            if ok {
                reward.passed_value(first_latency, first_cost)
            } else {
                0.0
            }
        });
        Ok(ex)
    }
}

/// Learns `observations` in order; returns the infrastructure failures among them (ignored).
fn learn(policy: &mut Policy, observations: impl Iterator<Item = Observation>) -> u64 {
    observations
        .map(|obs| u64::from(policy.update(&obs).infra_ignored))
        .sum()
}

/// Share of the last 100 of `flags` that are `value` (0 when there are none).
fn share_of_last_100(flags: &[bool], value: bool) -> f64 {
    let last = &flags[flags.len().saturating_sub(100)..];
    if last.is_empty() {
        0.0
    } else {
        last.iter().filter(|f| **f == value).count() as f64 / last.len() as f64
    }
}

#[derive(Debug, Clone, Default)]
struct Acc {
    n: u64,
    passed: u64,
    reward: f64,
    regret: f64,
    random_regret: f64,
    explored: u64,
}

impl Acc {
    fn add(&mut self, passed: bool, reward: f64, regret: f64, random_regret: f64, greedy: bool) {
        self.n += 1;
        self.passed += u64::from(passed);
        self.reward += reward;
        self.regret += regret;
        self.random_regret += random_regret;
        self.explored += u64::from(!greedy);
    }
    /// Counts a task by its regret alone.
    fn add_regret(&mut self, regret: f64, random_regret: f64) {
        self.n += 1;
        self.regret += regret;
        self.random_regret += random_regret;
    }
    fn ratio(&self) -> f64 {
        if self.random_regret > 1e-12 {
            self.regret / self.random_regret
        } else {
            0.0
        }
    }
    fn div(&self, x: f64) -> f64 {
        if self.n == 0 { 0.0 } else { x / self.n as f64 }
    }
}

/// The regret of the policy's greedy plan `greedy` (arm indices) for task `index`: the oracle's
/// expected reward `oracle` minus the plan's.
fn greedy_regret(
    env: &SimEnv,
    policy: &Policy,
    index: u64,
    features: &BTreeMap<String, String>,
    greedy: &[usize],
    oracle: f64,
) -> Result<f64, String> {
    let arms = policy
        .plan_arms(greedy)
        .ok_or_else(|| format!("the greedy plan {greedy:?} is not a plan of the policy"))?;
    let plan: Vec<(String, String)> = arms.into_iter().map(|a| (a.tool, a.strategy)).collect();
    let value = env
        .expected_reward(index, features, &plan)
        .map_err(|e| e.to_string())?;
    Ok((oracle - value).max(0.0))
}

/// Runs `tasks` tasks of `env` (drawn with `seed`) through a fresh policy with `policy_config`
/// (its reward is replaced by the environment's) and measures the KPIs.
pub fn run_learning(
    env: &SimEnv,
    policy_config: PolicyConfig,
    tasks: u64,
    seed: u64,
) -> Result<LearningReport, SimRunError> {
    run_learning_with(env, policy_config, &SimRunConfig::default(), tasks, seed).map(|(r, _)| r)
}

/// [`run_learning`] with the simulation's own configuration; also returns the trained policy.
pub fn run_learning_with(
    env: &SimEnv,
    mut policy_config: PolicyConfig,
    cfg: &SimRunConfig,
    tasks: u64,
    seed: u64,
) -> Result<(LearningReport, Policy), SimRunError> {
    policy_config.reward = reward_params(env);
    let mut policy =
        Policy::new(policy_config, stage_arms(env)).map_err(|source| SimRunError::Policy {
            env: env.name().to_string(),
            source,
        })?;
    let seeded = env.clone().with_seed(seed);
    let tools: HashMap<String, Arc<dyn Tool>> = seeded
        .tools()
        .into_iter()
        .map(|t| (t.spec().name.clone(), t))
        .collect();
    let runner = Runner {
        env: &seeded,
        tools,
        cfg,
    };
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_b0a7);
    let mut sops = SopBook::new(SopConfig::default());
    let mut sops_promoted = 0u64;
    let mut drift = DriftTracker::new(env, cfg.recovery_tasks);
    let mut total = Acc::default();
    let mut window = Acc::default();
    let mut windows = Vec::new();
    let mut recent: Vec<bool> = Vec::new();
    let mut oracle_sum = 0.0;
    let mut random_sum = 0.0;
    let mut trace = Vec::new();
    let mut infra_seen = 0u64;
    let mut greedy_sum = 0.0;
    // Outcomes not learned yet (at most `feedback_delay` of them).
    let mut pending: VecDeque<Observation> = VecDeque::new();
    // The distiller fits from its own stream, so that the choices do not depend on its fits.
    let mut fit_rng = fastrand::Rng::with_seed(seed ^ 0xd157_111e);
    let mut distiller = Distiller::new(cfg.distill.clone());
    let mut log: Vec<LogRecord> = Vec::new();
    let mut ranked: Vec<bool> = Vec::new();
    let stage_names: Vec<String> = policy.stages().iter().map(|s| s.stage.clone()).collect();
    for index in 0..tasks {
        let task = seeded.draw_task(seed, index);
        let f = &task.features;
        let exploit = distiller.exploit_plan(&policy, f);
        let choice = policy.choose_with(f, exploit.as_deref(), &mut rng);
        ranked.push(choice.ranked);
        let plan = choice.arms();
        let base = seeded.baselines(index, f);
        let (oracle, random) = (base.oracle, base.random);
        let chosen = seeded
            .expected_reward(index, f, &plan)
            .map_err(|e| runner.err(e.to_string()))?;
        let regret = (oracle - chosen).max(0.0);
        let random_regret = (oracle - random).max(0.0);
        let greedy_regret = greedy_regret(&seeded, &policy, index, f, &choice.greedy_plan, oracle)
            .map_err(|e| runner.err(e))?;
        greedy_sum += greedy_regret;
        oracle_sum += oracle;
        random_sum += random;
        let ex = runner.run_task(&policy, index, f, &choice.indices, &mut rng)?;
        let reward = seeded.reward(ex.passed, ex.latency, ex.cost);
        pending.push_back(Observation {
            features: f.clone(),
            stages: ex.obs,
        });
        let due = pending.len().saturating_sub(cfg.feedback_delay as usize);
        infra_seen += learn(&mut policy, pending.drain(..due));
        if let Some(first) = ex.first {
            log.push(LogRecord {
                context: f.clone(),
                stages: stage_names.clone(),
                plan: choice.plan.iter().map(|c| c.arm.clone()).collect(),
                propensity: choice.plan_propensity.clamp(1e-6, 1.0),
                reward: first,
            });
            if distiller.due(log.len() as u64) {
                distiller.refit(log.len() as u64, &log, &policy, &mut fit_rng);
            }
        }
        total.add(ex.passed, reward, regret, random_regret, choice.greedy);
        window.add(ex.passed, reward, regret, random_regret, choice.greedy);
        recent.push(choice.greedy);
        // Shadow SOP book (recorded, not routed, so the regret is the policy's alone).
        let arms: Vec<ArmChoice> = choice.arm_choices();
        sops.record_run(f, &arms, ex.passed, &format!("sim-{index}"), None);
        if (index + 1) % 50 == 0 {
            sops_promoted += sops
                .consolidate(index)
                .iter()
                .filter(|e| matches!(e, SopEvent::Promoted(_)))
                .count() as u64;
        }
        drift.add(index, f, regret, random_regret);
        if cfg.trace {
            trace.push(TaskTrace {
                task: index,
                features: f.clone(),
                plan: plan.iter().map(|(t, s)| format!("{t}/{s}")).collect(),
                arms: arms.clone(),
                passed: ex.passed,
                reward,
                regret,
                greedy_regret,
            });
        }
        if window.n == cfg.window.max(1) || index + 1 == tasks {
            windows.push(WindowKpi {
                start: index + 1 - window.n,
                end: index + 1,
                success_rate: window.div(window.passed as f64),
                mean_reward: window.div(window.reward),
                mean_regret: window.div(window.regret),
                regret_ratio: window.ratio(),
                exploration_rate: window.div(window.explored as f64),
            });
            window = Acc::default();
        }
    }
    // The outcomes still in flight when the last task was chosen are learned all the same.
    infra_seen += learn(&mut policy, pending.drain(..));
    let exploration_rate_last_100 = share_of_last_100(&recent, false);
    let ranker_share_last_100 = share_of_last_100(&ranked, true);
    let drift = drift.finish(tasks);
    let n = tasks.max(1) as f64;
    let report = LearningReport {
        env: env.name().to_string(),
        seed,
        tasks,
        success_rate: total.div(total.passed as f64),
        mean_reward: total.div(total.reward),
        oracle_mean_reward: oracle_sum / n,
        random_mean_reward: random_sum / n,
        cumulative_regret: total.regret,
        random_cumulative_regret: total.random_regret,
        regret_ratio: total.ratio(),
        greedy_regret: greedy_sum,
        exploration_regret: total.regret - greedy_sum,
        exploration_rate_last_100,
        infra_failures_learned_from: policy.infra_learned(),
        infra_failures_seen: infra_seen,
        changes_detected: policy.changes_detected(),
        sops_promoted,
        ranker_fits: distiller.fits,
        ranker_promotions: distiller.promotions,
        ranker_share_last_100,
        windows,
        drift,
        trace,
    };
    Ok((report, policy))
}
