//! render: the report as one self-contained HTML page.

use std::fmt::Write as _;

use super::ReportData;
use super::charts::{arms_chart, failures_chart, regret_chart, reward_chart, sop_chart};
use super::svg::{escape, fmt_f};

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
        "<h1>{}</h1><p>Environment <b>{}</b>, {} tasks, windows of {} tasks, generated at {} (UTC).</p>",
        escape(title),
        escape(&data.env),
        data.tasks,
        data.window_size,
        super::format_time(data.generated_ms)
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

    out.push_str("<h2>Reward per window</h2><p>The expected reward of the first attempt's plan, the agent's next to the oracle's and random's (like with like), and the agent's realised reward after its recoveries, which no first-attempt figure includes.</p>");
    out.push_str(&reward_chart(data));
    out.push_str("<table id=\"windows\"><tr><th>window</th><th>first task</th><th>tasks</th><th>success</th><th>agent expected, first attempt</th><th>oracle expected, first attempt</th><th>random expected, first attempt</th><th>agent realised, after recoveries</th></tr>");
    for (i, w) in data.windows.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            w.start_task,
            w.tasks,
            fmt_f(w.success_rate),
            fmt_f(w.chosen_expected_reward),
            fmt_f(w.oracle_mean_reward),
            fmt_f(w.random_mean_reward),
            fmt_f(w.mean_reward)
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
