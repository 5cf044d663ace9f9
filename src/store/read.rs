//! read: the store's reads, each on its own redb read transaction (concurrent with each other
//! and with the writer), and the decoding of its records, a damaged one reported in its place.

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use serde::de::DeserializeOwned;

use super::error::{corrupt, read_err};
use super::json::JsonTree;
use super::stored::{StoredCheckpoint, StoredExperience};
use super::tables::{
    CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, KV_PREFIX, OPEN_RUNS, RUNS, checkpoint_key,
};
use super::{Entries, KvTable, NewDiaryEntry, Store, StoreError, envelope};
use crate::record::{Checkpoint, DiaryEntry, ExperienceTuple, Run};

/// A record's value from its envelope; one that cannot be decoded is
/// [`StoreError::Corrupt`], naming its table and key.
pub(super) fn decode<T: DeserializeOwned>(
    table: &str,
    key: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    envelope::decode(bytes).map_err(|e| corrupt(table, key, e.to_string()))
}

/// An idempotency record's JSON value.
pub(super) fn decode_idempotent(key: &str, bytes: &[u8]) -> Result<serde_json::Value, StoreError> {
    let tree: JsonTree = decode("idempotency", key, bytes)?;
    tree.into_value()
        .map_err(|r| corrupt("idempotency", key, r))
}

pub(super) fn decode_checkpoint(
    run_id: &str,
    seq: u64,
    bytes: &[u8],
) -> Result<Checkpoint, StoreError> {
    let key = checkpoint_key(run_id, seq);
    let stored: StoredCheckpoint = decode("checkpoints", &key, bytes)?;
    stored
        .into_checkpoint()
        .map_err(|r| corrupt("checkpoints", &key, r))
}

pub(super) fn decode_diary(seq: u64, bytes: &[u8]) -> Result<DiaryEntry, StoreError> {
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

pub(super) fn decode_experience(seq: u64, bytes: &[u8]) -> Result<ExperienceTuple, StoreError> {
    let key = seq.to_string();
    let stored: StoredExperience = decode("experience", &key, bytes)?;
    stored
        .into_experience()
        .map_err(|r| corrupt("experience", &key, r))
}

impl Store {
    pub(super) fn read_txn(&self) -> Result<redb::ReadTransaction, StoreError> {
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
        self.rows_after(DIARY, seq, decode_diary)
    }

    /// The whole experience log, oldest first, each with its sequence number.
    pub fn experience_all(&self) -> Result<Entries<u64, ExperienceTuple>, StoreError> {
        self.experience_since(0)
    }

    /// Experience tuples with a sequence number greater than `seq`, oldest first.
    pub fn experience_since(&self, seq: u64) -> Result<Entries<u64, ExperienceTuple>, StoreError> {
        self.rows_after(EXPERIENCE, seq, |seq, bytes| {
            (seq, decode_experience(seq, bytes))
        })
    }

    /// The rows of a sequence-numbered table after `seq`, oldest first, each as `row` makes it
    /// of its sequence number and bytes (read errors name the table).
    fn rows_after<T>(
        &self,
        table: TableDefinition<u64, &[u8]>,
        seq: u64,
        row: impl Fn(u64, &[u8]) -> T,
    ) -> Result<Vec<T>, StoreError> {
        let name = table.name();
        let txn = self.read_txn()?;
        let t = txn.open_table(table).map_err(read_err(name))?;
        let mut out = Vec::new();
        for entry in t.range(seq.saturating_add(1)..).map_err(read_err(name))? {
            let (k, v) = entry.map_err(read_err(name))?;
            out.push(row(k.value(), v.value()));
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
        self.get_many(table, [key])?.pop().flatten().transpose()
    }

    /// A record of a generic table written by [`WriteOp::put_json`], read back through its
    /// JSON form.
    pub fn get_json<T: DeserializeOwned>(
        &self,
        table: KvTable,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let Some(tree) = self.get::<JsonTree>(table, key)? else {
            return Ok(None);
        };
        let damaged = |reason: String| corrupt(&table.redb_name(), key, reason);
        let value = tree.into_value().map_err(damaged)?;
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| damaged(e.to_string()))
    }

    /// The records of `keys` in a generic table, read in one transaction, in the order of
    /// `keys`: `None` where there is none, an `Err` in the place of a damaged one.
    pub fn get_many<'k, T: DeserializeOwned>(
        &self,
        table: KvTable,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<Vec<Option<Result<T, StoreError>>>, StoreError> {
        let name = table.redb_name();
        let txn = self.read_txn()?;
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(&name);
        let t = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => {
                return Ok(keys.into_iter().map(|_| None).collect());
            }
            Err(e) => return Err(read_err(&name)(e)),
        };
        keys.into_iter()
            .map(|key| {
                Ok(t.get(key)
                    .map_err(read_err(&name))?
                    .map(|g| decode(&name, key, g.value())))
            })
            .collect()
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
