//! document: the OpenAPI document a daemon serves, [`OPENAPI_JSON`](super::OPENAPI_JSON) made
//! exact for its workflow and guard: the stages, the `(stage, tool, strategy)` arms a plan or a
//! policy update may name, one plan step per stage in order, and the longest goal.

use serde_json::{Value, json};

use super::types::MAX_TEXT_CHARS;

/// One stage of the workflow as the document describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocStage {
    /// The stage's name.
    pub name: String,
    /// Its arms, `(tool, strategy)`.
    pub arms: Vec<(String, String)>,
}

/// Why the document could not be made (a programming error: the shipped document is malformed).
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The shipped document is not JSON.
    #[error("the shipped OpenAPI document is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The shipped document lacks a schema this module fills in.
    #[error("the shipped OpenAPI document has no {0}")]
    Missing(&'static str),
}

fn arm_schema(stage: &str, tool: &str, strategy: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "stage": {"const": stage},
            "tool": {"const": tool},
            "strategy": {"const": strategy}
        },
        "required": ["stage", "tool", "strategy"],
        "additionalProperties": false
    })
}

fn schema_mut<'a>(doc: &'a mut Value, name: &'static str) -> Result<&'a mut Value, DocumentError> {
    doc.pointer_mut(&format!("/components/schemas/{name}"))
        .ok_or(DocumentError::Missing(name))
}

fn property_mut<'a>(
    doc: &'a mut Value,
    schema: &'static str,
    property: &'static str,
) -> Result<&'a mut Value, DocumentError> {
    schema_mut(doc, schema)?
        .pointer_mut(&format!("/properties/{property}"))
        .ok_or(DocumentError::Missing(property))
}

/// `base` (the shipped document) with the workflow's stages and arms and the guard's longest
/// goal (`max_goal_chars`) written in, so that a request the document allows is one the daemon
/// does not refuse for naming an unknown stage or arm, a plan out of order or a long goal.
pub fn for_workflow(
    base: &str,
    stages: &[DocStage],
    max_goal_chars: usize,
) -> Result<String, DocumentError> {
    let mut doc: Value = serde_json::from_str(base)?;
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();

    let goal = property_mut(&mut doc, "TaskRequest", "goal")?;
    goal["maxLength"] = json!(max_goal_chars.min(MAX_TEXT_CHARS));

    // A plan: one step per stage, in order, each an arm of its stage.
    let steps: Vec<Value> = stages
        .iter()
        .map(|s| {
            json!({"anyOf": s.arms.iter().map(|(t, x)| arm_schema(&s.name, t, x)).collect::<Vec<_>>()})
        })
        .collect();
    *property_mut(&mut doc, "ExecuteRequest", "plan")? = json!({
        "type": "array",
        "description": "One step per stage of the workflow, in order; each an arm of its stage.",
        "prefixItems": steps,
        "items": false,
        "minItems": stages.len(),
        "maxItems": stages.len()
    });

    let stage_enum = json!({"type": "string", "enum": names});
    *property_mut(&mut doc, "ValidateRequest", "stage")? = stage_enum.clone();
    *property_mut(&mut doc, "PolicySuggestRequest", "stage")? =
        json!({"anyOf": [stage_enum, {"type": "null"}]});

    // A policy update names one arm of one stage.
    let arms: Vec<Value> = stages
        .iter()
        .flat_map(|s| {
            s.arms.iter().map(|(t, x)| {
                json!({"properties": {
                    "stage": {"const": s.name},
                    "tool": {"const": t},
                    "strategy": {"const": x}
                }})
            })
        })
        .collect();
    let update = schema_mut(&mut doc, "PolicyUpdateRequest")?;
    let passed = update
        .get("anyOf")
        .cloned()
        .ok_or(DocumentError::Missing("PolicyUpdateRequest.anyOf"))?;
    if let Some(obj) = update.as_object_mut() {
        obj.remove("anyOf");
        obj.insert("allOf".into(), json!([{"anyOf": passed}, {"anyOf": arms}]));
    }
    Ok(serde_json::to_string_pretty(&doc)?)
}
