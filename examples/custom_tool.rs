//! Custom Rust tools in a workflow of your own: two tools implement `hindsight::tools::Tool`
//! (each with a JSON schema for its arguments), are registered in `RuntimeOptions::registry`,
//! and serve a two-stage workflow (`WorkflowSource::Custom`) whose stages have two arms each.
//! Tasks come from two kinds of invoice (clean PDFs and scans). The cheap `regex` reader fails on
//! scans (its output fails the workflow's output check and the run is replanned); the
//! `layout_model` reader always works but is slow and costly. The example prints which arms the
//! policy's first plan chose, window by window, so you can watch it learn the better arm per kind
//! of invoice, and the greedy plan it settled on for each.
//!
//! Run it with `cargo run --example custom_tool`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hindsight::Task;
use hindsight::run::workflow::{OutputCheck, WorkflowArm, WorkflowStage};
use hindsight::store::Durability;
use hindsight::taxonomy::{ErrorClass, FailureCategory};
use hindsight::tools::sim::RewardConfig;
use hindsight::tools::{
    CallContext, CostModel, Tool, ToolError, ToolFuture, ToolOutput, ToolRegistry, ToolSpec,
};
use hindsight_actors::policy::PolicyMsg;
use hindsight_actors::runtime::{Runtime, RuntimeOptions, WorkflowSource};
use serde_json::{Map, Value, json};

/// Any error of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reads an invoice's total: `layout_model` (slow, costly, always right) or `regex` (fast and
/// cheap, but finds no total in a scanned image).
pub struct InvoiceReader {
    spec: ToolSpec,
}

impl InvoiceReader {
    /// The tool with its argument schema.
    pub fn new() -> InvoiceReader {
        let mut spec = ToolSpec::new("invoice_reader", "Reads the total of an invoice.");
        spec.input_schema = json!({
            "type": "object",
            "properties": {
                "strategy": {"enum": ["layout_model", "regex"]},
                "dpi": {"type": "integer", "minimum": 72, "maximum": 600}
            },
            "required": ["strategy"],
            "additionalProperties": false
        });
        spec.idempotent = true;
        spec.cost = CostModel {
            per_call: 0.01,
            expected_latency_ms: 200.0,
        };
        InvoiceReader { spec }
    }
}

impl Default for InvoiceReader {
    fn default() -> Self {
        InvoiceReader::new()
    }
}

/// The invoice total of a task (deterministic per task).
fn total_cents(ctx: &CallContext) -> u64 {
    1_000 + (ctx.task_index * 7_919) % 90_000
}

impl Tool for InvoiceReader {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let scanned = ctx.features.get("source").map(String::as_str) == Some("scan");
            match args["strategy"].as_str() {
                Some("layout_model") => Ok(ToolOutput {
                    value: json!({"total_cents": total_cents(ctx), "reader": "layout_model"}),
                    latency_ms: 450.0,
                    cost: 0.03,
                }),
                // A scan has no text layer: the regex finds nothing, and the output check
                // (the workflow's data contract) rejects the stage.
                Some("regex") if scanned => Ok(ToolOutput {
                    value: json!({"total_cents": null, "reader": "regex"}),
                    latency_ms: 15.0,
                    cost: 0.0005,
                }),
                Some("regex") => Ok(ToolOutput {
                    value: json!({"total_cents": total_cents(ctx), "reader": "regex"}),
                    latency_ms: 15.0,
                    cost: 0.0005,
                }),
                other => Err(ToolError::new(
                    ErrorClass::SchemaMismatch,
                    FailureCategory::Strategy,
                    format!("unknown strategy {other:?}"),
                )),
            }
        })
    }
}

/// Converts a total to US dollars: `daily_rate` (cached, fast) or `live_quote` (a slow, costly
/// quote that gives the same figure).
pub struct FxConverter {
    spec: ToolSpec,
}

impl FxConverter {
    /// The tool with its argument schema.
    pub fn new() -> FxConverter {
        let mut spec = ToolSpec::new("fx_convert", "Converts an amount to USD.");
        spec.input_schema = json!({
            "type": "object",
            "properties": {"strategy": {"enum": ["daily_rate", "live_quote"]}},
            "required": ["strategy"],
            "additionalProperties": false
        });
        spec.idempotent = true;
        FxConverter { spec }
    }
}

impl Default for FxConverter {
    fn default() -> Self {
        FxConverter::new()
    }
}

impl Tool for FxConverter {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            let usd = total_cents(ctx) * 108 / 100;
            let (latency_ms, cost) = match args["strategy"].as_str() {
                Some("daily_rate") => (5.0, 0.0),
                Some("live_quote") => (350.0, 0.02),
                other => {
                    return Err(ToolError::new(
                        ErrorClass::SchemaMismatch,
                        FailureCategory::Strategy,
                        format!("unknown strategy {other:?}"),
                    ));
                }
            };
            Ok(ToolOutput {
                value: json!({"usd_cents": usd}),
                latency_ms,
                cost,
            })
        })
    }
}

fn arm(tool: &str, strategy: &str, params: Value) -> WorkflowArm {
    WorkflowArm {
        tool: tool.to_string(),
        strategy: strategy.to_string(),
        params: match params {
            Value::Object(map) => map,
            _ => Map::new(),
        },
    }
}

/// The workflow: read the total, then convert it.
pub fn stages() -> Vec<WorkflowStage> {
    vec![
        WorkflowStage::tools(
            "read",
            vec![
                arm("invoice_reader", "layout_model", json!({"dpi": 300})),
                arm("invoice_reader", "regex", json!({})),
            ],
        ),
        WorkflowStage::tools(
            "convert",
            vec![
                arm("fx_convert", "daily_rate", json!({})),
                arm("fx_convert", "live_quote", json!({})),
            ],
        ),
    ]
}

/// Checks each stage's output (the data contract of the workflow).
pub fn check() -> OutputCheck {
    Arc::new(|_, stage: &str, output: &Value| match stage {
        "read" if output["total_cents"].as_u64().is_some() => Ok(()),
        "read" => Err(format!("read: no integer `total_cents` in {output}")),
        "convert" if output["usd_cents"].as_u64().is_some() => Ok(()),
        "convert" => Err(format!("convert: no integer `usd_cents` in {output}")),
        other => Err(format!("unknown stage `{other}`")),
    })
}

/// The kind of invoice of task `index`: one in three is a scan.
pub fn source(index: u64) -> &'static str {
    if index.is_multiple_of(3) {
        "scan"
    } else {
        "pdf"
    }
}

/// Task `index` of the example.
pub fn task(index: u64) -> Task {
    Task {
        // `<name>#<index>` gives the tools `ctx.task_index == index`.
        task_id: format!("invoices#{index}"),
        goal: "total of the invoice in USD".to_string(),
        features: BTreeMap::from([("source".to_string(), source(index).to_string())]),
        ..Task::default()
    }
}

/// One task's first plan and result.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The task index.
    pub index: u64,
    /// The kind of invoice.
    pub source: &'static str,
    /// The first plan's read strategy.
    pub read: String,
    /// The first plan's convert strategy.
    pub convert: String,
    /// Whether the run passed.
    pub passed: bool,
    /// The terminal state.
    pub state: String,
    /// How the triage loop recovered, if it had to (one failure type per recovery).
    pub recoveries: Vec<String>,
    /// The reward.
    pub reward: f64,
}

/// What the example did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Every task, in order.
    pub choices: Vec<Choice>,
    /// The greedy plan learned for each kind of invoice.
    pub greedy: BTreeMap<String, Vec<String>>,
}

/// Runs `tasks` tasks of the invoice workflow with data in `data_dir`.
pub async fn demo(data_dir: &Path, tasks: u64) -> Result<Summary, BoxError> {
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(InvoiceReader::new()))?;
    registry.register(Arc::new(FxConverter::new()))?;
    let workflow = WorkflowSource::Custom {
        name: "invoices".to_string(),
        stages: stages(),
        check: check(),
        reward: RewardConfig {
            success: 1.0,
            latency: 0.3,
            cost: 0.3,
            max_cost: 0.06,
            sla_ms: 1_000.0,
        },
    };
    let mut opts = RuntimeOptions::new(data_dir, workflow);
    opts.registry = registry;
    opts.durability = Durability::None;
    opts.seed = 5;
    let rt = Runtime::start(opts).await?;

    let mut choices = Vec::new();
    for index in 0..tasks {
        let outcome = rt.orchestrate(task(index)).await?;
        let strategy = |stage: &str| {
            outcome
                .arms
                .iter()
                .find(|a| a.stage == stage)
                .map(|a| a.strategy.clone())
                .unwrap_or_default()
        };
        choices.push(Choice {
            index,
            source: source(index),
            read: strategy("read"),
            convert: strategy("convert"),
            passed: outcome.passed,
            state: outcome.state.to_string(),
            recoveries: outcome
                .recoveries
                .iter()
                .map(|r| r.failure.to_string())
                .collect(),
            reward: outcome.reward,
        });
        if !outcome.recoveries.is_empty() || !outcome.passed {
            let recoveries: Vec<String> = outcome
                .recoveries
                .iter()
                .map(|r| format!("{} -> {}", r.failure, r.action))
                .collect();
            println!(
                "{} ({}): first plan {} -> recovered by [{}], {}",
                outcome.task_id,
                source(index),
                strategy("read"),
                recoveries.join(", "),
                outcome.state
            );
        }
    }

    println!("first-plan choices per window of {WINDOW} tasks:");
    println!(
        "{:<8} {:<6} {:>5} {:>18} {:>11} {:>19} {:>12}",
        "tasks",
        "source",
        "runs",
        "read=layout_model",
        "read=regex",
        "convert=daily_rate",
        "mean reward"
    );
    for (w, window) in choices.chunks(WINDOW).enumerate() {
        for src in ["pdf", "scan"] {
            let rows: Vec<&Choice> = window.iter().filter(|c| c.source == src).collect();
            let count = |s: &str| rows.iter().filter(|c| c.read == s).count();
            let mean = rows.iter().map(|c| c.reward).sum::<f64>() / rows.len().max(1) as f64;
            println!(
                "{:<8} {:<6} {:>5} {:>18} {:>11} {:>19} {:>12.3}",
                format!("{}-{}", w * WINDOW, w * WINDOW + window.len() - 1),
                src,
                rows.len(),
                count("layout_model"),
                count("regex"),
                rows.iter().filter(|c| c.convert == "daily_rate").count(),
                mean
            );
        }
    }

    let mut greedy = BTreeMap::new();
    for src in ["pdf", "scan"] {
        let features = BTreeMap::from([("source".to_string(), src.to_string())]);
        let (plan, estimate) = rt
            .ctx()
            .dir
            .policy
            .call(|reply| PolicyMsg::Greedy {
                features: features.clone(),
                reply,
            })
            .await?;
        println!(
            "learned plan for {src:<4}: {} (estimated reward {estimate:.3})",
            plan.join(" -> ")
        );
        greedy.insert(src.to_string(), plan);
    }
    rt.shutdown().await;
    Ok(Summary { choices, greedy })
}

/// Tasks per printed window.
const WINDOW: usize = 15;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    demo(dir.path(), 90).await?;
    Ok(())
}
