//! Retention: ended sessions past their tenant's retention are archived to
//! one file each and deleted, in the background, while running sessions go
//! on; an archive imports back read-only and equal to what was exported;
//! long sessions' events are compacted past the horizon, keeping decisions
//! and ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{
    ADMIN_TOKEN, TestApp, TestDb, client_with_key, config_with, create_key, distinct_steps,
    eventually, store_on,
};

/// A fresh archive folder of one test.
fn archive_dir() -> PathBuf {
    std::env::temp_dir().join(format!("warden-archive-{}", uuid::Uuid::new_v4()))
}

/// Sets `tenant`'s retention through the admin route; returns the answer.
async fn set_retention(app: &TestApp, tenant: &str, keep: &str) -> Value {
    let res = reqwest::Client::new()
        .put(app.url("/api/retention"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": tenant, "keep": keep }))
        .send()
        .await
        .expect("sent");
    let status = res.status();
    let body: Value = res.json().await.expect("json");
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The archive file of session `id` of `tenant` under `dir`, once written.
fn archive_file(dir: &Path, tenant: &str, id: &str) -> Option<PathBuf> {
    let months = std::fs::read_dir(dir.join(tenant)).ok()?;
    months
        .filter_map(Result::ok)
        .map(|m| m.path().join(format!("{id}.jsonl.zst")))
        .find(|p| p.exists())
}

/// What the API shows of a session: its status document (the fields an
/// import must keep), iterations, reflections and events.
async fn views(app: &TestApp, id: &str) -> Value {
    let s = app.session(id).await;
    let keep = [
        "id",
        "goal",
        "mode",
        "status",
        "reason",
        "summary",
        "iterations",
        "tokens_used",
        "percent_complete",
        "limits",
        "created_at",
        "ended_at",
        "checkpoint_saved",
        "next_steps",
        "last_event_seq",
    ];
    let status: serde_json::Map<String, Value> = keep
        .iter()
        .map(|k| (k.to_string(), s[*k].clone()))
        .collect();
    let (code, reflections) = app
        .get(&format!("/api/autonomous/{id}/reflections?limit=500"))
        .await;
    assert_eq!(code, StatusCode::OK, "{reflections}");
    json!({
        "status": status,
        "iterations": app.iterations(id).await,
        "reflections": reflections["items"],
        "events": app.events(id).await,
        "decisions": app.decisions(id).await,
    })
}

#[tokio::test]
async fn sessions_past_their_tenants_retention_are_archived_and_deleted_and_import_back_read_only()
{
    let db = TestDb::new().await;
    let dir = archive_dir();
    let dir_var = dir.to_string_lossy().to_string();
    // No server retention: only the tenant's own prunes.
    let app = TestApp::spawn_with(
        db.pool.clone(),
        config_with(&[
            ("WARDEN_PRUNE_INTERVAL", "1s"),
            ("WARDEN_ARCHIVE_DIR", dir_var.as_str()),
        ]),
    )
    .await;
    let other = client_with_key(
        create_key(&app.base, "other", "operator").await["secret"]
            .as_str()
            .expect("secret"),
    );
    let ended_a = app
        .create_scripted(distinct_steps(3, 10, 0), json!({}))
        .await;
    let ended_b = app
        .create_scripted(distinct_steps(2, 10, 0), json!({}))
        .await;
    let running = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 100000 },
            "executor": { "kind": "scripted", "steps": distinct_steps(2000, 1, 30) }
        }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let res = other
        .post(app.url("/api/autonomous"))
        .json(&json!({
            "goal": "Create README.md with a project description",
            "executor": { "kind": "scripted", "steps": distinct_steps(2, 10, 0) }
        }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED);
    let others: Value = res.json().await.expect("json");
    let others = others["id"].as_str().expect("id").to_string();
    for id in [&ended_a, &ended_b] {
        app.wait_settled(id).await;
    }
    let before = views(&app, &ended_a).await;
    assert_eq!(before["status"]["status"], "stopped", "{before}");

    let set = set_retention(&app, "test", "1s").await;
    assert_eq!(set["keep"], "1s");
    assert_eq!(set["retention_seconds"], 1);
    for id in [&ended_a, &ended_b] {
        eventually(
            Duration::from_secs(60),
            "the ended session to be archived and deleted",
            || async { app.get(&format!("/api/autonomous/{id}")).await.0 == StatusCode::NOT_FOUND },
        )
        .await;
    }
    let file = archive_file(&dir, "test", &ended_a).expect("the archive file is written");
    assert!(archive_file(&dir, "test", &ended_b).is_some());
    // The running session went on, and the other tenant's ended one stays.
    let at = app.session_view(&running).await.iterations;
    app.wait_until(&running, Duration::from_secs(30), |s| {
        s["status"] == "running" && s["iterations"].as_i64().expect("iterations") > at
    })
    .await;
    let res = other
        .get(app.url(&format!("/api/autonomous/{others}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "another tenant's session is kept"
    );
    // No temporary file is left beside the archives.
    let month = file.parent().expect("month folder");
    let names: Vec<String> = std::fs::read_dir(month)
        .expect("month folder")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(".jsonl.zst")), "{names:?}");
    let (code, metrics) = {
        let res = app.admin_get("/metrics").await;
        (res.status(), res.text().await.unwrap_or_default())
    };
    assert_eq!(code, StatusCode::OK);
    assert!(
        metrics.contains("warden_archived_sessions_total 2"),
        "{metrics}"
    );

    // Back, read-only, under its tenant, equal to what was exported.
    set_retention(&app, "test", "forever").await;
    let imported = warden::session::archive::import(&store_on(db.pool.clone()), &file)
        .await
        .expect("the archive imports");
    assert_eq!(imported.tenant, "test");
    let after = views(&app, &ended_a).await;
    assert_eq!(after, before, "the import equals the export");
    let shown = app.session(&ended_a).await;
    assert!(shown["imported_at"].is_string(), "{shown}");
    assert_eq!(shown["allowed_actions"], json!(["delete"]));
    for (path, body) in [
        ("resume", Some(json!({ "guidance": "again" }))),
        ("stop", None),
        ("pause", None),
    ] {
        let (code, problem) = app
            .post(&format!("/api/autonomous/{ended_a}/{path}"), body)
            .await;
        assert_eq!(code, StatusCode::CONFLICT, "{path}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or("")
                .contains("imported from an archive"),
            "{problem}"
        );
    }
    let (code, problem) = app
        .patch(
            &format!("/api/autonomous/{ended_a}"),
            json!({ "limits": { "max_iterations": 9 } }),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{problem}");
    let res = other
        .get(app.url(&format!("/api/autonomous/{ended_a}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "still its tenant's only"
    );
    // A second import of the same session is refused; nothing changes.
    let again = warden::session::archive::import(&store_on(db.pool.clone()), &file).await;
    assert!(again.is_err());
    let res = app
        .client
        .delete(app.url(&format!("/api/autonomous/{ended_a}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let (code, _) = app
        .post(&format!("/api/autonomous/{running}/stop"), None)
        .await;
    assert_eq!(code, StatusCode::OK);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_server_retention_applies_to_tenants_without_their_own() {
    let dir = archive_dir();
    let dir_var = dir.to_string_lossy().to_string();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_RETENTION_DAYS", "1s"),
        ("WARDEN_PRUNE_INTERVAL", "1s"),
        ("WARDEN_ARCHIVE_DIR", dir_var.as_str()),
    ]))
    .await;
    // Tenant "keep" keeps its sessions forever, over the server's 1 s.
    let kept_key = create_key(&app.base, "keep", "operator").await;
    let kept_client = client_with_key(kept_key["secret"].as_str().expect("secret"));
    let set = set_retention(&app, "keep", "forever").await;
    assert_eq!(set["keep"], "forever");
    assert!(set["retention_seconds"].is_null());
    let res = kept_client
        .post(app.url("/api/autonomous"))
        .json(&json!({
            "goal": "Create README.md with a project description",
            "executor": { "kind": "scripted", "steps": distinct_steps(1, 10, 0) }
        }))
        .send()
        .await
        .expect("sent");
    let kept: Value = res.json().await.expect("json");
    let kept = kept["id"].as_str().expect("id").to_string();
    let pruned = app
        .create_scripted(distinct_steps(1, 10, 0), json!({}))
        .await;
    eventually(
        Duration::from_secs(60),
        "the default tenant's session to be pruned",
        || async { app.get(&format!("/api/autonomous/{pruned}")).await.0 == StatusCode::NOT_FOUND },
    )
    .await;
    let res = kept_client
        .get(app.url(&format!("/api/autonomous/{kept}")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK, "a tenant's forever wins");
    let listed = app.admin_get("/api/retention").await;
    let listed: Value = listed.json().await.expect("json");
    assert_eq!(listed["server_default"], "1s", "{listed}");
    assert_eq!(listed["tenants"][0]["tenant"], "keep", "{listed}");
    // Only a global admin sets a tenant's retention; bad values are 422.
    let res = reqwest::Client::new()
        .put(app.url("/api/retention"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": "keep", "keep": "soon" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let res = app
        .client
        .put(app.url("/api/retention"))
        .json(&json!({ "tenant": "test", "keep": "forever" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "an operator key");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn compaction_drops_routine_events_past_the_horizon_and_keeps_decisions_and_ends() {
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_PRUNE_INTERVAL", "1s"),
        ("WARDEN_EVENT_HORIZON", "10"),
    ]))
    .await;
    let id = app
        .create_scripted(distinct_steps(40, 10, 0), json!({}))
        .await;
    let ended = app.wait_settled(&id).await;
    let last_seq = ended["last_event_seq"].as_i64().expect("seq");
    let decisions = app.decisions(&id).await;
    let status_changes = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["kind"] == "status_changed")
            .cloned()
            .collect()
    };
    let routine_past_horizon = |events: &[Value]| -> usize {
        events
            .iter()
            .map(crate::common::view::<crate::common::EventView>)
            .filter(|e| e.kind == "iteration_completed" && e.seq <= last_seq - 10)
            .count()
    };
    let before = app.events(&id).await;
    let ends = status_changes(&before);

    eventually(
        Duration::from_secs(60),
        "routine events past the horizon to be compacted",
        || async { routine_past_horizon(&app.events(&id).await) == 0 },
    )
    .await;
    let after = app.events(&id).await;
    // The pages say how far back the log was thinned, the decisions' too
    // (their `continue` gate evaluations are among what goes).
    for list in ["events", "decisions"] {
        let (status, page) = app
            .get(&format!("/api/autonomous/{id}/{list}?limit=1"))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["compacted_through"], json!(last_seq - 10), "{list}");
    }
    // The log held one event per seq, 1 to last_seq, before the sweep
    // (which may have run before `before` was read, on a loaded machine).
    assert!(
        after.len() < usize::try_from(last_seq).expect("a seq"),
        "{} events of {last_seq} left",
        after.len()
    );
    assert_eq!(
        app.decisions(&id).await,
        decisions,
        "every decision is kept"
    );
    assert_eq!(status_changes(&after), ends, "every status change is kept");
    let latest: Vec<i64> = after
        .iter()
        .filter_map(|e| e["seq"].as_i64())
        .filter(|seq| *seq > last_seq - 10)
        .collect();
    assert_eq!(
        latest,
        ((last_seq - 9)..=last_seq).collect::<Vec<_>>(),
        "the latest events are whole"
    );
    // The session itself is untouched.
    assert_eq!(app.session(&id).await["iterations"], 40);
    assert_eq!(app.iterations(&id).await.len(), 40);
}

#[tokio::test]
async fn the_archive_import_command_brings_a_session_back_read_only() {
    let dir = archive_dir();
    let dir_var = dir.to_string_lossy().to_string();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_RETENTION_DAYS", "1s"),
        ("WARDEN_PRUNE_INTERVAL", "1s"),
        ("WARDEN_ARCHIVE_DIR", dir_var.as_str()),
    ]))
    .await;
    let id = app
        .create_scripted(distinct_steps(2, 10, 0), json!({}))
        .await;
    eventually(
        Duration::from_secs(60),
        "the session to be archived",
        || async { app.get(&format!("/api/autonomous/{id}")).await.0 == StatusCode::NOT_FOUND },
    )
    .await;
    let file = archive_file(&dir, "test", &id).expect("archive file");
    let file = file.to_string_lossy().to_string();

    // Into another database, through the command, then served from there.
    let target = TestDb::new().await;
    let data_dir = std::env::temp_dir().join(format!("warden-import-{}", uuid::Uuid::new_v4()));
    let warden = || {
        if crate::common::embedded() {
            crate::common::Warden::on_data_dir(&data_dir)
        } else {
            crate::common::Warden::at_url(&crate::common::database_url(&target.pool))
        }
    };
    let refused = warden().run(&["archive", "import", "/no/such/file.jsonl.zst"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no/such/file"));
    let output = warden().run(&["archive", "import", &file]);
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains(&format!("imported session {id} of tenant test")),
        "{printed}"
    );
    let service = warden().serve().await;
    let admin = client_with_key(ADMIN_TOKEN);
    let shown: Value = admin
        .get(format!("{}/api/autonomous/{id}", service.base))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(shown["status"], "stopped", "{shown}");
    assert_eq!(shown["iterations"], 2, "{shown}");
    assert!(shown["imported_at"].is_string(), "{shown}");
    let res = admin
        .post(format!("{}/api/autonomous/{id}/resume", service.base))
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    // Under its tenant, as it was: another tenant's key does not find it.
    for (tenant, expected) in [("test", StatusCode::OK), ("other", StatusCode::NOT_FOUND)] {
        let key = create_key(&service.base, tenant, "viewer").await;
        let res = client_with_key(key["secret"].as_str().expect("secret"))
            .get(format!("{}/api/autonomous/{id}", service.base))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), expected, "{tenant}");
    }
    drop(service);
    let _ = std::fs::remove_dir_all(&data_dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `row` as a plain JSON Lines archive of one session into `dir`.
fn plain_archive(dir: &Path, row: &Value) -> PathBuf {
    std::fs::create_dir_all(dir).expect("folder");
    let path = dir.join(format!("{}.jsonl", uuid::Uuid::new_v4()));
    let line = json!({ "type": "session", "format": 1, "row": row });
    std::fs::write(&path, format!("{line}\n")).expect("written");
    path
}

#[tokio::test]
async fn an_import_checks_tenant_lineage_and_secrets_against_the_target_and_reads_regular_files_only()
 {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let dir = archive_dir();
    let store = store_on(db.pool.clone());
    // Another tenant's session, and an ended one to copy rows from.
    let victim = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let ended = app
        .create_scripted(json!([{ "action": "a", "output": "done" }]), json!({}))
        .await;
    app.wait_settled(&ended).await;
    let row: String =
        sqlx::query_scalar("SELECT row_to_json(s)::text FROM sessions s WHERE id = $1::text::uuid")
            .bind(&ended)
            .fetch_one(&db.pool)
            .await
            .expect("the row");
    let row: Value = serde_json::from_str(&row).expect("json");
    let sessions = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sessions")
            .fetch_one(&db.pool)
            .await
            .expect("count")
    };
    let before = sessions().await;
    let fresh = |tenant: &str, parent: Option<&str>, secrets_from: Option<&str>| {
        let mut r = row.clone();
        r["id"] = json!(uuid::Uuid::new_v4());
        r["tenant"] = json!(tenant);
        r["parent_id"] = json!(parent);
        r["lineage"] = json!(parent.map_or_else(Vec::new, |p| vec![p]));
        r["parent_call"] = json!(parent.map(|_| "split.0"));
        r["budget_tokens"] = json!(parent.map(|_| 10));
        r["budget_iterations"] = json!(parent.map(|_| 1));
        r["secrets_from"] = json!(secrets_from);
        r
    };
    for (why, r) in [
        (
            "a child of another tenant's session",
            fresh("evil", Some(&victim), Some(&victim)),
        ),
        (
            "a child of a missing session",
            fresh("test", Some(&uuid::Uuid::new_v4().to_string()), None),
        ),
        (
            "a root borrowing another session's secrets",
            fresh("evil", None, Some(&victim)),
        ),
        (
            "a child borrowing secrets outside its lineage",
            fresh("test", Some(&victim), Some(&ended)),
        ),
        ("a tenant name that is none", fresh("../evil", None, None)),
    ] {
        let file = plain_archive(&dir, &r);
        let refused = warden::session::archive::import(&store, &file).await;
        assert!(refused.is_err(), "{why} was imported");
    }
    assert_eq!(sessions().await, before, "nothing was imported");
    // A child that fits under its parent here imports.
    let file = plain_archive(&dir, &fresh("test", Some(&victim), Some(&victim)));
    warden::session::archive::import(&store, &file)
        .await
        .expect("a child in its place imports");
    assert_eq!(sessions().await, before + 1);

    // A FIFO is refused at once, not waited on.
    #[cfg(target_os = "linux")]
    {
        let fifo = dir.join("archive.fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("no NUL");
        // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            warden::session::archive::import(&store, &fifo),
        )
        .await
        .expect("the import of a FIFO returns at once");
        let err = refused.expect_err("a FIFO is no archive").to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
    let (code, _) = app
        .post(&format!("/api/autonomous/{victim}/stop"), None)
        .await;
    assert_eq!(code, StatusCode::OK);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An archive written by an older release lacks the NOT NULL columns later
/// migrations added (cost, unpriced steps, tree and capability columns):
/// its rows import with each column's default, as the migration gave rows
/// that existed then, instead of failing on a NULL.
#[tokio::test]
async fn an_archive_from_before_later_columns_imports_with_their_defaults() {
    let db = TestDb::new().await;
    let app = TestApp::spawn(db.pool.clone()).await;
    let store = store_on(db.pool.clone());
    let ended = app
        .create_scripted(json!([{ "action": "a", "output": "done" }]), json!({}))
        .await;
    app.wait_settled(&ended).await;
    let row: String =
        sqlx::query_scalar("SELECT row_to_json(s)::text FROM sessions s WHERE id = $1::text::uuid")
            .bind(&ended)
            .fetch_one(&db.pool)
            .await
            .expect("the row");
    let mut row: Value = serde_json::from_str(&row).expect("json");
    let id = uuid::Uuid::new_v4();
    row["id"] = json!(id);
    let older = row.as_object_mut().expect("an object");
    for added in [
        "cost_usd",
        "unpriced_steps",
        "needs",
        "tokens_charged",
        "forgiven_tokens",
        "on_child_pause",
        "lineage",
        "children_tokens",
        "children_iterations",
    ] {
        assert!(older.remove(added).is_some(), "{added} is a column today");
    }
    let file = plain_archive(&archive_dir(), &row);
    warden::session::archive::import(&store, &file)
        .await
        .expect("an older archive imports");
    let (status, shown) = app.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["cost_usd"], "0", "{shown}");
    assert_eq!(shown["unpriced_steps"], 0, "{shown}");
    assert!(shown["imported_at"].is_string(), "{shown}");
}
