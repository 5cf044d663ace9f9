//! error: what can go wrong in the store, each error naming the table, key or file at fault.

use std::path::PathBuf;

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

/// The error of a damaged record: its table, key and what is wrong with it.
pub(super) fn corrupt(table: &str, key: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        table: table.to_string(),
        key: key.to_string(),
        reason,
    }
}

/// The error of a read that failed on `table`.
pub(super) fn read_err<E: std::fmt::Display>(table: &str) -> impl Fn(E) -> StoreError + '_ {
    move |e| StoreError::Read {
        table: table.to_string(),
        reason: e.to_string(),
    }
}
