//! Which experiences of the log an event-sourced actor has applied: everything up to a
//! watermark, plus the applied ones above it (experiences finish out of order); and how such an
//! actor reads its snapshot and writes behind itself.

use std::collections::BTreeSet;

use hindsight::store::{KvTable, Store, WriteOp};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An event-sourced actor's snapshot from `table` under `key`, if there is one and it can be
/// read. One that cannot (a corrupt record, a read error) is logged and treated as absent: the
/// actor rebuilds its state from the experience log instead of failing to start.
pub fn read_snapshot<T: DeserializeOwned>(store: &Store, table: KvTable, key: &str) -> Option<T> {
    match store.get(table, key) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(
                error = %e,
                table = table.name(),
                "the actor's snapshot cannot be read; rebuilding its state from the experience log"
            );
            None
        }
    }
}

/// Queues `ops` to the store's group-commit writer without waiting (they commit in the order
/// queued, so after anything queued before); a failure is logged as `what` was not written.
pub fn write_behind(store: &Store, ops: Vec<WriteOp>, what: &'static str) {
    let written = store.queue_batch(ops);
    tokio::spawn(async move {
        if let Err(e) = written.await {
            tracing::warn!(error = %e, "{what} was not written");
        }
    });
}

/// Applied experience sequence numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// Every experience with `seq <= watermark` is applied.
    pub watermark: u64,
    /// Applied experiences above the watermark.
    pub above: BTreeSet<u64>,
}

impl Applied {
    /// Whether `seq` is still to be applied.
    pub fn is_new(&self, seq: u64) -> bool {
        seq > self.watermark && !self.above.contains(&seq)
    }

    /// Marks `seq` applied.
    pub fn mark(&mut self, seq: u64) {
        self.above.insert(seq);
        while self.above.remove(&(self.watermark + 1)) {
            self.watermark += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_marks_advance_the_watermark() {
        let mut a = Applied::default();
        a.mark(2);
        assert!(a.is_new(1) && !a.is_new(2));
        a.mark(1);
        assert_eq!(a.watermark, 2);
        assert!(a.above.is_empty());
    }
}
