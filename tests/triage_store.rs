//! The recovery loop checkpoints through the redb store: a rollback after a restart of the
//! store restores the state the run checkpointed.

use std::sync::Arc;

use hindsight::store::{Store, StoreOptions};
use hindsight::triage::checkpoint::CheckpointStore;
use hindsight::{Checkpoint, now_ms};

#[tokio::test]
async fn checkpoints_of_the_loop_survive_a_reopen_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store: Arc<dyn CheckpointStore> =
            Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
        let cp = Checkpoint {
            run_id: "r".into(),
            step_index: 2,
            name: Some("before-write".into()),
            state: serde_json::json!({"rows": [1, 2, 3], "cursor": 1}),
            completed_steps: Vec::new(),
            created_ms: now_ms(),
        };
        store.put(&cp).await.unwrap();
    }
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let named = CheckpointStore::named(&store, "r", "before-write")
        .unwrap()
        .unwrap();
    assert_eq!(named.state["cursor"], 1);
    assert_eq!(
        CheckpointStore::latest(&store, "r")
            .unwrap()
            .unwrap()
            .step_index,
        2
    );
    assert!(
        CheckpointStore::named(&store, "r", "missing")
            .unwrap()
            .is_none()
    );
}
