//! The disk's own ceiling, for benchmarks: durable redb transactions written directly (no
//! writer thread, no envelope, no channel), so that a group-commit figure can be read against
//! what redb itself does on the same disk in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};

use super::StoreError;
use super::writer::fail;

const ROWS: TableDefinition<u64, &[u8]> = TableDefinition::new("baseline_rows");

/// What a baseline measurement measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RawRate {
    /// Rows inserted per transaction.
    pub rows_per_transaction: usize,
    /// Durable transactions committed.
    pub transactions: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Rows per second.
    pub rows_per_s: f64,
}

/// A redb file written directly, one thread, for baseline measurements; it stays open across
/// measurements so that rounds interleaved with other configurations continue one database.
pub struct RawBaseline {
    db: Database,
    next_key: u64,
}

impl RawBaseline {
    /// Creates a fresh redb file at `path`.
    pub fn create(path: &Path) -> Result<RawBaseline, StoreError> {
        Ok(RawBaseline {
            db: Database::create(path).map_err(fail("baseline: create"))?,
            next_key: 0,
        })
    }

    /// Commits durable transactions of `rows_per_transaction` rows of `value_bytes` bytes each
    /// for `duration` and reports the rate.
    pub fn measure(
        &mut self,
        rows_per_transaction: usize,
        value_bytes: usize,
        duration: Duration,
    ) -> Result<RawRate, StoreError> {
        let value = vec![b'x'; value_bytes];
        let rows_per_transaction = rows_per_transaction.max(1);
        let start = Instant::now();
        let (first_key, mut transactions) = (self.next_key, 0u64);
        while start.elapsed() < duration {
            let mut txn = self.db.begin_write().map_err(fail("baseline: begin"))?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(fail("baseline: durability"))?;
            {
                let mut table = txn.open_table(ROWS).map_err(fail("baseline: open table"))?;
                for _ in 0..rows_per_transaction {
                    table
                        .insert(self.next_key, value.as_slice())
                        .map_err(fail("baseline: insert"))?;
                    self.next_key += 1;
                }
            }
            txn.commit().map_err(fail("baseline: commit"))?;
            transactions += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok(RawRate {
            rows_per_transaction,
            transactions,
            seconds,
            rows_per_s: (self.next_key - first_key) as f64 / seconds.max(1e-9),
        })
    }
}
