//! `hindsight demo`: the main job (see [`hindsight_actors::app::demo`]).

use std::path::PathBuf;

use hindsight::store::Durability;
use hindsight_actors::app::demo::{self, DemoOptions};

use super::{Failure, Global, print_json};

/// `hindsight demo [--env FILE] [--tasks N] [--seed S] [--chaos FILE] [--json]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The simulated environment (default: config/envs/bank_statements.toml, else the embedded
    /// copy).
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Tasks to run (the next ones after what earlier demos on the same data ran).
    #[arg(long, default_value_t = 1000, value_parser = super::parse_tasks)]
    pub tasks: u64,
    /// Seed of the tasks and of every choice.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// A fault plan (see config/chaos.toml).
    #[arg(long, value_name = "FILE")]
    pub chaos: Option<PathBuf>,
    /// Tasks in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the HTML report here (default: DATA/report).
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
}

/// Runs the demo and prints its table (or JSON).
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    let opts = DemoOptions {
        env: args.env,
        tasks: args.tasks,
        seed: args.seed,
        chaos: args.chaos,
        data_dir: global.data.clone(),
        durability: Durability::Immediate,
        concurrency: args.concurrency.max(1),
        progress: !args.json,
        report_dir: args.report,
    };
    let summary = demo::run(&opts)
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    if args.json {
        print_json(&summary)
    } else {
        outln!("{}", demo::render_table(&summary))?;
        outln!("report: {}", summary.report.as_deref().unwrap_or("(none)"))
    }
}
