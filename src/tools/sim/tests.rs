//! Unit tests of the simulator: parsing, expected rewards against hand computation, the oracle
//! and random baseline of bank_statements, seeded draws.

use std::collections::BTreeMap;

use super::*;
use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::tools::tool::CallContext;

const TINY: &str = r#"
name = "tiny"
goal = "Do {kind}"
sla_ms = 1000

[reward]
success = 1.0
latency = 0.2
cost = 0.1
max_cost = 0.1

[features]
kind = { values = ["a", "b"], weights = [1, 3] }

[[stage]]
name = "s1"

[[stage.arm]]
tool = "t1"
strategy = "fast"
cost = 0.02
latency_ms = 200
p_success = 0.9
p_valid = 0.8
errors = { Timeout = 1 }

[[stage.arm.when]]
match = { kind = "b" }
p_success = 0.5

[[stage.arm.when]]
match = { kind = "b" }
p_success = 0.0

[[stage.arm]]
tool = "t2"
strategy = "slow"
cost = 0.05
latency_ms = 600
p_success = 1.0
errors = { DeterministicFailure = 1 }

[[stage]]
name = "s2"

[[stage.arm]]
tool = "t3"
strategy = "x"
params = { mode = "x" }
cost = 0.01
latency_ms = 100
p_success = 0.95
errors = { SchemaMismatch = 1 }

[[stage.arm]]
tool = "t3"
strategy = "y"
params = { mode = "y" }
cost = 0.1
latency_ms = 1000
p_success = 1.0
p_valid = 0.9
errors = { SchemaMismatch = 1 }

[infra]
p_fault = 0.1
errors = { TransientNetwork = 1 }

[[drift]]
after_task = 10
stage = "s1"
tool = "t2"
strategy = "slow"
p_success = 0.5
"#;

fn tiny() -> SimEnv {
    SimEnv::parse(TINY, "tiny.toml").unwrap()
}

fn feats(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn plan(p: &[(&str, &str)]) -> Plan {
    p.iter()
        .map(|(t, s)| (t.to_string(), s.to_string()))
        .collect()
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn tiny_expected_rewards_match_hand_computation() {
    let env = tiny();
    let a = feats(&[("kind", "a")]);
    // P(pass) = 0.9*0.8*0.95; L0 = 300 -> 0.2*0.3; C0 = 0.03 -> 0.1*0.3.
    let fx = 0.9 * 0.8 * 0.95 * (1.0 - 0.06 - 0.03);
    // L0 = 1200 and C0 = 0.12 are both past their caps: 1 - 0.2 - 0.1.
    let fy = 0.9 * 0.8 * 0.9 * 0.7;
    // L0 = 700 -> 0.14; C0 = 0.06 -> 0.06.
    let sx = 0.95 * 0.8;
    let sy = 0.9 * 0.7;
    close(
        env.expected_reward(0, &a, &plan(&[("t1", "fast"), ("t3", "x")]))
            .unwrap(),
        fx,
    );
    close(
        env.expected_reward(0, &a, &plan(&[("t1", "fast"), ("t3", "y")]))
            .unwrap(),
        fy,
    );
    close(
        env.expected_reward(0, &a, &plan(&[("t2", "slow"), ("t3", "x")]))
            .unwrap(),
        sx,
    );
    close(
        env.expected_reward(0, &a, &plan(&[("t2", "slow"), ("t3", "y")]))
            .unwrap(),
        sy,
    );
    let (best, r) = env.oracle(0, &a);
    assert_eq!(best, plan(&[("t2", "slow"), ("t3", "x")]));
    close(r, sx);
    close(env.random_baseline(0, &a), (fx + fy + sx + sy) / 4.0);

    // `when`: the first match wins (p_success 0.5, not 0.0).
    let b = feats(&[("kind", "b")]);
    close(
        env.expected_reward(0, &b, &plan(&[("t1", "fast"), ("t3", "x")]))
            .unwrap(),
        0.5 * 0.8 * 0.95 * 0.91,
    );
    // Drift from task 10 on: t2/slow succeeds half the time, so t1/fast becomes the best plan.
    close(
        env.expected_reward(10, &a, &plan(&[("t2", "slow"), ("t3", "x")]))
            .unwrap(),
        0.5 * 0.95 * 0.8,
    );
    close(
        env.expected_reward(9, &a, &plan(&[("t2", "slow"), ("t3", "x")]))
            .unwrap(),
        sx,
    );
    let (best, r) = env.oracle(10, &a);
    assert_eq!(best, plan(&[("t1", "fast"), ("t3", "x")]));
    close(r, fx);
    assert!(
        env.expected_reward(0, &a, &plan(&[("t1", "fast")]))
            .is_err()
    );
    assert!(
        env.expected_reward(0, &a, &plan(&[("t3", "x"), ("t1", "fast")]))
            .is_err()
    );
}

#[test]
fn reward_follows_the_format() {
    let env = tiny();
    close(env.reward(false, 0.0, 0.0), 0.0);
    close(env.reward(true, 500.0, 0.05), 1.0 - 0.1 - 0.05);
    close(env.reward(true, 5000.0, 5.0), 0.7);
    assert_eq!(env.reward_config().sla_ms, 1000.0);
}

fn bank() -> SimEnv {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/envs/bank_statements.toml"
    );
    SimEnv::load(std::path::Path::new(path)).unwrap()
}

#[test]
fn bank_statements_oracle_and_random_for_two_combos() {
    let env = bank();
    assert_eq!(env.plans().len(), 8);
    // pdf, 0-10MB, tenant A: no override applies.
    let f = feats(&[
        ("filetype", "pdf"),
        ("size_bucket", "0-10MB"),
        ("tenant", "A"),
    ]);
    let gross =
        |l: f64, c: f64| 1.0 - 0.2 * (l / 20000.0f64).min(1.0) - 0.1 * (c / 0.1f64).min(1.0);
    let extract = [
        (0.85 * 0.95, 3200.0, 0.012),
        (0.92 * 0.95, 1800.0, 0.008),
        (0.97 * 0.97, 400.0, 0.001),
        (0.97 * 0.99, 7000.0, 0.06),
    ];
    let normalize_a = [(0.98 * 0.99, 200.0, 0.001), (0.97 * 0.92, 350.0, 0.002)];
    let all = |ex: &[(f64, f64, f64)], no: &[(f64, f64, f64)]| -> Vec<f64> {
        let mut v = Vec::new();
        for e in ex {
            for n in no {
                v.push((e.0 * n.0 * gross(e.1 + n.1, e.2 + n.2)).clamp(0.0, 1.0));
            }
        }
        v
    };
    let v = all(&extract, &normalize_a);
    let (best, r) = env.oracle(0, &f);
    assert_eq!(
        best,
        plan(&[("pdfminer", "direct"), ("tables_v1", "strict")])
    );
    close(r, v.iter().cloned().fold(f64::MIN, f64::max));
    close(
        r,
        0.97 * 0.97 * 0.98 * 0.99 * (1.0 - 0.2 * 0.03 - 0.1 * 0.02),
    );
    close(env.random_baseline(0, &f), v.iter().sum::<f64>() / 8.0);

    // png, 50-100MB, tenant B, task 700: ocr `when`s apply, pdfminer is png-unfit and then
    // drifted (drift applies after `when`: p_success 0.15), strict normalizer's p_valid 0.55.
    let f = feats(&[
        ("filetype", "png"),
        ("size_bucket", "50-100MB"),
        ("tenant", "B"),
    ]);
    let extract = [
        (0.90 * 0.95, 9000.0, 0.012),
        (0.25 * 0.95, 15000.0, 0.008),
        (0.15 * 0.97, 400.0, 0.001),
        (0.97 * 0.99, 7000.0, 0.06),
    ];
    let normalize_b = [(0.98 * 0.55, 200.0, 0.001), (0.97 * 0.92, 350.0, 0.002)];
    let v = all(&extract, &normalize_b);
    let (best, r) = env.oracle(700, &f);
    assert_eq!(
        best,
        plan(&[("vision_llm", "page_by_page"), ("tables_v2", "lenient")])
    );
    close(r, v.iter().cloned().fold(f64::MIN, f64::max));
    close(env.random_baseline(700, &f), v.iter().sum::<f64>() / 8.0);
    // Before the drift, pdfminer on png is at its `when` value 0.02.
    let n = env
        .numbers("extract", "pdfminer", "direct", 10, &f)
        .unwrap();
    close(n.p_success, 0.02);
    assert_eq!(n.errors, vec![(ErrorClass::ToolNotFit, 1.0)]);
}

/// The one-pass baselines give, to the bit, what every plan built and scored one by one gives
/// (`plans()` and `expected_reward`), on every shipped environment: `when`s, drift, ties and
/// three to five stages.
#[test]
fn baselines_are_the_brute_force_ones_to_the_bit() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/envs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        // The agent environments (AGENT-FORMAT.md) share the directory.
        .filter(|p| agent::AgentEnv::load(p).is_err())
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for file in files {
        let env = SimEnv::load(&file).unwrap().with_seed(3);
        let plans = env.plans();
        for index in [0, 599, 700, 999] {
            let task = env.draw_task(3, index);
            let f = &task.features;
            let values: Vec<f64> = plans
                .iter()
                .map(|p| env.expected_reward(index, f, p).unwrap())
                .collect();
            let (mut best, mut best_i) = (f64::NEG_INFINITY, 0);
            for (i, v) in values.iter().enumerate() {
                if *v > best {
                    (best, best_i) = (*v, i);
                }
            }
            let b = env.baselines(index, f);
            let at = format!("{} task {index}", file.display());
            assert_eq!(b.oracle.to_bits(), best.to_bits(), "{at}");
            assert_eq!(b.oracle_plan, plans[best_i], "{at}");
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            assert_eq!(b.random.to_bits(), mean.to_bits(), "{at}");
        }
    }
}

/// Tasks with the same numbers in force share one walk over the plans, and what they share is
/// what a walk of their own would give, to the bit, on both sides of the drift point.
#[test]
fn tasks_with_the_same_numbers_share_one_walk() {
    let env = bank().with_seed(5);
    let mut combos = std::collections::BTreeSet::new();
    for index in 0..1000 {
        let f = env.draw_task(5, index).features;
        let b = env.baselines(index, &f);
        // A fresh parse has an empty memo: its answer is a walk of this task's own.
        let own = bank().baselines(index, &f);
        assert_eq!(b, own, "task {index}");
        combos.insert((f, index >= 600));
    }
    let walks = env.memo.walks();
    assert!(
        walks <= combos.len() as u64,
        "{walks} walks, {} combinations",
        combos.len()
    );
    assert!(walks < 100, "{walks} walks for 1000 tasks");
    // The drift changes the baselines of the tasks it applies to: those are walked again.
    let f = feats(&[
        ("filetype", "pdf"),
        ("size_bucket", "0-10MB"),
        ("tenant", "B"),
    ]);
    let before = env.baselines(599, &f);
    let after = env.baselines(600, &f);
    assert_eq!(after, bank().baselines(600, &f));
    assert_ne!(before, after);
}

/// Ten arms in each of six stages are a million plans: the baselines walk them without
/// building one (the plan list alone would take about a gigabyte).
#[test]
fn a_million_plans_are_scored_without_building_them() {
    let mut text = String::from(
        "name = \"big\"\ngoal = \"g {f}\"\nsla_ms = 20000\n[features]\nf = { values = [\"x\", \"y\"] }\n",
    );
    for s in 0..6 {
        text.push_str(&format!("[[stage]]\nname = \"s{s}\"\n"));
        for a in 0..10 {
            // Arm 7 is the best everywhere; in stage 2 arm 3 ties with it (the first wins).
            let p = if a == 7 || (s == 2 && a == 3) {
                0.99
            } else {
                0.5 + a as f64 / 100.0
            };
            text.push_str(&format!(
                "[[stage.arm]]\ntool = \"t{a}\"\nstrategy = \"k\"\ncost = 0.001\nlatency_ms = 100\np_success = {p}\nerrors = {{ Timeout = 1 }}\n"
            ));
        }
    }
    let env = SimEnv::parse(&text, "big.toml").unwrap();
    let f = feats(&[("f", "x")]);
    let b = env.baselines(0, &f);
    let want: Plan = (0..6)
        .map(|s| {
            (
                if s == 2 { "t3" } else { "t7" }.to_string(),
                "k".to_string(),
            )
        })
        .collect();
    assert_eq!(b.oracle_plan, want);
    assert_eq!(b.oracle, env.expected_reward(0, &f, &want).unwrap());
    // The mean of a product of independent stages is the product of the stages' means, up to
    // the latency and cost penalty, which is the same for every plan here.
    let stage_mean = |s: usize| -> f64 {
        (0..10)
            .map(|a| {
                if a == 7 || (s == 2 && a == 3) {
                    0.99
                } else {
                    0.5 + a as f64 / 100.0
                }
            })
            .sum::<f64>()
            / 10.0
    };
    let gross = 1.0 - 0.2 * (600.0 / 20000.0) - 0.1 * (0.006 / 0.1);
    let want_mean = (0..6).map(stage_mean).product::<f64>() * gross;
    close(b.random, want_mean);
}

#[test]
fn draw_task_follows_weights_and_is_seeded() {
    let env = bank();
    assert_eq!(env.draw_task(7, 3), env.draw_task(7, 3));
    let t = env.draw_task(7, 3);
    assert!(t.goal.contains(&t.features["tenant"]));
    assert!(!t.goal.contains('{'));
    let n = 4000;
    let pdf = (0..n)
        .filter(|i| env.draw_task(1, *i).features["filetype"] == "pdf")
        .count() as f64;
    assert!(
        (pdf / n as f64 - 0.75).abs() < 0.03,
        "pdf share {}",
        pdf / n as f64
    );
    let differs = (0..50).any(|i| env.draw_task(1, i) != env.draw_task(2, i));
    assert!(differs);
}

fn ctx(
    stage: &str,
    task: u64,
    attempt: u32,
    call: u32,
    f: &BTreeMap<String, String>,
) -> CallContext {
    CallContext {
        run_id: "r".into(),
        task_index: task,
        attempt,
        stage: stage.into(),
        call,
        features: f.clone(),
        turn: 0,
        input: None,
        tenant: None,
    }
}

#[tokio::test]
async fn tool_calls_are_seeded_and_follow_the_odds() {
    let env = tiny().with_seed(42);
    let tools = env.tools();
    let names: Vec<_> = tools.iter().map(|t| t.spec().name.clone()).collect();
    assert_eq!(names, ["t1", "t2", "t3"]);
    let t1 = &tools[0];
    let a = feats(&[("kind", "a")]);
    let args = serde_json::json!({"strategy": "fast"});
    let once = t1.call(args.clone(), &ctx("s1", 3, 0, 0, &a)).await;
    let again = t1.call(args.clone(), &ctx("s1", 3, 0, 0, &a)).await;
    assert_eq!(once, again);

    let n = 4000u32;
    let (mut infra, mut own, mut ok, mut valid) = (0, 0, 0, 0);
    let mut latencies = Vec::new();
    for i in 0..n {
        match t1
            .call(args.clone(), &ctx("s1", u64::from(i), 0, 0, &a))
            .await
        {
            Ok(out) => {
                ok += 1;
                assert_eq!(out.cost, 0.02);
                latencies.push(out.latency_ms);
                if env.validate("s1", &out.value).is_ok() {
                    valid += 1;
                } else {
                    let why = env.validate("s1", &out.value).unwrap_err();
                    assert!(why.contains("stage `s1`"), "{why}");
                }
            }
            Err(e) if e.category == FailureCategory::Infrastructure => {
                assert_eq!(e.class, ErrorClass::TransientNetwork);
                infra += 1;
            }
            Err(e) => {
                // The arm's own Timeout is the arm's fault.
                assert_eq!(
                    (e.class, e.category),
                    (ErrorClass::Timeout, FailureCategory::Strategy)
                );
                assert!(e.latency_ms > 0.0);
                own += 1;
            }
        }
    }
    let nf = f64::from(n);
    assert!((f64::from(infra) / nf - 0.1).abs() < 0.02, "infra {infra}");
    assert!((f64::from(own) / nf - 0.9 * 0.1).abs() < 0.02, "own {own}");
    assert!(
        (f64::from(valid) / f64::from(ok) - 0.8).abs() < 0.03,
        "valid {valid}/{ok}"
    );
    latencies.sort_by(f64::total_cmp);
    let median = latencies[latencies.len() / 2];
    assert!((median - 200.0).abs() < 10.0, "median {median}");
}

#[tokio::test]
async fn tool_rejects_bad_strategy_stage_and_params() {
    let env = tiny();
    let tools = env.tools();
    let t3 = &tools[2];
    let a = feats(&[("kind", "a")]);
    let c = ctx("s2", 0, 0, 0, &a);
    let e = t3
        .call(serde_json::json!({"strategy": "z"}), &c)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::SchemaMismatch);
    let e = t3
        .call(serde_json::json!({"strategy": "x", "mode": "y"}), &c)
        .await
        .unwrap_err();
    assert!(e.message.contains("mode"), "{}", e.message);
    let e = t3
        .call(
            serde_json::json!({"strategy": "x"}),
            &ctx("s1", 0, 0, 0, &a),
        )
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::ToolNotFit);
    let e = t3
        .call(
            serde_json::json!({"strategy": "x"}),
            &ctx("nope", 0, 0, 0, &a),
        )
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    // No stage in the context: the only stage with that arm; no features: drawn from the seed.
    let c = ctx("", 0, 0, 0, &BTreeMap::new());
    let r = t3
        .call(serde_json::json!({"strategy": "y", "mode": "y"}), &c)
        .await;
    if let Ok(out) = r {
        assert_eq!(out.value["stage"], "s2");
    }
    assert_eq!(
        tools[0].spec().input_schema["properties"]["strategy"]["enum"][0],
        "fast"
    );
}

/// The failures of `n` calls of stage `s1`'s arm `t1`/`fast` for a task of kind `a`, tasks
/// 0 to `n - 1`, first attempt.
async fn fast_failures(env: &SimEnv, n: u32) -> Vec<crate::tools::tool::ToolError> {
    let tools = env.tools();
    let a = feats(&[("kind", "a")]);
    let args = serde_json::json!({"strategy": "fast"});
    let mut out = Vec::new();
    for i in 0..n {
        if let Err(e) = tools[0]
            .call(args.clone(), &ctx("s1", u64::from(i), 0, 0, &a))
            .await
        {
            out.push(e);
        }
    }
    out
}

/// FORMAT.md makes `[infra]` optional and lets an arm set `p_infra`: a file with the one and
/// without the other runs, its arm's faults drawn from the classes of FORMAT.md's example (as
/// are those of an `[infra]` with a `p_fault` and no `errors`), rather than being refused.
#[tokio::test]
async fn an_arms_infrastructure_faults_need_no_infra_table() {
    let (start, end) = (
        TINY.find("[infra]").unwrap(),
        TINY.find("[[drift]]").unwrap(),
    );
    let no_table = format!(
        "{}{}",
        &TINY[..start].replace("p_valid = 0.8\n", "p_valid = 0.8\np_infra = 0.5\n"),
        &TINY[end..]
    );
    let no_classes = TINY.replace("errors = { TransientNetwork = 1 }\n", "");
    for (text, p_fault) in [(no_table, 0.5), (no_classes, 0.1)] {
        let env = SimEnv::parse(&text, "infra.toml")
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
            .with_seed(7);
        let n = 2000u32;
        let mut classes = BTreeMap::new();
        for e in fast_failures(&env, n).await {
            if e.category == FailureCategory::Infrastructure {
                *classes.entry(format!("{:?}", e.class)).or_insert(0u32) += 1;
            }
        }
        let faults: u32 = classes.values().sum();
        assert!(
            (f64::from(faults) / f64::from(n) - p_fault).abs() < 0.04,
            "{faults} faults in {n} calls, expected about {p_fault}: {classes:?}"
        );
        let keys: Vec<&String> = classes.keys().collect();
        assert_eq!(keys, ["RateLimit", "TransientNetwork"], "{classes:?}");
        assert!(
            classes["TransientNetwork"] > classes["RateLimit"],
            "{classes:?}"
        );
    }
}

/// A feature's values may be numbers or booleans as well as strings: tasks carry them as TOML
/// writes them, and `match` compares them the same way; a value given twice is refused.
#[test]
fn feature_values_may_be_numbers_or_booleans() {
    let text = TINY
        .replace(
            "kind = { values = [\"a\", \"b\"], weights = [1, 3] }",
            "kind = { values = [\"a\", \"b\"], weights = [1, 3] }\nsize = { values = [10, 2.5] }\nurgent = { values = [true, false] }",
        )
        .replace(
            "match = { kind = \"b\" }\np_success = 0.5",
            "match = { size = 10, urgent = true }\np_success = 0.5",
        )
        .replace("goal = \"Do {kind}\"", "goal = \"Do {kind} of {size} MB\"");
    let env = SimEnv::parse(&text, "typed.toml").unwrap_or_else(|e| panic!("{e}"));
    let task = env.draw_task(1, 0);
    let size = task.features["size"].clone();
    assert!(["10", "2.5"].contains(&size.as_str()), "{size}");
    assert!(
        task.goal.ends_with(&format!("of {size} MB")),
        "{}",
        task.goal
    );
    let p = |size: &str, urgent: &str| {
        env.expected_reward(
            0,
            &feats(&[("kind", "a"), ("size", size), ("urgent", urgent)]),
            &plan(&[("t1", "fast"), ("t3", "x")]),
        )
        .unwrap()
    };
    assert!(
        p("10", "true") < p("10", "false"),
        "the `when` applies to size 10, urgent"
    );
    assert_eq!(p("2.5", "true"), p("10", "false"));
    rejects(
        &text.replace(
            "match = { size = 10, urgent = true }",
            "match = { size = 11 }",
        ),
        "stage[0].arm[0].when[0].match.size",
    );
    rejects(
        &text.replace("values = [10, 2.5]", "values = [10, \"10\"]"),
        "features.size.values[1]",
    );
    rejects(
        &text.replace("values = [10, 2.5]", "values = [[10], 2.5]"),
        "features.size.values[0]",
    );
}

/// An arm's own failure is the arm's fault whatever its class: a `RateLimit` or
/// `TransientNetwork` among its `errors` is part of `1 - p_success`, which the oracle counts
/// against it, so it must reach the policy as `Strategy`, not be dropped as infrastructure.
#[tokio::test]
async fn an_arms_own_transient_classes_are_its_own_fault() {
    let text = TINY
        .replace(
            "errors = { Timeout = 1 }",
            "errors = { RateLimit = 1, TransientNetwork = 1 }",
        )
        .replace("p_fault = 0.1", "p_fault = 0.0");
    let env = SimEnv::parse(&text, "own.toml").unwrap().with_seed(3);
    let mut own = BTreeMap::new();
    for e in fast_failures(&env, 1000).await {
        assert_eq!(e.category, FailureCategory::Strategy, "{e:?}");
        *own.entry(format!("{:?}", e.class)).or_insert(0u32) += 1;
    }
    let keys: Vec<&String> = own.keys().collect();
    assert_eq!(keys, ["RateLimit", "TransientNetwork"], "{own:?}");
    let n: u32 = own.values().sum();
    assert!(
        (f64::from(n) / 1000.0 - 0.1).abs() < 0.03,
        "{n} own failures"
    );
}

#[test]
fn validate_names_stage_and_reason() {
    let env = tiny();
    assert!(
        env.validate("s1", &serde_json::json!([]))
            .unwrap_err()
            .contains("s1")
    );
    let e = env
        .validate(
            "s1",
            &serde_json::json!({"stage": "s2", "rows": [[0, "x", 0]]}),
        )
        .unwrap_err();
    assert!(e.contains("s2"), "{e}");
}

fn rejects(text: &str, key: &str) {
    match SimEnv::parse(text, "bad.toml") {
        Err(SimError::Key {
            file,
            key: k,
            expected,
        }) => {
            assert_eq!(file, "bad.toml");
            assert_eq!(k, key, "expected: {expected}");
            assert!(!expected.is_empty());
        }
        other => panic!("expected a key error at {key}, got {other:?}"),
    }
}

#[test]
fn parse_errors_name_file_key_and_expectation() {
    rejects(&TINY.replace("sla_ms = 1000", ""), "sla_ms");
    rejects(
        &TINY.replace("p_success = 0.9\n", "p_success = 1.9\n"),
        "stage[0].arm[0].p_success",
    );
    rejects(
        &TINY.replace("errors = { Timeout = 1 }", "errors = { Slow = 1 }"),
        "stage[0].arm[0].errors.Slow",
    );
    rejects(
        &TINY.replace(
            "match = { kind = \"b\" }\np_success = 0.5",
            "match = { colour = \"b\" }\np_success = 0.5",
        ),
        "stage[0].arm[0].when[0].match.colour",
    );
    rejects(
        &TINY.replace(
            "errors = { TransientNetwork = 1 }",
            "errors = { NotFound = 1 }",
        ),
        "infra.errors.NotFound",
    );
    rejects(
        &TINY.replace(
            "strategy = \"slow\"\np_success = 0.5",
            "strategy = \"fast2\"\np_success = 0.5",
        ),
        "drift[0].strategy",
    );
    rejects(
        &TINY.replace("weights = [1, 3]", "weights = [1]"),
        "features.kind.weights",
    );
    rejects(
        &TINY.replace("goal = \"Do {kind}\"", "goal = \"Do {size}\""),
        "goal",
    );
    rejects(
        &TINY.replace("sla_ms = 1000", "sla_ms = 1000\ncolour = 1"),
        "colour",
    );
    let one_arm = TINY
        .split("[[stage.arm]]\ntool = \"t2\"")
        .next()
        .unwrap()
        .to_string()
        + "[[stage]]\nname = \"s2\"\n";
    rejects(&one_arm, "stage[0].arm");
    match SimEnv::parse("name = ", "broken.toml") {
        Err(SimError::Toml { file, .. }) => assert_eq!(file, "broken.toml"),
        other => panic!("{other:?}"),
    }
    match SimEnv::load(std::path::Path::new("/nonexistent/env.toml")) {
        Err(SimError::Io { file, .. }) => assert!(file.contains("env.toml")),
        other => panic!("{other:?}"),
    }
}

/// The file deserializes before it is checked: an unknown key anywhere and a value of the wrong
/// type are refused with their dotted path; a TOML integer stands for a number.
#[test]
fn unknown_keys_and_wrong_types_are_named_with_their_path() {
    rejects(
        &TINY.replacen(
            "strategy = \"slow\"\n",
            "strategy = \"slow\"\nbogus = 1\n",
            1,
        ),
        "stage[0].arm[1].bogus",
    );
    rejects(
        &TINY.replace(
            "match = { kind = \"b\" }\np_success = 0.5",
            "match = { kind = \"b\" }\np_sucess = 0.5",
        ),
        "stage[0].arm[0].when[0].p_sucess",
    );
    rejects(
        &TINY.replace("max_cost = 0.1", "max_cost = 0.1\nbonus = 1"),
        "reward.bonus",
    );
    rejects(
        &TINY.replace("p_success = 0.95", "p_success = \"high\""),
        "stage[1].arm[0].p_success",
    );
    rejects(
        &TINY.replace("weights = [1, 3]", "weights = [1, \"3\"]"),
        "features.kind.weights[1]",
    );
    rejects(
        &TINY.replace("after_task = 10", "after_task = 1.5"),
        "drift[0].after_task",
    );
    rejects(
        &TINY.replace("[infra]\np_fault = 0.1", "[infra]\np_fault = inf"),
        "infra.p_fault",
    );
    rejects(
        &TINY.replace("latency_ms = 600", "latency_ms = inf"),
        "stage[0].arm[1].latency_ms",
    );
    // An array is no table, though serde would read one as a struct.
    rejects(
        &TINY.replace(
            "[reward]\nsuccess = 1.0\nlatency = 0.2\ncost = 0.1\nmax_cost = 0.1",
            "reward = [1.0, 0.2, 0.1, 0.1]",
        ),
        "reward",
    );
    let ints = TINY
        .replace("cost = 0.05", "cost = 0")
        .replace("p_success = 1.0", "p_success = 1");
    let env = SimEnv::parse(&ints, "ints.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(env.spec().stages[0].arms[1].numbers.cost, 0.0);
    assert_eq!(env.spec().stages[0].arms[1].numbers.p_success, 1.0);
}
