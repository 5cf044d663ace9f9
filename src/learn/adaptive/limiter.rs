//! A sliding-window rate limiter keyed by authenticated principal, serialisable so its state
//! persists across restarts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Allows at most `limit` events per principal in any window of `window_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateLimiter {
    /// Events allowed per window.
    pub limit: u32,
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// The times of the events still inside the window, per principal.
    pub hits: BTreeMap<String, Vec<u64>>,
}

impl RateLimiter {
    /// An empty limiter.
    pub fn new(limit: u32, window_ms: u64) -> RateLimiter {
        RateLimiter {
            limit,
            window_ms,
            hits: BTreeMap::new(),
        }
    }

    /// Records an event for `principal` at `now_ms` if allowed; otherwise returns how long to
    /// wait (ms) before the next one is.
    /// Principals whose events have all left the window are dropped on the way, so the
    /// persisted state holds the principals active in the last window, not every one ever seen.
    pub fn check_and_record(&mut self, principal: &str, now_ms: u64) -> Result<(), u64> {
        self.prune(now_ms);
        let window = self.window_ms;
        let hits = self.hits.entry(principal.to_string()).or_default();
        hits.retain(|t| now_ms < t.saturating_add(window));
        if hits.len() >= self.limit as usize {
            let oldest = hits.iter().copied().min().unwrap_or(now_ms);
            return Err(oldest.saturating_add(window).saturating_sub(now_ms).max(1));
        }
        hits.push(now_ms);
        Ok(())
    }

    /// Drops principals whose events have all left the window.
    pub fn prune(&mut self, now_ms: u64) {
        let window = self.window_ms;
        self.hits.retain(|_, hits| {
            hits.retain(|t| now_ms < t.saturating_add(window));
            !hits.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_holds_per_principal_and_idle_principals_are_forgotten() {
        let mut l = RateLimiter::new(2, 1_000);
        assert_eq!(l.check_and_record("alice", 0), Ok(()));
        assert_eq!(l.check_and_record("alice", 100), Ok(()));
        assert_eq!(l.check_and_record("alice", 200), Err(800));
        assert_eq!(l.check_and_record("bob", 300), Ok(()));
        assert_eq!(l.hits.len(), 2);
        // Past alice's window: her entry goes when anyone acts, and she may act again.
        assert_eq!(l.check_and_record("bob", 1_150), Ok(()));
        assert_eq!(l.hits.keys().collect::<Vec<_>>(), vec!["bob"]);
        assert_eq!(l.check_and_record("alice", 1_200), Ok(()));
    }
}
