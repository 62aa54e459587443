//! `POST /api/autonomous/estimate`: figures from the tenant's completed
//! sessions like this one, or `basis: none` and the limits when there are
//! too few; never another tenant's history, never a session created.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, client_with_key, config_with, create_key};

/// A scripted create body: `tokens` per step over `steps` steps, done at the end.
fn body(goal: &str, steps: u64, tokens: u64) -> Value {
    let mut script: Vec<Value> = (1..steps)
        .map(|i| json!({ "action": format!("step {i}"), "tokens": tokens }))
        .collect();
    script.push(json!({ "action": "finish", "tokens": tokens,
                        "output": "done\n<<WARDEN_GOAL_DONE: finished>>" }));
    json!({
        "goal": goal,
        "success_criteria": ["The tests pass"],
        "limits": { "max_iterations": 40, "max_tokens": 100_000 },
        "executor": { "kind": "scripted", "steps": script }
    })
}

async fn estimate(client: &reqwest::Client, app: &TestApp, body: &Value) -> (StatusCode, Value) {
    let res = client
        .post(app.url("/api/autonomous/estimate"))
        .json(body)
        .send()
        .await
        .expect("sent");
    let status = res.status();
    (status, res.json().await.expect("json"))
}

/// The create of `body` as a dry run: the answer, nothing created.
async fn dry_run(app: &TestApp, body: &Value) -> reqwest::Response {
    let mut dry = body.clone();
    dry["dry_run"] = json!(true);
    app.client
        .post(app.url("/api/autonomous"))
        .json(&dry)
        .send()
        .await
        .expect("sent")
}

#[tokio::test]
async fn an_estimate_comes_from_completed_sessions_like_this_one_and_says_so() {
    let app = TestApp::start().await;
    let query = body("Write unit tests for the billing parser", 3, 100);
    // No history: the figures are the limits and the answer says so.
    let (status, first) = estimate(&app.client, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["basis"], "none", "{first}");
    assert_eq!(first["sessions_used"], 0);
    assert_eq!(first["iterations"]["p90"], 40);
    assert_eq!(first["tokens"]["p50"], 100_000);
    assert_eq!(first["cost_usd"], Value::Null, "no cost is made up");
    assert_eq!(first["executor_kind"], "scripted");
    let (status, list) = app.get("/api/autonomous").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"], json!([]), "an estimate creates nothing");

    // Six completed sessions with similar goals, 2 to 7 steps of 100 tokens.
    let mut ids = Vec::new();
    for (i, steps) in [2_u64, 3, 4, 5, 6, 7].into_iter().enumerate() {
        let goal = format!("Write unit tests for the billing parser, part {i}");
        ids.push(
            app.create(body(&goal, steps, 100)).await["id"]
                .as_str()
                .expect("id")
                .to_string(),
        );
    }
    for id in &ids {
        let s = app
            .wait_until(id, Duration::from_secs(30), |s| s["status"] != "running")
            .await;
        assert_eq!(s["status"], "completed", "{s}");
    }
    let (status, later) = estimate(&app.client, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{later}");
    assert_eq!(later["basis"], "similar_goals", "{later}");
    assert_eq!(later["sessions_used"], 6);
    let p50 = later["iterations"]["p50"].as_u64().expect("p50");
    let p90 = later["iterations"]["p90"].as_u64().expect("p90");
    // Order statistics of 2..=7: ranks ⌈0.5·7⌉ = 4 and ⌈0.9·7⌉ = 7, capped at 6.
    assert_eq!((p50, p90), (5, 7), "{later}");
    assert_eq!(later["tokens"]["p90"], 700);
    assert!(
        later["closest_similarity"].as_f64().expect("similarity") > 0.5,
        "{later}"
    );
    assert_eq!(later["fits_limits"], true);

    // Another tenant's history is not this tenant's.
    let other_key = create_key(&app.base, "estimates-other", "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let other = client_with_key(&other_key);
    let (status, theirs) = estimate(&other, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    assert_eq!(theirs["basis"], "none", "{theirs}");
}

#[tokio::test]
async fn an_estimate_checks_its_body_like_a_create() {
    let app = TestApp::start().await;
    for bad in [
        json!({ "goal": "", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        json!({ "goal": "Do it", "limits": { "max_iterations": 0 },
                "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        json!({ "goal": "Do it", "executor": { "kind": "scripted", "steps": [] }, "nonsense": 1 }),
        // The executor's shape, and the request's own rule: a
        // confirmation bound on a goal split into subgoals.
        json!({ "goal": "Do it", "executor": { "kind": "scripted", "steps": [] } }),
        json!({ "goal": "Do it", "confirm_if_over": { "cost_usd": "1" },
                "subgoals": ["First half", "Second half"],
                "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
    ] {
        let (status, answer) = estimate(&app.client, &app, &bad).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad} -> {answer}"
        );
        let created = app
            .client
            .post(app.url("/api/autonomous"))
            .json(&bad)
            .send()
            .await
            .expect("sent");
        assert_eq!(created.status(), status, "the create answers alike: {bad}");
    }
    // Whether the server can run the executor is the create's (and its dry
    // run's) to say: an llm executor with no model where none is configured.
    let draft = json!({ "goal": "Do it", "executor": { "kind": "llm" } });
    let (status, answer) = estimate(&app.client, &app, &draft).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let res = dry_run(&app, &draft).await;
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_dry_run_answers_the_estimate_and_creates_nothing() {
    let app = TestApp::start().await;
    for (i, steps) in [2_u64, 3, 4, 5, 6].into_iter().enumerate() {
        let goal = format!("Write unit tests for the billing parser, part {i}");
        let id = app.create(body(&goal, steps, 100)).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        app.wait_until(&id, Duration::from_secs(30), |s| s["status"] != "running")
            .await;
    }
    let (_, before) = app.get("/api/autonomous").await;
    let query = body("Write unit tests for the billing parser", 3, 100);
    let (status, estimated) = estimate(&app.client, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{estimated}");
    let res = dry_run(&app, &query).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("location").is_none());
    let answer: Value = res.json().await.expect("json");
    assert_eq!(answer, estimated, "the same estimate as /estimate");
    assert_eq!(answer["basis"], "similar_goals", "{answer}");
    let (_, after) = app.get("/api/autonomous").await;
    assert_eq!(before["items"], after["items"], "a dry run creates nothing");
    // A dry run with confirm_if_over is still a dry run.
    let mut dry = query.clone();
    dry["dry_run"] = json!(true);
    dry["confirm_if_over"] = json!({ "cost_usd": "0.01" });
    let (status, again) = app.post("/api/autonomous", Some(dry)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let (_, after) = app.get("/api/autonomous").await;
    assert_eq!(before["items"], after["items"]);
}

#[tokio::test]
async fn a_dry_run_refuses_what_a_create_refuses() {
    let app = TestApp::start().await;
    for bad in [
        json!({ "goal": "", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        json!({ "goal": "Do it", "limits": { "max_iterations": 0 },
                "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
        json!({ "goal": "Do it", "executor": { "kind": "scripted", "steps": [] }, "nonsense": 1 }),
        json!({ "goal": "Do it", "executor": { "kind": "scripted", "steps": [{ "action": "a" }] },
                "confirm_if_over": {} }),
        // A create checks more than the estimate does: the LLM executor's
        // endpoint, which this server has no default for.
        json!({ "goal": "Do it", "executor": { "kind": "llm" } }),
    ] {
        let mut dry = bad.clone();
        dry["dry_run"] = json!(true);
        let (dry_status, dry_answer) = app.post("/api/autonomous", Some(dry)).await;
        let mut create = bad.clone();
        create["dry_run"] = json!(false);
        let (status, _) = app.post("/api/autonomous", Some(create)).await;
        assert_eq!(
            dry_status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad} -> {dry_answer}"
        );
        assert_eq!(status, dry_status, "{bad}: as a create");
    }
    let (_, list) = app.get("/api/autonomous").await;
    assert_eq!(list["items"], json!([]));
}

#[tokio::test]
async fn priced_history_gives_a_cost_estimate_and_a_money_budget_is_the_default() {
    // $10 per million output tokens: 100 tokens cost $0.001.
    let app = TestApp::start_with(config_with(&[("WARDEN_MODEL_PRICES", "*=0/10")])).await;
    let mut query = body("Write unit tests for the billing parser", 3, 100);
    query["limits"]["max_cost_usd"] = json!("0.5");
    let (status, first) = estimate(&app.client, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["basis"], "none", "{first}");
    // No history: the money budget is the figure, as the other limits are.
    assert_eq!(first["cost_usd"]["p90"], "0.5", "{first}");
    for (i, steps) in [2_u64, 3, 4, 5, 6, 7].into_iter().enumerate() {
        let goal = format!("Write unit tests for the billing parser, part {i}");
        let id = app.create(body(&goal, steps, 100)).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        let s = app
            .wait_until(&id, Duration::from_secs(30), |s| s["status"] != "running")
            .await;
        assert_eq!(s["status"], "completed", "{s}");
    }
    let (status, later) = estimate(&app.client, &app, &query).await;
    assert_eq!(status, StatusCode::OK, "{later}");
    assert_eq!(later["basis"], "similar_goals", "{later}");
    // 2 to 7 steps of $0.001: the same order statistics as the iterations.
    assert_eq!(later["cost_usd"]["p50"], "0.005", "{later}");
    assert_eq!(later["cost_usd"]["p90"], "0.007", "{later}");
}
