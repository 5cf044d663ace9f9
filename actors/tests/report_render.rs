//! The HTML report: its SVG charts hold the data they claim (coordinates are mapped back to the
//! data and compared), text is escaped, and it is written to disk.

use hindsight_actors::app::report::*;

fn outcomes(seed: u64, n: u64) -> ReportBuilder {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = ReportBuilder::new(
        "Learning <report>",
        "bank & statements",
        25,
        1_700_000_000_000,
    );
    let clusters = ["pdf/small", "csv/large", "<script>alert(\"x\")</script>"];
    let arms = ["ocr/fast", "ocr/careful", "parse&split/default"];
    for task in 0..n {
        let cluster = clusters[rng.usize(..clusters.len())];
        let late = task > n / 2;
        let arm = if late {
            arms[0]
        } else {
            arms[rng.usize(..arms.len())]
        };
        let oracle = 0.9;
        let expected = if arm == arms[0] {
            0.88
        } else {
            0.5 + rng.f64() * 0.2
        };
        b.task(TaskOutcome {
            task,
            cluster: cluster.to_string(),
            plan: vec![
                ("extract".to_string(), arm.to_string()),
                ("validate".to_string(), "schema/strict".to_string()),
            ],
            passed: rng.f64() < expected,
            reward: (expected + rng.f64() * 0.1 - 0.05).clamp(0.0, 1.0),
            expected_reward: expected,
            oracle_reward: oracle,
            random_reward: 0.55,
        });
        if rng.f64() < 0.3 {
            b.failure("Timeout", "infrastructure");
        }
        if rng.f64() < 0.1 {
            b.failure("SchemaMismatch", "strategy");
        }
    }
    b.failure("<NotFound>", "strategy");
    b.sop_event(SopEvent {
        task: n / 2,
        sop_id: "sop-pdf".into(),
        version: 1,
        cluster: "pdf/small".into(),
        kind: SopEventKind::Promoted,
    });
    b.sop_event(SopEvent {
        task: n - 10,
        sop_id: "sop-<csv>".into(),
        version: 2,
        cluster: "csv/large".into(),
        kind: SopEventKind::RolledBack,
    });
    b.summary("sops promoted", 1);
    b
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The `<svg id="ID" ...>...</svg>` element.
fn svg<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no svg {id}"));
    let end = html[start..].find("</svg>").unwrap() + start + "</svg>".len();
    &html[start..end]
}

/// Every opening tag `<NAME ...>` in `s`.
fn tags<'a>(s: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name} ");
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find(&open) {
        let end = rest[i..].find('>').unwrap() + i + 1;
        out.push(&rest[i..end]);
        rest = &rest[end..];
    }
    out
}

fn attr(tag: &str, name: &str) -> String {
    let key = format!(" {name}=\"");
    let i = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let j = tag[i..].find('"').unwrap() + i;
    unescape(&tag[i..j])
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name).parse().unwrap()
}

struct Domain {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

fn domain(svg: &str) -> Domain {
    let open = tags(svg, "svg")[0];
    Domain {
        x0: num(open, "data-x-min"),
        x1: num(open, "data-x-max"),
        y0: num(open, "data-y-min"),
        y1: num(open, "data-y-max"),
    }
}

fn data_x(px: f64, d: &Domain, left: f64, width: f64) -> f64 {
    d.x0 + (px - left) / width * (d.x1 - d.x0)
}

fn data_y(py: f64, d: &Domain) -> f64 {
    d.y0 + (PLOT_TOP + PLOT_HEIGHT - py) / PLOT_HEIGHT * (d.y1 - d.y0)
}

/// The points of the polyline of `series`, mapped back to data coordinates.
fn series(svg: &str, name: &str) -> Vec<(f64, f64)> {
    let d = domain(svg);
    let line = tags(svg, "polyline")
        .into_iter()
        .find(|t| attr(t, "data-series") == name)
        .unwrap_or_else(|| panic!("no series {name}"));
    attr(line, "points")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
            (data_x(x, &d, PLOT_LEFT, PLOT_WIDTH), data_y(y, &d))
        })
        .collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn reward_chart_holds_the_windows() {
    let data = outcomes(7, 400).build();
    assert_eq!(data.windows.len(), 16);
    let html = render_report(&data);
    let chart = svg(&html, "reward-chart");
    let d = domain(chart);
    let tol = (d.y1 - d.y0) * 0.001 + 1e-6;
    for (name, pick) in [
        (
            "agent realised",
            (|w: &WindowStat| w.mean_reward) as fn(&WindowStat) -> f64,
        ),
        ("agent expected", |w| w.chosen_expected_reward),
        ("oracle expected", |w| w.oracle_mean_reward),
        ("random expected", |w| w.random_mean_reward),
    ] {
        let pts = series(chart, name);
        assert_eq!(pts.len(), data.windows.len(), "{name}");
        for (i, ((x, y), w)) in pts.iter().zip(&data.windows).enumerate() {
            assert!(close(*x, i as f64, 0.01), "{name} window {i}: x {x}");
            assert!(
                close(*y, pick(w), tol),
                "{name} window {i}: {y} vs {}",
                pick(w)
            );
        }
    }
}

#[test]
fn regret_chart_holds_the_regret() {
    let data = outcomes(11, 300).build();
    let html = render_report(&data);
    let chart = svg(&html, "regret-chart");
    let d = domain(chart);
    let tol = (d.y1 - d.y0) * 0.001 + 1e-6;
    let agent = series(chart, "agent");
    let random = series(chart, "random");
    assert_eq!(agent.len(), data.regret.len());
    for ((a, r), p) in agent.iter().zip(&random).zip(&data.regret) {
        assert!(
            close(a.0, p.task as f64, 0.5),
            "task {} vs x {}",
            p.task,
            a.0
        );
        assert!(close(a.1, p.cumulative_regret, tol));
        assert!(close(r.1, p.random_cumulative_regret, tol));
    }
    // The learner's regret ends below random's, and the ratio in the summary is consistent.
    let ratio = data.regret_ratio().unwrap();
    assert!(ratio > 0.0 && ratio < 1.0, "{ratio}");
    assert!(html.contains(&format!("{ratio:.3}")));
}

#[test]
fn arms_chart_holds_every_choice() {
    let data = outcomes(3, 200).build();
    let html = render_report(&data);
    let chart = svg(&html, "arms-chart");
    let d = domain(chart);
    let groups = tags(chart, "g")
        .into_iter()
        .filter(|t| t.contains("class=\"strip\""))
        .collect::<Vec<_>>();
    assert_eq!(groups.len(), data.cluster_arms.len());
    let rects = tags(chart, "rect")
        .into_iter()
        .filter(|t| t.contains("class=\"choice\""))
        .collect::<Vec<_>>();
    let want: Vec<(u64, String)> = data
        .cluster_arms
        .iter()
        .flat_map(|c| c.choices.iter().map(|a| (a.task, a.arm.clone())))
        .collect();
    let got: Vec<(u64, String)> = rects
        .iter()
        .map(|r| (attr(r, "data-task").parse().unwrap(), attr(r, "data-arm")))
        .collect();
    assert_eq!(got, want);
    for (g, c) in groups.iter().zip(&data.cluster_arms) {
        assert_eq!(attr(g, "data-cluster"), c.cluster);
        assert_eq!(attr(g, "data-stage"), c.stage);
    }
    // Each rectangle starts at its task, and an arm always has the same colour.
    let mut colour = std::collections::BTreeMap::new();
    for r in &rects {
        let task: f64 = attr(r, "data-task").parse().unwrap();
        assert!(close(
            data_x(num(r, "x"), &d, STRIP_LEFT, STRIP_WIDTH),
            task,
            0.01
        ));
        let prev = colour.insert(attr(r, "data-arm"), attr(r, "fill"));
        if let Some(prev) = prev {
            assert_eq!(prev, attr(r, "fill"));
        }
    }
    // Every arm is in the legend.
    for arm in colour.keys() {
        assert!(
            tags(chart, "g")
                .iter()
                .any(|g| g.contains("class=\"legend\"") && attr(g, "data-arm") == *arm),
            "legend lacks {arm}"
        );
    }
}

#[test]
fn sop_chart_marks_every_event() {
    let data = outcomes(5, 200).build();
    let html = render_report(&data);
    let chart = svg(&html, "sop-chart");
    let d = domain(chart);
    let marks = tags(chart, "path")
        .into_iter()
        .filter(|t| t.contains("class=\"sop-event\""))
        .collect::<Vec<_>>();
    assert_eq!(marks.len(), data.sop_events.len());
    for (m, e) in marks.iter().zip(&data.sop_events) {
        assert_eq!(attr(m, "data-kind"), e.kind.as_str());
        assert_eq!(attr(m, "data-sop"), e.sop_id);
        assert_eq!(attr(m, "data-task"), e.task.to_string());
        assert!(close(
            data_x(num(m, "data-x"), &d, PLOT_LEFT, PLOT_WIDTH),
            e.task as f64,
            0.01
        ));
    }
}

#[test]
fn failure_bars_are_proportional_and_labelled() {
    let data = outcomes(9, 300).build();
    assert!(data.failures.len() >= 3);
    let html = render_report(&data);
    let chart = svg(&html, "failures-chart");
    let bars = tags(chart, "rect")
        .into_iter()
        .filter(|t| t.contains("class=\"bar\""))
        .collect::<Vec<_>>();
    assert_eq!(bars.len(), data.failures.len());
    let max = data.failures.iter().map(|f| f.count).max().unwrap() as f64;
    for (bar, f) in bars.iter().zip(&data.failures) {
        assert_eq!(attr(bar, "data-class"), f.class);
        assert_eq!(attr(bar, "data-count"), f.count.to_string());
        let h = num(bar, "height");
        assert!(
            close(h, f.count as f64 / max * PLOT_HEIGHT, 0.01),
            "{} {h}",
            f.class
        );
        // The bar stands on the axis.
        assert!(close(num(bar, "y") + h, PLOT_TOP + PLOT_HEIGHT, 0.01));
        let label = format!(">{}</text>", escape(&f.class));
        assert!(chart.contains(&label), "no label {label}");
    }
}

#[test]
fn text_is_escaped_and_page_is_self_contained() {
    let data = outcomes(1, 120).build();
    let html = render_report(&data);
    assert!(!html.contains("<script"), "unescaped script tag");
    assert!(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"));
    assert!(html.contains("bank &amp; statements"));
    assert!(html.contains("Learning &lt;report&gt;"));
    // No external resources: the only URL is the SVG namespace.
    for (i, _) in html.match_indices("http") {
        assert!(
            html[i..].starts_with("http://www.w3.org/2000/svg"),
            "external reference at {i}"
        );
    }
    for id in [
        "reward-chart",
        "regret-chart",
        "arms-chart",
        "sop-chart",
        "failures-chart",
    ] {
        svg(&html, id);
    }
}

#[test]
fn builder_computes_windows_and_regret() {
    let mut b = ReportBuilder::new("t", "e", 2, 0);
    for (task, reward, expected, passed) in [
        (0u64, 1.0, 0.8, true),
        (1, 0.0, 0.4, false),
        (2, 0.5, 0.9, true),
    ] {
        b.task(TaskOutcome {
            task,
            cluster: "c".into(),
            plan: vec![("s".into(), format!("a{task}"))],
            passed,
            reward,
            expected_reward: expected,
            oracle_reward: 1.0,
            random_reward: 0.5,
        });
    }
    let data = b.build();
    assert_eq!(data.tasks, 3);
    assert_eq!(data.windows.len(), 2);
    assert_eq!(data.windows[0].mean_reward, 0.5);
    assert_eq!(data.windows[0].success_rate, 0.5);
    assert_eq!(data.windows[1].start_task, 2);
    assert_eq!(data.windows[1].tasks, 1);
    let last = data.regret.last().unwrap();
    assert!(close(last.cumulative_regret, 0.2 + 0.6 + 0.1, 1e-12));
    assert!(close(last.random_cumulative_regret, 1.5, 1e-12));
    assert_eq!(data.cluster_arms[0].choices.len(), 3);
}

#[test]
fn empty_report_renders_and_writes() {
    let data = ReportBuilder::new("", "e", 100, 0).build();
    let html = render_report(&data);
    assert!(html.contains("No tasks yet."));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested");
    let path = write_report(&out, &outcomes(2, 50).build()).unwrap();
    assert_eq!(path, out.join("report.html"));
    let written = std::fs::read_to_string(&path).unwrap();
    assert_eq!(written, render_report(&outcomes(2, 50).build()));
}

#[test]
fn the_report_says_when_it_was_generated_as_a_date_and_labels_each_reward() {
    // 1796159864786 ms since the epoch, the figure the report used to print raw.
    let data = ReportBuilder::new("t", "e", 2, 1_796_159_864_786).build();
    let html = render_report(&data);
    assert!(
        html.contains("generated at 2026-12-01T21:17:44.786Z (UTC)"),
        "{html}"
    );
    assert!(!html.contains("since the epoch"));
    let table = html.split("<table id=\"windows\">").nth(1).unwrap();
    for label in [
        "agent expected, first attempt",
        "oracle expected, first attempt",
        "random expected, first attempt",
        "agent realised, after recoveries",
    ] {
        assert!(table.contains(label), "{label}");
    }
}
