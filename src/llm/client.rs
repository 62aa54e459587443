//! The HTTP client: one call with retries, backoff and a timeout.

use std::fmt;
use std::time::Duration;

use tracing::Instrument;

use super::wire::{ChatRequest, ChatResponse, Message, Usage};
use crate::egress::{
    DEFAULT_MAX_RESPONSE_BYTES, ReadError, read_capped, transport_error, upstream_error_summary,
};
use crate::telemetry;

/// Where and how to reach a model server.
#[derive(Clone)]
pub struct LlmSettings {
    /// Base URL up to `/v1`, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: String,
    /// Bearer token, if the server needs one.
    pub api_key: Option<String>,
    /// Timeout of one HTTP attempt.
    pub timeout: Duration,
    /// Retries after the first attempt (429, 5xx, connection errors, timeouts).
    pub max_retries: u32,
    /// First backoff delay; doubles per retry, capped at 30 s.
    pub retry_base: Duration,
}

/// How model calls time out and retry (`WARDEN_LLM_TIMEOUT_MS`,
/// `WARDEN_LLM_MAX_RETRIES`, `WARDEN_LLM_RETRY_BASE_MS`), whatever endpoint
/// a session names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallPolicy {
    /// Timeout of one HTTP attempt.
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff delay.
    pub retry_base: Duration,
}

impl Default for CallPolicy {
    fn default() -> CallPolicy {
        CallPolicy {
            timeout: Duration::from_secs(120),
            max_retries: 3,
            retry_base: Duration::from_millis(500),
        }
    }
}

impl fmt::Debug for LlmSettings {
    // The API key never reaches a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmSettings")
            .field("base_url", &crate::egress::redact_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

/// The URL of `path` under `base_url`: the path goes after the base's path
/// and before its query (`https://h/v1?k=1` → `https://h/v1/chat/completions?k=1`).
pub fn endpoint(base_url: &str, path: &str) -> String {
    let (base, query) = crate::egress::split_query(base_url);
    let joined = format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    );
    match query {
        Some(query) => format!("{joined}?{query}"),
        None => joined,
    }
}

/// Tokens charged for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Of the prompt's, those served from a prompt cache (as reported, else 0).
    pub cached: u64,
    /// Total (as reported, else prompt + completion).
    pub total: u64,
}

/// A successful call.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant's message.
    pub message: Message,
    /// Tokens charged.
    pub usage: TokenUsage,
    /// Whether usage came from the server (otherwise it was estimated).
    pub usage_reported: bool,
    /// Why generation stopped, if the server said.
    pub finish_reason: Option<String>,
    /// Attempts it took.
    pub attempts: u32,
    /// The completion's id, as the server gave it (capped).
    pub response_id: Option<String>,
    /// The model that answered, as the server named it (capped).
    pub response_model: Option<String>,
}

/// Most characters of a server-reported id or model name kept for telemetry.
const REPORTED_NAME_CHARS: usize = 256;

/// A name the model server reported, cut to [`REPORTED_NAME_CHARS`].
fn reported(name: Option<String>) -> Option<String> {
    name.map(|n| n.chars().take(REPORTED_NAME_CHARS).collect())
}

/// Why a call failed after its retries.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The server answered with an error status.
    #[error("model server answered {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The status line and the server's own error message, sanitized.
        body: String,
    },
    /// The server could not be reached or the call timed out.
    #[error("model server unreachable: {0}")]
    Transport(String),
    /// The answer was larger than the cap: permanent, never retried.
    #[error("model server's {0}")]
    TooLarge(ReadError),
    /// The answer was not a chat completion.
    #[error("model server answered something that is not a chat completion: {0}")]
    InvalidResponse(String),
}

impl LlmError {
    fn retryable(&self) -> bool {
        match self {
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::Transport(_) => true,
            LlmError::TooLarge(_) | LlmError::InvalidResponse(_) => false,
        }
    }
}

/// A chat-completions client.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    settings: LlmSettings,
    /// Largest answer read.
    max_body: usize,
}

fn estimate_tokens(text: usize) -> u64 {
    // About four characters per token; only used when a server omits usage.
    (text as u64).div_ceil(4)
}

/// The tokens a call is charged: as the server reported them (a missing
/// total is prompt + completion), or estimated from the text both ways when
/// it reported none.
fn charged(reported: Option<Usage>, request: &ChatRequest, answer: &Message) -> TokenUsage {
    if let Some(u) = reported {
        let prompt = u.prompt_tokens.unwrap_or(0);
        let completion = u.completion_tokens.unwrap_or(0);
        let cached = u
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        return TokenUsage {
            prompt,
            completion,
            cached,
            total: u
                .total_tokens
                .unwrap_or_else(|| prompt.saturating_add(completion)),
        };
    }
    let prompt_chars: usize = request
        .messages
        .iter()
        .map(|m| m.content.as_deref().map_or(0, str::len))
        .sum();
    let completion_chars = answer.content.as_deref().map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|c| c.function.arguments.len() + c.function.name.len())
            .sum::<usize>();
    let prompt = estimate_tokens(prompt_chars);
    let completion = estimate_tokens(completion_chars);
    TokenUsage {
        prompt,
        completion,
        cached: 0,
        total: prompt + completion,
    }
}

impl LlmClient {
    /// A client for the operator's own endpoint (`WARDEN_LLM_BASE_URL`):
    /// trusted, so it is not held to the outbound-request policy.
    pub fn new(settings: LlmSettings) -> Result<LlmClient, LlmError> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| LlmError::Transport(e.without_url().to_string()))?;
        Ok(LlmClient::with_http(
            settings,
            http,
            DEFAULT_MAX_RESPONSE_BYTES,
        ))
    }

    /// A client over `http` (e.g. one built under the outbound-request
    /// policy), reading answers up to `max_body` bytes.
    pub fn with_http(settings: LlmSettings, http: reqwest::Client, max_body: usize) -> LlmClient {
        LlmClient {
            http,
            settings,
            max_body,
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &LlmSettings {
        &self.settings
    }

    /// Sends `request`, retrying transient failures with exponential
    /// backoff, in a GenAI `chat {model}` span when traces are exported.
    pub async fn chat(&self, request: &ChatRequest) -> Result<Completion, LlmError> {
        let server = server_of(&self.settings.base_url);
        let span = tracing::info_span!(
            target: telemetry::TARGET,
            "chat",
            otel.name = %format_args!("chat {}", request.model),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = PROVIDER,
            gen_ai.request.model = %request.model,
            gen_ai.request.max_tokens = telemetry::int(request.max_tokens),
            server.address = tracing::field::Empty,
            server.port = tracing::field::Empty,
            gen_ai.response.id = tracing::field::Empty,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
            warden.attempts = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        if span.is_disabled() {
            return self.call(request, None).await;
        }
        if let Some((address, port)) = &server {
            span.record("server.address", address.as_str());
            span.record("server.port", i64::from(*port));
        }
        let traceparent = telemetry::traceparent_of_span(&span);
        let started = std::time::Instant::now();
        let result = self
            .call(request, traceparent.as_deref())
            .instrument(span.clone())
            .await;
        let error = record_call(&span, request, &result);
        let call = telemetry::GenAiCall {
            operation: "chat",
            provider: PROVIDER,
            request_model: &request.model,
            response_model: result
                .as_ref()
                .ok()
                .and_then(|c| c.response_model.as_deref()),
            server: server.as_ref().map(|(a, p)| (a.as_str(), *p)),
        };
        let tokens = result
            .as_ref()
            .ok()
            .map(|c| (c.usage.prompt, c.usage.completion));
        telemetry::record_genai_metrics(&call, started.elapsed(), tokens, error.as_deref());
        result
    }

    #[tracing::instrument(skip_all, fields(model = %request.model))]
    async fn call(
        &self,
        request: &ChatRequest,
        traceparent: Option<&str>,
    ) -> Result<Completion, LlmError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(request, traceparent).await {
                Ok(mut completion) => {
                    completion.attempts = attempt;
                    return Ok(completion);
                }
                Err((err, retry_after)) => {
                    if !err.retryable() || attempt > self.settings.max_retries {
                        return Err(err);
                    }
                    let backoff = self
                        .settings
                        .retry_base
                        .saturating_mul(1 << (attempt - 1).min(16))
                        .min(Duration::from_secs(30));
                    let delay = retry_after.unwrap_or(backoff).min(Duration::from_secs(30));
                    tracing::warn!(error = %err, attempt, ?delay, "model call failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn attempt(
        &self,
        request: &ChatRequest,
        traceparent: Option<&str>,
    ) -> Result<Completion, (LlmError, Option<Duration>)> {
        let url = endpoint(&self.settings.base_url, "chat/completions");
        let mut builder = self.http.post(&url).json(request);
        if let Some(key) = &self.settings.api_key {
            builder = builder.bearer_auth(key);
        }
        if let Some(traceparent) = traceparent {
            builder = builder.header(telemetry::TRACEPARENT, traceparent);
        }
        let response = builder
            .send()
            .await
            .map_err(|e| (LlmError::Transport(transport_error(&e)), None))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = read_capped(response, self.max_body)
            .await
            .map_err(|e| match e {
                ReadError::TooLarge { .. } => (LlmError::TooLarge(e), None),
                ReadError::Unreadable(_) => (LlmError::Transport(e.to_string()), None),
            })?;
        if !status.is_success() {
            // Only a summary: the answer of an endpoint a client chose must
            // not travel back to that client (SSRF).
            return Err((
                LlmError::Status {
                    status: status.as_u16(),
                    body: upstream_error_summary(status, &body),
                },
                retry_after,
            ));
        }
        let parsed: ChatResponse = serde_json::from_slice(&body)
            .map_err(|e| (LlmError::InvalidResponse(e.to_string()), None))?;
        let choice = parsed.choices.into_iter().next().ok_or_else(|| {
            (
                LlmError::InvalidResponse("no choices in the answer".into()),
                None,
            )
        })?;
        let usage_reported = parsed.usage.is_some();
        let usage = charged(parsed.usage, request, &choice.message);
        Ok(Completion {
            message: choice.message,
            usage,
            usage_reported,
            finish_reason: choice.finish_reason,
            attempts: 1,
            response_id: reported(parsed.id),
            response_model: reported(parsed.model),
        })
    }
}

/// `gen_ai.provider.name` of the model client: an OpenAI-compatible API.
const PROVIDER: &str = "openai";

/// `server.address` and `server.port` of a model server's base URL.
fn server_of(base_url: &str) -> Option<(String, u16)> {
    let url = url::Url::parse(base_url).ok()?;
    let host = url.host_str()?.trim_matches(['[', ']']).to_string();
    Some((host, url.port_or_known_default()?))
}

/// What a finished call puts on its `chat` span: usage, response id and
/// model, finish reason, error, and the messages when content tracing is
/// on. Returns its `error.type` when it failed.
fn record_call(
    span: &tracing::Span,
    request: &ChatRequest,
    result: &Result<Completion, LlmError>,
) -> Option<String> {
    let error = match result {
        Ok(completion) => {
            span.record(
                "gen_ai.usage.input_tokens",
                telemetry::int(completion.usage.prompt),
            );
            span.record(
                "gen_ai.usage.output_tokens",
                telemetry::int(completion.usage.completion),
            );
            span.record("warden.attempts", i64::from(completion.attempts));
            if let Some(id) = &completion.response_id {
                span.record("gen_ai.response.id", id.as_str());
            }
            if let Some(model) = &completion.response_model {
                span.record("gen_ai.response.model", model.as_str());
            }
            telemetry::record_strings(
                span,
                "gen_ai.response.finish_reasons",
                completion.finish_reason.iter().cloned().collect(),
            );
            if telemetry::content_enabled() {
                let output = serde_json::to_string(&[&completion.message]).unwrap_or_default();
                span.record(
                    "gen_ai.output.messages",
                    telemetry::capped(&output).as_str(),
                );
            }
            None
        }
        Err(err) => {
            let kind = match err {
                LlmError::Status { status, .. } => status.to_string(),
                LlmError::Transport(_) => "transport".to_string(),
                LlmError::TooLarge(_) => "too_large".to_string(),
                LlmError::InvalidResponse(_) => "invalid_response".to_string(),
            };
            span.record("error.type", kind.as_str());
            span.record("otel.status_code", "ERROR");
            Some(kind)
        }
    };
    if telemetry::content_enabled() {
        let input = serde_json::to_string(&request.messages).unwrap_or_default();
        span.record("gen_ai.input.messages", telemetry::capped(&input).as_str());
    }
    error
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reported_usage_at_the_extremes_never_overflows() {
        let request = request("hi");
        let answer = Message::text("assistant", "ok");
        for (prompt, completion) in [
            (u64::MAX, u64::MAX),
            (u64::MAX, 1),
            (i64::MAX as u64, i64::MAX as u64),
        ] {
            let usage = Usage {
                prompt_tokens: Some(prompt),
                completion_tokens: Some(completion),
                total_tokens: None,
                prompt_tokens_details: Some(crate::llm::wire::PromptTokensDetails {
                    cached_tokens: Some(prompt),
                }),
            };
            let charged = charged(Some(usage), &request, &answer);
            assert_eq!(charged.total, prompt.saturating_add(completion));
            assert_eq!(charged.cached, prompt);
        }
    }

    #[test]
    fn an_answer_over_the_cap_is_not_retried_and_not_unreachable() {
        let err = LlmError::TooLarge(ReadError::TooLarge {
            over: 5,
            exact: true,
            cap: 10,
        });
        assert!(!err.retryable());
        let text = err.to_string();
        assert!(text.contains("answer too large: 5 bytes over the cap of 10 bytes"));
        assert!(!text.contains("unreachable"), "{text}");
        assert!(LlmError::Transport("reset".into()).retryable());
    }

    #[test]
    fn the_path_goes_before_the_query() {
        for (base, url) in [
            ("https://h/v1", "https://h/v1/chat/completions"),
            ("https://h/v1/", "https://h/v1/chat/completions"),
            ("https://h/v1?x=1", "https://h/v1/chat/completions?x=1"),
            (
                "https://h/v1/?x=1&y=2",
                "https://h/v1/chat/completions?x=1&y=2",
            ),
            ("https://h/v1?", "https://h/v1/chat/completions"),
            (
                "https://h/v1?k=a/b#frag",
                "https://h/v1/chat/completions?k=a/b",
            ),
            ("http://h:8080", "http://h:8080/chat/completions"),
        ] {
            assert_eq!(endpoint(base, "chat/completions"), url, "{base}");
        }
    }

    fn request(prompt: &str) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![Message::text("user", prompt)],
            tools: Vec::new(),
            max_tokens: 100,
            max_completion_tokens: None,
            temperature: None,
            top_p: None,
        }
    }

    fn response(body: serde_json::Value) -> ChatResponse {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn reported_usage_is_charged_and_a_missing_total_is_the_sum() {
        let r = response(json!({
            "choices": [{ "message": { "role": "assistant", "content": "hi" } }],
            "usage": { "prompt_tokens": 7, "completion_tokens": 3 }
        }));
        let answer = &r.choices[0].message;
        let usage = charged(r.usage, &request("a long prompt"), answer);
        assert_eq!((usage.prompt, usage.completion, usage.total), (7, 3, 10));
    }

    #[test]
    fn without_usage_both_directions_are_estimated_from_their_text() {
        let r = response(json!({
            "choices": [{ "message": {
                "role": "assistant", "content": "12345",
                "tool_calls": [{ "function": { "name": "ls", "arguments": "{}" } }]
            } }]
        }));
        assert!(r.usage.is_none());
        let answer = &r.choices[0].message;
        // 9 prompt characters; 5 of content + 2 of name + 2 of arguments.
        let usage = charged(r.usage, &request("123456789"), answer);
        assert_eq!((usage.prompt, usage.completion, usage.total), (3, 3, 6));
    }
}
