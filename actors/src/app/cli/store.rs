//! `hindsight store ...`: statistics and compaction of the database, and the hidden
//! `crash-writer` that the crash test kills.

use std::io::Write;
use std::sync::Arc;

use clap::Subcommand;
use hindsight::record::{Checkpoint, ExperienceTuple, Run, RunResult, RunState};
use hindsight::store::{Durability, KvTable, NewDiaryEntry, Store, StoreOptions};
use serde_json::json;

use super::data::{open, open_existing};
use super::{Failure, Global, print_json};

/// The table the crash writer puts generic records in.
pub const CRASH_TABLE: KvTable = KvTable::new("crash");

/// `hindsight store ...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Record counts per table and the size of the database file.
    Stats {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove diary and experience entries, and finished runs, older than their time-to-live
    /// (none without a TTL), then give the space they held back to the file system. The
    /// daemon must be stopped: the file is compacted in place.
    Compact {
        /// Time-to-live of diary entries (`30d`, `12h`, `90m`, `45s`, `500ms`).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
        diary_ttl: Option<u64>,
        /// Time-to-live of experience tuples (same format).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
        experience_ttl: Option<u64>,
        /// Time-to-live of finished runs after their end (same format): each goes with its
        /// checkpoint, task, outcome and retry records; an unfinished run is never removed.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
        run_ttl: Option<u64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Test helper: write records from many concurrent writers forever, printing each
    /// acknowledged write on stdout, until killed.
    #[command(hide = true)]
    CrashWriter {
        /// Concurrent writers.
        #[arg(long, default_value_t = 16)]
        writers: u64,
        /// Seed of the payload sizes, also part of every id written.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

/// Runs `hindsight store ...`.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    match args.command {
        StoreCommand::Stats { json } => stats(global, json),
        StoreCommand::Compact {
            diary_ttl,
            experience_ttl,
            run_ttl,
            json,
        } => compact(
            global,
            StoreOptions {
                diary_ttl_ms: diary_ttl,
                experience_ttl_ms: experience_ttl,
                run_ttl_ms: run_ttl,
                ..StoreOptions::default()
            },
            json,
        ),
        StoreCommand::CrashWriter { writers, seed } => crash_writer(global, writers, seed).await,
    }
}

/// Parses `30d`, `12h`, `90m`, `45s` or `500ms` into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30d, 12h, 90m, 45s or 500ms"))?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{text:?} has no unit: write it like 30d, 12h, 90m, 45s or 500ms"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("the duration {text:?} is too long"))
}

fn stats(global: &Global, json: bool) -> Result<(), Failure> {
    let store = open_existing(&global.data, StoreOptions::default())?;
    let stats = store.stats()?;
    if json {
        return print_json(&stats);
    }
    outln!("{} ({} bytes)", stats.path.display(), stats.file_bytes)?;
    for t in &stats.tables {
        outln!("  {:<24} {:>10}", t.table, t.records)?;
    }
    Ok(())
}

fn compact(global: &Global, options: StoreOptions, json: bool) -> Result<(), Failure> {
    let store = open_existing(&global.data, options)?;
    let report = hindsight_actors::runtime::compact(&store)?;
    // The file is released when the last handle goes; only then can it shrink.
    drop(store);
    let shrunk = hindsight::store::shrink(&global.data)?;
    if json {
        return print_json(&CompactOutput {
            removed: report,
            file: shrunk,
        });
    }
    outln!(
        "removed {} diary entries, {} experience tuples and {} finished runs (with {} idempotency records)",
        report.diary_removed,
        report.experience_removed,
        report.runs_removed,
        report.idempotency_removed
    )?;
    outln!(
        "file: {} -> {} bytes",
        shrunk.file_bytes_before,
        shrunk.file_bytes_after
    )?;
    if report.damaged_kept > 0 {
        eprintln!(
            "warning: {} damaged entries were kept because their age cannot be read",
            report.damaged_kept
        );
    }
    Ok(())
}

/// `store compact --json`: what the TTLs removed, and the file's size before and after.
#[derive(serde::Serialize)]
struct CompactOutput {
    #[serde(flatten)]
    removed: hindsight::store::CompactReport,
    #[serde(flatten)]
    file: hindsight::store::ShrinkReport,
}

/// One acknowledged write, as the crash writer prints it (one line each):
/// `diary SEQ TEXT`, `experience SEQ RUN_ID`, `kv KEY TEXT`, `checkpoint RUN_ID STEP`,
/// `run RUN_ID ATTEMPTS`. Ids include the seed, so that runs with different seeds can share a
/// database.
async fn crash_writer(global: &Global, writers: u64, seed: u64) -> Result<(), Failure> {
    let store = open(
        &global.data,
        StoreOptions {
            durability: Durability::Immediate,
            ..StoreOptions::default()
        },
    )?;
    let out = Arc::new(std::sync::Mutex::new(()));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let out = out.clone();
        tasks.push(tokio::spawn(async move {
            crash_loop(store, w, seed, out).await
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure::new(format!("a crash writer task failed: {e}")))??;
    }
    Ok(())
}

fn ack(out: &std::sync::Mutex<()>, line: String) -> Result<(), Failure> {
    let _guard = out
        .lock()
        .map_err(|_| Failure::new("the stdout lock was poisoned"))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::new(format!("cannot write to stdout: {e}")))
}

/// The text of crash writer `w`'s `i`th record, `len` bytes of payload.
pub fn crash_text(w: u64, i: u64, len: usize) -> String {
    let mut s = format!("w{w}-{i}-");
    while s.len() < len {
        s.push(char::from(b'a' + (s.len() % 26) as u8));
    }
    s
}

async fn crash_loop(
    store: Store,
    w: u64,
    seed: u64,
    out: Arc<std::sync::Mutex<()>>,
) -> Result<(), Failure> {
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(1_000_003).wrapping_add(w));
    let run_id = format!("run-s{seed}-w{w}");
    for i in 0u64.. {
        let len = rng.usize(16..600);
        let text = crash_text(w, i, len);
        let line = match i % 5 {
            0 => {
                let seq = store
                    .append_diary(NewDiaryEntry {
                        time_ms: i,
                        run_id: Some(run_id.clone()),
                        kind: "crash".into(),
                        text: text.clone(),
                        tags: vec![format!("w{w}")],
                    })
                    .await?;
                format!("diary {seq} {text}")
            }
            1 => {
                let key = format!("s{seed}-w{w}-{i}");
                store.put(CRASH_TABLE, &key, &text).await?;
                format!("kv {key} {text}")
            }
            2 => {
                store
                    .put_checkpoint(&Checkpoint {
                        run_id: run_id.clone(),
                        step_index: i as u32,
                        name: None,
                        state: json!({ "w": w, "i": i, "text": text }),
                        completed_steps: Vec::new(),
                        created_ms: i,
                    })
                    .await?;
                format!("checkpoint {run_id} {i}")
            }
            3 => {
                store
                    .put_run(&Run {
                        run_id: run_id.clone(),
                        task_id: format!("task-w{w}"),
                        state: RunState::Executing,
                        attempts: i as u32,
                        created_ms: 0,
                        updated_ms: i,
                        tenant: None,
                        plan_id: None,
                        sop_id: None,
                        reward: None,
                        reason: Some(text),
                    })
                    .await?;
                format!("run {run_id} {i}")
            }
            _ => {
                let exp_run = format!("s{seed}-w{w}-{i}");
                let seq = store
                    .append_experience(ExperienceTuple {
                        run_id: exp_run.clone(),
                        task_id: format!("task-w{w}"),
                        plan_id: "crash".into(),
                        user_id: None,
                        context_features: Default::default(),
                        arms: Vec::new(),
                        steps: Vec::new(),
                        result: RunResult {
                            state: RunState::Succeeded,
                            passed: true,
                            output: Some(json!({ "text": text })),
                            latency_ms: 0.0,
                            cost: 0.0,
                            attempts: 1,
                        },
                        reward: 1.0,
                        user_feedback: None,
                        time_ms: i,
                    })
                    .await?;
                format!("experience {seq} {exp_run}")
            }
        };
        ack(&out, line)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("30d"), Ok(30 * 86_400_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert!(parse_duration_ms("30").is_err());
        assert!(parse_duration_ms("d").is_err());
        assert!(parse_duration_ms("99999999999999999999d").is_err());
    }

    #[test]
    fn crash_texts_have_the_asked_length_and_name_their_writer() {
        let t = crash_text(3, 7, 40);
        assert_eq!(t.len(), 40);
        assert!(t.starts_with("w3-7-"));
    }
}
