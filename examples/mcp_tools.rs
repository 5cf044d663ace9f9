//! Tools from an MCP server: starts the npm server `@modelcontextprotocol/server-everything`
//! (stdio), lists its tools into a [`ToolRegistry`] (each with the JSON schema the server
//! declared), and calls `echo` through the resilient [`ToolRunner`] (schema check, timeout,
//! retries with backoff, circuit breaker), printing the call report. A call with a bad argument is
//! rejected by the schema check before it reaches the server.
//!
//! The server is installed on first use exactly as the MCP tests install it: the pinned version,
//! with npm, into `target/npm-cache/mcp-2026.8.31` (under `CARGO_TARGET_DIR` when it is set),
//! serialised with `flock`. It needs Node.js and npm; when they are missing or the install
//! fails, the example says how to install the server by hand and exits with status 1.
//!
//! Run it with `cargo run --example mcp_tools`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use hindsight::tools::mcp::McpServer;
use hindsight::tools::{
    CallContext, CallOptions, CallReport, McpServerConfig, ResiliencePolicy, RetryPolicy,
    StopReason, TokioClock, ToolRegistry, ToolRunner,
};
use serde_json::json;

/// Any error of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The pinned server (the version the MCP tests use).
pub const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";
/// The other server the tests install into the same cache (installed together, so that the
/// cache is the tests' own).
pub const MEMORY: &str = "@modelcontextprotocol/server-memory@2026.8.31";

/// The cargo target folder (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// How to install the server by hand into `dir`.
fn how_to_install(dir: &Path) -> String {
    format!(
        "install Node.js 18+ with npm, then run: mkdir -p '{d}' && cd '{d}' && npm install \
         --prefix . {EVERYTHING} {MEMORY} && touch .installed",
        d = dir.display()
    )
}

/// Installs the pinned npm MCP servers (once) into the tests' cache and returns the path of
/// server-everything's entry point.
pub fn install_everything() -> Result<PathBuf, String> {
    let dir = target_dir().join("npm-cache").join("mcp-2026.8.31");
    let index = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if dir.join(".installed").exists() && index.exists() {
        return Ok(index);
    }
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create {}: {e}; {}",
            dir.display(),
            how_to_install(&dir)
        )
    })?;
    println!(
        "installing {EVERYTHING} into {} (first run only)",
        dir.display()
    );
    let script = format!(
        "set -e; cd '{}'; [ -f .installed ] && exit 0; \
         npm install --no-audit --no-fund --silent --prefix . {EVERYTHING} {MEMORY}; touch .installed",
        dir.display()
    );
    let out = Command::new("flock")
        .arg(dir.with_extension("lock"))
        .args(["bash", "-c", &script])
        .output()
        .map_err(|e| {
            format!(
                "cannot run flock and bash to install the server: {e}; {}",
                how_to_install(&dir)
            )
        })?;
    if !out.status.success() {
        let output = [&out.stdout, &out.stderr]
            .iter()
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        return Err(format!(
            "installing the MCP server failed ({}): {output}; {}",
            out.status,
            how_to_install(&dir)
        ));
    }
    if !index.exists() {
        return Err(format!(
            "npm finished but {} is missing; {}",
            index.display(),
            how_to_install(&dir)
        ));
    }
    Ok(index)
}

/// What the example did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The tools the server listed, as registered.
    pub tools: Vec<String>,
    /// The report of the `echo` call.
    pub echo: CallReport,
    /// The report of an `echo` call with a bad argument.
    pub bad_echo: CallReport,
}

/// Starts server-everything from `index` (its `dist/index.js`), registers its tools and calls
/// `echo` through the runner.
pub async fn demo(index: &Path, message: &str) -> Result<Summary, BoxError> {
    let mut config = McpServerConfig::new(
        "everything",
        "node",
        vec![index.display().to_string(), "stdio".into()],
    );
    config.request_timeout_ms = 10_000;
    let server = McpServer::connect(config).await?;
    let mut registry = ToolRegistry::new();
    for tool in server.tools() {
        registry.register(tool)?;
    }
    let tools = registry.names();
    println!("server `{}` lists {} tools:", server.name(), tools.len());
    for name in &tools {
        if let Some(tool) = registry.get(name) {
            println!(
                "  {:<28} {}",
                name,
                tool.spec().description.lines().next().unwrap_or("")
            );
        }
    }
    if let Some(echo) = registry.get("echo") {
        println!("echo's input schema: {}", echo.spec().input_schema);
    }

    // Real time for a real server: backoff waits are slept.
    let policy = ResiliencePolicy {
        timeout_ms: Some(10_000),
        retry: RetryPolicy {
            max_attempts: 4,
            base_ms: 100,
            max_ms: 1_000,
            ..RetryPolicy::default()
        },
        ..ResiliencePolicy::default()
    };
    let runner = ToolRunner::new(Arc::new(registry), Arc::new(TokioClock::new()), 1)
        .with_default_policy(policy);
    let ctx = CallContext {
        run_id: "mcp-example".to_string(),
        stage: "greet".to_string(),
        ..CallContext::default()
    };
    let echo = runner
        .call(
            "echo",
            json!({"message": message}),
            &ctx,
            &CallOptions::default(),
        )
        .await;
    match &echo.result {
        Ok(out) => println!(
            "echo -> {} ({:?} after {} attempt(s), {:.1} ms)",
            out.value,
            echo.stop,
            echo.attempts.len(),
            echo.total_latency_ms
        ),
        Err(e) => println!("echo failed: {e} ({:?})", echo.stop),
    }
    let bad_echo = runner
        .call(
            "echo",
            json!({"message": 42}),
            &ctx,
            &CallOptions::default(),
        )
        .await;
    if let Err(e) = &bad_echo.result {
        println!("echo with a number -> {:?}, never sent: {e}", bad_echo.stop);
    }
    // Leave the server running until the calls are done, then stop it.
    tokio::time::timeout(Duration::from_secs(10), server.shutdown()).await?;
    Ok(Summary {
        tools,
        echo,
        bad_echo,
    })
}

/// Whether the summary shows what the example claims.
pub fn check(summary: &Summary, message: &str) -> Result<(), String> {
    let text = match &summary.echo.result {
        Ok(out) => out.value["text"].as_str().unwrap_or_default().to_string(),
        Err(e) => return Err(format!("echo failed: {e}")),
    };
    if !text.contains(message) {
        return Err(format!("echo answered {text:?}, not the message"));
    }
    if summary.bad_echo.stop != StopReason::Rejected {
        return Err(format!(
            "a bad argument was not rejected: {:?}",
            summary.bad_echo.stop
        ));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let index = match install_everything() {
        Ok(index) => index,
        Err(e) => {
            eprintln!("mcp_tools: the MCP server is not available: {e}");
            return ExitCode::FAILURE;
        }
    };
    let message = "hello from hindsight";
    match demo(&index, message).await {
        Ok(summary) => match check(&summary, message) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mcp_tools: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("mcp_tools: {e}");
            ExitCode::FAILURE
        }
    }
}
