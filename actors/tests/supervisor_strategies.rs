//! Each restart strategy: which children are stopped (in reverse order) and restarted (in order).

mod supervisor_support;

use hindsight_actors::supervisor::{ChildState, Strategy, Supervisor, SupervisorOptions};
use supervisor_support::{ProbeMsg, Probes, send};

#[tokio::test]
async fn one_for_one_restarts_only_the_failed_child() {
    let mut p = Probes::new();
    let opts = SupervisorOptions::new(Strategy::OneForOne).label("s");
    let stats = opts.stats.clone();
    let (sup, _j) = Supervisor::spawn(None, opts, vec![p.spec("a"), p.spec("b"), p.spec("c")])
        .await
        .unwrap();
    let first = p.starts(3).await;
    let before = Supervisor::which_children(&sup).await.unwrap();
    send(&first[1].1, ProbeMsg::Panic);
    let (id, _) = p.next_start().await;
    assert_eq!(id, "b");
    let after = Supervisor::which_children(&sup).await.unwrap();
    assert_eq!(after.len(), 3);
    for i in [0, 2] {
        assert_eq!(
            before[i].cell.as_ref().unwrap().get_id(),
            after[i].cell.as_ref().unwrap().get_id()
        );
    }
    assert_ne!(
        before[1].cell.as_ref().unwrap().get_id(),
        after[1].cell.as_ref().unwrap().get_id()
    );
    assert!(after.iter().all(|c| c.state == ChildState::Running));
    assert_eq!(after[1].restarts, 1);
    assert_eq!(stats.total(), 1);
    assert_eq!(stats.child("s/b"), 1);
    assert_eq!(p.log(), ["start:a", "start:b", "start:c", "start:b"]);
    sup.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn one_for_all_stops_the_others_in_reverse_and_restarts_all_in_order() {
    let mut p = Probes::new();
    let opts = SupervisorOptions::new(Strategy::OneForAll);
    let stats = opts.stats.clone();
    let (sup, _j) = Supervisor::spawn(None, opts, vec![p.spec("a"), p.spec("b"), p.spec("c")])
        .await
        .unwrap();
    let first = p.starts(3).await;
    send(&first[1].1, ProbeMsg::Panic);
    let again = p.starts(3).await;
    let ids: Vec<_> = again.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        p.log(),
        [
            "start:a", "start:b", "start:c", // initial
            "stop:c", "stop:a", // the survivors, in reverse order (b panicked: no post_stop)
            "start:a", "start:b", "start:c"
        ]
    );
    assert_eq!(stats.total(), 3);
    sup.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn rest_for_one_restarts_the_child_and_those_started_after_it() {
    let mut p = Probes::new();
    let opts = SupervisorOptions::new(Strategy::RestForOne);
    let (sup, _j) = Supervisor::spawn(
        None,
        opts,
        vec![p.spec("a"), p.spec("b"), p.spec("c"), p.spec("d")],
    )
    .await
    .unwrap();
    let first = p.starts(4).await;
    send(&first[1].1, ProbeMsg::Fail);
    let again = p.starts(3).await;
    let ids: Vec<_> = again.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["b", "c", "d"]);
    assert_eq!(
        p.log(),
        [
            "start:a", "start:b", "start:c", "start:d", "stop:d", "stop:c", "start:b", "start:c",
            "start:d"
        ]
    );
    let kids = Supervisor::which_children(&sup).await.unwrap();
    assert_eq!(
        kids[0].cell.as_ref().unwrap().get_id(),
        first[0].1.get_id(),
        "a is untouched"
    );
    sup.stop_and_wait(None, None).await.unwrap();
}
