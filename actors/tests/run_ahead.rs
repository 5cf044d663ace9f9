//! A run's idempotent calls may start while the writes before them are synced; a call that is
//! not idempotent never does: when it starts, the checkpoint that marks it in flight is on disk,
//! after an idempotent call that ran ahead of its own transition as well.

use std::sync::{Arc, Mutex, OnceLock};

use hindsight::store::Store;
use hindsight::tools::{CallContext, Tool, ToolFuture, ToolOutput, ToolSpec};
use hindsight::{RunState, Task};
use hindsight_actors::runtime::{Runtime, RuntimeOptions};

mod tools_support;

/// What a tool found on disk as it was called: the run's state and the call its latest
/// checkpoint marks in flight.
type Seen = Arc<Mutex<Vec<(String, Option<RunState>, Option<u64>)>>>;

/// A tool that reads the run's record and checkpoint from the store as it is called.
struct Looking {
    spec: ToolSpec,
    store: Arc<OnceLock<Store>>,
    seen: Seen,
}

impl Tool for Looking {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, _args: serde_json::Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            if let Some(store) = self.store.get() {
                let state = store.get_run(&ctx.run_id).unwrap().map(|r| r.state);
                let in_flight = store
                    .latest_checkpoint(&ctx.run_id)
                    .unwrap()
                    .and_then(|cp| cp.state["in_flight"].as_u64());
                self.seen
                    .lock()
                    .unwrap()
                    .push((self.spec.name.clone(), state, in_flight));
            }
            Ok(ToolOutput {
                value: serde_json::json!({"done": true}),
                latency_ms: 0.0,
                cost: 0.0,
            })
        })
    }
}

/// Two stages: `lookup` (idempotent) then `charge` (not).
fn options(dir: &std::path::Path, store: &Arc<OnceLock<Store>>, seen: &Seen) -> RuntimeOptions {
    let mut tools: Vec<(&str, Arc<dyn Tool>)> = Vec::new();
    for (stage, tool, idempotent) in [("find", "lookup", true), ("pay", "charge", false)] {
        let mut spec = ToolSpec::new(tool, "reads the store as it is called");
        spec.idempotent = idempotent;
        let looking = Looking {
            spec,
            store: store.clone(),
            seen: seen.clone(),
        };
        tools.push((stage, Arc::new(looking)));
    }
    tools_support::tool_stages(dir, "ahead", tools)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_is_not_idempotent_starts_only_once_its_checkpoint_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(OnceLock::new());
    let seen: Seen = Arc::default();
    let rt = Runtime::start(options(dir.path(), &store, &seen))
        .await
        .unwrap();
    store.set(rt.store().clone()).ok().unwrap();
    let submitter = rt.submitter();
    let mut runs = Vec::new();
    for i in 0..24 {
        let submitter = submitter.clone();
        runs.push(tokio::spawn(async move {
            submitter
                .orchestrate(Task {
                    task_id: format!("pay-{i}"),
                    goal: "find and pay".into(),
                    ..Task::default()
                })
                .await
        }));
    }
    drop(submitter);
    for run in runs {
        let outcome = run.await.unwrap().unwrap();
        assert_eq!(outcome.state, RunState::Succeeded, "{:?}", outcome.reason);
    }
    let seen = seen.lock().unwrap().clone();
    let charges: Vec<_> = seen.iter().filter(|(tool, ..)| tool == "charge").collect();
    assert_eq!(charges.len(), 24, "{seen:?}");
    for (_, state, in_flight) in charges {
        // The second stage's call (index 1) is marked in flight on disk, the run executing.
        assert_eq!(
            (*state, *in_flight),
            (Some(RunState::Executing), Some(1)),
            "{seen:?}"
        );
    }
    // The test's handle on the store goes first: shutdown waits for every one to close it.
    drop(store);
    rt.shutdown().await;
}
