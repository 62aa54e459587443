//! The threshold report (`GET /api/insights/thresholds`) over a tenant's
//! real sessions: outcomes, a review pause a person overruled, outcomes
//! against the iteration limit, a suggestion weighed by a replay, and
//! nothing of another tenant's.

use crate::common;

use crate::replay::{ended, steps};
use common::{TestApp, client_with_key, create_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn count(doc: &Value, key: &str) -> u64 {
    doc[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is a count: {doc}"))
}

#[tokio::test]
async fn the_report_reads_how_a_tenants_sessions_ended_against_their_thresholds() {
    let app = TestApp::start().await;
    ended(&app, steps(3, true), json!({ "max_iterations": 10 })).await;
    ended(&app, steps(5, true), json!({ "max_iterations": 10 })).await;
    ended(&app, steps(12, false), json!({ "max_iterations": 10 })).await;
    // Paused for review after 2 steps; a person resumes it and it completes.
    let reviewed = ended(
        &app,
        steps(4, true),
        json!({ "max_iterations": 10, "review_every": 2 }),
    )
    .await;
    assert_eq!(app.session(&reviewed).await["reason"], "review_required");
    let (status, _) = app
        .post(&format!("/api/autonomous/{reviewed}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let done = app
        .wait_until(&reviewed, std::time::Duration::from_secs(20), |s| {
            s["status"] == "completed"
        })
        .await;
    assert_eq!(done["iterations"], 4);
    // Another tenant's runaway session is not the caller's history.
    let other = client_with_key(
        create_key(&app.base, "other-tenant", "operator").await["secret"]
            .as_str()
            .expect("a secret"),
    );
    let res = other
        .post(app.url("/api/autonomous"))
        .json(&json!({ "goal": "Write the other tenant's notes",
                       "limits": { "max_iterations": 40 },
                       "executor": { "kind": "scripted", "steps": steps(45, false) } }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.expect("a session")["id"]
        .as_str()
        .expect("an id")
        .to_string();
    // Ended (by its limit), so it would count were tenants not kept apart.
    common::eventually(
        std::time::Duration::from_secs(20),
        "the other tenant's session ends",
        || {
            let (other, url) = (other.clone(), app.url(&format!("/api/autonomous/{id}")));
            async move {
                let doc: Value = other
                    .get(url)
                    .send()
                    .await
                    .expect("sent")
                    .json()
                    .await
                    .expect("json");
                doc["status"] == "stopped"
            }
        },
    )
    .await;

    let (status, report) = app.get("/api/insights/thresholds").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(count(&report, "sessions"), 4, "{report}");
    let outcomes = report["outcomes"].as_array().expect("outcomes");
    assert_eq!(
        outcomes[0],
        json!({ "status": "completed", "reason": "goal_achieved", "sessions": 3 })
    );
    assert_eq!(
        outcomes[1],
        json!({ "status": "stopped", "reason": "max_iterations", "sessions": 1 })
    );
    assert_eq!(
        report["pauses"],
        json!([{ "reason": "review_required", "pauses": 1, "resumed": 1, "premature": 1 }])
    );
    let iterations = &report["limits"][0];
    assert_eq!(iterations["name"], "max_iterations");
    assert_eq!(
        iterations["values"],
        json!([{ "value": 10, "sessions": 4, "completed": 3, "ended_by_it": 1 }])
    );
    // The longest completion ran 5 steps: 6 leaves it room and would have
    // ended the runaway 4 steps earlier, as the replay of the same
    // sessions confirms.
    let s = &report["max_iterations_suggestion"];
    assert_eq!(count(s, "value"), 6, "{s}");
    assert_eq!(count(s, "longest_completion"), 5);
    assert_eq!(count(s, "sessions_ending_earlier"), 1);
    assert_eq!(count(s, "iterations_saved"), 4);
    assert_eq!(count(s, "completions_cut_short"), 0);
    let replay = &s["replay"];
    assert_eq!(count(replay, "sessions"), 4, "{replay}");
    assert_eq!(count(replay, "earlier"), 1, "{replay}");
    assert_eq!(count(replay, "completions_cut_short"), 0, "{replay}");
    assert_eq!(count(replay, "tokens_saved"), 40, "{replay}");
    assert_eq!(report["calibration"].as_array().map(Vec::len), Some(10));
}

#[tokio::test]
async fn a_tenant_with_no_history_gets_an_empty_report() {
    let app = TestApp::start().await;
    let (status, report) = app.get("/api/insights/thresholds").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(count(&report, "sessions"), 0);
    assert!(report["max_iterations_suggestion"].is_null(), "{report}");
    assert_eq!(report["outcomes"], json!([]));
}
