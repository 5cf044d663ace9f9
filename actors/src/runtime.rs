//! The embedding API: open the store, build the tree on a workflow, start it under a root
//! supervisor, submit tasks, and shut it down in order.

use hindsight::learn::Mechanism;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hindsight::learn::bandit::{PolicyConfig, PolicyError};
use hindsight::store::{CompactReport, Durability, Store, StoreError, StoreOptions};
use hindsight::tools::sim::{SimEnv, SimError};
use hindsight::tools::{ToolRegistry, ToolRunner};
use hindsight::{Run, Task};
use ractor::ActorRef;

use crate::chaos::ChaosHandle;
use crate::directory::CallError;
use crate::orchestrator::OrchestratorMsg;
use crate::reflect_retry::{ReflectRetryConfig, RunValidator, default_validator};
use crate::run::{RunOutcome, TreeCtx};
use crate::supervisor::{RestartStats, Supervisor, SupervisorMsg};
use crate::tree::{self, TreeConfig, TreeSpec};
use hindsight::learn::adaptive::AdaptiveConfig;
use hindsight::learn::distill::DistillConfig;
use hindsight::learn::sop::SopConfig;
use hindsight::run::workflow::{UnknownTool, Workflow};
use hindsight::tools::VirtualClock;

/// Why the runtime could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The environment file is not valid.
    #[error(transparent)]
    Env(#[from] SimError),
    /// The workflow names a tool that is not configured.
    #[error(transparent)]
    UnknownTool(#[from] UnknownTool),
    /// The policy configuration is not valid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The distillation configuration is not valid.
    #[error(transparent)]
    Distill(#[from] hindsight::learn::distill::DistillConfigError),
    /// The tree could not be started.
    #[error("the supervision tree could not start: {0}")]
    Spawn(String),
    /// An actor could not be reached.
    #[error(transparent)]
    Call(#[from] CallError),
    /// A submitted task got no outcome: refused at ingress, or its run could not be stored.
    #[error(transparent)]
    Submit(#[from] crate::orchestrator::SubmitError),
    /// The runtime could not be set up: a tool that cannot be registered, a journal or chaos
    /// plan that cannot be read, a compaction that failed.
    #[error("{0}")]
    Setup(String),
    /// The caller asked for something this cannot do (a bench's arguments, say).
    #[error("{0}")]
    Invalid(String),
    /// A task of the runtime's own failed (a panic in a spawned task).
    #[error("{0}")]
    Internal(String),
}

/// How to start a runtime.
pub struct RuntimeOptions {
    /// The data directory (the redb file lives in it).
    pub data_dir: PathBuf,
    /// `Immediate` (default) or `None` (tests and benchmarks).
    pub durability: Durability,
    /// The workflow: a simulated environment (its tools join the registry) or stages of your own.
    pub workflow: WorkflowSource,
    /// More tools (custom Rust tools, MCP servers).
    pub registry: ToolRegistry,
    /// The model endpoints the workflow's agent stages name.
    pub models: hindsight::model::Models,
    /// The bandit's configuration (its reward is taken from the environment).
    pub policy: PolicyConfig,
    /// Seed of every random choice.
    pub seed: u64,
    /// Run limits and the failure policy.
    pub tree: TreeConfig,
    /// ReflectRetry's configuration.
    pub reflect_retry: ReflectRetryConfig,
    /// ReflectRetry's judge of a finished run's events (by default, its last validation).
    pub validator: RunValidator,
    /// Plugins of your own, each hosted by a supervised actor (see [`crate::plugin`]).
    pub plugins: Vec<crate::plugin::PluginSpec>,
    /// Fault injection into actors and tools, if any.
    pub chaos: Option<ChaosHandle>,
    /// SOP promotion and rollback rules.
    pub sop: SopConfig,
    /// Adaptive strategies: lessons synthesised from failures (the `[adaptive]` section).
    pub adaptive: AdaptiveConfig,
    /// A model-backed lesson synthesiser (the `[model]` section), if any: lessons are derived
    /// offline without one, and when it fails.
    pub synthesiser: Option<Arc<dyn hindsight::learn::adaptive::Synthesiser>>,
    /// The judge of human corrections (the `[model]` section's model), if any: a correction the
    /// evidence check passes must also be judged supported by it.
    pub verifier: Option<Arc<dyn hindsight::learn::adaptive::Verifier>>,
    /// How the policy distils a ranker from the log and when it plans with it.
    pub distill: DistillConfig,
    /// Root restart intensity: at most this many restarts ...
    pub max_restarts: u32,
    /// ... within this period.
    pub restart_period: Duration,
    /// Learning mechanisms switched off, to measure what each contributes
    /// (`hindsight bench adaptive --ablate`); none by default.
    pub ablate: BTreeSet<Mechanism>,
    /// When the store was opened with a TTL (diary, experience or finished runs), the runtime
    /// compacts it at start and then at this interval (`None`: at start only).
    pub compact_every: Option<Duration>,
}

/// Where a tree's workflow comes from.
pub enum WorkflowSource {
    /// A simulated environment: its stages, arms, tools, output checks and reward.
    Sim(SimEnv),
    /// A simulated agent environment: one agent stage, whose simulated model (added to
    /// [`RuntimeOptions::models`]) calls the environment's simulated tools.
    Agent(hindsight::tools::sim::agent::AgentEnv),
    /// Stages of your own over tools in [`RuntimeOptions::registry`].
    Custom {
        /// The workflow's name.
        name: String,
        /// The stages and their candidate arms.
        stages: Vec<hindsight::run::workflow::WorkflowStage>,
        /// Checks a stage's output.
        check: hindsight::run::workflow::OutputCheck,
        /// The reward of a run.
        reward: hindsight::tools::sim::RewardConfig,
    },
}

impl From<hindsight::tools::sim::agent::AgentEnv> for WorkflowSource {
    fn from(env: hindsight::tools::sim::agent::AgentEnv) -> WorkflowSource {
        WorkflowSource::Agent(env)
    }
}

impl From<SimEnv> for WorkflowSource {
    fn from(env: SimEnv) -> WorkflowSource {
        WorkflowSource::Sim(env)
    }
}

impl RuntimeOptions {
    /// Defaults on `workflow` (your stages over the tools of [`RuntimeOptions::registry`], or a
    /// simulated environment, which brings its own tools) with data under `data_dir`.
    pub fn new(
        data_dir: impl Into<PathBuf>,
        workflow: impl Into<WorkflowSource>,
    ) -> RuntimeOptions {
        RuntimeOptions {
            data_dir: data_dir.into(),
            durability: Durability::Immediate,
            workflow: workflow.into(),
            registry: ToolRegistry::new(),
            models: hindsight::model::Models::new(),
            policy: PolicyConfig::default(),
            seed: 0,
            tree: TreeConfig::default(),
            reflect_retry: ReflectRetryConfig::default(),
            validator: default_validator(),
            plugins: Vec::new(),
            chaos: None,
            sop: SopConfig::default(),
            adaptive: AdaptiveConfig::default(),
            synthesiser: None,
            verifier: None,
            distill: DistillConfig::default(),
            max_restarts: 100,
            restart_period: Duration::from_secs(5),
            compact_every: Some(Duration::from_secs(60 * 60)),
            ablate: BTreeSet::new(),
        }
    }
}

/// A running tree.
pub struct Runtime {
    ctx: Arc<TreeCtx>,
    root: ActorRef<SupervisorMsg>,
    join: tokio::task::JoinHandle<()>,
    stats: Arc<RestartStats>,
    /// The periodic compaction, when the store has a TTL.
    compactor: Option<AbortOnDrop>,
}

/// A spawned task that is aborted when this is dropped (the compaction task holds the store: it
/// must not outlive the runtime).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the store's TTLs (diary, experience, and finished runs with the records that belong
/// to them, [`crate::orchestrator::RUN_RECORDS`]) and logs what went.
pub fn compact(store: &Store) -> Result<CompactReport, StoreError> {
    let report = store.compact_with(hindsight::now_ms(), &crate::orchestrator::RUN_RECORDS)?;
    if report.diary_removed + report.experience_removed + report.runs_removed > 0 {
        tracing::info!(
            diary = report.diary_removed,
            experience = report.experience_removed,
            runs = report.runs_removed,
            idempotency = report.idempotency_removed,
            damaged_kept = report.damaged_kept,
            "store compacted"
        );
    }
    Ok(report)
}

/// [`compact`] on a blocking thread, so that a long history does not stall the executor.
async fn compact_blocking(store: &Store) -> Result<CompactReport, RuntimeError> {
    let s = store.clone();
    tokio::task::spawn_blocking(move || compact(&s))
        .await
        .map_err(|e| RuntimeError::Setup(format!("the store compaction stopped: {e}")))?
        .map_err(RuntimeError::from)
}

/// Whether `store` was opened with any TTL.
fn has_ttl(store: &Store) -> bool {
    let o = store.options();
    o.diary_ttl_ms.is_some() || o.experience_ttl_ms.is_some() || o.run_ttl_ms.is_some()
}

/// Compacts `store` every `period`, logging failures, until aborted.
fn spawn_compactor(store: Store, period: Duration) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = compact_blocking(&store).await {
                tracing::error!(error = %e, "store compaction failed");
            }
        }
    }))
}

/// Registers the tools of simulated environment `env`, seeded by `seed`.
pub fn register_sim_tools(
    registry: &mut ToolRegistry,
    env: &SimEnv,
    seed: u64,
) -> Result<(), RuntimeError> {
    for tool in env.clone().with_seed(seed).tools() {
        registry
            .register(tool)
            .map_err(|e| RuntimeError::Setup(e.to_string()))?;
    }
    Ok(())
}

/// Submits tasks to a running tree; cheap to clone.
#[derive(Clone)]
pub struct Submitter {
    ctx: Arc<TreeCtx>,
}

impl Submitter {
    /// See [`Runtime::orchestrate`].
    pub async fn orchestrate(&self, task: Task) -> Result<RunOutcome, RuntimeError> {
        self.run_with(task, None).await
    }

    /// Runs a task on a given plan (one arm per stage of the workflow) instead of the policy's.
    pub async fn run_with(
        &self,
        task: Task,
        plan: Option<Vec<hindsight::ArmChoice>>,
    ) -> Result<RunOutcome, RuntimeError> {
        let answer = self
            .ctx
            .dir
            .orchestrator
            .call_with(
                |reply| OrchestratorMsg::Submit {
                    task: Box::new(task.clone()),
                    plan: plan.clone(),
                    reply,
                },
                Duration::from_secs(3600),
                u32::MAX,
            )
            .await?;
        Ok(answer?)
    }
}

impl Runtime {
    /// Opens the store, builds the tree and starts it; every run left unfinished by an earlier
    /// process is resumed from its last checkpoint.
    pub async fn start(opts: RuntimeOptions) -> Result<Runtime, RuntimeError> {
        let store = Store::open(
            &opts.data_dir,
            StoreOptions {
                durability: opts.durability,
                ..StoreOptions::default()
            },
        )?;
        Runtime::start_with_store(store, opts).await
    }

    /// As [`Runtime::start`], on a store already open.
    pub async fn start_with_store(
        store: Store,
        opts: RuntimeOptions,
    ) -> Result<Runtime, RuntimeError> {
        let mut registry = opts.registry;
        let mut models = opts.models;
        match &opts.workflow {
            WorkflowSource::Sim(env) => register_sim_tools(&mut registry, env, opts.seed)?,
            WorkflowSource::Agent(env) => {
                let env = env.clone().with_seed(opts.seed);
                for tool in env.tools() {
                    registry
                        .register(tool)
                        .map_err(|e| RuntimeError::Setup(e.to_string()))?;
                }
                // A model of that name given with the options (one that wraps it, say) stays.
                if models.get(hindsight::run::workflow::SIM_MODEL).is_none() {
                    models.insert(
                        hindsight::run::workflow::SIM_MODEL,
                        Arc::new(env.model()) as Arc<dyn hindsight::model::LanguageModel>,
                    );
                }
            }
            WorkflowSource::Custom { .. } => {}
        }
        if let Some(chaos) = &opts.chaos {
            registry = crate::chaos_tools::wrap_registry(registry, chaos);
        }
        let journal = crate::journal::CallJournal::from_env().map_err(|e| {
            RuntimeError::Setup(format!(
                "cannot open the call journal named by {}: {e}",
                crate::journal::ENV
            ))
        })?;
        if let Some(j) = &journal {
            registry = crate::journal::wrap_registry(registry, j);
        }
        let registry = Arc::new(registry);
        // The TTLs apply before the tree reads the store, then periodically.
        let compactor = if has_ttl(&store) {
            compact_blocking(&store).await?;
            opts.compact_every
                .filter(|p| !p.is_zero())
                .map(|p| spawn_compactor(store.clone(), p))
        } else {
            None
        };
        let simulated = matches!(
            opts.workflow,
            WorkflowSource::Sim(_) | WorkflowSource::Agent(_)
        );
        let workflow = Arc::new(match opts.workflow {
            WorkflowSource::Sim(env) => Workflow::from_sim(&env.with_seed(opts.seed), &registry)?,
            WorkflowSource::Agent(env) => {
                Workflow::from_agent_env(&env.with_seed(opts.seed), &registry)?
            }
            WorkflowSource::Custom {
                name,
                stages,
                check,
                reward,
            } => Workflow::new(name, stages, &registry, check, reward)?,
        });
        opts.distill.validate()?;
        let policy = workflow.policy(opts.policy)?;
        // Simulated tools report virtual latency: backoff waits are virtual too. Tools of a
        // workflow of your own are real: their backoff and Retry-After waits are real.
        let clock: Arc<dyn hindsight::tools::Clock> = if simulated {
            Arc::new(VirtualClock::new())
        } else {
            Arc::new(hindsight::tools::TokioClock::new())
        };
        let runner = Arc::new(
            ToolRunner::new(registry.clone(), clock, opts.seed).with_idempotency(Arc::new(
                crate::idempotency::StoreIdempotency::new(store.clone()),
            )),
        );
        let tree = tree::build(TreeSpec {
            journal,
            store,
            workflow,
            runner,
            models,
            policy,
            seed: opts.seed,
            config: opts.tree,
            reflect_retry: opts.reflect_retry,
            validator: opts.validator,
            plugins: opts.plugins,
            faults: opts.chaos.as_ref().map(crate::chaos_tools::decider),
            sop: opts.sop,
            adaptive: opts.adaptive,
            synthesiser: opts.synthesiser,
            verifier: opts.verifier,
            distill: opts.distill,
            max_restarts: opts.max_restarts,
            restart_period: opts.restart_period,
            ablate: opts.ablate,
        });
        let stats = tree.options.stats.clone();
        let (root, join) = Supervisor::spawn(None, tree.options, tree.children)
            .await
            .map_err(|e| RuntimeError::Spawn(e.to_string()))?;
        Ok(Runtime {
            ctx: tree.ctx,
            root,
            join,
            stats,
            compactor,
        })
    }

    /// Runs a task to its end and returns the outcome with provenance. A task id submitted
    /// again joins its run (or gets its stored outcome): every task runs once.
    pub async fn orchestrate(&self, task: Task) -> Result<RunOutcome, RuntimeError> {
        self.submitter().orchestrate(task).await
    }

    /// A cheap handle that submits tasks (for spawned tasks).
    pub fn submitter(&self) -> Submitter {
        Submitter {
            ctx: self.ctx.clone(),
        }
    }

    /// A run's record.
    pub async fn run(&self, run_id: &str) -> Result<Option<Run>, RuntimeError> {
        Ok(self
            .ctx
            .dir
            .orchestrator
            .call(|reply| OrchestratorMsg::Get {
                run_id: run_id.to_string(),
                reply,
            })
            .await?)
    }

    /// How many runs the orchestrator holds in memory: those under way, and those ended whose
    /// end is not on disk yet. A finished run is read from the store, so this does not grow
    /// with the daemon's history.
    pub async fn held_runs(&self) -> Result<usize, RuntimeError> {
        Ok(self
            .ctx
            .dir
            .orchestrator
            .call(|reply| OrchestratorMsg::Held { reply })
            .await?)
    }

    /// What the actors share (store, directory, workflow).
    pub fn ctx(&self) -> &Arc<TreeCtx> {
        &self.ctx
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// Actor restarts so far.
    pub fn restarts(&self) -> u64 {
        self.stats.total()
    }

    /// Restarts per child.
    pub fn restart_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.stats.per_child()
    }

    /// Runs in flight.
    pub fn in_flight(&self) -> usize {
        self.ctx.live.len()
    }

    /// Stops the tree like [`Runtime::shutdown`] but does not wait for the store to be
    /// released: for a caller that holds the store (or the context) itself, such as the daemon
    /// behind the HTTP API, whose file closes when that caller lets go.
    pub async fn stop(mut self) {
        self.ctx
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.ctx.dir.close();
        drop(self.compactor.take());
        let _ = self
            .ctx
            .dir
            .policy
            .call_with_timeout(
                |reply| crate::policy::PolicyMsg::Flush { reply },
                Duration::from_secs(10),
            )
            .await;
        self.root.stop(Some("shutdown".to_string()));
        let _ = self.join.await;
    }

    /// Stops the tree: children stop in reverse start order (the orchestrator first), each
    /// persisting what it owns; runs in flight are let go of as a crash would leave them (the
    /// tool calls and model turns they wait on dropped), checkpointed, and resume at the next
    /// start.
    pub async fn shutdown(self) {
        let ctx = self.ctx.clone();
        self.stop().await;
        // Stopped actors drop their state (and with it their handles on the store) a little
        // after the root's join; wait for that, so that the database file is closed when this
        // returns and a new runtime can open it at once.
        let held = |ctx: &Arc<TreeCtx>| Arc::strong_count(ctx) > 1 || ctx.store.handles() > 1;
        let deadline = tokio::time::Instant::now() + SHUTDOWN_RELEASE;
        while held(&ctx) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if held(&ctx) {
            tracing::warn!(
                "shutdown: the store is still held elsewhere; its file closes when that ends"
            );
        }
    }
}

/// How long shutdown waits for stopped actors to release the store.
const SHUTDOWN_RELEASE: Duration = Duration::from_secs(10);

/// The default data directory.
pub fn default_data_dir() -> &'static Path {
    Path::new("./hindsight-data")
}
