//! The learning report: [`ReportData`] (what happened over a sequence of tasks), a
//! [`ReportBuilder`] that derives it from per-task outcomes, and [`render_report`], a
//! self-contained HTML page with inline SVG charts (no script, no external asset): reward per
//! window against the oracle and random, cumulative regret, the arm each cluster chose over time,
//! SOP promotions and rollbacks, and failures by error class.
//!
//! Every SVG carries its data domain (`data-x-min`, `data-x-max`, `data-y-min`, `data-y-max`) and
//! the plot area is fixed by the `PLOT_*` constants, so a reader (or a test) can map the drawn
//! coordinates back to the data.

mod charts;
mod render;
mod svg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use render::render_report;
pub use svg::escape;

/// Width of every chart, in SVG units.
pub const CHART_WIDTH: f64 = 720.0;
/// Height of the line and bar charts.
pub const CHART_HEIGHT: f64 = 260.0;
/// Left edge of the plot area of the line, bar and SOP charts.
pub const PLOT_LEFT: f64 = 56.0;
/// Top edge of the plot area.
pub const PLOT_TOP: f64 = 16.0;
/// Width of the plot area of the line, bar and SOP charts.
pub const PLOT_WIDTH: f64 = 648.0;
/// Height of the plot area of the line and bar charts.
pub const PLOT_HEIGHT: f64 = 204.0;
/// Left edge of the plot area of the arm strip chart (labels to its left).
pub const STRIP_LEFT: f64 = 220.0;
/// Width of the plot area of the arm strip chart.
pub const STRIP_WIDTH: f64 = 484.0;
/// Height of one row of the arm strip chart.
pub const STRIP_ROW: f64 = 18.0;

/// Reward statistics of one window of consecutive tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowStat {
    /// First task (0-based) of the window.
    pub start_task: u64,
    /// Tasks in the window.
    pub tasks: u64,
    /// Share of tasks that passed.
    pub success_rate: f64,
    /// Mean realised reward of the agent (after its recoveries and retries).
    pub mean_reward: f64,
    /// Mean expected reward of the agent's first-attempt plans: what compares with the oracle's.
    #[serde(default)]
    pub chosen_expected_reward: f64,
    /// Mean expected reward of the oracle's plans (first attempt).
    pub oracle_mean_reward: f64,
    /// Mean expected reward of the uniform-random baseline.
    pub random_mean_reward: f64,
}

/// Cumulative regret after a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegretPoint {
    /// The task (0-based).
    pub task: u64,
    /// Sum over tasks so far of oracle minus the expected reward of the chosen plan.
    pub cumulative_regret: f64,
    /// The same for the uniform-random baseline.
    pub random_cumulative_regret: f64,
}

/// The arm one cluster chose for one stage over time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterArms {
    /// The task cluster.
    pub cluster: String,
    /// The stage.
    pub stage: String,
    /// Each task of the cluster with its arm (`tool/strategy`), in task order.
    pub choices: Vec<ArmAt>,
}

/// One choice of an arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmAt {
    /// The task (0-based).
    pub task: u64,
    /// The arm, `tool/strategy`.
    pub arm: String,
}

/// What happened to an SOP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SopEventKind {
    /// Promoted to stable.
    Promoted,
    /// Rolled back.
    RolledBack,
}

impl SopEventKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            SopEventKind::Promoted => "promoted",
            SopEventKind::RolledBack => "rolled_back",
        }
    }
}

/// An SOP promotion or rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SopEvent {
    /// The task at which it happened.
    pub task: u64,
    /// The SOP.
    pub sop_id: String,
    /// Its version.
    pub version: u32,
    /// The cluster it applies to.
    pub cluster: String,
    /// Promotion or rollback.
    pub kind: SopEventKind,
}

/// Failures of one error class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureCount {
    /// The error class.
    pub class: String,
    /// `infrastructure`, `strategy` or `unknown`.
    pub category: String,
    /// How many tool calls failed with it.
    pub count: u64,
}

/// Everything a report shows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReportData {
    /// Page title.
    pub title: String,
    /// The environment (or workload) name.
    pub env: String,
    /// When it was generated (ms since epoch).
    pub generated_ms: u64,
    /// Tasks covered.
    pub tasks: u64,
    /// Tasks per window.
    pub window_size: u64,
    /// Per window, in order.
    pub windows: Vec<WindowStat>,
    /// Per task, in order.
    pub regret: Vec<RegretPoint>,
    /// Per cluster and stage, the arms chosen over time.
    pub cluster_arms: Vec<ClusterArms>,
    /// SOP promotions and rollbacks, in task order.
    pub sop_events: Vec<SopEvent>,
    /// Failures by error class.
    pub failures: Vec<FailureCount>,
    /// Extra figures shown as a table (name -> value).
    pub summary: BTreeMap<String, String>,
}

impl ReportData {
    /// Final cumulative regret divided by the random baseline's (0 = oracle, 1 = random).
    pub fn regret_ratio(&self) -> Option<f64> {
        let last = self.regret.last()?;
        (last.random_cumulative_regret > 0.0)
            .then(|| last.cumulative_regret / last.random_cumulative_regret)
    }
}

/// The outcome of one task, as the builder needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    /// The task (0-based, increasing).
    pub task: u64,
    /// Its cluster.
    pub cluster: String,
    /// The first attempt's plan: `(stage, "tool/strategy")` in stage order.
    pub plan: Vec<(String, String)>,
    /// Whether it passed.
    pub passed: bool,
    /// The realised reward.
    pub reward: f64,
    /// The expected reward of the first attempt's plan.
    pub expected_reward: f64,
    /// The oracle's expected reward for the task.
    pub oracle_reward: f64,
    /// The random baseline's expected reward for the task.
    pub random_reward: f64,
}

/// Derives [`ReportData`] from task outcomes, SOP events and failures.
#[derive(Debug, Clone, Default)]
pub struct ReportBuilder {
    data: ReportData,
    outcomes: Vec<TaskOutcome>,
    failures: BTreeMap<(String, String), u64>,
}

impl ReportBuilder {
    /// A builder for `env`, with windows of `window_size` tasks (at least 1).
    pub fn new(title: &str, env: &str, window_size: u64, generated_ms: u64) -> ReportBuilder {
        ReportBuilder {
            data: ReportData {
                title: title.to_string(),
                env: env.to_string(),
                generated_ms,
                window_size: window_size.max(1),
                ..ReportData::default()
            },
            outcomes: Vec::new(),
            failures: BTreeMap::new(),
        }
    }

    /// Adds a task's outcome.
    pub fn task(&mut self, outcome: TaskOutcome) -> &mut Self {
        self.outcomes.push(outcome);
        self
    }

    /// Adds an SOP event.
    pub fn sop_event(&mut self, event: SopEvent) -> &mut Self {
        self.data.sop_events.push(event);
        self
    }

    /// Counts a failed tool call of `class` (`category` infrastructure / strategy / unknown).
    pub fn failure(&mut self, class: &str, category: &str) -> &mut Self {
        *self
            .failures
            .entry((class.to_string(), category.to_string()))
            .or_insert(0) += 1;
        self
    }

    /// Adds a summary figure.
    pub fn summary(&mut self, name: &str, value: impl ToString) -> &mut Self {
        self.data
            .summary
            .insert(name.to_string(), value.to_string());
        self
    }

    /// The report data.
    pub fn build(mut self) -> ReportData {
        self.outcomes.sort_by_key(|o| o.task);
        let mut data = self.data;
        data.tasks = self.outcomes.len() as u64;
        let size = data.window_size as usize;
        for chunk in self.outcomes.chunks(size) {
            let n = chunk.len() as f64;
            let mean = |f: fn(&TaskOutcome) -> f64| chunk.iter().map(f).sum::<f64>() / n;
            data.windows.push(WindowStat {
                start_task: chunk[0].task,
                tasks: chunk.len() as u64,
                success_rate: chunk.iter().filter(|o| o.passed).count() as f64 / n,
                mean_reward: mean(|o| o.reward),
                chosen_expected_reward: mean(|o| o.expected_reward),
                oracle_mean_reward: mean(|o| o.oracle_reward),
                random_mean_reward: mean(|o| o.random_reward),
            });
        }
        let (mut regret, mut random) = (0.0, 0.0);
        let mut strips: BTreeMap<(String, String), Vec<ArmAt>> = BTreeMap::new();
        for o in &self.outcomes {
            regret += o.oracle_reward - o.expected_reward;
            random += o.oracle_reward - o.random_reward;
            data.regret.push(RegretPoint {
                task: o.task,
                cumulative_regret: regret,
                random_cumulative_regret: random,
            });
            for (stage, arm) in &o.plan {
                strips
                    .entry((o.cluster.clone(), stage.clone()))
                    .or_default()
                    .push(ArmAt {
                        task: o.task,
                        arm: arm.clone(),
                    });
            }
        }
        data.cluster_arms = strips
            .into_iter()
            .map(|((cluster, stage), choices)| ClusterArms {
                cluster,
                stage,
                choices,
            })
            .collect();
        data.sop_events.sort_by_key(|e| e.task);
        let mut failures: Vec<FailureCount> = self
            .failures
            .into_iter()
            .map(|((class, category), count)| FailureCount {
                class,
                category,
                count,
            })
            .collect();
        failures.sort_by(|a, b| b.count.cmp(&a.count).then(a.class.cmp(&b.class)));
        data.failures = failures;
        data
    }
}

/// Writing a report failed.
#[derive(Debug, thiserror::Error)]
#[error("writing report {path}: {source}")]
pub struct ReportError {
    /// The file or directory at fault.
    pub path: String,
    /// The I/O error.
    pub source: std::io::Error,
}

/// Renders `data` and writes it to `dir/report.html` (creating `dir`); returns the file's path.
pub fn write_report(dir: &Path, data: &ReportData) -> Result<PathBuf, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError {
        path: dir.display().to_string(),
        source,
    })?;
    let path = dir.join("report.html");
    let tmp = dir.join("report.html.tmp");
    std::fs::write(&tmp, render_report(data)).map_err(|source| ReportError {
        path: tmp.display().to_string(),
        source,
    })?;
    std::fs::rename(&tmp, &path).map_err(|source| ReportError {
        path: path.display().to_string(),
        source,
    })?;
    Ok(path)
}

/// `ms` since the Unix epoch as an RFC 3339 UTC time, `2026-11-22T01:50:00.123Z`.
pub fn format_time(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}
