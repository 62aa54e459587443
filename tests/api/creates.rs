//! Creates are atomic and safe to retry: an error answer means nothing was
//! created, and an `Idempotency-Key` makes a retried create answer the
//! session the first one made.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, client_with_key, config_with, create_key};

/// Sessions stored, of every tenant.
async fn stored_sessions(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(pool)
        .await
        .expect("count")
}

fn scripted(goal: &str) -> Value {
    json!({
        "goal": goal,
        "executor": { "kind": "scripted", "steps": [{ "action": "a", "delay_ms": 600_000 }] }
    })
}

async fn create_with_key(
    client: &reqwest::Client,
    app: &TestApp,
    key: Option<&str>,
    body: &Value,
) -> (StatusCode, Option<String>, Value) {
    let mut req = client.post(app.url("/api/autonomous")).json(body);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let res = req.send().await.expect("sent");
    let status = res.status();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, replayed, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_create_that_cannot_make_its_workspace_answers_503_and_leaves_nothing() {
    // A file where the workspace root should be: no directory can be made under it.
    let blocker = std::env::temp_dir().join(format!("warden-not-a-dir-{}", uuid::Uuid::new_v4()));
    std::fs::write(&blocker, "a file").expect("file");
    let root = blocker.to_string_lossy().to_string();
    let app = TestApp::start_with(config_with(&[("WARDEN_WORKSPACE_ROOT", root.as_str())])).await;
    let body = json!({
        "goal": "Write notes.md with three lines about the project",
        "executor": { "kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m" }
    });
    for _ in 0..3 {
        let (status, _, problem) = create_with_key(&app.client, &app, None, &body).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("workspace") && d.contains("nothing was created")),
            "{problem}"
        );
    }
    assert_eq!(
        stored_sessions(app.pool()).await,
        0,
        "a 503 created nothing"
    );
    let (status, list) = app.get("/api/autonomous").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"], json!([]));
    // A session that needs no workspace is created as usual.
    let (status, _, created) =
        create_with_key(&app.client, &app, None, &scripted("Write the changelog")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    app.post(
        &format!("/api/autonomous/{}/stop", created["id"].as_str().unwrap()),
        None,
    )
    .await;
    let _ = std::fs::remove_file(&blocker);
}

#[tokio::test]
async fn a_retried_create_with_the_same_idempotency_key_answers_the_first_session() {
    let app = TestApp::start().await;
    let body = scripted("Write the changelog for the release");
    let (status, replayed, first) =
        create_with_key(&app.client, &app, Some("retry-1"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(replayed, None);
    let id = first["id"].as_str().expect("id").to_string();

    // The same body in another layout is the same request.
    let relaid: Value =
        serde_json::from_str(&serde_json::to_string_pretty(&body).unwrap()).unwrap();
    let (status, replayed, again) =
        create_with_key(&app.client, &app, Some("retry-1"), &relaid).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again["id"], id);
    assert_eq!(stored_sessions(app.pool()).await, 1);

    // The same key with another body is refused, and creates nothing.
    let (status, _, problem) = create_with_key(
        &app.client,
        &app,
        Some("retry-1"),
        &scripted("Write something else entirely"),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["code"], "idempotency_key_reused");
    assert_eq!(stored_sessions(app.pool()).await, 1);

    // Keys are per tenant: another tenant's same key is its own.
    let other = client_with_key(
        create_key(&app.base, "other", "operator").await["secret"]
            .as_str()
            .expect("secret"),
    );
    let (status, replayed, theirs) = create_with_key(&other, &app, Some("retry-1"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    assert_eq!(replayed, None);
    assert_ne!(theirs["id"], id);

    // Malformed keys are refused before anything happens.
    for bad in ["", &"k".repeat(256), "has space"] {
        let (status, _, problem) = create_with_key(&app.client, &app, Some(bad), &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {problem}");
    }
    assert_eq!(stored_sessions(app.pool()).await, 2);

    // A deleted session frees its key.
    app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let (status, replayed, fresh) =
        create_with_key(&app.client, &app, Some("retry-1"), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{fresh}");
    assert_eq!(replayed, None);
    assert_ne!(fresh["id"], id);
    app.post(
        &format!("/api/autonomous/{}/stop", fresh["id"].as_str().unwrap()),
        None,
    )
    .await;
    other
        .post(app.url(&format!(
            "/api/autonomous/{}/stop",
            theirs["id"].as_str().unwrap()
        )))
        .send()
        .await
        .expect("sent");
}

#[tokio::test]
async fn concurrent_creates_with_one_idempotency_key_make_one_session() {
    let app = TestApp::start().await;
    let body = scripted("Write the migration guide");
    let answers = futures::future::join_all(
        (0..8).map(|_| create_with_key(&app.client, &app, Some("burst"), &body)),
    )
    .await;
    let mut ids = std::collections::BTreeSet::new();
    for (status, _, doc) in &answers {
        assert_eq!(*status, StatusCode::CREATED, "{doc}");
        ids.insert(doc["id"].as_str().expect("id").to_string());
    }
    assert_eq!(ids.len(), 1, "one session for one key: {ids:?}");
    assert_eq!(
        answers.iter().filter(|(_, r, _)| r.is_none()).count(),
        1,
        "exactly one answer is the original"
    );
    assert_eq!(stored_sessions(app.pool()).await, 1);
    let id = ids.into_iter().next().unwrap();
    app.post(&format!("/api/autonomous/{id}/stop"), None).await;
}
