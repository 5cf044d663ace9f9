//! Parsing and checking a simulated environment file (FORMAT.md). The file deserializes into raw
//! tables (an unknown key or a value of the wrong type is refused with its dotted path), then a
//! check pass enforces ranges and cross-references; every rejection names the file, the key and
//! what was expected.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use toml::Value as Toml;

use super::model::{
    Arm, Drift, Feature, Infra, Numbers, Overrides, RewardConfig, SimSpec, Stage, When,
};
use crate::config::Table;
use crate::taxonomy::ErrorClass;

/// Why an environment file was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The file could not be read.
    #[error("{file}: cannot read: {reason}")]
    Io {
        /// The file.
        file: String,
        /// The OS error.
        reason: String,
    },
    /// The file is not TOML.
    #[error("{file}: not valid TOML: {reason}")]
    Toml {
        /// The file.
        file: String,
        /// The parser's message.
        reason: String,
    },
    /// A key is missing, of the wrong type, out of range or unknown.
    #[error("{file}: key `{key}`: {expected}")]
    Key {
        /// The file.
        file: String,
        /// The dotted path of the key (`stage[0].arm[1].p_success`).
        key: String,
        /// What was expected.
        expected: String,
    },
    /// A plan given to the simulator does not fit the environment.
    #[error("environment {env}: bad plan: {reason}")]
    Plan {
        /// The environment's name.
        env: String,
        /// What is wrong with the plan.
        reason: String,
    },
}

/// Error classes with relative weights, by name (sorted, as the draws expect).
type RawErrors = BTreeMap<String, f64>;

/// Feature conditions as written: feature name to value.
type RawMatch = BTreeMap<String, Toml>;

/// The whole file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawSpec {
    name: String,
    goal: String,
    sla_ms: f64,
    #[serde(default)]
    reward: Table<RawReward>,
    /// By name: the features are kept in this (sorted) order.
    features: BTreeMap<String, Table<RawFeature>>,
    #[serde(default)]
    stage: Vec<Table<RawStage>>,
    infra: Option<Table<RawInfra>>,
    #[serde(default)]
    drift: Vec<Table<RawDrift>>,
}

/// `[reward]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawReward {
    pub(super) success: Option<f64>,
    pub(super) latency: Option<f64>,
    pub(super) cost: Option<f64>,
    pub(super) max_cost: Option<f64>,
}

/// One entry of `[features]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawFeature {
    values: Vec<Toml>,
    weights: Option<Vec<f64>>,
}

/// `[infra]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawInfra {
    p_fault: Option<f64>,
    errors: Option<RawErrors>,
}

/// One `[[stage]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawStage {
    name: String,
    #[serde(default)]
    arm: Vec<Table<RawArm>>,
}

/// Declares a raw table with its own keys and the number keys (FORMAT.md: `cost`, `latency_ms`,
/// `p_success`, `p_valid`, `errors`, `p_infra`), checked by its `overrides`.
macro_rules! with_numbers {
    ($(#[$doc:meta])* struct $name:ident { $($own:tt)* }) => {
        $(#[$doc])*
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a table")]
        struct $name {
            $($own)*
            cost: Option<f64>,
            latency_ms: Option<f64>,
            p_success: Option<f64>,
            p_valid: Option<f64>,
            p_infra: Option<f64>,
            errors: Option<RawErrors>,
        }

        impl $name {
            /// The number keys given, each checked.
            fn overrides(&self, cx: &Ctx<'_>, path: &str) -> Result<Overrides, SimError> {
                let key = |k: &str| format!("{path}.{k}");
                Ok(Overrides {
                    cost: cx.opt(self.cost, &key("cost"), Check::NonNegative)?,
                    latency_ms: cx.opt(self.latency_ms, &key("latency_ms"), Check::Positive)?,
                    p_success: cx.opt(self.p_success, &key("p_success"), Check::Probability)?,
                    p_valid: cx.opt(self.p_valid, &key("p_valid"), Check::Probability)?,
                    p_infra: cx.opt(self.p_infra, &key("p_infra"), Check::Probability)?,
                    errors: self
                        .errors
                        .as_ref()
                        .map(|e| cx.errors(e, &key("errors"), false))
                        .transpose()?,
                })
            }
        }
    };
}

with_numbers! {
    /// One `[[stage.arm]]`.
    struct RawArm {
        tool: String,
        strategy: String,
        params: Option<toml::Table>,
        #[serde(default)]
        when: Vec<Table<RawWhen>>,
    }
}

with_numbers! {
    /// One `[[stage.arm.when]]`.
    struct RawWhen {
        #[serde(rename = "match")]
        matcher: RawMatch,
    }
}

with_numbers! {
    /// One `[[drift]]`.
    struct RawDrift {
        after_task: u64,
        stage: String,
        tool: String,
        strategy: String,
        #[serde(default, rename = "match")]
        matcher: RawMatch,
    }
}

/// The range a number must be in.
#[derive(Clone, Copy)]
pub(super) enum Check {
    /// Greater than 0.
    Positive,
    /// At least 0.
    NonNegative,
    /// In [0, 1].
    Probability,
}

impl Check {
    /// What the check expects, in words.
    pub(super) fn describe(self) -> &'static str {
        match self {
            Check::Positive => "a number greater than 0",
            Check::NonNegative => "a number of at least 0",
            Check::Probability => "a probability in [0, 1]",
        }
    }

    fn holds(self, x: f64) -> bool {
        match self {
            Check::Positive => x > 0.0,
            Check::NonNegative => x >= 0.0,
            Check::Probability => (0.0..=1.0).contains(&x),
        }
    }
}

/// The check pass: knows the file, builds the errors (the agent environments' check pass uses
/// it too).
pub(super) struct Ctx<'a> {
    /// The file's name, for the errors.
    pub(super) file: &'a str,
}

impl Ctx<'_> {
    /// The error at `key`.
    pub(super) fn err(&self, key: &str, expected: impl Into<String>) -> SimError {
        SimError::Key {
            file: self.file.to_string(),
            key: key.to_string(),
            expected: expected.into(),
        }
    }

    /// `x` (at `key`) if it is finite and in range.
    pub(super) fn number(&self, x: f64, key: &str, check: Check) -> Result<f64, SimError> {
        if !x.is_finite() {
            Err(self.err(key, format!("expected a finite number, found {x}")))
        } else if !check.holds(x) {
            Err(self.err(key, format!("expected {}, found {x}", check.describe())))
        } else {
            Ok(x)
        }
    }

    /// [`Ctx::number`] of an optional key.
    pub(super) fn opt(
        &self,
        x: Option<f64>,
        key: &str,
        check: Check,
    ) -> Result<Option<f64>, SimError> {
        x.map(|x| self.number(x, key, check)).transpose()
    }

    /// `s` (at `key`) if it is not blank.
    pub(super) fn text(&self, s: &str, key: &str) -> Result<String, SimError> {
        if s.trim().is_empty() {
            return Err(self.err(key, "expected a non-empty string"));
        }
        Ok(s.to_string())
    }

    /// Error classes with weights (`infra_only`: the infrastructure classes only).
    pub(super) fn errors(
        &self,
        t: &RawErrors,
        path: &str,
        infra_only: bool,
    ) -> Result<Vec<(ErrorClass, f64)>, SimError> {
        if t.is_empty() {
            return Err(self.err(
                path,
                "expected at least one error class with a positive weight",
            ));
        }
        let mut out = Vec::new();
        for (name, &w) in t {
            let key = format!("{path}.{name}");
            let class = ErrorClass::parse(name).ok_or_else(|| {
                self.err(
                    &key,
                    "unknown error class; expected one of Timeout, RateLimit, Auth, SchemaMismatch, NotFound, ToolNotFit, TransientNetwork, DeterministicFailure",
                )
            })?;
            if class.as_str() != name {
                return Err(self.err(&key, format!("expected the canonical name `{class}`")));
            }
            if infra_only
                && !matches!(
                    class,
                    ErrorClass::Timeout
                        | ErrorClass::RateLimit
                        | ErrorClass::TransientNetwork
                        | ErrorClass::Auth
                )
            {
                return Err(self.err(
                    &key,
                    "infrastructure faults use only Timeout, RateLimit, TransientNetwork or Auth",
                ));
            }
            out.push((class, self.number(w, &key, Check::NonNegative)?));
        }
        if out.iter().map(|(_, w)| *w).sum::<f64>() <= 0.0 {
            return Err(self.err(path, "expected the weights to sum to more than 0"));
        }
        Ok(out)
    }

    /// Feature conditions (`when`, `match`): each a declared feature and one of its values.
    pub(super) fn matcher(
        &self,
        m: &RawMatch,
        path: &str,
        features: &[Feature],
    ) -> Result<BTreeMap<String, String>, SimError> {
        let mut out = BTreeMap::new();
        for (name, value) in m {
            let key = format!("{path}.{name}");
            let feature = features.iter().find(|f| &f.name == name).ok_or_else(|| {
                self.err(
                    &key,
                    "expected the name of a feature declared in [features]",
                )
            })?;
            let value = feature_value(value).ok_or_else(|| {
                self.err(
                    &key,
                    format!(
                        "expected a string, number or boolean, found {}",
                        value.type_str()
                    ),
                )
            })?;
            if !feature.values.contains(&value) {
                return Err(self.err(
                    &key,
                    format!(
                        "expected one of the feature's values: {}",
                        feature.values.join(", ")
                    ),
                ));
            }
            out.insert(name.clone(), value);
        }
        Ok(out)
    }

    fn feature(&self, name: &str, f: &RawFeature) -> Result<Feature, SimError> {
        let values_path = format!("features.{name}.values");
        if f.values.is_empty() {
            return Err(self.err(&values_path, "expected a non-empty array of values"));
        }
        let values: Vec<String> = f
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                feature_value(v).ok_or_else(|| {
                    self.err(
                        &format!("{values_path}[{i}]"),
                        "expected a string, number or boolean",
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        if let Some(i) = (1..values.len()).find(|&i| values[..i].contains(&values[i])) {
            return Err(self.err(
                &format!("{values_path}[{i}]"),
                format!("duplicate value `{}`", values[i]),
            ));
        }
        let weights_path = format!("features.{name}.weights");
        let weights = match &f.weights {
            None => vec![1.0; values.len()],
            Some(w) if w.len() != values.len() => {
                return Err(self.err(
                    &weights_path,
                    format!(
                        "expected {} weights, one per value, found {}",
                        values.len(),
                        w.len()
                    ),
                ));
            }
            Some(w) => {
                let w = w
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        self.number(x, &format!("{weights_path}[{i}]"), Check::NonNegative)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if w.iter().sum::<f64>() <= 0.0 {
                    return Err(self.err(&weights_path, "expected weights summing to more than 0"));
                }
                w
            }
        };
        Ok(Feature {
            name: name.to_string(),
            values,
            weights,
        })
    }

    fn arm(&self, a: &RawArm, path: &str, features: &[Feature]) -> Result<Arm, SimError> {
        let key = |k: &str| format!("{path}.{k}");
        let tool = self.text(&a.tool, &key("tool"))?;
        let strategy = self.text(&a.strategy, &key("strategy"))?;
        if tool.contains(['/', ' ']) || strategy.contains(' ') {
            return Err(self.err(&key("tool"), "expected names without spaces or `/`"));
        }
        let params = match &a.params {
            None => serde_json::Map::new(),
            Some(t) => match serde_json::to_value(t) {
                Ok(Value::Object(m)) if m.contains_key("strategy") => {
                    return Err(self.err(&key("params.strategy"), "`strategy` is reserved"));
                }
                Ok(Value::Object(m)) => m,
                _ => return Err(self.err(&key("params"), "expected a table of plain values")),
            },
        };
        let o = a.overrides(self, path)?;
        let required =
            |k: &str, what: &str| self.err(&key(k), format!("required; expected {what}"));
        let numbers = Numbers {
            cost: o
                .cost
                .ok_or_else(|| required("cost", Check::NonNegative.describe()))?,
            latency_ms: o
                .latency_ms
                .ok_or_else(|| required("latency_ms", Check::Positive.describe()))?,
            p_success: o
                .p_success
                .ok_or_else(|| required("p_success", Check::Probability.describe()))?,
            p_valid: o.p_valid.unwrap_or(1.0),
            p_infra: o.p_infra,
            errors: o
                .errors
                .ok_or_else(|| required("errors", "a table of error classes with weights"))?,
        };
        let when = a
            .when
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let wp = format!("{path}.when[{i}]");
                Ok(When {
                    matcher: self.matcher(&w.matcher, &format!("{wp}.match"), features)?,
                    overrides: w.overrides(self, &wp)?,
                })
            })
            .collect::<Result<_, SimError>>()?;
        Ok(Arm {
            tool,
            strategy,
            params,
            numbers,
            when,
        })
    }

    fn drift(
        &self,
        d: &RawDrift,
        path: &str,
        stages: &[Stage],
        features: &[Feature],
    ) -> Result<Drift, SimError> {
        let key = |k: &str| format!("{path}.{k}");
        let stage = self.text(&d.stage, &key("stage"))?;
        let tool = self.text(&d.tool, &key("tool"))?;
        let strategy = self.text(&d.strategy, &key("strategy"))?;
        let Some(s) = stages.iter().find(|s| s.name == stage) else {
            return Err(self.err(
                &key("stage"),
                format!("expected the name of a stage; `{stage}` is none"),
            ));
        };
        if !s
            .arms
            .iter()
            .any(|a| a.tool == tool && a.strategy == strategy)
        {
            return Err(self.err(
                &key("strategy"),
                format!("expected an arm of stage `{stage}`; ({tool}, {strategy}) is none"),
            ));
        }
        Ok(Drift {
            after_task: d.after_task,
            stage,
            tool,
            strategy,
            matcher: self.matcher(&d.matcher, &key("match"), features)?,
            overrides: d.overrides(self, path)?,
        })
    }

    /// `[reward]`'s FORMAT.md keys, with their defaults.
    pub(super) fn reward(&self, r: &RawReward, sla_ms: f64) -> Result<RewardConfig, SimError> {
        Ok(RewardConfig {
            success: self
                .opt(r.success, "reward.success", Check::NonNegative)?
                .unwrap_or(1.0),
            latency: self
                .opt(r.latency, "reward.latency", Check::NonNegative)?
                .unwrap_or(0.2),
            cost: self
                .opt(r.cost, "reward.cost", Check::NonNegative)?
                .unwrap_or(0.1),
            max_cost: self
                .opt(r.max_cost, "reward.max_cost", Check::Positive)?
                .unwrap_or(0.1),
            sla_ms,
        })
    }

    /// `[features]`: at least one, each checked, in name order.
    pub(super) fn features(
        &self,
        raw: &BTreeMap<String, Table<RawFeature>>,
    ) -> Result<Vec<Feature>, SimError> {
        if raw.is_empty() {
            return Err(self.err("features", "expected at least one feature"));
        }
        raw.iter().map(|(name, f)| self.feature(name, f)).collect()
    }

    /// The goal's placeholders must name features.
    pub(super) fn goal(&self, goal: &str, features: &[Feature]) -> Result<(), SimError> {
        let mut rest = goal;
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| {
                self.err("goal", "expected `}` to close a `{feature}` placeholder")
            })?;
            let ph = &after[..close];
            if !features.iter().any(|f| f.name == ph) {
                return Err(self.err("goal", format!("placeholder `{{{ph}}}` names no feature")));
            }
            rest = &after[close + 1..];
        }
        Ok(())
    }

    /// `[infra]`. It is optional, and so is its `errors`: an arm's `p_infra` (FORMAT.md allows
    /// it without an `[infra]` table) or a `p_fault` without classes draws from the default
    /// classes (`Infra::default`), so that such a file runs instead of being refused.
    pub(super) fn infra(&self, raw: Option<&RawInfra>) -> Result<Infra, SimError> {
        Ok(match raw {
            None => Infra::default(),
            Some(i) => Infra {
                p_fault: self
                    .opt(i.p_fault, "infra.p_fault", Check::Probability)?
                    .unwrap_or(0.0),
                errors: match &i.errors {
                    Some(e) => self.errors(e, "infra.errors", true)?,
                    None => Infra::default().errors,
                },
            },
        })
    }

    fn spec(&self, raw: RawSpec) -> Result<SimSpec, SimError> {
        let name = self.text(&raw.name, "name")?;
        let goal = self.text(&raw.goal, "goal")?;
        let sla_ms = self.number(raw.sla_ms, "sla_ms", Check::Positive)?;
        let reward = self.reward(&raw.reward, sla_ms)?;
        let features = self.features(&raw.features)?;
        self.goal(&goal, &features)?;
        let infra = self.infra(raw.infra.as_deref())?;

        if raw.stage.is_empty() {
            return Err(self.err("stage", "expected one or more [[stage]] tables"));
        }
        let mut stages: Vec<Stage> = Vec::new();
        for (si, s) in raw.stage.iter().enumerate() {
            let sp = format!("stage[{si}]");
            let sname = self.text(&s.name, &format!("{sp}.name"))?;
            if stages.iter().any(|s| s.name == sname) {
                return Err(self.err(
                    &format!("{sp}.name"),
                    format!("duplicate stage name `{sname}`"),
                ));
            }
            if s.arm.len() < 2 {
                return Err(self.err(
                    &format!("{sp}.arm"),
                    format!("expected two or more [[stage.arm]], found {}", s.arm.len()),
                ));
            }
            let mut arms: Vec<Arm> = Vec::new();
            for (ai, a) in s.arm.iter().enumerate() {
                let ap = format!("{sp}.arm[{ai}]");
                let arm = self.arm(a, &ap, &features)?;
                if arms
                    .iter()
                    .any(|b| b.tool == arm.tool && b.strategy == arm.strategy)
                {
                    return Err(self.err(
                        &format!("{ap}.strategy"),
                        format!(
                            "duplicate arm ({}, {}) in stage `{sname}`",
                            arm.tool, arm.strategy
                        ),
                    ));
                }
                arms.push(arm);
            }
            stages.push(Stage { name: sname, arms });
        }

        let drift = raw
            .drift
            .iter()
            .enumerate()
            .map(|(i, d)| self.drift(d, &format!("drift[{i}]"), &stages, &features))
            .collect::<Result<_, _>>()?;

        Ok(SimSpec {
            name,
            goal,
            reward,
            features,
            stages,
            infra,
            drift,
        })
    }
}

/// Parses and checks an environment file's text; `file` names it in errors.
pub fn parse_spec(text: &str, file: &str) -> Result<SimSpec, SimError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| SimError::Toml {
        file: file.to_string(),
        reason: e.to_string(),
    })?;
    let cx = Ctx { file };
    let raw = crate::config::from_toml(table).map_err(|(key, why)| cx.err(&key, why))?;
    cx.spec(raw)
}

/// A feature's value as the tasks carry it: a string as written, a number or a boolean as TOML
/// writes it (`10`, `1.5`, `true`), so that `values = [10, 50]` and `match = { size = 10 }`
/// agree; `None` for anything else.
pub(super) fn feature_value(v: &Toml) -> Option<String> {
    match v {
        Toml::String(s) => Some(s.clone()),
        Toml::Integer(i) => Some(i.to_string()),
        Toml::Float(f) if f.is_finite() => Some(f.to_string()),
        Toml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}
