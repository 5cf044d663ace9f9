//! Loading failure policies, classifier settings and loop limits from TOML
//! (`config/policy.toml`), with errors naming the file and the key at fault.

use std::path::Path;

use toml::{Table, Value};

use crate::taxonomy::FailureType;

use super::agent::AgentConfig;
use super::classify::{ClassifierConfig, RulesClassifier};
use super::policy::{Backoff, FailurePolicy, Strategy};

/// A policy file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not TOML.
    #[error("{file}: {source}")]
    Syntax {
        /// The file.
        file: String,
        /// Why.
        source: toml::de::Error,
    },
    /// A key has a wrong or missing value.
    #[error("{file}: {key}: {reason}")]
    Key {
        /// The file.
        file: String,
        /// The dotted key (`policy.types.timeout.max_attempts`).
        key: String,
        /// Why.
        reason: String,
    },
}

/// Everything a policy file configures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyFile {
    /// The `[limits]` table.
    pub limits: AgentConfig,
    /// The `[classifier]` table.
    pub classifier: ClassifierConfig,
    /// The `[policy]` table.
    pub policy: FailurePolicy,
}

struct Ctx<'a> {
    file: &'a str,
}

impl Ctx<'_> {
    fn err(&self, key: &str, reason: impl Into<String>) -> PolicyError {
        PolicyError::Key {
            file: self.file.to_string(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    fn table<'t>(&self, v: &'t Value, key: &str) -> Result<&'t Table, PolicyError> {
        v.as_table()
            .ok_or_else(|| self.err(key, format!("expected a table, found {}", v.type_str())))
    }

    fn u64(&self, t: &Table, key: &str, path: &str) -> Result<Option<u64>, PolicyError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= 0 => Ok(Some(*i as u64)),
            Some(v) => Err(self.err(
                &format!("{path}.{key}"),
                format!("expected a non-negative integer, found {v}"),
            )),
        }
    }

    fn u32(&self, t: &Table, key: &str, path: &str) -> Result<Option<u32>, PolicyError> {
        match self.u64(t, key, path)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.err(&format!("{path}.{key}"), "too large")),
        }
    }

    fn f64(&self, t: &Table, key: &str, path: &str) -> Result<Option<f64>, PolicyError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::Float(f)) if *f >= 0.0 => Ok(Some(*f)),
            Some(Value::Integer(i)) if *i >= 0 => Ok(Some(*i as f64)),
            Some(v) => Err(self.err(
                &format!("{path}.{key}"),
                format!("expected a non-negative number, found {v}"),
            )),
        }
    }

    fn bool(&self, t: &Table, key: &str, path: &str) -> Result<Option<bool>, PolicyError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(
                &format!("{path}.{key}"),
                format!("expected true or false, found {v}"),
            )),
        }
    }

    fn string(&self, t: &Table, key: &str, path: &str) -> Result<Option<String>, PolicyError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.err(
                &format!("{path}.{key}"),
                format!("expected a string, found {v}"),
            )),
        }
    }

    fn known(&self, t: &Table, path: &str, allowed: &[&str]) -> Result<(), PolicyError> {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    &format!("{path}.{k}"),
                    format!("unknown key (expected one of: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn strategy(&self, v: &Value, path: &str) -> Result<Strategy, PolicyError> {
        // A bare string names a strategy with default settings.
        let owned;
        let t = match v {
            Value::String(s) => {
                let mut t = Table::new();
                t.insert("strategy".into(), Value::String(s.clone()));
                owned = t;
                &owned
            }
            other => self.table(other, path)?,
        };
        let name = self
            .string(t, "strategy", path)?
            .ok_or_else(|| self.err(&format!("{path}.strategy"), "missing"))?;
        let s = match name.as_str() {
            "retry_with_tool_manifest" => {
                self.known(t, path, &["strategy", "max_attempts"])?;
                Strategy::RetryWithToolManifest {
                    max_attempts: self.u32(t, "max_attempts", path)?.unwrap_or(3),
                }
            }
            "backoff_and_retry" => {
                self.known(t, path, &["strategy", "max_attempts", "base_ms", "cap_ms"])?;
                let d = Backoff::default();
                Strategy::BackoffAndRetry(Backoff {
                    max_attempts: self.u32(t, "max_attempts", path)?.unwrap_or(d.max_attempts),
                    base_ms: self.u64(t, "base_ms", path)?.unwrap_or(d.base_ms),
                    cap_ms: self.u64(t, "cap_ms", path)?.unwrap_or(d.cap_ms),
                })
            }
            "replan" => {
                self.known(t, path, &["strategy", "hint", "max_replans"])?;
                Strategy::Replan {
                    hint: self
                        .string(t, "hint", path)?
                        .ok_or_else(|| self.err(&format!("{path}.hint"), "missing"))?,
                    max_replans: self.u32(t, "max_replans", path)?.unwrap_or(3),
                }
            }
            "resume_from_subgoal" => {
                self.known(t, path, &["strategy"])?;
                Strategy::ResumeFromSubgoal
            }
            "rollback_to_checkpoint" => {
                self.known(t, path, &["strategy", "checkpoint"])?;
                Strategy::RollbackToCheckpoint {
                    checkpoint: self.string(t, "checkpoint", path)?,
                }
            }
            "escalate" | "escalate_by_default" => {
                self.known(t, path, &["strategy", "message"])?;
                Strategy::Escalate {
                    message: self.string(t, "message", path)?,
                }
            }
            "abort" | "abort_by_default" => {
                self.known(t, path, &["strategy", "reason"])?;
                Strategy::Abort {
                    reason: self.string(t, "reason", path)?,
                }
            }
            "suspend" => {
                self.known(t, path, &["strategy", "message"])?;
                Strategy::Suspend {
                    message: self
                        .string(t, "message", path)?
                        .unwrap_or_else(|| "approval needed to continue".into()),
                }
            }
            "chain" => {
                self.known(t, path, &["strategy", "primary", "fallback", "after_kinds"])?;
                let get = |k: &str| {
                    t.get(k)
                        .ok_or_else(|| self.err(&format!("{path}.{k}"), "missing"))
                };
                let after_kinds = match t.get("after_kinds") {
                    None => vec!["escalate".to_string()],
                    Some(Value::Array(a)) => a
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            v.as_str().map(str::to_string).ok_or_else(|| {
                                self.err(&format!("{path}.after_kinds[{i}]"), "expected a string")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(self.err(
                            &format!("{path}.after_kinds"),
                            "expected an array of action kinds",
                        ));
                    }
                };
                Strategy::Chain {
                    primary: Box::new(self.strategy(get("primary")?, &format!("{path}.primary"))?),
                    fallback: Box::new(
                        self.strategy(get("fallback")?, &format!("{path}.fallback"))?,
                    ),
                    after_kinds,
                }
            }
            "sequence" => {
                self.known(t, path, &["strategy", "steps"])?;
                let Some(Value::Array(a)) = t.get("steps") else {
                    return Err(
                        self.err(&format!("{path}.steps"), "expected an array of strategies")
                    );
                };
                Strategy::Sequence {
                    steps: a
                        .iter()
                        .enumerate()
                        .map(|(i, v)| self.strategy(v, &format!("{path}.steps[{i}]")))
                        .collect::<Result<_, _>>()?,
                }
            }
            other => {
                return Err(self.err(
                    &format!("{path}.strategy"),
                    format!("unknown strategy {other:?}"),
                ));
            }
        };
        Ok(s)
    }
}

impl PolicyFile {
    /// Reads and parses a policy file.
    pub fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            file: file.clone(),
            source,
        })?;
        PolicyFile::parse(&text, &file)
    }

    /// Parses policy TOML; `file` names the source in errors.
    pub fn parse(text: &str, file: &str) -> Result<PolicyFile, PolicyError> {
        let cx = Ctx { file };
        let root: Table = toml::from_str(text).map_err(|source| PolicyError::Syntax {
            file: file.to_string(),
            source,
        })?;
        cx.known(&root, "", &["limits", "classifier", "policy"])
            .map_err(|e| match e {
                PolicyError::Key { file, key, reason } => PolicyError::Key {
                    file,
                    key: key.trim_start_matches('.').to_string(),
                    reason,
                },
                e => e,
            })?;
        let mut out = PolicyFile::default();
        if let Some(v) = root.get("limits") {
            let t = cx.table(v, "limits")?;
            let p = "limits";
            cx.known(
                t,
                p,
                &[
                    "max_recovery_attempts",
                    "max_total_attempts",
                    "max_recovery_ms",
                    "max_tokens",
                    "max_cost",
                    "auto_checkpoint",
                    "strict_idempotency",
                    "seed",
                    "tool_manifest",
                ],
            )?;
            let l = &mut out.limits;
            if let Some(n) = cx.u32(t, "max_recovery_attempts", p)? {
                l.max_recovery_attempts = n;
            }
            l.max_total_attempts = cx.u32(t, "max_total_attempts", p)?;
            l.max_recovery_ms = cx.u64(t, "max_recovery_ms", p)?;
            l.max_tokens = cx.u64(t, "max_tokens", p)?;
            l.max_cost = cx.f64(t, "max_cost", p)?;
            l.auto_checkpoint = cx.bool(t, "auto_checkpoint", p)?.unwrap_or(false);
            l.strict_idempotency = cx.bool(t, "strict_idempotency", p)?.unwrap_or(false);
            l.seed = cx.u64(t, "seed", p)?.unwrap_or(0);
            l.tool_manifest = cx.string(t, "tool_manifest", p)?;
        }
        if let Some(v) = root.get("classifier") {
            let t = cx.table(v, "classifier")?;
            cx.known(t, "classifier", &["loop_window", "constraints"])?;
            if let Some(n) = cx.u64(t, "loop_window", "classifier")? {
                if n < 2 {
                    return Err(cx.err("classifier.loop_window", "must be at least 2"));
                }
                out.classifier.loop_window = n as usize;
            }
            match t.get("constraints") {
                None => {}
                Some(Value::Array(a)) => {
                    for (i, v) in a.iter().enumerate() {
                        let key = format!("classifier.constraints[{i}]");
                        let s = v
                            .as_str()
                            .ok_or_else(|| cx.err(&key, "expected a string"))?;
                        regex::Regex::new(s).map_err(|e| cx.err(&key, e.to_string()))?;
                        out.classifier.constraints.push(s.to_string());
                    }
                }
                Some(_) => {
                    return Err(cx.err("classifier.constraints", "expected an array of patterns"));
                }
            }
        }
        if let Some(v) = root.get("policy") {
            let t = cx.table(v, "policy")?;
            cx.known(t, "policy", &["default", "types"])?;
            if let Some(d) = t.get("default") {
                out.policy.default = Some(cx.strategy(d, "policy.default")?);
            }
            if let Some(types) = t.get("types") {
                let types = cx.table(types, "policy.types")?;
                for (name, v) in types {
                    let key = format!("policy.types.{name}");
                    let ft = FailureType::parse(name).ok_or_else(|| {
                        cx.err(&key, "not a failure type (wrong_tool_called, constraint_ignored, loop_detected, hallucinated_state, plan_incomplete, schema_mismatch, context_overflow, goal_drift, external_fault, timeout, unknown)")
                    })?;
                    out.policy.strategies.insert(ft, cx.strategy(v, &key)?);
                }
            }
        }
        Ok(out)
    }

    /// The rules classifier these settings describe.
    pub fn rules_classifier(&self) -> Result<RulesClassifier, PolicyError> {
        RulesClassifier::new(&self.classifier).map_err(|e| PolicyError::Key {
            file: String::new(),
            key: format!("classifier.constraints[{}]", e.index),
            reason: e.source.to_string(),
        })
    }
}
