//! The learning report: [`ReportData`] (what happened over a sequence of tasks), a
//! [`ReportBuilder`] that derives it from per-task outcomes, and [`render_report`], a
//! self-contained HTML page with inline SVG charts (no script, no external asset): reward per
//! window against the oracle and random, cumulative regret, the arm each cluster chose over time,
//! SOP promotions and rollbacks, and failures by error class.
//!
//! Every SVG carries its data domain (`data-x-min`, `data-x-max`, `data-y-min`, `data-y-max`) and
//! the plot area is fixed by the `PLOT_*` constants, so a reader (or a test) can map the drawn
//! coordinates back to the data.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// Mean realised reward of the agent.
    pub mean_reward: f64,
    /// Mean expected reward of the oracle's plans.
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

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A finite number or 0.
fn fin(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Linear map of `v` from `[d0, d1]` to `[r0, r1]`.
fn scale(v: f64, d0: f64, d1: f64, r0: f64, r1: f64) -> f64 {
    if d1 == d0 {
        return (r0 + r1) / 2.0;
    }
    r0 + (fin(v) - d0) / (d1 - d0) * (r1 - r0)
}

const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1b9e77", "#7570b3",
];

/// One line of a line chart.
struct Series<'a> {
    name: &'a str,
    color: &'a str,
    dash: bool,
    ys: Vec<f64>,
}

/// Domain of a line chart.
struct Domain {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

fn svg_open(out: &mut String, id: &str, height: f64, domain: &Domain, label: &str) {
    let _ = write!(
        out,
        "<svg id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_WIDTH}\" height=\"{height}\" viewBox=\"0 0 {CHART_WIDTH} {height}\" role=\"img\" aria-label=\"{}\" data-x-min=\"{}\" data-x-max=\"{}\" data-y-min=\"{}\" data-y-max=\"{}\">",
        escape(label),
        domain.x0,
        domain.x1,
        domain.y0,
        domain.y1
    );
}

/// Round tick values (steps of 1, 2 or 5 times a power of ten) within `[lo, hi]`.
fn nice_ticks(lo: f64, hi: f64, target: usize, integer: bool) -> Vec<f64> {
    if hi <= lo || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    if integer {
        step = step.max(1.0).round();
    }
    let first = (lo / step).ceil() * step;
    (0..=target * 3)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

fn axes(out: &mut String, d: &Domain, x_label: &str, y_label: &str, x_ticks: bool, integer: bool) {
    let bottom = PLOT_TOP + PLOT_HEIGHT;
    for v in nice_ticks(d.y0, d.y1, 5, integer) {
        let y = scale(v, d.y0, d.y1, bottom, PLOT_TOP);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{PLOT_LEFT}\" y1=\"{y:.3}\" x2=\"{:.3}\" y2=\"{y:.3}\" stroke=\"#e5e5e5\"/><text x=\"{:.3}\" y=\"{:.3}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            PLOT_LEFT + PLOT_WIDTH,
            PLOT_LEFT - 4.0,
            y + 3.0,
            tick_label(v)
        );
    }
    if x_ticks {
        x_axis_ticks(out, d.x0, d.x1, PLOT_LEFT, PLOT_WIDTH, bottom + 14.0);
    }
    let _ = write!(
        out,
        "<line x1=\"{PLOT_LEFT}\" y1=\"{bottom}\" x2=\"{:.3}\" y2=\"{bottom}\" stroke=\"#333\"/><line x1=\"{PLOT_LEFT}\" y1=\"{PLOT_TOP}\" x2=\"{PLOT_LEFT}\" y2=\"{bottom}\" stroke=\"#333\"/>",
        PLOT_LEFT + PLOT_WIDTH
    );
    let _ = write!(
        out,
        "<text x=\"{:.3}\" y=\"{:.3}\" font-size=\"11\" text-anchor=\"middle\">{}</text><text x=\"12\" y=\"{:.3}\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 {:.3})\">{}</text>",
        PLOT_LEFT + PLOT_WIDTH / 2.0,
        bottom + 34.0,
        escape(x_label),
        PLOT_TOP + PLOT_HEIGHT / 2.0,
        PLOT_TOP + PLOT_HEIGHT / 2.0,
        escape(y_label)
    );
}

/// Tick labels of an x axis over `[x0, x1]` drawn from `left` over `width`, at height `y`.
fn x_axis_ticks(out: &mut String, x0: f64, x1: f64, left: f64, width: f64, y: f64) {
    for v in nice_ticks(x0, x1, 6, true) {
        let x = scale(v, x0, x1, left, left + width);
        let _ = write!(
            out,
            "<text x=\"{x:.3}\" y=\"{y:.3}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
            tick_label(v)
        );
    }
}

fn tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}")
    }
}

fn line_chart(
    id: &str,
    label: &str,
    x_label: &str,
    y_label: &str,
    xs: &[f64],
    series: &[Series<'_>],
    domain: &Domain,
) -> String {
    let mut out = String::new();
    svg_open(&mut out, id, CHART_HEIGHT, domain, label);
    axes(&mut out, domain, x_label, y_label, true, false);
    for s in series {
        let mut points = String::new();
        for (x, y) in xs.iter().zip(&s.ys) {
            let px = scale(*x, domain.x0, domain.x1, PLOT_LEFT, PLOT_LEFT + PLOT_WIDTH);
            let py = scale(*y, domain.y0, domain.y1, PLOT_TOP + PLOT_HEIGHT, PLOT_TOP);
            let _ = write!(points, "{px:.3},{py:.3} ");
        }
        let dash = if s.dash {
            " stroke-dasharray=\"5 3\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash} points=\"{}\"><title>{}</title></polyline>",
            escape(s.name),
            s.color,
            points.trim_end(),
            escape(s.name)
        );
    }
    // Legend.
    for (i, s) in series.iter().enumerate() {
        let x = PLOT_LEFT + 12.0 + i as f64 * 130.0;
        let _ = write!(
            out,
            "<rect x=\"{x:.3}\" y=\"{:.3}\" width=\"12\" height=\"4\" fill=\"{}\"/><text x=\"{:.3}\" y=\"{:.3}\" font-size=\"11\">{}</text>",
            PLOT_TOP + 4.0,
            s.color,
            x + 16.0,
            PLOT_TOP + 9.0,
            escape(s.name)
        );
    }
    out.push_str("</svg>");
    out
}

fn reward_chart(data: &ReportData) -> String {
    if data.windows.is_empty() {
        return empty_note("reward-chart", "No tasks yet.");
    }
    let xs: Vec<f64> = (0..data.windows.len()).map(|i| i as f64).collect();
    let pick = |f: fn(&WindowStat) -> f64| data.windows.iter().map(f).map(fin).collect::<Vec<_>>();
    let series = [
        Series {
            name: "agent",
            color: "#4e79a7",
            dash: false,
            ys: pick(|w| w.mean_reward),
        },
        Series {
            name: "oracle",
            color: "#59a14f",
            dash: true,
            ys: pick(|w| w.oracle_mean_reward),
        },
        Series {
            name: "random",
            color: "#e15759",
            dash: true,
            ys: pick(|w| w.random_mean_reward),
        },
    ];
    let all = series.iter().flat_map(|s| s.ys.iter().copied());
    let (lo, hi) = all.fold((0.0f64, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let domain = Domain {
        x0: 0.0,
        x1: (xs.len() as f64 - 1.0).max(1.0),
        y0: lo,
        y1: hi,
    };
    line_chart(
        "reward-chart",
        "Mean reward per window: agent, oracle and random",
        &format!("window ({} tasks each)", data.window_size),
        "mean reward",
        &xs,
        &series,
        &domain,
    )
}

fn regret_chart(data: &ReportData) -> String {
    if data.regret.is_empty() {
        return empty_note("regret-chart", "No tasks yet.");
    }
    let xs: Vec<f64> = data.regret.iter().map(|p| p.task as f64).collect();
    let series = [
        Series {
            name: "agent",
            color: "#4e79a7",
            dash: false,
            ys: data
                .regret
                .iter()
                .map(|p| fin(p.cumulative_regret))
                .collect(),
        },
        Series {
            name: "random",
            color: "#e15759",
            dash: true,
            ys: data
                .regret
                .iter()
                .map(|p| fin(p.random_cumulative_regret))
                .collect(),
        },
    ];
    let all = series.iter().flat_map(|s| s.ys.iter().copied());
    let (lo, hi) = all.fold((0.0f64, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let x0 = xs.first().copied().unwrap_or(0.0);
    let x1 = xs.last().copied().unwrap_or(0.0);
    let domain = Domain {
        x0,
        x1: if x1 > x0 { x1 } else { x0 + 1.0 },
        y0: lo,
        y1: if hi > lo { hi } else { lo + 1.0 },
    };
    line_chart(
        "regret-chart",
        "Cumulative regret: agent and random",
        "task",
        "cumulative regret",
        &xs,
        &series,
        &domain,
    )
}

fn task_span(data: &ReportData) -> (f64, f64) {
    let tasks = data
        .regret
        .iter()
        .map(|p| p.task)
        .chain(
            data.cluster_arms
                .iter()
                .flat_map(|c| c.choices.iter().map(|a| a.task)),
        )
        .chain(data.sop_events.iter().map(|e| e.task));
    let (lo, hi) = tasks.fold((u64::MAX, 0u64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    if lo == u64::MAX {
        (0.0, 1.0)
    } else {
        (lo as f64, hi as f64 + 1.0)
    }
}

fn arm_colors(data: &ReportData) -> BTreeMap<&str, &'static str> {
    let mut arms: Vec<&str> = data
        .cluster_arms
        .iter()
        .flat_map(|c| c.choices.iter().map(|a| a.arm.as_str()))
        .collect();
    arms.sort_unstable();
    arms.dedup();
    arms.into_iter()
        .enumerate()
        .map(|(i, a)| (a, PALETTE[i % PALETTE.len()]))
        .collect()
}

fn arms_chart(data: &ReportData) -> String {
    if data.cluster_arms.is_empty() {
        return empty_note("arms-chart", "No choices yet.");
    }
    let (x0, x1) = task_span(data);
    let colors = arm_colors(data);
    let rows = data.cluster_arms.len() as f64;
    let legend_rows = (colors.len() as f64 / 3.0).ceil();
    let height = PLOT_TOP + rows * STRIP_ROW + 34.0 + legend_rows * 16.0;
    let mut out = String::new();
    let domain = Domain {
        x0,
        x1,
        y0: 0.0,
        y1: rows,
    };
    svg_open(
        &mut out,
        "arms-chart",
        height,
        &domain,
        "Arm chosen by each cluster and stage over time",
    );
    for (r, row) in data.cluster_arms.iter().enumerate() {
        let y = PLOT_TOP + r as f64 * STRIP_ROW;
        let _ = write!(
            out,
            "<g class=\"strip\" data-cluster=\"{}\" data-stage=\"{}\"><text x=\"{:.3}\" y=\"{:.3}\" font-size=\"10\" text-anchor=\"end\">{} · {}</text>",
            escape(&row.cluster),
            escape(&row.stage),
            STRIP_LEFT - 6.0,
            y + STRIP_ROW * 0.7,
            escape(&row.cluster),
            escape(&row.stage)
        );
        for (i, choice) in row.choices.iter().enumerate() {
            let next = row
                .choices
                .get(i + 1)
                .map_or(choice.task as f64 + 1.0, |n| n.task as f64);
            let left = scale(
                choice.task as f64,
                x0,
                x1,
                STRIP_LEFT,
                STRIP_LEFT + STRIP_WIDTH,
            );
            let right = scale(next, x0, x1, STRIP_LEFT, STRIP_LEFT + STRIP_WIDTH);
            let color = colors.get(choice.arm.as_str()).copied().unwrap_or("#999");
            let _ = write!(
                out,
                "<rect class=\"choice\" data-task=\"{}\" data-arm=\"{}\" x=\"{left:.3}\" y=\"{:.3}\" width=\"{:.3}\" height=\"{:.3}\" fill=\"{color}\"><title>task {}: {}</title></rect>",
                choice.task,
                escape(&choice.arm),
                y + 1.0,
                (right - left).max(0.5),
                STRIP_ROW - 2.0,
                choice.task,
                escape(&choice.arm)
            );
        }
        out.push_str("</g>");
    }
    let axis_y = PLOT_TOP + rows * STRIP_ROW + 12.0;
    x_axis_ticks(&mut out, x0, x1, STRIP_LEFT, STRIP_WIDTH, axis_y);
    for (i, (arm, color)) in colors.iter().enumerate() {
        let x = 20.0 + (i % 3) as f64 * 230.0;
        let y = axis_y + 16.0 + (i / 3) as f64 * 16.0;
        let _ = write!(
            out,
            "<g class=\"legend\" data-arm=\"{}\"><rect x=\"{x:.3}\" y=\"{:.3}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{:.3}\" y=\"{y:.3}\" font-size=\"11\">{}</text></g>",
            escape(arm),
            y - 9.0,
            x + 14.0,
            escape(arm)
        );
    }
    out.push_str("</svg>");
    out
}

fn sop_chart(data: &ReportData) -> String {
    if data.sop_events.is_empty() {
        return empty_note("sop-chart", "No SOP was promoted or rolled back.");
    }
    let (x0, x1) = task_span(data);
    let height = 104.0;
    let domain = Domain {
        x0,
        x1,
        y0: 0.0,
        y1: 1.0,
    };
    let mut out = String::new();
    svg_open(
        &mut out,
        "sop-chart",
        height,
        &domain,
        "SOP promotions and rollbacks over time",
    );
    let mid = 50.0;
    let _ = write!(
        out,
        "<line x1=\"{PLOT_LEFT}\" y1=\"{mid}\" x2=\"{:.3}\" y2=\"{mid}\" stroke=\"#333\"/>",
        PLOT_LEFT + PLOT_WIDTH
    );
    for e in &data.sop_events {
        let x = scale(e.task as f64, x0, x1, PLOT_LEFT, PLOT_LEFT + PLOT_WIDTH);
        let (path, color) = match e.kind {
            SopEventKind::Promoted => (
                format!(
                    "M{:.3},{:.3} L{:.3},{:.3} L{:.3},{:.3} Z",
                    x,
                    mid - 14.0,
                    x - 6.0,
                    mid - 2.0,
                    x + 6.0,
                    mid - 2.0
                ),
                "#59a14f",
            ),
            SopEventKind::RolledBack => (
                format!(
                    "M{:.3},{:.3} L{:.3},{:.3} L{:.3},{:.3} Z",
                    x,
                    mid + 14.0,
                    x - 6.0,
                    mid + 2.0,
                    x + 6.0,
                    mid + 2.0
                ),
                "#e15759",
            ),
        };
        let label_y = match e.kind {
            SopEventKind::Promoted => mid - 17.0,
            SopEventKind::RolledBack => mid + 25.0,
        };
        let _ = write!(
            out,
            "<text x=\"{x:.3}\" y=\"{label_y:.3}\" font-size=\"9\" text-anchor=\"middle\">{} v{}</text>",
            escape(&e.sop_id),
            e.version
        );
        let _ = write!(
            out,
            "<path class=\"sop-event\" data-kind=\"{}\" data-task=\"{}\" data-sop=\"{}\" data-x=\"{x:.3}\" d=\"{path}\" fill=\"{color}\"><title>task {}: {} v{} {} ({})</title></path>",
            e.kind.as_str(),
            e.task,
            escape(&e.sop_id),
            e.task,
            escape(&e.sop_id),
            e.version,
            e.kind.as_str().replace('_', " "),
            escape(&e.cluster)
        );
    }
    x_axis_ticks(&mut out, x0, x1, PLOT_LEFT, PLOT_WIDTH, mid + 44.0);
    let _ = write!(
        out,
        "<text x=\"{PLOT_LEFT}\" y=\"12\" font-size=\"11\" fill=\"#59a14f\">▲ promoted</text><text x=\"{:.3}\" y=\"12\" font-size=\"11\" fill=\"#e15759\">▼ rolled back</text>",
        PLOT_LEFT + 100.0
    );
    out.push_str("</svg>");
    out
}

fn failures_chart(data: &ReportData) -> String {
    if data.failures.is_empty() {
        return empty_note("failures-chart", "No failed tool calls.");
    }
    let max = data
        .failures
        .iter()
        .map(|f| f.count)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let n = data.failures.len() as f64;
    let slot = PLOT_WIDTH / n;
    let width = slot * 0.7;
    let domain = Domain {
        x0: 0.0,
        x1: n,
        y0: 0.0,
        y1: max,
    };
    let mut out = String::new();
    svg_open(
        &mut out,
        "failures-chart",
        CHART_HEIGHT,
        &domain,
        "Failed tool calls by error class",
    );
    axes(
        &mut out,
        &domain,
        "error class",
        "failed calls",
        false,
        true,
    );
    for (i, (name, color)) in [
        ("infrastructure", "#f28e2b"),
        ("strategy", "#4e79a7"),
        ("unknown", "#bab0ac"),
    ]
    .iter()
    .enumerate()
    {
        let x = PLOT_LEFT + PLOT_WIDTH - 330.0 + i as f64 * 110.0;
        let _ = write!(
            out,
            "<rect x=\"{x:.3}\" y=\"{:.3}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{:.3}\" y=\"{:.3}\" font-size=\"11\">{name}</text>",
            PLOT_TOP,
            x + 14.0,
            PLOT_TOP + 9.0
        );
    }
    let bottom = PLOT_TOP + PLOT_HEIGHT;
    for (i, f) in data.failures.iter().enumerate() {
        let h = f.count as f64 / max * PLOT_HEIGHT;
        let x = PLOT_LEFT + i as f64 * slot + (slot - width) / 2.0;
        let color = match f.category.as_str() {
            "infrastructure" => "#f28e2b",
            "strategy" => "#4e79a7",
            _ => "#bab0ac",
        };
        let _ = write!(
            out,
            "<rect class=\"bar\" data-class=\"{}\" data-category=\"{}\" data-count=\"{}\" x=\"{x:.3}\" y=\"{:.3}\" width=\"{width:.3}\" height=\"{h:.3}\" fill=\"{color}\"><title>{}: {} ({})</title></rect><text class=\"bar-label\" x=\"{:.3}\" y=\"{:.3}\" font-size=\"10\" text-anchor=\"middle\">{}</text><text x=\"{:.3}\" y=\"{:.3}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
            escape(&f.class),
            escape(&f.category),
            f.count,
            bottom - h,
            escape(&f.class),
            f.count,
            escape(&f.category),
            x + width / 2.0,
            bottom + 12.0 + (i % 2) as f64 * 10.0,
            escape(&f.class),
            x + width / 2.0,
            bottom - h - 3.0,
            f.count
        );
    }
    out.push_str("</svg>");
    out
}

fn empty_note(id: &str, text: &str) -> String {
    format!("<p class=\"empty\" id=\"{id}\">{}</p>", escape(text))
}

fn fmt_f(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "n/a".to_string()
    }
}

/// The report as one self-contained HTML page (inline CSS and SVG, no script).
pub fn render_report(data: &ReportData) -> String {
    let mut out = String::new();
    let title = if data.title.is_empty() {
        "hindsight report"
    } else {
        data.title.as_str()
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>body{{font-family:system-ui,sans-serif;margin:2em auto;max-width:760px;color:#222}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}th{{background:#f4f4f4}}td.l,th.l{{text-align:left}}svg{{display:block;margin:0.5em 0}}.empty{{color:#777}}</style></head><body>",
        escape(title)
    );
    let _ = write!(
        out,
        "<h1>{}</h1><p>Environment <b>{}</b>, {} tasks, windows of {} tasks, generated at {} ms since the epoch.</p>",
        escape(title),
        escape(&data.env),
        data.tasks,
        data.window_size,
        data.generated_ms
    );
    out.push_str("<table id=\"summary\"><tr><th class=\"l\">figure</th><th>value</th></tr>");
    if let Some(last) = data.regret.last() {
        let _ = write!(
            out,
            "<tr><td class=\"l\">cumulative regret</td><td>{}</td></tr><tr><td class=\"l\">random cumulative regret</td><td>{}</td></tr>",
            fmt_f(last.cumulative_regret),
            fmt_f(last.random_cumulative_regret)
        );
    }
    if let Some(r) = data.regret_ratio() {
        let _ = write!(
            out,
            "<tr><td class=\"l\">regret ratio</td><td>{}</td></tr>",
            fmt_f(r)
        );
    }
    for (k, v) in &data.summary {
        let _ = write!(
            out,
            "<tr><td class=\"l\">{}</td><td>{}</td></tr>",
            escape(k),
            escape(v)
        );
    }
    out.push_str("</table>");

    out.push_str("<h2>Reward per window</h2>");
    out.push_str(&reward_chart(data));
    out.push_str("<table id=\"windows\"><tr><th>window</th><th>first task</th><th>tasks</th><th>success</th><th>reward</th><th>oracle</th><th>random</th></tr>");
    for (i, w) in data.windows.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            w.start_task,
            w.tasks,
            fmt_f(w.success_rate),
            fmt_f(w.mean_reward),
            fmt_f(w.oracle_mean_reward),
            fmt_f(w.random_mean_reward)
        );
    }
    out.push_str("</table>");

    out.push_str("<h2>Cumulative regret</h2>");
    out.push_str(&regret_chart(data));

    out.push_str("<h2>Arm chosen per cluster over time</h2>");
    out.push_str(&arms_chart(data));

    out.push_str("<h2>SOP promotions and rollbacks</h2>");
    out.push_str(&sop_chart(data));
    if !data.sop_events.is_empty() {
        out.push_str("<table id=\"sop-events\"><tr><th>task</th><th class=\"l\">SOP</th><th>version</th><th class=\"l\">cluster</th><th class=\"l\">event</th></tr>");
        for e in &data.sop_events {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                e.task,
                escape(&e.sop_id),
                e.version,
                escape(&e.cluster),
                e.kind.as_str().replace('_', " ")
            );
        }
        out.push_str("</table>");
    }

    out.push_str("<h2>Failures by error class</h2>");
    out.push_str(&failures_chart(data));
    out.push_str("</body></html>\n");
    out
}
