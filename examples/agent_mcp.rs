//! An agent over a real MCP server, embedded: the tools of `@modelcontextprotocol/server-everything`
//! (installed on first use, as `mcp_tools` installs it) are offered to a model by an agent stage
//! run by the supervision tree; each task's answer comes back with its provenance.
//!
//! The model is an OpenAI-compatible server when `HINDSIGHT_MODEL_URL` is set (with
//! `HINDSIGHT_MODEL`, `HINDSIGHT_MODEL_API_KEY`), else the offline rule-based model, which calls
//! each offered tool once with the arguments the task's input names and answers with the results.
//!
//! Run it with `cargo run --example agent_mcp`.

/// The server's installer (the `mcp_tools` example).
#[allow(dead_code)]
#[path = "mcp_tools.rs"]
pub mod mcp_tools;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use hindsight::Task;
use hindsight::model::LanguageModel;
use hindsight::model::openai::{OpenAiClient, OpenAiConfig};
use hindsight::model::rule::RuleModel;
use hindsight::run::workflow::AgentConfig;
use hindsight::run::{AgentStage, AgentVariant};
use hindsight::tools::mcp::McpServer;
use hindsight::tools::{McpServerConfig, ToolRegistry};
use hindsight_actors::app::backend::agent_workflow;
use hindsight_actors::runtime::{Runtime, RuntimeOptions};
use serde_json::json;

pub use mcp_tools::BoxError;

/// One task's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The run's state.
    pub state: String,
    /// The agent's answer.
    pub answer: String,
    /// The plan (model and variant) it ran.
    pub plan_id: Option<String>,
    /// Attempts made.
    pub attempts: u32,
}

/// The agent: `echo` and `get-sum` of the server registered as `everything`.
pub fn agent() -> AgentConfig {
    AgentConfig {
        name: "everything".into(),
        stage: AgentStage {
            description: "Echoes a message and adds two numbers".into(),
            instructions: "You answer by calling the tools of the everything server, then say \
                           what they returned."
                .into(),
            variants: vec![AgentVariant {
                name: "default".into(),
                model: "model".into(),
                prompt: None,
                tools: vec!["everything/echo".into(), "everything/get-sum".into()],
                temperature: Some(0.0),
            }],
            max_turns: 6,
            answer_schema: None,
            // A small local model may generate until its context is full without it.
            max_turn_tokens: Some(256),
            max_tokens: None,
            max_cost: None,
            max_wall_ms: None,
        },
    }
}

/// Starts server-everything from `index`, runs `tasks` tasks on the agent in a tree whose data
/// lives under `data`, and returns their answers.
pub async fn demo(index: &Path, data: &Path, tasks: u64) -> Result<Vec<Answer>, BoxError> {
    let mut config = McpServerConfig::new(
        "everything",
        "node",
        vec![index.display().to_string(), "stdio".into()],
    );
    config.tool_prefix = Some("everything".into());
    let server = McpServer::connect(config).await?;
    let mut registry = ToolRegistry::new();
    for tool in server.tools() {
        registry.register(tool)?;
    }
    let model: Arc<dyn LanguageModel> = match OpenAiConfig::from_env() {
        Some(config) => Arc::new(OpenAiClient::new(config)?),
        None => Arc::new(RuleModel::new()),
    };
    println!("model: {}", model.name());
    let mut opts = RuntimeOptions::new(data, agent_workflow(&agent()));
    opts.registry = registry;
    opts.models.insert("model", model);
    let rt = Runtime::start(opts).await?;
    let mut answers = Vec::new();
    for i in 0..tasks {
        let task = Task {
            task_id: format!("everything-{i}"),
            goal: "Echo the message, then add the two numbers".into(),
            input: Some(json!({"message": format!("hello {i}"), "a": i, "b": 10})),
            ..Task::default()
        };
        let out = rt.orchestrate(task).await?;
        let answer = out
            .output
            .as_ref()
            .and_then(|o| o["everything"]["answer"].as_str())
            .unwrap_or("")
            .to_string();
        println!(
            "{}: {} in {} attempt(s), plan {}\n  {}",
            out.task_id,
            out.state.as_str(),
            out.attempts,
            out.plan_id.as_deref().unwrap_or("-"),
            out.reason
                .as_deref()
                .map_or_else(|| answer.replace('\n', "\n  "), str::to_string)
        );
        answers.push(Answer {
            state: out.state.as_str().to_string(),
            answer,
            plan_id: out.plan_id,
            attempts: out.attempts,
        });
    }
    rt.shutdown().await;
    Ok(answers)
}

#[tokio::main]
async fn main() -> ExitCode {
    let index = match mcp_tools::install_everything() {
        Ok(index) => index,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let data = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot make a data folder: {e}");
            return ExitCode::FAILURE;
        }
    };
    match demo(&index, data.path(), 3).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
