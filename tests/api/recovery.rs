//! Durability across process deaths: a crashed instance's sessions are
//! rescued by the next one through lease expiry; a graceful shutdown hands
//! them over at once; a stopped session never comes back.

use crate::common;

use std::time::Duration;

use common::{TestApp, assert_gap_free, distinct_steps};
use serde_json::{Value, json};

fn script_ending_done(n: usize, delay_ms: u64) -> Value {
    let mut steps = distinct_steps(n, 10, delay_ms)
        .as_array()
        .cloned()
        .unwrap_or_default();
    steps.push(json!({ "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: all steps done>>" }));
    Value::Array(steps)
}

#[tokio::test]
async fn a_crashed_instance_is_replaced_and_the_session_finishes_gap_free() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
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

#[tokio::test]
async fn graceful_shutdown_checkpoints_and_the_next_instance_resumes() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
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

#[tokio::test]
async fn a_stopped_session_stays_stopped_across_restarts() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
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

#[tokio::test]
async fn a_stop_recorded_while_no_instance_runs_is_honoured_on_start() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
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

#[tokio::test]
async fn a_stop_sent_to_another_instance_reaches_the_owner() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let owner = TestApp::spawn(pool.clone()).await;
    let other = TestApp::spawn(pool).await;
    let id = owner
        .create_scripted(distinct_steps(50, 10, 2_000), json!({}))
        .await;
    owner
        .wait_until(&id, Duration::from_secs(5), |s| {
            !s["current_step"].is_null()
        })
        .await;
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

/// The owner tells the fleet once a stopped run's end is committed
/// (`ended:<id>` on the control channel): the instance that took the stop
/// answers on that word instead of polling the row for it.
#[tokio::test]
#[ignore = "needs a Postgres server: LISTEN/NOTIFY between two instances"]
async fn the_owner_tells_the_fleet_once_a_stop_sent_elsewhere_has_landed() {
    common::require_server_postgres("LISTEN/NOTIFY between two instances");
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let owner = TestApp::spawn(pool.clone()).await;
    let other = TestApp::spawn(pool.clone()).await;
    let mut control = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("a listener connects");
    control
        .listen(warden::store::CONTROL_CHANNEL)
        .await
        .expect("LISTEN");
    let id = owner
        .create_scripted(distinct_steps(50, 10, 2_000), json!({}))
        .await;
    owner
        .wait_until(&id, Duration::from_secs(5), |s| {
            !s["current_step"].is_null()
        })
        .await;
    let (status, s) = other
        .post(&format!("/api/autonomous/{id}/stop"), None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(s["status"], "interrupted", "{s}");
    let ended = format!("ended:{id}");
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let note = control.recv().await.expect("the listener stays connected");
            if note.payload() == ended {
                return;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "no {ended} on the control channel");
}

#[tokio::test]
async fn a_live_owner_keeps_its_sessions_when_another_instance_starts() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    // This test is about ownership, not fast recovery: leases long enough
    // that a heartbeat delayed by a loaded machine (two cores running the
    // whole suite) is not mistaken for a dead owner.
    let patient = || {
        crate::common::config_with(&[
            ("WARDEN_LEASE_TTL_MS", "15000"),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", "500"),
        ])
    };
    let owner = TestApp::spawn_with(pool.clone(), patient()).await;
    let id = owner
        .create_scripted(distinct_steps(30, 10, 50), json!({}))
        .await;
    let _second = TestApp::spawn_with(pool, patient()).await;
    let s = owner.wait_settled(&id).await;
    assert_eq!(s["reason"], "executor_exhausted");
    let events = owner.events(&id).await;
    assert!(
        !events.iter().any(|e| e["kind"] == "lease_acquired"),
        "no takeover while the owner was alive"
    );
    assert_gap_free(&owner.iterations(&id).await);
}

/// Sessions on the embedded PostgreSQL survive `kill -9` of the
/// process; restarted on the same data directory, every one resumes and
/// finishes gap-free, no committed iteration lost or repeated. Needs no
/// server, so it runs on both passes.
#[cfg(feature = "embedded")]
#[tokio::test]
async fn embedded_sessions_survive_sigkill_and_resume_gap_free() {
    let dir = std::env::temp_dir().join(format!("warden-k9-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("data dir");
    let mut first = common::Warden::on_data_dir(&dir).serve().await;
    let base = first.base.clone();

    // Only one process may use the data directory.
    let mut second = common::Warden::on_data_dir(&dir).spawn();
    let refused = second.exit_status(Duration::from_secs(60)).await;
    assert!(
        !refused.success(),
        "a second process on the data directory must refuse to start"
    );
    let said = second.logs();
    assert!(said.contains("in use by another Warden process"), "{said}");

    let app = TestApp::connect(None, base.clone()).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            app.create_scripted(script_ending_done(15, 100), json!({}))
                .await,
        );
    }
    app.wait_until(&ids[0], Duration::from_secs(30), |s| {
        s["iterations"].as_i64() >= Some(3)
    })
    .await;
    let mut before = Vec::new();
    for id in &ids {
        before.push(app.session_view(id).await.iterations);
    }
    // SIGKILL: no checkpoint, no lease release, nothing flushed by Warden.
    first.kill();

    let restarted = common::Warden::on_data_dir(&dir)
        .port(first.port())
        .serve()
        .await;
    for (id, before) in ids.iter().zip(before) {
        let s = app
            .wait_until(id, Duration::from_secs(60), |s| {
                s["status"] != "running" && s["status"] != "queued"
            })
            .await;
        assert_eq!(s["status"], "completed", "{s}");
        assert_eq!(s["iterations"], 16, "{s}");
        assert_eq!(s["tokens_used"], 160, "no iteration counted twice: {s}");
        assert!(
            s["iterations"].as_i64() >= Some(before),
            "nothing committed was lost"
        );
        assert_gap_free(&app.iterations(id).await);
    }
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On the embedded store the data directory's lock
/// proves the killed process is gone, so the restarted one releases its
/// leases at start and its sessions move at once, not a lease TTL (30 s
/// here) later. Needs no server, so it runs on both passes.
#[cfg(feature = "embedded")]
#[tokio::test]
async fn an_embedded_restart_after_sigkill_resumes_sessions_at_once() {
    let dir = std::env::temp_dir().join(format!("warden-k9r-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("data dir");
    let env = [
        ("WARDEN_LEASE_TTL_MS", "30000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "1000"),
    ];
    let mut first = common::Warden::on_data_dir(&dir).envs(&env).serve().await;
    let base = first.base.clone();
    let app = TestApp::connect(None, base.clone()).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            app.create_scripted(distinct_steps(400, 1, 50), json!({}))
                .await,
        );
    }
    for id in &ids {
        app.wait_until(id, Duration::from_secs(30), |s| {
            s["iterations"].as_i64() >= Some(2)
        })
        .await;
    }
    let old_owner = app.session(&ids[0]).await["owner"].clone();
    first.kill();

    let restarted = common::Warden::on_data_dir(&dir)
        .envs(&env)
        .port(first.port())
        .serve()
        .await;
    let ready = std::time::Instant::now();
    for id in &ids {
        let at_restart = app.session_view(id).await.iterations;
        let s = app
            .wait_until(id, Duration::from_secs(20), |s| {
                s["iterations"].as_i64() > Some(at_restart) && s["owner"] != old_owner
            })
            .await;
        assert_eq!(s["status"], "running", "{s}");
    }
    let moved = ready.elapsed();
    eprintln!("embedded restart: every session moving {moved:?} after ready");
    assert!(
        moved < Duration::from_secs(1) + Duration::from_millis(1_500),
        "sessions moved {moved:?} after the restart, not at once (lease TTL 30 s)"
    );
    for id in &ids {
        let (status, doc) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{doc}");
        assert_gap_free(&app.iterations(id).await);
    }
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}
