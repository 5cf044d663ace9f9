//! `hindsight policy ...`: the learning policy from the command line. `evaluate` compares the
//! live policy, a greedy policy and the ranker distilled from the experience log, off-policy
//! (IPS, self-normalised IPS, doubly robust) on the log's newest rows.

use clap::Subcommand;
use hindsight::ExperienceTuple;
use hindsight::learn::bandit::Policy;
use hindsight::learn::distill::{EvaluationConfig, PolicyEvaluation, evaluate_log};
use hindsight::learn::ope::Objective;
use hindsight::store::StoreOptions;

use super::data::open_existing;
use super::{Failure, Global, print_json};

/// `hindsight policy ...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Off-policy evaluation of the live policy, a greedy policy and the distilled ranker on the
    /// experience log, and whether the ranker would be promoted.
    Evaluate {
        /// Share of the newest rows held out for evaluation (the rest fits the ranker).
        #[arg(long, default_value_t = 0.3)]
        holdout: f64,
        /// Margin by which the ranker may look worse than the live policy's greedy plan and
        /// still be promoted (the policy actor's `[distill] margin`).
        #[arg(long, default_value_t = 0.0)]
        margin: f64,
        /// Seed of the posterior draws and of the ranker's fit.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// What a run's reward is: its first attempt's plan as if no recovery followed (what
        /// the policy and the regret measure), or what it earned in the end.
        #[arg(long, value_enum, default_value_t = ObjectiveArg::FirstAttempt)]
        objective: ObjectiveArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `--objective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ObjectiveArg {
    /// The first attempt's plan, as if no recovery followed.
    FirstAttempt,
    /// What the run earned in the end, recoveries included.
    Realized,
}

/// What `evaluate --json` prints: the evaluation and the ranker the policy has in force.
#[derive(serde::Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    evaluation: &'a PolicyEvaluation,
    /// The distiller the policy actor persisted, if any: whether a ranker plans now.
    in_force: Option<InForce>,
}

/// The policy actor's distillation, as stored.
#[derive(serde::Serialize)]
struct InForce {
    ranker: bool,
    fits: u64,
    promotions: u64,
    last_fit_at_row: u64,
    last_reason: Option<String>,
}

/// Runs `hindsight policy ...`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        PolicyCommand::Evaluate {
            holdout,
            margin,
            seed,
            objective,
            json,
        } => {
            if !(0.0..1.0).contains(&holdout) {
                return Err(Failure::new(format!(
                    "--holdout must be in [0, 1), got {holdout}"
                )));
            }
            let store = open_existing(&global.data, StoreOptions::default())?;
            let mut tuples = Vec::new();
            for (seq, row) in store.experience_all()? {
                match row {
                    Ok(t) => tuples.push(t),
                    Err(e) => eprintln!("experience row {seq} skipped: {e}"),
                }
            }
            // An unreadable snapshot (written by an older build, say) does not stop the
            // evaluation: the greedy policy and the ranker are still compared, and the policy
            // actor rebuilds the snapshot from the experience log at its next start.
            let live = match hindsight_actors::policy::stored_policy(&store) {
                Ok(live) => live,
                Err(e) => {
                    eprintln!(
                        "the live policy cannot be read ({e}); evaluating without it (the daemon rebuilds it from the experience log when it next starts)"
                    );
                    None
                }
            };
            let in_force = match hindsight_actors::policy::stored_distiller(&store) {
                Ok(d) => d.map(|d| InForce {
                    ranker: d.active.is_some(),
                    fits: d.fits,
                    promotions: d.promotions,
                    last_fit_at_row: d.last_at,
                    last_reason: d.last.map(|p| p.reason),
                }),
                Err(e) => {
                    eprintln!("the policy's distilled ranker cannot be read ({e})");
                    None
                }
            };
            let cfg = EvaluationConfig {
                holdout_share: holdout,
                margin,
                seed,
                objective: match objective {
                    ObjectiveArg::FirstAttempt => Objective::FirstAttempt,
                    ObjectiveArg::Realized => Objective::Realized,
                },
                ..EvaluationConfig::default()
            };
            let evaluation = evaluate(&tuples, live.as_ref(), &cfg);
            let report = Report {
                evaluation: &evaluation,
                in_force,
            };
            if json {
                print_json(&report)
            } else {
                print_table(&report)
            }
        }
    }
}

/// The evaluation of an experience log (the part of `evaluate` that needs no store).
pub fn evaluate(
    tuples: &[ExperienceTuple],
    live: Option<&Policy>,
    cfg: &EvaluationConfig,
) -> PolicyEvaluation {
    evaluate_log(tuples, live, cfg)
}

fn print_table(report: &Report<'_>) -> Result<(), Failure> {
    let r = report.evaluation;
    outln!(
        "experience rows {} (skipped {}), fitted on {}, evaluated on {}; logged mean reward {:.4}",
        r.rows,
        r.skipped,
        r.train_rows,
        r.holdout_rows,
        r.logged_mean_reward
    )?;
    outln!(
        "rewards: {}",
        match r.objective {
            Objective::FirstAttempt =>
                "each run's first attempt, as if no recovery followed (runs cut short by an infrastructure fault are skipped)",
            Objective::Realized => "what each run earned in the end, recoveries included",
        }
    )?;
    outln!(
        "{:<8} {:>16} {:>16} {:>16} {:>8}",
        "policy",
        "IPS",
        "SNIPS",
        "DR",
        "ESS"
    )?;
    // An estimate with a 95% interval; IPS and SNIPS say nothing where the policy never chose
    // what the log chose (no support), so they are shown as such rather than as 0.
    let cell = |e: &hindsight::learn::ope::Estimate, weighted: bool| {
        if weighted && e.effective_n <= 0.0 {
            format!("{:>16}", "no support")
        } else {
            // `+ 0.0` turns a negative zero into zero.
            format!("{:>7.4} ±{:<7.4}", e.value + 0.0, 1.96 * e.std_err)
        }
    };
    for p in &r.policies {
        outln!(
            "{:<8} {} {} {} {:>8.1}",
            p.name,
            cell(&p.ips, true),
            cell(&p.snips, true),
            cell(&p.dr, false),
            p.dr.effective_n
        )?;
    }
    if let Some(p) = &r.promotion {
        outln!("ranker: {}", p.reason)?;
    }
    if let Some(n) = &r.note {
        outln!("note: {n}")?;
    }
    match &report.in_force {
        Some(d) => outln!(
            "in the running policy: {} ({} fits, {} promotions; last at row {}{})",
            if d.ranker {
                "a distilled ranker plans the exploit share"
            } else {
                "no ranker in force; the policy plans"
            },
            d.fits,
            d.promotions,
            d.last_fit_at_row,
            d.last_reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )?,
        None => outln!("in the running policy: no ranker was ever distilled")?,
    }
    Ok(())
}
