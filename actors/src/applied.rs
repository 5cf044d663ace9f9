//! Which experiences of the log an event-sourced actor has applied: everything up to a
//! watermark, plus the applied ones above it (experiences finish out of order).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

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
