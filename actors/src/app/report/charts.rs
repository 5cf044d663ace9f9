//! charts: the report's charts, each an inline SVG (or a note when there is nothing to draw):
//! reward per window, cumulative regret, arms per cluster over time, SOP events, failures.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::svg::{
    Domain, PALETTE, Series, axes, empty_note, escape, fin, line_chart, scale, svg_open,
    x_axis_ticks,
};
use super::{
    CHART_HEIGHT, PLOT_HEIGHT, PLOT_LEFT, PLOT_TOP, PLOT_WIDTH, ReportData, STRIP_LEFT, STRIP_ROW,
    STRIP_WIDTH, SopEventKind, WindowStat,
};

/// Mean reward per window: the expected reward of the first attempt's plan (agent, oracle,
/// random: like with like) and the agent's realised reward after recoveries.
pub(super) fn reward_chart(data: &ReportData) -> String {
    if data.windows.is_empty() {
        return empty_note("reward-chart", "No tasks yet.");
    }
    let xs: Vec<f64> = (0..data.windows.len()).map(|i| i as f64).collect();
    let pick = |f: fn(&WindowStat) -> f64| data.windows.iter().map(f).map(fin).collect::<Vec<_>>();
    let series = [
        Series {
            name: "agent expected",
            color: "#4e79a7",
            dash: false,
            ys: pick(|w| w.chosen_expected_reward),
        },
        Series {
            name: "oracle expected",
            color: "#59a14f",
            dash: true,
            ys: pick(|w| w.oracle_mean_reward),
        },
        Series {
            name: "agent realised",
            color: "#f28e2b",
            dash: false,
            ys: pick(|w| w.mean_reward),
        },
        Series {
            name: "random expected",
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
        "Mean reward per window: first-attempt expected (agent, oracle, random) and the agent's realised reward after recoveries",
        &format!("window ({} tasks each)", data.window_size),
        "mean reward",
        &xs,
        &series,
        &domain,
    )
}

/// Cumulative regret against the random baseline's.
pub(super) fn regret_chart(data: &ReportData) -> String {
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

/// The first and last task index the charts span.
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

/// A colour per arm.
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

/// The arm each cluster chose over time, one strip per cluster.
pub(super) fn arms_chart(data: &ReportData) -> String {
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

/// SOP promotions and rollbacks over time.
pub(super) fn sop_chart(data: &ReportData) -> String {
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

/// Failures by error class.
pub(super) fn failures_chart(data: &ReportData) -> String {
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
