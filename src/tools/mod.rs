//! Tools: the `Tool` trait and registry, argument validation, the resilient runner, the MCP
//! adapter and the simulated environments.

pub mod breaker;
pub mod clock;
pub mod config;
pub mod idempotency;
pub mod mcp;
pub mod policy;
pub mod registry;
pub mod runner;
pub mod sim;
pub mod tool;
pub mod toolbox;

pub use breaker::{BreakerState, CircuitBreaker};
pub use clock::{Clock, TokioClock, VirtualClock};
pub use config::{McpServerConfig, ToolsConfig, ToolsConfigError};
pub use idempotency::{IdempotencyError, IdempotencyStore, MemoryIdempotency, idempotency_key};
pub use policy::{BreakerConfig, ResiliencePolicy, RetryPolicy};
pub use registry::{RegistryError, ToolRegistry};
pub use runner::{AttemptRecord, Budget, CallOptions, CallReport, StopReason, ToolRunner};
pub use tool::{
    CallContext, CostModel, RateLimit, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec,
};
pub use toolbox::{Toolbox, ToolboxError};
