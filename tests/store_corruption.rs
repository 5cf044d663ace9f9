//! Damaged records: reading one gives `StoreError::Corrupt` naming its table and key, never a
//! panic, and every other record stays readable (also after reopening and compacting).

use hindsight::record::{Checkpoint, ExperienceTuple, Run, RunResult, RunState};
use hindsight::store::{
    Durability, KvTable, NewDiaryEntry, Store, StoreError, StoreOptions, envelope,
};
use serde_json::json;

const THINGS: KvTable = KvTable::new("things");

fn opts() -> StoreOptions {
    StoreOptions {
        durability: Durability::None,
        diary_ttl_ms: Some(10),
        experience_ttl_ms: Some(10),
        ..StoreOptions::default()
    }
}

fn note(i: u64) -> NewDiaryEntry {
    NewDiaryEntry {
        time_ms: 1000 + i,
        run_id: None,
        kind: "note".into(),
        text: format!("note {i} with some text"),
        tags: vec!["t".into()],
    }
}

fn run(id: &str) -> Run {
    Run {
        run_id: id.into(),
        task_id: "task".into(),
        state: RunState::Executing,
        attempts: 1,
        created_ms: 1,
        updated_ms: 2,
        tenant: None,
        plan_id: Some("plan".into()),
        sop_id: None,
        reward: None,
        reason: None,
    }
}

fn experience(i: u64) -> ExperienceTuple {
    ExperienceTuple {
        run_id: format!("r{i}"),
        task_id: "t".into(),
        plan_id: "p".into(),
        user_id: None,
        context_features: Default::default(),
        arms: Vec::new(),
        steps: Vec::new(),
        result: RunResult {
            state: RunState::Succeeded,
            passed: true,
            output: Some(json!({"i": i})),
            latency_ms: 1.0,
            cost: 0.0,
            attempts: 1,
        },
        reward: 1.0,
        user_feedback: None,
        time_ms: 1000 + i,
    }
}

fn assert_corrupt<T: std::fmt::Debug>(r: Result<T, StoreError>, table: &str, key: &str) {
    match r {
        Err(StoreError::Corrupt {
            table: t,
            key: k,
            reason,
        }) => {
            assert_eq!((t.as_str(), k.as_str()), (table, key), "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected a Corrupt error for {table}/{key}, got {other:?}"),
    }
}

fn check_damage(store: &Store, cp_key: &str) {
    let tail = store.diary_tail(10).unwrap();
    assert_eq!(tail.len(), 5);
    for (i, entry) in tail.into_iter().enumerate() {
        let seq = i as u64 + 1;
        if seq == 2 || seq == 4 {
            assert_corrupt(entry, "diary", &seq.to_string());
        } else {
            assert_eq!(entry.unwrap().text, format!("note {seq} with some text"));
        }
    }
    for (seq, x) in store.experience_all().unwrap() {
        if seq == 3 {
            assert_corrupt(x, "experience", "3");
        } else {
            assert_eq!(x.unwrap().run_id, format!("r{seq}"));
        }
    }
    assert_corrupt(store.get_run("r2"), "runs", "r2");
    assert_eq!(store.get_run("r1").unwrap().unwrap().run_id, "r1");
    let runs = store.list_runs().unwrap();
    assert_eq!(runs.len(), 5);
    assert_eq!(runs.iter().filter(|r| r.is_err()).count(), 1);
    assert_eq!(store.unfinished_runs().unwrap().len(), 5);

    assert_corrupt(store.get::<(u64, String)>(THINGS, "k3"), "kv.things", "k3");
    assert_eq!(
        store.get::<(u64, String)>(THINGS, "k1").unwrap(),
        Some((1, "thing".to_string()))
    );
    let scanned = store.scan::<(u64, String)>(THINGS).unwrap();
    assert_eq!(scanned.iter().filter(|(_, r)| r.is_err()).count(), 1);

    assert_corrupt(store.get_idempotent("idem5"), "idempotency", "idem5");
    assert_eq!(
        store.get_idempotent("idem4").unwrap(),
        Some(json!({"i": 4}))
    );

    assert_corrupt(store.latest_checkpoint("r1"), "checkpoints", cp_key);
    let cps = store.checkpoints("r1").unwrap();
    assert_eq!(cps[0].1.as_ref().unwrap().step_index, 0);
    assert_corrupt(cps[1].1.clone(), "checkpoints", cp_key);
}

#[tokio::test]
async fn damaged_records_are_typed_errors_and_the_rest_reads_fine() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    for i in 1..=5 {
        store.append_diary(note(i)).await.unwrap();
        store.append_experience(experience(i)).await.unwrap();
        store.put_run(&run(&format!("r{i}"))).await.unwrap();
        store
            .put(THINGS, &format!("k{i}"), &(i, "thing"))
            .await
            .unwrap();
        store
            .put_idempotent(&format!("idem{i}"), &json!({"i": i}))
            .await
            .unwrap();
    }
    for step in 0..2 {
        store
            .put_checkpoint(&Checkpoint {
                run_id: "r1".into(),
                step_index: step,
                name: None,
                state: json!({"step": step}),
                completed_steps: Vec::new(),
                created_ms: 5,
            })
            .await
            .unwrap();
    }

    // A wrong version byte, a truncated body, an empty value, trailing garbage.
    let mut wrong_version = envelope::encode(&note(2)).unwrap();
    wrong_version[0] = 0xEE;
    let good = envelope::encode(&note(4)).unwrap();
    let truncated = &good[..good.len() / 2];
    let mut trailing = envelope::encode(&(3u64, "thing")).unwrap();
    trailing.extend_from_slice(&[0xFF; 7]);
    store.overwrite_raw("diary", "2", &wrong_version).unwrap();
    store.overwrite_raw("diary", "4", truncated).unwrap();
    store.overwrite_raw("experience", "3", &[]).unwrap();
    store.overwrite_raw("runs", "r2", &[1, 0xFF, 0xFF]).unwrap();
    store.overwrite_raw("kv.things", "k3", &trailing).unwrap();
    store.overwrite_raw("idempotency", "idem5", &[1]).unwrap();
    let cp_seq = store.checkpoints("r1").unwrap()[1].0;
    let cp_key = format!("r1#{cp_seq}");
    store
        .overwrite_raw("checkpoints", &cp_key, &[1, 200])
        .unwrap();

    check_damage(&store, &cp_key);
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    check_damage(&store, &cp_key);

    // Compaction removes every readable expired entry and keeps (and counts) the damaged ones.
    let report = store.compact(u64::MAX).unwrap();
    assert_eq!(report.diary_removed, 3);
    assert_eq!(report.experience_removed, 4);
    assert_eq!(report.damaged_kept, 3);

    // Writing after the damage still works, with keys past the damaged ones.
    let seq = store.append_diary(note(6)).await.unwrap();
    assert_eq!(seq, 6);
    assert_eq!(store.diary_tail(1).unwrap()[0].as_ref().unwrap().seq, 6);
}

#[tokio::test]
async fn the_damaged_record_error_reads_as_a_sentence_naming_table_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.append_diary(note(1)).await.unwrap();
    store.overwrite_raw("diary", "1", &[7, 1, 2]).unwrap();
    let err = store.diary_tail(1).unwrap().remove(0).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("record 1 in table diary"), "{text}");
    assert!(text.contains("version 7"), "{text}");
}
