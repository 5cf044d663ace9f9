//! Building the registry from a [`ToolsConfig`]: simulated environments loaded, MCP servers
//! started, every tool registered.

use std::sync::Arc;

use super::config::ToolsConfig;
use super::mcp::{McpServer, McpServerError};
use super::registry::{RegistryError, ToolRegistry};
use super::sim::{SimEnv, SimError};

/// Why the tools could not be set up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolboxError {
    /// A simulated environment was rejected.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// An MCP server could not be started.
    #[error(transparent)]
    Mcp(#[from] McpServerError),
    /// A tool could not be registered (duplicate name, bad schema).
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// The registry with what serves it.
#[derive(Debug)]
pub struct Toolbox {
    /// Every tool.
    pub registry: ToolRegistry,
    /// The running MCP servers.
    pub servers: Vec<McpServer>,
    /// The loaded simulated environments.
    pub envs: Vec<SimEnv>,
}

impl Toolbox {
    /// Loads the environments and starts the servers of `config`; registers all their tools.
    pub async fn build(config: &ToolsConfig) -> Result<Toolbox, ToolboxError> {
        let mut registry = ToolRegistry::new();
        let mut envs = Vec::new();
        for path in &config.sim_envs {
            let env = SimEnv::load(path)?.with_seed(config.sim_seed);
            for tool in env.tools() {
                registry.register(tool)?;
            }
            envs.push(env);
        }
        let mut servers = Vec::new();
        for server_config in &config.mcp {
            let server = McpServer::connect(server_config.clone()).await?;
            for tool in server.tools() {
                registry.register(tool)?;
            }
            servers.push(server);
        }
        Ok(Toolbox {
            registry,
            servers,
            envs,
        })
    }

    /// Stops the MCP servers.
    pub async fn shutdown(&self) {
        for s in &self.servers {
            s.shutdown().await;
        }
    }

    /// The registry behind an `Arc`, for a [`crate::tools::ToolRunner`].
    pub fn into_registry(self) -> (Arc<ToolRegistry>, Vec<McpServer>, Vec<SimEnv>) {
        (Arc::new(self.registry), self.servers, self.envs)
    }
}
