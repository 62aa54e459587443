//! Sessions and their data go away: `DELETE /api/autonomous/{id}` removes an
//! ended session, its history and its workspace; workspaces of sessions
//! ended longer than `WARDEN_WORKSPACE_RETENTION` ago (and of sessions that
//! no longer exist) are swept from the disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{self, TestApp, client_with_key, config_with, create_key};

/// A fresh workspace root of one test.
fn workspace_root() -> PathBuf {
    let root = std::env::temp_dir().join(format!("warden-retention-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&root).expect("workspace root");
    root
}

/// A workspace directory holding one file, as an agent leaves it.
fn make_workspace(root: &Path, id: &str) -> PathBuf {
    let dir = root.join(id);
    std::fs::create_dir_all(dir.join("notes")).expect("workspace");
    std::fs::write(dir.join("notes/plan.md"), "the plan").expect("file");
    dir
}

/// Rows of `table` that belong to session `id`.
async fn rows_of(pool: &sqlx::PgPool, table: &str, id: &str) -> i64 {
    let id: uuid::Uuid = id.parse().expect("uuid");
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE session_id = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("count")
}

async fn delete(client: &reqwest::Client, app: &TestApp, id: &str) -> (StatusCode, String) {
    let res = client
        .delete(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("sent");
    let status = res.status();
    (status, res.text().await.unwrap_or_default())
}

#[tokio::test]
async fn an_ended_session_is_deleted_with_its_history_and_workspace() {
    let root = workspace_root();
    let root_var = root.to_string_lossy().to_string();
    let app =
        TestApp::start_with(config_with(&[("WARDEN_WORKSPACE_ROOT", root_var.as_str())])).await;
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let dir = make_workspace(&root, &id);

    // A running session is not deleted: it must be stopped first.
    let (status, body) = delete(&app.client, &app, &id).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("stop it first"), "{body}");
    let (status, stopped) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert!(rows_of(app.pool(), "events", &id).await > 0);
    assert!(rows_of(app.pool(), "checkpoints", &id).await > 0);

    // Another tenant cannot, a viewer of the same tenant may not.
    let other = client_with_key(
        create_key(&app.base, "someone-else", "operator").await["secret"]
            .as_str()
            .expect("secret"),
    );
    let (status, _) = delete(&other, &app, &id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let viewer = client_with_key(
        create_key(&app.base, crate::common::TEST_TENANT, "viewer").await["secret"]
            .as_str()
            .expect("secret"),
    );
    let (status, _) = delete(&viewer, &app, &id).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(dir.exists());

    let (status, body) = delete(&app.client, &app, &id).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(body.is_empty());
    assert!(!dir.exists(), "the workspace is removed with its session");
    for table in [
        "events",
        "checkpoints",
        "iterations",
        "refinements",
        "reflections",
    ] {
        assert_eq!(rows_of(app.pool(), table, &id).await, 0, "{table}");
    }
    let (status, _) = app.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.get(&format!("/api/autonomous/{id}/events")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Deleting again finds nothing.
    let (status, _) = delete(&app.client, &app, &id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let _ = std::fs::remove_dir_all(&root);
}

/// Sets a directory's modification time into the past.
fn age(dir: &Path, by: Duration) {
    let file = std::fs::File::open(dir).expect("open directory");
    file.set_modified(SystemTime::now() - by)
        .expect("set modification time");
}

#[tokio::test]
async fn workspaces_of_long_ended_and_missing_sessions_are_swept() {
    let root = workspace_root();
    let root_var = root.to_string_lossy().to_string();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_WORKSPACE_ROOT", root_var.as_str()),
        ("WARDEN_WORKSPACE_RETENTION", "2s"),
    ]))
    .await;
    let ended = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let running = app
        .create_scripted(json!([{ "action": "b", "delay_ms": 600_000 }]), json!({}))
        .await;
    let ended_dir = make_workspace(&root, &ended);
    let running_dir = make_workspace(&root, &running);
    // Old, and not a session at all: deleted long ago, or never committed.
    let old_orphan = make_workspace(&root, &uuid::Uuid::new_v4().to_string());
    age(&old_orphan, Duration::from_secs(2 * 3_600));
    age(&running_dir, Duration::from_secs(2 * 3_600));
    // Just made: its create may still be in flight.
    let new_orphan = make_workspace(&root, &uuid::Uuid::new_v4().to_string());
    // Not a workspace: never touched.
    let stray = root.join("not-a-session");
    std::fs::create_dir_all(&stray).expect("stray dir");
    let (status, body) = app
        .post(&format!("/api/autonomous/{ended}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    common::eventually_ok(Duration::from_secs(20), "the sweep", || async {
        match (ended_dir.exists(), old_orphan.exists()) {
            (false, false) => Ok(()),
            (ended, orphan) => Err(format!(
                "ended dir left: {ended}, old orphan left: {orphan}"
            )),
        }
    })
    .await;
    assert!(running_dir.exists(), "a live session keeps its workspace");
    assert!(new_orphan.exists(), "a fresh directory is given its grace");
    assert!(stray.exists(), "what is not a session's is left alone");
    // The ended session itself is kept: only its files went.
    let (status, _) = app.get(&format!("/api/autonomous/{ended}")).await;
    assert_eq!(status, StatusCode::OK);
    app.post(&format!("/api/autonomous/{running}/stop"), None)
        .await;
    let _ = std::fs::remove_dir_all(&root);
}
