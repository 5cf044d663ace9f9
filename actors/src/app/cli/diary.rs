//! `hindsight diary ...`: reading the episodic diary.

use clap::Subcommand;
use hindsight::store::StoreOptions;

use super::data::{format_time, open_existing};
use super::{Failure, Global, print_json};

/// `hindsight diary ...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: DiaryCommand,
}

#[derive(Debug, Subcommand)]
enum DiaryCommand {
    /// Print the last entries, oldest first. A damaged entry is reported on stderr with its key
    /// and skipped; the command still succeeds.
    Tail {
        /// How many entries.
        #[arg(short = 'n', long = "lines", default_value_t = 20)]
        n: usize,
        /// Print a JSON array instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `hindsight diary ...`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        DiaryCommand::Tail { n, json } => tail(global, n, json),
    }
}

fn tail(global: &Global, n: usize, json: bool) -> Result<(), Failure> {
    let store = open_existing(&global.data, StoreOptions::default())?;
    let mut good = Vec::new();
    for entry in store.diary_tail(n)? {
        match entry {
            Ok(e) => {
                if !json {
                    let run = e.run_id.as_deref().unwrap_or("-");
                    let tags = if e.tags.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", e.tags.join(", "))
                    };
                    outln!(
                        "#{} {} {} run={} {}{}",
                        e.seq,
                        format_time(e.time_ms),
                        e.kind,
                        run,
                        e.text,
                        tags
                    )?;
                }
                good.push(e);
            }
            Err(err) => eprintln!("warning: {err}; skipped"),
        }
    }
    if json {
        print_json(&good)?;
    }
    Ok(())
}
