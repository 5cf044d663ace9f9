//! compact: the store's statistics, compaction (checkpoint retention, the TTL of finished runs
//! and their records) and the open-runs index.

use std::collections::HashSet;

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use serde::de::DeserializeOwned;

use super::error::read_err;
use super::read::{decode, decode_idempotent};
use super::stored::StoredExperience;
use super::tables::{
    CHECKPOINTS, DIARY, EXPERIENCE, IDEMPOTENCY, META, OPEN_RUNS, OPEN_RUNS_INDEXED, RUNS,
};
use super::{
    CompactReport, Durability, NewDiaryEntry, RunKey, RunRecords, Store, StoreError, StoreStats,
    TableStats, envelope, idempotency,
};
use crate::record::Run;

impl Store {
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
                let (removed, damaged) =
                    remove_older(&txn, DIARY, cutoff, |e: &NewDiaryEntry| e.time_ms)
                        .map_err(|e| fail(&e))?;
                report.diary_removed = removed;
                report.damaged_kept += damaged;
            }
            if let Some(ttl) = self.inner.options.experience_ttl_ms {
                let cutoff = now_ms.saturating_sub(ttl);
                let (removed, damaged) =
                    remove_older(&txn, EXPERIENCE, cutoff, StoredExperience::time_ms)
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
}

/// Removes from `table` the records whose time (`time_of`) is before `cutoff`; a record that
/// cannot be decoded is kept (its age cannot be read). Returns `(removed, damaged kept)`.
fn remove_older<T: DeserializeOwned>(
    txn: &redb::WriteTransaction,
    table: TableDefinition<u64, &[u8]>,
    cutoff: u64,
    time_of: impl Fn(&T) -> u64,
) -> Result<(u64, u64), redb::Error> {
    let mut t = txn.open_table(table)?;
    let (mut removed, mut damaged) = (0, 0);
    t.retain(|_, v| match envelope::decode::<T>(v) {
        Ok(e) if time_of(&e) < cutoff => {
            removed += 1;
            false
        }
        Ok(_) => true,
        Err(_) => {
            damaged += 1;
            true
        }
    })?;
    Ok((removed, damaged))
}

/// Builds the open-runs index once, for a store written before it existed: every run record
/// that is not terminal (or cannot be read, so may not be) goes in. Later writes keep it.
pub(super) fn index_open_runs(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
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
        doomed.extend(idempotency::calls_of(&idem, runs, run_id)?);
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
