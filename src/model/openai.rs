//! An OpenAI-compatible HTTP client (chat completions with JSON mode and tool calling,
//! embeddings) for users who have a model server: configuration from a struct or
//! `HINDSIGHT_MODEL_*` variables, deadlines, retries of infrastructure failures with seeded
//! full-jitter backoff honouring Retry-After, and every failure classified into a [`ModelError`]
//! with its [`ErrorClass`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    ChatMessage, ChatRequest, Embedder, LanguageModel, ModelError, ModelFuture, ModelReply, Role,
    ToolCall, ToolChoice, TurnContext, Usage,
};
use crate::taxonomy::ErrorClass;
use crate::tools::RetryPolicy;

/// Where and how to reach the model server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenAiConfig {
    /// The API base, e.g. `http://127.0.0.1:8080/v1` (the paths `/chat/completions` and
    /// `/embeddings` are appended).
    pub base_url: String,
    /// The chat model's name.
    pub model: String,
    /// The embedding model's name (defaults to `model`).
    pub embedding_model: Option<String>,
    /// Bearer token, if the server wants one.
    pub api_key: Option<String>,
    /// Deadline of one request, in milliseconds.
    pub timeout_ms: u64,
    /// Deadline of connecting, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Retries of infrastructure failures (timeouts, 429, 5xx, refused connections).
    pub retry: RetryPolicy,
    /// The embedding dimension, when known in advance (else learned from the first answer).
    pub dimension: Option<usize>,
    /// Seed of the backoff jitter.
    pub seed: u64,
    /// How a request's JSON Schema is sent.
    pub schema_format: SchemaFormat,
}

/// How a JSON-mode request's schema ([`ChatRequest::json_schema`]) is put in `response_format`:
/// servers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaFormat {
    /// OpenAI's structured outputs (also vLLM, llama.cpp's `llama-server`):
    /// `{"type": "json_schema", "json_schema": {"name": "answer", "schema": ...}}`.
    #[default]
    JsonSchema,
    /// A schema inside JSON mode (llama-cpp-python's server, Anyscale, llama.cpp's
    /// `llama-server`): `{"type": "json_object", "schema": ...}`.
    JsonObject,
    /// Plain JSON mode, the schema left out (servers that support neither).
    Off,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: "http://127.0.0.1:8080/v1".into(),
            model: "default".into(),
            embedding_model: None,
            api_key: None,
            timeout_ms: 60_000,
            connect_timeout_ms: 5_000,
            retry: RetryPolicy {
                max_attempts: 3,
                base_ms: 200,
                max_ms: 5_000,
                honour_retry_after: true,
                retry_non_idempotent: true,
            },
            dimension: None,
            seed: 0,
            schema_format: SchemaFormat::default(),
        }
    }
}

impl OpenAiConfig {
    /// The configuration from the process environment; `None` when `HINDSIGHT_MODEL_URL` is
    /// unset. See [`OpenAiConfig::from_lookup`].
    pub fn from_env() -> Option<OpenAiConfig> {
        OpenAiConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// The configuration from variables: `HINDSIGHT_MODEL_URL` (required), `HINDSIGHT_MODEL`,
    /// `HINDSIGHT_EMBED_MODEL`, `HINDSIGHT_MODEL_API_KEY` (or `HINDSIGHT_API_KEY`),
    /// `HINDSIGHT_MODEL_TIMEOUT_MS`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<OpenAiConfig> {
        let base_url = get("HINDSIGHT_MODEL_URL").filter(|s| !s.trim().is_empty())?;
        let mut c = OpenAiConfig {
            base_url,
            ..OpenAiConfig::default()
        };
        if let Some(m) = get("HINDSIGHT_MODEL").filter(|s| !s.is_empty()) {
            c.model = m;
        }
        c.embedding_model = get("HINDSIGHT_EMBED_MODEL").filter(|s| !s.is_empty());
        c.api_key = get("HINDSIGHT_MODEL_API_KEY")
            .or_else(|| get("HINDSIGHT_API_KEY"))
            .filter(|s| !s.is_empty());
        if let Some(t) = get("HINDSIGHT_MODEL_TIMEOUT_MS").and_then(|s| s.parse().ok()) {
            c.timeout_ms = t;
        }
        Some(c)
    }
}

/// The client (one HTTP connection pool; cheap to share behind an `Arc`).
#[derive(Debug)]
pub struct OpenAiClient {
    config: OpenAiConfig,
    http: reqwest::Client,
    dimension: AtomicUsize,
    rng: Mutex<fastrand::Rng>,
    name: String,
}

struct Failure {
    error: ModelError,
    retryable: bool,
    retry_after_ms: Option<u64>,
}

fn request_error(url: &str, class: ErrorClass, message: String) -> ModelError {
    ModelError::Request {
        url: url.to_string(),
        message,
        class,
    }
}

impl OpenAiClient {
    /// A client for `config`.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiClient, ModelError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .build()
            .map_err(|e| ModelError::InvalidInput(format!("cannot build the HTTP client: {e}")))?;
        Ok(OpenAiClient {
            dimension: AtomicUsize::new(config.dimension.unwrap_or(0)),
            rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            name: format!("openai-compatible:{}", config.model),
            config,
            http,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.config.base_url.trim_end_matches('/'))
    }

    async fn post_once(&self, url: &str, body: &Value) -> Result<Value, Failure> {
        let mut req = self.http.post(url).json(body);
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let class = if e.is_timeout() {
                    ErrorClass::Timeout
                } else {
                    ErrorClass::TransientNetwork
                };
                return Err(Failure {
                    error: request_error(url, class, format!("request failed: {e}")),
                    retryable: true,
                    retry_after_ms: None,
                });
            }
        };
        let status = resp.status().as_u16();
        let retry_after_ms = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .map(|s| (s * 1000.0) as u64);
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                let class = if e.is_timeout() {
                    ErrorClass::Timeout
                } else {
                    ErrorClass::TransientNetwork
                };
                return Err(Failure {
                    error: request_error(url, class, format!("reading the answer failed: {e}")),
                    retryable: true,
                    retry_after_ms: None,
                });
            }
        };
        if !(200..300).contains(&status) {
            let snippet: String = text.chars().take(300).collect();
            let message = format!("HTTP {status}: {snippet}");
            let (class, retryable) = match status {
                429 => (ErrorClass::RateLimit, true),
                401 | 403 => (ErrorClass::Auth, false),
                404 => (ErrorClass::NotFound, false),
                // A request the server refuses: too long for its context (the classifier's
                // verdict, kept with the server's words in the message), else malformed.
                400 | 422 => {
                    let c = crate::triage::classify_error(None, &message);
                    if c.rule == "context_overflow" {
                        (c.error_class, false)
                    } else {
                        (ErrorClass::SchemaMismatch, false)
                    }
                }
                408 | 504 => (ErrorClass::Timeout, true),
                500..=599 => (ErrorClass::TransientNetwork, true),
                _ => {
                    let c = crate::triage::classify_error(None, &message);
                    (
                        c.error_class,
                        c.category == crate::taxonomy::FailureCategory::Infrastructure,
                    )
                }
            };
            return Err(Failure {
                error: request_error(url, class, message),
                retryable,
                retry_after_ms,
            });
        }
        serde_json::from_str(&text).map_err(|e| Failure {
            error: ModelError::BadResponse {
                url: url.to_string(),
                message: format!(
                    "not JSON ({e}): {}",
                    text.chars().take(200).collect::<String>()
                ),
            },
            retryable: false,
            retry_after_ms: None,
        })
    }

    /// POSTs `body` to `path`, retrying infrastructure failures per the retry policy.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ModelError> {
        let url = self.url(path);
        let policy = &self.config.retry;
        let mut attempt = 0u32;
        loop {
            match self.post_once(&url, body).await {
                Ok(v) => return Ok(v),
                Err(f) if f.retryable && attempt + 1 < policy.max_attempts.max(1) => {
                    let delay = match self.rng.lock() {
                        Ok(mut rng) => policy.delay_ms(attempt, f.retry_after_ms, &mut rng),
                        Err(_) => policy.ceiling_ms(attempt),
                    };
                    tracing::debug!(url = %url, attempt, delay, error = %f.error, "retrying model request");
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    attempt += 1;
                }
                Err(f) => return Err(f.error),
            }
        }
    }

    /// The body of a chat completion request for `request`, in the OpenAI wire format: the
    /// messages (an assistant's tool calls with their arguments as a JSON string and its text,
    /// `""` when it has none; tool results naming the call they answer), the offered tools and the tool choice (only with tools),
    /// the sampling settings and JSON mode.
    ///
    /// [`ToolChoice::Required`] with exactly one tool offered is sent as the named choice of that
    /// tool (`{"type": "function", "function": {"name": ...}}`): the same constraint, and the
    /// form more servers accept (llama-cpp-python's `chatml-function-calling` handles a named
    /// choice but not `"required"`).
    pub fn chat_body(&self, request: &ChatRequest) -> Result<Value, ModelError> {
        if request.messages.is_empty() {
            return Err(ModelError::InvalidInput(
                "a chat request needs at least one message".into(),
            ));
        }
        let messages = request
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| wire_message(i, m))
            .collect::<Result<Vec<Value>, ModelError>>()?;
        let mut obj = serde_json::Map::new();
        obj.insert("model".into(), json!(self.config.model));
        obj.insert("messages".into(), Value::Array(messages));
        if let Some(t) = request.max_tokens {
            obj.insert("max_tokens".into(), json!(t));
        }
        if let Some(t) = request.temperature {
            obj.insert("temperature".into(), json!(t));
        }
        if request.json_mode {
            let format = match (&request.json_schema, self.config.schema_format) {
                (Some(schema), SchemaFormat::JsonSchema) => json!({
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema},
                }),
                (Some(schema), SchemaFormat::JsonObject) => {
                    json!({"type": "json_object", "schema": schema})
                }
                _ => json!({"type": "json_object"}),
            };
            obj.insert("response_format".into(), format);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        },
                    })
                })
                .collect();
            let choice = match (request.tool_choice, request.tools.as_slice()) {
                (ToolChoice::Auto, _) => json!("auto"),
                (ToolChoice::None, _) => json!("none"),
                (ToolChoice::Required, [only]) => {
                    json!({"type": "function", "function": {"name": only.name}})
                }
                (ToolChoice::Required, _) => json!("required"),
            };
            obj.insert("tools".into(), Value::Array(tools));
            obj.insert("tool_choice".into(), choice);
        }
        Ok(Value::Object(obj))
    }

    /// Sends `request` and reads the reply (`turn` names calls the server gave no id); in JSON
    /// mode an answer in words is checked to be JSON.
    async fn exchange(&self, request: &ChatRequest, turn: u32) -> Result<ModelReply, ModelError> {
        let body = self.chat_body(request)?;
        let url = self.url("chat/completions");
        let v = self.post("chat/completions", &body).await?;
        let reply = parse_reply(&url, &v, turn)?;
        if request.json_mode
            && reply.tool_calls.is_empty()
            && serde_json::from_str::<Value>(&reply.content).is_err()
        {
            return Err(ModelError::BadResponse {
                url,
                message: format!(
                    "JSON mode answer is not JSON: {}",
                    reply.content.chars().take(200).collect::<String>()
                ),
            });
        }
        Ok(reply)
    }

    /// Chat completion; in JSON mode the answer is checked to be JSON. A reply that only calls
    /// tools is a [`ModelError::BadResponse`] here (see [`OpenAiClient::chat_turn`]).
    pub async fn chat(&self, request: &ChatRequest) -> Result<String, ModelError> {
        let reply = self.exchange(request, 0).await?;
        if reply.content.is_empty() && !reply.tool_calls.is_empty() {
            let names: Vec<&str> = reply.tool_calls.iter().map(|c| c.name.as_str()).collect();
            return Err(ModelError::BadResponse {
                url: self.url("chat/completions"),
                message: format!(
                    "no choices[0].message.content: the model called tools ({}) where text was \
                     asked for",
                    names.join(", ")
                ),
            });
        }
        Ok(reply.content)
    }

    /// One turn: the model's text, every tool it calls (in order), and the tokens it took.
    pub async fn chat_turn(
        &self,
        request: &ChatRequest,
        ctx: &TurnContext,
    ) -> Result<ModelReply, ModelError> {
        self.exchange(request, ctx.turn).await
    }

    /// Embeddings of `texts`, in order: a vector per text, or one per token that is mean-pooled
    /// (llama.cpp's server without pooling), then L2-normalised.
    pub async fn embeddings(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, ModelError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        if texts.iter().any(|t| t.is_empty()) {
            return Err(ModelError::InvalidInput(
                "cannot embed an empty text".into(),
            ));
        }
        let model = self
            .config
            .embedding_model
            .as_ref()
            .unwrap_or(&self.config.model);
        let url = self.url("embeddings");
        let v = self
            .post("embeddings", &json!({"model": model, "input": texts}))
            .await?;
        let bad = |message: String| ModelError::BadResponse {
            url: url.clone(),
            message,
        };
        let data = v
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `data` array".into()))?;
        if data.len() != texts.len() {
            return Err(bad(format!(
                "{} embeddings for {} texts",
                data.len(),
                texts.len()
            )));
        }
        let mut out: Vec<(usize, Vec<f32>)> = Vec::with_capacity(data.len());
        for (i, item) in data.iter().enumerate() {
            let index = item
                .get("index")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(i);
            let emb = item
                .get("embedding")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("data[{i}] has no `embedding` array")))?;
            out.push((
                index,
                pool(emb).map_err(|m| bad(format!("data[{i}].embedding: {m}")))?,
            ));
        }
        out.sort_by_key(|(i, _)| *i);
        let dim = out.first().map(|(_, v)| v.len()).unwrap_or(0);
        if out.iter().any(|(_, v)| v.len() != dim) || dim == 0 {
            return Err(bad("embeddings of different or zero dimension".into()));
        }
        let known = self.dimension.load(Ordering::Relaxed);
        if known != 0 && known != dim {
            return Err(bad(format!("dimension {dim}, expected {known}")));
        }
        self.dimension.store(dim, Ordering::Relaxed);
        Ok(out.into_iter().map(|(_, v)| v).collect())
    }
}

/// One message in the OpenAI wire format (`index`: its place in the conversation, for errors).
fn wire_message(index: usize, m: &ChatMessage) -> Result<Value, ModelError> {
    Ok(match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::User => json!({"role": "user", "content": m.content}),
        Role::Assistant if m.tool_calls.is_empty() => {
            json!({"role": "assistant", "content": m.content})
        }
        Role::Assistant => {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": wire_arguments(&c.arguments)},
                    })
                })
                .collect();
            // An empty text goes as "" rather than null: OpenAI, vLLM and llama.cpp's server take
            // either, but llama-cpp-python's server refuses null (its assistant message's
            // content is a string, when present) and its templates need the key.
            json!({"role": "assistant", "content": m.content, "tool_calls": calls})
        }
        Role::Tool => {
            let id = m.tool_call_id.as_deref().ok_or_else(|| {
                ModelError::InvalidInput(format!(
                    "message {index} is a tool result without the id of the call it answers"
                ))
            })?;
            json!({"role": "tool", "tool_call_id": id, "content": m.content})
        }
    })
}

/// A call's arguments as the JSON string the wire carries: a string kept raw (arguments that
/// did not parse) goes back as the model wrote it, anything else is serialised.
fn wire_arguments(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

/// A call's arguments as read from the wire: a JSON string holding an object gives the object;
/// an empty string or none at all, the empty object; anything else is kept as the raw string,
/// for the tool layer's schema check to refuse with a message the model reads.
fn read_arguments(arguments: Option<&Value>) -> Value {
    match arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(Value::String(raw)) if raw.trim().is_empty() => json!({}),
        Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(o)) => Value::Object(o),
            _ => Value::String(raw.clone()),
        },
        Some(other) => Value::String(other.to_string()),
    }
}

/// The reply of a chat completion: `choices[0].message`'s content (text, null, or text parts)
/// and tool calls (ids the server left out are `call_<turn>_<position>`), and `usage`.
fn parse_reply(url: &str, v: &Value, turn: u32) -> Result<ModelReply, ModelError> {
    let bad = |message: String| ModelError::BadResponse {
        url: url.to_string(),
        message,
    };
    let message = v
        .pointer("/choices/0/message")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no choices[0].message object".into()))?;
    let content = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<String>(),
        ),
        Some(_) => {
            return Err(bad(
                "choices[0].message.content is neither text nor null".into()
            ));
        }
    };
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => {
            return Err(bad("choices[0].message.tool_calls is not an array".into()));
        }
    };
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        let function = call
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                bad(format!(
                    "choices[0].message.tool_calls[{i}] has no function"
                ))
            })?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                bad(format!(
                    "choices[0].message.tool_calls[{i}].function has no name"
                ))
            })?;
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("call_{turn}_{i}"));
        tool_calls.push(ToolCall {
            id,
            name: name.to_string(),
            arguments: read_arguments(function.get("arguments")),
        });
    }
    if content.is_none() && tool_calls.is_empty() {
        return Err(bad(
            "choices[0].message has neither a content string nor tool_calls".into(),
        ));
    }
    let usage = v.get("usage").and_then(|u| {
        let count = |k: &str| {
            u.get(k)
                .and_then(Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        match (count("prompt_tokens"), count("completion_tokens")) {
            (None, None) => None,
            (p, c) => Some(Usage {
                prompt_tokens: p.unwrap_or(0),
                completion_tokens: c.unwrap_or(0),
            }),
        }
    });
    Ok(ModelReply {
        content: content.unwrap_or_default(),
        tool_calls,
        usage,
    })
}

/// A vector from `[x, ...]` or the mean of `[[x, ...], ...]`, L2-normalised.
fn pool(emb: &[Value]) -> Result<Vec<f32>, String> {
    let mut v: Vec<f32> = match emb.first() {
        None => return Err("empty".into()),
        Some(Value::Array(_)) => {
            let rows: Vec<Vec<f32>> = emb
                .iter()
                .map(|r| numbers(r.as_array().ok_or("mixed rows")?))
                .collect::<Result<_, _>>()?;
            let d = rows[0].len();
            if rows.iter().any(|r| r.len() != d) {
                return Err("token vectors of different lengths".into());
            }
            let mut mean = vec![0.0f32; d];
            for r in &rows {
                for (m, x) in mean.iter_mut().zip(r) {
                    *m += x;
                }
            }
            mean.iter_mut().for_each(|m| *m /= rows.len() as f32);
            mean
        }
        Some(_) => numbers(emb)?,
    };
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    Ok(v)
}

fn numbers(a: &[Value]) -> Result<Vec<f32>, String> {
    a.iter()
        .map(|x| {
            x.as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| "not a number".to_string())
        })
        .collect()
}

impl LanguageModel for OpenAiClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String> {
        Box::pin(self.chat(request))
    }

    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        Box::pin(self.chat_turn(request, ctx))
    }
}

impl Embedder for OpenAiClient {
    /// The configured dimension, or the one learned from the first answer (0 before any).
    fn dimension(&self) -> usize {
        self.dimension.load(Ordering::Relaxed)
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> ModelFuture<'a, Vec<Vec<f32>>> {
        Box::pin(self.embeddings(texts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_variables() {
        assert!(OpenAiConfig::from_lookup(|_| None).is_none());
        let c = OpenAiConfig::from_lookup(|k| match k {
            "HINDSIGHT_MODEL_URL" => Some("http://h:1/v1".into()),
            "HINDSIGHT_MODEL" => Some("smol".into()),
            "HINDSIGHT_API_KEY" => Some("k".into()),
            "HINDSIGHT_MODEL_TIMEOUT_MS" => Some("1500".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            (c.base_url.as_str(), c.model.as_str()),
            ("http://h:1/v1", "smol")
        );
        assert_eq!(c.api_key.as_deref(), Some("k"));
        assert_eq!(c.timeout_ms, 1500);
    }

    #[test]
    fn pooling() {
        let v = pool(&[json!([1.0, 0.0]), json!([0.0, 1.0])]).unwrap();
        assert!((v[0] - v[1]).abs() < 1e-6 && (v[0] - 0.70710677).abs() < 1e-6);
        let v = pool(&[json!(3.0), json!(4.0)]).unwrap();
        assert_eq!(v, vec![0.6, 0.8]);
        assert!(pool(&[]).is_err());
        assert!(pool(&[json!([1.0]), json!([1.0, 2.0])]).is_err());
    }
}
