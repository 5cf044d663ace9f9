//! Reflector: consolidation from stage outcomes, near-duplicate merging, contradictions that
//! supersede, infrastructure exclusion and persistence.

use std::collections::BTreeMap;

use hindsight::learn::reflector::*;
use hindsight::{
    ArmChoice, ErrorClass, ExperienceTuple, FailureCategory, Lesson, RunResult, RunState, Step,
};

fn feats(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn outcome(run: usize, filetype: &str, passed: bool, class: Option<ErrorClass>) -> RunOutcome {
    let category = class.map(|c| match c {
        ErrorClass::TransientNetwork | ErrorClass::RateLimit => FailureCategory::Infrastructure,
        _ => FailureCategory::Strategy,
    });
    RunOutcome {
        run_id: format!("run-{run}"),
        features: feats(&[("filetype", filetype), ("bank", ["a", "b", "c"][run % 3])]),
        stages: vec![StageOutcome {
            stage: "extract".into(),
            tool: "pdfminer".into(),
            strategy: "direct".into(),
            passed,
            error_class: if passed { None } else { class },
            category: if passed { None } else { category },
        }],
    }
}

fn lesson(action: &str, pre: &[(&str, &str)], evidence: &[&str], confidence: f64) -> Lesson {
    Lesson {
        lesson_id: String::new(),
        preconditions: feats(pre),
        tool: Some("pdfminer".into()),
        action: action.into(),
        confidence,
        evidence: evidence.iter().map(|s| s.to_string()).collect(),
        source: "reflection".into(),
        scope: "shared".into(),
        created_ms: 0,
        reinforced_ms: 0,
        superseded_by: None,
    }
}

#[test]
fn consolidates_avoid_lesson_per_cluster_from_stage_outcomes() {
    let mut r = Reflector::new(ReflectorConfig::default());
    for i in 0..10 {
        let passed = i == 0;
        r.observe(&outcome(i, "png", passed, Some(ErrorClass::ToolNotFit)));
    }
    // Infrastructure failures are not counted.
    for i in 10..30 {
        r.observe(&outcome(
            i,
            "png",
            false,
            Some(ErrorClass::TransientNetwork),
        ));
    }
    let report = r.consolidate(1_000);
    assert_eq!(report.created.len(), 1, "{report:?}");
    let l = r.lesson(&report.created[0]).unwrap();
    assert_eq!(l.preconditions, feats(&[("filetype", "png")]));
    assert_eq!(
        l.action,
        "avoid pdfminer/direct at stage extract: ToolNotFit 9 of 10"
    );
    assert_eq!(
        describe(l),
        "for filetype=png avoid pdfminer/direct at stage extract: ToolNotFit 9 of 10"
    );
    assert_eq!(l.evidence.len(), 9);
    assert!(l.evidence.iter().all(|e| e != "run-0"));
    assert!((l.confidence - wilson_lower(9, 10, 1.96)).abs() < 1e-12);
    assert_eq!(l.tool.as_deref(), Some("pdfminer"));
    let matching = r.matching(&feats(&[("filetype", "png"), ("bank", "z")]));
    assert_eq!(matching.len(), 1);
    assert!(r.matching(&feats(&[("filetype", "pdf")])).is_empty());
    // Reconsolidating with more evidence updates the same lesson.
    for i in 30..40 {
        r.observe(&outcome(i, "png", false, Some(ErrorClass::ToolNotFit)));
    }
    let again = r.consolidate(2_000);
    assert!(again.updated.contains(&report.created[0]), "{again:?}");
    // The new lessons are per bank (each bank now has enough samples), never about png again.
    for id in &again.created {
        assert!(r.lesson(id).unwrap().preconditions.contains_key("bank"));
    }
    let l = r.lesson(&report.created[0]).unwrap();
    assert_eq!(
        l.action,
        "avoid pdfminer/direct at stage extract: ToolNotFit 19 of 20"
    );
}

#[test]
fn drift_flips_the_lesson_and_supersedes_the_old_one() {
    let mut r = Reflector::new(ReflectorConfig::default());
    for i in 0..10 {
        r.observe(&outcome(i, "png", false, Some(ErrorClass::ToolNotFit)));
    }
    let first = r.consolidate(1).created[0].clone();
    for i in 10..100 {
        r.observe(&outcome(i, "png", true, None));
    }
    let report = r.consolidate(2);
    assert!(report.superseded.contains(&first), "{report:?}");
    let old = r.lesson(&first).unwrap();
    let new_id = old.superseded_by.clone().unwrap();
    let new = r.lesson(&new_id).unwrap();
    assert!(
        new.action.starts_with("prefer pdfminer/direct"),
        "{}",
        new.action
    );
    let png = feats(&[("filetype", "png")]);
    assert_eq!(
        r.active_lessons()
            .filter(|l| l.preconditions == png)
            .count(),
        1
    );
    assert_eq!(
        r.lessons().filter(|l| l.preconditions == png).count(),
        2,
        "the old lesson is kept, not deleted"
    );
}

#[test]
fn near_duplicates_merge_and_unite_evidence() {
    let mut r = Reflector::new(ReflectorConfig::default());
    let a = r.add_lesson(
        lesson(
            "avoid pdfminer/direct for scanned statements: it returns ToolNotFit",
            &[("filetype", "png")],
            &["r1", "r2", "r3"],
            0.9,
        ),
        1,
    );
    let LessonChange::Inserted(id) = a else {
        panic!("{a:?}")
    };
    let b = r.add_lesson(
        lesson(
            "avoid pdfminer/direct for scanned statements, it returns ToolNotFit",
            &[("filetype", "png")],
            &["r3", "r4"],
            0.6,
        ),
        2,
    );
    assert_eq!(b, LessonChange::Merged { into: id.clone() });
    let l = r.lesson(&id).unwrap();
    assert_eq!(l.evidence, vec!["r1", "r2", "r3", "r4"]);
    assert!((l.confidence - (0.9 * 3.0 + 0.6 * 2.0) / 5.0).abs() < 1e-12);
    assert_eq!(l.reinforced_ms, 2);
    // Same words, other preconditions: not a duplicate.
    let c = r.add_lesson(
        lesson(
            "avoid pdfminer/direct for scanned statements: it returns ToolNotFit",
            &[("filetype", "pdf")],
            &["r9"],
            0.9,
        ),
        3,
    );
    assert!(matches!(c, LessonChange::Inserted(_)));
    // An unrelated lesson on the same subject is not merged either.
    let d = r.add_lesson(
        lesson(
            "avoid pdfminer/layout when the statement has more than fifty pages",
            &[("filetype", "png")],
            &["r10"],
            0.7,
        ),
        4,
    );
    assert!(matches!(d, LessonChange::Inserted(_)), "{d:?}");
    assert_eq!(r.active_lessons().count(), 3);
}

#[test]
fn contradiction_supersedes_rather_than_deletes() {
    let mut r = Reflector::new(ReflectorConfig::default());
    let LessonChange::Inserted(old) = r.add_lesson(
        lesson(
            "avoid pdfminer/direct on png",
            &[("filetype", "png")],
            &["r1"],
            0.8,
        ),
        1,
    ) else {
        panic!()
    };
    // Opposite action on another target of the same tool is no contradiction.
    let other = r.add_lesson(
        lesson(
            "prefer pdfminer/ocr on png",
            &[("filetype", "png")],
            &["r2"],
            0.8,
        ),
        2,
    );
    assert!(matches!(other, LessonChange::Inserted(_)), "{other:?}");
    let change = r.add_lesson(
        lesson(
            "use pdfminer/direct on png",
            &[("filetype", "png")],
            &["r3"],
            0.8,
        ),
        3,
    );
    let LessonChange::Superseded { new, old: gone } = change else {
        panic!("{change:?}")
    };
    assert_eq!(gone, vec![old.clone()]);
    assert_eq!(
        r.lesson(&old).unwrap().superseded_by.as_deref(),
        Some(new.as_str())
    );
    assert_eq!(polarity("Do not use x"), Polarity::Avoid);
    assert_eq!(
        target("avoid pdfminer/direct: ToolNotFit"),
        Some("pdfminer/direct".into())
    );
}

#[test]
fn stage_outcomes_come_from_experience_steps() {
    let step = |tool: &str, stage: &str, error: Option<&str>| Step {
        action: "tool_call".into(),
        tool_called: Some(tool.into()),
        error: error.map(str::to_string),
        error_class: error.map(|_| ErrorClass::ToolNotFit),
        metadata: BTreeMap::from([("stage".to_string(), serde_json::json!(stage))]),
        ..Step::default()
    };
    let arm = |stage: &str, tool: &str| ArmChoice {
        stage: stage.into(),
        tool: tool.into(),
        strategy: "direct".into(),
        propensity: 0.5,
    };
    let exp = ExperienceTuple {
        run_id: "r1".into(),
        task_id: "t1".into(),
        plan_id: "p1".into(),
        user_id: None,
        context_features: feats(&[("filetype", "png")]),
        arms: vec![
            arm("extract", "pdfminer"),
            arm("validate", "checker"),
            arm("x", "never"),
        ],
        steps: vec![
            step("pdfminer", "extract", Some("unsupported file type: png")),
            step("checker", "validate", None),
        ],
        result: RunResult {
            state: RunState::Failed,
            passed: false,
            output: None,
            latency_ms: 10.0,
            cost: 0.0,
            attempts: 1,
        },
        reward: 0.0,
        user_feedback: None,
        time_ms: 5,
    };
    let o = RunOutcome::from_experience(&exp);
    assert_eq!(o.stages.len(), 2);
    assert!(!o.stages[0].passed);
    assert_eq!(o.stages[0].error_class, Some(ErrorClass::ToolNotFit));
    assert!(o.stages[1].passed);
}

#[test]
fn snapshot_restores_lessons_and_statistics() {
    let mut r = Reflector::new(ReflectorConfig::default());
    for i in 0..10 {
        r.observe(&outcome(i, "png", false, Some(ErrorClass::ToolNotFit)));
    }
    r.consolidate(1);
    let json = serde_json::to_string(&r.snapshot()).unwrap();
    let back = Reflector::restore(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back, r);
    let bytes = postcard::to_allocvec(&r.snapshot()).unwrap();
    let back = Reflector::restore(postcard::from_bytes(&bytes).unwrap()).unwrap();
    assert_eq!(back, r);
}

/// A consolidation looks again only at the buckets runs changed since the last one (a full pass
/// after a restore or a supersession): the lessons in force are those of a full pass every
/// time, on outcomes whose rates drift (lessons are created, updated, flipped and superseded).
/// The buckets handed over to be persisted are each changed one, once, and with the snapshot
/// without them they restore the reflector.
#[test]
fn consolidating_the_changed_buckets_gives_the_lessons_of_a_full_pass() {
    let mut rng = fastrand::Rng::with_seed(5);
    let mut incremental = Reflector::new(ReflectorConfig::default());
    let mut full = Reflector::new(ReflectorConfig::default());
    let mut persisted: BTreeMap<String, Bucket> = BTreeMap::new();
    let in_force = |r: &Reflector| -> Vec<(BTreeMap<String, String>, String, String)> {
        let mut v: Vec<_> = r
            .active_lessons()
            .map(|l| {
                (
                    l.preconditions.clone(),
                    l.action.clone(),
                    format!("{:.6}", l.confidence),
                )
            })
            .collect();
        v.sort();
        v
    };
    for round in 0..30 {
        // The failure rate of png swings from round to round; pdf stays good.
        let fail_png = if (round / 5) % 2 == 0 { 0.9 } else { 0.1 };
        for i in 0..rng.usize(1..12) {
            let run = round * 100 + i;
            let filetype = ["png", "pdf"][rng.usize(..2)];
            let fails = filetype == "png" && rng.f64() < fail_png;
            let o = outcome(run, filetype, !fails, Some(ErrorClass::ToolNotFit));
            incremental.observe(&o);
            full.observe(&o);
        }
        incremental.consolidate(round as u64);
        // A restored reflector looks at every bucket.
        full = Reflector::restore(full.snapshot()).unwrap();
        full.consolidate(round as u64);
        assert_eq!(in_force(&incremental), in_force(&full), "round {round}");
        persisted.extend(incremental.take_bucket_changes());
        assert!(
            incremental.take_bucket_changes().is_empty(),
            "handed over once"
        );
    }
    let mut snapshot = incremental.snapshot_without_buckets();
    assert!(snapshot.buckets.is_empty());
    snapshot.buckets = persisted;
    assert_eq!(Reflector::restore(snapshot).unwrap(), incremental);
}

#[test]
fn a_lesson_that_only_decayed_reads_the_same_to_memory() {
    let l = lesson("use ocr_v3", &[("filetype", "pdf")], &["r1"], 0.8);
    let mut decayed = l.clone();
    decayed.confidence = 0.6;
    decayed.evidence.push("r2".to_string());
    decayed.reinforced_ms += 1_000;
    assert!(reads_the_same(&l, &decayed));
    assert_eq!(describe(&l), describe(&decayed));
    let mut reworded = l.clone();
    reworded.action = "use pdfminer".to_string();
    assert!(!reads_the_same(&l, &reworded));
    let mut narrowed = l.clone();
    narrowed
        .preconditions
        .insert("tenant".to_string(), "B".to_string());
    assert!(!reads_the_same(&l, &narrowed));
    let mut moved = l.clone();
    moved.scope = "user:u2".to_string();
    assert!(!reads_the_same(&l, &moved));
}
