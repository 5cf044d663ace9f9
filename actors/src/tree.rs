//! The supervision tree of hindsight: the root supervisor's children in start order (Memory,
//! Policy, Reflector, Executor, Validator, the ReflectRetry plugin host, Orchestrator), the
//! directory through which they find each other, and the configuration they share.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hindsight::learn::Mechanism;
use hindsight::learn::bandit::Policy;
use hindsight::store::Store;
use hindsight::tools::ToolRunner;

use crate::chaos_hook::{ChaosHook, FaultDecider};
use crate::directory::Slot;
use crate::executor::{Executor, ExecutorArgs, ExecutorMsg};
use crate::memory::{MemoryActor, MemoryArgs, MemoryMsg};
use crate::orchestrator::{Orchestrator, OrchestratorArgs, OrchestratorMsg};
use crate::plugin::{PluginFactory, PluginMsg, PluginSlot, PluginSpec, host_child};
use crate::policy::{PolicyActor, PolicyArgs, PolicyMsg};
use crate::reflect_retry::{ReflectRetry, ReflectRetryConfig, RunValidator};
use crate::reflector::{ReflectorActor, ReflectorArgs, ReflectorMsg};
use crate::run::{LiveRuns, TreeCtx};
use crate::supervisor::{ChildSpec, Strategy, SupervisorOptions};
use crate::validator::{Validator, ValidatorArgs, ValidatorMsg};
use hindsight::run::{RunRules, Workflow};

/// The live actors of one tree, each in a slot its actor fills at every (re)start.
pub struct Directory {
    /// The orchestrator.
    pub orchestrator: Arc<Slot<OrchestratorMsg>>,
    /// The executor.
    pub executor: Arc<Slot<ExecutorMsg>>,
    /// The validator.
    pub validator: Arc<Slot<ValidatorMsg>>,
    /// The policy.
    pub policy: Arc<Slot<PolicyMsg>>,
    /// The memory.
    pub memory: Arc<Slot<MemoryMsg>>,
    /// The reflector.
    pub reflector: Arc<Slot<ReflectorMsg>>,
    /// The ReflectRetry plugin host.
    pub reflect_retry: Arc<Slot<PluginMsg>>,
    /// The hosts of the embedder's plugins, in the order they were given.
    pub plugins: Vec<PluginSlot>,
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            orchestrator: Arc::new(Slot::new("orchestrator")),
            executor: Arc::new(Slot::new("executor")),
            validator: Arc::new(Slot::new("validator")),
            policy: Arc::new(Slot::new("policy")),
            memory: Arc::new(Slot::new("memory")),
            reflector: Arc::new(Slot::new("reflector")),
            reflect_retry: Arc::new(Slot::new("reflect_retry")),
            plugins: Vec::new(),
        }
    }
}

impl Directory {
    /// Closes every slot as the tree stops ([`Slot::close`]): a run's driver calling an actor
    /// that stopped leaves its run to be resumed at once instead of waiting for a successor.
    pub fn close(&self) {
        self.orchestrator.close();
        self.executor.close();
        self.validator.close();
        self.policy.close();
        self.memory.close();
        self.reflector.close();
        self.reflect_retry.close();
        for plugin in &self.plugins {
            plugin.slot.close();
        }
    }
}

/// Limits and switches shared by every run.
#[derive(Clone)]
pub struct TreeConfig {
    /// How failures are classified and recovered, and the caps on recoveries and attempts.
    pub rules: RunRules,
    /// How long a stage's call (retries included) may take before the run gives up on it.
    pub stage_timeout: Duration,
    /// What a task must satisfy to be run (checked at ingress, by the orchestrator).
    pub guard: hindsight::guard::GuardConfig,
    /// Whether a tenant's run may read what memory's graph learned from every tenant's runs
    /// (`api.shared_learning`); its own lessons, SOPs and postmortems it reads either way.
    pub shared_learning: bool,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            rules: RunRules::default(),
            stage_timeout: Duration::from_secs(120),
            guard: hindsight::guard::GuardConfig::default(),
            shared_learning: false,
        }
    }
}

/// Everything needed to build a tree.
pub struct TreeSpec {
    /// The call journal, if one is kept.
    pub journal: Option<crate::journal::CallJournal>,
    /// The open store.
    pub store: Store,
    /// The workflow tasks are planned from.
    pub workflow: Arc<Workflow>,
    /// The resilient tool caller (its registry holds the workflow's tools).
    pub runner: Arc<ToolRunner>,
    /// The model endpoints of the workflow's agent stages.
    pub models: hindsight::model::Models,
    /// The policy to start from when nothing is stored.
    pub policy: Policy,
    /// Seed of every random choice the tree makes.
    pub seed: u64,
    /// SOP promotion and rollback rules.
    pub sop: hindsight::learn::sop::SopConfig,
    /// Adaptive strategies' configuration (the reflector's).
    pub adaptive: hindsight::learn::adaptive::AdaptiveConfig,
    /// A model-backed lesson synthesiser, if any (offline otherwise).
    pub synthesiser: Option<Arc<dyn hindsight::learn::adaptive::Synthesiser>>,
    /// The judge of human corrections, if any (the evidence check alone otherwise).
    pub verifier: Option<Arc<dyn hindsight::learn::adaptive::Verifier>>,
    /// How the policy distils its ranker.
    pub distill: hindsight::learn::distill::DistillConfig,
    /// Run limits and the failure policy.
    pub config: TreeConfig,
    /// ReflectRetry's configuration.
    pub reflect_retry: ReflectRetryConfig,
    /// ReflectRetry's judge of a finished run's events.
    pub validator: RunValidator,
    /// Plugins of the embedder's, each hosted by an actor of its own (started after
    /// ReflectRetry, before the orchestrator).
    pub plugins: Vec<PluginSpec>,
    /// Decides which actor messages crash their actor (fault injection), if any.
    pub faults: Option<FaultDecider>,
    /// Restart intensity of the root supervisor: at most this many restarts ...
    pub max_restarts: u32,
    /// ... within this period.
    pub restart_period: Duration,
    /// Learning mechanisms switched off, to measure what each contributes (none by default).
    pub ablate: BTreeSet<Mechanism>,
}

/// A built tree: what its actors share, and the children of its root supervisor.
pub struct Tree {
    /// What every run and actor shares.
    pub ctx: Arc<TreeCtx>,
    /// The root supervisor's options (strategy, intensity, restart counters).
    pub options: SupervisorOptions,
    /// The root supervisor's children, in start order.
    pub children: Vec<ChildSpec>,
}

fn hook(faults: &Option<FaultDecider>, actor: &'static str) -> Option<ChaosHook> {
    faults.as_ref().map(|f| ChaosHook::new(actor, f.clone()))
}

/// Builds the tree's children; start them under a supervisor of your own with
/// `Supervisor::spawn(None, tree.options, tree.children)` (what [`crate::Runtime`] does) or nest
/// them with `Supervisor::child_spec`.
pub fn build(spec: TreeSpec) -> Tree {
    let mut config = spec.config.clone();
    config.rules = config.rules.for_workflow(&spec.workflow);
    if spec.ablate.contains(&Mechanism::Hints) {
        config.rules.triage = Arc::new((*config.rules.triage).clone().without_hints());
    }
    let mut reflect_retry = spec.reflect_retry.clone();
    if spec.ablate.contains(&Mechanism::Reflect) {
        reflect_retry.max_retries = 0;
    }
    let ctx = Arc::new(TreeCtx {
        store: spec.store.clone(),
        dir: Directory {
            plugins: spec.plugins.iter().map(PluginSpec::slot).collect(),
            ..Directory::default()
        },
        live: LiveRuns::default(),
        workflow: spec.workflow.clone(),
        config,
        chaos: hook(&spec.faults, crate::chaos::RUN_DRIVER),
        gates: crate::run::Gates::new(crate::run::SHARED_CALLS_IN_FLIGHT),
        lessons: Arc::new(crate::lesson_board::LessonBoard::new(
            spec.adaptive.clone(),
            spec.workflow.tool_names(),
        )),
        stopping: std::sync::atomic::AtomicBool::new(false),
    });
    let faults = spec.faults;
    let store = spec.store;
    let mut children = Vec::new();

    {
        let (store, slot, chaos) = (
            store.clone(),
            ctx.dir.memory.clone(),
            hook(&faults, "memory"),
        );
        let shared_learning = ctx.config.shared_learning;
        let mut tools: Vec<String> = spec
            .workflow
            .stages()
            .iter()
            .flat_map(|s| s.arms.iter().map(|a| a.tool.clone()))
            .collect();
        tools.sort();
        tools.dedup();
        children.push(ChildSpec::actor("memory", None, move || {
            (
                MemoryActor,
                MemoryArgs {
                    store: store.clone(),
                    tools: tools.clone(),
                    slot: slot.clone(),
                    chaos: chaos.clone(),
                    shared_learning,
                },
            )
        }));
    }
    {
        let (store, slot, chaos) = (
            store.clone(),
            ctx.dir.policy.clone(),
            hook(&faults, "policy"),
        );
        let initial = spec.policy;
        let memory = ctx.dir.memory.clone();
        let seed = spec.seed;
        let sop = spec.sop;
        let distill = spec.distill;
        let sops = !spec.ablate.contains(&Mechanism::Sops);
        children.push(ChildSpec::actor("policy", None, move || {
            (
                PolicyActor,
                PolicyArgs {
                    store: store.clone(),
                    initial: initial.clone(),
                    seed,
                    snapshot_every: crate::applied::SNAPSHOT_EVERY,
                    sop: sop.clone(),
                    sops,
                    distill: distill.clone(),
                    slot: slot.clone(),
                    memory: memory.clone(),
                    chaos: chaos.clone(),
                },
            )
        }));
    }
    {
        let (store, slot, chaos) = (
            store.clone(),
            ctx.dir.reflector.clone(),
            hook(&faults, "reflector"),
        );
        let board = ctx.lessons.clone();
        let memory = ctx.dir.memory.clone();
        let adaptive = spec.adaptive.clone();
        let synthesiser = spec.synthesiser.clone();
        let verifier = spec.verifier.clone();
        let ablate = spec.ablate.clone();
        children.push(ChildSpec::actor("reflector", None, move || {
            (
                ReflectorActor,
                ReflectorArgs {
                    adaptive: adaptive.clone(),
                    store: store.clone(),
                    memory: memory.clone(),
                    slot: slot.clone(),
                    board: board.clone(),
                    synthesiser: synthesiser.clone(),
                    verifier: verifier.clone(),
                    chaos: chaos.clone(),
                    ablate: ablate.clone(),
                },
            )
        }));
    }
    {
        let (runner, slot, chaos) = (
            spec.runner.clone(),
            ctx.dir.executor.clone(),
            hook(&faults, "executor"),
        );
        let (journal, models) = (spec.journal.clone(), spec.models.clone());
        children.push(ChildSpec::actor("executor", None, move || {
            (
                Executor,
                ExecutorArgs {
                    journal: journal.clone(),
                    runner: runner.clone(),
                    models: models.clone(),
                    slot: slot.clone(),
                    chaos: chaos.clone(),
                },
            )
        }));
    }
    {
        let (workflow, slot, chaos) = (
            spec.workflow.clone(),
            ctx.dir.validator.clone(),
            hook(&faults, "validator"),
        );
        children.push(ChildSpec::actor("validator", None, move || {
            (
                Validator,
                ValidatorArgs {
                    workflow: workflow.clone(),
                    slot: slot.clone(),
                    chaos: chaos.clone(),
                },
            )
        }));
    }
    {
        let (slot, chaos) = (
            ctx.dir.reflect_retry.clone(),
            hook(&faults, "reflect_retry"),
        );
        let (config, validator, store) = (reflect_retry, spec.validator.clone(), store.clone());
        let factory: PluginFactory<ReflectRetry> = Arc::new(move || {
            let (config, validator, store) = (config.clone(), validator.clone(), store.clone());
            Box::pin(async move { Ok(ReflectRetry::new(config, validator, store)) })
        });
        children.push(host_child(
            "reflect_retry".to_string(),
            factory,
            slot,
            chaos,
        ));
    }
    for (plugin, host) in spec.plugins.iter().zip(&ctx.dir.plugins) {
        children.push(plugin.child(host.slot.clone(), hook(&faults, "plugin")));
    }
    {
        let (tctx, chaos) = (ctx.clone(), hook(&faults, "orchestrator"));
        children.push(ChildSpec::actor("orchestrator", None, move || {
            (
                Orchestrator,
                OrchestratorArgs {
                    ctx: tctx.clone(),
                    chaos: chaos.clone(),
                },
            )
        }));
    }

    let options = SupervisorOptions::new(Strategy::OneForOne)
        .intensity(spec.max_restarts, spec.restart_period)
        .label("hindsight");
    Tree {
        ctx,
        options,
        children,
    }
}

/// The actor types of the tree, for documentation and tests.
pub fn actor_names() -> [&'static str; 7] {
    [
        "memory",
        "policy",
        "reflector",
        "executor",
        "validator",
        "reflect_retry",
        "orchestrator",
    ]
}
