//! The runner's clock: real (tokio time, so tests can pause it) or virtual (nothing is slept; the
//! time a call or a backoff would take is only added up and reported).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

/// The future of [`Clock::sleep`].
pub type SleepFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Time as the runner sees it.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the clock started.
    fn now_ms(&self) -> u64;
    /// Waits `ms` (a virtual clock only moves its time on).
    fn sleep(&self, ms: u64) -> SleepFuture<'_>;
    /// A call reported `ms` of latency: a virtual clock moves on by it, a real one already did.
    fn elapsed(&self, ms: f64);
    /// Whether waiting is virtual.
    fn is_virtual(&self) -> bool;
}

/// Real time through tokio (honours `tokio::time::pause` in tests).
#[derive(Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock starting now.
    pub fn new() -> TokioClock {
        TokioClock {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn sleep(&self, ms: u64) -> SleepFuture<'_> {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(ms)))
    }

    fn elapsed(&self, _ms: f64) {}

    fn is_virtual(&self) -> bool {
        false
    }
}

/// Virtual time: sleeping returns at once and moves the clock on; reported latencies move it too.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now_us: AtomicU64,
}

impl VirtualClock {
    /// A virtual clock at 0.
    pub fn new() -> VirtualClock {
        VirtualClock::default()
    }

    /// Moves the clock on by `ms`.
    pub fn advance(&self, ms: f64) {
        if ms.is_finite() && ms > 0.0 {
            self.now_us
                .fetch_add((ms * 1000.0) as u64, Ordering::Relaxed);
        }
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.now_us.load(Ordering::Relaxed) / 1000
    }

    fn sleep(&self, ms: u64) -> SleepFuture<'_> {
        self.advance(ms as f64);
        Box::pin(std::future::ready(()))
    }

    fn elapsed(&self, ms: f64) {
        self.advance(ms);
    }

    fn is_virtual(&self) -> bool {
        true
    }
}
