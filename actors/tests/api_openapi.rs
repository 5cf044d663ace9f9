//! The OpenAPI document agrees with the Rust types: every schema lists exactly the fields the type
//! serializes, a request field is `required` exactly when decoding fails without it, and the
//! closed request schemas match the types' rejection of unknown fields.

use std::collections::{BTreeMap, BTreeSet};

use hindsight::{ArmChoice, Run, RunState, Sop, SopStatus, Task};
use hindsight_actors::api::types::*;
use hindsight_actors::api::{self, ErrorBody};
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
        "user_id": "u", "session_id": "s", "idempotency_key": "k"
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
    };
    check_response("Sop", &sop);
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
