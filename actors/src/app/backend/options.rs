//! options: the tree a configuration describes: its runtime options (workflow, durability,
//! learning, model, triage, chaos, MCP servers), and why it could not be started.

use std::path::Path;
use std::sync::Arc;

use hindsight::config::{Config, DurabilityConfig};
use hindsight::store::Durability;
use hindsight::tools::mcp::McpServer;
use hindsight::tools::{Tool, ToolRegistry};

use crate::runtime::{RuntimeError, RuntimeOptions, WorkflowSource};

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A configuration value cannot be used.
    #[error("{key}: {reason}")]
    Config {
        /// The configuration key at fault.
        key: String,
        /// Why.
        reason: String,
    },
    /// The tree could not start.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

pub(super) fn config_error(key: impl Into<String>, reason: impl Into<String>) -> StartError {
    StartError::Config {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Sets what `opts`'s tree learns with from the configuration: `[policy]`, `[distill]`,
/// `[adaptive]` (each the learning module's own type, checked when the file was read) and the
/// `[triage]` caps (how many attempts a run may make is how many outcomes it gives the policy).
/// The daemon and `hindsight bench learning --config` both go through here.
pub fn apply_learning(config: &Config, opts: &mut RuntimeOptions) {
    opts.policy = config.policy.clone();
    opts.distill = config.distill.clone();
    opts.adaptive = config.adaptive.clone();
    opts.tree.rules.max_recovery_attempts = config.triage.max_recovery_attempts;
    opts.tree.rules.max_total_attempts = config.triage.max_total_attempts;
}

/// The options of the tree a configuration describes (its first agent's, or its simulated
/// workflow's without one), and the MCP servers it started.
pub async fn runtime_options(
    config: &Config,
) -> Result<(RuntimeOptions, Vec<McpServer>), StartError> {
    let (tools, servers) = mcp_tools(config).await?;
    let agent = (!config.agents.is_empty()).then_some(0);
    match tree_options(config, agent, tools) {
        Ok(opts) => Ok((opts, servers)),
        Err(e) => {
            for s in &servers {
                s.shutdown().await;
            }
            Err(e)
        }
    }
}

/// Starts the configured MCP servers (`[[tools.mcp]]`): their tools, each under its server's
/// prefix (the server's name unless the block names one, so that two servers' tools never
/// collide), for every tree of the daemon to share; and the servers, to shut down at the end.
pub async fn mcp_tools(
    config: &Config,
) -> Result<(Vec<Arc<dyn Tool>>, Vec<McpServer>), StartError> {
    let mut names = std::collections::BTreeSet::new();
    let mut tools = Vec::new();
    let mut servers: Vec<McpServer> = Vec::new();
    for (i, server) in config.tools.mcp.iter().enumerate() {
        let mut mcp = server.clone();
        mcp.tool_prefix.get_or_insert_with(|| server.name.clone());
        let started = match McpServer::connect(mcp).await {
            Ok(s) => s,
            Err(e) => {
                for s in &servers {
                    s.shutdown().await;
                }
                return Err(config_error(format!("tools.mcp[{i}]"), e.to_string()));
            }
        };
        let mut clash = None;
        for tool in started.tools() {
            // Each tree registers (and checks) them; here only a name given twice is refused.
            if !names.insert(tool.spec().name.clone()) {
                clash = Some(format!("tool `{}` is already registered", tool.spec().name));
                break;
            }
            tools.push(tool);
        }
        servers.push(started);
        if let Some(e) = clash {
            for s in &servers {
                s.shutdown().await;
            }
            return Err(config_error(format!("tools.mcp[{i}]"), e));
        }
    }
    Ok((tools, servers))
}

/// The options of one tree of the daemon: agent `agent` of `[[agent]]` (its loop over `tools`,
/// its turns performed by the `[models.NAME]` endpoints, its data under
/// [`Config::agent_data_dir`]), or without one the simulated workflow of `tools.sim_envs`.
pub fn tree_options(
    config: &Config,
    agent: Option<usize>,
    tools: Vec<Arc<dyn Tool>>,
) -> Result<RuntimeOptions, StartError> {
    let agent = agent.and_then(|i| config.agents.get(i).map(|a| (i, a)));
    // `[[agent]]`: the tree's workflow is the agent's loop over `tools`, its data its own;
    // without one, the first simulated environment's.
    let mut opts = match agent {
        Some((i, a)) => RuntimeOptions::new(config.agent_data_dir(i), agent_workflow(a)),
        None => RuntimeOptions::new(&config.data_dir, WorkflowSource::Sim(sim_env(config)?)),
    };
    opts.durability = match config.store.durability {
        DurabilityConfig::Immediate => Durability::Immediate,
        DurabilityConfig::None => Durability::None,
    };
    opts.seed = config.seed;
    opts.compact_every = (config.store.compact_every_minutes > 0).then(|| {
        std::time::Duration::from_secs(config.store.compact_every_minutes.saturating_mul(60))
    });
    apply_learning(config, &mut opts);
    if let Some(client) = model_of(&config.model, "model")? {
        // `[model]`: lessons are synthesised by the model (offline when it fails), and human
        // corrections the evidence supports are judged by it too.
        opts.synthesiser = Some(Arc::new(hindsight::learn::adaptive::ModelSynthesiser::new(
            client.clone(),
        )));
        opts.verifier = Some(Arc::new(hindsight::learn::adaptive::ModelVerifier::new(
            client,
        )));
    }
    opts.tree.guard = config.guard.clone();
    opts.tree.shared_learning = config.api.shared_learning;
    if let Some(path) = &config.triage.policy_file {
        let setup = hindsight::run::TriageSetup::load(path)
            .map_err(|e| config_error("triage.policy_file", e.to_string()))?;
        opts.tree.rules.triage = Arc::new(setup);
    }
    opts.reflect_retry = config.reflect_retry.clone();
    if let Some(path) = &config.chaos.plan {
        let plan = crate::chaos_tools::load(path)
            .map_err(|e| config_error("chaos.plan", e.to_string()))?;
        opts.chaos = Some(crate::chaos::ChaosHandle::new(plan));
    }
    let mut registry = ToolRegistry::new();
    for tool in tools {
        let name = tool.spec().name.clone();
        registry
            .register(tool)
            .map_err(|e| config_error("tools", format!("tool `{name}`: {e}")))?;
    }
    opts.registry = registry;
    if agent.is_some() {
        // The agent's turns are performed by the `[models.NAME]` endpoints (offline without a
        // base_url), at their prices.
        for (name, model) in &config.models {
            let endpoint = model_of(model, &format!("models.{name}"))?.unwrap_or_else(|| {
                Arc::new(hindsight::model::rule::RuleModel::new())
                    as Arc<dyn hindsight::model::LanguageModel>
            });
            opts.models.insert(name.clone(), endpoint);
            opts.models.set_price(name.clone(), model.price());
        }
    }
    Ok(opts)
}

/// The first simulated environment of `tools.sim_envs` (the default one without any); the
/// others are not loaded, with a warning.
fn sim_env(config: &Config) -> Result<hindsight::tools::sim::SimEnv, StartError> {
    let env = match config.tools.sim_envs.first() {
        Some(p) if p != Path::new(crate::app::demo::DEFAULT_ENV) => {
            crate::app::demo::load_env(Some(p.as_path()))
        }
        _ => crate::app::demo::load_env(None),
    }
    .map_err(|e| config_error("tools.sim_envs[0]", e.to_string()))?;
    for (i, extra) in config.tools.sim_envs.iter().enumerate().skip(1) {
        tracing::warn!(
            file = %extra.display(),
            "tools.sim_envs[{i}]: only the first environment is the daemon's workflow; this one is not loaded"
        );
    }
    Ok(env)
}

/// The workflow of a configured agent: one agent stage, named as the agent, whose answer is
/// checked against its `answer_schema` when it has one; the reward is 1 for a pass, less up to
/// 0.1 each for nearing its time budget (`max_wall_ms`, else a minute) and its cost budget
/// (`max_cost`, else 1). A model turn's cost is its tokens at its endpoint's price, so the
/// policy learns which variant is worth its tokens.
pub fn agent_workflow(agent: &hindsight::run::workflow::AgentConfig) -> WorkflowSource {
    WorkflowSource::Custom {
        name: agent.name.clone(),
        stages: vec![hindsight::run::WorkflowStage::agent(
            agent.name.clone(),
            agent.stage.clone(),
        )],
        check: hindsight::run::workflow::answer_check(&agent.stage),
        reward: hindsight::tools::sim::RewardConfig {
            success: 1.0,
            latency: 0.1,
            cost: 0.1,
            max_cost: agent.stage.max_cost.filter(|c| *c > 0.0).unwrap_or(1.0),
            sla_ms: agent
                .stage
                .max_wall_ms
                .filter(|ms| *ms > 0)
                .map_or(60_000.0, |ms| ms as f64),
        },
    }
}

/// The OpenAI-compatible client a `[model]` or `[models.NAME]` block describes (`key` names it
/// in errors); `None` without a `base_url` (the offline model).
fn model_of(
    model: &hindsight::config::ModelConfig,
    key: &str,
) -> Result<Option<Arc<dyn hindsight::model::LanguageModel>>, StartError> {
    let Some(base_url) = &model.base_url else {
        return Ok(None);
    };
    let client =
        hindsight::model::openai::OpenAiClient::new(hindsight::model::openai::OpenAiConfig {
            base_url: base_url.clone(),
            model: model.model.clone(),
            api_key: std::env::var(&model.api_key_env)
                .ok()
                .filter(|k| !k.is_empty()),
            timeout_ms: model.timeout_ms,
            schema_format: model.schema_format,
            ..hindsight::model::openai::OpenAiConfig::default()
        })
        .map_err(|e| config_error(format!("{key}.base_url"), e.to_string()))?;
    Ok(Some(Arc::new(client)))
}
