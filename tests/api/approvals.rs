//! Calls that wait for a person: a model's `write_file` under an approval
//! rule pauses the session `approval_required`; approving runs it once,
//! rejecting (or expiry) gives the model the refusal as the tool result;
//! decisions survive a kill -9, stay within the tenant, and webhook agents
//! can ask approval for a named action too.

use crate::common;

use std::time::Duration;

use common::fake_llm::{Answer, FakeLlm, tool_calls};
use common::{TestApp, client_with_key, config_with, create_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn app_with_model(fake: &FakeLlm, extra: &[(&str, &str)]) -> TestApp {
    let base = fake.base_url();
    let mut vars = vec![
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
    ];
    vars.extend_from_slice(extra);
    TestApp::start_with(config_with(&vars)).await
}

/// A model answer that says `text` and calls `name` with `args`.
fn saying_and_calling(text: &str, name: &str, args: Value) -> Answer {
    let mut answer = tool_calls(&[(name, args)], 40);
    answer.body["choices"][0]["message"]["content"] = json!(text);
    answer
}

/// The model writes notes.md (asking first), then claims the goal with it.
fn script_write_then_complete(fake: &FakeLlm) {
    fake.agent(saying_and_calling(
        "I will save the notes",
        "write_file",
        json!({ "path": "notes.md", "content": "hello" }),
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "notes saved", "deliverables": ["notes.md"] }),
        )],
        20,
    ));
}

async fn create_writer(app: &TestApp) -> String {
    let doc = app
        .create(json!({
            "goal": "Write notes.md with a greeting",
            "executor": { "kind": "llm",
                "approvals": { "default": "never", "tools": { "write_file": "always" } } }
        }))
        .await;
    doc["id"].as_str().expect("id").to_string()
}

async fn waiting_for_approval(app: &TestApp, id: &str) -> Value {
    app.wait_until(id, Duration::from_secs(30), |s| {
        s["status"] == "paused" && s["reason"] == "approval_required"
    })
    .await
}

async fn decide(app: &TestApp, id: &str, call_id: &str, body: Value) -> (StatusCode, Value) {
    app.post(
        &format!("/api/autonomous/{id}/approvals/{call_id}"),
        Some(body),
    )
    .await
}

/// How many times a step of the session wrote `path`.
async fn writes_of(app: &TestApp, id: &str, path: &str) -> usize {
    app.iterations(id)
        .await
        .iter()
        .flat_map(|i| {
            i["record"]["files_written"]
                .as_array()
                .cloned()
                .expect("files_written")
        })
        .filter(|f| f["path"] == path)
        .count()
}

/// The contents of the tool results the model was sent in `request`.
fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().expect("content").to_string())
        .collect()
}

#[tokio::test]
async fn an_approved_call_runs_once_and_the_session_continues_its_step() {
    let fake = FakeLlm::start().await;
    script_write_then_complete(&fake);
    let app = app_with_model(&fake, &[]).await;
    let id = create_writer(&app).await;

    let s = waiting_for_approval(&app, &id).await;
    let pending = s["pending_approvals"]
        .as_array()
        .expect("pending approvals");
    assert_eq!(pending.len(), 1, "{s}");
    assert_eq!(pending[0]["call_id"], "1.0");
    assert_eq!(pending[0]["tool"], "write_file");
    assert_eq!(pending[0]["arguments"]["path"], "notes.md");
    assert_eq!(pending[0]["reason"], "I will save the notes");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 0, "nothing ran yet");
    assert_eq!(fake.agent_requests().len(), 1);

    // The tenant's inbox lists it.
    let (status, inbox) = app.get("/api/autonomous/approvals").await;
    assert_eq!(status, StatusCode::OK, "{inbox}");
    assert!(
        inbox["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["session_id"] == id.as_str() && a["call_id"] == "1.0"),
        "{inbox}"
    );
    // An unknown call is a 404; a resume without a decision is refused.
    let (status, _) = decide(&app, &id, "7.0", json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    let (status, body) = decide(&app, &id, "1.0", json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    // The completion was verified: the file exists, written by the approved call.
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 1);
    let requests = fake.agent_requests();
    assert_eq!(requests.len(), 2);
    assert!(
        tool_results(&requests[1])
            .iter()
            .any(|r| r == "wrote notes.md"),
        "the model got the approved call's result: {}",
        requests[1]["messages"]
    );

    // Deciding again is a conflict; the decision records who decided.
    let (status, body) = decide(&app, &id, "1.0", json!({ "decision": "reject" })).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let events = app.events(&id).await;
    let requested = events.iter().find(|e| e["kind"] == "approval_requested");
    assert_eq!(
        requested.expect("approval_requested")["data"]["tool"],
        "write_file"
    );
    let decided = events
        .iter()
        .find(|e| e["kind"] == "approval_decided")
        .expect("approval_decided");
    assert_eq!(decided["data"]["decision"], "approve");
    let prefix: String = app.key.chars().take(12).collect();
    assert!(
        decided["data"]["decided_by"]
            .as_str()
            .is_some_and(|by| !by.is_empty() && prefix.starts_with(by)),
        "{decided} (key {prefix}…)"
    );
}

/// The model writes notes.md (asking first), then claims the goal with
/// docs/notes.md: only a person's edit of the path makes that claim true.
fn script_write_then_claim_the_edited_path(fake: &FakeLlm) {
    fake.agent(saying_and_calling(
        "I will save the notes",
        "write_file",
        json!({ "path": "notes.md", "content": "hello" }),
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "notes saved", "deliverables": ["docs/notes.md"] }),
        )],
        20,
    ));
}

#[tokio::test]
async fn an_approval_with_edited_arguments_runs_the_call_with_them_once() {
    let fake = FakeLlm::start().await;
    script_write_then_claim_the_edited_path(&fake);
    let app = app_with_model(&fake, &[]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    let edited = json!({ "path": "docs/notes.md", "content": "hello, edited" });
    let (status, body) = decide(
        &app,
        &id,
        "1.0",
        json!({ "decision": "approve", "arguments": edited, "message": "keep notes in docs/" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    // The claim of docs/notes.md was verified: the edited call wrote it.
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(writes_of(&app, &id, "docs/notes.md").await, 1);
    assert_eq!(
        writes_of(&app, &id, "notes.md").await,
        0,
        "the agent's own arguments never ran"
    );
    // The model learns the call ran, that a person changed it, and how.
    let requests = fake.agent_requests();
    assert_eq!(requests.len(), 2, "no model call repeated");
    let results = tool_results(&requests[1]);
    let result = results
        .iter()
        .find(|r| r.starts_with("wrote docs/notes.md"))
        .unwrap_or_else(|| panic!("the edited call's result: {results:?}"));
    assert!(
        result.contains("edited the arguments") && result.contains("docs/notes.md"),
        "{result}"
    );
    assert!(result.contains("keep notes in docs/"), "{result}");
    // The record keeps both: what the agent asked, and the person's edit.
    let events = app.events(&id).await;
    let requested = events
        .iter()
        .find(|e| e["kind"] == "approval_requested")
        .expect("approval_requested");
    assert_eq!(requested["data"]["arguments"]["path"], "notes.md");
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "approval_decided")
        .collect();
    assert_eq!(decided.len(), 1, "journaled once: {decided:?}");
    assert_eq!(decided[0]["data"]["decision"], "approve");
    assert_eq!(decided[0]["data"]["edited_arguments"], edited);
}

#[tokio::test]
async fn arguments_come_only_with_an_approval_and_as_an_object() {
    let fake = FakeLlm::start().await;
    script_write_then_complete(&fake);
    let app = app_with_model(&fake, &[("WARDEN_MAX_OUTPUT_BYTES", "2048")]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    let refused = [
        json!({ "decision": "reject", "arguments": { "path": "x.md" } }),
        json!({ "decision": "approve", "arguments": ["notes.md"] }),
        json!({ "decision": "approve", "arguments": null }),
        json!({ "decision": "approve", "arguments": { "path": "notes.md", "content": "x".repeat(4_096) } }),
    ];
    for body in refused {
        let (status, problem) = decide(&app, &id, "1.0", body.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body} -> {problem}"
        );
    }
    let s = app.session(&id).await;
    assert_eq!(s["reason"], "approval_required", "still waiting: {s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 0);

    // The agent's own arguments given back are no edit.
    let (status, body) = decide(
        &app,
        &id,
        "1.0",
        json!({ "decision": "approve",
                "arguments": { "content": "hello", "path": "notes.md" } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 1);
    let results = tool_results(&fake.agent_requests()[1]);
    assert!(results.iter().any(|r| r == "wrote notes.md"), "{results:?}");
    let events = app.events(&id).await;
    let decided = events
        .iter()
        .find(|e| e["kind"] == "approval_decided")
        .expect("approval_decided");
    assert!(
        decided["data"].get("edited_arguments").is_none(),
        "{decided}"
    );
}

#[tokio::test]
async fn a_rejected_call_is_the_models_next_tool_result() {
    let fake = FakeLlm::start().await;
    fake.agent(saying_and_calling(
        "Saving",
        "write_file",
        json!({ "path": "notes.md", "content": "hello" }),
    ))
    .agent(tool_calls(
        &[("ask_question", json!({ "question": "where then?" }))],
        20,
    ));
    let app = app_with_model(&fake, &[]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    let (status, body) = decide(
        &app,
        &id,
        "1.0",
        json!({ "decision": "reject", "message": "not in the root, use docs/" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app
        .wait_until(&id, Duration::from_secs(30), |s| s["reason"] == "ask_user")
        .await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(
        writes_of(&app, &id, "notes.md").await,
        0,
        "a rejected call never runs"
    );
    let requests = fake.agent_requests();
    assert_eq!(requests.len(), 2);
    let results = tool_results(&requests[1]);
    assert!(
        results
            .iter()
            .any(|r| r.contains("rejected") && r.contains("not in the root, use docs/")),
        "{results:?}"
    );
}

#[tokio::test]
async fn another_tenant_can_neither_see_nor_decide_a_call() {
    let fake = FakeLlm::start().await;
    script_write_then_complete(&fake);
    let app = app_with_model(&fake, &[]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    let other_key = create_key(&app.base, "other-tenant", "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let other = client_with_key(&other_key);
    let res = other
        .post(app.url(&format!("/api/autonomous/{id}/approvals/1.0")))
        .json(&json!({ "decision": "approve" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let inbox: Value = other
        .get(app.url("/api/autonomous/approvals"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(inbox["items"], json!([]), "{inbox}");
    // A viewer of the owning tenant may look but not decide.
    let viewer_key = create_key(&app.base, common::TEST_TENANT, "viewer").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let res = client_with_key(&viewer_key)
        .post(app.url(&format!("/api/autonomous/{id}/approvals/1.0")))
        .json(&json!({ "decision": "approve" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::FORBIDDEN);

    let s = app.session(&id).await;
    assert_eq!(s["reason"], "approval_required", "still waiting: {s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 0);
}

#[tokio::test]
async fn an_unanswered_call_expires_as_not_approved() {
    let fake = FakeLlm::start().await;
    fake.agent(saying_and_calling(
        "Saving",
        "write_file",
        json!({ "path": "notes.md", "content": "hello" }),
    ))
    .agent(tool_calls(
        &[(
            "ask_question",
            json!({ "question": "nobody answered; what now?" }),
        )],
        20,
    ));
    let app = app_with_model(&fake, &[("WARDEN_APPROVAL_TIMEOUT_MS", "1000")]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;
    let s = app
        .wait_until(&id, Duration::from_secs(30), |s| s["reason"] == "ask_user")
        .await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 0);
    let results = tool_results(&fake.agent_requests()[1]);
    assert!(results.iter().any(|r| r.contains("expired")), "{results:?}");
    let events = app.events(&id).await;
    let decided = events
        .iter()
        .find(|e| e["kind"] == "approval_decided")
        .expect("approval_decided");
    assert_eq!(decided["data"]["decision"], "expired");
    assert_eq!(
        decided["data"]["decided_by"],
        Value::Null,
        "no person decided"
    );
    let (status, _) = decide(&app, &id, "1.0", json!({ "decision": "approve" })).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "an expired call cannot be approved"
    );
}

#[tokio::test]
async fn a_call_waiting_when_the_process_is_killed_still_waits_and_runs_once_after() {
    let db = common::TestDb::new().await;
    let fake = FakeLlm::start().await;
    script_write_then_complete(&fake);
    let dir = std::env::temp_dir().join(format!("warden-appr-{}", uuid::Uuid::new_v4().simple()));
    let base_url = fake.base_url();
    let workspaces = dir.join("workspaces");
    let warden = || {
        let warden = if common::embedded() {
            common::Warden::on_data_dir(&dir.join("data"))
        } else {
            common::Warden::at_url(&common::database_url(&db.pool))
        };
        warden.envs(&[
            ("WARDEN_LLM_BASE_URL", base_url.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
            ("WARDEN_EGRESS_ALLOW", "127.0.0.1"),
            (
                "WARDEN_WORKSPACE_ROOT",
                workspaces.to_str().expect("utf-8 path"),
            ),
        ])
    };
    let mut first = warden().serve().await;
    let app = TestApp::connect(None, first.base.clone()).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    first.kill();
    let restarted = warden().port(first.port()).serve().await;
    let s = waiting_for_approval(&app, &id).await;
    assert_eq!(s["pending_approvals"][0]["call_id"], "1.0", "{s}");

    let (status, body) = decide(&app, &id, "1.0", json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app
        .wait_until(&id, Duration::from_secs(60), |s| {
            s["status"] != "running" && s["status"] != "queued"
        })
        .await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 1);
    assert_eq!(fake.agent_requests().len(), 2, "no model call repeated");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

mod approving_agent {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::{Value, json};

    /// An external agent that asks approval to deploy, then deploys only
    /// when the next step says it was approved.
    pub async fn start() -> (String, Arc<Mutex<Vec<Value>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        async fn step(
            State(seen): State<Arc<Mutex<Vec<Value>>>>,
            Json(req): Json<Value>,
        ) -> Json<Value> {
            seen.lock().unwrap().push(req.clone());
            Json(if req["iteration"] == 1 {
                json!({ "action": "build", "tokens": 5, "output": "built v2",
                        "approval": { "action": "deploy", "arguments": { "env": "prod" },
                                      "reason": "v2 is built and tested" } })
            } else if req["approval"]["decision"] == "approve" {
                json!({ "action": "deploy", "tokens": 5, "output": "deployed",
                        "signal": "done", "reason": "deployed v2" })
            } else {
                json!({ "action": "skip_deploy", "tokens": 5, "output": "not deployed",
                        "signal": "blocked", "reason": "deploy not approved" })
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
async fn a_webhook_agent_asks_approval_for_an_action_and_learns_the_decision() {
    let (url, seen) = approving_agent::start().await;
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Build and deploy v2",
            "executor": { "kind": "webhook", "url": url }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let s = waiting_for_approval(&app, &id).await;
    assert_eq!(s["pending_approvals"][0]["tool"], "deploy", "{s}");
    assert_eq!(s["pending_approvals"][0]["arguments"]["env"], "prod");
    assert_eq!(
        s["pending_approvals"][0]["reason"],
        "v2 is built and tested"
    );

    let (status, body) = decide(
        &app,
        &id,
        "1.0",
        json!({ "decision": "approve", "message": "go ahead" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].get("approval").is_none(), "{}", requests[0]);
    assert_eq!(
        requests[1]["approval"],
        json!({ "action": "deploy", "arguments": { "env": "prod" },
                "decision": "approve", "message": "go ahead" })
    );
}

#[tokio::test]
async fn a_call_and_its_session_are_reached_by_their_one_spelling_only() {
    let fake = FakeLlm::start().await;
    script_write_then_complete(&fake);
    let app = app_with_model(&fake, &[]).await;
    let id = create_writer(&app).await;
    waiting_for_approval(&app, &id).await;

    // A call id is read as written: `1%2E0` is not the call `1.0`.
    for spelled in ["1%2E0", "1%2e0", "%31.0", "1.%30"] {
        let (status, doc) = decide(&app, &id, spelled, json!({ "decision": "approve" })).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{spelled}: {doc}");
        assert_eq!(doc["code"], "approval_not_found", "{spelled}: {doc}");
    }
    // The session's own segment is checked, not any segment: an encoded
    // session id with the canonical one standing elsewhere in the path is
    // no session.
    let encoded = format!("%{:02X}{}", id.as_bytes()[0], &id[1..]);
    let path = format!("/api/autonomous/{encoded}/approvals/{id}");
    let (status, doc) = app
        .post(&path, Some(json!({ "decision": "approve" })))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{doc}");
    assert_eq!(doc["code"], "session_not_found", "{doc}");
    let (status, doc) = decide(&app, &encoded, "1.0", json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{doc}");
    assert_eq!(doc["code"], "session_not_found", "{doc}");

    let s = app.session(&id).await;
    assert_eq!(s["reason"], "approval_required", "still waiting: {s}");
    assert_eq!(writes_of(&app, &id, "notes.md").await, 0);
    // Its one spelling decides it.
    let (status, doc) = decide(&app, &id, "1.0", json!({ "decision": "reject" })).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
}
