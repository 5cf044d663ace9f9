//! `hindsight bench runtime` and `hindsight bench learning`: throughput of full runs through the
//! tree next to raw ractor and tokio baselines measured in the same process, and learning KPIs
//! against the environment's oracle.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::app::drift::{DriftRecovery, DriftTracker};
use hindsight::store::Durability;
use hindsight::tools::sim::SimEnv;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::app::workload::{self, Summary, TaskRecord};
use crate::runtime::{Runtime, RuntimeError, RuntimeOptions};

/// Figures of `hindsight bench runtime`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimeBench {
    /// Full runs per second, durable store (fsync at every group commit).
    pub runs_per_sec_durable: f64,
    /// Full runs per second, no fsync.
    pub runs_per_sec_no_fsync: f64,
    /// CPU time per run, durable store: the process's user and system time over the measured
    /// runs (every thread: the tree, its store's writer, the bench's driver), in milliseconds;
    /// absent where the platform does not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms_per_run_durable: Option<f64>,
    /// CPU time per run, no fsync, as above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms_per_run_no_fsync: Option<f64>,
    /// Runs measured per configuration.
    pub runs: u64,
    /// Runs in flight at once.
    pub concurrency: usize,
    /// Raw ractor casts per second (one actor counting messages).
    pub ractor_casts_per_sec: f64,
    /// Raw ractor call round trips per second, made from the bench's own thread (as the issue
    /// that set the runtime's goal measured them): each answer wakes that thread, so the figure
    /// lands in a slow mode or a fast one by chance.
    pub ractor_calls_per_sec: f64,
    /// Raw ractor call round trips per second made from a task on the runtime's workers, as
    /// the tree's run drivers make theirs.
    #[serde(default)]
    pub ractor_calls_per_sec_from_task: f64,
    /// Raw tokio mpsc messages per second (one consumer task).
    pub tokio_channel_msgs_per_sec: f64,
    /// Actor messages per run (estimated), to compare the tree with the raw figures.
    pub messages_per_run: f64,
}

struct Counter;

enum CounterMsg {
    Add,
    Ping(RpcReplyPort<u64>),
}

impl Actor for Counter {
    type Msg = CounterMsg;
    type State = u64;
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }

    async fn handle(
        &self,
        _: ActorRef<Self::Msg>,
        msg: Self::Msg,
        n: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CounterMsg::Add => *n += 1,
            CounterMsg::Ping(reply) => {
                let _ = reply.send(*n);
            }
        }
        Ok(())
    }
}

/// Raw ractor: casts per second into one actor, call round trips per second from the caller,
/// and from a task spawned on the runtime.
pub async fn ractor_baseline(messages: u64) -> Result<(f64, f64, f64), RuntimeError> {
    let (actor, join) = Actor::spawn(None, Counter, ())
        .await
        .map_err(|e| RuntimeError::Spawn(e.to_string()))?;
    let t = Instant::now();
    for _ in 0..messages {
        actor
            .cast(CounterMsg::Add)
            .map_err(|e| RuntimeError::Spawn(e.to_string()))?;
    }
    // The call is answered after every cast before it was handled.
    let _ = actor.call(CounterMsg::Ping, None).await;
    let casts = messages as f64 / t.elapsed().as_secs_f64();
    let calls_n = messages / 10;
    let calls = calls_per_sec(&actor, calls_n).await;
    let from_task = tokio::spawn({
        let actor = actor.clone();
        async move { calls_per_sec(&actor, calls_n).await }
    })
    .await
    .map_err(|e| RuntimeError::Spawn(format!("the baseline's task failed: {e}")))?;
    actor.stop(None);
    let _ = join.await;
    Ok((casts, calls, from_task))
}

/// Call round trips per second to `actor`, over `n` calls one after another.
async fn calls_per_sec(actor: &ActorRef<CounterMsg>, n: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let _ = actor.call(CounterMsg::Ping, None).await;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// Raw tokio: messages per second through a bounded mpsc channel to one consumer task.
pub async fn tokio_baseline(messages: u64) -> f64 {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
    let consumer = tokio::spawn(async move {
        let mut sum = 0u64;
        while let Some(v) = rx.recv().await {
            sum = sum.wrapping_add(v);
        }
        sum
    });
    let t = Instant::now();
    for i in 0..messages {
        if tx.send(i).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = consumer.await;
    messages as f64 / t.elapsed().as_secs_f64()
}

/// What one configuration of the tree did: full runs per second, and the CPU time per run
/// where the platform tells.
struct Throughput {
    runs_per_sec: f64,
    cpu_ms_per_run: Option<f64>,
}

/// Full runs per second through a fresh tree in `dir`, and their CPU time.
async fn tree_throughput(
    dir: &Path,
    env: &SimEnv,
    durability: Durability,
    runs: u64,
    concurrency: usize,
) -> Result<Throughput, RuntimeError> {
    let mut opts = RuntimeOptions::new(dir, env.clone());
    opts.durability = durability;
    opts.seed = 1;
    let rt = Runtime::start(opts).await?;
    // Warm up (first allocations, table creation) outside the measurement.
    workload::run_tasks(&rt, env, 1, 50.min(runs), concurrency, |_| {}).await?;
    let (t, cpu) = (Instant::now(), process_cpu());
    workload::run_tasks(&rt, env, 1, runs, concurrency, |_| {}).await?;
    let runs_per_sec = runs as f64 / t.elapsed().as_secs_f64();
    let cpu_ms_per_run = cpu
        .zip(process_cpu())
        .map(|(before, after)| after.saturating_sub(before).as_secs_f64() * 1e3 / runs as f64);
    rt.shutdown().await;
    Ok(Throughput {
        runs_per_sec,
        cpu_ms_per_run,
    })
}

/// The CPU time the process has used so far (user and system, every thread).
#[cfg(target_os = "linux")]
fn process_cpu() -> Option<Duration> {
    // SAFETY: `rusage` is plain integers, for which all zeroes is a value; `getrusage` writes
    // one into the pointer it is given, which points at `usage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

/// The CPU time the process has used so far: not told on this platform.
#[cfg(not(target_os = "linux"))]
fn process_cpu() -> Option<Duration> {
    None
}

/// `hindsight bench runtime`.
pub async fn runtime(
    env: &SimEnv,
    runs: u64,
    concurrency: usize,
) -> Result<RuntimeBench, RuntimeError> {
    let (ractor_casts_per_sec, ractor_calls_per_sec, ractor_calls_per_sec_from_task) =
        ractor_baseline(2_000_000).await?;
    let tokio_channel_msgs_per_sec = tokio_baseline(2_000_000).await;
    let durable_dir = tempdir()?;
    let durable = tree_throughput(
        durable_dir.path(),
        env,
        Durability::Immediate,
        runs,
        concurrency,
    )
    .await?;
    let fast_dir = tempdir()?;
    let fast = tree_throughput(fast_dir.path(), env, Durability::None, runs, concurrency).await?;
    Ok(RuntimeBench {
        runs_per_sec_durable: durable.runs_per_sec,
        runs_per_sec_no_fsync: fast.runs_per_sec,
        cpu_ms_per_run_durable: durable.cpu_ms_per_run,
        cpu_ms_per_run_no_fsync: fast.cpu_ms_per_run,
        runs,
        concurrency,
        ractor_casts_per_sec,
        ractor_calls_per_sec,
        ractor_calls_per_sec_from_task,
        tokio_channel_msgs_per_sec,
        // Per stage: an executor call and a checkpoint; per run: retrieval, a plan, five
        // transitions, validation, ReflectRetry, the end, and three learner casts.
        messages_per_run: 2.0 * env.stages().len() as f64 + 13.0,
    })
}

/// A temporary directory removed when dropped (benches run on a store of their own).
pub(crate) fn tempdir() -> Result<TempDir, RuntimeError> {
    TempDir::new()
        .map_err(|e| RuntimeError::Setup(format!("cannot create a temporary directory: {e}")))
}

/// A directory removed when dropped.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A new directory under the system's temporary directory.
    pub(crate) fn new() -> std::io::Result<TempDir> {
        let base = std::env::temp_dir().join(format!(
            "hindsight-bench-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&base)?;
        Ok(TempDir(base))
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Tasks after a drift point within which the drifted clusters are expected back near the
/// oracle.
pub const RECOVERY_TASKS: u64 = 150;

/// Figures of `hindsight bench learning`: the workload's KPIs plus the learning-specific ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LearningBench {
    /// The workload's KPIs.
    #[serde(flatten)]
    pub summary: Summary,
    /// The interpreter the tasks ran on.
    pub engine: Engine,
    /// SOPs promoted to stable during the workload.
    pub sops_promoted: u64,
    /// Share of first attempts that repeated a strategy error the same task cluster had already
    /// shown on the same arm in its previous run.
    pub repeat_error_rate: f64,
    /// Infrastructure failures the policy learned from (must be 0).
    pub infra_failures_learned_from: u64,
    /// Infrastructure failures the policy saw and ignored.
    pub infra_failures_ignored: u64,
    /// How the policy followed the environment's drift (`null` when it does not drift within
    /// the tasks run): the regret ratio of the tasks a drift applies to, during the first
    /// [`RECOVERY_TASKS`] tasks after it and after them.
    pub drift: Option<DriftRecovery>,
    /// Wall time of the workload.
    pub seconds: f64,
    /// The configuration file whose `[policy]`, `[distill]`, `[adaptive]` and `[triage]` caps the
    /// tree learned with (`null`: the embedded defaults).
    pub config: Option<String>,
}

/// Where `hindsight bench learning` takes its learning settings from: a configuration and the
/// file it was read from.
#[derive(Debug, Clone, Copy)]
pub struct LearningSettings<'a> {
    /// The configuration (its `[policy]`, `[distill]`, `[adaptive]` and `[triage]` caps apply;
    /// its seed does not).
    pub config: &'a hindsight::config::Config,
    /// The file it came from, for the report.
    pub file: &'a Path,
}

/// Which interpreter of the run machine runs the learning bench's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The core's interpreter: one task after another in this process, without actors or a
    /// store (fast; the same decisions as the tree with one task in flight).
    Core,
    /// The supervision tree, with its actors and store: what the daemon runs.
    #[default]
    Tree,
}

/// How `hindsight bench learning` runs: the tasks, the seed, the engine and its settings.
#[derive(Debug, Clone, Copy)]
pub struct LearningPlan<'a> {
    /// Tasks to run.
    pub tasks: u64,
    /// Seed of the tasks and of every choice.
    pub seed: u64,
    /// Tasks in flight at once (the core engine runs one at a time).
    pub concurrency: usize,
    /// The interpreter.
    pub engine: Engine,
    /// Keep the tree's store in this new or empty directory.
    pub keep: Option<&'a Path>,
    /// Learning settings other than the embedded defaults.
    pub settings: Option<LearningSettings<'a>>,
}

/// What a learning run leaves besides its task records.
struct Learned {
    records: Vec<TaskRecord>,
    infra_learned: u64,
    infra_ignored: u64,
    ranker: crate::policy::DistillStatus,
    sops_promoted: u64,
    restarts: u64,
}

/// Runs `plan.tasks` tasks of `env` on a fresh engine and returns the KPIs and every task's
/// record. The tree runs on a temporary store (durability off: the bench measures learning, not
/// the disk), or on `plan.keep` (which must be new or empty) when the store is wanted afterwards.
/// Both engines learn with the embedded defaults, or with `plan.settings` when given.
pub async fn learning(
    env: &SimEnv,
    plan: LearningPlan<'_>,
) -> Result<(LearningBench, Vec<TaskRecord>), RuntimeError> {
    let t = Instant::now();
    let learned = match plan.engine {
        Engine::Tree => learn_on_tree(env, &plan).await?,
        Engine::Core => learn_on_core(env, &plan).await?,
    };
    let seconds = t.elapsed().as_secs_f64();
    let records = learned.records;
    let mut summary = workload::summarize(env, &records, learned.restarts);
    summary.ranker = Some(learned.ranker);
    let repeat_error_rate = repeat_error_rate(&records);
    let mut drift = DriftTracker::new(env, RECOVERY_TASKS);
    for r in &records {
        drift.add(r.task, &r.features, r.regret(), r.random_regret());
    }
    let drift = drift.finish(plan.tasks);
    Ok((
        LearningBench {
            summary,
            engine: plan.engine,
            sops_promoted: learned.sops_promoted,
            repeat_error_rate,
            infra_failures_learned_from: learned.infra_learned,
            infra_failures_ignored: learned.infra_ignored,
            drift,
            seconds,
            config: plan.settings.map(|s| s.file.display().to_string()),
        },
        records,
    ))
}

/// The runtime options of a learning run on `dir`.
fn learning_options(env: &SimEnv, dir: &Path, plan: &LearningPlan<'_>) -> RuntimeOptions {
    let mut opts = RuntimeOptions::new(dir, env.clone());
    opts.durability = Durability::None;
    opts.seed = plan.seed;
    if let Some(s) = plan.settings {
        crate::app::backend::apply_learning(s.config, &mut opts);
    }
    opts
}

/// The learning run on a fresh tree.
async fn learn_on_tree(env: &SimEnv, plan: &LearningPlan<'_>) -> Result<Learned, RuntimeError> {
    let temp;
    let dir = match plan.keep {
        Some(dir) => {
            let occupied = std::fs::read_dir(dir)
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false);
            if occupied {
                return Err(RuntimeError::Invalid(format!(
                    "{} is not empty: the learning bench starts from nothing, so give it a new or empty directory to keep its store in",
                    dir.display()
                )));
            }
            dir
        }
        None => {
            temp = tempdir()?;
            temp.path()
        }
    };
    let rt = Runtime::start(learning_options(env, dir, plan)).await?;
    let records = workload::run_tasks(
        &rt,
        env,
        plan.seed,
        plan.tasks,
        plan.concurrency.max(1),
        |_| {},
    )
    .await?;
    let stats = policy_stats(&rt).await?;
    let ranker = workload::distillation(&rt).await?;
    // The policy's own SOPs: its snapshot reaches the store a moment after it is taken.
    let sops = rt
        .ctx()
        .dir
        .policy
        .call_with_timeout(
            |reply| crate::policy::PolicyMsg::Sops { reply },
            Duration::from_secs(30),
        )
        .await?;
    let sops_promoted = crate::policy::sops_promoted(&sops);
    let restarts = rt.restarts();
    rt.shutdown().await;
    Ok(Learned {
        records,
        infra_learned: stats.infra_learned,
        infra_ignored: stats.infra_ignored,
        ranker,
        sops_promoted,
        restarts,
    })
}

/// What the policy learned of a bench's runs (infrastructure failures learned from and ignored).
pub(crate) async fn policy_stats(
    rt: &Runtime,
) -> Result<crate::policy::LearningStats, RuntimeError> {
    Ok(rt
        .ctx()
        .dir
        .policy
        .call_with_timeout(
            |reply| crate::policy::PolicyMsg::Stats { reply },
            Duration::from_secs(30),
        )
        .await?)
}

/// The core's interpreter of the run machine on `env`'s tasks, built from `opts` as
/// [`Runtime::start`] builds the tree (the same tools, seeds, policy, rules and ReflectRetry), for
/// benchmarks and sweeps that run tasks one after another without actors or a store.
pub fn core_runner(
    env: &SimEnv,
    opts: RuntimeOptions,
) -> Result<hindsight::run::local::LocalRunner, RuntimeError> {
    let mut registry = hindsight::tools::ToolRegistry::new();
    crate::runtime::register_sim_tools(&mut registry, env, opts.seed)?;
    let registry = std::sync::Arc::new(registry);
    let workflow = std::sync::Arc::new(hindsight::run::Workflow::from_sim(
        &env.clone().with_seed(opts.seed),
        &registry,
    )?);
    opts.distill.validate()?;
    let planner = hindsight::learn::planner::Planner::new(
        workflow.policy(opts.policy)?,
        hindsight::learn::sop::SopBook::new(opts.sop),
        hindsight::learn::distill::Distiller::new(opts.distill),
        0,
        Default::default(),
        Default::default(),
        opts.seed,
    );
    let runner = hindsight::tools::ToolRunner::new(
        registry,
        std::sync::Arc::new(hindsight::tools::VirtualClock::new()),
        opts.seed,
    );
    let rules = opts.tree.rules.for_workflow(&workflow);
    Ok(hindsight::run::local::LocalRunner::new(
        workflow,
        runner,
        rules,
        planner,
        opts.reflect_retry,
        opts.validator,
    ))
}

/// The learning run on the core's interpreter.
async fn learn_on_core(env: &SimEnv, plan: &LearningPlan<'_>) -> Result<Learned, RuntimeError> {
    if plan.keep.is_some() {
        return Err(RuntimeError::Invalid(
            "--keep keeps the tree's store, and the core engine has none: give --engine tree"
                .to_string(),
        ));
    }
    if plan.concurrency > 1 {
        return Err(RuntimeError::Invalid(format!(
            "the core engine runs one task at a time, not {}: give --concurrency 1 or --engine tree",
            plan.concurrency
        )));
    }
    let mut local = core_runner(env, learning_options(env, Path::new(""), plan))?;
    let mut records = Vec::with_capacity(plan.tasks as usize);
    for index in 0..plan.tasks {
        let task = workload::sim_task(env, plan.seed, index);
        let outcome = local
            .run(task.clone())
            .await
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        records.push(workload::record_of(env, index, &task, &outcome));
    }
    let planner = local.planner();
    Ok(Learned {
        records,
        infra_learned: planner.policy.infra_learned(),
        infra_ignored: planner.policy.infra_ignored(),
        ranker: crate::policy::DistillStatus::of(planner),
        sops_promoted: crate::policy::sops_promoted(&planner.sops.sops),
        restarts: 0,
    })
}

/// The bar on the learning bench: a run's regret ratio at most this.
pub const REGRET_BAR: f64 = 0.2;

/// Several runs of `hindsight bench learning` on one environment (`--runs N`): each seed's
/// figures and their spread. At more than one task in flight the tree does not repeat a seed
/// exactly (the order in which results arrive depends on timing), so a single run is a draw from
/// a distribution; the mean and the share of runs above [`REGRET_BAR`] are the figures to read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LearningRuns {
    /// The environment's name.
    pub env: String,
    /// Tasks per run.
    pub tasks: u64,
    /// Seeds run, in order (the first is `--seed`).
    pub seeds: Vec<u64>,
    /// Mean regret ratio over the runs.
    pub mean_regret_ratio: f64,
    /// Lowest regret ratio of a run.
    pub min_regret_ratio: f64,
    /// Highest regret ratio of a run.
    pub max_regret_ratio: f64,
    /// Runs whose regret ratio is above [`REGRET_BAR`].
    pub runs_above_bar: usize,
    /// Mean success rate over the runs.
    pub mean_success_rate: f64,
    /// Mean regret ratio of the drifted tasks after the recovery allowance, over the runs that
    /// reached a drift (`null` when none did).
    pub mean_drift_regret_ratio_after_recovery: Option<f64>,
    /// Infrastructure failures learned from, summed over the runs (must be 0).
    pub infra_failures_learned_from: u64,
    /// Each run's figures, in seed order.
    pub per_run: Vec<LearningBench>,
}

impl LearningRuns {
    /// Aggregates the runs of `seeds` (one [`LearningBench`] per seed, same order); `None` when
    /// there is none.
    pub fn new(tasks: u64, seeds: Vec<u64>, per_run: Vec<LearningBench>) -> Option<LearningRuns> {
        let first = per_run.first()?;
        let n = per_run.len() as f64;
        let ratios: Vec<f64> = per_run.iter().map(|b| b.summary.regret_ratio).collect();
        let drifts: Vec<f64> = per_run
            .iter()
            .filter_map(|b| b.drift.as_ref().map(|d| d.regret_ratio_after_recovery))
            .collect();
        Some(LearningRuns {
            env: first.summary.env.clone(),
            tasks,
            seeds,
            mean_regret_ratio: ratios.iter().sum::<f64>() / n,
            min_regret_ratio: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max_regret_ratio: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            runs_above_bar: ratios.iter().filter(|&&r| r > REGRET_BAR).count(),
            mean_success_rate: per_run.iter().map(|b| b.summary.success_rate).sum::<f64>() / n,
            mean_drift_regret_ratio_after_recovery: (!drifts.is_empty())
                .then(|| drifts.iter().sum::<f64>() / drifts.len() as f64),
            infra_failures_learned_from: per_run
                .iter()
                .map(|b| b.infra_failures_learned_from)
                .sum(),
            per_run,
        })
    }
}

/// Share of tasks whose first plan used an arm that failed (strategy error or invalid output)
/// on the previous task of the same cluster: the error repeated instead of being learned from.
pub fn repeat_error_rate(records: &[TaskRecord]) -> f64 {
    use std::collections::HashMap;
    let mut last_failed: HashMap<String, Vec<String>> = HashMap::new();
    let (mut repeats, mut chances) = (0u64, 0u64);
    for r in records {
        let cluster = r
            .features
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        if let Some(failed) = last_failed.get(&cluster)
            && !failed.is_empty()
        {
            chances += 1;
            if r.plan.iter().any(|p| failed.contains(p)) && !r.passed {
                repeats += 1;
            }
        }
        let failed: Vec<String> = if r.passed { Vec::new() } else { r.plan.clone() };
        last_failed.insert(cluster, failed);
    }
    if chances == 0 {
        0.0
    } else {
        repeats as f64 / chances as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_configuration_s_throughput_comes_with_its_cpu_time_per_run() {
        let env = crate::app::demo::load_env(None).unwrap();
        let dir = tempdir().unwrap();
        let measured = tree_throughput(dir.path(), &env, Durability::None, 40, 8)
            .await
            .unwrap();
        assert!(measured.runs_per_sec > 0.0);
        // A run is actor messages, a policy choice, store writes: more than nothing, less than
        // the whole second a run of the debug build would need to be that slow.
        if cfg!(target_os = "linux") {
            let cpu = measured.cpu_ms_per_run.unwrap();
            assert!(cpu > 0.0 && cpu < 1_000.0, "{cpu} ms of CPU a run");
        } else {
            assert!(measured.cpu_ms_per_run.is_none());
        }
    }
}
