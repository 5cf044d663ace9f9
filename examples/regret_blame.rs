//! Where a bench run's regret came from: per stage, which swaps of the oracle's arm for the arm
//! the policy chose cost the most expected reward over a range of tasks.
//!
//! `cargo run --release --example regret_blame -- ENV.toml TRACE.jsonl [FIRST LAST]`, on the
//! trace of `hindsight bench learning --env ENV.toml --trace TRACE.jsonl`, over tasks
//! FIRST..LAST-1 (the trace counts from 0; all of them without a range).
//!
//! For each task it takes the environment's oracle plan ([`SimEnv::oracle`]: FORMAT.md's expected
//! reward, with the task's `when` overrides and any drift in force), then for each stage where
//! the chosen plan departs from it, the value lost by that stage's arm alone (the other stages
//! kept at the oracle's, [`SimEnv::expected_reward`]). The trace's `regret` and `greedy_regret`
//! say how much of the range's regret was exploration (the chosen plan departing from the
//! policy's own greedy one) and how much the greedy plans' own mistakes.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::Write;
use std::path::Path;

use hindsight::tools::sim::SimEnv;
use serde::Deserialize;

const USAGE: &str = "usage: regret_blame ENV.toml TRACE.jsonl [FIRST LAST]";

/// The fields of a trace line this reads.
#[derive(Deserialize)]
struct Line {
    task: u64,
    features: BTreeMap<String, String>,
    plan: Vec<String>,
    regret: f64,
    greedy_regret: Option<f64>,
}

/// One (stage, oracle's arm, chosen arm) swap: the value it lost and over how many tasks.
type Blame = BTreeMap<(String, String, String), (f64, u64)>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Output cut short by its reader (`| head`): not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("regret_blame: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (env_path, trace_path, range) = match args.as_slice() {
        [env, trace] => (env, trace, 0..u64::MAX),
        [env, trace, first, last] => {
            let n = |s: &str| {
                s.parse::<u64>()
                    .map_err(|_| format!("FIRST and LAST must be whole numbers, not `{s}`"))
            };
            (env, trace, n(first)?..n(last)?)
        }
        _ => return Err(USAGE.into()),
    };
    let env = SimEnv::load(Path::new(env_path))?;
    let names: Vec<Vec<String>> = env
        .stages()
        .iter()
        .map(|s| {
            s.arms
                .iter()
                .map(|a| format!("{}/{}", a.tool, a.strategy))
                .collect()
        })
        .collect();
    let text = std::fs::read_to_string(trace_path)
        .map_err(|e| format!("cannot read {trace_path}: {e}"))?;
    let (mut tasks, mut regret, mut greedy_regret) = (0u64, 0.0, 0.0);
    let mut blame = Blame::new();
    for (number, line) in text.lines().enumerate() {
        let bad = |why: String| {
            format!(
                "{trace_path} line {} is not a trace line of {env_path}: {why}",
                number + 1
            )
        };
        let line: Line = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if line.plan.len() != names.len() {
            return Err(bad(format!("a plan of {} stages", line.plan.len())).into());
        }
        // The chosen arm per stage, as the (tool, strategy) the environment names it by.
        let chosen = line
            .plan
            .iter()
            .zip(env.stages())
            .zip(&names)
            .map(|((arm, stage), stage_names)| {
                let i = stage_names
                    .iter()
                    .position(|n| n == arm)
                    .ok_or_else(|| bad(format!("stage `{}` has no arm `{arm}`", stage.name)))?;
                Ok((stage.arms[i].tool.clone(), stage.arms[i].strategy.clone()))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if !range.contains(&line.task) {
            continue;
        }
        tasks += 1;
        regret += line.regret;
        greedy_regret += line.greedy_regret.unwrap_or(line.regret);
        let (best, best_value) = env.oracle(line.task, &line.features);
        for (s, arm) in chosen.iter().enumerate() {
            if *arm == best[s] {
                continue;
            }
            let mut alt = best.clone();
            alt[s] = arm.clone();
            let lost = best_value - env.expected_reward(line.task, &line.features, &alt)?;
            let key = (
                env.stages()[s].name.clone(),
                format!("{}/{}", best[s].0, best[s].1),
                format!("{}/{}", arm.0, arm.1),
            );
            let entry = blame.entry(key).or_default();
            entry.0 += lost;
            entry.1 += 1;
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{tasks} tasks: regret {regret:.2}, of which exploration {:.2} (the greedy plans alone \
         would have cost {greedy_regret:.2})",
        regret - greedy_regret
    )?;
    let mut rows: Vec<_> = blame.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    for ((stage, best, chosen), (lost, n)) in rows.into_iter().take(15) {
        writeln!(
            out,
            "{lost:7.2} over {n:4} tasks: {stage}: {best} -> {chosen}"
        )?;
    }
    Ok(())
}
