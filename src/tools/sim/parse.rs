//! Parsing and checking a simulated environment file (FORMAT.md): every rejection names the file,
//! the key and what was expected.

use std::collections::BTreeMap;

use serde_json::Value;
use toml::Value as Toml;

use super::model::{
    Arm, Drift, Feature, Infra, Numbers, Overrides, RewardConfig, SimSpec, Stage, When,
};
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

struct Ctx<'a> {
    file: &'a str,
}

impl Ctx<'_> {
    fn err(&self, key: &str, expected: impl Into<String>) -> SimError {
        SimError::Key {
            file: self.file.to_string(),
            key: key.to_string(),
            expected: expected.into(),
        }
    }

    fn table<'t>(&self, v: &'t Toml, key: &str) -> Result<&'t toml::Table, SimError> {
        v.as_table()
            .ok_or_else(|| self.err(key, format!("expected a table, found {}", v.type_str())))
    }

    fn only_keys(&self, t: &toml::Table, prefix: &str, allowed: &[&str]) -> Result<(), SimError> {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    &join(prefix, k),
                    format!("unknown key; expected one of: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn string(&self, t: &toml::Table, prefix: &str, key: &str) -> Result<String, SimError> {
        let path = join(prefix, key);
        match t.get(key) {
            None => Err(self.err(&path, "required; expected a string")),
            Some(Toml::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Toml::String(_)) => Err(self.err(&path, "expected a non-empty string")),
            Some(v) => Err(self.err(&path, format!("expected a string, found {}", v.type_str()))),
        }
    }

    fn number(&self, v: &Toml, path: &str) -> Result<f64, SimError> {
        match v {
            Toml::Integer(i) => Ok(*i as f64),
            Toml::Float(f) if f.is_finite() => Ok(*f),
            other => Err(self.err(
                path,
                format!("expected a finite number, found {}", other.type_str()),
            )),
        }
    }

    fn opt_number(
        &self,
        t: &toml::Table,
        prefix: &str,
        key: &str,
        check: Check,
    ) -> Result<Option<f64>, SimError> {
        let path = join(prefix, key);
        match t.get(key) {
            None => Ok(None),
            Some(v) => {
                let x = self.number(v, &path)?;
                check.apply(x).map_err(|e| self.err(&path, e))?;
                Ok(Some(x))
            }
        }
    }

    fn req_number(
        &self,
        t: &toml::Table,
        prefix: &str,
        key: &str,
        check: Check,
    ) -> Result<f64, SimError> {
        self.opt_number(t, prefix, key, check)?.ok_or_else(|| {
            self.err(
                &join(prefix, key),
                format!("required; expected {}", check.describe()),
            )
        })
    }

    fn errors(
        &self,
        v: &Toml,
        path: &str,
        infra_only: bool,
    ) -> Result<Vec<(ErrorClass, f64)>, SimError> {
        let t = self.table(v, path)?;
        if t.is_empty() {
            return Err(self.err(
                path,
                "expected at least one error class with a positive weight",
            ));
        }
        let mut out = Vec::new();
        for (name, w) in t {
            let key = join(path, name);
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
            let weight = self.number(w, &key)?;
            Check::NonNegative
                .apply(weight)
                .map_err(|e| self.err(&key, e))?;
            out.push((class, weight));
        }
        if out.iter().map(|(_, w)| *w).sum::<f64>() <= 0.0 {
            return Err(self.err(path, "expected the weights to sum to more than 0"));
        }
        Ok(out)
    }

    fn matcher(
        &self,
        t: &toml::Table,
        prefix: &str,
        features: &[Feature],
    ) -> Result<BTreeMap<String, String>, SimError> {
        let path = join(prefix, "match");
        let Some(v) = t.get("match") else {
            return Ok(BTreeMap::new());
        };
        let m = self.table(v, &path)?;
        let mut out = BTreeMap::new();
        for (name, value) in m {
            let key = join(&path, name);
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

    fn overrides(&self, t: &toml::Table, prefix: &str) -> Result<Overrides, SimError> {
        Ok(Overrides {
            cost: self.opt_number(t, prefix, "cost", Check::NonNegative)?,
            latency_ms: self.opt_number(t, prefix, "latency_ms", Check::Positive)?,
            p_success: self.opt_number(t, prefix, "p_success", Check::Probability)?,
            p_valid: self.opt_number(t, prefix, "p_valid", Check::Probability)?,
            p_infra: self.opt_number(t, prefix, "p_infra", Check::Probability)?,
            errors: match t.get("errors") {
                None => None,
                Some(v) => Some(self.errors(v, &join(prefix, "errors"), false)?),
            },
        })
    }

    fn array<'t>(
        &self,
        t: &'t toml::Table,
        prefix: &str,
        key: &str,
    ) -> Result<&'t [Toml], SimError> {
        match t.get(key) {
            None => Ok(&[]),
            Some(Toml::Array(a)) => Ok(a),
            Some(v) => Err(self.err(
                &join(prefix, key),
                format!("expected an array of tables, found {}", v.type_str()),
            )),
        }
    }
}

#[derive(Clone, Copy)]
enum Check {
    Positive,
    NonNegative,
    Probability,
}

impl Check {
    fn describe(self) -> &'static str {
        match self {
            Check::Positive => "a number greater than 0",
            Check::NonNegative => "a number of at least 0",
            Check::Probability => "a probability in [0, 1]",
        }
    }

    fn apply(self, x: f64) -> Result<(), String> {
        let ok = match self {
            Check::Positive => x > 0.0,
            Check::NonNegative => x >= 0.0,
            Check::Probability => (0.0..=1.0).contains(&x),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("expected {}, found {x}", self.describe()))
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

const OVERRIDE_KEYS: [&str; 6] = [
    "cost",
    "latency_ms",
    "p_success",
    "p_valid",
    "errors",
    "p_infra",
];

/// Parses and checks an environment file's text; `file` names it in errors.
pub fn parse_spec(text: &str, file: &str) -> Result<SimSpec, SimError> {
    let cx = Ctx { file };
    let root: toml::Table = text.parse().map_err(|e: toml::de::Error| SimError::Toml {
        file: file.to_string(),
        reason: e.to_string(),
    })?;
    cx.only_keys(
        &root,
        "",
        &[
            "name", "goal", "sla_ms", "reward", "features", "stage", "infra", "drift",
        ],
    )?;
    let name = cx.string(&root, "", "name")?;
    let goal = cx.string(&root, "", "goal")?;
    let sla_ms = cx.req_number(&root, "", "sla_ms", Check::Positive)?;

    let mut reward = RewardConfig {
        success: 1.0,
        latency: 0.2,
        cost: 0.1,
        max_cost: 0.1,
        sla_ms,
    };
    if let Some(v) = root.get("reward") {
        let t = cx.table(v, "reward")?;
        cx.only_keys(t, "reward", &["success", "latency", "cost", "max_cost"])?;
        if let Some(x) = cx.opt_number(t, "reward", "success", Check::NonNegative)? {
            reward.success = x;
        }
        if let Some(x) = cx.opt_number(t, "reward", "latency", Check::NonNegative)? {
            reward.latency = x;
        }
        if let Some(x) = cx.opt_number(t, "reward", "cost", Check::NonNegative)? {
            reward.cost = x;
        }
        if let Some(x) = cx.opt_number(t, "reward", "max_cost", Check::Positive)? {
            reward.max_cost = x;
        }
    }

    let features_v = root
        .get("features")
        .ok_or_else(|| cx.err("features", "required; expected a table of features"))?;
    let ft = cx.table(features_v, "features")?;
    if ft.is_empty() {
        return Err(cx.err("features", "expected at least one feature"));
    }
    let mut features = Vec::new();
    for (fname, fv) in ft {
        let prefix = join("features", fname);
        let t = cx.table(fv, &prefix)?;
        cx.only_keys(t, &prefix, &["values", "weights"])?;
        let values_path = join(&prefix, "values");
        let values: Vec<String> = match t.get("values") {
            Some(Toml::Array(a)) if !a.is_empty() => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    feature_value(v).ok_or_else(|| {
                        cx.err(
                            &format!("{values_path}[{i}]"),
                            "expected a string, number or boolean",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(cx.err(&values_path, "expected a non-empty array of values")),
            None => {
                return Err(cx.err(
                    &values_path,
                    "required; expected a non-empty array of values (strings, numbers or booleans)",
                ));
            }
        };
        if let Some(i) = (1..values.len()).find(|&i| values[..i].contains(&values[i])) {
            return Err(cx.err(
                &format!("{values_path}[{i}]"),
                format!("duplicate value `{}`", values[i]),
            ));
        }
        let weights_path = join(&prefix, "weights");
        let weights: Vec<f64> = match t.get("weights") {
            None => vec![1.0; values.len()],
            Some(Toml::Array(a)) => {
                if a.len() != values.len() {
                    return Err(cx.err(
                        &weights_path,
                        format!(
                            "expected {} weights, one per value, found {}",
                            values.len(),
                            a.len()
                        ),
                    ));
                }
                let w = a
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let p = format!("{weights_path}[{i}]");
                        let x = cx.number(v, &p)?;
                        Check::NonNegative.apply(x).map_err(|e| cx.err(&p, e))?;
                        Ok(x)
                    })
                    .collect::<Result<Vec<_>, SimError>>()?;
                if w.iter().sum::<f64>() <= 0.0 {
                    return Err(cx.err(&weights_path, "expected weights summing to more than 0"));
                }
                w
            }
            Some(v) => {
                return Err(cx.err(
                    &weights_path,
                    format!("expected an array of numbers, found {}", v.type_str()),
                ));
            }
        };
        features.push(Feature {
            name: fname.clone(),
            values,
            weights,
        });
    }

    // Goal placeholders must name features.
    let mut rest = goal.as_str();
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| cx.err("goal", "expected `}` to close a `{feature}` placeholder"))?;
        let ph = &after[..close];
        if !features.iter().any(|f| f.name == ph) {
            return Err(cx.err("goal", format!("placeholder `{{{ph}}}` names no feature")));
        }
        rest = &after[close + 1..];
    }

    // `[infra]` is optional, and so is its `errors`: an arm's `p_infra` (FORMAT.md allows it
    // without an `[infra]` table) or a `p_fault` without classes draws from the default classes
    // (`Infra::default`), so that such a file runs instead of being refused.
    let infra = match root.get("infra") {
        None => Infra::default(),
        Some(v) => {
            let t = cx.table(v, "infra")?;
            cx.only_keys(t, "infra", &["p_fault", "errors"])?;
            let p_fault = cx
                .opt_number(t, "infra", "p_fault", Check::Probability)?
                .unwrap_or(0.0);
            let errors = match t.get("errors") {
                Some(e) => cx.errors(e, "infra.errors", true)?,
                None => Infra::default().errors,
            };
            Infra { p_fault, errors }
        }
    };

    let stage_arr = match root.get("stage") {
        Some(Toml::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(cx.err("stage", "expected one or more [[stage]] tables")),
        None => return Err(cx.err("stage", "required; expected one or more [[stage]] tables")),
    };
    let mut stages: Vec<Stage> = Vec::new();
    for (si, sv) in stage_arr.iter().enumerate() {
        let sp = format!("stage[{si}]");
        let st = cx.table(sv, &sp)?;
        cx.only_keys(st, &sp, &["name", "arm"])?;
        let sname = cx.string(st, &sp, "name")?;
        if stages.iter().any(|s| s.name == sname) {
            return Err(cx.err(
                &join(&sp, "name"),
                format!("duplicate stage name `{sname}`"),
            ));
        }
        let arms_v = cx.array(st, &sp, "arm")?;
        if arms_v.len() < 2 {
            return Err(cx.err(
                &join(&sp, "arm"),
                format!("expected two or more [[stage.arm]], found {}", arms_v.len()),
            ));
        }
        let mut arms: Vec<Arm> = Vec::new();
        for (ai, av) in arms_v.iter().enumerate() {
            let ap = format!("{sp}.arm[{ai}]");
            let at = cx.table(av, &ap)?;
            let mut allowed = vec!["tool", "strategy", "params", "when"];
            allowed.extend(OVERRIDE_KEYS);
            cx.only_keys(at, &ap, &allowed)?;
            let tool = cx.string(at, &ap, "tool")?;
            let strategy = cx.string(at, &ap, "strategy")?;
            if arms
                .iter()
                .any(|a| a.tool == tool && a.strategy == strategy)
            {
                return Err(cx.err(
                    &join(&ap, "strategy"),
                    format!("duplicate arm ({tool}, {strategy}) in stage `{sname}`"),
                ));
            }
            if tool.contains(['/', ' ']) || strategy.contains(' ') {
                return Err(cx.err(&join(&ap, "tool"), "expected names without spaces or `/`"));
            }
            let params = match at.get("params") {
                None => serde_json::Map::new(),
                Some(v) => {
                    let pp = join(&ap, "params");
                    cx.table(v, &pp)?;
                    match serde_json::to_value(v) {
                        Ok(Value::Object(m)) => {
                            if m.contains_key("strategy") {
                                return Err(
                                    cx.err(&join(&pp, "strategy"), "`strategy` is reserved")
                                );
                            }
                            m
                        }
                        _ => return Err(cx.err(&pp, "expected a table of plain values")),
                    }
                }
            };
            let numbers = Numbers {
                cost: cx.req_number(at, &ap, "cost", Check::NonNegative)?,
                latency_ms: cx.req_number(at, &ap, "latency_ms", Check::Positive)?,
                p_success: cx.req_number(at, &ap, "p_success", Check::Probability)?,
                p_valid: cx
                    .opt_number(at, &ap, "p_valid", Check::Probability)?
                    .unwrap_or(1.0),
                p_infra: cx.opt_number(at, &ap, "p_infra", Check::Probability)?,
                errors: match at.get("errors") {
                    Some(v) => cx.errors(v, &join(&ap, "errors"), false)?,
                    None => {
                        return Err(cx.err(
                            &join(&ap, "errors"),
                            "required; expected a table of error classes with weights",
                        ));
                    }
                },
            };
            let mut when = Vec::new();
            for (wi, wv) in cx.array(at, &ap, "when")?.iter().enumerate() {
                let wp = format!("{ap}.when[{wi}]");
                let wt = cx.table(wv, &wp)?;
                let mut allowed = vec!["match"];
                allowed.extend(OVERRIDE_KEYS);
                cx.only_keys(wt, &wp, &allowed)?;
                if !wt.contains_key("match") {
                    return Err(cx.err(
                        &join(&wp, "match"),
                        "required; expected a table of feature = value",
                    ));
                }
                when.push(When {
                    matcher: cx.matcher(wt, &wp, &features)?,
                    overrides: cx.overrides(wt, &wp)?,
                });
            }
            arms.push(Arm {
                tool,
                strategy,
                params,
                numbers,
                when,
            });
        }
        stages.push(Stage { name: sname, arms });
    }

    let mut drift = Vec::new();
    for (di, dv) in cx.array(&root, "", "drift")?.iter().enumerate() {
        let dp = format!("drift[{di}]");
        let dt = cx.table(dv, &dp)?;
        let mut allowed = vec!["after_task", "stage", "tool", "strategy", "match"];
        allowed.extend(OVERRIDE_KEYS);
        cx.only_keys(dt, &dp, &allowed)?;
        let after_path = join(&dp, "after_task");
        let after_task = match dt.get("after_task") {
            Some(Toml::Integer(i)) if *i >= 0 => *i as u64,
            Some(_) => return Err(cx.err(&after_path, "expected an integer of at least 0")),
            None => return Err(cx.err(&after_path, "required; expected an integer of at least 0")),
        };
        let stage = cx.string(dt, &dp, "stage")?;
        let tool = cx.string(dt, &dp, "tool")?;
        let strategy = cx.string(dt, &dp, "strategy")?;
        let Some(s) = stages.iter().find(|s| s.name == stage) else {
            return Err(cx.err(
                &join(&dp, "stage"),
                format!("expected the name of a stage; `{stage}` is none"),
            ));
        };
        if !s
            .arms
            .iter()
            .any(|a| a.tool == tool && a.strategy == strategy)
        {
            return Err(cx.err(
                &join(&dp, "strategy"),
                format!("expected an arm of stage `{stage}`; ({tool}, {strategy}) is none"),
            ));
        }
        drift.push(Drift {
            after_task,
            stage,
            tool,
            strategy,
            matcher: cx.matcher(dt, &dp, &features)?,
            overrides: cx.overrides(dt, &dp)?,
        });
    }

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

/// A feature's value as the tasks carry it: a string as written, a number or a boolean as TOML
/// writes it (`10`, `1.5`, `true`), so that `values = [10, 50]` and `match = { size = 10 }`
/// agree; `None` for anything else.
fn feature_value(v: &Toml) -> Option<String> {
    match v {
        Toml::String(s) => Some(s.clone()),
        Toml::Integer(i) => Some(i.to_string()),
        Toml::Float(f) if f.is_finite() => Some(f.to_string()),
        Toml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}
