//! distill: the stable ranker distilled from the experience log (importance-weighted logistic
//! regression on hashed features of (context, stage, arm)), the decision to promote it, made by
//! off-policy evaluation against the live policy's greedy plan, the running system's
//! [`Distiller`] (its schedule and the ranker in force), and `hindsight policy evaluate`'s
//! report.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::bandit::{Arm, Policy, StageArms};
use crate::learn::ope::{
    Comparison, Estimate, GreedyTarget, LogRecord, Objective, PolicyGreedyTarget, PolicyModel,
    PolicyTarget, RewardModel, TabularModel, TargetPolicy, compare_terms, doubly_robust, ips,
    log_for, snips,
};
use crate::record::ExperienceTuple;

/// Configuration of the ranker's fit (serde, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankerConfig {
    /// log2 of the hashed feature space.
    pub bits: u32,
    /// Passes over the log.
    pub epochs: usize,
    /// SGD step size.
    pub learning_rate: f64,
    /// L2 regularisation per step.
    pub l2: f64,
    /// Importance weights (1 / propensity, normalised to mean 1) are clipped at this.
    pub max_weight: f64,
}

impl Default for RankerConfig {
    fn default() -> Self {
        RankerConfig {
            bits: 16,
            epochs: 8,
            learning_rate: 0.1,
            l2: 1e-5,
            max_weight: 3.0,
        }
    }
}

/// A linear ranker: the reward of a plan is predicted as `sigmoid(sum over stages of w . phi(
/// context, stage, arm))`, so the best plan is the best arm of every stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranker {
    /// The configuration it was fitted with.
    #[serde(with = "crate::store::envelope::as_json")]
    pub config: RankerConfig,
    /// The stages and their arms.
    pub stages: Vec<StageArms>,
    /// The weights (length `2^bits`; stored sparse, most are 0).
    #[serde(with = "sparse")]
    pub weights: Vec<f64>,
    /// Records it was fitted on.
    pub fitted_on: usize,
}

/// A weight vector stored as its length and its non-zero `(index, weight)` pairs.
mod sparse {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes the length and the non-zero entries.
    pub fn serialize<S: Serializer>(w: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let nz: Vec<(u32, f64)> = w
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(i, v)| (i as u32, *v))
            .collect();
        (w.len() as u32, nz).serialize(s)
    }

    /// Reads them back (an index beyond the length, or a length beyond what a configuration
    /// allows, `2^24`, is an error: a corrupt record must not allocate gigabytes).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        let (len, nz) = <(u32, Vec<(u32, f64)>)>::deserialize(d)?;
        if len > 1 << 24 {
            return Err(D::Error::custom(format!(
                "{len} weights: more than a ranker can have (2^24)"
            )));
        }
        let mut w = vec![0.0; len as usize];
        for (i, v) in nz {
            *w.get_mut(i as usize)
                .ok_or_else(|| D::Error::custom(format!("weight {i} beyond length {len}")))? = v;
        }
        Ok(w)
    }
}

/// FNV-1a, fed piece by piece: the hash of a string is that of its pieces fed in order.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const START: Fnv = Fnv(0xcbf2_9ce4_8422_2325);

    fn feed(self, s: &str) -> Fnv {
        Fnv(s.bytes().fold(self.0, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        }))
    }
}

/// The hashed features of `(context, stage, arm)`: the arm alone, the arm with each feature,
/// and the arm with each pair of features. Each is the FNV-1a hash of its text
/// (`stage|tool/strategy`, then `|key=value` for each feature in it), fed piece by piece
/// rather than formatted.
pub fn hashed_features(
    context: &BTreeMap<String, String>,
    stage: &str,
    arm: &Arm,
    bits: u32,
) -> Vec<usize> {
    let mask = (1u64 << bits.min(30)) - 1;
    let index = |h: Fnv| (h.0 & mask) as usize;
    let base = Fnv::START
        .feed(stage)
        .feed("|")
        .feed(&arm.tool)
        .feed("/")
        .feed(&arm.strategy);
    let with = |h: Fnv, (k, v): (&String, &String)| h.feed("|").feed(k).feed("=").feed(v);
    let n = context.len();
    let mut out = Vec::with_capacity(1 + n + n * n.saturating_sub(1) / 2);
    out.push(index(base));
    for (i, p) in context.iter().enumerate() {
        let one = with(base, p);
        out.push(index(one));
        for q in context.iter().skip(i + 1) {
            out.push(index(with(one, q)));
        }
    }
    out
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl Ranker {
    /// Fits a ranker on the log (records whose stages differ from `stages` are skipped).
    pub fn fit<R: Borrow<LogRecord>>(
        log: &[R],
        stages: &[StageArms],
        config: RankerConfig,
        rng: &mut fastrand::Rng,
    ) -> Ranker {
        let dim = 1usize << config.bits.min(30);
        let mut weights = vec![0.0; dim];
        let examples: Vec<(Vec<usize>, f64, f64)> = log
            .iter()
            .map(R::borrow)
            .filter(|r| r.has_stages(stages))
            .map(|r| {
                let feats: Vec<usize> = r
                    .stages
                    .iter()
                    .zip(&r.plan)
                    .flat_map(|(s, a)| hashed_features(&r.context, s, a, config.bits))
                    .collect();
                (feats, r.reward, 1.0 / r.propensity)
            })
            .collect();
        let mean_w = if examples.is_empty() {
            1.0
        } else {
            examples.iter().map(|e| e.2).sum::<f64>() / examples.len() as f64
        };
        let mut order: Vec<usize> = (0..examples.len()).collect();
        for epoch in 0..config.epochs {
            rng.shuffle(&mut order);
            let lr = config.learning_rate / (1.0 + epoch as f64 * 0.5);
            for &i in &order {
                let (feats, y, w) = &examples[i];
                let w = (w / mean_w).min(config.max_weight);
                let z: f64 = feats.iter().map(|&f| weights[f]).sum();
                let g = (sigmoid(z) - y) * w;
                for &f in feats {
                    weights[f] -= lr * (g + config.l2 * weights[f]);
                }
            }
        }
        Ranker {
            config,
            stages: stages.to_vec(),
            weights,
            fitted_on: examples.len(),
        }
    }

    fn stage_score(&self, context: &BTreeMap<String, String>, stage: &str, arm: &Arm) -> f64 {
        hashed_features(context, stage, arm, self.config.bits)
            .into_iter()
            .map(|f| self.weights.get(f).copied().unwrap_or(0.0))
            .sum()
    }

    /// Scores of the arms of one stage (higher is better), in the stage's arm order.
    pub fn score_stage(&self, context: &BTreeMap<String, String>, stage: usize) -> Vec<f64> {
        let Some(st) = self.stages.get(stage) else {
            return Vec::new();
        };
        st.arms
            .iter()
            .map(|a| self.stage_score(context, &st.stage, a))
            .collect()
    }

    /// The ranker's plan: the best-scoring arm of every stage.
    pub fn best_plan(&self, context: &BTreeMap<String, String>) -> Vec<Arm> {
        self.stages
            .iter()
            .enumerate()
            .filter_map(|(i, st)| {
                let scores = self.score_stage(context, i);
                scores
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .and_then(|(a, _)| st.arms.get(a).cloned())
            })
            .collect()
    }
}

impl RewardModel for Ranker {
    fn predict(&self, context: &BTreeMap<String, String>, plan: &[Arm]) -> f64 {
        let z: f64 = self
            .stages
            .iter()
            .zip(plan)
            .map(|(s, a)| self.stage_score(context, &s.stage, a))
            .sum();
        sigmoid(z)
    }
}

impl TargetPolicy for Ranker {
    fn distribution(&self, context: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
        vec![(self.best_plan(context), 1.0)]
    }
}

/// Paired doubly robust comparison of a ranker's plan against `policy`'s greedy plan on `hold`,
/// with the policy's own beliefs as the reward model: the ranker comes out ahead only on
/// evidence (the importance-weighted residuals of the logged plans) that it does better than
/// the policy expects, never on a model's guess about plans the log hardly tried. Where the two
/// plans agree the difference is exactly 0.
pub fn ranker_vs_greedy<R: Borrow<LogRecord>>(
    hold: &[R],
    ranker: &Ranker,
    policy: &Policy,
) -> Comparison {
    let n = hold.len();
    let (mut a, mut b, mut wa, mut wb) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    // Held-out rows share a few task contexts: their beliefs, greedy plan and the ranker's
    // plan are worked out once per context.
    let mut by_context = BTreeMap::new();
    for r in hold.iter().map(R::borrow) {
        let (beliefs, greedy, greedy_value, candidate) =
            &*by_context.entry(&r.context).or_insert_with(|| {
                let beliefs = policy.beliefs(&r.context);
                let (greedy, greedy_value) = beliefs.greedy();
                let candidate = policy
                    .plan_indices(&ranker.best_plan(&r.context))
                    .unwrap_or_else(|| greedy.clone());
                (beliefs, greedy, greedy_value, candidate)
            });
        let logged = policy.plan_indices(&r.plan);
        let residual = logged
            .as_ref()
            .map(|l| (r.reward - beliefs.value(l)) / r.propensity)
            .unwrap_or(0.0);
        let hit = |plan: &[usize]| logged.as_deref() == Some(plan);
        let w = |plan: &[usize]| if hit(plan) { 1.0 / r.propensity } else { 0.0 };
        a.push(beliefs.value(candidate) + if hit(candidate) { residual } else { 0.0 });
        b.push(*greedy_value + if hit(greedy) { residual } else { 0.0 });
        wa.push(w(candidate));
        wb.push(w(greedy));
    }
    compare_terms(&a, &b, &wa, &wb)
}

/// Splits a log (oldest first) into the rows that fit and the newest `share` held out to
/// evaluate on: at least one row on each side when there are two or more.
fn split_holdout<R>(log: &[R], share: f64) -> (&[R], &[R]) {
    let n_hold = ((log.len() as f64) * share.clamp(0.0, 1.0)).round() as usize;
    let n_hold = if log.len() >= 2 {
        n_hold.clamp(1, log.len() - 1)
    } else {
        log.len()
    };
    log.split_at(log.len() - n_hold)
}

/// How a [`Promotion::reason`] refused for too small an effective sample begins.
pub const TOO_LITTLE_SUPPORT: &str = "too little support";

/// Whether to promote a candidate, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Promotion {
    /// Promote?
    pub promote: bool,
    /// Lower confidence bound of candidate minus incumbent.
    pub lower_bound: f64,
    /// A sentence for the diary.
    pub reason: String,
}

/// Promotes the candidate only when off-policy evaluation says it is not worse: the lower bound
/// `diff - z * diff_se` of the paired difference is at least `-margin`, with at least
/// `min_effective_n` effective samples behind the candidate's estimate.
pub fn promotion_decision(
    cmp: &Comparison,
    margin: f64,
    z: f64,
    min_effective_n: f64,
) -> Promotion {
    let lower_bound = cmp.diff - z * cmp.diff_se;
    if cmp.candidate.effective_n < min_effective_n {
        return Promotion {
            promote: false,
            lower_bound,
            reason: format!(
                "{TOO_LITTLE_SUPPORT}: effective sample {:.1} < {min_effective_n}",
                cmp.candidate.effective_n
            ),
        };
    }
    let promote = lower_bound >= -margin;
    Promotion {
        promote,
        lower_bound,
        reason: format!(
            "candidate {:.4} vs incumbent {:.4}: difference {:+.4} (lower bound {:+.4}, margin {margin}) -> {}",
            cmp.candidate.value,
            cmp.incumbent.value,
            cmp.diff,
            lower_bound,
            if promote {
                "promote"
            } else {
                "keep the incumbent"
            }
        ),
    }
}

/// How the running system distils its ranker (serde, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DistillConfig {
    /// Fit and evaluate a new ranker every this many new log rows (0 = never).
    pub every: u64,
    /// The newest rows a fit reads.
    pub window: usize,
    /// Usable rows needed before a first fit.
    pub min_rows: usize,
    /// Share of those rows (the newest) held out to evaluate the fitted ranker on.
    pub holdout_share: f64,
    /// The ranker's fit.
    pub ranker: RankerConfig,
    /// The ranker is promoted when the lower bound of its paired difference over the policy's
    /// greedy plan is at least `-margin`.
    pub margin: f64,
    /// Normal quantile of that bound.
    pub z: f64,
    /// Minimum effective sample size behind the ranker's estimate.
    pub min_effective_n: f64,
    /// A ranker in force plans a task only while the policy expects at most this much less
    /// reward from the ranker's plan than from its own greedy plan; beyond, the policy plans.
    /// A ranker is distilled from the past: after a drift that the policy has detected and
    /// followed, the ranker still plans what used to work until the next fit.
    pub defer_margin: f64,
}

impl Default for DistillConfig {
    fn default() -> Self {
        DistillConfig {
            every: 200,
            window: 2000,
            min_rows: 200,
            holdout_share: 0.3,
            ranker: RankerConfig::default(),
            margin: 0.0,
            z: 1.96,
            min_effective_n: 30.0,
            defer_margin: 0.05,
        }
    }
}

/// A distillation setting out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("distill.{field}: {reason}")]
pub struct DistillConfigError {
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl DistillConfig {
    /// Checks every setting (they are stored as JSON, which has no infinities or NaN).
    pub fn validate(&self) -> Result<(), DistillConfigError> {
        let bad = |field: &'static str, reason: &str| {
            Err(DistillConfigError {
                field,
                reason: reason.to_string(),
            })
        };
        if !(self.holdout_share > 0.0 && self.holdout_share < 1.0) {
            return bad("holdout_share", "must be in (0, 1)");
        }
        if !(self.margin.is_finite() && self.margin >= 0.0) {
            return bad("margin", "must be a finite number >= 0");
        }
        if !(self.z.is_finite() && self.z >= 0.0) {
            return bad("z", "must be a finite number >= 0");
        }
        if !(self.min_effective_n.is_finite() && self.min_effective_n >= 0.0) {
            return bad("min_effective_n", "must be a finite number >= 0");
        }
        if !(self.defer_margin.is_finite() && self.defer_margin >= 0.0) {
            return bad("defer_margin", "must be a finite number >= 0");
        }
        if self.window < 2 {
            return bad("window", "must be at least 2");
        }
        let r = &self.ranker;
        if !(1..=24).contains(&r.bits) {
            return bad("ranker.bits", "must be in 1..=24");
        }
        if !(r.learning_rate.is_finite() && r.learning_rate > 0.0) {
            return bad("ranker.learning_rate", "must be a finite number > 0");
        }
        if !(r.l2.is_finite() && r.l2 >= 0.0 && r.max_weight.is_finite() && r.max_weight > 0.0) {
            return bad(
                "ranker.l2/max_weight",
                "must be finite, l2 >= 0 and max_weight > 0",
            );
        }
        Ok(())
    }
}

/// What one distillation decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DistillOutcome {
    /// Rows the ranker was fitted on.
    pub fitted_on: usize,
    /// Rows it was evaluated on.
    pub evaluated_on: usize,
    /// Paired doubly robust comparison of the ranker against the policy's greedy plan.
    pub comparison: Comparison,
    /// The decision.
    pub promotion: Promotion,
    /// Whether a ranker was in force before (so a refusal is a demotion).
    pub was_active: bool,
}

/// The running system's distillation: every [`DistillConfig::every`] rows it fits a ranker on
/// the newest log rows (first-attempt rewards, what the policy and the regret measure), evaluates
/// it off-policy on the newest of them against the policy's greedy plan, and keeps it in force
/// only while that evaluation says it is not worse; the policy then takes the ranker's plan for
/// its exploit share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distiller {
    /// The configuration (stored as JSON text).
    #[serde(with = "crate::store::envelope::as_json")]
    pub config: DistillConfig,
    /// Rows seen at the last fit.
    pub last_at: u64,
    /// The ranker in force, if one was promoted.
    pub active: Option<Ranker>,
    /// Fits made.
    pub fits: u64,
    /// Fits that promoted their ranker.
    pub promotions: u64,
    /// The last decision.
    pub last: Option<Promotion>,
}

impl Distiller {
    /// A distiller with no ranker in force.
    pub fn new(config: DistillConfig) -> Distiller {
        Distiller {
            config,
            last_at: 0,
            active: None,
            fits: 0,
            promotions: 0,
            last: None,
        }
    }

    /// Whether a fit is due with `rows` rows logged (at least `min_rows`, `every` since the last).
    pub fn due(&self, rows: u64) -> bool {
        self.config.every > 0
            && rows >= self.config.min_rows as u64
            && rows >= self.last_at.saturating_add(self.config.every)
    }

    /// Fits a ranker on `log` (oldest first; its newest `window` rows are read), evaluates it
    /// against `policy`'s greedy plan and puts it in force or withdraws the one in force.
    /// `rows` is the log's length, for the schedule. `None` when too few rows are usable.
    pub fn refit<R: Borrow<LogRecord>>(
        &mut self,
        rows: u64,
        log: &[R],
        policy: &Policy,
        rng: &mut fastrand::Rng,
    ) -> Option<DistillOutcome> {
        self.last_at = rows;
        let c = &self.config;
        // The newest `window` usable rows, oldest first.
        let mut usable: Vec<&LogRecord> = log
            .iter()
            .map(R::borrow)
            .rev()
            .filter(|r| r.has_stages(policy.stages()))
            .take(c.window.max(1))
            .collect();
        usable.reverse();
        if usable.len() < c.min_rows.max(2) {
            return None;
        }
        let (train, hold) = split_holdout(&usable, c.holdout_share.clamp(0.05, 0.95));
        let ranker = Ranker::fit(train, policy.stages(), c.ranker.clone(), rng);
        let comparison = ranker_vs_greedy(hold, &ranker, policy);
        let promotion = promotion_decision(&comparison, c.margin, c.z, c.min_effective_n);
        let was_active = self.active.is_some();
        self.fits += 1;
        if promotion.promote {
            self.promotions += 1;
            self.active = Some(ranker);
        } else {
            self.active = None;
        }
        self.last = Some(promotion.clone());
        Some(DistillOutcome {
            fitted_on: train.len(),
            evaluated_on: hold.len(),
            comparison,
            promotion,
            was_active,
        })
    }

    /// The ranker's plan for `features` as the policy's arm indices, when one is in force and
    /// the policy does not expect clearly less from it than from its own greedy plan (by more
    /// than [`DistillConfig::defer_margin`]); `shortfall` is the policy's [`Policy::shortfall_of`]
    /// of a plan, from beliefs the caller may hold already.
    pub fn exploit_plan(
        &self,
        policy: &Policy,
        features: &BTreeMap<String, String>,
        shortfall: impl FnOnce(&[usize]) -> Option<f64>,
    ) -> Option<Vec<usize>> {
        let plan = policy.plan_indices(&self.active.as_ref()?.best_plan(features))?;
        (shortfall(&plan)? <= self.config.defer_margin).then_some(plan)
    }
}

/// How `evaluate_log` evaluates (serde, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvaluationConfig {
    /// Share of the log (its newest rows) held out for evaluation; the rest fits the ranker and
    /// the reward model.
    pub holdout_share: f64,
    /// Importance weights of IPS are clipped at this.
    pub clip: f64,
    /// Posterior draws per context for the live policy's distribution.
    pub draws: usize,
    /// Seed of every draw.
    pub seed: u64,
    /// The ranker's fit.
    pub ranker: RankerConfig,
    /// The ranker is promoted when the lower bound of its difference over the live policy's
    /// greedy plan is at least `-margin`.
    pub margin: f64,
    /// Normal quantile of that bound.
    pub z: f64,
    /// Minimum effective sample size behind the ranker's estimate.
    pub min_effective_n: f64,
    /// What a row's reward measures.
    pub objective: Objective,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        EvaluationConfig {
            holdout_share: 0.3,
            clip: 50.0,
            draws: 64,
            seed: 7,
            ranker: RankerConfig::default(),
            margin: 0.0,
            z: 1.96,
            min_effective_n: 30.0,
            objective: Objective::FirstAttempt,
        }
    }
}

/// The value of one policy on the held-out log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyValue {
    /// `live`, `greedy` or `ranker`.
    pub name: String,
    /// Inverse propensity scoring (clipped).
    pub ips: Estimate,
    /// Self-normalised IPS.
    pub snips: Estimate,
    /// Doubly robust.
    pub dr: Estimate,
}

/// What `hindsight policy evaluate` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyEvaluation {
    /// What the rewards measured.
    pub objective: Objective,
    /// Experience rows read.
    pub rows: usize,
    /// Rows without usable propensities (skipped).
    pub skipped: usize,
    /// Rows that fitted the ranker and the reward model.
    pub train_rows: usize,
    /// Rows the policies were evaluated on.
    pub holdout_rows: usize,
    /// Mean reward the logging policy earned on the held-out rows.
    pub logged_mean_reward: f64,
    /// The live policy (when its snapshot was given), the greedy policy (the live policy's
    /// posterior-mean plan, or without it the best plan of a table of the log's rewards), and
    /// the distilled ranker.
    pub policies: Vec<PolicyValue>,
    /// Paired doubly robust comparison of the ranker against the live policy's greedy plan
    /// (the share of choices a promoted ranker takes over), as the policy actor's gate makes it.
    pub ranker_vs_greedy: Option<Comparison>,
    /// Whether the ranker would be promoted.
    pub promotion: Option<Promotion>,
    /// Why there is no promotion decision, when there is none.
    pub note: Option<String>,
}

/// The stages of a log, in the order of their first appearance, with every arm seen.
pub fn stages_of(log: &[LogRecord]) -> Vec<StageArms> {
    let mut stages: Vec<StageArms> = Vec::new();
    for r in log {
        for (name, arm) in r.stages.iter().zip(&r.plan) {
            match stages.iter_mut().find(|s| &s.stage == name) {
                Some(s) => {
                    if !s.arms.contains(arm) {
                        s.arms.push(arm.clone());
                    }
                }
                None => stages.push(StageArms {
                    stage: name.clone(),
                    arms: vec![arm.clone()],
                }),
            }
        }
    }
    stages
}

fn value_of(
    name: &str,
    log: &[LogRecord],
    target: &dyn TargetPolicy,
    model: &dyn RewardModel,
    clip: f64,
) -> PolicyValue {
    PolicyValue {
        name: name.to_string(),
        ips: ips(log, target, clip),
        snips: snips(log, target),
        dr: doubly_robust(log, target, model),
    }
}

/// Evaluates the live policy (if given), the greedy policy and a ranker distilled from the
/// older part of the experience log, off-policy on its newest part, and decides whether the
/// ranker would be promoted over the live policy.
pub fn evaluate_log(
    tuples: &[ExperienceTuple],
    live: Option<&Policy>,
    cfg: &EvaluationConfig,
) -> PolicyEvaluation {
    let reward = live.map(|p| p.config().reward.clone()).unwrap_or_default();
    let (log, skipped) = log_for(tuples, cfg.objective, &reward);
    let (train, hold) = split_holdout(&log, cfg.holdout_share);
    let tabular = TabularModel::fit(train, 2.0);
    // With the live policy, its beliefs are the reward model and its greedy plan is the greedy
    // policy (what a promoted ranker would replace); without it, a table of the log's rewards.
    let policy_model = live.map(|policy| PolicyModel { policy });
    let model: &dyn RewardModel = match &policy_model {
        Some(m) => m,
        None => &tabular,
    };
    let stages = match live {
        Some(p) => p.stages().to_vec(),
        None => stages_of(&log),
    };
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let ranker = Ranker::fit(train, &stages, cfg.ranker.clone(), &mut rng);
    let table_greedy = GreedyTarget {
        model: &tabular,
        plans: TabularModel::plans_seen(train),
    };
    let live_greedy = live.map(|policy| PolicyGreedyTarget { policy });
    let greedy: &dyn TargetPolicy = match &live_greedy {
        Some(g) => g,
        None => &table_greedy,
    };
    let mut policies = Vec::new();
    if let Some(policy) = live {
        let target = PolicyTarget {
            policy,
            draws: cfg.draws,
            seed: cfg.seed,
        };
        policies.push(value_of("live", hold, &target, model, cfg.clip));
    }
    policies.push(value_of("greedy", hold, greedy, model, cfg.clip));
    policies.push(value_of("ranker", hold, &ranker, model, cfg.clip));
    let logged_mean_reward = if hold.is_empty() {
        0.0
    } else {
        hold.iter().map(|r| r.reward).sum::<f64>() / hold.len() as f64
    };
    let (ranker_vs_greedy, promotion, note) = match (live, hold.is_empty()) {
        (_, true) => (None, None, Some("the log has no usable rows".to_string())),
        (None, false) => (
            None,
            None,
            Some("no live policy snapshot: no promotion decision".to_string()),
        ),
        (Some(policy), false) => {
            let cmp = ranker_vs_greedy(hold, &ranker, policy);
            let decision = promotion_decision(&cmp, cfg.margin, cfg.z, cfg.min_effective_n);
            (Some(cmp), Some(decision), None)
        }
    };
    PolicyEvaluation {
        objective: cfg.objective,
        rows: tuples.len(),
        skipped,
        train_rows: train.len(),
        holdout_rows: hold.len(),
        logged_mean_reward,
        policies,
        ranker_vs_greedy,
        promotion,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashed features as first defined: each feature's text formatted, then hashed.
    fn formatted_features(
        context: &BTreeMap<String, String>,
        stage: &str,
        arm: &Arm,
        bits: u32,
    ) -> Vec<usize> {
        let fnv = |s: &str| {
            s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        let mask = (1u64 << bits.min(30)) - 1;
        let base = format!("{stage}|{}/{}", arm.tool, arm.strategy);
        let pairs: Vec<String> = context.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut out = vec![(fnv(&base) & mask) as usize];
        for (i, p) in pairs.iter().enumerate() {
            out.push((fnv(&format!("{base}|{p}")) & mask) as usize);
            for q in &pairs[i + 1..] {
                out.push((fnv(&format!("{base}|{p}|{q}")) & mask) as usize);
            }
        }
        out
    }

    #[test]
    fn hashed_features_are_the_hashes_of_the_formatted_features() {
        let arm = Arm::new("search", "by_date");
        for n in 0..5 {
            let context: BTreeMap<String, String> = (0..n)
                .map(|i| (format!("k{i}"), format!("v{}", i * 7)))
                .collect();
            for bits in [4, 16, 30] {
                assert_eq!(
                    hashed_features(&context, "lookup", &arm, bits),
                    formatted_features(&context, "lookup", &arm, bits),
                    "{n} features, {bits} bits"
                );
            }
        }
    }

    use crate::learn::ope::{TabularModel, compare};

    /// The distiller's exploit plan for the task of file type `t`, weighed on `p`'s beliefs.
    fn exploit(d: &Distiller, p: &Policy, t: &str) -> Option<Vec<usize>> {
        let f = ctx(t);
        d.exploit_plan(p, &f, |plan| p.shortfall_of(&f, plan))
    }

    fn ctx(t: &str) -> BTreeMap<String, String> {
        [("filetype".to_string(), t.to_string())]
            .into_iter()
            .collect()
    }

    fn stages() -> Vec<StageArms> {
        vec![StageArms {
            stage: "extract".into(),
            arms: vec![Arm::new("pdfminer", "direct"), Arm::new("ocr", "whole")],
        }]
    }

    /// pdfminer is best on pdf, ocr on png; the logger is uniform.
    fn log(n: usize) -> Vec<LogRecord> {
        let mut rng = fastrand::Rng::with_seed(5);
        (0..n)
            .map(|_| {
                let png = rng.f64() < 0.4;
                let a = rng.usize(0..2);
                let p = match (png, a) {
                    (false, 0) => 0.9,
                    (false, _) => 0.5,
                    (true, 0) => 0.05,
                    (true, _) => 0.8,
                };
                LogRecord {
                    context: ctx(if png { "png" } else { "pdf" }),
                    stages: vec!["extract".into()],
                    plan: vec![stages()[0].arms[a].clone()],
                    propensity: 0.5,
                    reward: if rng.f64() < p { 1.0 } else { 0.0 },
                }
            })
            .collect()
    }

    /// A policy over `stages()` taught that the arm `good(filetype)` succeeds and the other
    /// fails.
    fn taught(good: fn(&str) -> &'static str, n: usize) -> Policy {
        use crate::learn::bandit::{Observation, PolicyConfig, StageObservation, StageOutcome};
        let mut p = Policy::new(PolicyConfig::default(), stages()).unwrap();
        for i in 0..n {
            for t in ["pdf", "png"] {
                let arm = stages()[0].arms[i % 2].clone();
                let ok = arm.tool == good(t);
                p.update(&Observation {
                    features: ctx(t),
                    stages: vec![StageObservation {
                        stage: "extract".into(),
                        arm,
                        outcome: if ok {
                            StageOutcome::Valid
                        } else {
                            StageOutcome::Failed(crate::taxonomy::FailureCategory::Strategy)
                        },
                        latency_ms: 100.0,
                        cost: 0.0,
                    }],
                });
            }
        }
        p
    }

    #[test]
    fn the_distiller_promotes_only_on_evidence_and_withdraws_when_it_runs_out() {
        // The log says pdfminer on pdf and ocr on png; the policy wrongly believes ocr is best
        // everywhere, so on pdf the ranker's plan does better than the policy expects.
        let log = log(1500);
        let wrong = taught(|_| "ocr", 20);
        assert_eq!(wrong.greedy(&ctx("pdf")).0, vec![1]);
        // (The policy here was taught against the log, so it would veto the ranker's plan on
        // pdf; `defer_margin` 1 lets the ranker plan whatever the policy expects from it.)
        let mut d = Distiller::new(DistillConfig {
            min_rows: 100,
            defer_margin: 1.0,
            ..DistillConfig::default()
        });
        assert!(!d.due(50));
        assert!(d.due(200));
        let mut rng = fastrand::Rng::with_seed(2);
        let o = d.refit(1500, &log, &wrong, &mut rng).unwrap();
        assert!(o.promotion.promote, "{:?}", o.promotion);
        assert!(!o.was_active);
        assert!(o.comparison.diff > 0.05, "{:?}", o.comparison);
        assert_eq!(exploit(&d, &wrong, "pdf"), Some(vec![0]));
        assert_eq!(exploit(&d, &wrong, "png"), Some(vec![1]));
        assert!(!d.due(1600));
        // The ranker survives a round trip through the store's encoding (weights kept sparse).
        let bytes = crate::store::envelope::encode(&d).unwrap();
        assert!(bytes.len() < 8 * d.active.as_ref().unwrap().weights.len() / 4);
        let back: Distiller = crate::store::envelope::decode(&bytes).unwrap();
        assert_eq!(back, d);
        // A policy that already holds the truth leaves the ranker nothing to win: the paired
        // difference is not positive, and with a demand for more support than the holdout
        // can give the ranker is withdrawn.
        let right = taught(|t| if t == "pdf" { "pdfminer" } else { "ocr" }, 20);
        d.config.min_effective_n = 1e6;
        let o = d.refit(1700, &log, &right, &mut rng).unwrap();
        assert!(!o.promotion.promote && o.was_active);
        assert!(o.comparison.diff <= 1e-9, "{:?}", o.comparison);
        assert_eq!(exploit(&d, &right, "pdf"), None);
        assert_eq!((d.fits, d.promotions), (2, 1));
        // Too few rows: no fit.
        assert!(d.refit(1800, &log[..10], &right, &mut rng).is_none());
    }

    #[test]
    fn a_ranker_in_force_leaves_a_task_to_the_policy_that_expects_clearly_more_from_its_own_plan() {
        // The ranker is promoted on a log where pdfminer wins on pdf; the policy now expects
        // pdfminer to fail on pdf (as after a drift it has detected and followed, while the
        // ranker, distilled from the past, would plan pdfminer until its next fit).
        let log = log(1500);
        let after = taught(|_| "ocr", 20);
        let mut d = Distiller::new(DistillConfig {
            min_rows: 100,
            defer_margin: 1.0,
            ..DistillConfig::default()
        });
        let mut rng = fastrand::Rng::with_seed(2);
        let o = d.refit(1500, &log, &after, &mut rng).unwrap();
        assert!(o.promotion.promote, "{:?}", o.promotion);
        assert_eq!(exploit(&d, &after, "pdf"), Some(vec![0]));
        // With the default margin the policy plans the task, on pdf; on png the ranker and the
        // policy agree, and the ranker's plan stands.
        d.config.defer_margin = DistillConfig::default().defer_margin;
        assert_eq!(exploit(&d, &after, "pdf"), None);
        assert_eq!(exploit(&d, &after, "png"), Some(vec![1]));
        // A policy that expects about as much from the ranker's plan lets it plan.
        let agreeing = taught(|t| if t == "pdf" { "pdfminer" } else { "ocr" }, 20);
        assert_eq!(exploit(&d, &agreeing, "pdf"), Some(vec![0]));
    }

    #[test]
    fn a_distillation_setting_out_of_range_is_named() {
        assert_eq!(DistillConfig::default().validate(), Ok(()));
        for (cfg, field) in [
            (
                DistillConfig {
                    margin: f64::NAN,
                    ..DistillConfig::default()
                },
                "margin",
            ),
            (
                DistillConfig {
                    min_effective_n: f64::INFINITY,
                    ..DistillConfig::default()
                },
                "min_effective_n",
            ),
            (
                DistillConfig {
                    holdout_share: 1.0,
                    ..DistillConfig::default()
                },
                "holdout_share",
            ),
            (
                DistillConfig {
                    defer_margin: -0.1,
                    ..DistillConfig::default()
                },
                "defer_margin",
            ),
        ] {
            let e = cfg.validate().unwrap_err();
            assert_eq!(e.field, field);
            assert!(
                e.to_string().starts_with(&format!("distill.{field}:")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_ranker_learns_the_context_and_is_promoted_over_a_worse_incumbent() {
        let log = log(3000);
        let mut rng = fastrand::Rng::with_seed(1);
        let r = Ranker::fit(&log, &stages(), RankerConfig::default(), &mut rng);
        assert_eq!(r.fitted_on, 3000);
        assert_eq!(r.best_plan(&ctx("pdf"))[0].tool, "pdfminer");
        assert_eq!(r.best_plan(&ctx("png"))[0].tool, "ocr");
        let model = TabularModel::fit(&log, 2.0);
        struct Always(Arm);
        impl TargetPolicy for Always {
            fn distribution(&self, _: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
                vec![(vec![self.0.clone()], 1.0)]
            }
        }
        let worse = Always(Arm::new("pdfminer", "direct"));
        let cmp = compare(&log, &r, &worse, &model);
        let d = promotion_decision(&cmp, 0.01, 1.96, 100.0);
        assert!(d.promote, "{d:?}");
        // And the reverse comparison refuses.
        let back = compare(&log, &worse, &r, &model);
        let d = promotion_decision(&back, 0.01, 1.96, 100.0);
        assert!(!d.promote, "{d:?}");
    }
}
