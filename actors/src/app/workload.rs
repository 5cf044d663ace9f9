//! Runs a simulated environment's tasks through a running tree and measures the result against
//! the environment's exact oracle and uniform-random baseline (FORMAT.md): the main job's engine,
//! shared by `hindsight demo` and `hindsight bench learning`.

use std::collections::BTreeMap;
use std::sync::Arc;

use hindsight::Task;
use hindsight::store::{Commit, KvTable, WriteOp};
use hindsight::tools::sim::SimEnv;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::run::RunOutcome;
use crate::runtime::{Runtime, RuntimeError};
use hindsight::run::workflow::sim_task_id;

/// Where a workload remembers how far it got, per environment and seed.
pub const PROGRESS: KvTable = KvTable::new("workload_progress");

/// One task's result, as the bench's trace shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task's index.
    pub task: u64,
    /// Its features.
    pub features: BTreeMap<String, String>,
    /// The first attempt's arms, `tool/strategy` in stage order.
    pub plan: Vec<String>,
    /// Whether it passed.
    pub passed: bool,
    /// Its reward.
    pub reward: f64,
    /// The terminal state.
    pub state: String,
    /// Expected reward of the first attempt's plan (FORMAT.md).
    pub expected_reward: f64,
    /// The oracle's expected reward for the task.
    pub oracle_reward: f64,
    /// The random baseline's expected reward for the task.
    pub random_reward: f64,
    /// Whether the first plan was an exploration (not the policy's greedy choice).
    pub explored: bool,
    /// Expected reward of the policy's greedy plan when it chose (`None` when the run does not
    /// say, as runs of older builds do not).
    #[serde(default)]
    pub greedy_expected_reward: Option<f64>,
    /// The SOP followed, if any.
    pub sop_id: Option<String>,
    /// The probability the router and the policy had of choosing the first plan (what
    /// off-policy evaluation weighs the run by).
    #[serde(default)]
    pub propensity: f64,
    /// Recoveries by failure type.
    pub recoveries: Vec<String>,
    /// ReflectRetry rounds.
    pub reflect_retries: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Tool errors by class.
    pub tool_errors: BTreeMap<String, u32>,
    /// Whether the run was resumed after a crash.
    pub resumed: bool,
}

impl TaskRecord {
    /// The oracle's expected reward minus the first plan's (FORMAT.md's regret of the task).
    pub fn regret(&self) -> f64 {
        (self.oracle_reward - self.expected_reward).max(0.0)
    }

    /// The oracle's expected reward minus that of the policy's greedy plan when it chose: the
    /// regret of its beliefs (the first plan's regret when the greedy plan is not known).
    pub fn greedy_regret(&self) -> f64 {
        let greedy = self.greedy_expected_reward.unwrap_or(self.expected_reward);
        (self.oracle_reward - greedy).max(0.0)
    }

    /// The oracle's expected reward minus the random baseline's.
    pub fn random_regret(&self) -> f64 {
        (self.oracle_reward - self.random_reward).max(0.0)
    }
}

/// KPIs of one window of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// First task index of the window.
    pub from: u64,
    /// Tasks in it.
    pub tasks: usize,
    /// Share that passed.
    pub success_rate: f64,
    /// Mean reward.
    pub mean_reward: f64,
    /// Mean oracle expected reward.
    pub oracle_mean_reward: f64,
    /// Mean random-baseline expected reward.
    pub random_mean_reward: f64,
    /// Mean expected reward of the chosen plans.
    pub chosen_expected_reward: f64,
    /// Share of first plans that explored.
    pub exploration_rate: f64,
}

/// The whole workload's KPIs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The environment.
    pub env: String,
    /// Tasks run.
    pub tasks: usize,
    /// First and last task index.
    pub first_task: u64,
    /// Share that passed.
    pub success_rate: f64,
    /// Mean realised reward (after recoveries and retries).
    pub mean_reward: f64,
    /// Mean expected reward of the first attempts' plans: the agent's figure that compares with
    /// the oracle's and the random baseline's.
    #[serde(default)]
    pub chosen_expected_reward: f64,
    /// Mean oracle expected reward.
    pub oracle_mean_reward: f64,
    /// Mean random-baseline expected reward.
    pub random_mean_reward: f64,
    /// Sum over tasks of oracle minus chosen plan's expected reward.
    pub cumulative_regret: f64,
    /// The same for the random baseline.
    pub random_cumulative_regret: f64,
    /// `cumulative_regret / random_cumulative_regret` (0 = oracle, 1 = random).
    pub regret_ratio: f64,
    /// Sum over tasks of the oracle minus the policy's greedy plan when it chose: the part of
    /// the regret that its beliefs would have had (what it did not know yet).
    #[serde(default)]
    pub greedy_regret: f64,
    /// `cumulative_regret - greedy_regret`: what departing from its beliefs cost (exploration,
    /// and SOP or ranker plans in the greedy plan's place; negative when they did better).
    #[serde(default)]
    pub exploration_regret: f64,
    /// Windows of 100 tasks.
    pub windows: Vec<Window>,
    /// Recoveries by failure type.
    pub recoveries: BTreeMap<String, u64>,
    /// ReflectRetry rounds.
    pub reflect_retries: u64,
    /// Actor restarts during the workload.
    pub actor_restarts: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Tool errors by class.
    pub tool_errors: BTreeMap<String, u64>,
    /// Outcomes by terminal state.
    pub outcomes: BTreeMap<String, u64>,
    /// Share of the last 100 first plans that explored.
    pub exploration_rate_last_100: f64,
    /// Share of the last 100 tasks that followed an SOP.
    pub sop_coverage_last_100: f64,
    /// Runs resumed after a crash.
    pub resumed: u64,
    /// What the policy learned per cluster (filled by the demo).
    #[serde(default)]
    pub learned: Vec<Learned>,
    /// Where the demo wrote its HTML report.
    #[serde(default)]
    pub report: Option<String>,
    /// The policy's distilled ranker: fits, promotions, whether one is in force (filled by the
    /// demo and the learning bench).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranker: Option<crate::policy::DistillStatus>,
}

/// What the policy's distillation has done so far.
pub async fn distillation(
    rt: &Runtime,
) -> Result<crate::policy::DistillStatus, crate::runtime::RuntimeError> {
    Ok(rt
        .ctx()
        .dir
        .policy
        .call_with_timeout(
            |reply| crate::policy::PolicyMsg::Distillation { reply },
            std::time::Duration::from_secs(30),
        )
        .await?)
}

/// The task of index `index` of `env`.
pub fn sim_task(env: &SimEnv, seed: u64, index: u64) -> Task {
    let drawn = env.draw_task(seed, index);
    Task {
        task_id: sim_task_id(env.name(), index),
        goal: drawn.goal,
        features: drawn.features,
        user_id: Some("demo".to_string()),
        tenant: Some("demo".to_string()),
        ..Task::default()
    }
}

/// The record of task `index` of `env` from its outcome, with the oracle's and the random
/// baseline's expected rewards.
pub fn record_of(env: &SimEnv, index: u64, task: &Task, outcome: &RunOutcome) -> TaskRecord {
    // A plan's expected reward, when it has one arm per stage the environment knows.
    let value = |plan: &[(String, String)]| {
        (plan.len() == env.stages().len())
            .then(|| env.expected_reward(index, &task.features, plan).ok())
            .flatten()
    };
    let plan: Vec<(String, String)> = outcome
        .arms
        .iter()
        .map(|a| (a.tool.clone(), a.strategy.clone()))
        .collect();
    let greedy: Vec<(String, String)> = outcome
        .greedy_arms
        .iter()
        .map(|a| (a.tool.clone(), a.strategy.clone()))
        .collect();
    let expected_reward = value(&plan).unwrap_or(0.0);
    let greedy_expected_reward = value(&greedy);
    let base = env.baselines(index, &task.features);
    TaskRecord {
        task: index,
        features: task.features.clone(),
        plan: plan.iter().map(|(t, s)| format!("{t}/{s}")).collect(),
        passed: outcome.passed,
        reward: outcome.reward,
        state: outcome.state.to_string(),
        expected_reward,
        oracle_reward: base.oracle,
        random_reward: base.random,
        explored: outcome.explored,
        greedy_expected_reward,
        sop_id: outcome.sop_id.clone(),
        propensity: hindsight::plan_propensity(&outcome.arms),
        recoveries: outcome
            .recoveries
            .iter()
            .map(|r| r.failure.to_string())
            .collect(),
        reflect_retries: outcome.reflect_retries,
        tool_calls: outcome.tool_calls,
        tool_errors: outcome
            .tool_errors
            .iter()
            .map(|(c, n)| (c.to_string(), *n))
            .collect(),
        resumed: outcome.resumed,
    }
}

fn progress_key(env: &SimEnv, seed: u64) -> String {
    format!("{}#seed{seed}", env.name())
}

/// The index of the next task a workload on `env` with `seed` would run: past every task any
/// earlier workload on `env` ran, whatever its seed. Task ids are `{env}#{index}` for every
/// seed, so a workload with another seed that started at 0 would find the earlier seed's runs
/// under its own task ids and report them as its own.
pub fn next_task(rt: &Runtime, env: &SimEnv, seed: u64) -> Result<u64, RuntimeError> {
    let own = rt.store().get(PROGRESS, &progress_key(env, seed))?;
    let prefix = format!("{}#seed", env.name());
    let mut next = own.unwrap_or(0);
    for (key, done) in rt.store().scan::<u64>(PROGRESS)? {
        if key.starts_with(&prefix) {
            next = next.max(done?);
        }
    }
    Ok(next)
}

/// Runs `count` tasks of `env` from where the last workload stopped, `concurrency` at a time,
/// calling `on_done` after each. Returns the records in task order.
pub async fn run_tasks(
    rt: &Runtime,
    env: &SimEnv,
    seed: u64,
    count: u64,
    concurrency: usize,
    on_done: impl Fn(&TaskRecord) + Send + Sync,
) -> Result<Vec<TaskRecord>, RuntimeError> {
    let start = next_task(rt, env, seed)?;
    // Runs an earlier process left unfinished are resumed by the tree at start; wait for them
    // too, so that this workload ends with nothing in flight.
    let mut leftovers = tokio::task::JoinSet::new();
    for run in rt.store().unfinished_runs()?.into_iter().flatten() {
        let task: Option<Task> = rt.store().get(crate::orchestrator::TASKS, &run.task_id)?;
        if let Some(task) = task {
            let submit = rt.submitter();
            leftovers.spawn(async move { submit.orchestrate(task).await });
        }
    }
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut records: Vec<Option<TaskRecord>> = vec![None; count as usize];
    let mut done_upto = start;
    let mut results = tokio::task::JoinSet::new();
    let mut next = start;
    let end = start + count;
    loop {
        while next < end && gate.available_permits() > 0 {
            let Ok(permit) = gate.clone().acquire_owned().await else {
                break;
            };
            let task = sim_task(env, seed, next);
            let submit = rt.submitter();
            let index = next;
            results.spawn(async move {
                let outcome = submit.orchestrate(task.clone()).await;
                drop(permit);
                (index, task, outcome)
            });
            next += 1;
        }
        let Some(joined) = results.join_next().await else {
            break;
        };
        // Every run that ended meanwhile is taken now, before the next tasks go in.
        let mut joined = Some(joined);
        while let Some(one) = joined.take().or_else(|| results.try_join_next()) {
            let (index, task, outcome) = one.map_err(|e| RuntimeError::Internal(e.to_string()))?;
            let record = record_of(env, index, &task, &outcome?);
            on_done(&record);
            records[(index - start) as usize] = Some(record);
        }
        // Progress is the first index not yet done, persisted so a later workload goes on from
        // there. It is written behind: the runs' own writes do not wait for it, and a crash that
        // loses the newest of it costs nothing, since a task done beyond it is found by its run
        // and not run again. The last one is synced below.
        let before = done_upto;
        while done_upto < end && records[(done_upto - start) as usize].is_some() {
            done_upto += 1;
        }
        if done_upto > before {
            // Queued now; its outcome is the next synced write's.
            drop(rt.store().queue_batch(
                vec![WriteOp::put(
                    PROGRESS,
                    &progress_key(env, seed),
                    &done_upto,
                )?],
                Commit::Behind,
            ));
        }
    }
    if done_upto > start {
        rt.store()
            .put(PROGRESS, &progress_key(env, seed), &done_upto)
            .await?;
    }
    while let Some(joined) = leftovers.join_next().await {
        joined.map_err(|e| RuntimeError::Internal(e.to_string()))??;
    }
    Ok(records.into_iter().flatten().collect())
}

/// The KPIs of a workload.
pub fn summarize(env: &SimEnv, records: &[TaskRecord], actor_restarts: u64) -> Summary {
    let n = records.len().max(1) as f64;
    // Sums start at +0.0: `Sum` for floats starts at -0.0, which no tasks would print as "-0".
    let total = |f: &dyn Fn(&TaskRecord) -> f64| records.iter().map(f).fold(0.0, |a, x| a + x);
    let mean = |f: &dyn Fn(&TaskRecord) -> f64| total(f) / n;
    let cumulative_regret = total(&|r| r.oracle_reward - r.expected_reward);
    let random_cumulative_regret = total(&|r| r.oracle_reward - r.random_reward);
    let greedy_regret = total(&|r| r.greedy_regret());
    let windows = records
        .chunks(100)
        .map(|w| {
            let k = w.len().max(1) as f64;
            Window {
                from: w.first().map(|r| r.task).unwrap_or(0),
                tasks: w.len(),
                success_rate: w.iter().filter(|r| r.passed).count() as f64 / k,
                mean_reward: w.iter().map(|r| r.reward).sum::<f64>() / k,
                oracle_mean_reward: w.iter().map(|r| r.oracle_reward).sum::<f64>() / k,
                random_mean_reward: w.iter().map(|r| r.random_reward).sum::<f64>() / k,
                chosen_expected_reward: w.iter().map(|r| r.expected_reward).sum::<f64>() / k,
                exploration_rate: w.iter().filter(|r| r.explored).count() as f64 / k,
            }
        })
        .collect();
    let mut recoveries = BTreeMap::new();
    let mut tool_errors = BTreeMap::new();
    let mut outcomes = BTreeMap::new();
    for r in records {
        for f in &r.recoveries {
            *recoveries.entry(f.clone()).or_insert(0) += 1;
        }
        for (c, k) in &r.tool_errors {
            *tool_errors.entry(c.clone()).or_insert(0) += u64::from(*k);
        }
        *outcomes.entry(r.state.clone()).or_insert(0) += 1;
    }
    let last: Vec<&TaskRecord> = records.iter().rev().take(100).collect();
    let lk = last.len().max(1) as f64;
    Summary {
        env: env.name().to_string(),
        tasks: records.len(),
        first_task: records.first().map(|r| r.task).unwrap_or(0),
        success_rate: records.iter().filter(|r| r.passed).count() as f64 / n,
        mean_reward: mean(&|r| r.reward),
        chosen_expected_reward: mean(&|r| r.expected_reward),
        oracle_mean_reward: mean(&|r| r.oracle_reward),
        random_mean_reward: mean(&|r| r.random_reward),
        cumulative_regret,
        random_cumulative_regret,
        regret_ratio: if random_cumulative_regret > 0.0 {
            cumulative_regret / random_cumulative_regret
        } else {
            0.0
        },
        greedy_regret,
        exploration_regret: cumulative_regret - greedy_regret,
        windows,
        recoveries,
        reflect_retries: records.iter().map(|r| u64::from(r.reflect_retries)).sum(),
        actor_restarts,
        tool_calls: records.iter().map(|r| u64::from(r.tool_calls)).sum(),
        tool_errors,
        outcomes,
        exploration_rate_last_100: last.iter().filter(|r| r.explored).count() as f64 / lk,
        sop_coverage_last_100: last.iter().filter(|r| r.sop_id.is_some()).count() as f64 / lk,
        resumed: records.iter().filter(|r| r.resumed).count() as u64,
        learned: Vec::new(),
        report: None,
        ranker: None,
    }
}

/// What the policy learned for one cluster of tasks, next to the oracle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// The cluster's features.
    pub cluster: BTreeMap<String, String>,
    /// The policy's greedy plan.
    pub plan: Vec<String>,
    /// The environment's expected reward of that plan.
    pub expected_reward: f64,
    /// The oracle's plan.
    pub oracle_plan: Vec<String>,
    /// The oracle's expected reward.
    pub oracle_reward: f64,
}

/// Every combination of the environment's feature values.
pub fn clusters(env: &SimEnv) -> Vec<BTreeMap<String, String>> {
    let mut out = vec![BTreeMap::new()];
    for f in env.features() {
        let mut next = Vec::new();
        for partial in &out {
            for v in &f.values {
                let mut c = partial.clone();
                c.insert(f.name.clone(), v.clone());
                next.push(c);
            }
        }
        out = next;
    }
    out
}

/// The policy's greedy plan per cluster, judged at task `at` (drift applies from its index on).
pub async fn learned(rt: &Runtime, env: &SimEnv, at: u64) -> Result<Vec<Learned>, RuntimeError> {
    let mut out = Vec::new();
    for cluster in clusters(env) {
        let features = cluster.clone();
        let (plan, _) = rt
            .ctx()
            .dir
            .policy
            .call(|reply| crate::policy::PolicyMsg::Greedy {
                features: features.clone(),
                reply,
            })
            .await?;
        let pairs: Vec<(String, String)> = plan
            .iter()
            .filter_map(|p| {
                p.split_once('/')
                    .map(|(t, s)| (t.to_string(), s.to_string()))
            })
            .collect();
        let expected_reward = env.expected_reward(at, &cluster, &pairs).unwrap_or(0.0);
        let (oracle, oracle_reward) = env.oracle(at, &cluster);
        out.push(Learned {
            cluster,
            plan,
            expected_reward,
            oracle_plan: oracle.iter().map(|(t, s)| format!("{t}/{s}")).collect(),
            oracle_reward,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_tasks_give_plain_zeros_not_negative_ones() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/envs/bank_statements.toml"
        );
        let env = SimEnv::load(std::path::Path::new(path)).unwrap();
        let s = summarize(&env, &[], 0);
        for (name, v) in [
            ("mean_reward", s.mean_reward),
            ("oracle_mean_reward", s.oracle_mean_reward),
            ("random_mean_reward", s.random_mean_reward),
            ("cumulative_regret", s.cumulative_regret),
            ("random_cumulative_regret", s.random_cumulative_regret),
            ("regret_ratio", s.regret_ratio),
        ] {
            assert!(v == 0.0 && v.is_sign_positive(), "{name}: {v}");
        }
        assert!(serde_json::to_string(&s).is_ok_and(|j| !j.contains("-0.0")));
    }
}
