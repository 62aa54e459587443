//! Money (issue 43): every committed step is priced at `WARDEN_MODEL_PRICES`
//! from the usage it reported (input, cached input and output apart, by
//! model); the session's `cost_usd` is the exact sum of its steps', a tree's
//! the sum of its sessions'; a model no entry prices is counted
//! `unpriced_steps`, never 0.

use crate::common;

use std::time::Duration;

use common::fake_llm::{Answer, FakeLlm, tool_calls};
use common::{SessionView, TestApp, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A completion calling `write_file`, with a usage that has cached tokens.
fn cached_write(prompt: u64, cached: u64, completion: u64) -> Answer {
    Answer::ok(json!({
        "choices": [{ "index": 0, "finish_reason": "tool_calls",
            "message": { "role": "assistant", "content": null, "tool_calls": [
                { "id": "call_0", "type": "function", "function": { "name": "write_file",
                  "arguments": json!({ "path": "README.md", "content": "# Warden\n" }).to_string() } }
            ] } }],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion,
                   "prompt_tokens_details": { "cached_tokens": cached } }
    }))
}

#[tokio::test]
async fn a_model_session_costs_what_its_usage_comes_to_at_the_price_table() {
    let fake = FakeLlm::start().await;
    fake.agent(cached_write(1_000, 200, 100)).agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "README.md written", "deliverables": ["README.md"] }),
        )],
        80,
    ));
    let base = fake.base_url();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        (
            "WARDEN_MODEL_PRICES",
            "fake-*=2.50/10/1.25@2020-01-01; other=1/1",
        ),
    ]))
    .await;
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "executor": { "kind": "llm" }
        }))
        .await;
    let id = doc["id"].as_str().expect("id");
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["tokens_used"], 1_180);
    // By hand: 800 uncached × 2.50 + 200 cached × 1.25 + 100 out × 10 =
    // 3,250 per million; then 40 × 2.50 + 40 × 10 = 500 per million.
    assert_eq!(s["cost_usd"], "0.00375", "{s}");
    assert_eq!(s["unpriced_steps"], 0);
    let its = app.iterations(id).await;
    assert_eq!(its.len(), 2);
    assert_eq!(its[0]["cost_usd"], "0.00325", "{:?}", its[0]);
    assert_eq!(its[1]["cost_usd"], "0.0005");
    assert_eq!(its[0]["price_pattern"], "fake-*");
    assert_eq!(its[0]["price_valid_from"], "2020-01-01");
    assert_eq!(its[0]["usage"]["input_tokens"], 1_000);
    assert_eq!(its[0]["usage"]["cached_tokens"], 200);
    assert_eq!(its[0]["usage"]["output_tokens"], 100);
    assert_eq!(its[0]["usage"]["model"], "fake-model");

    // The list shows it, sorts by it and filters on it.
    let (status, page) = app
        .get("/api/autonomous?sort=cost&min_cost_usd=0.003")
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["items"][0]["cost_usd"], "0.00375", "{page}");
    let (_, none) = app.get("/api/autonomous?min_cost_usd=0.004").await;
    assert_eq!(none["items"].as_array().map(Vec::len), Some(0), "{none}");
    let (status, _) = app.get("/api/autonomous?min_cost_usd=-1").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // /metrics counts it for the tenant.
    let metrics = app.admin_get("/metrics").await.text().await.expect("text");
    assert!(
        metrics.contains("warden_tenant_cost_usd_total{tenant=\"test\"} 0.00375"),
        "{metrics}"
    );
}

mod usage_agent {
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::{Value, json};

    /// An agent that reports its usage the OpenAI Agents SDK's way: a
    /// priced model, then one no entry names, then a count alone.
    pub async fn start() -> String {
        async fn step(Json(req): Json<Value>) -> Json<Value> {
            let n = req["iteration"].as_u64().expect("iteration");
            Json(match n {
                1 => json!({ "action": "plan", "output": "planned",
                    "usage": { "input_tokens": 1_000, "output_tokens": 100, "cached_tokens": 200,
                               "reasoning_tokens": 40, "model": "gpt-4o" } }),
                2 => json!({ "action": "edit", "output": "edited", "tokens": 10,
                    "usage": { "input_tokens": 300, "output_tokens": 100, "cached_tokens": 5_000,
                               "model": "mystery-model" } }),
                _ => json!({ "action": "report", "tokens": 5, "output": "done",
                             "signal": "done", "reason": "all done" }),
            })
        }
        let app = Router::new().route("/step", post(step));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/step", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }
}

#[tokio::test]
async fn a_webhook_agents_unknown_model_is_flagged_unpriced_never_zero() {
    let url = usage_agent::start().await;
    let app = TestApp::start_with(config_with(&[(
        "WARDEN_MODEL_PRICES",
        "gpt-4o=2.50/10/1.25",
    )]))
    .await;
    let doc = app
        .create(json!({ "goal": "Edit the parts", "executor": { "kind": "webhook", "url": url } }))
        .await;
    let id = doc["id"].as_str().expect("id");
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    // The budget counts input + output (the larger of that and `tokens`).
    assert_eq!(s["tokens_used"], 1_100 + 400 + 5, "{s}");
    assert_eq!(s["cost_usd"], "0.00325", "{s}");
    assert_eq!(s["unpriced_steps"], 2, "{s}");
    let its = app.iterations(id).await;
    assert_eq!(its[0]["usage"]["reasoning_tokens"], 40);
    assert!(its[1]["cost_usd"].is_null(), "{:?}", its[1]);
    assert_eq!(its[1]["usage"]["model"], "mystery-model");
    // Cached tokens are held within the input.
    assert_eq!(its[1]["usage"]["cached_tokens"], 300);
    assert!(its[2]["cost_usd"].is_null());
}

#[tokio::test]
async fn a_trees_cost_is_the_sum_of_its_sessions_costs() {
    // A lone `*` prices steps that name no model; a count alone is priced
    // as output tokens.
    let app = TestApp::start_with(config_with(&[("WARDEN_MODEL_PRICES", "*=1/2")])).await;
    let child = |goal: &str| {
        json!({ "goal": goal, "steps": [
            { "action": "work_1", "tokens": 100, "output": "working" },
            { "action": "work_2", "tokens": 100, "output": "finished\n<<WARDEN_GOAL_DONE: done>>" }
        ] })
    };
    let doc = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": 3_000, "max_iterations": 200 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "tokens": 10,
                  "output": "merged\n<<WARDEN_GOAL_DONE: all parts done>>" }
            ] },
            "subgoals": [child("Build feature X"), child("Write the tests of X")],
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let parent = app
        .wait_until(&id, Duration::from_secs(30), |s| {
            !common::view::<SessionView>(s).is_live() && s["reason"] != "waiting_for_children"
        })
        .await;
    assert_eq!(parent["status"], "completed", "{parent}");
    assert_eq!(parent["cost_usd"], "0.00002", "{parent}");
    let (status, t) = app.get(&format!("/api/autonomous/{id}/tree")).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    // 410 tokens at $2 per million.
    assert_eq!(t["totals"]["cost_usd"], "0.00082", "{t}");
    assert_eq!(t["node"]["subtree_cost_usd"], "0.00082", "{t}");
    assert_eq!(t["totals"]["unpriced_steps"], 0);
    for c in t["node"]["children"].as_array().expect("children") {
        assert_eq!(c["cost_usd"], "0.0004", "{c}");
    }
    let children: Vec<Value> = t["node"]["children"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut sum = 0.0;
    for c in &children {
        let s = app.session(c["id"].as_str().expect("id")).await;
        sum += s["cost_usd"]
            .as_str()
            .expect("a decimal string")
            .parse::<f64>()
            .unwrap();
    }
    assert!((sum - 0.0008).abs() < 1e-12, "{sum}");
}

#[tokio::test]
async fn a_workers_completion_reports_its_usage_and_is_priced() {
    let app = TestApp::start_with(config_with(&[(
        "WARDEN_MODEL_PRICES",
        "claude-sonnet-4*=3/15/0.30",
    )]))
    .await;
    let res = reqwest::Client::new()
        .post(app.url("/api/keys"))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&json!({ "tenant": common::TEST_TENANT, "role": "worker", "queues": ["money"] }))
        .send()
        .await
        .expect("sent");
    let key: Value = res.json().await.expect("json");
    let worker = common::client_with_key(key["secret"].as_str().expect("secret"));
    let doc = app
        .create(json!({ "goal": "Write the report",
                        "executor": { "kind": "worker", "queue": "money" } }))
        .await;
    let id = doc["id"].as_str().expect("id");
    let task: Value = worker
        .post(app.url("/api/workers/claim"))
        .json(&json!({ "wait_ms": 5_000, "worker": "w" }))
        .send()
        .await
        .expect("claim")
        .json()
        .await
        .expect("a task");
    let done = json!({ "lease_token": task["lease_token"], "outcome": {
        "action": "report", "output": "written", "signal": "done", "reason": "written",
        "usage": { "input_tokens": 2_000, "cached_tokens": 1_000, "output_tokens": 500,
                   "reasoning_tokens": 100, "model": "claude-sonnet-4-5" } } });
    let task_id = task["task_id"].as_str().expect("task id");
    let res = worker
        .post(app.url(&format!("/api/workers/tasks/{task_id}/complete")))
        .json(&done)
        .send()
        .await
        .expect("complete");
    assert_eq!(res.status(), StatusCode::OK);
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["tokens_used"], 2_500);
    // 1,000 × 3 + 1,000 × 0.30 + 500 × 15 = 10,800 per million.
    assert_eq!(s["cost_usd"], "0.0108", "{s}");
    assert_eq!(s["unpriced_steps"], 0);
    let its = app.iterations(id).await;
    assert_eq!(its[0]["price_pattern"], "claude-sonnet-4*");
}

/// A server pricing every unnamed model at $10 per million output tokens:
/// a scripted step of 1,000 tokens costs $0.01.
async fn ten_dollars_a_million() -> TestApp {
    TestApp::start_with(config_with(&[("WARDEN_MODEL_PRICES", "*=0/10")])).await
}

/// Scripted steps of `tokens` each, the last one saying it is done.
fn costed_steps(tokens: &[u64]) -> Value {
    let n = tokens.len();
    Value::Array(
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let output = if i + 1 == n {
                    "all done\n<<WARDEN_GOAL_DONE: finished>>".to_string()
                } else {
                    format!("did step {}", i + 1)
                };
                json!({ "action": format!("step_{}", i + 1), "arguments": { "i": i },
                        "tokens": t, "output": output })
            })
            .collect(),
    )
}

#[tokio::test]
async fn a_money_budget_pauses_before_a_step_it_cannot_pay_for_and_a_raise_goes_on() {
    let app = ten_dollars_a_million().await;
    let id = app
        .create_scripted(
            costed_steps(&[1_000; 6]),
            json!({ "max_cost_usd": "0.035", "max_tokens": 1_000_000 }),
        )
        .await;
    let s = app.wait_settled(&id).await;
    // Three steps cost $0.03; $0.005 pays for 500 tokens, and the next
    // step is projected at 1,000: it never starts.
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "budget_projected_overrun", "{s}");
    assert_eq!(s["cost_usd"], "0.03", "{s}");
    assert_eq!(s["limits"]["max_cost_usd"], "0.035", "{s}");
    let detail = s["reason_detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("max_cost_usd") && detail.contains("0.005"),
        "{detail}"
    );
    // The money budget warned on the way: 50 % at step 2, 80 % at step 3.
    let warned: Vec<(Value, Value)> = s["budget_warnings"]
        .as_array()
        .expect("budget_warnings")
        .iter()
        .filter(|w| w["budget"] == "cost_usd")
        .map(|w| (w["threshold"].clone(), w["iteration"].clone()))
        .collect();
    assert_eq!(
        warned,
        [(json!(50), json!(2)), (json!(80), json!(3))],
        "{s}"
    );

    let (status, body) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "limits": { "max_cost_usd": "1" } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["cost_usd"], "0.06", "{s}");
}

#[tokio::test]
async fn a_spent_money_budget_ends_the_session_and_a_resume_must_raise_it() {
    let app = ten_dollars_a_million().await;
    // A spike: the third step reports 5,000 tokens but may spend only the
    // 2,000 the $0.02 left pays for; it is charged those and the budget is over.
    let id = app
        .create_scripted(
            costed_steps(&[1_000, 1_000, 5_000, 1_000]),
            json!({ "max_cost_usd": "0.04", "max_tokens": 1_000_000 }),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "cost_limit", "{s}");
    assert_eq!(s["cost_usd"], "0.04", "never past the budget: {s}");
    assert_eq!(s["tokens_used"], 4_000, "{s}");

    // Exactly spent, no spike: the guardrail ends it before a fourth step.
    let id = app
        .create_scripted(
            costed_steps(&[1_000; 5]),
            json!({ "max_cost_usd": "0.03", "max_tokens": 1_000_000, "max_iterations": 50 }),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "cost_limit", "{s}");
    assert_eq!(s["cost_usd"], "0.03", "{s}");
    assert_eq!(s["iterations"], 3, "{s}");
    assert_eq!(s["status"], "stopped", "{s}");
    let summary = s["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("money budget of 0.03 USD") && summary.contains("cost 0.03 USD"),
        "{summary}"
    );
    // A resume that does not raise the budget would stop at once: refused.
    let (status, body) = app
        .post(&format!("/api/autonomous/{id}/resume"), Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("max_cost_usd")),
        "{body}"
    );
    let (status, body) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "limits": { "max_cost_usd": "0.05" } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["cost_usd"], "0.05", "{s}");
}

#[tokio::test]
async fn a_money_budget_needs_a_price_table_and_a_valid_amount() {
    let unpriced = TestApp::start().await;
    let res = unpriced
        .client
        .post(unpriced.url("/api/autonomous"))
        .json(
            &json!({ "goal": "Create README.md with a project description",
                       "limits": { "max_cost_usd": "1" },
                       "executor": { "kind": "scripted", "steps": costed_steps(&[10]) } }),
        )
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["code"], "no_price_table", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("WARDEN_MODEL_PRICES")),
        "{body}"
    );

    let app = ten_dollars_a_million().await;
    for bad in [
        json!("0"),
        json!("-1"),
        json!("0.0000001"),
        json!("1000000.5"),
        json!("lots"),
    ] {
        let res = app
            .client
            .post(app.url("/api/autonomous"))
            .json(
                &json!({ "goal": "Create README.md with a project description",
                           "limits": { "max_cost_usd": bad },
                           "executor": { "kind": "scripted", "steps": costed_steps(&[10]) } }),
            )
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let (_, list) = app.get("/api/autonomous").await;
    assert_eq!(
        list["items"].as_array().map(Vec::len),
        Some(0),
        "nothing was made: {list}"
    );
}

#[tokio::test]
async fn a_childs_money_budget_is_carved_from_its_parents_and_changes_only_through_it() {
    let app = ten_dollars_a_million().await;
    let doc = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": 100_000, "max_iterations": 200, "max_cost_usd": "1" },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "tokens": 1_000,
                  "output": "merged\n<<WARDEN_GOAL_DONE: all parts done>>" }
            ] },
            "subgoals": [
                { "goal": "Build feature X", "budget_share": 0.25,
                  "steps": costed_steps(&[1_000, 1_000]) },
                { "goal": "Write the tests of X", "budget_share": 0.25,
                  "steps": costed_steps(&[2_000]) }
            ]
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    // A quarter of $1, then a quarter of the $0.75 left; the parent keeps
    // the rest, so the tree can never spend more than $1.
    let children: Vec<String> = app.session(&id).await["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| c["id"].as_str().expect("id").to_string())
        .collect();
    let carved: Vec<Value> = {
        let mut v = Vec::new();
        for c in &children {
            v.push(app.session(c).await["limits"]["max_cost_usd"].clone());
        }
        v
    };
    assert_eq!(carved, [json!("0.25"), json!("0.1875")], "{doc}");
    assert_eq!(doc["limits"]["max_cost_usd"], "0.5625", "{doc}");
    let (status, body) = app
        .patch(
            &format!("/api/autonomous/{}", children[0]),
            json!({ "limits": { "max_cost_usd": "5" } }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    let parent = app
        .wait_until(&id, Duration::from_secs(30), |s| s["status"] == "completed")
        .await;
    assert_eq!(parent["cost_usd"], "0.01", "{parent}");
    let (_, tree) = app.get(&format!("/api/autonomous/{id}/tree")).await;
    // $0.01 of the parent's, $0.02 and $0.02 of its children's.
    assert_eq!(tree["totals"]["cost_usd"], "0.05", "{tree}");
}
