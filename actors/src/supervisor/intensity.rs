//! The restart-intensity window: at most `max_restarts` restarts within `period`.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// A sliding window of restart instants (tokio time, so tests can pause the clock).
#[derive(Debug, Clone)]
pub struct RestartWindow {
    max_restarts: u32,
    period: Duration,
    restarts: VecDeque<Instant>,
}

impl RestartWindow {
    /// A window allowing `max_restarts` restarts within `period`.
    pub fn new(max_restarts: u32, period: Duration) -> Self {
        RestartWindow {
            max_restarts,
            period,
            restarts: VecDeque::new(),
        }
    }

    /// Records a restart at `now`; returns `false` when this restart exceeds the intensity
    /// (more than `max_restarts` within the last `period`, inclusive of `now`).
    pub fn record(&mut self, now: Instant) -> bool {
        while let Some(first) = self.restarts.front() {
            if now.saturating_duration_since(*first) >= self.period {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
        self.restarts.push_back(now);
        self.restarts.len() <= self.max_restarts as usize
    }

    /// Restarts currently inside the window.
    pub fn len(&self) -> usize {
        self.restarts.len()
    }

    /// Whether no restart is inside the window.
    pub fn is_empty(&self) -> bool {
        self.restarts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_max_then_refuses_and_slides() {
        let t0 = Instant::now();
        let mut w = RestartWindow::new(2, Duration::from_secs(5));
        assert!(w.record(t0));
        assert!(w.record(t0 + Duration::from_secs(1)));
        assert!(!w.record(t0 + Duration::from_secs(2)));
        // A restart at least one period old has left the window.
        let mut w = RestartWindow::new(2, Duration::from_secs(5));
        assert!(w.record(t0));
        assert!(w.record(t0 + Duration::from_secs(2)));
        assert!(w.record(t0 + Duration::from_secs(5)));
        assert_eq!(w.len(), 2);
        assert!(!w.record(t0 + Duration::from_secs(6)));
    }

    #[test]
    fn zero_intensity_refuses_first_restart() {
        let mut w = RestartWindow::new(0, Duration::from_secs(1));
        assert!(!w.record(Instant::now()));
    }
}
