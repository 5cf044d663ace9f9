//! Typed configuration of hindsight: the [`Config`] tree, loaded from a TOML file with
//! `HINDSIGHT_*` environment overrides, validated, with errors that name the file, key and reason.
//!
//! Every field has a default, so an empty file (or no file) is a valid configuration; unknown keys
//! are errors so that typos are reported. `config/hindsight.toml` documents every key.
//!
//! Environment overrides: `HINDSIGHT_STORE__DURABILITY=none` sets `store.durability`; a double
//! underscore separates nesting levels and names are lower-cased. The value is read as a TOML value
//! when it parses as one (`3`, `true`, `["a", "b"]`, `[{ name = "x" }]`) and as a string otherwise.
//! `HINDSIGHT_CONFIG` (the path of the file) and `HINDSIGHT_CALL_JOURNAL` (the call journal of
//! crash tests) are reserved and are not overrides.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Prefix of the environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "HINDSIGHT_";

/// Environment variable naming the configuration file (not an override).
pub const ENV_CONFIG_FILE: &str = "HINDSIGHT_CONFIG";

/// Environment variable naming the call journal a daemon keeps for crash tests (not an
/// override).
pub const ENV_CALL_JOURNAL: &str = "HINDSIGHT_CALL_JOURNAL";

/// The configuration file used when none is named and it exists.
pub const DEFAULT_FILE: &str = "config/hindsight.toml";

/// The default ReflectRetry template (issue 5's seed semantics).
pub const DEFAULT_REFLECT_TEMPLATE: &str = "[Reflect & Retry - Attempt {attempt}/{max}] {reason}\n\nPlease try again, adjusting your approach.";

/// A configuration that could not be loaded: names where (file or environment variable), the key
/// and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}: invalid TOML: {message}")]
    Syntax {
        /// The file (or environment variable) at fault.
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key has a bad value, is unknown, or conflicts with another.
    #[error("{origin}: key `{key}`: {reason}")]
    Invalid {
        /// The file or environment variable the value came from.
        origin: String,
        /// The dotted key (`store.durability`, `api.tenants[0].key_sha256`).
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// The whole configuration. Each section deserializes straight into the type of the module that
/// owns it; unknown keys anywhere are errors naming their path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory of the database and reports.
    pub data_dir: PathBuf,
    /// Seed of every random choice the tree makes (the policy's among them): the same seed and
    /// the same tasks in the same order make the same choices.
    pub seed: u64,
    /// Durable storage.
    pub store: StoreConfig,
    /// The contextual bandit.
    pub policy: crate::learn::bandit::PolicyConfig,
    /// Distillation of a ranker from the experience log.
    pub distill: crate::learn::distill::DistillConfig,
    /// Failure triage and recovery caps.
    pub triage: TriageConfig,
    /// The ReflectRetry plugin.
    pub reflect_retry: ReflectRetryConfig,
    /// Adaptive strategies (lessons from failures, human corrections).
    pub adaptive: crate::learn::adaptive::AdaptiveConfig,
    /// Where tools come from.
    pub tools: crate::tools::ToolsConfig,
    /// The HTTP API.
    pub api: ApiConfig,
    /// Fault injection.
    pub chaos: ChaosConfig,
    /// The language model.
    pub model: ModelConfig,
    /// `[models.NAME]`: the model endpoints agents name (no `base_url`: the offline rule-based
    /// model).
    pub models: std::collections::BTreeMap<String, ModelConfig>,
    /// `[[agent]]`: the agent the daemon hosts (its workflow instead of a simulated one).
    #[serde(rename = "agent")]
    pub agents: Vec<crate::run::workflow::AgentConfig>,
    /// Logging.
    pub log: LogConfig,
    /// Task ingress: budget ceilings, tool scopes, goal limits, injection rejection.
    pub guard: crate::guard::GuardConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./hindsight-data"),
            seed: 42,
            store: StoreConfig::default(),
            policy: crate::learn::bandit::PolicyConfig::default(),
            distill: crate::learn::distill::DistillConfig::default(),
            triage: TriageConfig::default(),
            reflect_retry: ReflectRetryConfig::default(),
            adaptive: crate::learn::adaptive::AdaptiveConfig::default(),
            tools: crate::tools::ToolsConfig {
                sim_envs: vec![PathBuf::from("config/envs/bank_statements.toml")],
                ..crate::tools::ToolsConfig::default()
            },
            api: ApiConfig::default(),
            chaos: ChaosConfig::default(),
            model: ModelConfig::default(),
            models: Default::default(),
            agents: Vec::new(),
            log: LogConfig::default(),
            guard: crate::guard::GuardConfig::default(),
        }
    }
}

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityConfig {
    /// After the transaction is fsynced (the default).
    #[default]
    Immediate,
    /// After the transaction is committed in memory (fast, lost on a machine crash).
    None,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `immediate` or `none`.
    pub durability: DurabilityConfig,
    /// Checkpoints kept per unfinished run.
    pub checkpoints_per_run: usize,
    /// Days a diary entry is kept; 0 keeps it forever.
    pub diary_ttl_days: u64,
    /// Days an experience tuple is kept; 0 keeps it forever.
    pub experience_ttl_days: u64,
    /// Days a finished run is kept after its end (with its checkpoint, task and outcome
    /// records); 0 keeps it forever. A task submitted again after its run was removed runs
    /// again.
    pub run_ttl_days: u64,
    /// Minutes between the runtime's compactions when a TTL is set (it compacts once at start,
    /// then at this interval); 0 compacts at start only.
    pub compact_every_minutes: u64,
    /// MiB of the database's page cache (0 = none).
    pub cache_mb: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            durability: DurabilityConfig::Immediate,
            checkpoints_per_run: 3,
            diary_ttl_days: 0,
            experience_ttl_days: 0,
            run_ttl_days: 0,
            compact_every_minutes: 60,
            cache_mb: (crate::store::DEFAULT_CACHE_BYTES >> 20) as u64,
        }
    }
}

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

impl StoreConfig {
    /// The diary TTL in milliseconds, `None` for forever.
    pub fn diary_ttl_ms(&self) -> Option<u64> {
        (self.diary_ttl_days > 0).then(|| self.diary_ttl_days.saturating_mul(DAY_MS))
    }

    /// The page cache in bytes.
    pub fn cache_bytes(&self) -> usize {
        usize::try_from(self.cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// The finished-run TTL in milliseconds, `None` for forever.
    pub fn run_ttl_ms(&self) -> Option<u64> {
        (self.run_ttl_days > 0).then(|| self.run_ttl_days.saturating_mul(DAY_MS))
    }

    /// The experience TTL in milliseconds, `None` for forever.
    pub fn experience_ttl_ms(&self) -> Option<u64> {
        (self.experience_ttl_days > 0).then(|| self.experience_ttl_days.saturating_mul(DAY_MS))
    }
}

/// `[triage]`: recovery caps and the failure policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TriageConfig {
    /// Recoveries per ReflectRetry round before the run is escalated.
    pub max_recovery_attempts: u32,
    /// Attempts per run, all causes together (the first, each recovery, each round sent back
    /// by ReflectRetry or a plugin).
    pub max_total_attempts: u32,
    /// A failure-policy file; absent = the built-in policy.
    pub policy_file: Option<PathBuf>,
}

impl Default for TriageConfig {
    fn default() -> Self {
        TriageConfig {
            max_recovery_attempts: 3,
            max_total_attempts: 12,
            policy_file: None,
        }
    }
}

/// `[reflect_retry]`: the ReflectRetry plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReflectRetryConfig {
    /// Reflections per run before the last attempt's result stands (0 = the plugin never
    /// sends a run back).
    pub max_retries: u32,
    /// The reflection message; `{attempt}`, `{max}` and `{reason}` are substituted.
    pub template: String,
}

impl Default for ReflectRetryConfig {
    fn default() -> Self {
        ReflectRetryConfig {
            max_retries: 2,
            template: DEFAULT_REFLECT_TEMPLATE.to_string(),
        }
    }
}

/// `[api]`: the HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Socket address to listen on.
    pub listen: String,
    /// Largest accepted request body in bytes (413 above).
    pub body_limit_bytes: usize,
    /// Seconds in-flight requests get to finish on shutdown.
    pub shutdown_grace_secs: u64,
    /// Seconds a request may take before it is answered 504 (0 = no limit).
    pub request_timeout_secs: u64,
    /// Tenants and their API keys.
    pub tenants: Vec<TenantConfig>,
    /// Whether the tenants share learning: the policy is one, learned from every tenant's runs,
    /// and with this set every tenant sees its statistics (`/policy/suggest`, the `strategy` and
    /// `failure_mode` items of `/memory/retrieve`). Off by default: then only keys with
    /// `policy_update` see them.
    pub shared_learning: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:8080".to_string(),
            body_limit_bytes: 1024 * 1024,
            shutdown_grace_secs: 30,
            request_timeout_secs: 300,
            tenants: Vec::new(),
            shared_learning: false,
        }
    }
}

impl ApiConfig {
    /// The listen address, parsed (validated at load).
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|e| ConfigError::Invalid {
            origin: "configuration".into(),
            key: "api.listen".into(),
            reason: format!("not a socket address ({e}): `{}`", self.listen),
        })
    }
}

/// `[[api.tenants]]`: one tenant's API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name (the isolation boundary).
    pub name: String,
    /// Lower-case hex SHA-256 of the bearer token (see [`hash_key`]); never the token itself.
    pub key_sha256: String,
    /// Whether this key may report outcomes to the policy (`/policy/update`) and read its
    /// statistics: the policy is shared by every tenant, so such a key steers all of them (an
    /// operator's key). Off by default.
    #[serde(default)]
    pub policy_update: bool,
}

/// Why `name` cannot be a tenant's name, if it cannot: tenant names prefix stored ids
/// (`{tenant}/{task}`, `api:{tenant}:{key}`), so they must be non-empty and hold no `/`, `:` or
/// control character. `hindsight config check` and `hindsight serve` both apply it.
pub fn tenant_name_problem(name: &str) -> Option<&'static str> {
    if name.trim().is_empty() {
        Some("must not be empty")
    } else if name.contains(['/', ':']) {
        Some("must not contain `/` or `:`")
    } else if name.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else {
        None
    }
}

/// `[chaos]`: fault injection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChaosConfig {
    /// A fault-plan file; absent = no faults.
    pub plan: Option<PathBuf>,
}

/// `[model]`: the language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Base URL of an OpenAI-compatible API; absent = the offline deterministic model.
    pub base_url: Option<String>,
    /// Model name sent to the API.
    pub model: String,
    /// Environment variable holding the API key.
    pub api_key_env: String,
    /// Request timeout in milliseconds.
    pub timeout_ms: u64,
    /// How the schema of a structured answer is sent (`json_schema`, OpenAI's; `json_object`,
    /// llama-cpp-python's; `off`).
    pub schema_format: crate::model::openai::SchemaFormat,
    /// What the endpoint charges per thousand prompt tokens (0: free). An agent turn's cost is
    /// its tokens priced so: it counts against the agent's `max_cost` and the task's cost
    /// ceiling, and lowers the run's reward, so the policy learns which variant is worth it.
    pub price_per_1k_prompt_tokens: f64,
    /// What the endpoint charges per thousand generated tokens (0: free).
    pub price_per_1k_completion_tokens: f64,
}

impl ModelConfig {
    /// The endpoint's price.
    pub fn price(&self) -> crate::model::Price {
        crate::model::Price {
            prompt_per_1k: self.price_per_1k_prompt_tokens,
            completion_per_1k: self.price_per_1k_completion_tokens,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            base_url: None,
            model: "gpt-4o-mini".to_string(),
            api_key_env: "OPENAI_API_KEY".to_string(),
            timeout_ms: 30_000,
            schema_format: crate::model::openai::SchemaFormat::default(),
            price_per_1k_prompt_tokens: 0.0,
            price_per_1k_completion_tokens: 0.0,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `hindsight=debug,warn`); `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// The lower-case hex SHA-256 of an API token, as `api.tenants[].key_sha256` wants it.
pub fn hash_key(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest.iter() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The token to hash for `hindsight config hash-key ARG`: `ARG` itself, or when it is `-` the
/// first line of `input` (so the token stays out of the shell history), without its line end.
pub fn key_from_arg(arg: &str, input: &mut impl std::io::BufRead) -> std::io::Result<String> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut line = String::new();
    input.read_line(&mut line)?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

impl Config {
    /// The configuration as TOML (`hindsight config show`): every key with its effective value;
    /// absent optional keys are left out.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Invalid {
            origin: "configuration".into(),
            key: String::new(),
            reason: format!("cannot be written as TOML: {e}"),
        })
    }

    /// Parses `text` (named `origin` in errors) without environment overrides.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, origin, std::iter::empty())
    }

    /// Parses `text` (named `origin` in errors) and applies the `HINDSIGHT_*` overrides in `env`.
    pub fn parse_with_env<I>(text: &str, origin: &str, env: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let overrides = apply_env(&mut table, env)?;
        let config: Config = from_toml(table).map_err(|(key, reason)| {
            let origin = overrides
                .iter()
                .find(|(k, _)| key == *k || key.starts_with(&format!("{k}.")))
                .or_else(|| {
                    overrides
                        .iter()
                        .find(|(k, _)| key.starts_with(&format!("{k}[")))
                })
                .map(|(_, var)| format!("environment {var}"))
                .unwrap_or_else(|| origin.to_string());
            ConfigError::Invalid {
                origin,
                key,
                reason,
            }
        })?;
        config.validate().map_err(|(key, reason)| {
            let origin = overrides
                .iter()
                .find(|(k, _)| key == *k || key.starts_with(&format!("{k}.")))
                .map(|(_, var)| format!("environment {var}"))
                .unwrap_or_else(|| origin.to_string());
            ConfigError::Invalid {
                origin,
                key,
                reason,
            }
        })?;
        Ok(config)
    }

    /// The file to load: `cli` (`--config FILE`) if given, else `$HINDSIGHT_CONFIG` if set, else
    /// `config/hindsight.toml` if it exists in the working directory, else none (defaults).
    pub fn locate(cli: Option<&Path>) -> Option<PathBuf> {
        Config::locate_with(
            cli,
            std::env::var_os(ENV_CONFIG_FILE).map(PathBuf::from),
            Path::new(DEFAULT_FILE).is_file(),
        )
    }

    /// [`Config::locate`] with its inputs given.
    pub fn locate_with(
        cli: Option<&Path>,
        env: Option<PathBuf>,
        default_exists: bool,
    ) -> Option<PathBuf> {
        cli.map(Path::to_path_buf)
            .or(env.filter(|p| !p.as_os_str().is_empty()))
            .or_else(|| default_exists.then(|| PathBuf::from(DEFAULT_FILE)))
    }

    /// Loads `path` (or only the defaults when `None`) and applies the process's `HINDSIGHT_*`
    /// environment overrides.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_with_env(path, std::env::vars())
    }

    /// Loads `path` (or only the defaults when `None`) and applies the overrides in `env`.
    pub fn load_with_env<I>(path: Option<&Path>, env: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                Config::parse_with_env(&text, &p.display().to_string(), env)
            }
            None => Config::parse_with_env("", "defaults", env),
        }
    }

    /// The data directory of agent `i` of `[[agent]]`: the first agent's is `data_dir` (it is the
    /// daemon's default agent, which the routes that name no agent serve); each other agent's is
    /// `data_dir/agents/NAME`, so that its runs, lessons, SOPs and policy are its own.
    pub fn agent_data_dir(&self, i: usize) -> PathBuf {
        match self.agents.get(i) {
            Some(agent) if i > 0 => self.data_dir.join("agents").join(&agent.name),
            _ => self.data_dir.clone(),
        }
    }

    /// For each agent of `[[agent]]`, the indices of the configured agents it calls as a tool
    /// (`agent:NAME` in its variants' tools), each once.
    pub fn agent_calls(&self) -> Vec<Vec<usize>> {
        self.agents
            .iter()
            .map(|a| {
                a.callees()
                    .into_iter()
                    .filter_map(|c| self.agents.iter().position(|b| b.name == c))
                    .collect()
            })
            .collect()
    }

    /// The agents each agent calls as a tool (`agent:NAME` in its variants' tools): each must be
    /// another configured agent, named exactly, and no agent may reach itself through them.
    fn check_agent_calls(&self) -> Result<(), (String, String)> {
        for (i, agent) in self.agents.iter().enumerate() {
            for (j, v) in agent.stage.variants.iter().enumerate() {
                for pattern in &v.tools {
                    let Some(callee) =
                        pattern.strip_prefix(crate::run::workflow::AGENT_TOOL_PREFIX)
                    else {
                        continue;
                    };
                    let key = format!("agent[{i}].variants[{j}].tools");
                    if callee == agent.name {
                        return Err((key, format!("`{pattern}`: an agent cannot call itself")));
                    }
                    if !self.agents.iter().any(|a| a.name == callee) {
                        return Err((
                            key,
                            format!(
                                "`{pattern}` names no configured agent (an agent is called by its exact name)"
                            ),
                        ));
                    }
                }
            }
        }
        let calls = self.agent_calls();
        if let Err(cycle) = crate::run::workflow::callees_first(&calls) {
            let names: Vec<&str> = cycle
                .iter()
                .map(|&k| self.agents[k].name.as_str())
                .collect();
            return Err((
                format!("agent[{}].variants", cycle[0]),
                format!(
                    "the agents call each other in a cycle ({}): a run could never end",
                    names.join(" -> ")
                ),
            ));
        }
        Ok(())
    }

    /// Checks what types alone cannot: ranges, formats, uniqueness. Returns the key and reason.
    fn validate(&self) -> Result<(), (String, String)> {
        fn bad(key: impl Into<String>, reason: impl Into<String>) -> Result<(), (String, String)> {
            Err((key.into(), reason.into()))
        }
        if self.data_dir.as_os_str().is_empty() {
            return bad("data_dir", "must not be empty");
        }
        if self.store.checkpoints_per_run == 0 {
            return bad("store.checkpoints_per_run", "must be at least 1");
        }
        if let Err(e) = self.policy.validate() {
            return match e {
                crate::learn::bandit::PolicyError::BadConfig { field, reason } => {
                    bad(format!("policy.{field}"), reason)
                }
                other => bad("policy", other.to_string()),
            };
        }
        if let Err(e) = self.distill.validate() {
            return bad(format!("distill.{}", e.field), e.reason);
        }
        if self.triage.max_total_attempts == 0 {
            return bad("triage.max_total_attempts", "must be at least 1");
        }
        if let Err(e) = self.adaptive.validate() {
            return match e {
                crate::learn::adaptive::AdaptiveError::Config { field, reason } => {
                    bad(format!("adaptive.{field}"), reason)
                }
                other => bad("adaptive", other.to_string()),
            };
        }
        let mut names = BTreeSet::new();
        for (i, server) in self.tools.mcp.iter().enumerate() {
            if server.name.trim().is_empty() {
                return bad(format!("tools.mcp[{i}].name"), "must not be empty");
            }
            if server.command.trim().is_empty() {
                return bad(format!("tools.mcp[{i}].command"), "must not be empty");
            }
            if !names.insert(server.name.as_str()) {
                return bad(
                    format!("tools.mcp[{i}].name"),
                    format!("duplicate server name `{}`", server.name),
                );
            }
        }
        let mut agent_names = BTreeSet::new();
        for (i, agent) in self.agents.iter().enumerate() {
            if agent.name.trim().is_empty() || !agent_names.insert(agent.name.as_str()) {
                return bad(
                    format!("agent[{i}].name"),
                    format!("must be a name no other agent has: `{}`", agent.name),
                );
            }
            // The name is a directory under `data_dir/agents/` and part of a tool's name.
            if !agent
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return bad(
                    format!("agent[{i}].name"),
                    format!(
                        "`{}`: only letters, digits, `_` and `-` may make an agent's name",
                        agent.name
                    ),
                );
            }
            if agent.stage.variants.is_empty() {
                return bad(format!("agent[{i}].variants"), "an agent needs a variant");
            }
            if let Some(schema) = &agent.stage.answer_schema
                && let Err(e) = jsonschema::validator_for(schema)
            {
                return bad(
                    format!("agent[{i}].answer_schema"),
                    format!("not a JSON Schema: {e}"),
                );
            }
            if agent.stage.max_turns == 0 {
                return bad(format!("agent[{i}].max_turns"), "must be at least 1");
            }
            if agent.stage.max_tokens == Some(0) {
                return bad(format!("agent[{i}].max_tokens"), "must be at least 1");
            }
            if agent.stage.max_wall_ms == Some(0) {
                return bad(format!("agent[{i}].max_wall_ms"), "must be at least 1");
            }
            if let Some(c) = agent.stage.max_cost
                && !(c.is_finite() && c > 0.0)
            {
                return bad(
                    format!("agent[{i}].max_cost"),
                    format!("must be a positive number, not {c}"),
                );
            }
            let mut variant_names = BTreeSet::new();
            for (j, v) in agent.stage.variants.iter().enumerate() {
                if !variant_names.insert(v.name.as_str()) {
                    return bad(
                        format!("agent[{i}].variants[{j}].name"),
                        format!("duplicate variant `{}`", v.name),
                    );
                }
                if !self.models.contains_key(&v.model) {
                    return bad(
                        format!("agent[{i}].variants[{j}].model"),
                        format!("no [models.{}] endpoint is configured", v.model),
                    );
                }
            }
        }
        self.check_agent_calls()?;
        for (key, m) in std::iter::once(("model".to_string(), &self.model)).chain(
            self.models
                .iter()
                .map(|(name, m)| (format!("models.{name}"), m)),
        ) {
            for (field, price) in [
                ("price_per_1k_prompt_tokens", m.price_per_1k_prompt_tokens),
                (
                    "price_per_1k_completion_tokens",
                    m.price_per_1k_completion_tokens,
                ),
            ] {
                if !(price.is_finite() && price >= 0.0) {
                    return bad(
                        format!("{key}.{field}"),
                        format!("must be 0 or more, not {price}"),
                    );
                }
            }
        }
        if let Err(e) = self.api.listen.parse::<SocketAddr>() {
            return bad(
                "api.listen",
                format!("not a socket address ({e}): `{}`", self.api.listen),
            );
        }
        if self.api.body_limit_bytes == 0 {
            return bad("api.body_limit_bytes", "must be at least 1");
        }
        let mut tenants = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for (i, t) in self.api.tenants.iter().enumerate() {
            if let Some(problem) = tenant_name_problem(&t.name) {
                return bad(format!("api.tenants[{i}].name"), problem);
            }
            if !tenants.insert(t.name.as_str()) {
                return bad(
                    format!("api.tenants[{i}].name"),
                    format!("duplicate tenant `{}`", t.name),
                );
            }
            let ok = t.key_sha256.len() == 64
                && t.key_sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !ok {
                return bad(
                    format!("api.tenants[{i}].key_sha256"),
                    "expected 64 lower-case hex digits (the SHA-256 of the token, see `hindsight config hash-key`)",
                );
            }
            if !keys.insert(t.key_sha256.as_str()) {
                return bad(
                    format!("api.tenants[{i}].key_sha256"),
                    "the same key is configured for two tenants",
                );
            }
        }
        if self.log.level.trim().is_empty() {
            return bad("log.level", "must not be empty");
        }
        Ok(())
    }
}

/// Deserializes a TOML table into `T`, refusing unknown keys wherever they are, also in the
/// sections whose types read stored settings leniently (a snapshot written by another build).
/// On error: the dotted key at fault (`api.tenants[0].name`) and the reason in this module's
/// words. The policy and environment files deserialize through it too.
pub(crate) fn from_toml<T: serde::de::DeserializeOwned>(
    table: toml::Table,
) -> Result<T, (String, String)> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
    let ignored = serde_ignored::Deserializer::new(toml::Value::Table(table), &mut note);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(ignored);
    match (parsed, unknown.first()) {
        (Ok(_), Some(key)) => Err((key.clone(), "unknown key".to_string())),
        (Ok(c), None) => Ok(c),
        (Err(e), _) => Err(describe(
            e.path().to_string(),
            e.inner().message().to_string(),
        )),
    }
}

/// A TOML table read as `T`: serde's derived structs also take an array of their fields in
/// order, which a file read through [`from_toml`] must not pass for a table.
#[derive(Debug, Default)]
pub(crate) struct Table<T>(T);

impl<T> std::ops::Deref for Table<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Only<T> {
            type Value = Table<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Table<T>, A::Error> {
                // Through `MapAccessDeserializer` the keys stay on the error's path.
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Table)
            }
        }
        d.deserialize_map(Only(std::marker::PhantomData))
    }
}

/// Turns serde's message into the key at fault and a reason in this module's words.
fn describe(path: String, message: String) -> (String, String) {
    let key = if path == "." { String::new() } else { path };
    let join = |name: &str| {
        if key == name || key.ends_with(&format!(".{name}")) {
            key.clone()
        } else if key.is_empty() {
            name.to_string()
        } else {
            format!("{key}.{name}")
        }
    };
    let quoted = |rest: &str| rest.split('`').next().unwrap_or("").to_string();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let name = quoted(rest);
        let expected = rest
            .split_once(", expected ")
            .map(|(_, e)| format!(" (expected {e})"))
            .unwrap_or_default();
        return (join(&name), format!("unknown key{expected}"));
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = quoted(rest);
        return (join(&name), "missing (required)".to_string());
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let found = quoted(rest);
        let expected = rest
            .split_once(", expected ")
            .map(|(_, e)| e.replace("one of ", "one of: "))
            .unwrap_or_else(|| "a known value".to_string());
        return (key, format!("expected {expected}, found `{found}`"));
    }
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        return (key, format!("expected {expected}, found {found}"));
    }
    (key, message)
}

/// Applies `HINDSIGHT_*` overrides to `table`; returns the overridden keys with their variables.
fn apply_env<I>(table: &mut toml::Table, env: I) -> Result<Vec<(String, String)>, ConfigError>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k != ENV_CONFIG_FILE && k != ENV_CALL_JOURNAL)
        .collect();
    vars.sort();
    let mut applied = Vec::new();
    for (var, raw) in vars {
        let origin = format!("environment {var}");
        let rest = &var[ENV_PREFIX.len()..];
        let segments: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(ConfigError::Invalid {
                origin,
                key: segments.join("."),
                reason: "empty key segment (use a double underscore between levels only)".into(),
            });
        }
        let key = segments.join(".");
        let value = parse_env_value(&raw);
        let mut node = &mut *table;
        let (last, parents) = match segments.split_last() {
            Some(split) => split,
            None => continue,
        };
        for (depth, seg) in parents.iter().enumerate() {
            let entry = node
                .entry(seg.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Invalid {
                        origin,
                        key: segments[..=depth].join("."),
                        reason: "is not a table, so it cannot have sub-keys".into(),
                    });
                }
            };
        }
        node.insert(last.clone(), value);
        applied.push((key, var));
    }
    Ok(applied)
}

/// Reads an environment value as a TOML value when it is one, else as a string.
fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) if t.len() == 1 => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        _ => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_is_defaults() {
        assert_eq!(Config::parse("", "x").unwrap(), Config::default());
    }

    #[test]
    fn shipped_file_documents_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/hindsight.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = Config::parse(&text, "config/hindsight.toml").unwrap();
        assert_eq!(parsed, Config::default());
        // Every key, uncommented, must parse and equal the default: the comments document them.
        let uncommented: String = text
            .lines()
            .map(|l| {
                let t = l.trim_start();
                match t.strip_prefix("# ") {
                    Some(rest) if rest.contains(" = ") || rest.starts_with('[') => rest,
                    _ => l,
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let doc: toml::Table = toml::from_str(&uncommented).unwrap();
        // Every field of the serialized defaults appears in the documented file.
        let defaults = toml::Table::try_from(Config::default()).unwrap();
        fn keys(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
            for (k, v) in t {
                let full = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if let toml::Value::Table(inner) = v {
                    keys(inner, &full, out);
                } else {
                    out.push(full);
                }
            }
        }
        let (mut want, mut have) = (Vec::new(), Vec::new());
        keys(&defaults, "", &mut want);
        keys(&doc, "", &mut have);
        for k in &want {
            assert!(
                have.contains(k),
                "config/hindsight.toml does not document `{k}`"
            );
        }
        for k in [
            "triage.policy_file",
            "chaos.plan",
            "model.base_url",
            "api.tenants",
            "tools.mcp",
        ] {
            assert!(have.contains(&k.to_string()), "undocumented `{k}`");
        }
    }

    #[test]
    fn env_overrides_nest_and_parse() {
        let c = Config::parse_with_env(
            "[store]\ncheckpoints_per_run = 5\n",
            "f.toml",
            env(&[
                ("HINDSIGHT_STORE__DURABILITY", "none"),
                ("HINDSIGHT_API__BODY_LIMIT_BYTES", "2048"),
                ("HINDSIGHT_CONFIG", "ignored.toml"),
                ("OTHER", "x"),
                ("HINDSIGHT_TOOLS__SIM_ENVS", "[\"a.toml\", \"b.toml\"]"),
            ]),
        )
        .unwrap();
        assert_eq!(c.store.durability, DurabilityConfig::None);
        assert_eq!(c.store.checkpoints_per_run, 5);
        assert_eq!(c.api.body_limit_bytes, 2048);
        assert_eq!(
            c.tools.sim_envs,
            vec![PathBuf::from("a.toml"), PathBuf::from("b.toml")]
        );
    }

    #[test]
    fn bad_variant_names_file_key_and_reason() {
        let e = Config::parse("[store]\ndurability = \"fast\"\n", "config/hindsight.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config/hindsight.toml: key `store.durability`: expected `immediate` or `none`, found `fast`"
        );
    }

    /// The error of a `[policy]` section holding `line`.
    fn policy_error(line: &str) -> String {
        Config::parse(&format!("[policy]\n{line}\n"), "h.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_change_threshold_must_be_above_zero() {
        let e = policy_error("change_threshold = 0.0");
        assert!(e.contains("policy.change_threshold"), "{e}");
        assert!(e.contains("must be a finite number > 0"), "{e}");
        let e = policy_error("change_threshold_up = -3.0");
        assert!(e.contains("policy.change_threshold_up"), "{e}");
        let c = Config::parse("[policy]\nchange_threshold = 7.5\n", "h.toml").unwrap();
        assert_eq!(c.policy.change_threshold, 7.5);
        let defaults = crate::learn::bandit::PolicyConfig::default();
        assert_eq!(c.policy.change_threshold_up, defaults.change_threshold_up);
    }

    #[test]
    fn policy_keys_are_checked_and_named() {
        let e = policy_error("structure_prior = -1.0");
        assert!(e.contains("policy.structure_prior"), "{e}");
        assert!(e.contains("must be a finite number >= 0"), "{e}");
        let e = policy_error("choice = { rule = \"information_directed\", samples = 100000 }");
        assert!(e.contains("policy.choice.samples"), "{e}");
        assert!(e.contains("from 1 to 4096"), "{e}");
        let e = policy_error("choice = { rule = \"information_directed\", thompson_share = 2.0 }");
        assert!(e.contains("policy.choice.thompson_share"), "{e}");
        let e = policy_error("choice = { rule = \"greedy\" }");
        assert!(e.contains("policy.choice"), "{e}");
        assert!(e.contains("`greedy`"), "{e}");
        // A key of the old mirror, removed, is an unknown key, named with its path.
        let e = policy_error("ids_samples = 32");
        assert!(
            e.starts_with("h.toml: key `policy.ids_samples`: unknown key"),
            "{e}"
        );
        let e = policy_error("[policy.reward]\nsla_ms = 3");
        assert!(e.contains("key `policy.reward`: unknown key"), "{e}");
        let c = Config::parse("[policy.choice]\nrule = \"thompson\"\n", "h.toml").unwrap();
        assert_eq!(c.policy.choice, crate::learn::bandit::ChoiceRule::Thompson);
        let e = Config::parse("[distill]\nholdout_share = 2.0\n", "h.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `distill.holdout_share`"), "{e}");
        let e = Config::parse("[adaptive]\ntop_k = 3\nbogus = 1\n", "h.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `adaptive.bogus`: unknown key"), "{e}");
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let e = Config::parse_with_env(
            "",
            "f.toml",
            env(&[("HINDSIGHT_STORE__DURABILITY", "fast")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("environment HINDSIGHT_STORE__DURABILITY: key `store.durability`"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_is_reported() {
        let e = Config::parse("[store]\ndurabilty = \"none\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.toml: key `store.durabilty`: unknown key"),
            "{e}"
        );
        let e = Config::parse("nonsense = 1\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml: key `nonsense`: unknown key"), "{e}");
    }

    #[test]
    fn wrong_type_is_reported() {
        let e = Config::parse("[store]\ncheckpoints_per_run = \"three\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.toml: key `store.checkpoints_per_run`: expected"),
            "{e}"
        );
    }

    #[test]
    fn an_agent_names_configured_models_and_agents_call_each_other_without_cycles() {
        let calling = |name: &str, model: &str, tools: &str| {
            format!(
                "[[agent]]\nname = \"{name}\"\ninstructions = \"i\"\n\
                 [[agent.variants]]\nname = \"v\"\nmodel = \"{model}\"\ntools = [{tools}]\n"
            )
        };
        let agent = |name: &str, model: &str| calling(name, model, "\"fs/*\"");
        let ok = Config::parse(
            &format!("{}[models.local]\n", agent("a", "local")),
            "f.toml",
        )
        .unwrap();
        assert_eq!(ok.agents[0].stage.max_turns, 8);
        assert_eq!(
            ok.agents[0].stage.variants[0].tools,
            vec!["fs/*".to_string()]
        );
        let e = Config::parse(&agent("a", "nowhere"), "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent[0].variants[0].model"), "{e}");
        let two = format!(
            "{}{}[models.local]\n",
            agent("a", "local"),
            agent("b", "local")
        );
        let two = Config::parse(&two, "f.toml").unwrap();
        assert_eq!(two.agent_data_dir(0), two.data_dir);
        assert_eq!(two.agent_data_dir(1), two.data_dir.join("agents").join("b"));
        // One agent calls another; a cycle, itself, an unknown agent or a bad name are refused.
        let chain = format!(
            "{}{}{}[models.local]\n",
            calling("a", "local", "\"agent:b\", \"agent:c\""),
            calling("b", "local", "\"agent:c\""),
            calling("c", "local", "")
        );
        let chain = Config::parse(&chain, "f.toml").unwrap();
        assert_eq!(chain.agents[0].callees(), vec!["b", "c"]);
        for (text, key, words) in [
            (
                format!(
                    "{}{}{}[models.local]\n",
                    calling("a", "local", "\"agent:b\""),
                    calling("b", "local", "\"agent:c\""),
                    calling("c", "local", "\"agent:a\"")
                ),
                "agent[0].variants",
                "a -> b -> c -> a",
            ),
            (
                format!("{}[models.local]\n", calling("a", "local", "\"agent:a\"")),
                "agent[0].variants[0].tools",
                "cannot call itself",
            ),
            (
                format!("{}[models.local]\n", calling("a", "local", "\"agent:z*\"")),
                "agent[0].variants[0].tools",
                "names no configured agent",
            ),
            (
                format!("{}[models.local]\n", calling("a b", "local", "")),
                "agent[0].name",
                "only letters",
            ),
        ] {
            let e = Config::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(words), "{e}");
        }
        // A misspelt key of the block, or of a variant, is refused with its name.
        for (block, in_variant, key) in [
            ("max_turn = 3\n", "", "max_turn"),
            ("", "temprature = 0.2\n", "temprature"),
        ] {
            let text = format!(
                "[[agent]]\nname = \"a\"\ninstructions = \"i\"\n{block}\
                 [[agent.variants]]\nname = \"v\"\nmodel = \"local\"\ntools = []\n{in_variant}\
                 [models.local]\n"
            );
            let e = Config::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(e.contains("agent[0]") && e.contains(key), "{e}");
        }
    }

    #[test]
    fn syntax_error_names_file() {
        let e = Config::parse("[store\n", "f.toml").unwrap_err().to_string();
        assert!(e.starts_with("f.toml: invalid TOML"), "{e}");
    }

    #[test]
    fn validation_names_key() {
        let e = Config::parse(
            "[adaptive]\nsynthesis_threshold = 5\nfailure_retention = 3\n",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("f.toml: key `adaptive.failure_retention`"),
            "{e}"
        );
        let e = Config::parse(
            "[[api.tenants]]\nname = \"a\"\nkey_sha256 = \"secret-token\"\n",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("f.toml: key `api.tenants[0].key_sha256`"),
            "{e}"
        );
        let e = Config::parse("[[api.tenants]]\nname = \"a\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.toml: key `api.tenants[0].key_sha256`: missing"),
            "{e}"
        );
        let e = Config::parse("[api]\nlisten = \"nowhere\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml: key `api.listen`"), "{e}");
    }

    #[test]
    fn env_into_scalar_parent_is_an_error() {
        let e = Config::parse_with_env(
            "",
            "f.toml",
            env(&[("HINDSIGHT_DATA_DIR__X", "1"), ("HINDSIGHT_DATA_DIR", "d")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("key `data_dir`"), "{e}");
    }

    #[test]
    fn to_toml_round_trips() {
        let mut c = Config::default();
        c.triage.policy_file = Some(PathBuf::from("p.toml"));
        c.api.tenants.push(TenantConfig {
            policy_update: false,
            name: "a".into(),
            key_sha256: hash_key("k"),
        });
        let mut server = crate::tools::McpServerConfig::new("fs", "npx", vec!["-y".into()]);
        server.env = BTreeMap::from([("A".to_string(), "b".to_string())]);
        c.tools.mcp.push(server);
        c.policy.choice = crate::learn::bandit::ChoiceRule::Thompson;
        for c in [Config::default(), c] {
            let text = c.to_toml().unwrap();
            assert_eq!(Config::parse(&text, "shown").unwrap(), c, "{text}");
        }
    }

    #[test]
    fn locate_prefers_cli_then_env_then_default() {
        let cli = Path::new("a.toml");
        let env = Some(PathBuf::from("b.toml"));
        assert_eq!(
            Config::locate_with(Some(cli), env.clone(), true),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            Config::locate_with(None, env, true),
            Some(PathBuf::from("b.toml"))
        );
        assert_eq!(
            Config::locate_with(None, None, true),
            Some(PathBuf::from(DEFAULT_FILE))
        );
        assert_eq!(Config::locate_with(None, None, false), None);
    }

    #[test]
    fn key_from_arg_reads_stdin_for_dash() {
        let mut input = std::io::Cursor::new(b"s3cret\r\nignored\n".to_vec());
        assert_eq!(key_from_arg("-", &mut input).unwrap(), "s3cret");
        let mut none = std::io::Cursor::new(Vec::new());
        assert_eq!(key_from_arg("tok", &mut none).unwrap(), "tok");
    }

    #[test]
    fn hash_key_is_sha256_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let c = Config::parse(
            &format!(
                "[[api.tenants]]\nname = \"acme\"\nkey_sha256 = \"{}\"\n",
                hash_key("t0ken")
            ),
            "f.toml",
        )
        .unwrap();
        assert_eq!(c.api.tenants[0].name, "acme");
    }
}
