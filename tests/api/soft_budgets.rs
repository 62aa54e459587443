//! Soft budgets: every budget with a hard limit warns at the session's
//! `limits.warn_at` thresholds (50, 80 and 95 % unless it says otherwise),
//! once per threshold per session, resumes included; each warning is a
//! `budget_warning` event, listed in the status as `budget_warnings`, and
//! told to the agent in its next step.

use crate::common;

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use common::{BudgetWarningView, TestApp};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// `n` distinct scripted steps (nothing for stuck detection to see).
fn steps(n: usize) -> Value {
    (1..=n)
        .map(|i| {
            json!({ "action": format!("step_{i}"), "arguments": {"i": i},
                    "output": format!("wrote part {i}"), "tokens": 5 })
        })
        .collect()
}

/// The session's `budget_warning` events' data, in log order.
async fn warning_events(app: &TestApp, id: &str) -> Vec<Value> {
    app.events(id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "budget_warning")
        .map(|e| e["data"].clone())
        .collect()
}

/// (iteration, threshold) of iteration-budget warnings, as `status` lists them.
fn iteration_warnings(warnings: &[BudgetWarningView]) -> Vec<(u64, u8)> {
    assert!(
        warnings.iter().all(|w| w.budget == "iterations"),
        "{warnings:?}"
    );
    warnings
        .iter()
        .map(|w| (w.iteration, w.threshold))
        .collect()
}

#[tokio::test]
async fn a_session_warns_at_50_80_and_95_percent_once_each_in_order() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(steps(30), json!({ "max_iterations": 20 }))
        .await;
    app.wait_settled(&id).await;
    let events = warning_events(&app, &id).await;
    let seen: Vec<(u64, u64)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["budget"], "iterations", "{e}");
            (
                e["iteration"].as_u64().expect("iteration"),
                e["threshold"].as_u64().expect("threshold"),
            )
        })
        .collect();
    assert_eq!(seen, [(10, 50), (16, 80), (19, 95)], "{events:?}");
    assert_eq!(events[1]["used"], "16");
    assert_eq!(events[1]["limit"], "20");
    let note = events[1]["note"].as_str().expect("note");
    assert!(
        note.contains("80% of the iteration budget is spent (16 of 20)"),
        "{note}"
    );
    let status = app.session_view(&id).await;
    assert_eq!(
        iteration_warnings(&status.budget_warnings),
        [(10, 50), (16, 80), (19, 95)]
    );
    assert_eq!(
        status.budget_warnings[2],
        BudgetWarningView {
            budget: "iterations".into(),
            threshold: 95,
            used: "19".into(),
            limit: "20".into(),
            iteration: 19,
        }
    );
    let (_, limits) = app.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(limits["limits"]["warn_at"], json!([50, 80, 95]));
}

#[tokio::test]
async fn custom_thresholds_warn_where_asked_and_none_never() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            steps(30),
            json!({ "max_iterations": 20, "warn_at": [60, 25, 60] }),
        )
        .await;
    app.wait_settled(&id).await;
    let status = app.session_view(&id).await;
    assert_eq!(
        iteration_warnings(&status.budget_warnings),
        [(5, 25), (12, 60)]
    );
    assert_eq!(app.session(&id).await["limits"]["warn_at"], json!([25, 60]));

    let quiet = app
        .create_scripted(steps(30), json!({ "max_iterations": 5, "warn_at": [] }))
        .await;
    app.wait_settled(&quiet).await;
    assert!(warning_events(&app, &quiet).await.is_empty());
    assert!(app.session_view(&quiet).await.budget_warnings.is_empty());
}

#[tokio::test]
async fn a_resumed_session_does_not_repeat_a_sent_threshold() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(steps(40), json!({ "max_iterations": 10 }))
        .await;
    let first = app.wait_settled(&id).await;
    assert_eq!(first["iterations"], 10, "{first}");
    assert_eq!(
        iteration_warnings(&app.session_view(&id).await.budget_warnings),
        [(5, 50), (8, 80), (10, 95)]
    );
    // Twice the budget: 11 of 20 is past 50 %, 16 past 80, 19 past 95, all sent.
    let (status, doc) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "limits": { "max_iterations": 20 } })),
        )
        .await;
    assert!(status.is_success(), "{doc}");
    let second = app
        .wait_until(&id, std::time::Duration::from_secs(20), |s| {
            s["iterations"] == 20 && s["status"] != "running"
        })
        .await;
    assert_eq!(second["run"], 2, "{second}");
    assert_eq!(warning_events(&app, &id).await.len(), 3);
    assert_eq!(
        iteration_warnings(&app.session_view(&id).await.budget_warnings),
        [(5, 50), (8, 80), (10, 95)]
    );
}

#[tokio::test]
async fn a_webhook_agent_is_told_to_wrap_up_in_its_next_request() {
    async fn step(
        State(got): State<Arc<Mutex<Vec<Value>>>>,
        Json(body): Json<Value>,
    ) -> Json<Value> {
        let n = {
            let mut got = got.lock().unwrap();
            got.push(body);
            got.len()
        };
        Json(json!({ "action": format!("step_{n}"), "output": format!("part {n}"), "tokens": 5 }))
    }
    let got = Arc::new(Mutex::new(Vec::new()));
    let agent = Router::new()
        .route("/step", post(step))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/step", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, agent).await.unwrap() });

    let app = TestApp::start().await;
    let id = app
        .create(json!({
            "goal": "Edit four parts",
            "limits": { "max_iterations": 4 },
            "executor": { "kind": "webhook", "url": url }
        }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    app.wait_settled(&id).await;
    let requests = got.lock().unwrap().clone();
    assert_eq!(requests.len(), 4, "{requests:?}");
    // Step 2 takes the iterations to 50 %: step 3 is told, once.
    let notes: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.get("budget_note").and_then(Value::as_str))
        .collect();
    assert_eq!(notes[0], None);
    assert_eq!(notes[1], None);
    let note = notes[2].expect("the step after the crossing is told");
    assert!(
        note.contains("50% of the iteration budget is spent (2 of 4)"),
        "{note}"
    );
    assert!(note.contains("about 2 steps are left"), "{note}");
    assert_eq!(notes[3], None, "told once");
}

#[tokio::test]
async fn an_invalid_warn_at_is_a_422_problem() {
    let app = TestApp::start().await;
    for warn_at in [
        json!([0]),
        json!([50, 100]),
        json!([300]),
        json!([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
        json!("50"),
    ] {
        let (status, doc) = app
            .post(
                "/api/autonomous",
                Some(json!({
                    "goal": "Create README.md with a project description",
                    "limits": { "warn_at": warn_at },
                    "executor": { "kind": "scripted", "steps": steps(2) }
                })),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{warn_at}: {doc}");
        let problem = common::problem(&doc);
        assert!(problem.detail.contains("warn_at"), "{warn_at}: {doc}");
    }
}

/// PUT /api/budget-warnings as `client`; the status and document.
async fn put_warn_at(app: &TestApp, client: &reqwest::Client, body: Value) -> (StatusCode, Value) {
    let res = client
        .put(app.url("/api/budget-warnings"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_tenant_s_thresholds_apply_to_its_sessions_that_set_none() {
    let app = TestApp::start().await;
    let global = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", common::ADMIN_TOKEN).parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    let (status, set) = put_warn_at(
        &app,
        &global,
        json!({ "tenant": common::TEST_TENANT, "warn_at": [75, 25] }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["warn_at"], json!([25, 75]), "sorted: {set}");
    let listed: Value = app
        .admin_get("/api/budget-warnings")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["server_default"], json!([50, 80, 95]), "{listed}");
    assert_eq!(
        listed["tenants"],
        json!([{ "tenant": common::TEST_TENANT, "warn_at": [25, 75] }])
    );
    // Refused: out of range, and a tenant admin setting thresholds.
    let (status, _) = put_warn_at(
        &app,
        &global,
        json!({ "tenant": common::TEST_TENANT, "warn_at": [100] }),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let tenant_admin = common::create_key(&app.base, common::TEST_TENANT, "admin").await;
    let tenant_admin = common::client_with_key(tenant_admin["secret"].as_str().unwrap());
    let (status, _) = put_warn_at(
        &app,
        &tenant_admin,
        json!({ "tenant": common::TEST_TENANT, "warn_at": [10] }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A session that sets none gets the tenant's thresholds.
    let id = app
        .create_scripted(steps(30), json!({ "max_iterations": 20 }))
        .await;
    assert_eq!(app.session(&id).await["limits"]["warn_at"], json!([25, 75]));
    app.wait_settled(&id).await;
    let status = app.session_view(&id).await;
    assert_eq!(
        iteration_warnings(&status.budget_warnings),
        [(5, 25), (15, 75)]
    );
    // Its own thresholds win.
    let own = app
        .create_scripted(steps(30), json!({ "max_iterations": 20, "warn_at": [50] }))
        .await;
    assert_eq!(app.session(&own).await["limits"]["warn_at"], json!([50]));
    // Back to the server's.
    let (status, reset) = put_warn_at(
        &app,
        &global,
        json!({ "tenant": common::TEST_TENANT, "warn_at": null }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reset}");
    assert_eq!(reset["warn_at"], json!([50, 80, 95]));
    let later = app
        .create_scripted(steps(3), json!({ "max_iterations": 20 }))
        .await;
    assert_eq!(
        app.session(&later).await["limits"]["warn_at"],
        json!([50, 80, 95])
    );
}
