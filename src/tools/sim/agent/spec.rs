//! The parsed form of an agent environment (AGENT-FORMAT.md): tools with their rules, the
//! model's character, the plans, the corrections, and the reward with its token term.

use std::collections::BTreeMap;

use serde_json::Value;

use super::template::{ParamType, Template};
use crate::taxonomy::ErrorClass;
use crate::tools::sim::{Feature, Infra, RewardConfig};

/// The reward's terms: FORMAT.md's, plus the token penalty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentReward {
    /// FORMAT.md's terms (with `sla_ms`).
    pub base: RewardConfig,
    /// Weight of the token penalty (default 0).
    pub tokens: f64,
    /// Tokens at which the token penalty is full (default 20,000).
    pub max_tokens: f64,
}

impl AgentReward {
    /// 0 if the task did not pass, else `clamp(success - latency * min(1, L / sla_ms) - cost *
    /// min(1, C / max_cost) - tokens * min(1, T / max_tokens), 0, 1)`.
    pub fn reward(&self, passed: bool, latency_ms: f64, cost: f64, tokens: f64) -> f64 {
        if !passed {
            return 0.0;
        }
        (self.base.gross(latency_ms, cost)
            - self.tokens * (tokens.max(0.0) / self.max_tokens).min(1.0))
        .clamp(0.0, 1.0)
    }
}

/// One parameter of a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: ParamType,
    /// Whether a call may leave it out (`?`).
    pub optional: bool,
}

/// What a call's arguments must satisfy (`require`); every listed condition must hold.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Require {
    /// Keys that must be present.
    pub has: Vec<String>,
    /// Keys that must be absent.
    pub absent: Vec<String>,
    /// Keys that must equal a value (canonical, after conversion to the parameter's type).
    pub equals: Vec<(String, Value)>,
}

impl Require {
    /// Whether arguments (canonical values by name) satisfy it.
    pub fn holds(&self, args: &BTreeMap<String, Value>) -> bool {
        self.has.iter().all(|k| args.contains_key(k))
            && self.absent.iter().all(|k| !args.contains_key(k))
            && self.equals.iter().all(|(k, v)| args.get(k) == Some(v))
    }
}

/// A change to a call's arguments: `set` then `remove`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Edit {
    /// Keys set, each to a template.
    pub set: Vec<(String, Template)>,
    /// Keys removed.
    pub remove: Vec<String>,
}

/// A hidden requirement of a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Features that must match the task for the rule to apply.
    pub when: BTreeMap<String, String>,
    /// What the arguments must satisfy.
    pub require: Require,
    /// The class of the failure.
    pub error: ErrorClass,
    /// The failure's message.
    pub message: String,
    /// The fix.
    pub fix: Edit,
    /// Words that, with the tool's name, make the fix known (lowercase).
    pub cue: Vec<String>,
}

/// A simulated tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDecl {
    /// The registry's name.
    pub name: String,
    /// Offered to the model.
    pub description: String,
    /// Its parameters, in name order.
    pub params: Vec<Param>,
    /// The fields of a successful result, by name.
    pub returns: Vec<(String, Template)>,
    /// Median latency of a call.
    pub latency_ms: f64,
    /// Cost per call.
    pub cost: f64,
    /// Whether calling twice is harmless.
    pub idempotent: bool,
    /// Overrides `[infra].p_fault` for this tool.
    pub p_infra: Option<f64>,
    /// Hidden requirements, in order.
    pub rules: Vec<Rule>,
}

impl ToolDecl {
    /// The parameter named `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
}

/// The simulated model's character (`[model]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Chance a known fix is applied to a call.
    pub p_follow: f64,
    /// Request tokens beyond which `p_follow` is scaled by `crowd / request_tokens`.
    pub crowd: f64,
    /// A request over this many tokens fails.
    pub context_window: u64,
    /// Tokens a turn generates.
    pub completion_tokens: u32,
    /// Times the model retries one failed call.
    pub retries: u32,
    /// Per attempt: repeats a call instead of moving on.
    pub p_loop: f64,
    /// Per attempt: its answer cites a reference no tool returned.
    pub p_claim: f64,
    /// Per attempt: answers after its first call.
    pub p_stop: f64,
    /// Per attempt: answers about another value of the goal's first feature.
    pub p_drift: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            p_follow: 0.9,
            crowd: 2000.0,
            context_window: 8000,
            completion_tokens: 60,
            retries: 2,
            p_loop: 0.0,
            p_claim: 0.0,
            p_stop: 0.0,
            p_drift: 0.0,
        }
    }
}

/// One call of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanCall {
    /// The tool.
    pub tool: String,
    /// Its arguments, each a template.
    pub args: Vec<(String, Template)>,
}

/// The calls the model makes by default for matching tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Features that must match (empty: every task).
    pub when: BTreeMap<String, String>,
    /// The calls, in order.
    pub calls: Vec<PlanCall>,
    /// The final answer when every call succeeded.
    pub answer: Template,
}

/// A human correction the bench submits.
#[derive(Debug, Clone, PartialEq)]
pub struct Correction {
    /// Submitted before this task.
    pub at_task: u64,
    /// The tool whose calls it changes.
    pub tool: String,
    /// What following it does to the calls.
    pub edit: Edit,
    /// Words that, with the tool's name, make it known (lowercase).
    pub cue: Vec<String>,
    /// Its words.
    pub text: String,
    /// A wrong correction.
    pub poisoned: bool,
}

/// A whole parsed agent environment.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// The environment's name.
    pub name: String,
    /// The goal template (`{feature}` placeholders).
    pub goal: String,
    /// The feature the goal names first (drift changes its value), if any.
    pub goal_first_feature: Option<String>,
    /// The reward's terms.
    pub reward: AgentReward,
    /// The features, in name order.
    pub features: Vec<Feature>,
    /// The input object's templates, by key.
    pub input: Vec<(String, Template)>,
    /// The tools, in file order.
    pub tools: Vec<ToolDecl>,
    /// The model's character.
    pub model: ModelConfig,
    /// The plans, in order.
    pub plans: Vec<Plan>,
    /// Infrastructure faults.
    pub infra: Infra,
    /// Corrections, in file order.
    pub corrections: Vec<Correction>,
}

/// Whether every listed feature equals the task's.
pub fn matches(when: &BTreeMap<String, String>, features: &BTreeMap<String, String>) -> bool {
    when.iter().all(|(k, v)| features.get(k) == Some(v))
}

impl AgentSpec {
    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&ToolDecl> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The first plan whose `when` matches the task.
    pub fn plan_for(&self, features: &BTreeMap<String, String>) -> Option<&Plan> {
        self.plans.iter().find(|p| matches(&p.when, features))
    }

    /// A tool's fault probability (`p_infra`, else `[infra].p_fault`).
    pub fn p_infra(&self, tool: &ToolDecl) -> f64 {
        tool.p_infra.unwrap_or(self.infra.p_fault)
    }
}
