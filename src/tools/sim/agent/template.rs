//! Templates (`{feature}`, `{index}`, `{input.KEY}`, `{TOOL.FIELD}`) and argument values: parsing
//! a template into pieces, rendering it for a task, and converting a rendered string to its
//! parameter's type (AGENT-FORMAT.md, Values).

use std::collections::BTreeMap;

use serde_json::Value;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text as written.
    Lit(String),
    /// `{index}`: the task's number.
    Index,
    /// `{feature}`: a feature's value.
    Feature(String),
    /// `{input.KEY}`: a value of the task's input object.
    Input(String),
    /// `{TOOL.FIELD}`: a field of an earlier call's result.
    Field(String, String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The text as written.
    pub text: String,
    /// Its pieces, in order.
    pub pieces: Vec<Piece>,
}

/// What a template may refer to where it is written.
pub struct Scope<'a> {
    /// The declared features.
    pub features: &'a [String],
    /// The input's keys (`None`: `{input.KEY}` is not allowed here).
    pub input: Option<&'a [String]>,
    /// Tools whose fields may be named, each with its fields (`None`: no `{TOOL.FIELD}` here).
    pub fields: Option<&'a [(String, Vec<String>)]>,
}

/// What a template is rendered with.
pub struct Values<'a> {
    /// The task's number.
    pub index: u64,
    /// The task's features.
    pub features: &'a BTreeMap<String, String>,
    /// The task's input object.
    pub input: &'a BTreeMap<String, String>,
    /// Fields of successful results, by tool (a missing one renders empty).
    pub fields: &'a BTreeMap<String, BTreeMap<String, String>>,
}

impl Template {
    /// Parses `text`, checking each placeholder against `scope`; the error says what is wrong.
    pub fn parse(text: &str, scope: &Scope<'_>) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Lit(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| "expected `}` to close a placeholder".to_string())?;
            pieces.push(placeholder(&after[..close], scope)?);
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err("a `}` closes no placeholder".to_string());
        }
        if !rest.is_empty() {
            pieces.push(Piece::Lit(rest.to_string()));
        }
        Ok(Template {
            text: text.to_string(),
            pieces,
        })
    }

    /// The template rendered (a field of a call that has not succeeded renders empty).
    pub fn render(&self, v: &Values<'_>) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Lit(s) => out.push_str(s),
                Piece::Index => out.push_str(&v.index.to_string()),
                Piece::Feature(f) => out.push_str(v.features.get(f).map_or("", String::as_str)),
                Piece::Input(k) => out.push_str(v.input.get(k).map_or("", String::as_str)),
                Piece::Field(t, f) => {
                    out.push_str(v.fields.get(t).and_then(|m| m.get(f)).map_or("", |s| s))
                }
            }
        }
        out
    }

    /// The tools whose fields the template names.
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Field(t, _) => Some(t.as_str()),
            _ => None,
        })
    }

    /// Whether the template has no placeholder.
    pub fn is_literal(&self) -> bool {
        self.pieces.iter().all(|p| matches!(p, Piece::Lit(_)))
    }
}

fn placeholder(ph: &str, scope: &Scope<'_>) -> Result<Piece, String> {
    if ph == "index" {
        return Ok(Piece::Index);
    }
    if let Some(key) = ph.strip_prefix("input.") {
        let Some(keys) = scope.input else {
            return Err(format!("placeholder `{{{ph}}}`: no `{{input.KEY}}` here"));
        };
        if !keys.iter().any(|k| k == key) {
            return Err(format!(
                "placeholder `{{{ph}}}` names no key of [input] (keys: {})",
                keys.join(", ")
            ));
        }
        return Ok(Piece::Input(key.to_string()));
    }
    if let Some((tool, field)) = ph.split_once('.') {
        let Some(tools) = scope.fields else {
            return Err(format!("placeholder `{{{ph}}}`: no `{{TOOL.FIELD}}` here"));
        };
        let Some((_, fields)) = tools.iter().find(|(t, _)| t == tool) else {
            return Err(format!(
                "placeholder `{{{ph}}}`: `{tool}` is not a tool called earlier in the plan"
            ));
        };
        if !fields.iter().any(|f| f == field) {
            return Err(format!(
                "placeholder `{{{ph}}}`: `{tool}` returns no field `{field}`"
            ));
        }
        return Ok(Piece::Field(tool.to_string(), field.to_string()));
    }
    if scope.features.iter().any(|f| f == ph) {
        return Ok(Piece::Feature(ph.to_string()));
    }
    Err(format!(
        "placeholder `{{{ph}}}` names no feature, `index`, `input.KEY` or `TOOL.FIELD`"
    ))
}

/// A parameter's type (`params`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// `string`.
    String,
    /// `integer`.
    Integer,
    /// `number`.
    Number,
    /// `boolean`.
    Boolean,
}

impl ParamType {
    /// The type named in a `params` entry (without its `?`).
    pub fn parse(s: &str) -> Option<ParamType> {
        match s {
            "string" => Some(ParamType::String),
            "integer" => Some(ParamType::Integer),
            "number" => Some(ParamType::Number),
            "boolean" => Some(ParamType::Boolean),
            _ => None,
        }
    }

    /// Its JSON Schema name.
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Integer => "integer",
            ParamType::Number => "number",
            ParamType::Boolean => "boolean",
        }
    }

    /// A rendered string converted to this type (`"true"` to a boolean, `"100000"` to an
    /// integer); `None` when it does not convert.
    pub fn convert(self, s: &str) -> Option<Value> {
        match self {
            ParamType::String => Some(Value::String(s.to_string())),
            ParamType::Integer => s.trim().parse::<i64>().ok().map(Value::from),
            ParamType::Number => s
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .and_then(|x| serde_json::Number::from_f64(x).map(Value::Number)),
            ParamType::Boolean => match s.trim() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
        }
    }

    /// An argument as this type: a value of the type, or a string that converts (the canonical
    /// form, so that `equals` compares after conversion); `None` when it is mistyped.
    pub fn accept(self, v: &Value) -> Option<Value> {
        match (self, v) {
            (_, Value::String(s)) => self.convert(s),
            (ParamType::Integer, Value::Number(n)) => n.as_i64().map(Value::from),
            (ParamType::Number, Value::Number(n)) => n
                .as_f64()
                .and_then(|x| serde_json::Number::from_f64(x).map(Value::Number)),
            (ParamType::Boolean, Value::Bool(b)) => Some(Value::Bool(*b)),
            _ => None,
        }
    }
}

/// The words of a text: runs of letters, digits and underscores, lowercased.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// Whether `s` is one word (letters, digits and underscores only, not empty).
pub fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}
