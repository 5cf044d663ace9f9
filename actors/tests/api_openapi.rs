//! The OpenAPI document agrees with the Rust types: every schema lists exactly the fields the type
//! serializes, a request field is `required` exactly when decoding fails without it, and the
//! closed request schemas match the types' rejection of unknown fields.

use std::collections::{BTreeMap, BTreeSet};

use hindsight::{ArmChoice, Run, RunState, Sop, SopStatus, Task};
use hindsight_actors::app::api::types::*;
use hindsight_actors::app::api::{self, ErrorBody};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn doc() -> Value {
    serde_json::from_str(api::OPENAPI_JSON).unwrap()
}

fn schema(name: &str) -> Value {
    let s = doc()["components"]["schemas"][name].clone();
    assert!(s.is_object(), "no schema {name}");
    s
}

fn props(s: &Value) -> BTreeSet<String> {
    s["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

fn required(s: &Value) -> BTreeSet<String> {
    s["required"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// A request type: its full JSON has exactly the schema's properties, and a field is required in
/// the schema exactly when decoding fails without it.
fn check_request<T: DeserializeOwned + Serialize>(name: &str, full: Value) {
    let s = schema(name);
    let keys: BTreeSet<String> = full.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, props(&s), "{name}: properties");
    let _: T = api::decode(full.to_string().as_bytes()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    for key in &keys {
        let mut partial = full.clone();
        partial.as_object_mut().unwrap().remove(key);
        let decoded = api::decode::<T>(partial.to_string().as_bytes());
        assert_eq!(
            decoded.is_err(),
            required(&s).contains(key),
            "{name}.{key}: required in the schema iff decoding needs it"
        );
        if let Err(e) = decoded {
            assert_eq!(e.body.field.as_deref(), Some(key.as_str()));
        }
    }
    let mut extra = full.clone();
    extra
        .as_object_mut()
        .unwrap()
        .insert("zzz".into(), json!(1));
    assert!(
        api::decode::<T>(extra.to_string().as_bytes()).is_err(),
        "{name} accepts unknown fields"
    );
    assert_eq!(
        s["additionalProperties"],
        json!(false),
        "{name} schema is not closed"
    );
}

/// A response type: it serializes exactly the schema's properties, and every required one.
fn check_response<T: Serialize>(name: &str, value: &T) {
    let s = schema(name);
    let v = serde_json::to_value(value).unwrap();
    let keys: BTreeSet<String> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, props(&s), "{name}: properties");
    assert!(required(&s).is_subset(&keys), "{name}: required");
}

fn task_json() -> Value {
    json!({
        "task_id": "t1", "goal": "g", "features": {"a": "b"},
        "constraints": {"max_latency_ms": 1.0, "max_cost": 2.0},
        "user_id": "u", "session_id": "s", "idempotency_key": "k",
        "input": {"email": "c1@example.com"}
    })
}

#[test]
fn request_schemas_match_types() {
    check_request::<TaskRequest>("TaskRequest", task_json());
    check_request::<ConstraintsRequest>(
        "Constraints",
        json!({"max_latency_ms": 1.0, "max_cost": 2.0}),
    );
    check_request::<PlanArm>(
        "PlanArm",
        json!({"stage": "s", "tool": "t", "strategy": "x"}),
    );
    check_request::<ExecuteRequest>(
        "ExecuteRequest",
        json!({"task": task_json(), "plan": [{"stage": "s", "tool": "t", "strategy": "x"}]}),
    );
    check_request::<ValidateRequest>(
        "ValidateRequest",
        json!({"stage": "s", "output": {"x": 1}, "run_id": "r"}),
    );
    check_request::<MemoryRetrieveRequest>(
        "MemoryRetrieveRequest",
        json!({"query": "q", "features": {}, "tools": ["t"], "k": 3, "user_id": "u", "session_id": "s"}),
    );
    check_request::<PolicySuggestRequest>(
        "PolicySuggestRequest",
        json!({"features": {}, "stage": "s", "k": 2}),
    );
    check_request::<PolicyUpdateRequest>(
        "PolicyUpdateRequest",
        json!({"features": {}, "stage": "s", "tool": "t", "strategy": "x", "reward": 0.5, "passed": true,
               "error_class": "Timeout", "propensity": 0.3}),
    );
    check_request::<FeedbackRequest>(
        "FeedbackRequest",
        json!({"correction": "c", "run_id": "r", "tool": "t", "features": {}, "user_id": "u"}),
    );
}

#[test]
fn error_class_enum_matches() {
    let s = schema("ErrorClass");
    let listed: BTreeSet<String> = s["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().into())
        .collect();
    let actual: BTreeSet<String> = hindsight::ErrorClass::ALL
        .iter()
        .map(|c| {
            serde_json::to_value(c)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(listed, actual);
    let states = schema("RunState");
    let listed: BTreeSet<String> = states["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().into())
        .collect();
    use RunState::*;
    let actual: BTreeSet<String> = [
        Received, Planned, Executing, Validating, Recovering, Succeeded, Failed, Escalated, Aborted,
    ]
    .iter()
    .map(|s| s.as_str().to_string())
    .collect();
    assert_eq!(listed, actual);
}

fn arm() -> ArmChoice {
    ArmChoice {
        stage: "s".into(),
        tool: "t".into(),
        strategy: "x".into(),
        propensity: 0.5,
    }
}

#[test]
fn response_schemas_match_types() {
    check_response(
        "OrchestrateResponse",
        &OrchestrateResponse {
            run_id: "r".into(),
            task_id: "t".into(),
            plan_id: Some("p".into()),
            sop_id: None,
            state: RunState::Succeeded,
            passed: true,
            attempts: 1,
            reflect_retries: 0,
            arms: vec![arm()],
            reward: Some(1.0),
            output: None,
            reason: None,
            latency_ms: 1.0,
            cost: 0.0,
            citations: vec![],
        },
    );
    check_response(
        "PlanResponse",
        &PlanResponse {
            plan_id: "p".into(),
            sop_id: None,
            cluster: "c".into(),
            arms: vec![arm()],
            strategy_context: None,
            citations: vec![],
        },
    );
    check_response(
        "ExecuteResponse",
        &ExecuteResponse {
            run_id: "r".into(),
            state: RunState::Failed,
            passed: false,
            steps: vec![hindsight::Step::default()],
            output: None,
            latency_ms: 0.0,
            cost: 0.0,
        },
    );
    check_response("Step", &hindsight::Step::default());
    check_response(
        "ValidateResponse",
        &ValidateResponse {
            valid: true,
            reason: None,
        },
    );
    check_response(
        "MemoryBundle",
        &MemoryBundle {
            items: vec![MemoryItem {
                kind: "lesson".into(),
                id: "l".into(),
                text: "x".into(),
                score: 1.0,
                citation: "c".into(),
            }],
        },
    );
    check_response(
        "MemoryItem",
        &MemoryItem {
            kind: "sop".into(),
            id: "i".into(),
            text: "t".into(),
            score: 0.0,
            citation: "c".into(),
        },
    );
    let ranked = RankedArm {
        tool: "t".into(),
        strategy: "x".into(),
        mean: 0.5,
        std_dev: 0.1,
        propensity: 0.4,
        n: 3,
    };
    check_response("RankedArm", &ranked);
    check_response(
        "StageArms",
        &StageArms {
            stage: "s".into(),
            arms: vec![ranked.clone()],
        },
    );
    check_response(
        "PolicySuggestResponse",
        &PolicySuggestResponse {
            cluster: "c".into(),
            stages: vec![],
        },
    );
    check_response(
        "PolicyUpdateResponse",
        &PolicyUpdateResponse {
            cluster: "c".into(),
            applied: true,
            reason: None,
        },
    );
    check_response(
        "FeedbackResponse",
        &FeedbackResponse {
            accepted: false,
            lesson_id: None,
            confidence: None,
            reason: Some("r".into()),
        },
    );
    let run = Run::new("r", &Task::default(), 0);
    check_response("Run", &run);
    check_response(
        "RunView",
        &RunView {
            run,
            arms: vec![],
            steps: vec![],
        },
    );
    let sop = Sop {
        sop_id: "s".into(),
        version: 1,
        preconditions: BTreeMap::new(),
        plan: vec![arm()],
        status: SopStatus::Candidate,
        successes: 0,
        trials: 0,
        baseline_successes: 0,
        baseline_trials: 0,
        p_value: None,
        evidence: vec![],
        created_ms: 0,
        updated_ms: 0,
        procedure: vec![procedure()],
    };
    check_response("Sop", &sop);
    check_response("Procedure", &procedure());
    check_response("ArmChoice", &arm());
    let ts = TenantSop {
        tenant: "a".into(),
        sop,
    };
    check_response("TenantSop", &ts);
    check_response("SopList", &SopList { sops: vec![ts] });
    check_response(
        "Health",
        &Health {
            status: "ok".into(),
            version: "v".into(),
            components: BTreeMap::new(),
        },
    );
    check_response(
        "Error",
        &ErrorBody {
            error: "e".into(),
            field: Some("f".into()),
        },
    );
}

/// A validator of the document's schema `name` (its `$ref`s resolved within `doc`).
fn validator(doc: &Value, name: &str) -> jsonschema::Validator {
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"].clone()
    });
    jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Whether the API's decoding and field checks accept `body` as a `T`.
fn api_accepts<T: DeserializeOwned + Validate>(body: &Value) -> bool {
    api::decode::<T>(body.to_string().as_bytes()).is_ok_and(|v| v.validate().is_ok())
}

/// The document allows exactly what the API's decoding and field checks accept, on the edges
/// the probe found apart: empty and blank strings, ids over 256 characters (and 256 characters
/// of several bytes each), control characters, `k: 8.0`, arrays where an object is expected.
#[test]
fn the_document_and_the_api_agree_on_the_edges_of_every_field() {
    let doc = doc();
    let long = "x".repeat(257);
    let wide = "é".repeat(256);
    let tasks = [
        json!({"goal": "g"}),
        json!({"goal": ""}),
        json!({"goal": "  "}),
        json!({"goal": "g".repeat(16 * 1024 + 1)}),
        json!({"goal": "line one\nline two"}),
        json!({"goal": "g", "task_id": ""}),
        json!({"goal": "g", "task_id": " "}),
        json!({"goal": "g", "task_id": long}),
        json!({"goal": "g", "task_id": wide}),
        json!({"goal": "g", "task_id": "a\nb"}),
        json!({"goal": "g", "task_id": "a\u{1b}[2J"}),
        json!({"goal": "g", "task_id": "a\u{85}"}),
        json!({"goal": "g", "task_id": null}),
        json!({"goal": "g", "user_id": long}),
        json!({"goal": "g", "session_id": "s\t"}),
        json!({"goal": "g", "idempotency_key": ""}),
        json!({"goal": "g", "features": {"": "v"}}),
        json!({"goal": "g", "features": {"k": long}}),
        json!({"goal": "g", "features": {"k": ""}}),
        json!({"goal": "g", "features": {"k": "a\nb"}}),
        json!({"goal": "g", "constraints": [null, null]}),
        json!({"goal": "g", "constraints": {"max_cost": 1}}),
        json!({"goal": "g", "constraints": {"max_cost": -1}}),
    ];
    let v = validator(&doc, "TaskRequest");
    for body in &tasks {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<TaskRequest>(body),
            "TaskRequest {body}"
        );
    }
    let retrieve = [
        json!({"query": "q", "k": 8}),
        json!({"query": "q", "k": 8.0}),
        json!({"query": "q", "k": 8.5}),
        json!({"query": "q", "k": 0}),
        json!({"query": "q", "k": 101}),
        json!({"query": "q", "tools": [""]}),
        json!({"query": "q", "tools": [long]}),
        json!({"query": "", "user_id": "u"}),
        json!({"query": "q", "session_id": long}),
    ];
    let v = validator(&doc, "MemoryRetrieveRequest");
    for body in &retrieve {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<MemoryRetrieveRequest>(body),
            "MemoryRetrieveRequest {body}"
        );
    }
    let suggest = [
        json!({"k": 3.0}),
        json!({"stage": ""}),
        json!({"stage": long}),
    ];
    let v = validator(&doc, "PolicySuggestRequest");
    for body in &suggest {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<PolicySuggestRequest>(body),
            "PolicySuggestRequest {body}"
        );
    }
    let arm = json!({"stage": "s", "tool": "t", "strategy": "x"});
    let executes = [
        json!({"task": {"goal": "g"}, "plan": [arm]}),
        json!({"task": {"goal": "g"}, "plan": []}),
        json!({"task": {"goal": "g"}, "plan": [["s", "t", "x"]]}),
        json!({"task": ["g"], "plan": [arm]}),
        json!({"task": {"goal": "g"}, "plan": [{"stage": "", "tool": "t", "strategy": "x"}]}),
    ];
    let v = validator(&doc, "ExecuteRequest");
    for body in &executes {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<ExecuteRequest>(body),
            "ExecuteRequest {body}"
        );
    }
    let updates = [
        json!({"stage": "s", "tool": "t", "strategy": "x", "reward": 0.5, "passed": true}),
        json!({"stage": "s", "tool": "t", "strategy": "x", "reward": 0.5, "passed": false, "error_class": "Timeout"}),
        json!({"stage": "", "tool": "t", "strategy": "x", "reward": 0.5, "passed": true}),
        json!({"stage": "s", "tool": "t", "strategy": "x", "reward": 1.5, "passed": true}),
    ];
    let v = validator(&doc, "PolicyUpdateRequest");
    for body in &updates {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<PolicyUpdateRequest>(body),
            "PolicyUpdateRequest {body}"
        );
    }
    let feedback = [
        json!({"correction": "c"}),
        json!({"correction": " "}),
        json!({"correction": "c", "run_id": ""}),
        json!({"correction": "c", "tool": long}),
        json!({"correction": "c", "user_id": "u\n"}),
    ];
    let v = validator(&doc, "FeedbackRequest");
    for body in &feedback {
        assert_eq!(
            v.is_valid(body),
            api_accepts::<FeedbackRequest>(body),
            "FeedbackRequest {body}"
        );
    }
    let v = validator(&doc, "ValidateRequest");
    for body in [
        json!({"stage": "s", "output": 1}),
        json!({"stage": "", "output": 1}),
        json!({"stage": "s", "output": 1, "run_id": "r\n"}),
    ] {
        assert_eq!(
            v.is_valid(&body),
            api_accepts::<ValidateRequest>(&body),
            "ValidateRequest {body}"
        );
    }
}

/// What the backend refuses for its workflow, the document a daemon serves refuses too: unknown
/// stages, arms of another stage, a plan out of order or short, an error class on a passed
/// update, a goal over the guard's limit.
#[test]
fn the_served_document_names_the_workflows_stages_and_arms() {
    use hindsight_actors::app::api::document::{DocStage, for_workflow};
    let stages = [
        DocStage {
            name: "extract".into(),
            arms: vec![
                ("ocr".into(), "fast".into()),
                ("ocr".into(), "careful".into()),
            ],
        },
        DocStage {
            name: "summarize".into(),
            arms: vec![("llm".into(), "short".into())],
        },
    ];
    let served: Value =
        serde_json::from_str(&for_workflow(api::OPENAPI_JSON, &stages, 100).unwrap()).unwrap();
    let exec = validator(&served, "ExecuteRequest");
    let step = |s: &str, t: &str, x: &str| json!({"stage": s, "tool": t, "strategy": x});
    let plan = |steps: Vec<Value>| json!({"task": {"goal": "g"}, "plan": steps});
    assert!(exec.is_valid(&plan(vec![
        step("extract", "ocr", "careful"),
        step("summarize", "llm", "short")
    ])));
    for bad in [
        vec![
            step("summarize", "llm", "short"),
            step("extract", "ocr", "fast"),
        ],
        vec![step("extract", "ocr", "fast")],
        vec![
            step("extract", "llm", "short"),
            step("summarize", "llm", "short"),
        ],
        vec![
            step("extract", "ocr", "slow"),
            step("summarize", "llm", "short"),
        ],
        vec![
            step("extract", "ocr", "fast"),
            step("summarize", "llm", "short"),
            step("summarize", "llm", "short"),
        ],
    ] {
        assert!(!exec.is_valid(&plan(bad.clone())), "{bad:?}");
    }
    let goal = |n: usize| json!({"task": {"goal": "g".repeat(n)}, "plan": [step("extract", "ocr", "fast"), step("summarize", "llm", "short")]});
    assert!(exec.is_valid(&goal(100)));
    assert!(!exec.is_valid(&goal(101)));

    let validate = validator(&served, "ValidateRequest");
    assert!(validate.is_valid(&json!({"stage": "summarize", "output": 1})));
    assert!(!validate.is_valid(&json!({"stage": "teleport", "output": 1})));
    let suggest = validator(&served, "PolicySuggestRequest");
    assert!(suggest.is_valid(&json!({"stage": "extract"})));
    assert!(suggest.is_valid(&json!({"stage": null})));
    assert!(!suggest.is_valid(&json!({"stage": "teleport"})));
    let update = validator(&served, "PolicyUpdateRequest");
    let upd = |s: &str, t: &str, x: &str, passed: bool, class: Value| json!({"stage": s, "tool": t, "strategy": x, "reward": 0.5, "passed": passed, "error_class": class});
    assert!(update.is_valid(&upd("extract", "ocr", "fast", true, Value::Null)));
    assert!(update.is_valid(&upd("summarize", "llm", "short", false, json!("Timeout"))));
    assert!(!update.is_valid(&upd("summarize", "ocr", "fast", true, Value::Null)));
    assert!(!update.is_valid(&upd("extract", "ocr", "fast", true, json!("Timeout"))));
}

#[test]
fn memory_item_kinds_and_documented_statuses() {
    let doc = doc();
    let kinds: BTreeSet<&str> =
        doc["components"]["schemas"]["MemoryItem"]["properties"]["kind"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
    // Every kind memory cites (crate::memory's sources) is listed.
    for kind in [
        "lesson",
        "sop",
        "postmortem",
        "diary",
        "graph",
        "strategy",
        "failure_mode",
    ] {
        assert!(kinds.contains(kind), "{kind}");
    }
    let responses = |path: &str| doc["paths"][path]["post"]["responses"].clone();
    for (path, status) in [
        ("/orchestrate", "409"),
        ("/execute", "409"),
        ("/policy/update", "403"),
        ("/policy/suggest", "403"),
        ("/orchestrate", "413"),
    ] {
        assert!(responses(path)[status].is_object(), "{path} {status}");
    }
}

/// A procedure with every kind of source and an answer template.
fn procedure() -> hindsight::learn::procedure::Procedure {
    use hindsight::learn::procedure::{Piece, Procedure, ProcedureCall, Source};
    Procedure {
        stage: "answer".into(),
        calls: vec![
            ProcedureCall {
                tool: "crm.lookup".into(),
                args: vec![
                    ("email".into(), Source::Input("email".into())),
                    ("tier".into(), Source::Feature("tier".into())),
                    ("limit".into(), Source::Literal("10".into())),
                ],
            },
            ProcedureCall {
                tool: "invoices".into(),
                args: vec![
                    (
                        "customer".into(),
                        Source::Result {
                            call: 0,
                            field: "id".into(),
                        },
                    ),
                    (
                        "path".into(),
                        Source::Template(vec![
                            Piece::Text("/c/".into()),
                            Piece::Value(Source::Input("email".into())),
                        ]),
                    ),
                ],
            },
        ],
        answer: Some(vec![
            Piece::Value(Source::Result {
                call: 1,
                field: "total".into(),
            }),
            Piece::Text(" owed".into()),
        ]),
    }
}
