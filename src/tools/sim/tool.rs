//! A simulated tool: one per tool name of an environment's arms. It takes the strategy (and the
//! arm's params) in its arguments and the stage, task, attempt and call from the context, draws
//! the outcome from the seeded RNG of that call, and reports virtual latency and cost.

use serde_json::{Map, Value, json};

use super::rng::{call_rng, pick_weighted};
use super::{Arm, SimEnv, Stage};
use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::tools::tool::{
    CallContext, CostModel, Tool, ToolError, ToolFuture, ToolOutput, ToolSpec,
};

/// Log-scale spread of the simulated latency.
pub const LATENCY_SIGMA: f64 = 0.25;

/// A tool of a simulated environment.
#[derive(Debug)]
pub struct SimTool {
    env: SimEnv,
    spec: ToolSpec,
}

impl SimTool {
    /// The tool named `name` of `env`.
    pub fn new(env: SimEnv, name: &str) -> SimTool {
        let arms: Vec<(&Stage, &Arm)> = env
            .stages()
            .iter()
            .flat_map(|s| s.arms.iter().map(move |a| (s, a)))
            .filter(|(_, a)| a.tool == name)
            .collect();
        let mut strategies: Vec<&str> = Vec::new();
        let mut props = Map::new();
        for (_, a) in &arms {
            if !strategies.contains(&a.strategy.as_str()) {
                strategies.push(&a.strategy);
            }
            for (k, v) in &a.params {
                let ty = match v {
                    Value::Bool(_) => "boolean",
                    Value::Number(_) => "number",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                    Value::Null => "null",
                };
                props.insert(k.clone(), json!({ "type": ty }));
            }
        }
        props.insert(
            "strategy".into(),
            json!({ "type": "string", "enum": strategies }),
        );
        let n = arms.len().max(1) as f64;
        let cost = CostModel {
            per_call: arms.iter().map(|(_, a)| a.numbers.cost).sum::<f64>() / n,
            expected_latency_ms: arms.iter().map(|(_, a)| a.numbers.latency_ms).sum::<f64>() / n,
        };
        let mut stages: Vec<&str> = Vec::new();
        for (s, _) in &arms {
            if !stages.contains(&s.name.as_str()) {
                stages.push(&s.name);
            }
        }
        let spec = ToolSpec {
            name: name.to_string(),
            description: format!(
                "Simulated tool `{name}` of environment `{}` (stages: {}; strategies: {})",
                env.name(),
                stages.join(", "),
                strategies.join(", ")
            ),
            input_schema: json!({
                "type": "object",
                "properties": Value::Object(props),
                "required": ["strategy"],
                "additionalProperties": false,
            }),
            idempotent: true,
            cost,
            rate_limit: None,
        };
        SimTool { env, spec }
    }

    fn run(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let name = &self.spec.name;
        let strategy_err =
            |m: String| ToolError::new(ErrorClass::SchemaMismatch, FailureCategory::Strategy, m);
        let strategy = args
            .get("strategy")
            .and_then(Value::as_str)
            .ok_or_else(|| strategy_err(format!("{name}: argument `strategy` must be a string")))?;
        let stages = self.env.stages();
        let stage = if ctx.stage.is_empty() {
            let mut it = stages.iter().filter(|s| {
                s.arms
                    .iter()
                    .any(|a| &a.tool == name && a.strategy == strategy)
            });
            match (it.next(), it.next()) {
                (Some(s), None) => s,
                (None, _) => {
                    return Err(strategy_err(format!(
                        "{name}: no stage has strategy `{strategy}`"
                    )));
                }
                (Some(_), Some(_)) => {
                    return Err(strategy_err(format!(
                        "{name}: strategy `{strategy}` serves several stages; the call context must name the stage"
                    )));
                }
            }
        } else {
            stages.iter().find(|s| s.name == ctx.stage).ok_or_else(|| {
                ToolError::new(
                    ErrorClass::NotFound,
                    FailureCategory::Strategy,
                    format!(
                        "{name}: environment `{}` has no stage `{}`",
                        self.env.name(),
                        ctx.stage
                    ),
                )
            })?
        };
        let arm = match stage
            .arms
            .iter()
            .find(|a| &a.tool == name && a.strategy == strategy)
        {
            Some(a) => a,
            None if stage.arms.iter().any(|a| &a.tool == name) => {
                return Err(strategy_err(format!(
                    "{name}: strategy `{strategy}` is not one of this tool's strategies at stage `{}`",
                    stage.name
                )));
            }
            None => {
                return Err(ToolError::new(
                    ErrorClass::ToolNotFit,
                    FailureCategory::Strategy,
                    format!("{name}: tool does not serve stage `{}`", stage.name),
                ));
            }
        };
        if let Some(obj) = args.as_object() {
            for (k, v) in obj {
                if k == "strategy" {
                    continue;
                }
                match arm.params.get(k) {
                    Some(p) if p == v => {}
                    Some(p) => {
                        return Err(strategy_err(format!(
                            "{name}: argument `{k}` = {v} contradicts strategy `{strategy}` ({k} = {p})"
                        )));
                    }
                    None => {
                        return Err(strategy_err(format!(
                            "{name}: unexpected argument `{k}` for strategy `{strategy}`"
                        )));
                    }
                }
            }
        }

        let features = if ctx.features.is_empty() {
            self.env.draw_task(self.env.seed(), ctx.task_index).features
        } else {
            ctx.features.clone()
        };
        let spec = self.env.spec();
        let n = spec.numbers(stage, arm, ctx.task_index, &features);
        let mut rng = call_rng(
            self.env.seed(),
            ctx.task_index,
            ctx.attempt,
            &stage.name,
            ctx.call,
        );
        // Fixed draw order, so that every arm sees the same uniforms for the same call.
        let (u_infra, u_infra_class, u_success, u_error_class, u_valid) =
            (rng.f64(), rng.f64(), rng.f64(), rng.f64(), rng.f64());
        let latency_ms = lognormal_latency(n.latency_ms, &mut rng);
        let cost = n.cost;
        let u_rows = rng.f64();
        let u_bad = rng.f64();
        let u_retry = rng.f64();

        let p_infra = n.p_infra.unwrap_or(spec.infra.p_fault);
        if u_infra < p_infra {
            let class = spec.infra.pick(u_infra_class);
            let retry_after = retry_after_ms(class, u_retry);
            return Err(ToolError::new(
                class,
                FailureCategory::Infrastructure,
                format!(
                    "{name}/{strategy} at stage `{}`: simulated infrastructure fault ({class})",
                    stage.name
                ),
            )
            .with_retry_after(retry_after)
            .with_usage(latency_ms, cost));
        }
        if u_success >= n.p_success {
            let weights: Vec<f64> = n.errors.iter().map(|(_, w)| *w).collect();
            let class = pick_weighted(&weights, u_error_class)
                .and_then(|i| n.errors.get(i))
                .map(|(c, _)| *c)
                .unwrap_or(ErrorClass::DeterministicFailure);
            // The arm's own failure, whatever its class: FORMAT.md counts it against the arm
            // (it is part of `1 - p_success`), so the policy must learn from it.
            let category = FailureCategory::Strategy;
            let retry_after = retry_after_ms(class, u_retry);
            return Err(ToolError::new(
                class,
                category,
                format!(
                    "{name}/{strategy} failed at stage `{}`: {}",
                    stage.name,
                    describe(class)
                ),
            )
            .with_retry_after(retry_after)
            .with_usage(latency_ms, cost));
        }
        let valid = u_valid < n.p_valid;
        let value = make_output(
            self.env.name(),
            &stage.name,
            name,
            strategy,
            ctx.task_index,
            valid,
            u_rows,
            u_bad,
        );
        Ok(ToolOutput {
            value,
            latency_ms,
            cost,
        })
    }
}

/// A latency drawn lognormal around `median` (sigma [`LATENCY_SIGMA`]), from two uniforms of
/// `rng` (Box-Muller).
pub fn lognormal_latency(median: f64, rng: &mut fastrand::Rng) -> f64 {
    let (u1, u2) = (1.0 - rng.f64(), rng.f64());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    median * (LATENCY_SIGMA * z).exp()
}

/// The Retry-After hint of a failure of `class` (a rate limit asks for 200 to 2,000 ms), from a
/// uniform `u`.
pub fn retry_after_ms(class: ErrorClass, u: f64) -> Option<u64> {
    (class == ErrorClass::RateLimit).then(|| 200 + (u * 1800.0) as u64)
}

fn describe(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Timeout => "the operation timed out",
        ErrorClass::RateLimit => "rate limit exceeded",
        ErrorClass::Auth => "credentials rejected",
        ErrorClass::SchemaMismatch => "output did not match the expected schema",
        ErrorClass::NotFound => "input not found",
        ErrorClass::ToolNotFit => "the tool cannot handle this input",
        ErrorClass::TransientNetwork => "connection reset",
        ErrorClass::DeterministicFailure => "the tool failed on this input",
    }
}

impl Tool for SimTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move { self.run(&args, ctx) })
    }
}

const COLUMNS: [&str; 3] = ["n", "field", "check"];

fn check_of(n: u64, field: &str) -> u64 {
    (n * 31 + field.bytes().map(u64::from).sum::<u64>()) % 97
}

#[allow(clippy::too_many_arguments)]
fn make_output(
    env: &str,
    stage: &str,
    tool: &str,
    strategy: &str,
    task_index: u64,
    valid: bool,
    u_rows: f64,
    u_bad: f64,
) -> Value {
    let count = 3 + (u_rows * 5.0) as u64;
    let bad = ((u_bad * count as f64) as u64).min(count - 1);
    let rows: Vec<Value> = (0..count)
        .map(|n| {
            let field = format!("{stage}-{task_index}-{n}");
            let mut check = check_of(n, &field);
            if !valid && n == bad {
                check = (check + 1 + (n % 7)) % 97;
            }
            json!([n, field, check])
        })
        .collect();
    json!({
        "env": env,
        "stage": stage,
        "tool": tool,
        "strategy": strategy,
        "task_index": task_index,
        "columns": COLUMNS,
        "rows": rows,
    })
}

/// Checks a simulated output of `stage`; the error names the stage and why.
pub fn validate(stage: &str, output: &Value) -> Result<(), String> {
    let obj = output
        .as_object()
        .ok_or_else(|| format!("stage `{stage}`: output is not an object"))?;
    match obj.get("stage").and_then(Value::as_str) {
        Some(s) if s == stage => {}
        Some(s) => return Err(format!("stage `{stage}`: output belongs to stage `{s}`")),
        None => return Err(format!("stage `{stage}`: output has no `stage`")),
    }
    let rows = obj
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("stage `{stage}`: output has no `rows` array"))?;
    if rows.is_empty() {
        return Err(format!("stage `{stage}`: output has no rows"));
    }
    for (i, row) in rows.iter().enumerate() {
        let cells = row
            .as_array()
            .filter(|c| c.len() == COLUMNS.len())
            .ok_or_else(|| {
                format!(
                    "stage `{stage}`: row {i} does not have {} cells",
                    COLUMNS.len()
                )
            })?;
        let (Some(n), Some(field), Some(check)) =
            (cells[0].as_u64(), cells[1].as_str(), cells[2].as_u64())
        else {
            return Err(format!(
                "stage `{stage}`: row {i} has cells of the wrong types"
            ));
        };
        let expected = check_of(n, field);
        if check != expected {
            return Err(format!(
                "stage `{stage}`: row {i} fails its check digit (expected {expected}, found {check}): the output is corrupt"
            ));
        }
    }
    Ok(())
}
