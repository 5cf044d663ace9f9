//! The main job: run a simulated environment through the whole supervision tree on embedded
//! defaults, with a progress bar, and end with what was learned and the KPIs per window.
//! Run it again on the same data directory and it goes on from what it learned.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hindsight::store::Durability;
use hindsight::tools::sim::SimEnv;
use indicatif::{ProgressBar, ProgressStyle};

use crate::app::workload::{self, Summary};
use crate::runtime::{Runtime, RuntimeError, RuntimeOptions};

/// The bank-statements environment, embedded so the demo runs from any directory.
pub const BANK_STATEMENTS: &str = include_str!("../../../config/envs/bank_statements.toml");

/// The default environment file.
pub const DEFAULT_ENV: &str = "config/envs/bank_statements.toml";

/// Options of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The environment file (`None`: the embedded bank-statements environment).
    pub env: Option<PathBuf>,
    /// Tasks to run.
    pub tasks: u64,
    /// Seed of the tasks and every choice.
    pub seed: u64,
    /// A fault plan, if any.
    pub chaos: Option<PathBuf>,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Durability of the store.
    pub durability: Durability,
    /// Tasks in flight at once.
    pub concurrency: usize,
    /// Show a progress bar (only on a terminal).
    pub progress: bool,
    /// Where the HTML report goes (default: `<data>/report`).
    pub report_dir: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            env: None,
            tasks: 1000,
            seed: 7,
            chaos: None,
            data_dir: PathBuf::from("./hindsight-data"),
            durability: Durability::Immediate,
            concurrency: 8,
            progress: true,
            report_dir: None,
        }
    }
}

/// Loads the environment: the file given, else `config/envs/bank_statements.toml` if present,
/// else the embedded copy.
pub fn load_env(path: Option<&Path>) -> Result<SimEnv, RuntimeError> {
    match path {
        Some(p) => Ok(SimEnv::load(p)?),
        None if Path::new(DEFAULT_ENV).exists() => Ok(SimEnv::load(Path::new(DEFAULT_ENV))?),
        None => Ok(SimEnv::parse(
            BANK_STATEMENTS,
            "(embedded) bank_statements.toml",
        )?),
    }
}

/// Runs the demo and returns its KPIs.
pub async fn run(opts: &DemoOptions) -> Result<Summary, RuntimeError> {
    let env = load_env(opts.env.as_deref())?;
    let mut ropts = RuntimeOptions::new(&opts.data_dir, env.clone());
    ropts.seed = opts.seed;
    ropts.durability = opts.durability;
    if let Some(path) = &opts.chaos {
        let plan = crate::chaos_tools::load(path)?;
        ropts.chaos = Some(crate::chaos::ChaosHandle::new(plan));
    }
    let rt = Runtime::start(ropts).await?;
    let bar = if opts.progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(opts.tasks);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tasks  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(bar)
    } else {
        None
    };
    let restarts_before = rt.restarts();
    let passed = std::sync::atomic::AtomicU64::new(0);
    let records = workload::run_tasks(&rt, &env, opts.seed, opts.tasks, opts.concurrency, |r| {
        if let Some(bar) = &bar {
            if r.passed {
                passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            bar.inc(1);
            let done = bar.position().max(1);
            bar.set_message(format!(
                "success {:.0}%",
                100.0 * passed.load(std::sync::atomic::Ordering::Relaxed) as f64 / done as f64
            ));
        }
    })
    .await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let restarts = rt.restarts() - restarts_before;
    let records = match records {
        Ok(r) => r,
        Err(e) => {
            rt.shutdown().await;
            return Err(e);
        }
    };
    let at = records.last().map(|r| r.task).unwrap_or(0);
    let learned = workload::learned(&rt, &env, at).await;
    let ranker = workload::distillation(&rt).await;
    // The report is built from the running tree's store (a second open of the file would race
    // with the shutdown's last writes).
    let report = report_data(rt.store(), &env, hindsight::now_ms()).and_then(|data| {
        let dir = opts
            .report_dir
            .clone()
            .unwrap_or_else(|| opts.data_dir.join("report"));
        crate::app::report::write_report(&dir, &data)
            .map_err(|e| RuntimeError::Setup(e.to_string()))
    });
    rt.shutdown().await;
    let mut summary = workload::summarize(&env, &records, restarts);
    summary.learned = learned?;
    summary.ranker = Some(ranker?);
    summary.report = Some(report?.display().to_string());
    Ok(summary)
}

/// The demo's closing table.
pub fn render_table(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "hindsight demo: {} tasks of `{}` from task {}",
        s.tasks, s.env, s.first_task
    );
    let _ = writeln!(
        out,
        "success {:.1}%   expected reward of the first attempt: agent {:.3}, oracle {:.3}, random {:.3}   regret ratio {:.3}",
        100.0 * s.success_rate,
        s.chosen_expected_reward,
        s.oracle_mean_reward,
        s.random_mean_reward,
        s.regret_ratio
    );
    let _ = writeln!(
        out,
        "realised reward after recoveries: agent {:.3} (no first-attempt figure includes recoveries)",
        s.mean_reward
    );
    let _ = writeln!(
        out,
        "regret {:.1}: {:.1} of the policy's greedy plans (what it did not know yet), {:.1} of departing from them (exploration, SOPs, ranker)",
        s.cumulative_regret, s.greedy_regret, s.exploration_regret
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>8}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}",
        "from", "tasks", "success", "agent", "oracle", "random", "realised"
    );
    let _ = writeln!(
        out,
        "{:>8}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}",
        "", "", "", "expected", "expected", "expected", "reward"
    );
    for w in &s.windows {
        let _ = writeln!(
            out,
            "{:>8}  {:>6}  {:>7.1}%  {:>8.3}  {:>8.3}  {:>8.3}  {:>8.3}",
            w.from,
            w.tasks,
            100.0 * w.success_rate,
            w.chosen_expected_reward,
            w.oracle_mean_reward,
            w.random_mean_reward,
            w.mean_reward
        );
    }
    if !s.learned.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "what it learned (greedy plan per cluster, expected reward; oracle):"
        );
        for l in &s.learned {
            let cluster = l.cluster.values().cloned().collect::<Vec<_>>().join(" ");
            let mark = if l.plan == l.oracle_plan { "=" } else { " " };
            let _ = writeln!(
                out,
                "  {cluster:<24} {:<40} {:.3} {mark} {:<40} {:.3}",
                l.plan.join(" + "),
                l.expected_reward,
                l.oracle_plan.join(" + "),
                l.oracle_reward
            );
        }
    }
    let _ = writeln!(out);
    let join = |m: &std::collections::BTreeMap<String, u64>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let _ = writeln!(out, "outcomes:          {}", join(&s.outcomes));
    let _ = writeln!(out, "recoveries:        {}", join(&s.recoveries));
    let _ = writeln!(out, "reflect-retries:   {}", s.reflect_retries);
    let _ = writeln!(out, "actor restarts:    {}", s.actor_restarts);
    let _ = writeln!(out, "tool calls:        {}", s.tool_calls);
    let _ = writeln!(out, "tool errors:       {}", join(&s.tool_errors));
    let _ = writeln!(
        out,
        "last 100 tasks:    exploration {:.0}%, SOP coverage {:.0}%",
        100.0 * s.exploration_rate_last_100,
        100.0 * s.sop_coverage_last_100
    );
    if let Some(r) = &s.ranker {
        let _ = writeln!(
            out,
            "distilled ranker:  {} fits, {} promoted; {}",
            r.fits,
            r.promotions,
            if r.in_force {
                format!("in force, it planned {} choices", r.ranked_choices)
            } else if let Some(last) = &r.last {
                if last
                    .reason
                    .starts_with(hindsight::learn::distill::TOO_LITTLE_SUPPORT)
                {
                    "not in force: too little support on the log yet".to_string()
                } else {
                    format!(
                        "not in force: it did not beat the policy's greedy plan (lower bound {:+.3})",
                        last.lower_bound
                    )
                }
            } else {
                "not fitted yet (every 200 runs)".to_string()
            }
        );
    }
    if s.resumed > 0 {
        let _ = writeln!(out, "resumed after a crash: {}", s.resumed);
    }
    out
}

/// The report of everything the store holds for `env`: every logged run of the environment in
/// task order, judged against the environment's oracle and random baseline.
pub fn report_data(
    store: &hindsight::store::Store,
    env: &SimEnv,
    now_ms: u64,
) -> Result<crate::app::report::ReportData, RuntimeError> {
    use crate::app::report::{ReportBuilder, SopEvent, SopEventKind, TaskOutcome};
    let mut rows: Vec<(u64, hindsight::ExperienceTuple)> = Vec::new();
    let prefix = format!("{}#", env.name());
    for (_, exp) in store.experience_all()? {
        let Ok(exp) = exp else { continue };
        if let Some(i) = exp
            .task_id
            .strip_prefix(&prefix)
            .and_then(|n| n.parse().ok())
        {
            rows.push((i, exp));
        }
    }
    rows.sort_by_key(|(i, _)| *i);
    let mut b = ReportBuilder::new(
        &format!("hindsight: {}", env.name()),
        env.name(),
        100,
        now_ms,
    );
    let mut first_task_of_run = std::collections::HashMap::new();
    for (i, exp) in &rows {
        first_task_of_run.insert(exp.run_id.clone(), *i);
        let plan: Vec<(String, String)> = exp
            .arms
            .iter()
            .map(|a| (a.tool.clone(), a.strategy.clone()))
            .collect();
        let expected = env
            .expected_reward(*i, &exp.context_features, &plan)
            .unwrap_or(0.0);
        let (_, oracle) = env.oracle(*i, &exp.context_features);
        b.task(TaskOutcome {
            task: *i,
            cluster: exp
                .context_features
                .values()
                .cloned()
                .collect::<Vec<_>>()
                .join(" "),
            plan: exp
                .arms
                .iter()
                .map(|a| (a.stage.clone(), format!("{}/{}", a.tool, a.strategy)))
                .collect(),
            passed: exp.result.passed,
            reward: exp.reward,
            expected_reward: expected,
            oracle_reward: oracle,
            random_reward: env.random_baseline(*i, &exp.context_features),
        });
        // Every tool error of the run, retried ones included: what the demo counts.
        if let Ok(Some(outcome)) = crate::orchestrator::read_outcome(store, &exp.run_id) {
            for (class, n) in &outcome.tool_errors {
                let category = match class {
                    hindsight::ErrorClass::TransientNetwork | hindsight::ErrorClass::RateLimit => {
                        "infrastructure"
                    }
                    _ => "strategy",
                };
                for _ in 0..*n {
                    b.failure(class.as_str(), category);
                }
            }
        }
    }
    for (_, sop) in store.scan::<hindsight::Sop>(crate::policy::SOPS)? {
        let Ok(sop) = sop else { continue };
        let task = sop
            .evidence
            .last()
            .and_then(|r| first_task_of_run.get(r))
            .copied()
            .unwrap_or(0);
        let kind = match sop.status {
            hindsight::SopStatus::RolledBack => SopEventKind::RolledBack,
            _ => SopEventKind::Promoted,
        };
        b.sop_event(SopEvent {
            task,
            sop_id: sop.sop_id.clone(),
            version: sop.version,
            cluster: sop
                .preconditions
                .values()
                .cloned()
                .collect::<Vec<_>>()
                .join(" "),
            kind,
        });
    }
    b.summary("runs", rows.len());
    Ok(b.build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::workload::TaskRecord;

    fn record(task: u64, reward: f64, expected: f64, oracle: f64) -> TaskRecord {
        TaskRecord {
            task,
            features: Default::default(),
            plan: Vec::new(),
            passed: true,
            reward,
            state: "succeeded".into(),
            expected_reward: expected,
            oracle_reward: oracle,
            random_reward: 0.5,
            explored: false,
            greedy_expected_reward: None,
            sop_id: None,
            propensity: 1.0,
            recoveries: Vec::new(),
            reflect_retries: 0,
            tool_calls: 0,
            tool_errors: Default::default(),
            resumed: false,
        }
    }

    #[test]
    fn the_table_compares_first_attempt_expectations_and_labels_the_realised_reward() {
        let env = load_env(None).unwrap();
        // Recoveries lift the realised reward (0.95) above the oracle's first-attempt
        // expectation (0.85); the agent's own first-attempt expectation is 0.75.
        let records = [record(0, 0.95, 0.7, 0.85), record(1, 0.95, 0.8, 0.85)];
        let table = render_table(&workload::summarize(&env, &records, 0));
        let second = table.lines().nth(1).unwrap();
        assert!(
            second.contains(
                "expected reward of the first attempt: agent 0.750, oracle 0.850, random 0.500"
            ),
            "{second}"
        );
        assert!(!second.contains("0.950"), "{second}");
        let third = table.lines().nth(2).unwrap();
        assert!(
            third.starts_with("realised reward after recoveries: agent 0.950"),
            "{third}"
        );
    }
}
