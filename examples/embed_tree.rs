//! Embedding the hindsight supervision tree inside your own application: your own root
//! supervisor (one_for_one) runs one actor of your own (an auditor) and, next to it, the whole
//! hindsight tree as a nested supervisor. Tasks of the simulated bank-statements environment are
//! submitted straight to the tree's orchestrator; every outcome is handed to the auditor, which
//! persists it in a table of its own in the same store. Then everything stops in order: the
//! policy is flushed, the hindsight subtree is terminated (its orchestrator first), and the
//! auditor, started first, stops last.
//!
//! Your own actor here is a [`Plugin`] hosted by hindsight's [`PluginHost`] (a ractor actor):
//! the root package of hindsight does not depend on `ractor`, so this example cannot implement
//! `ractor::Actor` itself. In an application that depends on `ractor`, pass any actor of yours
//! to `ChildSpec::actor(id, None, || (MyActor, args))` exactly the same way.
//!
//! Run it with `cargo run --example embed_tree`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hindsight::learn::adaptive::AdaptiveConfig;
use hindsight::learn::bandit::PolicyConfig;
use hindsight::learn::distill::DistillConfig;
use hindsight::learn::sop::SopConfig;
use hindsight::run::workflow::Workflow;
use hindsight::store::{Durability, KvTable, Store, StoreOptions};
use hindsight::tools::sim::SimEnv;
use hindsight::tools::{ToolRegistry, ToolRunner, VirtualClock};
use hindsight_actors::app::workload::sim_task;
use hindsight_actors::directory::Slot;
use hindsight_actors::idempotency::StoreIdempotency;
use hindsight_actors::orchestrator::OrchestratorMsg;
use hindsight_actors::plugin::{
    Plugin, PluginArgs, PluginError, PluginFactory, PluginHost, PluginMsg, RunReport, Verdict,
};
use hindsight_actors::policy::PolicyMsg;
use hindsight_actors::reflect_retry::{ReflectRetryConfig, default_validator};
use hindsight_actors::run::RunOutcome;
use hindsight_actors::supervisor::{
    ChildSpec, ChildState, Strategy, Supervisor, SupervisorOptions,
};
use hindsight_actors::tree::{self, TreeConfig, TreeSpec};
use serde::{Deserialize, Serialize};

/// Any error of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The auditor's own table in the shared store.
const AUDIT: KvTable = KvTable::new("example_audit");

/// How long a submitted task may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// One line of the audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditLine {
    /// Whether the run passed.
    pub passed: bool,
    /// The ReflectRetry round that closed it.
    pub round: u32,
}

/// The application's own actor behaviour: records every outcome it is told about.
struct Auditor {
    store: Store,
    /// Lines recorded, reloaded from the store at every (re)start.
    recorded: u64,
}

impl Plugin for Auditor {
    fn name(&self) -> &str {
        "auditor"
    }

    async fn after_run(&mut self, report: &RunReport) -> Result<Verdict, PluginError> {
        let line = AuditLine {
            passed: report.passed,
            round: report.round,
        };
        // Keyed by run: a message handled twice (re-sent after a crash) writes the same line.
        self.store.put(AUDIT, &report.run_id, &line).await?;
        self.recorded += 1;
        Ok(Verdict::Accept)
    }
}

/// The auditor's child spec: a plugin host that publishes itself in `slot` at every start.
fn auditor_spec(store: Store, slot: Arc<Slot<PluginMsg>>) -> ChildSpec {
    let factory: PluginFactory<Auditor> = Arc::new(move || {
        let store = store.clone();
        Box::pin(async move {
            let recorded = store.scan::<AuditLine>(AUDIT)?.len() as u64;
            Ok(Auditor { store, recorded })
        })
    });
    ChildSpec::actor("auditor", None, move || {
        (
            PluginHost::<Auditor>::default(),
            PluginArgs {
                factory: factory.clone(),
                slot: slot.clone(),
                chaos: None,
            },
        )
    })
}

/// One task's outcome as the example prints it.
#[derive(Debug, Clone)]
pub struct TaskLine {
    /// The task.
    pub task_id: String,
    /// Its run.
    pub run_id: String,
    /// The terminal state.
    pub state: String,
    /// Whether it passed.
    pub passed: bool,
    /// `tool/strategy` per stage of the first plan.
    pub plan: Vec<String>,
    /// Attempts made.
    pub attempts: u32,
    /// The reward.
    pub reward: f64,
}

/// What the example did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// One line per task, in submission order.
    pub tasks: Vec<TaskLine>,
    /// The root's children (id, state) after the hindsight subtree was terminated.
    pub children_after_terminate: Vec<(String, String)>,
    /// The audit lines found in the store at the end.
    pub audited: Vec<(String, AuditLine)>,
}

/// The simulated environment shipped in `config/envs/`.
pub fn bank_statements() -> Result<SimEnv, BoxError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envs/bank_statements.toml");
    Ok(SimEnv::load(&path)?)
}

/// Builds the hindsight tree on `env` over `store` (what `Runtime::start` does, by hand).
fn build_tree(store: &Store, env: &SimEnv, seed: u64) -> Result<tree::Tree, BoxError> {
    let env = env.clone().with_seed(seed);
    let mut registry = ToolRegistry::new();
    for tool in env.tools() {
        registry.register(tool)?;
    }
    let registry = Arc::new(registry);
    let workflow = Arc::new(Workflow::from_sim(&env, &registry)?);
    let policy = workflow.policy(PolicyConfig::default())?;
    // Simulated tools report virtual latency, so backoff waits are virtual too.
    let runner = Arc::new(
        ToolRunner::new(registry, Arc::new(VirtualClock::new()), seed)
            .with_idempotency(Arc::new(StoreIdempotency::new(store.clone()))),
    );
    Ok(tree::build(TreeSpec {
        journal: None,
        store: store.clone(),
        workflow,
        runner,
        models: hindsight::model::Models::new(),
        policy,
        seed,
        config: TreeConfig::default(),
        reflect_retry: ReflectRetryConfig::default(),
        validator: default_validator(),
        // Plugins hosted by the tree itself (`PluginSpec::from_fn("name", || MyPlugin)`) see
        // every run's events as they happen; the auditor here is an actor of the application's.
        plugins: Vec::new(),
        faults: None,
        sop: SopConfig::default(),
        adaptive: AdaptiveConfig::default(),
        // Lessons derived offline; `Some(Arc::new(ModelSynthesiser::new(model)))` asks a model.
        synthesiser: None,
        verifier: None,
        distill: DistillConfig::default(),
        max_restarts: 20,
        restart_period: Duration::from_secs(5),
        // Every learning mechanism on.
        ablate: Default::default(),
    }))
}

/// Starts the application under its own root supervisor with data in `data_dir`, runs `tasks`
/// tasks, and stops it in order.
pub async fn demo(data_dir: &Path, tasks: u64) -> Result<Summary, BoxError> {
    let store = Store::open(
        data_dir,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )?;
    let env = bank_statements()?;
    let seed = 7;
    let tree = build_tree(&store, &env, seed)?;
    let ctx = tree.ctx.clone();

    // The application's root: its own actor first, then the hindsight tree nested.
    let audit_slot = Arc::new(Slot::<PluginMsg>::new("auditor"));
    let children = vec![
        auditor_spec(store.clone(), audit_slot.clone()),
        Supervisor::child_spec("hindsight", tree.options, tree.children),
    ];
    let options = SupervisorOptions::new(Strategy::OneForOne)
        .label("my-app")
        .intensity(10, Duration::from_secs(10));
    let (root, join) = Supervisor::spawn(None, options, children)
        .await
        .map_err(|e| format!("the application could not start: {e}"))?;
    println!("started my-app: auditor + hindsight (nested supervisor)");
    for child in Supervisor::which_children(&root).await? {
        println!(
            "  child {:<10} {:?} {:?}",
            child.id, child.kind, child.state
        );
    }

    let mut lines = Vec::new();
    for index in 0..tasks {
        let task = sim_task(&env, seed, index);
        // What `Runtime::orchestrate` does: a Submit to the orchestrator, answered at the run's end.
        let outcome: RunOutcome = ctx
            .dir
            .orchestrator
            .call_with_timeout(
                |reply| OrchestratorMsg::Submit {
                    task: Box::new(task.clone()),
                    plan: None,
                    reply,
                },
                RUN_TIMEOUT,
            )
            .await??;
        let report = Arc::new(RunReport {
            run_id: outcome.run_id.clone(),
            round: outcome.reflect_retries + 1,
            passed: outcome.passed,
            events: Vec::new(),
        });
        audit_slot
            .call(|reply| PluginMsg::AfterRun(report.clone(), reply))
            .await?;
        let line = TaskLine {
            task_id: outcome.task_id.clone(),
            run_id: outcome.run_id.clone(),
            state: outcome.state.to_string(),
            passed: outcome.passed,
            plan: outcome
                .arms
                .iter()
                .map(|a| format!("{}/{}", a.tool, a.strategy))
                .collect(),
            attempts: outcome.attempts,
            reward: outcome.reward,
        };
        println!(
            "{:<20} {:<10} attempts {} reward {:.3} plan {}",
            line.task_id,
            line.state,
            line.attempts,
            line.reward,
            line.plan.join(" -> ")
        );
        lines.push(line);
    }

    // Stop in order: persist the policy, then the hindsight subtree (its children stop in reverse
    // start order, the orchestrator first), then the rest of the application.
    ctx.dir
        .policy
        .call(|reply| PolicyMsg::Flush { reply })
        .await?
        .map_err(|e| format!("the policy could not be flushed: {e}"))?;
    Supervisor::terminate_child(&root, "hindsight")
        .await?
        .map_err(|e| format!("the hindsight subtree did not stop: {e}"))?;
    let children_after_terminate: Vec<(String, String)> = Supervisor::which_children(&root)
        .await?
        .into_iter()
        .map(|c| {
            let state = match c.state {
                ChildState::Running => "running",
                ChildState::Restarting => "restarting",
                ChildState::Terminated => "terminated",
            };
            (c.id, state.to_string())
        })
        .collect();
    println!("after terminating the hindsight subtree: {children_after_terminate:?}");
    root.stop(Some("shutdown".to_string()));
    join.await?;
    println!("my-app stopped");

    let mut audited = Vec::new();
    for (run_id, line) in store.scan::<AuditLine>(AUDIT)? {
        audited.push((run_id, line?));
    }
    println!(
        "the auditor recorded {} runs, {} passed",
        audited.len(),
        audited.iter().filter(|(_, l)| l.passed).count()
    );
    Ok(Summary {
        tasks: lines,
        children_after_terminate,
        audited,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    demo(dir.path(), 8).await?;
    Ok(())
}
