//! `hindsight agents` as a user runs it, offline: `list` shows two agents, their budgets and
//! that one calls the other; `run` runs a task on the caller by name, whose `agent:echoer` call
//! is a child run of the callee in the callee's own store; an unknown agent is refused by name.

mod cli_support;

use cli_support::hindsight;
use serde_json::Value;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("agents.toml");
    std::fs::write(
        &path,
        format!(
            r#"data_dir = "{data}"

[[agent]]
name = "desk"
description = "Answers, asking the echoer first"
instructions = "You answer by calling your tools."
max_tokens = 50000

[[agent.variants]]
name = "default"
model = "local"
tools = ["agent:echoer"]

[[agent]]
name = "echoer"
description = "Repeats what it is asked"
instructions = "You repeat the request."

[[agent.variants]]
name = "default"
model = "local"
tools = []

[models.local]

[store]
durability = "none"

[log]
level = "warn"
"#,
            data = dir.join("data").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn agents_are_listed_and_run_by_name_one_calling_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let config = config.to_str().unwrap();
    let data = dir.path().join("data");
    let out = hindsight(&data, &["agents", "list", "--config", config]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("desk: Answers, asking the echoer first"),
        "{text}"
    );
    assert!(text.contains("max_tokens 50000"), "{text}");
    assert!(text.contains("calls agents: echoer"), "{text}");
    assert!(text.contains("echoer: Repeats what it is asked"), "{text}");

    let out = hindsight(
        &data,
        &[
            "agents",
            "run",
            "desk",
            "--config",
            config,
            "--task-id",
            "t1",
            "--goal",
            "Have the echoer repeat the word",
            "--input",
            r#"{"goal": "Repeat the word xyzzy"}"#,
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["state"], "succeeded", "{outcome}");
    let answer = outcome["output"]["desk"]["answer"].as_str().unwrap_or("");
    assert!(answer.contains("agent_echoer"), "{outcome}");
    assert!(answer.contains("xyzzy"), "{outcome}");
    assert!(answer.contains("run-t1/desk/a0.t1.c0/echoer"), "{outcome}");
    // The child run is the echoer's, in its own store.
    assert!(
        data.join("agents")
            .join("echoer")
            .join("hindsight.redb")
            .exists()
    );

    let out = hindsight(
        &data,
        &["agents", "run", "nobody", "--config", config, "--goal", "x"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no agent `nobody`") && err.contains("desk, echoer"),
        "{err}"
    );
}
