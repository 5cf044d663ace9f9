//! procedure: what an agent stage did when it passed, as a procedure that can run again without
//! the model. The successful tool calls of the stage, in order, with each argument abstracted to
//! where its value came from (a feature of the task, a key of its input, a field of an earlier
//! call's result, or a literal), and the answer as a template over the same sources when the
//! model's answers agree on one. Abstraction reads a finished trajectory; rendering fills a
//! procedure in for a new task. Both are pure.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The step metadata key under which a passed agent stage's answer step records the procedure
/// its calls make (JSON), for the SOP book to propose.
pub const PROCEDURE_KEY: &str = "procedure";

/// Where an argument's (or an answer piece's) value comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A value as written (JSON text).
    Literal(String),
    /// A feature of the task.
    Feature(String),
    /// A key of the task's input object.
    Input(String),
    /// A field of the result of an earlier call of the procedure (0-based).
    Result {
        /// The call.
        call: u32,
        /// The result's field.
        field: String,
    },
    /// A string made of text and values from sources (`{input.log_dir}/{call1.newest}`).
    Template(Vec<Piece>),
}

/// One call of a procedure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcedureCall {
    /// The tool (its registry name).
    pub tool: String,
    /// Its arguments, by name.
    pub args: Vec<(String, Source)>,
}

/// A piece of a template (an answer, or a string argument).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Piece {
    /// Text as written.
    Text(String),
    /// A value from a source (never a literal).
    Value(Source),
}

/// A procedure of one agent stage. See the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Procedure {
    /// The agent stage.
    pub stage: String,
    /// Its calls, in order.
    pub calls: Vec<ProcedureCall>,
    /// The answer, when the model's answers agreed on a template; without one the model is
    /// asked once, after the calls, for the answer.
    pub answer: Option<Vec<Piece>>,
}

/// A call made by a stage that passed: the tool, its arguments and its result.
#[derive(Debug, Clone, Copy)]
pub struct MadeCall<'a> {
    /// The tool (its registry name).
    pub tool: &'a str,
    /// The arguments it was called with.
    pub args: &'a Value,
    /// What it returned.
    pub result: &'a Value,
}

/// What a procedure is filled in with: the task's features and input, and the results of the
/// procedure's calls made so far.
#[derive(Debug, Clone, Copy)]
pub struct Bindings<'a> {
    /// The task's features.
    pub features: &'a BTreeMap<String, String>,
    /// The task's input object, if any.
    pub input: Option<&'a Value>,
    /// Results of the calls made so far, in order.
    pub results: &'a [Value],
}

/// Why a procedure cannot be filled in for a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The task has no such feature.
    #[error("the task has no feature `{0}`")]
    Feature(String),
    /// The task's input has no such key.
    #[error("the task's input has no key `{0}`")]
    Input(String),
    /// An earlier call's result has no such field.
    #[error("the result of call {} has no field `{field}`", call + 1)]
    Result {
        /// The call (0-based).
        call: u32,
        /// The field.
        field: String,
    },
    /// A literal is not JSON (a damaged procedure).
    #[error("the literal `{0}` is not JSON")]
    Literal(String),
}

impl Source {
    /// The value for a task.
    pub fn value(&self, b: &Bindings<'_>) -> Result<Value, RenderError> {
        match self {
            Source::Literal(text) => {
                serde_json::from_str(text).map_err(|_| RenderError::Literal(text.clone()))
            }
            Source::Feature(name) => b
                .features
                .get(name)
                .map(|v| Value::String(v.clone()))
                .ok_or_else(|| RenderError::Feature(name.clone())),
            Source::Input(key) => b
                .input
                .and_then(|i| i.get(key))
                .cloned()
                .ok_or_else(|| RenderError::Input(key.clone())),
            Source::Result { call, field } => b
                .results
                .get(*call as usize)
                .and_then(|r| r.get(field))
                .cloned()
                .ok_or_else(|| RenderError::Result {
                    call: *call,
                    field: field.clone(),
                }),
            Source::Template(pieces) => render(pieces, b).map(Value::String),
        }
    }
}

/// The text of `pieces` for a task.
fn render(pieces: &[Piece], b: &Bindings<'_>) -> Result<String, RenderError> {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Value(source) => out.push_str(&text_of(&source.value(b)?)),
        }
    }
    Ok(out)
}

/// `pieces` as written, with `{...}` placeholders.
fn written(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => t.clone(),
            Piece::Value(s) => s.to_string(),
        })
        .collect()
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Literal(text) => write!(f, "{text}"),
            Source::Feature(name) => write!(f, "{{{name}}}"),
            Source::Input(key) => write!(f, "{{input.{key}}}"),
            Source::Result { call, field } => write!(f, "{{call{}.{field}}}", call + 1),
            Source::Template(pieces) => write!(f, "\"{}\"", written(pieces)),
        }
    }
}

/// The text of a value as an answer shows it (a string as is, anything else as JSON).
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Procedure {
    /// The procedure of `calls`, made by agent stage `stage` for a task with `features` and
    /// `input` that passed with `answer`; `None` when a call's arguments are not an object.
    pub fn abstracted(
        stage: &str,
        calls: &[MadeCall<'_>],
        features: &BTreeMap<String, String>,
        input: Option<&Value>,
        answer: &str,
    ) -> Option<Procedure> {
        let mut out = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let args = call.args.as_object()?;
            let args = args
                .iter()
                .map(|(name, v)| (name.clone(), source_of(v, &calls[..i], features, input)))
                .collect();
            out.push(ProcedureCall {
                tool: call.tool.to_string(),
                args,
            });
        }
        Some(Procedure {
            stage: stage.to_string(),
            calls: out,
            answer: Some(template(answer, calls, features, input)),
        })
    }

    /// What identifies the procedure's calls (the answer apart): procedures with the same key
    /// make the same calls from the same sources.
    pub fn calls_key(&self) -> String {
        let mut out = format!("{}:", self.stage);
        for (i, call) in self.calls.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&call.tool);
            out.push('(');
            for (j, (name, source)) in call.args.iter().enumerate() {
                if j > 0 {
                    out.push(';');
                }
                out.push_str(&format!("{name}={source}"));
            }
            out.push(')');
        }
        out
    }

    /// The arguments of call `at` for a task.
    pub fn args(&self, at: usize, b: &Bindings<'_>) -> Result<Value, RenderError> {
        let mut args = serde_json::Map::new();
        if let Some(call) = self.calls.get(at) {
            for (name, source) in &call.args {
                args.insert(name.clone(), source.value(b)?);
            }
        }
        Ok(Value::Object(args))
    }

    /// The answer for a task, when the procedure has one.
    pub fn answer(&self, b: &Bindings<'_>) -> Option<Result<String, RenderError>> {
        Some(render(self.answer.as_ref()?, b))
    }
}

impl fmt::Display for Procedure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, call) in self.calls.iter().enumerate() {
            let args: Vec<String> = call
                .args
                .iter()
                .map(|(name, source)| format!("{name}={source}"))
                .collect();
            writeln!(f, "{}. {}({})", i + 1, call.tool, args.join(", "))?;
        }
        match &self.answer {
            Some(pieces) => write!(f, "answer: {}", written(pieces)),
            None => write!(f, "answer: the model's"),
        }
    }
}

/// Where `v` came from: a field of an earlier call's result (the earliest), a key of the input,
/// a feature, or else the literal itself.
fn source_of(
    v: &Value,
    earlier: &[MadeCall<'_>],
    features: &BTreeMap<String, String>,
    input: Option<&Value>,
) -> Source {
    let meaningful = match v {
        Value::String(s) => !s.is_empty(),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
        _ => true,
    };
    if meaningful {
        for (j, call) in earlier.iter().enumerate() {
            if let Some(field) = call
                .result
                .as_object()
                .and_then(|o| o.iter().find(|(_, r)| *r == v).map(|(k, _)| k))
            {
                return Source::Result {
                    call: j as u32,
                    field: field.clone(),
                };
            }
        }
        if let Some(key) = input
            .and_then(Value::as_object)
            .and_then(|o| o.iter().find(|(_, r)| *r == v).map(|(k, _)| k))
        {
            return Source::Input(key.clone());
        }
        if let Some(s) = v.as_str() {
            if let Some((name, _)) = features.iter().find(|(_, f)| *f == s) {
                return Source::Feature(name.clone());
            }
            let pieces = template(s, earlier, features, input);
            if pieces.iter().any(|p| matches!(p, Piece::Value(_))) {
                return Source::Template(pieces);
            }
        }
    }
    Source::Literal(v.to_string())
}

/// `text` with every whole-word occurrence of a value the task or `calls` gave (two characters
/// or more; the longest first) replaced by its source.
fn template(
    text: &str,
    calls: &[MadeCall<'_>],
    features: &BTreeMap<String, String>,
    input: Option<&Value>,
) -> Vec<Piece> {
    let mut known: Vec<(String, Source)> = Vec::new();
    for (j, call) in calls.iter().enumerate() {
        for (field, v) in call.result.as_object().into_iter().flatten() {
            known.push((
                text_of(v),
                Source::Result {
                    call: j as u32,
                    field: field.clone(),
                },
            ));
        }
    }
    for (key, v) in input.and_then(Value::as_object).into_iter().flatten() {
        known.push((text_of(v), Source::Input(key.clone())));
    }
    for (name, v) in features {
        known.push((v.clone(), Source::Feature(name.clone())));
    }
    known.retain(|(t, _)| t.chars().count() >= 2);
    // Longest first; among equal texts the first found (results before input before features).
    known.sort_by_key(|k| std::cmp::Reverse(k.0.len()));
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        let before = text[..at].chars().next_back();
        let hit = (!word(before))
            .then(|| {
                known.iter().find(|(t, _)| {
                    rest.starts_with(t.as_str()) && !word(rest[t.len()..].chars().next())
                })
            })
            .flatten();
        match hit {
            Some((t, source)) => {
                if !lit.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut lit)));
                }
                pieces.push(Piece::Value(source.clone()));
                at += t.len();
            }
            None => {
                let Some(c) = rest.chars().next() else {
                    break;
                };
                lit.push(c);
                at += c.len_utf8();
            }
        }
    }
    if !lit.is_empty() {
        pieces.push(Piece::Text(lit));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feats() -> BTreeMap<String, String> {
        [("tier", "pro"), ("topic", "billing")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn arguments_are_abstracted_to_their_sources_and_rendered_for_another_task() {
        let input = json!({"customer": "Customer 5", "email": "c5@example.com"});
        let a1 = json!({"query": "Customer 5", "email": "c5@example.com", "limit": 10});
        let r1 = json!({"id": "cus_5", "plan": "pro"});
        let a2 = json!({"customer_id": "cus_5", "status": "open"});
        let r2 = json!({"total": "120.50"});
        let calls = [
            MadeCall {
                tool: "search_customers",
                args: &a1,
                result: &r1,
            },
            MadeCall {
                tool: "list_invoices",
                args: &a2,
                result: &r2,
            },
        ];
        let p = Procedure::abstracted(
            "answer",
            &calls,
            &feats(),
            Some(&input),
            "Customer 5 (pro) owes 120.50.",
        )
        .unwrap();
        assert_eq!(
            p.calls_key(),
            "answer:search_customers(email={input.email};limit=10;query={input.customer}),\
             list_invoices(customer_id={call1.id};status=\"open\")"
        );
        // Another task: the same procedure fills in with its own values.
        let input2 = json!({"customer": "Customer 9", "email": "c9@example.com"});
        let b = Bindings {
            features: &feats(),
            input: Some(&input2),
            results: &[],
        };
        assert_eq!(
            p.args(0, &b).unwrap(),
            json!({"query": "Customer 9", "email": "c9@example.com", "limit": 10})
        );
        let results = [json!({"id": "cus_9", "plan": "pro"}), json!({"total": "7"})];
        let b = Bindings {
            results: &results,
            ..b
        };
        assert_eq!(
            p.args(1, &b).unwrap(),
            json!({"customer_id": "cus_9", "status": "open"})
        );
        assert_eq!(p.answer(&b).unwrap().unwrap(), "Customer 9 (pro) owes 7.");
        // A source the task lacks is an error naming it, not a guess.
        let b = Bindings { input: None, ..b };
        assert_eq!(p.args(0, &b), Err(RenderError::Input("email".to_string())));
    }

    #[test]
    fn a_string_argument_made_of_values_is_a_template() {
        let input = json!({"log_dir": "/var/log/billing", "host": "host-12.internal"});
        let a1 =
            json!({"host": "host-12.internal", "path": "/var/log/billing", "pattern": "*.log"});
        let r1 = json!({"newest": "billing-12.log"});
        let a2 = json!({"path": "/var/log/billing/billing-12.log", "level": 9});
        let r2 = json!({});
        let calls = [
            MadeCall {
                tool: "list_files",
                args: &a1,
                result: &r1,
            },
            MadeCall {
                tool: "compress",
                args: &a2,
                result: &r2,
            },
        ];
        let p = Procedure::abstracted("rotate", &calls, &feats(), Some(&input), "ok").unwrap();
        assert_eq!(
            p.calls_key(),
            "rotate:list_files(host={input.host};path={input.log_dir};pattern=\"*.log\"),\
             compress(level=9;path=\"{input.log_dir}/{call1.newest}\")"
        );
        let input = json!({"log_dir": "/var/log/auth", "host": "h"});
        let results = [json!({"newest": "auth-3.log"})];
        let b = Bindings {
            features: &feats(),
            input: Some(&input),
            results: &results,
        };
        assert_eq!(
            p.args(1, &b).unwrap(),
            json!({"path": "/var/log/auth/auth-3.log", "level": 9})
        );
    }

    #[test]
    fn values_inside_words_are_not_placeholders() {
        let input = json!({"name": "pro"});
        let p =
            Procedure::abstracted("s", &[], &feats(), Some(&input), "a professional pro").unwrap();
        assert_eq!(
            p.answer,
            Some(vec![
                Piece::Text("a professional ".into()),
                Piece::Value(Source::Input("name".into())),
            ])
        );
    }
}
