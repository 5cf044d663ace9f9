//! `hindsight agents list`: the agents a configuration describes (`[[agent]]`), each with its
//! variants: the model endpoint, the tool patterns it offers, its budget of turns.

use std::path::PathBuf;

use super::Failure;

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
}

/// Runs `hindsight agents`.
pub fn run(args: Args) -> Result<(), Failure> {
    let AgentsCommand::List { config, json } = args.command;
    let config =
        hindsight::config::Config::load(Some(&config)).map_err(|e| Failure::new(e.to_string()))?;
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
        outln!("  max_turns {}", agent.stage.max_turns)?;
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
