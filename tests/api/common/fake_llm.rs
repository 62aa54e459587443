//! A real HTTP fake of an OpenAI-compatible server, scripted per test:
//! agent requests (with tools) and reflection requests (without) each pop
//! the next scripted answer from their own queue. Every request is kept.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub delay: Duration,
    /// Answered only once a permit is added here: the test acts on the
    /// workspace while the step waits for its model.
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

impl Answer {
    pub fn ok(body: Value) -> Answer {
        Answer {
            status: 200,
            body,
            delay: Duration::ZERO,
            hold: None,
        }
    }

    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            body: json!({ "error": { "message": "scripted failure" } }),
            delay: Duration::ZERO,
            hold: None,
        }
    }

    /// Answered once `gate` gets a permit.
    pub fn held(mut self, gate: Arc<tokio::sync::Semaphore>) -> Answer {
        self.hold = Some(gate);
        self
    }

    pub fn delayed(mut self, ms: u64) -> Answer {
        self.delay = Duration::from_millis(ms);
        self
    }
}

#[derive(Default)]
struct Script {
    agent: VecDeque<Answer>,
    reflection: VecDeque<Answer>,
    requests: Vec<Value>,
    /// The Authorization header of every request, in order.
    authorizations: Vec<Option<String>>,
    /// The query string of every request, in order.
    queries: Vec<Option<String>>,
    /// The `traceparent` header of every request, in order.
    traceparents: Vec<Option<String>>,
}

/// The fake server.
#[derive(Clone)]
pub struct FakeLlm {
    pub addr: SocketAddr,
    script: Arc<Mutex<Script>>,
}

async fn chat(
    State(script): State<Arc<Mutex<Script>>>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    Json(body): Json<Value>,
) -> Response {
    let is_agent = body
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let answer = {
        let mut s = script.lock().unwrap();
        s.requests.push(body);
        s.queries.push(uri.query().map(str::to_string));
        s.traceparents.push(
            headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        );
        s.authorizations.push(
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        );
        if is_agent {
            s.agent.pop_front()
        } else {
            s.reflection.pop_front()
        }
    };
    let Some(answer) = answer else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "fake model: nothing scripted for this request",
        )
            .into_response();
    };
    if let Some(gate) = &answer.hold {
        let _ = gate.acquire().await;
    }
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    (
        StatusCode::from_u16(answer.status).unwrap(),
        Json(answer.body),
    )
        .into_response()
}

impl FakeLlm {
    pub async fn start() -> FakeLlm {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeLlm { addr, script }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn agent(&self, answer: Answer) -> &Self {
        self.script.lock().unwrap().agent.push_back(answer);
        self
    }

    pub fn reflection(&self, answer: Answer) -> &Self {
        self.script.lock().unwrap().reflection.push_back(answer);
        self
    }

    pub fn requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().requests.clone()
    }

    /// The Authorization header of every request, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().authorizations.clone()
    }

    /// The query string of every request (all on `/v1/chat/completions`), in order.
    pub fn queries(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().queries.clone()
    }

    /// The `traceparent` header of every request, in order.
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().traceparents.clone()
    }

    pub fn agent_requests(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r.get("tools")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
            })
            .collect()
    }
}

/// A completion whose assistant message calls `calls` (name, arguments).
pub fn tool_calls(calls: &[(&str, Value)], tokens: u64) -> Answer {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({ "id": format!("call_{i}_{name}"), "type": "function",
                    "function": { "name": name, "arguments": args.to_string() } })
        })
        .collect();
    Answer::ok(json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake-model-0613",
        "choices": [{ "index": 0, "finish_reason": "tool_calls",
            "message": { "role": "assistant", "content": null, "tool_calls": calls } }],
        "usage": { "prompt_tokens": tokens / 2, "completion_tokens": tokens - tokens / 2, "total_tokens": tokens }
    }))
}

/// A completion with plain text.
pub fn text(content: &str, tokens: u64) -> Answer {
    Answer::ok(json!({
        "choices": [{ "index": 0, "finish_reason": "stop",
            "message": { "role": "assistant", "content": content } }],
        "usage": { "prompt_tokens": tokens / 2, "completion_tokens": tokens - tokens / 2, "total_tokens": tokens }
    }))
}

/// A reflection answer.
pub fn assessment(goal: &str, progress: &str, percent: f64, looped: bool, rec: &str) -> Answer {
    let content = json!({
        "goalAchieved": goal, "progress": progress, "percentComplete": percent,
        "loopDetected": looped, "recommendation": rec,
        "reasoning": format!("scripted: {goal}/{progress}"), "nextSteps": ["keep going"],
        "coherence": 0.9, "uncertainty": 0.1
    });
    text(&format!("```json\n{content}\n```"), 50)
}
