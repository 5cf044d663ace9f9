//! stats: the small statistics the learning code decides with: the normal CDF, log-gamma,
//! binomial tails, the two-proportion z-test, Fisher's exact test and Wilson intervals.

/// The complementary error function (Numerical Recipes' Chebyshev fit; relative error below
/// 1.2e-7 everywhere).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// The standard normal cumulative distribution function.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// ln C(n, k).
pub fn ln_choose(n: u64, k: u64) -> f64 {
    if k > n {
        return f64::NEG_INFINITY;
    }
    ln_gamma(n as f64 + 1.0) - ln_gamma(k as f64 + 1.0) - ln_gamma((n - k) as f64 + 1.0)
}

fn binom_ln_pmf(k: u64, n: u64, p: f64) -> f64 {
    if p <= 0.0 {
        return if k == 0 { 0.0 } else { f64::NEG_INFINITY };
    }
    if p >= 1.0 {
        return if k == n { 0.0 } else { f64::NEG_INFINITY };
    }
    ln_choose(n, k) + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()
}

/// P(X <= k) for X ~ Binomial(n, p), exact.
pub fn binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
    if k >= n {
        return 1.0;
    }
    (0..=k)
        .map(|i| binom_ln_pmf(i, n, p).exp())
        .sum::<f64>()
        .min(1.0)
}

/// P(X >= k) for X ~ Binomial(n, p), exact.
pub fn binomial_sf(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    (k..=n)
        .map(|i| binom_ln_pmf(i, n, p).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The result of a one-sided test of "group 1 succeeds more often than group 2".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpliftTest {
    /// Success rate of group 1.
    pub rate1: f64,
    /// Success rate of group 2.
    pub rate2: f64,
    /// The test statistic (z for the z-test; NaN for exact tests).
    pub statistic: f64,
    /// One-sided p-value.
    pub p_value: f64,
}

/// Two-proportion z-test (pooled variance), one-sided: is `s1/n1` above `s2/n2`?
pub fn two_proportion_z(s1: u64, n1: u64, s2: u64, n2: u64) -> UpliftTest {
    let (r1, r2) = (rate(s1, n1), rate(s2, n2));
    if n1 == 0 || n2 == 0 {
        return UpliftTest {
            rate1: r1,
            rate2: r2,
            statistic: 0.0,
            p_value: 1.0,
        };
    }
    let pooled = (s1 + s2) as f64 / (n1 + n2) as f64;
    let se = (pooled * (1.0 - pooled) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt();
    let z = if se > 0.0 { (r1 - r2) / se } else { 0.0 };
    UpliftTest {
        rate1: r1,
        rate2: r2,
        statistic: z,
        p_value: if se > 0.0 { 1.0 - normal_cdf(z) } else { 1.0 },
    }
}

/// Fisher's exact test, one-sided: is `s1/n1` above `s2/n2`? (The probability, under the
/// hypergeometric null with both margins fixed, of group 1 having `s1` successes or more.)
pub fn fisher_exact_greater(s1: u64, n1: u64, s2: u64, n2: u64) -> UpliftTest {
    let (r1, r2) = (rate(s1, n1), rate(s2, n2));
    let s1 = s1.min(n1);
    let s2 = s2.min(n2);
    let n = n1 + n2;
    let k = s1 + s2; // successes in total
    let denom = ln_choose(n, n1);
    let hi = k.min(n1);
    let p: f64 = (s1..=hi)
        .filter(|&x| k - x <= n2)
        .map(|x| (ln_choose(k, x) + ln_choose(n - k, n1 - x) - denom).exp())
        .sum();
    UpliftTest {
        rate1: r1,
        rate2: r2,
        statistic: f64::NAN,
        p_value: p.clamp(0.0, 1.0),
    }
}

/// The Mann-Whitney U test, one-sided: do the values of `x` tend to be larger than those of
/// `y`? (Normal approximation, with the tie and continuity corrections; `rate1` and `rate2` are
/// the groups' means.) Made for rewards, whose distribution no parametric test fits.
pub fn mann_whitney_greater(x: &[f64], y: &[f64]) -> UpliftTest {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (n1, n2) = (x.len() as f64, y.len() as f64);
    let mut all: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rank_sum, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1..=j+1 share their mean.
        let rank = (i + j + 2) as f64 / 2.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_sum += rank * all[i..=j].iter().filter(|(_, in_x)| *in_x).count() as f64;
        i = j + 1;
    }
    let n = n1 + n2;
    let u = rank_sum - n1 * (n1 + 1.0) / 2.0;
    let var = if n > 1.0 {
        n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)))
    } else {
        0.0
    };
    let (statistic, p_value) = if n1 == 0.0 || n2 == 0.0 || var <= 0.0 {
        (0.0, 1.0)
    } else {
        let z = (u - n1 * n2 / 2.0 - 0.5) / var.sqrt();
        (z, 1.0 - normal_cdf(z))
    };
    UpliftTest {
        rate1: mean(x),
        rate2: mean(y),
        statistic,
        p_value,
    }
}

/// The Wilson score interval of `s/n` at normal quantile `z`.
pub fn wilson_interval(s: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n_f = n as f64;
    let p = s.min(n) as f64 / n_f;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n_f)) / (1.0 + z2 / n_f);
    let half = z * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt() / (1.0 + z2 / n_f);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn rate(s: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        s.min(n) as f64 / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mann_whitney_by_hand() {
        // Every x above every y: U = 6 of 6, z = (6 - 3 - 0.5) / sqrt(3).
        let t = mann_whitney_greater(&[3.0, 4.0, 5.0], &[1.0, 2.0]);
        assert!((t.statistic - 2.5 / 3f64.sqrt()).abs() < 1e-12);
        assert!((t.p_value - 0.07446).abs() < 1e-4, "{}", t.p_value);
        // The same values on both sides: no evidence at all.
        assert!(mann_whitney_greater(&[1.0, 2.0], &[1.0, 2.0]).p_value > 0.5);
        assert_eq!(mann_whitney_greater(&[1.0; 4], &[1.0; 4]).p_value, 1.0);
        assert_eq!(mann_whitney_greater(&[], &[1.0]).p_value, 1.0);
        // Twenty runs a little better than fifty: significant; the other way round: not.
        let better: Vec<f64> = (0..20).map(|i| 0.95 + f64::from(i) * 1e-3).collect();
        let model: Vec<f64> = (0..50).map(|i| 0.90 + f64::from(i) * 1e-3).collect();
        assert!(mann_whitney_greater(&better, &model).p_value < 0.001);
        assert!(mann_whitney_greater(&model, &better).p_value > 0.99);
    }

    #[test]
    fn normal_cdf_matches_tables() {
        assert!(close(normal_cdf(0.0), 0.5, 1e-7));
        assert!(close(normal_cdf(1.959_963_985), 0.975, 1e-7));
        assert!(close(normal_cdf(-1.644_853_627), 0.05, 1e-7));
        assert!(close(normal_cdf(3.0), 0.998_650_101_968, 1e-7));
        assert!(close(normal_cdf(-6.0), 9.865_876_45e-10, 1e-12));
    }

    #[test]
    fn ln_gamma_matches_factorials() {
        assert!(close(ln_gamma(1.0), 0.0, 1e-12));
        assert!(close(ln_gamma(11.0), (3_628_800f64).ln(), 1e-10));
        assert!(close(
            ln_gamma(0.5),
            std::f64::consts::PI.sqrt().ln(),
            1e-12
        ));
    }

    #[test]
    fn binomial_tails_are_exact() {
        // P(X <= 2 | 10, 0.5) = 56 / 1024.
        assert!(close(binomial_cdf(2, 10, 0.5), 56.0 / 1024.0, 1e-12));
        assert!(close(binomial_sf(8, 10, 0.5), 56.0 / 1024.0, 1e-12));
        // P(X <= 14 | 20, 0.9) = 0.011253134164509 (exact sum of the pmf).
        assert!(close(
            binomial_cdf(14, 20, 0.9),
            0.011_253_134_164_509,
            1e-11
        ));
        assert_eq!(binomial_cdf(10, 10, 0.3), 1.0);
        assert_eq!(binomial_sf(0, 10, 0.3), 1.0);
    }

    #[test]
    fn two_proportion_z_test_known_value() {
        // 45/50 vs 30/50: pooled 0.75, se = sqrt(0.75 * 0.25 * 0.04), z = 0.3 / se = 3.4641.
        let t = two_proportion_z(45, 50, 30, 50);
        assert!(close(t.statistic, 3.464_101_615, 1e-6));
        assert!(close(t.p_value, 2.660_028_1e-4, 1e-8));
        let none = two_proportion_z(30, 50, 45, 50);
        assert!(none.p_value > 0.99);
        assert_eq!(two_proportion_z(1, 0, 1, 1).p_value, 1.0);
    }

    #[test]
    fn fisher_exact_known_value() {
        // [[8, 2], [1, 5]]: one-sided p = 0.024475524475524 (hypergeometric tail).
        let t = fisher_exact_greater(8, 10, 1, 6);
        assert!(close(t.p_value, 0.024_475_524_475_524, 1e-12));
        // No uplift: p-value large.
        assert!(fisher_exact_greater(5, 10, 5, 10).p_value > 0.5);
    }

    #[test]
    fn wilson_interval_contains_the_rate() {
        let (lo, hi) = wilson_interval(81, 100, 1.96);
        assert!(
            close(lo, 0.7222, 1e-3) && close(hi, 0.8749, 1e-3),
            "{lo} {hi}"
        );
        assert_eq!(wilson_interval(0, 0, 1.96), (0.0, 1.0));
    }
}
