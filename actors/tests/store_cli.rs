//! The `hindsight` binary's store commands: output formats, damaged records reported without a
//! crash, and one-sentence errors with exit code 2.

mod cli_support;

use std::path::Path;

use cli_support::hindsight;

use hindsight::record::{Run, RunState};
use hindsight::store::{Durability, NewDiaryEntry, Store, StoreOptions};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn seeded(dir: &Path) {
    let store = Store::open(
        dir,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    for i in 1..=4u64 {
        store
            .append_diary(NewDiaryEntry {
                time_ms: 1_795_311_000_000 + i,
                run_id: Some("r1".into()),
                kind: "note".into(),
                text: format!("entry number {i}"),
                tags: vec!["x".into()],
            })
            .await
            .unwrap();
    }
    for (id, state) in [("r1", RunState::Succeeded), ("r2", RunState::Recovering)] {
        store
            .put_run(&Run {
                run_id: id.into(),
                task_id: format!("task-{id}"),
                state,
                attempts: 2,
                created_ms: 1,
                updated_ms: 2,
                tenant: None,
                plan_id: None,
                sop_id: None,
                reward: Some(0.5),
                reason: None,
            })
            .await
            .unwrap();
    }
    store.overwrite_raw("diary", "3", &[1, 0xFF]).unwrap();
}

#[tokio::test]
async fn diary_tail_reports_a_damaged_entry_and_prints_the_others() {
    let dir = tempfile::tempdir().unwrap();
    seeded(dir.path()).await;

    let out = hindsight(dir.path(), &["diary", "tail", "-n", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    for i in [1, 2, 4] {
        assert!(stdout.contains(&format!("entry number {i}")), "{stdout}");
    }
    assert!(!stdout.contains("entry number 3"), "{stdout}");
    assert!(stdout.contains("2026-11-22T01:30:00.001Z"), "{stdout}");
    assert!(
        stderr.contains("record 3 in table diary is damaged"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let out = hindsight(dir.path(), &["diary", "tail", "-n", "2", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let entries: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let seqs: Vec<u64> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![4], "the last two are 3 (damaged) and 4");
    assert!(text(&out.stderr).contains("record 3 in table diary"));
}

#[tokio::test]
async fn runs_list_json_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    seeded(dir.path()).await;
    let out = hindsight(dir.path(), &["runs", "list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["run_id"], "r1");
    assert_eq!(runs[0]["task_id"], "task-r1");
    assert_eq!(runs[0]["state"], "succeeded");
    assert_eq!(runs[1]["state"], "recovering");
    assert_eq!(runs[1]["attempts"], 2);

    let out = hindsight(dir.path(), &["runs", "list"]);
    assert!(text(&out.stdout).contains("recovering"));
}

#[tokio::test]
async fn store_stats_and_compact() {
    let dir = tempfile::tempdir().unwrap();
    seeded(dir.path()).await;
    let out = hindsight(dir.path(), &["store", "stats", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(stats["file_bytes"].as_u64().unwrap() > 0);
    let diary = stats["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "diary")
        .unwrap();
    assert_eq!(diary["records"], 4);

    // Without a TTL nothing is removed; the file is still compacted in place.
    let out = hindsight(dir.path(), &["store", "compact", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["diary_removed"], 0);
    assert!(report["file_bytes_after"].as_u64().unwrap() > 0);

    let out = hindsight(
        dir.path(),
        &["store", "compact", "--diary-ttl", "1ms", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["diary_removed"], 3);
    assert_eq!(report["damaged_kept"], 1);
}

/// Record counts of the tables that hold any.
fn records(data: &Path) -> std::collections::BTreeMap<String, u64> {
    let out = hindsight(data, &["store", "stats", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    stats["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["table"].as_str().unwrap().to_string(),
                t["records"].as_u64().unwrap(),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn the_run_ttl_removes_finished_runs_with_everything_that_belongs_to_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("kept");
    let out = hindsight(
        dir.path(),
        &[
            "bench",
            "learning",
            "--tasks",
            "30",
            "--keep",
            data.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let before = records(&data);
    for table in ["runs", "checkpoints", "kv.tasks", "kv.outcomes"] {
        assert_eq!(before.get(table), Some(&30), "{table}: {before:?}");
    }
    // The idempotency records went with each run's end already; nothing is open.
    assert_eq!(before.get("idempotency"), None, "{before:?}");
    assert_eq!(before.get("open_runs"), None, "{before:?}");

    // A TTL longer than the runs' age removes nothing.
    let out = hindsight(&data, &["store", "compact", "--run-ttl", "30d", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["runs_removed"], 0);
    assert_eq!(records(&data), before);

    let out = hindsight(&data, &["store", "compact", "--run-ttl", "1ms", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["runs_removed"], 30);
    // The file is compacted in place after the removal (how much it gives back depends on
    // where the freed pages lie; `store::tests::shrink_gives_the_space_of_removed_records_back`
    // measures it), and never grows.
    let (was, is) = (
        report["file_bytes_before"].as_u64().unwrap(),
        report["file_bytes_after"].as_u64().unwrap(),
    );
    assert!(is > 0 && is <= was, "{was} -> {is}");
    let after = records(&data);
    for table in [
        "runs",
        "checkpoints",
        "kv.tasks",
        "kv.outcomes",
        "kv.experience_logged",
        "kv.reflect_retry_counts",
    ] {
        assert_eq!(after.get(table), None, "{table}: {after:?}");
    }
    // What was learned stays: the experience log, the policy, the diary.
    for table in ["experience", "kv.policy", "diary"] {
        assert_eq!(after.get(table), before.get(table), "{table}");
    }
    let out = hindsight(&data, &["runs", "list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_missing_database_is_one_sentence_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("nowhere");
    for args in [
        &["diary", "tail"][..],
        &["runs", "list", "--json"],
        &["store", "stats"],
    ] {
        let out = hindsight(&data, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&data.join("hindsight.redb").display().to_string()),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
        assert!(
            !data.exists(),
            "a read command must not create the data directory"
        );
    }
}

#[test]
fn a_file_that_is_not_a_database_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hindsight.redb"), b"this is not redb").unwrap();
    let out = hindsight(dir.path(), &["runs", "list"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("cannot open the database "), "{stderr}");
}

/// A run id or task id with control characters (stored by an embedder, or before the API refused
/// them) is printed escaped by `runs list`: it cannot forge a line or move the terminal.
#[tokio::test]
async fn runs_list_escapes_control_characters_in_ids() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(
            dir.path(),
            StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        for (id, task) in [
            (
                "run-a",
                "t\nrun-forged       done        1  2026-01-01T00:00:00.000Z 1.000",
            ),
            ("run-b\u{1b}[2J", "t\u{1b}[H\u{7}"),
        ] {
            store
                .put_run(&Run {
                    run_id: id.into(),
                    task_id: task.into(),
                    state: RunState::Succeeded,
                    attempts: 1,
                    created_ms: 1,
                    updated_ms: 2,
                    tenant: None,
                    plan_id: None,
                    sop_id: None,
                    reward: None,
                    reason: None,
                })
                .await
                .unwrap();
        }
    }
    let out = hindsight(dir.path(), &["runs", "list"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 3, "a header and two runs: {stdout}");
    assert!(
        !stdout.chars().any(|c| c.is_control() && c != '\n'),
        "{stdout:?}"
    );
    assert!(stdout.contains("t\\nrun-forged"), "{stdout}");
    assert!(stdout.contains("run-b\\u{1b}[2J"), "{stdout}");
    // The JSON form is JSON's own escaping of the same ids.
    let out = hindsight(dir.path(), &["runs", "list", "--json"]);
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[1]["run_id"], "run-b\u{1b}[2J");
}
