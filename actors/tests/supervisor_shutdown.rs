//! Ordered start and reverse-order graceful shutdown, with a per-child timeout then kill, and
//! through nested supervisors.

mod supervisor_support;

use std::time::Duration;

use hindsight_actors::supervisor::{Shutdown, Strategy, Supervisor, SupervisorOptions};
use supervisor_support::Probes;

#[tokio::test]
async fn children_start_in_order_and_stop_in_reverse() {
    let mut p = Probes::new();
    let specs = ["a", "b", "c", "d"].map(|id| p.spec(id)).to_vec();
    let (sup, join) = Supervisor::spawn(None, SupervisorOptions::new(Strategy::OneForOne), specs)
        .await
        .unwrap();
    p.starts(4).await;
    sup.stop(None);
    join.await.unwrap();
    assert_eq!(
        p.log(),
        [
            "start:a", "start:b", "start:c", "start:d", "stop:d", "stop:c", "stop:b", "stop:a"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_child_that_does_not_stop_in_time_is_killed_and_shutdown_goes_on() {
    let mut p = Probes::new();
    let slow = p
        .spec_with("slow", Some(Duration::from_secs(3600)), false)
        .shutdown(Shutdown::Timeout(Duration::from_millis(250)));
    let specs = vec![p.spec("a"), slow, p.spec("c")];
    let (sup, join) = Supervisor::spawn(None, SupervisorOptions::new(Strategy::OneForOne), specs)
        .await
        .unwrap();
    p.starts(3).await;
    let t0 = tokio::time::Instant::now();
    sup.stop(None);
    join.await.unwrap();
    // `slow` never logged its stop: it was killed in its post_stop after 250 ms (virtual).
    assert_eq!(
        p.log(),
        ["start:a", "start:slow", "start:c", "stop:c", "stop:a"]
    );
    assert_eq!(t0.elapsed(), Duration::from_millis(250));
}

#[tokio::test]
async fn brutal_kill_skips_post_stop() {
    let mut p = Probes::new();
    let specs = vec![p.spec("a"), p.spec("b").shutdown(Shutdown::BrutalKill)];
    let (sup, join) = Supervisor::spawn(None, SupervisorOptions::new(Strategy::OneForOne), specs)
        .await
        .unwrap();
    p.starts(2).await;
    sup.stop(None);
    join.await.unwrap();
    assert_eq!(p.log(), ["start:a", "start:b", "stop:a"]);
}

#[tokio::test]
async fn nested_supervisors_shut_down_depth_first_in_reverse() {
    let mut p = Probes::new();
    let inner = Supervisor::child_spec(
        "inner",
        SupervisorOptions::new(Strategy::OneForOne).label("inner"),
        vec![p.spec("x"), p.spec("y")],
    );
    let specs = vec![p.spec("a"), inner, p.spec("b")];
    let (sup, join) = Supervisor::spawn(None, SupervisorOptions::new(Strategy::OneForOne), specs)
        .await
        .unwrap();
    p.starts(4).await;
    sup.stop(None);
    join.await.unwrap();
    assert_eq!(
        p.log(),
        [
            "start:a", "start:x", "start:y", "start:b", "stop:b", "stop:y", "stop:x", "stop:a"
        ]
    );
}

#[tokio::test]
async fn a_child_failing_to_start_fails_the_supervisor_after_stopping_the_started_ones() {
    let mut p = Probes::new();
    let specs = vec![
        p.spec("a"),
        p.spec("b"),
        p.spec_with("bad", None, true),
        p.spec("c"),
    ];
    let Err(err) =
        Supervisor::spawn(None, SupervisorOptions::new(Strategy::OneForOne), specs).await
    else {
        panic!("spawn should fail");
    };
    assert!(err.to_string().contains("bad"), "{err}");
    p.starts(2).await;
    assert_eq!(p.log(), ["start:a", "start:b", "stop:b", "stop:a"]);
}
