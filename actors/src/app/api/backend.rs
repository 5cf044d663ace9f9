//! The [`Backend`] trait: what the HTTP API asks of the running tree, one async method per route.
//! The supervision tree implements it; tests implement a fake.

use std::future::Future;

use super::types::{
    ExecuteRequest, ExecuteResponse, FeedbackRequest, FeedbackResponse, Health, MemoryBundle,
    MemoryRetrieveRequest, OrchestrateResponse, PlanResponse, PolicySuggestRequest,
    PolicySuggestResponse, PolicyUpdateRequest, PolicyUpdateResponse, RunView, TaskRequest,
    TenantSop, ValidateRequest, ValidateResponse,
};

/// Who made an authenticated request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    /// The tenant its key belongs to: the isolation boundary.
    pub tenant: String,
    /// A stable id of the key (the first 16 hex digits of its SHA-256), e.g. for rate limits.
    pub key_id: String,
    /// Whether the key may report outcomes to the shared policy (`/policy/update`): its
    /// tenant's `policy_update`.
    pub policy_update: bool,
    /// Whether the key sees statistics learned from every tenant's runs (`/policy/suggest`):
    /// `api.shared_learning`, or the key's `policy_update`.
    pub policy_read: bool,
}

/// Why the backend could not serve a request. Each maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The thing does not exist for this tenant (404; also for another tenant's data).
    #[error("{what} `{id}` not found")]
    NotFound {
        /// What was looked for (`run`, `sop`, `tool`).
        what: String,
        /// Its id.
        id: String,
    },
    /// A field is unacceptable for a reason only the backend can see (422).
    #[error("{field}: {reason}")]
    Invalid {
        /// The request field at fault.
        field: String,
        /// Why.
        reason: String,
    },
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// Too many requests from this principal (429).
    #[error("rate limited; retry after {retry_after_secs} s")]
    RateLimited {
        /// Seconds until a retry may succeed.
        retry_after_secs: u64,
    },
    /// The tree is shutting down or a component is down (503).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A record the request needs is damaged in the store (500): the server's fault, said as
    /// such with the table and key (the message names no other tenant's data: it is the
    /// caller's own record, or the store's own tables).
    #[error("a stored record is damaged: {0}")]
    Damaged(String),
    /// Anything else (500); the message is logged, and returned without internals.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The result of a backend call.
pub type BackendResult<T> = Result<T, BackendError>;

/// What the HTTP API needs from the running system. Every method is given the caller's tenant and
/// must only see and touch that tenant's runs, lessons and SOPs (the API also checks the tenant of
/// what is returned, as a second line of defence).
pub trait Backend: Send + Sync + 'static {
    /// Runs a task through the whole lifecycle and returns its result with provenance.
    fn orchestrate(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> impl Future<Output = BackendResult<OrchestrateResponse>> + Send;

    /// Plans a task (retrieval, policy, SOP match) without running it.
    fn plan(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> impl Future<Output = BackendResult<PlanResponse>> + Send;

    /// Runs a caller-given plan for a task.
    fn execute(
        &self,
        tenant: &str,
        request: ExecuteRequest,
    ) -> impl Future<Output = BackendResult<ExecuteResponse>> + Send;

    /// Validates one stage's output.
    fn validate(
        &self,
        tenant: &str,
        request: ValidateRequest,
    ) -> impl Future<Output = BackendResult<ValidateResponse>> + Send;

    /// Returns the retrieval bundle for a query.
    fn memory_retrieve(
        &self,
        tenant: &str,
        request: MemoryRetrieveRequest,
    ) -> impl Future<Output = BackendResult<MemoryBundle>> + Send;

    /// Ranks the arms for a task's features.
    fn policy_suggest(
        &self,
        tenant: &str,
        request: PolicySuggestRequest,
    ) -> impl Future<Output = BackendResult<PolicySuggestResponse>> + Send;

    /// Feeds an outcome to the policy.
    fn policy_update(
        &self,
        tenant: &str,
        request: PolicyUpdateRequest,
    ) -> impl Future<Output = BackendResult<PolicyUpdateResponse>> + Send;

    /// One of the tenant's SOPs, `None` when it has none of that id.
    fn sop(
        &self,
        tenant: &str,
        sop_id: &str,
    ) -> impl Future<Output = BackendResult<Option<TenantSop>>> + Send;

    /// The agents the system hosts (none unless it is configured with agents).
    fn agents(&self) -> impl Future<Output = BackendResult<super::types::AgentList>> + Send {
        std::future::ready(Ok(super::types::AgentList { agents: Vec::new() }))
    }

    /// Runs a task on the agent `name`, as [`Backend::orchestrate`] runs one.
    fn agent_run(
        &self,
        tenant: &str,
        name: &str,
        request: TaskRequest,
    ) -> impl Future<Output = BackendResult<OrchestrateResponse>> + Send {
        let _ = (tenant, request);
        std::future::ready(Err(BackendError::NotFound {
            what: "agent".into(),
            id: name.to_string(),
        }))
    }

    /// All of the tenant's SOPs.
    fn sops(&self, tenant: &str) -> impl Future<Output = BackendResult<Vec<TenantSop>>> + Send;

    /// One of the tenant's runs, `None` when it has none of that id.
    fn run(
        &self,
        tenant: &str,
        run_id: &str,
    ) -> impl Future<Output = BackendResult<Option<RunView>>> + Send;

    /// A human correction from an authenticated principal (rate-limited per principal).
    fn feedback(
        &self,
        principal: &Principal,
        request: FeedbackRequest,
    ) -> impl Future<Output = BackendResult<FeedbackResponse>> + Send;

    /// Liveness and readiness of the components.
    fn health(&self) -> impl Future<Output = Health> + Send;

    /// The Prometheus text exposition of the metrics (the learning figures read at the call).
    fn metrics_text(&self) -> impl Future<Output = String> + Send;

    /// The metrics the API records its requests in (`hindsight_http_requests_total`, ...), if any.
    fn metrics(&self) -> Option<&crate::app::metrics::Metrics> {
        None
    }

    /// The OpenAPI document served at `/openapi.json`: the shipped one, or one made exact for
    /// the backend's workflow ([`super::document::for_workflow`]).
    fn openapi(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(super::routes::OPENAPI_JSON)
    }
}
