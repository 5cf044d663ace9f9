//! The durable store: one redb file (`dir/hindsight.redb`) with typed tables, every value a
//! record envelope (a format-version byte, then postcard), one writer thread with group commit,
//! concurrent reads, checkpoint retention and TTL compaction.
//!
//! Writes are `async` and resolve only after the transaction that holds them committed; many
//! concurrent writes share one transaction. Reads are synchronous and run concurrently on redb
//! read transactions. A record that cannot be decoded is reported as [`StoreError::Corrupt`]
//! naming its table and key; every other record stays readable.
//!
//! Generic records ([`Store::put`], [`Store::get`], [`Store::scan`]) are encoded with postcard,
//! which cannot decode types that need a self-describing format: a `T` must not contain
//! `serde_json::Value`, untagged or internally tagged enums, or `#[serde(flatten)]`. The store's
//! own records keep their JSON fields in an exact postcard-friendly form.
//!
//! ```no_run
//! use hindsight::store::{KvTable, NewDiaryEntry, Store, StoreOptions};
//!
//! const NOTES: KvTable = KvTable::new("notes");
//!
//! # async fn demo() -> Result<(), hindsight::store::StoreError> {
//! let store = Store::open("./hindsight-data".as_ref(), StoreOptions::default())?;
//! let seq = store
//!     .append_diary(NewDiaryEntry {
//!         time_ms: hindsight::now_ms(),
//!         run_id: None,
//!         kind: "note".into(),
//!         text: "hello".into(),
//!         tags: vec![],
//!     })
//!     .await?; // resolves once the entry is committed
//! store.put(NOTES, "greeting", &("hello", seq)).await?;
//! for entry in store.diary_tail(10)? {
//!     println!("{:?}", entry?);
//! }
//! # Ok(())
//! # }
//! ```

pub mod baseline;
pub mod envelope;
pub mod idempotency;
mod json;
mod shrink;
mod stored;
mod tables;
mod writer;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::record::{Checkpoint, DiaryEntry, ExperienceTuple, Run};
pub use envelope::EnvelopeError;
use json::JsonTree;
pub use shrink::{ShrinkReport, shrink};
use stored::{StoredCheckpoint, StoredExperience};
pub use tables::KvTable;
use tables::{
    CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, KV_PREFIX, META, OPEN_RUNS, OPEN_RUNS_INDEXED,
    RUNS, checkpoint_key,
};
use writer::{Op, Request, WriterConfig};

/// Most write requests the writer gathers into one transaction by default.
pub const MAX_BATCH: usize = writer::MAX_BATCH;

/// The file name of the database inside the data directory.
pub const FILE_NAME: &str = "hindsight.redb";

/// How hard a commit works to be on disk before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// fsync before acknowledging: an acknowledged write survives `kill -9` and power loss.
    #[default]
    Immediate,
    /// No fsync: fast, for tests and benchmarks; a crash may lose recent writes.
    None,
}

/// How a store is opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreOptions {
    /// Commit durability.
    pub durability: Durability,
    /// Checkpoints kept per unfinished run (at least 1).
    pub checkpoints_per_run: usize,
    /// Diary entries older than this are removed by [`Store::compact`].
    pub diary_ttl_ms: Option<u64>,
    /// Experience tuples older than this are removed by [`Store::compact`].
    pub experience_ttl_ms: Option<u64>,
    /// Finished runs last updated longer ago than this are removed by [`Store::compact_with`],
    /// with their checkpoints and their records in the tables it is given (`None` keeps them).
    pub run_ttl_ms: Option<u64>,
    /// Bytes of the database's page cache (redb's own default is 1 GiB; a long-lived daemon's
    /// memory is this plus what its actors hold, which does not grow with its history).
    pub cache_bytes: usize,
}

/// The page cache of [`StoreOptions::default`]: 256 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            durability: Durability::Immediate,
            checkpoints_per_run: 3,
            diary_ttl_ms: None,
            experience_ttl_ms: None,
            run_ttl_ms: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// What can go wrong in the store. Every variant names what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be created or opened.
    #[error("cannot open the database {}: {reason}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A stored record could not be decoded.
    #[error("the record {key} in table {table} is damaged: {reason}")]
    Corrupt {
        /// The table.
        table: String,
        /// The key (`run_id#seq` for checkpoints).
        key: String,
        /// Why it cannot be read.
        reason: String,
    },
    /// A record could not be encoded for writing.
    #[error("the record {key} for table {table} cannot be encoded: {reason}")]
    Encode {
        /// The table.
        table: String,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A read transaction or table scan failed.
    #[error("cannot read the table {table}: {reason}")]
    Read {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
    /// The write transaction of a batch failed; every request of the batch gets this error.
    #[error("the write transaction failed: {reason}")]
    Write {
        /// Why.
        reason: String,
    },
    /// The writer thread has stopped.
    #[error("the store's writer has stopped, so the write was not made")]
    Closed,
}

/// Records read by a scan, each with its key; a damaged record is an `Err` in its place.
pub type Entries<K, T> = Vec<(K, Result<T, StoreError>)>;

/// A diary entry to append; the store assigns its sequence number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewDiaryEntry {
    /// When it was written (ms since epoch).
    pub time_ms: u64,
    /// The run it is about, if any.
    pub run_id: Option<String>,
    /// What kind of note.
    pub kind: String,
    /// The note.
    pub text: String,
    /// Tags for retrieval.
    pub tags: Vec<String>,
}

/// One write of a [`Store::write_batch`]; all ops of a batch commit together.
#[derive(Debug, Clone)]
pub struct WriteOp(Op);

impl WriteOp {
    /// Writes a run record.
    pub fn run(run: &Run) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::PutRun {
            run_id: run.run_id.clone(),
            open: !run.state.is_terminal(),
            bytes: encode("runs", &run.run_id, run)?,
        }))
    }

    /// Writes a checkpoint, keeping the last K of its run.
    pub fn checkpoint(cp: &Checkpoint) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::PutCheckpoint {
            run_id: cp.run_id.clone(),
            bytes: encode("checkpoints", &cp.run_id, &StoredCheckpoint::from(cp))?,
        }))
    }

    /// Writes a terminal run and drops all but its final checkpoint.
    pub fn finish_run(run: &Run) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::FinishRun {
            run_id: run.run_id.clone(),
            bytes: encode("runs", &run.run_id, run)?,
        }))
    }

    /// Appends a diary entry.
    pub fn diary(entry: &NewDiaryEntry) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::AppendDiary {
            bytes: encode("diary", "(new)", entry)?,
        }))
    }

    /// Appends an experience tuple.
    pub fn experience(tuple: &ExperienceTuple) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::AppendExperience {
            bytes: encode("experience", "(new)", &StoredExperience::from(tuple))?,
        }))
    }

    /// Records the result of an idempotent call.
    pub fn idempotent(key: &str, value: &serde_json::Value) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::PutIdempotent {
            key: key.to_string(),
            bytes: encode("idempotency", key, &JsonTree::from(value))?,
        }))
    }

    /// Deletes the record of an idempotent call (no error if absent): once a run's end is on
    /// disk its calls are never repeated, so their records need not be kept.
    pub fn delete_idempotent(key: &str) -> WriteOp {
        WriteOp(Op::DeleteIdempotent {
            key: key.to_string(),
        })
    }

    /// Writes a generic record.
    pub fn put<T: Serialize + ?Sized>(
        table: KvTable,
        key: &str,
        value: &T,
    ) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::Put {
            table,
            key: key.to_string(),
            bytes: encode(&table.redb_name(), key, value)?,
        }))
    }

    /// Deletes a generic record (no error if absent).
    pub fn delete(table: KvTable, key: &str) -> WriteOp {
        WriteOp(Op::Delete {
            table,
            key: key.to_string(),
        })
    }
}

/// Counts of one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableStats {
    /// The redb table name (`kv.<name>` for a [`KvTable`]).
    pub table: String,
    /// Number of records.
    pub records: u64,
}

/// What [`Store::stats`] reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// The database file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub file_bytes: u64,
    /// Every table, by name.
    pub tables: Vec<TableStats>,
}

/// What [`Store::compact`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompactReport {
    /// Diary entries removed by the TTL.
    pub diary_removed: u64,
    /// Experience tuples removed by the TTL.
    pub experience_removed: u64,
    /// Finished runs removed by the run TTL (with their checkpoints and records).
    #[serde(default)]
    pub runs_removed: u64,
    /// Idempotency records removed with their runs: task claims of removed tasks, and call
    /// results that a run's end did not already delete (written by builds before it did).
    #[serde(default)]
    pub idempotency_removed: u64,
    /// Damaged records kept because their age cannot be read.
    pub damaged_kept: u64,
}

/// Which key a run's record has in a [`KvTable`] that [`Store::compact_with`] cleans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKey {
    /// The run's id.
    RunId,
    /// The id of the run's task.
    TaskId,
}

/// A table of per-run records that go with their run when the run TTL removes it (the
/// orchestrator's task and outcome records, say): declared by the module that owns the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRecords {
    /// The table.
    pub table: KvTable,
    /// How its records are keyed.
    pub key: RunKey,
}

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WriterStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Write requests acknowledged as committed (a request is one write call).
    pub requests: u64,
    /// Transactions that failed (each failed all of its requests).
    pub failed_transactions: u64,
}

struct Inner {
    db: Arc<Database>,
    counters: Arc<writer::Counters>,
    path: PathBuf,
    options: StoreOptions,
    tx: Mutex<Option<Sender<Request>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut handle) = self.writer.lock()
            && let Some(h) = handle.take()
        {
            let _ = h.join();
        }
    }
}

/// The durable store. Cheap to clone; every clone shares the database and its writer, which
/// stops (releasing the file) when the last clone is dropped.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    /// How many handles (clones) of this store are alive: the database file stays open, and
    /// locked against a reopen, until the last one is dropped.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

fn encode<T: Serialize + ?Sized>(table: &str, key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    envelope::encode(value).map_err(|e| StoreError::Encode {
        table: table.to_string(),
        key: key.to_string(),
        reason: e.to_string(),
    })
}

fn decode<T: DeserializeOwned>(table: &str, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    envelope::decode(bytes).map_err(|e| corrupt(table, key, e.to_string()))
}

fn corrupt(table: &str, key: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        table: table.to_string(),
        key: key.to_string(),
        reason,
    }
}

fn read_err<E: std::fmt::Display>(table: &str) -> impl Fn(E) -> StoreError + '_ {
    move |e| StoreError::Read {
        table: table.to_string(),
        reason: e.to_string(),
    }
}

/// An idempotency record's JSON value.
fn decode_idempotent(key: &str, bytes: &[u8]) -> Result<serde_json::Value, StoreError> {
    let tree: JsonTree = decode("idempotency", key, bytes)?;
    tree.into_value()
        .map_err(|r| corrupt("idempotency", key, r))
}

fn decode_checkpoint(run_id: &str, seq: u64, bytes: &[u8]) -> Result<Checkpoint, StoreError> {
    let key = checkpoint_key(run_id, seq);
    let stored: StoredCheckpoint = decode("checkpoints", &key, bytes)?;
    stored
        .into_checkpoint()
        .map_err(|r| corrupt("checkpoints", &key, r))
}

fn decode_diary(seq: u64, bytes: &[u8]) -> Result<DiaryEntry, StoreError> {
    let e: NewDiaryEntry = decode("diary", &seq.to_string(), bytes)?;
    Ok(DiaryEntry {
        seq,
        time_ms: e.time_ms,
        run_id: e.run_id,
        kind: e.kind,
        text: e.text,
        tags: e.tags,
    })
}

fn decode_experience(seq: u64, bytes: &[u8]) -> Result<ExperienceTuple, StoreError> {
    let key = seq.to_string();
    let stored: StoredExperience = decode("experience", &key, bytes)?;
    stored
        .into_experience()
        .map_err(|r| corrupt("experience", &key, r))
}

impl Store {
    /// Opens (creating if needed) `dir/hindsight.redb` and starts its writer thread.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        Store::open_with_batch_limit(dir, options, MAX_BATCH)
    }

    /// Like [`Store::open`], with at most `max_batch` write requests per transaction
    /// (`1` = one commit per request, which is what benchmarks compare group commit against).
    pub fn open_with_batch_limit(
        dir: &Path,
        options: StoreOptions,
        max_batch: usize,
    ) -> Result<Store, StoreError> {
        let path = dir.join(FILE_NAME);
        let open_err = |reason: String| StoreError::Open {
            path: path.clone(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| {
            open_err(format!(
                "cannot create the directory {}: {e}",
                dir.display()
            ))
        })?;
        let db = redb::Builder::new()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| open_err(e.to_string()))?;
        // Create the fixed tables so that reads never meet a missing one.
        let txn = db.begin_write().map_err(|e| open_err(e.to_string()))?;
        {
            txn.open_table(META).map_err(|e| open_err(e.to_string()))?;
            txn.open_table(RUNS).map_err(|e| open_err(e.to_string()))?;
            txn.open_table(CHECKPOINTS)
                .map_err(|e| open_err(e.to_string()))?;
            txn.open_table(DIARY).map_err(|e| open_err(e.to_string()))?;
            txn.open_table(EXPERIENCE)
                .map_err(|e| open_err(e.to_string()))?;
            txn.open_table(IDEMPOTENCY)
                .map_err(|e| open_err(e.to_string()))?;
            index_open_runs(&txn).map_err(|e| open_err(e.to_string()))?;
        }
        txn.commit().map_err(|e| open_err(e.to_string()))?;

        let db = Arc::new(db);
        let (tx, rx) = std::sync::mpsc::channel();
        let config = WriterConfig {
            durability: options.durability,
            checkpoints_per_run: options.checkpoints_per_run,
            max_batch: max_batch.max(1),
        };
        let writer_db = db.clone();
        let counters = Arc::new(writer::Counters::default());
        let writer_counters = counters.clone();
        let handle = std::thread::Builder::new()
            .name("hindsight-store-writer".into())
            .spawn(move || writer::run(writer_db, rx, config, writer_counters))
            .map_err(|e| open_err(format!("cannot start the writer thread: {e}")))?;
        Ok(Store {
            inner: Arc::new(Inner {
                db,
                counters,
                path,
                options,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the writer has done since the store was opened (group commit shows as fewer
    /// transactions than requests).
    pub fn writer_stats(&self) -> WriterStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.inner.counters;
        WriterStats {
            transactions: c.transactions.load(Relaxed),
            requests: c.requests.load(Relaxed),
            failed_transactions: c.failed_transactions.load(Relaxed),
        }
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    // ---------------------------------------------------------------- writes

    async fn submit(&self, ops: Vec<Op>) -> Result<Vec<Option<u64>>, StoreError> {
        let (ack, done) = oneshot::channel();
        {
            let guard = self.inner.tx.lock().map_err(|_| StoreError::Closed)?;
            let tx = guard.as_ref().ok_or(StoreError::Closed)?;
            tx.send(Request { ops, ack })
                .map_err(|_| StoreError::Closed)?;
        }
        done.await.map_err(|_| StoreError::Closed)?
    }

    async fn submit_one(&self, op: Op) -> Result<Option<u64>, StoreError> {
        let mut acks = self.submit(vec![op]).await?;
        acks.pop().ok_or(StoreError::Write {
            reason: "the writer acknowledged no op".into(),
        })
    }

    async fn submit_seq(&self, op: Op) -> Result<u64, StoreError> {
        self.submit_one(op).await?.ok_or(StoreError::Write {
            reason: "the writer assigned no sequence number".into(),
        })
    }

    /// Appends a diary entry; returns its sequence number once committed.
    pub async fn append_diary(&self, entry: NewDiaryEntry) -> Result<u64, StoreError> {
        self.submit_seq(WriteOp::diary(&entry)?.0).await
    }

    /// Appends an experience tuple; returns its sequence number once committed.
    pub async fn append_experience(&self, tuple: ExperienceTuple) -> Result<u64, StoreError> {
        self.submit_seq(WriteOp::experience(&tuple)?.0).await
    }

    /// Writes a run record.
    pub async fn put_run(&self, run: &Run) -> Result<(), StoreError> {
        self.submit_one(WriteOp::run(run)?.0).await.map(drop)
    }

    /// Writes a checkpoint and drops the run's older ones beyond the last K.
    pub async fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.submit_one(WriteOp::checkpoint(checkpoint)?.0)
            .await
            .map(drop)
    }

    /// Writes the terminal run and drops all but its final checkpoint, in one transaction.
    pub async fn finish_run(&self, run: &Run) -> Result<(), StoreError> {
        self.submit_one(WriteOp::finish_run(run)?.0).await.map(drop)
    }

    /// Records the result of an idempotent call under its idempotency key.
    pub async fn put_idempotent(
        &self,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.submit_one(WriteOp::idempotent(key, value)?.0)
            .await
            .map(drop)
    }

    /// Writes a generic record to a named table.
    pub async fn put<T: Serialize + ?Sized>(
        &self,
        table: KvTable,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        self.submit_one(WriteOp::put(table, key, value)?.0)
            .await
            .map(drop)
    }

    /// Deletes a generic record (no error if absent).
    pub async fn delete(&self, table: KvTable, key: &str) -> Result<(), StoreError> {
        self.submit_one(WriteOp::delete(table, key).0)
            .await
            .map(drop)
    }

    /// Writes several ops in one transaction, acknowledged together; returns, per op, the
    /// sequence number assigned to an append (`None` for other ops).
    pub async fn write_batch(&self, ops: Vec<WriteOp>) -> Result<Vec<Option<u64>>, StoreError> {
        self.submit(ops.into_iter().map(|o| o.0).collect()).await
    }

    // ---------------------------------------------------------------- reads

    fn read_txn(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.inner
            .db
            .begin_read()
            .map_err(read_err("(read transaction)"))
    }

    /// A run by id.
    pub fn get_run(&self, run_id: &str) -> Result<Option<Run>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn.open_table(RUNS).map_err(read_err("runs"))?;
        match t.get(run_id).map_err(read_err("runs"))? {
            Some(g) => decode("runs", run_id, g.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Every run, by id; a damaged record is an `Err` in its place.
    pub fn list_runs(&self) -> Result<Vec<Result<Run, StoreError>>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn.open_table(RUNS).map_err(read_err("runs"))?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(read_err("runs"))? {
            let (k, v) = entry.map_err(read_err("runs"))?;
            out.push(decode("runs", k.value(), v.value()));
        }
        Ok(out)
    }

    /// Runs not in a terminal state (to resume after a restart), from the open-runs index, so
    /// that the cost is that of the unfinished runs, not of every run kept; damaged run records
    /// are included as `Err`, since they may be unfinished.
    pub fn unfinished_runs(&self) -> Result<Vec<Result<Run, StoreError>>, StoreError> {
        let txn = self.read_txn()?;
        let open = txn.open_table(OPEN_RUNS).map_err(read_err("open_runs"))?;
        let runs = txn.open_table(RUNS).map_err(read_err("runs"))?;
        let mut out = Vec::new();
        for entry in open.iter().map_err(read_err("open_runs"))? {
            let (k, _) = entry.map_err(read_err("open_runs"))?;
            let Some(v) = runs.get(k.value()).map_err(read_err("runs"))? else {
                continue;
            };
            let run: Result<Run, StoreError> = decode("runs", k.value(), v.value());
            if run.as_ref().map_or(true, |r| !r.state.is_terminal()) {
                out.push(run);
            }
        }
        Ok(out)
    }

    /// How many runs the open-runs index holds (unfinished runs, and damaged records that may
    /// be).
    pub fn open_run_count(&self) -> Result<u64, StoreError> {
        let txn = self.read_txn()?;
        let open = txn.open_table(OPEN_RUNS).map_err(read_err("open_runs"))?;
        open.len().map_err(read_err("open_runs"))
    }

    /// A run's retained checkpoints, oldest first, each with its sequence number.
    pub fn checkpoints(&self, run_id: &str) -> Result<Entries<u64, Checkpoint>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn
            .open_table(CHECKPOINTS)
            .map_err(read_err("checkpoints"))?;
        let mut out = Vec::new();
        for entry in t
            .range((run_id, 0u64)..=(run_id, u64::MAX))
            .map_err(read_err("checkpoints"))?
        {
            let (k, v) = entry.map_err(read_err("checkpoints"))?;
            let seq = k.value().1;
            out.push((seq, decode_checkpoint(run_id, seq, v.value())));
        }
        Ok(out)
    }

    /// A run's newest checkpoint.
    pub fn latest_checkpoint(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn
            .open_table(CHECKPOINTS)
            .map_err(read_err("checkpoints"))?;
        let mut range = t
            .range((run_id, 0u64)..=(run_id, u64::MAX))
            .map_err(read_err("checkpoints"))?;
        match range.next_back() {
            Some(entry) => {
                let (k, v) = entry.map_err(read_err("checkpoints"))?;
                decode_checkpoint(run_id, k.value().1, v.value()).map(Some)
            }
            None => Ok(None),
        }
    }

    /// A run's newest retained checkpoint called `name`. A damaged checkpoint of the run is an
    /// error, since it might be the one asked for.
    pub fn checkpoint_named(
        &self,
        run_id: &str,
        name: &str,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let mut found = None;
        for (_, cp) in self.checkpoints(run_id)? {
            let cp = cp?;
            if cp.name.as_deref() == Some(name) {
                found = Some(cp);
            }
        }
        Ok(found)
    }

    /// The last `n` diary entries, oldest first; a damaged entry is an `Err` in its place.
    pub fn diary_tail(&self, n: usize) -> Result<Vec<Result<DiaryEntry, StoreError>>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn.open_table(DIARY).map_err(read_err("diary"))?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(read_err("diary"))?.rev().take(n) {
            let (k, v) = entry.map_err(read_err("diary"))?;
            out.push(decode_diary(k.value(), v.value()));
        }
        out.reverse();
        Ok(out)
    }

    /// Diary entries with a sequence number greater than `seq`, oldest first.
    pub fn diary_since(&self, seq: u64) -> Result<Vec<Result<DiaryEntry, StoreError>>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn.open_table(DIARY).map_err(read_err("diary"))?;
        let mut out = Vec::new();
        for entry in t
            .range(seq.saturating_add(1)..)
            .map_err(read_err("diary"))?
        {
            let (k, v) = entry.map_err(read_err("diary"))?;
            out.push(decode_diary(k.value(), v.value()));
        }
        Ok(out)
    }

    /// The whole experience log, oldest first, each with its sequence number.
    pub fn experience_all(&self) -> Result<Entries<u64, ExperienceTuple>, StoreError> {
        self.experience_since(0)
    }

    /// Experience tuples with a sequence number greater than `seq`, oldest first.
    pub fn experience_since(&self, seq: u64) -> Result<Entries<u64, ExperienceTuple>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn.open_table(EXPERIENCE).map_err(read_err("experience"))?;
        let mut out = Vec::new();
        for entry in t
            .range(seq.saturating_add(1)..)
            .map_err(read_err("experience"))?
        {
            let (k, v) = entry.map_err(read_err("experience"))?;
            let seq = k.value();
            out.push((seq, decode_experience(seq, v.value())));
        }
        Ok(out)
    }

    /// The recorded result of an idempotent call.
    pub fn get_idempotent(&self, key: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let txn = self.read_txn()?;
        let t = txn
            .open_table(IDEMPOTENCY)
            .map_err(read_err("idempotency"))?;
        match t.get(key).map_err(read_err("idempotency"))? {
            Some(g) => decode_idempotent(key, g.value()).map(Some),
            None => Ok(None),
        }
    }

    /// A generic record.
    pub fn get<T: DeserializeOwned>(
        &self,
        table: KvTable,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let name = table.redb_name();
        let txn = self.read_txn()?;
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(&name);
        let t = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(read_err(&name)(e)),
        };
        match t.get(key).map_err(read_err(&name))? {
            Some(g) => decode(&name, key, g.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Every record of a generic table, by key; a damaged record is an `Err` in its place.
    pub fn scan<T: DeserializeOwned>(
        &self,
        table: KvTable,
    ) -> Result<Entries<String, T>, StoreError> {
        let name = table.redb_name();
        let txn = self.read_txn()?;
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(&name);
        let t = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(read_err(&name)(e)),
        };
        let mut out = Vec::new();
        for entry in t.iter().map_err(read_err(&name))? {
            let (k, v) = entry.map_err(read_err(&name))?;
            let key = k.value().to_string();
            let value = decode(&name, &key, v.value());
            out.push((key, value));
        }
        Ok(out)
    }

    /// Record counts of every table and the size of the file.
    pub fn stats(&self) -> Result<StoreStats, StoreError> {
        let txn = self.read_txn()?;
        let mut tables = Vec::new();
        for handle in txn.list_tables().map_err(read_err("(table list)"))? {
            let name = handle.name().to_string();
            let t = txn.open_untyped_table(handle).map_err(read_err(&name))?;
            let records = t.len().map_err(read_err(&name))?;
            tables.push(TableStats {
                table: name,
                records,
            });
        }
        tables.sort_by(|a, b| a.table.cmp(&b.table));
        let file_bytes = std::fs::metadata(&self.inner.path)
            .map_err(|e| StoreError::Read {
                table: format!("(file {})", self.inner.path.display()),
                reason: e.to_string(),
            })?
            .len();
        Ok(StoreStats {
            path: self.inner.path.clone(),
            file_bytes,
            tables,
        })
    }

    /// Removes diary entries and experience tuples older than their TTL (`now_ms - ttl`).
    /// Damaged entries are kept (their age cannot be read) and counted. Runs in its own write
    /// transaction, serialized with the writer's by redb, durable per the store's options.
    pub fn compact(&self, now_ms: u64) -> Result<CompactReport, StoreError> {
        self.compact_with(now_ms, &[])
    }

    /// [`Store::compact`], and also the run TTL: every finished run last updated before
    /// `now_ms - run_ttl_ms` is removed with its checkpoints and its records in `run_records`.
    /// An unfinished run is never removed, however old; a damaged run record is kept (its state
    /// cannot be read) and counted.
    pub fn compact_with(
        &self,
        now_ms: u64,
        run_records: &[RunRecords],
    ) -> Result<CompactReport, StoreError> {
        let fail = |e: &dyn std::fmt::Display| StoreError::Write {
            reason: format!("compaction: {e}"),
        };
        let mut report = CompactReport::default();
        let mut txn = self.inner.db.begin_write().map_err(|e| fail(&e))?;
        txn.set_durability(match self.inner.options.durability {
            Durability::Immediate => redb::Durability::Immediate,
            Durability::None => redb::Durability::None,
        })
        .map_err(|e| fail(&e))?;
        {
            if let Some(ttl) = self.inner.options.diary_ttl_ms {
                let cutoff = now_ms.saturating_sub(ttl);
                let mut t = txn.open_table(DIARY).map_err(|e| fail(&e))?;
                let (mut removed, mut damaged) = (0, 0);
                t.retain(|_, v| match envelope::decode::<NewDiaryEntry>(v) {
                    Ok(e) if e.time_ms < cutoff => {
                        removed += 1;
                        false
                    }
                    Ok(_) => true,
                    Err(_) => {
                        damaged += 1;
                        true
                    }
                })
                .map_err(|e| fail(&e))?;
                report.diary_removed = removed;
                report.damaged_kept += damaged;
            }
            if let Some(ttl) = self.inner.options.experience_ttl_ms {
                let cutoff = now_ms.saturating_sub(ttl);
                let mut t = txn.open_table(EXPERIENCE).map_err(|e| fail(&e))?;
                let (mut removed, mut damaged) = (0, 0);
                t.retain(|_, v| match envelope::decode::<StoredExperience>(v) {
                    Ok(e) if e.time_ms() < cutoff => {
                        removed += 1;
                        false
                    }
                    Ok(_) => true,
                    Err(_) => {
                        damaged += 1;
                        true
                    }
                })
                .map_err(|e| fail(&e))?;
                report.experience_removed = removed;
                report.damaged_kept += damaged;
            }
            if let Some(ttl) = self.inner.options.run_ttl_ms {
                let cutoff = now_ms.saturating_sub(ttl);
                let gone = remove_old_runs(&txn, cutoff, run_records).map_err(|e| fail(&e))?;
                report.runs_removed = gone.runs;
                report.idempotency_removed = gone.idempotency;
                report.damaged_kept += gone.damaged;
            }
        }
        txn.commit().map_err(|e| fail(&e))?;
        Ok(report)
    }

    /// Overwrites a stored value with `bytes` as they are, without an envelope: for repair tools
    /// and for tests that must damage a record. `table` is a redb table name (`runs`,
    /// `checkpoints`, `diary`, `experience`, `idempotency`, `kv.<name>`) and `key` is written
    /// as errors report it (`17` for the diary and experience, `run_id#seq` for checkpoints).
    #[doc(hidden)]
    pub fn overwrite_raw(&self, table: &str, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let fail = |reason: String| StoreError::Write {
            reason: format!("cannot overwrite the key {key} of table {table}: {reason}"),
        };
        let txn = self
            .inner
            .db
            .begin_write()
            .map_err(|e| fail(e.to_string()))?;
        {
            match table {
                "diary" | "experience" => {
                    let seq: u64 = key
                        .parse()
                        .map_err(|_| fail("not a sequence number".into()))?;
                    let def = if table == "diary" { DIARY } else { EXPERIENCE };
                    let mut t = txn.open_table(def).map_err(|e| fail(e.to_string()))?;
                    t.insert(seq, bytes).map_err(|e| fail(e.to_string()))?;
                }
                "checkpoints" => {
                    let (run_id, seq) = key
                        .rsplit_once('#')
                        .and_then(|(r, s)| Some((r, s.parse::<u64>().ok()?)))
                        .ok_or_else(|| fail("not of the form run_id#seq".into()))?;
                    let mut t = txn
                        .open_table(CHECKPOINTS)
                        .map_err(|e| fail(e.to_string()))?;
                    t.insert((run_id, seq), bytes)
                        .map_err(|e| fail(e.to_string()))?;
                }
                "meta" => return Err(fail("the meta table holds no envelopes".into())),
                name => {
                    let def: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
                    let mut t = txn.open_table(def).map_err(|e| fail(e.to_string()))?;
                    t.insert(key, bytes).map_err(|e| fail(e.to_string()))?;
                }
            }
        }
        txn.commit().map_err(|e| fail(e.to_string()))
    }

    /// Names of the generic tables that exist (without the `kv.` prefix).
    pub fn kv_tables(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.read_txn()?;
        Ok(txn
            .list_tables()
            .map_err(read_err("(table list)"))?
            .filter_map(|h| h.name().strip_prefix(KV_PREFIX).map(str::to_string))
            .collect())
    }
}

#[cfg(test)]
mod tests;

/// The recovery loop's checkpoints, kept in the store (durable, with its retention rules).
impl crate::triage::checkpoint::CheckpointStore for Store {
    fn put<'a>(&'a self, cp: &'a Checkpoint) -> crate::triage::checkpoint::PutFuture<'a> {
        Box::pin(async move {
            self.put_checkpoint(cp)
                .await
                .map_err(crate::triage::checkpoint::CheckpointError::backend)
        })
    }

    fn latest(
        &self,
        run_id: &str,
    ) -> Result<Option<Checkpoint>, crate::triage::checkpoint::CheckpointError> {
        self.latest_checkpoint(run_id)
            .map_err(crate::triage::checkpoint::CheckpointError::backend)
    }

    fn named(
        &self,
        run_id: &str,
        name: &str,
    ) -> Result<Option<Checkpoint>, crate::triage::checkpoint::CheckpointError> {
        self.checkpoint_named(run_id, name)
            .map_err(crate::triage::checkpoint::CheckpointError::backend)
    }
}

/// Builds the open-runs index once, for a store written before it existed: every run record
/// that is not terminal (or cannot be read, so may not be) goes in. Later writes keep it.
fn index_open_runs(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META)?;
    let mut open = txn.open_table(OPEN_RUNS)?;
    if meta.get(OPEN_RUNS_INDEXED)?.is_some() {
        return Ok(());
    }
    let runs = txn.open_table(RUNS)?;
    for entry in runs.iter()? {
        let (k, v) = entry?;
        match decode::<Run>("runs", k.value(), v.value()) {
            Ok(run) if run.state.is_terminal() => {}
            // Unfinished, or unreadable and so maybe unfinished.
            Ok(_) | Err(_) => {
                open.insert(k.value(), ())?;
            }
        }
    }
    meta.insert(OPEN_RUNS_INDEXED, 1)?;
    Ok(())
}

/// What [`remove_old_runs`] removed and kept.
struct RunsRemoved {
    runs: u64,
    idempotency: u64,
    damaged: u64,
}

/// Removes every finished run last updated before `cutoff`, with its checkpoints, its records
/// in `run_records` and its idempotency records ([`idempotency`]'s scheme): a claim goes once no
/// run of its task is left, a call result once its run is gone. Damaged run and idempotency
/// records are kept and counted.
fn remove_old_runs(
    txn: &redb::WriteTransaction,
    cutoff: u64,
    run_records: &[RunRecords],
) -> Result<RunsRemoved, redb::Error> {
    let mut runs = txn.open_table(RUNS)?;
    let mut old: Vec<(String, String)> = Vec::new();
    let mut kept_tasks: HashSet<String> = HashSet::new();
    let mut damaged = 0;
    for entry in runs.iter()? {
        let (k, v) = entry?;
        match decode::<Run>("runs", k.value(), v.value()) {
            Ok(run) if run.state.is_terminal() && run.updated_ms < cutoff => {
                old.push((run.run_id, run.task_id));
            }
            Ok(run) => {
                kept_tasks.insert(run.task_id);
            }
            Err(_) => damaged += 1,
        }
    }
    let mut cps = txn.open_table(CHECKPOINTS)?;
    let mut open = txn.open_table(OPEN_RUNS)?;
    let names: Vec<String> = run_records.iter().map(|r| r.table.redb_name()).collect();
    let mut tables = Vec::with_capacity(run_records.len());
    for (r, name) in run_records.iter().zip(&names) {
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
        tables.push((txn.open_table(def)?, r.key));
    }
    for (run_id, task_id) in &old {
        runs.remove(run_id.as_str())?;
        open.remove(run_id.as_str())?;
        cps.retain_in(
            (run_id.as_str(), 0)..=(run_id.as_str(), u64::MAX),
            |_, _| false,
        )?;
        for (t, key) in &mut tables {
            let k = match key {
                RunKey::RunId => run_id.as_str(),
                RunKey::TaskId => task_id.as_str(),
            };
            t.remove(k)?;
        }
    }
    let gone_tasks: HashSet<&str> = old
        .iter()
        .map(|(_, t)| t.as_str())
        .filter(|t| !kept_tasks.contains(*t))
        .collect();
    let (idempotency, damaged_idem) = remove_run_idempotency(txn, &runs, &old, &gone_tasks)?;
    Ok(RunsRemoved {
        runs: old.len() as u64,
        idempotency,
        damaged: damaged + damaged_idem,
    })
}

/// Removes the idempotency records of the removed runs `old` (after they left `runs`): the call
/// results under each run's `{run_id}/a` prefix whose longest candidate run is not a stored
/// one, and the task claims of `gone_tasks`. Returns how many went and how many damaged claims
/// were kept.
fn remove_run_idempotency(
    txn: &redb::WriteTransaction,
    runs: &redb::Table<&str, &[u8]>,
    old: &[(String, String)],
    gone_tasks: &HashSet<&str>,
) -> Result<(u64, u64), redb::Error> {
    let mut idem = txn.open_table(IDEMPOTENCY)?;
    let mut doomed: Vec<String> = Vec::new();
    for (run_id, _) in old {
        let from = format!("{run_id}/a");
        let to = format!("{run_id}/b");
        for entry in idem.range(from.as_str()..to.as_str())? {
            let (k, _) = entry?;
            let key = k.value();
            let candidates = idempotency::call_key_runs(key);
            // The key is this run's unless a longer candidate is a run still stored.
            let mut taken = false;
            for c in candidates.iter().filter(|c| c.len() > run_id.len()) {
                if runs.get(*c)?.is_some() {
                    taken = true;
                    break;
                }
            }
            if !taken && candidates.contains(&run_id.as_str()) {
                doomed.push(key.to_string());
            }
        }
    }
    let mut damaged = 0;
    if !gone_tasks.is_empty() {
        let claims = idempotency::TASK_CLAIM_PREFIX..idempotency::TASK_CLAIM_END;
        for entry in idem.range(claims)? {
            let (k, v) = entry?;
            match decode_idempotent(k.value(), v.value()) {
                Ok(value) => {
                    if idempotency::claimed_task(&value).is_some_and(|t| gone_tasks.contains(t)) {
                        doomed.push(k.value().to_string());
                    }
                }
                Err(_) => damaged += 1,
            }
        }
    }
    for key in &doomed {
        idem.remove(key.as_str())?;
    }
    Ok((doomed.len() as u64, damaged))
}
