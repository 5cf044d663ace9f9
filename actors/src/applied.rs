//! Which experiences of the log an event-sourced actor has applied: everything up to a
//! watermark, plus the applied ones above it (experiences finish out of order).

use std::collections::BTreeSet;

use hindsight::store::{KvTable, Store};
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
