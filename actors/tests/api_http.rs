//! The HTTP API over a fake backend on a loopback port: every route, tenant isolation, bad bodies,
//! wrong keys, error mapping, OpenAPI agreement and graceful shutdown.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use hindsight::config::{ApiConfig, TenantConfig, hash_key};
use hindsight::{ArmChoice, Run, RunState, Sop, SopStatus, Task};
use hindsight_actors::app::api::types::*;
use hindsight_actors::app::api::{self, Backend, BackendError, BackendResult, Principal, ROUTES};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

const KEY_A: &str = "key-of-tenant-a";
const KEY_B: &str = "key-of-tenant-b";

/// A fake backend. Its `run`, `sop` and `sops` deliberately ignore the tenant, so the tests show
/// that the API itself never lets another tenant's data through.
#[derive(Default)]
struct Fake {
    runs: Mutex<HashMap<String, RunView>>,
    sops: Mutex<Vec<TenantSop>>,
    feedback_by_key: Mutex<HashMap<String, u32>>,
    slow_started: Notify,
    slow_release: Notify,
    metrics: hindsight_actors::app::metrics::Metrics,
}

fn arm(stage: &str, tool: &str) -> ArmChoice {
    ArmChoice {
        stage: stage.into(),
        tool: tool.into(),
        strategy: "default".into(),
        propensity: 0.5,
    }
}

impl Backend for Fake {
    async fn orchestrate(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        if request.goal == "slow" {
            self.slow_started.notify_one();
            self.slow_release.notified().await;
        }
        let n = self.runs.lock().unwrap().len();
        let run_id = format!("run-{n}");
        let task: Task = request.into_task(tenant, || format!("task-{n}"));
        let mut run = Run::new(&run_id, &task, 1);
        run.state = RunState::Succeeded;
        run.attempts = 1;
        run.plan_id = Some(format!("plan-{n}"));
        run.reward = Some(0.9);
        let arms = vec![arm("extract", "ocr")];
        self.runs.lock().unwrap().insert(
            run_id.clone(),
            RunView {
                run: run.clone(),
                arms: arms.clone(),
                steps: vec![],
            },
        );
        let sop = Sop {
            sop_id: format!("sop-{tenant}"),
            version: 1,
            preconditions: task.features.clone(),
            plan: arms.clone(),
            status: SopStatus::Stable,
            successes: 9,
            trials: 10,
            baseline_successes: 5,
            baseline_trials: 10,
            p_value: Some(0.01),
            evidence: vec![run_id.clone()],
            created_ms: 1,
            updated_ms: 1,
            procedure: vec![],
        };
        let mut sops = self.sops.lock().unwrap();
        if !sops.iter().any(|s| s.sop.sop_id == sop.sop_id) {
            sops.push(TenantSop {
                tenant: tenant.to_string(),
                sop,
            });
        }
        Ok(OrchestrateResponse {
            run_id,
            task_id: task.task_id,
            plan_id: run.plan_id,
            sop_id: None,
            state: RunState::Succeeded,
            passed: true,
            attempts: 1,
            reflect_retries: 0,
            arms,
            reward: Some(0.9),
            output: Some(json!({"ok": true})),
            reason: None,
            latency_ms: 12.0,
            cost: 0.5,
            citations: vec![],
        })
    }

    async fn plan(&self, tenant: &str, request: TaskRequest) -> BackendResult<PlanResponse> {
        Ok(PlanResponse {
            plan_id: format!("plan-for-{tenant}"),
            sop_id: None,
            cluster: format!("{:?}", request.features),
            arms: vec![arm("extract", "ocr")],
            strategy_context: None,
            citations: vec![],
        })
    }

    async fn execute(
        &self,
        _tenant: &str,
        request: ExecuteRequest,
    ) -> BackendResult<ExecuteResponse> {
        if request.plan.iter().any(|a| a.tool == "nope") {
            return Err(BackendError::NotFound {
                what: "tool".into(),
                id: "nope".into(),
            });
        }
        Ok(ExecuteResponse {
            run_id: "run-x".into(),
            state: RunState::Succeeded,
            passed: true,
            steps: vec![],
            output: None,
            latency_ms: 1.0,
            cost: 0.0,
        })
    }

    async fn validate(
        &self,
        _tenant: &str,
        request: ValidateRequest,
    ) -> BackendResult<ValidateResponse> {
        let valid = request.output.get("total").is_some();
        Ok(ValidateResponse {
            valid,
            reason: (!valid).then(|| "missing total".to_string()),
        })
    }

    async fn memory_retrieve(
        &self,
        tenant: &str,
        request: MemoryRetrieveRequest,
    ) -> BackendResult<MemoryBundle> {
        Ok(MemoryBundle {
            items: (0..request.k.min(2))
                .map(|i| MemoryItem {
                    kind: "lesson".into(),
                    id: format!("{tenant}-lesson-{i}"),
                    text: request.query.clone(),
                    score: 1.0 / (i as f64 + 1.0),
                    citation: format!("lessons/{tenant}-lesson-{i}"),
                })
                .collect(),
        })
    }

    async fn policy_suggest(
        &self,
        _tenant: &str,
        request: PolicySuggestRequest,
    ) -> BackendResult<PolicySuggestResponse> {
        Ok(PolicySuggestResponse {
            cluster: "c".into(),
            stages: vec![StageArms {
                stage: request.stage.unwrap_or_else(|| "extract".into()),
                arms: vec![RankedArm {
                    tool: "ocr".into(),
                    strategy: "default".into(),
                    mean: 0.8,
                    std_dev: 0.1,
                    propensity: 0.9,
                    n: 10,
                }],
            }],
        })
    }

    async fn policy_update(
        &self,
        _tenant: &str,
        request: PolicyUpdateRequest,
    ) -> BackendResult<PolicyUpdateResponse> {
        let infra = matches!(
            request.error_class,
            Some(hindsight::ErrorClass::Timeout | hindsight::ErrorClass::TransientNetwork)
        );
        Ok(PolicyUpdateResponse {
            cluster: "c".into(),
            applied: !infra,
            reason: infra.then(|| "infrastructure".to_string()),
        })
    }

    async fn sop(&self, _tenant: &str, sop_id: &str) -> BackendResult<Option<TenantSop>> {
        Ok(self
            .sops
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.sop.sop_id == sop_id)
            .cloned())
    }

    async fn sops(&self, _tenant: &str) -> BackendResult<Vec<TenantSop>> {
        Ok(self.sops.lock().unwrap().clone())
    }

    async fn run(&self, _tenant: &str, run_id: &str) -> BackendResult<Option<RunView>> {
        Ok(self.runs.lock().unwrap().get(run_id).cloned())
    }

    async fn feedback(
        &self,
        principal: &Principal,
        request: FeedbackRequest,
    ) -> BackendResult<FeedbackResponse> {
        if let Some(run_id) = &request.run_id {
            let owned = self
                .runs
                .lock()
                .unwrap()
                .get(run_id)
                .is_some_and(|v| v.run.tenant.as_deref() == Some(principal.tenant.as_str()));
            if !owned {
                return Err(BackendError::NotFound {
                    what: "run".into(),
                    id: run_id.clone(),
                });
            }
        }
        let mut counts = self.feedback_by_key.lock().unwrap();
        let n = counts.entry(principal.key_id.clone()).or_insert(0);
        *n += 1;
        if *n > 2 {
            return Err(BackendError::RateLimited {
                retry_after_secs: 60,
            });
        }
        Ok(FeedbackResponse {
            accepted: true,
            lesson_id: Some(format!("{}-{}", principal.tenant, n)),
            confidence: Some(0.9),
            reason: None,
        })
    }

    async fn health(&self) -> Health {
        Health {
            status: "ok".into(),
            version: "test".into(),
            components: BTreeMap::from([("store".to_string(), "ok".to_string())]),
        }
    }

    async fn metrics_text(&self) -> String {
        self.metrics.encode()
    }

    fn metrics(&self) -> Option<&hindsight_actors::app::metrics::Metrics> {
        Some(&self.metrics)
    }
}

struct Server {
    base: String,
    client: reqwest::Client,
    backend: Arc<Fake>,
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<Result<(), api::ServeError>>,
}

fn config(limit: usize) -> ApiConfig {
    ApiConfig {
        body_limit_bytes: limit,
        shutdown_grace_secs: 5,
        tenants: vec![
            TenantConfig {
                policy_update: true,
                name: "a".into(),
                key_sha256: hash_key(KEY_A),
            },
            TenantConfig {
                policy_update: false,
                name: "b".into(),
                key_sha256: hash_key(KEY_B),
            },
        ],
        ..ApiConfig::default()
    }
}

async fn start() -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let backend = Arc::new(Fake::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let b = Arc::clone(&backend);
    let handle = tokio::spawn(async move {
        api::serve(listener, b, &config(4096), async move {
            let _ = stopped.await;
        })
        .await
    });
    Server {
        base,
        client: reqwest::Client::new(),
        backend,
        stop: Some(stop),
        handle,
    }
}

impl Server {
    async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
        let mut req = self.client.post(format!("{}{path}", self.base)).json(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn post_raw(&self, path: &str, key: &str, ctype: &str, body: Vec<u8>) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("content-type", ctype)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut req = self.client.get(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.handle.await.unwrap().unwrap();
    }
}

fn task(goal: &str) -> Value {
    json!({"goal": goal, "features": {"file_type": "pdf"}, "constraints": {"max_cost": 3.0}})
}

#[tokio::test]
async fn every_route_answers() {
    let s = start().await;
    let (st, body) = s.post("/orchestrate", Some(KEY_A), &task("parse it")).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["arms"][0]["tool"], "ocr");
    let run_id = body["run_id"].as_str().unwrap().to_string();

    let (st, body) = s.post("/plan", Some(KEY_A), &task("plan it")).await;
    assert_eq!((st, body["plan_id"].as_str()), (200, Some("plan-for-a")));

    let exec = json!({"task": task("run it"), "plan": [{"stage": "extract", "tool": "ocr", "strategy": "fast"}]});
    let (st, body) = s.post("/execute", Some(KEY_A), &exec).await;
    assert_eq!((st, body["passed"].as_bool()), (200, Some(true)));

    let (st, body) = s
        .post(
            "/validate",
            Some(KEY_A),
            &json!({"stage": "extract", "output": {"x": 1}}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(body, json!({"valid": false, "reason": "missing total"}));

    let (st, body) = s
        .post(
            "/memory/retrieve",
            Some(KEY_A),
            &json!({"query": "pdf statements", "k": 2}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(body["items"].as_array().unwrap().len(), 2);
    assert_eq!(body["items"][0]["citation"], "lessons/a-lesson-0");

    let (st, body) = s
        .post(
            "/policy/suggest",
            Some(KEY_A),
            &json!({"features": {"file_type": "pdf"}, "stage": "extract"}),
        )
        .await;
    assert_eq!(
        (st, body["stages"][0]["stage"].as_str()),
        (200, Some("extract"))
    );

    let upd = json!({"stage": "extract", "tool": "ocr", "strategy": "fast", "reward": 0.0, "passed": false, "error_class": "Timeout"});
    let (st, body) = s.post("/policy/update", Some(KEY_A), &upd).await;
    assert_eq!((st, body["applied"].as_bool()), (200, Some(false)));

    let (st, body) = s
        .post(
            "/feedback",
            Some(KEY_A),
            &json!({"correction": "use ocr for scans", "run_id": run_id}),
        )
        .await;
    assert_eq!((st, body["accepted"].as_bool()), (200, Some(true)));

    let (st, body) = s.get("/sops", Some(KEY_A)).await;
    assert_eq!(st, 200);
    assert_eq!(body["sops"][0]["sop"]["sop_id"], "sop-a");
    let (st, body) = s.get("/sop/sop-a", Some(KEY_A)).await;
    assert_eq!((st, body["tenant"].as_str()), (200, Some("a")));
    let (st, body) = s.get(&format!("/runs/{run_id}"), Some(KEY_A)).await;
    assert_eq!(
        (st, body["run"]["run_id"].as_str()),
        (200, Some(run_id.as_str()))
    );

    let (st, body) = s.get("/healthz", None).await;
    assert_eq!((st, body["status"].as_str()), (200, Some("ok")));
    let resp = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains(
            "hindsight_http_requests_total{method=\"POST\",route=\"/orchestrate\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains(
        "hindsight_http_requests_total{method=\"GET\",route=\"/runs/{id}\",status=\"200\"} 1"
    ));
    let (st, body) = s.get("/openapi.json", None).await;
    assert_eq!((st, body["openapi"].as_str()), (200, Some("3.1.0")));
    s.stop().await;
}

#[tokio::test]
async fn every_route_is_registered_and_guarded_as_declared() {
    let s = start().await;
    for r in ROUTES {
        let path = r.path.replace("{id}", "x");
        let url = format!("{}{path}", s.base);
        let req = match r.method {
            "GET" => s.client.get(&url),
            "POST" => s.client.post(&url).json(&json!({})),
            m => panic!("unexpected method {m}"),
        };
        let status = req.send().await.unwrap().status().as_u16();
        if r.auth {
            assert_eq!(status, 401, "{} {} without a key", r.method, r.path);
        } else {
            assert_eq!(status, 200, "{} {} is public", r.method, r.path);
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn openapi_matches_routes() {
    let doc: Value = serde_json::from_str(api::OPENAPI_JSON).unwrap();
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
            documented.push((method.to_uppercase(), path.clone(), secured));
        }
    }
    let mut routed: Vec<_> = ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string(), r.auth))
        .collect();
    documented.sort();
    routed.sort();
    assert_eq!(documented, routed);
    // Every $ref resolves.
    let text = api::OPENAPI_JSON;
    for part in text.split("\"$ref\": \"#/components/schemas/").skip(1) {
        let name = part.split('"').next().unwrap();
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "dangling $ref {name}"
        );
    }
    // Every request schema is closed, as the Rust types reject unknown fields.
    for name in [
        "TaskRequest",
        "ExecuteRequest",
        "PlanArm",
        "ValidateRequest",
        "MemoryRetrieveRequest",
        "PolicySuggestRequest",
        "PolicyUpdateRequest",
        "FeedbackRequest",
        "Constraints",
    ] {
        assert_eq!(
            doc["components"]["schemas"][name]["additionalProperties"],
            json!(false),
            "{name}"
        );
    }
}

#[tokio::test]
async fn tenants_see_only_their_own_data() {
    let s = start().await;
    let (_, a) = s.post("/orchestrate", Some(KEY_A), &task("a's task")).await;
    let (_, b) = s.post("/orchestrate", Some(KEY_B), &task("b's task")).await;
    let a_run = a["run_id"].as_str().unwrap();
    let b_run = b["run_id"].as_str().unwrap();

    let (st, body) = s.get(&format!("/runs/{a_run}"), Some(KEY_B)).await;
    assert_eq!(st, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("not found"));
    let (st, _) = s.get(&format!("/runs/{b_run}"), Some(KEY_B)).await;
    assert_eq!(st, 200);
    let (st, _) = s.get("/sop/sop-a", Some(KEY_B)).await;
    assert_eq!(st, 404);
    let (st, body) = s.get("/sops", Some(KEY_B)).await;
    assert_eq!(st, 200);
    let tenants: Vec<_> = body["sops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tenant"].clone())
        .collect();
    assert_eq!(tenants, vec![json!("b")]);
    // Feedback about another tenant's run is refused as not found.
    let (st, _) = s
        .post(
            "/feedback",
            Some(KEY_B),
            &json!({"correction": "x", "run_id": a_run}),
        )
        .await;
    assert_eq!(st, 404);
    s.stop().await;
}

#[tokio::test]
async fn missing_or_wrong_keys_are_401() {
    let s = start().await;
    let resp = s
        .client
        .post(format!("{}/orchestrate", s.base))
        .json(&task("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert!(resp.headers().get("www-authenticate").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["field"], "authorization");
    for key in ["wrong", &hash_key(KEY_A), "", " "] {
        let (st, _) = s.post("/orchestrate", Some(key), &task("x")).await;
        assert_eq!(st, 401, "key {key:?}");
    }
    let resp = s
        .client
        .get(format!("{}/sops", s.base))
        .header("authorization", format!("Basic {KEY_A}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // The scheme is case-insensitive.
    let resp = s
        .client
        .get(format!("{}/sops", s.base))
        .header("authorization", format!("bearer {KEY_A}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    s.stop().await;
}

#[tokio::test]
async fn bad_bodies_are_4xx_naming_the_field() {
    let s = start().await;
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        ("/orchestrate", json!({"goal": 5}), 400, Some("goal")),
        ("/orchestrate", json!({"features": {}}), 400, Some("goal")),
        (
            "/orchestrate",
            json!({"goal": "g", "colour": "red"}),
            400,
            Some("colour"),
        ),
        (
            "/orchestrate",
            json!({"goal": "g", "constraints": {"max_cost": "lots"}}),
            400,
            Some("constraints.max_cost"),
        ),
        (
            "/orchestrate",
            json!({"goal": "g", "constraints": {"budget": 1}}),
            400,
            Some("constraints.budget"),
        ),
        (
            "/orchestrate",
            json!({"goal": "g", "features": {"size": 3}}),
            400,
            Some("features.size"),
        ),
        ("/orchestrate", json!({"goal": "   "}), 422, Some("goal")),
        (
            "/orchestrate",
            json!({"goal": "g", "constraints": {"max_latency_ms": -1.0}}),
            422,
            Some("constraints.max_latency_ms"),
        ),
        ("/orchestrate", json!([1, 2]), 400, None),
        (
            "/execute",
            json!({"task": {"goal": "g"}, "plan": []}),
            422,
            Some("plan"),
        ),
        (
            "/execute",
            json!({"task": {"goal": "g"}, "plan": [{"stage": "s", "tool": "t", "strategy": "x", "foo": 1}]}),
            400,
            Some("plan[0].foo"),
        ),
        (
            "/execute",
            json!({"task": {"goal": "g"}, "plan": [{"stage": "s", "strategy": "x"}]}),
            400,
            Some("plan[0].tool"),
        ),
        (
            "/execute",
            json!({"task": {"goal": ""}, "plan": [{"stage": "s", "tool": "t", "strategy": "x"}]}),
            422,
            Some("task.goal"),
        ),
        ("/validate", json!({"output": {}}), 400, Some("stage")),
        (
            "/memory/retrieve",
            json!({"query": "q", "k": 0}),
            422,
            Some("k"),
        ),
        (
            "/memory/retrieve",
            json!({"query": "q", "k": -3}),
            400,
            Some("k"),
        ),
        ("/policy/suggest", json!({"k": 1000}), 422, Some("k")),
        (
            "/policy/update",
            json!({"stage": "s", "tool": "t", "strategy": "x", "reward": 1.5, "passed": true}),
            422,
            Some("reward"),
        ),
        (
            "/policy/update",
            json!({"stage": "s", "tool": "t", "strategy": "x", "reward": 0.5, "passed": true, "error_class": "Gremlins"}),
            400,
            Some("error_class"),
        ),
        (
            "/feedback",
            json!({"correction": ""}),
            422,
            Some("correction"),
        ),
    ];
    for (path, body, status, field) in cases {
        let (st, resp) = s.post(path, Some(KEY_A), &body).await;
        assert_eq!(st, status, "{path} {body}: {resp}");
        assert!(resp["error"].is_string(), "{path} {body}: {resp}");
        assert_eq!(resp["field"].as_str(), field, "{path} {body}: {resp}");
    }
    // Malformed JSON, an empty body, trailing garbage, the wrong media type.
    for (ctype, raw, status) in [
        ("application/json", b"{\"goal\": ".to_vec(), 400),
        ("application/json", b"".to_vec(), 400),
        ("application/json", b"{\"goal\": \"g\"} x".to_vec(), 400),
        ("text/plain", b"{\"goal\": \"g\"}".to_vec(), 415),
    ] {
        let (st, resp) = s.post_raw("/orchestrate", KEY_A, ctype, raw.clone()).await;
        assert_eq!(
            st,
            status,
            "{ctype} {:?}: {resp}",
            String::from_utf8_lossy(&raw)
        );
        assert!(resp["error"].is_string());
    }
    // Too large (limit 4096 bytes in these tests).
    let big = json!({"goal": "x".repeat(5000)});
    let (st, resp) = s.post("/orchestrate", Some(KEY_A), &big).await;
    assert_eq!(st, 413, "{resp}");
    assert!(resp["error"].as_str().unwrap().contains("limit"));
    // Backend errors map to statuses.
    let exec =
        json!({"task": {"goal": "g"}, "plan": [{"stage": "s", "tool": "nope", "strategy": "x"}]});
    let (st, _) = s.post("/execute", Some(KEY_A), &exec).await;
    assert_eq!(st, 404);
    s.stop().await;
}

#[tokio::test]
async fn unknown_routes_methods_and_ids() {
    let s = start().await;
    let (st, body) = s.get("/nowhere", Some(KEY_A)).await;
    assert_eq!(st, 404);
    assert!(body["error"].is_string());
    // Unknown paths are counted under one label, not one per path.
    assert!(
        s.backend
            .metrics
            .encode()
            .contains("route=\"unmatched\",status=\"404\"} 1")
    );
    let (st, body) = s.get("/orchestrate", Some(KEY_A)).await;
    assert_eq!(st, 405);
    assert!(body["error"].is_string());
    let long = "x".repeat(300);
    let (st, body) = s.get(&format!("/runs/{long}"), Some(KEY_A)).await;
    assert_eq!((st, body["field"].as_str()), (400, Some("id")));
    s.stop().await;
}

#[tokio::test]
async fn feedback_is_rate_limited_per_key() {
    let s = start().await;
    for _ in 0..2 {
        let (st, _) = s
            .post("/feedback", Some(KEY_A), &json!({"correction": "c"}))
            .await;
        assert_eq!(st, 200);
    }
    let resp = s
        .client
        .post(format!("{}/feedback", s.base))
        .bearer_auth(KEY_A)
        .json(&json!({"correction": "c"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "60");
    // Another key has its own budget.
    let (st, _) = s
        .post("/feedback", Some(KEY_B), &json!({"correction": "c"}))
        .await;
    assert_eq!(st, 200);
    s.stop().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let s = start().await;
    let client = s.client.clone();
    let url = format!("{}/orchestrate", s.base);
    let in_flight = tokio::spawn(async move {
        client
            .post(url)
            .bearer_auth(KEY_A)
            .json(&json!({"goal": "slow"}))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    s.backend.slow_started.notified().await;
    let Server {
        mut stop,
        handle,
        backend,
        ..
    } = s;
    stop.take().unwrap().send(()).unwrap();
    // The server must not stop while the request is in flight; release it and both complete.
    tokio::task::yield_now().await;
    assert!(!handle.is_finished());
    backend.slow_release.notify_one();
    assert_eq!(in_flight.await.unwrap().unwrap(), 200);
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    let mut cfg = config(1024);
    cfg.tenants[0].key_sha256 = "not-hex".into();
    let err = api::router(Arc::new(Fake::default()), &cfg).unwrap_err();
    assert_eq!(
        err.to_string(),
        "api.tenants[0].key_sha256: expected 64 hex digits"
    );
    // An address already in use is reported with the key and the address.
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = ApiConfig {
        listen: taken.local_addr().unwrap().to_string(),
        ..config(1024)
    };
    let err = api::serve_config(Arc::new(Fake::default()), &cfg)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("api.listen: cannot listen on `{}`", cfg.listen)),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_requests_get_504_after_the_time_limit() {
    use tower::ServiceExt;
    let backend = Arc::new(Fake::default());
    let cfg = ApiConfig {
        request_timeout_secs: 300,
        ..config(4096)
    };
    let app = api::router(Arc::clone(&backend), &cfg).unwrap();
    let req = axum::http::Request::post("/orchestrate")
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"goal": "slow"}"#))
        .unwrap();
    let started = tokio::time::Instant::now();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 504);
    assert_eq!(started.elapsed(), std::time::Duration::from_secs(300));
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("api.request_timeout_secs")
    );
}
