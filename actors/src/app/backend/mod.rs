//! The daemon's [`Backend`](crate::app::api::Backend): the HTTP API over a running supervision tree
//! ([`TreeBackend`]), started from a [`Config`], with tenant isolation by namespacing (the rules
//! are in `tenant.rs`).

mod daemon;
mod handlers;
mod options;
mod tenant;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hindsight::config::Config;
use hindsight::store::{Claim, Store, StoreError, StoreOptions, idempotency};
use hindsight::{ArmChoice, ErrorClass, FailureCategory, Lesson, Sop, Step, Task};
use ractor::ActorStatus;
use sha2::{Digest, Sha256};

use crate::app::api::document::DocStage;
use crate::app::api::types::TaskRequest;
use crate::app::api::{BackendError, BackendResult};
use crate::app::metrics::Metrics;
use crate::directory::{CallError, Slot};
use crate::orchestrator::OrchestratorMsg;
use crate::policy::SOPS;
use crate::reflector::ReflectorMsg;
use crate::run::{RunOutcome, TreeCtx};
use crate::runtime::{Runtime, RuntimeError, Submitter};

pub use daemon::Daemon;
pub use options::{
    StartError, agent_workflow, apply_learning, mcp_tools, runtime_options, tree_options,
};
pub use tenant::{run_in_tenant, scope_in_tenant, sop_in_tenant, tenant_run_id, tenant_task_id};

use tenant::Visible;

/// The HTTP API's backend over a running tree.
pub struct TreeBackend {
    ctx: Arc<TreeCtx>,
    submitter: Submitter,
    runtime: tokio::sync::Mutex<Option<Runtime>>,
    metrics: Metrics,
    stopping: AtomicBool,
    /// Numbers the tasks of requests that name none (shared by the daemon's trees, so that no
    /// two agents' generated task ids are the same).
    next_id: Arc<AtomicU64>,
    started_ms: u64,
    /// Damaged records met while serving: how many, and the last one's error (for `/healthz`).
    damage: std::sync::Mutex<(u64, Option<String>)>,
    /// `api.shared_learning`: whether retrieval shows every tenant the statistics learned from
    /// all tenants' runs.
    shared_learning: bool,
    /// The OpenAPI document made exact for the workflow and the guard.
    openapi: String,
}

/// The failure category the policy learns an error class under: timeouts, rate limits and
/// transient network errors are infrastructure (never learned from); `Auth` is ambiguous
/// (credentials or permission); every other class is the strategy's fault.
pub fn category_of(class: ErrorClass) -> FailureCategory {
    match class {
        ErrorClass::Timeout | ErrorClass::RateLimit | ErrorClass::TransientNetwork => {
            FailureCategory::Infrastructure
        }
        ErrorClass::Auth => FailureCategory::Unknown,
        _ => FailureCategory::Strategy,
    }
}

fn call_error(e: CallError) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

fn runtime_error(e: RuntimeError) -> BackendError {
    use crate::orchestrator::SubmitError;
    match e {
        RuntimeError::Call(c) => call_error(c),
        RuntimeError::Submit(SubmitError::Refused { field, reason }) => {
            BackendError::Invalid { field, reason }
        }
        other => BackendError::Internal(other.to_string()),
    }
}

fn hex16(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn slot_status<M: ractor::Message>(slot: &Slot<M>) -> String {
    match slot.current().map(|a| a.get_status()) {
        Some(ActorStatus::Running) => "ok".to_string(),
        Some(status) => format!("{status:?}").to_lowercase(),
        None => "down".to_string(),
    }
}

impl TreeBackend {
    /// Opens the store under `opts.data_dir` and starts the tree `opts` describes (one of the
    /// daemon's: see [`Daemon::start`]), its requests counted in `metrics`, the tasks of requests
    /// that name none numbered by `ids` (the counter and the daemon's start).
    async fn start_tree(
        config: &Config,
        opts: crate::runtime::RuntimeOptions,
        metrics: Metrics,
        ids: (Arc<AtomicU64>, u64),
    ) -> Result<TreeBackend, StartError> {
        let store = Store::open(
            &opts.data_dir,
            StoreOptions {
                durability: opts.durability,
                checkpoints_per_run: config.store.checkpoints_per_run.max(1),
                diary_ttl_ms: config.store.diary_ttl_ms(),
                experience_ttl_ms: config.store.experience_ttl_ms(),
                run_ttl_ms: config.store.run_ttl_ms(),
                cache_bytes: config.store.cache_bytes(),
            },
        )
        .map_err(RuntimeError::from)?;
        let runtime = Runtime::start_with_store(store, opts).await?;
        let ctx = runtime.ctx().clone();
        let stages: Vec<DocStage> = ctx
            .workflow
            .stages()
            .iter()
            .map(|s| DocStage {
                name: s.name.clone(),
                arms: s
                    .arms
                    .iter()
                    .map(|a| (a.tool.clone(), a.strategy.clone()))
                    .collect(),
            })
            .collect();
        let openapi = match crate::app::api::document::for_workflow(
            crate::app::api::OPENAPI_JSON,
            &stages,
            ctx.config.guard.max_goal_chars,
        ) {
            Ok(doc) => doc,
            Err(e) => {
                runtime.stop().await;
                return Err(StartError::Runtime(RuntimeError::Setup(e.to_string())));
            }
        };
        Ok(TreeBackend {
            ctx,
            submitter: runtime.submitter(),
            runtime: tokio::sync::Mutex::new(Some(runtime)),
            metrics,
            stopping: AtomicBool::new(false),
            next_id: ids.0,
            started_ms: ids.1,
            damage: std::sync::Mutex::new((0, None)),
            shared_learning: config.api.shared_learning,
            openapi,
        })
    }

    /// Stops the tree (runs in flight stay checkpointed and resume at the next start).
    /// Requests after this are answered 503.
    async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The backend holds the store itself (its file closes when the backend is dropped), so
        // it does not wait for the tree to release it as `Runtime::shutdown` would.
        if let Some(rt) = self.runtime.lock().await.take() {
            rt.stop().await;
        }
    }

    /// Whether this tree's workflow uses `tool` (a correction naming it is for this tree).
    fn offers_tool(&self, tool: &str) -> bool {
        self.ctx.workflow.tool_names().iter().any(|t| t == tool)
    }

    /// What submits tasks to this tree (another agent's `agent:NAME` tool calls through it).
    fn submitter(&self) -> Submitter {
        self.submitter.clone()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// A store error as the API's: a server fault (500). A damaged record is said as such
    /// ([`BackendError::Damaged`]) and remembered for `/healthz`.
    fn store_fault(&self, e: StoreError) -> BackendError {
        match e {
            StoreError::Corrupt { .. } => {
                self.saw_damage(&e);
                BackendError::Damaged(e.to_string())
            }
            other => BackendError::Internal(other.to_string()),
        }
    }

    fn saw_damage(&self, e: &StoreError) {
        tracing::error!(error = %e, "damaged record in the store");
        let mut seen = self.damage.lock().unwrap_or_else(|p| p.into_inner());
        seen.0 += 1;
        seen.1 = Some(e.to_string());
    }

    /// The damage seen so far: `None`, or what `/healthz` says of the store.
    fn damage_seen(&self) -> Option<String> {
        let seen = self.damage.lock().unwrap_or_else(|p| p.into_inner());
        seen.1.as_ref().map(|last| {
            format!(
                "damaged: {} damaged record(s) met since start, the last: {last}",
                seen.0
            )
        })
    }

    fn check_running(&self) -> BackendResult<()> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable(
                "the daemon is shutting down".into(),
            ));
        }
        Ok(())
    }

    /// The core task of a request, ids namespaced by tenant, checked at ingress (a refusal
    /// names the field under `prefix`: `task.` for `/execute`).
    fn task_of(&self, tenant: &str, request: TaskRequest, prefix: &str) -> BackendResult<Task> {
        let local = match (&request.task_id, &request.idempotency_key) {
            (Some(id), _) => id.clone(),
            (None, Some(key)) => format!("idem-{}", hex16(key)),
            (None, None) => format!(
                "t-{:x}-{}",
                self.started_ms,
                self.next_id.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let user = request.user_id.clone();
        let session = request.session_id.clone();
        let mut task = request.into_task(tenant, || local.clone());
        task.task_id = tenant_task_id(tenant, &local);
        task.user_id = user.map(|u| tenant_task_id(tenant, &u));
        task.session_id = session.map(|s| tenant_task_id(tenant, &s));
        // Ingress: the orchestrator checks every task again (embedders, the CLI); here a refusal
        // names the request's field.
        hindsight::guard::Guard::new()
            .check_task(&task, &self.ctx.config.guard)
            .map(|checked| checked.task)
            .map_err(|e| BackendError::Invalid {
                field: format!("{prefix}{}", e.field()),
                reason: e.to_string(),
            })
    }

    /// Records an idempotency key's task, or refuses a key reused for another task.
    async fn claim_key(&self, tenant: &str, key: Option<&str>, task: &Task) -> BackendResult<()> {
        let Some(key) = key else { return Ok(()) };
        let store_key = idempotency::task_claim_key(tenant, &hex16(key));
        let want = idempotency::task_claim_value(&task.task_id);
        match self.store().claim_idempotent(&store_key, &want).await {
            Ok(Claim::Claimed | Claim::Held) => Ok(()),
            Ok(Claim::Taken(_)) => Err(BackendError::Conflict(
                "idempotency_key was used for another task_id".into(),
            )),
            Err(e) => Err(self.store_fault(e)),
        }
    }

    /// A run's steps so far, from its latest checkpoint (the run driver keeps them in the
    /// checkpoint's state under `steps`).
    fn steps_of(&self, run_id: &str) -> Vec<Step> {
        match self.store().latest_checkpoint(run_id) {
            Ok(Some(c)) if !c.completed_steps.is_empty() => c.completed_steps,
            Ok(Some(c)) => c
                .state
                .get("steps")
                .cloned()
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "the run's checkpoint cannot be read");
                Vec::new()
            }
        }
    }

    fn count_outcome(&self, outcome: &RunOutcome, steps: &[Step]) {
        self.metrics.run_finished(outcome.state);
        for r in &outcome.recoveries {
            self.metrics.recovery(r.failure);
        }
        for _ in 0..outcome.reflect_retries {
            self.metrics.reflect_retry();
        }
        for s in steps {
            if let Some(tool) = &s.tool_called {
                self.metrics.tool_call(tool, s.latency_ms, s.error_class);
            }
        }
    }

    async fn submit(
        &self,
        task: Task,
        plan: Option<Vec<ArmChoice>>,
    ) -> BackendResult<(RunOutcome, Vec<Step>)> {
        // A damaged record of the task's run is the server's fault, said before the orchestrator
        // (which would refuse the task) sees it.
        self.store()
            .get_run(&crate::run::run_id_for(&task))
            .map_err(|e| self.store_fault(e))?;
        self.metrics.run_started();
        match self.submitter.run_with(task, plan).await {
            Ok(outcome) => {
                let steps = self.steps_of(&outcome.run_id);
                self.count_outcome(&outcome, &steps);
                Ok((outcome, steps))
            }
            Err(e) => {
                self.metrics.run_finished(hindsight::RunState::Failed);
                Err(runtime_error(e))
            }
        }
    }

    /// The ids of every lesson the tenant may see.
    async fn tenant_lessons(&self, tenant: &str) -> BackendResult<Vec<Lesson>> {
        let lessons = self
            .ctx
            .dir
            .reflector
            .call(|reply| ReflectorMsg::Lessons {
                scope_prefix: None,
                reply,
            })
            .await
            .map_err(call_error)?;
        Ok(lessons
            .into_iter()
            .filter(|l| scope_in_tenant(tenant, &l.scope))
            .collect())
    }

    fn all_sops(&self) -> BackendResult<Vec<Sop>> {
        let rows = self
            .store()
            .scan::<Sop>(SOPS)
            .map_err(|e| self.store_fault(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(_, s)| s.map_err(|e| self.saw_damage(&e)).ok())
            .collect())
    }

    fn tenant_sops(&self, tenant: &str) -> BackendResult<Vec<Sop>> {
        Ok(self
            .all_sops()?
            .into_iter()
            .filter(|s| sop_in_tenant(tenant, s))
            .collect())
    }

    /// Which `kind:id` citations the tenant may see.
    async fn visible(&self, tenant: &str) -> BackendResult<Visible> {
        let lessons = self
            .tenant_lessons(tenant)
            .await?
            .into_iter()
            .map(|l| l.lesson_id)
            .collect();
        let sops = self
            .tenant_sops(tenant)?
            .into_iter()
            .flat_map(|s| [s.sop_id.clone(), format!("{}@{}", s.sop_id, s.version)])
            .collect();
        let diary = self
            .store()
            .diary_tail(1000)
            .map(|entries| {
                entries
                    .into_iter()
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.run_id
                            .as_deref()
                            .is_some_and(|r| run_in_tenant(tenant, r))
                    })
                    .map(|e| e.seq.to_string())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Visible {
            tenant: tenant.to_string(),
            shared_learning: self.shared_learning,
            lessons,
            sops,
            diary,
        })
    }

    fn check_plan(
        &self,
        plan: &[crate::app::api::types::PlanArm],
    ) -> BackendResult<Vec<ArmChoice>> {
        let stages = self.ctx.workflow.stages();
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        let mut arms = Vec::with_capacity(plan.len());
        for (i, arm) in plan.iter().enumerate() {
            let Some(stage) = stages.iter().find(|s| s.name == arm.stage) else {
                return Err(BackendError::Invalid {
                    field: format!("plan[{i}].stage"),
                    reason: format!(
                        "unknown stage `{}`; the workflow's stages are {}",
                        arm.stage,
                        names.join(", ")
                    ),
                });
            };
            check_arm(stage, &arm.tool, &arm.strategy, &format!("plan[{i}]."))?;
            arms.push(ArmChoice {
                stage: arm.stage.clone(),
                tool: arm.tool.clone(),
                strategy: arm.strategy.clone(),
                propensity: 1.0,
            });
        }
        let given: Vec<&str> = plan.iter().map(|a| a.stage.as_str()).collect();
        if given != names {
            return Err(BackendError::Invalid {
                field: "plan".into(),
                reason: format!(
                    "needs one step per stage, in order: {}; found {}",
                    names.join(", "),
                    given.join(", ")
                ),
            });
        }
        Ok(arms)
    }

    fn check_stage(&self, field: &str, stage: &str) -> BackendResult<()> {
        let stages = self.ctx.workflow.stages();
        if stages.iter().any(|s| s.name == stage) {
            return Ok(());
        }
        Err(BackendError::Invalid {
            field: field.into(),
            reason: format!(
                "unknown stage `{stage}`; the workflow's stages are {}",
                stages
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    async fn own_run(&self, tenant: &str, run_id: &str) -> BackendResult<Option<hindsight::Run>> {
        if !run_in_tenant(tenant, run_id) {
            return Ok(None);
        }
        let run = self
            .ctx
            .dir
            .orchestrator
            .call(|reply| OrchestratorMsg::Get {
                run_id: run_id.to_string(),
                reply,
            })
            .await
            .map_err(call_error)?;
        if run.is_none() {
            // The orchestrator answers `None` for a record it cannot read: a damaged record is
            // the server's fault, not an absent run.
            self.store()
                .get_run(run_id)
                .map_err(|e| self.store_fault(e))?;
        }
        Ok(run.filter(|r| r.tenant.as_deref() == Some(tenant)))
    }

    /// The effective observation count behind a Beta posterior of mean `m` and deviation `sd`
    /// (its pseudo-count minus the prior's).
    fn effective_n(&self, m: f64, sd: f64) -> u64 {
        let var = sd * sd;
        if var <= f64::EPSILON {
            return 0;
        }
        let total = m * (1.0 - m) / var - 1.0;
        (total - hindsight::learn::bandit::prior_pseudo_count())
            .max(0.0)
            .round() as u64
    }
}

/// Whether `stage` has the arm `(tool, strategy)`; if not, the error names the field at fault
/// (`{prefix}tool` or `{prefix}strategy`) and what the stage offers.
fn check_arm(
    stage: &hindsight::run::workflow::WorkflowStage,
    tool: &str,
    strategy: &str,
    prefix: &str,
) -> BackendResult<()> {
    if !stage.arms.iter().any(|a| a.tool == tool) {
        let mut tools: Vec<&str> = stage.arms.iter().map(|a| a.tool.as_str()).collect();
        tools.dedup();
        return Err(BackendError::Invalid {
            field: format!("{prefix}tool"),
            reason: format!(
                "stage `{}` has no tool `{tool}`; its tools are {}",
                stage.name,
                tools.join(", ")
            ),
        });
    }
    if !stage
        .arms
        .iter()
        .any(|a| a.tool == tool && a.strategy == strategy)
    {
        return Err(BackendError::Invalid {
            field: format!("{prefix}strategy"),
            reason: format!(
                "tool `{tool}` has no strategy `{strategy}` at stage `{}`",
                stage.name
            ),
        });
    }
    Ok(())
}

/// The Thompson-sampling share of each arm of one stage, from Gaussian approximations of the
/// posteriors of their values (`(mean value, its deviation)`), drawn with a seeded generator.
pub fn stage_propensities(values: &[(f64, f64)], draws: usize, seed: u64) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut wins = vec![0u64; values.len()];
    let draws = draws.max(1);
    for _ in 0..draws {
        let mut best = 0;
        let mut best_v = f64::NEG_INFINITY;
        for (i, (m, sd)) in values.iter().enumerate() {
            // Box-Muller.
            let u1 = rng.f64().max(f64::MIN_POSITIVE);
            let u2 = rng.f64();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let v = m + sd * z;
            if v > best_v {
                best_v = v;
                best = i;
            }
        }
        wins[best] += 1;
    }
    wins.iter().map(|w| *w as f64 / draws as f64).collect()
}
