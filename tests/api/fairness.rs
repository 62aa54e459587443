//! Fair share in the queue: free places go to the waiting
//! tenants by weight against what each already runs, oldest first inside a
//! tenant, and a tenant at its running cap waits; queue places count per
//! tenant.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{
    self, ADMIN_TOKEN, TestApp, client_with_key, config_with, create_key, distinct_steps, store_on,
};

/// A session whose steps each take a minute: it runs until stopped.
fn long_steps() -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "scripted", "steps": distinct_steps(3, 1, 60_000) }
    })
}

/// A tenant's client: an operator key of its own.
async fn tenant_client(app: &TestApp, tenant: &str) -> reqwest::Client {
    let key = create_key(&app.base, tenant, "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    client_with_key(&key)
}

async fn create_as(app: &TestApp, client: &reqwest::Client) -> Value {
    let res = client
        .post(app.url("/api/autonomous"))
        .json(&long_steps())
        .send()
        .await
        .expect("sent");
    let status = res.status();
    let doc: Value = res.json().await.expect("json");
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    doc
}

fn id_of(doc: &Value) -> String {
    doc["id"].as_str().expect("id").to_string()
}

/// A session as the global admin sees it (any tenant's).
async fn admin_session(app: &TestApp, id: &str) -> Value {
    let res = app.admin_get(&format!("/api/autonomous/{id}")).await;
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.expect("json")
}

/// Every queued session a list shows to `client` (the admin's key when
/// `None`), paged `limit` at a time, as (id, place, tenants waiting).
async fn queued_list(
    app: &TestApp,
    client: Option<&reqwest::Client>,
    limit: usize,
) -> Vec<(String, Value, Value)> {
    let admin = client_with_key(ADMIN_TOKEN);
    let client = client.unwrap_or(&admin);
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/autonomous?status=queued&limit={limit}&cursor={c}"),
            None => format!("/api/autonomous?status=queued&limit={limit}"),
        };
        let res = client.get(app.url(&path)).send().await.expect("sent");
        assert_eq!(res.status(), StatusCode::OK);
        let page: Value = res.json().await.expect("json");
        for s in page["items"].as_array().expect("items") {
            let id = s["id"].as_str().expect("id").to_string();
            out.push((id, s["queue_position"].clone(), s["queue_tenants"].clone()));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

async fn wait_running(app: &TestApp, id: &str) {
    common::eventually(Duration::from_secs(20), "the session starts", || async {
        admin_session(app, id).await["status"] == "running"
    })
    .await;
}

async fn stop(app: &TestApp, id: &str) {
    let res = reqwest::Client::new()
        .post(app.url(&format!("/api/autonomous/{id}/stop")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn freed_places_go_to_the_tenants_that_run_least_for_their_weight_within_their_caps() {
    let app = TestApp::start_with(config_with(&[("WARDEN_MAX_RUNNING", "4")])).await;
    let pool = app.pool().clone();
    // C weighs three times as much but may run one session at a time.
    store_on(pool.clone())
        .set_tenant_settings("tenant-c", 3, Some(1))
        .await
        .expect("settings stored");
    let (a, b, c) = (
        tenant_client(&app, "tenant-a").await,
        tenant_client(&app, "tenant-b").await,
        tenant_client(&app, "tenant-c").await,
    );
    // A fills every place and queues five more before B and C queue two each.
    let mut a_running = Vec::new();
    for _ in 0..4 {
        let doc = create_as(&app, &a).await;
        assert_eq!(doc["status"], "running", "{doc}");
        a_running.push(id_of(&doc));
    }
    let mut a_queued = Vec::new();
    for _ in 0..5 {
        a_queued.push(id_of(&create_as(&app, &a).await));
    }
    let b_queued = [
        id_of(&create_as(&app, &b).await),
        id_of(&create_as(&app, &b).await),
    ];
    let c_queued = [
        id_of(&create_as(&app, &c).await),
        id_of(&create_as(&app, &c).await),
    ];
    // Places count per tenant; three tenants share the queue.
    for (ids, name) in [
        (&a_queued[..], "A"),
        (&b_queued[..], "B"),
        (&c_queued[..], "C"),
    ] {
        for (i, id) in ids.iter().enumerate() {
            let s = admin_session(&app, id).await;
            assert_eq!(s["status"], "queued", "{name} {i}: {s}");
            assert_eq!(s["queue_position"], json!(i + 1), "{name} {i}: {s}");
            assert_eq!(s["queue_tenants"], json!(3), "{name} {i}: {s}");
        }
    }
    // A list gives each queued row the place a read of it gives (the list
    // computes the page's places in one statement), on every page, for the
    // tenant's key and across tenants for the admin's.
    let a_listed = queued_list(&app, Some(&a), 2).await;
    let mut a_places: Vec<(String, Value, Value)> = a_queued
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), json!(i + 1), json!(3)))
        .collect();
    a_places.reverse();
    assert_eq!(a_listed, a_places, "A's queue, newest first");
    let everyone = queued_list(&app, None, 3).await;
    assert_eq!(everyone.len(), 9, "{everyone:?}");
    for (id, place, tenants) in &everyone {
        let s = admin_session(&app, id).await;
        assert_eq!(
            (place, tenants),
            (&s["queue_position"], &s["queue_tenants"]),
            "{s}"
        );
    }

    // A runs 3, B and C none: B, the older of the two, gets the place,
    // not A's older queued sessions.
    stop(&app, &a_running[0]).await;
    wait_running(&app, &b_queued[0]).await;
    // A runs 2, B 1, C 0: C.
    stop(&app, &a_running[1]).await;
    wait_running(&app, &c_queued[0]).await;
    // A runs 1, B 1, C 1 of weight 3 (the lowest share) but at its cap:
    // the tie between A and B goes to A, whose session waited longest.
    stop(&app, &a_running[2]).await;
    wait_running(&app, &a_queued[0]).await;
    for id in [&b_queued[1], &c_queued[1], &a_queued[1]] {
        let s = admin_session(&app, id).await;
        assert_eq!(s["status"], "queued", "{s}");
        assert_eq!(s["queue_position"], json!(1), "each tenant's next: {s}");
    }
    let a_next = admin_session(&app, &a_queued[4]).await;
    assert_eq!(
        a_next["queue_position"],
        json!(4),
        "A's places moved up: {a_next}"
    );

    // When C's session ends, C is below its cap and runs least for its
    // weight again: its next session takes the place.
    stop(&app, &c_queued[0]).await;
    wait_running(&app, &c_queued[1]).await;
}

#[tokio::test]
async fn a_tenant_at_its_running_cap_queues_though_places_are_free() {
    let app = TestApp::start_with(config_with(&[("WARDEN_MAX_RUNNING", "4")])).await;
    let pool = app.pool().clone();
    store_on(pool.clone())
        .set_tenant_settings("tenant-d", 1, Some(1))
        .await
        .expect("settings stored");
    let d = tenant_client(&app, "tenant-d").await;
    let first = create_as(&app, &d).await;
    assert_eq!(first["status"], "running", "{first}");
    let second = create_as(&app, &d).await;
    assert_eq!(
        (
            &second["status"],
            &second["queue_position"],
            &second["queue_tenants"]
        ),
        (&json!("queued"), &json!(1), &json!(1)),
        "{second}"
    );
    // Another tenant is not held back by D's cap.
    let e = tenant_client(&app, "tenant-e").await;
    let other = create_as(&app, &e).await;
    wait_running(&app, &id_of(&other)).await;
    // D's session ends: its next one takes the place.
    stop(&app, &id_of(&first)).await;
    wait_running(&app, &id_of(&second)).await;
}
