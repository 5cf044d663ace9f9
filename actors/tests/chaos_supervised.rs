//! A user-defined actor under a supervisor, fault-injected with the chaos harness: injected
//! panics are restarted one for one, the caller retries the calls that died with the actor, and
//! the workload completes.

use std::time::Duration;

use hindsight_actors::call::{CallError, call};
use hindsight_actors::chaos::{ChaosHandle, ChaosPlan, ChaosReport, run_under_chaos};
use hindsight_actors::supervisor::{ChildSpec, Strategy, Supervisor, SupervisorMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// The user's actor: doubles numbers, with chaos applied first thing in `handle`.
struct Doubler {
    chaos: ChaosHandle,
}

enum DoublerMsg {
    Work(u64, RpcReplyPort<u64>),
}

impl Actor for Doubler {
    type Msg = DoublerMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<DoublerMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<DoublerMsg>,
        message: DoublerMsg,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        self.chaos.inject("doubler").await;
        let DoublerMsg::Work(n, reply) = message;
        let _ = reply.send(n * 2);
        Ok(())
    }
}

#[derive(Debug, PartialEq)]
struct Outcome {
    sum: u64,
    dropped: u64,
    stale: u64,
}

/// Sends `n` work items one after the other, retrying each call that failed because the actor
/// died, until every item got its answer.
async fn workload(plan: ChaosPlan, n: u64) -> ChaosReport<Outcome> {
    run_under_chaos(plan, move |ctx| async move {
        let chaos = ctx.chaos.clone();
        let spec = ChildSpec::actor("doubler", None, move || {
            (
                Doubler {
                    chaos: chaos.clone(),
                },
                (),
            )
        });
        let options = ctx
            .supervisor_options(Strategy::OneForOne)
            .label("user")
            .intensity(100_000, Duration::from_secs(60));
        let (sup, join) = Supervisor::spawn(None, options, vec![spec]).await.unwrap();
        let current = |sup: ActorRef<SupervisorMsg>| async move {
            let kids = Supervisor::which_children(&sup).await.unwrap();
            kids[0].cell.clone().map(ActorRef::<DoublerMsg>::from)
        };
        let mut worker = current(sup.clone()).await.unwrap();
        let mut out = Outcome {
            sum: 0,
            dropped: 0,
            stale: 0,
        };
        for i in 0..n {
            let mut attempts = 0;
            loop {
                attempts += 1;
                assert!(attempts < 100_000, "item {i} never got through");
                match call(&worker, |tx| DoublerMsg::Work(i, tx)).await {
                    Ok(v) => {
                        assert_eq!(v, 2 * i);
                        out.sum += v;
                        break;
                    }
                    Err(e @ (CallError::Dropped { .. } | CallError::NotDelivered { .. })) => {
                        if matches!(e, CallError::Dropped { .. }) {
                            out.dropped += 1;
                        } else {
                            out.stale += 1;
                            tokio::task::yield_now().await;
                        }
                        if let Some(w) = current(sup.clone()).await {
                            worker = w;
                        }
                    }
                    Err(e) => panic!("unexpected call error: {e}"),
                }
            }
        }
        sup.stop(None);
        join.await.unwrap();
        out
    })
    .await
}

fn plan(text: &str) -> ChaosPlan {
    ChaosPlan::parse(text, "test.toml").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_percent_panics_over_ten_thousand_messages_are_all_restarted() {
    hindsight_actors::chaos::quiet_injected_panics();
    let n = 10_000;
    let report = workload(
        plan("seed = 11\n[[actors]]\nname = \"doubler\"\npanic_probability = 0.01\n"),
        n,
    )
    .await;
    let c = report.counts;
    println!(
        "messages {}, injected panics {}, restarts {}, dropped calls {}, stale refs {}",
        c.messages, c.panics, report.restarts, report.output.dropped, report.output.stale
    );
    assert_eq!(
        report.output.sum,
        n * (n - 1),
        "every item answered exactly once"
    );
    assert!(
        (50..=160).contains(&c.panics),
        "about 1% panics: {}",
        c.panics
    );
    assert_eq!(report.restarts, c.panics, "one restart per injected panic");
    // Each panic dropped the call being handled; a call sent to the dying incarnation before it
    // was gone is dropped too (never handled, so never counted as a message).
    assert!(
        report.output.dropped >= c.panics,
        "each panic dropped its call"
    );
    assert_eq!(
        c.messages,
        n + c.panics,
        "each panicked item was sent again"
    );
    assert_eq!(report.escalations, 0);
}

#[tokio::test]
async fn panic_every_n_messages_gives_an_exact_restart_count_and_the_same_run_twice() {
    hindsight_actors::chaos::quiet_injected_panics();
    let text = "seed = 3\n[[actors]]\nname = \"doubler\"\npanic_every = 100\n";
    let first = workload(plan(text), 1_000).await;
    // Messages 100, 200, ..., 1000 panic: 1,000 items + 10 retries = 1,010 messages.
    assert_eq!(first.counts.panics, 10);
    assert_eq!(first.restarts, 10);
    assert_eq!(first.counts.messages, 1_010);
    let again = workload(plan(text), 1_000).await;
    assert_eq!(again.counts, first.counts);
    assert_eq!(again.output.sum, first.output.sum);
}

#[tokio::test]
async fn an_empty_plan_injects_nothing() {
    let report = workload(ChaosPlan::default(), 500).await;
    assert_eq!(report.counts.panics, 0);
    assert_eq!(report.restarts, 0);
    assert_eq!(report.counts.messages, 500);
    assert_eq!(report.output.dropped, 0);
}
