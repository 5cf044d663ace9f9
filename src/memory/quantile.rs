//! A streaming quantile estimate (the P² algorithm of Jain and Chlamtac, 1985): five markers,
//! constant memory, serialisable, used for the p95 latency of graph edges.

use serde::{Deserialize, Serialize};

/// Streaming estimate of one quantile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct P2Quantile {
    /// The quantile in (0, 1).
    p: f64,
    /// Observations so far.
    count: u64,
    /// Marker heights.
    q: [f64; 5],
    /// Marker positions (1-based).
    n: [f64; 5],
    /// Desired marker positions.
    np: [f64; 5],
    /// Increments of the desired positions.
    dn: [f64; 5],
    /// The first five observations, until the markers are initialised.
    initial: Vec<f64>,
}

impl P2Quantile {
    /// An estimator of quantile `p` (clamped into [0.001, 0.999]).
    pub fn new(p: f64) -> P2Quantile {
        let p = if p.is_finite() {
            p.clamp(0.001, 0.999)
        } else {
            0.5
        };
        P2Quantile {
            p,
            count: 0,
            q: [0.0; 5],
            n: [1.0, 2.0, 3.0, 4.0, 5.0],
            np: [1.0, 1.0 + 2.0 * p, 1.0 + 4.0 * p, 3.0 + 2.0 * p, 5.0],
            dn: [0.0, p / 2.0, p, (1.0 + p) / 2.0, 1.0],
            initial: Vec::with_capacity(5),
        }
    }

    /// The p95 estimator.
    pub fn p95() -> P2Quantile {
        P2Quantile::new(0.95)
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds an observation (non-finite values are ignored).
    pub fn observe(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.count += 1;
        if self.count <= 5 {
            self.initial.push(x);
            if self.count == 5 {
                self.initial.sort_by(f64::total_cmp);
                self.q.copy_from_slice(&self.initial);
                self.initial.clear();
            }
            return;
        }
        let k = if x < self.q[0] {
            self.q[0] = x;
            0
        } else if x >= self.q[4] {
            self.q[4] = x;
            3
        } else {
            (0..4)
                .find(|&i| self.q[i] <= x && x < self.q[i + 1])
                .unwrap_or(3)
        };
        for i in (k + 1)..5 {
            self.n[i] += 1.0;
        }
        for i in 0..5 {
            self.np[i] += self.dn[i];
        }
        for i in 1..4 {
            let d = self.np[i] - self.n[i];
            if (d >= 1.0 && self.n[i + 1] - self.n[i] > 1.0)
                || (d <= -1.0 && self.n[i - 1] - self.n[i] < -1.0)
            {
                let s = d.signum();
                let candidate = self.parabolic(i, s);
                self.q[i] = if self.q[i - 1] < candidate && candidate < self.q[i + 1] {
                    candidate
                } else {
                    self.linear(i, s)
                };
                self.n[i] += s;
            }
        }
    }

    fn parabolic(&self, i: usize, d: f64) -> f64 {
        let (q, n) = (&self.q, &self.n);
        q[i] + d / (n[i + 1] - n[i - 1])
            * ((n[i] - n[i - 1] + d) * (q[i + 1] - q[i]) / (n[i + 1] - n[i])
                + (n[i + 1] - n[i] - d) * (q[i] - q[i - 1]) / (n[i] - n[i - 1]))
    }

    fn linear(&self, i: usize, d: f64) -> f64 {
        let j = if d > 0.0 { i + 1 } else { i - 1 };
        self.q[i] + d * (self.q[j] - self.q[i]) / (self.n[j] - self.n[i])
    }

    /// The current estimate (`None` before any observation; exact nearest-rank below five).
    pub fn estimate(&self) -> Option<f64> {
        match self.count {
            0 => None,
            1..=4 => {
                let mut v = self.initial.clone();
                v.sort_by(f64::total_cmp);
                let rank = (self.p * v.len() as f64).ceil().max(1.0) as usize;
                v.get(rank.min(v.len()) - 1).copied()
            }
            _ => Some(self.q[2]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_of_a_shuffled_uniform_stream() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut values: Vec<f64> = (0..10_000).map(f64::from).collect();
        rng.shuffle(&mut values);
        let mut q = P2Quantile::p95();
        for v in values {
            q.observe(v);
        }
        let est = q.estimate().unwrap();
        assert!((est - 9_500.0).abs() < 150.0, "{est}");
    }

    #[test]
    fn small_samples_are_exact() {
        let mut q = P2Quantile::p95();
        assert_eq!(q.estimate(), None);
        for v in [5.0, 1.0, 3.0] {
            q.observe(v);
        }
        assert_eq!(q.estimate(), Some(5.0));
        q.observe(f64::NAN);
        assert_eq!(q.count(), 3);
    }
}
