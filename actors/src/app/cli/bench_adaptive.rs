//! `hindsight bench adaptive`: learning in words on a simulated agent environment, with one
//! mechanism ablated side by side.

use std::path::PathBuf;

use hindsight::learn::Mechanism;
use hindsight_actors::app::adaptive::{self, AdaptiveFigures, AdaptivePlan, AdaptiveRuns};

use super::{Failure, Global, print_json};

/// `hindsight bench adaptive --env FILE [--tasks N] [--seed S] [--runs R] [--ablate M] [--json]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent environment (`config/envs/AGENT-FORMAT.md`), e.g.
    /// `config/envs/support_desk.toml`.
    #[arg(long, value_name = "FILE")]
    pub env: PathBuf,
    /// Tasks to run, one after another.
    #[arg(long, default_value_t = 1000, value_parser = super::parse_tasks)]
    pub tasks: u64,
    /// Seed of the tasks, the simulated model and tools, and every choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs, on the seeds from `--seed` up, each on a fresh tree: each run's figures and the
    /// means.
    #[arg(long, default_value_t = 1, value_parser = super::parse_runs)]
    pub runs: u64,
    /// Run the same tasks again with this mechanism off and print its figures beside (`lessons`,
    /// `reflect`, `hints`, `corrections` or `sops`).
    #[arg(long, value_name = "MECHANISM", value_parser = parse_mechanism)]
    pub ablate: Option<Mechanism>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn parse_mechanism(s: &str) -> Result<Mechanism, String> {
    s.parse()
        .map_err(|e: hindsight::learn::mechanism::UnknownMechanism| e.to_string())
}

/// Runs `hindsight bench adaptive`.
pub async fn run(_global: &Global, args: Args) -> Result<(), Failure> {
    let env = adaptive::load(&args.env).map_err(|e| Failure::new(e.to_string()))?;
    let seeds: Vec<u64> = (0..args.runs).map(|i| args.seed.wrapping_add(i)).collect();
    let mut per_run = Vec::with_capacity(seeds.len());
    for &seed in &seeds {
        let plan = AdaptivePlan {
            tasks: args.tasks,
            seed,
            ablate: args.ablate,
        };
        let b = adaptive::adaptive(&env, plan)
            .await
            .map_err(|e| Failure::new(format!("run with seed {seed}: {e}")))?;
        if !args.json {
            outln!("{} (seed {seed}, {} tasks):", b.env, args.tasks)?;
            print_figures(&b.figures, b.ablation.zip(b.ablated.as_ref()))?;
        }
        per_run.push(b);
    }
    if args.runs == 1 {
        return match per_run.pop() {
            Some(b) if args.json => print_json(&b),
            _ => Ok(()),
        };
    }
    let all = AdaptiveRuns::new(seeds, per_run).ok_or_else(|| Failure::new("no run was made"))?;
    if args.json {
        return print_json(&all);
    }
    outln!(
        "{} runs of `{}`: repeat error rate mean {:.3}{}, success {:.1}%; poisoned corrections accepted {}; infra failures learned from {}",
        all.seeds.len(),
        all.env,
        all.mean_repeat_error_rate,
        all.mean_repeat_error_rate_ablated
            .map(|a| format!(
                " ({a:.3} with {} off)",
                args.ablate.map_or("", Mechanism::as_str)
            ))
            .unwrap_or_default(),
        100.0 * all.mean_success_rate,
        all.poisoned_corrections_accepted,
        all.infra_failures_learned_from
    )
}

/// The figures as a table, with the ablated run's beside them.
fn print_figures(
    on: &AdaptiveFigures,
    ablated: Option<(Mechanism, &AdaptiveFigures)>,
) -> Result<(), Failure> {
    let on_json = serde_json::to_value(on).unwrap_or_default();
    let off_json = ablated.map(|(_, a)| serde_json::to_value(a).unwrap_or_default());
    let head = ablated.map_or(String::new(), |(m, _)| {
        format!("{:>14}", format!("{m} off"))
    });
    outln!("  {:<32}{:>14}{head}", "figure", "all on")?;
    let cell = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::Number(n)) if n.is_f64() => {
            format!("{:>14.3}", n.as_f64().unwrap_or_default())
        }
        Some(serde_json::Value::Null) | None => format!("{:>14}", "-"),
        Some(serde_json::Value::Object(m)) => format!(
            "  {}",
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(v) => format!("{:>14}", v.to_string()),
    };
    if let Some(fields) = on_json.as_object() {
        for (name, value) in fields {
            let other = off_json
                .as_ref()
                .map(|o| cell(o.get(name)))
                .unwrap_or_default();
            outln!("  {name:<32}{}{other}", cell(Some(value)))?;
        }
    }
    Ok(())
}
