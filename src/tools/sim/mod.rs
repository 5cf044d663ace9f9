//! Simulated tool environments (the format of `config/envs/FORMAT.md`): parsing, task drawing,
//! the simulated tools with virtual latency and cost, validation of their outputs, and the exact
//! expected rewards that give the oracle and the random baseline.
//!
//! Labelling convention for failures: an infrastructure fault (`p_infra`, else `[infra].p_fault`)
//! is always [`FailureCategory::Infrastructure`](crate::taxonomy::FailureCategory). An arm's own
//! `errors` are the arm's fault, [`FailureCategory::Strategy`](crate::taxonomy::FailureCategory),
//! whatever their class: a `Timeout` (the strategy made the call slow), and a `RateLimit` or
//! `TransientNetwork` too (a tool whose quota was cut keeps failing however often it is retried,
//! and FORMAT.md's expected reward counts those failures against the arm). An environment that
//! wants arm-specific transient faults uses `p_infra`.

pub mod agent;
mod baselines;
mod model;
mod parse;
pub mod rng;
mod tool;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use model::{
    Arm, Drift, Feature, Infra, Numbers, Overrides, RewardConfig, SimSpec, Stage, When,
};
pub use parse::SimError;
pub use tool::{LATENCY_SIGMA, SimTool, lognormal_latency, retry_after_ms};

use crate::tools::tool::Tool;

/// One task drawn from an environment.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SimTask {
    /// The task's 0-based index.
    pub index: u64,
    /// One value per feature.
    pub features: BTreeMap<String, String>,
    /// The goal template with the features filled in.
    pub goal: String,
}

/// A plan: one `(tool, strategy)` per stage, in stage order.
pub type Plan = Vec<(String, String)>;

/// A task's oracle and random baseline ([`SimEnv::baselines`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Baselines {
    /// The plan with the highest expected reward (the first in file order on a tie).
    pub oracle_plan: Plan,
    /// Its expected reward.
    pub oracle: f64,
    /// The mean expected reward over all plans.
    pub random: f64,
}

/// A loaded simulated environment. Cheap to clone (shared inside).
#[derive(Debug, Clone)]
pub struct SimEnv {
    spec: Arc<SimSpec>,
    seed: u64,
    /// Baselines already walked, shared by the clones (they do not depend on the seed).
    memo: Arc<baselines::Memo>,
}

/// The text of an environment file and its name for errors.
pub(crate) fn read(path: &Path) -> Result<(String, String), SimError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SimError::Io {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    Ok((text, file))
}

impl SimEnv {
    /// Reads and checks an environment file.
    pub fn load(path: &Path) -> Result<SimEnv, SimError> {
        let (text, file) = read(path)?;
        SimEnv::parse(&text, &file)
    }

    /// Parses and checks an environment's text; `file_name` names it in errors. Seed 0.
    pub fn parse(text: &str, file_name: &str) -> Result<SimEnv, SimError> {
        Ok(SimEnv {
            spec: Arc::new(parse::parse_spec(text, file_name)?),
            seed: 0,
            memo: Arc::default(),
        })
    }

    /// The same environment whose tools draw with `seed` (tasks are drawn with the seed given to
    /// [`SimEnv::draw_task`]; use the same one).
    pub fn with_seed(mut self, seed: u64) -> SimEnv {
        self.seed = seed;
        self
    }

    /// The seed the tools draw with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The environment's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The whole parsed environment.
    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.spec.stages
    }

    /// The features, in file order.
    pub fn features(&self) -> &[Feature] {
        &self.spec.features
    }

    /// Draws task `index`: each feature by its weights from an RNG seeded by `(seed, index)`.
    pub fn draw_task(&self, seed: u64, index: u64) -> SimTask {
        let features = draw_features(&self.spec.features, seed, index);
        let goal = fill_goal(&self.spec.goal, &features);
        SimTask {
            index,
            features,
            goal,
        }
    }

    /// One tool per distinct tool name of the arms, in order of first appearance.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut names: Vec<&str> = Vec::new();
        for s in &self.spec.stages {
            for a in &s.arms {
                if !names.contains(&a.tool.as_str()) {
                    names.push(&a.tool);
                }
            }
        }
        names
            .into_iter()
            .map(|n| Arc::new(SimTool::new(self.clone(), n)) as Arc<dyn Tool>)
            .collect()
    }

    /// Checks a successful output of `stage`; the error names the stage and why.
    pub fn validate(&self, stage: &str, output: &serde_json::Value) -> Result<(), String> {
        tool::validate(stage, output)
    }

    /// The numbers of an arm in force for a task (`when`, then drift), if the arm exists.
    pub fn numbers(
        &self,
        stage: &str,
        tool: &str,
        strategy: &str,
        index: u64,
        features: &BTreeMap<String, String>,
    ) -> Option<Numbers> {
        let s = self.spec.stages.iter().find(|s| s.name == stage)?;
        let a = s
            .arms
            .iter()
            .find(|a| a.tool == tool && a.strategy == strategy)?;
        Some(self.spec.numbers(s, a, index, features))
    }

    /// Every plan (the product of the stages' arms), in file order, built (the baselines walk
    /// them without building any: [`SimEnv::baselines`]).
    pub fn plans(&self) -> Vec<Plan> {
        let mut plans: Vec<Plan> = vec![Vec::new()];
        for s in &self.spec.stages {
            let mut next = Vec::with_capacity(plans.len() * s.arms.len());
            for p in &plans {
                for a in &s.arms {
                    let mut q = p.clone();
                    q.push((a.tool.clone(), a.strategy.clone()));
                    next.push(q);
                }
            }
            plans = next;
        }
        plans
    }

    /// The expected first-attempt reward of a plan for a task (FORMAT.md): `P(pass) * (success -
    /// latency * min(1, L0 / sla_ms) - cost * min(1, C0 / max_cost))` clamped to [0, 1].
    pub fn expected_reward(
        &self,
        index: u64,
        features: &BTreeMap<String, String>,
        plan: &[(String, String)],
    ) -> Result<f64, SimError> {
        let stages = &self.spec.stages;
        if plan.len() != stages.len() {
            return Err(SimError::Plan {
                env: self.spec.name.clone(),
                reason: format!(
                    "expected one (tool, strategy) per stage ({}), found {}",
                    stages.len(),
                    plan.len()
                ),
            });
        }
        let (mut p_pass, mut l0, mut c0) = (1.0, 0.0, 0.0);
        for (s, (tool, strategy)) in stages.iter().zip(plan) {
            let a = s
                .arms
                .iter()
                .find(|a| &a.tool == tool && &a.strategy == strategy)
                .ok_or_else(|| SimError::Plan {
                    env: self.spec.name.clone(),
                    reason: format!("stage `{}` has no arm ({tool}, {strategy})", s.name),
                })?;
            let n = self.spec.numbers(s, a, index, features);
            p_pass *= n.p_success * n.p_valid;
            l0 += n.latency_ms;
            c0 += n.cost;
        }
        Ok((p_pass * self.spec.reward.gross(l0, c0)).clamp(0.0, 1.0))
    }

    /// The plan with the highest expected reward for the task and that reward (the first plan in
    /// file order wins a tie).
    pub fn oracle(&self, index: u64, features: &BTreeMap<String, String>) -> (Plan, f64) {
        let b = self.baselines(index, features);
        (b.oracle_plan, b.oracle)
    }

    /// The mean expected reward over all plans (a uniformly random policy).
    pub fn random_baseline(&self, index: u64, features: &BTreeMap<String, String>) -> f64 {
        self.baselines(index, features).random
    }

    /// The oracle and the random baseline of a task in one pass over every plan
    /// ([`SimEnv::oracle`], [`SimEnv::random_baseline`]). Each arm's numbers are worked out once
    /// per task and the plans are walked in file order with running products and sums, so that
    /// no plan is ever built: a million plans take milliseconds, not a gigabyte. Tasks whose
    /// arms have the same numbers in force (the same features, on the same side of every drift
    /// point) share one walk. The figures are the ones [`SimEnv::expected_reward`] gives each
    /// plan, to the bit.
    pub fn baselines(&self, index: u64, features: &BTreeMap<String, String>) -> Baselines {
        let stages = &self.spec.stages;
        // Per stage, per arm: (p_success * p_valid, latency, cost).
        let numbers: Vec<Vec<(f64, f64, f64)>> = stages
            .iter()
            .map(|s| {
                s.arms
                    .iter()
                    .map(|a| {
                        let n = self.spec.numbers(s, a, index, features);
                        (n.p_success * n.p_valid, n.latency_ms, n.cost)
                    })
                    .collect()
            })
            .collect();
        self.memo.get_or_walk(stages, &self.spec.reward, &numbers)
    }

    /// The reward of a finished task (FORMAT.md).
    pub fn reward(&self, passed: bool, total_latency_ms: f64, total_cost: f64) -> f64 {
        self.spec
            .reward
            .reward(passed, total_latency_ms, total_cost)
    }

    /// The reward's terms.
    pub fn reward_config(&self) -> RewardConfig {
        self.spec.reward
    }
}

/// Draws task `index`'s features (FORMAT.md): each feature by its weights, in file order, from
/// an RNG seeded by `(seed, index)`.
pub fn draw_features(features: &[Feature], seed: u64, index: u64) -> BTreeMap<String, String> {
    let mut rng = rng::task_rng(seed, index);
    let mut out = BTreeMap::new();
    for f in features {
        let i = rng::pick_weighted(&f.weights, rng.f64()).unwrap_or(0);
        if let Some(v) = f.values.get(i) {
            out.insert(f.name.clone(), v.clone());
        }
    }
    out
}

/// A goal template with each `{feature}` replaced by the task's value.
pub fn fill_goal(goal: &str, features: &BTreeMap<String, String>) -> String {
    let mut goal = goal.to_string();
    for (k, v) in features {
        goal = goal.replace(&format!("{{{k}}}"), v);
    }
    goal
}

#[cfg(test)]
mod tests;
