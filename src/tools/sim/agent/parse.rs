//! Parsing and checking an agent environment file (AGENT-FORMAT.md). The file deserializes into
//! raw tables (an unknown key or a value of the wrong type is refused with its dotted path), then
//! a check pass enforces ranges, cross-references and templates (a placeholder naming no feature,
//! no input key, or no field of a tool called earlier in the plan); every rejection names the
//! file, the key and what was expected. The FORMAT.md keys (`[reward]`, `[features]`, `[infra]`)
//! are checked by the tool-stage simulator's own check pass.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Value as Toml;

use super::spec::{
    AgentReward, AgentSpec, Correction, Edit, ModelConfig, Param, Plan, PlanCall, Require, Rule,
    ToolDecl,
};
use super::template::{ParamType, Scope, Template, is_word};
use crate::config::Table;
use crate::taxonomy::ErrorClass;
use crate::tools::sim::parse::{
    Check as Range, Ctx, RawFeature, RawInfra, RawReward, feature_value,
};
use crate::tools::sim::{Feature, SimError};

/// The whole file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawAgent {
    name: String,
    goal: String,
    sla_ms: f64,
    #[serde(default)]
    reward: Table<RawAgentReward>,
    features: BTreeMap<String, Table<RawFeature>>,
    #[serde(default)]
    input: BTreeMap<String, String>,
    #[serde(default)]
    tool: Vec<Table<RawTool>>,
    #[serde(default)]
    model: Table<RawModel>,
    #[serde(default)]
    plan: Vec<Table<RawPlan>>,
    infra: Option<Table<RawInfra>>,
    #[serde(default)]
    correction: Vec<Table<RawCorrection>>,
}

/// `[reward]`: FORMAT.md's keys and the token term.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawAgentReward {
    success: Option<f64>,
    latency: Option<f64>,
    cost: Option<f64>,
    max_cost: Option<f64>,
    tokens: Option<f64>,
    max_tokens: Option<f64>,
}

/// One `[[tool]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawTool {
    name: String,
    description: String,
    params: BTreeMap<String, String>,
    #[serde(default)]
    returns: BTreeMap<String, String>,
    latency_ms: f64,
    cost: f64,
    idempotent: Option<bool>,
    p_infra: Option<f64>,
    #[serde(default)]
    rule: Vec<Table<RawRule>>,
}

/// One `[[tool.rule]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawRule {
    #[serde(default)]
    when: BTreeMap<String, Toml>,
    require: Table<RawRequire>,
    error: String,
    message: String,
    fix: Table<RawEdit>,
    cue: Vec<String>,
}

/// A rule's `require`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawRequire {
    #[serde(default)]
    has: Vec<String>,
    #[serde(default)]
    absent: Vec<String>,
    #[serde(default)]
    equals: BTreeMap<String, Toml>,
}

/// A rule's `fix` (a correction's keys are the same).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawEdit {
    #[serde(default)]
    set: BTreeMap<String, Toml>,
    #[serde(default)]
    remove: Vec<String>,
}

/// `[model]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawModel {
    p_follow: Option<f64>,
    crowd: Option<f64>,
    context_window: Option<u64>,
    completion_tokens: Option<u32>,
    retries: Option<u32>,
    p_loop: Option<f64>,
    p_claim: Option<f64>,
    p_stop: Option<f64>,
    p_drift: Option<f64>,
}

/// One `[[plan]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawPlan {
    #[serde(default)]
    when: BTreeMap<String, Toml>,
    calls: Vec<Table<RawCall>>,
    answer: String,
}

/// One call of a plan.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawCall {
    tool: String,
    #[serde(default)]
    args: BTreeMap<String, Toml>,
}

/// One `[[correction]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawCorrection {
    at_task: u64,
    tool: String,
    #[serde(default)]
    set: BTreeMap<String, Toml>,
    #[serde(default)]
    remove: Vec<String>,
    cue: Vec<String>,
    text: String,
    #[serde(default)]
    poisoned: bool,
}

/// Parses and checks an agent environment's text; `file` names it in errors.
pub fn parse_agent(text: &str, file: &str) -> Result<AgentSpec, SimError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| SimError::Toml {
        file: file.to_string(),
        reason: e.to_string(),
    })?;
    let cx = Ctx { file };
    let raw: RawAgent = crate::config::from_toml(table).map_err(|(key, why)| cx.err(&key, why))?;
    Checker { cx: &cx }.spec(raw)
}

/// What the templates of the file may name.
struct Names {
    features: Vec<String>,
    input: Vec<String>,
}

impl Names {
    /// `{index}`, `{feature}`, and `{input.KEY}` when `input`.
    fn scope(&self, input: bool) -> Scope<'_> {
        Scope {
            features: &self.features,
            input: input.then_some(self.input.as_slice()),
            fields: None,
        }
    }
}

/// The check pass of an agent file (the tool-stage [`Ctx`] builds the errors).
struct Checker<'a> {
    cx: &'a Ctx<'a>,
}

impl Checker<'_> {
    fn err(&self, key: &str, expected: impl Into<String>) -> SimError {
        self.cx.err(key, expected)
    }

    fn prob(&self, x: Option<f64>, key: &str, default: f64) -> Result<f64, SimError> {
        Ok(self.cx.opt(x, key, Range::Probability)?.unwrap_or(default))
    }

    fn template(&self, text: &str, key: &str, scope: &Scope<'_>) -> Result<Template, SimError> {
        Template::parse(text, scope).map_err(|why| self.err(key, format!("bad template: {why}")))
    }

    /// A scalar written where a template is expected (`limit = 100000` reads as `"100000"`).
    fn scalar_template(
        &self,
        v: &Toml,
        key: &str,
        scope: &Scope<'_>,
    ) -> Result<Template, SimError> {
        let text = feature_value(v).ok_or_else(|| {
            self.err(
                key,
                format!(
                    "expected a template string (or a number or boolean), found {}",
                    v.type_str()
                ),
            )
        })?;
        self.template(&text, key, scope)
    }

    /// The parameter `name` of `tool` (at `key`).
    fn param<'t>(&self, tool: &'t ToolDecl, name: &str, key: &str) -> Result<&'t Param, SimError> {
        tool.param(name).ok_or_else(|| {
            self.err(
                key,
                format!(
                    "expected a parameter of tool `{}` ({}); `{name}` is none",
                    tool.name,
                    tool.params
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }

    /// A literal value for `param` must convert to its type.
    fn literal_converts(&self, t: &Template, param: &Param, key: &str) -> Result<(), SimError> {
        if t.is_literal() && param.ty.convert(&t.text).is_none() {
            return Err(self.err(
                key,
                format!(
                    "expected a value that converts to {} (parameter `{}`), found `{}`",
                    param.ty.as_str(),
                    param.name,
                    t.text
                ),
            ));
        }
        Ok(())
    }

    /// Cue words: one or more single words, kept lowercase.
    fn cue(&self, cue: &[String], key: &str) -> Result<Vec<String>, SimError> {
        if cue.is_empty() {
            return Err(self.err(key, "expected one or more cue words"));
        }
        cue.iter()
            .enumerate()
            .map(|(i, w)| {
                if is_word(w) {
                    Ok(w.to_lowercase())
                } else {
                    Err(self.err(
                        &format!("{key}[{i}]"),
                        format!(
                            "expected one word of letters, digits and underscores, found `{w}`"
                        ),
                    ))
                }
            })
            .collect()
    }

    /// A `fix` or a correction's `set` and `remove`.
    fn edit(
        &self,
        set: &BTreeMap<String, Toml>,
        remove: &[String],
        path: &str,
        tool: &ToolDecl,
        names: &Names,
    ) -> Result<Edit, SimError> {
        if set.is_empty() && remove.is_empty() {
            return Err(self.err(path, "expected `set` or `remove` to change something"));
        }
        let mut edit = Edit::default();
        for (k, v) in set {
            let key = format!("{path}.set.{k}");
            let param = self.param(tool, k, &key)?;
            let t = self.scalar_template(v, &key, &names.scope(true))?;
            self.literal_converts(&t, param, &key)?;
            edit.set.push((k.clone(), t));
        }
        for (i, k) in remove.iter().enumerate() {
            let key = format!("{path}.remove[{i}]");
            let param = self.param(tool, k, &key)?;
            if !param.optional {
                return Err(self.err(
                    &key,
                    format!("expected an optional parameter; `{k}` is required"),
                ));
            }
            edit.remove.push(k.clone());
        }
        Ok(edit)
    }

    fn error_class(&self, name: &str, key: &str) -> Result<ErrorClass, SimError> {
        match ErrorClass::parse(name) {
            Some(c) if c.as_str() == name => Ok(c),
            Some(c) => Err(self.err(key, format!("expected the canonical name `{c}`"))),
            None => Err(self.err(
                key,
                "unknown error class; expected one of Timeout, RateLimit, Auth, SchemaMismatch, NotFound, ToolNotFit, TransientNetwork, DeterministicFailure",
            )),
        }
    }

    fn rule(
        &self,
        r: &RawRule,
        path: &str,
        tool: &ToolDecl,
        features: &[Feature],
        names: &Names,
    ) -> Result<Rule, SimError> {
        let key = |k: &str| format!("{path}.{k}");
        let when = self.cx.matcher(&r.when, &key("when"), features)?;
        let q = &r.require;
        if q.has.is_empty() && q.absent.is_empty() && q.equals.is_empty() {
            return Err(self.err(
                &key("require"),
                "expected at least one of `has`, `absent`, `equals`",
            ));
        }
        for (list, name) in [(&q.has, "has"), (&q.absent, "absent")] {
            for (i, k) in list.iter().enumerate() {
                self.param(tool, k, &format!("{path}.require.{name}[{i}]"))?;
            }
        }
        let mut equals = Vec::new();
        for (k, v) in &q.equals {
            let ekey = format!("{path}.require.equals.{k}");
            let param = self.param(tool, k, &ekey)?;
            let value = feature_value(v)
                .and_then(|s| param.ty.convert(&s))
                .ok_or_else(|| {
                    self.err(
                        &ekey,
                        format!("expected a value of type {}", param.ty.as_str()),
                    )
                })?;
            equals.push((k.clone(), value));
        }
        Ok(Rule {
            when,
            require: Require {
                has: q.has.clone(),
                absent: q.absent.clone(),
                equals,
            },
            error: self.error_class(&r.error, &key("error"))?,
            message: self.cx.text(&r.message, &key("message"))?,
            fix: self.edit(&r.fix.set, &r.fix.remove, &key("fix"), tool, names)?,
            cue: self.cue(&r.cue, &key("cue"))?,
        })
    }

    fn tool(
        &self,
        t: &RawTool,
        path: &str,
        features: &[Feature],
        names: &Names,
    ) -> Result<ToolDecl, SimError> {
        let key = |k: &str| format!("{path}.{k}");
        let name = self.cx.text(&t.name, &key("name"))?;
        if !is_word(&name) {
            return Err(self.err(
                &key("name"),
                format!("expected a name of letters, digits and underscores (cues match it as a word), found `{name}`"),
            ));
        }
        let description = self.cx.text(&t.description, &key("description"))?;
        let mut params = Vec::new();
        for (p, ty) in &t.params {
            let pkey = format!("{path}.params.{p}");
            if !is_word(p) {
                return Err(self.err(
                    &pkey,
                    "expected a parameter name of letters, digits and underscores",
                ));
            }
            let (base, optional) = match ty.strip_suffix('?') {
                Some(b) => (b, true),
                None => (ty.as_str(), false),
            };
            let ty = ParamType::parse(base).ok_or_else(|| {
                self.err(
                    &pkey,
                    format!("expected string, integer, number or boolean (a trailing ? for an optional argument), found `{ty}`"),
                )
            })?;
            params.push(Param {
                name: p.clone(),
                ty,
                optional,
            });
        }
        let returns = t
            .returns
            .iter()
            .map(|(f, tpl)| {
                Ok((
                    f.clone(),
                    self.template(tpl, &format!("{path}.returns.{f}"), &names.scope(true))?,
                ))
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        let mut decl = ToolDecl {
            name,
            description,
            params,
            returns,
            latency_ms: self
                .cx
                .number(t.latency_ms, &key("latency_ms"), Range::Positive)?,
            cost: self.cx.number(t.cost, &key("cost"), Range::NonNegative)?,
            idempotent: t.idempotent.unwrap_or(true),
            p_infra: self
                .cx
                .opt(t.p_infra, &key("p_infra"), Range::Probability)?,
            rules: Vec::new(),
        };
        let rules = t
            .rule
            .iter()
            .enumerate()
            .map(|(i, r)| self.rule(r, &format!("{path}.rule[{i}]"), &decl, features, names))
            .collect::<Result<Vec<_>, _>>()?;
        decl.rules = rules;
        Ok(decl)
    }

    fn model(&self, m: &RawModel) -> Result<ModelConfig, SimError> {
        let d = ModelConfig::default();
        if m.context_window == Some(0) {
            return Err(self.err("model.context_window", "expected a positive integer"));
        }
        Ok(ModelConfig {
            p_follow: self.prob(m.p_follow, "model.p_follow", d.p_follow)?,
            crowd: self
                .cx
                .opt(m.crowd, "model.crowd", Range::Positive)?
                .unwrap_or(d.crowd),
            context_window: m.context_window.unwrap_or(d.context_window),
            completion_tokens: m.completion_tokens.unwrap_or(d.completion_tokens),
            retries: m.retries.unwrap_or(d.retries),
            p_loop: self.prob(m.p_loop, "model.p_loop", d.p_loop)?,
            p_claim: self.prob(m.p_claim, "model.p_claim", d.p_claim)?,
            p_stop: self.prob(m.p_stop, "model.p_stop", d.p_stop)?,
            p_drift: self.prob(m.p_drift, "model.p_drift", d.p_drift)?,
        })
    }

    fn plan(
        &self,
        p: &RawPlan,
        path: &str,
        tools: &[ToolDecl],
        features: &[Feature],
        names: &Names,
    ) -> Result<Plan, SimError> {
        let when = self
            .cx
            .matcher(&p.when, &format!("{path}.when"), features)?;
        if p.calls.is_empty() {
            return Err(self.err(&format!("{path}.calls"), "expected one or more calls"));
        }
        // The tools called so far, with the fields they return.
        let mut earlier: Vec<(String, Vec<String>)> = Vec::new();
        let mut calls = Vec::new();
        for (ci, c) in p.calls.iter().enumerate() {
            let cp = format!("{path}.calls[{ci}]");
            let tool = tools.iter().find(|t| t.name == c.tool).ok_or_else(|| {
                self.err(
                    &format!("{cp}.tool"),
                    format!("expected the name of a [[tool]]; `{}` is none", c.tool),
                )
            })?;
            let scope = Scope {
                features: &names.features,
                input: Some(&names.input),
                fields: Some(&earlier),
            };
            let mut args = Vec::new();
            for (k, v) in &c.args {
                let key = format!("{cp}.args.{k}");
                let param = self.param(tool, k, &key)?;
                let t = self.scalar_template(v, &key, &scope)?;
                self.literal_converts(&t, param, &key)?;
                args.push((k.clone(), t));
            }
            if let Some(missing) = tool
                .params
                .iter()
                .find(|p| !p.optional && !c.args.contains_key(&p.name))
            {
                return Err(self.err(
                    &format!("{cp}.args"),
                    format!(
                        "expected every required parameter of `{}`; `{}` is missing",
                        tool.name, missing.name
                    ),
                ));
            }
            calls.push(PlanCall {
                tool: tool.name.clone(),
                args,
            });
            let fields = tool.returns.iter().map(|(f, _)| f.clone()).collect();
            earlier.retain(|(t, _)| t != &tool.name);
            earlier.push((tool.name.clone(), fields));
        }
        let scope = Scope {
            features: &names.features,
            input: Some(&names.input),
            fields: Some(&earlier),
        };
        let answer = self.template(&p.answer, &format!("{path}.answer"), &scope)?;
        if answer.text.trim().is_empty() {
            return Err(self.err(&format!("{path}.answer"), "expected a non-empty answer"));
        }
        Ok(Plan {
            when,
            calls,
            answer,
        })
    }

    fn correction(
        &self,
        c: &RawCorrection,
        path: &str,
        tools: &[ToolDecl],
        names: &Names,
    ) -> Result<Correction, SimError> {
        let key = |k: &str| format!("{path}.{k}");
        let tool = tools.iter().find(|t| t.name == c.tool).ok_or_else(|| {
            self.err(
                &key("tool"),
                format!("expected the name of a [[tool]]; `{}` is none", c.tool),
            )
        })?;
        let edit = self.edit(&c.set, &c.remove, path, tool, names)?;
        let cue = self.cue(&c.cue, &key("cue"))?;
        let text = self.cx.text(&c.text, &key("text"))?;
        if !super::knows::line_cues(&text, &tool.name, &cue) {
            return Err(self.err(
                &key("text"),
                format!(
                    "expected a line naming `{}` and every cue word ({}): the text is what makes the correction known",
                    tool.name,
                    cue.join(", ")
                ),
            ));
        }
        Ok(Correction {
            at_task: c.at_task,
            tool: tool.name.clone(),
            edit,
            cue,
            text,
            poisoned: c.poisoned,
        })
    }

    fn spec(&self, raw: RawAgent) -> Result<AgentSpec, SimError> {
        let cx = self.cx;
        let name = cx.text(&raw.name, "name")?;
        let goal = cx.text(&raw.goal, "goal")?;
        let sla_ms = cx.number(raw.sla_ms, "sla_ms", Range::Positive)?;
        let r = &raw.reward;
        let base = cx.reward(
            &RawReward {
                success: r.success,
                latency: r.latency,
                cost: r.cost,
                max_cost: r.max_cost,
            },
            sla_ms,
        )?;
        let reward = AgentReward {
            base,
            tokens: cx
                .opt(r.tokens, "reward.tokens", Range::NonNegative)?
                .unwrap_or(0.0),
            max_tokens: cx
                .opt(r.max_tokens, "reward.max_tokens", Range::Positive)?
                .unwrap_or(20_000.0),
        };
        let features = cx.features(&raw.features)?;
        cx.goal(&goal, &features)?;
        let goal_first_feature = goal
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(f, _)| f.to_string());

        let mut names = Names {
            features: features.iter().map(|f| f.name.clone()).collect(),
            input: Vec::new(),
        };
        if let Some(f) = names.features.iter().find(|f| *f == "index") {
            return Err(self.err(
                &format!("features.{f}"),
                "`index` is reserved for the task's number",
            ));
        }
        let mut input = Vec::new();
        for (k, v) in &raw.input {
            let key = format!("input.{k}");
            if !is_word(k) {
                return Err(self.err(&key, "expected a key of letters, digits and underscores"));
            }
            input.push((k.clone(), self.template(v, &key, &names.scope(false))?));
        }
        names.input = raw.input.keys().cloned().collect();

        if raw.tool.is_empty() {
            return Err(self.err("tool", "expected one or more [[tool]] tables"));
        }
        let mut tools: Vec<ToolDecl> = Vec::new();
        for (i, t) in raw.tool.iter().enumerate() {
            let path = format!("tool[{i}]");
            let t = self.tool(t, &path, &features, &names)?;
            if tools.iter().any(|u| u.name == t.name) {
                return Err(self.err(
                    &format!("{path}.name"),
                    format!("duplicate tool name `{}`", t.name),
                ));
            }
            tools.push(t);
        }
        let model = self.model(&raw.model)?;
        if raw.plan.is_empty() {
            return Err(self.err("plan", "expected one or more [[plan]] tables"));
        }
        let plans = raw
            .plan
            .iter()
            .enumerate()
            .map(|(i, p)| self.plan(p, &format!("plan[{i}]"), &tools, &features, &names))
            .collect::<Result<Vec<_>, _>>()?;
        let infra = cx.infra(raw.infra.as_deref())?;
        let corrections = raw
            .correction
            .iter()
            .enumerate()
            .map(|(i, c)| self.correction(c, &format!("correction[{i}]"), &tools, &names))
            .collect::<Result<Vec<_>, _>>()?;
        // The validator refuses any `ref-<number>`: an answer that always has one cannot pass.
        for (i, p) in plans.iter().enumerate() {
            if super::validate::first_ref(&p.answer.text).is_some() {
                return Err(self.err(
                    &format!("plan[{i}].answer"),
                    "expected no `ref-<number>` (the validator refuses references no tool returned)",
                ));
            }
        }
        Ok(AgentSpec {
            name,
            goal,
            goal_first_feature,
            reward,
            features,
            input,
            tools,
            model,
            plans,
            infra,
            corrections,
        })
    }
}
