//! Confirmation before start: a create with `confirm_if_over` whose
//! estimate is over a bound (or unknown) waits `awaiting_confirmation` with
//! its estimate; `POST /{id}/confirm` starts it (once), a stop ends it, the
//! approval timeout expires it, another tenant cannot see it, and the
//! tenant's notify target hears of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, TestApp, client_with_key, config_with, create_key, eventually};

/// A scripted create body that finishes after `steps` steps, with `confirm`
/// as its `confirm_if_over`.
fn body(goal: &str, steps: u64, confirm: Value) -> Value {
    let mut script: Vec<Value> = (1..steps)
        .map(|i| json!({ "action": format!("step {i}"), "tokens": 10 }))
        .collect();
    script.push(json!({ "action": "finish", "tokens": 10,
                        "output": "done\n<<WARDEN_GOAL_DONE: finished>>" }));
    json!({
        "goal": goal,
        "limits": { "max_iterations": 20, "max_tokens": 10_000 },
        "executor": { "kind": "scripted", "steps": script },
        "confirm_if_over": confirm,
    })
}

/// Creates `body`; asserts 201 and returns the session.
async fn create(app: &TestApp, body: Value) -> Value {
    app.create(body).await
}

fn id_of(s: &Value) -> String {
    s["id"].as_str().expect("id").to_string()
}

#[tokio::test]
async fn without_history_a_session_waits_for_confirmation_and_confirm_starts_it_once() {
    let app = TestApp::start().await;
    let s = create(
        &app,
        body("Write the release notes", 2, json!({ "minutes": 30 })),
    )
    .await;
    let id = id_of(&s);
    assert_eq!(s["status"], "awaiting_confirmation", "{s}");
    let c = &s["confirmation"];
    assert_eq!(c["over"], json!(["unknown"]), "no history: unknown, {c}");
    assert_eq!(c["estimate"]["basis"], "none");
    assert_eq!(c["confirm_if_over"], json!({ "minutes": 30 }));
    assert!(c["expires_at"].is_string(), "{c}");
    assert!(
        s["allowed_actions"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("confirm"))),
        "{s}"
    );
    // It does not start by itself: a session created after it, with no
    // bound, starts and finishes while it still waits.
    let plain = app.create(body("Write a note", 3, Value::Null)).await;
    app.wait_settled(&id_of(&plain)).await;
    let still = app.session(&id).await;
    assert_eq!(still["status"], "awaiting_confirmation");
    assert_eq!(still["iterations"], 0);
    // The list filters by the new status.
    let (status, page) = app
        .get("/api/autonomous?status=awaiting_confirmation")
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    // Pause and resume are refused: it has not started.
    let (status, _) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (status, started) = app
        .post(&format!("/api/autonomous/{id}/confirm"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert!(
        matches!(
            started["status"].as_str(),
            Some("running" | "queued" | "completed")
        ),
        "{started}"
    );
    let done = app
        .wait_until(&id, Duration::from_secs(20), |s| s["status"] == "completed")
        .await;
    assert_eq!(done["iterations"], 2, "{done}");
    assert_eq!(done["confirmation"]["over"], json!(["unknown"]), "kept");

    let (status, problem) = app
        .post(&format!("/api/autonomous/{id}/confirm"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap_or("").contains("confirm"),
        "{problem}"
    );
    // Its log says it waited, with the estimate.
    let events = app.events(&id).await;
    let waited = events
        .iter()
        .find(|e| e["kind"] == "awaiting_confirmation")
        .expect("an awaiting_confirmation event");
    assert_eq!(waited["data"]["estimate"]["basis"], "none", "{waited}");
}

#[tokio::test]
async fn within_its_bound_a_session_starts_at_once_and_a_cost_bound_without_costs_waits() {
    let app = TestApp::start().await;
    for i in 0..6 {
        let s = create(
            &app,
            json!({
                "goal": format!("Write the release notes for version {i}"),
                "limits": { "max_iterations": 20, "max_tokens": 10_000 },
                "executor": { "kind": "scripted", "steps": [
                    { "action": "a", "tokens": 10 },
                    { "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: ok>>" }
                ] }
            }),
        )
        .await;
        app.wait_until(&id_of(&s), Duration::from_secs(20), |s| {
            s["status"] == "completed"
        })
        .await;
    }
    // History says it takes well under a minute: it starts.
    let s = create(
        &app,
        body(
            "Write the release notes for version 9",
            2,
            json!({ "minutes": 60 }),
        ),
    )
    .await;
    assert_ne!(s["status"], "awaiting_confirmation", "{s}");
    assert_eq!(s["confirmation"], Value::Null, "{s}");
    // The history has no costs: a cost bound cannot be checked, so it waits.
    let s = create(
        &app,
        body(
            "Write the release notes for version 10",
            2,
            json!({ "cost_usd": "5.00" }),
        ),
    )
    .await;
    assert_eq!(s["status"], "awaiting_confirmation", "{s}");
    assert_eq!(s["confirmation"]["over"], json!(["unknown"]), "{s}");
    assert_ne!(s["confirmation"]["estimate"]["basis"], "none", "{s}");
}

#[tokio::test]
async fn bad_bounds_are_refused_and_create_nothing() {
    let app = TestApp::start().await;
    for bad in [
        json!({}),
        json!({ "cost_usd": "-1" }),
        json!({ "cost_usd": "abc" }),
        json!({ "minutes": 0 }),
        json!({ "minutes": 30, "hours": 1 }),
    ] {
        let (status, problem) = app
            .post(
                "/api/autonomous",
                Some(body("Write the notes", 1, bad.clone())),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad} -> {problem}"
        );
    }
    let (_, list) = app.get("/api/autonomous").await;
    assert_eq!(list["items"], json!([]));
}

#[tokio::test]
async fn a_stop_ends_a_session_awaiting_confirmation_and_another_tenant_sees_nothing() {
    let app = TestApp::start().await;
    let s = create(
        &app,
        body("Write the release notes", 2, json!({ "minutes": 5 })),
    )
    .await;
    let id = id_of(&s);
    assert_eq!(s["status"], "awaiting_confirmation");

    let other = create_key(&app.base, "confirm-other", "operator").await;
    let other = client_with_key(other["secret"].as_str().expect("secret"));
    for tail in ["/confirm", "/stop"] {
        let res = other
            .post(app.url(&format!("/api/autonomous/{id}{tail}")))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{tail}");
    }
    assert_eq!(app.session(&id).await["status"], "awaiting_confirmation");

    let (status, stopped) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["status"], "interrupted", "{stopped}");
    assert_eq!(stopped["reason"], "user_stop");
    assert_eq!(stopped["iterations"], 0);
    let (status, _) = app
        .post(&format!("/api/autonomous/{id}/confirm"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn an_unconfirmed_session_expires_stopped_after_the_approval_timeout() {
    let app = TestApp::start_with(config_with(&[("WARDEN_APPROVAL_TIMEOUT_MS", "1000")])).await;
    let s = create(
        &app,
        body("Write the release notes", 2, json!({ "minutes": 5 })),
    )
    .await;
    let id = id_of(&s);
    assert_eq!(s["status"], "awaiting_confirmation");
    let expired = app
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["status"] != "awaiting_confirmation"
        })
        .await;
    assert_eq!(expired["status"], "stopped", "{expired}");
    assert_eq!(expired["reason"], "confirmation_expired", "{expired}");
    assert!(
        expired["summary"]
            .as_str()
            .unwrap_or("")
            .contains("nobody confirmed it"),
        "{expired}"
    );
    assert_eq!(expired["iterations"], 0);
    let (status, _) = app
        .post(&format!("/api/autonomous/{id}/confirm"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

/// Bodies a fake receiver got.
type Got = Arc<Mutex<Vec<Value>>>;

async fn receive(State(got): State<Got>, body: Bytes) -> &'static str {
    if let Ok(doc) = serde_json::from_slice(&body) {
        got.lock().unwrap().push(doc);
    }
    "ok"
}

#[tokio::test]
async fn the_tenant_target_hears_that_a_session_awaits_confirmation_once() {
    let app = TestApp::start().await;
    let got: Got = Arc::default();
    let router = Router::new()
        .route("/hook", post(receive))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    let admin = create_key(&app.base, common::TEST_TENANT, "admin").await;
    let admin = client_with_key(admin["secret"].as_str().unwrap());
    let res = admin
        .put(app.url("/api/notify"))
        .json(&json!({ "url": format!("http://{addr}/hook") }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);

    let s = create(
        &app,
        body("Write the release notes", 2, json!({ "minutes": 5 })),
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the confirmation is notified",
        || async { !got.lock().unwrap().is_empty() },
    )
    .await;
    // Notifications are delivered in order: once the stop's arrives, a
    // duplicate (the status change) would have arrived before it.
    let id = id_of(&s);
    let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
    let delivered = |kind: &'static str| {
        let got = got.clone();
        move || {
            let got = got.clone();
            async move { got.lock().unwrap().iter().any(|b| b["type"] == kind) }
        }
    };
    eventually(
        Duration::from_secs(5),
        "the stop is notified",
        delivered("session.ended"),
    )
    .await;
    let bodies: Vec<Value> = got
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b["type"] != "session.ended")
        .cloned()
        .collect();
    assert_eq!(
        bodies.len(),
        1,
        "one notification before the end: {bodies:?}"
    );
    let b = &bodies[0];
    assert_eq!(b["type"], "session.awaiting_confirmation", "{b}");
    assert_eq!(b["data"]["session_id"], s["id"], "{b}");
    assert_eq!(b["data"]["event"]["estimate"]["basis"], "none", "{b}");
}
