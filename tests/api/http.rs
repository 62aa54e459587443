//! The HTTP contract: bad input answers a clear 4xx problem document and
//! changes nothing; health probes; the committed OpenAPI document.

use crate::common;

use common::{TestApp, distinct_steps};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn raw_post(
    app: &TestApp,
    path: &str,
    content_type: &str,
    body: &str,
) -> (StatusCode, String, Value) {
    let res = app
        .client
        .post(app.url(path))
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
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

fn assert_problem(status: StatusCode, ct: &str, body: &Value, expected: StatusCode, mention: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(ct, "application/problem+json");
    assert_eq!(body["status"], expected.as_u16());
    let detail = crate::common::problem(body).detail;
    assert!(
        detail.contains(mention),
        "detail {detail:?} should mention {mention:?}"
    );
    assert!(body["code"].is_string());
    assert!(body["title"].is_string());
}

#[tokio::test]
async fn bad_create_requests_get_clear_problems_and_create_nothing() {
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let valid_executor = json!({ "kind": "scripted", "steps": [{ "action": "a" }] });
    let cases: Vec<(String, StatusCode, &str)> = vec![
        ("{\"goal\": ".into(), StatusCode::BAD_REQUEST, "malformed JSON"),
        ("[1, 2".into(), StatusCode::BAD_REQUEST, "malformed JSON"),
        ("".into(), StatusCode::BAD_REQUEST, "required"),
        (json!({ "goal": "x", "executor": valid_executor, "colour": "red" }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "colour"),
        (json!({ "executor": valid_executor }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "goal"),
        (json!({ "goal": "x" }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "executor"),
        (json!({ "goal": "  ", "executor": valid_executor }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "goal"),
        (json!({ "goal": "x", "mode": "turbo", "executor": valid_executor }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "turbo"),
        (json!({ "goal": "x", "executor": valid_executor, "limits": { "max_iterations": 0 } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "max_iterations"),
        (json!({ "goal": "x", "executor": valid_executor, "limits": { "max_tokens": -5 } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "max_tokens"),
        (json!({ "goal": "x", "executor": valid_executor, "limits": { "max_wall_time_ms": 5 } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "max_wall_time_ms"),
        (json!({ "goal": "x", "executor": valid_executor, "limits": { "speed": 5 } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "speed"),
        (json!({ "goal": "x", "executor": { "kind": "quantum" } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "quantum"),
        (json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [] } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "steps"),
        (json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [{ "action": "a", "delay_ms": 99_999_999 }] } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "delay_ms"),
        (json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [{ "action": "a", "outcome": "meh" }] } }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "meh"),
        (json!({ "goal": "x".repeat(20_000), "executor": valid_executor }).to_string(), StatusCode::UNPROCESSABLE_ENTITY, "goal"),
    ];
    for (body, expected, mention) in cases {
        let (status, ct, problem) =
            raw_post(&app, "/api/autonomous", "application/json", &body).await;
        assert_problem(status, &ct, &problem, expected, mention);
    }
    let (status, ct, problem) = raw_post(&app, "/api/autonomous", "text/plain", "{}").await;
    assert_problem(
        status,
        &ct,
        &problem,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "application/json",
    );
    let huge = json!({ "goal": "x", "executor": { "kind": "scripted", "steps": [{ "action": "a", "output": "y".repeat(2_000_000) }] } });
    let (status, ct, problem) = raw_post(
        &app,
        "/api/autonomous",
        "application/json",
        &huge.to_string(),
    )
    .await;
    assert_problem(status, &ct, &problem, StatusCode::PAYLOAD_TOO_LARGE, "");

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "no bad request created a session");
}

#[tokio::test]
async fn unknown_ids_routes_and_methods_answer_problems() {
    let app = TestApp::start().await;
    let missing = uuid::Uuid::new_v4();
    for path in [
        format!("/api/autonomous/{missing}"),
        format!("/api/autonomous/{missing}/iterations"),
        format!("/api/autonomous/{missing}/checkpoints"),
        format!("/api/autonomous/{missing}/events"),
        format!("/api/autonomous/{missing}/decisions"),
    ] {
        let (status, body) = app.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["code"], "session_not_found");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains(&missing.to_string())
        );
    }
    for action in ["stop", "pause", "resume"] {
        let (status, body) = app
            .post(&format!("/api/autonomous/{missing}/{action}"), None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{action}: {body}");
    }
    let (status, body) = app
        .patch(
            &format!("/api/autonomous/{missing}"),
            json!({ "mode": "fixed" }),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Not a session id in its one spelling: no such session.
    let (status, body) = app.get("/api/autonomous/not-a-uuid").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "session_not_found");

    let (status, body) = app.get("/api/autonomous?status=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = app.get("/api/autonomous?cursor=garbage").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("cursor"));
    let (status, _) = app.get("/api/autonomous?limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = app.get("/no/such/route").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "not_found");
    let res = app
        .client
        .delete(app.url("/api/autonomous"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        res.headers().get("content-type").unwrap(),
        "application/problem+json"
    );
}

#[tokio::test]
async fn bad_resume_and_update_bodies_change_nothing() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            json!([{ "action": "a", "output": "<<WARDEN_GOAL_BLOCKED: help>>" }]),
            json!({}),
        )
        .await;
    let before = app.wait_settled(&id).await;
    let (status, ct, problem) = raw_post(
        &app,
        &format!("/api/autonomous/{id}/resume"),
        "application/json",
        "{\"guidance\": 5}",
    )
    .await;
    assert_problem(
        status,
        &ct,
        &problem,
        StatusCode::UNPROCESSABLE_ENTITY,
        "guidance",
    );
    let (status, ct, problem) = raw_post(
        &app,
        &format!("/api/autonomous/{id}/resume"),
        "application/json",
        &json!({ "limits": { "max_iterations": 0 } }).to_string(),
    )
    .await;
    assert_problem(
        status,
        &ct,
        &problem,
        StatusCode::UNPROCESSABLE_ENTITY,
        "max_iterations",
    );
    let (status, problem) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "limits": { "checkpoint_interval": 0 } }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    let (status, problem) = app
        .patch(&format!("/api/autonomous/{id}"), json!({ "mood": "happy" }))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    let after = app.session(&id).await;
    assert_eq!(after["status"], before["status"]);
    assert_eq!(after["limits"], before["limits"]);
    assert_eq!(after["last_event_seq"], before["last_event_seq"]);
}

#[tokio::test]
async fn health_and_readiness() {
    let app = TestApp::start().await;
    let (status, body) = app.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

#[tokio::test]
async fn dashboard_is_served_self_contained() {
    let app = TestApp::start().await;
    // No key needed for the page and its files (the API behind them asks for one).
    let plain = reqwest::Client::new();
    let res = plain.get(app.url("/")).send().await.expect("GET /");
    assert_eq!(res.status(), StatusCode::OK);
    let header = |res: &reqwest::Response, name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert!(header(&res, "content-type").starts_with("text/html"));
    let csp = header(&res, "content-security-policy");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    let html = res.text().await.expect("body");
    // Works offline: nothing is loaded from another origin.
    for external in ["src=\"http", "href=\"http", "@import", "cdn"] {
        assert!(!html.contains(external), "external resource: {external}");
    }
    for (path, kind) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/style.css", "text/css"),
        ("/assets/vendor/uPlot.iife.min.js", "text/javascript"),
        ("/assets/vendor/uPlot.min.css", "text/css"),
    ] {
        assert!(html.contains(path), "the page loads {path}");
        let res = plain.get(app.url(path)).send().await.expect("asset");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        assert!(header(&res, "content-type").starts_with(kind), "{path}");
        assert_eq!(header(&res, "cache-control"), "no-cache");
        let etag = header(&res, "etag");
        assert!(etag.starts_with('"'), "{path}: {etag}");
        let body = res.text().await.expect("body");
        if path == "/assets/app.js" {
            assert!(body.contains("/api/autonomous"), "uses the public API");
        }
        // The browser's copy stays good until a build changes the bytes.
        let again = plain
            .get(app.url(path))
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("revalidate");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
    }
    let res = plain
        .get(app.url("/assets/nope.js"))
        .send()
        .await
        .expect("unknown");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = plain
        .get(app.url("/assets/vendor%2F..%2F..%2FCargo.toml"))
        .send()
        .await
        .expect("escape");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = plain
        .post(app.url("/assets/app.js"))
        .send()
        .await
        .expect("post");
    assert!(res.status().is_client_error(), "{}", res.status());
}

#[tokio::test]
async fn status_reports_cost_and_velocity() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let config = common::config_with(&[("WARDEN_MODEL_PRICES", "*=2.5/2.5")]);
    let app = TestApp::spawn_with(pool.clone(), config).await;
    let id = app
        .create_scripted(
            distinct_steps(4, 100_000, 0),
            json!({ "max_iterations": 4 }),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["tokens_used"], 400_000);
    assert_eq!(s["cost_usd"], "1", "{s}");
    assert_eq!(s["unpriced_steps"], 0, "{s}");
    let velocity = s["velocity"].as_array().expect("velocity series");
    let total: u64 = velocity
        .iter()
        .map(|p| p["iterations"].as_u64().expect("iterations"))
        .sum();
    assert_eq!(total, 4, "{velocity:?}");
    assert!(velocity.iter().all(|p| p["minute"].is_string()));

    // The cost was committed with the steps: a replica without a price
    // table shows it too. Lists leave the series out.
    let plain = TestApp::spawn(pool).await;
    let s = plain.session(&id).await;
    assert_eq!(s["cost_usd"], "1", "{s}");
    let (_, page) = plain.get("/api/autonomous").await;
    assert!(page["items"][0].get("velocity").is_none_or(Value::is_null));
}

#[tokio::test]
async fn status_document_has_the_contract_fields() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(2, 5, 0), json!({ "max_iterations": 7 }))
        .await;
    let s = app.wait_settled(&id).await;
    for field in [
        "id",
        "goal",
        "mode",
        "status",
        "reason",
        "summary",
        "iterations",
        "tokens_used",
        "percent_complete",
        "eta_seconds",
        "limits",
        "created_at",
        "updated_at",
        "ended_at",
        "checkpoint_saved",
        "next_steps",
    ] {
        assert!(s.get(field).is_some(), "missing {field}: {s}");
    }
    assert_eq!(s["limits"]["max_iterations"], 7);
    assert_eq!(s["executor"]["kind"], "scripted");
    assert_eq!(s["executor"]["steps"], 2);
}

#[tokio::test]
async fn served_openapi_matches_the_committed_document() {
    let app = TestApp::start().await;
    let (status, served) = app.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .expect("openapi/openapi.json is committed"),
    )
    .expect("committed document is JSON");
    assert!(
        served == committed,
        "openapi/openapi.json is stale: regenerate it with `cargo run -- openapi > openapi/openapi.json`"
    );
    for path in [
        "/api/autonomous",
        "/api/autonomous/{id}",
        "/api/autonomous/{id}/stop",
        "/api/autonomous/{id}/pause",
        "/api/autonomous/{id}/resume",
        "/api/autonomous/{id}/iterations",
        "/api/autonomous/{id}/checkpoints",
        "/api/autonomous/{id}/events",
        "/api/autonomous/{id}/decisions",
        "/api/autonomous/{id}/reflections",
        "/api/autonomous/{id}/refinement",
        "/api/autonomous/{id}/refinements",
        "/api/autonomous/{id}/tasks",
        "/api/autonomous/outcomes",
    ] {
        assert!(served["paths"].get(path).is_some(), "{path} undocumented");
    }
    let res = app.client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("swagger"));
}
