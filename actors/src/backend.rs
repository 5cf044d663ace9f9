//! The daemon's [`Backend`]: the HTTP API over a running supervision tree ([`TreeBackend`]),
//! started from a [`Config`], with tenant isolation by namespacing.
//!
//! Isolation rules:
//! - A task id is stored as `{tenant}/{task_id}` (run id `run-{tenant}/{task_id}`), generated when
//!   the request names none (derived from `idempotency_key` when it has one), so two tenants never
//!   share a run. A run is visible only to the tenant of its record and its namespace.
//! - User and session ids are stored as `{tenant}/{id}`, so lesson scopes (`user:{tenant}/{u}`,
//!   `tenant:{tenant}`, `session:{tenant}/{s}`) never cross tenants.
//! - An SOP is visible to a tenant only when every run of its evidence belongs to that tenant.
//! - Retrieval returns lessons, SOPs, postmortems and diary notes only when they are the tenant's;
//!   the graph's aggregate statistics over the shared workflow (`strategy`, `failure_mode`) are
//!   returned to every tenant.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hindsight::config::{Config, DurabilityConfig};
use hindsight::learn::bandit::{Arm, Observation, StageObservation, StageOutcome};
use hindsight::store::{Durability, Store, StoreOptions, idempotency};
use hindsight::tools::ToolRegistry;
use hindsight::tools::mcp::McpServer;
use hindsight::{ArmChoice, ErrorClass, FailureCategory, Lesson, Sop, Step, Task};
use ractor::ActorStatus;
use sha2::{Digest, Sha256};

use crate::api::types::{
    ExecuteRequest, ExecuteResponse, FeedbackRequest, FeedbackResponse, Health, MemoryBundle,
    MemoryItem, MemoryRetrieveRequest, OrchestrateResponse, PlanResponse, PolicySuggestRequest,
    PolicySuggestResponse, PolicyUpdateRequest, PolicyUpdateResponse, RankedArm, RunView,
    StageArms, TaskRequest, TenantSop, ValidateRequest, ValidateResponse,
};
use crate::api::{Backend, BackendError, BackendResult, Principal};
use crate::directory::{CallError, Slot};
use crate::memory::{MemoryMsg, Query};
use crate::metrics::Metrics;
use crate::orchestrator::OrchestratorMsg;
use crate::policy::{PolicyMsg, SOPS};
use crate::reflector::{FeedbackRefused, ReflectorMsg};
use crate::run::{RunOutcome, TreeCtx};
use crate::runtime::{Runtime, RuntimeError, RuntimeOptions, Submitter, WorkflowSource};
use crate::validator::ValidatorMsg;

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A configuration value cannot be used.
    #[error("{key}: {reason}")]
    Config {
        /// The configuration key at fault.
        key: String,
        /// Why.
        reason: String,
    },
    /// The tree could not start.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

fn config_error(key: impl Into<String>, reason: impl Into<String>) -> StartError {
    StartError::Config {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The HTTP API's backend over a running tree.
pub struct TreeBackend {
    ctx: Arc<TreeCtx>,
    submitter: Submitter,
    runtime: tokio::sync::Mutex<Option<Runtime>>,
    servers: Vec<McpServer>,
    metrics: Metrics,
    stopping: AtomicBool,
    next_id: AtomicU64,
    prior_count: f64,
    started_ms: u64,
}

/// The namespaced task id of a tenant's task.
pub fn tenant_task_id(tenant: &str, task_id: &str) -> String {
    format!("{tenant}/{task_id}")
}

/// The run id of a tenant's task.
pub fn tenant_run_id(tenant: &str, task_id: &str) -> String {
    crate::run::run_id_for(&Task {
        task_id: tenant_task_id(tenant, task_id),
        goal: String::new(),
        features: BTreeMap::new(),
        constraints: Default::default(),
        user_id: None,
        tenant: None,
        session_id: None,
    })
}

/// Whether `run_id` is in `tenant`'s namespace.
pub fn run_in_tenant(tenant: &str, run_id: &str) -> bool {
    run_id
        .strip_prefix("run-")
        .and_then(|rest| rest.strip_prefix(tenant))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether a lesson scope belongs to `tenant`.
pub fn scope_in_tenant(tenant: &str, scope: &str) -> bool {
    scope == format!("tenant:{tenant}")
        || scope.starts_with(&format!("user:{tenant}/"))
        || scope.starts_with(&format!("session:{tenant}/"))
}

/// Whether an SOP is visible to `tenant`: every run of its evidence is the tenant's.
pub fn sop_in_tenant(tenant: &str, sop: &Sop) -> bool {
    !sop.evidence.is_empty() && sop.evidence.iter().all(|r| run_in_tenant(tenant, r))
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
    match e {
        RuntimeError::Call(c) => call_error(c),
        RuntimeError::Rejected(reason) => BackendError::Invalid {
            field: "task".into(),
            reason,
        },
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

/// The adaptive strategies' configuration the `[adaptive]` section describes (the settings it
/// does not name keep their defaults), checked as the reflector will check it.
pub fn adaptive_config(
    section: &hindsight::config::AdaptiveConfig,
) -> Result<hindsight::learn::adaptive::AdaptiveConfig, StartError> {
    use hindsight::config::ScopeConfig;
    use hindsight::learn::adaptive::{AdaptiveConfig, AdaptiveError, ScopeMode};
    let adaptive = AdaptiveConfig {
        scope: match section.scope {
            ScopeConfig::PerUser => ScopeMode::PerUser,
            ScopeConfig::PerTenant => ScopeMode::PerTenant,
            ScopeConfig::Shared => ScopeMode::Shared,
            ScopeConfig::PerSession => ScopeMode::PerSession,
        },
        synthesis_threshold: section.synthesis_threshold as usize,
        failure_retention: section.failure_retention as usize,
        max_strategies: section.max_strategies as usize,
        strategy_ttl_ms: section.ttl_days.saturating_mul(86_400_000),
        corrections_per_window: section.corrections_per_hour,
        correction_window_ms: 3_600_000,
        ..AdaptiveConfig::default()
    };
    adaptive.validate().map_err(|e| match e {
        AdaptiveError::Config { field, reason } => {
            // Named as the section names it.
            let key = match field {
                "corrections_per_window" => "corrections_per_hour",
                "strategy_ttl_ms" => "ttl_days",
                other => other,
            };
            config_error(format!("adaptive.{key}"), reason)
        }
        other => config_error("adaptive", other.to_string()),
    })?;
    Ok(adaptive)
}

/// Sets what `opts`'s tree learns with from the configuration: `[policy]` (all of it but its
/// seed, which the caller sets) and `[adaptive]`. The daemon and `hindsight bench learning
/// --config` both go through here.
pub fn apply_learning(config: &Config, opts: &mut RuntimeOptions) -> Result<(), StartError> {
    let policy = &config.policy;
    opts.policy.discount = policy.discount;
    opts.policy.pool_strength = policy.prior_strength;
    opts.policy.propensity_draws = policy.propensity_samples.max(1) as usize;
    opts.policy.level_penalty_first = policy.level_penalty_first;
    opts.policy.level_penalty_more = policy.level_penalty_more;
    opts.policy.stage_evidence_share = policy.stage_evidence_share;
    opts.policy.stage_evidence_min_arms = policy.stage_evidence_min_arms;
    opts.policy.fallback_local_visits = policy.fallback_local_visits;
    opts.policy.ids_samples = policy.ids_samples;
    opts.policy.thompson_share = policy.thompson_share;
    opts.distill.every = policy.distill_every;
    opts.distill.margin = policy.distill_margin;
    opts.distill.defer_margin = policy.distill_defer_margin;
    opts.adaptive = adaptive_config(&config.adaptive)?;
    Ok(())
}

/// The options of the tree a configuration describes, and the MCP servers it started.
pub async fn runtime_options(
    config: &Config,
) -> Result<(RuntimeOptions, Vec<McpServer>), StartError> {
    let env_path = config.tools.envs.first();
    let env = match env_path {
        Some(p) if p != Path::new(crate::demo::DEFAULT_ENV) => {
            crate::demo::load_env(Some(p.as_path()))
        }
        _ => crate::demo::load_env(None),
    }
    .map_err(|e| config_error("tools.envs[0]", e.to_string()))?;
    for (i, extra) in config.tools.envs.iter().enumerate().skip(1) {
        tracing::warn!(
            file = %extra.display(),
            "tools.envs[{i}]: only the first environment is the daemon's workflow; this one is not loaded"
        );
    }
    let mut opts = RuntimeOptions::with_workflow(&config.data_dir, WorkflowSource::Sim(env));
    opts.durability = match config.store.durability {
        DurabilityConfig::Immediate => Durability::Immediate,
        DurabilityConfig::None => Durability::None,
    };
    opts.seed = config.policy.seed;
    opts.compact_every = (config.store.compact_every_minutes > 0).then(|| {
        std::time::Duration::from_secs(config.store.compact_every_minutes.saturating_mul(60))
    });
    apply_learning(config, &mut opts)?;
    if let Some(base_url) = &config.model.base_url {
        // `[model]`: lessons are synthesised by the model (offline when it fails).
        let client =
            hindsight::model::openai::OpenAiClient::new(hindsight::model::openai::OpenAiConfig {
                base_url: base_url.clone(),
                model: config.model.model.clone(),
                api_key: std::env::var(&config.model.api_key_env)
                    .ok()
                    .filter(|k| !k.is_empty()),
                timeout_ms: config.model.timeout_ms,
                schema_format: config.model.schema_format,
                ..hindsight::model::openai::OpenAiConfig::default()
            })
            .map_err(|e| config_error("model.base_url", e.to_string()))?;
        opts.synthesiser = Some(Arc::new(hindsight::learn::adaptive::ModelSynthesiser::new(
            Arc::new(client),
        )));
    }
    opts.tree.max_recovery_attempts = config.triage.max_recovery_attempts;
    opts.tree.guard = config.guard.clone();
    if let Some(path) = &config.triage.policy_file {
        let setup = crate::recovery::TriageSetup::load(path)
            .map_err(|e| config_error("triage.policy_file", e.to_string()))?;
        opts.tree.triage = Arc::new(setup);
    }
    opts.reflect_retry.max_retries = if config.reflect_retry.enabled {
        config.reflect_retry.max_retries
    } else {
        0
    };
    opts.reflect_retry.template = config.reflect_retry.template.clone();
    if let Some(path) = &config.chaos.plan {
        let plan = crate::chaos_tools::load(path)
            .map_err(|e| config_error("chaos.plan", e.to_string()))?;
        opts.chaos = Some(crate::chaos::ChaosHandle::new(plan));
    }
    let mut registry = ToolRegistry::new();
    let mut servers = Vec::new();
    for (i, server) in config.tools.mcp.iter().enumerate() {
        let mut mcp = hindsight::tools::McpServerConfig::new(
            server.name.clone(),
            server.command.clone(),
            server.args.clone(),
        );
        mcp.env = server.env.clone();
        mcp.tool_prefix = Some(server.name.clone());
        let started = McpServer::connect(mcp)
            .await
            .map_err(|e| config_error(format!("tools.mcp[{i}]"), e.to_string()))?;
        for tool in started.tools() {
            registry
                .register(tool)
                .map_err(|e| config_error(format!("tools.mcp[{i}]"), e.to_string()))?;
        }
        servers.push(started);
    }
    opts.registry = registry;
    Ok((opts, servers))
}

impl TreeBackend {
    /// Opens the store under `config.data_dir` and starts the tree the configuration describes.
    pub async fn start(config: &Config) -> Result<TreeBackend, StartError> {
        for (i, t) in config.api.tenants.iter().enumerate() {
            if t.name.trim().is_empty() || t.name.contains(['/', ':']) {
                return Err(config_error(
                    format!("api.tenants[{i}].name"),
                    "must be non-empty and contain no `/` or `:`",
                ));
            }
        }
        let (opts, servers) = runtime_options(config).await?;
        let store = Store::open(
            &config.data_dir,
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
        let prior_count = opts.policy.prior_alpha + opts.policy.prior_beta;
        let runtime = match Runtime::start_with_store(store, opts).await {
            Ok(rt) => rt,
            Err(e) => {
                for s in &servers {
                    s.shutdown().await;
                }
                return Err(e.into());
            }
        };
        Ok(TreeBackend {
            ctx: runtime.ctx().clone(),
            submitter: runtime.submitter(),
            runtime: tokio::sync::Mutex::new(Some(runtime)),
            servers,
            metrics: Metrics::new(),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            prior_count,
            started_ms: hindsight::now_ms(),
        })
    }

    /// Stops the tree (runs in flight stay checkpointed and resume at the next start) and the
    /// MCP servers. Requests after this are answered 503.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The backend holds the store itself (its file closes when the backend is dropped), so
        // it does not wait for the tree to release it as `Runtime::shutdown` would.
        if let Some(rt) = self.runtime.lock().await.take() {
            rt.stop().await;
        }
        for s in &self.servers {
            s.shutdown().await;
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.ctx.store
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
        match self.store().get_idempotent(&store_key) {
            Ok(Some(seen)) if seen == want => Ok(()),
            Ok(Some(_)) => Err(BackendError::Conflict(
                "idempotency_key was used for another task_id".into(),
            )),
            Ok(None) => self
                .store()
                .put_idempotent(&store_key, &want)
                .await
                .map_err(|e| BackendError::Internal(e.to_string())),
            Err(e) => Err(BackendError::Internal(e.to_string())),
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
            .map_err(|e| BackendError::Internal(e.to_string()))?;
        Ok(rows.into_iter().filter_map(|(_, s)| s.ok()).collect())
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
            lessons,
            sops,
            diary,
        })
    }

    fn check_plan(&self, plan: &[crate::api::types::PlanArm]) -> BackendResult<Vec<ArmChoice>> {
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
            if !stage.arms.iter().any(|a| a.tool == arm.tool) {
                return Err(BackendError::Invalid {
                    field: format!("plan[{i}].tool"),
                    reason: format!(
                        "stage `{}` has no tool `{}`; its tools are {}",
                        stage.name,
                        arm.tool,
                        tools_of(stage).join(", ")
                    ),
                });
            }
            if !stage
                .arms
                .iter()
                .any(|a| a.tool == arm.tool && a.strategy == arm.strategy)
            {
                return Err(BackendError::Invalid {
                    field: format!("plan[{i}].strategy"),
                    reason: format!(
                        "tool `{}` has no strategy `{}` at stage `{}`",
                        arm.tool, arm.strategy, stage.name
                    ),
                });
            }
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
        (total - self.prior_count).max(0.0).round() as u64
    }
}

fn tools_of(stage: &crate::workflow::WorkflowStage) -> Vec<String> {
    let mut tools: Vec<String> = stage.arms.iter().map(|a| a.tool.clone()).collect();
    tools.dedup();
    tools
}

/// What one tenant may see of memory.
struct Visible {
    tenant: String,
    lessons: BTreeSet<String>,
    sops: BTreeSet<String>,
    diary: BTreeSet<String>,
}

impl Visible {
    fn allows(&self, kind: &str, id: &str) -> bool {
        match kind {
            "lesson" => self.lessons.contains(id),
            "sop" => self.sops.contains(id),
            "postmortem" => run_in_tenant(&self.tenant, id),
            "diary" => self.diary.contains(id),
            "strategy" | "failure_mode" => true,
            _ => false,
        }
    }

    /// The SOP and plan ids to show: an SOP the tenant may not see (promoted from another
    /// tenant's runs, shared through the policy) is not named; the plan id is then its arms'.
    fn provenance(
        &self,
        sop_id: Option<String>,
        plan_id: Option<String>,
        arms: &[ArmChoice],
    ) -> (Option<String>, Option<String>) {
        match sop_id {
            Some(id) if !self.sops.contains(&id) => (
                None,
                Some(crate::policy::PlanChoice::new(arms.to_vec(), None, true).plan_id),
            ),
            other => (other, plan_id),
        }
    }

    fn allows_citation(&self, citation: &str) -> bool {
        citation
            .split_once(':')
            .is_some_and(|(kind, id)| self.allows(kind, id))
    }
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

impl Backend for TreeBackend {
    async fn orchestrate(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        self.check_running()?;
        let key = request.idempotency_key.clone();
        let task = self.task_of(tenant, request, "")?;
        self.claim_key(tenant, key.as_deref(), &task).await?;
        let (o, _) = self.submit(task, None).await?;
        let visible = self.visible(tenant).await?;
        let (sop_id, plan_id) = visible.provenance(o.sop_id, o.plan_id, &o.final_arms);
        Ok(OrchestrateResponse {
            run_id: o.run_id,
            task_id: o.task_id,
            plan_id,
            sop_id,
            state: o.state,
            passed: o.passed,
            attempts: o.attempts,
            reflect_retries: o.reflect_retries,
            arms: o.arms,
            reward: Some(o.reward),
            output: o.output,
            reason: o.reason,
            latency_ms: o.latency_ms,
            cost: o.cost,
            citations: o
                .citations
                .into_iter()
                .filter(|c| visible.allows_citation(c))
                .collect(),
        })
    }

    async fn plan(&self, tenant: &str, request: TaskRequest) -> BackendResult<PlanResponse> {
        self.check_running()?;
        let task = Arc::new(self.task_of(tenant, request, "")?);
        let bundle = self
            .ctx
            .dir
            .memory
            .call(|reply| MemoryMsg::Retrieve {
                task: task.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let choice = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Choose {
                task: task.clone(),
                base: None,
                exclude: Vec::new(),
                reply,
            })
            .await
            .map_err(call_error)?
            .map_err(|reason| BackendError::Invalid {
                field: "features".into(),
                reason,
            })?;
        let context = self
            .ctx
            .dir
            .reflector
            .call(|reply| ReflectorMsg::Context {
                task: task.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let visible = self.visible(tenant).await?;
        // An SOP the tenant may not see is not named (its plan is still the policy's choice).
        let (sop_id, plan_id) =
            visible.provenance(choice.sop_id, Some(choice.plan_id), &choice.arms);
        Ok(PlanResponse {
            plan_id: plan_id.unwrap_or_default(),
            sop_id,
            cluster: hindsight::learn::cluster::cluster_key(&task.features),
            arms: choice.arms,
            strategy_context: context,
            citations: bundle
                .citations()
                .into_iter()
                .filter(|c| visible.allows_citation(c))
                .collect(),
        })
    }

    async fn execute(
        &self,
        tenant: &str,
        request: ExecuteRequest,
    ) -> BackendResult<ExecuteResponse> {
        self.check_running()?;
        let plan = self.check_plan(&request.plan)?;
        let key = request.task.idempotency_key.clone();
        let task = self.task_of(tenant, request.task, "task.")?;
        self.claim_key(tenant, key.as_deref(), &task).await?;
        let (o, steps) = self.submit(task, Some(plan)).await?;
        Ok(ExecuteResponse {
            run_id: o.run_id,
            state: o.state,
            passed: o.passed,
            steps,
            output: o.output,
            latency_ms: o.latency_ms,
            cost: o.cost,
        })
    }

    async fn validate(
        &self,
        tenant: &str,
        request: ValidateRequest,
    ) -> BackendResult<ValidateResponse> {
        self.check_running()?;
        self.check_stage("stage", &request.stage)?;
        if let Some(run_id) = &request.run_id
            && self.own_run(tenant, run_id).await?.is_none()
        {
            return Err(BackendError::NotFound {
                what: "run".into(),
                id: run_id.clone(),
            });
        }
        let outputs = vec![(request.stage.clone(), request.output.clone())];
        let verdict = self
            .ctx
            .dir
            .validator
            .call(|reply| ValidatorMsg::Validate {
                outputs: outputs.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let result = verdict
            .into_iter()
            .find(|(s, _)| s == &request.stage)
            .map(|(_, r)| r)
            .ok_or_else(|| BackendError::Internal("the validator gave no verdict".into()))?;
        Ok(match result {
            Ok(()) => ValidateResponse {
                valid: true,
                reason: None,
            },
            Err(reason) => ValidateResponse {
                valid: false,
                reason: Some(reason),
            },
        })
    }

    async fn memory_retrieve(
        &self,
        tenant: &str,
        request: MemoryRetrieveRequest,
    ) -> BackendResult<MemoryBundle> {
        self.check_running()?;
        let query = Query {
            text: request.query.clone(),
            features: request.features.clone(),
            tools: request.tools.clone(),
            k: request.k.saturating_mul(4).min(400),
        };
        let bundle = self
            .ctx
            .dir
            .memory
            .call(|reply| MemoryMsg::Query {
                query: Box::new(query.clone()),
                reply,
            })
            .await
            .map_err(call_error)?;
        let visible = self.visible(tenant).await?;
        let items = bundle
            .items
            .into_iter()
            .filter(|i| visible.allows(&i.citation.kind, &i.citation.id))
            .take(request.k)
            .map(|i| MemoryItem {
                citation: format!("{}:{}", i.citation.kind, i.citation.id),
                kind: i.citation.kind,
                id: i.citation.id,
                text: i.text,
                score: i.citation.score,
            })
            .collect();
        Ok(MemoryBundle { items })
    }

    async fn policy_suggest(
        &self,
        _tenant: &str,
        request: PolicySuggestRequest,
    ) -> BackendResult<PolicySuggestResponse> {
        self.check_running()?;
        if let Some(stage) = &request.stage {
            self.check_stage("stage", stage)?;
        }
        let ranked = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Suggest {
                features: request.features.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let cluster = hindsight::learn::cluster::cluster_key(&request.features);
        let seed = crate::workflow::stable_hash(&cluster);
        let stages = ranked
            .into_iter()
            .filter(|(stage, _)| request.stage.as_ref().is_none_or(|s| s == stage))
            .map(|(stage, arms)| {
                // The value deviation scales with the success deviation by value/mean.
                let values: Vec<(f64, f64)> = arms
                    .iter()
                    .map(|(_, _, m, sd, v)| {
                        let scale = if *m > 0.0 { v / m } else { 1.0 };
                        (*v, sd * scale)
                    })
                    .collect();
                let shares =
                    stage_propensities(&values, 512, seed ^ crate::workflow::stable_hash(&stage));
                let arms = arms
                    .into_iter()
                    .zip(shares)
                    .take(request.k)
                    .map(
                        |((tool, strategy, mean, std_dev, _), propensity)| RankedArm {
                            n: self.effective_n(mean, std_dev),
                            tool,
                            strategy,
                            mean,
                            std_dev,
                            propensity,
                        },
                    )
                    .collect();
                StageArms { stage, arms }
            })
            .collect();
        Ok(PolicySuggestResponse { cluster, stages })
    }

    async fn policy_update(
        &self,
        _tenant: &str,
        request: PolicyUpdateRequest,
    ) -> BackendResult<PolicyUpdateResponse> {
        self.check_running()?;
        self.check_stage("stage", &request.stage)?;
        let stage = self
            .ctx
            .workflow
            .stages()
            .iter()
            .find(|s| s.name == request.stage)
            .ok_or_else(|| BackendError::Internal("stage vanished".into()))?;
        if !stage.arms.iter().any(|a| a.tool == request.tool) {
            return Err(BackendError::Invalid {
                field: "tool".into(),
                reason: format!(
                    "stage `{}` has no tool `{}`; its tools are {}",
                    stage.name,
                    request.tool,
                    tools_of(stage).join(", ")
                ),
            });
        }
        if !stage
            .arms
            .iter()
            .any(|a| a.tool == request.tool && a.strategy == request.strategy)
        {
            return Err(BackendError::Invalid {
                field: "strategy".into(),
                reason: format!(
                    "tool `{}` has no strategy `{}` at stage `{}`",
                    request.tool, request.strategy, stage.name
                ),
            });
        }
        if request.passed && request.error_class.is_some() {
            return Err(BackendError::Invalid {
                field: "error_class".into(),
                reason: "must be absent when passed is true".into(),
            });
        }
        let cluster = hindsight::learn::cluster::cluster_key(&request.features);
        let outcome = match (request.passed, request.error_class) {
            (true, _) => StageOutcome::Valid,
            (false, Some(class)) => StageOutcome::Failed(category_of(class)),
            (false, None) => StageOutcome::Invalid,
        };
        // The request carries a reward, not latency and cost: its shortfall from the success
        // value is given to the policy as the equivalent latency, so the arm's estimated value
        // matches the reward reported.
        let r = self.ctx.workflow.reward_config();
        let shortfall = (r.success - request.reward).max(0.0);
        let lat_frac = if r.latency > 0.0 {
            (shortfall / r.latency).min(1.0)
        } else {
            0.0
        };
        let observation = Observation {
            features: request.features.clone(),
            stages: vec![StageObservation {
                stage: request.stage.clone(),
                arm: Arm::new(request.tool.clone(), request.strategy.clone()),
                outcome,
                latency_ms: lat_frac * r.sla_ms,
                cost: 0.0,
            }],
        };
        let summary = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Learn {
                observation: Box::new(observation.clone()),
                reply,
            })
            .await
            .map_err(call_error)?;
        let applied = summary.learned > 0;
        let reason = if applied {
            None
        } else if summary.infra_ignored > 0 {
            Some(format!(
                "{} is an infrastructure failure; infrastructure failures are not learned from",
                request
                    .error_class
                    .map_or("the error".to_string(), |c| c.to_string())
            ))
        } else if summary.unknown_arm > 0 {
            Some("the policy does not know this stage and arm".to_string())
        } else {
            Some("nothing to learn from this outcome".to_string())
        };
        Ok(PolicyUpdateResponse {
            cluster,
            applied,
            reason,
        })
    }

    async fn sop(&self, tenant: &str, sop_id: &str) -> BackendResult<Option<TenantSop>> {
        self.check_running()?;
        let (id, version) = match sop_id.rsplit_once('@') {
            Some((id, v)) => match v.parse::<u32>() {
                Ok(v) => (id, Some(v)),
                Err(_) => (sop_id, None),
            },
            None => (sop_id, None),
        };
        let best = self
            .tenant_sops(tenant)?
            .into_iter()
            .filter(|s| s.sop_id == id && version.is_none_or(|v| s.version == v))
            .max_by_key(|s| s.version);
        Ok(best.map(|sop| TenantSop {
            tenant: tenant.to_string(),
            sop,
        }))
    }

    async fn sops(&self, tenant: &str) -> BackendResult<Vec<TenantSop>> {
        self.check_running()?;
        let mut sops = self.tenant_sops(tenant)?;
        sops.sort_by(|a, b| (&a.sop_id, a.version).cmp(&(&b.sop_id, b.version)));
        Ok(sops
            .into_iter()
            .map(|sop| TenantSop {
                tenant: tenant.to_string(),
                sop,
            })
            .collect())
    }

    async fn run(&self, tenant: &str, run_id: &str) -> BackendResult<Option<RunView>> {
        self.check_running()?;
        let Some(mut run) = self.own_run(tenant, run_id).await? else {
            return Ok(None);
        };
        let outcome = self
            .ctx
            .dir
            .orchestrator
            .call(|reply| OrchestratorMsg::Outcome {
                run_id: run_id.to_string(),
                reply,
            })
            .await
            .map_err(call_error)?;
        if run.sop_id.is_some() {
            let visible = self.visible(tenant).await?;
            let last = outcome
                .as_ref()
                .map(|o| o.final_arms.clone())
                .unwrap_or_default();
            let (sop_id, plan_id) =
                visible.provenance(run.sop_id.take(), run.plan_id.take(), &last);
            run.sop_id = sop_id;
            run.plan_id = plan_id;
        }
        Ok(Some(RunView {
            arms: outcome.map(|o| o.arms).unwrap_or_default(),
            steps: self.steps_of(run_id),
            run,
        }))
    }

    async fn feedback(
        &self,
        principal: &Principal,
        request: FeedbackRequest,
    ) -> BackendResult<FeedbackResponse> {
        self.check_running()?;
        let tenant = principal.tenant.as_str();
        if let Some(run_id) = &request.run_id
            && self.own_run(tenant, run_id).await?.is_none()
        {
            return Err(BackendError::NotFound {
                what: "run".into(),
                id: run_id.clone(),
            });
        }
        // The scope comes from the tenant and the user; the principal only from the key.
        let user = request
            .user_id
            .clone()
            .unwrap_or_else(|| format!("key-{}", principal.key_id));
        let scope_task = Task {
            task_id: tenant_task_id(tenant, "feedback"),
            goal: request.correction.clone(),
            features: request.features.clone(),
            constraints: Default::default(),
            user_id: Some(tenant_task_id(tenant, &user)),
            tenant: Some(tenant.to_string()),
            session_id: None,
        };
        let answer = self
            .ctx
            .dir
            .reflector
            .call(|reply| ReflectorMsg::Feedback {
                principal: Some(principal.key_id.clone()),
                scope_of: Box::new(scope_task.clone()),
                tool: request.tool.clone(),
                text: request.correction.clone(),
                run_id: request.run_id.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        match answer {
            Ok(lesson) => Ok(FeedbackResponse {
                accepted: true,
                lesson_id: Some(lesson.lesson_id),
                confidence: Some(lesson.confidence),
                reason: None,
            }),
            Err(FeedbackRefused::RateLimited { retry_after_secs }) => {
                Err(BackendError::RateLimited { retry_after_secs })
            }
            Err(FeedbackRefused::Rejected { reason }) => Ok(FeedbackResponse {
                accepted: false,
                lesson_id: None,
                confidence: None,
                reason: Some(reason),
            }),
            Err(FeedbackRefused::Unauthenticated) => Err(BackendError::Internal(
                "the reflector saw no principal".into(),
            )),
        }
    }

    async fn health(&self) -> Health {
        let d = &self.ctx.dir;
        let mut components = BTreeMap::new();
        components.insert("orchestrator".to_string(), slot_status(&d.orchestrator));
        components.insert("executor".to_string(), slot_status(&d.executor));
        components.insert("validator".to_string(), slot_status(&d.validator));
        components.insert("policy".to_string(), slot_status(&d.policy));
        components.insert("memory".to_string(), slot_status(&d.memory));
        components.insert("reflector".to_string(), slot_status(&d.reflector));
        components.insert("reflect_retry".to_string(), slot_status(&d.reflect_retry));
        for p in &d.plugins {
            components.insert(format!("plugin:{}", p.name), slot_status(&p.slot));
        }
        components.insert(
            "store".to_string(),
            match self.store().get_run("") {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("error: {e}"),
            },
        );
        for s in &self.servers {
            components.insert(
                format!("mcp:{}", s.name()),
                format!("{:?}", s.health()).to_lowercase(),
            );
        }
        let stopping = self.stopping.load(Ordering::SeqCst);
        let all_ok = components
            .iter()
            .filter(|(k, _)| !k.starts_with("mcp:"))
            .all(|(_, v)| v == "ok");
        Health {
            status: if stopping {
                "stopping".to_string()
            } else if all_ok {
                "ok".to_string()
            } else {
                "degraded".to_string()
            },
            version: env!("CARGO_PKG_VERSION").to_string(),
            components,
        }
    }

    async fn metrics_text(&self) -> String {
        // The learning figures are the policy actor's; a scrape that cannot reach it (a restart
        // in progress) shows the last ones read.
        let policy = &self.ctx.dir.policy;
        let wait = std::time::Duration::from_secs(2);
        let stats = policy
            .call_with_timeout(|reply| PolicyMsg::Stats { reply }, wait)
            .await;
        let ranker = policy
            .call_with_timeout(|reply| PolicyMsg::Distillation { reply }, wait)
            .await;
        if let (Ok(s), Ok(r)) = (stats, ranker) {
            self.metrics.learning(&crate::metrics::LearningFigures {
                learned: s.learned,
                infra_ignored: s.infra_ignored,
                infra_learned: s.infra_learned,
                changes_detected: s.changes_detected,
                ranker_fits: r.fits,
                ranker_promotions: r.promotions,
                ranker_in_force: r.in_force,
            });
        }
        self.metrics.encode()
    }

    fn metrics(&self) -> Option<&Metrics> {
        Some(&self.metrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_policy_section_reaches_the_bandit() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "data_dir = {:?}\n[policy]\nprior_strength = 3.0\nlevel_penalty_first = 0.5\nlevel_penalty_more = 1.0\nstage_evidence_share = 0.5\nstage_evidence_min_arms = 3\nfallback_local_visits = 0.0\nids_samples = 8\nthompson_share = 0.25\n",
            dir.path()
        );
        let config = Config::parse(&text, "test.toml").unwrap();
        let (opts, servers) = runtime_options(&config).await.unwrap();
        assert!(servers.is_empty());
        assert_eq!(opts.policy.pool_strength, 3.0);
        assert_eq!(opts.policy.level_penalty_first, 0.5);
        assert_eq!(opts.policy.level_penalty_more, 1.0);
        assert_eq!(opts.policy.stage_evidence_share, 0.5);
        assert_eq!(opts.policy.stage_evidence_min_arms, 3);
        assert_eq!(opts.policy.fallback_local_visits, 0.0);
        assert_eq!(opts.policy.ids_samples, 8);
        assert_eq!(opts.policy.thompson_share, 0.25);
    }

    #[tokio::test]
    async fn the_daemon_applies_the_run_ttl_at_start() {
        use hindsight::{Run, RunState};
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: dir.path().to_path_buf(),
            store: hindsight::config::StoreConfig {
                durability: DurabilityConfig::None,
                run_ttl_days: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        {
            let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
            let now = hindsight::now_ms();
            for (id, updated) in [("old", now - 2 * 86_400_000), ("recent", now - 1000)] {
                let mut run = Run::new(format!("run-{id}"), &Task::default(), updated);
                run.task_id = id.into();
                run.state = RunState::Succeeded;
                store.finish_run(&run).await.unwrap();
                store
                    .put(crate::orchestrator::TASKS, id, &Task::default())
                    .await
                    .unwrap();
            }
        }
        let backend = TreeBackend::start(&config).await.unwrap();
        let store = backend.store();
        assert_eq!(store.get_run("run-old").unwrap(), None);
        assert!(store.get_run("run-recent").unwrap().is_some());
        assert_eq!(
            store
                .get::<Task>(crate::orchestrator::TASKS, "old")
                .unwrap(),
            None
        );
        backend.shutdown().await;
    }

    #[test]
    fn the_adaptive_section_maps_onto_the_reflectors_settings() {
        let section = hindsight::config::AdaptiveConfig {
            synthesis_threshold: 3,
            failure_retention: 9,
            max_strategies: 4,
            scope: hindsight::config::ScopeConfig::PerTenant,
            ttl_days: 2,
            corrections_per_hour: 6,
        };
        let a = adaptive_config(&section).unwrap();
        assert_eq!(a.scope, hindsight::learn::adaptive::ScopeMode::PerTenant);
        assert_eq!(
            (a.synthesis_threshold, a.failure_retention, a.max_strategies),
            (3, 9, 4)
        );
        assert_eq!(a.strategy_ttl_ms, 2 * 86_400_000);
        assert_eq!(
            (a.corrections_per_window, a.correction_window_ms),
            (6, 3_600_000)
        );

        let bad = hindsight::config::AdaptiveConfig {
            corrections_per_hour: 0,
            ..section
        };
        match adaptive_config(&bad) {
            Err(StartError::Config { key, .. }) => assert_eq!(key, "adaptive.corrections_per_hour"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn namespaces_keep_tenants_apart() {
        let run = tenant_run_id("acme", "t1");
        assert!(run_in_tenant("acme", &run));
        assert!(!run_in_tenant("acm", &run));
        assert!(!run_in_tenant("globex", &run));
        assert!(scope_in_tenant("acme", "user:acme/bob"));
        assert!(scope_in_tenant("acme", "tenant:acme"));
        assert!(!scope_in_tenant("acme", "tenant:acmex"));
        assert!(!scope_in_tenant("acme", "user:acmex/bob"));
        assert!(!scope_in_tenant("acme", "shared"));
    }

    #[test]
    fn infrastructure_classes_are_not_learned_from() {
        for class in [
            ErrorClass::Timeout,
            ErrorClass::RateLimit,
            ErrorClass::TransientNetwork,
        ] {
            assert_eq!(category_of(class), FailureCategory::Infrastructure);
        }
        assert_eq!(
            category_of(ErrorClass::SchemaMismatch),
            FailureCategory::Strategy
        );
    }

    #[test]
    fn propensities_sum_to_one_and_favour_the_better_arm() {
        let p = stage_propensities(&[(0.9, 0.05), (0.2, 0.05), (0.5, 0.3)], 2000, 3);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(p[0] > 0.8, "{p:?}");
        assert!(p[1] < 0.01, "{p:?}");
    }
}
