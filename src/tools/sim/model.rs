//! The parsed form of a simulated environment and the numbers in force for a task (`when`
//! overrides, then drift).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::taxonomy::ErrorClass;

/// The reward's terms (`[reward]` plus `sla_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardConfig {
    /// Earned when the task passes validation.
    pub success: f64,
    /// Weight of the latency penalty.
    pub latency: f64,
    /// Weight of the cost penalty.
    pub cost: f64,
    /// Cost at which the cost penalty is full.
    pub max_cost: f64,
    /// Latency at which the latency penalty is full.
    pub sla_ms: f64,
}

impl RewardConfig {
    /// The reward of a task: 0 if it did not pass, else
    /// `clamp(success - latency * min(1, L / sla_ms) - cost * min(1, C / max_cost), 0, 1)`.
    pub fn reward(&self, passed: bool, total_latency_ms: f64, total_cost: f64) -> f64 {
        if !passed {
            return 0.0;
        }
        self.gross(total_latency_ms, total_cost).clamp(0.0, 1.0)
    }

    /// The unclamped reward of a pass with these totals.
    pub fn gross(&self, total_latency_ms: f64, total_cost: f64) -> f64 {
        self.success
            - self.latency * (total_latency_ms.max(0.0) / self.sla_ms).min(1.0)
            - self.cost * (total_cost.max(0.0) / self.max_cost).min(1.0)
    }
}

/// One feature: its values and their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    /// The feature's name.
    pub name: String,
    /// Its values.
    pub values: Vec<String>,
    /// Relative weights, one per value.
    pub weights: Vec<f64>,
}

/// The numbers of an arm, as in force for one task.
#[derive(Debug, Clone, PartialEq)]
pub struct Numbers {
    /// Cost per call.
    pub cost: f64,
    /// Median latency per call.
    pub latency_ms: f64,
    /// Probability the call returns without error (no infra fault drawn).
    pub p_success: f64,
    /// Probability a successful output passes validation.
    pub p_valid: f64,
    /// The arm's own error classes with relative weights.
    pub errors: Vec<(ErrorClass, f64)>,
    /// Infrastructure-fault probability of this arm; `None` uses `[infra].p_fault`.
    pub p_infra: Option<f64>,
}

/// A partial set of numbers (`when` and `drift`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overrides {
    /// See [`Numbers::cost`].
    pub cost: Option<f64>,
    /// See [`Numbers::latency_ms`].
    pub latency_ms: Option<f64>,
    /// See [`Numbers::p_success`].
    pub p_success: Option<f64>,
    /// See [`Numbers::p_valid`].
    pub p_valid: Option<f64>,
    /// See [`Numbers::errors`].
    pub errors: Option<Vec<(ErrorClass, f64)>>,
    /// See [`Numbers::p_infra`].
    pub p_infra: Option<f64>,
}

impl Numbers {
    /// Applies the overrides that are set.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(x) = o.cost {
            self.cost = x;
        }
        if let Some(x) = o.latency_ms {
            self.latency_ms = x;
        }
        if let Some(x) = o.p_success {
            self.p_success = x;
        }
        if let Some(x) = o.p_valid {
            self.p_valid = x;
        }
        if let Some(x) = &o.errors {
            self.errors = x.clone();
        }
        if let Some(x) = o.p_infra {
            self.p_infra = Some(x);
        }
    }
}

/// A conditional override of an arm.
#[derive(Debug, Clone, PartialEq)]
pub struct When {
    /// Every listed feature must equal the task's.
    pub matcher: BTreeMap<String, String>,
    /// The numbers that change.
    pub overrides: Overrides,
}

/// One `(tool, strategy)` candidate of a stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// The tool's name.
    pub tool: String,
    /// The strategy's name.
    pub strategy: String,
    /// Parameters passed to the tool.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The base numbers.
    pub numbers: Numbers,
    /// Conditional overrides; the first whose match holds wins.
    pub when: Vec<When>,
}

/// A stage of every task.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The stage's name.
    pub name: String,
    /// Its candidate arms.
    pub arms: Vec<Arm>,
}

/// The environment's own faults.
#[derive(Debug, Clone, PartialEq)]
pub struct Infra {
    /// Fault probability per call.
    pub p_fault: f64,
    /// Fault classes with relative weights.
    pub errors: Vec<(ErrorClass, f64)>,
}

impl Default for Infra {
    /// No `[infra]` table: no environment-wide faults, and the classes of FORMAT.md's example,
    /// `{ TransientNetwork = 2, RateLimit = 1 }`, for an arm's `p_infra` to draw from (also
    /// those of an `[infra]` that names none).
    fn default() -> Self {
        Infra {
            p_fault: 0.0,
            errors: vec![
                (ErrorClass::TransientNetwork, 2.0),
                (ErrorClass::RateLimit, 1.0),
            ],
        }
    }
}

impl Infra {
    /// The class of a fault, drawn by the weights from a uniform `u`.
    pub fn pick(&self, u: f64) -> ErrorClass {
        let weights: Vec<f64> = self.errors.iter().map(|(_, w)| *w).collect();
        super::rng::pick_weighted(&weights, u)
            .and_then(|i| self.errors.get(i))
            .map(|(c, _)| *c)
            .unwrap_or(ErrorClass::TransientNetwork)
    }
}

/// A change of an arm's numbers from some task on.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift {
    /// The first (0-based) task index the drift applies to.
    pub after_task: u64,
    /// The stage of the arm.
    pub stage: String,
    /// The arm's tool.
    pub tool: String,
    /// The arm's strategy.
    pub strategy: String,
    /// Feature conditions (empty: every task).
    pub matcher: BTreeMap<String, String>,
    /// The numbers that change.
    pub overrides: Overrides,
}

/// A whole parsed environment.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    /// The environment's name.
    pub name: String,
    /// The goal template.
    pub goal: String,
    /// The reward's terms.
    pub reward: RewardConfig,
    /// The features, in file order.
    pub features: Vec<Feature>,
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// Infrastructure faults.
    pub infra: Infra,
    /// Drift entries, in file order.
    pub drift: Vec<Drift>,
}

fn matches(matcher: &BTreeMap<String, String>, features: &BTreeMap<String, String>) -> bool {
    matcher.iter().all(|(k, v)| features.get(k) == Some(v))
}

impl SimSpec {
    /// The numbers of `arm` of stage `stage` in force for task `index` with `features`: the base,
    /// then the first `when` whose match holds, then every drift entry that applies, in order.
    pub fn numbers(
        &self,
        stage: &Stage,
        arm: &Arm,
        index: u64,
        features: &BTreeMap<String, String>,
    ) -> Numbers {
        let mut n = arm.numbers.clone();
        if let Some(w) = arm.when.iter().find(|w| matches(&w.matcher, features)) {
            n.apply(&w.overrides);
        }
        for d in &self.drift {
            if index >= d.after_task
                && d.stage == stage.name
                && d.tool == arm.tool
                && d.strategy == arm.strategy
                && matches(&d.matcher, features)
            {
                n.apply(&d.overrides);
            }
        }
        n
    }
}
