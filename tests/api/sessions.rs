//! The session lifecycle over the real HTTP API and Postgres: completion,
//! sentinels, every guardrail, stop, pause, resume and live updates.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, assert_gap_free, distinct_steps};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn done_sentinel_completes_the_session() {
    let app = TestApp::start().await;
    let created = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "continuous",
            "executor": { "kind": "scripted", "steps": [
                { "action": "plan", "tokens": 50, "output": "planned" },
                { "action": "write_file", "arguments": { "path": "README.md" }, "tokens": 120, "output": "wrote README.md" },
                { "action": "report", "tokens": 30, "output": "All done.\n<<WARDEN_GOAL_DONE: README.md written>>" }
            ] }
        }))
        .await;
    assert_eq!(created["status"], "running");
    assert_eq!(created["mode"], "continuous");
    let id = created["id"].as_str().unwrap();
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["reason"], "goal_achieved");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["tokens_used"], 200);
    assert_eq!(s["percent_complete"], 100.0);
    assert_eq!(s["checkpoint_saved"], true);
    assert!(s["ended_at"].is_string());
    assert!(s["summary"].as_str().unwrap().contains("README.md written"));
    assert!(!s["next_steps"].as_array().unwrap().is_empty());
    assert_gap_free(&app.iterations(id).await);
    // A log far shorter than the event horizon was never compacted.
    let (status, page) = app.get(&format!("/api/autonomous/{id}/events")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page["compacted_through"].is_null(), "{page}");
    assert!(!page["items"].as_array().unwrap().is_empty(), "{page}");
}

#[tokio::test]
async fn blocked_sentinel_pauses_with_agent_blocked() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            json!([
                { "action": "try", "output": "working" },
                { "action": "deploy", "output": "no credentials\n<<warden_goal_blocked: need deploy key>>" },
                { "action": "never", "output": "must not run" }
            ]),
            json!({}),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused");
    assert_eq!(s["reason"], "agent_blocked");
    assert_eq!(s["iterations"], 2);
    assert!(s["summary"].as_str().unwrap().contains("need deploy key"));
}

#[tokio::test]
async fn quoted_sentinel_does_not_stop() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            json!([
                { "action": "explain", "output": "I will print <<WARDEN_GOAL_DONE: x>> when finished" },
                { "action": "finish", "output": "<<WARDEN_GOAL_DONE>>" }
            ]),
            json!({}),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed");
    assert_eq!(s["iterations"], 2);
}

#[tokio::test]
async fn script_running_out_stops_with_executor_exhausted() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(2, 10, 0), json!({}))
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["reason"], "executor_exhausted");
    assert_eq!(s["iterations"], 2);
}

#[tokio::test]
async fn iteration_cap_stops_with_max_iterations() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(10, 10, 0), json!({ "max_iterations": 3 }))
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["reason"], "max_iterations");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["checkpoint_saved"], true);
    assert!(
        s["next_steps"][0]
            .as_str()
            .unwrap()
            .contains("max_iterations")
    );
}

#[tokio::test]
async fn token_budget_stops_with_cost_limit() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(10, 100, 0), json!({ "max_tokens": 300 }))
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["reason"], "cost_limit");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["tokens_used"], 300, "spent to the budget, never past it");
}

#[tokio::test]
async fn wall_clock_stops_a_long_step_with_timeout() {
    let app = TestApp::start().await;
    let started = Instant::now();
    let id = app
        .create_scripted(
            distinct_steps(3, 10, 30_000),
            json!({ "max_wall_time_ms": 300 }),
        )
        .await;
    let s = app.wait_settled(&id).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["reason"], "timeout");
    assert_eq!(s["iterations"], 0);
    assert!(s["elapsed_ms"].as_i64().unwrap() >= 300);
}

#[tokio::test]
async fn consecutive_errors_stop_with_error_threshold() {
    let app = TestApp::start().await;
    let steps: Vec<_> = (1..=6)
        .map(|i| json!({ "action": format!("call_{i}"), "outcome": "error", "output": format!("error {i}") }))
        .collect();
    let id = app
        .create_scripted(json!(steps), json!({ "max_consecutive_errors": 3 }))
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["reason"], "error_threshold");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["consecutive_errors"], 3);
    let decisions = app.decisions(&id).await;
    assert!(
        decisions
            .iter()
            .any(|d| d["kind"] == "guardrail_tripped" && d["data"]["breach"] == "error_threshold")
    );
}

#[tokio::test]
async fn fixed_mode_defaults_to_fifty_iterations() {
    let app = TestApp::start().await;
    let created = app
        .create(json!({
            "goal": "Create README.md",
            "mode": "fixed",
            "executor": { "kind": "scripted", "steps": distinct_steps(60, 1, 0) }
        }))
        .await;
    assert_eq!(created["limits"]["max_iterations"], 50);
    let s = app.wait_settled(created["id"].as_str().unwrap()).await;
    assert_eq!(s["reason"], "max_iterations");
    assert_eq!(s["iterations"], 50);
    let continuous = app
        .create(json!({
            "goal": "Create README.md",
            "mode": "continuous",
            "executor": { "kind": "scripted", "steps": distinct_steps(1, 1, 0) }
        }))
        .await;
    assert_eq!(continuous["limits"]["max_iterations"], 200);
    assert_eq!(continuous["limits"]["max_tokens"], 500_000);
    assert_eq!(continuous["limits"]["max_wall_time_ms"], 7_200_000);
    assert_eq!(continuous["limits"]["max_consecutive_errors"], 5);
}

#[tokio::test]
async fn stop_lands_during_a_long_step_and_resume_continues() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            json!([
                { "action": "quick", "tokens": 10, "output": "fast" },
                { "action": "slow", "tokens": 10, "output": "slow", "delay_ms": 1500 },
                { "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: finished>>" }
            ]),
            json!({}),
        )
        .await;
    app.wait_until(&id, Duration::from_secs(5), |s| {
        s["iterations"] == 1 && !s["current_step"].is_null()
    })
    .await;

    let started = Instant::now();
    let (status, s) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{s}");
    assert!(took < Duration::from_millis(1000), "stop took {took:?}");
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["reason"], "user_stop");
    assert_eq!(s["checkpoint_saved"], true);
    assert_eq!(
        s["iterations"], 1,
        "the step in flight is abandoned, not committed"
    );

    let (_, checkpoints) = app.get(&format!("/api/autonomous/{id}/checkpoints")).await;
    let last = checkpoints["items"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["reason"], "user_stop");
    assert_eq!(last["iteration"], 1);

    // Stop is idempotent.
    let (status, again) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["status"], "interrupted");

    let (status, resumed) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["status"], "running");
    assert_eq!(resumed["run"], 2);
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 3);
    assert_eq!(s["tokens_used"], 30);
    let iterations = app.iterations(&id).await;
    assert_gap_free(&iterations);
    assert_eq!(iterations[1]["action"], "slow");
    assert_eq!(iterations[1]["run"], 2);

    // A completed session can be neither resumed nor stopped.
    let (status, problem) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "illegal_transition");
    assert!(problem["detail"].as_str().unwrap().contains("completed"));
    let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn budgets_count_across_resume_and_raising_them_is_recorded() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(20, 100, 0), json!({ "max_tokens": 300 }))
        .await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "cost_limit");
    assert_eq!(s["tokens_used"], 300);

    let (status, problem) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "limit_exhausted");
    assert!(problem["detail"].as_str().unwrap().contains("max_tokens"));

    let (status, resumed) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "guidance": "finish the rest", "limits": { "max_tokens": 500 } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["limits"]["max_tokens"], 500);
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "cost_limit");
    assert_eq!(
        s["tokens_used"], 500,
        "tokens are cumulative over the whole session"
    );
    assert_eq!(s["iterations"], 5, "iterations continue from 4, not from 1");
    assert_gap_free(&app.iterations(&id).await);

    let events = app.events(&id).await;
    let raised = events
        .iter()
        .find(|e| e["kind"] == "limits_changed")
        .expect("limits_changed event");
    assert_eq!(raised["data"]["from"]["max_tokens"], 300);
    assert_eq!(raised["data"]["to"]["max_tokens"], 500);
    let resumed_event = events.iter().find(|e| e["kind"] == "resumed").unwrap();
    assert_eq!(resumed_event["data"]["guidance"], "finish the rest");
    // Sequence numbers are gap-free.
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
}

#[tokio::test]
async fn pause_lets_the_step_finish_then_resume_runs_on() {
    let app = TestApp::start().await;
    let mut steps = distinct_steps(4, 10, 400).as_array().unwrap().clone();
    steps.push(json!({ "action": "finish", "output": "<<WARDEN_GOAL_DONE>>" }));
    let id = app.create_scripted(json!(steps), json!({})).await;
    app.wait_until(&id, Duration::from_secs(5), |s| s["iterations"] == 1)
        .await;
    let (status, s) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["status"], "paused");
    assert_eq!(s["reason"], "user_pause");
    assert_eq!(
        s["iterations"], 2,
        "the step in flight finished and was kept"
    );

    let (status, again) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["status"], "paused");

    let (status, _) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "guidance": "carry on" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed");
    assert_eq!(s["iterations"], 5);
    assert_gap_free(&app.iterations(&id).await);
}

#[tokio::test]
async fn stopping_a_paused_session_interrupts_it() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(
            json!([{ "action": "ask", "output": "<<WARDEN_GOAL_BLOCKED: which repo?>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&id).await;
    let (status, s) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["reason"], "user_stop");
    let (status, problem) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "illegal_transition");
}

#[tokio::test]
async fn patch_switches_mode_and_limits_on_a_live_session() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(50, 10, 100), json!({}))
        .await;
    let (status, s) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "mode": "continuous", "limits": { "max_iterations": 2 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["mode"], "continuous");
    assert_eq!(s["limits"]["max_iterations"], 2);
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "max_iterations");
    assert!(s["iterations"].as_i64().unwrap() <= 2);
    let kinds: Vec<String> = app
        .events(&id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains(&"mode_changed".to_string()));
    assert!(kinds.contains(&"limits_changed".to_string()));
}

#[tokio::test]
async fn repeating_a_failing_action_is_nudged_then_paused_as_stuck() {
    let app = TestApp::start().await;
    let created = app
        .create(json!({
            "goal": "Make the tests pass",
            "executor": { "kind": "scripted", "repeat": true, "steps": [
                { "action": "run_tests", "outcome": "failure", "tokens": 20, "output": "1 test failed: test_login" }
            ] }
        }))
        .await;
    let id = created["id"].as_str().unwrap();
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "stuck");
    assert_eq!(
        s["iterations"], 4,
        "nudged after 3 repeats, paused on the 4th"
    );

    let decisions = app.decisions(id).await;
    let stuck: Vec<_> = decisions
        .iter()
        .filter(|d| d["kind"] == "stuck_detected")
        .collect();
    assert_eq!(stuck.len(), 2, "{decisions:?}");
    assert_eq!(stuck[0]["data"]["verdict"]["verdict"], "nudge");
    assert_eq!(stuck[0]["data"]["step"], 3);
    assert_eq!(stuck[1]["data"]["verdict"]["verdict"], "pause");
    let last = decisions.last().unwrap();
    assert_eq!(last["kind"], "status_changed");
    assert_eq!(last["data"]["reason"], "stuck");
    // The nudge reached the executor's context as an effect of step 3.
    let iterations = app.iterations(id).await;
    assert_eq!(
        iterations[2]["effects"]["stuck"]["verdict"]["verdict"],
        "nudge"
    );
}

#[tokio::test]
async fn accelerating_spend_is_throttled_and_recorded() {
    let app = TestApp::start().await;
    let steps: Vec<_> = (1..=13u64)
        .map(|i| json!({ "action": format!("s{i}"), "tokens": 10 * i * i, "output": format!("o{i}") }))
        .collect();
    let id = app.create_scripted(json!(steps), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "executor_exhausted");
    let decisions = app.decisions(&id).await;
    let throttle = decisions
        .iter()
        .find(|d| d["kind"] == "gate_decision" && d["data"]["decision"]["decision"] == "throttle")
        .expect("a throttle decision");
    assert_eq!(throttle["data"]["step"], 11);
    assert!(throttle["data"]["metrics"]["spend_slope"].as_f64().unwrap() > 0.02);
    assert_eq!(
        throttle["data"]["inputs"]["token_deltas"]
            .as_array()
            .unwrap()
            .len(),
        10,
        "the decision records its inputs"
    );
}

#[tokio::test]
async fn steady_spend_is_not_throttled() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(distinct_steps(15, 100, 0), json!({}))
        .await;
    app.wait_settled(&id).await;
    let (_, all) = app
        .get(&format!(
            "/api/autonomous/{id}/decisions?include_continue=true&limit=500"
        ))
        .await;
    let gate: Vec<_> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "gate_decision")
        .collect();
    assert_eq!(gate.len(), 16, "every step's evaluation is recorded");
    assert!(
        gate.iter()
            .all(|d| d["data"]["decision"]["decision"] != "throttle")
    );
}

#[tokio::test]
async fn rework_ratio_pauses_with_rework_loop() {
    let app = TestApp::start().await;
    // Every other step redoes the same `edit` with the same arguments.
    let steps: Vec<_> = (1..=12)
        .map(|i| {
            if i % 2 == 1 {
                json!({ "action": "edit", "arguments": { "path": "main.rs" }, "output": format!("edited {i}") })
            } else {
                json!({ "action": format!("look_{i}"), "output": format!("looked {i}") })
            }
        })
        .collect();
    let id = app.create_scripted(json!(steps), json!({})).await;
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "rework_loop");
    let decisions = app.decisions(&id).await;
    let pause = decisions
        .iter()
        .find(|d| d["kind"] == "gate_decision")
        .expect("gate pause recorded");
    assert!(pause["data"]["metrics"]["rework_ratio"].as_f64().unwrap() > 0.3);
}

#[tokio::test]
async fn a_review_point_pauses_a_continuous_session_and_a_resume_grants_another_stretch() {
    let mut config = common::test_config();
    config.gate.review_every = 4;
    let app = TestApp::start_with(config).await;
    let steps = distinct_steps(10, 1, 0);
    let continuous = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "continuous",
            "executor": { "kind": "scripted", "steps": steps }
        }))
        .await;
    let id = continuous["id"].as_str().expect("id").to_string();
    assert!(
        continuous["limits"]["review_every"].is_null(),
        "{continuous}"
    );
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["reason"], "review_required");
    assert_eq!(s["iterations"], 4);
    let summary = s["summary"].as_str().expect("summary");
    assert!(
        summary.contains("4 steps since a person last looked"),
        "{summary}"
    );
    assert!(
        s["next_steps"]
            .as_array()
            .expect("next steps")
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("review_every"))),
        "{s}"
    );
    let decisions = app.decisions(&id).await;
    let pause = decisions
        .iter()
        .find(|d| d["kind"] == "gate_decision")
        .expect("the review pause is logged");
    assert_eq!(pause["data"]["decision"]["cause"], "review_required");
    assert_eq!(pause["data"]["metrics"]["review_every"], 4);
    assert_eq!(pause["data"]["metrics"]["steps_until_review"], 0);
    // One call resumes it, and the count starts over.
    let (code, _) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert!(code.is_success(), "{code}");
    let s = app.wait_settled(&id).await;
    assert_eq!(s["reason"], "review_required");
    assert_eq!(s["iterations"], 8);

    // The same steps in fixed mode run to the end of the script.
    let fixed = app
        .create_scripted(distinct_steps(10, 1, 0), json!({}))
        .await;
    let s = app.wait_settled(&fixed).await;
    assert_eq!(s["reason"], "executor_exhausted", "{s}");
    assert_eq!(s["iterations"], 10);
    // A continuous session with an explicit iteration limit has none either...
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "continuous",
            "limits": { "max_iterations": 8 },
            "executor": { "kind": "scripted", "steps": distinct_steps(10, 1, 0) }
        }))
        .await;
    assert_eq!(doc["limits"]["review_every"], 0);
    let s = app.wait_settled(doc["id"].as_str().expect("id")).await;
    assert_eq!(s["reason"], "max_iterations", "{s}");
    assert_eq!(s["iterations"], 8);
    // ...unless it asks for one, which a fixed session may too.
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "limits": { "max_iterations": 8, "review_every": 3 },
            "executor": { "kind": "scripted", "steps": distinct_steps(10, 1, 0) }
        }))
        .await;
    let s = app.wait_settled(doc["id"].as_str().expect("id")).await;
    assert_eq!(s["reason"], "review_required", "{s}");
    assert_eq!(s["iterations"], 3);
}

#[tokio::test]
async fn list_filters_by_status_and_pages_stably() {
    let app = TestApp::start().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let id = app
            .create_scripted(distinct_steps(1, 1, 0), json!({}))
            .await;
        app.wait_settled(&id).await;
        ids.push(id);
    }
    let blocked = app
        .create_scripted(
            json!([{ "action": "a", "output": "<<WARDEN_GOAL_BLOCKED>>" }]),
            json!({}),
        )
        .await;
    app.wait_settled(&blocked).await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/autonomous?status=stopped&limit=2&cursor={c}"),
            None => "/api/autonomous?status=stopped&limit=2".to_string(),
        };
        let (status, page) = app.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for item in page["items"].as_array().unwrap() {
            assert_eq!(item["status"], "stopped");
            seen.push(item["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest first, each exactly once");
    let (_, paused) = app.get("/api/autonomous?status=paused").await;
    assert_eq!(paused["items"].as_array().unwrap().len(), 1);
    assert_eq!(paused["items"][0]["id"], blocked.as_str());
}

/// The API answers while many sessions run: on the embedded PostgreSQL the
/// loops and the API share one connection, and nothing may hold it across
/// an await on anything but the database. The bound is a
/// liveness check (a frozen API never answers), not a latency figure.
#[tokio::test]
async fn status_reads_answer_while_many_sessions_run() {
    let app = TestApp::start().await;
    let mut ids = Vec::new();
    for _ in 0..24 {
        // Distinct steps (no rework), each waiting a little as a model call does.
        ids.push(
            app.create_scripted(distinct_steps(95, 1, 15), json!({}))
                .await,
        );
    }
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_secs(3) {
        for id in ids.iter().step_by(5) {
            let asked = Instant::now();
            let s = tokio::time::timeout(Duration::from_secs(10), app.session(id))
                .await
                .expect("a status read answered while sessions ran");
            assert!(asked.elapsed() < Duration::from_secs(10));
            assert_eq!(s["id"], id.as_str(), "{s}");
            reads += 1;
        }
        let (status, _) = tokio::time::timeout(Duration::from_secs(10), app.get("/api/autonomous"))
            .await
            .expect("a list answered while sessions ran");
        assert_eq!(status, StatusCode::OK);
    }
    assert!(reads > 0);
    for id in &ids {
        let s = app.wait_settled(id).await;
        // The fixed mode's iteration limit (50) ends them.
        assert_eq!(s["status"], "stopped", "{s}");
        assert_eq!(s["iterations"], 50, "{s}");
        assert_gap_free(&app.iterations(id).await);
    }
}

#[tokio::test]
async fn the_status_says_what_may_be_done_and_each_of_it_works() {
    let app = TestApp::start().await;
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let running = app.session(&id).await;
    assert_eq!(
        running["allowed_actions"],
        json!(["stop", "pause", "update"])
    );
    assert_eq!(running["attempts"], 0);
    assert_eq!(running["last_error"], serde_json::Value::Null);
    let (status, _) = app
        .patch(&format!("/api/autonomous/{id}"), json!({ "mode": "fixed" }))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, stopped) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["status"], "interrupted");
    assert_eq!(
        stopped["allowed_actions"],
        json!(["resume", "update", "delete"])
    );
    // What is not offered is refused by the same rules.
    let (status, _) = app.post(&format!("/api/autonomous/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, resumed) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(
        resumed["allowed_actions"],
        json!(["stop", "pause", "update"])
    );
    app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
}

/// The ids of every page of `query` (one session a page), in order.
async fn ids_paged(app: &TestApp, query: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/autonomous?{query}&limit=1&cursor={c}"),
            None => format!("/api/autonomous?{query}&limit=1"),
        };
        let (status, page) = app.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
        for item in page["items"].as_array().expect("items") {
            seen.push(item["id"].as_str().expect("id").to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return seen,
        }
    }
}

#[tokio::test]
async fn list_filters_by_mode_executor_goal_and_time_sorts_both_ways_and_counts() {
    let app = TestApp::start().await;
    let mut ids = Vec::new();
    for (goal, mode) in [
        ("Write the alpha report", "fixed"),
        ("Write the beta notes", "fixed"),
        ("Proofread the ALPHA report", "continuous"),
    ] {
        let doc = app
            .create(json!({
                "goal": goal,
                "mode": mode,
                "executor": { "kind": "scripted", "steps": [
                    { "action": "write", "tokens": 5, "output": "<<WARDEN_GOAL_DONE>>" }
                ] }
            }))
            .await;
        let id = doc["id"].as_str().expect("id").to_string();
        app.wait_settled(&id).await;
        ids.push(id);
    }
    let (s1, s2, s3) = (ids[0].as_str(), ids[1].as_str(), ids[2].as_str());

    // Goal text, any case; `%` and `_` match only themselves.
    assert_eq!(ids_paged(&app, "q=alpha%20report").await, [s3, s1]);
    assert_eq!(ids_paged(&app, "q=ALPHA&mode=fixed").await, [s1]);
    assert!(ids_paged(&app, "q=%25").await.is_empty());
    assert!(ids_paged(&app, "q=Write_the").await.is_empty());
    assert_eq!(ids_paged(&app, "executor=scripted").await, [s3, s2, s1]);
    assert!(ids_paged(&app, "executor=llm").await.is_empty());
    assert_eq!(ids_paged(&app, "mode=continuous").await, [s3]);

    // Creation range: from is inclusive, before exclusive.
    let created = app.session(s2).await["created_at"]
        .as_str()
        .expect("created_at")
        .to_string();
    let at = created.replace('+', "%2B");
    assert_eq!(
        ids_paged(&app, &format!("created_from={at}")).await,
        [s3, s2]
    );
    assert_eq!(ids_paged(&app, &format!("created_before={at}")).await, [s1]);

    // Both orders of both keys, each session once, cursor by cursor.
    assert_eq!(ids_paged(&app, "order=asc").await, [s1, s2, s3]);
    assert_eq!(
        ids_paged(&app, "sort=created&order=desc").await,
        [s3, s2, s1]
    );
    let by_update = ids_paged(&app, "sort=updated&order=asc").await;
    let mut times = Vec::new();
    for id in &by_update {
        times.push(
            app.session(id).await["updated_at"]
                .as_str()
                .expect("t")
                .to_string(),
        );
    }
    let parsed: Vec<chrono::DateTime<chrono::Utc>> =
        times.iter().map(|t| t.parse().expect("RFC 3339")).collect();
    assert!(parsed.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let mut newest_first = ids_paged(&app, "sort=updated").await;
    newest_first.reverse();
    assert_eq!(newest_first, by_update);

    // Counts per status under the same filters; every status is named.
    let (status, counts) = app.get("/api/autonomous/counts?q=alpha").await;
    assert_eq!(status, StatusCode::OK, "{counts}");
    assert_eq!(counts["total"], 2);
    assert_eq!(counts["by_status"]["completed"], 2);
    assert_eq!(counts["by_status"]["running"], 0);
    assert_eq!(counts["by_status"].as_object().expect("map").len(), 9);
    let (_, counts) = app
        .get("/api/autonomous/counts?mode=fixed&executor=scripted")
        .await;
    assert_eq!(counts["total"], 2, "{counts}");

    // Another tenant counts and lists none of them.
    let other = common::create_key(&app.base, "other-tenant", "viewer").await;
    let client = common::client_with_key(other["secret"].as_str().expect("secret"));
    for path in ["/api/autonomous/counts", "/api/autonomous?q=alpha"] {
        let doc: serde_json::Value = client
            .get(app.url(path))
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("json");
        assert!(
            doc["total"] == 0 || doc["items"].as_array().is_some_and(Vec::is_empty),
            "{path}: {doc}"
        );
    }

    // Bad filters are a clear 400.
    let long = "a".repeat(201);
    for bad in [
        "/api/autonomous?q=%01".to_string(),
        format!("/api/autonomous?q={long}"),
        "/api/autonomous/counts?q=%7F".to_string(),
        "/api/autonomous?executor=nope".to_string(),
        "/api/autonomous?sort=goal".to_string(),
        "/api/autonomous?order=up".to_string(),
        "/api/autonomous?created_from=yesterday".to_string(),
        "/api/autonomous/counts?status=running".to_string(),
    ] {
        let (status, doc) = app.get(&bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {doc}");
    }
}
