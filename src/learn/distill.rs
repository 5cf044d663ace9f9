//! distill: the stable ranker distilled from the experience log (importance-weighted logistic
//! regression on hashed features of (context, stage, arm)) and the decision to promote it, made
//! by off-policy evaluation against the live policy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::bandit::{Arm, Policy, StageArms};
use crate::learn::ope::{
    Comparison, Estimate, GreedyTarget, LogRecord, PolicyTarget, RewardModel, TabularModel,
    TargetPolicy, compare, doubly_robust, ips, log_from_experience, snips,
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
    pub config: RankerConfig,
    /// The stages and their arms.
    pub stages: Vec<StageArms>,
    /// The weights (length `2^bits`).
    pub weights: Vec<f64>,
    /// Records it was fitted on.
    pub fitted_on: usize,
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hashed features of `(context, stage, arm)`: the arm alone, the arm with each feature,
/// and the arm with each pair of features.
pub fn hashed_features(
    context: &BTreeMap<String, String>,
    stage: &str,
    arm: &Arm,
    bits: u32,
) -> Vec<usize> {
    let mask = (1u64 << bits.min(30)) - 1;
    let base = format!("{stage}|{}/{}", arm.tool, arm.strategy);
    let pairs: Vec<String> = context.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut out = Vec::with_capacity(1 + pairs.len() + pairs.len() * pairs.len() / 2);
    out.push((fnv(&base) & mask) as usize);
    for (i, p) in pairs.iter().enumerate() {
        out.push((fnv(&format!("{base}|{p}")) & mask) as usize);
        for q in &pairs[i + 1..] {
            out.push((fnv(&format!("{base}|{p}|{q}")) & mask) as usize);
        }
    }
    out
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl Ranker {
    /// Fits a ranker on the log (records whose stages differ from `stages` are skipped).
    pub fn fit(
        log: &[LogRecord],
        stages: &[StageArms],
        config: RankerConfig,
        rng: &mut fastrand::Rng,
    ) -> Ranker {
        let dim = 1usize << config.bits.min(30);
        let mut weights = vec![0.0; dim];
        let names: Vec<&str> = stages.iter().map(|s| s.stage.as_str()).collect();
        let examples: Vec<(Vec<usize>, f64, f64)> = log
            .iter()
            .filter(|r| {
                r.stages
                    .iter()
                    .map(String::as_str)
                    .eq(names.iter().copied())
            })
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
                "too little support: effective sample {:.1} < {min_effective_n}",
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

/// When to distill again: every `every` new experience rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistillSchedule {
    /// Rows between fits.
    pub every: u64,
    /// Rows seen at the last fit.
    pub last_at: u64,
}

impl DistillSchedule {
    /// Whether a fit is due with `rows` rows logged; marks it done when it is.
    pub fn due(&mut self, rows: u64) -> bool {
        if rows >= self.last_at.saturating_add(self.every.max(1)) {
            self.last_at = rows;
            true
        } else {
            false
        }
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
    /// The ranker is promoted when its lower bound is at least `-margin`.
    pub margin: f64,
    /// Normal quantile of that bound.
    pub z: f64,
    /// Minimum effective sample size behind the ranker's estimate.
    pub min_effective_n: f64,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        EvaluationConfig {
            holdout_share: 0.3,
            clip: 50.0,
            draws: 64,
            seed: 7,
            ranker: RankerConfig::default(),
            margin: 0.01,
            z: 1.96,
            min_effective_n: 30.0,
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
    /// The live policy (when its snapshot was given), the greedy policy of the reward model,
    /// and the distilled ranker.
    pub policies: Vec<PolicyValue>,
    /// Paired doubly robust comparison of the ranker against the live policy.
    pub ranker_vs_live: Option<Comparison>,
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
    let (log, skipped) = log_from_experience(tuples);
    let share = cfg.holdout_share.clamp(0.0, 1.0);
    let n_hold = ((log.len() as f64) * share).round() as usize;
    let n_hold = if log.len() >= 2 {
        n_hold.clamp(1, log.len() - 1)
    } else {
        log.len()
    };
    let (train, hold) = log.split_at(log.len() - n_hold);
    let model = TabularModel::fit(train, 2.0);
    let stages = stages_of(&log);
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let ranker = Ranker::fit(train, &stages, cfg.ranker.clone(), &mut rng);
    let greedy = GreedyTarget {
        model: &model,
        plans: TabularModel::plans_seen(train),
    };
    let mut policies = Vec::new();
    let live_target = live.map(|p| PolicyTarget {
        policy: p,
        draws: cfg.draws,
        seed: cfg.seed,
    });
    if let Some(t) = &live_target {
        policies.push(value_of("live", hold, t, &model, cfg.clip));
    }
    policies.push(value_of("greedy", hold, &greedy, &model, cfg.clip));
    policies.push(value_of("ranker", hold, &ranker, &model, cfg.clip));
    let logged_mean_reward = if hold.is_empty() {
        0.0
    } else {
        hold.iter().map(|r| r.reward).sum::<f64>() / hold.len() as f64
    };
    let (ranker_vs_live, promotion, note) = match (&live_target, hold.is_empty()) {
        (_, true) => (None, None, Some("the log has no usable rows".to_string())),
        (None, false) => (
            None,
            None,
            Some("no live policy snapshot: no promotion decision".to_string()),
        ),
        (Some(t), false) => {
            let cmp = compare(hold, &ranker, t, &model);
            let decision = promotion_decision(&cmp, cfg.margin, cfg.z, cfg.min_effective_n);
            (Some(cmp), Some(decision), None)
        }
    };
    PolicyEvaluation {
        rows: tuples.len(),
        skipped,
        train_rows: train.len(),
        holdout_rows: hold.len(),
        logged_mean_reward,
        policies,
        ranker_vs_live,
        promotion,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::ope::{TabularModel, compare};

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
        let mut s = DistillSchedule {
            every: 100,
            last_at: 0,
        };
        assert!(!s.due(50));
        assert!(s.due(100));
        assert!(!s.due(150));
    }
}
