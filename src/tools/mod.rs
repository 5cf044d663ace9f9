//! Tools: the `Tool` trait and registry, argument validation, the resilient runner, the MCP
//! adapter and the simulated environments.

pub mod sim;
pub mod tool;

pub use tool::{
    CallContext, CostModel, RateLimit, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec,
};
