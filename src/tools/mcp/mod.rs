//! MCP servers through rmcp (stdio child processes): start-up with a deadline, their tools listed
//! into the registry with their schemas, per-request deadlines, errors mapped to classified
//! `ToolError`s, and a server that dies restarted with exponential backoff while its calls fail
//! at once with `TransientNetwork`.

pub mod map;
mod tool;

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

pub use tool::McpTool;

use super::config::McpServerConfig;
use super::tool::{Tool, ToolError, ToolOutput};
use crate::taxonomy::{ErrorClass, FailureCategory};

type Service = RunningService<RoleClient, ()>;

/// Lines of a server's stderr kept for error messages.
const STDERR_TAIL: usize = 20;

/// Why an MCP server could not be started.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpServerError {
    /// The process could not be spawned.
    #[error("MCP server `{server}`: cannot start `{command}`: {reason}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The program.
        command: String,
        /// The OS error.
        reason: String,
    },
    /// The MCP handshake or tool listing failed or timed out.
    #[error("MCP server `{server}`: {reason}{}", if stderr.is_empty() { String::new() } else { format!("; its stderr ends with: {stderr}") })]
    Startup {
        /// The server's name.
        server: String,
        /// What failed.
        reason: String,
        /// The end of the server's stderr.
        stderr: String,
    },
}

/// Whether a server is serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Connected.
    Up,
    /// Dead; being restarted.
    Down,
    /// Shut down on purpose.
    Stopped,
}

struct Conn {
    service: Option<Arc<Service>>,
    pid: Option<u32>,
    generation: u64,
    restarting: bool,
    stopped: bool,
}

struct Inner {
    config: McpServerConfig,
    conn: Mutex<Conn>,
    health: watch::Sender<Health>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    restarts: AtomicU32,
    tools: Vec<rmcp::model::Tool>,
}

/// A running MCP server (cheap to clone; the process is stopped when the last clone and its
/// tools are dropped, or by [`McpServer::shutdown`]).
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.config.name)
            .field("health", &self.health())
            .finish()
    }
}

async fn start(
    config: &McpServerConfig,
    stderr_tail: &Arc<Mutex<VecDeque<String>>>,
) -> Result<(Service, Option<u32>), McpServerError> {
    let mut cmd = tokio::process::Command::new(&config.command);
    cmd.args(&config.args).envs(&config.env);
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| McpServerError::Spawn {
            server: config.name.clone(),
            command: config.command.clone(),
            reason: e.to_string(),
        })?;
    let pid = transport.id();
    if let Some(stderr) = stderr {
        let tail = stderr_tail.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(mut t) = tail.lock() {
                    if t.len() >= STDERR_TAIL {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
    }
    let startup = Duration::from_millis(config.startup_timeout_ms);
    let fail = |reason: String| McpServerError::Startup {
        server: config.name.clone(),
        reason,
        stderr: stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join(" | "))
            .unwrap_or_default(),
    };
    match tokio::time::timeout(startup, ().serve(transport)).await {
        Ok(Ok(service)) => Ok((service, pid)),
        Ok(Err(e)) => Err(fail(format!("MCP initialization failed: {e}"))),
        Err(_) => Err(fail(format!(
            "no answer to initialize within {} ms",
            config.startup_timeout_ms
        ))),
    }
}

impl McpServer {
    /// Starts the server, performs the MCP handshake and lists its tools, all within
    /// `startup_timeout_ms`.
    pub async fn connect(config: McpServerConfig) -> Result<McpServer, McpServerError> {
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let (service, pid) = start(&config, &stderr).await?;
        let deadline = Duration::from_millis(config.startup_timeout_ms);
        let tools = match tokio::time::timeout(deadline, service.list_all_tools()).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                return Err(McpServerError::Startup {
                    server: config.name.clone(),
                    reason: format!("tools/list failed: {e}"),
                    stderr: String::new(),
                });
            }
            Err(_) => {
                return Err(McpServerError::Startup {
                    server: config.name.clone(),
                    reason: format!(
                        "no answer to tools/list within {} ms",
                        config.startup_timeout_ms
                    ),
                    stderr: String::new(),
                });
            }
        };
        let (health, _) = watch::channel(Health::Up);
        Ok(McpServer {
            inner: Arc::new(Inner {
                config,
                conn: Mutex::new(Conn {
                    service: Some(Arc::new(service)),
                    pid,
                    generation: 0,
                    restarting: false,
                    stopped: false,
                }),
                health,
                stderr,
                restarts: AtomicU32::new(0),
                tools,
            }),
        })
    }

    /// The server's configured name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// The current health.
    pub fn health(&self) -> Health {
        *self.inner.health.borrow()
    }

    /// The process id of the current server process, if known.
    pub fn pid(&self) -> Option<u32> {
        self.inner.conn.lock().ok().and_then(|c| c.pid)
    }

    /// How many times the server was restarted.
    pub fn restarts(&self) -> u32 {
        self.inner.restarts.load(Ordering::Relaxed)
    }

    /// The tools the server listed at start-up, as registry tools.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.inner
            .tools
            .iter()
            .map(|t| {
                Arc::new(McpTool::new(
                    self.clone(),
                    t,
                    self.inner.config.tool_prefix.as_deref(),
                )) as Arc<dyn Tool>
            })
            .collect()
    }

    /// Waits until the server is up, at most `timeout`; returns whether it is.
    pub async fn wait_up(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.health.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|h| *h == Health::Up)).await,
            Ok(Ok(_))
        )
    }

    /// Stops the server process and any restart.
    pub async fn shutdown(&self) {
        let service = match self.inner.conn.lock() {
            Ok(mut c) => {
                c.stopped = true;
                c.pid = None;
                c.service.take()
            }
            Err(_) => None,
        };
        self.inner.health.send_replace(Health::Stopped);
        if let Some(s) = service {
            s.cancellation_token().cancel();
        }
    }

    /// The live connection, or the error calls get while the server is down.
    fn current(&self) -> Result<(Arc<Service>, u64), ToolError> {
        let (service, generation) = match self.inner.conn.lock() {
            Ok(c) => (c.service.clone(), c.generation),
            Err(_) => (None, 0),
        };
        match service {
            Some(s) if !s.is_transport_closed() => Ok((s, generation)),
            Some(_) => {
                self.mark_dead(generation);
                Err(self.down_error())
            }
            None => Err(self.down_error()),
        }
    }

    fn down_error(&self) -> ToolError {
        let stopped = self.health() == Health::Stopped;
        ToolError::new(
            ErrorClass::TransientNetwork,
            FailureCategory::Infrastructure,
            if stopped {
                format!("MCP server `{}` was shut down", self.name())
            } else {
                format!("MCP server `{}` is down and being restarted", self.name())
            },
        )
        .with_retry_after((!stopped).then_some(self.inner.config.restart_base_ms))
    }

    /// Marks the connection of `generation` dead and starts restarting (once).
    fn mark_dead(&self, generation: u64) {
        let Ok(mut c) = self.inner.conn.lock() else {
            return;
        };
        if c.generation != generation || c.stopped {
            return;
        }
        c.service = None;
        c.pid = None;
        self.inner.health.send_replace(Health::Down);
        if c.restarting {
            return;
        }
        c.restarting = true;
        tracing::warn!(server = %self.name(), "MCP server died; restarting with backoff");
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(restart_loop(weak));
    }

    /// Calls the server's tool `name` with `args` (an object), within the request deadline.
    pub async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        let arguments = match args {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => {
                return Err(ToolError::new(
                    ErrorClass::SchemaMismatch,
                    FailureCategory::Strategy,
                    format!("{name}: arguments must be an object, found {other}"),
                ));
            }
        };
        let (service, generation) = self.current()?;
        let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        let deadline = self.inner.config.request_timeout_ms;
        let start = Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_millis(deadline), service.call_tool(params)).await;
        let latency_ms = start.elapsed().as_secs_f64() * 1000.0;
        let result = match answer {
            Err(_) => Err(ToolError::new(
                ErrorClass::Timeout,
                FailureCategory::Infrastructure,
                format!(
                    "{name}: MCP server `{}` gave no answer within {deadline} ms",
                    self.name()
                ),
            )),
            Ok(Ok(r)) if r.is_error == Some(true) => Err(map::error_result(name, &r)),
            Ok(Ok(r)) => Ok(ToolOutput {
                value: map::result_value(&r),
                latency_ms,
                cost: 0.0,
            }),
            Ok(Err(ServiceError::McpError(e))) => {
                Err(map::classify(name, Some(e.code.0), &e.message))
            }
            Ok(Err(ServiceError::Timeout { timeout })) => Err(ToolError::new(
                ErrorClass::Timeout,
                FailureCategory::Infrastructure,
                format!("{name}: timed out after {} ms", timeout.as_millis()),
            )),
            Ok(Err(
                e @ (ServiceError::TransportClosed
                | ServiceError::TransportSend(_)
                | ServiceError::Cancelled { .. }),
            )) => {
                if service.is_transport_closed() || matches!(e, ServiceError::TransportClosed) {
                    self.mark_dead(generation);
                }
                Err(ToolError::new(
                    ErrorClass::TransientNetwork,
                    FailureCategory::Infrastructure,
                    format!("{name}: MCP server `{}` connection lost: {e}", self.name()),
                )
                .with_retry_after(Some(self.inner.config.restart_base_ms)))
            }
            Ok(Err(e)) => Err(ToolError::classified(
                Some("McpServiceError"),
                format!("{name}: {e}"),
            )),
        };
        result.map_err(|e| e.with_usage(latency_ms, 0.0))
    }
}

async fn restart_loop(weak: Weak<Inner>) {
    let mut failures = 0u32;
    loop {
        let (config, stderr) = match weak.upgrade() {
            Some(inner) => (inner.config.clone(), inner.stderr.clone()),
            None => return,
        };
        let factor = 1u64.checked_shl(failures.min(20)).unwrap_or(u64::MAX);
        let delay = config
            .restart_base_ms
            .saturating_mul(factor)
            .min(config.restart_max_ms);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let Some(inner) = weak.upgrade() else { return };
        if inner.conn.lock().map(|c| c.stopped).unwrap_or(true) {
            return;
        }
        drop(inner);
        match start(&config, &stderr).await {
            Ok((service, pid)) => {
                let Some(inner) = weak.upgrade() else { return };
                let Ok(mut c) = inner.conn.lock() else { return };
                if c.stopped {
                    return;
                }
                c.service = Some(Arc::new(service));
                c.pid = pid;
                c.generation += 1;
                c.restarting = false;
                inner.restarts.fetch_add(1, Ordering::Relaxed);
                inner.health.send_replace(Health::Up);
                tracing::info!(server = %config.name, "MCP server restarted");
                return;
            }
            Err(e) => {
                tracing::warn!(server = %config.name, error = %e, "MCP server restart failed");
                failures += 1;
            }
        }
    }
}
