//! Language models and embedders: the traits the core uses, offline deterministic defaults, and
//! an OpenAI-compatible HTTP client for users who have a model server.

pub mod embed;
pub mod models;
pub mod openai;
pub mod rule;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use models::{Models, Price};

/// A boxed, sendable future, as returned by the model traits.
pub type ModelFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ModelError>> + Send + 'a>>;

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions to the model.
    System,
    /// The user's words.
    User,
    /// The model's words (and tool calls).
    Assistant,
    /// A tool's result, answering one of the model's calls.
    Tool,
}

/// One call of a tool the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the tool's result names (`tool_call_id`).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments object.
    pub arguments: serde_json::Value,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The speaker.
    pub role: Role,
    /// The text (empty for an assistant turn that only calls tools).
    pub content: String,
    /// The tools an assistant turn calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new(Role::User, content)
    }

    /// The model's turn: its text and the tools it calls.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> ChatMessage {
        ChatMessage {
            tool_calls,
            ..ChatMessage::new(Role::Assistant, content)
        }
    }

    /// A tool's result for the call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            ..ChatMessage::new(Role::Tool, content)
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// The tool's name (a name in the registry).
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments object.
    pub parameters: serde_json::Value,
}

/// Whether the model may, must or must not call tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call a tool.
    Required,
    /// The model must answer in words.
    None,
}

/// A chat completion request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Ask for a JSON object as the answer.
    pub json_mode: bool,
    /// In JSON mode, the JSON Schema the answer must follow, if any (servers that support it
    /// constrain the generation to it; see [`openai::SchemaFormat`]).
    #[serde(default)]
    pub json_schema: Option<serde_json::Value>,
    /// Upper bound on generated tokens.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// The tools the model may call (none: it answers in words).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDef>,
    /// Whether it may, must or must not call them (only sent with tools).
    #[serde(default)]
    pub tool_choice: ToolChoice,
}

/// Tokens a turn took, as the server counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

impl Usage {
    /// Both together.
    pub fn total(&self) -> u32 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// One turn of the model: its text, the tools it calls (none: this is its answer), and what it
/// took.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelReply {
    /// The text.
    pub content: String,
    /// The tools it calls, in order (several at once when the server allows parallel calls).
    pub tool_calls: Vec<ToolCall>,
    /// Tokens, when the server reported them.
    pub usage: Option<Usage>,
}

/// Where a turn happens: the run, task, attempt, stage and turn (simulated models draw from
/// these, as simulated tools draw from [`crate::tools::CallContext`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnContext {
    /// The run.
    pub run_id: String,
    /// The task's index.
    pub task_index: u64,
    /// The attempt of the run (0-based).
    pub attempt: u32,
    /// The stage.
    pub stage: String,
    /// The turn within the stage of this attempt (0-based).
    pub turn: u32,
    /// The task's goal.
    pub goal: String,
    /// The task's features.
    pub features: std::collections::BTreeMap<String, String>,
    /// The task's input object, if it has one.
    pub input: Option<serde_json::Value>,
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// The server could not be reached or failed; carries the classified error.
    #[error("model request to {url} failed: {message}")]
    Request {
        /// The endpoint.
        url: String,
        /// What happened.
        message: String,
        /// The class of the failure.
        class: crate::taxonomy::ErrorClass,
    },
    /// The server answered something that is not what the API promises.
    #[error("model server at {url} returned an unreadable answer: {message}")]
    BadResponse {
        /// The endpoint.
        url: String,
        /// What was wrong with it.
        message: String,
    },
    /// The input cannot be handled (empty text, too long, ...).
    #[error("invalid model input: {0}")]
    InvalidInput(String),
}

/// A chat model: messages in, text (and tool calls) out.
pub trait LanguageModel: Send + Sync {
    /// A short name for logs and provenance.
    fn name(&self) -> &str;
    /// Completes the conversation with text.
    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String>;
    /// One turn of an agent's loop: the model answers in words or calls some of
    /// `request.tools`. A model that cannot call tools answers in words (the default).
    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        _ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        Box::pin(async move {
            Ok(ModelReply {
                content: self.complete(request).await?,
                ..ModelReply::default()
            })
        })
    }
}

/// Turns text into fixed-dimension vectors whose cosine similarity means similarity of meaning.
pub trait Embedder: Send + Sync {
    /// The dimension of every vector.
    fn dimension(&self) -> usize;
    /// Embeds each text, in order.
    fn embed<'a>(&'a self, texts: &'a [String]) -> ModelFuture<'a, Vec<Vec<f32>>>;
}

/// The dot product of two vectors of one length, summed in eight independent lanes (which the
/// compiler vectorizes; a single running sum would not be).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Cosine similarity of two vectors (0 when either is zero or the lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (na, nb) = (dot(a, a), dot(b, b));
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot(a, b) / (na.sqrt() * nb.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::cosine;

    /// The plain running sums the lanes replace.
    fn plain(a: &[f32], b: &[f32]) -> f64 {
        let (mut d, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (x, y) in a.iter().zip(b) {
            let (x, y) = (f64::from(*x), f64::from(*y));
            d += x * y;
            na += x * x;
            nb += y * y;
        }
        if na == 0.0 || nb == 0.0 {
            0.0
        } else {
            d / (na.sqrt() * nb.sqrt())
        }
    }

    #[test]
    fn the_cosine_in_lanes_is_the_cosine() {
        let mut rng = fastrand::Rng::with_seed(7);
        for len in [0, 1, 7, 8, 9, 63, 256, 384, 389] {
            for _ in 0..20 {
                let a: Vec<f32> = (0..len).map(|_| rng.f32() * 2.0 - 1.0).collect();
                let b: Vec<f32> = (0..len).map(|_| rng.f32() * 2.0 - 1.0).collect();
                let got = f64::from(cosine(&a, &b));
                assert!((got - plain(&a, &b)).abs() < 1e-5, "{len}: {got}");
                if len > 0 {
                    assert!((f64::from(cosine(&a, &a)) - 1.0).abs() < 1e-5);
                }
            }
        }
        assert_eq!(cosine(&[0.0; 9], &[1.0; 9]), 0.0);
        assert_eq!(cosine(&[1.0; 9], &[1.0; 8]), 0.0);
    }
}
