//! Notifications: a tenant's or a session's target hears about a session's
//! end within a second, signed per Standard Webhooks v1 with the tenant's
//! secret; a failing receiver is retried with the same `webhook-id`; a 410
//! disables the target; another tenant neither sees nor sets targets; and
//! an outbox row committed with its event survives a kill -9.

use crate::common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine;
use common::{ADMIN_TOKEN, TestApp, TestDb, client_with_key, create_key, eventually};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// One request the fake receiver got.
#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
    at: chrono::DateTime<chrono::Utc>,
    answered: u16,
}

#[derive(Default)]
struct Plan {
    /// Statuses to answer, in order; 200 once they run out.
    answers: VecDeque<u16>,
    got: Vec<Received>,
}

/// A webhook receiver on 127.0.0.1 that records what it gets.
#[derive(Clone)]
struct Receiver {
    url: String,
    plan: Arc<Mutex<Plan>>,
}

async fn receive(
    State(plan): State<Arc<Mutex<Plan>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let mut plan = plan.lock().unwrap();
    let answered = plan.answers.pop_front().unwrap_or(200);
    plan.got.push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: body.to_vec(),
        at: chrono::Utc::now(),
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

impl Receiver {
    async fn start(answers: &[u16]) -> Receiver {
        let plan = Arc::new(Mutex::new(Plan {
            answers: answers.iter().copied().collect(),
            got: Vec::new(),
        }));
        let app = Router::new()
            .route("/hook/{token}", post(receive))
            .with_state(plan.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            url: format!("http://{addr}/hook/s3cret-path"),
            plan,
        }
    }

    fn got(&self) -> Vec<Received> {
        self.plan.lock().unwrap().got.clone()
    }
}

/// Verifies a `webhook-signature` header as a receiver would, with its own HMAC.
fn verifies(secret: &str, r: &Received) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", r.id, r.timestamp).as_bytes());
    mac.update(&r.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    r.signature.split(' ').any(|s| s == expected)
}

fn finishing_steps(n: usize, delay_ms: u64) -> Value {
    let mut steps: Vec<Value> = (1..=n)
        .map(|i| json!({ "action": format!("step_{i}"), "arguments": {"i": i}, "tokens": 5, "delay_ms": delay_ms }))
        .collect();
    steps.push(json!({ "action": "finish", "tokens": 5, "output": "<<WARDEN_GOAL_DONE: done>>" }));
    Value::Array(steps)
}

/// PUT `path` with `body` as `client`; the status and document.
async fn put(client: &reqwest::Client, url: String, body: Value) -> (StatusCode, Value) {
    let res = client.put(url).json(&body).send().await.expect("sent");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn notifications(app: &TestApp, id: &str) -> Vec<Value> {
    let (status, body) = app
        .get(&format!("/api/autonomous/{id}/notifications"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_tenant_target_hears_of_an_end_within_a_second_signed() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let receiver = Receiver::start(&[]).await;
    let admin = create_key(&app.base, common::TEST_TENANT, "admin").await;
    let admin = client_with_key(admin["secret"].as_str().unwrap());
    let (status, set) = put(&admin, app.url("/api/notify"), json!({"url": receiver.url})).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let secret = set["signing_secret"]
        .as_str()
        .expect("the first target answers the secret")
        .to_string();
    assert!(secret.starts_with("whsec_"));
    assert!(
        !set["target"]["url"].as_str().unwrap().contains("s3cret"),
        "{set}"
    );
    // Setting it again does not show the secret again.
    let (_, again) = put(&admin, app.url("/api/notify"), json!({"url": receiver.url})).await;
    assert!(again.get("signing_secret").is_none(), "{again}");

    let id = app.create_scripted(finishing_steps(2, 50), json!({})).await;
    app.wait_settled(&id).await;
    eventually(Duration::from_secs(5), "the end is notified", || async {
        !receiver.got().is_empty()
    })
    .await;
    let got = receiver.got();
    assert_eq!(got.len(), 1, "{got:?}");
    let r = &got[0];
    assert!(verifies(&secret, r), "the signature verifies: {r:?}");
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["type"], "session.ended");
    assert_eq!(body["data"]["session_id"], id.as_str());
    assert_eq!(body["data"]["event"]["to"], "completed");
    let logged = chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().unwrap()).unwrap();
    let late = r.at.signed_duration_since(logged);
    assert!(
        late < chrono::Duration::seconds(1),
        "delivered {late} after the event"
    );

    eventually(
        Duration::from_secs(5),
        "the delivery is recorded",
        || async {
            notifications(&app, &id)
                .await
                .first()
                .is_some_and(|n| n["status"] == "delivered")
        },
    )
    .await;
    let listed = notifications(&app, &id).await;
    assert_eq!(listed[0]["webhook_id"], r.id.as_str());
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["target"], "tenant");
}

#[tokio::test]
async fn a_failing_receiver_is_retried_with_the_same_id_and_bytes() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let receiver = Receiver::start(&[503]).await;
    let id = app
        .create_scripted(finishing_steps(6, 150), json!({}))
        .await;
    let (status, set) = put(
        &app.client,
        app.url(&format!("/api/autonomous/{id}/notify")),
        json!({"url": receiver.url}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let secret = set["signing_secret"]
        .as_str()
        .expect("the tenant had no secret")
        .to_string();
    app.wait_settled(&id).await;
    eventually(
        Duration::from_secs(5),
        "the first attempt fails",
        || async {
            notifications(&app, &id)
                .await
                .first()
                .is_some_and(|n| n["last_status"] == 503)
        },
    )
    .await;
    let pending = &notifications(&app, &id).await[0];
    assert_eq!(pending["status"], "pending", "{pending}");
    assert!(pending["next_attempt_at"].is_string(), "{pending}");
    assert_eq!(pending["last_error"], "the receiver answered 503");

    // The schedule's first wait is 5 s (± 20 %).
    eventually(
        Duration::from_secs(15),
        "the retry is delivered",
        || async { receiver.got().len() >= 2 },
    )
    .await;
    let got = receiver.got();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].id, got[1].id, "one webhook-id across retries");
    assert_eq!(got[0].body, got[1].body, "the same bytes");
    assert!(got.iter().all(|r| verifies(&secret, r)));
    eventually(Duration::from_secs(5), "recorded as delivered", || async {
        notifications(&app, &id)
            .await
            .first()
            .is_some_and(|n| n["status"] == "delivered" && n["attempts"] == 2)
    })
    .await;
}

#[tokio::test]
async fn a_410_disables_the_target() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let receiver = Receiver::start(&[410]).await;
    let admin = create_key(&app.base, common::TEST_TENANT, "admin").await;
    let admin = client_with_key(admin["secret"].as_str().unwrap());
    let (status, _) = put(
        &admin,
        app.url("/api/notify"),
        json!({"url": receiver.url, "format": "slack"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let id = app.create_scripted(finishing_steps(1, 10), json!({})).await;
    app.wait_settled(&id).await;
    eventually(Duration::from_secs(5), "the 410 disables", || async {
        notifications(&app, &id)
            .await
            .first()
            .is_some_and(|n| n["status"] == "disabled")
    })
    .await;
    let body: Value = serde_json::from_slice(&receiver.got()[0].body).unwrap();
    assert!(
        body["text"].as_str().unwrap().contains(&id),
        "slack text: {body}"
    );
    let target: Value = admin
        .get(app.url("/api/notify"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(target["enabled"], false, "{target}");
    // A disabled target gets no more notifications.
    let next = app.create_scripted(finishing_steps(1, 10), json!({})).await;
    app.wait_settled(&next).await;
    assert!(notifications(&app, &next).await.is_empty());
    assert_eq!(receiver.got().len(), 1);
}

#[tokio::test]
async fn another_tenant_neither_sees_nor_sets_targets() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let receiver = Receiver::start(&[]).await;
    let id = app.create_scripted(finishing_steps(1, 10), json!({})).await;
    let (status, _) = put(
        &app.client,
        app.url(&format!("/api/autonomous/{id}/notify")),
        json!({"url": receiver.url}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let own_admin = client_with_key(
        create_key(&app.base, common::TEST_TENANT, "admin").await["secret"]
            .as_str()
            .unwrap(),
    );
    let (status, _) = put(
        &own_admin,
        app.url("/api/notify"),
        json!({"url": receiver.url}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let other = client_with_key(
        create_key(&app.base, "other", "operator").await["secret"]
            .as_str()
            .unwrap(),
    );
    let other_admin = client_with_key(
        create_key(&app.base, "other", "admin").await["secret"]
            .as_str()
            .unwrap(),
    );
    for path in [
        format!("/api/autonomous/{id}/notify"),
        format!("/api/autonomous/{id}/notifications"),
    ] {
        let res = other.get(app.url(&path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let (status, _) = put(
        &other,
        app.url(&format!("/api/autonomous/{id}/notify")),
        json!({"url": receiver.url}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let res = other
        .delete(app.url(&format!("/api/autonomous/{id}/notify")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // The other tenant's admin sees its own (none), never this tenant's.
    let res = other_admin
        .get(app.url("/api/notify"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // An operator sets no tenant target.
    let (status, _) = put(&other, app.url("/api/notify"), json!({"url": receiver.url})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The owner's target is still there.
    let res = own_admin.get(app.url("/api/notify")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_target_outside_the_egress_policy_is_refused() {
    let db = TestDb::new().await;
    let app = TestApp::spawn_with(
        db.pool.clone(),
        common::config_with(&[("WARDEN_EGRESS_ALLOW", "")]),
    )
    .await;
    let id = app.create_scripted(finishing_steps(1, 10), json!({})).await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/latest",
        "ftp://example.com/x",
    ] {
        let (status, body) = put(
            &app.client,
            app.url(&format!("/api/autonomous/{id}/notify")),
            json!({"url": url}),
        )
        .await;
        assert!(
            status == StatusCode::FORBIDDEN || status == StatusCode::UNPROCESSABLE_ENTITY,
            "{url}: {status} {body}"
        );
    }
}

#[tokio::test]
async fn a_kill_after_the_commit_still_delivers_once_with_the_same_id() {
    let db = TestDb::new().await;
    let receiver = Receiver::start(&[503]).await;
    let data_dir =
        std::env::temp_dir().join(format!("warden-notify-{}", uuid::Uuid::new_v4().simple()));
    let warden = || {
        let w = if common::embedded() {
            common::Warden::on_data_dir(&data_dir)
        } else {
            common::Warden::at_url(&common::database_url(&db.pool))
        };
        w.env("WARDEN_EGRESS_ALLOW", "127.0.0.1")
    };
    let mut first = warden().serve().await;
    let admin = client_with_key(ADMIN_TOKEN);
    let res = admin
        .post(format!("{}/api/autonomous", first.base))
        .json(&json!({"goal": "Create README.md with a project description", "executor": {"kind": "scripted", "steps": finishing_steps(4, 150)}}))
        .send()
        .await
        .unwrap();
    let created: Value = res.json().await.unwrap();
    let id = created["id"].as_str().expect("created").to_string();
    let (status, set) = put(
        &admin,
        format!("{}/api/autonomous/{id}/notify", first.base),
        json!({"url": receiver.url}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let secret = set["signing_secret"].as_str().unwrap().to_string();
    // The end is committed and its first attempt fails; the process dies
    // before the retry.
    // Killed after the failed attempt is recorded: killed mid-send, its row
    // would wait out its one-minute lease first.
    let listed = format!("{}/api/autonomous/{id}/notifications", first.base);
    eventually(
        Duration::from_secs(15),
        "the first attempt is recorded",
        || async {
            let notes: Value = admin
                .get(&listed)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            notes["items"][0]["last_status"] == 503
        },
    )
    .await;
    first.kill();

    let second = warden().serve().await;
    eventually(Duration::from_secs(20), "the restart delivers", || async {
        receiver.got().iter().any(|r| r.answered == 200)
    })
    .await;
    let notes: Value = admin
        .get(format!("{}/api/autonomous/{id}/notifications", second.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let got = receiver.got();
    assert_eq!(
        got.iter().filter(|r| r.answered == 200).count(),
        1,
        "{got:?}"
    );
    assert!(
        got.iter().all(|r| r.id == got[0].id),
        "one webhook-id: {got:?}"
    );
    assert!(got.iter().all(|r| verifies(&secret, r)));
    assert_eq!(notes["items"].as_array().map(Vec::len), Some(1), "{notes}");
    drop(second);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn a_budget_warning_reaches_the_tenant_target_within_a_second_of_its_step() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let receiver = Receiver::start(&[]).await;
    let admin = create_key(&app.base, common::TEST_TENANT, "admin").await;
    let admin = client_with_key(admin["secret"].as_str().unwrap());
    let (status, set) = put(&admin, app.url("/api/notify"), json!({"url": receiver.url})).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let secret = set["signing_secret"].as_str().expect("secret").to_string();

    // Four steps of a budget of eight: the fourth crosses 50 %.
    let id = app
        .create_scripted(finishing_steps(3, 50), json!({ "max_iterations": 8 }))
        .await;
    app.wait_settled(&id).await;
    let warning = || {
        receiver.got().into_iter().find(|r| {
            serde_json::from_slice::<Value>(&r.body)
                .is_ok_and(|b| b["type"] == "session.budget_warning")
        })
    };
    eventually(
        Duration::from_secs(5),
        "the warning is notified",
        || async { warning().is_some() },
    )
    .await;
    let r = warning().expect("a warning");
    assert!(verifies(&secret, &r), "the signature verifies: {r:?}");
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["data"]["session_id"], id.as_str());
    let event = &body["data"]["event"];
    assert_eq!(event["budget"], "iterations", "{body}");
    assert_eq!(event["threshold"], 50, "{body}");
    assert_eq!(event["iteration"], 4, "{body}");
    // Within a second of the commit of the step that crossed it.
    let iterations = app.iterations(&id).await;
    let step = iterations
        .iter()
        .find(|i| i["number"] == 4)
        .expect("the fourth iteration");
    let committed =
        chrono::DateTime::parse_from_rfc3339(step["finished_at"].as_str().unwrap()).unwrap();
    let late = r.at.signed_duration_since(committed);
    assert!(
        late < chrono::Duration::seconds(1),
        "delivered {late} after the step"
    );
    let warnings = receiver
        .got()
        .iter()
        .filter(|r| {
            serde_json::from_slice::<Value>(&r.body)
                .is_ok_and(|b| b["type"] == "session.budget_warning")
        })
        .count();
    assert_eq!(warnings, 1, "one threshold crossed, one warning");
}
