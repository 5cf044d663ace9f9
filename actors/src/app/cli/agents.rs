//! `hindsight agents`: `list` shows the agents a configuration describes (`[[agent]]`), each with
//! its variants (the model endpoint, the tool patterns it offers) and budgets; `run` starts the
//! daemon's trees in this process and runs one task on an agent by name, as
//! `POST /agents/{name}/runs` does.

use std::path::PathBuf;

use super::{Failure, Global};

/// Arguments of `hindsight agents`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: AgentsCommand,
}

/// The `agents` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AgentsCommand {
    /// List the agents of a configuration.
    List {
        /// The configuration file (its `[[agent]]` blocks and `[models.NAME]` endpoints).
        #[arg(long)]
        config: PathBuf,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run one task on an agent (its trees started in this process, on the configuration's
    /// data; stop the daemon first, which holds the same stores).
    Run {
        /// The agent's name.
        name: String,
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
        /// What the task is for, in words.
        #[arg(long)]
        goal: String,
        /// The task's input object, as JSON.
        #[arg(long)]
        input: Option<String>,
        /// A feature of the task, `key=value` (repeatable).
        #[arg(long = "feature", value_name = "KEY=VALUE")]
        features: Vec<String>,
        /// The task's id (a run of that id already made is answered from the store).
        #[arg(long)]
        task_id: Option<String>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `hindsight agents`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        AgentsCommand::List { config, json } => list(&config, json),
        AgentsCommand::Run {
            name,
            config,
            goal,
            input,
            features,
            task_id,
            json,
        } => {
            let input = input
                .map(|text| {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .map_err(|e| Failure::new(format!("--input: not JSON: {e}")))
                })
                .transpose()?;
            if input.as_ref().is_some_and(|i| !i.is_object()) {
                return Err(Failure::new("--input: must be a JSON object"));
            }
            let mut task = hindsight::Task {
                task_id: task_id.unwrap_or_else(|| format!("cli-{:x}", hindsight::now_ms())),
                goal,
                input,
                ..hindsight::Task::default()
            };
            for f in features {
                let Some((k, v)) = f.split_once('=') else {
                    return Err(Failure::new(format!("--feature: `{f}` is not KEY=VALUE")));
                };
                task.features
                    .insert(k.trim().to_string(), v.trim().to_string());
            }
            run_task(global, &config, &name, task, json).await
        }
    }
}

/// Starts the daemon's trees, runs `task` on agent `name`, prints its outcome and stops them.
/// `--data DIR` other than the default overrides `data_dir` of the configuration, as for
/// `hindsight serve`.
async fn run_task(
    global: &Global,
    config: &std::path::Path,
    name: &str,
    task: hindsight::Task,
    json: bool,
) -> Result<(), Failure> {
    let mut config =
        hindsight::config::Config::load(Some(config)).map_err(|e| Failure::new(e.to_string()))?;
    if global.data != hindsight_actors::runtime::default_data_dir() {
        config.data_dir = global.data.clone();
    }
    if !config.agents.iter().any(|a| a.name == name) {
        let names: Vec<&str> = config.agents.iter().map(|a| a.name.as_str()).collect();
        return Err(Failure::new(format!(
            "no agent `{name}` in the configuration (its agents: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )));
    }
    let daemon = hindsight_actors::app::backend::Daemon::start(&config)
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    let outcome = daemon.run_task(name, task).await;
    daemon.shutdown().await;
    let outcome = outcome.map_err(|e| Failure::new(e.to_string()))?;
    if json {
        super::print_json(&outcome)?;
        return Ok(());
    }
    outln!(
        "run {}: {} after {} attempt(s), plan {}",
        super::printable(&outcome.run_id),
        outcome.state.as_str(),
        outcome.attempts,
        super::printable(outcome.plan_id.as_deref().unwrap_or("none"))
    )?;
    if let Some(reason) = &outcome.reason {
        outln!("reason: {}", super::printable(reason))?;
    }
    let answer = outcome.output.as_ref().and_then(|o| o.get(name)).map(|a| {
        match a.get("answer").and_then(serde_json::Value::as_str) {
            Some(text) => text.to_string(),
            None => a.to_string(),
        }
    });
    if let Some(answer) = answer {
        outln!("answer: {}", super::printable(&answer))?;
    }
    Ok(())
}

/// Lists the agents of `config`.
fn list(config: &std::path::Path, json: bool) -> Result<(), Failure> {
    let config =
        hindsight::config::Config::load(Some(config)).map_err(|e| Failure::new(e.to_string()))?;
    if json {
        let text = serde_json::to_string_pretty(&config.agents)
            .map_err(|e| Failure::new(format!("cannot write the agents as JSON: {e}")))?;
        outln!("{text}")?;
        return Ok(());
    }
    if config.agents.is_empty() {
        outln!("no [[agent]] in the configuration")?;
    }
    for agent in &config.agents {
        outln!("{}: {}", agent.name, agent.stage.description)?;
        let a = &agent.stage;
        let or_none = |v: Option<String>| v.unwrap_or_else(|| "none".to_string());
        outln!(
            "  budgets: max_turns {}, max_tokens {}, max_cost {}, max_wall_ms {}",
            a.max_turns,
            or_none(a.max_tokens.map(|v| v.to_string())),
            or_none(a.max_cost.map(|v| v.to_string())),
            or_none(a.max_wall_ms.map(|v| v.to_string()))
        )?;
        let callees = agent.callees();
        if !callees.is_empty() {
            outln!("  calls agents: {}", callees.join(", "))?;
        }
        for v in &agent.stage.variants {
            let endpoint = match config
                .models
                .get(&v.model)
                .and_then(|m| m.base_url.as_deref())
            {
                Some(url) => url.to_string(),
                None => "offline rule-based model".to_string(),
            };
            outln!(
                "  variant {}: model {} ({endpoint}), tools {}",
                v.name,
                v.model,
                v.tools.join(", ")
            )?;
        }
    }
    Ok(())
}
