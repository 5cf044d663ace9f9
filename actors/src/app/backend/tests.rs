//! Tests of the backend: the configuration mapping, tenant namespaces, stage propensities and
//! the checks of a request's arms.

use hindsight::config::DurabilityConfig;

use super::*;

/// The runtime options of a configuration holding `sections` (its data directory a fresh one).
async fn options_of(sections: &str) -> crate::runtime::RuntimeOptions {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("data_dir = {:?}\n{sections}", dir.path());
    let config = Config::parse(&text, "test.toml").unwrap();
    let (opts, servers) = runtime_options(&config).await.unwrap();
    assert!(servers.is_empty());
    opts
}

#[tokio::test]
async fn the_learning_sections_reach_the_tree_as_read() {
    let opts = options_of(
        "seed = 9\n[policy]\npool_strength = 3.0\nstructure_prior = 1.0\npropensity_draws = 64\nchange_threshold = 8.5\nchange_threshold_up = 6.0\n[policy.choice]\nrule = \"information_directed\"\nsamples = 8\nthompson_share = 0.25\n[distill]\nevery = 50\n[adaptive]\nscope = \"per_tenant\"\ntop_k = 2\n",
    )
    .await;
    assert_eq!(opts.seed, 9);
    assert_eq!(opts.policy.pool_strength, 3.0);
    assert_eq!(opts.policy.structure_prior, 1.0);
    assert_eq!(opts.policy.propensity_draws, 64);
    assert_eq!(
        opts.policy.choice,
        hindsight::learn::bandit::ChoiceRule::InformationDirected {
            samples: 8,
            thompson_share: 0.25
        }
    );
    assert_eq!(opts.policy.change_threshold, 8.5);
    assert_eq!(opts.policy.change_threshold_up, 6.0);
    assert_eq!(opts.distill.every, 50);
    assert_eq!(
        opts.adaptive.scope,
        hindsight::learn::adaptive::ScopeMode::PerTenant
    );
    assert_eq!(opts.adaptive.top_k, 2);
}

#[tokio::test]
async fn the_daemon_and_an_embedding_program_learn_with_the_same_defaults() {
    let daemon = options_of("").await;
    let embedded =
        crate::runtime::RuntimeOptions::new("unused", crate::app::demo::load_env(None).unwrap());
    assert_eq!(daemon.policy, embedded.policy);
    assert_eq!(daemon.distill, embedded.distill);
    assert_eq!(daemon.adaptive, embedded.adaptive);
    assert_eq!(daemon.reflect_retry, embedded.reflect_retry);
}

#[tokio::test]
async fn the_triage_caps_reach_the_tree() {
    let opts = options_of("[triage]\nmax_recovery_attempts = 2\nmax_total_attempts = 4\n").await;
    assert_eq!(opts.tree.rules.max_recovery_attempts, 2);
    assert_eq!(opts.tree.rules.max_total_attempts, 4);
    let defaults = options_of("").await;
    assert_eq!(
        defaults.tree.rules.max_total_attempts,
        crate::tree::TreeConfig::default().rules.max_total_attempts
    );
}

#[tokio::test]
async fn the_daemon_applies_the_run_ttl_at_start() {
    use hindsight::{Run, RunState};
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        store: hindsight::config::StoreConfig {
            durability: DurabilityConfig::None,
            run_ttl_days: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let now = hindsight::now_ms();
        for (id, updated) in [("old", now - 2 * 86_400_000), ("recent", now - 1000)] {
            let mut run = Run::new(format!("run-{id}"), &Task::default(), updated);
            run.task_id = id.into();
            run.state = RunState::Succeeded;
            store.finish_run(&run).await.unwrap();
            store
                .put(crate::orchestrator::TASKS, id, &Task::default())
                .await
                .unwrap();
        }
    }
    let backend = Daemon::start(&config).await.unwrap();
    let store = backend.store();
    assert_eq!(store.get_run("run-old").unwrap(), None);
    assert!(store.get_run("run-recent").unwrap().is_some());
    assert_eq!(
        store
            .get::<Task>(crate::orchestrator::TASKS, "old")
            .unwrap(),
        None
    );
    backend.shutdown().await;
}

#[test]
fn namespaces_keep_tenants_apart() {
    let run = tenant_run_id("acme", "t1");
    assert!(run_in_tenant("acme", &run));
    assert!(!run_in_tenant("acm", &run));
    assert!(!run_in_tenant("globex", &run));
    assert!(scope_in_tenant("acme", "user:acme/bob"));
    assert!(scope_in_tenant("acme", "tenant:acme"));
    assert!(!scope_in_tenant("acme", "tenant:acmex"));
    assert!(!scope_in_tenant("acme", "user:acmex/bob"));
    assert!(!scope_in_tenant("acme", "shared"));
}

#[test]
fn infrastructure_classes_are_not_learned_from() {
    for class in [
        ErrorClass::Timeout,
        ErrorClass::RateLimit,
        ErrorClass::TransientNetwork,
    ] {
        assert_eq!(category_of(class), FailureCategory::Infrastructure);
    }
    assert_eq!(
        category_of(ErrorClass::SchemaMismatch),
        FailureCategory::Strategy
    );
}

#[test]
fn propensities_sum_to_one_and_favour_the_better_arm() {
    let p = stage_propensities(&[(0.9, 0.05), (0.2, 0.05), (0.5, 0.3)], 2000, 3);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    assert!(p[0] > 0.8, "{p:?}");
    assert!(p[1] < 0.01, "{p:?}");
}

#[test]
fn an_arm_the_stage_lacks_is_refused_naming_the_field_and_the_choices() {
    use hindsight::run::{WorkflowArm, WorkflowStage};
    let arm = |tool: &str, strategy: &str| WorkflowArm {
        tool: tool.into(),
        strategy: strategy.into(),
        params: Default::default(),
    };
    let stage = WorkflowStage::tools(
        "extract",
        vec![
            arm("ocr", "fast"),
            arm("ocr", "accurate"),
            arm("vision", "llm"),
        ],
    );
    assert!(check_arm(&stage, "ocr", "accurate", "").is_ok());
    let invalid = |r: BackendResult<()>| match r {
        Err(BackendError::Invalid { field, reason }) => (field, reason),
        other => panic!("expected Invalid, got {other:?}"),
    };
    let (field, reason) = invalid(check_arm(&stage, "pdf", "fast", "plan[2]."));
    assert_eq!(field, "plan[2].tool");
    assert_eq!(
        reason,
        "stage `extract` has no tool `pdf`; its tools are ocr, vision"
    );
    let (field, reason) = invalid(check_arm(&stage, "vision", "fast", ""));
    assert_eq!(field, "strategy");
    assert_eq!(
        reason,
        "tool `vision` has no strategy `fast` at stage `extract`"
    );
}

#[tokio::test]
async fn an_agents_budgets_and_its_models_price_reach_its_tree() {
    let opts = options_of(
        "[[agent]]\nname = \"a\"\ninstructions = \"i\"\nmax_tokens = 500\nmax_cost = 0.5\nmax_wall_ms = 30000\n\
         [[agent.variants]]\nname = \"v\"\nmodel = \"local\"\ntools = []\n\
         [models.local]\nprice_per_1k_prompt_tokens = 0.5\nprice_per_1k_completion_tokens = 1.5\n",
    )
    .await;
    let price = opts.models.price("local");
    assert_eq!((price.prompt_per_1k, price.completion_per_1k), (0.5, 1.5));
    let crate::runtime::WorkflowSource::Custom { stages, reward, .. } = &opts.workflow else {
        panic!("an agent's tree runs its own workflow");
    };
    let agent = stages[0].agent.as_ref().unwrap();
    assert_eq!(
        (agent.max_tokens, agent.max_cost, agent.max_wall_ms),
        (Some(500), Some(0.5), Some(30_000))
    );
    // The budgets scale the reward's cost and latency terms.
    assert_eq!((reward.max_cost, reward.sla_ms), (0.5, 30_000.0));
    let e = Config::parse(
        "[models.local]\nprice_per_1k_prompt_tokens = -1.0\n",
        "f.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("models.local.price_per_1k_prompt_tokens"), "{e}");
}
