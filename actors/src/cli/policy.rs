//! `hindsight policy ...`: the learning policy from the command line. `evaluate` compares the
//! live policy, a greedy policy and the ranker distilled from the experience log, off-policy
//! (IPS, self-normalised IPS, doubly robust) on the log's newest rows.

use clap::Subcommand;
use hindsight::ExperienceTuple;
use hindsight::learn::bandit::Policy;
use hindsight::learn::distill::{EvaluationConfig, PolicyEvaluation, evaluate_log};
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
        /// Margin by which the ranker may be worse than the live policy and still be promoted.
        #[arg(long, default_value_t = 0.01)]
        margin: f64,
        /// Seed of the posterior draws and of the ranker's fit.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `hindsight policy ...`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        PolicyCommand::Evaluate {
            holdout,
            margin,
            seed,
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
            let cfg = EvaluationConfig {
                holdout_share: holdout,
                margin,
                seed,
                ..EvaluationConfig::default()
            };
            let report = evaluate(&tuples, live.as_ref(), &cfg);
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

fn print_table(r: &PolicyEvaluation) -> Result<(), Failure> {
    outln!(
        "experience rows {} (skipped {}), fitted on {}, evaluated on {}; logged mean reward {:.4}",
        r.rows,
        r.skipped,
        r.train_rows,
        r.holdout_rows,
        r.logged_mean_reward
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
    Ok(())
}
