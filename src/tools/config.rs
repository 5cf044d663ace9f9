//! The `[tools]` table of the configuration: MCP servers to start and simulated environments to
//! load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Simulated environment files (relative paths are taken from the config file's folder).
    pub sim_envs: Vec<PathBuf>,
    /// The seed of the simulated tools.
    pub sim_seed: u64,
}

/// Why the configuration could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolsConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {reason}")]
    Io {
        /// The file.
        file: String,
        /// The OS error.
        reason: String,
    },
    /// The `[tools]` table is not what was expected.
    #[error("{file}: [tools]: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The parser's message (naming the key).
        reason: String,
    },
}

#[derive(Deserialize)]
struct Root {
    #[serde(default)]
    tools: Option<toml::Value>,
}

impl ToolsConfig {
    /// Reads the `[tools]` table of a TOML file (other tables are ignored); relative `sim_envs`
    /// are resolved against the file's folder.
    pub fn load(path: &Path) -> Result<ToolsConfig, ToolsConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ToolsConfigError::Io {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        let mut cfg = ToolsConfig::parse(&text, &file)?;
        if let Some(dir) = path.parent() {
            for p in &mut cfg.sim_envs {
                if p.is_relative() {
                    *p = dir.join(&*p);
                }
            }
        }
        Ok(cfg)
    }

    /// Parses the `[tools]` table of a TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ToolsConfig, ToolsConfigError> {
        let invalid = |reason: String| ToolsConfigError::Invalid {
            file: file.to_string(),
            reason,
        };
        let root: Root = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let Some(tools) = root.tools else {
            return Ok(ToolsConfig::default());
        };
        let cfg: ToolsConfig = tools
            .try_into()
            .map_err(|e: toml::de::Error| invalid(e.to_string()))?;
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in cfg.mcp.iter().enumerate() {
            if !names.insert(s.name.as_str()) {
                return Err(invalid(format!(
                    "mcp[{i}].name: duplicate server name `{}`",
                    s.name
                )));
            }
            if s.command.trim().is_empty() {
                return Err(invalid(format!(
                    "mcp[{i}].command: expected a program to run"
                )));
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_tools_table() {
        let cfg = ToolsConfig::parse(
            r#"
            [store]
            dir = "x"
            [tools]
            sim_envs = ["envs/bank.toml"]
            [[tools.mcp]]
            name = "everything"
            command = "node"
            args = ["index.js", "stdio"]
            env = { A = "1" }
            request_timeout_ms = 500
            "#,
            "h.toml",
        )
        .unwrap();
        assert_eq!(cfg.mcp[0].args, ["index.js", "stdio"]);
        assert_eq!(cfg.mcp[0].request_timeout_ms, 500);
        assert_eq!(cfg.mcp[0].startup_timeout_ms, 20_000);
        assert_eq!(cfg.sim_envs, [PathBuf::from("envs/bank.toml")]);
        assert_eq!(
            ToolsConfig::parse("", "e.toml").unwrap(),
            ToolsConfig::default()
        );
        let e = ToolsConfig::parse(
            "[[tools.mcp]]\nname = \"a\"\ncommand = \"x\"\nbogus = 1\n",
            "b.toml",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("b.toml") && e.to_string().contains("bogus"),
            "{e}"
        );
        let e = ToolsConfig::parse("[[tools.mcp]]\nname = \"a\"\n", "c.toml").unwrap_err();
        assert!(e.to_string().contains("command"), "{e}");
    }
}
