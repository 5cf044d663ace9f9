//! The error classifier against promptise 1.10.1's `classify_failure`, in the same run.
//!
//! Messages: every labelled fixture (`tests/fixtures/errors*.jsonl`, real error messages). First
//! a same-run comparison: hindsight's `classify_error` cycled over the messages for 100,000 calls
//! (median of five rounds after a warm-up pass), then promptise's function timed in-process by
//! `benches/promptise_classify.py` on the same messages and call count (a venv under
//! `target/promptise-venv` is created on first use); the ratio is printed. If Python or promptise
//! cannot be had, the bench says so and prints no peer figure. Then criterion groups: the whole
//! corpus per iteration (throughput in messages) and adversarial input of 68 KB and 1 MB, without
//! and with an explicit status that sends the text through the status pattern and the wrapped
//! exception search (the classifier is linear and bounds the message, so the larger costs about
//! the same).
//!
//! Run: `cargo bench -p hindsight --bench classify_errors`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hindsight::triage::classify_error;
use serde::Deserialize;

/// Calls per timed round, for both classifiers.
const CALLS: usize = 100_000;
const FIXTURES: [&str; 3] = [
    "errors.jsonl",
    "errors_holdout.jsonl",
    "errors_heldout_real.jsonl",
];
const PEER: &str = "promptise==1.10.1";

#[derive(Deserialize)]
struct Row {
    error_type: Option<String>,
    error_message: String,
}

fn fixture_paths() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    FIXTURES.iter().map(|f| dir.join(f)).collect()
}

fn messages() -> Vec<Row> {
    let mut rows = Vec::new();
    for p in fixture_paths() {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            rows.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
        }
    }
    rows
}

/// Median nanoseconds per call of `classify_error` over `CALLS` calls cycling through `rows`.
fn hindsight_ns_per_call(rows: &[Row]) -> f64 {
    for r in rows {
        black_box(classify_error(r.error_type.as_deref(), &r.error_message));
    }
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for r in rows.iter().cycle().take(CALLS) {
                black_box(classify_error(
                    black_box(r.error_type.as_deref()),
                    black_box(&r.error_message),
                ));
            }
            t.elapsed().as_nanos() as f64 / CALLS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// The venv's Python with promptise installed, creating the venv on first use.
fn peer_python() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let venv = target.join("promptise-venv");
    let python = venv.join("bin/python");
    let has_peer = |py: &Path| {
        Command::new(py)
            .args(["-c", "import promptise.strategy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has_peer(&python) {
        return Ok(python);
    }
    eprintln!("creating {} with {PEER} (first use)", venv.display());
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args(["install", "-q", PEER]))?;
    if has_peer(&python) {
        Ok(python)
    } else {
        Err(format!(
            "{PEER} installed but `import promptise.strategy` fails"
        ))
    }
}

/// promptise's median nanoseconds per call on the same messages, or why it could not be had.
fn promptise_ns_per_call() -> Result<f64, String> {
    let python = peer_python()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/promptise_classify.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(CALLS.to_string())
        .args(fixture_paths())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("reading the timing script's output: {e}"))?;
    v["ns_per_call_median"]
        .as_f64()
        .ok_or_else(|| format!("no ns_per_call_median in {v}"))
}

fn same_run_comparison(rows: &[Row]) {
    let t = Instant::now();
    // Reaches every rule table (no rule matches), so this builds them all.
    black_box(classify_error(Some("E"), black_box("the answer was empty")));
    let first = t.elapsed();
    let ours = hindsight_ns_per_call(rows);
    println!(
        "classify_errors: {} messages cycled to {CALLS} calls",
        rows.len()
    );
    println!(
        "  hindsight classify_error: {:.2} us/msg (first call, building the rules: {:.1} ms)",
        ours / 1e3,
        first.as_secs_f64() * 1e3
    );
    match promptise_ns_per_call() {
        Ok(peer) => {
            println!(
                "  {PEER} classify_failure (in-process): {:.2} us/call",
                peer / 1e3
            );
            println!("  ratio promptise/hindsight: {:.1}x", peer / ours);
        }
        Err(why) => println!("  {PEER}: NOT MEASURED ({why})"),
    }
}

fn bench(c: &mut Criterion) {
    let rows = messages();
    same_run_comparison(&rows);

    let mut g = c.benchmark_group("classify_errors");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.bench_function("corpus", |b| {
        b.iter(|| {
            for r in &rows {
                black_box(classify_error(
                    black_box(r.error_type.as_deref()),
                    black_box(&r.error_message),
                ));
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("classify_errors_adversarial");
    let unit = "status 5 code= HTTP/ x connection ".repeat(2_000);
    let big = unit.repeat(16);
    g.bench_function("68KB", |b| {
        b.iter(|| black_box(classify_error(Some("Error"), black_box(&unit))))
    });
    g.bench_function("1MB", |b| {
        b.iter(|| black_box(classify_error(Some("Error"), black_box(&big))))
    });
    // With an explicit 5xx status at the end: the status pattern, the regex patterns admitted
    // by "tool", and the search for a wrapped exception all run over the whole bounded text.
    let near = "status 50 code= http/ tool x: valueerror ".repeat(1_600);
    let unit = format!("{near}HTTP 503");
    let big = format!("{}HTTP 503", near.repeat(16));
    g.bench_function("68KB_status", |b| {
        b.iter(|| black_box(classify_error(Some("Error"), black_box(&unit))))
    });
    g.bench_function("1MB_status", |b| {
        b.iter(|| black_box(classify_error(Some("Error"), black_box(&big))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
