//! Tenant isolation, generated from the committed OpenAPI document: every
//! operation on a session (`{id}` in its path) is called by another
//! tenant's operator and viewer with every spelling of the victim's id that
//! a URL parser, a percent-decoder or a lenient UUID parser could take for
//! it. Each answer must be the answer for a session that does not exist,
//! and afterwards the victim's session must be exactly as it was. A new
//! route that forgets its tenant scope fails here.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{TestApp, client_with_key, create_key, valid_body};

fn committed_document() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .expect("openapi/openapi.json is committed");
    serde_json::from_str(&text).expect("JSON")
}

/// Every documented operation on one session: (method, path template).
fn session_operations(doc: &Value) -> Vec<(Method, String, bool)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        if !path.starts_with("/api/autonomous/{id}") {
            continue;
        }
        for (method, op) in item.as_object().expect("path item") {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            out.push((method, path.clone(), op.get("requestBody").is_some()));
        }
    }
    out
}

/// Every spelling of `id` (canonical, lower case) this test tries, with a
/// name for the failure message. Each is a path segment as sent on the wire.
fn spellings(id: &str) -> Vec<(String, String)> {
    let mut out = vec![
        ("canonical".to_string(), id.to_string()),
        ("upper case".to_string(), id.to_ascii_uppercase()),
        ("dashes as %2D".to_string(), id.replace('-', "%2D")),
        ("dashes as %2d".to_string(), id.replace('-', "%2d")),
        ("braced".to_string(), format!("%7B{id}%7D")),
        ("urn:uuid:".to_string(), format!("urn:uuid:{id}")),
        ("no dashes".to_string(), id.replace('-', "")),
        (
            "all percent-encoded".to_string(),
            id.bytes().map(|b| format!("%{b:02X}")).collect(),
        ),
    ];
    for (i, b) in id.bytes().enumerate() {
        let mut encoded = id[..i].to_string();
        encoded.push_str(&format!("%{b:02X}"));
        encoded.push_str(&id[i + 1..]);
        out.push((format!("character {i} percent-encoded"), encoded));
    }
    out
}

/// The paths of one operation for one spelling: the spelling in place of
/// `{id}`, plus a trailing slash and a doubled slash around it.
fn paths(template: &str, spelled: &str) -> Vec<(String, String)> {
    let path = template.replace("{id}", spelled);
    let doubled = template.replace("/{id}", &format!("//{spelled}"));
    vec![
        (String::new(), path.clone()),
        (" with a trailing slash".into(), format!("{path}/")),
        (" with a doubled slash".into(), doubled),
    ]
}

/// What the server answers: status, content type, problem code.
async fn answer(
    app: &TestApp,
    client: &reqwest::Client,
    method: &Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, String, Value) {
    let mut req = client.request(method.clone(), app.url(path));
    if let Some(body) = body {
        req = req.json(body);
    }
    crate::common::answer_of(req).await
}

/// What must not move on the victim's session.
fn fingerprint(session: &Value) -> Value {
    json!({
        "status": session["status"],
        "iterations": session["iterations"],
        "limits": session["limits"],
        "mode": session["mode"],
        "goal": session["goal"],
        "stop_requested": session["stop_requested"],
        "pause_requested": session["pause_requested"],
        "last_event_seq": session["last_event_seq"],
    })
}

#[tokio::test]
async fn no_spelling_of_an_id_reaches_another_tenants_session() {
    let app = TestApp::start().await;
    let secret = |doc: Value| doc["secret"].as_str().expect("secret").to_string();
    let victim_key = secret(create_key(&app.base, "victim", "operator").await);
    let attackers = [
        (
            "operator",
            client_with_key(&secret(create_key(&app.base, "intruder", "operator").await)),
        ),
        (
            "viewer",
            client_with_key(&secret(create_key(&app.base, "intruder", "viewer").await)),
        ),
    ];
    let victim = TestApp {
        client: client_with_key(&victim_key),
        key: victim_key.clone(),
        ..TestApp::connect(None, app.base.clone()).await
    };
    // Running, inside a step that outlasts the test: nothing moves on its own.
    let id = victim
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let before = victim.session(&id).await;
    assert_eq!(before["status"], "running", "{before}");
    let events_before = victim.events(&id).await.len();

    let doc = committed_document();
    let ops = session_operations(&doc);
    assert!(
        ops.len() >= 13,
        "the document lists the session operations: {ops:?}"
    );
    let missing = uuid::Uuid::new_v4().to_string();
    let mut checked = 0;
    for (method, template, has_body) in &ops {
        let body = valid_body(method, template);
        assert!(
            !has_body || body.is_some(),
            "{method} {template} takes a body: give it a valid one in valid_body()"
        );
        for (role, key) in &attackers {
            // The answer for a session that does not exist is the standard.
            let missing_path = template.replace("{id}", &missing);
            let (expected, ct, problem) =
                answer(&app, key, method, &missing_path, body.as_ref()).await;
            let wanted = if *role == "viewer" && *method != Method::GET {
                // A viewer may change nothing, of any session: the same 403
                // for every id, so it tells nothing either.
                StatusCode::FORBIDDEN
            } else {
                StatusCode::NOT_FOUND
            };
            assert_eq!(expected, wanted, "{method} {template} as {role}: {problem}");
            assert_eq!(ct, "application/problem+json", "{method} {template}");
            for (spelling, spelled) in spellings(&id) {
                for (shape, path) in paths(template, &spelled) {
                    let (status, ct, got) = answer(&app, key, method, &path, body.as_ref()).await;
                    let case = format!("{method} {path} ({spelling}{shape}) as the {role}");
                    assert_eq!(status, expected, "{case}: {got}");
                    assert_eq!(ct, "application/problem+json", "{case}");
                    assert_eq!(got["status"], expected.as_u16(), "{case}: {got}");
                    if shape.is_empty() {
                        // Not even the problem's code differs from a missing session's.
                        assert_eq!(got["code"], problem["code"], "{case}: {got}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1_000, "{checked} calls checked");

    // The victim's session is exactly as it was.
    let after = victim.session(&id).await;
    assert_eq!(fingerprint(&after), fingerprint(&before));
    assert_eq!(victim.events(&id).await.len(), events_before);
    // Its owner reaches it by its canonical id in either case, and by no other spelling.
    let (status, _) = victim
        .get(&format!("/api/autonomous/{}", id.to_ascii_uppercase()))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = victim
        .get(&format!("/api/autonomous/{}", id.replace('-', "%2D")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, stopped) = victim
        .post(&format!("/api/autonomous/{id}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["status"], "interrupted", "{stopped}");
}

/// The spellings of `id` that are not its one spelling.
fn other_spellings(id: &str) -> Vec<(String, String)> {
    spellings(id)
        .into_iter()
        .filter(|(name, _)| name != "canonical" && name != "upper case")
        .collect()
}

#[tokio::test]
async fn task_and_key_ids_have_one_spelling_too() {
    let app = TestApp::start().await;
    // A key: only its canonical id revokes it.
    let key = create_key(&app.base, crate::common::TEST_TENANT, "viewer").await;
    let key_id = key["id"].as_str().expect("id").to_string();
    for (spelling, spelled) in other_spellings(&key_id) {
        let req = reqwest::Client::new()
            .delete(app.url(&format!("/api/keys/{spelled}")))
            .bearer_auth(crate::common::ADMIN_TOKEN);
        let (status, _, doc) = crate::common::answer_of(req).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{spelling}: {doc}");
        assert_eq!(doc["code"], "key_not_found", "{spelling}: {doc}");
    }
    let viewer = client_with_key(key["secret"].as_str().expect("secret"));
    let res = viewer.get(app.url("/api/autonomous")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the key is not revoked");

    // A task: a worker reaches it by its canonical id only.
    let worker_doc = reqwest::Client::new()
        .post(app.url("/api/keys"))
        .bearer_auth(crate::common::ADMIN_TOKEN)
        .json(&json!({ "tenant": crate::common::TEST_TENANT, "role": "worker", "queues": ["q"] }))
        .send()
        .await
        .expect("sent")
        .json::<Value>()
        .await
        .expect("json");
    let worker = client_with_key(worker_doc["secret"].as_str().expect("secret"));
    app.create(
        json!({ "goal": "Write the notes file", "executor": { "kind": "worker", "queue": "q" } }),
    )
    .await;
    let task: Value = worker
        .post(app.url("/api/workers/claim"))
        .json(&json!({ "wait_ms": 10_000, "worker": "w" }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("a task");
    let task_id = task["task_id"].as_str().expect("task id").to_string();
    let beat = json!({ "lease_token": task["lease_token"] });
    for (spelling, spelled) in other_spellings(&task_id) {
        let req = worker
            .post(app.url(&format!("/api/workers/tasks/{spelled}/heartbeat")))
            .json(&beat);
        let (status, _, doc) = crate::common::answer_of(req).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{spelling}: {doc}");
        assert_eq!(doc["code"], "task_not_found", "{spelling}: {doc}");
    }
    let req = worker
        .post(app.url(&format!("/api/workers/tasks/{task_id}/heartbeat")))
        .json(&beat);
    let (status, _, doc) = crate::common::answer_of(req).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
}

#[tokio::test]
async fn a_childs_budget_changes_only_through_its_parents() {
    let app = TestApp::start().await;
    let parent = app
        .create(json!({
            "goal": "Build feature X and write its tests",
            "limits": { "max_tokens": 1_000, "max_iterations": 20 },
            "executor": { "kind": "scripted", "steps": [{ "action": "merge", "tokens": 1 }] },
            "subgoals": [{ "goal": "Build feature X", "budget_share": 0.333,
                           "steps": [{ "action": "build", "delay_ms": 600_000 }] }],
        }))
        .await;
    let parent_id = parent["id"].as_str().expect("id").to_string();
    let (status, tree) = app.get(&format!("/api/autonomous/{parent_id}/tree")).await;
    assert_eq!(status, StatusCode::OK, "{tree}");
    let child = tree["node"]["children"][0]["id"]
        .as_str()
        .expect("a child")
        .to_string();
    let before = app.session(&child).await;
    for limits in [
        json!({ "max_tokens": 1_000_000 }),
        json!({ "max_iterations": 200 }),
        json!({ "max_tokens": 1 }),
    ] {
        let (status, doc) = app
            .patch(
                &format!("/api/autonomous/{child}"),
                json!({ "limits": limits }),
            )
            .await;
        // Well-formed, but in conflict with what the session is: a child.
        assert_eq!(status, StatusCode::CONFLICT, "{limits}: {doc}");
        let problem = crate::common::problem(&doc);
        assert_eq!(problem.code, "carved_budget", "{doc}");
        assert!(problem.detail.contains("parent"), "{doc}");
    }
    let after = app.session(&child).await;
    assert_eq!(after["limits"], before["limits"]);
    // Its other limits are its own; the parent's budget is its parent's to change.
    let (status, doc) = app
        .patch(
            &format!("/api/autonomous/{child}"),
            json!({ "limits": { "max_consecutive_errors": 7 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    let (status, doc) = app
        .patch(
            &format!("/api/autonomous/{parent_id}"),
            json!({ "limits": { "max_tokens": 2_000 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    let (status, _) = app
        .post(&format!("/api/autonomous/{parent_id}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
}
