//! ope: off-policy evaluation over the experience log: the log record and what its reward
//! measures (a run's first attempt, or what it earned in the end), target policies as plan
//! distributions, reward models, and the IPS, self-normalised IPS and doubly robust estimators
//! with their standard errors, plus paired comparisons of two policies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::bandit::{Arm, Policy, RewardParams};
use crate::learn::cluster::cluster_key;
use crate::record::ExperienceTuple;

/// One logged decision: context, chosen plan, the propensity the logging policy had of choosing
/// it, and the reward it earned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// The task's features.
    pub context: BTreeMap<String, String>,
    /// The stage names, in order.
    pub stages: Vec<String>,
    /// The chosen arm per stage.
    pub plan: Vec<Arm>,
    /// Probability of the plan under the logging policy (product of the per-stage ones).
    pub propensity: f64,
    /// The reward earned, in [0, 1].
    pub reward: f64,
}

impl LogRecord {
    /// Whether the record's stages are `stages`, in order (a log of another workflow is not).
    pub fn has_stages(&self, stages: &[crate::learn::bandit::StageArms]) -> bool {
        self.stages
            .iter()
            .map(String::as_str)
            .eq(stages.iter().map(|s| s.stage.as_str()))
    }

    /// The record of an experience tuple; `None` when it has no arms or a propensity outside
    /// (0, 1] (such a row cannot be used for off-policy evaluation).
    pub fn from_experience(t: &ExperienceTuple) -> Option<LogRecord> {
        if t.arms.is_empty() {
            return None;
        }
        let propensity = crate::record::plan_propensity(&t.arms);
        if !(propensity > 0.0 && propensity <= 1.0 + 1e-9 && t.reward.is_finite()) {
            return None;
        }
        Some(LogRecord {
            context: t.context_features.clone(),
            stages: t.arms.iter().map(|a| a.stage.clone()).collect(),
            plan: t
                .arms
                .iter()
                .map(|a| Arm::new(a.tool.clone(), a.strategy.clone()))
                .collect(),
            propensity: propensity.min(1.0),
            reward: t.reward.clamp(0.0, 1.0),
        })
    }
}

impl LogRecord {
    /// The record of an experience tuple rewarded under `objective` (`reward` prices a first
    /// attempt); `None` when it cannot be used (see [`LogRecord::from_experience`] and
    /// [`first_attempt_reward`]).
    pub fn for_objective(
        t: &ExperienceTuple,
        objective: Objective,
        reward: &RewardParams,
    ) -> Option<LogRecord> {
        let mut r = LogRecord::from_experience(t)?;
        if objective == Objective::FirstAttempt {
            r.reward = first_attempt_reward(t, reward)?.clamp(0.0, 1.0);
        }
        Some(r)
    }
}

/// What a log record's reward measures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// The first attempt's plan as if no recovery followed: the arms' own latency and cost when
    /// every stage's first arm was valid, 0 when one failed on its own (what the bandit's plan
    /// value and FORMAT.md's regret measure). Runs whose first attempt ended on an
    /// infrastructure fault say nothing about the plan and are left out.
    #[default]
    FirstAttempt,
    /// The reward the run earned in the end, recoveries included.
    Realized,
}

/// The first attempt's reward of an experience ([`Objective::FirstAttempt`]): `None` when its
/// first attempt ended on an infrastructure fault or never reached a verdict on every stage.
pub fn first_attempt_reward(t: &ExperienceTuple, reward: &RewardParams) -> Option<f64> {
    use serde_json::Value;
    let first = t.steps.iter().filter(|s| {
        s.metadata
            .get("attempt")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            == 0
    });
    let (mut latency, mut cost) = (0.0, 0.0);
    let mut valid = Vec::new();
    for step in first {
        let Some(stage) = step.metadata.get("stage").and_then(Value::as_str) else {
            continue;
        };
        match step.metadata.get("outcome").and_then(Value::as_str) {
            Some("valid") => {
                let (l, c) = step.own_latency_cost();
                latency += l;
                cost += c;
                valid.push(stage);
            }
            Some("infrastructure") => return None,
            Some("invalid" | "strategy" | "unknown") => return Some(0.0),
            _ => {}
        }
    }
    t.arms
        .iter()
        .all(|a| valid.contains(&a.stage.as_str()))
        .then(|| reward.passed_value(latency, cost))
}

/// The records usable for off-policy evaluation under `objective` (`reward` prices a first
/// attempt), and how many were skipped.
pub fn log_for(
    tuples: &[ExperienceTuple],
    objective: Objective,
    reward: &RewardParams,
) -> (Vec<LogRecord>, usize) {
    let log: Vec<LogRecord> = tuples
        .iter()
        .filter_map(|t| LogRecord::for_objective(t, objective, reward))
        .collect();
    let skipped = tuples.len() - log.len();
    (log, skipped)
}

/// The records usable for off-policy evaluation, each with the reward its run earned in the end
/// ([`Objective::Realized`]), and how many were skipped.
pub fn log_from_experience(tuples: &[ExperienceTuple]) -> (Vec<LogRecord>, usize) {
    log_for(tuples, Objective::Realized, &RewardParams::default())
}

/// A policy to evaluate: its distribution over plans in a context.
pub trait TargetPolicy {
    /// `(plan, probability)` pairs; plans absent have probability 0.
    fn distribution(&self, context: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)>;
}

/// A model of the expected reward of a plan in a context (for the doubly robust estimator).
pub trait RewardModel {
    /// Predicted reward in [0, 1].
    fn predict(&self, context: &BTreeMap<String, String>, plan: &[Arm]) -> f64;
}

/// An estimate of a policy's value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The estimated mean reward per task.
    pub value: f64,
    /// Its standard error.
    pub std_err: f64,
    /// Records used.
    pub n: usize,
    /// Effective sample size of the importance weights (`(sum w)^2 / sum w^2`).
    pub effective_n: f64,
}

impl Estimate {
    /// The interval `value +- z * std_err`.
    pub fn interval(&self, z: f64) -> (f64, f64) {
        (self.value - z * self.std_err, self.value + z * self.std_err)
    }
}

fn prob_of(dist: &[(Vec<Arm>, f64)], plan: &[Arm]) -> f64 {
    dist.iter()
        .filter(|(p, _)| p.as_slice() == plan)
        .map(|(_, q)| *q)
        .sum()
}

fn mean_se(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, (var / n as f64).sqrt())
}

fn ess(weights: &[f64]) -> f64 {
    let s: f64 = weights.iter().sum();
    let s2: f64 = weights.iter().map(|w| w * w).sum();
    if s2 > 0.0 { s * s / s2 } else { 0.0 }
}

fn weights(log: &[LogRecord], target: &dyn TargetPolicy, clip: f64) -> Vec<f64> {
    log.iter()
        .map(|r| {
            let pi = prob_of(&target.distribution(&r.context), &r.plan);
            (pi / r.propensity).min(clip)
        })
        .collect()
}

/// Inverse propensity scoring, with importance weights clipped at `clip`.
pub fn ips(log: &[LogRecord], target: &dyn TargetPolicy, clip: f64) -> Estimate {
    let w = weights(log, target, clip);
    let terms: Vec<f64> = w.iter().zip(log).map(|(w, r)| w * r.reward).collect();
    let (value, std_err) = mean_se(&terms);
    Estimate {
        value,
        std_err,
        n: log.len(),
        effective_n: ess(&w),
    }
}

/// Self-normalised IPS: `sum w r / sum w` (bounded in [0, 1]; standard error by the delta
/// method).
pub fn snips(log: &[LogRecord], target: &dyn TargetPolicy) -> Estimate {
    let w = weights(log, target, f64::INFINITY);
    let sw: f64 = w.iter().sum();
    if sw <= 0.0 {
        return Estimate {
            value: 0.0,
            std_err: f64::INFINITY,
            n: log.len(),
            effective_n: 0.0,
        };
    }
    let value = w.iter().zip(log).map(|(w, r)| w * r.reward).sum::<f64>() / sw;
    let var = w
        .iter()
        .zip(log)
        .map(|(w, r)| (w * (r.reward - value)).powi(2))
        .sum::<f64>();
    Estimate {
        value,
        std_err: var.sqrt() / sw,
        n: log.len(),
        effective_n: ess(&w),
    }
}

fn dr_terms(log: &[LogRecord], target: &dyn TargetPolicy, model: &dyn RewardModel) -> Vec<f64> {
    log.iter()
        .map(|r| {
            let dist = target.distribution(&r.context);
            let direct: f64 = dist
                .iter()
                .map(|(p, q)| q * model.predict(&r.context, p))
                .sum();
            let pi = prob_of(&dist, &r.plan);
            let q_logged = model.predict(&r.context, &r.plan);
            direct + pi / r.propensity * (r.reward - q_logged)
        })
        .collect()
}

/// Doubly robust: the model's prediction under the target, corrected by the importance-weighted
/// residual of the logged plan.
pub fn doubly_robust(
    log: &[LogRecord],
    target: &dyn TargetPolicy,
    model: &dyn RewardModel,
) -> Estimate {
    let terms = dr_terms(log, target, model);
    let (value, std_err) = mean_se(&terms);
    Estimate {
        value,
        std_err,
        n: log.len(),
        effective_n: ess(&weights(log, target, f64::INFINITY)),
    }
}

/// A paired doubly robust comparison of a candidate against an incumbent on the same log.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The candidate's estimate.
    pub candidate: Estimate,
    /// The incumbent's estimate.
    pub incumbent: Estimate,
    /// Candidate minus incumbent.
    pub diff: f64,
    /// Standard error of the paired difference.
    pub diff_se: f64,
}

/// Compares two policies with paired doubly robust terms.
pub fn compare(
    log: &[LogRecord],
    candidate: &dyn TargetPolicy,
    incumbent: &dyn TargetPolicy,
    model: &dyn RewardModel,
) -> Comparison {
    compare_terms(
        &dr_terms(log, candidate, model),
        &dr_terms(log, incumbent, model),
        &weights(log, candidate, f64::INFINITY),
        &weights(log, incumbent, f64::INFINITY),
    )
}

/// A paired comparison from per-record doubly robust terms of the candidate (`a`) and the
/// incumbent (`b`) and their unclipped importance weights (`wa`, `wb`, for the effective sample
/// sizes).
pub fn compare_terms(a: &[f64], b: &[f64], wa: &[f64], wb: &[f64]) -> Comparison {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let (diff, diff_se) = mean_se(&d);
    let (va, sa) = mean_se(a);
    let (vb, sb) = mean_se(b);
    Comparison {
        candidate: Estimate {
            value: va,
            std_err: sa,
            n: a.len(),
            effective_n: ess(wa),
        },
        incumbent: Estimate {
            value: vb,
            std_err: sb,
            n: b.len(),
            effective_n: ess(wb),
        },
        diff,
        diff_se,
    }
}

/// Mean observed reward per (cluster, plan), backing off to the plan's mean over all clusters,
/// then to the global mean (shrunk towards the coarser level with `strength` pseudo-counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TabularModel {
    cells: BTreeMap<(String, String), (f64, f64)>,
    plans: BTreeMap<String, (f64, f64)>,
    global: (f64, f64),
    strength: f64,
}

fn plan_str(plan: &[Arm]) -> String {
    plan.iter()
        .map(|a| format!("{}/{}", a.tool, a.strategy))
        .collect::<Vec<_>>()
        .join(",")
}

impl TabularModel {
    /// Fits the tables on a log.
    pub fn fit(log: &[LogRecord], strength: f64) -> TabularModel {
        let mut m = TabularModel {
            strength,
            ..TabularModel::default()
        };
        for r in log {
            let p = plan_str(&r.plan);
            let c = m
                .cells
                .entry((cluster_key(&r.context), p.clone()))
                .or_default();
            c.0 += r.reward;
            c.1 += 1.0;
            let q = m.plans.entry(p).or_default();
            q.0 += r.reward;
            q.1 += 1.0;
            m.global.0 += r.reward;
            m.global.1 += 1.0;
        }
        m
    }

    /// The plans seen in the log, with their arms.
    pub fn plans_seen(log: &[LogRecord]) -> Vec<Vec<Arm>> {
        let mut seen: BTreeMap<String, Vec<Arm>> = BTreeMap::new();
        for r in log {
            seen.entry(plan_str(&r.plan))
                .or_insert_with(|| r.plan.clone());
        }
        seen.into_values().collect()
    }
}

impl RewardModel for TabularModel {
    fn predict(&self, context: &BTreeMap<String, String>, plan: &[Arm]) -> f64 {
        let g = if self.global.1 > 0.0 {
            self.global.0 / self.global.1
        } else {
            0.5
        };
        let p = plan_str(plan);
        let pm = self
            .plans
            .get(&p)
            .map(|(s, n)| (s + self.strength * g) / (n + self.strength))
            .unwrap_or(g);
        self.cells
            .get(&(cluster_key(context), p))
            .map(|(s, n)| (s + self.strength * pm) / (n + self.strength))
            .unwrap_or(pm)
    }
}

/// The greedy policy of a reward model over a fixed set of plans (deterministic).
pub struct GreedyTarget<'a> {
    /// The model.
    pub model: &'a dyn RewardModel,
    /// The plans it chooses among.
    pub plans: Vec<Vec<Arm>>,
}

impl TargetPolicy for GreedyTarget<'_> {
    fn distribution(&self, context: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
        let best = self
            .plans
            .iter()
            .map(|p| (self.model.predict(context, p), p))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        best.map(|(_, p)| vec![(p.clone(), 1.0)])
            .unwrap_or_default()
    }
}

/// The live policy's posterior means as a reward model: a plan's expected first-attempt reward
/// as the policy believes it (0 for a plan with an arm it does not know).
pub struct PolicyModel<'a> {
    /// The policy.
    pub policy: &'a Policy,
}

impl RewardModel for PolicyModel<'_> {
    fn predict(&self, context: &BTreeMap<String, String>, plan: &[Arm]) -> f64 {
        self.policy
            .plan_indices(plan)
            .map_or(0.0, |ix| self.policy.plan_mean_value(context, &ix))
    }
}

/// The live policy's greedy plan (posterior means, no exploration) as a target: the share of
/// choices a promoted ranker takes over.
pub struct PolicyGreedyTarget<'a> {
    /// The policy.
    pub policy: &'a Policy,
}

impl TargetPolicy for PolicyGreedyTarget<'_> {
    fn distribution(&self, context: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
        let (plan, _) = self.policy.greedy(context);
        self.policy
            .plan_arms(&plan)
            .map(|a| vec![(a, 1.0)])
            .unwrap_or_default()
    }
}

/// The live policy as a target: its plan distribution (the choices it draws) estimated by `draws`
/// posterior samples, from an RNG seeded per context (so the estimate is deterministic).
pub struct PolicyTarget<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// Samples per context.
    pub draws: usize,
    /// The seed.
    pub seed: u64,
}

impl TargetPolicy for PolicyTarget<'_> {
    fn distribution(&self, context: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
        let h = crate::learn::cluster::key_hash(&cluster_key(context));
        let mut rng = fastrand::Rng::with_seed(self.seed ^ h);
        self.policy
            .plan_distribution(context, self.draws, &mut rng)
            .into_iter()
            .filter_map(|(p, q)| self.policy.plan_arms(&p).map(|a| (a, q)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(v: &str) -> BTreeMap<String, String> {
        [("k".to_string(), v.to_string())].into_iter().collect()
    }

    struct Fixed(Vec<Arm>);
    impl TargetPolicy for Fixed {
        fn distribution(&self, _: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
            vec![(self.0.clone(), 1.0)]
        }
    }

    /// A uniform logger over two plans with true mean rewards 0.8 ("a") and 0.3 ("b").
    fn log(n: usize, seed: u64) -> Vec<LogRecord> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..n)
            .map(|_| {
                let a = rng.bool();
                let mean = if a { 0.8 } else { 0.3 };
                LogRecord {
                    context: ctx("x"),
                    stages: vec!["s".into()],
                    plan: vec![Arm::new(if a { "a" } else { "b" }, "x")],
                    propensity: 0.5,
                    reward: if rng.f64() < mean { 1.0 } else { 0.0 },
                }
            })
            .collect()
    }

    #[test]
    fn estimators_recover_the_value_of_a_deterministic_target() {
        let log = log(4000, 1);
        let target = Fixed(vec![Arm::new("a", "x")]);
        let model = TabularModel::fit(&log, 2.0);
        for est in [
            ips(&log, &target, 100.0),
            snips(&log, &target),
            doubly_robust(&log, &target, &model),
        ] {
            assert!(
                (est.value - 0.8).abs() < 3.0 * est.std_err + 0.01,
                "{est:?}"
            );
            assert!(est.std_err > 0.0 && est.std_err < 0.05);
            assert!(est.effective_n > 1500.0 && est.effective_n < 2500.0);
        }
        // The logger's own value (uniform) is 0.55.
        struct Uniform;
        impl TargetPolicy for Uniform {
            fn distribution(&self, _: &BTreeMap<String, String>) -> Vec<(Vec<Arm>, f64)> {
                vec![
                    (vec![Arm::new("a", "x")], 0.5),
                    (vec![Arm::new("b", "x")], 0.5),
                ]
            }
        }
        let u = snips(&log, &Uniform);
        assert!((u.value - 0.55).abs() < 0.03, "{u:?}");
        let cmp = compare(&log, &target, &Uniform, &model);
        assert!(cmp.diff > 0.2 && cmp.diff_se < 0.02, "{cmp:?}");
        let greedy = GreedyTarget {
            model: &model,
            plans: TabularModel::plans_seen(&log),
        };
        assert_eq!(greedy.distribution(&ctx("x"))[0].0[0].tool, "a");
    }

    fn passed() -> crate::record::RunResult {
        crate::record::RunResult {
            state: crate::record::RunState::Succeeded,
            passed: true,
            output: None,
            latency_ms: 1.0,
            cost: 0.0,
            attempts: 1,
        }
    }

    /// A step of attempt `attempt` at `stage` with `outcome`, 100 ms and 0.01 of its own.
    fn step(attempt: u32, stage: &str, outcome: &str) -> crate::taxonomy::Step {
        let mut s = crate::taxonomy::Step {
            tool_called: Some("t".into()),
            latency_ms: 900.0,
            cost: 0.05,
            ..crate::taxonomy::Step::default()
        };
        for (k, v) in [
            ("attempt", serde_json::json!(attempt)),
            ("stage", serde_json::json!(stage)),
            ("strategy", serde_json::json!("x")),
            ("outcome", serde_json::json!(outcome)),
            ("own_latency_ms", serde_json::json!(100.0)),
            ("own_cost", serde_json::json!(0.01)),
        ] {
            s.metadata.insert(k.into(), v);
        }
        s
    }

    #[test]
    fn the_first_attempt_is_priced_by_its_own_arms_and_recoveries_do_not_count() {
        let reward = RewardParams {
            success: 1.0,
            latency: 0.2,
            cost: 0.1,
            max_cost: 0.1,
            sla_ms: 1000.0,
        };
        let arm = |stage: &str| crate::record::ArmChoice {
            stage: stage.into(),
            tool: "t".into(),
            strategy: "x".into(),
            propensity: 0.5,
        };
        let tuple = |steps: Vec<crate::taxonomy::Step>| ExperienceTuple {
            run_id: "r".into(),
            task_id: "t".into(),
            plan_id: "p".into(),
            user_id: None,
            context_features: ctx("x"),
            arms: vec![arm("a"), arm("b")],
            steps,
            result: passed(),
            reward: 0.7,
            user_feedback: None,
            time_ms: 0,
        };
        // Both stages valid on the first attempt: 200 ms and 0.02 of the arms' own (the step
        // totals, with the infrastructure retries inside the calls, are not the plan's).
        let clean = tuple(vec![step(0, "a", "valid"), step(0, "b", "valid")]);
        let want = 1.0 - 0.2 * 0.2 - 0.1 * 0.2;
        assert!((first_attempt_reward(&clean, &reward).unwrap() - want).abs() < 1e-9);
        // The first plan failed on its own and a recovery passed: the plan earned 0.
        let recovered = tuple(vec![
            step(0, "a", "strategy"),
            step(1, "a", "valid"),
            step(1, "b", "valid"),
        ]);
        assert_eq!(first_attempt_reward(&recovered, &reward), Some(0.0));
        let invalid = tuple(vec![step(0, "a", "valid"), step(0, "b", "invalid")]);
        assert_eq!(first_attempt_reward(&invalid, &reward), Some(0.0));
        // An infrastructure fault says nothing about the plan; nor does an attempt cut short.
        let infra = tuple(vec![step(0, "a", "infrastructure"), step(1, "a", "valid")]);
        assert_eq!(first_attempt_reward(&infra, &reward), None);
        let cut = tuple(vec![step(0, "a", "valid"), step(0, "b", "success")]);
        assert_eq!(first_attempt_reward(&cut, &reward), None);
        // The log under each objective.
        let rows = [clean, recovered, infra];
        let (first, skipped) = log_for(&rows, Objective::FirstAttempt, &reward);
        assert_eq!((first.len(), skipped), (2, 1));
        assert_eq!(first[1].reward, 0.0);
        let (realized, skipped) = log_for(&rows, Objective::Realized, &reward);
        assert_eq!((realized.len(), skipped), (3, 0));
        assert!(realized.iter().all(|r| r.reward == 0.7));
    }

    #[test]
    fn experience_rows_without_propensities_are_skipped() {
        let mut t = ExperienceTuple {
            run_id: "r".into(),
            task_id: "t".into(),
            plan_id: "p".into(),
            user_id: None,
            context_features: ctx("x"),
            arms: vec![
                crate::record::ArmChoice {
                    stage: "s1".into(),
                    tool: "a".into(),
                    strategy: "x".into(),
                    propensity: 0.5,
                },
                crate::record::ArmChoice {
                    stage: "s2".into(),
                    tool: "b".into(),
                    strategy: "y".into(),
                    propensity: 0.4,
                },
            ],
            steps: vec![],
            result: passed(),
            reward: 0.9,
            user_feedback: None,
            time_ms: 0,
        };
        let r = LogRecord::from_experience(&t).unwrap();
        assert!((r.propensity - 0.2).abs() < 1e-12);
        assert_eq!(r.stages, vec!["s1", "s2"]);
        t.arms[0].propensity = 0.0;
        let (log, skipped) = log_from_experience(&[t]);
        assert!(log.is_empty());
        assert_eq!(skipped, 1);
    }
}
