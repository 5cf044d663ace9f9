//! `hindsight policy evaluate` as a user runs it, after a demo: the live policy the policy actor
//! persisted is evaluated next to the greedy policy and the distilled ranker, and a promotion
//! decision is made.

mod cli_support;

use std::path::Path;

use cli_support::hindsight;

use serde_json::Value;

#[test]
fn evaluate_reads_the_policy_the_tree_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/envs/bank_statements.toml");
    let out = hindsight(
        dir.path(),
        &[
            "demo",
            "--env",
            env.to_str().unwrap(),
            "--tasks",
            "200",
            "--seed",
            "5",
            "--concurrency",
            "1",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hindsight(dir.path(), &["policy", "evaluate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let eval: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eval["rows"], 200, "{eval}");
    let names: Vec<&str> = eval["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["live", "greedy", "ranker"], "{eval}");
    // The live policy logged the holdout itself: it has support on every row. It has learned
    // since it logged them, so its weights are uneven and its effective sample is a quarter to
    // a half of the holdout (33, 29, 23 and 17 of 60 in four builds whose choices differ); a
    // policy with no support there has a handful (the ranker in the first three: 3, 7 and 2).
    let holdout = eval["holdout_rows"].as_f64().unwrap();
    let live_ess = eval["policies"][0]["snips"]["effective_n"]
        .as_f64()
        .unwrap();
    assert!(holdout >= 50.0 && live_ess > 0.2 * holdout, "{eval}");
    assert!(eval["promotion"].is_object(), "{eval}");
    assert!(eval["note"].is_null(), "{eval}");

    // The table form says the same in words.
    let out = hindsight(dir.path(), &["policy", "evaluate"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("live ")), "{text}");
    assert!(!text.contains("no live policy"), "{text}");
}
