//! The OpenAPI document is exact: what it says a body, parameter or answer
//! looks like is what the server takes and sends.

use crate::common;

use common::TestApp;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (StatusCode, String, Value) {
    let mut req = app.client.request(method, app.url(path));
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let res = req.body(body.to_string()).send().await.unwrap();
    let status = res.status();
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = res.json().await.unwrap_or(Value::Null);
    (status, ct, body)
}

fn assert_invalid(got: (StatusCode, String, Value), mention: &str) {
    let (status, ct, body) = got;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(ct, "application/problem+json");
    let detail = crate::common::problem(&body).detail;
    assert!(
        detail.contains(mention),
        "{detail:?} should mention {mention:?}"
    );
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn arrays_in_place_of_objects_are_rejected_with_their_path() {
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let post = reqwest::Method::POST;
    let create = |body: Value| {
        let app = &app;
        let post = post.clone();
        async move { send(app, post, "/api/autonomous", JSON, &body.to_string()).await }
    };
    assert_invalid(
        create(json!(["Write arr.txt", null, {}, {"kind": "scripted", "steps": [["a"]]}])).await,
        "expected an object, got an array",
    );
    assert_invalid(
        create(json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [["a"]] } })).await,
        "`executor.steps[0]`",
    );
    assert_invalid(
        create(json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [{ "action": "a", "colour": 1 }] } }))
            .await,
        "`executor.steps[0]`: unknown field `colour`",
    );
    assert_invalid(
        create(json!({ "goal": "x", "limits": [5], "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }))
            .await,
        "`limits`",
    );
    assert_invalid(
        create(json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [{ "action": "a", "files": [{ "digest": "d" }] }] } }))
            .await,
        "path",
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "no array body created a session");

    let id = app
        .create_scripted(
            json!([{ "action": "a", "output": "<<WARDEN_GOAL_BLOCKED: help>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&id).await;
    let path = format!("/api/autonomous/{id}");
    assert_invalid(
        send(&app, reqwest::Method::PATCH, &path, JSON, r#"["fixed"]"#).await,
        "expected an object",
    );
    // Every tagged variant rejects unknown fields, the field-less one too.
    let refine = format!("/api/autonomous/{id}/refinement");
    assert_invalid(
        send(
            &app,
            reqwest::Method::POST,
            &refine,
            JSON,
            r#"{"choice":"accept_suggestion","extra":1}"#,
        )
        .await,
        "unknown field `extra`",
    );
    assert_invalid(
        send(
            &app,
            reqwest::Method::POST,
            &refine,
            JSON,
            r#"{"choice":"custom","goal":"g","extra":1}"#,
        )
        .await,
        "extra",
    );
}

#[tokio::test]
async fn resume_takes_no_body_or_null_as_no_changes() {
    let app = TestApp::start().await;
    for body in [None, Some("null"), Some("  ")] {
        let id = app
            .create_scripted(
                json!([{ "action": "a", "output": "<<WARDEN_GOAL_BLOCKED: help>>" }, { "action": "b" }]),
                json!({}),
            )
            .await;
        let before = app.wait_settled(&id).await;
        let path = format!("/api/autonomous/{id}/resume");
        let (status, _, doc) = match body {
            None => send(&app, reqwest::Method::POST, &path, None, "").await,
            Some(text) => send(&app, reqwest::Method::POST, &path, JSON, text).await,
        };
        assert_eq!(status, StatusCode::OK, "{body:?}: {doc}");
        assert_eq!(doc["run"], before["run"].as_i64().unwrap() + 1);
        assert_eq!(doc["limits"], before["limits"], "no changes");
    }
    // A non-JSON body is still refused.
    let id = app
        .create_scripted(
            json!([{ "action": "a", "output": "<<WARDEN_GOAL_BLOCKED: help>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&id).await;
    let (status, ct, _) = send(
        &app,
        reqwest::Method::POST,
        &format!("/api/autonomous/{id}/resume"),
        Some("text/plain"),
        "hello",
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(ct, "application/problem+json");
}

#[tokio::test]
async fn every_4xx_is_a_problem_and_413_names_the_limit() {
    let config = common::test_config();
    let limit = config.max_body_bytes;
    let app = TestApp::start_with(config).await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let (status, ct, body) = send(&app, reqwest::Method::DELETE, path, None, "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(ct, "application/problem+json", "{path}");
        assert_eq!(body["code"], "method_not_allowed", "{path}");
    }
    let big = json!({ "goal": "x".repeat(limit + 1) }).to_string();
    let (status, ct, body) = send(&app, reqwest::Method::POST, "/api/autonomous", JSON, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(ct, "application/problem+json");
    let detail = crate::common::problem(&body).detail;
    assert!(detail.contains(&format!("{limit} bytes")), "{detail}");

    // Out-of-range or unknown query parameters: 400, as documented.
    let id = app
        .create_scripted(json!([{ "action": "a" }]), json!({}))
        .await;
    for what in [
        "iterations",
        "checkpoints",
        "events",
        "decisions",
        "reflections",
    ] {
        let ok = format!("/api/autonomous/{id}/{what}?limit=500");
        assert_eq!(app.get(&ok).await.0, StatusCode::OK, "{ok}");
        for bad in ["limit=501", "limit=0", "colour=red"] {
            let path = format!("/api/autonomous/{id}/{what}?{bad}");
            assert_eq!(app.get(&path).await.0, StatusCode::BAD_REQUEST, "{path}");
        }
        // Not an id in its one spelling: no such session.
        let path = format!("/api/autonomous/not-a-uuid/{what}");
        assert_eq!(app.get(&path).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    assert_eq!(app.get("/api/autonomous?limit=200").await.0, StatusCode::OK);
    assert_eq!(
        app.get("/api/autonomous?limit=201").await.0,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn the_session_list_stream_refuses_clients_that_take_no_stream() {
    let app = TestApp::start().await;
    let res = app
        .client
        .get(app.url("/api/autonomous/events"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_ACCEPTABLE);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn the_docs_page_loads_nothing_from_elsewhere() {
    let app = TestApp::start().await;
    let res = app
        .client
        .get(app.url("/docs/swagger-initializer.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let script = res.text().await.unwrap();
    let compact: String = script.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(compact.contains(r#""validatorUrl":"none""#), "{script}");
    assert!(compact.contains(r#""url":"/openapi.json""#), "{script}");
}

#[tokio::test]
async fn documented_answers_of_the_event_operations_are_streams_as_text() {
    let app = TestApp::start().await;
    let (_, doc) = app.get("/openapi.json").await;
    for path in ["/api/autonomous/{id}/events", "/api/autonomous/events"] {
        // One event per schema (OpenAPI 3.1 on `text/event-stream`): the SSE
        // fields, `data` a string holding the payload as JSON.
        let media = &doc["paths"][path]["get"]["responses"]["200"]["content"]["text/event-stream"];
        let reference = media["schema"]["$ref"].as_str().expect("a frame schema");
        let frame = doc
            .pointer(reference.trim_start_matches('#'))
            .expect("frame defined");
        assert_eq!(frame["type"], "object", "{path}");
        assert_eq!(frame["properties"]["data"]["type"], "string", "{path}");
        let payload = frame["properties"]["data"]["contentSchema"]["$ref"]
            .as_str()
            .unwrap();
        assert!(
            doc.pointer(payload.trim_start_matches('#')).is_some(),
            "{payload}"
        );
    }
    let resume = &doc["paths"]["/api/autonomous/{id}/resume"]["post"]["requestBody"];
    assert_ne!(resume["required"], json!(true), "resume's body is optional");
}
