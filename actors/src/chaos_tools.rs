//! Fault injection into the tree: a [`ChaosHandle`] decides which actor messages panic (through
//! each actor's [`ChaosHook`](crate::chaos_hook::ChaosHook)) and which tool calls fail or slow down (through [`ChaosTool`], a
//! wrapper around every tool of the registry, so injected faults go through the same resilience
//! and triage as real ones).

use std::path::Path;
use std::sync::Arc;

use hindsight::tools::{CallContext, Tool, ToolError, ToolFuture, ToolRegistry, ToolSpec};
use hindsight::{ErrorClass, FailureCategory};

use crate::chaos::{ActorFault, ChaosHandle, ChaosPlan};
use crate::chaos_hook::{FaultDecider, InjectedFault};
use crate::runtime::RuntimeError;
use hindsight::run::workflow::stable_hash;

/// Loads a fault plan; errors name the file and the key.
pub fn load(path: &Path) -> Result<ChaosPlan, RuntimeError> {
    ChaosPlan::load(path).map_err(|e| RuntimeError::Setup(e.to_string()))
}

/// The actor fault decider of a handle: message `n` of an actor panics when the plan says so.
pub fn decider(handle: &ChaosHandle) -> FaultDecider {
    let handle = handle.clone();
    Arc::new(
        move |actor: &'static str| match handle.next_actor_fault(actor) {
            Some(ActorFault::Panic) => Some(InjectedFault::Panic),
            _ => None,
        },
    )
}

/// The category of an injected error class (FORMAT.md's convention).
fn category(class: ErrorClass) -> FailureCategory {
    match class {
        ErrorClass::TransientNetwork | ErrorClass::RateLimit | ErrorClass::Timeout => {
            FailureCategory::Infrastructure
        }
        _ => FailureCategory::Strategy,
    }
}

/// A tool whose calls the fault plan may fail or slow down.
pub struct ChaosTool {
    inner: Arc<dyn Tool>,
    chaos: ChaosHandle,
}

impl ChaosTool {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Tool>, chaos: ChaosHandle) -> ChaosTool {
        ChaosTool { inner, chaos }
    }
}

impl Tool for ChaosTool {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn call<'a>(&'a self, args: serde_json::Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let name = self.inner.spec().name.clone();
            let key = stable_hash(&format!(
                "{}/{}/{}/{}",
                ctx.run_id, ctx.stage, ctx.attempt, ctx.call
            ));
            if let Some((class, message)) = self.chaos.tool_fault(&name, key) {
                return Err(ToolError::new(class, category(class), message));
            }
            let extra = self.chaos.tool_latency(&name, key).unwrap_or(0) as f64;
            match self.inner.call(args, ctx).await {
                Ok(mut out) => {
                    out.latency_ms += extra;
                    Ok(out)
                }
                Err(mut e) => {
                    e.latency_ms += extra;
                    Err(e)
                }
            }
        })
    }
}

/// Every tool of `registry`, wrapped.
pub fn wrap_registry(registry: ToolRegistry, chaos: &ChaosHandle) -> ToolRegistry {
    let mut out = ToolRegistry::new();
    for name in registry.names() {
        if let Some(tool) = registry.get(&name) {
            let wrapped: Arc<dyn Tool> = Arc::new(ChaosTool::new(tool, chaos.clone()));
            if let Err(e) = out.register(wrapped) {
                tracing::warn!(tool = %name, error = %e, "tool not wrapped for chaos");
            }
        }
    }
    out
}
