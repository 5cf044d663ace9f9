//! `hindsight bench runtime` and `hindsight bench learning`.

use std::io::Write as _;
use std::path::PathBuf;

use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::bench;
use hindsight_actors::app::demo::load_env;

use super::{Failure, Global, print_json};

/// `hindsight bench runtime [--runs N] [--concurrency C] [--json]`.
#[derive(Debug, clap::Args)]
pub struct RuntimeArgs {
    /// Runs measured per configuration.
    #[arg(long, default_value_t = 5000)]
    pub runs: u64,
    /// Runs in flight at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// The environment (default: bank statements).
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hindsight bench runtime`.
pub async fn runtime(_global: &Global, args: RuntimeArgs) -> Result<(), Failure> {
    let env = load_env(args.env.as_deref()).map_err(|e| Failure::new(e.to_string()))?;
    let b = bench::runtime(&env, args.runs.max(1), args.concurrency.max(1))
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    if args.json {
        return print_json(&b);
    }
    outln!(
        "full runs through the tree ({} runs, {} in flight):",
        b.runs,
        b.concurrency
    )?;
    outln!(
        "  durable (fsync per group commit): {:>10.0} runs/s",
        b.runs_per_sec_durable
    )?;
    outln!(
        "  no fsync:                         {:>10.0} runs/s",
        b.runs_per_sec_no_fsync
    )?;
    if let (Some(durable), Some(fast)) = (b.cpu_ms_per_run_durable, b.cpu_ms_per_run_no_fsync) {
        outln!(
            "  CPU per run (every thread):       {durable:>10.3} ms durable, {fast:.3} ms no fsync"
        )?;
    }
    outln!("baselines measured in the same run:")?;
    outln!(
        "  ractor casts:                     {:>10.0} msgs/s",
        b.ractor_casts_per_sec
    )?;
    outln!(
        "  ractor call round trips:          {:>10.0} calls/s",
        b.ractor_calls_per_sec
    )?;
    outln!(
        "    from a task on the runtime:     {:>10.0} calls/s",
        b.ractor_calls_per_sec_from_task
    )?;
    outln!(
        "  tokio mpsc:                       {:>10.0} msgs/s",
        b.tokio_channel_msgs_per_sec
    )?;
    let share = |calls: f64| 100.0 * b.runs_per_sec_durable / calls.max(f64::MIN_POSITIVE);
    outln!(
        "durable runs/s as a share of the call round trips: {:.2}% (from a task: {:.3}%)",
        share(b.ractor_calls_per_sec),
        share(b.ractor_calls_per_sec_from_task)
    )
}

/// `hindsight bench learning --env FILE [--tasks N] [--seed S] [--runs R] [--trace FILE] [--json]`.
#[derive(Debug, clap::Args)]
pub struct LearningArgs {
    /// The simulated environment (default: bank statements).
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Tasks to run.
    #[arg(long, default_value_t = 1000, value_parser = super::parse_tasks)]
    pub tasks: u64,
    /// Seed of the tasks and of every choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs, on the seeds from `--seed` up, each on a fresh tree: every run's regret ratio and
    /// their mean, range and count above 0.2 (at more than one task in flight a seed does not
    /// repeat exactly, so one run is a single draw).
    #[arg(long, default_value_t = 1, value_parser = super::parse_runs)]
    pub runs: u64,
    /// Write one JSON line per task here.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Tasks in flight at once (default 4 on the tree; the core engine runs one at a time).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// The interpreter of the run machine: `tree` (the supervision tree, what the daemon runs)
    /// or `core` (one task after another in this process, no actors or store; with
    /// `--concurrency 1` both write the same `--trace` for the same seed).
    #[arg(long, value_enum, default_value_t = bench::Engine::Tree)]
    pub engine: bench::Engine,
    /// Keep the run's store in this new or empty directory (for `report`, `policy evaluate`,
    /// `diary` with `--data DIR`); by default it runs on a temporary store, never on `--data`.
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Learn with this configuration file's `[policy]`, `[distill]` and `[adaptive]` sections and
    /// `[triage]` caps instead of the embedded defaults (its `seed` does not apply: `--seed` is
    /// the run's), to measure a setting before the daemon runs with it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The configuration named by `--config`, if any.
fn load_config(args: &LearningArgs) -> Result<Option<hindsight::config::Config>, Failure> {
    args.config
        .as_deref()
        .map(|path| {
            hindsight::config::Config::load(Some(path)).map_err(|e| Failure::new(e.to_string()))
        })
        .transpose()
}

/// The learning bench's plan from the command line, on `seed`.
fn plan<'a>(
    args: &'a LearningArgs,
    seed: u64,
    settings: Option<bench::LearningSettings<'a>>,
) -> bench::LearningPlan<'a> {
    let default = match args.engine {
        bench::Engine::Tree => 4,
        bench::Engine::Core => 1,
    };
    bench::LearningPlan {
        tasks: args.tasks,
        seed,
        concurrency: args.concurrency.unwrap_or(default).max(1),
        engine: args.engine,
        keep: args.keep.as_deref(),
        settings,
    }
}

/// One line of the trace.
#[derive(serde::Serialize)]
struct TraceLine<'a> {
    task: u64,
    features: &'a std::collections::BTreeMap<String, String>,
    plan: &'a [String],
    passed: bool,
    reward: f64,
    /// Oracle's expected reward minus the first plan's (FORMAT.md).
    regret: f64,
    /// Oracle's expected reward minus that of the policy's greedy plan when it chose.
    greedy_regret: f64,
    /// The SOP the first plan followed, if any.
    sop: Option<&'a str>,
    /// The probability the first plan had of being chosen (the router's and the policy's).
    propensity: f64,
}

/// Runs `hindsight bench learning`.
pub async fn learning(_global: &Global, args: LearningArgs) -> Result<(), Failure> {
    let env = load_env(args.env.as_deref()).map_err(|e| Failure::new(e.to_string()))?;
    let config = load_config(&args)?;
    let settings = config
        .as_ref()
        .zip(args.config.as_deref())
        .map(|(config, file)| bench::LearningSettings { config, file });
    if let (Some(file), false) = (&args.config, args.json) {
        outln!(
            "learning with [policy], [distill] and [adaptive] of {}",
            file.display()
        )?;
    }
    if args.runs > 1 {
        return learning_runs(&env, &args, settings).await;
    }
    let (b, records) = bench::learning(&env, plan(&args, args.seed, settings))
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    if let Some(path) = &args.trace {
        let file = std::fs::File::create(path).map_err(|e| {
            Failure::new(format!(
                "cannot create the trace file {}: {e}",
                path.display()
            ))
        })?;
        let mut w = std::io::BufWriter::new(file);
        for r in &records {
            let line = serde_json::to_string(&TraceLine {
                task: r.task,
                features: &r.features,
                plan: &r.plan,
                passed: r.passed,
                reward: r.reward,
                regret: r.regret(),
                greedy_regret: r.greedy_regret(),
                sop: r.sop_id.as_deref(),
                propensity: r.propensity,
            })
            .map_err(|e| Failure::new(format!("cannot encode the trace: {e}")))?;
            writeln!(w, "{line}").map_err(|e| {
                Failure::new(format!(
                    "cannot write the trace file {}: {e}",
                    path.display()
                ))
            })?;
        }
        w.flush().map_err(|e| {
            Failure::new(format!(
                "cannot write the trace file {}: {e}",
                path.display()
            ))
        })?;
    }
    if args.json {
        return print_json(&b);
    }
    let s = &b.summary;
    outln!(
        "{} tasks of `{}`: success {:.1}%, mean reward {:.3} (oracle {:.3}, random {:.3})",
        s.tasks,
        s.env,
        100.0 * s.success_rate,
        s.mean_reward,
        s.oracle_mean_reward,
        s.random_mean_reward
    )?;
    outln!(
        "regret {:.1} vs random {:.1}: ratio {:.3}; SOPs promoted {}; infra failures learned from {}",
        s.cumulative_regret,
        s.random_cumulative_regret,
        s.regret_ratio,
        b.sops_promoted,
        b.infra_failures_learned_from
    )?;
    outln!(
        "of the regret, {:.1} is the policy's greedy plans (what it did not know yet) and {:.1} departing from them (exploration, SOP and ranker plans)",
        s.greedy_regret,
        s.exploration_regret
    )?;
    if let Some(d) = &b.drift {
        outln!(
            "drift from task {}: {} tasks affected; regret ratio {:.3} during the first {} tasks after it, {:.3} after them",
            d.after_task,
            d.affected_tasks,
            d.regret_ratio_during_recovery,
            bench::RECOVERY_TASKS,
            d.regret_ratio_after_recovery
        )?;
    }
    Ok(())
}

/// `hindsight bench learning --runs R` with R > 1: the runs one after another, then their spread.
async fn learning_runs(
    env: &SimEnv,
    args: &LearningArgs,
    settings: Option<bench::LearningSettings<'_>>,
) -> Result<(), Failure> {
    if args.trace.is_some() || args.keep.is_some() {
        return Err(Failure::new(
            "--trace and --keep describe one run: give them without --runs (or with --runs 1)",
        ));
    }
    let seeds: Vec<u64> = (0..args.runs).map(|i| args.seed.wrapping_add(i)).collect();
    let mut per_run = Vec::with_capacity(seeds.len());
    for &seed in &seeds {
        let (b, _) = bench::learning(env, plan(args, seed, settings))
            .await
            .map_err(|e| Failure::new(format!("run with seed {seed}: {e}")))?;
        if !args.json {
            outln!(
                "seed {seed}: regret ratio {:.3}, success {:.1}%{}",
                b.summary.regret_ratio,
                100.0 * b.summary.success_rate,
                b.drift
                    .as_ref()
                    .map(|d| format!(
                        ", drifted tasks after recovery {:.3}",
                        d.regret_ratio_after_recovery
                    ))
                    .unwrap_or_default()
            )?;
        }
        per_run.push(b);
    }
    let all = bench::LearningRuns::new(args.tasks, seeds, per_run)
        .ok_or_else(|| Failure::new("no run was made"))?;
    if args.json {
        return print_json(&all);
    }
    outln!(
        "{} runs of {} tasks of `{}`: regret ratio mean {:.3} ({:.3}-{:.3}), {} above {}; infra failures learned from {}",
        all.seeds.len(),
        all.tasks,
        all.env,
        all.mean_regret_ratio,
        all.min_regret_ratio,
        all.max_regret_ratio,
        all.runs_above_bar,
        bench::REGRET_BAR,
        all.infra_failures_learned_from
    )
}
