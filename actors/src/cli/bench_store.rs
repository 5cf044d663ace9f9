//! `hindsight bench store`: durable records/s of the store with group commit at 1, 8 and 64
//! concurrent writers, and with one commit per record at 1 and 64, printed as one JSON object.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hindsight::store::baseline::{RawRate, raw_durable_rows};
use hindsight::store::{Durability, MAX_BATCH, NewDiaryEntry, Store, StoreOptions, envelope};
use serde::Serialize;

use super::{Failure, Global, print_json};

/// `hindsight bench store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Seconds each configuration runs (its writers write until then).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Bytes of text per diary entry.
    #[arg(long, default_value_t = 200)]
    text_bytes: usize,
}

/// The result of one configuration.
#[derive(Debug, Serialize)]
struct Measurement {
    writers: u64,
    group_commit: bool,
    records: u64,
    seconds: f64,
    records_per_s: f64,
    transactions: u64,
    records_per_transaction: f64,
}

/// The whole result.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    durability: &'static str,
    record: String,
    group_commit: Vec<Measurement>,
    per_record_commit: Vec<Measurement>,
    ratio_at_64_writers: f64,
    target_ratio: f64,
    meets_target: bool,
    /// redb itself on the same disk in the same run: one row per durable transaction, and 64
    /// rows per durable transaction (what 64 writers' records would be in one commit).
    raw_redb: Vec<RawRate>,
    /// The ratio the disk allows at 64 writers: raw 64-row transactions over raw single rows.
    raw_ratio_at_64: f64,
    /// Group commit at 64 writers as a share of raw redb's 64-row rate.
    group_share_of_raw_64: f64,
}

/// Runs `hindsight bench store`. Each configuration writes into a fresh database in a scratch
/// directory under the system temp dir, removed afterwards; `--data` is not touched.
pub async fn run(_global: &Global, args: Args) -> Result<(), Failure> {
    let scratch = std::env::temp_dir().join(format!(
        "hindsight-bench-store-{}-{}",
        std::process::id(),
        hindsight::record::now_ms()
    ));
    let result = measure_all(&scratch, &args).await;
    let _ = std::fs::remove_dir_all(&scratch);
    let report = result?;
    if args.json {
        return print_json(&report);
    }
    for m in report.group_commit.iter().chain(&report.per_record_commit) {
        outln!(
            "{:<18} {:>3} writers: {:>10.0} records/s ({:.1} records per transaction)",
            if m.group_commit {
                "group commit"
            } else {
                "commit per record"
            },
            m.writers,
            m.records_per_s,
            m.records_per_transaction
        )?;
    }
    outln!(
        "group commit / commit per record at 64 writers: {:.1}x (target {}x)",
        report.ratio_at_64_writers,
        report.target_ratio
    )?;
    for r in &report.raw_redb {
        outln!(
            "raw redb, {:>2} rows per durable transaction: {:>10.0} rows/s",
            r.rows_per_transaction,
            r.rows_per_s
        )?;
    }
    outln!(
        "raw redb 64 rows / 1 row: {:.1}x (the disk's ceiling for 64 writers); group commit reaches {:.0}% of raw 64-row commits",
        report.raw_ratio_at_64,
        report.group_share_of_raw_64 * 100.0
    )
}

async fn measure_all(scratch: &Path, args: &Args) -> Result<Report, Failure> {
    let mut group = Vec::new();
    for writers in [1u64, 8, 64] {
        group.push(measure(scratch, writers, true, args.seconds, args.text_bytes).await?);
    }
    let mut single = Vec::new();
    for writers in [1u64, 64] {
        single.push(measure(scratch, writers, false, args.seconds, args.text_bytes).await?);
    }
    let at64 = |ms: &[Measurement]| {
        ms.iter()
            .find(|m| m.writers == 64)
            .map_or(0.0, |m| m.records_per_s)
    };
    let ratio = at64(&group) / at64(&single).max(f64::MIN_POSITIVE);
    std::fs::create_dir_all(scratch).map_err(|e| {
        Failure::new(format!(
            "cannot create the scratch directory {}: {e}",
            scratch.display()
        ))
    })?;
    // Raw rows as large as the stored diary entries the writers wrote.
    let value_bytes = envelope::encode(&entry(0, 0, "x".repeat(args.text_bytes)))
        .map_err(|e| Failure::new(format!("cannot encode a bench diary entry: {e}")))?
        .len();
    let seconds = Duration::from_secs_f64(args.seconds);
    let raw_single = raw(scratch, 1, value_bytes, seconds).await?;
    let raw_batched = raw(scratch, 64, value_bytes, seconds).await?;
    let raw_ratio = raw_batched.rows_per_s / raw_single.rows_per_s.max(f64::MIN_POSITIVE);
    let share = at64(&group) / raw_batched.rows_per_s.max(f64::MIN_POSITIVE);
    Ok(Report {
        bench: "store",
        durability: "immediate",
        record: format!("diary entry with {} bytes of text", args.text_bytes),
        group_commit: group,
        per_record_commit: single,
        ratio_at_64_writers: ratio,
        target_ratio: 30.0,
        meets_target: ratio >= 30.0,
        raw_redb: vec![raw_single, raw_batched],
        raw_ratio_at_64: raw_ratio,
        group_share_of_raw_64: share,
    })
}

/// Raw redb rows/s at `rows` rows per durable transaction, in the scratch directory.
async fn raw(
    scratch: &Path,
    rows: usize,
    value_bytes: usize,
    seconds: Duration,
) -> Result<RawRate, Failure> {
    let path = scratch.join(format!("raw-{rows}.redb"));
    tokio::task::spawn_blocking(move || raw_durable_rows(&path, rows, value_bytes, seconds))
        .await
        .map_err(|e| Failure::new(format!("the raw redb baseline failed: {e}")))?
        .map_err(Failure::from)
}

/// The diary entry bench writer `w` writes as its `n`th record.
fn entry(w: u64, n: u64, text: String) -> NewDiaryEntry {
    NewDiaryEntry {
        time_ms: n,
        run_id: Some(format!("bench-{w}")),
        kind: "bench".into(),
        text,
        tags: Vec::new(),
    }
}

async fn measure(
    scratch: &Path,
    writers: u64,
    group_commit: bool,
    seconds: f64,
    text_bytes: usize,
) -> Result<Measurement, Failure> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(Failure::new(format!(
            "--seconds must be a positive number of seconds, not {seconds}"
        )));
    }
    let dir: PathBuf = scratch.join(format!(
        "{}-{writers}",
        if group_commit { "group" } else { "single" }
    ));
    let options = StoreOptions {
        durability: Durability::Immediate,
        ..StoreOptions::default()
    };
    let max_batch = if group_commit { MAX_BATCH } else { 1 };
    let store = Store::open_with_batch_limit(&dir, options, max_batch)?;
    let text = "x".repeat(text_bytes);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store: Store = store.clone();
        let text = text.clone();
        tasks.push(tokio::spawn(async move {
            let mut written = 0u64;
            while Instant::now() < deadline {
                store.append_diary(entry(w, written, text.clone())).await?;
                written += 1;
            }
            Ok::<u64, hindsight::store::StoreError>(written)
        }));
    }
    let mut written = 0;
    for t in tasks {
        written += t
            .await
            .map_err(|e| Failure::new(format!("a bench writer task failed: {e}")))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let transactions = store.writer_stats().transactions;
    Ok(Measurement {
        writers,
        group_commit,
        records: written,
        seconds,
        records_per_s: written as f64 / seconds.max(1e-9),
        transactions,
        records_per_transaction: written as f64 / (transactions.max(1) as f64),
    })
}
