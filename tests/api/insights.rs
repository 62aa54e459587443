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

/// A client with a new key of `tenant` and `role`, and the key's public
/// prefix (who the log says acted).
async fn keyed(app: &TestApp, tenant: &str, role: &str) -> (reqwest::Client, String) {
    let key = create_key(&app.base, tenant, role).await;
    let client = client_with_key(key["secret"].as_str().expect("a secret"));
    (
        client,
        key["prefix"].as_str().expect("a prefix").to_string(),
    )
}

/// The admin token's client (a global admin).
fn global_admin() -> reqwest::Client {
    client_with_key(common::ADMIN_TOKEN)
}

async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let res = req.send().await.expect("sent");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn apply(app: &TestApp, client: &reqwest::Client, body: Value) -> (StatusCode, Value) {
    send(
        client
            .post(app.url("/api/insights/thresholds/apply"))
            .json(&body),
    )
    .await
}

async fn changes(app: &TestApp, client: &reqwest::Client, query: &str) -> (StatusCode, Value) {
    send(client.get(app.url(&format!("/api/insights/thresholds/changes{query}")))).await
}

/// A scripted create of `client`'s tenant with `limits`: its limits.
async fn created_limits(app: &TestApp, client: &reqwest::Client, limits: Value) -> Value {
    let (status, doc) = send(client.post(app.url("/api/autonomous")).json(&json!({
        "goal": "Write the release notes into NOTES.md",
        "limits": limits,
        "executor": { "kind": "scripted", "steps": steps(1, true) }
    })))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    doc["limits"].clone()
}

#[tokio::test]
async fn an_applied_iteration_limit_is_logged_with_its_replay_and_given_to_new_sessions() {
    let app = TestApp::start().await;
    ended(&app, steps(3, true), json!({ "max_iterations": 10 })).await;
    ended(&app, steps(5, true), json!({ "max_iterations": 10 })).await;
    ended(&app, steps(12, false), json!({ "max_iterations": 10 })).await;
    // Created (and settled) before the apply, without a limit of its own.
    let before = ended(&app, steps(1, true), json!({})).await;
    let before = app.session(&before).await["limits"].clone();
    let (admin, prefix) = keyed(&app, common::TEST_TENANT, "admin").await;

    // An operator may run sessions, not change its tenant's defaults.
    let (status, doc) = apply(&app, &app.client, json!({ "max_iterations": 6 })).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{doc}");
    let started = chrono::Utc::now();
    let (status, change) = apply(
        &app,
        &admin,
        json!({ "max_iterations": 6, "note": "  the report's suggestion " }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    assert_eq!(change["tenant"], common::TEST_TENANT);
    assert_eq!(change["threshold"], "max_iterations");
    assert_eq!(
        change["previous"],
        Value::Null,
        "the server's default before"
    );
    assert_eq!(change["value"], 6);
    assert_eq!(change["applied_by"], prefix.as_str(), "{change}");
    assert_eq!(change["note"], "the report's suggestion");
    let at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(change["applied_at"].clone()).expect("a time");
    assert!(at >= started - chrono::TimeDelta::seconds(5) && at <= chrono::Utc::now());
    // The justification: the four settled sessions replayed under 6; the
    // runaway ends 4 steps (40 tokens) earlier, no completion is cut short.
    let replay = &change["replay"];
    assert_eq!(replay["max_iterations"], 6, "{replay}");
    assert_eq!(replay["selection"]["rule"], "newest_settled");
    assert_eq!(count(&replay["selection"], "selected"), 4, "{replay}");
    assert_eq!(count(replay, "not_replayed"), 0, "{replay}");
    let totals = &replay["totals"];
    assert_eq!(count(totals, "sessions"), 4, "{totals}");
    assert_eq!(count(totals, "earlier"), 1, "{totals}");
    assert_eq!(count(totals, "tokens_saved"), 40, "{totals}");
    assert_eq!(count(totals, "completions_cut_short"), 0, "{totals}");
    // The log holds the same record; the report shows the value in force.
    let (status, log) = changes(&app, &app.client, "").await;
    assert_eq!(status, StatusCode::OK, "{log}");
    assert_eq!(log["items"], json!([change]));
    assert_eq!(log["next_before"], Value::Null);
    let (_, report) = app.get("/api/insights/thresholds").await;
    assert_eq!(
        report["applied"],
        json!({ "max_iterations": 6 }),
        "{report}"
    );
    // Applying what is in force changes nothing and logs nothing.
    let (status, doc) = apply(&app, &admin, json!({ "max_iterations": 6 })).await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");
    assert_eq!(doc["code"], "threshold_unchanged");

    // New sessions without their own limit get it, as a default: the
    // review point stays the server's. Their own value wins.
    let after = created_limits(&app, &app.client, json!({})).await;
    assert_eq!(after["max_iterations"], 6, "{after}");
    assert_eq!(after["review_every"], before["review_every"], "{after}");
    let own = created_limits(&app, &app.client, json!({ "max_iterations": 9 })).await;
    assert_eq!(own["max_iterations"], 9);
    // Another tenant's sessions keep the server's default.
    let (other, _) = keyed(&app, "other-tenant", "operator").await;
    let theirs = created_limits(&app, &other, json!({})).await;
    assert_eq!(theirs["max_iterations"], before["max_iterations"]);
    assert_ne!(before["max_iterations"], 6, "the default differs: {before}");
}

#[tokio::test]
async fn a_tenant_applies_and_reads_only_its_own_thresholds() {
    let app = TestApp::start().await;
    let (admin_a, _) = keyed(&app, "tenant-a", "admin").await;
    let (viewer_b, _) = keyed(&app, "tenant-b", "viewer").await;
    let (operator_b, _) = keyed(&app, "tenant-b", "operator").await;
    // A tenant's admin names only its own tenant.
    let (status, doc) = apply(
        &app,
        &admin_a,
        json!({ "tenant": "tenant-b", "max_iterations": 30 }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{doc}");
    let admin = global_admin();
    let (status, first) = apply(
        &app,
        &admin,
        json!({ "tenant": "tenant-b", "max_iterations": 30 }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["applied_by"], "admin-token");
    assert_eq!(first["tenant"], "tenant-b");
    assert_eq!(count(&first["replay"]["selection"], "selected"), 0);
    // A dry run resolves the limits the create would: with no history,
    // the estimate's figures are those limits.
    let (status, estimate) = send(operator_b.post(app.url("/api/autonomous/estimate")).json(
        &json!({
            "goal": "Write the release notes into NOTES.md",
            "executor": { "kind": "scripted", "steps": steps(1, true) }
        }),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{estimate}");
    assert_eq!(estimate["basis"], "none", "{estimate}");
    assert_eq!(
        estimate["iterations"],
        json!({ "p50": 30, "p90": 30 }),
        "{estimate}"
    );
    // Tenant a sees none of b's log, even naming b.
    for query in ["", "?tenant=tenant-b"] {
        let (status, log) = changes(&app, &admin_a, query).await;
        assert_eq!(status, StatusCode::OK, "{log}");
        assert_eq!(log["items"], json!([]), "{query}: {log}");
    }
    assert_eq!(
        created_limits(&app, &admin_a, json!({})).await["max_iterations"],
        created_limits(&app, &admin, json!({})).await["max_iterations"],
        "tenant a keeps the server's default"
    );
    assert_eq!(
        created_limits(&app, &operator_b, json!({})).await["max_iterations"],
        30
    );

    // Back to the server's default: logged, replayed under that default.
    let (status, reset) = apply(
        &app,
        &admin,
        json!({ "tenant": "tenant-b", "max_iterations": null }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reset}");
    assert_eq!(
        (&reset["previous"], &reset["value"]),
        (&json!(30), &Value::Null)
    );
    let default = created_limits(&app, &operator_b, json!({})).await["max_iterations"].clone();
    assert_ne!(default, 30);
    assert_eq!(reset["replay"]["max_iterations"], default, "{reset}");
    let (status, doc) = apply(
        &app,
        &admin,
        json!({ "tenant": "tenant-b", "max_iterations": null }),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");

    // b's viewer reads its log newest first, a page at a time; so does a
    // global admin naming b.
    let (status, page) = changes(&app, &viewer_b, "?limit=1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["items"], json!([reset]));
    let next = page["next_before"].as_i64().expect("another page");
    let (_, page) = changes(&app, &viewer_b, &format!("?limit=1&before={next}")).await;
    assert_eq!(page["items"], json!([first]));
    let (_, admin_log) = changes(&app, &admin, "?tenant=tenant-b").await;
    assert_eq!(admin_log["items"], json!([reset, first]));
    // A viewer changes nothing.
    let (status, _) = apply(&app, &viewer_b, json!({ "max_iterations": 5 })).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_apply_the_schema_forbids_is_refused_and_changes_nothing() {
    let app = TestApp::start().await;
    let admin = global_admin();
    for body in [
        json!({ "max_iterations": 0 }),
        json!({ "max_iterations": 1_000_001 }),
        json!({ "max_iterations": -3 }),
        json!({ "max_iterations": "12" }),
        json!({}),
        json!({ "note": "no value" }),
        json!({ "max_iterations": 12, "note": "x".repeat(501) }),
        json!({ "max_iterations": 12, "tenant": "not a tenant!" }),
        json!({ "max_iterations": 12, "tenant": "" }),
        json!({ "max_iterations": 12, "reason": "an unknown field" }),
    ] {
        let (status, doc) = apply(&app, &admin, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {doc}");
    }
    let (_, log) = changes(&app, &admin, "").await;
    assert_eq!(log["items"], json!([]), "{log}");
    let (status, doc) = changes(&app, &admin, "?limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{doc}");
}
