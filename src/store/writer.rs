//! The single writer thread: gathers concurrent write requests into one transaction (group
//! commit) and acknowledges each only after that transaction committed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::oneshot;

use super::tables::{
    CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, KvTable, META, NEXT_CHECKPOINT, NEXT_DIARY,
    NEXT_EXPERIENCE, RUNS,
};
use super::{Durability, StoreError};

/// Most requests gathered into one transaction.
pub(crate) const MAX_BATCH: usize = 4096;

/// While gathering a batch smaller than the previous one, the writer yields its thread to let
/// just-acknowledged callers send their next write into it, and stops after this many yields in
/// a row that brought nothing (no clock: a caller still arriving keeps the batch open).
const GATHER_IDLE_YIELDS: u32 = 128;

/// One encoded write.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    PutRun {
        run_id: String,
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

/// What one request gets back: per op, the sequence number assigned to an append.
pub(crate) type Ack = Result<Vec<Option<u64>>, StoreError>;

/// A caller's write request: its ops commit together, and `ack` hears when they did.
pub(crate) struct Request {
    pub(crate) ops: Vec<Op>,
    pub(crate) ack: oneshot::Sender<Ack>,
}

/// Settings of the writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterConfig {
    pub(crate) durability: Durability,
    pub(crate) checkpoints_per_run: usize,
    /// At most this many requests per transaction (1 = one commit per request).
    pub(crate) max_batch: usize,
}

/// Counts of the writer's work, shared with the store.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) failed_transactions: AtomicU64,
}

/// Runs until every sender is gone.
pub(crate) fn run(
    db: Arc<Database>,
    rx: Receiver<Request>,
    config: WriterConfig,
    counters: Arc<Counters>,
) {
    let max_batch = config.max_batch.max(1);
    // How many requests the previous transaction held: the callers it just acknowledged are
    // likely to write again at once, so the next batch waits for them a little.
    let mut previous = 0;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let mut idle = 0;
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(r) => {
                    batch.push(r);
                    idle = 0;
                }
                Err(TryRecvError::Empty) if batch.len() < previous && idle < GATHER_IDLE_YIELDS => {
                    // Let the acknowledged callers run.
                    idle += 1;
                    std::thread::yield_now();
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        previous = batch.len();
        match commit(&db, &batch, config) {
            Ok(results) => {
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
                counters.failed_transactions.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, requests = batch.len(), "store batch failed");
                for req in batch {
                    let _ = req.ack.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Maps an error of redb to a write error that says what was being done.
pub(super) fn fail<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Write {
        reason: format!("{what}: {e}"),
    }
}

fn commit(
    db: &Database,
    batch: &[Request],
    config: WriterConfig,
) -> Result<Vec<Vec<Option<u64>>>, StoreError> {
    let mut txn = db
        .begin_write()
        .map_err(fail("cannot begin a write transaction"))?;
    txn.set_durability(match config.durability {
        Durability::Immediate => redb::Durability::Immediate,
        Durability::None => redb::Durability::None,
    })
    .map_err(fail("cannot set the durability"))?;
    let results = apply(&txn, batch, config)?;
    txn.commit().map_err(fail("the commit failed"))?;
    Ok(results)
}

fn next(meta: &redb::Table<&str, u64>, key: &str) -> Result<u64, StoreError> {
    Ok(meta
        .get(key)
        .map_err(fail("cannot read the table meta"))?
        .map(|g| g.value())
        .unwrap_or(1))
}

fn apply(
    txn: &WriteTransaction,
    batch: &[Request],
    config: WriterConfig,
) -> Result<Vec<Vec<Option<u64>>>, StoreError> {
    let mut meta = txn
        .open_table(META)
        .map_err(fail("cannot open the table meta"))?;
    let mut runs = txn
        .open_table(RUNS)
        .map_err(fail("cannot open the table runs"))?;
    let mut cps = txn
        .open_table(CHECKPOINTS)
        .map_err(fail("cannot open the table checkpoints"))?;
    let mut diary = txn
        .open_table(DIARY)
        .map_err(fail("cannot open the table diary"))?;
    let mut exp = txn
        .open_table(EXPERIENCE)
        .map_err(fail("cannot open the table experience"))?;
    let mut idem = txn
        .open_table(IDEMPOTENCY)
        .map_err(fail("cannot open the table idempotency"))?;
    let mut next_diary = next(&meta, NEXT_DIARY)?;
    let mut next_exp = next(&meta, NEXT_EXPERIENCE)?;
    let mut next_cp = next(&meta, NEXT_CHECKPOINT)?;
    let (start_diary, start_exp, start_cp) = (next_diary, next_exp, next_cp);
    let keep = config.checkpoints_per_run.max(1);

    let mut results = Vec::with_capacity(batch.len());
    for req in batch {
        let mut acks = Vec::with_capacity(req.ops.len());
        for op in &req.ops {
            let mut seq = None;
            match op {
                Op::PutRun { run_id, bytes } => {
                    runs.insert(run_id.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table runs"))?;
                }
                Op::PutCheckpoint { run_id, bytes } => {
                    cps.insert((run_id.as_str(), next_cp), bytes.as_slice())
                        .map_err(fail("cannot write to the table checkpoints"))?;
                    next_cp += 1;
                    prune_checkpoints(&mut cps, run_id, keep)?;
                }
                Op::FinishRun { run_id, bytes } => {
                    runs.insert(run_id.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table runs"))?;
                    prune_checkpoints(&mut cps, run_id, 1)?;
                }
                Op::AppendDiary { bytes } => {
                    diary
                        .insert(next_diary, bytes.as_slice())
                        .map_err(fail("cannot write to the table diary"))?;
                    seq = Some(next_diary);
                    next_diary += 1;
                }
                Op::AppendExperience { bytes } => {
                    exp.insert(next_exp, bytes.as_slice())
                        .map_err(fail("cannot write to the table experience"))?;
                    seq = Some(next_exp);
                    next_exp += 1;
                }
                Op::PutIdempotent { key, bytes } => {
                    idem.insert(key.as_str(), bytes.as_slice())
                        .map_err(fail("cannot write to the table idempotency"))?;
                }
                Op::Put { table, key, bytes } => {
                    let name = table.redb_name();
                    let def: TableDefinition<&str, &[u8]> = TableDefinition::new(&name);
                    let mut t = txn.open_table(def).map_err(|e| StoreError::Write {
                        reason: format!("cannot open the table {name}: {e}"),
                    })?;
                    t.insert(key.as_str(), bytes.as_slice())
                        .map_err(|e| StoreError::Write {
                            reason: format!("cannot write the key {key} to the table {name}: {e}"),
                        })?;
                }
                Op::Delete { table, key } => {
                    let name = table.redb_name();
                    let def: TableDefinition<&str, &[u8]> = TableDefinition::new(&name);
                    let mut t = txn.open_table(def).map_err(|e| StoreError::Write {
                        reason: format!("cannot open the table {name}: {e}"),
                    })?;
                    t.remove(key.as_str()).map_err(|e| StoreError::Write {
                        reason: format!("cannot delete the key {key} from the table {name}: {e}"),
                    })?;
                }
            }
            acks.push(seq);
        }
        results.push(acks);
    }
    // Only the counters that moved are written: an unchanged one would dirty pages for nothing.
    for (key, start, end) in [
        (NEXT_DIARY, start_diary, next_diary),
        (NEXT_EXPERIENCE, start_exp, next_exp),
        (NEXT_CHECKPOINT, start_cp, next_cp),
    ] {
        if end != start {
            meta.insert(key, end)
                .map_err(fail("cannot write to the table meta"))?;
        }
    }
    Ok(results)
}

/// Keeps only the newest `keep` checkpoints of `run_id`.
fn prune_checkpoints(
    cps: &mut redb::Table<(&str, u64), &[u8]>,
    run_id: &str,
    keep: usize,
) -> Result<(), StoreError> {
    let mut seqs = Vec::new();
    for entry in cps
        .range((run_id, 0u64)..=(run_id, u64::MAX))
        .map_err(fail("cannot scan the table checkpoints"))?
    {
        let (k, _) = entry.map_err(fail("cannot scan the table checkpoints"))?;
        seqs.push(k.value().1);
    }
    if seqs.len() > keep {
        for seq in &seqs[..seqs.len() - keep] {
            cps.remove((run_id, *seq))
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
        }
    }

    fn request(op: Op) -> (Request, oneshot::Receiver<Ack>) {
        let (ack, rx) = oneshot::channel();
        (Request { ops: vec![op], ack }, rx)
    }

    #[test]
    fn a_failed_commit_fails_every_request_of_its_batch_and_writes_nothing() {
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
        ] {
            let (req, ack) = request(op);
            tx.send(req).unwrap();
            acks.push(ack);
        }
        // Then a batch of its own that succeeds.
        let (req, last) = request(Op::AppendDiary { bytes: vec![3] });
        let counters = Arc::new(Counters::default());
        let writer = {
            let (db, counters) = (db.clone(), counters.clone());
            let cfg = WriterConfig {
                max_batch: 3,
                ..config()
            };
            std::thread::spawn(move || run(db, rx, cfg, counters))
        };
        tx.send(req).unwrap();
        drop(tx);
        writer.join().unwrap();

        for ack in acks {
            let err = ack.blocking_recv().unwrap().unwrap_err();
            assert!(
                matches!(&err, StoreError::Write { reason } if reason.contains("kv.typed")),
                "{err:?}"
            );
        }
        assert_eq!(last.blocking_recv().unwrap(), Ok(vec![Some(1)]));
        assert_eq!(counters.failed_transactions.load(Ordering::Relaxed), 1);
        assert_eq!(counters.transactions.load(Ordering::Relaxed), 1);
        let read = db.begin_read().unwrap();
        let diary = read.open_table(DIARY).unwrap();
        let keys: Vec<u64> = diary
            .iter()
            .unwrap()
            .map(|e| e.unwrap().0.value())
            .collect();
        assert_eq!(keys, vec![1], "nothing of the failed batch was written");
    }
}
