//! Sessions that delegate: children made by a split goal or by a step run
//! in parallel under their parent with budgets carved from it; the parent
//! waits for them and goes on with their results; the unspent budget goes
//! back exactly; stop and pause follow the tree; a kill -9 mid-tree loses
//! and repeats nothing; another tenant sees no node.

use crate::common;

use std::time::{Duration, Instant};

use common::fake_llm::{FakeLlm, tool_calls};
use common::{SessionView, TestApp, client_with_key, config_with, create_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A child's script: `n` steps of `tokens` taking `delay_ms` each, the last
/// saying it is done with `answer`.
fn child_steps(n: usize, tokens: u64, delay_ms: u64, answer: &str) -> Value {
    Value::Array(
        (1..=n)
            .map(|i| {
                let output = if i == n {
                    format!("finished\n<<WARDEN_GOAL_DONE: {answer}>>")
                } else {
                    format!("working {i}")
                };
                json!({ "action": format!("work_{i}"), "arguments": { "i": i },
                        "tokens": tokens, "delay_ms": delay_ms, "output": output })
            })
            .collect(),
    )
}

/// A parent whose own script says it is done at once, with `subgoals`.
async fn create_split(app: &TestApp, subgoals: Value, max_tokens: u64) -> String {
    let doc = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": max_tokens, "max_iterations": 200 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "tokens": 10,
                  "output": "merged the results\n<<WARDEN_GOAL_DONE: all parts done>>" }
            ] },
            "subgoals": subgoals,
        }))
        .await;
    assert_eq!(doc["status"], "paused", "{doc}");
    assert_eq!(doc["reason"], "waiting_for_children", "{doc}");
    doc["id"].as_str().expect("id").to_string()
}

async fn tree(app: &TestApp, id: &str) -> Value {
    let (status, body) = app.get(&format!("/api/autonomous/{id}/tree")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

fn child_ids(parent: &Value) -> Vec<String> {
    parent["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| c["id"].as_str().expect("id").to_string())
        .collect()
}

async fn settled(app: &TestApp, id: &str, within: Duration) -> Value {
    app.wait_until(id, within, |s| {
        !common::view::<SessionView>(s).is_live() && s["reason"] != "waiting_for_children"
    })
    .await
}

#[tokio::test]
async fn a_split_goal_runs_its_children_in_parallel_and_the_parent_completes_with_their_results() {
    let app = TestApp::start().await;
    let id = create_split(
        &app,
        json!([
            { "goal": "Build feature X", "steps": child_steps(2, 100, 300, "feature built") },
            { "goal": "Write the tests of X", "success_criteria": ["tests pass"],
              "steps": child_steps(2, 100, 300, "tests written") }
        ]),
        3_000,
    )
    .await;

    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let children = child_ids(&parent);
    assert_eq!(children.len(), 2, "{parent}");
    let mut spans = Vec::new();
    for child in &children {
        let c = app.session(child).await;
        assert_eq!(c["status"], "completed", "{c}");
        assert_eq!(c["parent_id"], id.as_str());
        assert_eq!(c["depth"], 1);
        let its = app.iterations(child).await;
        assert_eq!(its.len(), 2);
        spans.push((
            its[0]["started_at"].as_str().expect("start").to_string(),
            its[1]["finished_at"].as_str().expect("end").to_string(),
        ));
    }
    // In parallel: each started before the other finished.
    assert!(
        spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1,
        "{spans:?}"
    );
    // The parent's own step was given both results.
    let its = app.iterations(&id).await;
    assert_eq!(its.len(), 1, "{its:?}");
    let seen = its[0]["record"]["observation"]
        .as_str()
        .expect("observation");
    for needle in ["feature built", "tests written", &children[0], &children[1]] {
        assert!(seen.contains(needle), "{needle} in {seen}");
    }
    // Each child's budget came back but what it spent (2 × 100 each).
    assert_eq!(parent["delegation"]["tokens_reserved"], 0, "{parent}");
    assert_eq!(parent["delegation"]["tokens_spent_by_children"], 400);
    assert_eq!(parent["limits"]["max_tokens"], 3_000 - 400, "{parent}");
    let ended = app
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "child_ended")
        .count();
    assert_eq!(ended, 2);
    let t = tree(&app, &id).await;
    assert_eq!(t["totals"]["sessions"], 3, "{t}");
    assert_eq!(t["totals"]["live"], 0);
    assert_eq!(t["node"]["subtree_tokens_used"], 410, "{t}");
    assert_eq!(t["node"]["children"].as_array().map(Vec::len), Some(2));

    // The list can leave the children out.
    let (_, all) = app.get("/api/autonomous?limit=50").await;
    assert_eq!(all["items"].as_array().map(Vec::len), Some(3));
    let (_, roots) = app.get("/api/autonomous?root_only=true").await;
    let roots = roots["items"].as_array().cloned().expect("items");
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0]["id"], id.as_str());
}

#[tokio::test]
async fn a_step_delegates_waits_and_goes_on_with_the_results() {
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Write a report with two sections",
            "limits": { "max_tokens": 10_000, "max_iterations": 50 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "split", "tokens": 50, "output": "two sections, two writers",
                  "delegate": [
                      { "goal": "Write section one", "budget_share": 0.25, "script": "one" },
                      { "goal": "Write section two", "budget_share": 0.25, "script": "two" }
                  ] },
                { "action": "join", "tokens": 50,
                  "output": "joined\n<<WARDEN_GOAL_DONE: report written>>" }
            ], "scripts": {
                "one": child_steps(1, 20, 400, "section one"),
                "two": child_steps(1, 20, 400, "section two")
            } }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let waiting = app
        .wait_until(&id, Duration::from_secs(20), |s| {
            s["reason"] == "waiting_for_children"
        })
        .await;
    assert_eq!(waiting["status"], "paused");
    let children = child_ids(&waiting);
    assert_eq!(children.len(), 2, "{waiting}");
    // Carved: a quarter of what was left after the step's own 50 tokens,
    // then a quarter of the rest.
    let budgets: Vec<i64> = waiting["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["budget_tokens"].as_i64().unwrap())
        .collect();
    assert_eq!(budgets, vec![2_487, 1_865], "{waiting}");

    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let its = app.iterations(&id).await;
    assert_eq!(its.len(), 2);
    let seen = its[1]["record"]["observation"]
        .as_str()
        .expect("observation");
    assert!(
        seen.contains("section one") && seen.contains("section two"),
        "{seen}"
    );
    // Exact return: 10,000 less the parent's 100 and the children's 40
    // is what the parent could still spend.
    assert_eq!(parent["limits"]["max_tokens"], 10_000 - 40, "{parent}");
    assert_eq!(parent["tokens_used"], 100);
    let delegated = app
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "child_delegated")
        .count();
    assert_eq!(delegated, 2, "one child per task, none twice");
}

#[tokio::test]
async fn budgets_are_exact_when_many_children_end_at_once_and_a_runaway_child_is_stopped_by_its_own()
 {
    let db = common::TestDb::new().await;
    let app = TestApp::spawn_with(
        db.pool.clone(),
        config_with(&[("WARDEN_MAX_RUNNING", "16")]),
    )
    .await;
    // The runaway first, with a tenth of the budget: 2,000 tokens, which
    // its 400-token steps use up in five; it would go on for ever.
    let mut subgoals = vec![json!({ "goal": "Part 7 of the job", "budget_share": 0.1,
        "repeat": true, "steps": [
            { "action": "spin", "arguments": { "n": 1 }, "tokens": 400, "output": "more" },
            { "action": "spin", "arguments": { "n": 2 }, "tokens": 400, "output": "more" }
        ] })];
    subgoals.extend((0..7).map(|i| {
        json!({ "goal": format!("Part {i} of the job"),
                "steps": child_steps(2, 37 + i, 50, "part done") })
    }));
    let id = create_split(&app, Value::Array(subgoals), 20_000).await;
    let parent = settled(&app, &id, Duration::from_secs(60)).await;
    assert_eq!(
        parent["status"], "completed",
        "the parent goes on: {parent}"
    );

    let t = tree(&app, &id).await;
    let nodes = t["node"]["children"].as_array().cloned().expect("children");
    assert_eq!(nodes.len(), 8);
    let runaway = nodes
        .iter()
        .find(|n| n["goal"] == "Part 7 of the job")
        .expect("runaway");
    assert_eq!(runaway["status"], "stopped", "{runaway}");
    assert_eq!(runaway["reason"], "cost_limit");
    assert_eq!(runaway["budget_tokens"], 2_000, "{runaway}");
    assert_eq!(runaway["tokens_used"], 2_000, "stopped at its own budget");
    assert_eq!(runaway["iterations"], 5);
    // Everything the children spent is counted once; nothing else is lost.
    let spent: i64 = nodes
        .iter()
        .map(|n| n["subtree_tokens_used"].as_i64().unwrap())
        .sum();
    assert_eq!(parent["delegation"]["tokens_spent_by_children"], spent);
    assert_eq!(parent["delegation"]["tokens_reserved"], 0);
    assert_eq!(
        parent["limits"]["max_tokens"].as_i64().unwrap(),
        20_000 - spent,
        "{parent}"
    );
    assert!(t["node"]["subtree_tokens_used"].as_i64().unwrap() <= 20_000);
}

#[tokio::test]
async fn a_parent_whose_children_all_fail_is_blocked_with_their_reasons() {
    let app = TestApp::start().await;
    let failing = |what: &str| {
        json!({ "goal": format!("Try {what}"), "steps": [
            { "action": "try", "output": format!("no way\n<<WARDEN_GOAL_BLOCKED: {what} is impossible>>") }
        ] })
    };
    let id = create_split(&app, json!([failing("plan A"), failing("plan B")]), 5_000).await;
    // Each child pauses blocked; stopping them ends them, and the parent
    // learns both ended without success.
    let waiting = app.session(&id).await;
    for child in child_ids(&waiting) {
        app.wait_until(&child, Duration::from_secs(20), |s| {
            s["reason"] == "agent_blocked"
        })
        .await;
        let (status, body) = app
            .post(&format!("/api/autonomous/{child}/stop"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let parent = settled(&app, &id, Duration::from_secs(20)).await;
    assert_eq!(parent["status"], "paused", "{parent}");
    assert_eq!(parent["reason"], "agent_blocked", "{parent}");
    let why = format!("{} {}", parent["summary"], parent["reason_detail"]);
    assert!(
        why.contains("Try plan A") && why.contains("Try plan B"),
        "{parent}"
    );
    assert!(
        app.iterations(&id).await.is_empty(),
        "no step of its own ran"
    );
}

#[tokio::test]
async fn a_stop_of_the_root_interrupts_every_descendant_at_once() {
    let app = TestApp::start().await;
    let slow = json!([{ "action": "wait", "delay_ms": 60_000, "output": "still" }]);
    let doc = app
        .create(json!({
            "goal": "Coordinate a long job",
            "limits": { "max_tokens": 50_000 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "split", "delegate": [
                    { "goal": "Do the first long part", "script": "middle" },
                    { "goal": "Do the second long part", "script": "slow" }
                ] },
                { "action": "never", "output": "unreached" }
            ], "scripts": {
                "middle": [
                    { "action": "split_again", "delegate": [
                        { "goal": "Do the deepest part", "script": "slow" }
                    ] },
                    { "action": "never", "output": "unreached" }
                ],
                "slow": slow
            } }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    // Wait for the whole tree: the grandchild runs its long step.
    let deepest = common::eventually_ok(Duration::from_secs(20), "the tree grows", || async {
        let t = tree(&app, &id).await;
        let running = t["totals"]["live"].as_u64().expect("live");
        let grandchild = t["node"]["children"][0]["children"][0].clone();
        if t["totals"]["sessions"] == 4 && grandchild["status"] == "running" && running == 4 {
            Ok(grandchild["id"].as_str().expect("id").to_string())
        } else {
            Err(t.to_string())
        }
    })
    .await;
    let started = Instant::now();
    let (status, body) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "interrupted");
    assert!(
        took < Duration::from_secs(5),
        "the whole tree stopped in {took:?}"
    );
    let t = tree(&app, &id).await;
    assert_eq!(t["totals"]["live"], 0, "nothing left running: {t}");
    let deep = app.session(&deepest).await;
    assert_eq!(deep["status"], "interrupted", "{deep}");
    assert_eq!(deep["reason"], "user_stop");
    // A child that ended cannot be run again on its own, and the root
    // cannot be deleted while... it can now: the whole tree ended.
    let (status, body) = app
        .post(&format!("/api/autonomous/{deepest}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let (status, _) = app.get(&format!("/api/autonomous/{deepest}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted with its tree");
}

#[tokio::test]
async fn pause_and_resume_follow_the_tree() {
    let app = TestApp::start().await;
    let id = create_split(
        &app,
        json!([
            { "goal": "Do part one slowly", "steps": child_steps(3, 10, 400, "one") },
            { "goal": "Do part two slowly", "steps": child_steps(3, 10, 400, "two") }
        ]),
        5_000,
    )
    .await;
    let children = child_ids(&app.session(&id).await);
    for child in &children {
        app.wait_until(child, Duration::from_secs(20), |s| s["status"] == "running")
            .await;
    }
    let (status, body) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for child in &children {
        let c = settled(&app, child, Duration::from_secs(20)).await;
        assert_eq!(c["status"], "paused", "{c}");
        assert_eq!(c["reason"], "user_pause");
    }
    // Deleting a tree that has not ended is refused.
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    // A parent waiting for its children goes on by itself: a resume body
    // is checked (out-of-range limits are a 422) and a change it asks for
    // is refused, never dropped.
    let resume = format!("/api/autonomous/{id}/resume");
    let too_many = json!({ "limits": { "max_iterations": 9_116_445 } });
    let (status, body) = app.post(&resume, Some(too_many)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let guided = json!({ "guidance": "Hurry up" });
    let (status, body) = app.post(&resume, Some(guided)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        app.session(&children[0]).await["status"] == "paused",
        "a refused resume resumed nothing"
    );
    // A child's carved budget changes only through its parent: a conflict
    // with what the session is, not a malformed request.
    let (status, body) = app
        .patch(
            &format!("/api/autonomous/{}", children[0]),
            json!({ "limits": { "max_iterations": 15 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "carved_budget", "{body}");

    let (status, body) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["reason"], "waiting_for_children",
        "it keeps waiting: {body}"
    );
    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    for child in &children {
        assert_eq!(app.session(child).await["status"], "completed");
    }
}

#[tokio::test]
async fn another_tenant_sees_no_node_of_a_tree() {
    let app = TestApp::start().await;
    let id = create_split(
        &app,
        json!([{ "goal": "Do a slow part", "steps": child_steps(1, 10, 30_000, "done") }]),
        5_000,
    )
    .await;
    let child = child_ids(&app.session(&id).await).remove(0);
    let other_key = create_key(&app.base, "other-tenant", "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let other = client_with_key(&other_key);
    for path in [
        format!("/api/autonomous/{id}/tree"),
        format!("/api/autonomous/{child}/tree"),
        format!("/api/autonomous/{child}"),
    ] {
        let res = other.get(app.url(&path)).send().await.expect("sent");
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    for action in ["stop", "pause", "resume"] {
        let res = other
            .post(app.url(&format!("/api/autonomous/{child}/{action}")))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{action}");
    }
    let list: Value = other
        .get(app.url("/api/autonomous"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(list["items"], json!([]), "{list}");
    let untouched = app.session(&child).await;
    assert!(
        common::view::<SessionView>(&untouched).is_live(),
        "nothing the other tenant sent reached it: {untouched}"
    );
    let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_model_agent_delegates_with_its_tool_and_reads_the_childs_result() {
    let fake = FakeLlm::start().await;
    // The parent delegates; the child (its own session, the same model)
    // answers; then the parent, given the result, completes.
    fake.agent(tool_calls(
        &[(
            "delegate_task",
            json!({ "goal": "Find the answer to the question", "budget_share": 0.5 }),
        )],
        30,
    ))
    .agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "answer.md", "content": "42" }),
        )],
        20,
    ))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "the answer is 42", "deliverables": ["answer.md"] }),
        )],
        20,
    ))
    .agent(tool_calls(
        &[("task_completion", json!({ "result": "reported 42" }))],
        20,
    ));
    let base = fake.base_url();
    let ws = std::env::temp_dir().join(format!("warden-tree-ws-{}", uuid::Uuid::new_v4().simple()));
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_WORKSPACE_ROOT", ws.to_str().expect("utf-8 path")),
    ]))
    .await;
    let doc = app
        .create(json!({
            "goal": "Answer the question with help",
            "limits": { "max_tokens": 20_000 },
            "executor": { "kind": "llm" }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let child = child_ids(&parent).remove(0);
    let c = app.session(&child).await;
    assert_eq!(c["status"], "completed", "{c}");
    assert_eq!(c["goal"], "Find the answer to the question");
    let requests = fake.agent_requests();
    assert_eq!(requests.len(), 4);
    let last = requests[3]["messages"].to_string();
    assert!(
        last.contains("Results of the tasks you delegated") && last.contains("the answer is 42"),
        "the parent was given the child's result: {last}"
    );
    // The child worked inside the parent's workspace, and the parent was
    // told where its file is.
    assert!(
        last.contains(&format!("delegated/{child}/answer.md")),
        "{last}"
    );
    let written = ws
        .join(&id)
        .join("delegated")
        .join(&child)
        .join("answer.md");
    assert_eq!(
        std::fs::read_to_string(&written).expect("the child's file"),
        "42"
    );
    let _ = std::fs::remove_dir_all(&ws);
    // The offered tools name delegation.
    assert!(requests[0]["tools"].to_string().contains("delegate_task"));
}

#[tokio::test]
async fn a_kill_mid_tree_loses_nothing_and_repeats_nothing() {
    let db = common::TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("warden-tree-{}", uuid::Uuid::new_v4().simple()));
    let warden = || {
        let warden = if common::embedded() {
            common::Warden::on_data_dir(&dir.join("data"))
        } else {
            common::Warden::at_url(&common::database_url(&db.pool))
        };
        warden.envs(&[
            ("WARDEN_LEASE_TTL_MS", "2000"),
            (
                "WARDEN_WORKSPACE_ROOT",
                dir.join("ws").to_str().expect("utf-8 path"),
            ),
        ])
    };
    let mut first = warden().serve().await;
    let app = TestApp::connect(None, first.base.clone()).await;
    let id = create_split(
        &app,
        json!([
            { "goal": "Do part one", "steps": child_steps(6, 10, 300, "one") },
            { "goal": "Do part two", "steps": child_steps(6, 10, 300, "two") }
        ]),
        5_000,
    )
    .await;
    let children = child_ids(&app.session(&id).await);
    common::eventually(
        Duration::from_secs(20),
        "both children have stepped",
        || {
            let app = &app;
            let children = &children;
            async move {
                for child in children {
                    if app.iterations(child).await.len() < 2 {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    first.kill();
    let restarted = warden().port(first.port()).serve().await;
    let parent = settled(&app, &id, Duration::from_secs(90)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let after = child_ids(&parent);
    assert_eq!(after, children, "no child made twice");
    for child in &children {
        let c = app.session(child).await;
        assert_eq!(c["status"], "completed", "{c}");
        let its = app.iterations(child).await;
        assert_eq!(its.len(), 6, "each step once");
        common::assert_gap_free(&its);
    }
    assert_eq!(parent["delegation"]["tokens_spent_by_children"], 120);
    assert_eq!(app.iterations(&id).await.len(), 1);
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

mod delegating_agent {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::{Value, json};

    /// An external agent that, as the parent, delegates one task and then
    /// reports its child's result; as the child, does the task at once.
    pub async fn start() -> (String, Arc<Mutex<Vec<Value>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        async fn step(
            State(seen): State<Arc<Mutex<Vec<Value>>>>,
            Json(req): Json<Value>,
        ) -> Json<Value> {
            seen.lock().unwrap().push(req.clone());
            Json(if req["goal"] == "Count the open issues" {
                json!({ "action": "count", "tokens": 7, "output": "17 open",
                        "signal": "done", "reason": "17 issues are open" })
            } else if req["iteration"] == 1 {
                json!({ "action": "plan", "tokens": 5, "output": "asking a helper",
                        "delegate": [{ "goal": "Count the open issues", "budget_share": 0.5 }] })
            } else {
                let told = req["children"][0]["summary"]
                    .as_str()
                    .expect("the child's summary")
                    .to_string();
                json!({ "action": "report", "tokens": 5, "output": format!("heard: {told}"),
                        "signal": "done", "reason": format!("the helper said {told}") })
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
async fn a_webhook_agent_delegates_in_its_answer_and_gets_the_result_in_its_next_request() {
    let (url, seen) = delegating_agent::start().await;
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Report how many issues are open",
            "limits": { "max_tokens": 1_000 },
            "executor": { "kind": "webhook", "url": url }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let child = child_ids(&parent).remove(0);
    assert_eq!(app.session(&child).await["status"], "completed");
    let requests = seen.lock().unwrap().clone();
    let last = requests
        .iter()
        .rev()
        .find(|r| r["session_id"] == id.as_str())
        .expect("the parent's last request");
    assert_eq!(last["children"][0]["child_id"], child.as_str(), "{last}");
    assert_eq!(last["children"][0]["status"], "completed");
    assert!(
        parent["summary"]
            .as_str()
            .is_some_and(|s| s.contains("17 issues")),
        "{parent}"
    );
    // Half of what was left after the parent's first step (1,000 - 5).
    assert_eq!(parent["children"][0]["budget_tokens"], 497);
}

#[tokio::test]
async fn a_tenants_tree_limits_refuse_a_deeper_child_and_the_agent_is_told_why() {
    let app = TestApp::start().await;
    common::store_on(app.pool().clone())
        .set_tenant_tree_limits(common::TEST_TENANT, Some(1), Some(2))
        .await
        .expect("limits stored");
    let doc = app
        .create(json!({
            "goal": "Plan the work and hand it out",
            "limits": { "max_tokens": 10_000 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "hand_out", "delegate": [
                    { "goal": "Do the work", "script": "again", "wait": true }
                ] },
                { "action": "finish", "output": "done\n<<WARDEN_GOAL_DONE: handed out>>" }
            ], "scripts": {
                "again": [
                    { "action": "hand_out_again", "delegate": [{ "goal": "Do part of the work" }] },
                    { "action": "finish", "output": "done\n<<WARDEN_GOAL_DONE: did it>>" }
                ]
            } }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let parent = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let child = child_ids(&parent).remove(0);
    let its = app.iterations(&child).await;
    assert_eq!(its[0]["outcome"], "error", "{its:?}");
    let why = its[0]["record"]["error"].to_string();
    assert!(why.contains("deeper than the 1 allowed"), "{why}");
    assert_eq!(
        tree(&app, &id).await["totals"]["sessions"],
        2,
        "no grandchild was made"
    );
    // A split over the children limit is refused at creation.
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .json(&json!({
            "goal": "Do three things at once",
            "executor": { "kind": "scripted", "steps": [{ "action": "a" }] },
            "subgoals": ["Do the first thing", "Do the second thing", "Do the third thing"]
        }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = res.json().await.expect("json");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("children")),
        "{body}"
    );
}

/// Running sessions of the test tenant, as its list shows them.
async fn running_count(app: &TestApp) -> usize {
    let (status, list) = app.get("/api/autonomous?status=running&limit=200").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["items"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn children_count_against_the_tenants_running_cap_and_another_tenant_is_not_kept_waiting() {
    let app = TestApp::start_with(config_with(&[("WARDEN_TENANT_MAX_RUNNING", "2")])).await;
    // Eight children made at once: all queued, never refused.
    let subgoals: Vec<Value> = (1..=8)
        .map(|i| {
            json!({ "goal": format!("Do part {i} of the job"),
                         "steps": child_steps(2, 10, 150, &format!("part {i}")) })
        })
        .collect();
    let id = create_split(&app, Value::Array(subgoals), 50_000).await;
    // Another tenant's session starts at once though the first tenant
    // has six children waiting.
    let other_key = create_key(&app.base, "other-tenant", "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let other = client_with_key(&other_key);
    let created: Value = other
        .post(app.url("/api/autonomous"))
        .json(&json!({ "goal": "Do the other tenant's work",
                       "executor": { "kind": "scripted",
                                     "steps": child_steps(1, 10, 2_000, "other done") } }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    let other_id = created["id"].as_str().expect("id").to_string();
    let started = Instant::now();
    let mut other_ran = false;
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        most = most.max(running_count(&app).await);
        if !other_ran {
            let s: Value = other
                .get(app.url(&format!("/api/autonomous/{other_id}")))
                .send()
                .await
                .expect("sent")
                .json()
                .await
                .expect("json");
            other_ran = s["status"] != "queued";
            assert!(
                other_ran || started.elapsed() < Duration::from_secs(5),
                "the other tenant waited behind the children: {s}"
            );
        }
        let parent = app.session(&id).await;
        if parent["status"] == "completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tree did not finish: {parent}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(other_ran);
    assert!(most <= 2, "{most} of the tenant's sessions ran at once");
    assert!(most >= 1);
    let parent = app.session(&id).await;
    assert_eq!(child_ids(&parent).len(), 8);
    for child in child_ids(&parent) {
        assert_eq!(app.session(&child).await["status"], "completed");
    }
}

/// A child whose rising costs pause it (`budget_projected_overrun`) and
/// one that finishes.
fn one_child_pauses() -> Value {
    json!([
        { "goal": "Do the expensive part", "budget_share": 0.3, "steps": [
            { "action": "a", "tokens": 100 }, { "action": "b", "tokens": 200 },
            { "action": "c", "tokens": 400 },
            { "action": "d", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: never>>" }
        ] },
        { "goal": "Do the cheap part", "steps": child_steps(1, 10, 0, "cheap part done") }
    ])
}

#[tokio::test]
async fn a_child_that_pauses_for_a_person_is_named_by_its_root_its_stream_and_the_inbox() {
    let app = TestApp::start().await;
    let id = create_split(&app, one_child_pauses(), 3_000).await;
    let root = app
        .wait_until(&id, Duration::from_secs(30), |s| {
            s["children_needing_attention"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
        .await;
    assert_eq!(root["reason"], "waiting_for_children", "{root}");
    assert_eq!(root["on_child_pause"], "wait");
    let named = &root["children_needing_attention"][0];
    assert_eq!(named["reason"], "budget_projected_overrun", "{root}");
    assert_eq!(named["goal"], "Do the expensive part");
    assert_eq!(named["root_id"], id.as_str());
    assert_eq!(named["depth"], 1);
    let child = named["child_id"].as_str().expect("child").to_string();
    let event = app
        .events(&id)
        .await
        .into_iter()
        .find(|e| e["kind"] == "child_needs_attention")
        .expect("the root's log names the child");
    assert_eq!(event["data"]["child_id"], child.as_str(), "{event}");
    assert_eq!(event["data"]["reason"], "budget_projected_overrun");
    let (status, inbox) = app.get("/api/autonomous/attention").await;
    assert_eq!(status, StatusCode::OK, "{inbox}");
    assert_eq!(inbox["items"][0]["child_id"], child.as_str(), "{inbox}");
    let (status, page) = app.get("/api/autonomous/attention?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    let cursor = page["next_cursor"].as_str().expect("a cursor at the limit");
    let (_, rest) = app
        .get(&format!("/api/autonomous/attention?cursor={cursor}"))
        .await;
    assert_eq!(rest["items"], json!([]), "{rest}");
    let (status, _) = app.get("/api/autonomous/attention?cursor=nonsense").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Another tenant's inbox does not list it.
    let other_key = create_key(&app.base, "other-tenant", "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let theirs: Value = client_with_key(&other_key)
        .get(app.url("/api/autonomous/attention"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(theirs["items"], json!([]), "{theirs}");
    // A person stops the child: the root goes on with the other's result.
    let (status, _) = app
        .post(&format!("/api/autonomous/{child}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let root = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(root["status"], "completed", "{root}");
    let (_, inbox) = app.get("/api/autonomous/attention").await;
    assert_eq!(inbox["items"], json!([]));
}

#[tokio::test]
async fn under_fail_child_a_child_that_would_pause_fails_and_its_parent_goes_on() {
    let app = TestApp::start().await;
    let doc = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": 3_000, "max_iterations": 200 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "tokens": 10,
                  "output": "merged\n<<WARDEN_GOAL_DONE: what could be done is done>>" }
            ] },
            "subgoals": one_child_pauses(),
            "on_child_pause": "fail_child",
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    assert_eq!(doc["on_child_pause"], "fail_child", "{doc}");
    let root = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(root["status"], "completed", "{root}");
    let failed = app
        .events(&id)
        .await
        .into_iter()
        .find(|e| e["kind"] == "child_ended" && e["data"]["status"] == "failed")
        .expect("the parent was told the child failed");
    assert_eq!(
        failed["data"]["reason"], "budget_projected_overrun",
        "{failed}"
    );
    let child = app
        .session(failed["data"]["child_id"].as_str().expect("child"))
        .await;
    assert_eq!(child["status"], "failed", "{child}");
    assert_eq!(child["on_child_pause"], "fail_child");
    // Nothing ever waited for a person.
    assert!(
        !app.events(&id)
            .await
            .iter()
            .any(|e| e["kind"] == "child_needs_attention")
    );
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .json(&json!({ "goal": "Do the thing", "on_child_pause": "pause",
                       "executor": { "kind": "scripted", "steps": [{ "action": "a" }] } }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_subgoal_with_its_own_steps_delegates_to_the_parents_scripts_and_an_outliving_child_ends_parent_ended()
 {
    let db = common::TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let doc = app
        .create(json!({
            "goal": "Plan the work and hand it out",
            "limits": { "max_tokens": 10_000, "max_iterations": 200 },
            "executor": { "kind": "scripted", "steps": [
                { "action": "merge", "output": "merged\n<<WARDEN_GOAL_DONE: done>>" }
            ], "scripts": { "leaf": [
                { "action": "slow", "delay_ms": 60_000 },
                { "action": "end", "output": "<<WARDEN_GOAL_DONE: never>>" }
            ] } },
            "subgoals": [{ "goal": "Start the background job", "steps": [
                { "action": "start_job", "delegate": [
                    { "goal": "Run the background job", "script": "leaf", "wait": false }
                ] },
                { "action": "finish", "output": "started\n<<WARDEN_GOAL_DONE: job started>>" }
            ] }],
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let root = settled(&app, &id, Duration::from_secs(30)).await;
    assert_eq!(root["status"], "completed", "{root}");
    let child = child_ids(&root).remove(0);
    let its = app.iterations(&child).await;
    assert_eq!(
        its[0]["outcome"], "success",
        "the script was found: {its:?}"
    );
    let c = app.session(&child).await;
    assert_eq!(c["status"], "completed", "{c}");
    let grandchild = child_ids(&c).remove(0);
    let g = app
        .wait_until(&grandchild, Duration::from_secs(30), |s| {
            s["status"] == "interrupted"
        })
        .await;
    assert_eq!(g["reason"], "parent_ended", "{g}");
}

/// xorshift64*: the random trees below are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Random scripted steps: costs up to 300 tokens, sometimes a question
/// for a person, sometimes tasks for `next_level` scripts.
fn random_steps(rng: &mut Rng, next_level: &[String]) -> Value {
    let len = 1 + rng.below(3);
    let mut steps = Vec::new();
    for i in 0..len {
        let mut step = json!({ "action": format!("work_{i}_{}", rng.below(1_000)),
                               "tokens": rng.below(300), "delay_ms": rng.below(60) });
        if rng.below(10) == 0 {
            step["output"] = json!("<<WARDEN_GOAL_BLOCKED: which of the two designs?>>");
        }
        if !next_level.is_empty() && rng.below(2) == 0 {
            let tasks: Vec<Value> = (0..1 + rng.below(3))
                .map(|t| {
                    json!({ "goal": format!("Do sub-task {t}"),
                            "script": next_level[rng.below(next_level.len() as u64) as usize],
                            "budget_share": (20 + rng.below(50)) as f64 / 100.0,
                            "wait": rng.below(5) != 0 })
                })
                .collect();
            step["delegate"] = Value::Array(tasks);
        }
        steps.push(step);
    }
    steps.push(json!({ "action": "finish", "tokens": rng.below(50),
                       "output": "<<WARDEN_GOAL_DONE: done>>" }));
    Value::Array(steps)
}

/// Every node of a tree view, flattened.
fn nodes(node: &Value, out: &mut Vec<Value>) {
    out.push(node.clone());
    for child in node["children"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

/// Runs one random tree of depth ≤ 3 and fan-out ≤ 3 to its end, acting
/// as the person whenever it stands still; checks that it never stands
/// still without its root naming why, nor passes its budget.
/// How many children a person was asked about, and how many sessions there were.
async fn run_random_tree(app: &TestApp, seed: u64) -> (usize, usize) {
    let mut asked = 0;
    let mut rng = Rng(seed);
    let level3: Vec<String> = (0..2).map(|i| format!("deep{i}")).collect();
    let level2: Vec<String> = (0..2).map(|i| format!("mid{i}")).collect();
    let mut scripts = serde_json::Map::new();
    for name in &level3 {
        scripts.insert(name.clone(), random_steps(&mut rng, &[]));
    }
    for name in &level2 {
        scripts.insert(name.clone(), random_steps(&mut rng, &level3));
    }
    let subgoals: Vec<Value> = (0..1 + rng.below(3))
        .map(
            |i| json!({ "goal": format!("Do part {i}"), "steps": random_steps(&mut rng, &level2) }),
        )
        .collect();
    let budget = 500 + rng.below(2_500);
    let policy = if rng.below(2) == 0 {
        "wait"
    } else {
        "fail_child"
    };
    let doc = app
        .create(json!({
            "goal": "Do the whole job in parts",
            "limits": { "max_tokens": budget, "max_iterations": 500 },
            "executor": { "kind": "scripted", "scripts": scripts, "steps": [
                { "action": "merge", "tokens": rng.below(100), "output": "<<WARDEN_GOAL_DONE: merged>>" }
            ] },
            "subgoals": subgoals,
            "on_child_pause": policy,
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(90);
    let all = loop {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the tree did not end"
        );
        let view = tree(app, &id).await;
        let mut all = Vec::new();
        nodes(&view["node"], &mut all);
        if view["totals"]["live"] == 0 {
            break all;
        }
        let moving = all
            .iter()
            .any(|n| ["queued", "running"].contains(&n["status"].as_str().expect("status")));
        let root = app.session(&id).await;
        if moving
            || ["completed", "stopped", "interrupted", "failed"]
                .contains(&root["status"].as_str().expect("status"))
        {
            // Moving, or the root ended and the sweep stops what is left.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // Standing still: the root's status says why.
        if root["reason"] != "waiting_for_children" {
            assert_eq!(root["status"], "paused", "seed {seed}: {root}");
            let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
            assert_eq!(status, StatusCode::OK);
            continue;
        }
        let named = root["children_needing_attention"]
            .as_array()
            .cloned()
            .expect("children_needing_attention");
        // A child may have paused after the tree was read: read again.
        if named.is_empty() {
            let again = app.session(&id).await;
            let named = again["children_needing_attention"]
                .as_array()
                .map_or(0, Vec::len);
            let view = tree(app, &id).await;
            let mut now = Vec::new();
            nodes(&view["node"], &mut now);
            let still = !now
                .iter()
                .any(|n| ["queued", "running"].contains(&n["status"].as_str().expect("status")));
            assert!(
                !still || named > 0 || again["reason"] != "waiting_for_children",
                "seed {seed}: the tree stands still and its root names no child: {again} {view}"
            );
            continue;
        }
        assert_eq!(
            policy, "wait",
            "seed {seed}: a fail_child tree waited: {root}"
        );
        asked += named.len();
        for child in named {
            let child = child["child_id"].as_str().expect("child");
            let (status, _) = app
                .post(&format!("/api/autonomous/{child}/stop"), None)
                .await;
            assert_eq!(status, StatusCode::OK);
        }
    };
    let spent: i64 = all
        .iter()
        .map(|n| n["tokens_used"].as_i64().expect("tokens_used"))
        .sum();
    // Steps that report more than they were allowed are charged their
    // allowance, and the allowances of steps in flight together never pass
    // what the tree has left: the tree never passes its root's budget.
    assert!(
        spent <= budget as i64,
        "seed {seed}: {spent} spent of a budget of {budget}"
    );
    (asked, all.len())
}

#[tokio::test]
async fn random_trees_end_without_a_silent_stall_and_within_their_budget() {
    let app = TestApp::start().await;
    let (mut asked, mut sessions) = (0, 0);
    for seed in 1..=16u64 {
        let (a, s) = run_random_tree(&app, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).await;
        asked += a;
        sessions += s;
    }
    eprintln!("{sessions} sessions in 16 trees; a person was asked about {asked} children");
    // The trees were trees, and some stood still on a child that the root named.
    assert!(sessions > 16 * 2, "{sessions}");
    assert!(asked > 0);
}
