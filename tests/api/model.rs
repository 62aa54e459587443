//! Model-backed sessions against a real HTTP fake of an OpenAI-compatible
//! server: tools in the workspace, verified completion, questions, retries,
//! budgets, reflection, and the webhook executor against an in-process agent.

use crate::common;

use std::time::{Duration, Instant};

use common::fake_llm::{Answer, FakeLlm, assessment, text, tool_calls};
use common::{TestApp, assert_gap_free, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn app_with_model(fake: &FakeLlm) -> TestApp {
    let base = fake.base_url();
    TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
    ]))
    .await
}

async fn create_llm(app: &TestApp, mode: &str, limits: Value, executor: Value) -> String {
    let mut exec = json!({ "kind": "llm" });
    if let (Some(e), Some(extra)) = (exec.as_object_mut(), executor.as_object()) {
        e.extend(extra.clone());
    }
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": mode, "limits": limits, "executor": exec
        }))
        .await;
    doc["id"].as_str().unwrap().to_string()
}

fn messages_text(request: &Value) -> String {
    request["messages"].to_string()
}

#[tokio::test]
async fn writes_a_file_and_completes_with_a_verified_deliverable() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "README.md", "content": "# Warden\nSupervises agents.\n" }),
        )],
        120,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "README.md written", "deliverables": ["README.md"] }),
        )],
        80,
    ));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["reason"], "goal_achieved");
    assert_eq!(s["iterations"], 2);
    assert_eq!(s["tokens_used"], 200);
    assert_eq!(s["executor"]["kind"], "llm");
    let events = app.events(&id).await;
    assert!(events.iter().any(|e| e["kind"] == "completion_verified"));
    let iterations = app.iterations(&id).await;
    assert_eq!(iterations[0]["action"], "write_file");
    assert_eq!(
        iterations[0]["record"]["files_written"][0]["path"],
        "README.md"
    );

    // The model saw the tools, the goal, and its own earlier tool call and result.
    let requests = fake.agent_requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "fake-model");
    let names: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    for tool in [
        "read_file",
        "write_file",
        "list_files",
        "task_completion",
        "ask_question",
        "converse",
    ] {
        assert!(names.contains(&tool), "{tool} offered");
    }
    assert!(messages_text(&requests[0]).contains("Create README.md"));
    assert!(messages_text(&requests[1]).contains("wrote README.md"));
}

#[tokio::test]
async fn a_false_completion_claim_is_rejected_and_the_loop_continues() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "done", "deliverables": ["REPORT.md"] }),
        )],
        50,
    ))
    .agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "REPORT.md", "content": "report" }),
        )],
        50,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "done now", "deliverables": ["REPORT.md"] }),
        )],
        50,
    ));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 3);
    let events = app.events(&id).await;
    let rejected = events
        .iter()
        .find(|e| e["kind"] == "completion_rejected")
        .expect("rejection recorded");
    assert_eq!(rejected["data"]["missing"][0], "REPORT.md");
    let iterations = app.iterations(&id).await;
    assert_eq!(iterations[0]["outcome"], "failure");
    // The agent was told why.
    assert!(messages_text(&fake.agent_requests()[1]).contains("completion rejected"));
}

#[tokio::test]
async fn ask_question_pauses_and_the_answer_reaches_the_next_request() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "ask_question",
            json!({ "question": "Which language should the README use?" }),
        )],
        40,
    ))
    .agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "README.md", "content": "# Hallo" }),
        )],
        40,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "ok", "deliverables": ["README.md"] }),
        )],
        40,
    ));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "ask_user");
    assert_eq!(s["question"], "Which language should the README use?");

    let (status, _) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "guidance": "Write it in German" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let requests = fake.agent_requests();
    let after_resume = messages_text(&requests[1]);
    assert!(
        after_resume.contains("Write it in German"),
        "{after_resume}"
    );
    // The conversation was rebuilt from Postgres: the earlier question is in it.
    assert!(after_resume.contains("Which language should the README use?"));
    assert_gap_free(&app.iterations(&id).await);
}

#[tokio::test]
async fn a_done_sentinel_in_plain_text_completes() {
    let fake = FakeLlm::start().await;
    fake.agent(text(
        "I cannot call tools, but the work is finished.\n<<WARDEN_GOAL_DONE: nothing left>>",
        30,
    ));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed");
    assert_eq!(s["iterations"], 1);
    assert!(s["summary"].as_str().unwrap().contains("nothing left"));
}

#[tokio::test]
async fn server_errors_are_retried_then_count_as_iteration_errors() {
    let fake = FakeLlm::start().await;
    // Two 500s, then an answer: one successful iteration after retries.
    fake.agent(Answer::status(500))
        .agent(Answer::status(503))
        .agent(text("working on it", 10));
    // Then nothing but failures: each iteration exhausts its retries.
    for _ in 0..9 {
        fake.agent(Answer::status(500));
    }
    let app = app_with_model(&fake).await;
    let id = create_llm(
        &app,
        "fixed",
        json!({ "max_consecutive_errors": 2 }),
        json!({}),
    )
    .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped", "{s}");
    assert_eq!(s["reason"], "error_threshold");
    assert_eq!(s["iterations"], 3);
    let iterations = app.iterations(&id).await;
    assert_eq!(iterations[0]["outcome"], "success");
    assert_eq!(iterations[1]["outcome"], "error");
    assert!(
        iterations[1]["record"]["error"]
            .as_str()
            .unwrap()
            .contains("500")
    );
    // 3 attempts for the first iteration, then 3 (1 + 2 retries) for each failing one.
    assert_eq!(fake.agent_requests().len(), 9);
}

#[tokio::test]
async fn model_timeouts_count_as_errors() {
    let fake = FakeLlm::start().await;
    for _ in 0..6 {
        fake.agent(text("slow", 10).delayed(2_000));
    }
    let app = app_with_model(&fake).await;
    let started = Instant::now();
    let id = create_llm(
        &app,
        "fixed",
        json!({ "max_consecutive_errors": 1 }),
        json!({ "timeout_ms": 150 }),
    )
    .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "error_threshold", "{s}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let iterations = app.iterations(&id).await;
    assert!(
        iterations[0]["record"]["error"]
            .as_str()
            .unwrap()
            .contains("unreachable")
    );
}

#[tokio::test]
async fn usage_tokens_reach_the_cost_limit_and_calls_never_ask_beyond_it() {
    let fake = FakeLlm::start().await;
    for i in 0..14 {
        fake.agent(tool_calls(
            &[(
                "write_file",
                json!({ "path": format!("part{i}.txt"), "content": format!("part {i}") }),
            )],
            400,
        ));
    }
    let app = app_with_model(&fake).await;
    // The per-call cap is far above the budget: the allowance is the cap.
    let id = create_llm(
        &app,
        "fixed",
        json!({ "max_tokens": 5_000 }),
        json!({ "max_tokens_per_call": 1_000_000 }),
    )
    .await;
    let s = app.wait_settled(&id).await;
    let ending = (s["status"].as_str(), s["reason"].as_str());
    assert!(
        ending == (Some("paused"), Some("budget_projected_overrun"))
            || ending == (Some("stopped"), Some("cost_limit")),
        "{s}"
    );
    let used = s["tokens_used"].as_u64().unwrap();
    assert!(used <= 5_000, "the budget is hard: {s}");
    let requests = fake.agent_requests();
    assert!(!requests.is_empty());
    for (i, r) in requests.iter().enumerate() {
        let asked = r["max_tokens"].as_u64().unwrap();
        assert_eq!(r["max_completion_tokens"].as_u64(), Some(asked));
        // Less than what was left: the prompt's estimate comes off first.
        let left = 5_000 - 400 * i as u64;
        assert!(asked < left, "call {i} asked {asked} with {left} left");
    }
}

#[tokio::test]
async fn a_prompt_that_alone_exceeds_the_budget_is_never_sent() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(&[("list_files", json!({ "path": "." }))], 10));
    let app = app_with_model(&fake).await;
    // The system prompt and the tools alone are far more than 50 tokens.
    let id = create_llm(&app, "fixed", json!({ "max_tokens": 50 }), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped", "{s}");
    assert_eq!(
        s["reason"], "cost_limit",
        "a budget stop, not an error streak"
    );
    assert_eq!(s["tokens_used"], 0);
    assert!(fake.agent_requests().is_empty());
}

#[tokio::test]
async fn path_traversal_by_the_model_is_refused_and_recorded() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[
            (
                "write_file",
                json!({ "path": "../escape.txt", "content": "x" }),
            ),
            ("read_file", json!({ "path": "/etc/passwd" })),
            ("list_files", json!({ "path": "../.." })),
        ],
        30,
    ))
    .agent(text(
        "<<WARDEN_GOAL_BLOCKED: cannot leave the workspace>>",
        10,
    ));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "agent_blocked", "{s}");
    let first = &app.iterations(&id).await[0];
    assert_eq!(first["outcome"], "failure");
    let observation = first["record"]["observation"].as_str().unwrap();
    assert_eq!(
        observation.matches("outside the workspace").count(),
        3,
        "{observation}"
    );
    assert!(
        !observation.contains("root:"),
        "nothing was read from outside"
    );
}

#[tokio::test]
async fn reflection_yes_completes_and_intervals_adapt() {
    let fake = FakeLlm::start().await;
    for i in 0..15 {
        fake.agent(tool_calls(
            &[(
                "write_file",
                json!({ "path": format!("part{i}.md"), "content": format!("part {i}") }),
            )],
            100,
        ));
    }
    fake.reflection(assessment("NO", "STUCK", 30.0, false, "CONTINUE"))
        .reflection(assessment("YES", "GOOD", 100.0, false, "STOP"));
    let app = app_with_model(&fake).await;
    // No reflection_interval: it starts at the default 10 and adapts.
    let id = create_llm(&app, "continuous", json!({}), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["reason"], "goal_achieved");
    assert_eq!(s["limits"]["reflection_adaptive"], true, "{s}");
    // Reflected after step 10 (STUCK: the next is due 5 steps later) and after step 15.
    let (_, page) = app.get(&format!("/api/autonomous/{id}/reflections")).await;
    let reflections = page["items"].as_array().unwrap();
    assert_eq!(reflections.len(), 2, "{page}");
    assert_eq!(reflections[0]["after_iteration"], 10);
    assert_eq!(
        reflections[0]["next_interval"], 5,
        "stuck → reflect every 5"
    );
    assert_eq!(reflections[1]["after_iteration"], 15);
    assert_eq!(reflections[1]["assessment"]["goal_achieved"], "YES");
    // Each change of interval is a logged decision with its inputs.
    let changes: Vec<Value> = app
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "reflection_interval_changed")
        .collect();
    assert_eq!(changes.len(), 1, "{changes:?}");
    let change = &changes[0]["data"];
    assert_eq!(
        (change["from"].clone(), change["to"].clone()),
        (json!(10), json!(5))
    );
    assert_eq!(change["cause"], "stuck");
    assert_eq!(change["after_iteration"], 10);
    assert_eq!(change["inputs"]["progress"], "STUCK");
    assert_eq!(change["inputs"]["percent_now"], 30.0);
    // And it is listed among the session's decisions, inputs and all.
    let decided: Vec<Value> = app
        .decisions(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "reflection_interval_changed")
        .collect();
    assert_eq!(decided, changes, "the decisions list the change as logged");
    assert_eq!(decided[0]["data"]["inputs"]["progress"], "STUCK");
    assert_eq!(s["tokens_by_source"]["reflection"], 100);
    assert!(s["reflection_share"].as_f64().unwrap() > 0.0);
    assert_eq!(s["percent_complete"], 100.0);
}

#[tokio::test]
async fn reflection_loop_and_stuck_pauses_the_session() {
    let fake = FakeLlm::start().await;
    for i in 0..4 {
        fake.agent(tool_calls(
            &[("list_files", json!({ "path": format!("d{i}") }))],
            20,
        ));
    }
    fake.reflection(assessment("NO", "STUCK", 10.0, true, "CONTINUE"));
    let app = app_with_model(&fake).await;
    let id = create_llm(
        &app,
        "continuous",
        json!({ "reflection_interval": 2 }),
        json!({}),
    )
    .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "stuck");
    assert_eq!(s["iterations"], 2);
    let decisions = app.decisions(&id).await;
    assert_eq!(decisions.last().unwrap()["data"]["reason"], "stuck");
}

#[tokio::test]
async fn a_malformed_reflection_is_recorded_and_the_session_continues() {
    let fake = FakeLlm::start().await;
    for i in 0..3 {
        fake.agent(tool_calls(
            &[("list_files", json!({ "path": format!("d{i}") }))],
            20,
        ));
    }
    fake.agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "all listed", "deliverables": [] }),
        )],
        20,
    ));
    fake.reflection(text("I think it is going fine!", 15))
        .reflection(text(
            r#"{"goalAchieved":"MAYBE","progress":"GOOD","percentComplete":50,"loopDetected":false,"recommendation":"CONTINUE","reasoning":"r"}"#,
            15,
        ));
    let app = app_with_model(&fake).await;
    let id = create_llm(
        &app,
        "continuous",
        json!({ "reflection_interval": 2 }),
        json!({}),
    )
    .await;
    let s = app.wait_settled(&id).await;
    // Two failed reflections fall back to the fixed limits; the agent's own vote completes it.
    assert_eq!(s["status"], "completed", "{s}");
    let (_, page) = app.get(&format!("/api/autonomous/{id}/reflections")).await;
    let reflections = page["items"].as_array().unwrap();
    assert_eq!(reflections.len(), 2, "{page}");
    assert!(reflections.iter().all(|r| r["ok"] == false));
    assert!(
        reflections[0]["error"]
            .as_str()
            .unwrap()
            .contains("no JSON object")
    );
    assert!(
        reflections[1]["error"]
            .as_str()
            .unwrap()
            .contains("goalAchieved")
    );
    assert_eq!(reflections[1]["trigger"], "agent_claimed_done");
}

#[tokio::test]
async fn the_reviewer_disagreeing_twice_with_the_agent_asks_the_user() {
    let fake = FakeLlm::start().await;
    for _ in 0..2 {
        fake.agent(tool_calls(
            &[(
                "task_completion",
                json!({ "result": "done", "deliverables": [] }),
            )],
            20,
        ));
    }
    fake.reflection(assessment("NO", "SLOW", 40.0, false, "CONTINUE"))
        .reflection(assessment("PARTIAL", "SLOW", 60.0, false, "CONTINUE"));
    let app = app_with_model(&fake).await;
    let id = create_llm(
        &app,
        "continuous",
        json!({ "reflection_interval": 10 }),
        json!({}),
    )
    .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "ask_user");
    assert_eq!(s["iterations"], 2);
    // The agent heard the reviewer's objection before its second claim.
    assert!(messages_text(&fake.agent_requests()[1]).contains("disagrees"));
}

#[tokio::test]
async fn stop_abandons_an_in_flight_model_call() {
    let fake = FakeLlm::start().await;
    fake.agent(text("thinking very slowly", 10).delayed(10_000));
    let app = app_with_model(&fake).await;
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    crate::common::eventually(
        Duration::from_secs(5),
        "the call to be in flight",
        || async { !fake.agent_requests().is_empty() },
    )
    .await;
    assert_eq!(fake.agent_requests().len(), 1, "the call is in flight");
    let started = Instant::now();
    let (status, s) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["iterations"], 0);
    // The abandoned call is charged its prompt's estimate (about four bytes
    // a token; the call does not stream, so nothing more), as an event.
    let request = &fake.agent_requests()[0];
    let prompt_bytes = request["messages"].to_string().len() + request["tools"].to_string().len();
    let charged = s["tokens_used"].as_u64().expect("tokens_used");
    assert!(
        charged >= prompt_bytes as u64 / 6 && charged <= prompt_bytes as u64 / 3,
        "{charged} tokens for a prompt of {prompt_bytes} bytes"
    );
    let charges: Vec<Value> = app
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "usage_charged")
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(
        charges,
        [json!({ "source": "abandoned_model_call", "iteration": 1,
                 "tokens": charged, "reported": charged })]
    );
}

mod webhook_agent {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::{Value, json};

    /// An external agent that writes two steps and then says it is done.
    pub async fn start() -> (String, Arc<Mutex<Vec<Value>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        async fn step(
            State(seen): State<Arc<Mutex<Vec<Value>>>>,
            Json(req): Json<Value>,
        ) -> Json<Value> {
            seen.lock().unwrap().push(req.clone());
            let n = req["iteration"].as_u64().expect("iteration");
            Json(if n < 3 {
                json!({ "action": format!("edit_{n}"), "outcome": "success", "tokens": 25,
                        "output": format!("edited part {n}"), "percent_complete": n as f64 * 30.0 })
            } else {
                json!({ "action": "report", "tokens": 5, "output": "all parts edited",
                        "signal": "done", "reason": "three parts edited" })
            })
        }
        let app = Router::new()
            .route("/step", post(step))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/step", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, seen)
    }
}

#[tokio::test]
async fn a_webhook_agent_runs_to_completion() {
    let (url, seen) = webhook_agent::start().await;
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Edit three parts",
            "executor": { "kind": "webhook", "url": url }
        }))
        .await;
    let id = doc["id"].as_str().unwrap();
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["tokens_used"], 55);
    assert!(
        s["summary"]
            .as_str()
            .unwrap()
            .contains("three parts edited")
    );
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["goal"], "Edit three parts");
    assert_eq!(requests[2]["iteration"], 3);
    assert_eq!(requests[2]["history"].as_array().unwrap().len(), 2);
    assert_eq!(requests[2]["history"][1]["output"], "edited part 2");
}

#[tokio::test]
async fn an_unreachable_webhook_counts_as_errors() {
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Talk to a dead agent",
            "limits": { "max_consecutive_errors": 2 },
            "executor": { "kind": "webhook", "url": "http://127.0.0.1:9/step", "timeout_ms": 500 }
        }))
        .await;
    let s = app.wait_settled(doc["id"].as_str().unwrap()).await;
    assert_eq!(s["reason"], "error_threshold", "{s}");
}

#[tokio::test]
async fn llm_sessions_need_an_endpoint() {
    let app = TestApp::start().await;
    let (status, problem) = app
        .post(
            "/api/autonomous",
            Some(json!({ "goal": "x", "executor": { "kind": "llm", "model": "m" } })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("WARDEN_LLM_BASE_URL")
    );
    let (status, problem) = app
        .post(
            "/api/autonomous",
            Some(json!({ "goal": "x", "executor": { "kind": "webhook", "url": "ftp://x" } })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problem["detail"].as_str().unwrap().contains("executor.url"));
}

#[tokio::test]
async fn a_journaled_tool_result_is_replayed_instead_of_run_again() {
    let fake = FakeLlm::start().await;
    let args = json!({ "path": "deploy.log", "content": "deployed once" });
    // The first answer arrives late, so the journal entry below is in place
    // before the executor looks, as it would be after a crash mid-iteration.
    fake.agent(tool_calls(&[("write_file", args.clone())], 30).delayed(500))
        .agent(text("<<WARDEN_GOAL_DONE: deployed>>", 10));
    let workspaces = std::env::temp_dir().join(format!("warden-replay-{}", uuid::Uuid::new_v4()));
    let base = fake.base_url();
    let ws = workspaces.to_string_lossy().to_string();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_WORKSPACE_ROOT", ws.as_str()),
    ]))
    .await;
    let pool = app.pool().clone();
    let id = create_llm(&app, "fixed", json!({}), json!({})).await;
    sqlx::query(
        "INSERT INTO tool_calls (session_id, iteration, call_index, tool, arguments, status, result, finished_at)
         VALUES ($1::uuid, 1, 0, 'write_file', $2, 'finished', $3, now())",
    )
    .bind(&id)
    .bind(&args)
    .bind(json!({ "content": "wrote deploy.log (recorded)", "failed": false,
                  "file": { "path": "deploy.log", "digest": "0000000000000000" } }))
    .execute(&pool)
    .await
    .unwrap();
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let first = &app.iterations(&id).await[0];
    assert_eq!(
        first["record"]["observation"], "write_file: wrote deploy.log (recorded)",
        "the recorded result was replayed"
    );
    assert!(
        !workspaces.join(&id).join("deploy.log").exists(),
        "the side effect did not run a second time"
    );
}

#[tokio::test]
async fn a_restart_mid_session_keeps_the_conversation() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "notes.md", "content": "step one" }),
        )],
        20,
    ))
    .agent(text("still thinking", 10).delayed(3_000))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "done", "deliverables": ["notes.md"] }),
        )],
        20,
    ));
    let base = fake.base_url();
    let ws = std::env::temp_dir()
        .join(format!("warden-restart-{}", uuid::Uuid::new_v4()))
        .to_string_lossy()
        .to_string();
    let vars = [
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_WORKSPACE_ROOT", ws.as_str()),
    ];
    let mut first = TestApp::spawn_with(pool.clone(), config_with(&vars)).await;
    let id = create_llm(&first, "fixed", json!({}), json!({})).await;
    first
        .wait_until(&id, Duration::from_secs(5), |s| s["iterations"] == 1)
        .await;
    // The crash comes while the second request (the slow one) is in flight.
    common::eventually(
        Duration::from_secs(5),
        "the second model request",
        || async { fake.agent_requests().len() >= 2 },
    )
    .await;
    first.crash();
    let second = TestApp::spawn_with(pool, config_with(&vars)).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_gap_free(&second.iterations(&id).await);
    // The request made by the new instance carries step 1's tool call and result.
    let last = fake.agent_requests().last().cloned().unwrap();
    let text = messages_text(&last);
    assert!(text.contains("call_0_write_file"), "{text}");
    assert!(text.contains("wrote notes.md"), "{text}");
}
