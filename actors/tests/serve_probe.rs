//! `hindsight serve` against what an outside probe found (issue 56), through the real binary on
//! a loopback port: concurrent claims of one idempotency key, cross-tenant policy steering,
//! unbounded and control-character fields, damaged records, a declared body over the limit,
//! duplicate `Authorization` headers, malformed JSON and the tenant names `config check` takes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod daemon_support;

use daemon_support::{Daemon, terminate};
use hindsight::config::hash_key;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY_A: &str = "acme-secret-token";
const KEY_B: &str = "globex-secret-token";
const KEY_OPS: &str = "operator-secret-token";

/// A configuration of three tenants: `acme` and `globex` (plain keys) and `ops` (a key with the
/// `policy_update` right); `shared` sets `api.shared_learning`.
fn write_config(dir: &Path, shared: bool) -> PathBuf {
    let file = dir.join("hindsight.toml");
    let text = format!(
        r#"data_dir = "{data}"
seed = 42

[store]
durability = "immediate"

[api]
listen = "127.0.0.1:0"
shutdown_grace_secs = 5
request_timeout_secs = 60
shared_learning = {shared}

[[api.tenants]]
name = "acme"
key_sha256 = "{a}"

[[api.tenants]]
name = "globex"
key_sha256 = "{b}"

[[api.tenants]]
name = "ops"
key_sha256 = "{ops}"
policy_update = true

[log]
level = "warn"
"#,
        data = dir.join("data").display(),
        a = hash_key(KEY_A),
        b = hash_key(KEY_B),
        ops = hash_key(KEY_OPS),
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// Starts the daemon on `config`, its log beside it.
fn start(config: &Path) -> Daemon {
    daemon_support::start(config, &config.with_extension("log"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

async fn post(c: &reqwest::Client, d: &Daemon, path: &str, key: &str, body: Value) -> (u16, Value) {
    send(
        c.post(format!("{}{path}", d.base))
            .bearer_auth(key)
            .json(&body),
    )
    .await
}

async fn get(c: &reqwest::Client, d: &Daemon, path: &str, key: &str) -> (u16, Value) {
    send(c.get(format!("{}{path}", d.base)).bearer_auth(key)).await
}

fn field(body: &Value) -> &str {
    body["field"].as_str().unwrap_or("")
}

fn enc(id: &str) -> String {
    id.replace('/', "%2F")
}

/// Item 1: many concurrent `/orchestrate` requests with one `idempotency_key` and different
/// `task_id`s, in several rounds: exactly one of each round is run (200), every other one is
/// refused 409, and no run of a refused task exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reuses_of_an_idempotency_key_run_one_task() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(&write_config(dir.path(), false));
    let c = client();
    const ROUNDS: usize = 8;
    const REQUESTS: usize = 22;
    for round in 0..ROUNDS {
        let key = format!("probe-key-{round}");
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..REQUESTS {
            let (c, url, key) = (c.clone(), format!("{}/orchestrate", d.base), key.clone());
            calls.spawn(async move {
                let body = json!({"task_id": format!("r{round}-t{i}"), "goal": "read the statement",
                                  "features": {"file_type": "pdf"}, "idempotency_key": key});
                let (s, b) = send(c.post(url).bearer_auth(KEY_A).json(&body)).await;
                (i, s, b)
            });
        }
        let mut won = Vec::new();
        let mut refused = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let (i, s, b) = joined.unwrap();
            match s {
                200 => won.push((i, b)),
                409 => refused.push(i),
                other => panic!("round {round}, request {i}: {other} {b}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {} answered 200", won.len());
        assert_eq!(refused.len(), REQUESTS - 1, "round {round}");
        let (winner, body) = &won[0];
        assert_eq!(body["task_id"], format!("acme/r{round}-t{winner}"));
        for i in refused {
            let run = format!("run-acme/r{round}-t{i}");
            let (s, b) = get(&c, &d, &format!("/runs/{}", enc(&run)), KEY_A).await;
            assert_eq!(s, 404, "round {round}: the refused task {i} has a run: {b}");
        }
        // The key still names the winner's task: a resubmission of it is answered from its run.
        let again = json!({"task_id": format!("r{round}-t{winner}"), "goal": "read the statement",
                           "features": {"file_type": "pdf"}, "idempotency_key": key});
        let (s, b) = post(&c, &d, "/orchestrate", KEY_A, again).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["run_id"], body["run_id"]);
    }
    assert!(terminate(d), "the daemon did not exit 0 on SIGTERM");
}

/// Item 2: a tenant's key cannot report outcomes to the shared policy (403), so tenant A's 150
/// forged failures leave what the policy suggests for B's tasks unchanged; a tenant does not see
/// statistics learned from other tenants' runs (suggestions 403, no `strategy` or
/// `failure_mode` items in retrieval) unless the deployment shares learning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_steer_or_read_another_tenants_learning() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(&write_config(dir.path(), false));
    let c = client();
    let features = json!({"file_type": "pdf", "bank": "globex-bank"});
    for i in 0..6 {
        let task =
            json!({"task_id": format!("b{i}"), "goal": "read the statement", "features": features});
        let (s, b) = post(&c, &d, "/orchestrate", KEY_B, task).await;
        assert_eq!(s, 200, "{b}");
    }
    let suggest = json!({"features": features, "k": 5});
    let (s, before) = post(&c, &d, "/policy/suggest", KEY_OPS, suggest.clone()).await;
    assert_eq!(s, 200, "{before}");
    let stage = &before["stages"][0];
    let arm = &stage["arms"][0];
    let forged = json!({"features": features, "stage": stage["stage"], "tool": arm["tool"],
                        "strategy": arm["strategy"], "reward": 0.0, "passed": false});
    for _ in 0..150 {
        let (s, b) = post(&c, &d, "/policy/update", KEY_A, forged.clone()).await;
        assert_eq!(s, 403, "{b}");
    }
    let (s, after) = post(&c, &d, "/policy/suggest", KEY_OPS, suggest.clone()).await;
    assert_eq!(s, 200, "{after}");
    assert_eq!(after, before, "tenant A's refused updates moved the policy");
    // The key with the right does update it (the refusal is the right's, not the route's).
    let (s, b) = post(&c, &d, "/policy/update", KEY_OPS, forged).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["applied"], true, "{b}");
    // Tenants see no statistics learned from every tenant's runs.
    let (s, b) = post(&c, &d, "/policy/suggest", KEY_B, suggest).await;
    assert_eq!(s, 403, "{b}");
    let query = json!({"query": "read the statement pdf", "features": features, "k": 100});
    let (s, b) = post(&c, &d, "/memory/retrieve", KEY_A, query.clone()).await;
    assert_eq!(s, 200, "{b}");
    let kinds = |b: &Value| -> BTreeSet<String> {
        b["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["kind"].as_str().unwrap().to_string())
            .collect()
    };
    let unshared = kinds(&b);
    assert!(
        !unshared.contains("strategy") && !unshared.contains("failure_mode"),
        "{b}"
    );
    assert!(terminate(d));

    // The same data under a deployment that shares learning: the statistics are shown.
    let d = start(&write_config(dir.path(), true));
    let (s, b) = post(&c, &d, "/memory/retrieve", KEY_A, query).await;
    assert_eq!(s, 200, "{b}");
    assert!(kinds(&b).contains("strategy"), "{b}");
    let (s, b) = post(
        &c,
        &d,
        "/policy/suggest",
        KEY_A,
        json!({"features": features}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = post(
        &c,
        &d,
        "/policy/update",
        KEY_A,
        json!({"stage": "x", "tool": "y", "strategy": "z", "reward": 0.0, "passed": false}),
    )
    .await;
    assert_eq!(s, 403, "sharing learning does not grant updates: {b}");
    assert!(terminate(d));
}

/// Items 3 and 4: every string field is bounded, identifiers refuse control characters (422
/// naming the field; 400 for a path id), and the refused requests leave no run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_fields_are_bounded_and_identifiers_refuse_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(&write_config(dir.path(), false));
    let c = client();
    let long = "u".repeat(257);
    let task = |extra: Value| {
        let mut t = json!({"goal": "read the statement"});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        t
    };
    let cases = [
        (json!({"user_id": long}), "user_id"),
        (json!({"session_id": long}), "session_id"),
        (json!({"task_id": long}), "task_id"),
        (json!({"idempotency_key": long}), "idempotency_key"),
        (json!({"task_id": "t\nrun-forged  succeeded"}), "task_id"),
        (json!({"task_id": "t\u{1b}[2J\u{1b}[H"}), "task_id"),
        (json!({"user_id": "u\r"}), "user_id"),
        (json!({"session_id": "s\u{7f}"}), "session_id"),
        (json!({"task_id": " "}), "task_id"),
        (
            json!({"features": {"bank": "v".repeat(257)}}),
            "features.bank",
        ),
        (json!({"features": {"bank": "a\nb"}}), "features.bank"),
        (json!({"goal": "g".repeat(16 * 1024 + 1)}), "goal"),
    ];
    for (extra, want) in cases {
        for path in ["/orchestrate", "/plan"] {
            let (s, b) = post(&c, &d, path, KEY_A, task(extra.clone())).await;
            assert_eq!((s, field(&b)), (422, want), "{path} {extra}: {b}");
        }
    }
    let (s, b) = post(
        &c,
        &d,
        "/memory/retrieve",
        KEY_A,
        json!({"query": "q", "user_id": long}),
    )
    .await;
    assert_eq!((s, field(&b)), (422, "user_id"), "{b}");
    let (s, b) = post(
        &c,
        &d,
        "/feedback",
        KEY_A,
        json!({"correction": "use ocr", "user_id": long}),
    )
    .await;
    assert_eq!((s, field(&b)), (422, "user_id"), "{b}");
    let (s, b) = get(&c, &d, "/runs/run-acme%2Ft%0Aforged", KEY_A).await;
    assert_eq!((s, field(&b)), (400, "id"), "{b}");
    // 256 characters of three bytes each is within the bound (it counts characters, as the
    // document's maxLength does).
    let (s, b) = post(
        &c,
        &d,
        "/orchestrate",
        KEY_A,
        task(json!({"task_id": "é".repeat(256)})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // Nothing refused was stored: the one run is the last one's.
    assert!(terminate(d));
    let out = Command::new(env!("CARGO_BIN_EXE_hindsight"))
        .arg("--data")
        .arg(dir.path().join("data"))
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = runs
        .iter()
        .map(|r| r["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![format!("acme/{}", "é".repeat(256))]);
}

/// Item 5: a damaged run record is a server fault: `GET /runs/{id}` and a resubmission of its
/// task answer 500 saying the record is damaged, and `/healthz` reports the damage it has met.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_a_server_fault_and_health_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), false);
    let d = start(&config);
    let c = client();
    let task =
        json!({"task_id": "t1", "goal": "read the statement", "features": {"file_type": "pdf"}});
    let (s, b) = post(&c, &d, "/orchestrate", KEY_A, task.clone()).await;
    assert_eq!(s, 200, "{b}");
    let run_id = b["run_id"].as_str().unwrap().to_string();
    let (s, h) = get(&c, &d, "/healthz", KEY_A).await;
    assert_eq!((s, h["components"]["store"].as_str()), (200, Some("ok")));
    assert!(terminate(d));

    {
        let store = hindsight::store::Store::open(
            &dir.path().join("data"),
            hindsight::store::StoreOptions::default(),
        )
        .unwrap();
        store.overwrite_raw("runs", &run_id, &[1, 0xFF]).unwrap();
    }

    let d = start(&config);
    let (s, b) = get(&c, &d, &format!("/runs/{}", enc(&run_id)), KEY_A).await;
    assert_eq!(s, 500, "{b}");
    let msg = b["error"].as_str().unwrap();
    assert!(msg.contains("damaged") && msg.contains(&run_id), "{msg}");
    let (s, b) = post(&c, &d, "/orchestrate", KEY_A, task).await;
    assert_eq!(s, 500, "{b}");
    assert!(b["error"].as_str().unwrap().contains("damaged"), "{b}");
    let (s, h) = get(&c, &d, "/healthz", KEY_A).await;
    assert_eq!(s, 503, "{h}");
    let store = h["components"]["store"].as_str().unwrap();
    assert!(
        store.starts_with("damaged: 2 damaged record(s)") && store.contains(&run_id),
        "{h}"
    );
    // Another tenant asking for that id still gets 404: the fault is not revealed across tenants.
    let (s, _) = get(&c, &d, &format!("/runs/{}", enc(&run_id)), KEY_B).await;
    assert_eq!(s, 404);
    assert!(terminate(d));
}

/// Reads one HTTP response's status line and headers from `stream`.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "the connection closed before a response: {buf:?}");
        buf.push(byte[0]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Items 6 and 8: a declared `Content-Length` over the body limit is refused at once (413,
/// before the body that never comes); two `Authorization` headers are refused (401) even when
/// the first is a good key; a malformed body names no `?` field; `config check` refuses the
/// tenant names `serve` refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_declarations_duplicate_keys_and_malformed_bodies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(&write_config(dir.path(), false));
    let addr = d.base.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /orchestrate HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{\"goal\":\"x\"}}"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // If the server waited for the declared body, this read would get the request timeout's
    // 504 after 60 s instead.
    let response = read_head(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");

    let c = client();
    for second in [KEY_B, "not-a-key"] {
        let (s, b) = send(
            c.post(format!("{}/orchestrate", d.base))
                .header("authorization", format!("Bearer {KEY_A}"))
                .header("authorization", format!("Bearer {second}"))
                .json(&json!({"goal": "g"})),
        )
        .await;
        assert_eq!((s, field(&b)), (401, "authorization"), "{b}");
        assert!(
            b["error"].as_str().unwrap().contains("more than one"),
            "{b}"
        );
    }

    for body in [
        "{\"goal\": ",
        "{\"goal\": \"g\", \"features\": {\"a\": }",
        "{,}",
    ] {
        let (s, b) = send(
            c.post(format!("{}/orchestrate", d.base))
                .bearer_auth(KEY_A)
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        assert_eq!(s, 400, "{body}: {b}");
        assert!(!field(&b).contains('?'), "{body}: {b}");
        assert!(
            b["error"].as_str().unwrap().contains("malformed JSON"),
            "{b}"
        );
    }
    let (s, b) = send(
        c.post(format!("{}/orchestrate", d.base))
            .bearer_auth(KEY_A)
            .header("content-type", "application/json")
            .body("{\"goal\": \"g\", \"features\": {\"a\": }"),
    )
    .await;
    assert_eq!((s, field(&b)), (400, "features.a"), "{b}");
    assert!(terminate(d));

    for name in ["a/b", "a:b", "a\u{1b}b"] {
        let file = dir.path().join("bad.toml");
        std::fs::write(
            &file,
            format!(
                "data_dir = \"{}\"\n[[api.tenants]]\nname = {}\nkey_sha256 = \"{}\"\n",
                dir.path().join("other").display(),
                serde_json::to_string(name).unwrap(),
                hash_key("k")
            ),
        )
        .unwrap();
        for command in [&["config", "check", "--config"][..], &["serve", "--config"]] {
            let out = Command::new(env!("CARGO_BIN_EXE_hindsight"))
                .args(command)
                .arg(&file)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{command:?} {name:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("api.tenants[0].name"), "{command:?}: {err}");
        }
    }
}
