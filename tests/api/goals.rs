//! Goals that can be finished: ambiguity pre-flight and the three refinement
//! choices, success criteria and milestones ticked by reflection, context
//! cycles with memory and a task queue, and outcome metrics.

use crate::common;

use std::time::Duration;

use common::fake_llm::{FakeLlm, text, tool_calls};
use common::{TestApp, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn done_script() -> Value {
    json!({ "kind": "scripted", "steps": [
        { "action": "work", "tokens": 10, "output": "worked" },
        { "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: done>>" }
    ] })
}

async fn create_vague(app: &TestApp) -> Value {
    app.create(json!({ "goal": "Learn how to run a business", "executor": done_script() }))
        .await
}

#[tokio::test]
async fn a_vague_goal_waits_for_refinement_and_each_choice_starts_it() {
    let app = TestApp::start().await;

    let concrete = app
        .create(json!({ "goal": "Create README.md with a project description", "executor": done_script() }))
        .await;
    assert_eq!(
        concrete["status"], "running",
        "a concrete goal starts at once"
    );
    assert!(concrete["refinement"].is_null());

    // Accept the suggestion.
    let waiting = create_vague(&app).await;
    assert_eq!(waiting["status"], "awaiting_refinement");
    let proposal = &waiting["refinement"];
    let suggested = proposal["suggested_goal"].as_str().unwrap().to_string();
    assert!(suggested.contains("REPORT.md"), "{proposal}");
    assert!(suggested.contains("how to run a business"), "{proposal}");
    assert!(
        proposal["matched_patterns"]
            .as_array()
            .unwrap()
            .contains(&json!("vague_verb:learn"))
    );
    assert!(proposal["confidence"].as_f64().unwrap() >= 0.6);
    assert_eq!(proposal["source"], "rules");
    assert_eq!(
        proposal["choices"],
        json!(["accept_suggestion", "custom", "proceed_with_time_limit"])
    );
    let id = waiting["id"].as_str().unwrap();
    // That nothing runs is an absence, seen only over time.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        app.session(id).await["iterations"],
        0,
        "nothing runs while it waits"
    );
    let (status, s) = app
        .post(
            &format!("/api/autonomous/{id}/refinement"),
            Some(json!({ "choice": "accept_suggestion" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["status"], "running");
    assert_eq!(s["goal"], suggested.as_str());
    assert_eq!(s["original_goal"], "Learn how to run a business");
    assert_eq!(app.wait_settled(id).await["status"], "completed");
    let (_, history) = app.get(&format!("/api/autonomous/{id}/refinements")).await;
    assert_eq!(history["items"][0]["kind"], "accept_suggestion");
    assert_eq!(
        history["items"][0]["goal_before"],
        "Learn how to run a business"
    );

    // A goal of one's own.
    let id = create_vague(&app).await["id"].as_str().unwrap().to_string();
    let (status, s) = app
        .post(
            &format!("/api/autonomous/{id}/refinement"),
            Some(json!({ "choice": "custom", "goal": "Write BUSINESS.md with a one-page plan for a bakery" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(
        s["goal"],
        "Write BUSINESS.md with a one-page plan for a bakery"
    );

    // The goal as given, under a time limit.
    let id = create_vague(&app).await["id"].as_str().unwrap().to_string();
    let (status, s) = app
        .post(
            &format!("/api/autonomous/{id}/refinement"),
            Some(json!({ "choice": "proceed_with_time_limit", "max_wall_time_ms": 1_800_000 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["goal"], "Learn how to run a business");
    assert_eq!(s["limits"]["max_wall_time_ms"], 1_800_000);
    assert!(s["original_goal"].is_null());
    app.wait_settled(&id).await;

    // Refinement only applies while waiting; bad choices are 422.
    let (status, problem) = app
        .post(
            &format!("/api/autonomous/{id}/refinement"),
            Some(json!({ "choice": "accept_suggestion" })),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    let other = create_vague(&app).await["id"].as_str().unwrap().to_string();
    for bad in [
        json!({ "choice": "maybe" }),
        json!({ "choice": "custom" }),
        json!({ "choice": "custom", "goal": "  " }),
        json!({ "choice": "proceed_with_time_limit", "max_wall_time_ms": 1 }),
    ] {
        let (status, problem) = app
            .post(
                &format!("/api/autonomous/{other}/refinement"),
                Some(bad.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {problem}");
    }
    // A waiting session can be stopped.
    let (_, s) = app
        .post(&format!("/api/autonomous/{other}/stop"), None)
        .await;
    assert_eq!(s["status"], "interrupted");
}

#[tokio::test]
async fn auto_refinement_applies_the_suggestion_without_waiting() {
    let app = TestApp::start_with(config_with(&[("AUTONOMOUS_AUTO_REFINE_GOALS", "true")])).await;
    let s = create_vague(&app).await;
    assert_eq!(s["status"], "running");
    assert!(s["goal"].as_str().unwrap().starts_with("Write REPORT.md"));
    assert_eq!(s["original_goal"], "Learn how to run a business");
    let id = s["id"].as_str().unwrap();
    let (_, history) = app.get(&format!("/api/autonomous/{id}/refinements")).await;
    assert_eq!(history["items"][0]["kind"], "auto");
}

#[tokio::test]
async fn without_require_concrete_goals_a_vague_goal_runs() {
    let app = TestApp::start_with(config_with(&[(
        "AUTONOMOUS_REQUIRE_CONCRETE_GOALS",
        "false",
    )]))
    .await;
    let s = create_vague(&app).await;
    assert_eq!(s["status"], "running");
    assert_eq!(s["goal"], "Learn how to run a business");
}

#[tokio::test]
async fn the_model_writes_the_suggestion_when_one_is_configured() {
    let fake = FakeLlm::start().await;
    fake.reflection(text(
        "Write BUSINESS_PLAN.md covering pricing, costs and first customers",
        40,
    ));
    let base = fake.base_url();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
    ]))
    .await;
    let s = create_vague(&app).await;
    assert_eq!(s["status"], "awaiting_refinement");
    assert_eq!(
        s["refinement"]["suggested_goal"],
        "Write BUSINESS_PLAN.md covering pricing, costs and first customers"
    );
    assert_eq!(s["refinement"]["source"], "model");
    assert_eq!(s["tokens_by_source"]["refinement"], 40);
    assert_eq!(
        s["tokens_used"], 40,
        "refinement tokens count against the budget"
    );
}

#[tokio::test]
async fn resume_with_a_refined_goal_is_recorded() {
    let app = TestApp::start().await;
    let s = app
        .create(
            json!({ "goal": "Create README.md", "executor": { "kind": "scripted", "steps": [
            { "action": "ask", "output": "<<WARDEN_GOAL_BLOCKED: which audience?>>" },
            { "action": "finish", "output": "<<WARDEN_GOAL_DONE>>" } ] } }),
        )
        .await;
    let id = s["id"].as_str().unwrap();
    assert_eq!(app.wait_settled(id).await["reason"], "agent_blocked");
    let (status, s) = app
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "goal": "Create README.md for new contributors", "guidance": "audience: contributors" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["goal"], "Create README.md for new contributors");
    assert_eq!(s["original_goal"], "Create README.md");
    let (_, history) = app.get(&format!("/api/autonomous/{id}/refinements")).await;
    assert_eq!(history["items"][0]["kind"], "resume");
    assert_eq!(
        history["items"][0]["data"]["guidance"],
        "audience: contributors"
    );
    assert_eq!(app.wait_settled(id).await["status"], "completed");
}

fn reflection_answer(
    goal: &str,
    progress: &str,
    percent: f64,
    criteria: &[&str],
    milestones: &[&str],
) -> common::fake_llm::Answer {
    let body = json!({
        "goalAchieved": goal, "progress": progress, "percentComplete": percent,
        "loopDetected": false, "recommendation": "CONTINUE", "reasoning": format!("{goal} at {percent}"),
        "nextSteps": ["run the tests"], "criteriaMet": criteria, "milestonesDone": milestones
    });
    text(&body.to_string(), 20)
}

#[tokio::test]
async fn milestones_progress_from_reflection_and_unmet_criteria_refuse_completion() {
    let fake = FakeLlm::start().await;
    fake.reflection(reflection_answer(
        "PARTIAL",
        "SLOW",
        30.0,
        &["README.md exists"],
        &["outline"],
    ))
    .reflection(reflection_answer("PARTIAL", "SLOW", 60.0, &[], &["2"]))
    // The agent claims done after step 6; the reviewer agrees the goal looks done, but a criterion is unmet.
    .reflection(reflection_answer("YES", "GOOD", 95.0, &[], &[]))
    .reflection(reflection_answer(
        "YES",
        "GOOD",
        100.0,
        &["tests pass"],
        &["final"],
    ));
    let base = fake.base_url();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
    ]))
    .await;
    let mut steps: Vec<Value> = (1..=5)
        .map(|i| json!({ "action": format!("s{i}"), "tokens": 5, "output": format!("o{i}") }))
        .collect();
    steps.push(json!({ "action": "claim", "output": "<<WARDEN_GOAL_DONE: all done>>" }));
    steps.push(json!({ "action": "test", "output": "tests pass" }));
    steps.push(json!({ "action": "claim_again", "output": "<<WARDEN_GOAL_DONE: really done>>" }));
    let created = app
        .create(json!({
            "goal": "Create README.md and make the tests pass",
            "mode": "continuous",
            "limits": { "reflection_interval": 2 },
            "success_criteria": ["README.md exists", "tests pass"],
            "milestones": ["outline", "draft", "final"],
            "executor": { "kind": "scripted", "steps": steps }
        }))
        .await;
    assert_eq!(created["success_criteria"][0]["done"], false);
    let id = created["id"].as_str().unwrap();
    let s = app.wait_settled(id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        s["iterations"], 8,
        "the first claim was refused while `tests pass` was unmet"
    );
    let criteria = s["success_criteria"].as_array().unwrap();
    assert!(criteria.iter().all(|c| c["done"] == true), "{criteria:?}");
    assert_eq!(criteria[0]["done_at_iteration"], 2);
    assert_eq!(criteria[1]["done_at_iteration"], 8);
    let milestones = s["milestones"].as_array().unwrap();
    assert_eq!(
        milestones
            .iter()
            .map(|m| m["done_at_iteration"].clone())
            .collect::<Vec<_>>(),
        vec![json!(2), json!(4), json!(8)]
    );
    let (_, page) = app.get(&format!("/api/autonomous/{id}/reflections")).await;
    let refused = &page["items"][2];
    assert_eq!(refused["trigger"], "agent_claimed_done");
    assert_eq!(refused["decision"]["verdict"]["action"], "reject");
    assert!(
        refused["decision"]["verdict"]["feedback"]
            .as_str()
            .unwrap()
            .contains("tests pass")
    );
}

#[tokio::test]
async fn context_cycles_carry_memory_and_tasks_across_a_restart() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "task_queue_write",
            json!({ "tasks": [{ "title": "collect facts", "priority": 2 }] }),
        )],
        600,
    ))
    // Prompt 900 of a 1000-token budget: wrap-up begins.
    .agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "notes.md", "content": "facts-v1" }),
        )],
        1_800,
    ))
    .agent(tool_calls(
        &[(
            "task_queue_write",
            json!({ "tasks": [{ "id": 1, "status": "in_progress", "notes": "half done" }] }),
        )],
        100,
    ))
    .agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "memory.md", "content": "saved" }),
        )],
        100,
    ))
    .agent(tool_calls(&[("list_files", json!({ "path": "" }))], 100))
    // Cycle 2.
    .agent(tool_calls(
        &[(
            "task_queue_write",
            json!({ "tasks": [{ "id": 1, "status": "done" }] }),
        )],
        100,
    ))
    .agent(text("still thinking", 10).delayed(3_000))
    .agent(tool_calls(
        &[(
            "task_completion",
            json!({ "result": "facts collected", "deliverables": ["notes.md"] }),
        )],
        100,
    ));
    fake.reflection(text(
        "Cycle one: facts are in notes.md; task 1 is half done.",
        50,
    ));
    let base = fake.base_url();
    let ws = std::env::temp_dir()
        .join(format!("warden-cycles-{}", uuid::Uuid::new_v4()))
        .to_string_lossy()
        .to_string();
    let vars = [
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_WORKSPACE_ROOT", ws.as_str()),
    ];
    let mut first = TestApp::spawn_with(pool.clone(), config_with(&vars)).await;
    let created = first
        .create(json!({
            "goal": "Collect facts into notes.md",
            "limits": { "context_budget_tokens": 1000, "max_cycles": 3 },
            "executor": { "kind": "llm" }
        }))
        .await;
    let id = created["id"].as_str().unwrap().to_string();
    // The new cycle begins just after the sixth step commits; the seventh
    // (slow) request keeps the count at 6 meanwhile.
    let s = first
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"] == 6 && s["cycle"] == 2
        })
        .await;
    assert_eq!(s["cycle"], 2);
    assert!(s["memory_chars"].as_u64().unwrap() > 0);
    // The crash comes while the seventh request (the slow one) is in flight.
    common::eventually(
        Duration::from_secs(5),
        "the seventh model request",
        || async { fake.agent_requests().len() >= 7 },
    )
    .await;
    first.crash();

    let second = TestApp::spawn_with(pool, config_with(&vars)).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["cycle"], 2);
    assert_eq!(s["iterations"], 7);

    let requests = fake.agent_requests();
    let system = |r: &Value| {
        r["messages"][0]["content"]
            .as_str()
            .expect("content")
            .to_string()
    };
    // Wrap-up turns were announced.
    assert!(
        requests[2]["messages"]
            .to_string()
            .contains("3 turn(s) left"),
        "{}",
        requests[2]["messages"]
    );
    // Cycle 2 starts from memory and the task queue, with the conversation reset.
    let cycle2_first = &requests[5];
    assert!(system(cycle2_first).contains("context cycle 2"));
    assert!(system(cycle2_first).contains("facts are in notes.md"));
    assert!(system(cycle2_first).contains("[in_progress] (priority 2) collect facts"));
    assert!(
        !cycle2_first["messages"].to_string().contains("facts-v1"),
        "cycle 1 conversation was reset"
    );
    // After the restart: still cycle 2, same memory, the task marked done, cycle 2's step kept.
    let after_restart = requests.last().unwrap();
    assert!(system(after_restart).contains("facts are in notes.md"));
    assert!(system(after_restart).contains("[done] (priority 2) collect facts"));
    assert!(
        after_restart["messages"]
            .to_string()
            .contains("task queue updated")
    );
    assert!(!after_restart["messages"].to_string().contains("facts-v1"));

    let (_, tasks) = second.get(&format!("/api/autonomous/{id}/tasks")).await;
    assert_eq!(tasks["items"][0]["status"], "done");
    assert_eq!(tasks["items"][0]["title"], "collect facts");
    let events = second.events(&id).await;
    assert!(events.iter().any(|e| e["kind"] == "context_wrap_up"));
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "cycle_started" && e["data"]["cycle"] == 2)
    );
}

#[tokio::test]
async fn outcome_metrics_match_the_sessions() {
    let app = TestApp::start().await;
    let two = app
        .create(json!({ "goal": "Create A.md", "executor": done_script() }))
        .await;
    let four = app
        .create(json!({ "goal": "Create B.md", "executor": { "kind": "scripted", "steps": [
            { "action": "a" }, { "action": "b" }, { "action": "c" }, { "action": "d", "output": "<<WARDEN_GOAL_DONE>>" } ] } }))
        .await;
    let capped = app
        .create(json!({ "goal": "Create C.md", "limits": { "max_iterations": 1 }, "executor": done_script() }))
        .await;
    let long = app
        .create(
            json!({ "goal": "Create D.md", "executor": { "kind": "scripted", "steps": [
            { "action": "slow", "delay_ms": 30000 } ] } }),
        )
        .await;
    for s in [&two, &four, &capped] {
        app.wait_settled(s["id"].as_str().unwrap()).await;
    }
    app.post(
        &format!("/api/autonomous/{}/stop", long["id"].as_str().unwrap()),
        None,
    )
    .await;
    // The user finds the work of `two` was not done and reopens it.
    let two_id = two["id"].as_str().unwrap();
    let (status, reopened) = app
        .post(
            &format!("/api/autonomous/{two_id}/resume"),
            Some(json!({ "reopen": true, "guidance": "README is missing" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reopened}");
    assert_eq!(
        app.wait_settled(two_id).await["reason"],
        "executor_exhausted"
    );

    let (status, m) = app.get("/api/autonomous/outcomes").await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["sessions"], 4);
    assert_eq!(m["ended"], 4);
    assert_eq!(m["completed"], 1);
    assert_eq!(m["goal_completion_rate"], 0.25);
    assert_eq!(m["average_iterations_to_completion"], 4.0);
    assert_eq!(m["termination_reasons"]["goal_achieved"], 1);
    assert_eq!(m["termination_reasons"]["max_iterations"], 1);
    assert_eq!(m["termination_reasons"]["user_stop"], 1);
    assert_eq!(m["termination_reasons"]["executor_exhausted"], 1);
    assert_eq!(m["ever_completed"], 2);
    assert_eq!(m["reopened_after_completion"], 1);
    assert_eq!(m["premature_stop_rate"], 0.5);
}
