//! Tools: the `Tool` trait and registry, argument validation, the resilient runner, the MCP
//! adapter and the simulated environments.
//!
//! How the pieces fit:
//!
//! - A [`Tool`] has a [`ToolSpec`] (name, description, JSON Schema of its arguments, idempotent
//!   flag, cost model, rate limit) and an async call returning a [`ToolOutput`] or a classified
//!   [`ToolError`] (class + category; [`ToolError::classified`] asks the triage classifier when
//!   the tool cannot say).
//! - A [`ToolRegistry`] holds tools by name with their compiled schemas; bad arguments are a
//!   `SchemaMismatch` naming the field, and the tool is not called.
//! - A [`ToolRunner`] wraps every call: validation, idempotency record (replay without calling),
//!   the spec's rate limit, circuit breaker, bulkhead, timeout, and retries of infrastructure
//!   failures only, with seeded full-jitter backoff honouring Retry-After, within the caller's
//!   [`Budget`], through a [`Clock`] that is real ([`TokioClock`]) or virtual ([`VirtualClock`]:
//!   waits only added to the reported latency). It returns a [`CallReport`] with every attempt.
//!   Each retry increments `CallContext::call`, so that simulated tools draw afresh.
//! - [`mcp::McpServer`] runs an MCP server (rmcp, stdio) and exposes its tools; [`sim::SimEnv`]
//!   serves a simulated environment (`config/envs/FORMAT.md`); [`Toolbox`] builds the registry
//!   from the `[tools]` table ([`ToolsConfig`]).

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
pub use config::{McpServerConfig, ToolsConfig};
pub use idempotency::{IdempotencyError, IdempotencyStore, MemoryIdempotency, idempotency_key};
pub use policy::{BreakerConfig, ResiliencePolicy, RetryPolicy};
pub use registry::{RegistryError, ToolRegistry};
pub use runner::{AttemptRecord, Budget, CallOptions, CallReport, StopReason, ToolRunner};
pub use tool::{
    CallContext, CostModel, RateLimit, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec,
};
pub use toolbox::{Toolbox, ToolboxError};
