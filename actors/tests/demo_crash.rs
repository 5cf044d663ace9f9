//! The process-crash test: `hindsight demo` is killed with SIGKILL at 10 seeded points and
//! started again each time. At the end every task has exactly one terminal outcome, the experience
//! log holds exactly one entry per run, and no idempotent tool call was made again after its
//! result had been recorded (read from the call journal the binary keeps when asked).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hindsight::store::{Store, StoreOptions};

fn demo(data: &Path, journal: &Path, tasks: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hindsight"))
        .args(["--data"])
        .arg(data)
        .args(["demo", "--json", "--seed", "3", "--tasks"])
        .arg(tasks.to_string())
        .env(hindsight_actors::journal::ENV, journal)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the hindsight binary")
}

fn journal_lines(journal: &Path) -> usize {
    std::fs::read_to_string(journal)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn killed_ten_times_every_task_ends_once_and_no_recorded_call_is_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let journal = dir.path().join("calls.log");
    let mut rng = fastrand::Rng::with_seed(42);
    for round in 0..10 {
        let mut child = demo(&data, &journal, 60);
        // Kill once the child has made a seeded number of further tool calls (an event of the
        // child's, observed through its journal), or when it has finished on its own.
        let target = journal_lines(&journal) + rng.usize(5..120);
        let mut polls = 0;
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if journal_lines(&journal) >= target || polls > 3000 {
                child.kill().unwrap(); // SIGKILL
                break;
            }
            polls += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = child.wait().unwrap();
        eprintln!(
            "round {round}: {status:?}, {} journal lines",
            journal_lines(&journal)
        );
    }
    // A last start finishes whatever the kills left unfinished, then runs a few more tasks.
    let status = demo(&data, &journal, 20).wait().unwrap();
    assert!(status.success(), "the last demo exits 0");

    let store = Store::open(&data, StoreOptions::default()).unwrap();
    let runs: Vec<_> = store
        .list_runs()
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(runs.len() >= 20);
    for r in &runs {
        assert!(r.state.is_terminal(), "run {} is {}", r.run_id, r.state);
    }
    let tasks: HashSet<&str> = runs.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(tasks.len(), runs.len(), "one run per task");
    let log = store.experience_all().unwrap();
    let logged: HashSet<String> = log
        .iter()
        .map(|(_, e)| e.as_ref().unwrap().run_id.clone())
        .collect();
    let unlogged: Vec<String> = runs
        .iter()
        .filter(|r| !logged.contains(&r.run_id))
        .map(|r| format!("{} {} ({:?})", r.run_id, r.state, r.reason))
        .collect();
    assert!(
        unlogged.is_empty(),
        "runs without an experience: {unlogged:#?}"
    );
    assert_eq!(log.len(), runs.len(), "exactly one experience per run");
    assert_eq!(logged.len(), runs.len());

    // No call of an idempotent tool after its result was recorded.
    let text = std::fs::read_to_string(&journal).unwrap();
    let mut recorded: BTreeMap<&str, usize> = BTreeMap::new();
    let mut calls_after = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match line.split_once(' ') {
            Some(("recorded", key)) => {
                recorded.entry(key).or_insert(i);
            }
            Some(("call", key)) if recorded.contains_key(key) => calls_after.push(key.to_string()),
            _ => {}
        }
    }
    assert!(!recorded.is_empty());
    assert!(
        calls_after.is_empty(),
        "calls repeated after their result was recorded: {calls_after:?}"
    );
}
