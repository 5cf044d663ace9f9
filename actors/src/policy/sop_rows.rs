//! The SOP book's rows: each SOP of the policy's book is one row of the `sops` table, keyed by
//! its place in the book, and a snapshot writes again only the rows that changed since the last
//! one, so that its cost follows what changed rather than the size of the book (a book of 1,000
//! SOPs stored inline made every snapshot a 300 KB commit that the runs' own commits queued
//! behind). The table is what the API, the reports and memory read: every SOP version as the
//! planner holds it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hindsight::Sop;
use hindsight::store::{Store, StoreError, WriteOp};

use super::{POLICY, SOPS};

/// The key in [`POLICY`] of how many rows the book has (written with every snapshot).
const COUNT_KEY: &str = "sop_rows";

/// Why the book's rows cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum SopRowsError {
    /// The store could not be read, or a row did not decode.
    #[error("table `sops`: {0}")]
    Store(#[from] StoreError),
    /// A row of the book is not in the table.
    #[error("table `sops` key `{0}`: the book's row is missing")]
    Missing(String),
}

/// The key of the book's `i`th SOP (its place, zero-padded so that keys sort in book order).
fn row_key(i: usize) -> String {
    format!("{i:010}")
}

/// The place in the book a key names, if it is a row key.
fn place(key: &str) -> Option<usize> {
    (key.len() == 10 && key.bytes().all(|b| b.is_ascii_digit()))
        .then(|| key.parse().ok())
        .flatten()
}

/// What the table holds of the book, and what it holds that is not the book's.
#[derive(Debug, Default)]
pub struct SopRows {
    /// Each row as it was last written (or read), by place in the book: a snapshot compares
    /// the book with it, which costs a fraction of encoding every SOP to compare bytes.
    written: Vec<Sop>,
    /// Keys of the table that hold no SOP of the book (an older layout's rows, or those of a
    /// book that was started afresh): deleted with the next snapshot, and again after a
    /// snapshot whose writes failed.
    stale: Vec<String>,
    /// Whether the deletes of `stale` were handed over.
    stale_deleted: bool,
    /// Set when a snapshot's writes failed: the next one writes every row again.
    failed: Arc<AtomicBool>,
}

impl SopRows {
    /// The SOPs of the book whose snapshot held `inline` (empty unless the snapshot is of an
    /// older layout that held them inline), in book order: the rows the count written with
    /// the snapshot names. Inline SOPs are kept and all written with the next snapshot.
    pub fn load(store: &Store, inline: Vec<Sop>) -> Result<(SopRows, Vec<Sop>), SopRowsError> {
        let count: usize = match store.get::<u64>(POLICY, COUNT_KEY)? {
            Some(n) if inline.is_empty() => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        let mut rows: BTreeMap<usize, Sop> = BTreeMap::new();
        let mut stale = Vec::new();
        for (key, sop) in store.scan::<Sop>(SOPS)? {
            match place(&key) {
                Some(i) if i < count => {
                    rows.insert(i, sop?);
                }
                _ => stale.push(key),
            }
        }
        let sops = if inline.is_empty() {
            (0..count)
                .map(|i| {
                    rows.remove(&i)
                        .ok_or_else(|| SopRowsError::Missing(row_key(i)))
                })
                .collect::<Result<Vec<Sop>, SopRowsError>>()?
        } else {
            inline
        };
        let written = if count > 0 { sops.clone() } else { Vec::new() };
        Ok((
            SopRows {
                written,
                stale,
                stale_deleted: false,
                failed: Arc::default(),
            },
            sops,
        ))
    }

    /// The rows of a book started afresh: whatever the table holds is stale.
    pub fn fresh(store: &Store) -> SopRows {
        let stale = match store.scan::<Sop>(SOPS) {
            Ok(rows) => rows.into_iter().map(|(k, _)| k).collect(),
            Err(e) => {
                tracing::error!(error = %e, "table `sops` cannot be read; its rows are written again as the book grows");
                Vec::new()
            }
        };
        SopRows {
            stale,
            ..SopRows::default()
        }
    }

    /// The writes that bring the table to `sops`: the rows new or changed since the last
    /// writes, the stale rows deleted, and the count. They belong in the snapshot's
    /// transaction; [`SopRows::on_failure`] is to be set when it fails.
    pub fn writes(&mut self, sops: &[Sop]) -> Result<Vec<WriteOp>, StoreError> {
        if self.failed.swap(false, Ordering::SeqCst) {
            self.written.clear();
            self.stale_deleted = false;
        }
        let mut ops: Vec<WriteOp> = Vec::new();
        if !self.stale_deleted {
            ops.extend(self.stale.iter().map(|k| WriteOp::delete(SOPS, k)));
            self.stale_deleted = true;
        }
        self.written.truncate(sops.len());
        for (i, sop) in sops.iter().enumerate() {
            if self.written.get(i) != Some(sop) {
                ops.push(WriteOp::put(SOPS, &row_key(i), sop)?);
                match self.written.get_mut(i) {
                    Some(w) => w.clone_from(sop),
                    None => self.written.push(sop.clone()),
                }
            }
        }
        ops.push(WriteOp::put(POLICY, COUNT_KEY, &(sops.len() as u64))?);
        Ok(ops)
    }

    /// The flag to set when the writes did not commit (the next writes then write every row).
    pub fn on_failure(&self) -> Arc<AtomicBool> {
        self.failed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight::store::StoreOptions;
    use hindsight::{ArmChoice, SopStatus};
    use std::collections::BTreeMap;

    fn sop(i: u32) -> Sop {
        Sop {
            sop_id: format!("sop-{i}"),
            version: 1,
            preconditions: BTreeMap::from([("k".to_string(), format!("v{i}"))]),
            plan: vec![ArmChoice {
                stage: "s".into(),
                tool: "t".into(),
                strategy: "x".into(),
                propensity: 1.0,
            }],
            status: SopStatus::Stable,
            successes: 1,
            trials: 1,
            baseline_successes: 0,
            baseline_trials: 1,
            p_value: Some(0.01),
            evidence: Vec::new(),
            created_ms: 1,
            updated_ms: 1,
            procedure: Vec::new(),
        }
    }

    fn open(dir: &std::path::Path) -> Store {
        let options = StoreOptions {
            durability: hindsight::store::Durability::None,
            ..StoreOptions::default()
        };
        match Store::open(dir, options) {
            Ok(s) => s,
            Err(e) => panic!("open: {e}"),
        }
    }

    async fn write(store: &Store, ops: Vec<WriteOp>) {
        if let Err(e) = store.write_batch(ops).await {
            panic!("write: {e}");
        }
    }

    /// The writes `rows` hands over for `sops`, and how many (the count's write is one).
    fn puts(rows: &mut SopRows, sops: &[Sop]) -> (Vec<WriteOp>, usize) {
        let ops = match rows.writes(sops) {
            Ok(ops) => ops,
            Err(e) => panic!("writes: {e}"),
        };
        let n = ops.len();
        (ops, n)
    }

    #[tokio::test]
    async fn only_the_rows_that_changed_are_written_and_the_book_reads_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut book: Vec<Sop> = (0..50).map(sop).collect();
        let mut rows = SopRows::fresh(&store);
        let (ops, n) = puts(&mut rows, &book);
        assert_eq!(n, 51, "every row and the count");
        write(&store, ops).await;
        // One SOP changes and two are added: three rows and the count.
        book[7].evidence.push("run-1".into());
        book.push(sop(50));
        book.push(sop(51));
        let (ops, n) = puts(&mut rows, &book);
        assert_eq!(n, 4);
        write(&store, ops).await;
        let (_, n) = puts(&mut rows, &book);
        assert_eq!(n, 1, "nothing changed: the count alone");
        // Read back: the same book in the same order, and nothing to write.
        let (mut again, read) = SopRows::load(&store, Vec::new()).unwrap();
        assert_eq!(read, book);
        let (_, n) = puts(&mut again, &read);
        assert_eq!(n, 1);
    }

    #[tokio::test]
    async fn a_failed_write_has_every_row_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let book: Vec<Sop> = (0..5).map(sop).collect();
        let mut rows = SopRows::fresh(&store);
        let (_lost, _) = puts(&mut rows, &book);
        rows.on_failure().store(true, Ordering::SeqCst);
        let (ops, n) = puts(&mut rows, &book);
        assert_eq!(n, 6);
        write(&store, ops).await;
        let (_, read) = SopRows::load(&store, Vec::new()).unwrap();
        assert_eq!(read, book);
    }

    #[tokio::test]
    async fn an_inline_book_is_written_as_rows_and_older_rows_are_deleted_even_after_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        // The older layout: rows keyed `sop_id@version`, the book inline in the snapshot.
        let book: Vec<Sop> = (0..3).map(sop).collect();
        let old = book
            .iter()
            .map(|s| WriteOp::put(SOPS, &format!("{}@{}", s.sop_id, s.version), s).unwrap())
            .collect();
        write(&store, old).await;
        let (mut rows, read) = SopRows::load(&store, book.clone()).unwrap();
        assert_eq!(read, book);
        let (_lost, n) = puts(&mut rows, &read);
        assert_eq!(n, 3 + 3 + 1, "three deletes, three rows, the count");
        // Those writes failed: the next ones are the same.
        rows.on_failure().store(true, Ordering::SeqCst);
        let (ops, n) = puts(&mut rows, &read);
        assert_eq!(n, 3 + 3 + 1);
        write(&store, ops).await;
        let (_, n) = puts(&mut rows, &read);
        assert_eq!(n, 1, "the count alone once they are written");
        let keys: Vec<String> = store
            .scan::<Sop>(SOPS)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["0000000000", "0000000001", "0000000002"]);
        let (_, read) = SopRows::load(&store, Vec::new()).unwrap();
        assert_eq!(read, book);
    }

    #[tokio::test]
    async fn a_missing_row_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let book: Vec<Sop> = (0..3).map(sop).collect();
        let mut rows = SopRows::fresh(&store);
        let (ops, _) = puts(&mut rows, &book);
        write(&store, ops).await;
        write(&store, vec![WriteOp::delete(SOPS, "0000000001")]).await;
        match SopRows::load(&store, Vec::new()) {
            Err(SopRowsError::Missing(k)) => assert_eq!(k, "0000000001"),
            other => panic!("expected the missing row, got {other:?}"),
        }
    }
}
