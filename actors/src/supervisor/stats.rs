//! Observable restart counts (per child and total), shareable across a whole tree.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Restart counters. Share one `Arc<RestartStats>` between nested supervisors (through
/// [`super::SupervisorOptions::stats`]) to count a whole tree; per-child keys are
/// `"<supervisor label>/<child id>"`.
#[derive(Debug, Default)]
pub struct RestartStats {
    total: AtomicU64,
    escalations: AtomicU64,
    per_child: Mutex<BTreeMap<String, u64>>,
}

impl RestartStats {
    /// Fresh counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one restart of `child` under `supervisor`.
    pub fn record_restart(&self, supervisor: &str, child: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self.per_child.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(format!("{supervisor}/{child}")).or_insert(0) += 1;
    }

    /// Counts one escalation (a supervisor exceeding its intensity).
    pub fn record_escalation(&self) {
        self.escalations.fetch_add(1, Ordering::Relaxed);
    }

    /// Total restarts of children (each child restarted counts once).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Escalations counted.
    pub fn escalations(&self) -> u64 {
        self.escalations.load(Ordering::Relaxed)
    }

    /// Restarts of one child (`"<supervisor label>/<child id>"`).
    pub fn child(&self, key: &str) -> u64 {
        let map = self.per_child.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).copied().unwrap_or(0)
    }

    /// A copy of all per-child counts.
    pub fn per_child(&self) -> BTreeMap<String, u64> {
        self.per_child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
