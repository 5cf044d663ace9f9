//! Run-time child management through the supervisor's messages: start_child, terminate_child,
//! which_children, and errors for duplicate or unknown ids.

mod supervisor_support;

use hindsight_actors::supervisor::{
    ChildState, Restart, Strategy, Supervisor, SupervisorError, SupervisorOptions,
};
use supervisor_support::{ProbeMsg, Probes, send};

#[tokio::test]
async fn start_terminate_and_list_children_at_run_time() {
    let mut p = Probes::new();
    let (sup, _j) = Supervisor::spawn(
        None,
        SupervisorOptions::new(Strategy::OneForOne).label("rt"),
        vec![p.spec("a")],
    )
    .await
    .unwrap();
    p.next_start().await;

    let cell = Supervisor::start_child(&sup, p.spec("b").restart(Restart::Transient))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.next_start().await.1.get_id(), cell.get_id());
    let kids = Supervisor::which_children(&sup).await.unwrap();
    let ids: Vec<_> = kids.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(kids[1].restart, Restart::Transient);

    // A child started at run time is supervised like the others.
    send(&cell, ProbeMsg::Panic);
    let (id, _) = p.next_start().await;
    assert_eq!(id, "b");

    // Duplicate ids are refused.
    let dup = Supervisor::start_child(&sup, p.spec("a")).await.unwrap();
    assert!(matches!(dup, Err(SupervisorError::DuplicateChild { .. })));

    // A start failure is reported and nothing is added.
    let bad = Supervisor::start_child(&sup, p.spec_with("bad", None, true))
        .await
        .unwrap();
    assert!(
        matches!(bad, Err(SupervisorError::StartFailed { .. })),
        "{bad:?}"
    );

    Supervisor::terminate_child(&sup, "a")
        .await
        .unwrap()
        .unwrap();
    let unknown = Supervisor::terminate_child(&sup, "nope").await.unwrap();
    assert!(matches!(unknown, Err(SupervisorError::UnknownChild { .. })));
    let kids = Supervisor::which_children(&sup).await.unwrap();
    assert_eq!(kids.len(), 1);
    assert_eq!(kids[0].id, "b");
    assert_eq!(kids[0].state, ChildState::Running);
    assert_eq!(kids[0].restarts, 1);
    assert_eq!(p.log(), ["start:a", "start:b", "start:b", "stop:a"]);
    sup.stop_and_wait(None, None).await.unwrap();
    assert_eq!(p.log().last().unwrap(), "stop:b");
}

#[tokio::test]
async fn call_default_macro_reaches_the_supervisor() {
    let p = Probes::new();
    let (sup, _j) = Supervisor::spawn(
        None,
        SupervisorOptions::new(Strategy::OneForOne),
        vec![p.spec("a")],
    )
    .await
    .unwrap();
    let kids = hindsight_actors::call_default!(
        sup,
        hindsight_actors::supervisor::SupervisorMsg::WhichChildren
    )
    .await
    .unwrap();
    assert_eq!(kids.len(), 1);
    sup.stop_and_wait(None, None).await.unwrap();
}
