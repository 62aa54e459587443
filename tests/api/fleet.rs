//! A fleet of replicas: capacity (`WARDEN_MAX_RUNNING`), the queue and its
//! fairness, capacity freed to the queue, and the drain hand-over on
//! shutdown (two instances on one database in one process).

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, assert_gap_free, config_with, distinct_steps};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

/// A session whose steps each take a minute: it stays running until stopped.
fn long_steps() -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "scripted", "steps": distinct_steps(3, 1, 60_000) }
    })
}

async fn status_of(app: &TestApp, id: &str) -> (String, Option<i64>) {
    let s = app.session_view(id).await;
    (s.status, s.queue_position)
}

async fn stop(app: &TestApp, id: &str) -> Value {
    let (status, s) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    s
}

#[tokio::test]
async fn beyond_capacity_sessions_queue_with_their_place_and_start_oldest_first() {
    let app = TestApp::start_with(config_with(&[("WARDEN_MAX_RUNNING", "2")])).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let doc = app.create(long_steps()).await;
        let expected = if i < 2 { "running" } else { "queued" };
        assert_eq!(doc["status"], expected, "session {i}: {doc}");
        ids.push(doc["id"].as_str().expect("id").to_string());
    }
    // Two run; three wait with their places 1..3, oldest first.
    for (i, id) in ids.iter().enumerate() {
        let expected = match i {
            0 | 1 => ("running".to_string(), None),
            _ => ("queued".to_string(), Some(i as i64 - 1)),
        };
        assert_eq!(status_of(&app, id).await, expected, "session {i}");
    }
    let (status, page) = app.get("/api/autonomous?status=queued").await;
    assert_eq!(status, StatusCode::OK);
    let mut listed: Vec<(String, i64)> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().expect("id").to_string(),
                s["queue_position"].as_i64().expect("queue_position"),
            )
        })
        .collect();
    listed.sort_by_key(|(_, p)| *p);
    let expected: Vec<(String, i64)> = ids[2..].iter().cloned().zip(1..).collect();
    assert_eq!(listed, expected, "the list shows the queue and its places");
    // A queued session cannot be paused or resumed; it can be stopped.
    let (status, _) = app
        .post(&format!("/api/autonomous/{}/pause", ids[4]), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    // Capacity frees: the oldest queued session starts, the others move up.
    stop(&app, &ids[0]).await;
    app.wait_until(&ids[2], Duration::from_secs(5), |s| {
        s["status"] == "running"
    })
    .await;
    assert_eq!(status_of(&app, &ids[3]).await, ("queued".into(), Some(1)));
    assert_eq!(status_of(&app, &ids[4]).await, ("queued".into(), Some(2)));

    // A queued session stopped never runs, even when capacity frees after.
    let s = stop(&app, &ids[4]).await;
    assert_eq!(
        (&s["status"], &s["reason"]),
        (&json!("interrupted"), &json!("user_stop"))
    );
    stop(&app, &ids[1]).await;
    app.wait_until(&ids[3], Duration::from_secs(5), |s| {
        s["status"] == "running"
    })
    .await;
    stop(&app, &ids[2]).await;
    // Several heartbeats (200 ms in tests) with a free place and no queue:
    // that nothing starts it is an absence, seen only over time.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let s = app.session(&ids[4]).await;
    assert_eq!(s["status"], "interrupted", "{s}");
    assert_eq!(s["iterations"], 0, "{s}");
    let started = app
        .events(&ids[4])
        .await
        .into_iter()
        .any(|e| e["kind"] == "status_changed" && e["data"]["to"] == "running");
    assert!(!started, "a stopped queued session never started");
}

#[tokio::test]
async fn a_session_resumed_beyond_capacity_is_queued() {
    let app = TestApp::start_with(config_with(&[("WARDEN_MAX_RUNNING", "1")])).await;
    let first = app.create(long_steps()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let second = app.create(long_steps()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    stop(&app, &second).await;
    let (status, s) = app
        .post(&format!("/api/autonomous/{second}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(
        (&s["status"], &s["queue_position"]),
        (&json!("queued"), &json!(1))
    );
    let (status, _) = app
        .post(&format!("/api/autonomous/{second}/resume"), None)
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a queued session is not resumed twice"
    );
    stop(&app, &first).await;
    app.wait_until(&second, Duration::from_secs(5), |s| {
        s["status"] == "running"
    })
    .await;
}

/// Shutting replica A down hands its sessions to replica B within about a
/// heartbeat, far inside the lease TTL (10 s here), and their iterations
/// continue gap-free.
#[tokio::test]
async fn a_draining_replica_hands_its_sessions_to_a_peer_within_a_heartbeat() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    const HEARTBEAT_MS: u64 = 500;
    let cfg = || {
        config_with(&[
            ("WARDEN_LEASE_TTL_MS", "10000"),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", "500"),
        ])
    };
    let mut a = TestApp::spawn_with(pool.clone(), cfg()).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            // An explicit limit far away: none may end during the hand-over.
            a.create_scripted(distinct_steps(400, 1, 20), json!({ "max_iterations": 400 }))
                .await,
        );
    }
    let a_id = a.app.as_ref().expect("a").supervisor().replica_id();
    for id in &ids {
        a.wait_until(id, Duration::from_secs(10), |s| {
            s["iterations"].as_i64() >= Some(3) && s["owner"] == json!(a_id)
        })
        .await;
    }
    let b = TestApp::spawn_with(pool, cfg()).await;
    let b_id = b.app.as_ref().expect("b").supervisor().replica_id();

    a.shutdown().await;
    let released = Instant::now();
    let mut handed = Vec::new();
    for id in &ids {
        let at_release = b.session_view(id).await.iterations;
        let s = b
            .wait_until(id, Duration::from_secs(8), |s| {
                s["owner"] == json!(b_id) && s["iterations"].as_i64() > Some(at_release)
            })
            .await;
        assert_eq!(s["status"], "running", "{s}");
        handed.push(released.elapsed());
    }
    let slowest = handed.iter().max().copied().unwrap_or_default();
    eprintln!("drain hand-over: every session running on the peer after {slowest:?}");
    // One heartbeat for the peer's next claim, plus slack for a loaded machine.
    assert!(
        slowest < Duration::from_millis(HEARTBEAT_MS + 1_500),
        "hand-over took {slowest:?}, not about one heartbeat ({HEARTBEAT_MS} ms)"
    );
    for id in &ids {
        stop(&b, id).await;
        let iterations = b.iterations(id).await;
        assert!(iterations.len() > 3);
        assert_gap_free(&iterations);
        let events = b.events(id).await;
        assert!(events.iter().any(|e| e["kind"] == "lease_released"));
        let takeover = events
            .iter()
            .find(|e| e["kind"] == "lease_acquired")
            .expect("the peer took the lease");
        assert_eq!(takeover["data"]["owner"], json!(b_id));
        assert!(
            takeover["data"]["previous_owner"].is_null(),
            "a released session has no previous owner (not a failed attempt)"
        );
    }
}

// A heartbeat renews a replica's leases a few hundred to a statement, so
// that a stop of one of 100,000 waiting sessions does not wait for all of
// their rows; every lease must still be renewed, the last chunk's too.
#[tokio::test]
async fn more_leases_than_one_renewal_statement_holds_are_all_renewed() {
    // The test configuration: a 1-s lease renewed every 200 ms.
    let app = TestApp::start().await;
    const SESSIONS: usize = 600;
    let created: Vec<Value> = futures::stream::iter(0..SESSIONS)
        .map(|_| app.create(long_steps()))
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        created.iter().all(|doc| doc["status"] == "running"),
        "all run"
    );
    let pool = app.pool();
    let leases = || async {
        sqlx::query_as::<_, (uuid::Uuid, Option<uuid::Uuid>)>(
            "SELECT id, lease_token FROM sessions WHERE status = 'running' ORDER BY id",
        )
        .fetch_all(pool)
        .await
        .expect("leases")
    };
    let before = leases().await;
    assert_eq!(before.len(), SESSIONS);
    let (mark,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as("SELECT now()")
        .fetch_one(pool)
        .await
        .expect("now");
    // Every lease renewed after more than a lease's length has passed: one
    // left out would have expired and been rescued (a new token) by now.
    common::eventually(
        Duration::from_secs(20),
        "every lease renewed a TTL later",
        || async {
            let (renewed,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM sessions WHERE status = 'running'
               AND heartbeat_at > $1 + interval '1500 milliseconds' AND lease_expires_at > now()",
            )
            .bind(mark)
            .fetch_one(pool)
            .await
            .expect("renewed");
            renewed as usize == SESSIONS
        },
    )
    .await;
    assert_eq!(leases().await, before, "no lease was lost and taken over");
}

/// The status document as Postgres alone would give it.
async fn status_from_postgres(pool: &PgPool, id: &str) -> Value {
    let store = warden::store::Store::from_pool(pool.clone());
    let uuid: uuid::Uuid = id.parse().expect("uuid");
    let record = store
        .session(uuid, &warden::store::TenantScope::Global)
        .await
        .expect("read")
        .expect("exists");
    let velocity = store
        .velocity(uuid, 30, &warden::store::TenantScope::Global)
        .await
        .expect("velocity");
    let mut doc = warden::http::views::SessionView::from(record);
    doc.velocity = Some(
        velocity
            .into_iter()
            .map(|(minute, iterations)| warden::http::views::VelocityPoint { minute, iterations })
            .collect(),
    );
    committed_part(serde_json::to_value(doc).expect("json"))
}

async fn status_with_source(app: &TestApp, id: &str) -> (String, Value) {
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
    let source = res
        .headers()
        .get("warden-status-source")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (source, committed_part(res.json().await.expect("json")))
}

/// A status without what only the running replica knows of the step in
/// flight (its clock and the ETA drawn from it), which Postgres never holds.
fn committed_part(mut status: Value) -> Value {
    if let Some(fields) = status.as_object_mut() {
        for live in ["current_step", "eta_basis", "eta_seconds", "elapsed_ms"] {
            fields.remove(live);
        }
    }
    status
}

/// `GET /{id}` of a session this replica runs answers from the loop's
/// memory, field for field what Postgres holds, also after a settings
/// change; another tenant still gets a 404; once it ends, Postgres answers.
#[tokio::test]
async fn the_status_of_a_running_session_comes_from_memory_and_equals_postgres() {
    // A long heartbeat: no lease renewal between the two reads compared.
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LEASE_TTL_MS", "60000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "30000"),
    ]))
    .await;
    let pool = app.pool().clone();
    let mut steps = distinct_steps(12, 7, 0)
        .as_array()
        .cloned()
        .unwrap_or_default();
    steps.push(json!({ "action": "wait", "tokens": 1, "output": "waiting", "delay_ms": 60_000 }));
    let id = app
        .create_scripted(Value::Array(steps), json!({ "checkpoint_interval": 5 }))
        .await;
    // Twelve quick steps (two folded checkpoints), then one in flight for a minute.
    app.wait_until(&id, Duration::from_secs(10), |s| s["iterations"] == 12)
        .await;
    crate::common::eventually(
        Duration::from_secs(5),
        "memory to answer as Postgres does",
        || async {
            let (source, memory) = status_with_source(&app, &id).await;
            source == "memory" && memory == status_from_postgres(&pool, &id).await
        },
    )
    .await;
    let (source, memory) = status_with_source(&app, &id).await;
    assert_eq!(source, "memory");
    assert_eq!(memory, status_from_postgres(&pool, &id).await);
    assert_eq!(memory["last_checkpoint_iteration"], 10);
    assert_eq!(memory["velocity"][0]["iterations"], 12, "{memory}");

    // A settings change shows at once and memory answers again after it.
    let (status, _) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "limits": { "max_iterations": 40 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, first) = status_with_source(&app, &id).await;
    assert_eq!(first["limits"]["max_iterations"], 40);
    // A read refills the view once nothing changed while it ran (the
    // change's own notification also reaches this replica meanwhile).
    let memory =
        common::eventually_ok(Duration::from_secs(5), "memory to answer again", || async {
            let (source, doc) = status_with_source(&app, &id).await;
            assert_eq!(doc["limits"]["max_iterations"], 40, "{doc}");
            if source == "memory" {
                Ok(doc)
            } else {
                Err(format!("answered from {source}"))
            }
        })
        .await;
    assert_eq!(memory, status_from_postgres(&pool, &id).await);

    // Another tenant's key: a 404, as for a missing session.
    let other = common::create_key(&app.base, "other-tenant", "viewer").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let res = common::client_with_key(&other)
        .get(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    stop(&app, &id).await;
    let (source, ended) = status_with_source(&app, &id).await;
    assert_eq!(source, "database");
    assert_eq!(ended["status"], "interrupted");
}
