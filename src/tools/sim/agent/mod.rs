//! Simulated agent environments (the format of `config/envs/AGENT-FORMAT.md`): one agent stage
//! whose language model and tools are simulated. This module owns the loaded environment: its
//! tasks (features, goal, input object), the rendered expected answer and its validation, the
//! reward with its token term, which rule or correction a failure belongs to (repeat errors), and
//! the oracle's exact first-try success. The simulated tools are in `tool`, the simulated model
//! in `model`.

mod knows;
mod model;
mod parse;
mod spec;
mod template;
mod tool;
mod validate;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

pub use knows::{Outcome, outcome_of, request_tokens};
pub use model::{Quirks, SimModel};
pub use spec::{
    AgentReward, AgentSpec, Correction, Edit, ModelConfig, Param, Plan, PlanCall, Require, Rule,
    ToolDecl,
};
pub use template::{ParamType, Piece, Template};
pub use tool::AgentTool;

use crate::record::Task;
use crate::run::workflow::sim_task_id;
use crate::tools::sim::{SimError, draw_features, fill_goal};
use crate::tools::tool::Tool;
use template::Values;

/// What a failed call's message belongs to ([`AgentEnv::failure_source`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureSource {
    /// Rule `rule` (0-based, file order) of tool `tool`.
    Rule {
        /// The tool.
        tool: String,
        /// The rule's index among the tool's rules.
        rule: usize,
    },
    /// The effect of correction `index` (0-based, file order).
    Correction {
        /// The correction's index.
        index: usize,
    },
}

impl FailureSource {
    /// A stable key: `rule:<tool>:<n>` or `correction:<n>` (a repeat has the same key).
    pub fn key(&self) -> String {
        match self {
            FailureSource::Rule { tool, rule } => format!("rule:{tool}:{rule}"),
            FailureSource::Correction { index } => format!("correction:{index}"),
        }
    }
}

/// A loaded agent environment. Cheap to clone (shared inside).
#[derive(Debug, Clone)]
pub struct AgentEnv {
    spec: Arc<AgentSpec>,
    seed: u64,
}

impl AgentEnv {
    /// Reads and checks an agent environment file.
    pub fn load(path: &Path) -> Result<AgentEnv, SimError> {
        let (text, file) = crate::tools::sim::read(path)?;
        AgentEnv::parse(&text, &file)
    }

    /// Parses and checks an agent environment's text; `origin` names it in errors. Seed 0.
    pub fn parse(text: &str, origin: &str) -> Result<AgentEnv, SimError> {
        Ok(AgentEnv {
            spec: Arc::new(parse::parse_agent(text, origin)?),
            seed: 0,
        })
    }

    /// The same environment drawing with `seed` (tasks, tools and model alike).
    pub fn with_seed(mut self, seed: u64) -> AgentEnv {
        self.seed = seed;
        self
    }

    /// The seed every draw starts from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The environment's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The whole parsed environment.
    pub fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    /// Task `index`'s features, drawn as FORMAT.md draws them.
    pub fn features(&self, index: u64) -> BTreeMap<String, String> {
        draw_features(&self.spec.features, self.seed, index)
    }

    /// Task `index`'s input object, each `[input]` template rendered.
    pub fn input(
        &self,
        index: u64,
        features: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let empty = BTreeMap::new();
        let fields = BTreeMap::new();
        let v = Values {
            index,
            features,
            input: &empty,
            fields: &fields,
        };
        self.spec
            .input
            .iter()
            .map(|(k, t)| (k.clone(), t.render(&v)))
            .collect()
    }

    /// Task `index`: id `<env>#<index>`, the goal rendered from the drawn features, and the
    /// input object.
    pub fn task(&self, index: u64) -> Task {
        let features = self.features(index);
        let input = self.input(index, &features);
        Task {
            task_id: sim_task_id(&self.spec.name, index),
            goal: fill_goal(&self.spec.goal, &features),
            input: Some(Value::Object(
                input
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            )),
            features,
            ..Task::default()
        }
    }

    /// One simulated tool per `[[tool]]`, in file order.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        (0..self.spec.tools.len())
            .map(|i| Arc::new(AgentTool::new(self.clone(), i)) as Arc<dyn Tool>)
            .collect()
    }

    /// The simulated model of this environment.
    pub fn model(&self) -> SimModel {
        SimModel::new(self.clone())
    }

    /// The oracle model: knows every rule's fix, follows each with probability 1, follows no
    /// poisoned correction, has no quirks.
    pub fn oracle_model(&self) -> SimModel {
        SimModel::oracle(self.clone())
    }

    /// The fields every tool returns for task `index` (`returns` rendered), by tool.
    pub fn returns(&self, index: u64) -> BTreeMap<String, BTreeMap<String, String>> {
        let features = self.features(index);
        let input = self.input(index, &features);
        self.spec
            .tools
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    tool::render_returns(t, index, &features, &input),
                )
            })
            .collect()
    }

    /// The answer that passes task `index`: its plan's `answer` rendered with every call's
    /// result (`None` when no plan matches the task).
    pub fn expected_answer(&self, index: u64) -> Option<String> {
        let features = self.features(index);
        let input = self.input(index, &features);
        let plan = self.spec.plan_for(&features)?;
        let fields = self.returns(index);
        Some(plan.answer.render(&Values {
            index,
            features: &features,
            input: &input,
            fields: &fields,
        }))
    }

    /// Checks a final answer of task `index` (AGENT-FORMAT.md, Validation): it contains the
    /// rendered `answer` and no `ref-<number>` (no tool returns one). The error says why not.
    pub fn validate(&self, index: u64, answer: &str) -> Result<(), String> {
        let expected = self
            .expected_answer(index)
            .ok_or_else(|| format!("task {index} matches no [[plan]]: nothing can pass"))?;
        validate::check(answer, &expected)
    }

    /// The reward of a finished task: FORMAT.md's, minus `tokens * min(1, total_tokens /
    /// max_tokens)`.
    pub fn reward(&self, passed: bool, latency_ms: f64, cost: f64, tokens: f64) -> f64 {
        self.spec.reward.reward(passed, latency_ms, cost, tokens)
    }

    /// The corrections submitted before task `index` (`at_task <= index`), with their indices.
    pub fn corrections_before(&self, index: u64) -> impl Iterator<Item = (usize, &Correction)> {
        self.spec
            .corrections
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.at_task <= index)
    }

    /// What a failed call of `tool` with `args` on task `index` belongs to: the rule whose
    /// message the failure carries, or the correction whose effect (present in the arguments,
    /// on a key the rule checks) made it fail. `None` for an infrastructure fault, a params
    /// failure, or a message of no rule. Two failures with the same [`FailureSource::key`] in
    /// one scope make the later a repeat.
    pub fn failure_source(
        &self,
        index: u64,
        tool: &str,
        args: &Value,
        message: &str,
    ) -> Option<FailureSource> {
        let decl = self.spec.tool(tool)?;
        let rule = decl
            .rules
            .iter()
            .position(|r| message.contains(&r.message))?;
        let r = &decl.rules[rule];
        let checked: Vec<&str> = r
            .require
            .has
            .iter()
            .chain(&r.require.absent)
            .map(String::as_str)
            .chain(r.require.equals.iter().map(|(k, _)| k.as_str()))
            .collect();
        let features = self.features(index);
        let input = self.input(index, &features);
        let fields = BTreeMap::new();
        let v = Values {
            index,
            features: &features,
            input: &input,
            fields: &fields,
        };
        let canon = tool::canonical_args(decl, args);
        let by_correction = self.spec.corrections.iter().position(|c| {
            c.tool == tool
                && c.edit
                    .set
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .chain(c.edit.remove.iter().map(String::as_str))
                    .any(|k| checked.contains(&k))
                && c.edit.set.iter().all(|(k, t)| {
                    let want = decl.param(k).and_then(|p| p.ty.convert(&t.render(&v)));
                    want.is_some() && canon.get(k) == want.as_ref()
                })
                && c.edit.remove.iter().all(|k| !canon.contains_key(k))
        });
        Some(match by_correction {
            Some(index) => FailureSource::Correction { index },
            None => FailureSource::Rule {
                tool: tool.to_string(),
                rule,
            },
        })
    }

    /// The oracle's first-try success, exact from the file: over the features the plans' `when`
    /// names (their probabilities by the weights), the probability that no infrastructure fault
    /// strikes the calls of the first matching plan (0 where no plan matches).
    pub fn oracle_first_try_success(&self) -> f64 {
        let spec = &self.spec;
        let named: Vec<&crate::tools::sim::Feature> = spec
            .features
            .iter()
            .filter(|f| spec.plans.iter().any(|p| p.when.contains_key(&f.name)))
            .collect();
        let mut total = 0.0;
        let mut combo: BTreeMap<String, String> = BTreeMap::new();
        walk(&named, 0, 1.0, &mut combo, &mut |features, p| {
            if let Some(plan) = spec.plan_for(features) {
                let clean: f64 = plan
                    .calls
                    .iter()
                    .filter_map(|c| spec.tool(&c.tool))
                    .map(|t| 1.0 - spec.p_infra(t))
                    .product();
                total += p * clean;
            }
        });
        total
    }
}

/// Calls `f` with every combination of the features' values and its probability.
fn walk(
    features: &[&crate::tools::sim::Feature],
    at: usize,
    p: f64,
    combo: &mut BTreeMap<String, String>,
    f: &mut dyn FnMut(&BTreeMap<String, String>, f64),
) {
    let Some(feature) = features.get(at) else {
        f(combo, p);
        return;
    };
    let sum: f64 = feature.weights.iter().sum();
    for (v, w) in feature.values.iter().zip(&feature.weights) {
        if *w <= 0.0 {
            continue;
        }
        combo.insert(feature.name.clone(), v.clone());
        walk(features, at + 1, p * w / sum, combo, f);
    }
    combo.remove(&feature.name);
}

#[cfg(test)]
mod tests;
