//! ReflectRetry with a validator of your own. The validator here is a four-eyes rule: a
//! reviewer rejects the first draft of every task, naming the tools that produced it, so that the
//! run is sent back to the orchestrator once with a reflection message built from the template.
//! After that the reviewer defers to hindsight's default validator. The example prints each
//! outcome's `reflect_retries` and the reflection the run was re-planned with.
//!
//! A validator sees only the events of the round it judges (not the run id or the round), so the
//! reviewer is armed before each task and the tasks are submitted one at a time.
//!
//! Run it with `cargo run --example custom_validator`.

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use hindsight::store::Durability;
use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::workload::sim_task;
use hindsight_actors::plugin::RunEvent;
use hindsight_actors::reflect_retry::{
    RETRY_COUNTS, ReflectRetryConfig, RunValidator, default_validator, render_reflection,
};
use hindsight_actors::runtime::{Runtime, RuntimeOptions};

/// Any error of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The reflection template (`{attempt}`, `{max}` and `{reason}` are filled in).
pub const TEMPLATE: &str =
    "[review {attempt}/{max}] {reason}. Re-run the statement and check that the totals match.";

/// ReflectRetry rounds allowed per run.
pub const MAX_RETRIES: u32 = 2;

/// The start of every rejection of the reviewer.
pub const REASON: &str = "four-eyes rule: the first draft";

/// Rejects the first round it sees after being armed, then defers to the default validator.
pub struct Reviewer {
    armed: AtomicBool,
    /// The reason of the last rejection.
    last: Mutex<Option<String>>,
}

impl Reviewer {
    /// A reviewer, not armed.
    pub fn new() -> Arc<Reviewer> {
        Arc::new(Reviewer {
            armed: AtomicBool::new(false),
            last: Mutex::new(None),
        })
    }

    /// Arms the reviewer for the next task.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The reason of the rejection since the reviewer was last armed, if any.
    pub fn rejection(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The validator ReflectRetry calls with each finished round's events.
    pub fn validator(self: &Arc<Self>) -> RunValidator {
        let reviewer = self.clone();
        let fallback = default_validator();
        Arc::new(move |events: &[RunEvent]| {
            if reviewer.armed.swap(false, Ordering::SeqCst) {
                let steps: Vec<String> = events
                    .iter()
                    .filter_map(|e| match e {
                        RunEvent::StepSucceeded { stage, tool } => Some(format!("{stage}={tool}")),
                        _ => None,
                    })
                    .collect();
                let reason = format!(
                    "{REASON} ({}) must be redone and compared before it is filed",
                    steps.join(", ")
                );
                *reviewer.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
                return Err(reason);
            }
            fallback(events)
        })
    }
}

/// One task's outcome.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The task.
    pub task_id: String,
    /// The terminal state.
    pub state: String,
    /// ReflectRetry rounds that sent the run back.
    pub reflect_retries: u32,
    /// Attempts over all rounds.
    pub attempts: u32,
    /// The retry count ReflectRetry persisted for the run.
    pub persisted_retries: Option<u32>,
    /// The reflection ReflectRetry sent the run back with (the template filled with the
    /// reviewer's reason).
    pub reflection: Option<String>,
    /// The guidance in the run's last checkpoint: the reflection, unless a later recovery of the
    /// second round replaced it with its own hint.
    pub last_guidance: Option<String>,
}

/// Runs `tasks` tasks of the bank-statements environment under the reviewer.
pub async fn demo(data_dir: &Path, tasks: u64) -> Result<Vec<Reviewed>, BoxError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envs/bank_statements.toml");
    let env = SimEnv::load(&path)?;
    let reviewer = Reviewer::new();
    let mut opts = RuntimeOptions::new(data_dir, env.clone());
    opts.durability = Durability::None;
    opts.seed = 3;
    opts.reflect_retry = ReflectRetryConfig {
        max_retries: MAX_RETRIES,
        template: TEMPLATE.to_string(),
    };
    opts.validator = reviewer.validator();
    let rt = Runtime::start(opts).await?;

    let mut out = Vec::new();
    for index in 0..tasks {
        reviewer.arm();
        let outcome = rt.orchestrate(sim_task(&env, 3, index)).await?;
        let reflection = reviewer
            .rejection()
            .map(|reason| render_reflection(TEMPLATE, 1, MAX_RETRIES, &reason));
        // The driver checkpoints the guidance it plans with; a finished run keeps its last
        // checkpoint.
        let last_guidance = rt
            .store()
            .latest_checkpoint(&outcome.run_id)?
            .and_then(|cp| {
                cp.state
                    .get("guidance")
                    .and_then(|g| g.as_str())
                    .map(String::from)
            });
        let reviewed = Reviewed {
            task_id: outcome.task_id.clone(),
            state: outcome.state.to_string(),
            reflect_retries: outcome.reflect_retries,
            attempts: outcome.attempts,
            persisted_retries: rt.store().get(RETRY_COUNTS, &outcome.run_id)?,
            reflection,
            last_guidance,
        };
        println!(
            "{}: {} after {} attempts, reflect_retries = {}",
            reviewed.task_id, reviewed.state, reviewed.attempts, reviewed.reflect_retries
        );
        if let Some(r) = &reviewed.reflection {
            println!("  reflection: {r}");
        }
        match &reviewed.last_guidance {
            Some(g) if reviewed.reflection.as_ref() == Some(g) => {
                println!("  (the run's last checkpoint planned with this reflection)")
            }
            Some(g) => println!("  then a recovery in round 2 planned with: {g}"),
            None => {}
        }
        out.push(reviewed);
    }
    rt.shutdown().await;
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    demo(dir.path(), 4).await?;
    Ok(())
}
