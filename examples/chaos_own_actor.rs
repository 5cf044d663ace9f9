//! Fault-injecting your own actor with hindsight's chaos harness. A ledger actor of your own
//! posts transactions into a table of the store; it runs under your own one_for_one supervisor,
//! and a chaos plan (TOML) makes it panic on about 5% of its messages. The caller calls it
//! through a [`Slot`], which re-sends a call whose actor died to the restarted actor, so every
//! transaction is posted exactly once (posting is keyed by transaction, so a re-sent message is
//! harmless). The example prints the [`ChaosReport`]: panics injected, restarts observed, and the
//! workload's result.
//!
//! Your actor here is a [`Plugin`] hosted by hindsight's [`PluginHost`] (a ractor actor), because
//! the root package of hindsight does not depend on `ractor`; with `ractor` in your dependencies,
//! implement `ractor::Actor` and call `ctx.chaos.inject("ledger").await` first thing in `handle`
//! the same way.
//!
//! Run it with `cargo run --example chaos_own_actor`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hindsight::store::{Durability, KvTable, Store, StoreOptions};
use hindsight_actors::chaos::{ChaosHandle, ChaosPlan, ChaosReport, run_under_chaos};
use hindsight_actors::directory::Slot;
use hindsight_actors::plugin::{
    Plugin, PluginArgs, PluginError, PluginFactory, PluginHost, PluginMsg, RunReport, Verdict,
};
use hindsight_actors::supervisor::{ChildSpec, Strategy, Supervisor};

/// Any error of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The fault plan: the ledger panics on about one message in twenty.
pub const PLAN: &str = r#"
seed = 21

[[actors]]
name = "ledger"
panic_probability = 0.05
"#;

/// The ledger's table: amount in cents by transaction id.
const POSTED: KvTable = KvTable::new("example_posted");

/// The amount of transaction `i`, in cents.
pub fn amount(i: u64) -> u64 {
    100 + (i * 37) % 1_000
}

/// The ledger: posts each transaction it is sent (a `RunReport` whose `run_id` is the
/// transaction id).
struct Ledger {
    store: Store,
    chaos: ChaosHandle,
    /// Transactions posted, reloaded from the store at every (re)start.
    posted: u64,
}

impl Plugin for Ledger {
    fn name(&self) -> &str {
        "ledger"
    }

    async fn after_run(&mut self, report: &RunReport) -> Result<Verdict, PluginError> {
        // First thing in the handler: the plan may panic the actor here.
        self.chaos.inject("ledger").await;
        let i: u64 = report
            .run_id
            .strip_prefix("txn-")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("not a transaction id: {}", report.run_id))?;
        if self.store.get::<u64>(POSTED, &report.run_id)?.is_none() {
            self.store.put(POSTED, &report.run_id, &amount(i)).await?;
            self.posted += 1;
        }
        Ok(Verdict::Accept)
    }
}

/// What the workload saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Transactions sent.
    pub sent: u64,
    /// Transactions found in the ledger's table at the end.
    pub posted: u64,
    /// Their total, in cents.
    pub total_cents: u64,
    /// Times the ledger was started (1 + restarts).
    pub starts: u64,
}

/// Posts `n` transactions through the ledger under the chaos plan, with data in `data_dir`.
pub async fn demo(
    data_dir: &Path,
    n: u64,
) -> Result<ChaosReport<Result<Outcome, BoxError>>, BoxError> {
    let plan = ChaosPlan::parse(PLAN, "chaos_own_actor.toml")?;
    let store = Store::open(
        data_dir,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )?;
    let report = run_under_chaos(plan, move |ctx| async move {
        let slot = Arc::new(Slot::<PluginMsg>::new("ledger"));
        let starts = Arc::new(AtomicU64::new(0));
        let factory: PluginFactory<Ledger> = {
            let (store, chaos, starts) = (store.clone(), ctx.chaos.clone(), starts.clone());
            Arc::new(move || {
                let (store, chaos) = (store.clone(), chaos.clone());
                starts.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    let posted = store.scan::<u64>(POSTED)?.len() as u64;
                    Ok(Ledger {
                        store,
                        chaos,
                        posted,
                    })
                })
            })
        };
        let spec = {
            let slot = slot.clone();
            ChildSpec::actor("ledger", None, move || {
                (
                    PluginHost::<Ledger>::default(),
                    PluginArgs {
                        factory: factory.clone(),
                        slot: slot.clone(),
                        chaos: None,
                    },
                )
            })
        };
        // The context's options carry the restart counters the report reads.
        let options = ctx
            .supervisor_options(Strategy::OneForOne)
            .label("my-app")
            .intensity(1_000, Duration::from_secs(60));
        let (sup, join) = Supervisor::spawn(None, options, vec![spec])
            .await
            .map_err(|e| format!("the supervisor could not start: {e}"))?;
        for i in 0..n {
            let txn = Arc::new(RunReport {
                run_id: format!("txn-{i:05}"),
                round: 1,
                passed: true,
                events: Vec::new(),
            });
            // Re-sent to the restarted ledger when the one handling it panicked.
            slot.call(|reply| PluginMsg::AfterRun(txn.clone(), reply))
                .await?;
        }
        sup.stop(Some("done".to_string()));
        join.await?;
        let mut total_cents = 0;
        let mut posted = 0;
        for (_, amount) in store.scan::<u64>(POSTED)? {
            total_cents += amount?;
            posted += 1;
        }
        Ok::<Outcome, BoxError>(Outcome {
            sent: n,
            posted,
            total_cents,
            starts: starts.load(Ordering::SeqCst),
        })
    })
    .await;
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    hindsight_actors::chaos::quiet_injected_panics();
    let dir = tempfile::tempdir()?;
    let n = 400;
    let report = demo(dir.path(), n).await?;
    let outcome = report.output?;
    let c = report.counts;
    println!("chaos plan: panic_probability 0.05 on actor `ledger`, seed 21");
    println!(
        "messages {}, panics injected {}, restarts observed {}, escalations {}",
        c.messages, c.panics, report.restarts, report.escalations
    );
    println!(
        "ledger started {} times; {} of {} transactions posted, total {} cents (expected {})",
        outcome.starts,
        outcome.posted,
        outcome.sent,
        outcome.total_cents,
        (0..n).map(amount).sum::<u64>()
    );
    if outcome.posted != n {
        return Err(format!("only {} of {n} transactions were posted", outcome.posted).into());
    }
    println!("the workload completed: every transaction posted once");
    Ok(())
}
