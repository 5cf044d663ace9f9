//! `hindsight report` after `hindsight demo`: the HTML page exists and its SVG charts hold what
//! the demo's JSON reports (windows and their rewards, the tasks of the regret curve, the error
//! classes of the failures chart).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hindsight_actors::app::report::{PLOT_HEIGHT, PLOT_TOP};
use serde_json::Value;

fn hindsight(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hindsight"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs the demo (150 tasks) and the report; the demo's JSON and the report's HTML.
fn demo_and_report(dir: &Path) -> (Value, String, PathBuf) {
    let data = dir.join("data");
    let out = dir.join("out");
    let demo = hindsight(&[
        "demo",
        "--tasks",
        "150",
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        demo.status.success(),
        "{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    let summary: Value = serde_json::from_slice(&demo.stdout).unwrap();
    let report = hindsight(&[
        "report",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&report.stdout).trim());
    assert!(path.starts_with(&out), "{}", path.display());
    let html = std::fs::read_to_string(&path).unwrap();
    (summary, html, path)
}

/// The text of `<svg id="{id}" ...>...</svg>`.
fn svg<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no svg {id}"));
    let end = html[start..].find("</svg>").unwrap() + start;
    &html[start..end]
}

/// The value of attribute `name` in the first tag of `text`.
fn attr<'a>(text: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let at = text.find(&key).unwrap_or_else(|| panic!("no {name}")) + key.len();
    let end = text[at..].find('"').unwrap() + at;
    &text[at..end]
}

fn num(text: &str, name: &str) -> f64 {
    attr(text, name).parse().unwrap()
}

/// The points of the polyline of series `series`.
fn series(svg: &str, series: &str) -> Vec<(f64, f64)> {
    let at = svg
        .find(&format!("data-series=\"{series}\""))
        .unwrap_or_else(|| panic!("no series {series}"));
    let tag_start = svg[..at].rfind('<').unwrap();
    attr(&svg[tag_start..], "points")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// The failures chart's bars: class -> count.
fn bars(svg: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (i, _) in svg.match_indices("<rect class=\"bar\"") {
        let tag = &svg[i..];
        *out.entry(attr(tag, "data-class").to_string()).or_insert(0) +=
            num(tag, "data-count") as u64;
    }
    out
}

#[test]
fn the_report_charts_hold_the_windows_and_classes_of_the_demo() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, html, path) = demo_and_report(dir.path());
    assert_eq!(path.file_name().unwrap(), "report.html");
    assert!(html.starts_with("<!DOCTYPE html>") || html.starts_with("<!doctype html>"));

    // Reward per window: one point per window of the demo, at the demo's mean rewards.
    let windows = summary["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "150 tasks in windows of 100");
    let chart = svg(&html, "reward-chart");
    let (y0, y1) = (num(chart, "data-y-min"), num(chart, "data-y-max"));
    let back = |py: f64| y0 + (PLOT_TOP + PLOT_HEIGHT - py) / PLOT_HEIGHT * (y1 - y0);
    for (name, key) in [
        ("agent realised", "mean_reward"),
        ("agent expected", "chosen_expected_reward"),
        ("oracle expected", "oracle_mean_reward"),
        ("random expected", "random_mean_reward"),
    ] {
        let points = series(chart, name);
        assert_eq!(points.len(), windows.len(), "{name}");
        for (w, (_, py)) in windows.iter().zip(points) {
            let want = w[key].as_f64().unwrap();
            assert!(
                (back(py) - want).abs() < 1e-3,
                "{name}: drawn {} for window {} of mean {want}",
                back(py),
                w["from"]
            );
        }
    }

    // Regret: one point per task.
    let regret = svg(&html, "regret-chart");
    assert_eq!(
        series(regret, "agent").len() as u64,
        summary["tasks"].as_u64().unwrap()
    );

    // Failures: bars for error classes the demo saw.
    let demo_classes: BTreeMap<String, u64> =
        serde_json::from_value(summary["tool_errors"].clone()).unwrap();
    let drawn = bars(svg(&html, "failures-chart"));
    assert!(
        !drawn.is_empty(),
        "the demo had tool errors: {demo_classes:?}"
    );
    for class in drawn.keys() {
        assert!(
            demo_classes.contains_key(class),
            "the report draws {class}, which the demo never reported: {demo_classes:?}"
        );
    }
}

/// The failures chart counts every failed tool call by class, as the demo's `tool_errors` does.
///
/// Ignored until `demo::report_data` counts the tool errors of every call (retries included) from
/// the stored run outcomes (`orchestrator::OUTCOMES`, field `tool_errors`) instead of the final
/// error of each stage in the experience log, which drops the infrastructure errors that retries
/// absorbed and adds validation rejections as `SchemaMismatch`.
#[test]
fn the_failures_chart_counts_what_the_demo_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, html, _) = demo_and_report(dir.path());
    let demo_classes: BTreeMap<String, u64> =
        serde_json::from_value(summary["tool_errors"].clone()).unwrap();
    assert_eq!(bars(svg(&html, "failures-chart")), demo_classes);
}

#[test]
fn report_without_a_database_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    let out = hindsight(&["report", "--data", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("there is no database at"), "{err}");
    assert!(!missing.exists(), "report must not create a data directory");
}
