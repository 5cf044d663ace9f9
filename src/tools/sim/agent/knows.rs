//! Reading a request as the simulated model does (AGENT-FORMAT.md): its tokens, the cue rule
//! (one line naming the tool and every cue word, whole words, case-insensitive), and the calls
//! made so far in the conversation with their results.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::template::words;
use crate::model::{ChatRequest, Role};

/// A request's tokens: the whitespace-separated words of every message (its text, and the name
/// and arguments of each tool call it carries) plus the offered tools' names, descriptions and
/// parameter names.
pub fn request_tokens(req: &ChatRequest) -> u64 {
    let count = |s: &str| s.split_whitespace().count() as u64;
    let mut n = 0;
    for m in &req.messages {
        n += count(&m.content);
        for c in &m.tool_calls {
            n += count(&c.name) + count(&c.arguments.to_string());
        }
    }
    for t in &req.tools {
        n += count(&t.name) + count(&t.description);
        if let Some(props) = t.parameters.get("properties").and_then(Value::as_object) {
            n += props.len() as u64;
        }
    }
    n
}

/// The words of each line of the request's messages (any role).
pub fn line_words(req: &ChatRequest) -> Vec<BTreeSet<String>> {
    req.messages
        .iter()
        .flat_map(|m| m.content.lines())
        .map(|l| words(l).collect::<BTreeSet<_>>())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Whether one of `lines` holds `tool` and every cue word (cues already lowercase).
pub fn cued(lines: &[BTreeSet<String>], tool: &str, cue: &[String]) -> bool {
    let tool = tool.to_lowercase();
    lines
        .iter()
        .any(|l| l.contains(&tool) && cue.iter().all(|c| l.contains(c)))
}

/// Whether one line of `text` holds `tool` and every cue word.
pub fn line_cues(text: &str, tool: &str, cue: &[String]) -> bool {
    let lines: Vec<BTreeSet<String>> = text.lines().map(|l| words(l).collect()).collect();
    cued(&lines, tool, cue)
}

/// A tool's result as it came back to the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A success: the result's fields, as strings.
    Ok(BTreeMap<String, String>),
    /// A failure: its text.
    Failed(String),
}

/// One call the model made in the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Made {
    /// The tool.
    pub tool: String,
    /// The arguments.
    pub args: Value,
    /// Its result, if one came back.
    pub outcome: Option<Outcome>,
}

/// The outcome a tool message's content says: a JSON object without a top-level `error` is a
/// success (its fields become strings); anything else is a failure whose text is the content.
pub fn outcome_of(content: &str) -> Outcome {
    match serde_json::from_str::<Value>(content) {
        Ok(Value::Object(m)) if !m.contains_key("error") => Outcome::Ok(
            m.into_iter()
                .map(|(k, v)| {
                    let s = match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, s)
                })
                .collect(),
        ),
        _ => Outcome::Failed(content.to_string()),
    }
}

/// The calls of the assistant turns, in order, each with the tool message that answers it.
pub fn calls_made(req: &ChatRequest) -> Vec<Made> {
    let mut made: Vec<(String, Made)> = Vec::new();
    for m in &req.messages {
        match m.role {
            Role::Assistant => {
                for c in &m.tool_calls {
                    made.push((
                        c.id.clone(),
                        Made {
                            tool: c.name.clone(),
                            args: c.arguments.clone(),
                            outcome: None,
                        },
                    ));
                }
            }
            Role::Tool => {
                if let Some(id) = &m.tool_call_id
                    && let Some((_, mc)) = made.iter_mut().find(|(i, _)| i == id)
                {
                    mc.outcome = Some(outcome_of(&m.content));
                }
            }
            Role::System | Role::User => {}
        }
    }
    made.into_iter().map(|(_, m)| m).collect()
}
