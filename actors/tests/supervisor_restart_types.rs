//! Each restart type against each way of ending: normal exit, panic, handler error, kill.

mod supervisor_support;

use hindsight_actors::supervisor::{
    ChildState, ExitReason, Restart, Strategy, Supervisor, SupervisorEvent, SupervisorOptions,
};
use supervisor_support::{ProbeMsg, Probes, send, wait_event, with_events};

#[derive(Clone, Copy, Debug)]
enum End {
    Exit,
    Panic,
    Fail,
    Kill,
}

/// Runs one child of `restart` type, ends it with `end`, and returns whether it was restarted
/// (and checks the supervisor's view accordingly).
async fn case(restart: Restart, end: End) -> bool {
    let mut p = Probes::new();
    let (opts, mut events) = with_events(SupervisorOptions::new(Strategy::OneForOne).label("rt"));
    let (sup, _j) = Supervisor::spawn(None, opts, vec![p.spec("w").restart(restart)])
        .await
        .unwrap();
    let (_, cell) = p.next_start().await;
    match end {
        End::Exit => send(&cell, ProbeMsg::Exit),
        End::Panic => send(&cell, ProbeMsg::Panic),
        End::Fail => send(&cell, ProbeMsg::Fail),
        End::Kill => cell.kill(),
    }
    let SupervisorEvent::ChildExited {
        reason,
        will_restart,
        ..
    } = wait_event(&mut events, |e| {
        matches!(e, SupervisorEvent::ChildExited { .. })
    })
    .await
    else {
        unreachable!()
    };
    match end {
        End::Exit => assert_eq!(reason, ExitReason::Normal(None)),
        End::Panic | End::Fail => assert!(matches!(reason, ExitReason::Failed(_)), "{reason:?}"),
        End::Kill => assert!(matches!(reason, ExitReason::Killed(_)), "{reason:?}"),
    }
    if will_restart {
        let (id, new_cell) = p.next_start().await;
        assert_eq!(id, "w");
        assert_ne!(new_cell.get_id(), cell.get_id());
    }
    let kids = Supervisor::which_children(&sup).await.unwrap();
    match (will_restart, restart) {
        (true, _) => {
            assert_eq!(kids.len(), 1);
            assert_eq!(kids[0].state, ChildState::Running);
            assert_eq!(kids[0].restarts, 1);
        }
        (false, Restart::Temporary) => assert!(kids.is_empty(), "temporary child removed"),
        (false, _) => {
            assert_eq!(kids.len(), 1);
            assert_eq!(kids[0].state, ChildState::Terminated);
            assert!(kids[0].cell.is_none());
        }
    }
    sup.stop_and_wait(None, None).await.unwrap();
    will_restart
}

#[tokio::test]
async fn permanent_is_always_restarted() {
    for end in [End::Exit, End::Panic, End::Fail, End::Kill] {
        assert!(case(Restart::Permanent, end).await, "{end:?}");
    }
}

#[tokio::test]
async fn transient_is_restarted_only_after_an_abnormal_exit() {
    assert!(!case(Restart::Transient, End::Exit).await);
    for end in [End::Panic, End::Fail, End::Kill] {
        assert!(case(Restart::Transient, end).await, "{end:?}");
    }
}

#[tokio::test]
async fn temporary_is_never_restarted() {
    for end in [End::Exit, End::Panic, End::Fail, End::Kill] {
        assert!(!case(Restart::Temporary, end).await, "{end:?}");
    }
}
