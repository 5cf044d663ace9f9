//! One tool of an MCP server, as a registry [`Tool`].

use serde_json::Value;

use super::McpServer;
use crate::tools::tool::{CallContext, CostModel, Tool, ToolFuture, ToolSpec};

/// A tool served by an MCP server.
#[derive(Debug)]
pub struct McpTool {
    server: McpServer,
    remote_name: String,
    spec: ToolSpec,
}

impl McpTool {
    /// The registry tool for `tool` of `server`, named `prefix.name` when a prefix is given.
    pub fn new(server: McpServer, tool: &rmcp::model::Tool, prefix: Option<&str>) -> McpTool {
        let remote_name = tool.name.to_string();
        let name = match prefix {
            Some(p) => format!("{p}.{remote_name}"),
            None => remote_name.clone(),
        };
        let hints = tool.annotations.as_ref();
        let idempotent = hints
            .map(|a| a.idempotent_hint == Some(true) || a.read_only_hint == Some(true))
            .unwrap_or(false);
        let spec = ToolSpec {
            name,
            description: tool
                .description
                .as_deref()
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!("MCP tool `{remote_name}` of server `{}`", server.name())
                }),
            input_schema: Value::Object((*tool.input_schema).clone()),
            idempotent,
            cost: CostModel::default(),
            rate_limit: None,
        };
        McpTool {
            server,
            remote_name,
            spec,
        }
    }

    /// The server serving it.
    pub fn server(&self) -> &McpServer {
        &self.server
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(self.server.call(&self.remote_name, args))
    }
}
