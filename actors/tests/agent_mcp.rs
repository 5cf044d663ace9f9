//! An agent over a real MCP server through `hindsight serve`: the configuration's `[[agent]]`
//! offers two tools of `@modelcontextprotocol/server-everything` (installed on first use under
//! target/, pinned) to the offline rule-based model; `GET /agents` lists it and
//! `POST /agents/{name}/runs` runs a task on it, answering with what the real tools returned
//! and the run's provenance.

use std::time::Duration;

#[path = "../../tests/support/mod.rs"]
mod support;

mod daemon_support;

use daemon_support::{start, start_with_env, terminate};
use hindsight::config::hash_key;
use serde_json::{Value, json};

const KEY: &str = "agent-test-secret";

/// A daemon configuration in `dir` (data under `dir/data`): `agents` (the `[[agent]]` blocks),
/// the offline model `local`, tenant `acme` with [`KEY`], server-everything as MCP server
/// `everything`, durability `none` when `durable` is false.
fn daemon_config(dir: &std::path::Path, agents: &str, durable: bool) -> std::path::PathBuf {
    let server =
        support::npm_servers().join("@modelcontextprotocol/server-everything/dist/index.js");
    let config = dir.join("hindsight.toml");
    let store = if durable {
        ""
    } else {
        "[store]\ndurability = \"none\"\n"
    };
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"
{agents}
[models.local]

{store}
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
            data = dir.join("data").display(),
            key = hash_key(KEY),
            server = server.display(),
        ),
    )
    .unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_agent_calls_real_mcp_tools_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let config = daemon_config(
        dir.path(),
        r#"
[[agent]]
name = "everything"
description = "Echoes a message and adds two numbers"
instructions = "You answer by calling the tools of the everything server."
max_turns = 6

[[agent.variants]]
name = "default"
model = "local"
tools = ["everything/echo", "everything/get-sum"]
"#,
        false,
    );
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

/// Two agents in one daemon, one calling the other (`agent:echoer`): each call of the tool is a
/// child run of the callee in its own tree and store, linked to its parent by id, readable at
/// `GET /runs/{id}`; both agents are listed, and each keeps its runs in its own store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_hosts_two_agents_and_one_calls_the_other_as_a_child_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = daemon_config(
        dir.path(),
        r#"
[[agent]]
name = "desk"
description = "Answers a request, asking the echoer to echo its message"
instructions = "You answer by calling your tools."

[[agent.variants]]
name = "default"
model = "local"
tools = ["agent:echoer", "everything/get-sum"]

[[agent]]
name = "echoer"
description = "Echoes a message"
instructions = "You echo the message with the echo tool."

[[agent.variants]]
name = "default"
model = "local"
tools = ["everything/echo"]
"#,
        false,
    );
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
    assert_eq!(agents["agents"][0]["name"], "desk", "{agents}");
    assert_eq!(
        agents["agents"][0]["variants"][0]["tools"],
        json!(["agent_echoer", "everything_get-sum"]),
        "{agents}"
    );
    assert_eq!(agents["agents"][1]["name"], "echoer", "{agents}");
    let response = http
        .post(format!("{}/agents/desk/runs", daemon.base))
        .bearer_auth(KEY)
        .json(&json!({
            "task_id": "multi-1",
            "goal": "Have the message echoed and add the numbers",
            "input": {"goal": "Echo the message", "input": {"message": "hello via echoer"}, "a": 2, "b": 3}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let out: Value = response.json().await.unwrap();
    assert_eq!(out["state"], "succeeded", "{out}");
    let answer = out["output"]["desk"]["answer"].as_str().unwrap_or("");
    assert!(answer.contains("hello via echoer"), "{out}");
    assert!(answer.contains('5'), "{out}");
    // The child run: in the echoer's tree, its id naming its parent run and the call.
    let child_id = "run-acme/multi-1/desk/a0.t1.c0/echoer";
    assert!(answer.contains(child_id), "{out}");
    let child: Value = http
        .get(format!(
            "{}/runs/{}",
            daemon.base,
            child_id.replace('/', "%2F")
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(child["run"]["state"], "succeeded", "{child}");
    assert_eq!(child["run"]["tenant"], "acme", "{child}");
    assert_eq!(child["arms"][0]["stage"], "echoer", "{child}");
    assert_eq!(
        child["steps"][1]["tool_called"], "everything.echo",
        "{child}"
    );
    // The echoer's runs are in its own store, and the desk's in the daemon's data_dir.
    assert!(data.join("agents").join("echoer").exists());
    let parent: Value = http
        .get(format!("{}/runs/run-acme%2Fmulti-1", daemon.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(parent["run"]["state"], "succeeded", "{parent}");
    assert_eq!(
        parent["steps"][1]["tool_called"], "agent:echoer",
        "{parent}"
    );
    assert!(terminate(daemon));
}

/// The configuration of an agent whose offline model calls `echo` and then
/// `trigger-long-running-operation` of server-everything (both idempotent by their hints).
fn long_config(dir: &std::path::Path) -> std::path::PathBuf {
    daemon_config(
        dir,
        r#"
[[agent]]
name = "slow"
description = "Echoes, then runs a long operation"
instructions = "Call the tools."

[[agent.variants]]
name = "default"
model = "local"
tools = ["everything/echo", "everything/trigger-long-running-operation"]
"#,
        true,
    )
}

fn journal_calls(journal: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("call ").map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_an_agents_loop_repeats_no_completed_call() {
    let dir = tempfile::tempdir().unwrap();
    let config = long_config(dir.path());
    let (log, journal) = (dir.path().join("daemon.log"), dir.path().join("calls.log"));
    let env = [(hindsight_actors::journal::ENV, journal.as_path())];
    let mut daemon = start_with_env(&config, &log, &env);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let body = json!({
        "task_id": "long-1",
        "goal": "Echo, then run the long operation",
        "input": {"message": "before the crash", "duration": 3, "steps": 3}
    });
    let url = format!("{}/agents/slow/runs", daemon.base);
    let first = tokio::spawn({
        let (http, body) = (http.clone(), body.clone());
        async move { http.post(url).bearer_auth(KEY).json(&body).send().await }
    });
    // The long operation is in flight once the journal shows its call (the second of the run).
    let mut waited = 0;
    while journal_calls(&journal).len() < 2 {
        assert!(
            waited < 600,
            "the loop never reached its second call: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    daemon.child.kill().unwrap();
    let _ = daemon.child.wait();
    assert!(first.await.unwrap().is_err(), "the killed daemon answered");
    let calls_before = journal_calls(&journal);

    // Restarted, the daemon resumes the run mid-loop; resubmitting the task joins it.
    let daemon = start_with_env(&config, &log, &env);
    let out: Value = http
        .post(format!("{}/agents/slow/runs", daemon.base))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let calls = journal_calls(&journal);
    let echo: Vec<&String> = calls.iter().filter(|k| k.ends_with("/t1/c0")).collect();
    // The echo completed before the crash: its result is in the checkpointed conversation and
    // it is not called again.
    assert_eq!(
        echo.len(),
        1,
        "calls before {calls_before:?}, after {calls:?}"
    );
    // The long operation (idempotent by its server's hints) was in flight and never completed:
    // it has no record, so the resumed loop makes it again, once, and the run ends well. (A
    // call in flight that is not idempotent is in doubt and goes to the failure policy instead:
    // `src/run/agent_tests.rs`.)
    let long: Vec<&String> = calls.iter().filter(|k| k.ends_with("/t2/c1")).collect();
    assert_eq!(long.len(), 2, "{calls:?}");
    assert_eq!(out["state"], "succeeded", "{out}");
    let answer = out["output"]["slow"]["answer"].as_str().unwrap_or("");
    assert!(answer.contains("before the crash"), "{out}");
    assert!(terminate(daemon));
}
