//! Keys, roles, tenants and cross-site rules: an auth matrix
//! generated from the committed OpenAPI document, tenant isolation, key
//! revocation, protected mode, and no secret in any answer or log line.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use warden::Application;

use crate::common::{ADMIN_TOKEN, TestApp, Warden, client_with_key, config_with, create_key};

fn committed_document() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .expect("openapi/openapi.json is committed");
    serde_json::from_str(&text).expect("JSON")
}

/// Every operation of the document: (method, path template).
fn operations(doc: &Value) -> Vec<(Method, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            out.push((method, path.clone()));
        }
    }
    out
}

async fn call(
    app: &TestApp,
    method: &Method,
    path: &str,
    key: Option<&str>,
) -> (StatusCode, String, Value) {
    // A body the operation takes, so the answer is about the key and the
    // session, not about the body.
    let body = crate::common::valid_body(method, &template_of(path)).unwrap_or(json!({}));
    let mut req = reqwest::Client::new()
        .request(method.clone(), app.url(path))
        .json(&body);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    crate::common::answer_of(req).await
}

/// The template of a session path: its id segment as `{id}`.
fn template_of(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            if uuid::Uuid::try_parse(segment).is_ok() {
                "{id}"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn secret(doc: &Value) -> String {
    doc["secret"].as_str().expect("secret").to_string()
}

#[tokio::test]
async fn auth_matrix_over_every_documented_operation() {
    let app = TestApp::start().await;
    let operator_a = secret(&create_key(&app.base, "a", "operator").await);
    let viewer_a = secret(&create_key(&app.base, "a", "viewer").await);
    let operator_b = secret(&create_key(&app.base, "b", "operator").await);
    let revoked = create_key(&app.base, "a", "operator").await;
    let revoked_key = secret(&revoked);
    let res = reqwest::Client::new()
        .delete(app.url(&format!("/api/keys/{}", revoked["id"].as_str().unwrap())))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let spare_key = create_key(&app.base, "a", "viewer").await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let a = TestApp::connect(None, app.base.clone()).await;
    let a = TestApp {
        client: client_with_key(&operator_a),
        key: operator_a.clone(),
        ..a
    };
    let session = a
        .create_scripted(json!([{ "action": "a", "delay_ms": 60000 }]), json!({}))
        .await;

    let doc = committed_document();
    let ops = operations(&doc);
    assert!(ops.len() >= 20, "the document lists every operation");
    let malformed = "wdn_not-a-key";
    for (method, template) in &ops {
        let id = if template.starts_with("/api/keys/") {
            spare_key.as_str()
        } else {
            session.as_str()
        };
        let path = template.replace("{id}", id);
        if matches!(template.as_str(), "/healthz" | "/readyz") {
            let (status, _, _) = call(&app, method, &path, None).await;
            assert_eq!(status, StatusCode::OK, "{method} {template} is open");
            // Open, and the document says so outright.
            assert_eq!(
                doc["paths"][template][method.as_str().to_lowercase()]["security"],
                json!([]),
                "{method} {template}"
            );
            continue;
        }
        assert!(
            doc["paths"][template][method.as_str().to_lowercase()]
                .get("security")
                .is_some(),
            "{method} {template} documents that it needs a key"
        );
        let mut cases: Vec<(&str, Option<&str>, StatusCode)> = vec![
            ("no key", None, StatusCode::UNAUTHORIZED),
            ("malformed key", Some(malformed), StatusCode::UNAUTHORIZED),
            ("revoked key", Some(&revoked_key), StatusCode::UNAUTHORIZED),
        ];
        let admin_only = template.starts_with("/api/keys")
            || template == "/metrics"
            || template == "/api/insights/thresholds/apply";
        if *method != Method::GET || admin_only {
            cases.push(("viewer", Some(&viewer_a), StatusCode::FORBIDDEN));
        }
        if admin_only {
            cases.push(("operator", Some(&operator_b), StatusCode::FORBIDDEN));
        } else if template.contains("{id}") {
            cases.push((
                "operator of another tenant",
                Some(&operator_b),
                StatusCode::NOT_FOUND,
            ));
        }
        for (case, key, expected) in cases {
            let (status, ct, body) = call(&app, method, &path, key).await;
            assert_eq!(status, expected, "{method} {template} with {case}: {body}");
            assert_eq!(ct, "application/problem+json", "{method} {template} {case}");
            assert_eq!(
                body["status"],
                expected.as_u16(),
                "{method} {template} {case}"
            );
        }
    }

    // Collections of another tenant hold nothing of tenant a.
    let b = client_with_key(&operator_b);
    let list: Value = b
        .get(app.url("/api/autonomous"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"], json!([]));
    let outcomes: Value = b
        .get(app.url("/api/autonomous/outcomes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(outcomes["by_status"], json!({}), "{outcomes}");
    // The same answer as a session that does not exist.
    let (_, _, other) = call(
        &app,
        &Method::GET,
        &format!("/api/autonomous/{session}"),
        Some(&operator_b),
    )
    .await;
    let missing = uuid::Uuid::new_v4();
    let (_, _, none) = call(
        &app,
        &Method::GET,
        &format!("/api/autonomous/{missing}"),
        Some(&operator_b),
    )
    .await;
    assert_eq!(other["code"], none["code"]);
    assert_eq!(
        other["detail"].as_str().unwrap().replace(&session, "ID"),
        none["detail"]
            .as_str()
            .unwrap()
            .replace(&missing.to_string(), "ID")
    );
    a.post(&format!("/api/autonomous/{session}/stop"), None)
        .await;
}

#[tokio::test]
async fn tenants_see_only_their_sessions_and_admins_see_all() {
    let app = TestApp::start().await;
    let b_key = secret(&create_key(&app.base, "b", "operator").await);
    let viewer_b = secret(&create_key(&app.base, "b", "viewer").await);
    let mine = app
        .create_scripted(
            json!([{ "action": "finish", "output": "<<WARDEN_GOAL_DONE: ok>>" }]),
            json!({}),
        )
        .await;
    let b = TestApp {
        client: client_with_key(&b_key),
        key: b_key.clone(),
        ..TestApp::connect(None, app.base.clone()).await
    };
    let theirs = b
        .create_scripted(
            json!([{ "action": "finish", "output": "<<WARDEN_GOAL_DONE: ok>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&mine).await;
    b.wait_settled(&theirs).await;

    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, list) = app.get("/api/autonomous").await;
    assert_eq!(ids(&list), vec![mine.clone()]);
    let (_, list) = b.get("/api/autonomous").await;
    assert_eq!(ids(&list), vec![theirs.clone()]);
    let (status, _) = b.get(&format!("/api/autonomous/{mine}/iterations")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A viewer reads its tenant's sessions, and cannot stop them.
    let viewer = client_with_key(&viewer_b);
    let res = viewer
        .get(app.url(&format!("/api/autonomous/{theirs}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = viewer
        .post(app.url(&format!("/api/autonomous/{theirs}/stop")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);

    let admin: Value = app.admin_get("/api/autonomous").await.json().await.unwrap();
    let mut all = ids(&admin);
    all.sort();
    let mut both = vec![mine.clone(), theirs.clone()];
    both.sort();
    assert_eq!(all, both);
    let only_b: Value = app
        .admin_get("/api/autonomous?tenant=b")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(ids(&only_b), vec![theirs.clone()]);
    let outcomes: Value = b.get("/api/autonomous/outcomes").await.1;
    assert_eq!(outcomes["by_status"], json!({ "completed": 1 }));

    // The live list stream of tenant b carries only b's session.
    let res = b
        .client
        .get(app.url("/api/autonomous/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut res = res;
    let mut text = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline && !text.contains(&theirs) {
        match tokio::time::timeout(std::time::Duration::from_millis(500), res.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    assert!(text.contains(&theirs), "{text}");
    assert!(!text.contains(&mine), "{text}");
}

#[tokio::test]
async fn keys_are_listed_without_secrets_and_revoked_at_once() {
    let app = TestApp::start().await;
    let created = create_key(&app.base, "acme", "viewer").await;
    let key = secret(&created);
    assert!(key.starts_with("wdn_") && key.len() >= 40);
    assert!(key.starts_with(created["prefix"].as_str().unwrap()));
    let viewer = client_with_key(&key);
    let res = viewer.get(app.url("/api/autonomous")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let listed = app.admin_get("/api/keys").await.text().await.unwrap();
    assert!(!listed.contains(&key), "no secret in the key list");
    assert!(!listed.contains("hash"));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let row = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == created["id"])
        .cloned()
        .unwrap();
    assert_eq!(row["tenant"], "acme");
    assert_eq!(row["role"], "viewer");
    // last_used_at is written in the background, once.
    let mut used = row["last_used_at"].is_string();
    for _ in 0..50 {
        if used {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let listed: Value = app.admin_get("/api/keys").await.json().await.unwrap();
        used = listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["id"] == created["id"] && k["last_used_at"].is_string());
    }
    assert!(used, "last_used_at is recorded");

    let res = reqwest::Client::new()
        .delete(app.url(&format!("/api/keys/{}", created["id"].as_str().unwrap())))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = viewer.get(app.url("/api/autonomous")).send().await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "revocation is immediate"
    );

    // Bad requests to the key endpoints.
    let res = reqwest::Client::new()
        .post(app.url("/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": "a b", "role": "viewer" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let res = reqwest::Client::new()
        .post(app.url("/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": "a", "role": "root" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn cross_site_requests_cannot_change_state() {
    let app = TestApp::start().await;
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .header("origin", "http://evil.example")
        .json(
            &json!({ "goal": "Create README.md with a project description", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // The same origin is fine.
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .header("origin", app.base.clone())
        .json(
            &json!({ "goal": "Create README.md with a project description", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn auth_off_serves_loopback_names_and_json_writes_only() {
    let config = config_with(&[("WARDEN_ADMIN_TOKEN", "")]);
    assert!(config.auth.admin_token.is_none());
    let app = TestApp::start_with(config).await;
    assert!(
        app.key.is_empty(),
        "protected mode: no key needed on loopback"
    );
    let id = app
        .create_scripted(
            json!([{ "action": "finish", "output": "<<WARDEN_GOAL_DONE: ok>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&id).await;
    // A form post (no JSON content type, as another site could send) is refused.
    let res = app
        .client
        .post(app.url(&format!("/api/autonomous/{id}/stop")))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("a=b")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // DNS rebinding: a foreign name pointing at 127.0.0.1.
    let res = app
        .client
        .get(app.url("/api/autonomous"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = app
        .client
        .get(app.url("/api/autonomous"))
        .header("host", "localhost")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn forced_off_serves_loopback_host_names_only() {
    // WARDEN_AUTH=off (here with an admin token set too, which it overrides):
    // a page on a foreign name that resolves to this machine must not be
    // able to read or drive sessions, just as in protected mode.
    let app = TestApp::start_with(config_with(&[("WARDEN_AUTH", "off")])).await;
    assert!(app.key.is_empty(), "auth off: no key needed");
    for host in [
        "evil.example",
        "evil.example:8080",
        "10.0.0.1",
        "localhost.evil.com",
    ] {
        let res = app
            .client
            .get(app.url("/api/autonomous"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{host}");
        let body: Value = res.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains("loopback"),
            "{body}"
        );
        let res = app
            .client
            .post(app.url("/api/autonomous"))
            .header("host", host)
            .json(&json!({ "goal": "Create README.md with a project description", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{host}");
    }
    for host in ["localhost", "localhost:1234", "127.0.0.1:9", "[::1]:80"] {
        let res = app
            .client
            .get(app.url("/api/autonomous"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{host}");
    }
}

#[tokio::test]
async fn no_auth_beyond_loopback_refuses_to_start_unless_forced_off() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let config = config_with(&[
        ("WARDEN_ADMIN_TOKEN", ""),
        ("WARDEN_LISTEN_ADDR", "0.0.0.0:0"),
    ]);
    let err =
        match Application::build_with_store(config, crate::common::store_on(pool.clone())).await {
            Ok(_) => panic!("started without auth on every interface"),
            Err(err) => err.to_string(),
        };
    assert!(
        err.contains("WARDEN_ADMIN_TOKEN") && err.contains("WARDEN_AUTH=off"),
        "{err}"
    );
    let config = config_with(&[
        ("WARDEN_ADMIN_TOKEN", ""),
        ("WARDEN_LISTEN_ADDR", "0.0.0.0:0"),
        ("WARDEN_AUTH", "off"),
    ]);
    let app = Application::build_with_store(config, crate::common::store_on(pool.clone()))
        .await
        .expect("WARDEN_AUTH=off starts");
    app.shutdown().await.unwrap();
    // With an admin token, every interface is fine.
    let config = config_with(&[("WARDEN_LISTEN_ADDR", "0.0.0.0:0")]);
    let app = Application::build_with_store(config, crate::common::store_on(pool))
        .await
        .expect("with a token it starts");
    app.shutdown().await.unwrap();
}

#[tokio::test]
async fn no_answer_and_no_log_line_carries_a_secret() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let metrics_token = "metrics-token-5e6f7a8b9c0d1e2f";
    let llm_key = "sk-server-llm-key-1a2b3c4d5e6f";
    let process = Warden::on(&pool)
        .envs(&[
            ("RUST_LOG", "debug"),
            ("WARDEN_METRICS_TOKEN", metrics_token),
            ("WARDEN_LLM_BASE_URL", "http://127.0.0.1:9/v1"),
            ("WARDEN_LLM_API_KEY", llm_key),
            ("WARDEN_EGRESS_ALLOW", "127.0.0.1"),
        ])
        .serve()
        .await;
    let mut answers = Vec::new();
    let operator = create_key(&process.base, "acme", "operator").await;
    answers.push(operator.to_string().replace(&secret(&operator), ""));
    let op_key = secret(&operator);
    let viewer = create_key(&process.base, "acme", "viewer").await;
    answers.push(viewer.to_string().replace(&secret(&viewer), ""));
    let viewer_key = secret(&viewer);
    let client = client_with_key(&op_key);
    let base = &process.base;
    let res = client
        .post(format!("{base}/api/autonomous"))
        .json(&json!({ "goal": "Create README.md with a project description",
                        "executor": { "kind": "scripted", "steps": [{ "action": "finish", "output": "<<WARDEN_GOAL_DONE: ok>>" }] } }))
        .send()
        .await
        .unwrap();
    let created: Value = res.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    answers.push(created.to_string());
    // A session with its own model key: sealed at rest, never shown or logged
    // (its endpoint refuses connections, so its failing calls are logged too).
    let session_key = "sk-session-own-77aa66bb55cc";
    let res = client
        .post(format!("{base}/api/autonomous"))
        .json(
            &json!({ "goal": "Create README.md with a project description",
                        "limits": { "max_iterations": 2 },
                        "executor": { "kind": "llm", "base_url": "http://127.0.0.1:10/v1",
                                      "model": "m", "api_key": session_key } }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let llm_session: Value = res.json().await.unwrap();
    answers.push(llm_session.to_string());
    let res = client
        .get(format!(
            "{base}/api/autonomous/{}",
            llm_session["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    answers.push(res.text().await.unwrap());
    let almost = format!("{}0", &op_key[..op_key.len() - 1]);
    for (key, path) in [
        (op_key.as_str(), format!("/api/autonomous/{id}")),
        (op_key.as_str(), "/api/autonomous".to_string()),
        (viewer_key.as_str(), format!("/api/autonomous/{id}/events")),
        (viewer_key.as_str(), "/api/keys".to_string()),
        (almost.as_str(), "/api/autonomous".to_string()),
        (metrics_token, "/metrics".to_string()),
        (ADMIN_TOKEN, "/api/keys".to_string()),
        ("wdn_garbage", "/api/autonomous".to_string()),
    ] {
        let res = reqwest::Client::new()
            .get(format!("{base}{path}"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        answers.push(res.text().await.unwrap());
    }
    let res = client_with_key(&viewer_key)
        .post(format!("{base}/api/autonomous/{id}/stop"))
        .send()
        .await
        .unwrap();
    answers.push(res.text().await.unwrap());
    crate::common::eventually(
        std::time::Duration::from_secs(5),
        "the log to be captured",
        || async {
            let logs = process.logs();
            logs.contains("DEBUG") || logs.contains("INFO")
        },
    )
    .await;
    let logs = process.logs();
    for secret in [
        ADMIN_TOKEN,
        metrics_token,
        llm_key,
        op_key.as_str(),
        viewer_key.as_str(),
        &op_key[13..],
        &viewer_key[13..],
        session_key,
        crate::common::TEST_SECRET_KEY,
    ] {
        for (i, answer) in answers.iter().enumerate() {
            assert!(
                !answer.contains(secret),
                "answer {i} holds a secret: {answer}"
            );
        }
        assert!(!logs.contains(secret), "a log line holds a secret");
    }
}

#[tokio::test]
#[ignore = "needs a Postgres server: the keys command as a process beside the test, both on the test's database"]
async fn the_keys_command_creates_lists_and_revokes() {
    crate::common::require_server_postgres(
        "the keys command as a process beside the test, both on the test's database",
    );
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let warden = |args: &[&str]| {
        let out = Warden::on(&db.pool).run(&[&["keys"], args].concat());
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, key) = warden(&["create", "--tenant", "acme", "--role", "operator"]);
    assert!(ok);
    let key = key.trim().to_string();
    assert!(key.starts_with("wdn_"), "{key}");
    let (ok, listed) = warden(&["list"]);
    assert!(ok);
    assert!(listed.contains(&key[..12]) && listed.contains("acme") && !listed.contains(&key));
    let id = listed
        .lines()
        .find(|l| l.contains(&key[..12]))
        .and_then(|l| l.split('\t').next())
        .unwrap()
        .to_string();

    // A server over the same database accepts the key, then not once revoked.
    let app = TestApp::spawn(pool).await;
    let client = client_with_key(&key);
    let res = client.get(app.url("/api/autonomous")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (ok, _) = warden(&["revoke", &id]);
    assert!(ok);
    // Another process revoked it: this replica lets it go within a second.
    let refused = status_within(
        std::time::Duration::from_secs(1),
        StatusCode::UNAUTHORIZED,
        || client.get(app.url("/api/autonomous")).send(),
    )
    .await;
    assert!(refused, "a key revoked by the CLI is refused within 1 s");
    let (ok, global) = warden(&["create", "--tenant", "ops", "--role", "admin", "--global"]);
    assert!(ok);
    let (_, listed) = warden(&["list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains(&global.trim()[..12]) && l.contains("\tadmin\tyes\t")),
        "{listed}"
    );
    assert!(!warden(&["create", "--tenant", "ops", "--role", "viewer", "--global"]).0);
    assert!(!warden(&["create", "--tenant", "a b", "--role", "viewer"]).0);
    assert!(!warden(&["create", "--tenant", "a", "--role", "root"]).0);
}

#[tokio::test]
async fn control_events_name_the_key_that_acted() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 60000 }]), json!({}))
        .await;
    let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
    let events = app.events(&id).await;
    let prefix = &app.key[..12];
    let actor = |kind: &str| {
        events
            .iter()
            .find(|e| e["kind"] == kind)
            .map(|e| e["actor"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(actor("session_created"), json!(prefix));
    assert_eq!(actor("stop_requested"), json!(prefix));
    // What the loop writes by itself names no key; no event carries the secret.
    assert!(events.iter().any(|e| e["actor"].is_null()), "{events:?}");
    assert!(!serde_json::to_string(&events).unwrap().contains(&app.key));
}

/// On the embedded PostgreSQL (no DATABASE_URL) the keys command works on
/// the data directory, and `warden db dump` writes it as SQL a server can
/// load: the schema and the rows. Needs no server: runs on both passes.
#[cfg(feature = "embedded")]
#[tokio::test]
async fn keys_and_db_dump_work_on_the_embedded_data_directory() {
    let dir = std::env::temp_dir().join(format!("warden-dump-{}", uuid::Uuid::new_v4().simple()));
    let warden = |args: &[&str]| {
        let out = Warden::on_data_dir(&dir).run(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, _, err) = warden(&["db", "dump"]);
    assert!(!ok, "nothing to dump yet");
    assert!(err.contains("no embedded database here"), "{err}");

    let (ok, key, err) = warden(&["keys", "create", "--tenant", "acme", "--role", "operator"]);
    assert!(ok, "{err}");
    let prefix = key.trim()[..12].to_string();
    let (ok, listed, err) = warden(&["keys", "list"]);
    assert!(ok, "{err}");
    assert!(
        listed.contains(&prefix) && listed.contains("acme"),
        "{listed}"
    );

    let (ok, sql, err) = warden(&["db", "dump"]);
    assert!(ok, "{err}");
    assert!(
        sql.contains("CREATE TABLE public.sessions"),
        "the schema is dumped"
    );
    assert!(sql.contains(&prefix), "the rows are dumped");
    assert!(
        !sql.contains(key.trim()),
        "a key's secret is never stored, so never dumped"
    );
    let (ok, _, err) = warden(&["db", "dump", "extra"]);
    assert!(
        !ok && err.contains("'extra'") && err.contains("Usage: warden db dump"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls `request` until it answers `want`, for at most `within`.
async fn status_within<F, Fut>(within: std::time::Duration, want: StatusCode, request: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if request().await.is_ok_and(|r| r.status() == want) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn post_key(base: &str, bearer: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/api/keys"))
        .json(&body);
    if let Some(key) = bearer {
        req = req.bearer_auth(key);
    }
    let res = req.send().await.expect("sent");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_first_key_made_without_auth_is_a_global_admin() {
    let db = crate::common::TestDb::new().await;
    let app =
        TestApp::spawn_with(db.pool.clone(), config_with(&[("WARDEN_ADMIN_TOKEN", "")])).await;
    assert!(app.key.is_empty(), "protected mode");
    for body in [
        json!({ "tenant": "t", "role": "viewer" }),
        json!({ "tenant": "t", "role": "operator" }),
        json!({ "tenant": "t", "role": "admin" }),
    ] {
        let (status, doc) = post_key(&app.base, None, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {doc}");
        assert_eq!(doc["code"], "first_key_must_be_global_admin", "{doc}");
        assert!(doc["detail"].as_str().unwrap().contains("global"), "{doc}");
    }
    // Still protected: nothing was made.
    let res = reqwest::Client::new()
        .get(app.url("/api/keys"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (status, owner) = post_key(
        &app.base,
        None,
        json!({ "tenant": "t", "role": "admin", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{owner}");
    assert_eq!(owner["global"], true);
    // Keys are required now, and the owner can make the rest.
    let (status, _) = post_key(&app.base, None, json!({ "tenant": "t", "role": "viewer" })).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, doc) = post_key(
        &app.base,
        Some(&secret(&owner)),
        json!({ "tenant": "t", "role": "viewer" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    assert_eq!(doc["global"], false);
}

#[tokio::test]
async fn tenant_admins_manage_their_own_tenant_only() {
    let app = TestApp::start().await;
    let (status, tenant_admin) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "a", "role": "admin", "name": "a's admin" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{tenant_admin}");
    assert_eq!(tenant_admin["global"], false);
    let (status, global) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "ops", "role": "admin", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{global}");
    assert_eq!(global["global"], true);
    let b_viewer = create_key(&app.base, "b", "viewer").await;
    let ta = secret(&tenant_admin);

    // Keys: its own tenant's only, none global.
    let (status, a_viewer) = post_key(
        &app.base,
        Some(&ta),
        json!({ "tenant": "a", "role": "viewer" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{a_viewer}");
    let (status, doc) = post_key(
        &app.base,
        Some(&ta),
        json!({ "tenant": "b", "role": "viewer" }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{doc}");
    let (status, doc) = post_key(
        &app.base,
        Some(&ta),
        json!({ "tenant": "a", "role": "admin", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{doc}");
    let listed: Value = client_with_key(&ta)
        .get(app.url("/api/keys"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tenants: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["tenant"].as_str().unwrap())
        .collect();
    assert!(
        tenants.len() == 2 && tenants.iter().all(|t| *t == "a"),
        "{listed}"
    );
    let revoke = |key: &str, id: &Value| {
        client_with_key(key)
            .delete(app.url(&format!("/api/keys/{}", id.as_str().unwrap())))
            .send()
    };
    assert_eq!(
        revoke(&ta, &b_viewer["id"]).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        revoke(&ta, &a_viewer["id"]).await.unwrap().status(),
        StatusCode::OK
    );
    // The global admin sees and manages every key, and the flag.
    let listed: Value = client_with_key(&secret(&global))
        .get(app.url("/api/keys"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items = listed["items"].as_array().unwrap();
    assert!(items.iter().any(|k| k["tenant"] == "b"));
    assert!(
        items
            .iter()
            .any(|k| k["id"] == global["id"] && k["global"] == true)
    );
    assert_eq!(
        revoke(&secret(&global), &b_viewer["id"])
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // Sessions: its tenant's only, whatever ?tenant= says; no /metrics.
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 60000 }]), json!({}))
        .await;
    let ta_client = client_with_key(&ta);
    for path in [
        format!("/api/autonomous/{id}"),
        format!("/api/autonomous/{id}?tenant=test"),
    ] {
        let res = ta_client.get(app.url(&path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let list: Value = ta_client
        .get(app.url("/api/autonomous?tenant=test"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    assert_eq!(
        ta_client
            .get(app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let res = client_with_key(&secret(&global))
        .get(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        client_with_key(&secret(&global))
            .get(app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn key_names_are_empty_or_one_to_64_printable_characters() {
    let app = TestApp::start().await;
    // An empty name is no name (created below without one).
    let (status, doc) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "t", "role": "viewer", "name": "" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    assert_eq!(doc["name"], serde_json::Value::Null, "{doc}");
    for name in [
        json!(" "),
        json!("x".repeat(65)),
        json!("a\nb"),
        json!("a\u{202E}b"),
    ] {
        let (status, doc) = post_key(
            &app.base,
            Some(ADMIN_TOKEN),
            json!({ "tenant": "t", "role": "viewer", "name": name }),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {doc}");
    }
    let (status, doc) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "t", "role": "viewer", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{doc}");
    let (status, doc) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "t", "role": "viewer", "name": "x".repeat(64) }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
}

#[tokio::test]
async fn origins_are_compared_by_scheme_host_and_port() {
    let app = TestApp::start().await;
    let port = app.base.rsplit(':').next().unwrap().to_string();
    let body = json!({ "goal": "Create README.md with a project description", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } });
    for (origin, want) in [
        (format!("http://127.0.0.1:{port}"), StatusCode::CREATED),
        (format!("ftp://127.0.0.1:{port}"), StatusCode::FORBIDDEN),
        ("http://127.0.0.1".to_string(), StatusCode::FORBIDDEN),
        (format!("http://127.0.0.1:{port}0"), StatusCode::FORBIDDEN),
        ("null".to_string(), StatusCode::FORBIDDEN),
    ] {
        let res = app
            .client
            .post(app.url("/api/autonomous"))
            .header("origin", &origin)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{origin}");
    }
    // Host without a port: the Origin's default port.
    for (origin, want) in [
        ("http://warden.example", StatusCode::CREATED),
        ("http://warden.example:80", StatusCode::CREATED),
        ("https://warden.example", StatusCode::CREATED),
        ("http://warden.example:8080", StatusCode::FORBIDDEN),
    ] {
        let res = app
            .client
            .post(app.url("/api/autonomous"))
            .header("host", "warden.example")
            .header("origin", origin)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{origin}");
    }
}

#[tokio::test]
#[ignore = "needs a Postgres server: a second Warden process and the keys command on the test's database"]
async fn keys_change_on_every_replica_within_a_second() {
    crate::common::require_server_postgres(
        "a second Warden process and the keys command on the test's database",
    );
    let db = crate::common::TestDb::new().await;
    // Replica A starts in protected mode: no admin token, no keys.
    let a = TestApp::spawn_with(db.pool.clone(), config_with(&[("WARDEN_ADMIN_TOKEN", "")])).await;
    assert!(a.key.is_empty());
    let b = Warden::on(&db.pool).serve().await;
    let second = std::time::Duration::from_secs(1);

    // A key made through B ends A's protected mode within a second.
    let (status, owner) = post_key(
        &b.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "t", "role": "admin", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{owner}");
    let anonymous = reqwest::Client::new();
    assert!(
        status_within(second, StatusCode::UNAUTHORIZED, || anonymous
            .get(a.url("/api/autonomous"))
            .send())
        .await,
        "A requires keys within 1 s of the first key"
    );
    let owner_client = client_with_key(&secret(&owner));
    assert_eq!(
        owner_client
            .get(a.url("/api/keys"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // A key in A's cache, revoked through B: refused by A within a second.
    let viewer = create_key(&b.base, "t", "viewer").await;
    let viewer_client = client_with_key(&secret(&viewer));
    assert_eq!(
        viewer_client
            .get(a.url("/api/autonomous"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let res = reqwest::Client::new()
        .delete(format!(
            "{}/api/keys/{}",
            b.base,
            viewer["id"].as_str().unwrap()
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        status_within(second, StatusCode::UNAUTHORIZED, || viewer_client
            .get(a.url("/api/autonomous"))
            .send())
        .await,
        "a key revoked through B is refused by A within 1 s"
    );

    // A key made by the CLI: accepted by A and B within a second.
    let out = Warden::on(&db.pool).run(&["keys", "create", "--tenant", "t", "--role", "operator"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cli_client = client_with_key(&key);
    for base in [&a.base, &b.base] {
        assert!(
            status_within(second, StatusCode::OK, || cli_client
                .get(format!("{base}/api/autonomous"))
                .send())
            .await,
            "a key made by the CLI is accepted by {base} within 1 s"
        );
    }
}

#[tokio::test]
async fn a_tenant_admin_cannot_see_or_revoke_a_global_key_of_its_tenant_name() {
    // The README's first key: `--tenant ops --global`; then a tenant admin of ops.
    let app = TestApp::start().await;
    let (status, global) = post_key(
        &app.base,
        Some(ADMIN_TOKEN),
        json!({ "tenant": "ops", "role": "admin", "global": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{global}");
    let (status, ops_admin) = post_key(
        &app.base,
        Some(&secret(&global)),
        json!({ "tenant": "ops", "role": "admin" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{ops_admin}");
    let ops_viewer = create_key(&app.base, "ops", "viewer").await;
    let ta = client_with_key(&secret(&ops_admin));

    let listed: Value = ta
        .get(app.url("/api/keys"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&Value> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| &k["id"])
        .collect();
    assert!(ids.contains(&&ops_viewer["id"]), "{listed}");
    assert!(ids.contains(&&ops_admin["id"]), "{listed}");
    assert!(!ids.contains(&&global["id"]), "{listed}");
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["global"] == false),
        "{listed}"
    );

    let res = ta
        .delete(app.url(&format!("/api/keys/{}", global["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // The global admin still gets in, and still manages every key.
    let res = client_with_key(&secret(&global))
        .get(app.url("/api/keys"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let listed: Value = res.json().await.unwrap();
    let global_row = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == global["id"])
        .cloned()
        .expect("the global key is listed to a global admin");
    assert_eq!(global_row["revoked_at"], Value::Null, "{global_row}");
    // A tenant admin's own tenant's plain keys stay within its reach.
    let res = ta
        .delete(app.url(&format!("/api/keys/{}", ops_viewer["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
