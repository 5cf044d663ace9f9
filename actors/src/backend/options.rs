//! options: the tree a configuration describes: its runtime options (workflow, durability,
//! learning, model, triage, chaos, MCP servers), and why it could not be started.

use std::path::Path;
use std::sync::Arc;

use hindsight::config::{Config, DurabilityConfig};
use hindsight::store::Durability;
use hindsight::tools::ToolRegistry;
use hindsight::tools::mcp::McpServer;

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

/// The adaptive strategies' configuration the `[adaptive]` section describes (the settings it
/// does not name keep their defaults), checked as the reflector will check it.
pub fn adaptive_config(
    section: &hindsight::config::AdaptiveConfig,
) -> Result<hindsight::learn::adaptive::AdaptiveConfig, StartError> {
    use hindsight::learn::adaptive::{AdaptiveConfig, AdaptiveError};
    let adaptive = AdaptiveConfig {
        scope: section.scope,
        synthesis_threshold: section.synthesis_threshold as usize,
        failure_retention: section.failure_retention as usize,
        max_strategies: section.max_strategies as usize,
        strategy_ttl_ms: section.ttl_days.saturating_mul(86_400_000),
        corrections_per_window: section.corrections_per_hour,
        correction_window_ms: 3_600_000,
        ..AdaptiveConfig::default()
    };
    adaptive.validate().map_err(|e| match e {
        AdaptiveError::Config { field, reason } => {
            // Named as the section names it.
            let key = match field {
                "corrections_per_window" => "corrections_per_hour",
                "strategy_ttl_ms" => "ttl_days",
                other => other,
            };
            config_error(format!("adaptive.{key}"), reason)
        }
        other => config_error("adaptive", other.to_string()),
    })?;
    Ok(adaptive)
}

/// Sets what `opts`'s tree learns with from the configuration: `[policy]` (all of it but its
/// seed, which the caller sets), `[adaptive]` and the `[triage]` caps (how many attempts a run
/// may make is how many outcomes it gives the policy). The daemon and `hindsight bench learning
/// --config` both go through here.
pub fn apply_learning(config: &Config, opts: &mut RuntimeOptions) -> Result<(), StartError> {
    let policy = &config.policy;
    opts.policy.discount = policy.discount;
    opts.policy.pool_strength = policy.prior_strength;
    opts.policy.propensity_draws = policy.propensity_samples.max(1) as usize;
    opts.policy.level_penalty_first = policy.level_penalty_first;
    opts.policy.level_penalty_more = policy.level_penalty_more;
    opts.policy.stage_evidence_share = policy.stage_evidence_share;
    opts.policy.stage_evidence_min_arms = policy.stage_evidence_min_arms;
    opts.policy.fallback_local_visits = policy.fallback_local_visits;
    opts.policy.fallback_upper_sd = policy.fallback_upper_sd;
    opts.policy.ids_samples = policy.ids_samples;
    opts.policy.thompson_share = policy.thompson_share;
    opts.policy.change_threshold = policy.change_threshold;
    opts.policy.change_threshold_up = policy.change_threshold_up;
    opts.distill.every = policy.distill_every;
    opts.distill.margin = policy.distill_margin;
    opts.distill.defer_margin = policy.distill_defer_margin;
    opts.adaptive = adaptive_config(&config.adaptive)?;
    opts.tree.max_recovery_attempts = config.triage.max_recovery_attempts;
    opts.tree.max_total_attempts = config.triage.max_total_attempts;
    Ok(())
}

/// The options of the tree a configuration describes, and the MCP servers it started.
pub async fn runtime_options(
    config: &Config,
) -> Result<(RuntimeOptions, Vec<McpServer>), StartError> {
    let env_path = config.tools.envs.first();
    let env = match env_path {
        Some(p) if p != Path::new(crate::demo::DEFAULT_ENV) => {
            crate::demo::load_env(Some(p.as_path()))
        }
        _ => crate::demo::load_env(None),
    }
    .map_err(|e| config_error("tools.envs[0]", e.to_string()))?;
    for (i, extra) in config.tools.envs.iter().enumerate().skip(1) {
        tracing::warn!(
            file = %extra.display(),
            "tools.envs[{i}]: only the first environment is the daemon's workflow; this one is not loaded"
        );
    }
    let mut opts = RuntimeOptions::with_workflow(&config.data_dir, WorkflowSource::Sim(env));
    opts.durability = match config.store.durability {
        DurabilityConfig::Immediate => Durability::Immediate,
        DurabilityConfig::None => Durability::None,
    };
    opts.seed = config.policy.seed;
    opts.compact_every = (config.store.compact_every_minutes > 0).then(|| {
        std::time::Duration::from_secs(config.store.compact_every_minutes.saturating_mul(60))
    });
    apply_learning(config, &mut opts)?;
    if let Some(base_url) = &config.model.base_url {
        // `[model]`: lessons are synthesised by the model (offline when it fails).
        let client =
            hindsight::model::openai::OpenAiClient::new(hindsight::model::openai::OpenAiConfig {
                base_url: base_url.clone(),
                model: config.model.model.clone(),
                api_key: std::env::var(&config.model.api_key_env)
                    .ok()
                    .filter(|k| !k.is_empty()),
                timeout_ms: config.model.timeout_ms,
                schema_format: config.model.schema_format,
                ..hindsight::model::openai::OpenAiConfig::default()
            })
            .map_err(|e| config_error("model.base_url", e.to_string()))?;
        opts.synthesiser = Some(Arc::new(hindsight::learn::adaptive::ModelSynthesiser::new(
            Arc::new(client),
        )));
    }
    opts.tree.guard = config.guard.clone();
    if let Some(path) = &config.triage.policy_file {
        let setup = crate::recovery::TriageSetup::load(path)
            .map_err(|e| config_error("triage.policy_file", e.to_string()))?;
        opts.tree.triage = Arc::new(setup);
    }
    opts.reflect_retry.max_retries = if config.reflect_retry.enabled {
        config.reflect_retry.max_retries
    } else {
        0
    };
    opts.reflect_retry.template = config.reflect_retry.template.clone();
    if let Some(path) = &config.chaos.plan {
        let plan = crate::chaos_tools::load(path)
            .map_err(|e| config_error("chaos.plan", e.to_string()))?;
        opts.chaos = Some(crate::chaos::ChaosHandle::new(plan));
    }
    let mut registry = ToolRegistry::new();
    let mut servers = Vec::new();
    for (i, server) in config.tools.mcp.iter().enumerate() {
        let mut mcp = hindsight::tools::McpServerConfig::new(
            server.name.clone(),
            server.command.clone(),
            server.args.clone(),
        );
        mcp.env = server.env.clone();
        mcp.tool_prefix = Some(server.name.clone());
        let started = McpServer::connect(mcp)
            .await
            .map_err(|e| config_error(format!("tools.mcp[{i}]"), e.to_string()))?;
        for tool in started.tools() {
            registry
                .register(tool)
                .map_err(|e| config_error(format!("tools.mcp[{i}]"), e.to_string()))?;
        }
        servers.push(started);
    }
    opts.registry = registry;
    Ok((opts, servers))
}
