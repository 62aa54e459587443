//! OpenTelemetry traces, received by a real OTLP/HTTP receiver in the
//! test: the span tree of a model-backed session (invoke_agent ->
//! iterations -> chat / execute_tool), its GenAI attributes, the gate's
//! span events, the API's server spans, no content by default, and the
//! `traceparent` the model server receives.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::fake_llm::{FakeLlm, tool_calls};
use common::{ADMIN_TOKEN, Warden, client_with_key, eventually};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

/// An OTLP/HTTP trace receiver on 127.0.0.1 keeping every span it is sent.
#[derive(Clone)]
struct Receiver {
    addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut kept = spans.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            kept.extend(scope.spans);
        }
    }
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

impl Receiver {
    async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { addr, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// A span's attribute as text (numbers and booleans written out).
fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        Any::BoolValue(b) => b.to_string(),
        Any::ArrayValue(a) => a
            .values
            .iter()
            .filter_map(|v| match &v.value {
                Some(Any::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    })
}

/// The trace context a caller of the API sends.
const CALLER_TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A traced Warden (exporting to a fresh receiver, with `env` on top)
/// that has run a session to completion: two model calls, a file written
/// and the task completed.
async fn traced_session(env: &[(&str, &str)]) -> Traced {
    let db = common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "README.md", "content": "# Warden\nSupervises agents.\n" }),
        )],
        120,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "README.md written", "deliverables": ["README.md"] }),
        )],
        80,
    ));
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let base_url = fake.base_url();
    let process = Warden::on(&db.pool)
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "warden-under-test"),
            // The default log level, whose log spans (session, model call)
            // sit between the traced ones and must not break the tree.
            ("RUST_LOG", "info"),
            ("WARDEN_LLM_BASE_URL", base_url.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
        ])
        .envs(env)
        .serve()
        .await;
    let client = client_with_key(ADMIN_TOKEN);
    let base = process.base.clone();
    let res = client
        .post(format!("{base}/api/autonomous"))
        // The caller's own trace, which the server span continues.
        .header("traceparent", CALLER_TRACEPARENT)
        .json(
            &json!({ "goal": "Create README.md with a project description",
                        "mode": "fixed", "executor": { "kind": "llm" } }),
        )
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let created: Value = res.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();

    let status = Arc::new(Mutex::new(Value::Null));
    eventually(Duration::from_secs(60), "the session to complete", || {
        let (client, url, status) = (
            client.clone(),
            format!("{base}/api/autonomous/{id}"),
            status.clone(),
        );
        async move {
            let Ok(res) = client.get(url).send().await else {
                return false;
            };
            let doc: Value = res.json().await.unwrap_or_default();
            let settled = doc["status"] != "running" && doc["status"] != "queued";
            *status.lock().unwrap() = doc;
            settled
        }
    })
    .await;
    let settled = status.lock().unwrap().clone();
    assert_eq!(settled["status"], "completed", "{settled}");
    Traced {
        _db: db,
        fake,
        receiver,
        process,
        id,
    }
}

/// What [`traced_session`] leaves running.
struct Traced {
    _db: common::TestDb,
    fake: FakeLlm,
    receiver: Receiver,
    process: common::ServiceProcess,
    id: String,
}

#[tokio::test]
async fn a_session_exports_the_genai_span_tree_without_content() {
    let Traced {
        fake,
        receiver,
        id,
        _db,
        process: _process,
    } = traced_session(&[]).await;

    // The run's spans arrive within a few batch delays of its end.
    eventually(
        Duration::from_secs(30),
        "the run's spans at the receiver",
        || {
            let spans = receiver.spans();
            async move {
                // The last run ends last: its span closes the tree.
                let ended = spans.iter().any(|s| {
                    s.name == "invoke_agent llm"
                        && attr(s, "warden.session.exit.status").as_deref() == Some("completed")
                });
                let tools = spans
                    .iter()
                    .filter(|s| s.name.starts_with("execute_tool "))
                    .count();
                let chats = spans.iter().filter(|s| s.name == "chat fake-model").count();
                ended && tools >= 2 && chats >= 2
            }
        },
    )
    .await;
    let spans = receiver.spans();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let parent = |s: &Span| by_id.get(&s.parent_span_id).copied();

    // One run, or more when a loaded machine let a lease lapse and the
    // session was taken up again: each its own trace.
    let runs: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent llm")
        .collect();
    for run in &runs {
        assert_eq!(
            attr(run, "gen_ai.operation.name").as_deref(),
            Some("invoke_agent")
        );
        assert_eq!(attr(run, "gen_ai.agent.id").as_deref(), Some(id.as_str()));
        assert_eq!(
            attr(run, "gen_ai.conversation.id").as_deref(),
            Some(id.as_str())
        );
        assert!(run.parent_span_id.is_empty(), "a run is a root span");
        assert_eq!(attr(run, "gen_ai.agent.name").as_deref(), Some("llm"));
        // Linked to the create request's span, in the caller's trace.
        let (caller_trace, _) = trace_and_span(CALLER_TRACEPARENT);
        assert!(run.links.iter().any(|l| hex(&l.trace_id) == caller_trace));
    }

    // Iterations under a run, in its trace.
    let iterations: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "warden.iteration")
        .collect();
    assert!(iterations.len() >= 2, "{} iterations", iterations.len());
    for iteration in &iterations {
        let run = parent(iteration).expect("an iteration has a parent");
        assert_eq!(run.name, "invoke_agent llm");
        assert_eq!(run.trace_id, iteration.trace_id, "same trace");
    }
    // Each iteration's gate decision is a span event with its metrics.
    let gated = iterations
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| e.name == "warden.gate")
        .collect::<Vec<_>>();
    assert!(gated.len() >= 2, "{} gate events", gated.len());
    assert!(
        gated[0]
            .attributes
            .iter()
            .any(|kv| kv.key == "warden.gate.rework_ratio"),
        "{:?}",
        gated[0].attributes
    );

    // Two model calls, each under an iteration, with the GenAI attributes.
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "chat fake-model")
        .collect();
    assert_eq!(chats.len(), 2, "two model calls");
    let mut answered = Vec::new();
    for chat in &chats {
        let up = parent(chat).expect("a chat span has a parent");
        assert_eq!(up.name, "warden.iteration");
        assert_eq!(up.trace_id, chat.trace_id, "same trace");
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            attr(chat, "gen_ai.request.model").as_deref(),
            Some("fake-model")
        );
        assert_eq!(
            attr(chat, "gen_ai.provider.name").as_deref(),
            Some("openai")
        );
        assert!(attr(chat, "gen_ai.request.max_tokens").is_some());
        assert_eq!(
            attr(chat, "gen_ai.response.finish_reasons").as_deref(),
            Some("tool_calls")
        );
        let input: u64 = attr(chat, "gen_ai.usage.input_tokens")
            .unwrap()
            .parse()
            .unwrap();
        let output: u64 = attr(chat, "gen_ai.usage.output_tokens")
            .unwrap()
            .parse()
            .unwrap();
        answered.push(input + output);
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![80, 120], "usage as the model reported it");

    // The tool calls, each under the iteration of its model call.
    let tools: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("execute_tool "))
        .collect();
    let write = tools
        .iter()
        .find(|s| s.name == "execute_tool write_file")
        .expect("the write_file call");
    assert_eq!(
        attr(write, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(
        attr(write, "gen_ai.tool.name").as_deref(),
        Some("write_file")
    );
    assert_eq!(
        attr(write, "gen_ai.tool.call.id").as_deref(),
        Some("call_0_write_file")
    );
    let write_iteration = parent(write).expect("a tool span has a parent");
    assert_eq!(write_iteration.name, "warden.iteration");
    assert_eq!(write_iteration.trace_id, write.trace_id, "same trace");
    assert!(
        chats
            .iter()
            .any(|c| c.parent_span_id == write_iteration.span_id),
        "the tool call shares its iteration with the model call that asked for it"
    );
    assert!(
        tools
            .iter()
            .any(|s| s.name == "execute_tool task_completion")
    );

    // Nothing of the prompts or answers by default.
    for span in &spans {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert_eq!(attr(span, key), None, "{key} on {}", span.name);
        }
    }

    // The API's server spans.
    let created_span = spans
        .iter()
        .find(|s| {
            attr(s, "http.route").as_deref() == Some("/api/autonomous")
                && attr(s, "http.request.method").as_deref() == Some("POST")
        })
        .expect("the create request's server span");
    assert_eq!(created_span.name, "POST /api/autonomous");
    assert_eq!(
        attr(created_span, "http.route").as_deref(),
        Some("/api/autonomous")
    );
    let (caller_trace, caller_span) = trace_and_span(CALLER_TRACEPARENT);
    assert_eq!(hex(&created_span.trace_id), caller_trace);
    assert_eq!(hex(&created_span.parent_span_id), caller_span);
    assert!(
        attr(created_span, "http.response.status_code").is_some_and(|code| code.starts_with('2')),
        "{:?}",
        attr(created_span, "http.response.status_code")
    );

    // The model server was told each call's span.
    let traceparents: Vec<String> = fake.traceparents().into_iter().flatten().collect();
    for chat in &chats {
        let expected = format!("00-{}-{}-01", hex(&chat.trace_id), hex(&chat.span_id));
        assert!(
            traceparents.contains(&expected),
            "{expected} not among {traceparents:?}"
        );
    }
}

#[tokio::test]
async fn content_is_exported_when_asked_and_buffered_spans_are_flushed_at_shutdown() {
    // A batch delay far beyond the test: only the shutdown's flush sends them.
    let Traced {
        receiver,
        mut process,
        _db,
        ..
    } = traced_session(&[
        ("WARDEN_TRACE_CONTENT", "true"),
        ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
    ])
    .await;
    let pid = i32::try_from(process.pid()).expect("a pid");
    // SAFETY: sends SIGTERM to the child process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = process.exit_status(Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");

    let spans = receiver.spans();
    assert!(
        spans.iter().any(|s| s.name == "invoke_agent llm"),
        "the run's span was flushed at shutdown: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "chat fake-model")
        .collect();
    assert_eq!(chats.len(), 2);
    for chat in chats {
        let input = attr(chat, "gen_ai.input.messages").expect("the prompt");
        assert!(input.contains("Create README.md"), "{input}");
        assert!(attr(chat, "gen_ai.output.messages").is_some());
    }
    let write = spans
        .iter()
        .find(|s| s.name == "execute_tool write_file")
        .expect("the write_file call");
    assert!(
        attr(write, "gen_ai.tool.call.arguments").is_some_and(|a| a.contains("README.md")),
        "{:?}",
        attr(write, "gen_ai.tool.call.arguments")
    );
    assert!(attr(write, "gen_ai.tool.call.result").is_some());
}

/// What an external agent received: the `traceparent` header and the
/// body's `traceparent`.
type SeenSteps = Arc<Mutex<Vec<(Option<String>, Value)>>>;

async fn agent_step(
    State(seen): State<SeenSteps>,
    headers: axum::http::HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> axum::Json<Value> {
    let header = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    seen.lock().unwrap().push((header, body));
    axum::Json(json!({ "action": "report", "tokens": 5, "output": "done",
                       "signal": "done", "reason": "finished in one step" }))
}

/// A W3C traceparent's trace id and span id.
fn trace_and_span(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{traceparent}");
    assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{traceparent}");
    (parts[1].to_string(), parts[2].to_string())
}

#[tokio::test]
async fn webhook_agents_and_workers_get_the_steps_traceparent() {
    let db = common::TestDb::new().await;
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let seen: SeenSteps = Arc::new(Mutex::new(Vec::new()));
    let agent = Router::new()
        .route("/step", post(agent_step))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/step", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, agent).await.unwrap() });
    let process = Warden::on(&db.pool)
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("WARDEN_EGRESS_ALLOW", "127.0.0.1"),
        ])
        .serve()
        .await;
    let base = process.base.clone();
    let client = client_with_key(ADMIN_TOKEN);
    let create = |executor: Value| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let res = client
                .post(format!("{base}/api/autonomous"))
                .json(
                    &json!({ "goal": "Create README.md with a project description",
                                "mode": "continuous", "executor": executor }),
                )
                .send()
                .await
                .unwrap();
            assert!(res.status().is_success(), "{}", res.status());
            let doc: Value = res.json().await.unwrap();
            doc["id"].as_str().unwrap().to_string()
        }
    };

    // A webhook step: the header and the body carry the step's iteration span.
    let id = create(json!({ "kind": "webhook", "url": url })).await;
    eventually(Duration::from_secs(60), "the webhook run's spans", || {
        let spans = receiver.spans();
        let id = id.clone();
        async move {
            spans.iter().any(|s| {
                s.name == "invoke_agent webhook"
                    && attr(s, "gen_ai.agent.id").as_deref() == Some(id.as_str())
                    && attr(s, "warden.session.exit.status").as_deref() == Some("completed")
            })
        }
    })
    .await;
    let steps = seen.lock().unwrap().clone();
    let (header, body) = steps.first().expect("the agent was called");
    let header = header.as_deref().expect("a traceparent header");
    assert_eq!(body["traceparent"].as_str(), Some(header));
    let (trace, span) = trace_and_span(header);
    let spans = receiver.spans();
    let iteration = spans
        .iter()
        .find(|s| hex(&s.span_id) == span)
        .expect("the header names an exported span");
    assert_eq!(iteration.name, "warden.iteration");
    assert_eq!(hex(&iteration.trace_id), trace);

    // A worker task: its context carries the traceparent (the admin
    // token acts in the default tenant, so the worker key does too).
    let res = client
        .post(format!("{base}/api/keys"))
        .json(&json!({ "tenant": warden::auth::DEFAULT_TENANT, "role": "worker", "queues": ["traced"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::CREATED);
    let key: Value = res.json().await.unwrap();
    let worker = client_with_key(key["secret"].as_str().unwrap());
    create(json!({ "kind": "worker", "queue": "traced" })).await;
    let res = worker
        .post(format!("{base}/api/workers/claim"))
        .json(&json!({ "wait_ms": 20_000, "worker": "traced-worker" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    let task: Value = res.json().await.unwrap();
    let traceparent = task["context"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("a traceparent in the task's context: {task}"));
    trace_and_span(traceparent);
}

#[tokio::test]
async fn a_resumed_run_links_to_the_run_before_it() {
    let db = common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "ask_question",
            json!({ "question": "Which language should the README use?" }),
        )],
        40,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "ok", "deliverables": [] }),
        )],
        40,
    ));
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let base_url = fake.base_url();
    let process = Warden::on(&db.pool)
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("WARDEN_LLM_BASE_URL", base_url.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
        ])
        .serve()
        .await;
    let base = process.base.clone();
    let client = client_with_key(ADMIN_TOKEN);
    let res = client
        .post(format!("{base}/api/autonomous"))
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
    let ended_runs = |spans: &[Span]| {
        spans
            .iter()
            .filter(|s| {
                s.name == "invoke_agent llm"
                    && attr(s, "gen_ai.agent.id").as_deref() == Some(id.as_str())
                    && attr(s, "warden.session.exit.status").is_some()
            })
            .count()
    };
    eventually(Duration::from_secs(60), "the first run's span", || {
        let ended = ended_runs(&receiver.spans());
        async move { ended >= 1 }
    })
    .await;
    let res = client
        .post(format!("{base}/api/autonomous/{id}/resume"))
        .json(&json!({ "guidance": "English" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    eventually(Duration::from_secs(60), "the resumed run's span", || {
        let ended = ended_runs(&receiver.spans());
        async move { ended >= 2 }
    })
    .await;

    let mut runs: Vec<Span> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.name == "invoke_agent llm")
        .collect();
    runs.sort_by_key(|s| s.start_time_unix_nano);
    let [.., before, last] = runs.as_slice() else {
        panic!("two runs");
    };
    assert_ne!(before.trace_id, last.trace_id, "each run is its own trace");
    assert_eq!(
        attr(last, "warden.previous_trace_id"),
        Some(hex(&before.trace_id))
    );
    assert!(
        last.links
            .iter()
            .any(|l| (&l.trace_id, &l.span_id) == (&before.trace_id, &before.span_id)),
        "a link to the run before"
    );
}

#[tokio::test]
async fn the_grpc_exporter_starts_and_an_absent_collector_holds_nothing_up() {
    let db = common::TestDb::new().await;
    // Nothing listens there: exports fail in the background.
    let endpoint = format!("http://127.0.0.1:{}", common::free_port());
    let mut process = Warden::on(&db.pool)
        .envs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .serve()
        .await;
    let base = process.base.clone();
    let client = client_with_key(ADMIN_TOKEN);
    let res = client
        .post(format!("{base}/api/autonomous"))
        .json(&json!({ "goal": "Create README.md with a project description",
                        "executor": { "kind": "scripted",
                            "steps": [{ "action": "finish", "output": "<<WARDEN_GOAL_DONE: ok>>" }] } }))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(60), "the session to complete", || {
        let url = format!("{base}/api/autonomous/{id}");
        let client = client.clone();
        async move {
            let Ok(res) = client.get(url).send().await else {
                return false;
            };
            let doc: Value = res.json().await.unwrap_or_default();
            doc["status"] == "completed"
        }
    })
    .await;
    let pid = i32::try_from(process.pid()).expect("a pid");
    // SAFETY: sends SIGTERM to the child process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = process.exit_status(Duration::from_secs(60)).await;
    assert!(status.success(), "{status}: {}", process.logs());
}
