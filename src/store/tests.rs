//! Unit tests of the store: round trips, group commit, retention, compaction, monotonic keys.

use std::collections::BTreeMap;

use serde_json::json;

use super::tables::{OPEN_RUNS, OPEN_RUNS_INDEXED};
use super::*;
use crate::record::{ArmChoice, RunResult, RunState};
use crate::taxonomy::{ErrorClass, Step};

fn opts() -> StoreOptions {
    StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    }
}

/// A store in `dir` with `options` (the test options with a few fields set).
fn open_with(dir: &Path, options: StoreOptions) -> Store {
    Store::open(dir, options).unwrap()
}

fn run(id: &str, state: RunState) -> Run {
    Run {
        run_id: id.into(),
        task_id: format!("task-{id}"),
        state,
        attempts: 2,
        created_ms: 10,
        updated_ms: 20,
        tenant: Some("acme".into()),
        plan_id: Some("plan-1".into()),
        sop_id: None,
        reward: Some(0.75),
        reason: None,
    }
}

fn step(i: u32) -> Step {
    let mut metadata = BTreeMap::new();
    metadata.insert("stage".to_string(), json!("parse"));
    metadata.insert("nested".to_string(), json!({"a": [1, 2.5, null, "x"]}));
    Step {
        index: i,
        action: "tool_call".into(),
        tool_called: Some("pdf_parser".into()),
        tool_input: Some(json!({"path": "/tmp/a.pdf", "pages": [1, 2], "strict": true})),
        tool_output: Some(json!(null)),
        llm_output: None,
        error: Some("timed out".into()),
        exception_type: Some("TimeoutError".into()),
        error_class: Some(ErrorClass::Timeout),
        timestamp_ms: 123,
        latency_ms: 12.5,
        cost: 0.01,
        idempotent: true,
        idempotency_key: Some(format!("k{i}")),
        metadata,
    }
}

fn checkpoint(run_id: &str, i: u32) -> Checkpoint {
    Checkpoint {
        run_id: run_id.into(),
        step_index: i,
        name: Some(format!("cp{i}")),
        state: json!({"stage": i, "vars": {"x": -1, "big": u64::MAX, "f": 0.1}}),
        completed_steps: (0..=i).map(step).collect(),
        created_ms: 1000 + u64::from(i),
    }
}

fn experience(run_id: &str, time_ms: u64) -> ExperienceTuple {
    ExperienceTuple {
        run_id: run_id.into(),
        task_id: "t".into(),
        plan_id: "p".into(),
        user_id: Some("u".into()),
        context_features: [("file_type".to_string(), "pdf".to_string())].into(),
        arms: vec![ArmChoice {
            stage: "parse".into(),
            tool: "pdf_parser".into(),
            strategy: "ocr".into(),
            propensity: 0.25,
        }],
        steps: vec![step(0), step(1)],
        result: RunResult {
            state: RunState::Succeeded,
            passed: true,
            output: Some(json!({"rows": 3})),
            latency_ms: 40.0,
            cost: 0.02,
            attempts: 1,
        },
        reward: 0.9,
        user_feedback: None,
        time_ms,
    }
}

fn note(time_ms: u64, text: &str) -> NewDiaryEntry {
    NewDiaryEntry {
        time_ms,
        run_id: Some("r1".into()),
        kind: "note".into(),
        text: text.into(),
        tags: vec!["a".into()],
    }
}

#[tokio::test]
async fn every_record_type_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let r = run("r1", RunState::Executing);
    store.put_run(&r).await.unwrap();
    assert_eq!(store.get_run("r1").unwrap(), Some(r));
    assert_eq!(store.get_run("nope").unwrap(), None);

    let cp = checkpoint("r1", 2);
    store.put_checkpoint(&cp).await.unwrap();
    assert_eq!(store.latest_checkpoint("r1").unwrap(), Some(cp.clone()));
    assert_eq!(store.checkpoint_named("r1", "cp2").unwrap(), Some(cp));
    assert_eq!(store.checkpoint_named("r1", "other").unwrap(), None);
    // A checkpoint written straight from a state reads back as the one with its value.
    let state = BTreeMap::from([("stage", json!(3)), ("vars", json!({"big": u64::MAX}))]);
    let write = WriteOp::checkpoint_of_state("r2", 3, &state, 1003).unwrap();
    store.write_batch(vec![write]).await.unwrap();
    let from_value = Checkpoint {
        run_id: "r2".into(),
        step_index: 3,
        name: None,
        state: serde_json::to_value(&state).unwrap(),
        completed_steps: Vec::new(),
        created_ms: 1003,
    };
    assert_eq!(store.latest_checkpoint("r2").unwrap(), Some(from_value));

    let seq = store.append_diary(note(5, "hello")).await.unwrap();
    let tail = store.diary_tail(10).unwrap();
    assert_eq!(tail.len(), 1);
    let e = tail[0].as_ref().unwrap();
    assert_eq!((e.seq, e.time_ms, e.text.as_str()), (seq, 5, "hello"));

    let x = experience("r1", 7);
    let seq = store.append_experience(x.clone()).await.unwrap();
    let all = store.experience_all().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].0, seq);
    assert_eq!(all[0].1.as_ref().unwrap(), &x);

    let v = json!({"ok": true, "n": [1, -2, 3.5], "s": "é"});
    store.put_idempotent("idem-1", &v).await.unwrap();
    assert_eq!(store.get_idempotent("idem-1").unwrap(), Some(v));
    assert_eq!(store.get_idempotent("idem-2").unwrap(), None);

    const T: KvTable = KvTable::new("things");
    store.put(T, "a", &vec![1.5f64, 2.0]).await.unwrap();
    assert_eq!(store.get::<Vec<f64>>(T, "a").unwrap(), Some(vec![1.5, 2.0]));
    assert_eq!(
        store.get::<Vec<f64>>(KvTable::new("absent"), "a").unwrap(),
        None
    );
    store.delete(T, "a").await.unwrap();
    assert_eq!(store.get::<Vec<f64>>(T, "a").unwrap(), None);
    assert_eq!(store.kv_tables().unwrap(), vec!["things".to_string()]);
}

#[tokio::test]
async fn a_record_of_the_wrong_type_is_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    const T: KvTable = KvTable::new("mixed");
    store.put(T, "s", "a string").await.unwrap();
    store.put(T, "n", &7u8).await.unwrap();
    let err = store.get::<Run>(T, "s").unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { table, key, .. } if table == "kv.mixed" && key == "s"),
        "{err:?}"
    );
    let scanned = store.scan::<u8>(T).unwrap();
    assert_eq!(scanned.len(), 2);
    assert_eq!(scanned[0].0, "n");
    assert_eq!(scanned[0].1, Ok(7));
    assert!(scanned[1].1.is_err());
    // Read by keys: in their order, none where there is none, the damaged one in its place.
    let got = store.get_many::<u8>(T, ["s", "gone", "n"]).unwrap();
    assert!(matches!(&got[0], Some(Err(StoreError::Corrupt { key, .. })) if key == "s"));
    assert_eq!(got[1], None);
    assert_eq!(got[2], Some(Ok(7)));
    const NONE: KvTable = KvTable::new("never_written");
    assert_eq!(
        store.get_many::<u8>(NONE, ["a", "b"]).unwrap(),
        vec![None, None]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_are_all_acked_and_all_present() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut tasks = Vec::new();
    for w in 0..32u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..50u64 {
                let seq = store
                    .append_diary(note(w * 1000 + i, &format!("w{w} i{i}")))
                    .await
                    .unwrap();
                seqs.push((seq, format!("w{w} i{i}")));
            }
            seqs
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert_eq!(acked.len(), 32 * 50);
    let ws = store.writer_stats();
    assert_eq!(ws.requests, 32 * 50);
    assert_eq!(ws.failed_transactions, 0);
    assert!(ws.transactions <= ws.requests);
    let mut seqs: Vec<u64> = acked.iter().map(|a| a.0).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(
        seqs.len(),
        32 * 50,
        "every append got its own sequence number"
    );
    let stored = store.diary_since(0).unwrap();
    assert_eq!(stored.len(), 32 * 50);
    let by_seq: BTreeMap<u64, String> = stored
        .into_iter()
        .map(|e| e.map(|e| (e.seq, e.text)).unwrap())
        .collect();
    for (seq, text) in acked {
        assert_eq!(by_seq.get(&seq), Some(&text));
    }
}

#[tokio::test]
async fn settled_returns_after_every_write_queued_before_it_is_committed() {
    const T: KvTable = KvTable::new("queued");
    let dir = tempfile::tempdir().unwrap();
    // One commit per request, each synced: the writer is far behind the queue.
    let options = StoreOptions {
        durability: Durability::Immediate,
        ..StoreOptions::default()
    };
    let store = Store::open_with_batch_limit(dir.path(), options, 1).unwrap();
    for i in 0..100u64 {
        // Queued and not waited for, as an actor writes behind itself.
        drop(store.queue_batch(
            vec![WriteOp::put(T, &format!("{i:03}"), &i).unwrap()],
            Commit::Synced,
        ));
    }
    store.settled().await.unwrap();
    assert_eq!(
        store.scan::<u64>(T).unwrap().len(),
        100,
        "every queued write is on disk"
    );
}

#[tokio::test]
async fn a_batch_commits_together_and_reports_sequence_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let acks = store
        .write_batch(vec![
            WriteOp::run(&run("r1", RunState::Planned)).unwrap(),
            WriteOp::diary(&note(1, "a")).unwrap(),
            WriteOp::diary(&note(2, "b")).unwrap(),
            WriteOp::experience(&experience("r1", 3)).unwrap(),
        ])
        .await
        .unwrap();
    assert_eq!(acks, vec![None, Some(1), Some(2), Some(1)]);
    assert!(store.get_run("r1").unwrap().is_some());
}

#[tokio::test]
async fn only_the_last_k_checkpoints_are_kept_and_finish_keeps_the_final_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(
        dir.path(),
        StoreOptions {
            checkpoints_per_run: 3,
            ..opts()
        },
    );
    for i in 0..7 {
        store.put_checkpoint(&checkpoint("r1", i)).await.unwrap();
        store.put_checkpoint(&checkpoint("r10", i)).await.unwrap();
    }
    let kept: Vec<u32> = store
        .checkpoints("r1")
        .unwrap()
        .into_iter()
        .map(|(_, c)| c.unwrap().step_index)
        .collect();
    assert_eq!(kept, vec![4, 5, 6]);
    assert_eq!(
        store.checkpoints("r10").unwrap().len(),
        3,
        "a run id that extends another is separate"
    );

    store
        .finish_run(&run("r1", RunState::Succeeded))
        .await
        .unwrap();
    let kept: Vec<u32> = store
        .checkpoints("r1")
        .unwrap()
        .into_iter()
        .map(|(_, c)| c.unwrap().step_index)
        .collect();
    assert_eq!(kept, vec![6]);
    assert_eq!(store.checkpoints("r10").unwrap().len(), 3);
    assert_eq!(
        store.get_run("r1").unwrap().map(|r| r.state),
        Some(RunState::Succeeded)
    );
}

/// The step indices of the checkpoints `store` keeps of `run_id`.
fn kept_steps(store: &Store, run_id: &str) -> Vec<u32> {
    store
        .checkpoints(run_id)
        .unwrap()
        .into_iter()
        .map(|(_, c)| c.unwrap().step_index)
        .collect()
}

#[tokio::test]
async fn retention_holds_for_runs_written_here_and_for_runs_resumed_from_an_earlier_writer() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        checkpoints_per_run: 3,
        ..opts()
    };
    let store = open_with(dir.path(), options.clone());
    // Checkpoints before the run's record, then the record (new to the open-runs index), then
    // more: the writer goes by what the table holds, not by when the run was accepted.
    for i in 0..2 {
        store.put_checkpoint(&checkpoint("a", i)).await.unwrap();
    }
    store.put_run(&run("a", RunState::Executing)).await.unwrap();
    for i in 2..5 {
        store.put_checkpoint(&checkpoint("a", i)).await.unwrap();
    }
    assert_eq!(kept_steps(&store, "a"), vec![2, 3, 4]);
    // A run that ended and is under way again keeps its last checkpoint among the three.
    store.put_run(&run("a", RunState::Failed)).await.unwrap();
    store.put_run(&run("a", RunState::Executing)).await.unwrap();
    store.put_checkpoint(&checkpoint("a", 5)).await.unwrap();
    assert_eq!(kept_steps(&store, "a"), vec![3, 4, 5]);
    drop(store);
    // The next writer has not seen the run: it scans it once, then goes on from what it found.
    let store = open_with(dir.path(), options);
    for i in 6..8 {
        store.put_checkpoint(&checkpoint("a", i)).await.unwrap();
    }
    assert_eq!(kept_steps(&store, "a"), vec![5, 6, 7]);
    store
        .finish_run(&run("a", RunState::Succeeded))
        .await
        .unwrap();
    assert_eq!(kept_steps(&store, "a"), vec![7]);
}

/// The ids of the store's unfinished runs (every record readable).
fn unfinished_ids(store: &Store) -> Vec<String> {
    store
        .unfinished_runs()
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().run_id)
        .collect()
}

#[tokio::test]
async fn unfinished_runs_excludes_terminal_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.put_run(&run("a", RunState::Executing)).await.unwrap();
    store.put_run(&run("b", RunState::Failed)).await.unwrap();
    store.put_run(&run("c", RunState::Received)).await.unwrap();
    let ids = unfinished_ids(&store);
    assert_eq!(ids, vec!["a", "c"]);
    assert_eq!(store.list_runs().unwrap().len(), 3);
}

#[tokio::test]
async fn the_open_runs_index_follows_every_write_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.put_run(&run("a", RunState::Executing)).await.unwrap();
    store.put_run(&run("b", RunState::Received)).await.unwrap();
    store
        .put_run(&run("c", RunState::Validating))
        .await
        .unwrap();
    // A run that ends by a plain write leaves the index, as one that ends by finish_run does.
    store.put_run(&run("b", RunState::Failed)).await.unwrap();
    store
        .finish_run(&run("c", RunState::Succeeded))
        .await
        .unwrap();
    assert_eq!(store.open_run_count().unwrap(), 1);
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    let ids = unfinished_ids(&store);
    assert_eq!(ids, vec!["a"]);
    assert_eq!(store.list_runs().unwrap().len(), 3);
}

#[tokio::test]
async fn a_store_written_before_the_open_runs_index_gets_it_built_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.put_run(&run("a", RunState::Executing)).await.unwrap();
    store.put_run(&run("b", RunState::Succeeded)).await.unwrap();
    store.put_run(&run("c", RunState::Received)).await.unwrap();
    // What an earlier build left: no index, no marker.
    {
        let txn = store.inner.db.begin_write().unwrap();
        txn.delete_table(OPEN_RUNS).unwrap();
        txn.open_table(META)
            .unwrap()
            .remove(OPEN_RUNS_INDEXED)
            .unwrap();
        txn.commit().unwrap();
    }
    store.overwrite_raw("runs", "c", &[1, 0xFF]).unwrap();
    assert!(
        store.open_run_count().is_err(),
        "no index before the reopen"
    );
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    let found = store.unfinished_runs().unwrap();
    assert_eq!(found.len(), 2, "the unfinished run and the damaged one");
    assert_eq!(found[0].as_ref().unwrap().run_id, "a");
    assert!(found[1].is_err(), "a damaged record may be unfinished");
}

#[tokio::test]
async fn an_idempotency_record_can_be_deleted_in_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.put_idempotent("r/a0/s", &json!(1)).await.unwrap();
    store.put_idempotent("r/a0/t", &json!(2)).await.unwrap();
    store
        .write_batch(vec![
            WriteOp::delete_idempotent("r/a0/s"),
            WriteOp::delete_idempotent("r/a9/never-written"),
        ])
        .await
        .unwrap();
    assert_eq!(store.get_idempotent("r/a0/s").unwrap(), None);
    assert_eq!(store.get_idempotent("r/a0/t").unwrap(), Some(json!(2)));
}

#[tokio::test]
async fn a_run_s_end_removes_the_records_of_its_calls_and_only_those() {
    use super::idempotency::{agent_call_key, call_key, procedure_call_key, task_claim_key};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    // Run `r` and a run in flight whose id extends it (`r/a1/x`: a task id may hold `/a1/`),
    // a run `r2`, and a client's claim.
    store.put_run(&run("r", RunState::Executing)).await.unwrap();
    store
        .put_run(&run("r/a1/x", RunState::Executing))
        .await
        .unwrap();
    let ours = [
        call_key("r", 0, "extract"),
        call_key("r", 3, "extract"),
        agent_call_key("r", 1, "triage", 2, 0),
        procedure_call_key("r", 0, "triage", 1),
    ];
    let others = [
        call_key("r/a1/x", 0, "s"),
        agent_call_key("r/a1/x", 0, "s", 1, 1),
        call_key("r2", 0, "extract"),
        task_claim_key("acme", "k"),
    ];
    for key in ours.iter().chain(&others) {
        store.put_idempotent(key, &json!(1)).await.unwrap();
    }
    store
        .write_batch(vec![
            WriteOp::finish_run(&run("r", RunState::Succeeded)).unwrap(),
        ])
        .await
        .unwrap();
    for key in &ours {
        assert_eq!(store.get_idempotent(key).unwrap(), None, "{key}");
    }
    for key in &others {
        assert_eq!(store.get_idempotent(key).unwrap(), Some(json!(1)), "{key}");
    }
}

#[tokio::test]
async fn the_run_ttl_removes_only_finished_runs_past_it_and_their_records() {
    const OUTCOMES: KvTable = KvTable::new("outcomes");
    const TASKS: KvTable = KvTable::new("tasks");
    const RECORDS: [RunRecords; 2] = [
        RunRecords {
            table: OUTCOMES,
            key: RunKey::RunId,
        },
        RunRecords {
            table: TASKS,
            key: RunKey::TaskId,
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(
        dir.path(),
        StoreOptions {
            run_ttl_ms: Some(1000),
            ..opts()
        },
    );
    // (id, state, last update): old and done, old but unfinished, done but recent.
    for (id, state, updated) in [
        ("old", RunState::Succeeded, 100),
        ("stuck", RunState::Recovering, 100),
        ("new", RunState::Failed, 1500),
    ] {
        let r = Run {
            updated_ms: updated,
            ..run(id, state)
        };
        store.put_run(&r).await.unwrap();
        store.put_checkpoint(&checkpoint(id, 1)).await.unwrap();
        store.put(OUTCOMES, id, &id).await.unwrap();
        store.put(TASKS, &r.task_id, &id).await.unwrap();
    }
    let damaged = Run {
        updated_ms: 100,
        ..run("damaged", RunState::Succeeded)
    };
    store.put_run(&damaged).await.unwrap();
    store.overwrite_raw("runs", "damaged", &[1, 0xFF]).unwrap();

    // The plain compaction knows no run tables, and the diary and experience have no TTL here.
    let report = store.compact_with(2000, &RECORDS).unwrap();
    assert_eq!(report.runs_removed, 1);
    assert_eq!(report.damaged_kept, 1);
    assert_eq!(store.get_run("old").unwrap(), None);
    assert!(store.checkpoints("old").unwrap().is_empty());
    assert_eq!(store.get::<String>(OUTCOMES, "old").unwrap(), None);
    assert_eq!(store.get::<String>(TASKS, "task-old").unwrap(), None);
    for kept in ["stuck", "new"] {
        assert!(store.get_run(kept).unwrap().is_some(), "{kept}");
        assert_eq!(store.checkpoints(kept).unwrap().len(), 1, "{kept}");
        assert!(store.get::<String>(OUTCOMES, kept).unwrap().is_some());
        assert!(
            store
                .get::<String>(TASKS, &format!("task-{kept}"))
                .unwrap()
                .is_some()
        );
    }
    // The damaged record was written finished, so the open-runs index does not list it.
    assert_eq!(store.unfinished_runs().unwrap().len(), 1, "stuck");
    // Without a run TTL nothing of a run goes.
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(
        store.compact_with(u64::MAX, &RECORDS).unwrap().runs_removed,
        0
    );
}

#[tokio::test]
async fn the_run_ttl_takes_the_runs_idempotency_records_and_nothing_else() {
    use super::idempotency::{call_key, task_claim_key, task_claim_value};
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(
        dir.path(),
        StoreOptions {
            run_ttl_ms: Some(1000),
            ..opts()
        },
    );
    // `old` goes; `old/a1/x` (a run id that extends `old` like a call key) and `new` stay;
    // `stuck` is old but unfinished. `twice` has two runs of one task, one of them recent.
    let runs = [
        ("old", "task-old", RunState::Succeeded, 100),
        ("old/a1/x", "task-x", RunState::Succeeded, 1500),
        ("new", "task-new", RunState::Failed, 1500),
        ("stuck", "task-stuck", RunState::Recovering, 100),
        ("twice-1", "task-twice", RunState::Failed, 100),
        ("twice-2", "task-twice", RunState::Succeeded, 1500),
    ];
    for (id, task, state, updated) in runs {
        let r = Run {
            task_id: task.into(),
            updated_ms: updated,
            ..run(id, state)
        };
        store.put_run(&r).await.unwrap();
        store
            .put_idempotent(&call_key(id, 0, "s"), &json!(id))
            .await
            .unwrap();
        let claim = task_claim_key("acme", &format!("key-{id}"));
        store
            .put_idempotent(&claim, &task_claim_value(task))
            .await
            .unwrap();
    }
    // A claim of another tenant that happens to hold an unrelated value, and a damaged claim.
    store
        .put_idempotent("api:other:k", &json!({"no": "task"}))
        .await
        .unwrap();
    store
        .put_idempotent("api:acme:bad", &json!(0))
        .await
        .unwrap();
    store
        .overwrite_raw("idempotency", "api:acme:bad", &[1, 0xFF])
        .unwrap();

    let report = store.compact_with(2000, &[]).unwrap();
    assert_eq!(report.runs_removed, 2, "old and twice-1");
    // old's call and claim, and twice-1's call; the task `twice` still has a run, so its
    // claims stay.
    assert_eq!(report.idempotency_removed, 3);
    assert_eq!(report.damaged_kept, 1);
    assert_eq!(
        store.get_idempotent(&call_key("old", 0, "s")).unwrap(),
        None
    );
    assert_eq!(
        store.get_idempotent(&call_key("twice-1", 0, "s")).unwrap(),
        None
    );
    assert_eq!(
        store
            .get_idempotent(&task_claim_key("acme", "key-old"))
            .unwrap(),
        None
    );
    for id in ["old/a1/x", "new", "stuck", "twice-2"] {
        assert_eq!(
            store.get_idempotent(&call_key(id, 0, "s")).unwrap(),
            Some(json!(id)),
            "{id}"
        );
    }
    for id in ["old/a1/x", "new", "stuck", "twice-1", "twice-2"] {
        let claim = task_claim_key("acme", &format!("key-{id}"));
        assert!(store.get_idempotent(&claim).unwrap().is_some(), "{id}");
    }
    assert!(store.get_idempotent("api:other:k").unwrap().is_some());
    assert!(
        store.get_idempotent("api:acme:bad").is_err(),
        "the damaged claim is kept"
    );
}

#[tokio::test]
async fn compaction_applies_the_ttls() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            diary_ttl_ms: Some(100),
            experience_ttl_ms: Some(1000),
            ..opts()
        },
    )
    .unwrap();
    for t in [0u64, 500, 950, 1000, 1500] {
        store.append_diary(note(t, "n")).await.unwrap();
        store.append_experience(experience("r", t)).await.unwrap();
    }
    // now = 1100: diary keeps time >= 1000, experience keeps time >= 100.
    let report = store.compact(1100).unwrap();
    assert_eq!(
        report,
        CompactReport {
            diary_removed: 3,
            experience_removed: 1,
            runs_removed: 0,
            idempotency_removed: 0,
            damaged_kept: 0
        }
    );
    let times: Vec<u64> = store
        .diary_tail(100)
        .unwrap()
        .into_iter()
        .map(|e| e.unwrap().time_ms)
        .collect();
    assert_eq!(times, vec![1000, 1500]);
    assert_eq!(store.experience_all().unwrap().len(), 4);
    assert_eq!(store.compact(1100).unwrap(), CompactReport::default());
}

#[tokio::test]
async fn compaction_without_ttls_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.append_diary(note(0, "old")).await.unwrap();
    assert_eq!(store.compact(u64::MAX).unwrap(), CompactReport::default());
    assert_eq!(store.diary_tail(10).unwrap().len(), 1);
}

#[tokio::test]
async fn sequence_numbers_keep_increasing_after_reopen_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = StoreOptions {
        diary_ttl_ms: Some(1),
        experience_ttl_ms: Some(1),
        ..opts()
    };
    let (d, x) = {
        let store = Store::open(dir.path(), ttl.clone()).unwrap();
        store.append_diary(note(0, "a")).await.unwrap();
        let d = store.append_diary(note(0, "b")).await.unwrap();
        let x = store.append_experience(experience("r", 0)).await.unwrap();
        // Everything expires: the table is empty, yet keys must not restart.
        store.compact(1000).unwrap();
        assert!(store.diary_tail(10).unwrap().is_empty());
        (d, x)
    };
    let store = Store::open(dir.path(), ttl).unwrap();
    assert!(store.append_diary(note(0, "c")).await.unwrap() > d);
    assert!(store.append_experience(experience("r", 0)).await.unwrap() > x);
}

#[tokio::test]
async fn diary_tail_returns_the_last_n_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    for i in 0..10 {
        store.append_diary(note(i, &format!("n{i}"))).await.unwrap();
    }
    let texts: Vec<String> = store
        .diary_tail(3)
        .unwrap()
        .into_iter()
        .map(|e| e.unwrap().text)
        .collect();
    assert_eq!(texts, vec!["n7", "n8", "n9"]);
    assert_eq!(store.diary_since(8).unwrap().len(), 2);
}

#[tokio::test]
async fn stats_count_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.put_run(&run("r1", RunState::Planned)).await.unwrap();
    store.append_diary(note(0, "a")).await.unwrap();
    store.append_diary(note(0, "b")).await.unwrap();
    store.put(KvTable::new("x"), "k", &1u32).await.unwrap();
    let stats = store.stats().unwrap();
    let count = |name: &str| stats.records(name);
    assert_eq!(count("runs"), Some(1));
    assert_eq!(count("diary"), Some(2));
    assert_eq!(count("kv.x"), Some(1));
    assert_eq!(count("checkpoints"), Some(0));
    assert!(stats.file_bytes > 0);
}

#[tokio::test]
async fn one_request_per_transaction_still_acks_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with_batch_limit(dir.path(), opts(), 1).unwrap();
    let futs: Vec<_> = (0..20)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move { s.append_diary(note(i, "x")).await })
        })
        .collect();
    for f in futs {
        f.await.unwrap().unwrap();
    }
    assert_eq!(store.writer_stats().transactions, 20);
    assert_eq!(store.diary_tail(100).unwrap().len(), 20);
}

#[test]
fn opening_an_unusable_path_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a dir").unwrap();
    let err = Store::open(&blocker, opts()).unwrap_err();
    assert!(
        matches!(&err, StoreError::Open { path, .. } if path == &blocker.join(FILE_NAME)),
        "{err:?}"
    );
    assert!(err.to_string().contains("hindsight.redb"), "{err}");
}

#[test]
fn a_second_open_of_the_same_file_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path(), opts()).unwrap();
    assert!(matches!(
        Store::open(dir.path(), opts()),
        Err(StoreError::Open { .. })
    ));
}

#[test]
fn dropping_the_last_clone_releases_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let clone = store.clone();
    drop(store);
    drop(clone);
    Store::open(dir.path(), opts()).unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn requests_queued_during_a_commit_share_the_next_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    // Hold redb's write lock so the writer is stuck on its first batch while the rest queue.
    let blocker = store.inner.db.begin_write().unwrap();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move { s.append_diary(note(i, "q")).await })
        })
        .collect();
    // Every spawned task runs up to its await (its request sent) before this one resumes.
    tokio::task::yield_now().await;
    drop(blocker);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let ws = store.writer_stats();
    assert_eq!(ws.requests, 100);
    // The request the writer held while blocked, then the queue: one or two more transactions
    // depending on how many spawned tasks had sent theirs when the writer drained it (a loaded
    // machine may let a few in late). One commit per request would be 100.
    assert!(ws.transactions <= 3, "{ws:?}");
    assert_eq!(store.diary_tail(1000).unwrap().len(), 100);
}

#[test]
fn the_store_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Store>();
}

#[tokio::test]
async fn shrink_gives_the_space_of_removed_records_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(
        dir.path(),
        StoreOptions {
            diary_ttl_ms: Some(1),
            ..opts()
        },
    );
    for i in 0..400u64 {
        store
            .append_diary(note(i, &"x".repeat(4000)))
            .await
            .unwrap();
    }
    // An open store holds the file: shrinking it is refused, not done under the writer.
    assert!(matches!(shrink(dir.path()), Err(StoreError::Open { .. })));
    assert_eq!(store.compact(u64::MAX).unwrap().diary_removed, 400);
    drop(store);
    let report = shrink(dir.path()).unwrap();
    assert!(
        report.file_bytes_after * 2 < report.file_bytes_before,
        "{report:?}"
    );
    // The store opens and writes as before.
    let store = Store::open(dir.path(), opts()).unwrap();
    store.append_diary(note(1, "after")).await.unwrap();
    assert_eq!(store.diary_tail(10).unwrap().len(), 1);
}

#[test]
fn shrink_names_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = shrink(dir.path()).unwrap_err();
    assert!(e.to_string().contains("hindsight.redb"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_claims_of_one_key_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(dir.path(), opts());
    for round in 0..8 {
        let key = format!("api:acme:k{round}");
        let claims: Vec<_> = (0..32)
            .map(|i| {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    store
                        .claim_idempotent(&key, &json!({ "task_id": format!("t{i}") }))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for c in claims {
            outcomes.push(c.await.unwrap());
        }
        let won: Vec<usize> = (0..outcomes.len())
            .filter(|i| outcomes[*i] == Claim::Claimed)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {outcomes:?}");
        let winner = json!({ "task_id": format!("t{}", won[0]) });
        for (i, o) in outcomes.iter().enumerate() {
            if i != won[0] {
                assert_eq!(o, &Claim::Taken(winner.clone()), "round {round}, claim {i}");
            }
        }
        // The winner's own claim again is held; the record is the winner's.
        assert_eq!(
            store.claim_idempotent(&key, &winner).await.unwrap(),
            Claim::Held
        );
        assert_eq!(store.get_idempotent(&key).unwrap(), Some(winner));
    }
}

/// What one flipped byte of a compacted store file does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Flip {
    /// redb panics reading the file (at open the store turns this into an error: `Open`).
    Panic,
    /// The file no longer opens.
    Open,
    /// redb's integrity check finds a page whose checksum does not match.
    Checksum,
    /// A read reports a damaged record (the envelope does not decode).
    Record,
    /// A record reads back different, and nothing reports it.
    Silent,
    /// Nothing reads differently (reads), or the check passes (integrity check): the byte is in
    /// space no table uses.
    Unused,
}

fn dump(store: &Store) -> Result<String, StoreError> {
    let runs = store.list_runs()?;
    let diary = store.diary_tail(100_000)?;
    let mut out = String::new();
    for r in runs {
        out.push_str(&format!("{:?}\n", r?));
    }
    for d in diary {
        out.push_str(&format!("{:?}\n", d?));
    }
    Ok(out)
}

/// What a flipped byte at `offset` does: to plain reads of every run and diary entry (what
/// the daemon does), and to redb's integrity check of the file (page checksums).
fn classify_flip(file: &[u8], offset: usize, baseline: &str) -> (Flip, Flip) {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = file.to_vec();
    bytes[offset] ^= 0xFF;
    let path = dir.path().join(FILE_NAME);
    std::fs::write(&path, &bytes).unwrap();
    let read = match Store::open(dir.path(), opts()) {
        Err(_) => Flip::Open,
        Ok(store) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dump(&store))) {
                Err(_) => Flip::Panic,
                Ok(Err(_)) => Flip::Record,
                Ok(Ok(d)) if d == baseline => Flip::Unused,
                Ok(Ok(_)) => Flip::Silent,
            }
        }
    };
    std::fs::write(&path, &bytes).unwrap();
    let checked = std::panic::catch_unwind(|| match redb::Database::open(&path) {
        Ok(mut db) => Some(matches!(db.check_integrity(), Ok(true))),
        Err(_) => None,
    });
    let check = match checked {
        Err(_) => Flip::Panic,
        Ok(None) => Flip::Open,
        Ok(Some(false)) => Flip::Checksum,
        Ok(Some(true)) => Flip::Unused,
    };
    (read, check)
}

/// The probe's experiment (4 x 256 flipped bytes of a compacted copy, undetected), one byte at a
/// time so that each is classified: where did it land, and what notices it. The figures are in
/// docs/operations.md; `cargo test -p hindsight --lib flipped_bytes -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an experiment: 1024 copies of a store file, reported, not asserted"]
async fn flipped_bytes_of_a_compacted_file_by_where_they_land() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with(dir.path(), opts());
        for i in 0..300 {
            store
                .put_run(&run(&format!("run-{i}"), RunState::Succeeded))
                .await
                .unwrap();
            store
                .append_diary(NewDiaryEntry {
                    time_ms: i,
                    run_id: Some(format!("run-{i}")),
                    kind: "note".into(),
                    text: format!("note {i} about the run"),
                    tags: vec!["x".into()],
                })
                .await
                .unwrap();
        }
    }
    super::shrink(dir.path()).unwrap();
    let baseline = dump(&Store::open(dir.path(), opts()).unwrap()).unwrap();
    // Store::open may write (the open-runs index): the file as it left it.
    let file = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
    // redb's panics on damaged pages are counted, not printed.
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = fastrand::Rng::with_seed(56);
    let mut counts: BTreeMap<(Flip, Flip), usize> = BTreeMap::new();
    let mut pages: BTreeMap<Flip, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for _ in 0..4 * 256 {
        let offset = rng.usize(..file.len());
        let (read, check) = classify_flip(&file, offset, &baseline);
        *counts.entry((read, check)).or_default() += 1;
        pages.entry(check).or_default().insert(offset / 4096);
    }
    let _ = std::panic::take_hook();
    println!(
        "file {} bytes ({} pages of 4 KiB); 1024 flips, (plain reads, integrity check):",
        file.len(),
        file.len().div_ceil(4096)
    );
    for ((read, check), n) in &counts {
        println!("  {read:?} / {check:?}: {n}");
    }
    for (flip, p) in &pages {
        println!("integrity check {flip:?}: {} distinct pages", p.len());
    }
}

#[tokio::test]
async fn a_store_another_holder_has_open_is_refused_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let first = open_with(dir.path(), opts());
    let e = Store::open(dir.path(), opts())
        .map(drop)
        .expect_err("a second open of the same file must be refused")
        .to_string();
    assert!(
        e.contains("hindsight.redb") && e.contains("another process has it open"),
        "{e}"
    );
    drop(first);
}
