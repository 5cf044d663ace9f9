//! A deterministic, offline, rule-based [`LanguageModel`] for where a model is optional. It
//! answers a lessons-synthesis request in JSON mode from the failures described in the prompt
//! (as embedded JSON objects or as `key=value` lines), and otherwise returns an extractive
//! summary of the last user message. As an agent's model it calls each offered tool once, in
//! order, with the arguments the task's input and features supply by name, and answers with
//! what the tools returned.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{
    ChatRequest, LanguageModel, ModelError, ModelFuture, ModelReply, Role, ToolCall, TurnContext,
};

/// The rule-based model.
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleModel;

impl RuleModel {
    /// The model.
    pub fn new() -> RuleModel {
        RuleModel
    }
}

impl LanguageModel for RuleModel {
    fn name(&self) -> &str {
        "rule-based"
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String> {
        Box::pin(std::future::ready(respond(request)))
    }

    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        Box::pin(std::future::ready(agent_turn(request, ctx)))
    }
}

/// One turn of the rule-based agent: the first offered tool not called yet in this
/// conversation whose required arguments the task supplies, else the answer.
fn agent_turn(request: &ChatRequest, ctx: &TurnContext) -> Result<ModelReply, ModelError> {
    if request.tools.is_empty() {
        return respond(request).map(|content| ModelReply {
            content,
            ..ModelReply::default()
        });
    }
    let called: Vec<&ToolCall> = request
        .messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .collect();
    for (i, tool) in request.tools.iter().enumerate() {
        if called.iter().any(|c| c.name == tool.name) {
            continue;
        }
        if let Some(arguments) = arguments_for(&tool.parameters, ctx) {
            return Ok(ModelReply {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: format!("call_{}_{i}", ctx.turn),
                    name: tool.name.clone(),
                    arguments,
                }],
                usage: None,
            });
        }
    }
    let results: Vec<String> = called
        .iter()
        .filter_map(|c| {
            let result = request
                .messages
                .iter()
                .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(&c.id))?;
            Some(format!("{}: {}", c.name, result.content))
        })
        .collect();
    let content = if results.is_empty() {
        "No tool could be called with what the task gives.".to_string()
    } else {
        results.join("\n")
    };
    Ok(ModelReply {
        content,
        ..ModelReply::default()
    })
}

/// The arguments of a call of a tool with JSON Schema `parameters`: each property the task's
/// input (any JSON value) or features (a string) name; `None` when a required one is missing.
fn arguments_for(parameters: &Value, ctx: &TurnContext) -> Option<Value> {
    let properties = parameters.get("properties").and_then(Value::as_object);
    let mut args = serde_json::Map::new();
    for name in properties.into_iter().flat_map(|p| p.keys()) {
        let value = ctx
            .input
            .as_ref()
            .and_then(|i| i.get(name))
            .cloned()
            .or_else(|| ctx.features.get(name).map(|v| Value::from(v.clone())));
        if let Some(value) = value {
            args.insert(name.clone(), value);
        }
    }
    let required = parameters.get("required").and_then(Value::as_array);
    let complete = required
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .all(|r| args.contains_key(r));
    complete.then_some(Value::Object(args))
}

/// One failure found in a prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FailureNote {
    /// The tool that failed.
    pub tool: String,
    /// Its strategy, if named.
    pub strategy: Option<String>,
    /// The error class or failure type, if named.
    pub error: Option<String>,
    /// The stage, if named.
    pub stage: Option<String>,
    /// Task features.
    pub features: BTreeMap<String, String>,
}

const KNOWN: [&str; 8] = [
    "tool",
    "strategy",
    "error",
    "error_class",
    "failure_type",
    "failure",
    "stage",
    "features",
];

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn note_from_object(m: &serde_json::Map<String, Value>) -> Option<FailureNote> {
    let tool = m
        .get("tool")
        .or_else(|| m.get("tool_called"))
        .and_then(scalar)?;
    let error = ["error_class", "error", "failure_type", "failure"]
        .iter()
        .find_map(|k| m.get(*k).and_then(scalar));
    let mut features = BTreeMap::new();
    if let Some(Value::Object(f)) = m.get("features") {
        for (k, v) in f {
            if let Some(s) = scalar(v) {
                features.insert(k.clone(), s);
            }
        }
    }
    Some(FailureNote {
        tool,
        strategy: m.get("strategy").and_then(scalar),
        error,
        stage: m.get("stage").and_then(scalar),
        features,
    })
}

fn collect_json(v: &Value, out: &mut Vec<FailureNote>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| collect_json(x, out)),
        Value::Object(m) => match note_from_object(m) {
            Some(n) => out.push(n),
            None => m.values().for_each(|x| collect_json(x, out)),
        },
        _ => {}
    }
}

/// The failures described in `text`: JSON objects with a `tool` key (anywhere in embedded JSON),
/// and lines of `key=value` pairs with `tool=` (other keys become features).
pub fn failures_in(text: &str) -> Vec<FailureNote> {
    let mut out = Vec::new();
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'{' || bytes[i] == b'[' {
            let mut it = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
            if let Some(Ok(v)) = it.next() {
                let before = out.len();
                collect_json(&v, &mut out);
                if out.len() > before || v.is_object() {
                    i += it.byte_offset().max(1);
                    continue;
                }
            }
        }
        i += 1;
    }
    if !out.is_empty() {
        return out;
    }
    for line in text.lines() {
        let mut pairs = BTreeMap::new();
        for token in line.split_whitespace() {
            let token = token.trim_matches(|c: char| c == ',' || c == ';' || c == '-' || c == '*');
            if let Some((k, v)) = token.split_once(['=', ':'])
                && !k.is_empty()
                && !v.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                pairs.insert(k.to_ascii_lowercase(), v.trim_matches('"').to_string());
            }
        }
        let Some(tool) = pairs.get("tool").cloned() else {
            continue;
        };
        let error = ["error_class", "error", "failure_type", "failure"]
            .iter()
            .find_map(|k| pairs.get(*k).cloned());
        let features = pairs
            .iter()
            .filter(|(k, _)| !KNOWN.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push(FailureNote {
            tool,
            strategy: pairs.get("strategy").cloned(),
            error,
            stage: pairs.get("stage").cloned(),
            features,
        });
    }
    out
}

/// Lessons from failures: one per (tool, strategy, error), with the features every occurrence
/// shared, most frequent first.
pub fn synthesize_lessons(failures: &[FailureNote]) -> Value {
    type Key = (String, Option<String>, Option<String>);
    let mut groups: BTreeMap<Key, Vec<&FailureNote>> = BTreeMap::new();
    for f in failures {
        groups
            .entry((f.tool.clone(), f.strategy.clone(), f.error.clone()))
            .or_default()
            .push(f);
    }
    let mut lessons: Vec<(usize, Value)> = groups
        .into_iter()
        .map(|((tool, strategy, error), notes)| {
            let mut common = notes[0].features.clone();
            common.retain(|k, v| notes.iter().all(|n| n.features.get(k) == Some(v)));
            let arm = match &strategy {
                Some(s) => format!("{tool}/{s}"),
                None => tool.clone(),
            };
            let when = if common.is_empty() {
                String::new()
            } else {
                format!(
                    " when {}",
                    common
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let err = error.clone().unwrap_or_else(|| "an error".to_string());
            let n = notes.len();
            let stage = notes.iter().find_map(|n| n.stage.clone());
            (
                n,
                json!({
                    "title": format!("Avoid {arm}{when}"),
                    "lesson": format!("Avoid {arm}{when}: it failed {n} time{} with {err}; prefer another strategy.", if n == 1 { "" } else { "s" }),
                    "tool": tool,
                    "strategy": strategy,
                    "stage": stage,
                    "error_class": error,
                    "features": common,
                    "occurrences": n,
                    "confidence": (n as f64 / (n as f64 + 1.0) * 1000.0).round() / 1000.0,
                }),
            )
        })
        .collect();
    lessons.sort_by_key(|l| std::cmp::Reverse(l.0));
    json!({ "lessons": lessons.into_iter().map(|(_, v)| v).collect::<Vec<_>>() })
}

fn sentences(text: &str) -> Vec<&str> {
    text.split_inclusive(['.', '!', '?', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The rule-based answer to a request.
pub fn respond(request: &ChatRequest) -> Result<String, ModelError> {
    let all: String = request
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    if all.trim().is_empty() {
        return Err(ModelError::InvalidInput("no message text to answer".into()));
    }
    let last_user = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .unwrap_or(all.as_str());
    let wants_lessons = all.to_ascii_lowercase().contains("lesson");
    if request.json_mode {
        let v = if wants_lessons {
            synthesize_lessons(&failures_in(last_user))
        } else {
            json!({ "summary": summary(last_user, request.max_tokens) })
        };
        return Ok(v.to_string());
    }
    if wants_lessons {
        let lessons = synthesize_lessons(&failures_in(last_user));
        let lines: Vec<String> = lessons["lessons"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["lesson"].as_str().map(|s| format!("- {s}")))
                    .collect()
            })
            .unwrap_or_default();
        if !lines.is_empty() {
            return Ok(lines.join("\n"));
        }
    }
    Ok(summary(last_user, request.max_tokens))
}

/// The first sentences of `text`, within about `max_tokens` tokens (4 characters each).
fn summary(text: &str, max_tokens: Option<u32>) -> String {
    let budget = max_tokens.map(|t| t as usize * 4).unwrap_or(400).max(16);
    let mut out = String::new();
    for s in sentences(text) {
        if !out.is_empty() && out.len() + s.len() + 1 > budget {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(s);
        if out.len() >= budget {
            break;
        }
    }
    if out.len() > budget {
        let mut cut = budget;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChatMessage;

    fn req(text: &str, json_mode: bool) -> ChatRequest {
        ChatRequest {
            messages: vec![
                ChatMessage::system("Synthesize lessons from these failures as JSON."),
                ChatMessage::user(text),
            ],
            json_mode,
            json_schema: None,
            max_tokens: None,
            temperature: None,
            ..ChatRequest::default()
        }
    }

    #[tokio::test]
    async fn lessons_from_json_failures() {
        let prompt = r#"Failures:
[{"tool": "ocr_v3", "strategy": "whole_file", "error_class": "Timeout", "features": {"size_bucket": "50-100MB", "tenant": "A"}},
 {"tool": "ocr_v3", "strategy": "whole_file", "error_class": "Timeout", "features": {"size_bucket": "50-100MB", "tenant": "B"}},
 {"tool": "tables_v1", "strategy": "strict", "error_class": "SchemaMismatch", "features": {"tenant": "B"}}]"#;
        let out = RuleModel.complete(&req(prompt, true)).await.unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let lessons = v["lessons"].as_array().unwrap();
        assert_eq!(lessons.len(), 2);
        assert_eq!(lessons[0]["tool"], "ocr_v3");
        assert_eq!(lessons[0]["occurrences"], 2);
        assert_eq!(lessons[0]["features"], json!({"size_bucket": "50-100MB"}));
        assert_eq!(
            lessons[0]["title"],
            "Avoid ocr_v3/whole_file when size_bucket=50-100MB"
        );
        assert_eq!(lessons[1]["error_class"], "SchemaMismatch");
        // Deterministic.
        assert_eq!(out, RuleModel.complete(&req(prompt, true)).await.unwrap());
    }

    #[tokio::test]
    async fn lessons_from_key_value_lines_and_summaries() {
        let prompt = "- tool=pdfminer strategy=direct error=ToolNotFit filetype=png\n- tool=pdfminer strategy=direct error=ToolNotFit filetype=png tenant=A\n";
        let out = RuleModel.complete(&req(prompt, true)).await.unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["lessons"][0]["features"], json!({"filetype": "png"}));
        assert_eq!(v["lessons"][0]["occurrences"], 2);
        let text = RuleModel.complete(&req(prompt, false)).await.unwrap();
        assert!(
            text.starts_with("- Avoid pdfminer/direct when filetype=png"),
            "{text}"
        );

        let plain = ChatRequest {
            messages: vec![ChatMessage::user(
                "The run failed twice. Then it passed. Nothing else happened.",
            )],
            max_tokens: Some(10),
            ..ChatRequest::default()
        };
        let s = RuleModel.complete(&plain).await.unwrap();
        assert_eq!(s, "The run failed twice. Then it passed.");
        let empty = ChatRequest::default();
        assert!(matches!(
            RuleModel.complete(&empty).await,
            Err(ModelError::InvalidInput(_))
        ));
        let none = RuleModel
            .complete(&req("no failures here", true))
            .await
            .unwrap();
        assert_eq!(none, r#"{"lessons":[]}"#);
    }

    #[tokio::test]
    async fn as_an_agent_it_calls_each_tool_it_can_fill_then_answers_with_the_results() {
        use crate::model::{ToolDef, TurnContext};
        let tools = vec![
            ToolDef {
                name: "echo".into(),
                description: "echoes".into(),
                parameters: json!({"type": "object", "properties": {"message": {"type": "string"}},
                                   "required": ["message"]}),
            },
            ToolDef {
                name: "needs_path".into(),
                description: "reads a file".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}},
                                   "required": ["path"]}),
            },
        ];
        let ctx = TurnContext {
            input: Some(json!({"message": "hi"})),
            ..TurnContext::default()
        };
        let mut request = ChatRequest {
            messages: vec![ChatMessage::user("Goal: echo")],
            tools,
            ..ChatRequest::default()
        };
        let first = RuleModel.turn(&request, &ctx).await.unwrap();
        assert_eq!(first.tool_calls.len(), 1);
        assert_eq!(first.tool_calls[0].name, "echo");
        assert_eq!(first.tool_calls[0].arguments, json!({"message": "hi"}));
        request
            .messages
            .push(ChatMessage::assistant("", first.tool_calls.clone()));
        request.messages.push(ChatMessage::tool(
            first.tool_calls[0].id.clone(),
            "Echo: hi",
        ));
        // `needs_path` cannot be filled from the task: the model answers.
        let answer = RuleModel.turn(&request, &ctx).await.unwrap();
        assert!(answer.tool_calls.is_empty());
        assert_eq!(answer.content, "echo: Echo: hi");
    }
}
