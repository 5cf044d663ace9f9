//! Which experiences of the log an event-sourced actor has applied: everything up to a
//! watermark, plus the applied ones above it (experiences finish out of order); and how such an
//! actor reads its snapshot and writes behind itself.

use std::collections::BTreeSet;

use hindsight::store::{Commit, KvTable, Store, WriteOp};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Experiences between two snapshots an event-sourced learner (memory, the policy, the
/// reflector) writes unasked: a snapshot only bounds the log a restart replays, and each one is
/// a large commit that the runs' own writes queue behind, so it is written seldom.
pub const SNAPSHOT_EVERY: u64 = 500;

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

/// Waits until the writes queued before now are committed: an actor that writes behind itself
/// calls it at the top of its start, so that a restarted one reads its records after all that
/// its predecessor queued before dying (not between two of its reads, which would give it a
/// snapshot of one moment and rows or counters of another). A store that cannot be waited on is
/// logged; the reads that follow say what they can.
pub async fn after_queued_writes(store: &Store, actor: &'static str) {
    if let Err(e) = store.settled().await {
        tracing::warn!(error = %e, actor, "the writes queued before this start could not be waited for");
    }
}

/// Queues `ops` to the store's group-commit writer as a write behind, without waiting (they
/// commit in the order queued, so after anything queued before, and reach the disk with the
/// next synced write: a run's write never waits behind their sync; see
/// [`Commit::Behind`]); a failure is logged as `what` was not written.
pub fn write_behind(store: &Store, ops: Vec<WriteOp>, what: &'static str) {
    let written = store.queue_batch(ops, Commit::Behind);
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
