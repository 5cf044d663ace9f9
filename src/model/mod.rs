//! Language models and embedders: the traits the core uses, offline deterministic defaults, and
//! an OpenAI-compatible HTTP client for users who have a model server.

pub mod embed;
pub mod openai;
pub mod rule;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

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
    /// The model's words.
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The speaker.
    pub role: Role,
    /// The text.
    pub content: String,
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

/// A chat model: messages in, text out.
pub trait LanguageModel: Send + Sync {
    /// A short name for logs and provenance.
    fn name(&self) -> &str;
    /// Completes the conversation.
    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String>;
}

/// Turns text into fixed-dimension vectors whose cosine similarity means similarity of meaning.
pub trait Embedder: Send + Sync {
    /// The dimension of every vector.
    fn dimension(&self) -> usize;
    /// Embeds each text, in order.
    fn embed<'a>(&'a self, texts: &'a [String]) -> ModelFuture<'a, Vec<Vec<f32>>>;
}

/// Cosine similarity of two vectors (0 when either is zero or the lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}
