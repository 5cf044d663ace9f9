//! drift: the Page-Hinkley change detector that tells the policy when an arm's success rate in a
//! cluster has moved, so that old evidence is forgotten.

use serde::{Deserialize, Serialize};

/// Two-sided Page-Hinkley test on a stream of values in [0, 1].
///
/// It tracks the running mean since its last reset and the cumulative deviations from it; it
/// fires when the deviation in either direction exceeds `lambda` (with tolerance `delta` per
/// observation), and only after `min_obs` observations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PageHinkley {
    /// Observations since the last reset.
    pub n: u32,
    /// Running mean since the last reset.
    pub mean: f64,
    /// Cumulative sum for a decrease.
    pub down: f64,
    /// Its minimum so far.
    pub down_min: f64,
    /// Cumulative sum for an increase.
    pub up: f64,
    /// Its minimum so far.
    pub up_min: f64,
}

impl PageHinkley {
    /// Feeds one value; returns `true` when a change is detected (the detector then resets).
    pub fn observe(&mut self, x: f64, delta: f64, lambda: f64, min_obs: u32) -> bool {
        self.n += 1;
        self.mean += (x - self.mean) / f64::from(self.n);
        self.down += self.mean - x - delta;
        self.down_min = self.down_min.min(self.down);
        self.up += x - self.mean - delta;
        self.up_min = self.up_min.min(self.up);
        let fired = self.n >= min_obs
            && (self.down - self.down_min > lambda || self.up - self.up_min > lambda);
        if fired {
            *self = PageHinkley::default();
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_on_a_drop_and_not_on_a_stationary_stream() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut ph = PageHinkley::default();
        let mut false_alarms = 0;
        for _ in 0..300 {
            let x = if rng.f64() < 0.95 { 1.0 } else { 0.0 };
            if ph.observe(x, 0.05, 5.0, 10) {
                false_alarms += 1;
            }
        }
        assert_eq!(false_alarms, 0);
        let mut fired_after = None;
        for i in 0..50 {
            let x = if rng.f64() < 0.15 { 1.0 } else { 0.0 };
            if ph.observe(x, 0.05, 5.0, 10) {
                fired_after = Some(i);
                break;
            }
        }
        let after = fired_after.expect("the drop is detected");
        assert!(after < 12, "detected after {after}");
        assert_eq!(ph.n, 0, "reset after firing");
    }
}
