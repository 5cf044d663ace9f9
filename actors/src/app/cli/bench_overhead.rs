//! `hindsight bench overhead`.

use std::path::PathBuf;

use hindsight_actors::app::demo::load_env;
use hindsight_actors::app::overhead::{self, Load};

use super::{Failure, Global, print_json};

/// `hindsight bench overhead [--runs N] [--experiences N] [--lessons N] [--sops N]
/// [--unfinished N] [--json]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs measured, one at a time.
    #[arg(long, default_value_t = 1000)]
    pub runs: u64,
    /// Experiences in the prepared store's log (the size of your own store's, to measure at it).
    #[arg(long, default_value_t = Load::default().experiences)]
    pub experiences: u64,
    /// Lessons in the prepared store (20 in each user's scope).
    #[arg(long, default_value_t = Load::default().lessons)]
    pub lessons: u64,
    /// Stable SOPs in the prepared store.
    #[arg(long, default_value_t = Load::default().sops)]
    pub sops: u64,
    /// Unfinished runs the resume measurement starts with.
    #[arg(long, default_value_t = Load::default().unfinished)]
    pub unfinished: u64,
    /// The environment whose stages and tasks the runs have (default: bank statements).
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hindsight bench overhead`.
pub async fn run(_global: &Global, args: Args) -> Result<(), Failure> {
    // What goes wrong in the tree (a run that ends before its first call, say) on stderr.
    hindsight_actors::app::telemetry::init(hindsight::config::LogFormat::Text, "warn")
        .map_err(|e| Failure::new(e.to_string()))?;
    let env = load_env(args.env.as_deref()).map_err(|e| Failure::new(e.to_string()))?;
    let load = Load {
        experiences: args.experiences,
        lessons: args.lessons,
        sops: args.sops,
        unfinished: args.unfinished,
    };
    let b = overhead::overhead(&env, args.runs.max(1), load)
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    if args.json {
        return print_json(&b);
    }
    outln!(
        "store: {} experiences, {} lessons, {} stable SOPs (prepared in {:.1} s)",
        b.load.experiences,
        b.load.lessons,
        b.load.sops,
        b.prepare_seconds
    )?;
    for (kind, f) in [
        ("a tool that is not idempotent", b.write_ahead),
        ("an agent's model turn", b.model_turn),
    ] {
        outln!(
            "submission to the first call, {kind} ({} runs, one at a time): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            f.runs,
            f.p50_ms,
            f.p99_ms,
            f.max_ms
        )?;
    }
    outln!(
        "start to {} unfinished runs resumed: {:.3} s (the start itself {:.3} s); {} made their first tool call again, {} ended before it",
        b.load.unfinished,
        b.resume_seconds,
        b.start_seconds,
        b.resumed_to_first_call,
        b.ended_before_first_call
    )
}
