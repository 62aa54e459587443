//! The control path under contention and hostile data: stops that
//! must neither freeze the API nor be lost, agents whose output Postgres
//! cannot store, the failure model, outage answers, and a hammer of
//! concurrent clients against a real server process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use warden::policy::guardrails::Usage;
use warden::policy::lifecycle::{Mode, Reason};
use warden::policy::termination::{self, Facts};
use warden::store::{self, Counters, Lease, NewSession, StoreError, TenantScope};

use crate::common::{self, TestApp, config_with, distinct_steps, test_config};

/// The tests of this file run one at a time: the hammer and the timing
/// bounds measure Warden, not the other tests sharing two cores with it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Warden binary as its own process (default pool sizes: the API pool has
/// 4 connections) at `database_url`, with extra environment; without keys,
/// so a loopback client needs none.
async fn server_at(database_url: &str, env: &[(&str, &str)]) -> common::ServiceProcess {
    common::Warden::at_url(database_url)
        .without_admin_token()
        .env("WARDEN_GATE_STEP_LIMIT", "1000000")
        .env(
            "WARDEN_WORKSPACE_ROOT",
            std::env::temp_dir().join("warden-ctl"),
        )
        .env("RUST_LOG", "error")
        .envs(env)
        .serve()
        .await
}

/// As [`server_at`], on the test's database.
async fn server_on(pool: &PgPool, env: &[(&str, &str)]) -> common::ServiceProcess {
    server_at(&common::database_url(pool), env).await
}

/// A long-running scripted session body (distinct steps, so the stuck
/// detector leaves it alone).
fn long_session(delay_ms: u64) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "limits": { "max_iterations": 100000 },
        "executor": { "kind": "scripted", "steps": distinct_steps(400, 1, delay_ms) }
    })
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (StatusCode, Value) {
    // These servers run without keys on loopback: a state change without a
    // bearer key must say it is JSON (the cross-site rule), body or not.
    let mut req = client
        .request(method, url)
        .timeout(Duration::from_secs(30))
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status();
            (status, res.json().await.unwrap_or(Value::Null))
        }
        Err(e) => panic!("request failed: {e}"),
    }
}

async fn create_on(client: &reqwest::Client, base: &str, body: Value) -> String {
    let (status, doc) = send(
        client,
        reqwest::Method::POST,
        format!("{base}/api/autonomous"),
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    doc["id"].as_str().expect("id").to_string()
}

async fn status_of(pool: &PgPool, id: &str) -> (String, i64, bool) {
    sqlx::query_as("SELECT status, iterations, stop_requested FROM sessions WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("session row")
}

async fn wait_db(pool: &PgPool, id: &str, timeout: Duration, done: impl Fn(&str, i64) -> bool) {
    common::eventually_ok(timeout, &format!("{id} to reach the condition"), || async {
        let (status, iterations, _) = status_of(pool, id).await;
        if done(&status, iterations) {
            Ok(())
        } else {
            Err(format!("status {status}, {iterations} iterations"))
        }
    })
    .await
}

// A stop of a session no local loop runs once held a row lock while asking
// the pool for a second connection; four at once froze the API.
#[tokio::test]
#[ignore = "needs a Postgres server: a warden process beside the test, both on the test's database"]
async fn concurrent_stops_of_paused_sessions_do_not_freeze_the_api() {
    crate::common::require_server_postgres(
        "a warden process beside the test, both on the test's database",
    );
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let _serial = SERIAL.lock().await;
    let server = server_on(&pool, &[]).await;
    let client = reqwest::Client::new();
    let base = server.base.clone();
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(create_on(&client, &base, long_session(20)).await);
    }
    for id in &ids {
        let (status, doc) = send(
            &client,
            reqwest::Method::POST,
            format!("{base}/api/autonomous/{id}/pause"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{doc}");
    }
    for id in &ids {
        wait_db(&pool, id, Duration::from_secs(10), |s, _| s == "paused").await;
    }
    let started = Instant::now();
    let stops = futures::future::join_all(ids.iter().map(|id| {
        send(
            &client,
            reqwest::Method::POST,
            format!("{base}/api/autonomous/{id}/stop"),
            None,
        )
    }));
    let ready = async {
        // Paced, not a wait: the probe goes out while the stops are in flight.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t = Instant::now();
        let res = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .expect("readyz");
        (res.status(), t.elapsed())
    };
    let (answers, (ready_status, ready_took)) = tokio::join!(stops, ready);
    let took = started.elapsed();
    for (status, doc) in &answers {
        assert_eq!(*status, StatusCode::OK, "{doc}");
        assert_eq!(doc["status"], "interrupted", "{doc}");
    }
    assert!(took < Duration::from_secs(5), "8 stops took {took:?}");
    assert_eq!(ready_status, StatusCode::OK);
    assert!(
        ready_took < Duration::from_secs(1),
        "readyz took {ready_took:?}"
    );
}

// A loop finishing a pause must not clear a stop committed meanwhile: the
// store refuses the pause under the row lock and the loop records the stop.
#[tokio::test]
async fn the_loop_cannot_pause_over_a_pending_stop() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let _serial = SERIAL.lock().await;
    let store = crate::common::store_on(pool.clone());
    store.migrate().await.expect("migrated");
    let limits = test_config().defaults.limits;
    let new = NewSession {
        id: Uuid::new_v4(),
        goal: "Create README.md".into(),
        mode: Mode::Fixed,
        limits,
        executor: serde_json::from_value(
            json!({ "kind": "scripted", "steps": [{ "action": "a" }] }),
        )
        .unwrap(),
        original_goal: None,
        refinement: None,
        criteria: Vec::new(),
        milestones: Vec::new(),
        refinement_tokens: 0,
        tenant: "test".into(),
    };
    let (_, lease) = store
        .insert_session(&new, Some(Uuid::new_v4()), Duration::from_secs(30), &[])
        .await
        .expect("inserted");
    let lease = lease.expect("a lease");
    let mut tx = store.begin().await.expect("tx");
    store::request_stop(&mut tx, new.id, &TenantScope::Global)
        .await
        .expect("stop recorded");
    tx.commit().await.expect("committed");
    let usage = Usage::default();
    let pause = termination::record(
        Reason::UserPause,
        Facts {
            usage: &usage,
            limits: &limits,
            detail: None,
        },
    );
    let answer = store
        .finish(
            &lease,
            &pause,
            None,
            Counters::default(),
            (0, &json!({})),
            &[],
        )
        .await;
    assert!(
        matches!(answer, Err(StoreError::StopPending(id)) if id == new.id),
        "{answer:?}"
    );
    let s = store
        .session(new.id, &TenantScope::Global)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(s.status.as_str(), "running");
    assert!(s.stop_requested, "the stop request must survive");
    // The stop itself is accepted.
    let stop = termination::record(
        Reason::UserStop,
        Facts {
            usage: &usage,
            limits: &limits,
            detail: None,
        },
    );
    store
        .finish(
            &lease,
            &stop,
            None,
            Counters::default(),
            (0, &json!({})),
            &[],
        )
        .await
        .expect("the stop is recorded");
    let s = store
        .session(new.id, &TenantScope::Global)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(s.status.as_str(), "interrupted");
}

// The same race end to end: a stop sent right behind a pause wins.
#[tokio::test]
async fn a_stop_racing_a_pause_ends_interrupted() {
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    for round in 0..6u64 {
        let id = app.create(long_session(30)).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        app.wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(1)
        })
        .await;
        let pause_path = format!("/api/autonomous/{id}/pause");
        let pause = app.post(&pause_path, None);
        let stop = async {
            // Paced: each round sends the stop a little later after the pause.
            tokio::time::sleep(Duration::from_millis(round * 6)).await;
            app.post(&format!("/api/autonomous/{id}/stop"), None).await
        };
        let ((p, paused), (st, doc)) = tokio::join!(pause, stop);
        // Sent together, the stop may land first: then the pause finds the
        // session ended and says so (409); it never undoes the stop.
        assert!(
            p == StatusCode::OK || p == StatusCode::CONFLICT,
            "round {round}: pause answered {p}: {paused}"
        );
        assert_eq!(st, StatusCode::OK, "{doc}");
        let s = app
            .wait_until(&id, Duration::from_secs(10), |s| s["status"] != "running")
            .await;
        assert_eq!(
            s["status"], "interrupted",
            "round {round}: the stop was lost: {s}"
        );
        assert_eq!(s["reason"], "user_stop");
    }
}

// A late start on a stale lease must not replace the live runner in the
// registry, or the live one loses its renewals and is rescued.
#[tokio::test]
async fn a_late_runner_start_does_not_replace_the_live_runner() {
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let id = app.create(long_session(50)).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    app.wait_until(&id, Duration::from_secs(10), |s| {
        s["iterations"].as_i64() >= Some(2)
    })
    .await;
    let uuid: Uuid = id.parse().expect("uuid");
    let store = crate::common::store_on(pool.clone());
    let record = store
        .session(uuid, &TenantScope::Global)
        .await
        .expect("read")
        .expect("exists");
    let stale = Lease {
        session_id: uuid,
        token: Uuid::new_v4(),
    };
    let supervisor = app.app.as_ref().expect("running").supervisor().clone();
    supervisor
        .spawn(
            stale,
            Instant::now(),
            &record,
            warden::session::rehydrate::initial_state(&record),
        )
        .await
        .expect("the stale runner starts");
    let before = app.session_view(&id).await.iterations;
    // Several TTLs (1 s in tests): a live runner without renewals would quit.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let s = app.session_view(&id).await;
    assert_eq!(s.status, "running", "{s:?}");
    assert!(s.iterations > before + 10, "{s:?}");
    let takeovers = app
        .event_views(&id)
        .await
        .into_iter()
        .filter(|e| e.kind == "lease_acquired")
        .count();
    assert_eq!(takeovers, 0, "the live runner lost its lease");
}

/// An in-process agent whose answers a closure decides from the call number.
mod agent {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::Value;

    type Answer = Arc<dyn Fn(usize) -> Value + Send + Sync>;

    #[derive(Clone)]
    struct Agent {
        keys: Arc<Mutex<Vec<String>>>,
        answer: Answer,
    }

    /// Starts the agent; returns its URL and the Idempotency-Key of each call.
    pub async fn start(
        answer: impl Fn(usize) -> Value + Send + Sync + 'static,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        async fn step(State(a): State<Agent>, headers: HeaderMap) -> Json<Value> {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let n = {
                let mut keys = a.keys.lock().unwrap();
                keys.push(key);
                keys.len()
            };
            Json((a.answer)(n))
        }
        let agent = Agent {
            keys: Arc::new(Mutex::new(Vec::new())),
            answer: Arc::new(answer),
        };
        let keys = agent.keys.clone();
        let app = Router::new().route("/step", post(step)).with_state(agent);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/step", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, keys)
    }
}

// Postgres text cannot hold NUL: client text carrying one is a 422 naming
// the field, not a 500 from the database.
#[tokio::test]
async fn nul_in_client_text_is_refused_naming_the_field() {
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    let step = |output: &str| json!([{ "action": "a", "output": output }]);
    let cases = [
        (
            json!({ "goal": "Create README\u{0}.md", "executor": { "kind": "scripted", "steps": step("x") } }),
            "goal",
        ),
        (
            json!({ "goal": "Create README.md", "success_criteria": ["ok", "bad\u{0}"],
                    "executor": { "kind": "scripted", "steps": step("x") } }),
            "success_criteria[1]",
        ),
        (
            json!({ "goal": "Create README.md", "executor": { "kind": "scripted", "steps": step("o\u{0}") } }),
            "executor.steps[0].output",
        ),
        (
            json!({ "goal": "Create README.md",
                    "executor": { "kind": "scripted", "steps": [{ "action": "a", "arguments": { "p": "\u{0}" } }] } }),
            "executor.steps[0].arguments.p",
        ),
    ];
    for (body, field) in cases {
        let (status, doc) = app.post("/api/autonomous", Some(body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{doc}");
        let detail = crate::common::problem(&doc).detail;
        assert!(detail.contains(&format!("`{field}`")), "{field}: {doc}");
    }
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 10 }]), json!({}))
        .await;
    app.wait_settled(&id).await;
    let (status, doc) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "guidance": "go\u{0}on", "limits": { "max_iterations": 5 } })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .expect("detail")
            .contains("`guidance`")
    );
    let (status, doc) = app
        .post(
            &format!("/api/autonomous/{id}/refinement"),
            Some(json!({ "choice": "custom", "goal": "x\u{0}" })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{doc}");
}

// The same NUL from an agent is not a poison pill: an agent that answers a
// NUL and then valid text keeps working; the NUL is replaced and recorded.
#[tokio::test]
async fn an_agent_answering_nul_keeps_working() {
    let _serial = SERIAL.lock().await;
    let (url, keys) = agent::start(|n| {
        if n == 1 {
            json!({ "action": "write\u{0}", "output": "bad\u{0}byte", "arguments": { "k\u{0}": "\u{0}" },
                    "tokens": 3 })
        } else if n < 4 {
            json!({ "action": format!("step_{n}"), "output": "fine", "tokens": 3 })
        } else {
            json!({ "action": "report", "output": "done", "signal": "done", "reason": "all\u{0}done" })
        }
    })
    .await;
    let app = TestApp::start().await;
    let id = app
        .create(
            json!({ "goal": "Edit three parts", "executor": { "kind": "webhook", "url": url } }),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 4);
    assert_eq!(keys.lock().unwrap().len(), 4, "each step called once");
    let its = app.iterations(&id).await;
    assert_eq!(its[0]["action"], "write\u{FFFD}");
    let sanitized: Vec<Value> = app
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "agent_output_sanitized")
        .collect();
    assert_eq!(sanitized.len(), 2, "recorded for steps 1 and 4");
    // Action, output (as observation and message), argument key and value.
    assert_eq!(sanitized[0]["data"]["nul_replaced"], 5);
}

// A poison pill the store refuses: an answer that can never be stored ends
// the session failed after N attempts, the agent called at most N times with
// one Idempotency-Key; an exited runner's lease is given up at once, so the
// attempts come a heartbeat apart, not a TTL.
#[tokio::test]
async fn an_unstorable_answer_fails_the_session_after_n_attempts() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let _serial = SERIAL.lock().await;
    // Fault injection: iterations with this action cannot be stored.
    sqlx::query("ALTER TABLE iterations ADD CONSTRAINT poison CHECK (action <> 'poison')")
        .execute(&pool)
        .await
        .expect("constraint added");
    let (url, keys) = agent::start(|_| json!({ "action": "poison", "output": "x" })).await;
    let config = config_with(&[
        ("WARDEN_MAX_ATTEMPTS", "3"),
        ("WARDEN_LEASE_TTL_MS", "4000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "200"),
    ]);
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let started = Instant::now();
    let id = app
        .create(
            json!({ "goal": "Edit three parts", "executor": { "kind": "webhook", "url": url } }),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let s = app
        .wait_until(&id, Duration::from_secs(30), |s| {
            s["status"] != "running" && s["status"] != "queued"
        })
        .await;
    let took = started.elapsed();
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(s["reason"], "internal_error");
    assert_eq!(s["iterations"], 0);
    let detail = s.to_string();
    assert!(
        detail.contains("3 failed attempts") && detail.contains("poison"),
        "the error is in the termination record: {s}"
    );
    let calls = keys.lock().unwrap().clone();
    assert!(!calls.is_empty() && calls.len() <= 3, "{calls:?}");
    assert!(
        calls.iter().all(|k| *k == format!("{id}:1")),
        "one key per iteration: {calls:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "attempts must not wait a TTL each: {took:?}"
    );
    let failed: Vec<Value> = app
        .decisions(&id)
        .await
        .into_iter()
        .filter(|d| d["kind"] == "status_changed" && d["data"]["to"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["data"]["attempts"], 3);
    // The counter is bumped just after the failure commits: on a loaded
    // machine the status can be read first, so give it a moment.
    common::eventually_ok(
        Duration::from_secs(3),
        "the internal_error counter",
        || async {
            let metrics = app.admin_get("/metrics").await.text().await.expect("text");
            let counted = metrics
                .lines()
                .any(|l| l.contains("internal_error") && !l.starts_with('#'));
            if counted { Ok(()) } else { Err(metrics) }
        },
    )
    .await;
    // Nothing rescues it again: an absence, seen only over time.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(keys.lock().unwrap().len() <= 3);
}

// Connection-level failures answer 503 with Retry-After, so clients back
// off; /readyz answers within a second so balancers can route away.
#[tokio::test]
#[ignore = "needs a Postgres server: a second connection that terminates the service's backends"]
async fn a_lost_database_answers_503_quickly() {
    crate::common::require_server_postgres(
        "a second connection that terminates the service's backends",
    );
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let id = app
        .create_scripted(json!([{ "action": "a" }]), json!({}))
        .await;
    app.wait_settled(&id).await;
    // Every pooled connection is killed by the server, as an admin would.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .expect("admin connection");
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&admin)
    .await
    .expect("terminated");
    for _ in 0..4 {
        let res = app
            .client
            .get(app.url(&format!("/api/autonomous/{id}")))
            .send()
            .await
            .expect("sent");
        assert!(
            res.status() == StatusCode::OK || res.status() == StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            res.status()
        );
    }
    pool.close().await;
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().get("retry-after").is_some());
    let doc: Value = res.json().await.expect("problem");
    assert_eq!(doc["code"], "database_unavailable");
    let t = Instant::now();
    let res = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(t.elapsed() < Duration::from_secs(1));
}

// Hostile stream ids and cursors are 400, not a panic or a 500; a webhook's
// u64::MAX tokens saturate instead of wrapping to -1 in a BIGINT.
#[tokio::test]
async fn hostile_ids_cursors_and_token_counts() {
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let res = app
        .client
        .get(app.url("/api/autonomous/events"))
        .header("accept", "text/event-stream")
        .header("last-event-id", "-8334601228799321961")
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let (status, doc) = app
        .get(&format!(
            "/api/autonomous?cursor=-300000000000000000_{}",
            Uuid::new_v4()
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{doc}");
    assert!(crate::common::problem(&doc).detail.contains("cursor"));

    let (url, _) = agent::start(|n| {
        if n == 1 {
            json!({ "action": "count", "output": "x", "tokens": u64::MAX })
        } else {
            json!({ "action": "report", "output": "done", "signal": "done" })
        }
    })
    .await;
    let id = app
        .create(
            json!({ "goal": "Edit three parts", "limits": { "max_tokens": 10_000_000_000u64 },
                        "executor": { "kind": "webhook", "url": url } }),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let s = app.wait_settled(&id).await;
    assert_ne!(s["status"], "running");
    let tokens: i64 = sqlx::query_scalar(
        "SELECT tokens FROM iterations WHERE session_id = $1::uuid AND number = 1",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .expect("iteration 1");
    // A reported count is held to the step's allowance (the whole budget
    // here) before it touches state: never wrapped, never past it.
    assert_eq!(tokens, 10_000_000_000);
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/events")))
        .header("accept", "text/event-stream")
        .header("last-event-id", "-5")
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// A small deterministic generator (xorshift) for the hammer's choices.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

// The control-path hammer: >= 100 concurrent clients doing random
// create/stop/pause/resume/PATCH/GET over a pool of sessions for a few
// seconds against a real server process (default pool sizes).
#[tokio::test]
#[ignore = "needs a Postgres server: a warden process beside the test, both on the test's database"]
async fn control_path_hammer() {
    crate::common::require_server_postgres(
        "a warden process beside the test, both on the test's database",
    );
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let _serial = SERIAL.lock().await;
    const CLIENTS: u64 = 120;
    const FOR: Duration = Duration::from_secs(5);
    // Default pools (the API's has 4 connections), but requests may queue
    // for a connection for up to 10 s instead of 2: on a shared two-core
    // test machine 120 clients can queue longer than 2 s, and such 503s
    // would be backpressure, not the freeze (a pool exhausted by requests
    // that hold a lock and wait for a second connection) guarded against.
    let server = server_on(
        &pool,
        &[
            ("WARDEN_STOP_WAIT_MS", "1000"),
            ("WARDEN_DB_ACQUIRE_TIMEOUT_MS", "10000"),
        ],
    )
    .await;
    let base = server.base.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS as usize)
        .build()
        .expect("client");
    let ids: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..12 {
        let id = create_on(&client, &base, long_session(150)).await;
        ids.lock().unwrap().push(id);
    }

    // The monitor reads Postgres directly: iterations never decrease, no
    // session stays running with a stop requested for more than 2 s.
    let stop_monitor = tokio_util::sync::CancellationToken::new();
    let monitor = {
        let pool = pool.clone();
        let stop = stop_monitor.clone();
        tokio::spawn(async move {
            let mut last: HashMap<Uuid, i64> = HashMap::new();
            let mut stop_since: HashMap<Uuid, Instant> = HashMap::new();
            let mut violations = Vec::new();
            while !stop.is_cancelled() {
                let rows: Vec<(Uuid, String, i64, bool)> =
                    sqlx::query_as("SELECT id, status, iterations, stop_requested FROM sessions")
                        .fetch_all(&pool)
                        .await
                        .expect("monitor read");
                for (id, status, iterations, stop_requested) in rows {
                    if let Some(prev) = last.insert(id, iterations)
                        && iterations < prev
                    {
                        violations.push(format!("{id}: iterations {prev} -> {iterations}"));
                    }
                    if status == "running" && stop_requested {
                        let since = *stop_since.entry(id).or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(2) {
                            violations.push(format!("{id}: running with a stop requested > 2 s"));
                        }
                    } else {
                        stop_since.remove(&id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            violations
        })
    };

    let deadline = Instant::now() + FOR;
    let clients = (0..CLIENTS).map(|c| {
        let client = client.clone();
        let base = base.clone();
        let ids = ids.clone();
        async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
            let mut answers: Vec<(String, &'static str, StatusCode, Value)> = Vec::new();
            // Each client keeps going for the whole window and makes at
            // least two requests however loaded the machine is, so the
            // hammer always overlaps 120 clients' control requests.
            while Instant::now() < deadline || answers.len() < 2 {
                let id = {
                    let ids = ids.lock().unwrap();
                    ids[rng.below(ids.len() as u64) as usize].clone()
                };
                let url = format!("{base}/api/autonomous/{id}");
                let (op, (status, doc)) = match rng.below(12) {
                    0 if ids.lock().unwrap().len() < 40 => {
                        let (status, doc) = send(
                            &client,
                            reqwest::Method::POST,
                            format!("{base}/api/autonomous"),
                            Some(long_session(150)),
                        )
                        .await;
                        if let Some(new) = doc["id"].as_str() {
                            ids.lock().unwrap().push(new.to_string());
                        }
                        ("create", (status, doc))
                    }
                    1 | 2 => (
                        "stop",
                        send(&client, reqwest::Method::POST, format!("{url}/stop"), None).await,
                    ),
                    3 | 4 => (
                        "pause",
                        send(&client, reqwest::Method::POST, format!("{url}/pause"), None).await,
                    ),
                    5 | 6 => (
                        "resume",
                        send(
                            &client,
                            reqwest::Method::POST,
                            format!("{url}/resume"),
                            Some(json!({ "guidance": "carry on" })),
                        )
                        .await,
                    ),
                    7 => (
                        "patch",
                        send(
                            &client,
                            reqwest::Method::PATCH,
                            url.clone(),
                            Some(
                                json!({ "limits": { "max_iterations": 100000 + rng.below(1000) } }),
                            ),
                        )
                        .await,
                    ),
                    _ => ("get", send(&client, reqwest::Method::GET, url, None).await),
                };
                answers.push((id, op, status, doc));
                // A little think time, as real clients have.
                tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
            }
            answers
        }
    });
    let answers: Vec<_> = futures::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();

    // 0 answers >= 500 while Postgres is healthy.
    let errors: Vec<_> = answers
        .iter()
        .filter(|(_, _, status, _)| status.is_server_error())
        .map(|(id, op, status, doc)| format!("{op} {id}: {status} {doc}"))
        .collect();
    assert!(
        errors.is_empty(),
        "{} of {} answers were >= 500: {:?}",
        errors.len(),
        answers.len(),
        &errors[..errors.len().min(10)]
    );

    // Every stop answered 2xx lands (none is left pending on a running
    // session); then the event logs: no stop request is followed by a pause
    // (a lost stop) or left pending.
    let stopped_ok: Vec<&String> = answers
        .iter()
        .filter(|(_, op, status, _)| *op == "stop" && status.is_success())
        .map(|(id, ..)| id)
        .collect();
    assert!(!stopped_ok.is_empty(), "no stop answered 2xx");
    for id in &stopped_ok {
        common::eventually(
            Duration::from_secs(5),
            &format!("{id}: the stop answered 2xx to land"),
            || async {
                let (status, _, stop_requested) = status_of(&pool, id).await;
                !(status == "running" && stop_requested)
            },
        )
        .await;
    }
    let all_ids = ids.lock().unwrap().clone();
    for id in &all_ids {
        let kinds: Vec<(String, Value)> = sqlx::query_as(
            "SELECT kind, data FROM events WHERE session_id = $1::uuid ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .expect("events");
        let mut pending_stop = false;
        for (kind, data) in kinds {
            match kind.as_str() {
                "stop_requested" => pending_stop = true,
                "status_changed" => {
                    let to = data["to"].as_str().expect("to");
                    assert!(
                        !(pending_stop && (to == "paused" || to == "awaiting_refinement")),
                        "{id}: a requested stop was lost to a {to}"
                    );
                    if to != "running" {
                        pending_stop = false;
                    }
                }
                _ => {}
            }
        }
        let (status, _, _) = status_of(&pool, id).await;
        assert!(
            !pending_stop || status == "running",
            "{id}: stop pending while {status}"
        );
    }

    // Every running session keeps advancing after the hammer.
    let running: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT id, iterations FROM sessions WHERE status = 'running'")
            .fetch_all(&pool)
            .await
            .expect("running");
    for (id, before) in running {
        let id = id.to_string();
        common::eventually(
            Duration::from_secs(5),
            &format!("{id} to advance past {before}"),
            || async {
                let (status, now, _) = status_of(&pool, &id).await;
                status != "running" || now > before
            },
        )
        .await;
    }
    stop_monitor.cancel();
    let mut violations = monitor.await.expect("monitor");
    violations.dedup();
    if let Some(first) = violations.first() {
        let id = &first[..36];
        let events: Vec<(i64, String, Value, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
            "SELECT seq, kind, data, created_at FROM events WHERE session_id = $1::uuid ORDER BY seq DESC LIMIT 30",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .expect("events");
        let row: (String, bool, Option<chrono::DateTime<chrono::Utc>>, i64) = sqlx::query_as(
            "SELECT status, stop_requested, lease_expires_at, iterations FROM sessions WHERE id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .expect("row");
        panic!("{violations:?}\n{row:?}\n{events:#?}");
    }
}

// A session naming its own model endpoint must get the same timeout and
// retries as the server's (WARDEN_LLM_TIMEOUT_MS / _MAX_RETRIES /
// _RETRY_BASE_MS; the tests set 2 retries, 10 ms backoff; here 300 ms),
// not a built-in 120 s and 3 retries.
#[tokio::test]
async fn model_calls_honour_the_environment_for_any_endpoint() {
    let _serial = SERIAL.lock().await;
    let llm = common::fake_llm::FakeLlm::start().await;
    // The first attempt hangs past the timeout; the fake answers 500 after.
    llm.agent(common::fake_llm::Answer::ok(json!({})).delayed(3_000));
    let config = config_with(&[("WARDEN_LLM_TIMEOUT_MS", "300")]);
    assert!(config.models.endpoint.is_none(), "no default endpoint here");
    let app = TestApp::start_with(config).await;
    let started = Instant::now();
    let id = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 1 },
            "executor": { "kind": "llm", "base_url": llm.base_url(), "model": "m" }
        }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let s = app.wait_settled(&id).await;
    let took = started.elapsed();
    assert_eq!(s["iterations"], 1, "{s}");
    assert_eq!(
        llm.agent_requests().len(),
        3,
        "one call and WARDEN_LLM_MAX_RETRIES=2 retries"
    );
    assert!(took < Duration::from_millis(2_500), "took {took:?}");
}

/// A private Postgres cluster made with the machine's `initdb`/`pg_ctl`,
/// removed on drop. `None` when the binaries are absent (the test then
/// fails saying what it needs).
struct PrivateCluster {
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
    port: u16,
    /// Run the binaries as this user (initdb refuses to run as root).
    run_as: Option<&'static str>,
}

impl PrivateCluster {
    fn create() -> Option<PrivateCluster> {
        let mut bins: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
            .collect();
        bins.sort();
        let bin = bins.pop()?;
        let is_root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .ok()
            .is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        let run_as = is_root.then_some("postgres");
        let dir = std::env::temp_dir().join(format!("warden-outage-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let cluster = PrivateCluster {
            bin,
            dir,
            port,
            run_as,
        };
        if let Some(user) = run_as {
            let ok = std::process::Command::new("chown")
                .args([
                    &format!("{user}:"),
                    cluster.dir.to_str().expect("utf-8 path"),
                ])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cannot hand the cluster directory to {user}");
        }
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        cluster.start();
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = match self.run_as {
            Some(user) => {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => std::process::Command::new(&exe),
        };
        let out = cmd.args(args).output().expect("postgres tool runs");
        assert!(
            out.status.success(),
            "{tool} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").to_string_lossy().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "start"],
        );
    }

    fn stop(&self) {
        // Fast: open connections get "terminating connection due to
        // administrator command", as in a real outage.
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data();
        let exe = self.bin.join("pg_ctl");
        let mut cmd = match self.run_as {
            Some(user) => {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => std::process::Command::new(&exe),
        };
        let _ = cmd.args(["-D", &data, "-m", "immediate", "stop"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn committed(client: &reqwest::Client, base: &str, id: &str) -> Vec<Value> {
    let (status, doc) = send(
        client,
        reqwest::Method::GET,
        format!("{base}/api/autonomous/{id}/iterations?limit=500"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    doc["items"].as_array().cloned().expect("items")
}

// The database outage test: Postgres stops for a few seconds and starts
// again. The API answers 503 quickly meanwhile, sessions continue after,
// and no committed iteration changes.
#[tokio::test]
#[ignore = "needs a Postgres server: a private Postgres cluster to stop and restart"]
async fn a_database_outage_is_answered_503_and_survived() {
    crate::common::require_server_postgres("a private Postgres cluster to stop and restart");
    let _serial = SERIAL.lock().await;
    let cluster = PrivateCluster::create()
        .expect("this test needs initdb and pg_ctl under /usr/lib/postgresql/*/bin (Debian's postgresql package)");
    let server = server_at(&cluster.url(), &[]).await;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(create_on(&client, &base, long_session(100)).await);
    }
    for id in &ids {
        common::eventually(Duration::from_secs(20), "each session to start", || async {
            committed(&client, &base, id).await.len() >= 3
        })
        .await;
    }
    let mut before = Vec::new();
    for id in &ids {
        before.push(committed(&client, &base, id).await);
    }
    cluster.stop();
    let outage = Instant::now();
    for (id, before) in ids.iter().zip(&before) {
        // Reads that need Postgres answer 503 quickly.
        let t = Instant::now();
        let (status, doc) = send(
            &client,
            reqwest::Method::GET,
            format!("{base}/api/autonomous/{id}/iterations"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{doc}");
        assert_eq!(doc["code"], "database_unavailable");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
        );
        // The status of a session this replica runs comes from its memory:
        // the last committed state.
        let (status, doc) = send(
            &client,
            reqwest::Method::GET,
            format!("{base}/api/autonomous/{id}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{doc}");
        assert_eq!(doc["status"], "running", "{doc}");
        assert!(
            doc["iterations"].as_u64() >= Some(before.len() as u64),
            "{doc}"
        );
    }
    // For the whole outage: once the loops' leases can
    // no longer be trusted (TTL 2 s here), the status still answers from
    // memory, marked stale, with the time of its last committed state.
    let stale_by = outage + Duration::from_millis(2_500);
    let mut seen_stale = vec![false; ids.len()];
    while !seen_stale.iter().all(|s| *s) {
        assert!(
            outage.elapsed() < Duration::from_secs(10),
            "status never answered stale: {seen_stale:?}"
        );
        for (i, (id, before)) in ids.iter().zip(&before).enumerate() {
            let (status, doc) = send(
                &client,
                reqwest::Method::GET,
                format!("{base}/api/autonomous/{id}"),
                None,
            )
            .await;
            assert_eq!(status, StatusCode::OK, "during the outage: {doc}");
            assert!(
                doc["iterations"].as_u64() >= Some(before.len() as u64),
                "{doc}"
            );
            if doc["stale"] == true {
                assert!(doc["committed_at"].is_string(), "{doc}");
                seen_stale[i] = true;
            } else {
                assert!(doc["committed_at"].is_null(), "{doc}");
            }
        }
        if Instant::now() < stale_by {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let t = Instant::now();
    let ready = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "readyz took {:?}",
        t.elapsed()
    );
    // The outage lasts 3 s whatever the answers took: its length is the point.
    let remaining = Duration::from_secs(3).saturating_sub(outage.elapsed());
    tokio::time::sleep(remaining).await;
    cluster.start();
    common::eventually(Duration::from_secs(20), "warden to recover", || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|res| res.status() == StatusCode::OK)
    })
    .await;
    // Sessions continue (rescued once their leases lapse), and what was
    // committed before the outage is exactly as it was.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (id, before) in ids.iter().zip(&before) {
        let left = deadline.saturating_duration_since(Instant::now());
        let after = common::eventually_ok(left, &format!("{id} to continue"), || async {
            let after = committed(&client, &base, id).await;
            if after.len() >= before.len() + 3 {
                Ok(after)
            } else {
                Err(format!(
                    "{} iterations before, {} now",
                    before.len(),
                    after.len()
                ))
            }
        })
        .await;
        common::assert_gap_free(&after);
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(b, a, "{id}: a committed iteration changed");
        }
    }
    drop(server);
}

// A runner's lease clock starts when the acquiring request began; a runner
// started late (a long wait for a connection) must renew rather than trust
// that expired clock and quit, or the session is rescued a TTL later.
#[tokio::test]
async fn a_runner_started_late_renews_its_lease_instead_of_quitting() {
    let _serial = SERIAL.lock().await;
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let supervisor = app.app.as_ref().expect("running").supervisor().clone();
    let store = crate::common::store_on(pool.clone());
    let new = NewSession {
        id: Uuid::new_v4(),
        goal: "Create README.md".into(),
        mode: Mode::Fixed,
        limits: warden::policy::guardrails::Limits {
            max_iterations: 100_000,
            ..test_config().defaults.limits
        },
        executor: serde_json::from_value(
            json!({ "kind": "scripted", "steps": distinct_steps(400, 1, 30) }),
        )
        .unwrap(),
        original_goal: None,
        refinement: None,
        criteria: Vec::new(),
        milestones: Vec::new(),
        refinement_tokens: 0,
        tenant: "test".into(),
    };
    let (record, lease) = store
        .insert_session(
            &new,
            Some(supervisor.replica_id()),
            Duration::from_secs(1),
            &[],
        )
        .await
        .expect("inserted");
    // As if the acquiring request had waited 5 s for a connection.
    let acquired = Instant::now()
        .checked_sub(Duration::from_secs(5))
        .expect("an earlier instant");
    supervisor
        .spawn(
            lease.expect("a lease"),
            acquired,
            &record,
            warden::session::rehydrate::initial_state(&record),
        )
        .await
        .expect("started");
    let id = new.id.to_string();
    // Two TTLs (1 s in tests): a runner that quit would show it by then.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let s = app.session_view(&id).await;
    assert_eq!(s.status, "running", "{s:?}");
    assert!(s.iterations >= 10, "{s:?}");
    let takeovers = app
        .event_views(&id)
        .await
        .into_iter()
        .filter(|e| e.kind == "lease_acquired")
        .count();
    assert_eq!(takeovers, 0, "the runner quit on a stale clock");
}
