//! svg: the drawing shared by the charts: escaping, scales and nice ticks, axes, line charts.

use std::fmt::Write as _;

use super::{CHART_HEIGHT, CHART_WIDTH, PLOT_HEIGHT, PLOT_LEFT, PLOT_TOP, PLOT_WIDTH};

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
pub(super) fn fin(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Linear map of `v` from `[d0, d1]` to `[r0, r1]`.
pub(super) fn scale(v: f64, d0: f64, d1: f64, r0: f64, r1: f64) -> f64 {
    if d1 == d0 {
        return (r0 + r1) / 2.0;
    }
    r0 + (fin(v) - d0) / (d1 - d0) * (r1 - r0)
}

/// Colours of the series and arms, in order.
pub(super) const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1b9e77", "#7570b3",
];

/// One line of a line chart.
pub(super) struct Series<'a> {
    /// Its name in the legend.
    pub(super) name: &'a str,
    /// Its stroke colour.
    pub(super) color: &'a str,
    /// Drawn dashed.
    pub(super) dash: bool,
    /// One value per window.
    pub(super) ys: Vec<f64>,
}

/// Domain of a line chart.
pub(super) struct Domain {
    /// Smallest x.
    pub(super) x0: f64,
    /// Largest x.
    pub(super) x1: f64,
    /// Smallest y.
    pub(super) y0: f64,
    /// Largest y.
    pub(super) y1: f64,
}

/// Opens an `<svg>` of the chart width and `height`, carrying `domain` as data attributes.
pub(super) fn svg_open(out: &mut String, id: &str, height: f64, domain: &Domain, label: &str) {
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

/// The plot area's axes with their ticks and labels.
pub(super) fn axes(
    out: &mut String,
    d: &Domain,
    x_label: &str,
    y_label: &str,
    x_ticks: bool,
    integer: bool,
) {
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
pub(super) fn x_axis_ticks(out: &mut String, x0: f64, x1: f64, left: f64, width: f64, y: f64) {
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

/// A line chart of `series` over `xs` in `domain`, with axes and a legend.
pub(super) fn line_chart(
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

/// The note shown in a chart's place when it has nothing to draw.
pub(super) fn empty_note(id: &str, text: &str) -> String {
    format!("<p class=\"empty\" id=\"{id}\">{}</p>", escape(text))
}

/// A number with three decimals, or `n/a`.
pub(super) fn fmt_f(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "n/a".to_string()
    }
}
