//! An optional journal of tool invocations (`HINDSIGHT_CALL_JOURNAL=FILE`), for proving from
//! outside the process that an idempotent call is never repeated after its result was recorded:
//! `call <key>` is written when a tool is really invoked, `recorded <key>` once its result is
//! durable. Lines are appended with one `write` each, so a killed process leaves whole lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use hindsight::tools::{CallContext, Tool, ToolFuture, ToolRegistry, ToolSpec};

/// The environment variable naming the journal file.
pub const ENV: &str = hindsight::config::ENV_CALL_JOURNAL;

/// An append-only journal file.
#[derive(Clone)]
pub struct CallJournal {
    file: Arc<Mutex<File>>,
}

impl CallJournal {
    /// Opens (creates) the journal at `path`.
    pub fn open(path: &Path) -> std::io::Result<CallJournal> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(CallJournal {
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The journal named by `HINDSIGHT_CALL_JOURNAL`, if set.
    pub fn from_env() -> std::io::Result<Option<CallJournal>> {
        match std::env::var_os(ENV) {
            Some(p) => CallJournal::open(Path::new(&p)).map(Some),
            None => Ok(None),
        }
    }

    /// Appends one line.
    pub fn line(&self, kind: &str, key: &str) {
        let mut f = match self.file.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        if let Err(e) = f.write_all(format!("{kind} {key}\n").as_bytes()) {
            tracing::warn!(error = %e, "the call journal was not written");
        }
    }
}

/// The idempotency key of a call from its context (as the run machine forms it).
pub fn key_of(ctx: &CallContext) -> String {
    hindsight::store::idempotency::agent_call_key(
        &ctx.run_id,
        ctx.attempt,
        &ctx.stage,
        ctx.turn,
        ctx.call,
    )
}

/// A tool that journals every real invocation.
struct JournalTool {
    inner: Arc<dyn Tool>,
    journal: CallJournal,
}

impl Tool for JournalTool {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn call<'a>(&'a self, args: serde_json::Value, ctx: &'a CallContext) -> ToolFuture<'a> {
        self.journal.line("call", &key_of(ctx));
        self.inner.call(args, ctx)
    }
}

/// Every tool of `registry`, journaled.
pub fn wrap_registry(registry: ToolRegistry, journal: &CallJournal) -> ToolRegistry {
    let mut out = ToolRegistry::new();
    for name in registry.names() {
        if let Some(tool) = registry.get(&name) {
            let wrapped: Arc<dyn Tool> = Arc::new(JournalTool {
                inner: tool,
                journal: journal.clone(),
            });
            if let Err(e) = out.register(wrapped) {
                tracing::warn!(tool = %name, error = %e, "tool not journaled");
            }
        }
    }
    out
}
