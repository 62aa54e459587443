//! Conformance of the exported telemetry to the OpenTelemetry semantic
//! conventions, decoded from the OTLP/HTTP protobuf a real exporter sends:
//! a model-backed session (model calls, tool calls, a pause for the user
//! and a resume) and a worker session (a worker step continuing the
//! step's trace) run against a fake collector; every span is checked
//! against the table of its convention (each attribute's name, type and
//! requirement level), and so are the GenAI client metrics.
//!
//! The tables are taken from the semantic conventions repository
//! (github.com/open-telemetry/semantic-conventions), tag v1.37.0:
//! - `invoke_agent`: docs/gen-ai/gen-ai-agent-spans.md, "Invoke agent span"
//!   (span kind CLIENT there; v1.39.0 allows INTERNAL "on spans
//!   representing invocation of agents running in the same process",
//!   which Warden's session loop is);
//! - `chat`: docs/gen-ai/gen-ai-spans.md, "Inference";
//! - `execute_tool`: docs/gen-ai/gen-ai-spans.md, "Execute tool span", with
//!   the opt-in `gen_ai.tool.call.arguments` / `.result` v1.38.0 added;
//! - HTTP server spans: docs/http/http-spans.md, "HTTP server span";
//! - metrics: docs/gen-ai/gen-ai-metrics.md, `gen_ai.client.token.usage`
//!   and `gen_ai.client.operation.duration`.
//!
//! An attribute outside its table is refused unless it is Warden's own
//! (`warden.*`): that is what catches the `tracing` bridge's leftovers
//! (`thread.id`, `target`, `code.*`), the deprecated `gen_ai.system` and
//! non-standard names (`method`, `path`).

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::fake_llm::{FakeLlm, tool_calls};
use common::{ADMIN_TOKEN, Warden, client_with_key, eventually};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};
use prost::Message;
use reqwest::StatusCode as Http;
use serde_json::{Value, json};

/// What the fake collector was sent.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    metrics: Vec<Metric>,
}

type Shared = Arc<Mutex<Received>>;

async fn traces(State(got): State<Shared>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace protobuf body");
    let mut got = got.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            got.spans.extend(scope.spans);
        }
    }
    Vec::new()
}

async fn metrics(State(got): State<Shared>, body: Bytes) -> Vec<u8> {
    let request = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics protobuf body");
    let mut got = got.lock().unwrap();
    for resource in request.resource_metrics {
        for scope in resource.scope_metrics {
            got.metrics.extend(scope.metrics);
        }
    }
    Vec::new()
}

/// A fake OTLP/HTTP collector on 127.0.0.1: `/v1/traces` and `/v1/metrics`.
async fn collector() -> (String, Shared) {
    let got: Shared = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), got)
}

// ---------------------------------------------------------------------------
// The conventions' tables.

/// An attribute's type in the conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Str,
    Int,
    Double,
    StrArray,
    /// `any`: structured, or (on spans) a JSON string.
    Any,
}

/// When a conditionally required attribute is required, as it applies to
/// what Warden knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// The condition always holds where Warden makes the span ("if
    /// available" of something Warden always has).
    Always,
    /// The operation ended in an error (span status ERROR).
    Error,
    /// `server.address` is set.
    ServerAddress,
    /// The span's `gen_ai.agent.name` is `llm` (the agent is a model
    /// Warden calls, so the request's model is known).
    ModelAgent,
    /// The request matched a route (the answer is not 404 or 405).
    RouteMatched,
    /// A query string was received (`url.query`).
    Query,
    /// The condition never holds in Warden (no seed, one choice, no
    /// output type or data source requested, a known method).
    Never,
}

/// An attribute's requirement level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Required,
    Conditionally(When),
    Recommended,
    OptIn,
}

use Level::{Conditionally, OptIn, Recommended, Required};
use Type::{Double, Int, Str, StrArray};

/// One row of a convention's table.
type Row = (&'static str, Type, Level);

/// gen-ai-agent-spans.md v1.37.0, "Invoke agent span".
const INVOKE_AGENT: &[Row] = &[
    ("gen_ai.operation.name", Str, Required),
    ("gen_ai.provider.name", Str, Required),
    ("error.type", Str, Conditionally(When::Error)),
    ("gen_ai.agent.description", Str, Conditionally(When::Never)),
    ("gen_ai.agent.id", Str, Conditionally(When::Always)),
    ("gen_ai.agent.name", Str, Conditionally(When::Always)),
    ("gen_ai.conversation.id", Str, Conditionally(When::Always)),
    ("gen_ai.data_source.id", Str, Conditionally(When::Never)),
    ("gen_ai.output.type", Str, Conditionally(When::Never)),
    (
        "gen_ai.request.choice.count",
        Int,
        Conditionally(When::Never),
    ),
    ("gen_ai.request.model", Str, Conditionally(When::ModelAgent)),
    ("gen_ai.request.seed", Int, Conditionally(When::Never)),
    ("server.port", Int, Conditionally(When::ServerAddress)),
    ("gen_ai.request.frequency_penalty", Double, Recommended),
    ("gen_ai.request.max_tokens", Int, Recommended),
    ("gen_ai.request.presence_penalty", Double, Recommended),
    ("gen_ai.request.stop_sequences", StrArray, Recommended),
    ("gen_ai.request.temperature", Double, Recommended),
    ("gen_ai.request.top_p", Double, Recommended),
    ("gen_ai.response.finish_reasons", StrArray, Recommended),
    ("gen_ai.response.id", Str, Recommended),
    ("gen_ai.response.model", Str, Recommended),
    ("gen_ai.usage.input_tokens", Int, Recommended),
    ("gen_ai.usage.output_tokens", Int, Recommended),
    ("server.address", Str, Recommended),
    ("gen_ai.input.messages", Type::Any, OptIn),
    ("gen_ai.output.messages", Type::Any, OptIn),
    ("gen_ai.system_instructions", Type::Any, OptIn),
];

/// gen-ai-spans.md v1.37.0, "Inference" (the `chat` operation).
const CHAT: &[Row] = &[
    ("gen_ai.operation.name", Str, Required),
    ("gen_ai.provider.name", Str, Required),
    ("error.type", Str, Conditionally(When::Error)),
    // "when available": the session id is on the run's invoke_agent span;
    // the model client below it serves reflections too.
    ("gen_ai.conversation.id", Str, Conditionally(When::Never)),
    ("gen_ai.output.type", Str, Conditionally(When::Never)),
    (
        "gen_ai.request.choice.count",
        Int,
        Conditionally(When::Never),
    ),
    ("gen_ai.request.model", Str, Conditionally(When::Always)),
    ("gen_ai.request.seed", Int, Conditionally(When::Never)),
    ("server.port", Int, Conditionally(When::ServerAddress)),
    ("gen_ai.request.frequency_penalty", Double, Recommended),
    ("gen_ai.request.max_tokens", Int, Recommended),
    ("gen_ai.request.presence_penalty", Double, Recommended),
    ("gen_ai.request.stop_sequences", StrArray, Recommended),
    ("gen_ai.request.temperature", Double, Recommended),
    ("gen_ai.request.top_k", Double, Recommended),
    ("gen_ai.request.top_p", Double, Recommended),
    ("gen_ai.response.finish_reasons", StrArray, Recommended),
    ("gen_ai.response.id", Str, Recommended),
    ("gen_ai.response.model", Str, Recommended),
    ("gen_ai.usage.input_tokens", Int, Recommended),
    ("gen_ai.usage.output_tokens", Int, Recommended),
    ("server.address", Str, Recommended),
    ("gen_ai.input.messages", Type::Any, OptIn),
    ("gen_ai.output.messages", Type::Any, OptIn),
    ("gen_ai.system_instructions", Type::Any, OptIn),
];

/// gen-ai-spans.md v1.37.0, "Execute tool span" (+ v1.38.0's opt-ins).
const EXECUTE_TOOL: &[Row] = &[
    ("gen_ai.operation.name", Str, Required),
    ("error.type", Str, Conditionally(When::Error)),
    ("gen_ai.tool.call.id", Str, Recommended),
    ("gen_ai.tool.description", Str, Recommended),
    ("gen_ai.tool.name", Str, Recommended),
    ("gen_ai.tool.type", Str, Recommended),
    ("gen_ai.tool.call.arguments", Type::Any, OptIn),
    ("gen_ai.tool.call.result", Type::Any, OptIn),
];

/// http-spans.md v1.37.0, "HTTP server span" (the opt-in header
/// attributes, `http.request.header.<key>` and the response's, are
/// matched by prefix).
const HTTP_SERVER: &[Row] = &[
    ("http.request.method", Str, Required),
    ("url.path", Str, Required),
    ("url.scheme", Str, Required),
    ("error.type", Str, Conditionally(When::Error)),
    (
        "http.request.method_original",
        Str,
        Conditionally(When::Never),
    ),
    (
        "http.response.status_code",
        Int,
        Conditionally(When::Always),
    ),
    ("http.route", Str, Conditionally(When::RouteMatched)),
    ("network.protocol.name", Str, Conditionally(When::Never)),
    ("server.port", Int, Conditionally(When::ServerAddress)),
    ("url.query", Str, Conditionally(When::Query)),
    ("client.address", Str, Recommended),
    ("network.peer.address", Str, Recommended),
    ("network.peer.port", Int, Recommended),
    ("network.protocol.version", Str, Recommended),
    ("server.address", Str, Recommended),
    ("user_agent.original", Str, Recommended),
    ("client.port", Int, OptIn),
    ("http.request.body.size", Int, OptIn),
    ("http.request.size", Int, OptIn),
    ("http.response.body.size", Int, OptIn),
    ("http.response.size", Int, OptIn),
    ("network.local.address", Str, OptIn),
    ("network.local.port", Int, OptIn),
    ("network.transport", Str, OptIn),
    ("user_agent.synthetic.type", Str, OptIn),
];

/// Warden's own iteration span: no convention, its one attribute an integer.
const ITERATION: &[Row] = &[("warden.iteration.number", Int, Required)];

/// gen-ai-metrics.md v1.37.0, `gen_ai.client.token.usage`.
const TOKEN_USAGE: &[Row] = &[
    ("gen_ai.operation.name", Str, Required),
    ("gen_ai.provider.name", Str, Required),
    ("gen_ai.token.type", Str, Required),
    ("gen_ai.request.model", Str, Conditionally(When::Always)),
    ("server.port", Int, Conditionally(When::ServerAddress)),
    ("gen_ai.response.model", Str, Recommended),
    ("server.address", Str, Recommended),
];

/// gen-ai-metrics.md v1.37.0, `gen_ai.client.operation.duration`.
const OPERATION_DURATION: &[Row] = &[
    ("gen_ai.operation.name", Str, Required),
    ("gen_ai.provider.name", Str, Required),
    ("error.type", Str, Conditionally(When::Error)),
    ("gen_ai.request.model", Str, Conditionally(When::Always)),
    ("server.port", Int, Conditionally(When::ServerAddress)),
    ("gen_ai.response.model", Str, Recommended),
    ("server.address", Str, Recommended),
];

/// A span's convention: its table, the kinds it may have, and how its name is made.
struct Convention {
    what: &'static str,
    table: &'static [Row],
    kinds: &'static [SpanKind],
    name: fn(&Span) -> String,
}

/// The convention `span` falls under, by its operation (or kind).
fn convention_of(span: &Span) -> Convention {
    let operation = text(span, "gen_ai.operation.name");
    match operation.as_deref() {
        Some("invoke_agent") => Convention {
            what: "invoke_agent",
            table: INVOKE_AGENT,
            kinds: &[SpanKind::Client, SpanKind::Internal],
            name: |s| match text(s, "gen_ai.agent.name") {
                Some(name) => format!("invoke_agent {name}"),
                None => "invoke_agent".into(),
            },
        },
        Some("chat") => Convention {
            what: "chat",
            table: CHAT,
            kinds: &[SpanKind::Client],
            name: |s| {
                format!(
                    "chat {}",
                    text(s, "gen_ai.request.model").unwrap_or_default()
                )
            },
        },
        Some("execute_tool") => Convention {
            what: "execute_tool",
            table: EXECUTE_TOOL,
            kinds: &[SpanKind::Internal],
            name: |s| {
                format!(
                    "execute_tool {}",
                    text(s, "gen_ai.tool.name").unwrap_or_default()
                )
            },
        },
        Some(other) => panic!("a GenAI operation Warden does not make: {other}"),
        None if span.kind == SpanKind::Server as i32 => Convention {
            what: "HTTP server",
            table: HTTP_SERVER,
            kinds: &[SpanKind::Server],
            name: |s| {
                let method = text(s, "http.request.method").unwrap_or_default();
                match text(s, "http.route") {
                    Some(route) => format!("{method} {route}"),
                    None => method,
                }
            },
        },
        None if span.name == "warden.iteration" => Convention {
            what: "warden.iteration",
            table: ITERATION,
            kinds: &[SpanKind::Internal],
            name: |_| "warden.iteration".into(),
        },
        None => panic!(
            "a span of no known kind: {} {:?}",
            span.name,
            keys(&span.attributes)
        ),
    }
}

// ---------------------------------------------------------------------------
// Checking.

fn value<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

fn text(span: &Span, key: &str) -> Option<String> {
    match value(&span.attributes, key)? {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match value(&span.attributes, key)? {
        Any::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn keys(attributes: &[KeyValue]) -> Vec<&str> {
    attributes.iter().map(|kv| kv.key.as_str()).collect()
}

fn type_of(value: &Any) -> &'static str {
    match value {
        Any::StringValue(_) => "string",
        Any::IntValue(_) => "int",
        Any::DoubleValue(_) => "double",
        Any::BoolValue(_) => "boolean",
        Any::ArrayValue(_) => "array",
        Any::KvlistValue(_) => "map",
        Any::BytesValue(_) => "bytes",
        _ => "another type",
    }
}

fn has_type(value: &Any, ty: Type) -> bool {
    match ty {
        Type::Str => matches!(value, Any::StringValue(_)),
        Type::Int => matches!(value, Any::IntValue(_)),
        Type::Double => matches!(value, Any::DoubleValue(_)),
        Type::StrArray => match value {
            Any::ArrayValue(a) => a
                .values
                .iter()
                .all(|v| matches!(v.value, Some(Any::StringValue(_)))),
            _ => false,
        },
        Type::Any => true,
    }
}

/// Every breach of `table` by `attributes`: an attribute outside it (and
/// not Warden's own), of the wrong type, or required and missing.
fn breaches(
    what: &str,
    attributes: &[KeyValue],
    table: &[Row],
    holds: impl Fn(When) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for kv in attributes {
        if !seen.insert(kv.key.as_str()) {
            out.push(format!("{what}: `{}` recorded twice", kv.key));
        }
        let Some(v) = kv.value.as_ref().and_then(|v| v.value.as_ref()) else {
            out.push(format!("{what}: `{}` has no value", kv.key));
            continue;
        };
        let row = table.iter().find(|(name, ..)| *name == kv.key);
        match row {
            Some((name, ty, _)) if !has_type(v, *ty) => out.push(format!(
                "{what}: `{name}` is {} where the conventions say {ty:?}",
                type_of(v)
            )),
            Some(_) => {}
            None if kv.key.starts_with("warden.") => {}
            None if kv.key.starts_with("http.request.header.")
                || kv.key.starts_with("http.response.header.") =>
            {
                if !table
                    .iter()
                    .any(|(name, ..)| *name == "http.request.method")
                {
                    out.push(format!("{what}: `{}` is not in its conventions", kv.key));
                }
            }
            None => out.push(format!("{what}: `{}` is not in its conventions", kv.key)),
        }
    }
    for (name, _, level) in table {
        let required = match level {
            Level::Required => true,
            Level::Conditionally(when) => holds(*when),
            Level::Recommended | Level::OptIn => false,
        };
        if required && !seen.contains(name) {
            out.push(format!("{what}: `{name}` ({level:?}) is missing"));
        }
    }
    out
}

/// Every breach of its convention by `span`: its attributes, kind and name.
fn span_breaches(span: &Span) -> Vec<String> {
    let convention = convention_of(span);
    let what = format!("{} span `{}`", convention.what, span.name);
    let error = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    let status = int(span, "http.response.status_code");
    let holds = |when: When| match when {
        When::Always => true,
        When::Error => error,
        When::ServerAddress => text(span, "server.address").is_some(),
        When::ModelAgent => text(span, "gen_ai.agent.name").as_deref() == Some("llm"),
        When::RouteMatched => !matches!(status, Some(404 | 405)),
        // No request of this test sends a query string.
        When::Query => false,
        When::Never => false,
    };
    let mut out = breaches(&what, &span.attributes, convention.table, holds);
    if !convention.kinds.iter().any(|k| *k as i32 == span.kind) {
        out.push(format!(
            "{what}: kind {} not among {:?}",
            span.kind, convention.kinds
        ));
    }
    let name = (convention.name)(span);
    if span.name != name {
        out.push(format!("{what}: named `{}`, not `{name}`", span.name));
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` contains a UUID (a raw id where a template belongs).
fn has_uuid(s: &str) -> bool {
    s.split(['/', '?', '=', '&'])
        .any(|part| uuid::Uuid::parse_str(part).is_ok())
}

// ---------------------------------------------------------------------------
// The run.

/// The trace context the API's caller sends with the create.
const CALLER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// A child of `traceparent` (same trace and flags, a new span id), as the
/// Python worker derives the header of its calls from `context.traceparent`.
fn child_of(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    let span = format!("{:016x}", rand_span_id(parts[2]));
    (format!("00-{}-{span}-{}", parts[1], parts[3]), span)
}

fn rand_span_id(not: &str) -> u64 {
    loop {
        let id = uuid::Uuid::new_v4().as_u64_pair().0;
        if id != 0 && format!("{id:016x}") != not {
            return id;
        }
    }
}

async fn wait_status(client: &reqwest::Client, url: &str, want: &str) -> Value {
    let seen = Arc::new(Mutex::new(Value::Null));
    eventually(Duration::from_secs(60), &format!("status {want}"), || {
        let (client, url, seen) = (client.clone(), url.to_string(), seen.clone());
        let want = want.to_string();
        async move {
            let Ok(res) = client.get(url).send().await else {
                return false;
            };
            let doc: Value = res.json().await.unwrap_or_default();
            let done = doc["status"] == want.as_str();
            *seen.lock().unwrap() = doc;
            done
        }
    })
    .await;
    seen.lock().unwrap().clone()
}

#[tokio::test]
async fn every_exported_span_and_metric_follows_its_conventions() {
    let db = common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    // Run 1: a file written, then a question for the user (the run pauses).
    // Run 2, after the resume: the task completed.
    fake.agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "README.md", "content": "# Warden\n" }),
        )],
        120,
    ))
    .agent(tool_calls(
        &[(
            "ask_question",
            json!({ "question": "Which language should the README use?" }),
        )],
        60,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "README.md written", "deliverables": ["README.md"] }),
        )],
        80,
    ));
    let (endpoint, got) = collector().await;
    let base_url = fake.base_url();
    let process = Warden::on(&db.pool)
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            ("RUST_LOG", "info"),
            ("WARDEN_LLM_BASE_URL", base_url.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
        ])
        .serve()
        .await;
    let base = process.base.clone();
    let admin = client_with_key(ADMIN_TOKEN);

    // The model-backed session, created under the caller's trace.
    let res = admin
        .post(format!("{base}/api/autonomous"))
        .header("traceparent", CALLER)
        .json(
            &json!({ "goal": "Create README.md with a project description",
                       "mode": "fixed", "executor": { "kind": "llm" } }),
        )
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{base}/api/autonomous/{id}");
    let paused = wait_status(&admin, &url, "paused").await;
    assert_eq!(paused["reason"], "ask_user", "{paused}");
    let res = admin
        .post(format!("{url}/resume"))
        .json(&json!({ "guidance": "English" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), Http::OK);
    wait_status(&admin, &url, "completed").await;

    // The worker session: one step claimed, heartbeated and completed
    // under a child of the step's trace context.
    let res = admin
        .post(format!("{base}/api/keys"))
        .json(
            &json!({ "tenant": warden::auth::DEFAULT_TENANT, "role": "worker",
                       "queues": ["conformance"] }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), Http::CREATED);
    let key: Value = res.json().await.unwrap();
    let worker = client_with_key(key["secret"].as_str().unwrap());
    let res = admin
        .post(format!("{base}/api/autonomous"))
        .json(
            &json!({ "goal": "Create README.md with a project description",
                       "mode": "fixed",
                       "executor": { "kind": "worker", "queue": "conformance" } }),
        )
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let worker_session = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let res = worker
        .post(format!("{base}/api/workers/claim"))
        .json(&json!({ "wait_ms": 20_000, "worker": "conformance-worker" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), Http::OK);
    let task: Value = res.json().await.unwrap();
    let step = task["context"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("a traceparent in the task's context: {task}"))
        .to_string();
    let (continued, worker_span) = child_of(&step);
    let task_url = format!(
        "{base}/api/workers/tasks/{}",
        task["task_id"].as_str().unwrap()
    );
    let lease = task["lease_token"].clone();
    let res = worker
        .post(format!("{task_url}/heartbeat"))
        .header("traceparent", &continued)
        .json(&json!({ "lease_token": lease, "progress": "writing" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), Http::OK);
    let res = worker
        .post(format!("{task_url}/complete"))
        .header("traceparent", &continued)
        .json(&json!({ "lease_token": lease, "outcome": {
            "action": "report", "tokens": 10, "output": "README.md written",
            "signal": "done", "reason": "README.md written" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), Http::OK);
    wait_status(
        &admin,
        &format!("{base}/api/autonomous/{worker_session}"),
        "completed",
    )
    .await;

    // Everything at the collector: both sessions' last runs ended, the
    // worker's completion and both histograms.
    eventually(Duration::from_secs(30), "the spans and metrics", || {
        let got = got.clone();
        let (id, worker_session) = (id.clone(), worker_session.clone());
        async move {
            let got = got.lock().unwrap();
            let ended = |session: &str| {
                got.spans.iter().any(|s| {
                    text(s, "gen_ai.agent.id").as_deref() == Some(session)
                        && text(s, "warden.session.exit.status").as_deref() == Some("completed")
                })
            };
            let names: BTreeSet<&str> = got.metrics.iter().map(|m| m.name.as_str()).collect();
            let completed = got
                .spans
                .iter()
                .any(|s| s.name == "POST /api/workers/tasks/{task_id}/complete");
            ended(&id)
                && ended(&worker_session)
                && completed
                && names.contains("gen_ai.client.token.usage")
                && names.contains("gen_ai.client.operation.duration")
        }
    })
    .await;
    let (spans, metrics) = {
        let got = got.lock().unwrap();
        (got.spans.clone(), got.metrics.clone())
    };

    // Every span against its convention.
    let mut all = Vec::new();
    for span in &spans {
        all.extend(span_breaches(span));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));

    // A span of every kind.
    let of = |what: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| convention_of(s).what == what)
            .collect()
    };
    for what in [
        "invoke_agent",
        "warden.iteration",
        "chat",
        "execute_tool",
        "HTTP server",
    ] {
        assert!(!of(what).is_empty(), "no {what} span among {}", spans.len());
    }
    check_runs(&spans, &id, &worker_session);
    check_chats(&of("chat"), &fake);
    check_server_spans(&of("HTTP server"), &spans, &worker_span, &step);
    check_metrics(&metrics);
}

/// The runs: named by their agent, their exit as status and reason,
/// linked to the requests that started them and to the run before, one
/// iteration span per iteration.
fn check_runs(spans: &[Span], id: &str, worker_session: &str) {
    let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    let mut runs: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.name.starts_with("invoke_agent") && text(s, "gen_ai.agent.id").as_deref() == Some(id)
        })
        .collect();
    runs.sort_by_key(|s| s.start_time_unix_nano);
    let [first, .., last] = runs.as_slice() else {
        panic!("two runs of {id}: {}", runs.len());
    };
    for run in &runs {
        assert_eq!(run.name, "invoke_agent llm");
        assert_eq!(text(run, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(
            text(run, "gen_ai.request.model").as_deref(),
            Some("fake-model")
        );
        assert!(run.parent_span_id.is_empty(), "a run is a trace of its own");
    }
    assert_eq!(
        (
            text(first, "warden.session.exit.status").as_deref(),
            text(first, "warden.session.exit.reason").as_deref()
        ),
        (Some("paused"), Some("ask_user"))
    );
    assert_eq!(
        (
            text(last, "warden.session.exit.status").as_deref(),
            text(last, "warden.session.exit.reason").as_deref()
        ),
        (Some("completed"), Some("goal_achieved"))
    );

    // The first run links to the create request's server span, in the
    // caller's trace; the last to the resume's and to the run before it.
    let create = first
        .links
        .iter()
        .find(|l| hex(&l.trace_id) == "0af7651916cd43dd8448eb211c80319c")
        .expect("a link into the caller's trace");
    let create_span = by_id
        .get(create.span_id.as_slice())
        .expect("the create request's span is exported");
    assert_eq!(create_span.name, "POST /api/autonomous");
    let before = runs[runs.len() - 2];
    assert_eq!(last.links.len(), 2, "the run before and the resume request");
    assert!(last.links.iter().any(|l| l.span_id == before.span_id));
    // The resume request's server span.
    let resume = last
        .links
        .iter()
        .find(|l| l.span_id != before.span_id && l.trace_id != before.trace_id)
        .expect("a link to the resume request");
    let resume_span = by_id
        .get(resume.span_id.as_slice())
        .expect("the resume request's span is exported");
    assert_eq!(resume_span.name, "POST /api/autonomous/{id}/resume");
    assert_eq!(
        text(last, "warden.previous_trace_id"),
        Some(hex(&before.trace_id))
    );

    // Exactly one iteration span per iteration (two in the first run, one
    // after the resume), each under its run.
    let mut numbers: Vec<i64> = spans
        .iter()
        .filter(|s| s.name == "warden.iteration")
        .filter(|s| {
            let run = by_id
                .get(s.parent_span_id.as_slice())
                .expect("an iteration's run");
            text(run, "gen_ai.agent.id").as_deref() == Some(id)
        })
        .map(|s| int(s, "warden.iteration.number").expect("its number"))
        .collect();
    numbers.sort_unstable();
    assert_eq!(numbers, vec![1, 2, 3], "one span per iteration");

    let worker_runs: Vec<&Span> = spans
        .iter()
        .filter(|s| text(s, "gen_ai.agent.id").as_deref() == Some(worker_session))
        .collect();
    assert!(worker_runs.iter().all(|s| s.name == "invoke_agent worker"
        && text(s, "gen_ai.provider.name").as_deref() == Some("warden")));
}

/// The model calls: integer usage as the model reported it, the response's
/// id and model, the server, no deprecated `gen_ai.system`.
fn check_chats(chats: &[&Span], fake: &FakeLlm) {
    let mut usage: Vec<i64> = chats
        .iter()
        .map(|c| {
            int(c, "gen_ai.usage.input_tokens").expect("integer input tokens")
                + int(c, "gen_ai.usage.output_tokens").expect("integer output tokens")
        })
        .collect();
    usage.sort_unstable();
    assert_eq!(usage, vec![60, 80, 120]);
    let port = url::Url::parse(&fake.base_url()).unwrap().port().unwrap();
    for chat in chats {
        assert_eq!(
            text(chat, "gen_ai.response.id").as_deref(),
            Some("chatcmpl-fake")
        );
        assert_eq!(
            text(chat, "gen_ai.response.model").as_deref(),
            Some("fake-model-0613")
        );
        assert_eq!(text(chat, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(int(chat, "server.port"), Some(i64::from(port)));
        assert!(int(chat, "gen_ai.request.max_tokens").is_some());
        assert!(int(chat, "warden.attempts").is_some());
        assert_eq!(text(chat, "gen_ai.system"), None);
    }
}

/// The API's server spans: route templates, never ids; the worker's calls
/// in the step's trace under the worker's span.
fn check_server_spans(servers: &[&Span], spans: &[Span], worker_span: &str, step: &str) {
    for span in servers {
        let route = text(span, "http.route").unwrap_or_default();
        assert!(!has_uuid(&route), "a raw id in http.route: {route}");
        assert!(!has_uuid(&span.name), "a raw id in the name: {}", span.name);
        assert!(int(span, "http.response.status_code").is_some());
    }
    let step_span = step.split('-').nth(2).unwrap();
    assert!(
        spans
            .iter()
            .any(|s| s.name == "warden.iteration" && hex(&s.span_id) == step_span),
        "the step's traceparent names its iteration span"
    );
    // Every request has its server span, the ones after the first on a
    // keep-alive connection too (resume, keys, heartbeat, complete).
    let named = |name: &str| -> Vec<&Span> {
        servers
            .iter()
            .copied()
            .filter(|s| s.name == name || s.name == format!("{name}/"))
            .collect()
    };
    for name in [
        "POST /api/autonomous",
        "POST /api/autonomous/{id}/resume",
        "POST /api/keys",
        "POST /api/workers/claim",
        "POST /api/workers/tasks/{task_id}/heartbeat",
        "POST /api/workers/tasks/{task_id}/complete",
    ] {
        assert!(
            !named(name).is_empty(),
            "no server span {name} among {:?}",
            servers.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
    }
    // The worker's calls continue the step's trace, under the worker's span.
    let trace = step.split('-').nth(1).unwrap();
    for name in [
        "POST /api/workers/tasks/{task_id}/heartbeat",
        "POST /api/workers/tasks/{task_id}/complete",
    ] {
        for span in named(name) {
            assert_eq!(hex(&span.trace_id), trace, "{name} in the step's trace");
            assert_eq!(
                hex(&span.parent_span_id),
                worker_span,
                "{name} under the worker's span"
            );
        }
    }
}

/// The GenAI client histograms: unit, attributes and both token types.
fn check_metrics(metrics: &[Metric]) {
    let mut token_types = BTreeSet::new();
    let mut problems = Vec::new();
    for (name, unit, table) in [
        ("gen_ai.client.token.usage", "{token}", TOKEN_USAGE),
        ("gen_ai.client.operation.duration", "s", OPERATION_DURATION),
    ] {
        let exported: Vec<&Metric> = metrics.iter().filter(|m| m.name == name).collect();
        assert!(!exported.is_empty(), "{name} exported");
        for metric in exported {
            assert_eq!(metric.unit, unit, "{name}'s unit");
            let Some(metric::Data::Histogram(histogram)) = &metric.data else {
                panic!("{name} is a histogram: {:?}", metric.data);
            };
            assert!(!histogram.data_points.is_empty());
            for point in &histogram.data_points {
                let error = value(&point.attributes, "error.type").is_some();
                let server = value(&point.attributes, "server.address").is_some();
                problems.extend(breaches(
                    name,
                    &point.attributes,
                    table,
                    |when| match when {
                        When::Always => true,
                        When::Error => error,
                        When::ServerAddress => server,
                        _ => false,
                    },
                ));
                if let Some(Any::StringValue(t)) = value(&point.attributes, "gen_ai.token.type") {
                    token_types.insert(t.clone());
                }
                match value(&point.attributes, "gen_ai.request.model") {
                    Some(Any::StringValue(m)) => assert_eq!(m, "fake-model"),
                    other => panic!("{name}: gen_ai.request.model {other:?}"),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        token_types,
        BTreeSet::from(["input".to_string(), "output".to_string()])
    );
}
