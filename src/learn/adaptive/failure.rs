//! Failure observations and the classified, PII-redacted records kept of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::guard::pii::redact;
use crate::taxonomy::{ErrorClassification, FailureCategory};

/// Longest error message kept in a failure record, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;

/// A tool failure as the executor saw it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FailureObservation {
    /// The run it happened in.
    pub run_id: String,
    /// The tool that failed.
    pub tool: String,
    /// The error's type name, if known (`TimeoutError`, `ValidationError`).
    pub error_type: Option<String>,
    /// The error message.
    pub message: String,
    /// The arguments of the failing call, if known.
    pub arguments: Option<serde_json::Value>,
    /// The task's features.
    pub features: BTreeMap<String, String>,
}

/// A stored failure: classified, redacted, with its weight for synthesis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// Unique id within the adaptive state.
    pub id: u64,
    /// The run it happened in.
    pub run_id: String,
    /// The tool that failed.
    pub tool: String,
    /// The error's type name.
    pub error_type: Option<String>,
    /// The message, PII-redacted and truncated to [`MAX_MESSAGE_CHARS`].
    pub message: String,
    /// The arguments as compact JSON, every string value PII-redacted (a string so that the
    /// record also round-trips through non-self-describing formats such as postcard).
    pub arguments: Option<String>,
    /// The task's features (values PII-redacted).
    pub features: BTreeMap<String, String>,
    /// The classifier's verdict.
    pub classification: ErrorClassification,
    /// 1.0 for strategy failures; at most 0.5 for unknown ones.
    pub weight: f64,
    /// When it was recorded.
    pub time_ms: u64,
}

impl FailureRecord {
    /// Builds the record of an observation that is not an infrastructure failure.
    pub fn new(
        id: u64,
        obs: &FailureObservation,
        classification: ErrorClassification,
        now_ms: u64,
    ) -> FailureRecord {
        let weight = match classification.category {
            FailureCategory::Strategy => 1.0,
            _ => classification.confidence.clamp(0.0, 0.5),
        };
        let message: String = redact(&obs.message)
            .text
            .chars()
            .take(MAX_MESSAGE_CHARS)
            .collect();
        FailureRecord {
            id,
            run_id: obs.run_id.clone(),
            tool: obs.tool.clone(),
            error_type: obs.error_type.clone(),
            message,
            arguments: obs.arguments.as_ref().map(|a| redact_json(a).to_string()),
            features: obs
                .features
                .iter()
                .map(|(k, v)| (k.clone(), redact(v).text))
                .collect(),
            classification,
            weight,
            time_ms: now_ms,
        }
    }

    /// Whether the failure is a strategy failure (it counts towards the synthesis threshold).
    pub fn is_strategy(&self) -> bool {
        self.classification.category == FailureCategory::Strategy
    }

    /// The names of the top-level arguments, sorted.
    pub fn argument_keys(&self) -> Vec<String> {
        let parsed = self
            .arguments
            .as_deref()
            .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok());
        match parsed {
            Some(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

/// Redacts PII from every string inside a JSON value.
pub fn redact_json(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(redact(s).text),
        Value::Array(a) => Value::Array(a.iter().map(redact_json).collect()),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), redact_json(v))).collect())
        }
        other => other.clone(),
    }
}
