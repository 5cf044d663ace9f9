//! The command-line interface: global options, the one-sentence [`Failure`] error, and one
//! module per command group.

/// Writes one line on stdout, like `println!`, but returns a [`Failure`] instead of panicking
/// when stdout is gone (a closed pipe ends the command quietly).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_line(format_args!($($arg)*))
    };
}

pub mod agents;
pub mod bench_adaptive;
pub mod bench_overhead;
pub mod bench_store;
pub mod bench_tree;
pub mod classify;
pub mod config;
pub mod data;
pub mod demo;
pub mod diary;
pub mod policy;
pub mod report;
pub mod runs;
pub mod serve;
pub mod store;
pub mod tools;

use std::fmt;
use std::path::PathBuf;

use clap::Subcommand;
use hindsight::store::StoreError;

/// Options every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// The data directory (holds hindsight.redb).
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "./hindsight-data"
    )]
    pub data: PathBuf,
}

/// A command failure: one plain sentence naming the file, key or field at fault. The binary
/// prints it on stderr and exits with code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    sentence: String,
    broken_pipe: bool,
}

impl Failure {
    /// A failure described by `sentence`.
    pub fn new(sentence: impl Into<String>) -> Failure {
        Failure {
            sentence: sentence.into(),
            broken_pipe: false,
        }
    }

    /// Whether the failure is only that the reader of stdout went away (`hindsight ... | head`),
    /// which ends the command quietly and successfully.
    pub fn is_broken_pipe(&self) -> bool {
        self.broken_pipe
    }
}

/// Writes one line on stdout (use the `outln!` macro).
pub fn write_line(args: fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"))
        .map_err(|e| Failure {
            broken_pipe: e.kind() == std::io::ErrorKind::BrokenPipe,
            sentence: format!("cannot write to stdout: {e}"),
        })
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.sentence.trim_end();
        if s.ends_with(['.', '!', '?']) {
            f.write_str(s)
        } else {
            write!(f, "{s}.")
        }
    }
}

impl std::error::Error for Failure {}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::new(e.to_string())
    }
}

/// `text` safe to print on a terminal: each control character (a newline, an escape sequence's
/// ESC) is written escaped (`\n`, `\u{1b}`), so a stored id cannot forge a line or move the
/// cursor; everything else is unchanged.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes `value` as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::new(format!("cannot write the output as JSON: {e}")))?;
    outln!("{text}")
}

/// Parses a `--tasks` count: a whole number of at least 1 (a run of no tasks has no figures).
pub fn parse_tasks(s: &str) -> Result<u64, String> {
    parse_count(s, "tasks")
}

/// Parses a `--runs` count: a whole number of at least 1.
pub fn parse_runs(s: &str) -> Result<u64, String> {
    parse_count(s, "runs")
}

/// A whole number of `what`, at least 1.
fn parse_count(s: &str, what: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "expected a whole number of {what}, at least 1; found `{s}`"
        )),
    }
}

/// `hindsight bench ...`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Durable records/s of the store, with group commit and with one commit per record.
    Store(bench_store::Args),
    /// Full runs/s through the supervision tree, next to raw ractor and tokio baselines.
    Runtime(bench_tree::RuntimeArgs),
    /// Learning KPIs on a simulated environment against its oracle and random baseline.
    Learning(bench_tree::LearningArgs),
    /// Learning in words on a simulated agent environment: repeat errors, lessons, corrections,
    /// model calls and SOP coverage, with one mechanism ablated side by side.
    Adaptive(bench_adaptive::Args),
    /// What the runtime adds to a run before its first tool call, and the resume time, on a
    /// store that has been in use.
    Overhead(bench_overhead::Args),
}

/// Runs `hindsight bench ...`.
pub async fn run_bench(global: &Global, args: BenchArgs) -> Result<(), Failure> {
    match args.command {
        BenchCommand::Store(a) => bench_store::run(global, a).await,
        BenchCommand::Runtime(a) => bench_tree::runtime(global, a).await,
        BenchCommand::Learning(a) => bench_tree::learning(global, a).await,
        BenchCommand::Adaptive(a) => bench_adaptive::run(global, a).await,
        BenchCommand::Overhead(a) => bench_overhead::run(global, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_count_is_at_least_one() {
        assert_eq!(parse_tasks("1000"), Ok(1000));
        for bad in ["0", "-3", "ten", ""] {
            let e = parse_tasks(bad).err().unwrap_or_default();
            assert!(e.contains("at least 1"), "{bad}: {e}");
        }
        assert_eq!(parse_runs("24"), Ok(24));
        let e = parse_runs("0").err().unwrap_or_default();
        assert!(e.contains("number of runs, at least 1"), "{e}");
    }

    #[test]
    fn control_characters_are_printed_escaped() {
        assert_eq!(printable("task-1 é"), "task-1 é");
        assert_eq!(
            printable("t\nrun-forged done\u{1b}[2J\r\u{7f}"),
            "t\\nrun-forged done\\u{1b}[2J\\r\\u{7f}"
        );
        assert!(!printable("a\u{9b}b").chars().any(char::is_control));
    }

    #[test]
    fn a_failure_is_one_sentence() {
        assert_eq!(Failure::new("no such key k").to_string(), "no such key k.");
        assert_eq!(Failure::new("done.").to_string(), "done.");
    }
}
