//! A simulated tool of an agent environment (AGENT-FORMAT.md, A call): an infrastructure fault
//! drawn first (with a message like a real one), then the params check (after converting
//! rendered strings to the parameters' types), then the hidden rules in order, else `returns`
//! rendered; virtual latency and cost, failed calls included.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::AgentEnv;
use super::spec::{ToolDecl, matches};
use super::template::Values;
use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::tools::sim::rng::agent_rng;
use crate::tools::sim::{lognormal_latency, retry_after_ms};
use crate::tools::tool::{
    CallContext, CostModel, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec,
};

/// The tool `[[tool]]` number `index` of an environment.
#[derive(Debug)]
pub struct AgentTool {
    env: AgentEnv,
    index: usize,
    spec: ToolSpec,
}

impl AgentTool {
    /// The environment's tool number `index` (file order); an index past the tools gives a
    /// tool whose every call fails NotFound.
    pub fn new(env: AgentEnv, index: usize) -> AgentTool {
        let spec = match env.spec().tools.get(index) {
            Some(t) => tool_spec(t),
            None => ToolSpec::new(format!("missing_tool_{index}"), "no such tool"),
        };
        AgentTool { env, index, spec }
    }

    fn run(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let spec = self.env.spec();
        let Some(decl) = spec.tools.get(self.index) else {
            return Err(ToolError::new(
                ErrorClass::NotFound,
                FailureCategory::Strategy,
                format!("tool {} not found", self.spec.name),
            ));
        };
        let mut rng = agent_rng(
            "tool-call",
            self.env.seed(),
            ctx.task_index,
            ctx.attempt,
            ctx.turn,
            ctx.call,
        );
        // Fixed draw order.
        let (u_infra, u_class, u_retry, u_message) = (rng.f64(), rng.f64(), rng.f64(), rng.f64());
        let latency_ms = lognormal_latency(decl.latency_ms, &mut rng);
        let cost = decl.cost;
        let fail = |class: ErrorClass, category: FailureCategory, message: String| {
            ToolError::new(class, category, message).with_usage(latency_ms, cost)
        };

        if u_infra < spec.p_infra(decl) {
            let class = spec.infra.pick(u_class);
            return Err(fail(
                class,
                FailureCategory::Infrastructure,
                infra_message(class, u_message).to_string(),
            )
            .with_retry_after(retry_after_ms(class, u_retry)));
        }

        let schema = |m: String| fail(ErrorClass::SchemaMismatch, FailureCategory::Strategy, m);
        let Some(obj) = args.as_object() else {
            return Err(schema(format!(
                "invalid arguments for {}: expected an object, found {args}",
                decl.name
            )));
        };
        if let Some(k) = obj.keys().find(|k| decl.param(k).is_none()) {
            return Err(schema(format!(
                "invalid arguments for {}: unexpected argument `{k}`",
                decl.name
            )));
        }
        let mut canon = BTreeMap::new();
        for p in &decl.params {
            match obj.get(&p.name) {
                None if p.optional => {}
                None => {
                    return Err(schema(format!(
                        "invalid arguments for {}: missing required argument `{}`",
                        decl.name, p.name
                    )));
                }
                Some(v) => match p.ty.accept(v) {
                    Some(c) => {
                        canon.insert(p.name.clone(), c);
                    }
                    None => {
                        return Err(schema(format!(
                            "invalid arguments for {}: argument `{}` must be {} {}, found {v}",
                            decl.name,
                            p.name,
                            article(p.ty.as_str()),
                            p.ty.as_str()
                        )));
                    }
                },
            }
        }

        let features = if ctx.features.is_empty() {
            self.env.features(ctx.task_index)
        } else {
            ctx.features.clone()
        };
        if let Some(rule) = decl
            .rules
            .iter()
            .find(|r| matches(&r.when, &features) && !r.require.holds(&canon))
        {
            return Err(fail(
                rule.error,
                FailureCategory::Strategy,
                rule.message.clone(),
            ));
        }
        let input = match ctx.input.as_ref().and_then(Value::as_object) {
            Some(m) => strings_of(m),
            None => self.env.input(ctx.task_index, &features),
        };
        let value = render_returns(decl, ctx.task_index, &features, &input)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect::<Map<_, _>>();
        Ok(ToolOutput {
            value: Value::Object(value),
            latency_ms,
            cost,
        })
    }
}

impl Tool for AgentTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move { self.run(&args, ctx) })
    }
}

/// The registry's spec of a tool: its params as a JSON Schema, its idempotence and cost.
fn tool_spec(t: &ToolDecl) -> ToolSpec {
    let props: Map<String, Value> = t
        .params
        .iter()
        .map(|p| (p.name.clone(), json!({ "type": p.ty.as_str() })))
        .collect();
    let required: Vec<&str> = t
        .params
        .iter()
        .filter(|p| !p.optional)
        .map(|p| p.name.as_str())
        .collect();
    ToolSpec {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: json!({
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": false,
        }),
        idempotent: t.idempotent,
        cost: CostModel {
            per_call: t.cost,
            expected_latency_ms: t.latency_ms,
        },
        rate_limit: None,
    }
}

fn article(ty: &str) -> &'static str {
    if ty.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The message of an infrastructure fault of `class`, as a real server or network says it.
pub fn infra_message(class: ErrorClass, u: f64) -> &'static str {
    match class {
        ErrorClass::TransientNetwork if u < 0.5 => "connection reset by peer",
        ErrorClass::TransientNetwork => "HTTP 503 Service Unavailable",
        ErrorClass::RateLimit => "429 Too Many Requests",
        ErrorClass::Timeout => "HTTP 504 Gateway Timeout",
        ErrorClass::Auth => "401 Unauthorized: the access token expired",
        ErrorClass::SchemaMismatch
        | ErrorClass::NotFound
        | ErrorClass::ToolNotFit
        | ErrorClass::DeterministicFailure => "HTTP 500 Internal Server Error",
    }
}

/// An input object's values as strings.
pub(super) fn strings_of(m: &Map<String, Value>) -> BTreeMap<String, String> {
    m.iter()
        .map(|(k, v)| {
            let s = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), s)
        })
        .collect()
}

/// A tool's `returns` rendered for a task.
pub(super) fn render_returns(
    t: &ToolDecl,
    index: u64,
    features: &BTreeMap<String, String>,
    input: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let fields = BTreeMap::new();
    let v = Values {
        index,
        features,
        input,
        fields: &fields,
    };
    t.returns
        .iter()
        .map(|(k, tpl)| (k.clone(), tpl.render(&v)))
        .collect()
}

/// A call's arguments in canonical form (each converted to its parameter's type; unknown or
/// mistyped ones left out).
pub(super) fn canonical_args(t: &ToolDecl, args: &Value) -> BTreeMap<String, Value> {
    let Some(obj) = args.as_object() else {
        return BTreeMap::new();
    };
    obj.iter()
        .filter_map(|(k, v)| Some((k.clone(), t.param(k)?.ty.accept(v)?)))
        .collect()
}
