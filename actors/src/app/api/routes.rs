//! The route table (the single source of the router and of the OpenAPI check) and the handlers.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use super::backend::{Backend, Principal};
use super::error::{ApiError, ApiJson};
use super::types::{
    ExecuteRequest, FeedbackRequest, MemoryRetrieveRequest, PolicySuggestRequest,
    PolicyUpdateRequest, SopList, TaskRequest, ValidateRequest,
};

pub use super::types::MAX_ID_CHARS;

/// One route of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The path, with `{param}` placeholders (axum and OpenAPI syntax alike).
    pub path: &'static str,
    /// Whether a bearer key is required.
    pub auth: bool,
}

const fn route(method: &'static str, path: &'static str, auth: bool) -> RouteSpec {
    RouteSpec { method, path, auth }
}

/// Every route the router serves; the router is built from this table and nothing else.
pub const ROUTES: &[RouteSpec] = &[
    route("POST", "/orchestrate", true),
    route("POST", "/plan", true),
    route("POST", "/execute", true),
    route("POST", "/validate", true),
    route("POST", "/memory/retrieve", true),
    route("POST", "/policy/suggest", true),
    route("POST", "/policy/update", true),
    route("POST", "/feedback", true),
    route("GET", "/sop/{id}", true),
    route("GET", "/sops", true),
    route("GET", "/agents", true),
    route("POST", "/agents/{name}/runs", true),
    route("GET", "/runs/{id}", true),
    route("GET", "/healthz", false),
    route("GET", "/metrics", false),
    route("GET", "/openapi.json", false),
];

/// The OpenAPI 3.1 document of the routes.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Shared state of the handlers.
pub struct AppState<B> {
    /// The running system.
    pub backend: Arc<B>,
}

impl<B> Clone for AppState<B> {
    fn clone(&self) -> Self {
        AppState {
            backend: Arc::clone(&self.backend),
        }
    }
}

/// The handler of a route of [`ROUTES`], `None` for a route it does not know.
pub fn handler_for<B: Backend>(spec: &RouteSpec) -> Option<MethodRouter<AppState<B>>> {
    let r = match (spec.method, spec.path) {
        ("POST", "/orchestrate") => post(orchestrate::<B>),
        ("POST", "/plan") => post(plan::<B>),
        ("POST", "/execute") => post(execute::<B>),
        ("POST", "/validate") => post(validate::<B>),
        ("POST", "/memory/retrieve") => post(memory_retrieve::<B>),
        ("POST", "/policy/suggest") => post(policy_suggest::<B>),
        ("POST", "/policy/update") => post(policy_update::<B>),
        ("POST", "/feedback") => post(feedback::<B>),
        ("GET", "/sop/{id}") => get(sop::<B>),
        ("GET", "/sops") => get(sops::<B>),
        ("GET", "/agents") => get(agents::<B>),
        ("POST", "/agents/{name}/runs") => post(agent_run::<B>),
        ("GET", "/runs/{id}") => get(run::<B>),
        ("GET", "/healthz") => get(healthz::<B>),
        ("GET", "/metrics") => get(metrics::<B>),
        ("GET", "/openapi.json") => get(openapi::<B>),
        _ => return None,
    };
    Some(r)
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn path_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "id", e.body_text()))?;
    super::types::identifier("id", &id)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, e.field, e.reason))?;
    Ok(id)
}

async fn orchestrate<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<TaskRequest>,
) -> ApiResult<super::types::OrchestrateResponse> {
    Ok(Json(s.backend.orchestrate(&p.tenant, req).await?))
}

async fn plan<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<TaskRequest>,
) -> ApiResult<super::types::PlanResponse> {
    Ok(Json(s.backend.plan(&p.tenant, req).await?))
}

async fn execute<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> ApiResult<super::types::ExecuteResponse> {
    Ok(Json(s.backend.execute(&p.tenant, req).await?))
}

async fn validate<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<ValidateRequest>,
) -> ApiResult<super::types::ValidateResponse> {
    Ok(Json(s.backend.validate(&p.tenant, req).await?))
}

async fn memory_retrieve<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<MemoryRetrieveRequest>,
) -> ApiResult<super::types::MemoryBundle> {
    Ok(Json(s.backend.memory_retrieve(&p.tenant, req).await?))
}

async fn policy_suggest<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<PolicySuggestRequest>,
) -> ApiResult<super::types::PolicySuggestResponse> {
    if !p.policy_read {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the policy is learned from every tenant's runs, and this deployment does not share learning between tenants (api.shared_learning); this key has no `policy_update` right",
        ));
    }
    Ok(Json(s.backend.policy_suggest(&p.tenant, req).await?))
}

async fn policy_update<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<PolicyUpdateRequest>,
) -> ApiResult<super::types::PolicyUpdateResponse> {
    if !p.policy_update {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the policy is shared by every tenant, so reporting outcomes to it needs a key with the `policy_update` right (api.tenants[].policy_update)",
        ));
    }
    Ok(Json(s.backend.policy_update(&p.tenant, req).await?))
}

async fn feedback<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> ApiResult<super::types::FeedbackResponse> {
    Ok(Json(s.backend.feedback(&p, req).await?))
}

async fn sop<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<super::types::TenantSop> {
    let id = path_id(id)?;
    match s.backend.sop(&p.tenant, &id).await? {
        // A backend bug must not leak another tenant's SOP: same answer as "absent".
        Some(sop) if sop.tenant == p.tenant => Ok(Json(sop)),
        _ => Err(ApiError::not_found("sop", &id)),
    }
}

async fn sops<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
) -> ApiResult<SopList> {
    let mut sops = s.backend.sops(&p.tenant).await?;
    sops.retain(|sop| sop.tenant == p.tenant);
    Ok(Json(SopList { sops }))
}

async fn agents<B: Backend>(State(s): State<AppState<B>>) -> ApiResult<super::types::AgentList> {
    Ok(Json(s.backend.agents().await?))
}

async fn agent_run<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    name: Result<Path<String>, PathRejection>,
    ApiJson(req): ApiJson<TaskRequest>,
) -> ApiResult<super::types::OrchestrateResponse> {
    let Path(name) =
        name.map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "name", e.body_text()))?;
    super::types::identifier("name", &name)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, e.field, e.reason))?;
    Ok(Json(s.backend.agent_run(&p.tenant, &name, req).await?))
}

async fn run<B: Backend>(
    State(s): State<AppState<B>>,
    Extension(p): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<super::types::RunView> {
    let id = path_id(id)?;
    match s.backend.run(&p.tenant, &id).await? {
        Some(view) if view.run.tenant.as_deref() == Some(p.tenant.as_str()) => Ok(Json(view)),
        _ => Err(ApiError::not_found("run", &id)),
    }
}

async fn healthz<B: Backend>(State(s): State<AppState<B>>) -> Response {
    let health = s.backend.health().await;
    let status = if health.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

async fn metrics<B: Backend>(State(s): State<AppState<B>>) -> Response {
    let mut response = s.backend.metrics_text().await.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

async fn openapi<B: Backend>(State(s): State<AppState<B>>) -> Response {
    let mut response = s.backend.openapi().into_owned().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Fallback for unknown paths: a JSON 404.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

/// Fallback for a known path with the wrong method: a JSON 405.
pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "method {} not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    )
}

/// Middleware: answers 413 at once when the request declares a `Content-Length` over the body
/// limit (the state), instead of waiting for a body that may never come; 400 for a
/// `Content-Length` that is not a number.
pub async fn declared_length(State(limit): State<usize>, req: Request, next: Next) -> Response {
    let mut declared = req.headers().get_all(header::CONTENT_LENGTH).iter();
    if let Some(value) = declared.next() {
        let length = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        match length {
            None => {
                return ApiError::field(
                    StatusCode::BAD_REQUEST,
                    "content-length",
                    "`Content-Length` is not a number",
                )
                .into_response();
            }
            Some(n) if n > limit as u64 => {
                return ApiError::field(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "content-length",
                    format!(
                        "the declared body of {n} bytes is larger than the limit of {limit} bytes (api.body_limit_bytes)"
                    ),
                )
                .into_response();
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

/// Middleware: answers 504 when the inner service takes longer than the state's limit (`None` =
/// no limit). The backend's work is not cancelled by it: a run goes on and can be read later.
pub async fn time_limit(
    State(limit): State<Option<std::time::Duration>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(limit) = limit else {
        return next.run(req).await;
    };
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "request took longer than {} s (api.request_timeout_secs)",
                limit.as_secs()
            ),
        )
        .into_response(),
    }
}

/// Middleware: a tracing span per request, one log line with status and latency, and the request
/// counted in the backend's metrics under its route template.
pub async fn trace_request<B: Backend>(
    State(state): State<AppState<B>>,
    req: Request,
    next: Next,
) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_string();
    let span = tracing::info_span!("http", %method, %path);
    let started = Instant::now();
    let response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    span.in_scope(|| tracing::info!(status, latency_ms, "response"));
    if let Some(metrics) = state.backend.metrics() {
        metrics.http_request(method.as_str(), &route, status, elapsed);
    }
    response
}
