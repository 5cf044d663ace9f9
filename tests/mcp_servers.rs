//! MCP against real npm servers (installed on first use under target/npm-cache): list, call
//! echo, bad arguments, unknown tool, a server killed mid-session then recovered; and the echo
//! round trip measured.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hindsight::taxonomy::{ErrorClass, FailureCategory};
use hindsight::tools::mcp::{Health, McpServer};
use hindsight::tools::{
    CallContext, CallOptions, McpServerConfig, ResiliencePolicy, RetryPolicy, TokioClock,
    ToolRegistry, ToolRunner, Toolbox, ToolsConfig,
};
use serde_json::json;

fn everything_config() -> McpServerConfig {
    let modules = support::npm_servers();
    let index = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let mut c = McpServerConfig::new(
        "everything",
        "node",
        vec![index.display().to_string(), "stdio".into()],
    );
    c.request_timeout_ms = 10_000;
    c.restart_base_ms = 100;
    c
}

fn memory_config(dir: &std::path::Path) -> McpServerConfig {
    let modules = support::npm_servers();
    let index = modules.join("@modelcontextprotocol/server-memory/dist/index.js");
    let mut c = McpServerConfig::new("memory", "node", vec![index.display().to_string()]);
    c.env.insert(
        "MEMORY_FILE_PATH".into(),
        dir.join("memory.jsonl").display().to_string(),
    );
    c.tool_prefix = Some("memory".into());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_server_list_call_errors_and_recovery() {
    let server = McpServer::connect(everything_config()).await.unwrap();
    let mut reg = ToolRegistry::new();
    for t in server.tools() {
        reg.register(t).unwrap();
    }
    let names = reg.names();
    assert!(names.len() >= 10, "{names:?}");
    for expected in ["echo", "get-sum"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    let echo_schema = reg.get("echo").unwrap().spec().input_schema.clone();
    assert!(
        echo_schema["properties"]["message"].is_object(),
        "{echo_schema}"
    );

    let ctx = CallContext::default();
    let out = reg
        .call("echo", json!({"message": "hello"}), &ctx)
        .await
        .unwrap();
    assert!(
        out.value["text"].as_str().unwrap().contains("hello"),
        "{}",
        out.value
    );
    assert!(out.latency_ms > 0.0);
    let sum = reg
        .call("get-sum", json!({"a": 2, "b": 3}), &ctx)
        .await
        .unwrap();
    assert!(
        sum.value["text"].as_str().unwrap().contains('5'),
        "{}",
        sum.value
    );

    // Bad arguments: caught by our schema check before the call...
    let e = reg
        .call("echo", json!({"message": 5}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::SchemaMismatch, FailureCategory::Strategy)
    );
    assert!(e.message.contains("/message"), "{}", e.message);
    // ... and by the server when sent anyway (isError result with -32602).
    let e = server
        .call("echo", json!({"message": 5}))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::SchemaMismatch, FailureCategory::Strategy),
        "{e}"
    );
    // Unknown tool, straight to the server.
    let e = server.call("no-such-tool", json!({})).await.unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::NotFound, FailureCategory::Strategy),
        "{e}"
    );
    let e = reg.call("no-such-tool", json!({}), &ctx).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);

    // Kill the server mid-session.
    let pid = server.pid().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let e = server
        .call("echo", json!({"message": "after kill"}))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (
            ErrorClass::TransientNetwork,
            FailureCategory::Infrastructure
        ),
        "{e}"
    );
    // Calls meanwhile fail fast with TransientNetwork (or succeed if the restart was quick).
    match server.call("echo", json!({"message": "meanwhile"})).await {
        Err(e) => assert_eq!(e.class, ErrorClass::TransientNetwork, "{e}"),
        Ok(_) => assert_eq!(server.health(), Health::Up),
    }
    assert!(
        server.wait_up(Duration::from_secs(20)).await,
        "server did not come back"
    );
    assert_eq!(server.restarts(), 1);
    assert_ne!(server.pid(), Some(pid));
    let out = reg
        .call("echo", json!({"message": "back"}), &ctx)
        .await
        .unwrap();
    assert!(out.value["text"].as_str().unwrap().contains("back"));

    // Through the resilient runner, a kill is ridden out by retries.
    let reg = Arc::new(reg);
    let policy = ResiliencePolicy {
        retry: RetryPolicy {
            max_attempts: 8,
            base_ms: 200,
            max_ms: 2000,
            retry_non_idempotent: true,
            ..RetryPolicy::default()
        },
        ..ResiliencePolicy::default()
    };
    let runner = ToolRunner::new(reg, Arc::new(TokioClock::new()), 1).with_default_policy(policy);
    let pid = server.pid().unwrap();
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let report = runner
        .call(
            "echo",
            json!({"message": "ridden out"}),
            &ctx,
            &CallOptions::default(),
        )
        .await;
    assert!(report.result.is_ok(), "{report:?}");
    assert!(report.attempts.len() >= 2, "{:?}", report.attempts);
    assert_eq!(report.attempts[0].error, Some(ErrorClass::TransientNetwork));

    server.shutdown().await;
    assert_eq!(server.health(), Health::Stopped);
    let e = server
        .call("echo", json!({"message": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::TransientNetwork);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_server_through_the_toolbox() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ToolsConfig {
        mcp: vec![memory_config(dir.path())],
        sim_envs: vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/envs/bank_statements.toml"
        ))],
        sim_seed: 1,
    };
    let tb = Toolbox::build(&cfg).await.unwrap();
    let names = tb.registry.names();
    assert!(
        names.iter().any(|n| n == "memory.create_entities"),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "pdfminer"), "{names:?}");
    let ctx = CallContext::default();
    let out = tb
        .registry
        .call(
            "memory.create_entities",
            json!({"entities": [{"name": "tenant-B", "entityType": "tenant", "observations": ["strict normalizer fails"]}]}),
            &ctx,
        )
        .await
        .unwrap();
    assert!(
        out.value["text"].as_str().unwrap().contains("tenant-B"),
        "{}",
        out.value
    );
    let out = tb
        .registry
        .call("memory.read_graph", json!({}), &ctx)
        .await
        .unwrap();
    assert!(out.value.to_string().contains("strict normalizer fails"));
    let e = tb
        .registry
        .call("memory.create_entities", json!({"entities": "nope"}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::SchemaMismatch);
    tb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_is_a_clear_error() {
    let c = McpServerConfig::new("ghost", "/nonexistent/mcp-server", vec![]);
    let e = McpServer::connect(c).await.unwrap_err();
    assert!(
        e.to_string().contains("ghost") && e.to_string().contains("/nonexistent/mcp-server"),
        "{e}"
    );
    let mut c = McpServerConfig::new("silent", "sleep", vec!["30".into()]);
    c.startup_timeout_ms = 500;
    let e = McpServer::connect(c).await.unwrap_err();
    assert!(e.to_string().contains("silent"), "{e}");
}

/// Median and p99 of the echo round trip through rmcp (printed; `cargo test --release --test
/// mcp_servers -- --nocapture echo_round_trip` for the figure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trip() {
    let server = McpServer::connect(everything_config()).await.unwrap();
    for _ in 0..50 {
        server
            .call("echo", json!({"message": "warm"}))
            .await
            .unwrap();
    }
    let mut samples = Vec::with_capacity(1000);
    for i in 0..1000 {
        let t = Instant::now();
        server
            .call("echo", json!({"message": format!("m{i}")}))
            .await
            .unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    let p99 = samples[samples.len() * 99 / 100];
    println!(
        "echo round trip through rmcp to server-everything: median {median:.3} ms, p99 {p99:.3} ms (n=1000)"
    );
    assert!(median < 50.0, "median {median} ms");

    // The same through the registry and the resilient runner (schema validation, breaker, ...).
    let mut reg = ToolRegistry::new();
    for t in server.tools() {
        reg.register(t).unwrap();
    }
    let runner = ToolRunner::new(Arc::new(reg), Arc::new(TokioClock::new()), 1);
    let ctx = CallContext::default();
    let opts = CallOptions::default();
    let mut samples = Vec::with_capacity(1000);
    for i in 0..1000 {
        let t = Instant::now();
        let r = runner
            .call("echo", json!({"message": format!("m{i}")}), &ctx, &opts)
            .await;
        assert!(r.result.is_ok());
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "echo through ToolRunner: median {:.3} ms, p99 {:.3} ms (n=1000)",
        samples[500], samples[990]
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_hits_the_request_deadline_and_the_server_lives_on() {
    let mut cfg = everything_config();
    cfg.request_timeout_ms = 300;
    let server = McpServer::connect(cfg).await.unwrap();
    let t = Instant::now();
    let e = server
        .call(
            "trigger-long-running-operation",
            json!({"duration": 5, "steps": 5}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.category),
        (ErrorClass::Timeout, FailureCategory::Infrastructure),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3));
    let out = server
        .call("echo", json!({"message": "still here"}))
        .await
        .unwrap();
    assert!(out.value["text"].as_str().unwrap().contains("still here"));
    assert_eq!(server.health(), Health::Up);
    server.shutdown().await;
}
