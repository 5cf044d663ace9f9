//! `hindsight bench overhead`: what the runtime adds to one run before its first model or tool
//! call, and how long a start takes to resume every unfinished run, on a store that has been in
//! use.
//!
//! The store is prepared first: 100,000 experiences in the log (which the tree learns from at
//! its first start, as after any restart without snapshots), then 10,000 lessons (20 in each of
//! 500 users' scopes) and 1,000 stable SOPs added to the stored snapshots, and the lessons sent
//! to memory's index. The workflow is the environment's stages over probe tools: each records
//! when a run first calls it and answers at once. A run's overhead is the time from its
//! submission to that first call, one run at a time, through the tree's own code (ingress guard,
//! run record, retrieval, lesson relevance, policy choice, transitions and checkpoint): nothing
//! is measured on a copy of the loop. It is measured twice: with probe tools that are not
//! idempotent, whose first call waits for the checkpoint that marks it in flight to be on disk,
//! and with the first stage an agent's over a probe model, whose first turn starts while the
//! run's writes are synced (its prompt assembled from what the run retrieved, as any agent's).
//! Then 10,000 runs are left unfinished as a crash right after their acceptance leaves them, and
//! a new tree is started on the store: the resume time is from the start to the last of them
//! calling its first tool again (or ending without one, which the figures count apart).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hindsight::model::{ChatRequest, LanguageModel, ModelFuture, ModelReply, TurnContext};
use hindsight::run::workflow::{AgentStage, AgentVariant, OutputCheck, WorkflowStage};
use hindsight::store::{Durability, Store, StoreOptions, WriteOp};
use hindsight::taxonomy::Step;
use hindsight::tools::sim::SimEnv;
use hindsight::tools::{CallContext, Tool, ToolFuture, ToolOutput, ToolRegistry, ToolSpec};
use hindsight::{
    ArmChoice, ExperienceTuple, Lesson, Run, RunResult, RunState, Sop, SopStatus, Task, now_ms,
};
use serde::{Deserialize, Serialize};

use crate::memory::MemoryMsg;
use crate::runtime::{Runtime, RuntimeError, RuntimeOptions, WorkflowSource};

/// What the store holds when the overhead is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Experiences in the log.
    pub experiences: u64,
    /// Lessons (in scopes of at most [`LESSONS_PER_SCOPE`]).
    pub lessons: u64,
    /// Stable SOPs.
    pub sops: u64,
    /// Runs left unfinished for the resume measurement.
    pub unfinished: u64,
}

impl Default for Load {
    /// The figures: 100,000 experiences, 10,000 lessons, 1,000 SOPs, 10,000 unfinished
    /// runs.
    fn default() -> Load {
        Load {
            experiences: 100_000,
            lessons: 10_000,
            sops: 1_000,
            unfinished: 10_000,
        }
    }
}

/// Lessons per user's scope (the adaptive strategies' default cap on a scope's lessons).
pub const LESSONS_PER_SCOPE: u64 = 20;

/// The time from a run's submission to its first model or tool call, over runs measured one at
/// a time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FirstCall {
    /// Runs measured.
    pub runs: u64,
    /// Median, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// The slowest.
    pub max_ms: f64,
}

impl FirstCall {
    /// The figures of `took` (milliseconds, in any order).
    fn of(mut took: Vec<f64>) -> FirstCall {
        took.sort_by(f64::total_cmp);
        FirstCall {
            runs: took.len() as u64,
            p50_ms: quantile(&took, 0.5),
            p99_ms: quantile(&took, 0.99),
            max_ms: took.last().copied().unwrap_or(0.0),
        }
    }
}

/// Figures of `hindsight bench overhead`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverheadBench {
    /// What the store held.
    pub load: Load,
    /// Runs whose first call is a tool that is not idempotent: it waits until the checkpoint
    /// that marks it in flight is on disk (with the run's record and transition).
    pub write_ahead: FirstCall,
    /// Runs whose first stage is an agent's: the time to its first model turn, which starts
    /// while the run's writes are being synced (a crash may have it asked again).
    pub model_turn: FirstCall,
    /// Time from the start of a tree on the store to every unfinished run's first tool call
    /// (or its end, if it ended before one), in seconds.
    pub resume_seconds: f64,
    /// Unfinished runs that made their first tool call again.
    pub resumed_to_first_call: u64,
    /// Unfinished runs that ended (failed) before it: a resume the tree could not carry.
    pub ended_before_first_call: u64,
    /// Of it, the time [`Runtime::start`] took to return, in seconds.
    pub start_seconds: f64,
    /// Time the preparation of the store took (not measured overhead), in seconds.
    pub prepare_seconds: f64,
}

/// What the probe tools saw: each run's first call, and how many runs called.
#[derive(Default)]
struct Probe {
    first: Mutex<HashMap<String, Instant>>,
    runs: AtomicU64,
    /// While set, calls wait (so that resumed runs stay where the measurement found them).
    hold: AtomicBool,
    release: tokio::sync::Notify,
}

impl Probe {
    /// The first call of `run_id`, if it made one.
    fn first_call(&self, run_id: &str) -> Option<Instant> {
        match self.first.lock() {
            Ok(map) => map.get(run_id).copied(),
            Err(poisoned) => poisoned.into_inner().get(run_id).copied(),
        }
    }

    fn record(&self, run_id: &str) {
        let at = Instant::now();
        let mut map = match self.first.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        if !map.contains_key(run_id) {
            map.insert(run_id.to_string(), at);
            self.runs.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A tool that records the call and answers `{}` at once (or, while the probe holds, when it is
/// released).
struct ProbeTool {
    spec: ToolSpec,
    probe: Arc<Probe>,
}

impl Tool for ProbeTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, _args: serde_json::Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            self.probe.record(&ctx.run_id);
            while self.probe.hold.load(Ordering::SeqCst) {
                let released = self.probe.release.notified();
                if !self.probe.hold.load(Ordering::SeqCst) {
                    break;
                }
                released.await;
            }
            Ok(ToolOutput {
                value: serde_json::json!({}),
                latency_ms: 0.0,
                cost: 0.0,
            })
        })
    }
}

/// A model that records when a run first asks it for a turn and answers at once, in words.
struct ProbeModel {
    probe: Arc<Probe>,
}

impl LanguageModel for ProbeModel {
    fn name(&self) -> &str {
        "probe"
    }

    fn complete<'a>(&'a self, _request: &'a ChatRequest) -> ModelFuture<'a, String> {
        Box::pin(async { Ok("done".to_string()) })
    }

    fn turn<'a>(
        &'a self,
        _request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        Box::pin(async move {
            self.probe.record(&ctx.run_id);
            Ok(ModelReply {
                content: "done".to_string(),
                ..ModelReply::default()
            })
        })
    }
}

/// What a run of the bench calls first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// A tool that is not idempotent: the workflow is the environment's tool stages.
    WriteAhead,
    /// A model: the environment's first stage is an agent's, whose variants are that stage's
    /// arms (each arm's tool names the variant's model, its strategy the variant), so that the
    /// policy, the SOPs and the lessons the store holds apply to it as to the tool stage.
    ModelTurn,
}

/// `stage` as an agent's: a variant per arm, named after its strategy, whose model (named after
/// its tool, added to `models`) is a probe.
fn probe_agent(
    stage: &hindsight::tools::sim::Stage,
    probe: &Arc<Probe>,
    models: &mut hindsight::model::Models,
) -> Result<WorkflowStage, RuntimeError> {
    let mut variants: Vec<AgentVariant> = Vec::new();
    for arm in &stage.arms {
        if variants.iter().any(|v| v.name == arm.strategy) {
            return Err(RuntimeError::Setup(format!(
                "stage {} has two arms with the strategy {}: the agent's variants are named after them",
                stage.name, arm.strategy
            )));
        }
        models.insert(
            arm.tool.clone(),
            Arc::new(ProbeModel {
                probe: probe.clone(),
            }),
        );
        variants.push(AgentVariant {
            name: arm.strategy.clone(),
            model: arm.tool.clone(),
            prompt: None,
            tools: Vec::new(),
            temperature: None,
        });
    }
    let agent = AgentStage {
        description: format!("{} as an agent", stage.name),
        instructions: format!("Do the {} stage of the task.", stage.name),
        variants,
        max_turns: 2,
        answer_schema: None,
        max_turn_tokens: None,
        max_tokens: None,
        max_cost: None,
        max_wall_ms: None,
    };
    Ok(WorkflowStage::agent(stage.name.clone(), agent))
}

/// The runtime options of the bench's tree on `dir`: `env`'s stages over probe tools (not
/// idempotent), the first one an agent's over a probe model when `first` is a model turn.
fn options(
    env: &SimEnv,
    dir: &Path,
    probe: &Arc<Probe>,
    first: First,
) -> Result<RuntimeOptions, RuntimeError> {
    let mut registry = ToolRegistry::new();
    let mut models = hindsight::model::Models::new();
    let mut stages = Vec::new();
    for (n, stage) in env.stages().iter().enumerate() {
        if n == 0 && first == First::ModelTurn {
            stages.push(probe_agent(stage, probe, &mut models)?);
            continue;
        }
        let mut arms = Vec::new();
        for arm in &stage.arms {
            if registry.get(&arm.tool).is_none() {
                let tool = ProbeTool {
                    spec: ToolSpec::new(arm.tool.clone(), "records when a run first calls it"),
                    probe: probe.clone(),
                };
                registry
                    .register(Arc::new(tool))
                    .map_err(|e| RuntimeError::Setup(e.to_string()))?;
            }
            arms.push(hindsight::run::workflow::WorkflowArm {
                tool: arm.tool.clone(),
                strategy: arm.strategy.clone(),
                params: arm.params.clone(),
            });
        }
        stages.push(WorkflowStage::tools(stage.name.clone(), arms));
    }
    let check: OutputCheck = Arc::new(|_, _, _| Ok(()));
    let mut opts = RuntimeOptions::new(
        dir,
        WorkflowSource::Custom {
            name: env.name().to_string(),
            stages,
            check,
            reward: env.reward_config(),
        },
    );
    opts.registry = registry;
    opts.models = models;
    opts.durability = Durability::Immediate;
    opts.seed = 1;
    Ok(opts)
}

/// The bench's task `index`: the environment's, from one of 500 users.
fn task(env: &SimEnv, prefix: &str, index: u64) -> Task {
    let mut task = crate::app::workload::sim_task(env, 7, index);
    task.task_id = format!("{prefix}-{index}");
    task.user_id = Some(format!("u{}", index % 500));
    task
}

/// Experience `i` of the prepared log: a plan of the environment's arms, passed four times in
/// five, with one step per stage.
fn experience(env: &SimEnv, rng: &mut fastrand::Rng, i: u64) -> ExperienceTuple {
    let t = task(env, "seed", i);
    let passed = rng.f64() < 0.8;
    let arms: Vec<ArmChoice> = env
        .stages()
        .iter()
        .map(|s| {
            let a = &s.arms[rng.usize(..s.arms.len())];
            ArmChoice {
                stage: s.name.clone(),
                tool: a.tool.clone(),
                strategy: a.strategy.clone(),
                propensity: 1.0 / s.arms.len() as f64,
            }
        })
        .collect();
    let steps = arms
        .iter()
        .enumerate()
        .map(|(n, a)| Step {
            index: n as u32,
            action: "call".to_string(),
            tool_called: Some(a.tool.clone()),
            tool_output: Some(serde_json::json!({})),
            error_class: (!passed && n + 1 == arms.len())
                .then_some(hindsight::taxonomy::ErrorClass::SchemaMismatch),
            latency_ms: 100.0,
            metadata: [("stage".to_string(), serde_json::json!(a.stage))]
                .into_iter()
                .collect(),
            ..Step::default()
        })
        .collect();
    ExperienceTuple {
        run_id: format!("run-{}", t.task_id),
        task_id: t.task_id.clone(),
        plan_id: format!("plan-{i}"),
        user_id: t.user_id.clone(),
        context_features: t.features.clone(),
        arms,
        steps,
        result: RunResult {
            state: if passed {
                RunState::Succeeded
            } else {
                RunState::Failed
            },
            passed,
            output: None,
            latency_ms: 300.0,
            cost: 0.01,
            attempts: 1,
        },
        reward: if passed { 0.8 } else { 0.0 },
        user_feedback: None,
        time_ms: now_ms(),
    }
}

/// Lesson `i`: in user `i / 20`'s scope, about one of the environment's tools.
fn lesson(env: &SimEnv, i: u64) -> Lesson {
    let tools: Vec<&str> = env
        .stages()
        .iter()
        .flat_map(|s| s.arms.iter().map(|a| a.tool.as_str()))
        .collect();
    let tool = tools[(i as usize) % tools.len().max(1)].to_string();
    let t = task(env, "lesson", i);
    let (k, v) = t
        .features
        .iter()
        .nth((i as usize) % t.features.len().max(1))
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap_or_default();
    Lesson {
        lesson_id: format!("lesson-{i}"),
        preconditions: [(k.clone(), v.clone())].into_iter().collect(),
        tool: Some(tool.clone()),
        action: format!(
            "When {k} is {v}, check the arguments {tool} expects before calling it (lesson {i})"
        ),
        confidence: 0.6,
        evidence: vec![format!("run-seed-{i}")],
        source: "correction".to_string(),
        scope: format!("user:u{}", i / LESSONS_PER_SCOPE),
        created_ms: now_ms(),
        reinforced_ms: now_ms(),
        superseded_by: None,
    }
}

/// Stable SOP `i`: a plan of the environment's arms for the features of task `i`, with a tenant
/// of its own (so that most SOPs match no task of the bench's tenant, as in a store shared by
/// many tenants).
fn sop(env: &SimEnv, i: u64) -> Sop {
    let t = task(env, "sop", i);
    let mut preconditions: BTreeMap<String, String> = t.features.clone();
    if !i.is_multiple_of(10) {
        preconditions.insert("tenant".to_string(), format!("T{i}"));
    }
    let plan = env
        .stages()
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let a = &s.arms[(i as usize + n) % s.arms.len()];
            ArmChoice {
                stage: s.name.clone(),
                tool: a.tool.clone(),
                strategy: a.strategy.clone(),
                propensity: 1.0,
            }
        })
        .collect();
    Sop {
        sop_id: format!("sop-{i}"),
        version: 1,
        preconditions,
        plan,
        status: SopStatus::Stable,
        successes: 40,
        trials: 42,
        baseline_successes: 30,
        baseline_trials: 42,
        p_value: Some(0.01),
        evidence: Vec::new(),
        created_ms: now_ms(),
        updated_ms: now_ms(),
        procedure: Vec::new(),
    }
}

/// Prepares the store in `dir` (see the module's documentation).
async fn prepare(
    env: &SimEnv,
    dir: &Path,
    load: Load,
    probe: &Arc<Probe>,
) -> Result<(), RuntimeError> {
    {
        let store = Store::open(
            dir,
            StoreOptions {
                durability: Durability::None,
                ..StoreOptions::default()
            },
        )?;
        let mut rng = fastrand::Rng::with_seed(11);
        let mut i = 0;
        while i < load.experiences {
            let end = (i + 1_000).min(load.experiences);
            let ops = (i..end)
                .map(|i| WriteOp::experience(&experience(env, &mut rng, i)))
                .collect::<Result<Vec<_>, _>>()?;
            store.write_batch(ops).await?;
            i = end;
        }
    }
    tracing::info!(
        experiences = load.experiences,
        "experience log written; the first start learns it"
    );
    // The first start learns the log and writes the actors' snapshots.
    let rt = Runtime::start(options(env, dir, probe, First::WriteAhead)?).await?;
    rt.shutdown().await;
    tracing::info!("log learned; adding lessons and SOPs");
    let lessons: Vec<Lesson> = (0..load.lessons).map(|i| lesson(env, i)).collect();
    let sops: Vec<Sop> = (0..load.sops).map(|i| sop(env, i)).collect();
    {
        let store = Store::open(dir, StoreOptions::default())?;
        crate::reflector::add_stored_lessons(&store, &lessons)
            .await
            .map_err(|e| RuntimeError::Setup(e.to_string()))?;
        crate::policy::add_stored_sops(&store, &sops)
            .await
            .map_err(|e| RuntimeError::Setup(e.to_string()))?;
    }
    tracing::info!("lessons and SOPs added; memory indexes them");
    // Memory indexes the SOPs from their table at start, and the lessons as it is sent them.
    let rt = Runtime::start(options(env, dir, probe, First::WriteAhead)?).await?;
    for chunk in lessons.chunks(1_000) {
        rt.ctx()
            .dir
            .memory
            .tell(MemoryMsg::IndexLessons(chunk.to_vec()));
    }
    // Answered once the lessons before it are indexed.
    rt.ctx()
        .dir
        .memory
        .call_with_timeout(
            |reply| MemoryMsg::Query {
                query: Box::default(),
                reply,
            },
            Duration::from_secs(600),
        )
        .await?;
    rt.shutdown().await;
    Ok(())
}

/// The `q` quantile of sorted `xs` (nearest rank).
fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// `runs` runs one at a time on a tree on `dir` whose runs call `first` first: the time from
/// each submission to that call.
async fn first_calls(
    env: &SimEnv,
    dir: &Path,
    probe: &Arc<Probe>,
    runs: u64,
    first: First,
) -> Result<FirstCall, RuntimeError> {
    let rt = Runtime::start(options(env, dir, probe, first)?).await?;
    let prefix = match first {
        First::WriteAhead => "run",
        First::ModelTurn => "agent",
    };
    // Warm-up outside the measurement (first allocations, caches).
    for i in 0..20 {
        rt.orchestrate(task(env, &format!("warm-{prefix}"), i))
            .await?;
    }
    let mut took = Vec::with_capacity(runs as usize);
    for i in 0..runs {
        let task = task(env, prefix, i);
        let run_id = crate::run::run_id_for(&task);
        let submitted = Instant::now();
        rt.orchestrate(task).await?;
        if let Some(first) = probe.first_call(&run_id) {
            took.push(first.duration_since(submitted).as_secs_f64() * 1e3);
        }
    }
    rt.shutdown().await;
    Ok(FirstCall::of(took))
}

/// `hindsight bench overhead`: `runs` runs measured one at a time on a store prepared with
/// `load`, whose first call is a tool that is not idempotent, then `runs` whose first stage is an
/// agent's, then the resume of `load.unfinished` runs (tool stages).
pub async fn overhead(env: &SimEnv, runs: u64, load: Load) -> Result<OverheadBench, RuntimeError> {
    let temp = crate::app::bench::TempDir::new()
        .map_err(|e| RuntimeError::Setup(format!("cannot create a temporary directory: {e}")))?;
    let dir = temp.path();
    let probe = Arc::new(Probe::default());
    let t = Instant::now();
    prepare(env, dir, load, &probe).await?;
    let prepare_seconds = t.elapsed().as_secs_f64();

    tracing::info!(runs, "store prepared; measuring runs one at a time");
    let write_ahead = first_calls(env, dir, &probe, runs, First::WriteAhead).await?;
    let model_turn = first_calls(env, dir, &probe, runs, First::ModelTurn).await?;

    // Runs left as a crash right after their acceptance leaves them: the task and the run
    // record on disk, nothing else.
    {
        let store = Store::open(dir, StoreOptions::default())?;
        let mut i = 0;
        while i < load.unfinished {
            let end = (i + 1_000).min(load.unfinished);
            let mut ops = Vec::with_capacity(2 * (end - i) as usize);
            for i in i..end {
                let task = task(env, "unfinished", i);
                let run = Run::new(crate::run::run_id_for(&task), &task, now_ms());
                ops.push(WriteOp::put(
                    crate::orchestrator::TASKS,
                    &task.task_id,
                    &task,
                )?);
                ops.push(WriteOp::run(&run)?);
            }
            store.write_batch(ops).await?;
            i = end;
        }
    }
    tracing::info!(
        unfinished = load.unfinished,
        "runs left unfinished; measuring the resume"
    );
    probe.hold.store(true, Ordering::SeqCst);
    let before = probe.runs.load(Ordering::SeqCst);
    let called = || probe.runs.load(Ordering::SeqCst) - before;
    let t = Instant::now();
    let rt = Runtime::start(options(env, dir, &probe, First::WriteAhead)?).await?;
    let start_seconds = t.elapsed().as_secs_f64();
    // Resumed: every run's driver has made its first tool call (and waits there) or ended
    // (a run that fails before its first call, a call to an actor timing out say); the drivers
    // are claimed at start, so once one is seen the live ones are all counted.
    let mut seen = false;
    loop {
        let live = rt.in_flight() as u64;
        seen |= live > 0 || called() > 0;
        if seen && live <= called() {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            return Err(RuntimeError::Internal(format!(
                "{} of {} unfinished runs resumed within 600 s",
                called(),
                load.unfinished
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let resume_seconds = t.elapsed().as_secs_f64();
    let resumed_to_first_call = called();
    probe.hold.store(false, Ordering::SeqCst);
    probe.release.notify_waiters();
    rt.shutdown().await;
    Ok(OverheadBench {
        load,
        write_ahead,
        model_turn,
        resume_seconds,
        resumed_to_first_call,
        ended_before_first_call: load.unfinished.saturating_sub(resumed_to_first_call),
        start_seconds,
        prepare_seconds,
    })
}
