//! Policy replay (what-if) through `POST /api/autonomous/replay`: a changed
//! threshold over hand-built sessions reports exactly the differences a
//! table worked out by hand expects; another tenant's sessions are never
//! replayed; bad requests are refused. (The default policy reproducing
//! every end of the termination corpus is checked in `termination.rs`.)

use crate::common;

use std::time::Duration;

use common::{TestApp, client_with_key, create_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn step(i: usize, output: &str) -> Value {
    json!({ "action": format!("write_part_{i}"), "arguments": { "i": i }, "output": output, "tokens": 10 })
}

/// `n` distinct steps, the last one claiming the goal is done when `done`.
pub(crate) fn steps(n: usize, done: bool) -> Value {
    (1..=n)
        .map(|i| {
            if done && i == n {
                step(i, "all written\n<<WARDEN_GOAL_DONE: done>>")
            } else {
                step(i, &format!("wrote part {i}"))
            }
        })
        .collect()
}

/// Creates a scripted session and waits until it settles; its id.
pub(crate) async fn ended(app: &TestApp, steps: Value, limits: Value) -> String {
    let id = app.create_scripted(steps, limits).await;
    app.wait_settled(&id).await;
    id
}

async fn replay(app: &TestApp, client: &reqwest::Client, body: Value) -> (StatusCode, Value) {
    let res = client
        .post(app.url("/api/autonomous/replay"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// The replay streamed (`Accept: application/x-ndjson`): the status and
/// each line, parsed; a problem document as the only "line" of an error.
async fn replay_lines(
    app: &TestApp,
    client: &reqwest::Client,
    body: Value,
) -> (StatusCode, Vec<Value>) {
    let res = client
        .post(app.url("/api/autonomous/replay"))
        .header("accept", "application/x-ndjson")
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = res.status();
    let media = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = res.text().await.expect("the whole stream");
    if !status.is_success() {
        return (
            status,
            vec![serde_json::from_str(&text).unwrap_or(Value::Null)],
        );
    }
    assert_eq!(media, "application/x-ndjson", "{text}");
    assert!(text.ends_with('\n'), "every line ends: {text:?}");
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is JSON: {e}")))
        .collect();
    (status, lines)
}

/// A streamed replay split: its session lines and its end line (the last
/// line, and the only one that is not a session's), each without `line`.
fn split(lines: &[Value]) -> (Vec<Value>, Value) {
    let without = |l: &Value| {
        let mut l = l.clone();
        l.as_object_mut().expect("an object").remove("line");
        l
    };
    let (last, sessions) = lines.split_last().expect("at least the end line");
    assert_eq!(last["line"], "end", "the last line is the end: {lines:?}");
    for l in sessions {
        assert_eq!(l["line"], "session", "{lines:?}");
    }
    (sessions.iter().map(without).collect(), without(last))
}

fn end(doc: &Value) -> (Value, Value, Value) {
    (
        doc["status"].clone(),
        doc["reason"].clone(),
        doc["iterations"].clone(),
    )
}

#[tokio::test]
async fn a_lower_iteration_cap_reports_the_hand_computed_differences() {
    let app = TestApp::start().await;
    // Fixed mode, 10 tokens a step; each row: the session, its recorded end,
    // and by hand its end under max_iterations 6.
    let capped_10 = ended(&app, steps(12, false), json!({ "max_iterations": 10 })).await;
    let done_at_4 = ended(&app, steps(4, true), json!({ "max_iterations": 10 })).await;
    let done_at_8 = ended(&app, steps(8, true), json!({ "max_iterations": 10 })).await;
    let capped_5 = ended(&app, steps(12, false), json!({ "max_iterations": 5 })).await;
    let table = [
        // id, recorded (status, reason, iterations), replayed, change, tokens, cut short
        (
            &capped_10,
            ("stopped", "max_iterations", 10),
            (json!("stopped"), json!("max_iterations"), 6),
            "earlier",
            60,
            false,
        ),
        (
            &done_at_4,
            ("completed", "goal_achieved", 4),
            (json!("completed"), json!("goal_achieved"), 4),
            "same",
            40,
            false,
        ),
        (
            &done_at_8,
            ("completed", "goal_achieved", 8),
            (json!("stopped"), json!("max_iterations"), 6),
            "earlier",
            60,
            true,
        ),
        // A higher cap than it ran under: the record ends before the policy would.
        (
            &capped_5,
            ("stopped", "max_iterations", 5),
            (Value::Null, Value::Null, 5),
            "later",
            50,
            false,
        ),
    ];
    let ids: Vec<&String> = table.iter().map(|row| row.0).collect();
    let (status, doc) = replay(
        &app,
        &app.client,
        json!({ "session_ids": ids, "policy": { "limits": { "max_iterations": 6 } } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    let sessions = doc["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), table.len(), "{doc}");
    for (id, recorded, replayed, change, tokens, cut) in table {
        let s = sessions
            .iter()
            .find(|s| s["id"] == json!(id))
            .unwrap_or_else(|| panic!("{id} replayed: {doc}"));
        assert_eq!(
            end(&s["recorded"]),
            (json!(recorded.0), json!(recorded.1), json!(recorded.2)),
            "{s}"
        );
        assert_eq!(s["reproduced"], true, "{s}");
        assert_eq!(
            end(&s["replayed"]),
            (replayed.0, replayed.1, json!(replayed.2)),
            "{s}"
        );
        assert_eq!(s["change"], change, "{s}");
        assert_eq!(s["counterfactual_tokens"], tokens, "{s}");
        assert_eq!(s["cut_short"], cut, "{s}");
    }
    let by = |id: &String| {
        sessions
            .iter()
            .find(|s| s["id"] == json!(id))
            .expect("there")
    };
    // The first decision taken differently: the gate let step 7 run, the cap ends it.
    assert_eq!(
        by(&capped_10)["divergence"],
        json!({ "iteration": 6, "old": { "kind": "gate", "decision": "continue" },
                "new": { "kind": "end", "status": "stopped", "reason": "max_iterations" } })
    );
    assert_eq!(by(&done_at_4)["divergence"], Value::Null);
    assert_eq!(by(&capped_5)["replayed"]["ended_by"], "beyond_record");
    let t = &doc["totals"];
    assert_eq!(
        (
            &t["sessions"],
            &t["reproduced"],
            &t["earlier"],
            &t["later"],
            &t["same"]
        ),
        (&json!(4), &json!(4), &json!(2), &json!(1), &json!(1)),
        "{t}"
    );
    assert_eq!(
        (&t["tokens_saved"], &t["tokens_added"]),
        (&json!(60), &json!(0)),
        "{t}"
    );
    assert_eq!(t["completions_cut_short"], 1, "{t}");

    // The same sessions through the list's filter: the newest completed ones.
    let (status, doc) = replay(
        &app,
        &app.client,
        json!({ "filter": { "status": "completed", "limit": 10 }, "policy": { "limits": { "max_iterations": 6 } } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["totals"]["sessions"], 2, "{doc}");
    assert_eq!(doc["totals"]["completions_cut_short"], 1, "{doc}");
}

#[tokio::test]
async fn another_tenants_sessions_are_not_replayed() {
    let app = TestApp::start().await;
    let secret = |doc: Value| doc["secret"].as_str().expect("secret").to_string();
    let victim = client_with_key(&secret(create_key(&app.base, "victim", "operator").await));
    let intruder = client_with_key(&secret(create_key(&app.base, "intruder", "operator").await));
    let res = victim
        .post(app.url("/api/autonomous"))
        .json(
            &json!({ "goal": "Create README.md with a project description",
                       "limits": { "max_iterations": 3 },
                       "executor": { "kind": "scripted", "steps": steps(5, false) } }),
        )
        .send()
        .await
        .expect("sent");
    let id = res.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    common::eventually(Duration::from_secs(20), "the victim's session ends", || {
        let (victim, url) = (victim.clone(), app.url(&format!("/api/autonomous/{id}")));
        async move {
            let s: Value = victim
                .get(url)
                .send()
                .await
                .expect("sent")
                .json()
                .await
                .expect("json");
            s["status"] == "stopped"
        }
    })
    .await;
    let body = json!({ "session_ids": [id] });
    let (status, doc) = replay(&app, &intruder, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(
        doc["sessions"],
        json!([]),
        "nothing of another tenant's: {doc}"
    );
    assert_eq!(
        doc["not_replayed"],
        json!([{ "id": id, "why": "not_found" }])
    );
    // As a missing id reads.
    let missing = uuid::Uuid::new_v4();
    let (_, doc) = replay(&app, &intruder, json!({ "session_ids": [missing] })).await;
    assert_eq!(
        doc["not_replayed"],
        json!([{ "id": missing, "why": "not_found" }])
    );
    // Nor through a filter.
    let (_, doc) = replay(&app, &intruder, json!({ "filter": {} })).await;
    assert_eq!(doc["totals"]["sessions"], 0, "{doc}");
    // Streamed, the same: nothing of another tenant's, by id or filter.
    let (status, lines) = replay_lines(&app, &intruder, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{lines:?}");
    let (sessions, end) = split(&lines);
    assert!(sessions.is_empty(), "{lines:?}");
    assert_eq!(
        end["not_replayed"],
        json!([{ "id": id, "why": "not_found" }])
    );
    let (_, lines) = replay_lines(&app, &intruder, json!({ "filter": {} })).await;
    let (sessions, end) = split(&lines);
    assert!(sessions.is_empty(), "{lines:?}");
    assert_eq!(end["totals"]["sessions"], 0, "{end}");
    // And no stream without a key.
    let (status, _) = replay_lines(&app, &reqwest::Client::new(), body.clone()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Its own tenant replays it, whole or streamed.
    let (status, doc) = replay(&app, &victim, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["sessions"][0]["reproduced"], true, "{doc}");
    let (_, lines) = replay_lines(&app, &victim, body).await;
    let (sessions, _) = split(&lines);
    assert_eq!(json!(sessions), doc["sessions"]);
}

#[tokio::test]
async fn running_sessions_and_bad_requests_are_refused_clearly() {
    let app = TestApp::start().await;
    let running = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let (status, doc) = replay(&app, &app.client, json!({ "session_ids": [running] })).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(
        doc["not_replayed"],
        json!([{ "id": running, "why": "not_ended" }])
    );
    let too_many: Vec<uuid::Uuid> = (0..1_001).map(|_| uuid::Uuid::new_v4()).collect();
    for (body, says) in [
        (json!({}), "exactly one of session_ids and filter"),
        (json!({ "session_ids": [], "filter": {} }), "exactly one"),
        (json!({ "session_ids": [] }), "1 to 1000"),
        (json!({ "session_ids": too_many }), "1 to 1000"),
        (json!({ "filter": { "limit": 0 } }), "filter.limit"),
        (json!({ "filter": {}, "deadline_ms": 1 }), "deadline_ms"),
        (
            json!({ "filter": {}, "policy": { "gate": { "rework_max": 2.0 } } }),
            "rework_max",
        ),
        (
            json!({ "filter": {}, "policy": { "limits": { "max_iterations": 0 } } }),
            "max_iterations",
        ),
        (json!({ "filter": {}, "policy": { "gates": {} } }), "gates"),
    ] {
        let (status, doc) = replay(&app, &app.client, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {doc}");
        assert!(
            doc["detail"].as_str().unwrap_or("").contains(says),
            "{body}: {doc}"
        );
    }
}

#[tokio::test]
async fn a_streamed_replay_has_the_json_answers_sessions_and_totals() {
    let app = TestApp::start().await;
    let capped = ended(&app, steps(12, false), json!({ "max_iterations": 10 })).await;
    let done = ended(&app, steps(8, true), json!({ "max_iterations": 10 })).await;
    let early = ended(&app, steps(3, true), json!({})).await;
    let running = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 600_000 }]), json!({}))
        .await;
    let missing = uuid::Uuid::new_v4().to_string();
    let body = json!({
        "session_ids": [capped, missing, done, running, early],
        "policy": { "limits": { "max_iterations": 6 } }
    });
    let (status, whole) = replay(&app, &app.client, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let (status, lines) = replay_lines(&app, &app.client, body).await;
    assert_eq!(status, StatusCode::OK, "{lines:?}");
    let (sessions, end) = split(&lines);
    // Line for line what the JSON answer holds, in the same order.
    assert_eq!(json!(sessions), whole["sessions"]);
    assert_eq!(sessions.len(), 3, "{whole}");
    assert_eq!(end["totals"], whole["totals"]);
    assert_eq!(end["not_replayed"], whole["not_replayed"]);
    assert_eq!(
        end["not_replayed"],
        json!([{ "id": missing, "why": "not_found" }, { "id": running, "why": "not_ended" }])
    );
    assert_eq!(end["totals"]["earlier"], 2, "{end}");
    assert!(end["took_ms"].is_u64(), "{end}");
    // Through a filter too.
    let body = json!({ "filter": { "status": "completed" }, "policy": { "limits": { "max_iterations": 6 } } });
    let (_, whole) = replay(&app, &app.client, body.clone()).await;
    let (_, lines) = replay_lines(&app, &app.client, body).await;
    let (sessions, end) = split(&lines);
    assert_eq!(json!(sessions), whole["sessions"]);
    assert_eq!(end["totals"], whole["totals"]);
    assert_eq!(end["totals"]["sessions"], 2, "{end}");
    // A bad request is refused before the stream starts, as without it.
    let (status, lines) =
        replay_lines(&app, &app.client, json!({ "filter": {}, "deadline_ms": 1 })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{lines:?}");
    assert!(
        lines[0]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("deadline_ms"),
        "{lines:?}"
    );
}

#[tokio::test]
#[ignore = "needs a Postgres server: the replay is seen waiting on the lock through a second connection (the embedded store has one)"]
async fn a_short_deadline_ends_the_stream_naming_the_unread() {
    let app = TestApp::start().await;
    let a = ended(&app, steps(2, true), json!({})).await;
    let b = ended(&app, steps(3, true), json!({})).await;
    // The replay's read of the sessions' reflections waits on this lock
    // until well after its deadline: none of them is replayed in time.
    let mut lock = app.pool().begin().await.expect("a transaction");
    sqlx::query("LOCK TABLE reflections IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("locked");
    let deadline_ms = 100;
    let streamed = {
        let (client, url) = (app.client.clone(), app.url("/api/autonomous/replay"));
        let body = json!({ "session_ids": [a, b], "deadline_ms": deadline_ms });
        tokio::spawn(async move {
            let res = client
                .post(url)
                .header("accept", "application/x-ndjson")
                .json(&body)
                .send()
                .await
                .expect("sent");
            (res.status(), res.text().await.expect("the whole stream"))
        })
    };
    let pool = app.pool().clone();
    common::eventually(
        Duration::from_secs(20),
        "the replay waits on the lock",
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%FROM reflections r JOIN sessions s%'",
                )
                .fetch_one(&pool)
                .await
                .is_ok_and(|n| n > 0)
            }
        },
    )
    .await;
    // It began before it waited: past this, its deadline has passed.
    tokio::time::sleep(Duration::from_millis(2 * deadline_ms)).await;
    lock.commit().await.expect("released");
    let (status, text) = streamed.await.expect("joined");
    assert_eq!(status, StatusCode::OK, "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let (sessions, end) = split(&lines);
    assert_eq!(sessions, Vec::<Value>::new(), "none replayed in time");
    assert_eq!(
        end["not_replayed"],
        json!([{ "id": a, "why": "deadline" }, { "id": b, "why": "deadline" }])
    );
    assert_eq!(end["totals"]["sessions"], 0, "{end}");
    assert!(end["took_ms"].as_u64().unwrap_or(0) >= deadline_ms, "{end}");
    // Without the lock the same request replays both.
    let body = json!({ "session_ids": [a, b], "deadline_ms": 10_000 });
    let (_, lines) = replay_lines(&app, &app.client, body).await;
    let (sessions, end) = split(&lines);
    assert_eq!(sessions.len(), 2, "{lines:?}");
    assert_eq!(end["not_replayed"], json!([]));
}
