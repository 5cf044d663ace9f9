//! The clock the recovery loop sleeps through: real (tokio) or virtual (instant sleeps).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A boxed future that sleeps.
pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Time as the recovery loop sees it; injectable so tests and benches use virtual delays.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch (or a virtual origin).
    fn now_ms(&self) -> u64;
    /// Waits `ms` milliseconds.
    fn sleep(&self, ms: u64) -> SleepFuture;
}

/// Real time through tokio (so tests under `tokio::time::pause` stay virtual).
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin_ms: u64,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin_ms` now and advancing with tokio's time.
    pub fn new(origin_ms: u64) -> TokioClock {
        TokioClock {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.origin_ms + self.origin.elapsed().as_millis() as u64
    }

    fn sleep(&self, ms: u64) -> SleepFuture {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(ms)))
    }
}

/// Virtual time: `sleep` returns at once and moves the clock forward; every sleep is recorded.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
    slept: Mutex<Vec<u64>>,
}

impl VirtualClock {
    /// A virtual clock starting at `start_ms`.
    pub fn new(start_ms: u64) -> VirtualClock {
        VirtualClock {
            now: AtomicU64::new(start_ms),
            slept: Mutex::new(Vec::new()),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Every sleep requested so far, in order.
    pub fn sleeps(&self) -> Vec<u64> {
        self.slept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, ms: u64) -> SleepFuture {
        self.now.fetch_add(ms, Ordering::SeqCst);
        self.slept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ms);
        Box::pin(std::future::ready(()))
    }
}
