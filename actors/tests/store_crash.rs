//! Crash safety: a child `hindsight store crash-writer` appends diary entries and writes
//! records from 16 concurrent writers, printing each acknowledged write; the test `kill -9`s it
//! at a seeded point, reopens the database and checks that every acknowledged write is there and
//! intact. Twenty seeded kill points run against the same database, so each round also recovers
//! from the previous crash.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use hindsight::store::{Durability, KvTable, Store, StoreOptions};

const WRITERS: u64 = 16;
const KILL_POINTS: u64 = 20;
const CRASH_TABLE: KvTable = KvTable::new("crash");

/// Everything acknowledged so far, over every round.
#[derive(Default)]
struct Acked {
    diary: BTreeMap<u64, String>,
    experience: BTreeMap<u64, String>,
    kv: BTreeMap<String, String>,
    /// Highest acknowledged checkpoint step per run.
    checkpoints: BTreeMap<String, u64>,
    /// Highest acknowledged attempts per run.
    runs: BTreeMap<String, u64>,
    count: usize,
}

impl Acked {
    fn record(&mut self, line: &str) {
        let mut parts = line.splitn(3, ' ');
        let (kind, a, b) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        match kind {
            "diary" => {
                self.diary.insert(a.parse().unwrap(), b.to_string());
            }
            "experience" => {
                self.experience.insert(a.parse().unwrap(), b.to_string());
            }
            "kv" => {
                self.kv.insert(a.to_string(), b.to_string());
            }
            "checkpoint" => {
                let step: u64 = b.parse().unwrap();
                let e = self.checkpoints.entry(a.to_string()).or_default();
                *e = (*e).max(step);
            }
            "run" => {
                let attempts: u64 = b.parse().unwrap();
                let e = self.runs.entry(a.to_string()).or_default();
                *e = (*e).max(attempts);
            }
            other => panic!("unknown ack line kind {other:?} in {line:?}"),
        }
        self.count += 1;
    }
}

/// Starts a crash writer, reads `kill_after` acks, kills it with SIGKILL, then reads whatever
/// complete ack lines it had written before dying.
fn crash_round(data: &Path, seed: u64, kill_after: usize, acked: &mut Acked) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hindsight"))
        .arg("--data")
        .arg(data)
        .args(["store", "crash-writer", "--writers"])
        .arg(WRITERS.to_string())
        .arg("--seed")
        .arg(seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = 0;
    let mut line = String::new();
    while seen < kill_after {
        line.clear();
        let n = stdout.read_line(&mut line).unwrap();
        assert!(
            n > 0 && line.ends_with('\n'),
            "seed {seed}: the crash writer stopped by itself after {seen} acks: {:?}",
            child.wait()
        );
        acked.record(line.trim_end_matches('\n'));
        seen += 1;
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(!status.success(), "seed {seed}: the writer was not killed");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    // A line cut by the kill has no newline: it was never fully reported, so it is not counted.
    let complete = rest.rfind('\n').map_or("", |i| &rest[..i]);
    for l in complete.lines() {
        acked.record(l);
    }
}

fn verify(data: &Path, seed: u64, acked: &Acked) {
    let store = Store::open(
        data,
        StoreOptions {
            durability: Durability::Immediate,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let diary: BTreeMap<u64, String> = store
        .diary_since(0)
        .unwrap()
        .into_iter()
        .map(|e| {
            let e = e.unwrap_or_else(|err| panic!("seed {seed}: {err}"));
            (e.seq, e.text)
        })
        .collect();
    for (seq, text) in &acked.diary {
        assert_eq!(diary.get(seq), Some(text), "seed {seed}: diary {seq}");
    }
    let experience: BTreeMap<u64, String> = store
        .experience_all()
        .unwrap()
        .into_iter()
        .map(|(seq, x)| {
            let x = x.unwrap_or_else(|err| panic!("seed {seed}: {err}"));
            (seq, x.run_id)
        })
        .collect();
    for (seq, run_id) in &acked.experience {
        assert_eq!(
            experience.get(seq),
            Some(run_id),
            "seed {seed}: experience {seq}"
        );
    }
    for (key, text) in &acked.kv {
        assert_eq!(
            store.get::<String>(CRASH_TABLE, key).unwrap().as_ref(),
            Some(text),
            "seed {seed}: kv {key}"
        );
    }
    for (_, value) in store.scan::<String>(CRASH_TABLE).unwrap() {
        value.unwrap_or_else(|err| panic!("seed {seed}: {err}"));
    }
    for (run_id, step) in &acked.checkpoints {
        let cp = store
            .latest_checkpoint(run_id)
            .unwrap()
            .unwrap_or_else(|| panic!("seed {seed}: no checkpoint for {run_id}"));
        assert!(
            u64::from(cp.step_index) >= *step,
            "seed {seed}: {run_id} checkpoint {} < acked {step}",
            cp.step_index
        );
        assert_eq!(cp.state["i"], u64::from(cp.step_index));
        assert!(store.checkpoints(run_id).unwrap().len() <= 3);
    }
    for (run_id, attempts) in &acked.runs {
        let run = store
            .get_run(run_id)
            .unwrap()
            .unwrap_or_else(|| panic!("seed {seed}: run {run_id} missing"));
        assert!(
            u64::from(run.attempts) >= *attempts,
            "seed {seed}: {run_id}"
        );
    }
    for run in store.list_runs().unwrap() {
        run.unwrap_or_else(|err| panic!("seed {seed}: {err}"));
    }
}

#[test]
fn every_acknowledged_write_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    for seed in 0..KILL_POINTS {
        let mut rng = fastrand::Rng::with_seed(0xC0FFEE ^ seed);
        // Some rounds die before their first ack (possibly while opening the database).
        let kill_after = if rng.u8(..) < 32 {
            0
        } else {
            rng.usize(1..800)
        };
        crash_round(dir.path(), seed, kill_after, &mut acked);
        verify(dir.path(), seed, &acked);
    }
    assert!(
        acked.count >= 2000,
        "too few acks ({}) to mean anything",
        acked.count
    );
    assert!(!acked.diary.is_empty() && !acked.checkpoints.is_empty());
}
