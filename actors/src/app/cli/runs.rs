//! `hindsight runs ...`: listing runs (ids printed with their control characters escaped).

use clap::Subcommand;
use hindsight::store::StoreOptions;

use super::data::{format_time, open_existing};
use super::{Failure, Global, print_json, printable};

/// `hindsight runs ...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: RunsCommand,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// List every run, by id. A damaged run record is reported on stderr and skipped.
    List {
        /// Print a JSON array of runs (`run_id`, `task_id`, `state`, `attempts`, ...).
        #[arg(long)]
        json: bool,
    },
}

/// Runs `hindsight runs ...`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        RunsCommand::List { json } => list(global, json),
    }
}

fn list(global: &Global, json: bool) -> Result<(), Failure> {
    let store = open_existing(&global.data, StoreOptions::default())?;
    let mut runs = Vec::new();
    for run in store.list_runs()? {
        match run {
            Ok(r) => runs.push(r),
            Err(err) => eprintln!("warning: {}; skipped", printable(&err.to_string())),
        }
    }
    if json {
        return print_json(&runs);
    }
    if runs.is_empty() {
        outln!("no runs")?;
        return Ok(());
    }
    outln!(
        "{:<24} {:<20} {:<11} {:>8}  {:<24} reward",
        "run_id",
        "task_id",
        "state",
        "attempts",
        "updated"
    )?;
    for r in runs {
        let reward = r
            .reward
            .map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
        outln!(
            "{:<24} {:<20} {:<11} {:>8}  {:<24} {}",
            printable(&r.run_id),
            printable(&r.task_id),
            r.state.as_str(),
            r.attempts,
            format_time(r.updated_ms),
            reward
        )?;
    }
    Ok(())
}
