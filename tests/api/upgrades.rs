//! Upgrades an operator can trust (docs/operations/upgrades.md): a replica
//! runs only the sessions whose needs it covers, a create no live replica
//! can run is refused, and the binary refuses a schema it does not match
//! (`WARDEN_MIGRATE=off` and behind, or newer) in plain words.

use crate::common;

use std::time::Duration;

use common::{TestApp, Warden, config_with, distinct_steps};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A session whose `limits.review_every` asks for review points.
fn reviewed(steps: usize) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "limits": { "max_iterations": 100, "review_every": 10 },
        "executor": { "kind": "scripted", "steps": distinct_steps(steps, 1, 100) }
    })
}

/// A replica without `review_every` (a build with it switched off, as a
/// replica of an older release lacks it) is the only one: a session that
/// needs it is refused with 409, not run without its review points; one
/// that needs nothing runs there as before.
#[tokio::test]
async fn a_session_no_live_replica_can_run_is_refused_with_409() {
    let db = common::TestDb::new().await;
    let app = TestApp::spawn_with(
        db.pool.clone(),
        config_with(&[("WARDEN_CAPABILITIES_OFF", "review_every")]),
    )
    .await;
    let (status, doc) = app.post("/api/autonomous", Some(reviewed(20))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");
    assert_eq!(doc["code"], "capability_unavailable", "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap_or("")
            .contains("review_every"),
        "{doc}"
    );
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM sessions")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing was written");
    let plain = app
        .create_scripted(distinct_steps(3, 1, 0), json!({ "max_iterations": 3 }))
        .await;
    let s = app.wait_settled(&plain).await;
    assert_eq!(s["reason"], "max_iterations", "{s}");
}

/// A replica on `db` that lacks the comma-separated `capabilities_off`
/// (none when empty), with leases long enough that a loaded machine's late
/// heartbeat does not make it look gone.
async fn replica(db: &common::TestDb, capabilities_off: &str) -> TestApp {
    let mut vars = vec![
        ("WARDEN_LEASE_TTL_MS", "10000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "500"),
    ];
    if !capabilities_off.is_empty() {
        vars.push(("WARDEN_CAPABILITIES_OFF", capabilities_off));
    }
    TestApp::spawn_with(db.pool.clone(), config_with(&vars)).await
}

/// With a replica that has the capability in the fleet, a create on one
/// that lacks it is accepted `queued`, and the replica that has it claims
/// and runs it, review points included; the one that lacks it never owns it.
#[tokio::test]
#[ignore = "needs a Postgres server: two replicas on one database"]
async fn a_session_waits_for_a_replica_that_covers_its_needs() {
    common::require_server_postgres("two replicas on one database");
    let db = common::TestDb::new().await;
    let lacking = replica(&db, "review_every,delegate").await;
    let full = replica(&db, "").await;
    let lacking_id = lacking.app.as_ref().expect("app").supervisor().replica_id();
    let full_id = full.app.as_ref().expect("app").supervisor().replica_id();

    let created = lacking.create(reviewed(40)).await;
    assert_eq!(created["status"], "queued", "{created}");
    let id = created["id"].as_str().expect("id").to_string();
    let s = lacking
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["status"] == "paused" && s["reason"] == "review_required"
        })
        .await;
    assert_eq!(s["iterations"], 10, "{s}");
    let owners: Vec<Option<uuid::Uuid>> = sqlx::query_scalar(
        "SELECT DISTINCT (data->>'owner')::uuid FROM events
         WHERE session_id = $1::uuid AND kind = 'lease_acquired'",
    )
    .bind(&id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!owners.contains(&Some(lacking_id)), "{owners:?}");
    let needs: Vec<String> = sqlx::query_scalar("SELECT needs FROM sessions WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(needs, ["review_every"]);
    // Resumed on the replica that lacks it: queued again, run by the other.
    let (status, doc) = lacking
        .post(&format!("/api/autonomous/{id}/resume"), Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["status"], "queued", "{doc}");
    let s = full
        .wait_until(&id, Duration::from_secs(10), |s| {
            s["status"] == "running" || s["iterations"].as_i64() > Some(10)
        })
        .await;
    let owner: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT owner FROM sessions WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(owner.is_none() || owner == Some(full_id), "{s}");
}

/// The needs recorded for session `id`.
async fn needs_of(pool: &sqlx::PgPool, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT needs FROM sessions WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A queued session that needs what no live replica has says so in its
/// status (`waiting_for_replica`), and stays queued rather than failing;
/// once a replica that covers it starts, it runs and the reason goes.
#[tokio::test]
#[ignore = "needs a Postgres server: two replicas on one database"]
async fn a_queued_session_says_which_capabilities_it_waits_for() {
    common::require_server_postgres("two replicas on one database");
    let db = common::TestDb::new().await;
    let lacking = replica(&db, "review_every").await;
    // A replica that has every capability but never claims (a row only):
    // the create is queued for it, then it goes silent.
    let ghost = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO replicas (id, capabilities)
         VALUES ($1, ARRAY['delegate', 'review_every', 'approvals', 'mcp_tools'])",
    )
    .bind(ghost)
    .execute(&db.pool)
    .await
    .unwrap();
    let created = lacking.create(reviewed(30)).await;
    assert_eq!(created["status"], "queued", "{created}");
    let id = created["id"].as_str().expect("id").to_string();
    let (_, doc) = lacking.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(doc["waiting_for_replica"], Value::Null, "{doc}");

    sqlx::query("UPDATE replicas SET heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(ghost)
        .execute(&db.pool)
        .await
        .unwrap();
    let (_, doc) = lacking.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(doc["status"], "queued", "{doc}");
    assert_eq!(
        doc["waiting_for_replica"],
        json!({ "capabilities": ["review_every"] }),
        "{doc}"
    );
    // It waits; it does not fail, and the lacking replica never ran it.
    assert_eq!(doc["iterations"], 0, "{doc}");
    assert_eq!(doc["owner"], Value::Null, "{doc}");

    let full = replica(&db, "").await;
    let s = full
        .wait_until(&id, Duration::from_secs(20), |s| {
            s["status"] == "paused" && s["reason"] == "review_required"
        })
        .await;
    assert_eq!(s["iterations"], 10, "{s}");
    assert_eq!(s["waiting_for_replica"], Value::Null, "{s}");
}

/// A change that adds a need (`limits.review_every` on a session without
/// it) is refused with 409 while no replica covers it, with nothing
/// written; where one does, it is accepted and the need is recorded, so
/// only a replica that has it ever takes the session again.
#[tokio::test]
async fn an_update_that_adds_a_need_no_replica_covers_is_refused() {
    let db = common::TestDb::new().await;
    let app = replica(&db, "review_every").await;
    let id = app
        .create_scripted(distinct_steps(200, 1, 50), json!({ "max_iterations": 200 }))
        .await;
    let (status, doc) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "limits": { "review_every": 5 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");
    assert_eq!(doc["code"], "capability_unavailable", "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .unwrap_or("")
            .contains("review_every"),
        "{doc}"
    );
    let (_, s) = app.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(s["limits"]["review_every"], 0, "{s}");
    assert!(needs_of(&db.pool, &id).await.is_empty());
    assert!(
        !app.events(&id)
            .await
            .iter()
            .any(|e| e["kind"] == "limits_changed"),
        "nothing was written"
    );
    // A change that adds no need still goes through.
    let (status, doc) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "limits": { "max_iterations": 150 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    drop(app);

    let db = common::TestDb::new().await;
    let app = replica(&db, "").await;
    let id = app
        .create_scripted(distinct_steps(200, 1, 50), json!({ "max_iterations": 200 }))
        .await;
    let (status, doc) = app
        .patch(
            &format!("/api/autonomous/{id}"),
            json!({ "limits": { "review_every": 5 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(needs_of(&db.pool, &id).await, ["review_every"]);
    let s = app
        .wait_until(&id, Duration::from_secs(30), |s| {
            s["status"] == "paused" && s["reason"] == "review_required"
        })
        .await;
    assert_eq!(s["reason"], "review_required", "{s}");
}

/// `WARDEN_MIGRATE=off` on a schema behind the binary: the service refuses
/// to start, naming the command; `warden migrate --dry-run` lists what it
/// would apply, `warden migrate` applies it, and then the service starts.
/// A schema newer than the binary is refused in plain words.
#[tokio::test]
#[ignore = "needs a Postgres server: the service process and the migrate command on the test's database"]
async fn the_binary_refuses_a_schema_it_does_not_match_in_plain_words() {
    common::require_server_postgres("the service process on the test's database");
    let db = common::TestDb::new().await;
    let store = warden::store::Store::from_pool(db.pool.clone());
    // One migration behind: the newest reversed.
    let newest = warden::store::schema::binary_version();
    let below: i64 = sqlx::query_scalar(
        "SELECT version FROM _sqlx_migrations WHERE version < $1 ORDER BY version DESC LIMIT 1",
    )
    .bind(newest)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    store
        .migrate_down_to(below)
        .await
        .expect("the newest reverses");
    let newest = format!("{newest:04}");

    let mut refused = Warden::on(&db.pool).env("WARDEN_MIGRATE", "off").spawn();
    assert!(!refused.exit_status(Duration::from_secs(60)).await.success());
    let logs = refused.logs();
    assert!(logs.contains("behind this binary's"), "{logs}");
    assert!(logs.contains("run `warden migrate`"), "{logs}");
    let out = Warden::on(&db.pool).run(&["keys", "list"]);
    assert!(!out.status.success(), "a read command never migrates");

    let out = Warden::on(&db.pool).run(&["migrate", "--dry-run"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(listed.trim().lines().count(), 1, "{listed}");
    assert!(
        listed.trim().starts_with(&format!("would apply {newest} ")),
        "{listed}"
    );
    let out = Warden::on(&db.pool).run(&["migrate"]);
    assert!(out.status.success(), "{out:?}");
    let applied = String::from_utf8_lossy(&out.stdout);
    assert!(
        applied.trim().starts_with(&format!("applied {newest} ")),
        "{applied}"
    );
    let process = Warden::on(&db.pool)
        .env("WARDEN_MIGRATE", "off")
        .serve()
        .await;
    drop(process);

    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9001, 'from the future', true, '\\x00', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut newer = Warden::on(&db.pool).spawn();
    assert!(!newer.exit_status(Duration::from_secs(60)).await.success());
    let logs = newer.logs();
    let binary = warden::store::schema::binary_version();
    assert!(
        logs.contains(&format!(
            "this database's schema is at migration 9001, newer than this binary's {binary}"
        )),
        "{logs}"
    );
    assert!(
        !logs.contains("previously applied but is missing"),
        "{logs}"
    );
    let out = Warden::on(&db.pool).run(&["migrate", "--down-to", "26"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("newer than this binary's"),
        "{out:?}"
    );
}
