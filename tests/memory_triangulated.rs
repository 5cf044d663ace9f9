//! Triangulated memory: graph statistics, vector index, cited deduplicated retrieval,
//! salience-gated writes and persistence.

use std::collections::BTreeMap;

use hindsight::memory::*;
use hindsight::{ArmChoice, DiaryEntry, ErrorClass, ExperienceTuple, RunResult, RunState, Step};

fn feats(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One run of a single-stage plan `tool/strategy` with the given outcome.
fn exp(
    run: usize,
    filetype: &str,
    tool: &str,
    error: Option<&str>,
    latency: f64,
) -> ExperienceTuple {
    let mut step = Step {
        action: "tool_call".into(),
        tool_called: Some(tool.into()),
        error: error.map(str::to_string),
        latency_ms: latency,
        ..Step::default()
    };
    step.metadata
        .insert("stage".into(), serde_json::json!("extract"));
    if error.is_some_and(|e| e.contains("unsupported")) {
        step.error_class = Some(ErrorClass::ToolNotFit);
    }
    ExperienceTuple {
        run_id: format!("run-{run}"),
        task_id: format!("task-{run}"),
        plan_id: "p".into(),
        user_id: None,
        context_features: feats(&[("filetype", filetype), ("bank", "acme")]),
        arms: vec![ArmChoice {
            stage: "extract".into(),
            tool: tool.into(),
            strategy: "direct".into(),
            propensity: 0.5,
        }],
        steps: vec![step],
        result: RunResult {
            state: if error.is_some() {
                RunState::Failed
            } else {
                RunState::Succeeded
            },
            passed: error.is_none(),
            output: None,
            latency_ms: latency,
            cost: 0.0,
            attempts: 1,
        },
        reward: if error.is_some() { 0.0 } else { 1.0 },
        user_feedback: None,
        time_ms: run as u64,
    }
}

#[test]
fn graph_keeps_statistics_and_excludes_infrastructure() {
    let mut g = KnowledgeGraph::new();
    for i in 0..100 {
        let err = if i % 4 == 0 {
            Some("unsupported file type: png")
        } else {
            None
        };
        g.apply(&exp(i, "png", "pdfminer", err, (i % 100) as f64 * 10.0));
    }
    for i in 100..120 {
        g.apply(&exp(i, "png", "pdfminer", Some("connection refused"), 5.0));
    }
    let cluster = "bank=acme,filetype=png";
    let a = g.arm(cluster, "extract:pdfminer/direct").unwrap();
    assert_eq!(a.n, 100, "infrastructure failures are not counted");
    assert!((a.p_success() - 0.75).abs() < 1e-9);
    let p95 = a.p95_latency_ms().unwrap();
    assert!((p95 - 950.0).abs() < 60.0, "{p95}");
    let modes = g.failure_modes("pdfminer");
    assert_eq!(modes[0].0, ErrorClass::ToolNotFit);
    assert_eq!(modes[0].1.count, 25);
    let net = modes
        .iter()
        .find(|(c, _)| *c == ErrorClass::TransientNetwork)
        .unwrap();
    assert_eq!(net.1.infrastructure, 20);
    assert!(g.uses["extract:pdfminer/direct"].contains("pdfminer"));
    g.link_sop("sop-1", cluster);
    assert!(g.applies_to["sop-1"].contains(cluster));
    // A new cluster falls back to the most similar known one.
    assert_eq!(
        g.nearest_cluster(&feats(&[("filetype", "png"), ("bank", "other")]))
            .as_deref(),
        Some(cluster)
    );
    assert_eq!(g.nearest_cluster(&feats(&[("x", "y")])), None);
}

#[test]
fn best_strategies_rank_per_stage() {
    let mut g = KnowledgeGraph::new();
    for i in 0..10 {
        g.apply(&exp(
            i,
            "pdf",
            "pdfminer",
            (i % 2 == 0).then_some("unsupported input"),
            1.0,
        ));
        g.apply(&exp(i, "pdf", "camelot", None, 1.0));
    }
    let best = g.best_strategies("bank=acme,filetype=pdf", 3);
    assert_eq!(best.len(), 1, "one per stage");
    assert_eq!(best[0].0, "extract:camelot/direct");
}

fn diary(seq: u64, text: &str) -> DiaryEntry {
    DiaryEntry {
        seq,
        time_ms: seq,
        run_id: None,
        kind: "note".into(),
        text: text.into(),
        tags: vec![],
    }
}

#[test]
fn retrieval_returns_one_cited_deduplicated_bundle() {
    let mut m = Memory::default();
    for i in 0..20 {
        let e = exp(
            i,
            "png",
            "pdfminer",
            (i % 2 == 0).then_some("unsupported file type"),
            3.0,
        );
        m.ingest(&e, None).unwrap();
    }
    let texts = [
        (
            ItemKind::Lesson,
            "l1",
            "for filetype=png avoid pdfminer/direct: ToolNotFit 9 of 10",
        ),
        (
            ItemKind::Lesson,
            "l2",
            "for filetype=png, avoid pdfminer/direct; ToolNotFit 9 of 10",
        ),
        (
            ItemKind::Sop,
            "s1",
            "png statements: ocr then camelot lattice then validate totals",
        ),
        (
            ItemKind::Postmortem,
            "r7",
            "run 7 failed: pdfminer could not read the png scan",
        ),
        (
            ItemKind::Lesson,
            "l3",
            "weather in Lisbon is sunny and warm",
        ),
    ];
    for (kind, id, text) in texts {
        m.index_item(VectorItem {
            kind,
            id: id.into(),
            text: text.into(),
            vector: m.embed(text),
            cluster: None,
            time_ms: 0,
            scope: None,
        })
        .unwrap();
    }
    let notes = vec![
        diary(9, "pdfminer struggled with png scans today"),
        diary(
            8,
            "for filetype=png avoid pdfminer/direct: ToolNotFit 9 of 10",
        ),
    ];
    // Another user's lesson, as close to the task as can be: read only by a search of every
    // scope, never by a run of this user.
    let other = "extract png statement with pdfminer after ocr";
    m.index_item(VectorItem {
        kind: ItemKind::Lesson,
        id: "other".into(),
        text: other.into(),
        vector: m.embed(other),
        cluster: None,
        time_ms: 0,
        scope: Some("user:other".into()),
    })
    .unwrap();
    let f = feats(&[("filetype", "png"), ("bank", "acme")]);
    let goal = "extract png statement with pdfminer";
    let every = m.retrieve_for(goal, &f, &[], &notes, 3, Scopes::All);
    assert_eq!(every.items[0].citation.id, "other", "{:?}", every.items);
    let mine = ["shared".to_string(), "user:me".to_string()];
    let b = m.retrieve_for(goal, &f, &[], &notes, 3, Scopes::Only(&mine));
    assert!(b.items.iter().all(|i| i.citation.id != "other"));
    // Every item is cited.
    for item in &b.items {
        assert!(!item.citation.id.is_empty());
        assert!(item.citation.score.is_finite());
    }
    let ids: Vec<&str> = b.items.iter().map(|i| i.citation.id.as_str()).collect();
    // Near-duplicate lessons collapse to one.
    assert!(ids.contains(&"l1") ^ ids.contains(&"l2"), "{ids:?}");
    assert!(!ids.contains(&"l3"), "{ids:?}");
    assert_eq!(b.cluster.as_deref(), Some("bank=acme,filetype=png"));
    let strategies: Vec<_> = b.of_kind(CitationKind::Strategy).collect();
    assert_eq!(strategies.len(), 1);
    assert!(strategies[0].text.contains("p_success 0.50"));
    let modes: Vec<_> = b.of_kind(CitationKind::FailureMode).collect();
    assert_eq!(modes[0].citation.id, "pdfminer|ToolNotFit");
    // The diary note repeating a lesson's text is dropped; the other is kept.
    let diary_ids: Vec<_> = b
        .of_kind(CitationKind::Diary)
        .map(|i| i.citation.id.clone())
        .collect();
    assert_eq!(diary_ids, vec!["9".to_string()]);
    // No (kind, id) appears twice.
    let mut keys: Vec<_> = b
        .items
        .iter()
        .map(|i| (i.citation.kind, i.citation.id.clone()))
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n);
}

#[test]
fn writes_are_salience_gated() {
    let mut m = Memory::default();
    let first = m
        .ingest(&exp(0, "png", "pdfminer", None, 1.0), None)
        .unwrap();
    assert!(first.write_graph, "a new edge is salient");
    assert!(
        first
            .reasons
            .iter()
            .any(|r| matches!(r, SalienceReason::NewEdge(Edge::BestWith { .. })))
    );
    m.mark_written(&first);
    // The same outcome again: p_success unchanged (1.0), n 1 -> 2 crosses nothing.
    let second = m
        .ingest(&exp(1, "png", "pdfminer", None, 1.0), None)
        .unwrap();
    assert!(!second.write_graph, "{second:?}");
    // n crosses 5.
    for i in 2..4 {
        let d = m
            .ingest(&exp(i, "png", "pdfminer", None, 1.0), None)
            .unwrap();
        assert!(!d.write_graph, "{d:?}");
    }
    let fifth = m
        .ingest(&exp(4, "png", "pdfminer", None, 1.0), None)
        .unwrap();
    assert!(
        fifth
            .reasons
            .iter()
            .any(|r| matches!(r, SalienceReason::SampleThreshold { threshold: 5, .. }))
    );
    m.mark_written(&fifth);
    // A failure moves p_success from 1.0 to 5/6 (> 0.05): material change; and a new
    // FAILS_WITH edge.
    let fail = m
        .ingest(
            &exp(5, "png", "pdfminer", Some("unsupported file type"), 1.0),
            None,
        )
        .unwrap();
    assert!(fail.write_graph);
    assert!(
        fail.reasons
            .iter()
            .any(|r| matches!(r, SalienceReason::PSuccessMoved { .. }))
    );
    assert!(
        fail.reasons
            .iter()
            .any(|r| matches!(r, SalienceReason::NewEdge(Edge::FailsWith { .. })))
    );
    m.mark_written(&fail);
    // Vectors: a novel postmortem is indexed, a near-duplicate one is not.
    let text = "run 6 failed: pdfminer could not read the png scan";
    let cand = |id: &str, t: &str, m: &Memory| IndexCandidate {
        kind: ItemKind::Postmortem,
        id: id.into(),
        text: t.into(),
        vector: m.embed(t),
    };
    let c = cand("run-6", text, &m);
    let d = m
        .ingest(&exp(6, "png", "pdfminer", None, 1.0), Some(c))
        .unwrap();
    assert!(d.write_vectors);
    let c = cand(
        "run-7",
        "Run 6 failed - pdfminer could not read the PNG scan!",
        &m,
    );
    let d = m
        .ingest(&exp(7, "png", "pdfminer", None, 1.0), Some(c))
        .unwrap();
    assert!(!d.write_vectors, "near-duplicate embedding is not written");
    assert_eq!(m.index().len(), 1);
}

#[test]
fn memory_snapshot_round_trips() {
    let mut m = Memory::default();
    for i in 0..12 {
        m.ingest(
            &exp(
                i,
                "png",
                "pdfminer",
                (i % 3 == 0).then_some("unsupported x"),
                i as f64,
            ),
            None,
        )
        .unwrap();
    }
    let t = "avoid pdfminer on png";
    m.index_item(VectorItem {
        kind: ItemKind::Lesson,
        id: "l1".into(),
        text: t.into(),
        vector: m.embed(t),
        cluster: None,
        time_ms: 0,
        scope: Some("user:a".into()),
    })
    .unwrap();
    // The snapshot carries the graph; the items are persisted apart, as they change.
    let items: Vec<VectorItem> = m
        .take_index_changes()
        .into_iter()
        .filter_map(|(_, item)| item)
        .collect();
    assert_eq!(items.len(), m.index().len());
    let json = serde_json::to_string(&m.snapshot()).unwrap();
    let back = Memory::restore(serde_json::from_str(&json).unwrap(), items.clone()).unwrap();
    assert_eq!(back, m);
    let bytes = postcard::to_allocvec(&m.snapshot()).unwrap();
    let back = Memory::restore(postcard::from_bytes(&bytes).unwrap(), items).unwrap();
    assert_eq!(back, m);
    // What it holds, it holds with its text: sent again unchanged, it need not be indexed.
    assert!(back.holds(ItemKind::Lesson, "l1", t, Some("user:a")));
    assert!(!back.holds(ItemKind::Lesson, "l1", "reworded", Some("user:a")));
    assert!(!back.holds(ItemKind::Lesson, "l1", t, Some("user:b")));
    assert!(!back.holds(ItemKind::Sop, "l1", t, None));
    // Without its items, it is another memory.
    let bare = Memory::restore(m.snapshot(), Vec::new()).unwrap();
    assert_ne!(bare, m);
    // Wrong dimension is a typed error.
    let mut m2 = Memory::default();
    assert!(matches!(
        m2.index_item(VectorItem {
            kind: ItemKind::Sop,
            id: "s".into(),
            text: "x".into(),
            vector: vec![1.0; 3],
            cluster: None,
            time_ms: 0,
            scope: None,
        }),
        Err(MemoryError::Dimension { .. })
    ));
}

#[test]
fn a_rolled_back_sop_is_forgotten_and_nothing_else() {
    let mut m = Memory::default();
    let cluster = graph_cluster_key(&feats(&[("filetype", "pdf")]));
    for id in ["sop-a", "sop-b"] {
        let text = format!("SOP {id} v1: extract with pdfminer/direct");
        m.index_item(VectorItem {
            kind: ItemKind::Sop,
            id: id.into(),
            vector: m.embed(&text),
            text,
            cluster: Some(cluster.clone()),
            time_ms: 0,
            scope: None,
        })
        .unwrap();
        m.link_sop(id, &cluster);
    }
    assert!(m.forget_sop("sop-a"));
    assert!(!m.forget_sop("sop-a"), "forgotten already");
    assert!(m.index().get(ItemKind::Sop, "sop-a").is_none());
    assert!(m.index().get(ItemKind::Sop, "sop-b").is_some());
    assert!(!m.graph().applies_to.contains_key("sop-a"));
    assert!(m.graph().applies_to["sop-b"].contains(&cluster));
    assert!(m.graph().unwritten.iter().all(|e| !matches!(
        e,
        Edge::AppliesTo { sop_id, .. } if sop_id == "sop-a"
    )));
}
