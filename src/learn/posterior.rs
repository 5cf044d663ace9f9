//! posterior: the per-arm evidence of one cluster node (discounted Beta counts of "stage
//! succeeded and was valid", running latency and cost estimates, a change detector) and the
//! random variates (normal, gamma, beta) that Thompson sampling draws from a seeded RNG.

use serde::{Deserialize, Serialize};

use crate::learn::drift::BernoulliGlr;

/// Layers of the ziggurat behind [`sample_normal`].
const ZIGGURAT_LAYERS: usize = 256;
/// Where the ziggurat's tail starts (Marsaglia and Tsang, "The Ziggurat Method for Generating
/// Random Variables", 2000: 256 layers).
const ZIGGURAT_R: f64 = 3.654_152_885_361_009;
/// The area of each layer (and of the base with the tail) under exp(-x^2 / 2).
const ZIGGURAT_V: f64 = 4.928_673_233_992_336e-3;

/// The ziggurat's layer edges `x` (from the base's width down to 0) and the density at each.
struct Ziggurat {
    x: [f64; ZIGGURAT_LAYERS + 1],
    f: [f64; ZIGGURAT_LAYERS + 1],
}

/// exp(-x^2 / 2): the standard normal density without its constant.
fn normal_shape(x: f64) -> f64 {
    (-0.5 * x * x).exp()
}

static ZIGGURAT: std::sync::LazyLock<Ziggurat> = std::sync::LazyLock::new(|| {
    let mut x = [0.0; ZIGGURAT_LAYERS + 1];
    x[0] = ZIGGURAT_V / normal_shape(ZIGGURAT_R);
    x[1] = ZIGGURAT_R;
    for i in 1..ZIGGURAT_LAYERS - 1 {
        x[i + 1] = (-2.0 * (ZIGGURAT_V / x[i] + normal_shape(x[i])).ln()).sqrt();
    }
    Ziggurat {
        x,
        f: x.map(normal_shape),
    }
});

/// A standard normal variate (the ziggurat method: one 64-bit draw and a comparison nearly
/// every time; the layers' edges and the tail beyond [`ZIGGURAT_R`] are drawn exactly).
pub fn sample_normal(rng: &mut fastrand::Rng) -> f64 {
    let z = &*ZIGGURAT;
    loop {
        let bits = rng.u64(..);
        // The layer from the low 8 bits, a uniform in (-1, 1) from the high 53.
        let i = (bits & 0xff) as usize;
        let u = 2.0 * ((bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)) - 1.0;
        let x = u * z.x[i];
        if x.abs() < z.x[i + 1] {
            return x;
        }
        if i == 0 {
            // The tail beyond r (Marsaglia 1964).
            loop {
                let a = (1.0 - rng.f64()).ln() / ZIGGURAT_R;
                let b = (1.0 - rng.f64()).ln();
                if -2.0 * b >= a * a {
                    return if u < 0.0 {
                        a - ZIGGURAT_R
                    } else {
                        ZIGGURAT_R - a
                    };
                }
            }
        }
        if z.f[i + 1] + (z.f[i] - z.f[i + 1]) * rng.f64() < normal_shape(x) {
            return x;
        }
    }
}

/// A Gamma(shape, 1) distribution (Marsaglia-Tsang; boosted for shape < 1), with what its
/// shape gives computed once, for repeated draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GammaDraw {
    /// Marsaglia-Tsang's `d` and `c` for the shape (for shape + 1 when boosted).
    d: f64,
    c: f64,
    /// `1 / shape` when the shape is below 1 (the boost's exponent); `None` otherwise.
    boost: Option<f64>,
}

impl GammaDraw {
    /// Gamma(shape, 1); a shape that is not a finite number above 1e-6 is taken as 1e-6.
    pub fn new(shape: f64) -> GammaDraw {
        let shape = if shape.is_finite() && shape > 1e-6 {
            shape
        } else {
            1e-6
        };
        let (base, boost) = if shape < 1.0 {
            (shape + 1.0, Some(1.0 / shape))
        } else {
            (shape, None)
        };
        let d = base - 1.0 / 3.0;
        GammaDraw {
            d,
            c: 1.0 / (9.0 * d).sqrt(),
            boost,
        }
    }

    /// A variate.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> f64 {
        let Some(inv_shape) = self.boost else {
            return self.marsaglia_tsang(rng);
        };
        let u = 1.0 - rng.f64();
        self.marsaglia_tsang(rng) * u.powf(inv_shape)
    }

    fn marsaglia_tsang(&self, rng: &mut fastrand::Rng) -> f64 {
        let (d, c) = (self.d, self.c);
        loop {
            let x = sample_normal(rng);
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = 1.0 - rng.f64();
            let x2 = x * x;
            if u < 1.0 - 0.0331 * x2 * x2 || u.ln() < 0.5 * x2 + d * (1.0 - v + v.ln()) {
                return d * v;
            }
        }
    }
}

/// Both shapes at least this large: a Beta is drawn from its normal approximation.
pub const BETA_NORMAL_MIN_SHAPE: f64 = 12.0;

/// A Beta(alpha, beta) variate (from two gammas; from the normal with the same mean and
/// variance when both shapes are at least [`BETA_NORMAL_MIN_SHAPE`], which is much faster and
/// close enough for Thompson sampling).
pub fn sample_beta(rng: &mut fastrand::Rng, alpha: f64, beta: f64) -> f64 {
    BetaDraw::new(alpha, beta).sample(rng)
}

/// A Beta(alpha, beta) distribution with what [`sample_beta`] computes of its shapes before
/// each variate computed once, for repeated draws (the same variates from the same stream):
/// a policy's choice draws each arm's posterior hundreds of times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BetaDraw {
    /// The normal approximation's mean and standard deviation.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        sd: f64,
    },
    /// The ratio of two gammas.
    Gammas(GammaDraw, GammaDraw),
}

impl BetaDraw {
    /// Beta(alpha, beta).
    pub fn new(alpha: f64, beta: f64) -> BetaDraw {
        if alpha >= BETA_NORMAL_MIN_SHAPE && beta >= BETA_NORMAL_MIN_SHAPE {
            let n = alpha + beta;
            let mean = alpha / n;
            BetaDraw::Normal {
                mean,
                sd: (mean * (1.0 - mean) / (n + 1.0)).sqrt(),
            }
        } else {
            BetaDraw::Gammas(GammaDraw::new(alpha), GammaDraw::new(beta))
        }
    }

    /// A variate.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> f64 {
        match self {
            BetaDraw::Normal { mean, sd } => (mean + sd * sample_normal(rng)).clamp(0.0, 1.0),
            BetaDraw::Gammas(a, b) => {
                let x = a.sample(rng);
                let y = b.sample(rng);
                let s = x + y;
                if s > 0.0 { x / s } else { 0.5 }
            }
        }
    }
}

/// The evidence about one arm in one cluster node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArmStats {
    /// Discounted count of stage successes that were valid.
    pub successes: f64,
    /// Discounted count of strategy failures and invalid outputs.
    pub failures: f64,
    /// The node's visit count when the counts were last discounted.
    pub last_visit: u64,
    /// Discounted weight of the latency observations.
    pub latency_weight: f64,
    /// Discounted sum of ln(latency_ms) (so that exp(mean) estimates the median).
    pub latency_log_sum: f64,
    /// Discounted weight of the cost observations.
    pub cost_weight: f64,
    /// Discounted sum of the costs.
    pub cost_sum: f64,
    /// Observations learned from, ever (not discounted).
    pub observations: u64,
    /// Changes detected on this arm in this node.
    pub changes: u32,
    /// The change detector on the success indicator.
    pub detector: BernoulliGlr,
    /// Fast moving average of the success indicator (what the arm does lately).
    pub recent: f64,
}

impl ArmStats {
    /// The success and failure counts discounted to the node's current visit count.
    pub fn counts_at(&self, visits: u64, discount: f64) -> (f64, f64) {
        let age = visits.saturating_sub(self.last_visit);
        if age == 0 || discount >= 1.0 {
            return (self.successes, self.failures);
        }
        let factor = discount.powi(age.min(i32::MAX as u64) as i32);
        (self.successes * factor, self.failures * factor)
    }

    /// Applies the discount up to `visits`.
    pub fn age_to(&mut self, visits: u64, discount: f64) {
        let (s, f) = self.counts_at(visits, discount);
        self.successes = s;
        self.failures = f;
        self.last_visit = visits;
    }

    /// Adds latency and cost evidence with a per-observation discount.
    pub fn add_latency_cost(&mut self, latency_ms: f64, cost: f64, discount: f64) {
        if latency_ms.is_finite() && latency_ms >= 0.0 {
            self.latency_weight = self.latency_weight * discount + 1.0;
            self.latency_log_sum = self.latency_log_sum * discount + latency_ms.max(1e-3).ln();
        }
        if cost.is_finite() && cost >= 0.0 {
            self.cost_weight = self.cost_weight * discount + 1.0;
            self.cost_sum = self.cost_sum * discount + cost;
        }
    }

    /// Feeds the fast moving average of the success indicator.
    pub fn observe_recent(&mut self, x: f64, rate: f64) {
        if self.observations == 0 {
            self.recent = x;
        } else {
            self.recent += rate * (x - self.recent);
        }
    }

    /// Forgets the success evidence after a detected change: what is left is `keep` pseudo-
    /// observations at the recent success rate; latency and cost keep a fifth of their weight.
    /// The change detector is left as it is (one that fired has already started again from the
    /// change point it found).
    pub fn forget(&mut self, keep: f64) {
        let r = self.recent.clamp(0.0, 1.0);
        if self.successes + self.failures > keep {
            self.successes = keep * r;
            self.failures = keep * (1.0 - r);
        }
        self.changes += 1;
        // Latency and cost may have moved with the change: keep only a little of them.
        let keep = 0.2;
        self.latency_weight *= keep;
        self.latency_log_sum *= keep;
        self.cost_weight *= keep;
        self.cost_sum *= keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first four Beta variates from `fastrand::Rng::with_seed(seed)` as the sampler drew
    /// them before it was prepared once per choice (each variate recomputing the normal
    /// approximation's mean and spread or Marsaglia-Tsang's constants), bit for bit: the
    /// normal approximation, two gammas, boosted gammas (a shape below 1), gammas at 1, and a
    /// shape just under the approximation's threshold.
    const DRAWN_BEFORE: [(u64, f64, f64, [u64; 4]); 5] = [
        (
            1,
            40.0,
            60.0,
            [
                0x3fdac7a8783ddbbf,
                0x3fda0b2d9c4be1a7,
                0x3fd72bea6092cbf6,
                0x3fdbb519da5647e7,
            ],
        ),
        (
            2,
            3.0,
            5.0,
            [
                0x3fc721c19b156a6c,
                0x3fe6ad0a202bff82,
                0x3fc2f7dc6e2208d7,
                0x3fd0c2bd325b4fb7,
            ],
        ),
        (
            3,
            0.5,
            2.0,
            [
                0x3f9777cfb894f423,
                0x3fb263c90fd9035b,
                0x3fd16e6da810c51d,
                0x3fa6c1a17473c146,
            ],
        ),
        (
            4,
            1.0,
            0.999,
            [
                0x3fa4ee417ff4e904,
                0x3fbe751193cf4b34,
                0x3fefe84a53156ce7,
                0x3fa877b7ff7d1293,
            ],
        ),
        (
            5,
            12.0,
            11.9,
            [
                0x3fdddee6fe90e75a,
                0x3fe1ff9e598a2ce1,
                0x3fe2bbee60076265,
                0x3fdae5bf453793a6,
            ],
        ),
    ];

    #[test]
    fn prepared_draws_are_the_variates_drawn_before_bit_for_bit() {
        for (seed, a, b, want) in DRAWN_BEFORE {
            let draw = BetaDraw::new(a, b);
            let mut rng = fastrand::Rng::with_seed(seed);
            let got = want.map(|_| draw.sample(&mut rng).to_bits());
            assert_eq!(got, want, "Beta({a}, {b})");
            let mut rng = fastrand::Rng::with_seed(seed);
            let got = want.map(|_| sample_beta(&mut rng, a, b).to_bits());
            assert_eq!(got, want, "sample_beta({a}, {b})");
        }
    }

    #[test]
    fn the_ziggurat_layers_narrow_to_zero() {
        let z = &*ZIGGURAT;
        assert!(z.x.windows(2).all(|w| w[0] > w[1]), "edges decrease");
        // The last computed edge is near the peak: the layers' areas add up as they should.
        assert!(
            z.x[ZIGGURAT_LAYERS - 1] < 0.3,
            "{}",
            z.x[ZIGGURAT_LAYERS - 1]
        );
        assert_eq!(z.x[ZIGGURAT_LAYERS], 0.0);
        assert!(z.f.iter().all(|f| f.is_finite() && *f > 0.0 && *f <= 1.0));
    }

    #[test]
    fn normal_samples_follow_the_normal_distribution() {
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 400_000;
        let mut xs: Vec<f64> = (0..n).map(|_| sample_normal(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
        xs.sort_by(f64::total_cmp);
        // The empirical distribution function against the normal's, tails included.
        for x in [
            -4.0, -3.7, -3.0, -2.0, -1.0, -0.3, 0.0, 0.3, 1.0, 2.0, 3.0, 3.7, 4.0,
        ] {
            let below = xs.partition_point(|&v| v < x) as f64 / n as f64;
            let want = crate::learn::stats::normal_cdf(x);
            assert!(
                (below - want).abs() < 0.003,
                "P(X < {x}) = {below}, want {want}"
            );
        }
        // Beyond the ziggurat's base, drawn from the exact tail.
        let tail = xs.iter().filter(|x| x.abs() > ZIGGURAT_R).count() as f64 / n as f64;
        let want = 2.0 * (1.0 - crate::learn::stats::normal_cdf(ZIGGURAT_R));
        assert!(
            tail > 0.0 && (tail - want).abs() < want,
            "tail {tail}, want {want}"
        );
    }

    #[test]
    fn beta_samples_have_the_right_mean() {
        let mut rng = fastrand::Rng::with_seed(3);
        for &(a, b) in &[
            (1.0, 1.0),
            (0.3, 0.7),
            (20.0, 5.0),
            (2.0, 50.0),
            (40.0, 15.0),
        ] {
            let n = 20_000;
            let mean: f64 = (0..n).map(|_| sample_beta(&mut rng, a, b)).sum::<f64>() / n as f64;
            let want = a / (a + b);
            assert!(
                (mean - want).abs() < 0.01,
                "Beta({a},{b}): {mean} vs {want}"
            );
        }
    }

    #[test]
    fn discounting_decays_counts_with_age() {
        let s = ArmStats {
            successes: 10.0,
            failures: 10.0,
            last_visit: 0,
            ..ArmStats::default()
        };
        let (a, b) = s.counts_at(100, 0.99);
        assert!((a - 10.0 * 0.99f64.powi(100)).abs() < 1e-9);
        assert!((b - a).abs() < 1e-12);
    }
}
