//! Durability across process deaths: a crashed instance's sessions are
//! rescued by the next one through lease expiry; a graceful shutdown hands
//! them over at once; a stopped session never comes back.

use crate::common;

use std::time::Duration;

use common::{TestApp, assert_gap_free, distinct_steps};
use serde_json::{Value, json};
use sqlx::PgPool;

fn script_ending_done(n: usize, delay_ms: u64) -> Value {
    let mut steps = distinct_steps(n, 10, delay_ms)
        .as_array()
        .cloned()
        .unwrap_or_default();
    steps.push(json!({ "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: all steps done>>" }));
    Value::Array(steps)
}

#[sqlx::test]
async fn a_crashed_instance_is_replaced_and_the_session_finishes_gap_free(pool: PgPool) {
    let mut first = TestApp::spawn(pool.clone()).await;
    let id = first
        .create_scripted(script_ending_done(12, 60), json!({}))
        .await;
    first
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(3)
        })
        .await;
    first.crash();

    let second = TestApp::spawn(pool).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 13);
    assert_eq!(s["tokens_used"], 130, "no iteration counted twice");
    let iterations = second.iterations(&id).await;
    assert_gap_free(&iterations);
    let events = second.events(&id).await;
    let takeover = events
        .iter()
        .find(|e| e["kind"] == "lease_acquired")
        .expect("the new instance took the lease over");
    assert!(takeover["data"]["previous_owner"].is_string());
}

#[sqlx::test]
async fn graceful_shutdown_checkpoints_and_the_next_instance_resumes(pool: PgPool) {
    let mut first = TestApp::spawn(pool.clone()).await;
    let id = first
        .create_scripted(script_ending_done(10, 80), json!({}))
        .await;
    first
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(2)
        })
        .await;
    first.shutdown().await;

    let row: (String, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT status, owner FROM sessions WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(row.0, "running", "shutdown does not end sessions");
    assert_eq!(row.1, None, "shutdown releases the lease");

    let second = TestApp::spawn(pool).await;
    let (_, checkpoints) = second
        .get(&format!("/api/autonomous/{id}/checkpoints"))
        .await;
    assert!(
        checkpoints["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["reason"] == "shutdown")
    );
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 11);
    assert_gap_free(&second.iterations(&id).await);
}

#[sqlx::test]
async fn a_stopped_session_stays_stopped_across_restarts(pool: PgPool) {
    let mut first = TestApp::spawn(pool.clone()).await;
    let id = first
        .create_scripted(distinct_steps(50, 10, 50), json!({}))
        .await;
    // A second session still running when the instance dies: the next
    // instance's rescue must take it over, which proves a rescue ran.
    let running = first
        .create_scripted(script_ending_done(30, 50), json!({}))
        .await;
    first
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(2)
        })
        .await;
    let (_, stopped) = first
        .post(&format!("/api/autonomous/{id}/stop"), None)
        .await;
    assert_eq!(stopped["status"], "interrupted");
    let iterations = stopped["iterations"].clone();
    let seq_at_stop = first.session(&id).await["last_event_seq"].clone();
    assert_eq!(first.session(&running).await["status"], "running");
    first.crash();

    let second = TestApp::spawn(pool).await;
    let rescued = second.wait_settled(&running).await;
    assert_eq!(rescued["status"], "completed", "{rescued}");
    let takeover = second
        .events(&running)
        .await
        .into_iter()
        .find(|e| e["kind"] == "lease_acquired" && e["data"]["previous_owner"].is_string());
    assert!(
        takeover.is_some(),
        "the new instance rescued the running session"
    );

    // The same rescue rounds passed the stopped session over.
    let s = second.session(&id).await;
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["iterations"], iterations);
    assert_eq!(
        s["last_event_seq"], seq_at_stop,
        "nothing happened to it since"
    );
}

#[sqlx::test]
async fn a_stop_recorded_while_no_instance_runs_is_honoured_on_start(pool: PgPool) {
    let mut first = TestApp::spawn(pool.clone()).await;
    let id = first
        .create_scripted(distinct_steps(50, 10, 50), json!({}))
        .await;
    first
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(2)
        })
        .await;
    first.crash();
    // The durable flag is the truth, whoever picks the session up next.
    sqlx::query("UPDATE sessions SET stop_requested = true WHERE id = $1::uuid")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let second = TestApp::spawn(pool).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["reason"], "user_stop");
}

#[sqlx::test]
async fn a_stop_sent_to_another_instance_reaches_the_owner(pool: PgPool) {
    let owner = TestApp::spawn(pool.clone()).await;
    let other = TestApp::spawn(pool).await;
    let id = owner
        .create_scripted(distinct_steps(50, 10, 2_000), json!({}))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let (status, s) = other
        .post(&format!("/api/autonomous/{id}/stop"), None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(s["status"], "interrupted", "{s}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[sqlx::test]
async fn a_live_owner_keeps_its_sessions_when_another_instance_starts(pool: PgPool) {
    let owner = TestApp::spawn(pool.clone()).await;
    let id = owner
        .create_scripted(distinct_steps(30, 10, 50), json!({}))
        .await;
    let _second = TestApp::spawn(pool).await;
    let s = owner.wait_settled(&id).await;
    assert_eq!(s["reason"], "executor_exhausted");
    let events = owner.events(&id).await;
    assert!(
        !events.iter().any(|e| e["kind"] == "lease_acquired"),
        "no takeover while the owner was alive"
    );
    assert_gap_free(&owner.iterations(&id).await);
}
