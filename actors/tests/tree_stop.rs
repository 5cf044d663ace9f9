//! A tree stopped with runs in flight: `shutdown` returns with the store released (a new tree
//! opens it at once), the runs left as a crash would leave them, and the next start resumes
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hindsight::tools::{CallContext, Tool, ToolFuture, ToolOutput, ToolSpec};
use hindsight::{RunState, Task};
use hindsight_actors::runtime::{Runtime, RuntimeOptions};

mod tools_support;

/// A tool whose calls wait until it is opened, counting them.
struct Held {
    spec: ToolSpec,
    calls: Arc<AtomicUsize>,
    called: Arc<tokio::sync::Notify>,
    open: bool,
}

impl Tool for Held {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, _args: serde_json::Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.called.notify_one();
            if !self.open {
                std::future::pending::<()>().await;
            }
            Ok(ToolOutput {
                value: serde_json::json!({"done": true}),
                latency_ms: 0.0,
                cost: 0.0,
            })
        })
    }
}

fn options(
    dir: &std::path::Path,
    open: bool,
    calls: &Arc<AtomicUsize>,
    called: &Arc<tokio::sync::Notify>,
) -> RuntimeOptions {
    let mut spec = ToolSpec::new("slow", "waits on the world");
    spec.idempotent = true;
    let held = Held {
        spec,
        calls: calls.clone(),
        called: called.clone(),
        open,
    };
    tools_support::tool_stages(dir, "held", vec![("only", Arc::new(held))])
}

fn task(i: usize) -> Task {
    Task {
        task_id: format!("held-{i}"),
        goal: "wait on the world".into(),
        ..Task::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_go_of_runs_waiting_on_a_tool_and_the_next_start_resumes_them() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let called = Arc::new(tokio::sync::Notify::new());
    let rt = Runtime::start(options(dir.path(), false, &calls, &called))
        .await
        .unwrap();
    let submitter = rt.submitter();
    let mut waiting = Vec::new();
    for i in 0..4 {
        let submitter = submitter.clone();
        waiting.push(tokio::spawn(
            async move { submitter.orchestrate(task(i)).await },
        ));
    }
    drop(submitter);
    while calls.load(Ordering::SeqCst) < 4 {
        called.notified().await;
    }
    // Every run is inside the tool's call, which never returns.
    rt.shutdown().await;
    for w in waiting {
        // The callers are answered (with an error: the tree stopped), not left hanging.
        let _ = w.await.unwrap();
    }
    // The store was released as shutdown returned: a new tree opens it at once, and resumes
    // every run, which ends this time.
    let calls_after = Arc::new(AtomicUsize::new(0));
    let rt = Runtime::start(options(dir.path(), true, &calls_after, &called))
        .await
        .unwrap();
    for i in 0..4 {
        let outcome = rt.orchestrate(task(i)).await.unwrap();
        assert_eq!(outcome.state, RunState::Succeeded, "{:?}", outcome.reason);
    }
    assert_eq!(
        calls_after.load(Ordering::SeqCst),
        4,
        "each run called again"
    );
    rt.shutdown().await;
}
