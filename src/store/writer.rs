//! The single writer thread: gathers concurrent write requests into one transaction (group
//! commit) and acknowledges each only after that transaction committed. A transaction is synced
//! to disk when one of its requests asks for it; one made only of write-behind requests (the
//! learners' snapshots, which the experience log can rebuild) is not, and reaches the disk with
//! the next synced one, or when the writer falls idle for [`SYNC_BEHIND_AFTER`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use redb::{Database, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use tokio::sync::oneshot;

use super::tables::{
    CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, KvTable, META, NEXT_CHECKPOINT, NEXT_DIARY,
    NEXT_EXPERIENCE, OPEN_RUNS, RUNS,
};
use super::{Durability, StoreError, idempotency};

/// Most requests gathered into one transaction.
pub(crate) const MAX_BATCH: usize = 4096;

/// While gathering a batch smaller than the previous one, the writer yields its thread to let
/// just-acknowledged callers send their next write into it, and stops after this many yields in
/// a row that brought nothing, or after [`GATHER_MAX_WAIT`].
const GATHER_IDLE_YIELDS: u32 = 128;

/// The longest a transaction's gathering goes on yielding. On an idle machine a yield returns
/// at once and the yields above take some 40 us; on a busy one a yield gives the writer's core
/// to whatever else is runnable (a learner's refit) for a time slice, and without this bound a
/// run's single write waited milliseconds for a batch no one was joining.
const GATHER_MAX_WAIT: Duration = Duration::from_micros(50);

/// How long the writer waits, idle, before it syncs the write-behind transactions committed
/// since the last synced one: a crash loses at most what the learners wrote in that time after
/// the last run's write, which they replay from the experience log at their next start.
pub(crate) const SYNC_BEHIND_AFTER: Duration = Duration::from_millis(100);

/// Most runs whose checkpoints [`Retained`] keeps track of; past it, it starts again.
const MAX_RETAINED_RUNS: usize = 1 << 16;

/// The sequence numbers of the checkpoints of runs under way, oldest first, as a scan of the
/// table found them at the run's first checkpoint in this writer and the writer added to them
/// since: a later checkpoint drops the oldest past the retention, and the run's end all but the
/// last, without scanning the run's checkpoints again. The writer holds the database's file
/// lock and every write goes through it, so an entry is every checkpoint its run has (only
/// `Store::overwrite_raw`, a repair tool's, writes around it). It is cleared when a transaction
/// fails, as what it learned from that transaction was not committed.
#[derive(Debug, Default)]
struct Retained {
    runs: HashMap<String, VecDeque<u64>>,
}

impl Retained {
    /// Notes the checkpoints a run has, as a scan of the table found them.
    fn scanned(&mut self, run_id: &str, seqs: VecDeque<u64>) {
        if self.runs.len() >= MAX_RETAINED_RUNS {
            self.runs.clear();
        }
        self.runs.insert(run_id.to_string(), seqs);
    }

    /// Forgets a run that ended; returns what it knew of its checkpoints.
    fn ended(&mut self, run_id: &str) -> Option<VecDeque<u64>> {
        self.runs.remove(run_id)
    }
}

/// One encoded write.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    PutRun {
        run_id: String,
        /// Whether the run is unfinished (it stays in the open-runs index).
        open: bool,
        bytes: Vec<u8>,
    },
    PutCheckpoint {
        run_id: String,
        bytes: Vec<u8>,
    },
    FinishRun {
        run_id: String,
        bytes: Vec<u8>,
    },
    AppendDiary {
        bytes: Vec<u8>,
    },
    AppendExperience {
        bytes: Vec<u8>,
    },
    PutIdempotent {
        key: String,
        bytes: Vec<u8>,
    },
    DeleteIdempotent {
        key: String,
    },
    /// Writes `bytes` under `key` only if the key is absent, in the transaction itself, so that
    /// two concurrent claims cannot both see it absent; the ack is a [`ClaimCode`].
    ClaimIdempotent {
        key: String,
        bytes: Vec<u8>,
    },
    Put {
        table: KvTable,
        key: String,
        bytes: Vec<u8>,
    },
    Delete {
        table: KvTable,
        key: String,
    },
}

/// The outcome of an [`Op::ClaimIdempotent`], as the op's ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimCode {
    /// The key was absent and is now claimed.
    Claimed = 0,
    /// The key already held these very bytes.
    Same = 1,
    /// The key holds another value.
    Other = 2,
}

impl ClaimCode {
    pub(crate) fn from_ack(ack: Option<u64>) -> Option<ClaimCode> {
        match ack {
            Some(0) => Some(ClaimCode::Claimed),
            Some(1) => Some(ClaimCode::Same),
            Some(2) => Some(ClaimCode::Other),
            _ => None,
        }
    }
}

/// What one request gets back: per op, the sequence number assigned to an append.
pub(crate) type Ack = Result<Vec<Option<u64>>, StoreError>;

/// What one transaction gives its requests: each one's sequence numbers, or the error that
/// failed them all.
type Outcome = Result<Vec<Vec<Option<u64>>>, StoreError>;

/// [`Outcome`] of a committed transaction, with whether it was synced to disk.
type Committed = Result<(Vec<Vec<Option<u64>>>, bool), StoreError>;

/// A caller's write request: its ops commit together, and `ack` hears when they did.
pub(crate) struct Request {
    pub(crate) ops: Vec<Op>,
    pub(crate) ack: oneshot::Sender<Ack>,
    /// Whether the ack waits for the ops to be synced to disk (with the store's durability);
    /// a write-behind request's ack only says they are committed and readable.
    pub(crate) sync: bool,
}

/// Settings of the writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterConfig {
    pub(crate) durability: Durability,
    pub(crate) checkpoints_per_run: usize,
    /// At most this many requests per transaction (1 = one commit per request).
    pub(crate) max_batch: usize,
    /// Idle time after which write-behind transactions are synced ([`SYNC_BEHIND_AFTER`]).
    pub(crate) sync_behind_after: Duration,
}

/// Counts of the writer's work, shared with the store.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) failed_transactions: AtomicU64,
    /// Transactions synced to disk (with the store's durability; the syncs of idle write-behind
    /// included).
    pub(crate) synced: AtomicU64,
}

/// Runs until every sender is gone.
pub(crate) fn run(
    db: Arc<Database>,
    rx: Receiver<Request>,
    config: WriterConfig,
    counters: Arc<Counters>,
) {
    // How many requests the previous transaction held: the callers it just acknowledged are
    // likely to write again at once, so the next batch waits for them a little.
    let mut previous = 0;
    // Whether write-behind transactions were committed since the last synced one.
    let mut unsynced = false;
    let mut retained = Retained::default();
    loop {
        let first = if unsynced {
            match rx.recv_timeout(config.sync_behind_after) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    // Tried once per idle spell: a sync that failed is left to the next synced
                    // write rather than retried in a loop.
                    sync(&db, &counters);
                    unsynced = false;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(first) => first,
                Err(_) => break,
            }
        };
        let (batch, outcome) = gather_and_commit(&db, first, &rx, config, previous, &mut retained);
        previous = batch.len();
        match outcome {
            Ok((results, synced)) => {
                if synced {
                    counters.synced.fetch_add(1, Ordering::Relaxed);
                }
                unsynced = config.durability == Durability::Immediate && !synced;
                counters.transactions.fetch_add(1, Ordering::Relaxed);
                counters
                    .requests
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (req, res) in batch.into_iter().zip(results) {
                    // A caller that stopped waiting is not an error of the store.
                    let _ = req.ack.send(Ok(res));
                }
            }
            Err(e) => {
                retained.runs.clear();
                counters.failed_transactions.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, requests = batch.len(), "store batch failed");
                for req in batch {
                    let _ = req.ack.send(Err(e.clone()));
                }
            }
        }
    }
    if unsynced {
        sync(&db, &counters);
    }
}

/// Syncs the write-behind transactions committed since the last synced one (an empty synced
/// transaction carries them to disk); a failure is logged (the next synced transaction carries
/// them).
fn sync(db: &Database, counters: &Counters) {
    let synced = db
        .begin_write()
        .map_err(fail("cannot begin a write transaction"))
        .and_then(|mut txn| {
            txn.set_durability(redb::Durability::Immediate)
                .map_err(fail("cannot set the durability"))?;
            txn.commit().map_err(fail("the commit failed"))
        });
    match synced {
        Ok(()) => {
            counters.synced.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the learners' write-behind could not be synced; the next write carries it");
        }
    }
}

/// Maps an error of redb to a write error that says what was being done.
pub(super) fn fail<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Write {
        reason: format!("{what}: {e}"),
    }
}

/// One transaction: opens it for `first`, writes each further request into it as it arrives
/// (so that writing overlaps the callers' sending), and commits it, synced to disk when one of
/// its requests asks for it and the store's durability allows. Returns the requests it took,
/// with their sequence numbers and whether it was synced, or the error that failed them all: a
/// request that cannot be written ends the gathering, and nothing of its transaction is
/// committed.
fn gather_and_commit(
    db: &Database,
    first: Request,
    rx: &Receiver<Request>,
    config: WriterConfig,
    previous: usize,
    retained: &mut Retained,
) -> (Vec<Request>, Committed) {
    let mut batch = Vec::with_capacity(previous.max(1));
    batch.push(first);
    let mut txn = match db
        .begin_write()
        .map_err(fail("cannot begin a write transaction"))
    {
        Ok(txn) => txn,
        Err(e) => return (batch, Err(e)),
    };
    let outcome = gather(&txn, &mut batch, rx, config, previous, retained);
    let sync = config.durability == Durability::Immediate && batch.iter().any(|r| r.sync);
    let outcome = outcome.and_then(|results| {
        txn.set_durability(if sync {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        })
        .map_err(fail("cannot set the durability"))?;
        txn.commit()
            .map(|()| (results, sync))
            .map_err(fail("the commit failed"))
    });
    // On an error the transaction was dropped, which aborts it.
    (batch, outcome)
}

/// Writes `batch[0]`, then takes and writes requests while they arrive, up to the batch limit.
fn gather(
    txn: &WriteTransaction,
    batch: &mut Vec<Request>,
    rx: &Receiver<Request>,
    config: WriterConfig,
    previous: usize,
    retained: &mut Retained,
) -> Outcome {
    let max_batch = config.max_batch.max(1);
    let mut tables = Tables::open(txn, config, retained)?;
    let mut results = Vec::with_capacity(previous.max(1));
    results.push(tables.apply(&batch[0].ops)?);
    let mut idle = 0;
    let mut waiting: Option<Instant> = None;
    while batch.len() < max_batch {
        match rx.try_recv() {
            Ok(req) => {
                idle = 0;
                let written = tables.apply(&req.ops);
                batch.push(req);
                results.push(written?);
            }
            Err(TryRecvError::Empty)
                if batch.len() < previous
                    && idle < GATHER_IDLE_YIELDS
                    && waiting.get_or_insert_with(Instant::now).elapsed() < GATHER_MAX_WAIT =>
            {
                // Let the acknowledged callers run.
                idle += 1;
                std::thread::yield_now();
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
        }
    }
    tables.finish()?;
    Ok(results)
}

/// Removes the call records of run `run_id`, whose end is being written (its calls are never
/// repeated; [`idempotency::calls_of`]).
fn forget_calls(
    idem: &mut redb::Table<&str, &[u8]>,
    runs: &redb::Table<&str, &[u8]>,
    run_id: &str,
) -> Result<(), StoreError> {
    let keys = idempotency::calls_of(idem, runs, run_id)
        .map_err(fail("cannot read the call records of a run's end"))?;
    for key in keys {
        idem.remove(key.as_str())
            .map_err(fail("cannot delete from the table idempotency"))?;
    }
    Ok(())
}

fn next(meta: &redb::Table<&str, u64>, key: &str) -> Result<u64, StoreError> {
    Ok(meta
        .get(key)
        .map_err(fail("cannot read the table meta"))?
        .map(|g| g.value())
        .unwrap_or(1))
}

/// A generic table open in a write transaction.
type KvRows<'t> = redb::Table<'t, &'static str, &'static [u8]>;

/// The open tables of one write transaction and the sequence numbers it hands out.
struct Tables<'t> {
    meta: redb::Table<'t, &'static str, u64>,
    runs: redb::Table<'t, &'static str, &'static [u8]>,
    open_runs: redb::Table<'t, &'static str, ()>,
    cps: redb::Table<'t, (&'static str, u64), &'static [u8]>,
    diary: redb::Table<'t, u64, &'static [u8]>,
    exp: redb::Table<'t, u64, &'static [u8]>,
    idem: redb::Table<'t, &'static str, &'static [u8]>,
    /// Next sequence numbers (diary, experience, checkpoint) and their values at the start.
    next: [u64; 3],
    start: [u64; 3],
    keep: usize,
    retained: &'t mut Retained,
    /// The generic tables opened so far in this transaction (a few: opening one per write
    /// looked it up in the table tree each time).
    kv: Vec<(KvTable, String, KvRows<'t>)>,
    txn: &'t WriteTransaction,
}

impl<'t> Tables<'t> {
    fn open(
        txn: &'t WriteTransaction,
        config: WriterConfig,
        retained: &'t mut Retained,
    ) -> Result<Tables<'t>, StoreError> {
        let meta = open_table(txn, META)?;
        let next = [
            next(&meta, NEXT_DIARY)?,
            next(&meta, NEXT_EXPERIENCE)?,
            next(&meta, NEXT_CHECKPOINT)?,
        ];
        Ok(Tables {
            meta,
            runs: open_table(txn, RUNS)?,
            open_runs: open_table(txn, OPEN_RUNS)?,
            cps: open_table(txn, CHECKPOINTS)?,
            diary: open_table(txn, DIARY)?,
            exp: open_table(txn, EXPERIENCE)?,
            idem: open_table(txn, IDEMPOTENCY)?,
            next,
            start: next,
            keep: config.checkpoints_per_run.max(1),
            retained,
            kv: Vec::new(),
            txn,
        })
    }

    /// Writes one request's ops; returns the sequence number of each append.
    fn apply(&mut self, ops: &[Op]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut acks = Vec::with_capacity(ops.len());
        for op in ops {
            let mut seq = None;
            match op {
                Op::PutRun {
                    run_id,
                    open,
                    bytes,
                } => {
                    self.runs
                        .insert(run_id.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table runs"))?;
                    if *open {
                        // A run's every transition while open: its key is there since its
                        // acceptance, and inserting it again would rewrite its page.
                        let held = self.open_runs.get(run_id.as_str()).map(|v| v.is_some());
                        match held {
                            Ok(true) => Ok(()),
                            Ok(false) => self.open_runs.insert(run_id.as_str(), ()).map(|_| ()),
                            Err(e) => Err(e),
                        }
                    } else {
                        self.retained.ended(run_id);
                        self.open_runs.remove(run_id.as_str()).map(|_| ())
                    }
                    .map_err(fail("cannot write to the table open_runs"))?;
                }
                Op::PutCheckpoint { run_id, bytes } => {
                    let seq = self.next[2];
                    self.cps
                        .insert((run_id.as_str(), seq), bytes.as_slice())
                        .map_err(fail("cannot write to the table checkpoints"))?;
                    self.next[2] += 1;
                    match self.retained.runs.get_mut(run_id.as_str()) {
                        Some(seqs) => {
                            seqs.push_back(seq);
                            keep_newest(&mut self.cps, run_id, seqs, self.keep)?;
                        }
                        None => {
                            let mut seqs = scan_checkpoints(&self.cps, run_id)?;
                            keep_newest(&mut self.cps, run_id, &mut seqs, self.keep)?;
                            self.retained.scanned(run_id, seqs);
                        }
                    }
                }
                Op::FinishRun { run_id, bytes } => {
                    self.runs
                        .insert(run_id.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table runs"))?;
                    self.open_runs
                        .remove(run_id.as_str())
                        .map_err(fail("cannot write to the table open_runs"))?;
                    // What the writer knows of a run is every checkpoint the run has (`Retained`).
                    let mut seqs = match self.retained.ended(run_id) {
                        Some(seqs) => seqs,
                        None => scan_checkpoints(&self.cps, run_id)?,
                    };
                    keep_newest(&mut self.cps, run_id, &mut seqs, 1)?;
                    forget_calls(&mut self.idem, &self.runs, run_id)?;
                }
                Op::AppendDiary { bytes } => {
                    self.diary
                        .insert(self.next[0], bytes.as_slice())
                        .map_err(fail("cannot write to the table diary"))?;
                    seq = Some(self.next[0]);
                    self.next[0] += 1;
                }
                Op::AppendExperience { bytes } => {
                    self.exp
                        .insert(self.next[1], bytes.as_slice())
                        .map_err(fail("cannot write to the table experience"))?;
                    seq = Some(self.next[1]);
                    self.next[1] += 1;
                }
                Op::PutIdempotent { key, bytes } => {
                    self.idem
                        .insert(key.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table idempotency"))?;
                }
                Op::DeleteIdempotent { key } => {
                    self.idem
                        .remove(key.as_str())
                        .map_err(fail("cannot delete from the table idempotency"))?;
                }
                Op::ClaimIdempotent { key, bytes } => {
                    let held = self
                        .idem
                        .get(key.as_str())
                        .map_err(fail("cannot read the table idempotency"))?
                        .map(|g| g.value() == bytes.as_slice());
                    let code = match held {
                        Some(true) => ClaimCode::Same,
                        Some(false) => ClaimCode::Other,
                        None => {
                            self.idem
                                .insert(key.as_str(), bytes.as_slice())
                                .map_err(fail("cannot write to the table idempotency"))?;
                            ClaimCode::Claimed
                        }
                    };
                    seq = Some(code as u64);
                }
                Op::Put { table, key, bytes } => {
                    let (name, t) = self.kv(*table)?;
                    t.insert(key.as_str(), bytes.as_slice())
                        .map_err(|e| StoreError::Write {
                            reason: format!("cannot write the key {key} to the table {name}: {e}"),
                        })?;
                }
                Op::Delete { table, key } => {
                    let (name, t) = self.kv(*table)?;
                    t.remove(key.as_str()).map_err(|e| StoreError::Write {
                        reason: format!("cannot delete the key {key} from the table {name}: {e}"),
                    })?;
                }
            }
            acks.push(seq);
        }
        Ok(acks)
    }

    /// The generic table `table` (its redb name, for errors), opened in `txn` once.
    fn kv(&mut self, table: KvTable) -> Result<(&str, &mut KvRows<'t>), StoreError> {
        let i = match self.kv.iter().position(|(t, _, _)| *t == table) {
            Some(i) => i,
            None => {
                let name = table.redb_name();
                let t = open_table(self.txn, TableDefinition::<&str, &[u8]>::new(&name))?;
                self.kv.push((table, name, t));
                self.kv.len() - 1
            }
        };
        let (_, name, t) = &mut self.kv[i];
        Ok((name.as_str(), t))
    }

    /// Writes the sequence counters that moved (an unchanged one would dirty pages for nothing)
    /// and closes the tables.
    fn finish(mut self) -> Result<(), StoreError> {
        for (i, key) in [NEXT_DIARY, NEXT_EXPERIENCE, NEXT_CHECKPOINT]
            .into_iter()
            .enumerate()
        {
            if self.next[i] != self.start[i] {
                self.meta
                    .insert(key, self.next[i])
                    .map_err(fail("cannot write to the table meta"))?;
            }
        }
        Ok(())
    }
}

/// Opens `def` in `txn`; the error names the table.
fn open_table<'t, K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &'t WriteTransaction,
    def: TableDefinition<K, V>,
) -> Result<redb::Table<'t, K, V>, StoreError> {
    txn.open_table(def).map_err(|e| StoreError::Write {
        reason: format!("cannot open the table {}: {e}", def.name()),
    })
}

/// The sequence numbers of the checkpoints of `run_id`, oldest first.
fn scan_checkpoints(
    cps: &redb::Table<(&str, u64), &[u8]>,
    run_id: &str,
) -> Result<VecDeque<u64>, StoreError> {
    let mut seqs = VecDeque::new();
    for entry in cps
        .range((run_id, 0u64)..=(run_id, u64::MAX))
        .map_err(fail("cannot scan the table checkpoints"))?
    {
        let (k, _) = entry.map_err(fail("cannot scan the table checkpoints"))?;
        seqs.push_back(k.value().1);
    }
    Ok(seqs)
}

/// Deletes the oldest of `seqs`, checkpoints of `run_id`, until `keep` are left.
fn keep_newest(
    cps: &mut redb::Table<(&str, u64), &[u8]>,
    run_id: &str,
    seqs: &mut VecDeque<u64>,
    keep: usize,
) -> Result<(), StoreError> {
    while seqs.len() > keep {
        if let Some(seq) = seqs.pop_front() {
            cps.remove((run_id, seq))
                .map_err(fail("cannot delete from the table checkpoints"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tables::DIARY;
    use redb::ReadableDatabase;

    fn config() -> WriterConfig {
        WriterConfig {
            durability: Durability::None,
            checkpoints_per_run: 3,
            max_batch: MAX_BATCH,
            sync_behind_after: SYNC_BEHIND_AFTER,
        }
    }

    fn request(op: Op) -> (Request, oneshot::Receiver<Ack>) {
        request_synced(op, true)
    }

    fn request_synced(op: Op, sync: bool) -> (Request, oneshot::Receiver<Ack>) {
        let (ack, rx) = oneshot::channel();
        (
            Request {
                ops: vec![op],
                ack,
                sync,
            },
            rx,
        )
    }

    fn diary_rows(db: &Database) -> Vec<u64> {
        let read = db.begin_read().unwrap();
        let diary = read.open_table(DIARY).unwrap();
        diary
            .iter()
            .unwrap()
            .map(|e| e.unwrap().0.value())
            .collect()
    }

    /// Runs the writer over `requests` (`true` = synced) queued before it starts, one per
    /// transaction; returns its counters and the diary's sequence numbers.
    fn write(durability: Durability, requests: &[bool]) -> (Arc<Counters>, Vec<u64>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("t.redb")).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let mut acks = Vec::new();
        for (i, &sync) in requests.iter().enumerate() {
            let (req, ack) = request_synced(
                Op::AppendDiary {
                    bytes: vec![i as u8],
                },
                sync,
            );
            tx.send(req).unwrap();
            acks.push(ack);
        }
        drop(tx);
        let counters = Arc::new(Counters::default());
        let cfg = WriterConfig {
            durability,
            max_batch: 1,
            sync_behind_after: Duration::from_secs(3600),
            ..config()
        };
        run(db.clone(), rx, cfg, counters.clone());
        for ack in acks {
            assert!(ack.blocking_recv().unwrap().is_ok());
        }
        (counters, diary_rows(&db))
    }

    #[test]
    fn a_transaction_is_synced_when_one_of_its_writes_asks_and_at_the_stop_when_one_did_not() {
        // (durability, each request synced or not, transactions synced)
        let cases: [(Durability, &[bool], u64, &str); 3] = [
            (
                Durability::Immediate,
                &[false, false, true],
                1,
                "the writes behind reach the disk with the next synced one, nothing is left \
                 to sync at the stop",
            ),
            (
                Durability::Immediate,
                &[true, false],
                2,
                "a write behind left unsynced is synced when the writer stops",
            ),
            (
                Durability::None,
                &[true, false],
                0,
                "a store without durability syncs nothing",
            ),
        ];
        for (durability, requests, synced, what) in cases {
            let (counters, rows) = write(durability, requests);
            assert_eq!(
                counters.transactions.load(Ordering::Relaxed),
                requests.len() as u64
            );
            assert_eq!(counters.synced.load(Ordering::Relaxed), synced, "{what}");
            assert_eq!(rows, (1..=requests.len() as u64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_write_behind_is_synced_when_the_writer_falls_idle() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("t.redb")).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let counters = Arc::new(Counters::default());
        let cfg = WriterConfig {
            durability: Durability::Immediate,
            sync_behind_after: Duration::from_millis(1),
            ..config()
        };
        let writer = std::thread::spawn({
            let (db, counters) = (db.clone(), counters.clone());
            move || run(db, rx, cfg, counters)
        });
        let (req, ack) = request_synced(Op::AppendDiary { bytes: vec![1] }, false);
        tx.send(req).unwrap();
        assert!(ack.blocking_recv().unwrap().is_ok());
        // The writer, idle, syncs it on its own (waited for as an event, with a deadline).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while counters.synced.load(Ordering::Relaxed) == 0 {
            assert!(std::time::Instant::now() < deadline, "never synced");
            std::thread::yield_now();
        }
        drop(tx);
        writer.join().unwrap();
        assert_eq!(counters.transactions.load(Ordering::Relaxed), 1);
        assert_eq!(
            counters.synced.load(Ordering::Relaxed),
            1,
            "synced once, and not again at the stop"
        );
        assert_eq!(diary_rows(&db), vec![1]);
    }

    #[test]
    fn a_request_that_cannot_be_written_fails_its_batch_and_the_next_batch_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("t.redb")).unwrap());
        // A table under a KvTable's name but with other types makes that request's op fail.
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<u64, u64>::new("kv.typed"))
            .unwrap();
        txn.commit().unwrap();

        let (tx, rx) = std::sync::mpsc::channel();
        let mut acks = Vec::new();
        for op in [
            Op::AppendDiary { bytes: vec![1] },
            Op::Put {
                table: KvTable::new("typed"),
                key: "k".into(),
                bytes: vec![1],
            },
            Op::AppendDiary { bytes: vec![2] },
            Op::AppendDiary { bytes: vec![3] },
        ] {
            let (req, ack) = request(op);
            tx.send(req).unwrap();
            acks.push(ack);
        }
        drop(tx);
        let counters = Arc::new(Counters::default());
        let cfg = WriterConfig {
            max_batch: 3,
            ..config()
        };
        run(db.clone(), rx, cfg, counters.clone());

        let mut acks = acks.into_iter().map(|a| a.blocking_recv().unwrap());
        // The first request was written into the same transaction as the failing one: it fails
        // with it, naming the table at fault, and the gathering stops there.
        for _ in 0..2 {
            let err = acks.next().unwrap().unwrap_err();
            assert!(
                matches!(&err, StoreError::Write { reason } if reason.contains("kv.typed")),
                "{err:?}"
            );
        }
        assert_eq!(acks.next().unwrap(), Ok(vec![Some(1)]));
        assert_eq!(acks.next().unwrap(), Ok(vec![Some(2)]));
        assert_eq!(counters.failed_transactions.load(Ordering::Relaxed), 1);
        assert_eq!(counters.transactions.load(Ordering::Relaxed), 1);
        let read = db.begin_read().unwrap();
        let diary = read.open_table(DIARY).unwrap();
        let rows: Vec<(u64, Vec<u8>)> = diary
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect();
        assert_eq!(
            rows,
            vec![(1, vec![2]), (2, vec![3])],
            "nothing of the failed batch was written"
        );
    }
}
