//! An agent over a real MCP server through `hindsight serve`: the configuration's `[[agent]]`
//! offers two tools of `@modelcontextprotocol/server-everything` (installed on first use under
//! target/, pinned) to the offline rule-based model; `GET /agents` lists it and
//! `POST /agents/{name}/runs` runs a task on it, answering with what the real tools returned
//! and the run's provenance.

use std::time::Duration;

#[path = "../../tests/support/mod.rs"]
mod support;

mod daemon_support;

use daemon_support::{start, terminate};
use hindsight::config::hash_key;
use serde_json::{Value, json};

const KEY: &str = "agent-test-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_agent_calls_real_mcp_tools_through_the_daemon() {
    let modules = support::npm_servers();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hindsight.toml");
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"

[[agent]]
name = "everything"
description = "Echoes a message and adds two numbers"
instructions = "You answer by calling the tools of the everything server."
max_turns = 6

[[agent.variants]]
name = "default"
model = "local"
tools = ["everything/echo", "everything/get-sum"]

[models.local]

[store]
durability = "none"

[api]
listen = "127.0.0.1:0"

[[api.tenants]]
name = "acme"
key_sha256 = "{key}"

[[tools.mcp]]
name = "everything"
command = "node"
args = ["{server}", "stdio"]

[log]
level = "warn"
"#,
            data = dir.path().join("data").display(),
            key = hash_key(KEY),
            server = modules
                .join("@modelcontextprotocol/server-everything/dist/index.js")
                .display(),
        ),
    )
    .unwrap();
    let daemon = start(&config, &dir.path().join("daemon.log"));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let agents: Value = http
        .get(format!("{}/agents", daemon.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(agents["agents"][0]["name"], "everything", "{agents}");
    assert_eq!(
        agents["agents"][0]["variants"][0]["tools"],
        json!(["everything_echo", "everything_get-sum"]),
        "{agents}"
    );
    let response = http
        .post(format!("{}/agents/everything/runs", daemon.base))
        .bearer_auth(KEY)
        .json(&json!({
            "task_id": "echo-1",
            "goal": "Echo the message and add the numbers",
            "input": {"message": "hello from the agent", "a": 2, "b": 3}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let out: Value = response.json().await.unwrap();
    assert_eq!(out["state"], "succeeded", "{out}");
    let answer = out["output"]["everything"]["answer"].as_str().unwrap_or("");
    assert!(answer.contains("hello from the agent"), "{out}");
    assert!(answer.contains('5'), "{out}");
    assert_eq!(out["plan_id"], "local/default", "{out}");
    // An agent the daemon does not host is a 404.
    let missing = http
        .post(format!("{}/agents/nobody/runs", daemon.base))
        .bearer_auth(KEY)
        .json(&json!({"goal": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert!(terminate(daemon));
}
