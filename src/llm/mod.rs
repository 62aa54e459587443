//! A client for OpenAI-compatible chat completions (OpenAI, vLLM,
//! llama.cpp, Ollama…): tool calling, token usage, retries with backoff.
//! Wire types are lenient where servers differ and strict where Warden
//! depends on a field.

mod client;
mod wire;

pub use client::{CallPolicy, Completion, LlmClient, LlmError, LlmSettings, TokenUsage};
pub use wire::{ChatRequest, FunctionCall, Message, ToolCall, ToolSpec};
