//! The tool registry: tools by name, each with its compiled argument schema, and argument
//! validation before any call (a bad argument is a `SchemaMismatch` naming the field).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::tool::{CallContext, Tool, ToolError, ToolOutput, ToolSpec};
use crate::taxonomy::{ErrorClass, FailureCategory};

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegistryError {
    /// A tool of that name is already registered.
    #[error("tool `{0}` is already registered")]
    Duplicate(String),
    /// The tool's input schema is not a valid JSON Schema.
    #[error("tool `{tool}`: invalid input schema: {reason}")]
    BadSchema {
        /// The tool.
        tool: String,
        /// What the schema compiler said.
        reason: String,
    },
}

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

/// Tools by name, with their compiled argument schemas.
#[derive(Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> ToolRegistry {
        ToolRegistry::default()
    }

    /// Adds a tool, compiling its input schema.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        let validator = jsonschema::validator_for(&tool.spec().input_schema).map_err(|e| {
            RegistryError::BadSchema {
                tool: name.clone(),
                reason: e.to_string(),
            }
        })?;
        self.tools.insert(name, Entry { tool, validator });
        Ok(())
    }

    /// Adds or replaces a tool (an MCP server that restarted may change its tools).
    pub fn replace(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.tools.remove(&tool.spec().name);
        self.register(tool)
    }

    /// Removes a tool; returns it if it was there.
    pub fn remove(&mut self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.remove(name).map(|e| e.tool)
    }

    /// The tool of that name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).map(|e| e.tool.clone())
    }

    /// Whether a tool of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The specs, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|e| e.tool.spec().clone()).collect()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Checks `args` against the tool's schema. An unknown tool is `NotFound`; a bad argument a
    /// `SchemaMismatch` whose message names the field(s) at fault. Both are the caller's choice
    /// (`Strategy`).
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ToolError> {
        let entry = self.tools.get(name).ok_or_else(|| unknown_tool(name))?;
        let problems: Vec<String> = entry
            .validator
            .iter_errors(args)
            .map(|e| describe(&e))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ToolError::new(
                ErrorClass::SchemaMismatch,
                FailureCategory::Strategy,
                format!("invalid arguments for `{name}`: {}", problems.join("; ")),
            ))
        }
    }

    /// Validates the arguments, then calls the tool (no resilience: see `ToolRunner`).
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.validate(name, &args)?;
        let tool = self.get(name).ok_or_else(|| unknown_tool(name))?;
        tool.call(args, ctx).await
    }
}

/// The error of a call to a tool the registry does not have.
pub fn unknown_tool(name: &str) -> ToolError {
    ToolError::new(
        ErrorClass::NotFound,
        FailureCategory::Strategy,
        format!("unknown tool `{name}`"),
    )
}

/// One schema violation, naming the field: `field `/a/b`: <what>`.
fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind as K;
    let path = e.instance_path().as_str();
    let field = match e.kind() {
        K::Required { property } => {
            let p = property
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| property.to_string());
            format!("{path}/{p}")
        }
        K::AdditionalProperties { unexpected } => {
            format!("{path}/{}", unexpected.join(","))
        }
        _ if path.is_empty() => "(arguments)".to_string(),
        _ => path.to_string(),
    };
    format!("field `{field}`: {e}")
}
