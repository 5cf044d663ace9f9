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
mod compact;
pub mod envelope;
mod error;
pub mod idempotency;
mod json;
mod read;
mod shrink;
mod stored;
mod tables;
mod transcode;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::Database;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::record::{Checkpoint, ExperienceTuple, Run};
use compact::index_open_runs;
pub use envelope::EnvelopeError;
pub use error::StoreError;
use json::{JsonEncoded, JsonRef};
pub use shrink::{ShrinkReport, shrink};
pub use tables::KvTable;
use tables::{CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, META, RUNS};
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

/// What the acknowledgement of a queued batch ([`Store::queue_batch`]) waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The batch committed and synced to disk (with the store's [`Durability`]).
    Synced,
    /// The batch committed and readable, written behind: not synced on its own, it reaches the
    /// disk with the next synced write (in the order queued, so a crash keeps a prefix of the
    /// writes), or when the writer has been idle a moment. For what can be rebuilt after a
    /// crash (a learner's snapshot, which the experience log replays): the runs' writes do not
    /// wait behind its sync.
    Behind,
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
        WriteOp::put_checkpoint(&cp.run_id, &stored::CheckpointRef::from(cp))
    }

    /// Writes an unnamed checkpoint of `run_id` at `step_index` whose state is `state`, encoded
    /// straight into the stored form of its JSON value: no JSON value or text is built, and it
    /// reads back as the value `serde_json::to_value` makes of it.
    pub fn checkpoint_of_state<T: Serialize + ?Sized>(
        run_id: &str,
        step_index: u32,
        state: &T,
        created_ms: u64,
    ) -> Result<WriteOp, StoreError> {
        let tree = encode_tree("checkpoints", run_id, state)?;
        let cp = stored::CheckpointRef::of_tree(run_id, step_index, &tree, created_ms);
        WriteOp::put_checkpoint(run_id, &cp)
    }

    /// The write of `cp`, a checkpoint of `run_id` in its storage form.
    fn put_checkpoint(run_id: &str, cp: &stored::CheckpointRef<'_>) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::PutCheckpoint {
            run_id: run_id.to_string(),
            bytes: encode("checkpoints", run_id, cp)?,
        }))
    }

    /// Writes a terminal run, drops all but its final checkpoint and removes the records of its
    /// calls (a tool stage's, a model's tool calls turn by turn, a procedure's: an ended run's
    /// calls are never repeated).
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
            bytes: encode("experience", "(new)", &stored::ExperienceRef::from(tuple))?,
        }))
    }

    /// Records the result of an idempotent call.
    pub fn idempotent(key: &str, value: &serde_json::Value) -> Result<WriteOp, StoreError> {
        Ok(WriteOp(Op::PutIdempotent {
            key: key.to_string(),
            bytes: encode("idempotency", key, &JsonRef(value))?,
        }))
    }

    /// Deletes the record of an idempotent call (no error if absent; a run's end removes those
    /// of its calls itself, see [`WriteOp::finish_run`]).
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

    /// Writes a generic record that holds JSON (a `serde_json::Value` somewhere in it, which
    /// postcard alone cannot decode) as the tree of its JSON form, encoded straight from
    /// `value` without building the value or its text; read it with [`Store::get_json`].
    pub fn put_json<T: Serialize + ?Sized>(
        table: KvTable,
        key: &str,
        value: &T,
    ) -> Result<WriteOp, StoreError> {
        let name = table.redb_name();
        let tree = encode_tree(&name, key, value)?;
        Ok(WriteOp(Op::Put {
            table,
            key: key.to_string(),
            bytes: encode(&name, key, &JsonEncoded(&tree))?,
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

impl StoreStats {
    /// The records in table `table` (its [`TableStats::table`] name), if the store has it.
    pub fn records(&self, table: &str) -> Option<u64> {
        self.tables
            .iter()
            .find(|t| t.table == table)
            .map(|t| t.records)
    }
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
    /// Transactions synced to disk: those holding a write that asked for it, and the syncs of
    /// write-behind transactions when the writer fell idle (none with [`Durability::None`]).
    pub synced: u64,
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

/// The outcome of [`Store::claim_idempotent`].
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The key was free and is now the caller's.
    Claimed,
    /// The key was already claimed for the same value.
    Held,
    /// The key is claimed for another value (shown; `null` if it went meanwhile).
    Taken(serde_json::Value),
}

fn encode<T: Serialize + ?Sized>(table: &str, key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    envelope::encode(value).map_err(|e| StoreError::Encode {
        table: table.to_string(),
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// The postcard bytes of the JSON tree of `value` ([`transcode::tree_bytes`]), for the record
/// `key` of `table`.
fn encode_tree<T: Serialize + ?Sized>(
    table: &str,
    key: &str,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    transcode::tree_bytes(value).map_err(|e| StoreError::Encode {
        table: table.to_string(),
        key: key.to_string(),
        reason: e.to_string(),
    })
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
        // redb panics on some damaged files (a table name that is not UTF-8): a damaged file is
        // an error that names it, never a crash of the process opening it.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || -> Result<redb::Database, StoreError> {
                let db = redb::Builder::new()
                    .set_cache_size(options.cache_bytes)
                    .create(&path)
                    .map_err(|e| match e {
                        redb::DatabaseError::DatabaseAlreadyOpen => open_err(
                            "another process has it open (a running daemon or command on the same \
                             data directory): stop it first"
                                .to_string(),
                        ),
                        other => open_err(other.to_string()),
                    })?;
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
                Ok(db)
            },
        ));
        let db = opened.unwrap_or_else(|panic| {
            let what = crate::panic_text(panic.as_ref());
            Err(open_err(format!(
                "the file is damaged: reading it failed inside redb ({what})"
            )))
        })?;

        let db = Arc::new(db);
        let (tx, rx) = std::sync::mpsc::channel();
        let config = WriterConfig {
            durability: options.durability,
            checkpoints_per_run: options.checkpoints_per_run,
            max_batch: max_batch.max(1),
            sync_behind_after: writer::SYNC_BEHIND_AFTER,
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
            synced: c.synced.load(Relaxed),
        }
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    // ---------------------------------------------------------------- writes

    async fn submit(&self, ops: Vec<Op>) -> Result<Vec<Option<u64>>, StoreError> {
        self.queue(ops, true)?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// Hands `ops` to the writer now; the receiver answers once they are committed (and synced
    /// to disk, with `sync`).
    fn queue(
        &self,
        ops: Vec<Op>,
        sync: bool,
    ) -> Result<oneshot::Receiver<writer::Ack>, StoreError> {
        let (ack, done) = oneshot::channel();
        let guard = self.inner.tx.lock().map_err(|_| StoreError::Closed)?;
        let tx = guard.as_ref().ok_or(StoreError::Closed)?;
        tx.send(Request { ops, ack, sync })
            .map_err(|_| StoreError::Closed)?;
        Ok(done)
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

    /// Claims `key` for `value` atomically: the check and the write happen in one write
    /// transaction, so of concurrent claims of one key exactly one finds it absent.
    pub async fn claim_idempotent(
        &self,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<Claim, StoreError> {
        let bytes = encode("idempotency", key, &JsonRef(value))?;
        let ack = self
            .submit_one(Op::ClaimIdempotent {
                key: key.to_string(),
                bytes,
            })
            .await?;
        match writer::ClaimCode::from_ack(ack) {
            Some(writer::ClaimCode::Claimed) => Ok(Claim::Claimed),
            Some(writer::ClaimCode::Same) => Ok(Claim::Held),
            Some(writer::ClaimCode::Other) => match self.get_idempotent(key)? {
                Some(v) => Ok(Claim::Taken(v)),
                // Deleted (run TTL) between the claim and this read: it was taken.
                None => Ok(Claim::Taken(serde_json::Value::Null)),
            },
            None => Err(StoreError::Write {
                reason: format!("the writer gave no outcome for the claim of {key}"),
            }),
        }
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

    /// Waits until every write queued before this call has been committed (or has failed): the
    /// writer commits in the order queued, so an empty request's acknowledgement comes after
    /// theirs. An actor that restarts calls it before reading its records back, so that it reads
    /// them after whatever its predecessor queued without waiting, not in the middle of it.
    pub async fn settled(&self) -> Result<(), StoreError> {
        self.submit(Vec::new()).await.map(drop)
    }

    /// Queues `ops` as one transaction now, without waiting: batches queued one after another
    /// are committed in that order (an actor can hand over its snapshots and go on serving).
    /// The future answers once they are committed, and synced to disk as `commit` says.
    pub fn queue_batch(
        &self,
        ops: Vec<WriteOp>,
        commit: Commit,
    ) -> impl std::future::Future<Output = Result<Vec<Option<u64>>, StoreError>> + Send + 'static
    {
        let queued = self.queue(
            ops.into_iter().map(|o| o.0).collect(),
            commit == Commit::Synced,
        );
        async move { queued?.await.map_err(|_| StoreError::Closed)? }
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
