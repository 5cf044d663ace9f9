//! The workflow a tree plans from: its stages, the `(tool, strategy)` arms of each, how to check
//! a stage's output, and how a run's reward is computed. The planner chooses only among these
//! arms, and a workflow whose arms name a tool the registry lacks is refused at start.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::Task;
use crate::learn::bandit::{Arm, Policy, PolicyConfig, PolicyError, RewardParams, StageArms};
use crate::tools::ToolRegistry;
use crate::tools::sim::{RewardConfig, SimEnv};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One candidate of a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowArm {
    /// The tool (a name in the registry).
    pub tool: String,
    /// The strategy.
    pub strategy: String,
    /// Parameters passed to the tool with the strategy.
    pub params: Map<String, Value>,
}

/// One stage of every task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowStage {
    /// The stage's name.
    pub name: String,
    /// Its candidates.
    pub arms: Vec<WorkflowArm>,
}

/// Checks one stage's output.
pub type OutputCheck = Arc<dyn Fn(&str, &Value) -> Result<(), String> + Send + Sync>;

/// A workflow whose arm names a tool the registry does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "workflow `{workflow}`: stage `{stage}` uses tool `{tool}`, which no configured tool provides"
)]
pub struct UnknownTool {
    /// The workflow.
    pub workflow: String,
    /// The stage.
    pub stage: String,
    /// The tool.
    pub tool: String,
}

/// Stages, arms, output checks and the reward.
pub struct Workflow {
    name: String,
    stages: Vec<WorkflowStage>,
    idempotent: HashMap<String, bool>,
    check: OutputCheck,
    reward: RewardConfig,
    sim: Option<SimEnv>,
}

impl Workflow {
    /// A workflow over `stages`, checked against `registry`.
    pub fn new(
        name: impl Into<String>,
        stages: Vec<WorkflowStage>,
        registry: &ToolRegistry,
        check: OutputCheck,
        reward: RewardConfig,
    ) -> Result<Workflow, UnknownTool> {
        let name = name.into();
        let mut idempotent = HashMap::new();
        for stage in &stages {
            for arm in &stage.arms {
                let Some(tool) = registry.get(&arm.tool) else {
                    return Err(UnknownTool {
                        workflow: name.clone(),
                        stage: stage.name.clone(),
                        tool: arm.tool.clone(),
                    });
                };
                idempotent.insert(arm.tool.clone(), tool.spec().idempotent);
            }
        }
        Ok(Workflow {
            name,
            stages,
            idempotent,
            check,
            reward,
            sim: None,
        })
    }

    /// The workflow of a simulated environment, whose tools must be in `registry`.
    pub fn from_sim(env: &SimEnv, registry: &ToolRegistry) -> Result<Workflow, UnknownTool> {
        let stages = env
            .stages()
            .iter()
            .map(|s| WorkflowStage {
                name: s.name.clone(),
                arms: s
                    .arms
                    .iter()
                    .map(|a| WorkflowArm {
                        tool: a.tool.clone(),
                        strategy: a.strategy.clone(),
                        params: a.params.clone(),
                    })
                    .collect(),
            })
            .collect();
        let checker = env.clone();
        let check: OutputCheck = Arc::new(move |stage, output| checker.validate(stage, output));
        let mut wf = Workflow::new(env.name(), stages, registry, check, env.reward_config())?;
        wf.sim = Some(env.clone());
        Ok(wf)
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[WorkflowStage] {
        &self.stages
    }

    /// The tool manifest a `retry_with_tool_manifest` recovery injects: per stage, the tools
    /// and strategies it may use, one line each ("stage search: web_search/top3, ...").
    pub fn manifest(&self) -> String {
        self.stages
            .iter()
            .map(|s| {
                let arms: Vec<String> = s
                    .arms
                    .iter()
                    .map(|a| format!("{}/{}", a.tool, a.strategy))
                    .collect();
                format!("stage {}: {}", s.name, arms.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The simulated environment behind the workflow, if it is one.
    pub fn sim(&self) -> Option<&SimEnv> {
        self.sim.as_ref()
    }

    /// The reward configuration.
    pub fn reward_config(&self) -> &RewardConfig {
        &self.reward
    }

    /// Whether calling `tool` twice is harmless (unknown tools are taken as not).
    pub fn is_idempotent(&self, tool: &str) -> bool {
        self.idempotent.get(tool).copied().unwrap_or(false)
    }

    /// The arguments of an arm's call: its strategy and parameters.
    pub fn args(
        &self,
        stage: &str,
        tool: &str,
        strategy: &str,
        _previous: &BTreeMap<String, Value>,
    ) -> Value {
        let mut args = self
            .stages
            .iter()
            .find(|s| s.name == stage)
            .and_then(|s| {
                s.arms
                    .iter()
                    .find(|a| a.tool == tool && a.strategy == strategy)
            })
            .map(|a| a.params.clone())
            .unwrap_or_default();
        args.insert("strategy".into(), Value::from(strategy));
        Value::Object(args)
    }

    /// Checks one stage's output.
    pub fn validate(&self, stage: &str, output: &Value) -> Result<(), String> {
        (self.check)(stage, output)
    }

    /// The bandit's stages and arms.
    pub fn stage_arms(&self) -> Vec<StageArms> {
        self.stages
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

    /// A policy over this workflow's arms: `config` with the workflow's reward.
    pub fn policy(&self, mut config: PolicyConfig) -> Result<Policy, PolicyError> {
        config.reward = reward_params(&self.reward);
        Policy::new(config, self.stage_arms())
    }

    /// A run's reward.
    pub fn reward(&self, passed: bool, latency_ms: f64, cost: f64) -> f64 {
        self.reward.reward(passed, latency_ms, cost)
    }
}

/// The bandit's reward parameters from a reward configuration.
pub fn reward_params(r: &RewardConfig) -> RewardParams {
    RewardParams {
        success: r.success,
        latency: r.latency,
        cost: r.cost,
        max_cost: r.max_cost,
        sla_ms: r.sla_ms,
    }
}

/// The index of a task drawn from a simulated environment (`<env>#<index>`), else a stable hash
/// of its id.
pub fn task_index(task: &Task) -> u64 {
    if let Some((_, n)) = task.task_id.rsplit_once('#')
        && let Ok(i) = n.parse()
    {
        return i;
    }
    task.task_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The task id of task `index` of environment `env`.
pub fn sim_task_id(env: &str, index: u64) -> String {
    format!("{env}#{index}")
}

/// A stable 64-bit FNV-1a hash (the same on every machine and run).
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
