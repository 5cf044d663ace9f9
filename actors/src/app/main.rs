//! The `hindsight` binary: parses the command line and dispatches each command group to
//! `cli::<group>::run`. Every error is printed as one sentence on stderr, with exit code 2.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The binary's allocator: glibc's malloc grows and trims its heap under the tree's churn of
/// short-lived messages and records (see docs/benchmarks.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_decommits` (the sixth option of `mi_option_e` in `mimalloc.h`,
/// which `libmimalloc-sys` does not name).
const PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Two of mimalloc's defaults cost the tree's bursts (docs/benchmarks.md, "The allocator"); the
/// environment's `MIMALLOC_PURGE_DECOMMITS` and `MIMALLOC_ALLOW_THP` still decide when set.
/// - Memory held unused for a second is handed back to the kernel to take when it needs it
///   (`MADV_FREE`) instead of being decommitted, then faulted in and zeroed again by the next
///   burst of runs: a fifth of the process's system time in `bench overhead`.
/// - No transparent huge pages (mimalloc asks for them on its arenas, which it has reserved
///   before `main` runs, so the process declines them): each first touch of one zeroed 2 MB,
///   mostly for nothing while the process grows and shrinks with its runs in flight; the
///   system time of `bench overhead` 2.9-3.2 s with them, 0.6-0.7 s without.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DECOMMITS").is_none() {
        // SAFETY: mimalloc's options may not be set while other threads allocate; this runs
        // first in `main`, before any thread is started.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DECOMMITS, 0) };
    }
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: `prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)` takes plain integers and touches no
        // memory of the process. A kernel that refuses it leaves things as they were, which
        // is only slower: the result is not needed.
        let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// The command line of `hindsight`.
#[derive(Debug, Parser)]
#[command(
    name = "hindsight",
    version,
    about = "hindsight: supervised, self-improving tool-using agents"
)]
struct Cli {
    #[command(flatten)]
    global: cli::Global,
    #[command(subcommand)]
    command: Command,
}

/// The command groups.
#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: run a simulated environment through the whole tree and show what it learned.
    Demo(cli::demo::Args),
    /// Evaluate the learning policy off-policy on the experience log.
    Policy(cli::policy::Args),
    /// List the configured agents.
    Agents(cli::agents::Args),
    /// List and call the configured tools (MCP servers, simulated environments).
    Tools(cli::tools::ToolsArgs),
    /// Classify error messages (JSON lines on stdin).
    Classify(cli::classify::Args),
    /// Read the episodic diary.
    Diary(cli::diary::Args),
    /// List runs.
    Runs(cli::runs::Args),
    /// Inspect and maintain the database.
    Store(cli::store::Args),
    /// Measure performance.
    Bench(cli::BenchArgs),
    /// Run the daemon: the supervision tree behind the HTTP API (stops on ctrl-c or SIGTERM).
    Serve(hindsight_actors::app::api::command::ServeArgs),
    /// Write the HTML report of the runs in the store.
    Report(cli::report::Args),
    /// Hash an API key, show or check the configuration.
    Config(hindsight_actors::app::api::command::ConfigArgs),
}

async fn dispatch(global: cli::Global, command: Command) -> Result<(), cli::Failure> {
    match command {
        Command::Demo(args) => cli::demo::run(&global, args).await,
        Command::Tools(args) => match cli::tools::run(args).await {
            0 => Ok(()),
            code => std::process::exit(code),
        },
        Command::Agents(args) => cli::agents::run(&global, args).await,
        Command::Policy(args) => cli::policy::run(&global, args).await,
        Command::Classify(args) => cli::classify::main(&args)
            .map(|_| ())
            .map_err(|e| cli::Failure::new(e.to_string())),
        Command::Diary(args) => cli::diary::run(&global, args).await,
        Command::Runs(args) => cli::runs::run(&global, args).await,
        Command::Store(args) => cli::store::run(&global, args).await,
        Command::Bench(args) => cli::run_bench(&global, args).await,
        Command::Serve(args) => cli::serve::run(&global, args).await,
        Command::Report(args) => cli::report::run(&global, args).await,
        Command::Config(args) => cli::config::run(args),
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| cli::Failure::new(format!("cannot start the async runtime: {e}")))
        .and_then(|rt| rt.block_on(dispatch(cli.global, cli.command)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) if failure.is_broken_pipe() => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            ExitCode::from(2)
        }
    }
}
