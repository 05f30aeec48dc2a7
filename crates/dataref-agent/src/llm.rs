//! The LLM gateway: one small trait ([`ChatModel`]) the loop talks to, and its
//! OpenAI-compatible Chat Completions implementation ([`OpenAiCompatible`]), which covers
//! OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM and OpenRouter.

mod openai;
mod sse;

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::message::{Message, ToolDefinition, Usage};

pub use openai::{OpenAiCompatible, OpenAiSettings};

/// One request: the whole context the model sees this turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDefinition>,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
}

/// What the model answered: one assistant message (text and/or tool calls).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    pub message: Message,
    /// `None` when the provider sent no usage.
    pub usage: Option<Usage>,
    /// `stop`, `tool_calls`, `length`, … as the provider said it.
    pub finish_reason: Option<String>,
}

/// Where streamed text goes while the answer arrives.
pub trait TextSink: Send + Sync {
    fn text(&self, delta: &str);
}

/// A sink that drops the text (a caller that waits for the whole answer).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoText;

impl TextSink for NoText {
    fn text(&self, _delta: &str) {}
}

/// A model behind some API. Implementations stream text into `sink` as it comes, and stop
/// (returning [`LlmError::Cancelled`]) when `cancel` fires.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// The endpoint, for messages and logs (never a key).
    fn endpoint(&self) -> &str;

    async fn complete(
        &self,
        request: &ChatRequest,
        sink: &dyn TextSink,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError>;
}

/// Why a model request failed, each naming the endpoint and what to check.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Could not connect, or the connection dropped (after the retries).
    #[error("cannot reach the model at {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// No answer within the timeout (after the retries).
    #[error("the model at {endpoint} did not answer within {after:?}")]
    Timeout { endpoint: String, after: Duration },
    /// The provider said no: 4xx/5xx with its message. `status` 401/403: the key; 404: the
    /// URL or the model name; 400/422: the request; 429/5xx: after the retries.
    #[error("the model at {endpoint} answered {status}: {message}")]
    Status {
        endpoint: String,
        status: u16,
        message: String,
    },
    /// The answer was not what the API promises (not JSON, no choices, a broken stream).
    #[error("the model at {endpoint} sent an answer that cannot be read: {detail}")]
    Protocol { endpoint: String, detail: String },
    #[error("the model request was cancelled")]
    Cancelled,
}

impl LlmError {
    /// What a person should check, one line.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Unreachable { .. } => Some(
                "check DATAREF_LLM_URL (or the profile's `url`) and that the server is running",
            ),
            Self::Timeout { .. } => {
                Some("raise the profile's `timeout`, or check the server's load")
            }
            Self::Status { status, .. } => match status {
                401 | 403 => {
                    Some("check the API key (DATAREF_LLM_API_KEY or the profile's `api_key`)")
                }
                404 => Some("check the base URL (it usually ends in /v1) and the model name"),
                429 => Some("the provider is rate limiting: wait, or lower the request rate"),
                400 | 422 => {
                    Some("the provider refused the request; check the model supports tool calls")
                }
                _ => None,
            },
            Self::Protocol { .. } => Some("check the URL points at an OpenAI-compatible /v1 API"),
            Self::Cancelled => None,
        }
    }
}
