//! The error classifier on the labelled corpus of real error messages, and on adversarial input.

use std::time::Instant;

use hindsight::triage::classify_error;
use serde::Deserialize;

#[derive(Deserialize)]
struct Labelled {
    error_type: Option<String>,
    error_message: String,
    category: String,
    error_class: String,
}

fn corpus() -> Vec<Labelled> {
    load("errors.jsonl")
}

fn load(name: &str) -> Vec<Labelled> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}", i + 1)))
        .collect()
}

/// Category and class accuracy over `rows`, printing each miss.
fn accuracy(rows: &[Labelled]) -> (f64, f64) {
    accuracy_of(rows, true)
}

/// Category and class accuracy over `rows`, printing each miss if `show_misses`.
fn accuracy_of(rows: &[Labelled], show_misses: bool) -> (f64, f64) {
    let (mut cat_ok, mut class_ok, mut both_ok) = (0usize, 0usize, 0usize);
    for r in rows {
        let c = classify_error(r.error_type.as_deref(), &r.error_message);
        let cat = c.category.as_str() == r.category;
        let class = c.error_class.as_str() == r.error_class;
        cat_ok += cat as usize;
        class_ok += class as usize;
        both_ok += (cat && class) as usize;
        if show_misses && !(cat && class) {
            println!(
                "MISS {:?} {:?}: got {}/{} ({}), want {}/{}",
                r.error_type,
                r.error_message.chars().take(100).collect::<String>(),
                c.category,
                c.error_class,
                c.rule,
                r.category,
                r.error_class
            );
        }
    }
    let n = rows.len() as f64;
    let (cat, class, _) = (cat_ok as f64 / n, class_ok as f64 / n, both_ok as f64 / n);
    println!(
        "{} rows; category accuracy {:.1}%, class accuracy {:.1}%, both {:.1}%",
        rows.len(),
        cat * 100.0,
        class * 100.0,
        both_ok as f64 / n * 100.0
    );
    (cat, class)
}

#[test]
fn corpus_accuracy_is_well_over_90_percent() {
    let rows = corpus();
    assert!(rows.len() >= 300, "corpus has {} rows", rows.len());
    print!("corpus: ");
    let (cat, class) = accuracy(&rows);
    assert!(cat >= 0.95, "category accuracy {cat}");
    assert!(class >= 0.93, "class accuracy {class}");
}

/// Messages written after the rules were frozen (never tuned against): an out-of-sample check.
#[test]
fn holdout_accuracy() {
    let rows = load("errors_holdout.jsonl");
    print!("holdout: ");
    let (cat, class) = accuracy(&rows);
    assert!(cat >= 0.8, "holdout category accuracy {cat}");
    assert!(class >= 0.75, "holdout class accuracy {class}");
}

/// Real-world messages written for issue 57 before any rule change and never tuned on
/// (`tests/fixtures/README.md`): the out-of-sample accuracy the issue asks for. Its misses are not
/// printed, so that no rule is written against them.
#[test]
fn heldout_real_accuracy_is_at_least_90_percent() {
    let rows = load("errors_heldout_real.jsonl");
    assert!(rows.len() >= 150, "held-out set has {} rows", rows.len());
    print!("held-out real: ");
    let (cat, _) = accuracy_of(&rows, false);
    assert!(cat >= 0.90, "held-out real category accuracy {cat}");
}

#[test]
fn corpus_covers_every_category_and_class() {
    let rows = corpus();
    for cat in ["infrastructure", "strategy", "unknown"] {
        assert!(rows.iter().any(|r| r.category == cat), "{cat}");
    }
    for class in hindsight::ErrorClass::ALL {
        assert!(
            rows.iter().any(|r| r.error_class == class.as_str()),
            "{class}"
        );
    }
}

/// Median of a few timings of classifying `msg`, in nanoseconds.
fn time_ns(msg: &str) -> u128 {
    let mut v: Vec<u128> = (0..5)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(classify_error(Some("Error"), std::hint::black_box(msg)));
            t.elapsed().as_nanos()
        })
        .collect();
    v.sort_unstable();
    v[2]
}

#[test]
fn adversarial_inputs_classify_in_linear_time() {
    // promptise's quadratic case: "status" followed by 40,000 spaces.
    let spaces = format!("status{}", " ".repeat(40_000));
    let t = Instant::now();
    let c = classify_error(None, &spaces);
    assert!(t.elapsed().as_secs_f64() < 1.0);
    assert_eq!(c.category.as_str(), "unknown");
    let spaced_status = format!("status{}503", " ".repeat(40_000));
    assert_eq!(classify_error(None, &spaced_status).rule, "http_status_503");

    // Linear: 16x the input costs far less than 16^2 the time (the message is also bounded, so
    // beyond the bound it costs about the same).
    let unit = "status 5 code= HTTP/ x connection ".repeat(2_000); // ~68 KB
    let big = unit.repeat(16); // ~1 MB
    let small_ns = time_ns(&unit).max(1);
    let big_ns = time_ns(&big);
    assert!(
        big_ns < small_ns * 64,
        "1 MB took {big_ns} ns, 68 KB took {small_ns} ns"
    );
    let t = Instant::now();
    let mb = "a".repeat(1 << 20) + " HTTP 503";
    let c = classify_error(None, &mb);
    assert!(t.elapsed().as_secs_f64() < 1.0);
    assert_eq!(c.rule, "http_status_503", "the tail is kept");
    let spaces_mb = " ".repeat(1 << 20);
    let t = Instant::now();
    classify_error(Some(&spaces_mb), &spaces_mb);
    assert!(t.elapsed().as_secs_f64() < 1.0);
}
