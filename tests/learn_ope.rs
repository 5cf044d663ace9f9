//! Off-policy evaluation and distillation on a real experience log: a learning simulation's
//! log and policy go through the store (as the actors persist them), come back after a
//! "restart", and are evaluated.

use std::path::PathBuf;

use hindsight::ExperienceTuple;
use hindsight::learn::bandit::{Policy, PolicySnapshot};
use hindsight::learn::distill::{EvaluationConfig, evaluate_log};
use hindsight::learn::ope::Objective;
use hindsight::store::{Durability, KvTable, Store, StoreOptions};
use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::workload::{record_of, sim_task, summarize};
use hindsight_actors::runtime::RuntimeOptions;

#[tokio::test]
async fn the_log_and_the_policy_survive_a_restart_and_are_evaluated() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/envs/bank_statements.toml");
    let env = SimEnv::load(&path).unwrap();
    let mut opts = RuntimeOptions::new("", env.clone());
    opts.seed = 4;
    let mut local = hindsight_actors::app::bench::core_runner(&env, opts).unwrap();
    let mut records = Vec::new();
    for i in 0..600 {
        let task = sim_task(&env, 4, i);
        let outcome = local.run(task.clone()).await.unwrap();
        records.push(record_of(&env, i, &task, &outcome));
    }
    let report = summarize(&env, &records, 0);
    let log = local.experiences().to_vec();
    let policy = local.planner().policy.clone();

    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(
            dir.path(),
            StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        for t in &log {
            store.append_experience(t.clone()).await.unwrap();
        }
        store
            .put(KvTable::new("test_snapshots"), "policy", &policy.snapshot())
            .await
            .unwrap();
    }
    // Restart: a new store handle on the same directory.
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let back: Vec<ExperienceTuple> = store
        .experience_all()
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.unwrap())
        .collect();
    assert_eq!(back, log);
    let snap: PolicySnapshot = store
        .get(KvTable::new("test_snapshots"), "policy")
        .unwrap()
        .unwrap();
    let live = Policy::restore(snap).unwrap();
    assert_eq!(live.snapshot(), policy.snapshot());
    let (mut r1, mut r2) = (fastrand::Rng::with_seed(1), fastrand::Rng::with_seed(1));
    let f = &records[0].features;
    assert_eq!(live.choose(f, &mut r1), policy.choose(f, &mut r2));

    // The trace's rows carry no steps, so they are evaluated on what each run earned.
    let cfg = EvaluationConfig {
        objective: Objective::Realized,
        ..EvaluationConfig::default()
    };
    let eval = evaluate_log(&back, Some(&live), &cfg);
    assert_eq!(eval.rows, 600);
    assert_eq!(eval.skipped, 0);
    assert_eq!(eval.holdout_rows, 180);
    let names: Vec<&str> = eval.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["live", "greedy", "ranker"]);
    for p in &eval.policies {
        for e in [p.ips, p.snips, p.dr] {
            assert!(e.value.is_finite() && e.std_err.is_finite(), "{p:?}");
        }
    }
    // The live policy at the end of the log is close to what the log earned (it mostly
    // exploits by then), and well above a random policy.
    let live_dr = eval.policies[0].dr.value;
    assert!(
        (live_dr - eval.logged_mean_reward).abs() < 0.1,
        "live {live_dr} vs logged {}",
        eval.logged_mean_reward
    );
    assert!(live_dr > report.random_mean_reward, "{live_dr}");
    let decision = eval.promotion.clone().expect("a live policy was given");
    let cmp = eval.ranker_vs_greedy.expect("compared");
    assert_eq!(
        decision.promote,
        cmp.candidate.effective_n >= cfg.min_effective_n
            && cmp.diff - cfg.z * cmp.diff_se >= -cfg.margin,
        "{decision:?} {cmp:?}"
    );
}
