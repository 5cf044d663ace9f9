//! `hindsight bench store`: durable records/s of the store with group commit at 1, 8 and 64
//! concurrent writers, with one commit per record at 1 and 64, and of raw redb on the same disk,
//! printed as one JSON object. The configurations run in interleaved rounds, so that a disk
//! whose speed drifts during the run weighs on each of them alike.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hindsight::store::baseline::{RawBaseline, RawRate};
use hindsight::store::{Durability, MAX_BATCH, NewDiaryEntry, Store, StoreOptions, envelope};
use serde::Serialize;

use super::{Failure, Global, print_json};

/// `hindsight bench store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Seconds each configuration runs in all (its writers write until then), split over the
    /// rounds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Rounds: each round runs every configuration in turn for `seconds / rounds`.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
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
    /// Rounds the configurations ran in, interleaved.
    rounds: u32,
    ratio_at_64_writers: f64,
    /// The ratio at 64 writers in each round, from that round's rates alone.
    ratio_at_64_writers_per_round: Vec<f64>,
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
    let rounds: Vec<String> = report
        .ratio_at_64_writers_per_round
        .iter()
        .map(|r| format!("{r:.1}x"))
        .collect();
    outln!(
        "per round ({} rounds, interleaved): {}",
        report.rounds,
        rounds.join(", ")
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

/// A store configuration under measurement and what it measured so far.
struct Config {
    writers: u64,
    group_commit: bool,
    store: Store,
    records: u64,
    seconds: f64,
}

impl Config {
    fn open(scratch: &Path, writers: u64, group_commit: bool) -> Result<Config, Failure> {
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
        Ok(Config {
            writers,
            group_commit,
            store,
            records: 0,
            seconds: 0.0,
        })
    }

    fn measurement(&self) -> Measurement {
        let transactions = self.store.writer_stats().transactions;
        Measurement {
            writers: self.writers,
            group_commit: self.group_commit,
            records: self.records,
            seconds: self.seconds,
            records_per_s: self.records as f64 / self.seconds.max(1e-9),
            transactions,
            records_per_transaction: self.records as f64 / (transactions.max(1) as f64),
        }
    }
}

/// A raw redb baseline under measurement and what it measured so far.
struct Raw {
    rows: usize,
    baseline: Option<RawBaseline>,
    transactions: u64,
    seconds: f64,
}

impl Raw {
    /// One round of `duration`.
    async fn round(&mut self, value_bytes: usize, duration: Duration) -> Result<(), Failure> {
        let mut baseline = self
            .baseline
            .take()
            .ok_or_else(|| Failure::new("the raw redb baseline was lost in an earlier round"))?;
        let rows = self.rows;
        let (baseline, rate) = tokio::task::spawn_blocking(move || {
            let rate = baseline.measure(rows, value_bytes, duration);
            (baseline, rate)
        })
        .await
        .map_err(|e| Failure::new(format!("the raw redb baseline failed: {e}")))?;
        let rate = rate?;
        self.baseline = Some(baseline);
        self.transactions += rate.transactions;
        self.seconds += rate.seconds;
        Ok(())
    }

    fn rate(&self) -> RawRate {
        RawRate {
            rows_per_transaction: self.rows,
            transactions: self.transactions,
            seconds: self.seconds,
            rows_per_s: (self.transactions * self.rows as u64) as f64 / self.seconds.max(1e-9),
        }
    }
}

async fn measure_all(scratch: &Path, args: &Args) -> Result<Report, Failure> {
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(Failure::new(format!(
            "--seconds must be a positive number of seconds, not {}",
            args.seconds
        )));
    }
    if args.rounds == 0 {
        return Err(Failure::new("--rounds must be at least 1"));
    }
    std::fs::create_dir_all(scratch).map_err(|e| {
        Failure::new(format!(
            "cannot create the scratch directory {}: {e}",
            scratch.display()
        ))
    })?;
    let mut configs = Vec::new();
    for (writers, group_commit) in [(1u64, true), (8, true), (64, true), (1, false), (64, false)] {
        configs.push(Config::open(scratch, writers, group_commit)?);
    }
    // Raw rows as large as the stored diary entries the writers wrote.
    let value_bytes = envelope::encode(&entry(0, 0, "x".repeat(args.text_bytes)))
        .map_err(|e| Failure::new(format!("cannot encode a bench diary entry: {e}")))?
        .len();
    let mut raws = Vec::new();
    for rows in [1usize, 64] {
        raws.push(Raw {
            rows,
            baseline: Some(RawBaseline::create(
                &scratch.join(format!("raw-{rows}.redb")),
            )?),
            transactions: 0,
            seconds: 0.0,
        });
    }
    let slice = Duration::from_secs_f64(args.seconds / f64::from(args.rounds));
    let text = "x".repeat(args.text_bytes);
    let mut per_round = Vec::new();
    for _ in 0..args.rounds {
        let mut at64 = [0.0; 2];
        for c in &mut configs {
            let (records, seconds) = write_for(&c.store, c.writers, slice, &text).await?;
            c.records += records;
            c.seconds += seconds;
            if c.writers == 64 {
                at64[usize::from(c.group_commit)] = records as f64 / seconds.max(1e-9);
            }
        }
        for r in &mut raws {
            r.round(value_bytes, slice).await?;
        }
        per_round.push(at64[1] / at64[0].max(f64::MIN_POSITIVE));
    }
    let measured: Vec<Measurement> = configs.iter().map(Config::measurement).collect();
    let (group, single): (Vec<_>, Vec<_>) = measured.into_iter().partition(|m| m.group_commit);
    let at64 = |ms: &[Measurement]| {
        ms.iter()
            .find(|m| m.writers == 64)
            .map_or(0.0, |m| m.records_per_s)
    };
    let ratio = at64(&group) / at64(&single).max(f64::MIN_POSITIVE);
    let raw_single = raws[0].rate();
    let raw_batched = raws[1].rate();
    let raw_ratio = raw_batched.rows_per_s / raw_single.rows_per_s.max(f64::MIN_POSITIVE);
    let share = at64(&group) / raw_batched.rows_per_s.max(f64::MIN_POSITIVE);
    Ok(Report {
        bench: "store",
        durability: "immediate",
        record: format!("diary entry with {} bytes of text", args.text_bytes),
        group_commit: group,
        per_record_commit: single,
        rounds: args.rounds,
        ratio_at_64_writers: ratio,
        ratio_at_64_writers_per_round: per_round,
        target_ratio: 30.0,
        meets_target: ratio >= 30.0,
        raw_redb: vec![raw_single, raw_batched],
        raw_ratio_at_64: raw_ratio,
        group_share_of_raw_64: share,
    })
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

/// `writers` concurrent writers append diary entries to `store` for `duration`, each waiting
/// for its acknowledgement before the next; returns the records written and the seconds taken.
async fn write_for(
    store: &Store,
    writers: u64,
    duration: Duration,
    text: &str,
) -> Result<(u64, f64), Failure> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store: Store = store.clone();
        let text = text.to_owned();
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
    Ok((written, start.elapsed().as_secs_f64()))
}
