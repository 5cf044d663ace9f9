//! `hindsight bench learning` as a user runs it: the JSON object's KPIs (drift recovery
//! included), the per-task trace, and a one-sentence error for a missing environment file.

mod cli_support;

use std::path::{Path, PathBuf};

use cli_support::hindsight;

use serde_json::Value;

fn env_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/envs")
        .join(name)
}

#[test]
fn learning_bench_prints_the_kpis_with_drift_recovery_and_writes_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let env = env_file("web_research.toml");
    // web_research drifts at task 500: 650 tasks reach past it. One task in flight, so that the
    // run, and with it the trace's figures below, repeat exactly (at four in flight two runs of
    // a seed differ: the first 100 tasks' greedy regret against tasks 400-499's went from 2.0
    // to 5.6 times over ten runs of one). Seed 1: 11.44 against 1.25; seeds 2, 4, 5 and 6
    // alike (12.4-17.4 against 0.4-4.3). Seed 3, used here before fallbacks took the arm with
    // the highest upper bound (2026-11-29), now keeps news_api written off on news until the
    // drift (about 9.5 every hundred tasks throughout: 10.92 against 8.55).
    let out = hindsight(
        dir.path(),
        &[
            "bench",
            "learning",
            "--env",
            env.to_str().unwrap(),
            "--tasks",
            "650",
            "--seed",
            "1",
            "--concurrency",
            "1",
            "--trace",
            trace.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "tasks",
        "success_rate",
        "mean_reward",
        "oracle_mean_reward",
        "random_mean_reward",
        "cumulative_regret",
        "random_cumulative_regret",
        "regret_ratio",
        "sops_promoted",
        "sop_coverage_last_100",
        "exploration_rate_last_100",
        "repeat_error_rate",
        "infra_failures_learned_from",
    ] {
        assert!(report.get(key).is_some(), "missing {key}: {report}");
    }
    assert_eq!(report["tasks"], 650);
    assert_eq!(report["infra_failures_learned_from"], 0);
    let ratio = report["regret_ratio"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio < 1.0, "{ratio}");
    let drift = &report["drift"];
    assert_eq!(drift["after_task"], 500, "{report}");
    let affected = drift["affected_tasks"].as_u64().unwrap();
    // Every drifted task of the 150 after task 500 is still within the recovery allowance.
    assert!(affected > 0, "{drift}");
    assert_eq!(drift["affected_after_recovery"], 0, "{drift}");
    assert!(drift["regret_ratio_during_recovery"].as_f64().is_some());

    let lines: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 650);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["task"], i as u64, "{l}");
        assert_eq!(l["features"].as_object().unwrap().len(), 3, "{l}");
        // Two stages: search, then summarize.
        let plan = l["plan"].as_array().unwrap();
        assert_eq!(plan.len(), 2, "{l}");
        assert!(
            plan.iter().all(|a| a.as_str().unwrap().contains('/')),
            "{l}"
        );
        assert!(l["passed"].is_boolean() && l["reward"].is_f64(), "{l}");
        assert!(l["regret"].as_f64().unwrap() >= 0.0, "{l}");
        assert!(l["sop"].is_null() || l["sop"].is_string(), "{l}");
        // Every first plan carries the probability it was chosen with: the whole mixture's,
        // an SOP's plan included (the SOP takes 90% of the draws that land on the greedy
        // plan, so its plan's probability is the policy's chance of a greedy draw times that,
        // plus any exploration that lands on it; the unit tests check it against frequencies).
        let propensity = l["propensity"].as_f64().unwrap();
        assert!(propensity > 0.0 && propensity <= 1.0, "{l}");
    }
    // 650 tasks: the ranker was distilled three times (every 200 runs).
    assert_eq!(report["ranker"]["fits"], 3, "{report}");
    assert!(report["ranker"]["in_force"].is_boolean(), "{report}");
    // The trace's regret sums to the report's.
    let sum: f64 = lines.iter().map(|l| l["regret"].as_f64().unwrap()).sum();
    let cumulative = report["cumulative_regret"].as_f64().unwrap();
    assert!((sum - cumulative).abs() < 1e-6, "{sum} vs {cumulative}");
    // It splits into the regret of the policy's greedy plans (what it believed when it chose)
    // and of the departures from them; the trace's greedy regret sums to the report's, and the
    // beliefs improve: the first 100 tasks' greedy plans cost far more than those before the
    // drift at 500.
    let greedy = report["greedy_regret"].as_f64().unwrap();
    let departures = report["exploration_regret"].as_f64().unwrap();
    assert!(
        (greedy + departures - cumulative).abs() < 1e-6,
        "{greedy} + {departures} vs {cumulative}"
    );
    let greedy_of = |range: std::ops::Range<usize>| -> f64 {
        lines[range]
            .iter()
            .map(|l| l["greedy_regret"].as_f64().unwrap())
            .sum()
    };
    assert!((greedy_of(0..650) - greedy).abs() < 1e-6, "{greedy}");
    // The greedy plan travels with the run: where the first plan explored, its regret differs.
    let differ = lines
        .iter()
        .filter(|l| {
            (l["greedy_regret"].as_f64().unwrap() - l["regret"].as_f64().unwrap()).abs() > 1e-9
        })
        .count();
    assert!(
        differ > 10,
        "{differ} tasks where the greedy plan was not the plan run"
    );
    let (first, settled) = (greedy_of(0..100), greedy_of(400..500));
    assert!(
        first > 2.0 * settled,
        "first {first}, tasks 400-499 {settled}"
    );
}

#[test]
fn learning_bench_runs_several_seeds_and_gives_their_spread() {
    let dir = tempfile::tempdir().unwrap();
    let env = env_file("flaky_ocr.toml");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "bench",
            "learning",
            "--env",
            env.to_str().unwrap(),
            "--tasks",
            "120",
            "--seed",
            "4",
            "--runs",
            "3",
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let json = args(&["--json"]);
    let json: Vec<&str> = json.iter().map(String::as_str).collect();
    let out = hindsight(dir.path(), &json);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all["seeds"], serde_json::json!([4, 5, 6]), "{all}");
    assert_eq!(all["tasks"], 120);
    let runs = all["per_run"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let ratios: Vec<f64> = runs
        .iter()
        .map(|r| {
            assert_eq!(r["tasks"], 120, "{r}");
            r["regret_ratio"].as_f64().unwrap()
        })
        .collect();
    let mean = ratios.iter().sum::<f64>() / 3.0;
    assert!((all["mean_regret_ratio"].as_f64().unwrap() - mean).abs() < 1e-12);
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(all["min_regret_ratio"].as_f64().unwrap(), min);
    assert_eq!(all["max_regret_ratio"].as_f64().unwrap(), max);
    let above = ratios.iter().filter(|&&r| r > 0.2).count() as u64;
    assert_eq!(all["runs_above_bar"], above, "{all}");
    assert_eq!(all["infra_failures_learned_from"], 0);
    // flaky OCR does not drift: no run has drift figures to average.
    assert!(
        all["mean_drift_regret_ratio_after_recovery"].is_null(),
        "{all}"
    );

    // A trace or a kept store describes one run: refused, in one sentence.
    let trace = dir.path().join("t.jsonl");
    let refused = args(&["--trace", trace.to_str().unwrap()]);
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let out = hindsight(dir.path(), &refused);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trace and --keep describe one run"), "{err}");
    assert!(!trace.exists());
}

/// The run machine's two interpreters take the same decisions: with one task in flight and the
/// same seed, the core's (`--engine core`) and the tree's write the same trace, byte for byte.
/// Web research promotes SOPs within its first 400 tasks, so the A/B router is in the trace too.
#[test]
fn the_core_and_the_tree_write_the_same_trace() {
    for (env, tasks) in [
        ("bank_statements.toml", "300"),
        ("web_research.toml", "400"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let env = env_file(env);
        let trace = |engine: &str| {
            let trace = dir.path().join(format!("{engine}.jsonl"));
            let out = hindsight(
                dir.path(),
                &[
                    "bench",
                    "learning",
                    "--env",
                    env.to_str().unwrap(),
                    "--engine",
                    engine,
                    "--tasks",
                    tasks,
                    "--seed",
                    "7",
                    "--concurrency",
                    "1",
                    "--trace",
                    trace.to_str().unwrap(),
                    "--json",
                ],
            );
            assert!(
                out.status.success(),
                "{engine}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(report["engine"], engine);
            (std::fs::read(&trace).unwrap(), report)
        };
        let (core, core_report) = trace("core");
        let (tree, tree_report) = trace("tree");
        assert!(!core.is_empty());
        assert!(core == tree, "{}: the traces differ", env.display());
        for key in [
            "regret_ratio",
            "sops_promoted",
            "success_rate",
            "reflect_retries",
        ] {
            assert_eq!(core_report[key], tree_report[key], "{key}");
        }
    }
}

/// The core engine runs one task at a time and keeps no store: it says so rather than run
/// something else than asked.
#[test]
fn the_core_engine_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, words) in [
        (["--concurrency", "4"], "one task at a time"),
        (["--keep", "kept"], "has none"),
    ] {
        let mut args = vec!["bench", "learning", "--engine", "core", "--tasks", "10"];
        args.extend(extra);
        let out = hindsight(dir.path(), &args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(words), "{err}");
    }
}

#[test]
fn learning_bench_names_a_missing_environment_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let out = hindsight(
        dir.path(),
        &["bench", "learning", "--env", missing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope.toml"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn learning_bench_keeps_its_store_only_in_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("kept");
    let bench = |keep: &Path| {
        hindsight(
            dir.path(),
            &[
                "bench",
                "learning",
                "--tasks",
                "60",
                "--keep",
                keep.to_str().unwrap(),
                "--json",
            ],
        )
    };
    let out = bench(&keep);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The kept store is a data directory like any other.
    let out = hindsight(&keep, &["policy", "evaluate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let eval: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eval["rows"], 60, "{eval}");
    // A second run would mix two runs' learning: refused, in one sentence naming the directory.
    let out = bench(&keep);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kept") && err.contains("not empty"), "{err}");
}

#[test]
fn learning_bench_learns_with_a_configuration_files_policy_section() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "learning", "--tasks", "260", "--json"];
        args.extend_from_slice(extra);
        hindsight(dir.path(), &args)
    };
    let fits = |out: &std::process::Output| -> (u64, Value) {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        (report["ranker"]["fits"].as_u64().unwrap(), report)
    };
    // The embedded defaults fit a ranker from 200 experiences on, every 200: one in 260 tasks.
    let (defaults, report) = fits(&bench(&[]));
    assert_eq!(defaults, 1, "{report}");
    assert!(report["config"].is_null(), "{report}");
    // The file's [distill] fits every 20.
    let file = dir.path().join("tuned.toml");
    std::fs::write(
        &file,
        "[distill]\nevery = 20\n[policy.choice]\nrule = \"information_directed\"\nsamples = 8\n",
    )
    .unwrap();
    let (tuned, report) = fits(&bench(&["--config", file.to_str().unwrap()]));
    assert!(tuned >= 3, "{report}");
    assert_eq!(report["config"], file.to_str().unwrap(), "{report}");
    // A bad value: one sentence naming the file and the key, no run.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[policy.choice]\nrule = \"information_directed\"\nsamples = 100000\n",
    )
    .unwrap();
    let out = bench(&["--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("policy.choice.samples"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn overhead_bench_measures_every_run_and_accounts_for_every_unfinished_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = hindsight(
        dir.path(),
        &[
            "bench",
            "overhead",
            "--runs",
            "5",
            "--experiences",
            "300",
            "--lessons",
            "60",
            "--sops",
            "6",
            "--unfinished",
            "25",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Measured with a tool that is not idempotent first, and with an agent's model turn.
    for kind in ["write_ahead", "model_turn"] {
        let f = &report[kind];
        assert_eq!(f["runs"], 5, "{kind}: {report}");
        for key in ["p50_ms", "p99_ms", "max_ms"] {
            assert!(
                f[key].as_f64().is_some_and(|x| x >= 0.0),
                "{kind}.{key}: {report}"
            );
        }
        assert!(f["p50_ms"].as_f64() <= f["p99_ms"].as_f64(), "{report}");
    }
    assert_eq!(report["load"]["lessons"], 60);
    let resumed = report["resumed_to_first_call"].as_u64().unwrap();
    let ended = report["ended_before_first_call"].as_u64().unwrap();
    // Every unfinished run resumes: none ends before its first call.
    assert_eq!((resumed, ended), (25, 0), "{report}");
    for key in ["resume_seconds", "start_seconds"] {
        assert!(
            report[key].as_f64().is_some_and(|x| x >= 0.0),
            "{key}: {report}"
        );
    }
}
