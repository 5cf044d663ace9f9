//! Restart intensity: within the limit children are restarted; one restart too many stops the
//! children in reverse order and fails the supervisor, which escalates to its parent.

mod supervisor_support;

use std::sync::Arc;
use std::time::Duration;

use hindsight_actors::supervisor::{
    ExitReason, RestartStats, Strategy, Supervisor, SupervisorEvent, SupervisorOptions,
};
use ractor::ActorStatus;
use supervisor_support::{ProbeMsg, Probes, send, wait_event, with_events};

#[tokio::test]
async fn exceeding_intensity_stops_children_in_reverse_and_fails_the_root() {
    let mut p = Probes::new();
    let (opts, mut events) = with_events(
        SupervisorOptions::new(Strategy::OneForOne)
            .label("root")
            .intensity(2, Duration::from_secs(60)),
    );
    let stats = opts.stats.clone();
    let (sup, join) = Supervisor::spawn(None, opts, vec![p.spec("a"), p.spec("b"), p.spec("c")])
        .await
        .unwrap();
    let mut a = p.starts(3).await.remove(0).1;
    for _ in 0..2 {
        send(&a, ProbeMsg::Panic);
        a = p.next_start().await.1;
    }
    send(&a, ProbeMsg::Panic);
    let e = wait_event(&mut events, |e| {
        matches!(e, SupervisorEvent::Escalated { .. })
    })
    .await;
    let SupervisorEvent::Escalated { supervisor, reason } = e else {
        unreachable!()
    };
    assert_eq!(supervisor, "root");
    assert!(reason.contains("restart intensity exceeded"), "{reason}");
    join.await.unwrap();
    assert_eq!(sup.get_status(), ActorStatus::Stopped);
    assert_eq!(
        p.log(),
        [
            "start:a", "start:b", "start:c", "start:a", "start:a", "stop:c", "stop:b"
        ]
    );
    assert_eq!(stats.total(), 2);
    assert_eq!(stats.escalations(), 1);
}

#[tokio::test]
async fn a_nested_supervisor_escalates_and_its_parent_restarts_it() {
    let mut p = Probes::new();
    let stats = Arc::new(RestartStats::new());
    let (inner_opts, mut inner_events) = with_events(
        SupervisorOptions::new(Strategy::OneForOne)
            .label("inner")
            .intensity(1, Duration::from_secs(60))
            .stats(stats.clone()),
    );
    let inner = Supervisor::child_spec("inner", inner_opts, vec![p.spec("x"), p.spec("y")]);
    let (root_opts, mut root_events) = with_events(
        SupervisorOptions::new(Strategy::OneForOne)
            .label("root")
            .stats(stats.clone()),
    );
    let (root, _join) = Supervisor::spawn(None, root_opts, vec![p.spec("a"), inner])
        .await
        .unwrap();
    let starts = p.starts(3).await;
    let inner_before = Supervisor::which_children(&root).await.unwrap()[1]
        .cell
        .clone()
        .unwrap();
    send(&starts[1].1, ProbeMsg::Panic);
    let x = p.next_start().await.1;
    send(&x, ProbeMsg::Panic);
    wait_event(
        &mut inner_events,
        |e| matches!(e, SupervisorEvent::Escalated { supervisor, .. } if supervisor == "inner"),
    )
    .await;
    let exited = wait_event(
        &mut root_events,
        |e| matches!(e, SupervisorEvent::ChildExited { child, .. } if child == "inner"),
    )
    .await;
    let SupervisorEvent::ChildExited { reason, .. } = exited else {
        unreachable!()
    };
    match reason {
        ExitReason::Failed(r) => assert!(r.contains("'inner'"), "{r}"),
        other => panic!("inner should have failed, got {other:?}"),
    }
    // The root restarts `inner`, which starts x and y again.
    let again = p.starts(2).await;
    assert_eq!(again[0].0, "x");
    assert_eq!(again[1].0, "y");
    let kids = Supervisor::which_children(&root).await.unwrap();
    assert_ne!(
        kids[1].cell.as_ref().unwrap().get_id(),
        inner_before.get_id()
    );
    assert_eq!(kids[1].restarts, 1);
    assert_eq!(
        p.log(),
        [
            "start:a", "start:x", "start:y", "start:x", // x restarted once
            "stop:y",  // inner gives up: y stopped (x panicked)
            "start:x", "start:y" // root restarted inner
        ]
    );
    assert_eq!(stats.child("inner/x"), 1);
    assert_eq!(stats.child("root/inner"), 1);
    assert_eq!(stats.total(), 2);
    assert_eq!(stats.escalations(), 1);
    root.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn restarts_older_than_the_period_no_longer_count() {
    let mut p = Probes::new();
    let (opts, mut events) = with_events(
        SupervisorOptions::new(Strategy::OneForOne).intensity(1, Duration::from_secs(1)),
    );
    let (sup, _join) = Supervisor::spawn(None, opts, vec![p.spec("a")])
        .await
        .unwrap();
    let mut a = p.next_start().await.1;
    for _ in 0..5 {
        send(&a, ProbeMsg::Panic);
        a = p.next_start().await.1;
        tokio::time::advance(Duration::from_millis(1001)).await;
    }
    let kids = Supervisor::which_children(&sup).await.unwrap();
    assert_eq!(kids[0].restarts, 5);
    assert!(events.try_recv().is_ok());
    while let Ok(e) = events.try_recv() {
        assert!(!matches!(e, SupervisorEvent::Escalated { .. }));
    }
    sup.stop_and_wait(None, None).await.unwrap();
}
