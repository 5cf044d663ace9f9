//! Measures learning on many simulated environments and seeds at once, each run on the core's
//! interpreter of the run machine (`hindsight bench learning --engine core`: the tree's decisions
//! at one task in flight, without actors or a store), runs in parallel over the cores: the quick
//! way to see what a `[policy]` setting does across a family of environments before the tree is
//! run on them (`hindsight bench learning --runs`).
//!
//! `cargo run --release --example learning_sweep -- [--seeds 1-4] [--tasks 1000]
//! [--config FILE] [--quiet] ENV.toml...`
//!
//! Each run learns from nothing with the embedded defaults, or with `--config FILE`'s `[policy]`,
//! `[distill]`, `[adaptive]` and `[triage]` sections as the daemon would. It prints each run's
//! regret ratio and drifted-tasks-after-recovery figure
//! (unless `--quiet`), the environments whose mean of either is above 0.2, and the means with
//! the count of runs above 0.2. For example, with environments from the `random_env` example:
//! `cargo run --release --example random_env -- /tmp/envs 1 12 --wide`, then this on
//! `/tmp/envs/*.toml`.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hindsight::config::Config;
use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::bench::{self, Engine, LearningPlan, LearningSettings};

const USAGE: &str =
    "usage: learning_sweep [--seeds A-B] [--tasks N] [--config FILE] [--quiet] ENV.toml...";

/// What to run.
struct Args {
    seeds: (u64, u64),
    tasks: u64,
    config: Option<PathBuf>,
    quiet: bool,
    envs: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        seeds: (1, 4),
        tasks: 1000,
        config: None,
        quiet: false,
        envs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value; {USAGE}"));
        match a.as_str() {
            "--seeds" => {
                let v = value("--seeds")?;
                let (from, to) = v.split_once('-').unwrap_or((&v, &v));
                args.seeds = (from.parse()?, to.parse()?);
                if args.seeds.0 > args.seeds.1 {
                    return Err(format!("--seeds {v}: the first seed is after the last").into());
                }
            }
            "--tasks" => args.tasks = value("--tasks")?.parse()?,
            "--config" => args.config = Some(value("--config")?.into()),
            "--quiet" => args.quiet = true,
            flag if flag.starts_with("--") => return Err(format!("{flag}? {USAGE}").into()),
            env => args.envs.push(env.into()),
        }
    }
    if args.envs.is_empty() {
        return Err(USAGE.into());
    }
    Ok(args)
}

/// One run's figures.
struct RunResult {
    env: String,
    seed: u64,
    regret_ratio: f64,
    drift_after: Option<f64>,
}

fn main() -> std::process::ExitCode {
    match sweep() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Output cut short by its reader (`| head`): not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("learning_sweep: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn sweep() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let config = match &args.config {
        Some(path) => Some(Config::load(Some(path.as_path()))?),
        None => None,
    };
    let settings = config
        .as_ref()
        .zip(args.config.as_deref())
        .map(|(config, file)| LearningSettings { config, file });
    let mut envs = Vec::new();
    for path in &args.envs {
        envs.push((path.clone(), SimEnv::load(path)?));
    }
    let mut jobs: Vec<(usize, u64)> = (0..envs.len())
        .flat_map(|e| (args.seeds.0..=args.seeds.1).map(move |s| (e, s)))
        .collect();
    jobs.reverse();
    let jobs = Mutex::new(jobs);
    let results: Mutex<Vec<Result<RunResult, String>>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                // The guard is moved into the closure and dropped there: the lock is held
                // for the pop only.
                while let Some((e, seed)) = jobs.lock().ok().and_then(|mut j| j.pop()) {
                    let (path, env) = &envs[e];
                    let plan = LearningPlan {
                        tasks: args.tasks,
                        seed,
                        concurrency: 1,
                        engine: Engine::Core,
                        keep: None,
                        settings,
                    };
                    let r = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|err| err.to_string())
                        .and_then(|rt| {
                            rt.block_on(bench::learning(env, plan))
                                .map_err(|err| err.to_string())
                        })
                        .map(|(r, _)| RunResult {
                            env: path.display().to_string(),
                            seed,
                            regret_ratio: r.summary.regret_ratio,
                            drift_after: r.drift.map(|d| d.regret_ratio_after_recovery),
                        })
                        .map_err(|err| format!("{} seed {seed}: {err}", path.display()));
                    if let Ok(mut all) = results.lock() {
                        all.push(r);
                    }
                }
            });
        }
    });
    let mut runs = Vec::new();
    for r in results.into_inner().map_err(|_| "a run panicked")? {
        runs.push(r?);
    }
    runs.sort_by(|a, b| a.env.cmp(&b.env).then(a.seed.cmp(&b.seed)));
    report(&mut std::io::stdout().lock(), &runs, args.quiet)?;
    Ok(())
}

/// Writes the runs, the environments above 0.2 on average, and the means.
fn report(out: &mut impl Write, runs: &[RunResult], quiet: bool) -> std::io::Result<()> {
    let fmt = |d: Option<f64>| d.map_or("-".to_string(), |x| format!("{x:.3}"));
    // Per environment: sum and count of regret ratios, then of drift figures.
    let mut per_env: BTreeMap<&str, (f64, u32, f64, u32)> = BTreeMap::new();
    for r in runs {
        if !quiet {
            writeln!(
                out,
                "{} seed {}: regret ratio {:.3}, drifted tasks after recovery {}",
                r.env,
                r.seed,
                r.regret_ratio,
                fmt(r.drift_after)
            )?;
        }
        let e = per_env.entry(&r.env).or_default();
        e.0 += r.regret_ratio;
        e.1 += 1;
        if let Some(d) = r.drift_after {
            e.2 += d;
            e.3 += 1;
        }
    }
    let mean = |sum: f64, n: u32| (n > 0).then(|| sum / f64::from(n));
    for (env, (s, n, ds, dn)) in &per_env {
        let (m, d) = (mean(*s, *n), mean(*ds, *dn));
        if m.is_some_and(|m| m > 0.2) || d.is_some_and(|d| d > 0.2) {
            let name = Path::new(env)
                .file_name()
                .map_or(*env, |f| f.to_str().unwrap_or(env));
            writeln!(
                out,
                "above 0.2 on average: {name}: regret ratio {}, drifted after recovery {}",
                fmt(m),
                fmt(d)
            )?;
        }
    }
    let ratios: Vec<f64> = runs.iter().map(|r| r.regret_ratio).collect();
    let drifts: Vec<f64> = runs.iter().filter_map(|r| r.drift_after).collect();
    let over = |xs: &[f64]| xs.iter().filter(|x| **x > 0.2).count();
    writeln!(
        out,
        "{} runs: regret ratio mean {} ({} above 0.2); drifted tasks after recovery mean {} ({} of {} above 0.2)",
        ratios.len(),
        fmt(mean(ratios.iter().sum(), ratios.len() as u32)),
        over(&ratios),
        fmt(mean(drifts.iter().sum(), drifts.len() as u32)),
        over(&drifts),
        drifts.len()
    )
}
