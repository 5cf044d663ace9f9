//! The `[tools]` table of the configuration (read with the rest of it by
//! [`Config`](crate::config::Config)): MCP servers to start and simulated environments to load.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How to start one MCP server (stdio transport).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// A name for logs and errors.
    pub name: String,
    /// The program to run.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables (the rest of the environment is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Registers the server's tools as `PREFIX.tool` instead of `tool`.
    #[serde(default)]
    pub tool_prefix: Option<String>,
    /// Deadline of one request, in milliseconds (rmcp has none).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Deadline of start-up (spawn, initialize, list tools), in milliseconds.
    #[serde(default = "default_startup_timeout_ms")]
    pub startup_timeout_ms: u64,
    /// First delay before restarting a dead server, in milliseconds (doubles up to
    /// `restart_max_ms`).
    #[serde(default = "default_restart_base_ms")]
    pub restart_base_ms: u64,
    /// Largest delay between restarts, in milliseconds.
    #[serde(default = "default_restart_max_ms")]
    pub restart_max_ms: u64,
}

fn default_request_timeout_ms() -> u64 {
    30_000
}
fn default_startup_timeout_ms() -> u64 {
    20_000
}
fn default_restart_base_ms() -> u64 {
    250
}
fn default_restart_max_ms() -> u64 {
    10_000
}

impl McpServerConfig {
    /// A server run as `command args...` with the default timeouts.
    pub fn new(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        McpServerConfig {
            name: name.into(),
            command: command.into(),
            args,
            env: BTreeMap::new(),
            tool_prefix: None,
            request_timeout_ms: default_request_timeout_ms(),
            startup_timeout_ms: default_startup_timeout_ms(),
            restart_base_ms: default_restart_base_ms(),
            restart_max_ms: default_restart_max_ms(),
        }
    }
}

/// The `[tools]` table.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// MCP servers (`[[tools.mcp]]`).
    pub mcp: Vec<McpServerConfig>,
    /// Simulated environment files (relative paths from the working directory).
    pub sim_envs: Vec<PathBuf>,
    /// The seed of the simulated tools a [`Toolbox`](crate::tools::Toolbox) loads (a tree
    /// seeds its workflow's tools with its own seed).
    pub sim_seed: u64,
}
