//! The circuit breaker of one tool: closed, open, half-open, on a window of recent outcomes.
//! Only infrastructure failures count against a tool; time comes in as `now_ms`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::policy::BreakerConfig;

/// The observable state of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through; outcomes are counted.
    Closed,
    /// Calls are refused until the open period ends.
    Open,
    /// A few probe calls go through; one success closes, one failure opens again.
    HalfOpen,
}

/// A circuit breaker.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: BreakerState,
    window: VecDeque<bool>,
    open_until_ms: u64,
    probes_in_flight: u32,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> CircuitBreaker {
        CircuitBreaker {
            config,
            state: BreakerState::Closed,
            window: VecDeque::new(),
            open_until_ms: 0,
            probes_in_flight: 0,
        }
    }

    /// The state at `now_ms` (an open breaker whose period ended reads half-open).
    pub fn state(&self, now_ms: u64) -> BreakerState {
        match self.state {
            BreakerState::Open if now_ms >= self.open_until_ms => BreakerState::HalfOpen,
            s => s,
        }
    }

    /// Asks to make a call at `now_ms`: `Ok(())` lets it through (and must be followed by
    /// [`CircuitBreaker::record`]); `Err(ms)` refuses it, `ms` being how long until a probe.
    pub fn acquire(&mut self, now_ms: u64) -> Result<(), u64> {
        if !self.config.enabled {
            return Ok(());
        }
        if self.state == BreakerState::Open {
            if now_ms < self.open_until_ms {
                return Err(self.open_until_ms - now_ms);
            }
            self.state = BreakerState::HalfOpen;
            self.probes_in_flight = 0;
        }
        if self.state == BreakerState::HalfOpen {
            if self.probes_in_flight >= self.config.half_open_probes.max(1) {
                return Err(self.config.open_ms.clamp(1, 1000));
            }
            self.probes_in_flight += 1;
        }
        Ok(())
    }

    /// Records an outcome (`failed` = an infrastructure failure) at `now_ms`.
    pub fn record(&mut self, failed: bool, now_ms: u64) {
        if !self.config.enabled {
            return;
        }
        match self.state {
            BreakerState::HalfOpen => {
                self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
                if failed {
                    self.trip(now_ms);
                } else {
                    self.state = BreakerState::Closed;
                    self.window.clear();
                }
            }
            BreakerState::Open => {}
            BreakerState::Closed => {
                self.window.push_back(failed);
                while self.window.len() > self.config.window.max(1) {
                    self.window.pop_front();
                }
                let n = self.window.len();
                let failures = self.window.iter().filter(|f| **f).count();
                if n >= self.config.min_calls.max(1)
                    && failures as f64 / n as f64 >= self.config.failure_rate
                {
                    self.trip(now_ms);
                }
            }
        }
    }

    /// Releases a half-open probe slot without an outcome (the call was cancelled).
    pub fn release(&mut self) {
        if self.state == BreakerState::HalfOpen {
            self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
        }
    }

    fn trip(&mut self, now_ms: u64) {
        self.state = BreakerState::Open;
        self.open_until_ms = now_ms.saturating_add(self.config.open_ms);
        self.window.clear();
        self.probes_in_flight = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_failure_rate_then_probes() {
        let cfg = BreakerConfig {
            enabled: true,
            window: 4,
            min_calls: 4,
            failure_rate: 0.5,
            open_ms: 1000,
            half_open_probes: 1,
        };
        let mut b = CircuitBreaker::new(cfg);
        for f in [false, true, false] {
            b.acquire(0).unwrap();
            b.record(f, 0);
        }
        assert_eq!(b.state(0), BreakerState::Closed);
        b.acquire(0).unwrap();
        b.record(true, 10);
        assert_eq!(b.state(10), BreakerState::Open);
        assert_eq!(b.acquire(500), Err(510));
        assert_eq!(b.state(1010), BreakerState::HalfOpen);
        b.acquire(1010).unwrap();
        assert!(b.acquire(1010).is_err(), "one probe at a time");
        b.record(true, 1020);
        assert_eq!(b.state(1020), BreakerState::Open);
        b.acquire(2020).unwrap();
        b.record(false, 2020);
        assert_eq!(b.state(2020), BreakerState::Closed);
    }
}
