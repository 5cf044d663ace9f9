//! Restart backoff measured on a paused tokio clock: 100 ms, then 200 ms, capped at 300 ms.

mod supervisor_support;

use std::time::Duration;

use hindsight_actors::supervisor::{
    Backoff, ChildState, Strategy, Supervisor, SupervisorEvent, SupervisorOptions,
};
use supervisor_support::{ProbeMsg, Probes, send, wait_event, with_events};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn restarts_wait_for_the_backoff_on_a_paused_clock() {
    let mut p = Probes::new();
    let (opts, mut events) = with_events(
        SupervisorOptions::new(Strategy::OneForOne)
            .intensity(10, Duration::from_secs(60))
            .backoff(Backoff {
                initial: Duration::from_millis(100),
                factor: 2.0,
                max: Duration::from_millis(300),
            }),
    );
    let (sup, _j) = Supervisor::spawn(None, opts, vec![p.spec("a")])
        .await
        .unwrap();
    let mut a = p.next_start().await.1;
    for expected in [100, 200, 300, 300] {
        let t0 = Instant::now();
        send(&a, ProbeMsg::Panic);
        let e = wait_event(&mut events, |e| {
            matches!(e, SupervisorEvent::RestartScheduled { .. })
        })
        .await;
        let SupervisorEvent::RestartScheduled {
            delay, children, ..
        } = e
        else {
            unreachable!()
        };
        assert_eq!(delay, Duration::from_millis(expected));
        assert_eq!(children, ["a"]);
        let kids = Supervisor::which_children(&sup).await.unwrap();
        assert_eq!(kids[0].state, ChildState::Restarting);
        assert!(kids[0].cell.is_none());
        a = p.next_start().await.1;
        assert_eq!(t0.elapsed(), Duration::from_millis(expected));
    }
    sup.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn no_backoff_restarts_without_delay() {
    assert_eq!(
        Backoff {
            initial: Duration::from_millis(10),
            factor: 3.0,
            max: Duration::from_secs(1)
        }
        .delay(3),
        Duration::from_millis(90)
    );
    let opts = SupervisorOptions::new(Strategy::OneForOne);
    assert!(opts.backoff.is_none());
}
