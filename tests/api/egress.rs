//! The outbound-request policy, end to end: client-chosen URLs that point
//! inside the network are refused and never reached, redirects are not
//! followed, an allow-list opens exactly what it names, and the server's
//! own model key never travels to an endpoint a client chose.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode as AxumStatus, header};
use axum::response::IntoResponse;
use axum::routing::{any, post};
use common::{TestApp, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A listener that must never be reached: it counts every connection.
struct Tripwire {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Tripwire {
    async fn start() -> Tripwire {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        Tripwire { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Serves `router` on a loopback port.
async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    port
}

/// Config with the default policy: no loopback allowed.
fn closed_config(extra: &[(&str, &str)]) -> warden::config::Config {
    let mut vars = vec![("WARDEN_EGRESS_ALLOW", "")];
    vars.extend_from_slice(extra);
    config_with(&vars)
}

fn webhook(url: &str) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "webhook", "url": url }
    })
}

fn llm(base_url: &str) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "llm", "base_url": base_url, "model": "m", "api_key": "sk-session-own" }
    })
}

#[tokio::test]
async fn internal_destinations_are_refused_and_never_reached() {
    let app = TestApp::start_with(closed_config(&[])).await;
    let trap = Tripwire::start().await;
    let port = trap.port;
    let urls = [
        format!("http://127.0.0.1:{port}/step"),
        format!("http://localhost:{port}/step"),
        format!("http://2130706433:{port}/step"),
        format!("http://0x7f000001:{port}/step"),
        format!("http://[::1]:{port}/step"),
        format!("http://[::ffff:127.0.0.1]:{port}/step"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/step".to_string(),
        "http://[fd00:ec2::254]/".to_string(),
    ];
    for url in &urls {
        for body in [webhook(url), llm(url)] {
            let (status, problem) = app.post("/api/autonomous", Some(body)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{url}: {problem}");
            let refused = crate::common::problem(&problem);
            assert_eq!(refused.code, "egress_denied", "{url}: {problem}");
            let detail = refused.detail;
            assert!(
                detail.contains("executor.url") || detail.contains("executor.base_url"),
                "{url}: the detail names the field: {detail}"
            );
        }
    }
    // Time for a stray request to land: an absence cannot be polled for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(trap.hits(), 0, "a refused destination was contacted");
}

#[tokio::test]
async fn redirects_to_internal_destinations_are_not_followed() {
    let trap = Tripwire::start().await;
    let targets = [
        format!("http://127.0.0.1:{}/secret", trap.port),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ];
    let target = Arc::new(Mutex::new(targets[0].clone()));
    let location = target.clone();
    let redirector = serve(Router::new().route(
        "/{*path}",
        any(move || {
            let to = location.lock().map(|t| t.clone()).unwrap_or_default();
            async move { (AxumStatus::SEE_OTHER, [(header::LOCATION, to)], "moved") }
        }),
    ))
    .await;
    // Only the redirector's port is allowed, not the tripwire's.
    let allow = format!("127.0.0.1:{redirector}");
    let app = TestApp::start_with(closed_config(&[("WARDEN_EGRESS_ALLOW", &allow)])).await;
    for (i, to) in targets.iter().enumerate() {
        if let Ok(mut t) = target.lock() {
            *t = to.clone();
        }
        let mut body = webhook(&format!("http://127.0.0.1:{redirector}/step"));
        body["limits"] = json!({ "max_consecutive_errors": 1 });
        let id = app.create(body).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        let done = app.wait_settled(&id).await;
        assert_eq!(done["reason"], "error_threshold", "case {i}: {done}");
        let iterations = app.iterations(&id).await;
        let shown = iterations[0].to_string();
        assert!(shown.contains("303"), "the redirect is reported: {shown}");
        assert!(
            !shown.contains("moved"),
            "no upstream body is echoed: {shown}"
        );
    }
    // Time for a stray request to land: an absence cannot be polled for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(trap.hits(), 0, "a redirect was followed");
}

#[tokio::test]
async fn the_allow_list_opens_exactly_what_it_names() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let agent = serve(Router::new().route(
        "/step",
        post(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                axum::Json(json!({
                    "action": "write_file", "output": "done", "signal": "done", "reason": "written"
                }))
            }
        }),
    ))
    .await;
    let url = format!("http://127.0.0.1:{agent}/step");

    let closed = TestApp::spawn_with(pool.clone(), closed_config(&[])).await;
    let (status, problem) = closed.post("/api/autonomous", Some(webhook(&url))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("loopback") && d.contains("WARDEN_EGRESS_ALLOW")),
        "the refusal says why and what to set: {problem}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let allow = format!("127.0.0.1:{agent}");
    let open = TestApp::spawn_with(pool, closed_config(&[("WARDEN_EGRESS_ALLOW", &allow)])).await;
    let id = open.create(webhook(&url)).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let done = open.wait_settled(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A model server that records the Authorization header of every call.
async fn key_recorder() -> (u16, Arc<Mutex<Vec<Option<String>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let port = serve(Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap| {
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let Ok(mut seen) = record.lock() {
                seen.push(auth);
            }
            async {
                axum::Json(json!({
                    "choices": [{ "message": { "role": "assistant",
                        "content": "Nothing to do.\n<<WARDEN_GOAL_DONE: checked>>" },
                        "finish_reason": "stop" }],
                    "usage": { "prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10 }
                }))
                .into_response()
            }
        }),
    ))
    .await;
    (port, seen)
}

#[tokio::test]
async fn the_server_key_never_reaches_a_foreign_endpoint() {
    let (operator, operator_seen) = key_recorder().await;
    let (foreign, foreign_seen) = key_recorder().await;
    let operator_url = format!("http://127.0.0.1:{operator}/v1");
    let allow = format!("127.0.0.1:{foreign}");
    let app = TestApp::start_with(closed_config(&[
        ("WARDEN_LLM_BASE_URL", &operator_url),
        ("WARDEN_LLM_API_KEY", "sk-server-secret-123"),
        ("WARDEN_LLM_MODEL", "m"),
        ("WARDEN_EGRESS_ALLOW", &allow),
    ]))
    .await;

    // A session on the operator's endpoint uses the operator's key.
    let own = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "executor": { "kind": "llm" }
        }))
        .await;
    app.wait_settled(own["id"].as_str().expect("id")).await;
    let operator_calls = operator_seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        operator_calls
            .iter()
            .any(|a| a.as_deref() == Some("Bearer sk-server-secret-123")),
        "the operator's endpoint gets the operator's key: {operator_calls:?}"
    );

    // A session naming another endpoint without a key sends none; with its
    // own key, sends that one.
    for (key, expected) in [
        (None, None),
        (Some("sk-session-own"), Some("Bearer sk-session-own")),
    ] {
        let mut executor = json!({
            "kind": "llm", "base_url": format!("http://127.0.0.1:{foreign}/v1")
        });
        if let Some(key) = key {
            executor["api_key"] = json!(key);
        }
        let doc = app
            .create(json!({
                "goal": "Create README.md with a project description",
                "mode": "fixed",
                "executor": executor
            }))
            .await;
        let id = doc["id"].as_str().expect("id");
        app.wait_settled(id).await;
        let last = foreign_seen
            .lock()
            .ok()
            .and_then(|s| s.last().cloned())
            .expect("the foreign endpoint was called");
        assert_eq!(last.as_deref(), expected);
        let (_, shown) = app.get(&format!("/api/autonomous/{id}")).await;
        assert!(
            !shown.to_string().contains("sk-session-own"),
            "a session's key is never shown back: {shown}"
        );
    }
    let all = foreign_seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        all.iter()
            .all(|a| !a.as_deref().unwrap_or("").contains("sk-server-secret")),
        "the server key reached a foreign endpoint: {all:?}"
    );
}
