//! Loading failure policies, classifier settings and loop limits from TOML
//! (`config/policy.toml`). The file deserializes into raw tables (an unknown key or a value of the
//! wrong type is refused with its dotted path), then a check pass builds the strategies; every
//! error names the file and the key at fault.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::config::Table;
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

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawFile {
    #[serde(default)]
    limits: Table<RawLimits>,
    #[serde(default)]
    classifier: Table<RawClassifier>,
    #[serde(default)]
    policy: Table<RawPolicy>,
}

/// `[limits]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawLimits {
    max_recovery_attempts: Option<u32>,
    max_total_attempts: Option<u32>,
    max_recovery_ms: Option<u64>,
    max_tokens: Option<u64>,
    max_cost: Option<f64>,
    #[serde(default)]
    auto_checkpoint: bool,
    #[serde(default)]
    strict_idempotency: bool,
    #[serde(default)]
    seed: u64,
    tool_manifest: Option<String>,
}

/// `[classifier]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawClassifier {
    loop_window: Option<u64>,
    #[serde(default)]
    constraints: Vec<String>,
}

/// `[policy]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawPolicy {
    default: Option<RawStrategy>,
    /// By failure type's name.
    #[serde(default)]
    types: BTreeMap<String, RawStrategy>,
}

/// A strategy as written: a bare name (default settings), or a table with `strategy` and the
/// settings of that strategy.
struct RawStrategy(Box<StrategyTable>);

/// The keys any strategy may have; which belong to which is checked after.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a strategy table")]
struct StrategyTable {
    strategy: String,
    max_attempts: Option<u32>,
    base_ms: Option<u64>,
    cap_ms: Option<u64>,
    hint: Option<String>,
    max_replans: Option<u32>,
    checkpoint: Option<String>,
    message: Option<String>,
    reason: Option<String>,
    primary: Option<RawStrategy>,
    fallback: Option<RawStrategy>,
    after_kinds: Option<Vec<String>>,
    steps: Option<Vec<RawStrategy>>,
}

impl StrategyTable {
    /// The settings given, by key.
    fn given(&self) -> impl Iterator<Item = &'static str> {
        [
            ("max_attempts", self.max_attempts.is_some()),
            ("base_ms", self.base_ms.is_some()),
            ("cap_ms", self.cap_ms.is_some()),
            ("hint", self.hint.is_some()),
            ("max_replans", self.max_replans.is_some()),
            ("checkpoint", self.checkpoint.is_some()),
            ("message", self.message.is_some()),
            ("reason", self.reason.is_some()),
            ("primary", self.primary.is_some()),
            ("fallback", self.fallback.is_some()),
            ("after_kinds", self.after_kinds.is_some()),
            ("steps", self.steps.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
    }
}

impl<'de> Deserialize<'de> for RawStrategy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = RawStrategy;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a strategy name or a strategy table")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<RawStrategy, E> {
                Ok(RawStrategy(Box::new(StrategyTable {
                    strategy: name.to_string(),
                    ..StrategyTable::default()
                })))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawStrategy, A::Error> {
                // Through `MapAccessDeserializer` the keys stay on the error's path.
                StrategyTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| RawStrategy(Box::new(t)))
            }
        }
        d.deserialize_any(Either)
    }
}

/// The check pass: knows the file, builds the errors.
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

    fn strategy(&self, raw: &RawStrategy, path: &str) -> Result<Strategy, PolicyError> {
        let t = &*raw.0;
        let missing = |k: &str| self.err(&format!("{path}.{k}"), "missing");
        let sub = |s: &Option<RawStrategy>, k: &str| match s {
            Some(s) => self.strategy(s, &format!("{path}.{k}")).map(Box::new),
            None => Err(missing(k)),
        };
        let (keys, strategy): (&[&str], Strategy) = match t.strategy.as_str() {
            "retry_with_tool_manifest" => (
                &["max_attempts"],
                Strategy::RetryWithToolManifest {
                    max_attempts: t.max_attempts.unwrap_or(3),
                },
            ),
            "backoff_and_retry" => {
                let d = Backoff::default();
                (
                    &["max_attempts", "base_ms", "cap_ms"],
                    Strategy::BackoffAndRetry(Backoff {
                        max_attempts: t.max_attempts.unwrap_or(d.max_attempts),
                        base_ms: t.base_ms.unwrap_or(d.base_ms),
                        cap_ms: t.cap_ms.unwrap_or(d.cap_ms),
                    }),
                )
            }
            "replan" => (
                &["hint", "max_replans"],
                Strategy::Replan {
                    hint: t.hint.clone().ok_or_else(|| missing("hint"))?,
                    max_replans: t.max_replans.unwrap_or(3),
                },
            ),
            "resume_from_subgoal" => (&[], Strategy::ResumeFromSubgoal),
            "rollback_to_checkpoint" => (
                &["checkpoint"],
                Strategy::RollbackToCheckpoint {
                    checkpoint: t.checkpoint.clone(),
                },
            ),
            "escalate" | "escalate_by_default" => (
                &["message"],
                Strategy::Escalate {
                    message: t.message.clone(),
                },
            ),
            "abort" | "abort_by_default" => (
                &["reason"],
                Strategy::Abort {
                    reason: t.reason.clone(),
                },
            ),
            "suspend" => (
                &["message"],
                Strategy::Suspend {
                    message: t
                        .message
                        .clone()
                        .unwrap_or_else(|| "approval needed to continue".into()),
                },
            ),
            "chain" => (
                &["primary", "fallback", "after_kinds"],
                Strategy::Chain {
                    primary: sub(&t.primary, "primary")?,
                    fallback: sub(&t.fallback, "fallback")?,
                    after_kinds: t
                        .after_kinds
                        .clone()
                        .unwrap_or_else(|| vec!["escalate".to_string()]),
                },
            ),
            "sequence" => (
                &["steps"],
                Strategy::Sequence {
                    steps: t
                        .steps
                        .as_ref()
                        .ok_or_else(|| {
                            self.err(
                                &format!("{path}.steps"),
                                "missing; expected an array of strategies",
                            )
                        })?
                        .iter()
                        .enumerate()
                        .map(|(i, s)| self.strategy(s, &format!("{path}.steps[{i}]")))
                        .collect::<Result<_, _>>()?,
                },
            ),
            other => {
                return Err(self.err(
                    &format!("{path}.strategy"),
                    format!("unknown strategy {other:?}"),
                ));
            }
        };
        if let Some(k) = t.given().find(|k| !keys.contains(k)) {
            let expected = ["strategy"].iter().chain(keys).copied().collect::<Vec<_>>();
            return Err(self.err(
                &format!("{path}.{k}"),
                format!("unknown key (expected one of: {})", expected.join(", ")),
            ));
        }
        Ok(strategy)
    }

    fn file(&self, raw: RawFile) -> Result<PolicyFile, PolicyError> {
        let l = &*raw.limits;
        if let Some(x) = l.max_cost.filter(|x| x.is_nan() || *x < 0.0) {
            return Err(self.err(
                "limits.max_cost",
                format!("expected a non-negative number, found {x}"),
            ));
        }
        let limits = AgentConfig {
            max_recovery_attempts: l
                .max_recovery_attempts
                .unwrap_or(AgentConfig::default().max_recovery_attempts),
            max_total_attempts: l.max_total_attempts,
            max_recovery_ms: l.max_recovery_ms,
            max_tokens: l.max_tokens,
            max_cost: l.max_cost,
            auto_checkpoint: l.auto_checkpoint,
            strict_idempotency: l.strict_idempotency,
            seed: l.seed,
            tool_manifest: l.tool_manifest.clone(),
        };
        let mut classifier = ClassifierConfig::default();
        if let Some(n) = raw.classifier.loop_window {
            if n < 2 {
                return Err(self.err("classifier.loop_window", "must be at least 2"));
            }
            classifier.loop_window =
                usize::try_from(n).map_err(|_| self.err("classifier.loop_window", "too large"))?;
        }
        for (i, c) in raw.classifier.constraints.iter().enumerate() {
            regex::Regex::new(c)
                .map_err(|e| self.err(&format!("classifier.constraints[{i}]"), e.to_string()))?;
        }
        classifier.constraints = raw.classifier.constraints.clone();
        let mut policy = FailurePolicy {
            default: raw
                .policy
                .default
                .as_ref()
                .map(|d| self.strategy(d, "policy.default"))
                .transpose()?,
            ..FailurePolicy::default()
        };
        for (name, s) in &raw.policy.types {
            let key = format!("policy.types.{name}");
            let ft = FailureType::parse(name).ok_or_else(|| {
                self.err(&key, "not a failure type (wrong_tool_called, constraint_ignored, loop_detected, hallucinated_state, plan_incomplete, schema_mismatch, context_overflow, goal_drift, external_fault, timeout, unknown)")
            })?;
            policy.strategies.insert(ft, self.strategy(s, &key)?);
        }
        Ok(PolicyFile {
            limits,
            classifier,
            policy,
        })
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
        let root: toml::Table = toml::from_str(text).map_err(|source| PolicyError::Syntax {
            file: file.to_string(),
            source,
        })?;
        let cx = Ctx { file };
        let raw = crate::config::from_toml(root).map_err(|(key, reason)| cx.err(&key, reason))?;
        cx.file(raw)
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
