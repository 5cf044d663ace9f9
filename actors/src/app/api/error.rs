//! Error responses of the HTTP API (`{"error": "...", "field": "..."}` with a 4xx/5xx status) and
//! the [`ApiJson`] extractor that turns every bad body into one naming the field at fault.

use axum::Json;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::backend::BackendError;
use super::types::Validate;

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
    /// The request field at fault (dotted path), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub body: ErrorBody,
    /// `Retry-After` seconds, for 429.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// An error without a field.
    pub fn new(status: StatusCode, error: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody {
                error: error.into(),
                field: None,
            },
            retry_after_secs: None,
        }
    }

    /// An error naming a field.
    pub fn field(status: StatusCode, field: impl Into<String>, error: impl Into<String>) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                error: error.into(),
                field: Some(field.into()),
            },
            retry_after_secs: None,
        }
    }

    /// 404 for `what` `id` (also used for another tenant's data, which must not be revealed).
    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, format!("{what} `{id}` not found"))
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> ApiError {
        match e {
            BackendError::NotFound { what, id } => ApiError::not_found(&what, &id),
            BackendError::Invalid { field, reason } => {
                ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, reason)
            }
            BackendError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
            BackendError::RateLimited { retry_after_secs } => {
                let mut err = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("rate limited; retry after {retry_after_secs} s"),
                );
                err.retry_after_secs = Some(retry_after_secs);
                err
            }
            BackendError::Unavailable(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("unavailable: {m}"))
            }
            BackendError::Damaged(m) => {
                tracing::error!(error = %m, "damaged record");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "server fault: a stored record is damaged ({m}); the operator must repair the store (docs/operations.md)"
                    ),
                )
            }
            BackendError::Internal(m) => {
                tracing::error!(error = %m, "backend error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hindsight\""),
            );
        }
        if let Some(secs) = self.retry_after_secs
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}

/// A JSON request body, decoded strictly and validated: a body that is too large gets 413, not
/// JSON 415, malformed 400, a wrong type / missing / unknown field 400 naming the field, and a
/// field that fails [`Validate`] 422 naming it.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| {
                let v = v.trim().to_ascii_lowercase();
                v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::field(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "content-type",
                "expected `Content-Type: application/json`",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rejection| {
                let status = rejection.status();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(status, "request body is larger than the configured limit")
                } else {
                    ApiError::new(status, rejection.body_text())
                }
            })?;
        let value = decode::<T>(&bytes)?;
        value
            .validate()
            .map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, e.field, e.reason))?;
        Ok(ApiJson(value))
    }
}

/// Decodes `bytes` as `T`, naming the field at fault on error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "request body is empty; expected a JSON object",
        ));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "request body must be a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let (field, message) = field_of(&path, &inner);
        match field {
            Some(f) => ApiError::field(StatusCode::BAD_REQUEST, f, message),
            None => ApiError::new(StatusCode::BAD_REQUEST, message),
        }
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("trailing characters after the JSON value: {e}"),
        )
    })?;
    Ok(value)
}

/// The field an error is about, and the message to return.
fn field_of(path: &str, e: &serde_json::Error) -> (Option<String>, String) {
    // serde_path_to_error writes `?` for a place it could not name (a syntax error before any
    // field): the field named is the part of the path before it.
    let named: Vec<&str> = path
        .split('.')
        .take_while(|seg| !seg.is_empty() && !seg.contains('?'))
        .collect();
    let base = named.join(".");
    let base = base.as_str();
    let message = e.to_string();
    let quoted = |rest: &str| rest.split('`').next().unwrap_or("").to_string();
    let join = |name: &str| {
        if base == name || base.ends_with(&format!(".{name}")) {
            base.to_string()
        } else if base.is_empty() {
            name.to_string()
        } else {
            format!("{base}.{name}")
        }
    };
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            let field = (!base.is_empty()).then(|| base.to_string());
            (field, format!("malformed JSON: {message}"))
        }
        Category::Data => {
            if let Some(rest) = message.strip_prefix("unknown field `") {
                let name = quoted(rest);
                (Some(join(&name)), format!("unknown field `{name}`"))
            } else if let Some(rest) = message.strip_prefix("missing field `") {
                let name = quoted(rest);
                (Some(join(&name)), format!("missing field `{name}`"))
            } else {
                let field = (!base.is_empty()).then(|| base.to_string());
                (field, message)
            }
        }
    }
}
