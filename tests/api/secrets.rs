//! Secrets at rest: a session's own `api_key` is sealed
//! apart from its record, reaches its model after a restart, is moved out of
//! rows earlier versions wrote; a replica with another key refuses to start,
//! a rotation moves the fleet to a new key, and a secret no replica can open
//! fails its session clearly instead of crashing the server.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use warden::Application;

use crate::common;
use crate::common::fake_llm::{FakeLlm, text, tool_calls};
use crate::common::{TEST_SECRET_KEY, TestApp, config_with, store_on, test_config};

const OWN_KEY: &str = "sk-own-session-key-4b3a2918";

fn llm_session(fake: &FakeLlm, key: &str, max_iterations: u64) -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "mode": "fixed",
        "limits": { "max_iterations": max_iterations },
        "executor": { "kind": "llm", "base_url": fake.base_url(), "model": "m", "api_key": key }
    })
}

/// Rows of `table` whose text form contains `needle`.
async fn rows_containing(pool: &PgPool, table: &str, needle: &str) -> i64 {
    let sql = match table {
        "sessions" => "SELECT count(*) FROM sessions t WHERE t::text LIKE '%' || $1 || '%'",
        "session_secrets" => {
            "SELECT count(*) FROM session_secrets t WHERE t::text LIKE '%' || $1 || '%'"
        }
        "events" => "SELECT count(*) FROM events t WHERE t::text LIKE '%' || $1 || '%'",
        "iterations" => "SELECT count(*) FROM iterations t WHERE t::text LIKE '%' || $1 || '%'",
        other => panic!("no query for {other}"),
    };
    sqlx::query_scalar::<_, i64>(sql)
        .bind(needle)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_sessions_own_key_is_sealed_and_reaches_its_model_after_a_restart() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    // The first answer is slow: the instance dies while it is in flight.
    fake.agent(
        tool_calls(
            &[(
                "write_file",
                json!({ "path": "README.md", "content": "# x" }),
            )],
            10,
        )
        .delayed(3_000),
    )
    .agent(text("README.md written\n<<WARDEN_GOAL_DONE: done>>", 10));
    let mut first = TestApp::spawn(pool.clone()).await;
    let doc = first.create(llm_session(&fake, OWN_KEY, 10)).await;
    let id = doc["id"].as_str().unwrap().to_string();
    assert!(
        !doc.to_string().contains(OWN_KEY),
        "never shown back: {doc}"
    );
    common::eventually(
        Duration::from_secs(10),
        "the model to be called",
        || async { !fake.authorizations().is_empty() },
    )
    .await;
    first.crash();

    let second = TestApp::spawn(pool.clone()).await;
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    let seen = fake.authorizations();
    assert!(seen.len() >= 2, "called again after the restart: {seen:?}");
    let expected = format!("Bearer {OWN_KEY}");
    assert!(
        seen.iter().all(|a| a.as_deref() == Some(expected.as_str())),
        "{seen:?}"
    );
    // The plaintext is nowhere in the database.
    for table in ["sessions", "session_secrets", "events", "iterations"] {
        assert_eq!(rows_containing(&pool, table, OWN_KEY).await, 0, "{table}");
    }
    let sealed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM session_secrets WHERE session_id = $1::uuid AND name = 'api_key'",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(sealed, 1);
    let executor: Value = sqlx::query_scalar("SELECT executor FROM sessions WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(executor.get("api_key").is_none(), "{executor}");
}

#[tokio::test]
async fn plaintext_keys_of_earlier_versions_are_sealed_at_start() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    fake.agent(text("working on it", 10));
    let mut first = TestApp::spawn(pool.clone()).await;
    let doc = first
        .create(llm_session(&fake, "sk-placeholder-0000", 1))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    let s = first.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped", "{s}");
    first.shutdown().await;
    // What an earlier version stored: the key in the executor JSON.
    let legacy = "sk-legacy-plaintext-7c6d5e";
    sqlx::query("DELETE FROM session_secrets WHERE session_id = $1::uuid")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE sessions SET executor = executor || jsonb_build_object('api_key', $2::text) WHERE id = $1::uuid")
        .bind(&id)
        .bind(legacy)
        .execute(&pool)
        .await
        .unwrap();

    let second = TestApp::spawn(pool.clone()).await;
    assert_eq!(
        rows_containing(&pool, "sessions", legacy).await,
        0,
        "moved at start"
    );
    let sealed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_secrets WHERE session_id = $1::uuid")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(sealed, 1);
    fake.agent(text("done\n<<WARDEN_GOAL_DONE: ok>>", 10));
    let (status, body) = second
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "limits": { "max_iterations": 3 } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        fake.authorizations().last().cloned().flatten().as_deref(),
        Some(format!("Bearer {legacy}").as_str())
    );
}

/// The id of a key given as hex (what logs and errors name).
fn key_id(hex: &str) -> String {
    warden::secrets::SecretKey::parse(hex)
        .expect("a test key")
        .id()
        .to_string()
}

/// Starts a session whose first model call hangs, waits for that call, and
/// kills the instance: the session is left running, its key sealed.
async fn orphan_llm_session(pool: &PgPool, fake: &FakeLlm) -> String {
    fake.agent(text("slow", 10).delayed(5_000));
    let mut first = TestApp::spawn(pool.clone()).await;
    let doc = first.create(llm_session(fake, OWN_KEY, 10)).await;
    let id = doc["id"].as_str().unwrap().to_string();
    common::eventually(
        Duration::from_secs(10),
        "the model to be called",
        || async { !fake.authorizations().is_empty() },
    )
    .await;
    first.crash();
    id
}

async fn sealed_key_id(pool: &PgPool, id: &str) -> String {
    sqlx::query_scalar("SELECT key_id FROM session_secrets WHERE session_id = $1::uuid")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn registered_key_id(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT key_id FROM secret_key")
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_replica_with_another_secret_key_refuses_to_start_and_a_rotation_moves_the_fleet() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    let id = orphan_llm_session(&pool, &fake).await;
    let (old, new) = (key_id(TEST_SECRET_KEY), "ab".repeat(32));
    assert_eq!(
        registered_key_id(&pool).await.as_deref(),
        Some(old.as_str())
    );

    // Another key alone: the replica does not start (it would fail every
    // session it claims), and says which keys and what to do.
    let refused = Application::build_with_store(
        config_with(&[("WARDEN_SECRET_KEY", new.as_str())]),
        store_on(pool.clone()),
    )
    .await;
    let err = match refused {
        Ok(_) => panic!("a replica with another key started"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains(&old)
            && err.contains(&key_id(&new))
            && err.contains("WARDEN_SECRET_KEY_PREVIOUS"),
        "{err}"
    );
    assert!(!err.contains(&new), "the key itself is never shown: {err}");
    let status: String = sqlx::query_scalar("SELECT status FROM sessions WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "running", "the refused replica touched no session");

    // The new key with the old one as previous: a rotation. The secret is
    // sealed again under the new key and the session runs on with its key.
    fake.agent(text("done\n<<WARDEN_GOAL_DONE: ok>>", 10));
    let second = TestApp::spawn_with(
        pool.clone(),
        config_with(&[
            ("WARDEN_SECRET_KEY", new.as_str()),
            ("WARDEN_SECRET_KEY_PREVIOUS", TEST_SECRET_KEY),
        ]),
    )
    .await;
    // The re-seal runs in the background.
    crate::common::eventually(
        Duration::from_secs(10),
        "the secret is sealed again",
        || async { sealed_key_id(&pool, &id).await == key_id(&new) },
    )
    .await;
    assert_eq!(registered_key_id(&pool).await, Some(key_id(&new)));
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        fake.authorizations().last().cloned().flatten().as_deref(),
        Some(format!("Bearer {OWN_KEY}").as_str())
    );
    assert_eq!(rows_containing(&pool, "session_secrets", OWN_KEY).await, 0);

    // After the rotation the old key alone is the foreign one.
    let stale = Application::build_with_store(test_config(), store_on(pool.clone())).await;
    assert!(stale.is_err(), "a replica left on the old key started");
}

#[tokio::test]
async fn a_replica_whose_key_was_rotated_away_hands_sessions_over_instead_of_failing_them() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    let new = "cd".repeat(32);
    // A keeps running on the old key, with room and attempts to spare.
    let mut stale = TestApp::spawn_with(
        pool.clone(),
        config_with(&[("WARDEN_MAX_ATTEMPTS", "1000")]),
    )
    .await;
    // B rotates the fleet to the new key; one long session fills it.
    let mut fresh = TestApp::spawn_with(
        pool.clone(),
        config_with(&[
            ("WARDEN_SECRET_KEY", new.as_str()),
            ("WARDEN_SECRET_KEY_PREVIOUS", TEST_SECRET_KEY),
            ("WARDEN_MAX_RUNNING", "1"),
        ]),
    )
    .await;
    let blocker = fresh
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 1 },
            "executor": { "kind": "scripted",
                          "steps": [{ "action": "wait", "output": "x", "delay_ms": 60_000 }] }
        }))
        .await;
    let blocker = blocker["id"].as_str().unwrap().to_string();
    fresh
        .wait_until(&blocker, Duration::from_secs(5), |s| {
            s["status"] == "running"
        })
        .await;
    // Created on B (sealed under the new key) but queued there: A claims it.
    fake.agent(text("done\n<<WARDEN_GOAL_DONE: ok>>", 10));
    let doc = fresh.create(llm_session(&fake, OWN_KEY, 3)).await;
    let id = doc["id"].as_str().unwrap().to_string();
    assert_eq!(sealed_key_id(&pool, &id).await, key_id(&new));
    let last_error = common::eventually_ok(Duration::from_secs(10), "A to claim it", || async {
        let (status, error): (String, Option<String>) =
            sqlx::query_as("SELECT status, last_error FROM sessions WHERE id = $1::uuid")
                .bind(&id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_ne!(status, "failed", "the stale replica failed the session");
        error.ok_or_else(|| format!("still {status}, no error yet"))
    })
    .await;
    assert!(last_error.contains(&key_id(&new)), "{last_error}");
    assert!(fake.authorizations().is_empty(), "no call without the key");
    // A goes away and B gets room: B takes the session over and runs it
    // with its own key.
    stale.crash();
    let (status, body) = fresh
        .post(&format!("/api/autonomous/{blocker}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = fresh.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        fake.authorizations().last().cloned().flatten().as_deref(),
        Some(format!("Bearer {OWN_KEY}").as_str())
    );
    fresh.shutdown().await;
}

#[tokio::test]
async fn a_secret_under_a_key_no_replica_has_fails_the_session_naming_the_secret() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    let id = orphan_llm_session(&pool, &fake).await;
    // As if sealed by a key long gone (a database restored beside a lost key).
    sqlx::query("UPDATE session_secrets SET key_id = 'k0123456789ab' WHERE session_id = $1::uuid")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let second = TestApp::spawn(pool.clone()).await;
    let s = second
        .wait_until(&id, Duration::from_secs(10), |s| s["status"] == "failed")
        .await;
    assert_eq!(s["reason"], "secret_unreadable", "{s}");
    assert!(
        s["summary"].as_str().expect("summary").contains("api_key"),
        "{s}"
    );
    // The server goes on serving; a resume says why it cannot run.
    let (status, _) = second.get("/api/autonomous").await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = second
        .post(&format!("/api/autonomous/{id}/resume"), Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert_eq!(body["reason"], "secret_unreadable", "{body}");
    assert_eq!(fake.authorizations().len(), 1, "no call without the key");
}

#[tokio::test]
async fn an_executor_row_as_an_earlier_version_wrote_it_still_runs() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    fake.agent(text("working on it", 10));
    let mut first = TestApp::spawn(pool.clone()).await;
    let base_url = format!("{}?key={URL_SECRET}", fake.base_url());
    let doc = first
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "limits": { "max_iterations": 1 },
            "executor": { "kind": "llm", "base_url": base_url, "model": "m", "api_key": OWN_KEY }
        }))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    let s = first.wait_settled(&id).await;
    assert_eq!(s["status"], "stopped", "{s}");
    first.shutdown().await;
    // The row exactly as the versions that wrote the spec as untyped JSON
    // (with the sealed query's marker among its fields) left it.
    let legacy = json!({ "kind": "llm", "model": "m", "base_url": fake.base_url(),
                         "timeout_ms": null, "max_tokens_per_call": null,
                         "temperature": null, "url_query": "<sealed>" });
    sqlx::query("UPDATE sessions SET executor = $2 WHERE id = $1::uuid")
        .bind(&id)
        .bind(&legacy)
        .execute(&pool)
        .await
        .unwrap();

    let second = TestApp::spawn(pool.clone()).await;
    let (_, shown) = second.get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(shown["executor"]["kind"], "llm", "{shown}");
    assert_eq!(shown["executor"]["url"], fake.base_url(), "{shown}");
    fake.agent(text("done\n<<WARDEN_GOAL_DONE: ok>>", 10));
    let (status, body) = second
        .post(
            &format!("/api/autonomous/{id}/resume"),
            Some(json!({ "limits": { "max_iterations": 3 } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = second.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    // Its sealed query and key went back on the calls it made.
    let expected = format!("key={URL_SECRET}");
    assert_eq!(
        fake.queries().last().cloned().flatten().as_deref(),
        Some(expected.as_str())
    );
    assert_eq!(
        fake.authorizations().last().cloned().flatten().as_deref(),
        Some(format!("Bearer {OWN_KEY}").as_str())
    );
}

#[tokio::test]
async fn urls_shown_back_drop_userinfo_and_query() {
    let app = TestApp::start().await;
    // Nothing listens on port 9: every step fails, and its error is shown too.
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 2, "max_consecutive_errors": 2 },
            "executor": { "kind": "webhook",
                          "url": "http://127.0.0.1:9/step?token=tok-in-query#frag" }
        }))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    assert_eq!(doc["executor"]["url"], "http://127.0.0.1:9/step", "{doc}");
    app.wait_settled(&id).await;
    let (_, one) = app.get(&format!("/api/autonomous/{id}")).await;
    let (_, list) = app.get("/api/autonomous").await;
    let iterations = app.iterations(&id).await;
    let events = app.events(&id).await;
    for shown in [
        one.to_string(),
        list.to_string(),
        json!(iterations).to_string(),
        json!(events).to_string(),
    ] {
        assert!(
            !shown.contains("pw-in-userinfo") && !shown.contains("tok-in-query"),
            "{shown}"
        );
    }
    assert_eq!(one["executor"]["url"], "http://127.0.0.1:9/step");
}

const URL_SECRET: &str = "q-secret-in-query-91d2";

#[tokio::test]
async fn a_url_query_is_sealed_reaches_its_model_after_the_path_and_is_never_shown() {
    let fake = FakeLlm::start().await;
    fake.agent(tool_calls(
        &[(
            "write_file",
            json!({ "path": "README.md", "content": "# x" }),
        )],
        10,
    ))
    .agent(text("README.md written\n<<WARDEN_GOAL_DONE: done>>", 10));
    let app = TestApp::start().await;
    let pool = app.pool().clone();
    let base_url = format!("{}?api-version=2024&key={URL_SECRET}#frag", fake.base_url());
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "fixed",
            "limits": { "max_iterations": 10 },
            "executor": { "kind": "llm", "base_url": base_url, "model": "m", "api_key": OWN_KEY }
        }))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    // Every call went to /v1/chat/completions (the only route the fake
    // serves) with the query as given, fragment aside.
    let queries = fake.queries();
    assert!(queries.len() >= 2, "{queries:?}");
    let expected = format!("api-version=2024&key={URL_SECRET}");
    assert!(
        queries
            .iter()
            .all(|q| q.as_deref() == Some(expected.as_str())),
        "{queries:?}"
    );
    // Shown nowhere: the session, the list, events, iterations.
    let (_, one) = app.get(&format!("/api/autonomous/{id}")).await;
    let (_, list) = app.get("/api/autonomous").await;
    let iterations = app.iterations(&id).await;
    let events = app.events(&id).await;
    for shown in [
        doc.to_string(),
        one.to_string(),
        list.to_string(),
        json!(iterations).to_string(),
        json!(events).to_string(),
    ] {
        assert!(!shown.contains(URL_SECRET), "{shown}");
    }
    assert_eq!(one["executor"]["url"], fake.base_url(), "{one}");
    // Stored only sealed: not in the row (executor, its summary), events or iterations.
    for table in ["sessions", "events", "iterations", "session_secrets"] {
        assert_eq!(
            rows_containing(&pool, table, URL_SECRET).await,
            0,
            "{table}"
        );
    }
    let sealed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM session_secrets WHERE session_id = $1::uuid AND name = 'url_query'",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(sealed, 1);
    let (executor, summary): (Value, Value) =
        sqlx::query_as("SELECT executor, executor_summary FROM sessions WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(executor["base_url"], fake.base_url(), "{executor}");
    assert_eq!(executor["url_query"], "<sealed>", "{executor}");
    assert_eq!(summary["url"], fake.base_url(), "{summary}");
}

#[tokio::test]
async fn urls_carrying_credentials_are_refused_with_422() {
    let app = TestApp::start().await;
    for (executor, field, hint) in [
        (
            json!({ "kind": "llm", "base_url": "http://user:pw-userinfo@127.0.0.1:9/v1", "model": "m" }),
            "executor.base_url",
            "executor.api_key",
        ),
        (
            json!({ "kind": "webhook", "url": "http://user:pw-userinfo@127.0.0.1:9/step" }),
            "executor.url",
            "credentials",
        ),
    ] {
        let (status, problem) = app
            .post(
                "/api/autonomous",
                Some(json!({ "goal": "Create README.md with a project description", "executor": executor })),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
        let detail = crate::common::problem(&problem).detail;
        assert!(
            detail.contains(field) && detail.contains(hint) && !detail.contains("pw-userinfo"),
            "{detail}"
        );
    }
    let (_, list) = app.get("/api/autonomous").await;
    assert!(
        !list.to_string().contains("pw-userinfo"),
        "nothing was created: {list}"
    );
}

/// Builds a replica on `pool` and returns why it refused to start.
async fn refusal(pool: &PgPool, extra: &[(&str, &str)]) -> String {
    match Application::build_with_store(config_with(extra), store_on(pool.clone())).await {
        Ok(_) => panic!("the replica started"),
        Err(err) => err.to_string(),
    }
}

#[tokio::test]
async fn a_rotation_under_load_keeps_every_session_on_its_own_key_and_then_the_old_key_can_go() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    // Three sessions of six steps, each step a slow model call: they run
    // through the rotation, a crash of their replica and a rescue.
    const STEPS: u64 = 6;
    for i in 0..STEPS * 3 {
        fake.agent(
            tool_calls(
                &[(
                    "write_file",
                    json!({ "path": format!("notes-{i}.md"), "content": format!("step {i}") }),
                )],
                10,
            )
            .delayed(150),
        );
    }
    let mut old_replica = TestApp::spawn(pool.clone()).await;
    let own_keys: Vec<String> = (0..3)
        .map(|i| format!("sk-rotation-{i}-5e4d3c2b"))
        .collect();
    let mut ids = Vec::new();
    for key in &own_keys {
        let doc = old_replica.create(llm_session(&fake, key, STEPS)).await;
        ids.push(doc["id"].as_str().unwrap().to_string());
    }
    crate::common::eventually(
        Duration::from_secs(10),
        "every session calls its model",
        || async { fake.authorizations().len() >= 3 },
    )
    .await;

    // `warden secrets rotate` on the key file: a new key first, the old kept.
    let dir = std::env::temp_dir().join(format!("warden-rotation-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret.key");
    std::fs::write(&file, format!("{TEST_SECRET_KEY}\n")).unwrap();
    let (new_key, kept) = warden::secrets::rotate_key_file(&file).unwrap();
    assert_eq!(kept[0].id(), key_id(TEST_SECRET_KEY));
    let ring: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ring.len(), 2);
    let new_hex = ring[0].clone();
    // A replica with the new ring joins while the sessions run, and the old
    // one dies: the new one rescues them and re-seals in the background.
    let mut new_replica = TestApp::spawn_with(
        pool.clone(),
        config_with(&[("WARDEN_SECRET_KEYS", ring.join(",").as_str())]),
    )
    .await;
    assert_eq!(
        registered_key_id(&pool).await,
        Some(new_key.id().to_string())
    );
    let calls_before_crash = fake.authorizations().len();
    old_replica.crash();
    for id in &ids {
        let s = new_replica
            .wait_until(id, Duration::from_secs(60), |s| {
                s["status"] != "running" && s["status"] != "queued"
            })
            .await;
        assert_eq!(
            (&s["status"], &s["reason"]),
            (&json!("stopped"), &json!("max_iterations")),
            "{s}"
        );
    }
    // Every call carried one of the sessions' own keys, and every session
    // reached its model after the rotation and the rescue.
    let calls = fake.authorizations();
    let expected: Vec<String> = own_keys.iter().map(|k| format!("Bearer {k}")).collect();
    for call in &calls {
        assert!(
            call.as_ref().is_some_and(|c| expected.contains(c)),
            "a call without a session's own key: {call:?}"
        );
    }
    for key in &expected {
        assert!(
            calls[calls_before_crash..]
                .iter()
                .any(|c| c.as_deref() == Some(key.as_str())),
            "{key} did not reach the model after the rotation"
        );
    }
    // The re-seal finishes; then nothing is left under the old key.
    let store = store_on(pool.clone());
    crate::common::eventually(Duration::from_secs(20), "the re-seal finishes", || async {
        store.secret_counts().await.unwrap()
            == vec![(new_key.id().to_string(), own_keys.len() as i64)]
    })
    .await;
    assert_eq!(
        rows_containing(&pool, "session_secrets", "sk-rotation").await,
        0
    );

    // `warden secrets retire` drops the old key from the file, and a
    // replica with the new key alone starts and runs a session with its key.
    let still: Vec<String> = store
        .secret_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let dropped = warden::secrets::retire_from_key_file(&file, &still).unwrap();
    assert_eq!(dropped, vec![key_id(TEST_SECRET_KEY)]);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        new_hex.as_str()
    );
    new_replica.shutdown().await;
    fake.agent(text("done\n<<WARDEN_GOAL_DONE: ok>>", 10));
    let last = TestApp::spawn_with(
        pool.clone(),
        config_with(&[("WARDEN_SECRET_KEYS", new_hex.as_str())]),
    )
    .await;
    let doc = last.create(llm_session(&fake, OWN_KEY, 3)).await;
    let s = last.wait_settled(doc["id"].as_str().unwrap()).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(
        fake.authorizations().last().cloned().flatten().as_deref(),
        Some(format!("Bearer {OWN_KEY}").as_str())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_replica_refuses_to_start_without_a_key_the_database_needs_naming_its_id() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let fake = FakeLlm::start().await;
    let id = orphan_llm_session(&pool, &fake).await;
    let (old, new) = (key_id(TEST_SECRET_KEY), "ef".repeat(32));
    let new_id = key_id(&new);

    // As if a rotation to the new key had begun and its re-seal had not
    // finished: the old key still seals a secret and the fleet used it.
    sqlx::query("UPDATE secret_key SET key_id = $1")
        .bind(&new_id)
        .execute(&pool)
        .await
        .unwrap();
    let err = refusal(&pool, &[("WARDEN_SECRET_KEYS", new.as_str())]).await;
    assert!(
        err.contains(&format!("needs secret key {old}")) && err.contains("still sealed"),
        "{err}"
    );
    assert!(!err.contains(&new), "no key in the message: {err}");
    // With both keys it starts, and the re-seal moves the secret over.
    let ring = format!("{new},{TEST_SECRET_KEY}");
    let mut app = TestApp::spawn_with(
        pool.clone(),
        config_with(&[("WARDEN_SECRET_KEYS", ring.as_str())]),
    )
    .await;
    crate::common::eventually(
        Duration::from_secs(10),
        "the secret is sealed again",
        || async { sealed_key_id(&pool, &id).await == new_id },
    )
    .await;
    app.shutdown().await;

    // A key under the right id that does not open the check value recorded
    // for it: another key (here, the check value was swapped for one sealed
    // by a stranger under that id).
    let stranger = warden::secrets::SecretKey::parse(&"12".repeat(32)).unwrap();
    let forged = stranger.check_value().unwrap();
    sqlx::query("UPDATE secret_key_checks SET nonce = $2, ciphertext = $3 WHERE key_id = $1")
        .bind(&new_id)
        .bind(&forged.nonce)
        .bind(&forged.ciphertext)
        .execute(&pool)
        .await
        .unwrap();
    let err = refusal(&pool, &[("WARDEN_SECRET_KEYS", new.as_str())]).await;
    assert!(
        err.contains(&format!("needs secret key {new_id}")) && err.contains("key check value"),
        "{err}"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM sessions WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_ne!(status, "failed", "a refused replica fails nothing");
}

/// What `cat` run as `user` (uid, gid; `None`: as the test) reads of
/// `path`, or what it said when it could not.
#[cfg(target_os = "linux")]
fn read_as(user: Option<(u32, u32)>, path: &str) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt;
    let mut cat = std::process::Command::new("cat");
    cat.arg(path);
    if let Some((uid, gid)) = user {
        cat.uid(uid).gid(gid);
    }
    let out = cat.output().map_err(|e| format!("cat did not run: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[cfg(target_os = "linux")]
#[tokio::test]
#[ignore = "needs a Postgres server: a warden process of another user beside the test, on the test's database"]
async fn a_process_of_the_services_user_reads_neither_its_environment_nor_its_memory_map() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    common::require_server_postgres("a warden process of another user on the test's database");
    const MODEL_KEY: &str = "sk-model-key-never-readable-7c1d";
    const METRICS_TOKEN: &str = "metrics-token-never-readable-5e2a";
    let db = common::TestDb::new().await;
    // Root reads any process's files (CAP_SYS_PTRACE), dumpable or not: a
    // test running as root runs the service and the reader as another
    // user, the case of an MCP server started by the service.
    // SAFETY: getuid has no preconditions.
    let user = (unsafe { libc::getuid() } == 0).then_some((65534, 65534));
    let home = std::env::temp_dir().join(format!("warden-user-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&home).expect("folder");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mut warden = common::Warden::on(&db.pool)
        .env("WARDEN_LLM_API_KEY", MODEL_KEY)
        .env("WARDEN_METRICS_TOKEN", METRICS_TOKEN)
        .env("WARDEN_WORKSPACE_ROOT", home.join("workspaces"))
        .env("WARDEN_DATA_DIR", &home)
        .env("HOME", &home);
    if let Some((uid, gid)) = user {
        warden = warden.run_as(uid, gid);
    }
    let service = warden.serve().await;
    let pid = service.pid();

    // The same user reads what anyone may (the switch to it works) ...
    let status = read_as(user, &format!("/proc/{pid}/status")).expect("status is readable");
    assert!(String::from_utf8_lossy(&status).contains("Name:"));
    // ... but neither the environment nor the memory map.
    for file in ["environ", "maps"] {
        let path = format!("/proc/{pid}/{file}");
        let refused = match read_as(user, &path) {
            Ok(read) => panic!("{path} was readable ({} bytes)", read.len()),
            Err(refused) => refused,
        };
        assert!(refused.contains("Permission denied"), "{path}: {refused}");
        // A non-dumpable process's files are root's, whoever runs it.
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{path}");
    }

    // What root still reads there holds none of the secrets: they were
    // taken out, and their text zeroed, once read.
    if user.is_some() {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("root reads it");
        let environ = String::from_utf8_lossy(&environ);
        assert!(
            environ.contains("WARDEN_LEASE_TTL_MS=2000"),
            "the environment is read: {environ}"
        );
        let url = common::database_url(&db.pool);
        for secret in [
            "WARDEN_ADMIN_TOKEN=",
            "DATABASE_URL=",
            "WARDEN_SECRET_KEY=",
            "WARDEN_LLM_API_KEY=",
            "WARDEN_METRICS_TOKEN=",
            common::ADMIN_TOKEN,
            TEST_SECRET_KEY,
            MODEL_KEY,
            METRICS_TOKEN,
            url.as_str(),
        ] {
            assert!(!environ.contains(secret), "{secret} in {environ}");
        }
    }
    // And the service works with the secrets it read.
    let res = reqwest::Client::new()
        .get(format!("{}/api/autonomous", service.base))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
    drop(service);
    let _ = std::fs::remove_dir_all(&home);
}
