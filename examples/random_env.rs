//! Writes seeded random simulated environments (FORMAT.md) of the kind the issue describes:
//! three to five stages of three to six arms, two to four features, specialists (an arm much
//! better or much worse for one feature value), the best arm of each stage behind 20-40%
//! infrastructure faults, and a downward drift of one arm for one feature value at task 500,
//! 600 or 700. They stand in for the environments the learning bench will be run on unseen.
//!
//! `cargo run --release --example random_env -- DIR FIRST LAST [--wide]` writes `DIR/gFIRST.toml`
//! to `DIR/gLAST.toml`; then run `hindsight bench learning --env DIR/g1.toml --json` on each.
//! `--wide` draws six to ten arms per stage instead (the "many arms" of the issue, at its far end);
//! `--arms 15,20` draws each stage's number of arms from the list given; `--up` makes the drift
//! upward (the drifting arm becomes nearly perfect for its feature value: an arm long written off
//! may become the best); `--features 5,6,7` draws each environment's number of features from
//! the list given (most of them noise, as a task's metadata often is), `--values 8,12` each
//! feature's number of values (each value seen rarely), `--stages 6,7` each environment's
//! number of stages (long pipelines, where a task passes only if every stage does).

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

/// Arms per stage, drawn from these.
pub const ARMS: &[u64] = &[3, 4, 5, 6];
/// Arms per stage with `--wide`.
pub const WIDE_ARMS: &[u64] = &[6, 7, 8, 10];
/// Features per environment, drawn from these.
pub const FEATURES: &[u64] = &[2, 3, 3, 4];
/// Values per feature, drawn from these.
pub const VALUES: &[u64] = &[2, 3, 4];
/// Stages per environment, drawn from these.
pub const STAGES: &[u64] = &[3, 3, 4, 5];

/// The shape of the environments [`generate_env`] draws: each environment's number of stages
/// and of features, each stage's number of arms and each feature's number of values come from
/// these lists.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// Arms per stage.
    pub arms: &'a [u64],
    /// Features per environment.
    pub features: &'a [u64],
    /// Values per feature.
    pub values: &'a [u64],
    /// Stages per environment.
    pub stages: &'a [u64],
}

/// The environment of `seed`, as TOML text (the same text for the same seed, on every build).
pub fn generate(seed: u64) -> String {
    generate_with(seed, ARMS)
}

/// [`generate`] with each stage's number of arms drawn from `arm_counts`.
pub fn generate_with(seed: u64, arm_counts: &[u64]) -> String {
    generate_drift(seed, arm_counts, false)
}

/// [`generate_with`], with an upward drift when `up`: the drifting arm becomes nearly perfect
/// (`p_success` and `p_valid` 0.99) for its feature value instead of breaking, so that an arm
/// long written off may become the best.
pub fn generate_drift(seed: u64, arm_counts: &[u64], up: bool) -> String {
    let shape = Shape {
        arms: arm_counts,
        features: FEATURES,
        values: VALUES,
        stages: STAGES,
    };
    generate_env(seed, shape, up)
}

/// [`generate_drift`] in any [`Shape`] (the same text as `generate_drift` with [`FEATURES`],
/// [`VALUES`] and [`STAGES`]). With five features or more, most are noise that no arm's odds
/// turn on, as a task's metadata often is; with many values, each value is seen rarely (a
/// tenant among twelve).
pub fn generate_env(seed: u64, shape: Shape<'_>, up: bool) -> String {
    let mut r = fastrand::Rng::with_seed(seed);
    let pick = |r: &mut fastrand::Rng, xs: &[u64]| xs[r.usize(..xs.len())];
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    let n_stages = pick(&mut r, shape.stages);
    let n_features = pick(&mut r, shape.features);
    let features: Vec<(String, Vec<String>, Vec<u64>)> = (0..n_features)
        .map(|i| {
            let k = pick(&mut r, shape.values);
            let values = (0..k).map(|j| format!("v{i}{j}")).collect();
            let weights = (0..k).map(|_| r.u64(1..=5)).collect();
            (format!("f{i}"), values, weights)
        })
        .collect();
    let quote = |v: &[String]| {
        v.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    let placeholders: Vec<String> = features.iter().map(|f| format!("{{{}}}", f.0)).collect();
    let _ = writeln!(out, "name = \"random-{seed}\"");
    let _ = writeln!(out, "goal = \"task {}\"", placeholders.join(" "));
    let _ = writeln!(out, "sla_ms = {}\n", pick(&mut r, &[15000, 20000, 30000]));
    let _ = writeln!(out, "[reward]\nsuccess = 1.0");
    let _ = writeln!(out, "latency = {}", [0.1, 0.2, 0.3][r.usize(..3)]);
    let _ = writeln!(out, "cost = {}", [0.1, 0.15][r.usize(..2)]);
    let _ = writeln!(out, "max_cost = 0.2\n\n[features]");
    for (name, values, weights) in &features {
        let w: Vec<String> = weights.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "{name} = {{ values = [{}], weights = [{}] }}",
            quote(values),
            w.join(", ")
        );
    }
    let random_match = |r: &mut fastrand::Rng| {
        let (name, values, _) = &features[r.usize(..features.len())];
        format!("{name} = \"{}\"", values[r.usize(..values.len())])
    };
    let mut drifting: Option<(u64, u64)> = None;
    for s in 0..n_stages {
        let _ = writeln!(out, "\n[[stage]]\nname = \"s{s}\"");
        let n_arms = pick(&mut r, shape.arms);
        let best = r.u64(..n_arms);
        for a in 0..n_arms {
            let _ = writeln!(
                out,
                "\n[[stage.arm]]\ntool = \"t{s}_{a}\"\nstrategy = \"st{a}\""
            );
            let _ = writeln!(
                out,
                "cost = {}",
                [0.001, 0.005, 0.01, 0.03, 0.06][r.usize(..5)]
            );
            let _ = writeln!(
                out,
                "latency_ms = {}",
                pick(&mut r, &[300, 800, 1500, 3000, 6000, 12000])
            );
            let _ = writeln!(out, "p_success = {}", round2(0.55 + 0.42 * r.f64()));
            let _ = writeln!(out, "p_valid = {}", round2(0.6 + 0.39 * r.f64()));
            let _ = writeln!(out, "errors = {{ Timeout = 1, DeterministicFailure = 1 }}");
            if a == best {
                let _ = writeln!(out, "p_infra = {}", round2(0.2 + 0.2 * r.f64()));
            }
            for _ in 0..pick(&mut r, &[0, 0, 1, 2]) {
                let m = random_match(&mut r);
                let p = if r.bool() {
                    0.05 + 0.25 * r.f64()
                } else {
                    0.9 + 0.09 * r.f64()
                };
                let _ = writeln!(
                    out,
                    "\n[[stage.arm.when]]\nmatch = {{ {m} }}\np_success = {}",
                    round2(p)
                );
            }
            if drifting.is_none() && r.f64() < 0.3 {
                drifting = Some((s, a));
            }
        }
    }
    let _ = writeln!(
        out,
        "\n[infra]\np_fault = 0.05\nerrors = {{ TransientNetwork = 2, RateLimit = 1 }}"
    );
    let (s, a) = drifting.unwrap_or((0, 0));
    let m = random_match(&mut r);
    let after = pick(&mut r, &[500, 600, 700]);
    let down = round2(0.05 + 0.25 * r.f64());
    let _ = writeln!(
        out,
        "\n[[drift]]\nafter_task = {after}\nstage = \"s{s}\"\ntool = \"t{s}_{a}\"\nstrategy = \"st{a}\"\nmatch = {{ {m} }}"
    );
    if up {
        let _ = writeln!(out, "p_success = 0.99\np_valid = 0.99");
    } else {
        let _ = writeln!(out, "p_success = {down}");
    }
    out
}

/// A comma-separated list of counts, each from `min` to `max`, for the option `flag`.
fn counts(flag: &str, list: &str, (min, max): (u64, u64), what: &str) -> Result<Vec<u64>, String> {
    list.split(',')
        .map(|n| match n.trim().parse::<u64>() {
            Ok(k) if (min..=max).contains(&k) => Ok(k),
            _ => Err(format!(
                "{flag}: `{n}` is not a number of {what} ({min} to {max})"
            )),
        })
        .collect()
}

/// Removes `flag` and the list after it from `args` and parses the list (see [`counts`]);
/// `default` when the flag is absent.
fn take_counts(
    args: &mut Vec<String>,
    flag: &str,
    range: (u64, u64),
    what: &str,
    default: &[u64],
) -> Result<Vec<u64>, String> {
    let Some(i) = args.iter().position(|a| a == flag) else {
        return Ok(default.to_vec());
    };
    let list = args
        .get(i + 1)
        .cloned()
        .ok_or_else(|| format!("{flag} needs a list of numbers: N,M,..."))?;
    args.drain(i..i + 2);
    counts(flag, &list, range, what)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let up = args.iter().any(|a| a == "--up");
    args.retain(|a| a != "--up");
    let usage = "usage: random_env DIR FIRST LAST [--wide | --arms N,M,...] \
                 [--features N,M,...] [--values N,M,...] [--stages N,M,...] [--up]";
    let feature_counts = take_counts(&mut args, "--features", (1, 31), "features", FEATURES)?;
    let value_counts = take_counts(&mut args, "--values", (1, 1000), "values", VALUES)?;
    let stage_counts = take_counts(&mut args, "--stages", (1, 64), "stages", STAGES)?;
    let dir = args.first().ok_or(usage)?;
    let first: u64 = args.get(1).ok_or(usage)?.parse()?;
    let last: u64 = args.get(2).ok_or(usage)?.parse()?;
    let listed: Vec<u64>;
    let arm_counts: &[u64] = match (args.get(3).map(String::as_str), args.get(4)) {
        (None, _) => ARMS,
        (Some("--wide"), None) => WIDE_ARMS,
        (Some("--arms"), Some(list)) => {
            listed = counts("--arms", list, (2, u64::MAX), "arms")?;
            &listed
        }
        _ => return Err(usage.into()),
    };
    let shape = Shape {
        arms: arm_counts,
        features: &feature_counts,
        values: &value_counts,
        stages: &stage_counts,
    };
    std::fs::create_dir_all(dir)?;
    // Each file's path is listed as it is written; a reader that stops listening (`| head`)
    // stops the listing, not the writing.
    let mut out = Some(std::io::stdout().lock());
    for seed in first..=last {
        let path = Path::new(dir).join(format!("g{seed}.toml"));
        std::fs::write(&path, generate_env(seed, shape, up))?;
        if let Some(o) = out.as_mut()
            && let Err(e) = writeln!(o, "{}", path.display())
        {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(e.into());
            }
            out = None;
        }
    }
    Ok(())
}
