//! The workflow a tree plans from: its stages, the arms of each, how to check a stage's output,
//! and how a run's reward is computed. A tool stage's arms are `(tool, strategy)` pairs; an
//! agent stage's arms are variants of a model-driven loop (model, instruction variant, toolset,
//! temperature), which the bandit sees as `(model, variant)`. The planner chooses only among
//! these arms, and a workflow whose arms name a tool the registry lacks is refused at start.

use std::collections::HashMap;
use std::sync::Arc;

use crate::Task;
use crate::learn::bandit::{Arm, Policy, PolicyConfig, PolicyError, RewardParams, StageArms};
use crate::tools::ToolRegistry;
use crate::tools::sim::agent::AgentEnv;
use crate::tools::sim::{RewardConfig, SimEnv};

/// The name of a simulated agent environment's model in its workflow.
pub const SIM_MODEL: &str = "simulated";
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
    /// Its candidates (for an agent stage, one per variant: the model and the variant's name).
    pub arms: Vec<WorkflowArm>,
    /// The model-driven loop, when this is an agent stage.
    #[serde(default)]
    pub agent: Option<AgentStage>,
}

impl WorkflowStage {
    /// A tool stage over `arms`.
    pub fn tools(name: impl Into<String>, arms: Vec<WorkflowArm>) -> WorkflowStage {
        WorkflowStage {
            name: name.into(),
            arms,
            agent: None,
        }
    }

    /// An agent stage: its arms are the variants of `agent`.
    pub fn agent(name: impl Into<String>, agent: AgentStage) -> WorkflowStage {
        WorkflowStage {
            name: name.into(),
            arms: agent
                .variants
                .iter()
                .map(|v| WorkflowArm {
                    tool: v.model.clone(),
                    strategy: v.name.clone(),
                    params: Map::new(),
                })
                .collect(),
            agent: Some(agent),
        }
    }
}

/// An agent stage: a loop in which a model calls tools until it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStage {
    /// What the agent is for, in words (listed by `hindsight agents list` and `GET /agents`).
    #[serde(default)]
    pub description: String,
    /// What the agent is and does (the system message starts with it).
    pub instructions: String,
    /// The variants the policy chooses between.
    pub variants: Vec<AgentVariant>,
    /// Model turns per attempt before the attempt fails (its budget of turns; 8 unless set).
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// The JSON Schema the answer must follow (the answer is then read as JSON); `None`: the
    /// answer is text, given as `{"answer": text}`.
    #[serde(default)]
    pub answer_schema: Option<Value>,
    /// Tokens one turn may generate (sent as `max_tokens`): set it to bound a model that
    /// rambles or a turn's cost; `None` leaves the server's own limit.
    #[serde(default)]
    pub max_turn_tokens: Option<u32>,
    /// Tokens (prompt and generated) every model turn of a run of the stage may use together,
    /// over all its attempts; `None`: no limit. Checked before each turn: a run that has spent
    /// it ends `aborted`, naming it.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Cost (model turns' tokens at the endpoint's price, and tool calls) a run of the stage may
    /// spend, checked likewise. With it, the reward's cost term is the share of it spent.
    #[serde(default)]
    pub max_cost: Option<f64>,
    /// Time (ms) a run's model turns and tool calls may take together, checked likewise. With
    /// it, the reward's latency term is the share of it taken.
    #[serde(default)]
    pub max_wall_ms: Option<u64>,
}

impl AgentStage {
    /// Which budget a run that has spent `tokens`, `cost` and `wall_ms` has used up, in words.
    pub fn budget_spent(&self, tokens: u64, cost: f64, wall_ms: f64) -> Option<String> {
        if let Some(max) = self.max_tokens.filter(|&m| tokens >= m) {
            return Some(format!("its budget of {max} tokens ({tokens} used)"));
        }
        if let Some(max) = self.max_cost.filter(|&m| cost >= m) {
            return Some(format!("its budget of cost {max} ({cost:.4} used)"));
        }
        if let Some(max) = self.max_wall_ms.filter(|&m| wall_ms >= m as f64) {
            return Some(format!("its budget of {max} ms ({wall_ms:.0} ms used)"));
        }
        None
    }
}

fn default_max_turns() -> u32 {
    8
}

/// An agent as configured (`[[agent]]`): its name, what it is for, and its loop.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentConfig {
    /// The agent's name (tasks are submitted to it by name).
    pub name: String,
    /// Its loop: description, instructions, variants, budget of turns, answer schema.
    #[serde(flatten)]
    pub stage: AgentStage,
}

/// Read by hand rather than with `#[serde(flatten)]`, which would let an unknown key of the
/// block (a misspelt `max_turn` for one) pass unnoticed: the stage refuses keys it lacks.
impl<'de> Deserialize<'de> for AgentConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut block = serde_json::Map::<String, Value>::deserialize(d)?;
        let name = match block.remove("name") {
            Some(Value::String(name)) => name,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "`name` must be a string, not {other}"
                )));
            }
            None => return Err(D::Error::missing_field("name")),
        };
        let stage = AgentStage::deserialize(Value::Object(block)).map_err(D::Error::custom)?;
        Ok(AgentConfig { name, stage })
    }
}

/// One way of running an agent stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentVariant {
    /// The variant's name (the bandit's strategy).
    pub name: String,
    /// The model endpoint (a name the interpreter's models know).
    pub model: String,
    /// An instruction variant, added after the agent's instructions.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The tools it may call: registry names or globs (`*` matches any run of characters; a
    /// `/` in a pattern also matches the `.` of an MCP server's prefix).
    pub tools: Vec<String>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
}

/// The tools one variant of an agent stage offers, as the model sees them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Toolset {
    /// What is offered (names the model may use: a registry name with characters outside
    /// `[A-Za-z0-9_-]` replaced by `_`).
    pub offered: Vec<crate::model::ToolDef>,
    /// The registry name of each offered name.
    pub registry_names: HashMap<String, String>,
}

impl Toolset {
    /// The registry name of the tool the model calls `name`, if it was offered.
    pub fn registry_name(&self, name: &str) -> Option<&str> {
        self.registry_names.get(name).map(String::as_str)
    }

    /// One line per tool: its offered name and what it does (the manifest of the toolset).
    pub fn manifest(&self) -> String {
        self.offered
            .iter()
            .map(|t| format!("- {}: {}", t.name, t.description))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The output check of an agent stage: its answer must follow `answer_schema`, when it has one.
pub fn answer_check(agent: &AgentStage) -> OutputCheck {
    let validator = agent
        .answer_schema
        .as_ref()
        .map(|schema| jsonschema::validator_for(schema).map_err(|e| e.to_string()));
    Arc::new(move |_, _, output| match &validator {
        None => Ok(()),
        Some(Err(e)) => Err(format!("the answer schema is not a JSON Schema: {e}")),
        Some(Ok(v)) => v
            .validate(output)
            .map_err(|e| format!("the answer breaks its schema at {}: {e}", e.instance_path())),
    })
}

/// The prefix of the tool that calls another agent (`agent:NAME`): each call is a child run of
/// that agent.
pub const AGENT_TOOL_PREFIX: &str = "agent:";

impl AgentConfig {
    /// The agents this one calls as tools (`agent:NAME` in its variants' tools), each once.
    pub fn callees(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .stage
            .variants
            .iter()
            .flat_map(|v| &v.tools)
            .filter_map(|p| p.strip_prefix(AGENT_TOOL_PREFIX))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// The order to start agents that call each other (`calls[i]`: the agents `i` calls): every
/// agent after those it calls; or, when they call each other in a cycle, the agents along it
/// from the first met on it back to that one.
pub fn callees_first(calls: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    // Depth-first, colouring: 0 unseen, 1 on the current path, 2 placed (in post-order).
    fn visit(
        n: usize,
        calls: &[Vec<usize>],
        colour: &mut [u8],
        path: &mut Vec<usize>,
        order: &mut Vec<usize>,
    ) -> bool {
        colour[n] = 1;
        path.push(n);
        for &m in calls.get(n).map(Vec::as_slice).unwrap_or_default() {
            match colour.get(m).copied() {
                Some(1) => {
                    let start = path.iter().position(|&p| p == m).unwrap_or(0);
                    path.drain(..start);
                    path.push(m);
                    return true;
                }
                Some(0) if visit(m, calls, colour, path, order) => return true,
                _ => {}
            }
        }
        path.pop();
        colour[n] = 2;
        order.push(n);
        false
    }
    let mut colour = vec![0u8; calls.len()];
    let mut order = Vec::with_capacity(calls.len());
    for n in 0..calls.len() {
        let mut path = Vec::new();
        if colour[n] == 0 && visit(n, calls, &mut colour, &mut path, &mut order) {
            return Err(path);
        }
    }
    Ok(order)
}

/// Whether `name` matches the glob `pattern` (`*` any run of characters).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((c, rest)) => n
                .split_first()
                .is_some_and(|(d, nr)| c == d && go(rest, nr)),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
        || (pattern.contains('/') && go(pattern.replace('/', ".").as_bytes(), name.as_bytes()))
}

/// The name a model may use for the registry tool `name` (OpenAI-compatible servers accept
/// only `[A-Za-z0-9_-]`, at most 64 characters).
pub fn offered_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Checks one stage's output for a task.
pub type OutputCheck = Arc<dyn Fn(&Task, &str, &Value) -> Result<(), String> + Send + Sync>;

/// A workflow whose arm names a tool the registry does not have (for an agent variant, a
/// pattern that matches no tool, or two tools offered under one name).
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
    toolsets: HashMap<(String, String), Arc<Toolset>>,
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
        let mut toolsets = HashMap::new();
        for stage in &stages {
            if let Some(agent) = &stage.agent {
                for variant in &agent.variants {
                    let toolset = toolset(&name, &stage.name, variant, registry)?;
                    for registry_name in toolset.registry_names.values() {
                        if let Some(tool) = registry.get(registry_name) {
                            idempotent.insert(registry_name.clone(), tool.spec().idempotent);
                        }
                    }
                    toolsets.insert(
                        (stage.name.clone(), variant.name.clone()),
                        Arc::new(toolset),
                    );
                }
                continue;
            }
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
            toolsets,
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
            .map(|s| {
                WorkflowStage::tools(
                    s.name.clone(),
                    s.arms
                        .iter()
                        .map(|a| WorkflowArm {
                            tool: a.tool.clone(),
                            strategy: a.strategy.clone(),
                            params: a.params.clone(),
                        })
                        .collect(),
                )
            })
            .collect();
        let checker = env.clone();
        let check: OutputCheck = Arc::new(move |_, stage, output| checker.validate(stage, output));
        let mut wf = Workflow::new(env.name(), stages, registry, check, env.reward_config())?;
        wf.sim = Some(env.clone());
        Ok(wf)
    }

    /// The workflow of a simulated agent environment: one agent stage, `agent`, whose one
    /// variant runs the environment's simulated model (named [`SIM_MODEL`]) over all its tools,
    /// which must be in `registry`; an answer passes the environment's validation.
    pub fn from_agent_env(
        env: &AgentEnv,
        registry: &ToolRegistry,
    ) -> Result<Workflow, UnknownTool> {
        let spec = env.spec();
        let longest = spec.plans.iter().map(|p| p.calls.len()).max().unwrap_or(0) as u32;
        let agent = AgentStage {
            description: format!("the simulated agent of {}", spec.name),
            instructions: format!("You are the {} agent. {}", spec.name, spec.goal),
            variants: vec![AgentVariant {
                name: "default".to_string(),
                model: SIM_MODEL.to_string(),
                prompt: None,
                tools: spec.tools.iter().map(|t| t.name.clone()).collect(),
                temperature: None,
            }],
            // Every call of the longest plan with each retry the model makes, and the answer.
            max_turns: longest * (spec.model.retries + 1) + 2,
            answer_schema: None,
            max_turn_tokens: None,
            max_tokens: None,
            max_cost: None,
            max_wall_ms: None,
        };
        let checker = env.clone();
        let check: OutputCheck = Arc::new(move |task, _, output| {
            let answer = output.get("answer").and_then(Value::as_str).unwrap_or("");
            checker.validate(task_index(task), answer)
        });
        let reward = spec.reward.base;
        Workflow::new(
            spec.name.clone(),
            vec![WorkflowStage::agent("agent", agent)],
            registry,
            check,
            reward,
        )
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[WorkflowStage] {
        &self.stages
    }

    /// The agent loop of stage `stage`, if it is an agent stage.
    pub fn agent(&self, stage: &str) -> Option<&AgentStage> {
        self.stages
            .iter()
            .find(|s| s.name == stage)
            .and_then(|s| s.agent.as_ref())
    }

    /// The tools variant `variant` of agent stage `stage` offers (empty for anything else).
    pub fn toolset(&self, stage: &str, variant: &str) -> Arc<Toolset> {
        self.toolsets
            .get(&(stage.to_string(), variant.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// The tool manifest a `retry_with_tool_manifest` recovery injects: per stage, the tools
    /// and strategies it may use, one line each ("stage search: web_search/top3, ..."); an
    /// agent stage lists the tools its variants offer.
    pub fn manifest(&self) -> String {
        self.stages
            .iter()
            .map(|s| {
                if let Some(agent) = &s.agent {
                    let mut tools: Vec<String> = agent
                        .variants
                        .iter()
                        .flat_map(|v| self.toolset(&s.name, &v.name).offered.clone())
                        .map(|t| t.name)
                        .collect();
                    tools.sort();
                    tools.dedup();
                    return format!("stage {}: tools {}", s.name, tools.join(", "));
                }
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

    /// Every tool the workflow may call, sorted: its tool stages' arms and what its agent
    /// stages' variants offer (by registry name).
    pub fn tool_names(&self) -> Vec<String> {
        let mut tools: Vec<String> = self
            .stages
            .iter()
            .filter(|s| s.agent.is_none())
            .flat_map(|s| s.arms.iter().map(|a| a.tool.clone()))
            .chain(
                self.toolsets
                    .values()
                    .flat_map(|t| t.registry_names.values().cloned()),
            )
            .collect();
        tools.sort();
        tools.dedup();
        tools
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
    pub fn args(&self, stage: &str, tool: &str, strategy: &str) -> Value {
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

    /// Checks one stage's output for `task`.
    pub fn validate(&self, task: &Task, stage: &str, output: &Value) -> Result<(), String> {
        (self.check)(task, stage, output)
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

/// The toolset of `variant`: every registry tool a pattern matches, offered under a name a
/// model server accepts.
fn toolset(
    workflow: &str,
    stage: &str,
    variant: &AgentVariant,
    registry: &ToolRegistry,
) -> Result<Toolset, UnknownTool> {
    let unknown = |tool: &str| UnknownTool {
        workflow: workflow.to_string(),
        stage: stage.to_string(),
        tool: tool.to_string(),
    };
    let mut names = registry.names();
    names.sort();
    let mut set = Toolset::default();
    for pattern in &variant.tools {
        let matched: Vec<&String> = names.iter().filter(|n| glob_match(pattern, n)).collect();
        if matched.is_empty() {
            return Err(unknown(pattern));
        }
        for name in matched {
            let offered = offered_name(name);
            match set.registry_names.get(&offered) {
                Some(existing) if existing == name => continue,
                Some(_) => return Err(unknown(&format!("{name} (offered as {offered}, taken)"))),
                None => {}
            }
            let Some(tool) = registry.get(name) else {
                return Err(unknown(name));
            };
            let spec = tool.spec();
            set.offered.push(crate::model::ToolDef {
                name: offered.clone(),
                description: spec.description.clone(),
                parameters: spec.input_schema.clone(),
            });
            set.registry_names.insert(offered, name.clone());
        }
    }
    Ok(set)
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
