//! Quotas: running sessions per tenant (race-safe),
//! live streams per tenant, the request timeout and the global concurrency
//! limit, and lists that answer as before from summary columns.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;
use crate::common::{TestApp, config_with};

fn endless() -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "scripted", "repeat": true,
                      "steps": [{ "action": "wait", "output": "still here", "delay_ms": 200 }] }
    })
}

#[tokio::test]
async fn running_sessions_per_tenant_are_capped_even_under_concurrent_creates() {
    let app = TestApp::start_with(config_with(&[("WARDEN_TENANT_MAX_RUNNING", "2")])).await;
    let sends = (0..6).map(|_| {
        app.client
            .post(app.url("/api/autonomous"))
            .json(&endless())
            .send()
    });
    let answers = futures::future::join_all(sends).await;
    let mut created = Vec::new();
    let mut refused = 0;
    for res in answers {
        let res = res.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        match status {
            StatusCode::CREATED => created.push(body["id"].as_str().unwrap().to_string()),
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["code"], "tenant_running_limit", "{body}");
                assert!(
                    body["detail"]
                        .as_str()
                        .unwrap()
                        .contains("WARDEN_TENANT_MAX_RUNNING"),
                    "{body}"
                );
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!((created.len(), refused), (2, 4));
    // Another tenant has its own room.
    let other = crate::common::create_key(&app.base, "other", "operator").await;
    let res = crate::common::client_with_key(other["secret"].as_str().unwrap())
        .post(app.url("/api/autonomous"))
        .json(&endless())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // A stopped session frees its slot; resuming it needs one again.
    let (status, _) = app
        .post(&format!("/api/autonomous/{}/stop", created[0]), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .json(&endless())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let (status, body) = app
        .post(
            &format!("/api/autonomous/{}/resume", created[0]),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["code"], "tenant_running_limit");
}

async fn open_stream(app: &TestApp) -> reqwest::Response {
    app.client
        .get(app.url("/api/autonomous/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn live_streams_per_tenant_are_capped_and_a_closed_one_frees_its_slot() {
    let app = TestApp::start_with(config_with(&[("WARDEN_TENANT_MAX_STREAMS", "2")])).await;
    let first = open_stream(&app).await;
    let second = open_stream(&app).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    let third = open_stream(&app).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["code"], "stream_limit", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("WARDEN_TENANT_MAX_STREAMS")
    );
    // A session's own stream counts too.
    let id = app.create(endless()).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/events")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    let reopened = common::eventually_ok(
        Duration::from_secs(10),
        "the closed stream's slot to come back",
        || async {
            let res = open_stream(&app).await;
            if res.status() == StatusCode::OK {
                Ok(res)
            } else {
                Err(res.status().to_string())
            }
        },
    )
    .await;
    drop((second, reopened));
}

#[tokio::test]
async fn slow_requests_time_out_and_excess_requests_are_shed() {
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_REQUEST_TIMEOUT_MS", "400"),
        ("WARDEN_MAX_CONCURRENT_REQUESTS", "1"),
        ("WARDEN_STOP_WAIT_MS", "10000"),
    ]))
    .await;
    // A pause waits for the step in flight (3 s here): past the timeout.
    let id = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "executor": { "kind": "scripted", "repeat": true,
                          "steps": [{ "action": "wait", "output": "x", "delay_ms": 3000 }] }
        }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The pause must find the step in flight, not the loop before it.
    app.wait_until(&id, Duration::from_secs(10), |s| {
        !s["current_step"].is_null()
    })
    .await;
    let pause = app
        .client
        .post(app.url(&format!("/api/autonomous/{id}/pause")))
        .json(&json!({}))
        .send();
    // Asked again until the pause holds the only slot (for its 400 ms).
    let other = common::eventually_ok(
        Duration::from_secs(5),
        "a request shed while the pause holds the only slot",
        || async {
            let res = app
                .client
                .get(app.url("/api/autonomous"))
                .send()
                .await
                .expect("sent");
            match res.status() {
                StatusCode::SERVICE_UNAVAILABLE => Ok(res),
                other => Err(other.to_string()),
            }
        },
    );
    let (paused, shed) = tokio::join!(pause, other);
    let paused = paused.unwrap();
    assert_eq!(paused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = paused.json().await.unwrap();
    assert_eq!(body["code"], "request_timeout", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("WARDEN_REQUEST_TIMEOUT_MS")
    );
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(shed.headers().contains_key("retry-after"));
    let body: Value = shed.json().await.unwrap();
    assert_eq!(body["code"], "overloaded", "{body}");
    // Streams and probes are neither timed out nor counted.
    let mut stream = app
        .client
        .get(app.url("/api/autonomous/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let (status, _) = app.get("/api/autonomous").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an open stream holds no request slot"
    );
    // Past the request timeout: the stream lasting through it is the point.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let chunk = tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await;
    assert!(
        matches!(chunk, Ok(Ok(Some(_)))),
        "the stream outlived the timeout: {chunk:?}"
    );
}

#[tokio::test]
async fn an_event_stream_accept_header_exempts_no_other_route() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let app = TestApp::spawn_with(
        pool,
        config_with(&[
            ("WARDEN_REQUEST_TIMEOUT_MS", "400"),
            ("WARDEN_MAX_CONCURRENT_REQUESTS", "1"),
            ("WARDEN_STOP_WAIT_MS", "10000"),
        ]),
    )
    .await;
    let id = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "executor": { "kind": "scripted", "repeat": true,
                          "steps": [{ "action": "wait", "output": "x", "delay_ms": 3000 }] }
        }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A slow pause that asks for an event stream still times out…
    let pause = tokio::spawn(
        app.client
            .post(app.url(&format!("/api/autonomous/{id}/pause")))
            .header("accept", "text/event-stream")
            .json(&json!({}))
            .send(),
    );
    // …and, once it is in progress, holds the one request slot: a list
    // asking for an event stream is shed.
    let uuid: uuid::Uuid = id.parse().unwrap();
    common::eventually(Duration::from_secs(10), "the pause to arrive", || async {
        sqlx::query_scalar::<_, bool>("SELECT pause_requested FROM sessions WHERE id = $1")
            .bind(uuid)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    })
    .await;
    let shed = app
        .client
        .get(app.url("/api/autonomous"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = shed.json().await.unwrap();
    assert_eq!(body["code"], "overloaded", "{body}");
    let paused = pause.await.unwrap().unwrap();
    assert_eq!(paused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = paused.json().await.unwrap();
    assert_eq!(body["code"], "request_timeout", "{body}");
    // The session's own live stream is exempt: it holds no slot.
    let stream = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/events")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let (status, _) = app.get("/api/autonomous").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an open stream holds no request slot"
    );
    drop(stream);
}

#[tokio::test]
async fn lists_show_the_executor_summary_from_summary_columns() {
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let steps: Vec<Value> = (0..2_000)
        .map(|i| json!({ "action": format!("step {i}"), "output": "o".repeat(400) }))
        .collect();
    let id = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 1 },
            "executor": { "kind": "scripted", "steps": steps }
        }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.wait_settled(&id).await;
    let (_, one) = app.get(&format!("/api/autonomous/{id}")).await;
    let (status, list) = app.get("/api/autonomous").await;
    assert_eq!(status, StatusCode::OK);
    let listed = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(listed["executor"], one["executor"]);
    assert_eq!(listed["executor"]["steps"], 2_000);
    assert_eq!(listed["executor"]["kind"], "scripted");
    // The summary Postgres keeps is small whatever the spec's size.
    let (spec, summary): (i32, i32) = sqlx::query_as(
        "SELECT pg_column_size(executor), pg_column_size(executor_summary) FROM sessions WHERE id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(summary < 200 && spec > 10 * summary, "{spec} vs {summary}");
}

#[tokio::test]
async fn tool_calls_per_step_and_workspace_files_are_capped() {
    use crate::common::fake_llm::{FakeLlm, text, tool_calls};
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[
            ("write_file", json!({ "path": "a.md", "content": "a" })),
            ("write_file", json!({ "path": "b.md", "content": "b" })),
            ("write_file", json!({ "path": "c.md", "content": "c" })),
        ],
        30,
    ))
    .agent(text("<<WARDEN_GOAL_BLOCKED: limits>>", 10));
    let base = fake.base_url();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_MAX_TOOL_CALLS_PER_STEP", "2"),
        ("WARDEN_WORKSPACE_MAX_FILES", "1"),
    ]))
    .await;
    let id = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "executor": { "kind": "llm" }
        }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "agent_blocked", "{s}");
    let first = &app.iterations(&id).await[0];
    let observation = first["record"]["observation"].as_str().unwrap();
    assert!(observation.contains("wrote a.md"), "{observation}");
    assert_eq!(
        observation.matches("WARDEN_WORKSPACE_MAX_FILES").count(),
        1,
        "b.md is refused by the workspace quota: {observation}"
    );
    assert_eq!(
        observation
            .matches("WARDEN_MAX_TOOL_CALLS_PER_STEP")
            .count(),
        1,
        "c.md is not executed: {observation}"
    );
    let events = app.events(&id).await;
    let limited = events
        .iter()
        .find(|e| e["kind"] == "tool_calls_limited")
        .expect("the limit is recorded");
    assert_eq!(
        limited["data"],
        json!({ "requested": 3, "executed": 2, "limit": 2 })
    );
    // The model is told, in the result of the call that did not run.
    let second = &fake.agent_requests()[1];
    let told = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains("not executed"))
        })
        .count();
    assert_eq!(told, 1, "{second}");
}

/// A server on the fake model whose tenants may make one call a minute on it.
async fn one_model_call_a_minute(
    pool: sqlx::PgPool,
    fake: &crate::common::fake_llm::FakeLlm,
) -> TestApp {
    let base = fake.base_url();
    TestApp::spawn_with(
        pool,
        config_with(&[
            ("WARDEN_LLM_BASE_URL", base.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
            ("WARDEN_TENANT_MODEL_CALLS_PER_MINUTE", "1"),
        ]),
    )
    .await
}

#[tokio::test]
async fn the_model_call_limit_holds_for_the_fleet_not_per_replica() {
    use crate::common::fake_llm::{FakeLlm, text};
    let db = crate::common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    for _ in 0..3 {
        fake.reflection(text(
            "Write PLAN.md with pricing, costs and first customers",
            10,
        ));
    }
    // Two replicas on one database, one model call a minute per tenant.
    let first = one_model_call_a_minute(db.pool.clone(), &fake).await;
    let second = one_model_call_a_minute(db.pool.clone(), &fake).await;
    let vague = json!({ "goal": "Learn how to run a business",
                        "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } });
    let s = first.create(vague.clone()).await;
    assert_eq!(s["refinement"]["source"], "model", "{s}");
    // The other replica counts the same call: the tenant's minute is spent.
    let (status, doc) = second.post("/api/autonomous", Some(vague)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{doc}");
    assert_eq!(doc["code"], "tenant_model_rate_limit");
}

#[tokio::test]
async fn model_calls_over_the_tenant_rate_limit_answer_429() {
    use crate::common::fake_llm::{FakeLlm, text};
    let db = crate::common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    for _ in 0..3 {
        fake.reflection(text(
            "Write PLAN.md with pricing, costs and first customers",
            10,
        ));
    }
    let app = one_model_call_a_minute(db.pool.clone(), &fake).await;
    let vague = json!({ "goal": "Learn how to run a business",
                        "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } });
    // The refinement suggestion is a call on the server's model: one a minute.
    let s = app.create(vague.clone()).await;
    assert_eq!(s["refinement"]["source"], "model", "{s}");
    let (status, doc) = app.post("/api/autonomous", Some(vague.clone())).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{doc}");
    assert_eq!(doc["code"], "tenant_model_rate_limit");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("WARDEN_TENANT_MODEL_CALLS_PER_MINUTE"),
        "{doc}"
    );
    // So is criteria generation.
    let (status, doc) = app
        .post(
            "/api/autonomous",
            Some(
                json!({ "goal": "Create README.md with a project description",
                         "generate_criteria": true,
                         "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{doc}");
    assert_eq!(
        fake.requests().len(),
        1,
        "refused calls never reach the model"
    );
    // Another tenant has a bucket of its own.
    let other = crate::common::create_key(&app.base, "other", "operator").await;
    let res = crate::common::client_with_key(other["secret"].as_str().unwrap())
        .post(app.url("/api/autonomous"))
        .json(&vague)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // Counted per tenant.
    let metrics = app.admin_get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("warden_tenant_model_calls_total{tenant=\"test\"} 1")
            && metrics.contains("warden_tenant_model_calls_limited_total{tenant=\"test\"} 2")
            && metrics.contains("warden_tenant_model_calls_total{tenant=\"other\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_reflection_over_the_tenant_rate_limit_is_deferred_not_failed() {
    use crate::common::fake_llm::{FakeLlm, assessment, tool_calls};
    let db = crate::common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    for i in 0..8 {
        fake.agent(tool_calls(
            &[(
                "write_file",
                json!({ "path": format!("part{i}.md"), "content": "x" }),
            )],
            10,
        ));
    }
    // STUCK: the next reflection is due 5 steps later (after step 7).
    fake.reflection(assessment("NO", "STUCK", 30.0, false, "CONTINUE"));
    let app = one_model_call_a_minute(db.pool.clone(), &fake).await;
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "continuous",
            "limits": { "reflection_interval": 2, "max_iterations": 8 },
            "executor": { "kind": "llm" }
        }))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped", "{s}");
    assert_eq!(s["reason"], "max_iterations", "{s}");
    let (_, page) = app.get(&format!("/api/autonomous/{id}/reflections")).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    let events = app.events(&id).await;
    let deferred: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "reflection_deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "logged once per wait: {events:?}");
    assert_eq!(deferred[0]["data"]["reason"], "tenant_model_rate_limit");
    assert!(deferred[0]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_child_reporting_the_largest_count_is_charged_its_budget_and_its_tree_stays_whole() {
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": 3_000, "max_iterations": 20 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "tokens": 10, "output": "merged\n<<WARDEN_GOAL_DONE: merged>>" }
            ] },
            "subgoals": [{ "goal": "Build feature X", "budget_share": 0.5,
                           "steps": [{ "action": "build", "tokens": i64::MAX }] }],
        }))
        .await;
    let parent = doc["id"].as_str().expect("id").to_string();
    let settled = app
        .wait_until(&parent, Duration::from_secs(30), |s| {
            !common::view::<common::SessionView>(s).is_live()
                && s["reason"] != "waiting_for_children"
        })
        .await;
    let (status, tree) = app.get(&format!("/api/autonomous/{parent}/tree")).await;
    assert_eq!(status, StatusCode::OK, "{tree}");
    let child = tree["node"]["children"][0].clone();
    let child = app.session(child["id"].as_str().expect("child")).await;
    // The child was charged its whole budget, no more, and stopped on it.
    assert_eq!(child["status"], "stopped", "{child}");
    assert_eq!(child["reason"], "cost_limit", "{child}");
    let budget = child["limits"]["max_tokens"].as_i64().expect("budget");
    assert_eq!(child["tokens_used"].as_i64(), Some(budget), "{child}");
    // The parent got back what was left and waits for a person (its only
    // child failed); its figures are sums, not wrapped.
    assert_eq!(settled["reason"], "agent_blocked", "{settled}");
    assert_eq!(settled["limits"]["max_tokens"], 3_000 - budget, "{settled}");
    assert_eq!(settled["delegation"]["tokens_spent_by_children"], budget);
    let used = tree["totals"]["tokens_used"].as_i64().expect("total");
    assert!((0..=3_000).contains(&used), "{tree}");
    // Nothing is stuck: the parent stops, and deletes with its tree.
    let (status, stopped) = app
        .post(&format!("/api/autonomous/{parent}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{parent}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
}
