//! Owners that die: a stop sent through a peer
//! of a killed owner answers truthfully and lands within one lease period,
//! and the survivors of a kill share its sessions. Two or three `warden`
//! processes on one database: server Postgres only.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{TestApp, Warden, distinct_steps};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A session whose steps each take a minute: it stays running until stopped.
fn long_steps() -> Value {
    json!({
        "goal": "Create README.md with a project description",
        "executor": { "kind": "scripted", "steps": distinct_steps(3, 1, 60_000) }
    })
}

async fn owned_by(app: &TestApp, id: &str) -> Option<String> {
    app.session(id).await["owner"].as_str().map(str::to_string)
}

/// Kill -9 of the owner, stop through the peer: while the owner may still
/// land it, `202` with `stop_lands_by` (never `200 running`), and the stop
/// lands by then; once the owner is silent for two heartbeats, the peer
/// lands it at once (`200 interrupted`). Both within one lease period.
#[tokio::test]
#[ignore = "needs a Postgres server: two warden processes on one database"]
async fn a_stop_through_a_peer_of_a_killed_owner_is_truthful_and_lands_within_a_lease() {
    common::require_server_postgres("two warden processes on one database");
    let db = common::TestDb::new().await;
    const TTL: Duration = Duration::from_millis(8_000);
    let env = [
        ("WARDEN_LEASE_TTL_MS", "8000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "1000"),
        ("WARDEN_STOP_WAIT_MS", "100"),
    ];
    let owner = Warden::on(&db.pool).envs(&env).serve().await;
    let peer = Warden::on(&db.pool).envs(&env).serve().await;
    let on_owner = TestApp::connect(None, owner.base.clone()).await;
    let on_peer = TestApp::connect(None, peer.base.clone()).await;
    let first = on_owner.create(long_steps()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let second = on_owner.create(long_steps()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let owner_id = owned_by(&on_owner, &first).await.expect("owned");
    assert_eq!(owned_by(&on_owner, &second).await, Some(owner_id.clone()));

    drop(owner); // SIGKILL: no checkpoint, no lease released.
    let killed = Instant::now();

    // Right after the kill the owner's heartbeat is fresh: the stop is
    // recorded and the answer says by when it lands.
    let (status, doc) = on_peer
        .post(&format!("/api/autonomous/{first}/stop"), None)
        .await;
    let lands_by = match status {
        StatusCode::ACCEPTED => {
            assert_eq!(doc["status"], "running", "{doc}");
            assert_eq!(doc["stop_requested"], true, "{doc}");
            let by = doc["stop_lands_by"].as_str().expect("stop_lands_by");
            chrono::DateTime::parse_from_rfc3339(by).expect("a time")
        }
        StatusCode::OK => {
            assert_eq!(doc["status"], "interrupted", "{doc}");
            chrono::Utc::now().into()
        }
        other => panic!("stop answered {other}: {doc}"),
    };
    let landed = on_peer
        .wait_until(&first, TTL, |s| s["status"] == "interrupted")
        .await;
    assert_eq!(landed["reason"], "user_stop", "{landed}");
    assert!(
        killed.elapsed() < TTL,
        "landed {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        chrono::Utc::now() <= lands_by + chrono::TimeDelta::seconds(1),
        "landed after the promised {lands_by}"
    );

    // Two heartbeats after the kill the owner is gone: a stop lands at once.
    while killed.elapsed() < Duration::from_millis(2_500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = Instant::now();
    let (status, doc) = on_peer
        .post(&format!("/api/autonomous/{second}/stop"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["status"], "interrupted", "{doc}");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "took {:?}",
        sent.elapsed()
    );
    assert!(killed.elapsed() < TTL, "before the lease lapsed");
}

/// Of three replicas, one is killed with 12 sessions: each survivor takes
/// its fair share of them, not one all.
#[tokio::test]
#[ignore = "needs a Postgres server: three warden processes on one database"]
async fn the_survivors_of_a_kill_share_its_sessions() {
    common::require_server_postgres("three warden processes on one database");
    let db = common::TestDb::new().await;
    let a = Warden::on(&db.pool).serve().await;
    let b = Warden::on(&db.pool).serve().await;
    let doomed = Warden::on(&db.pool).serve().await;
    let on_doomed = TestApp::connect(None, doomed.base.clone()).await;
    let on_a = TestApp::connect(None, a.base.clone()).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(
            on_doomed.create(long_steps()).await["id"]
                .as_str()
                .expect("id")
                .to_string(),
        );
    }
    let doomed_id = owned_by(&on_doomed, &ids[0]).await.expect("owned");
    drop(doomed);
    let killed = Instant::now();
    let mut owners: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        let s = on_a
            .wait_until(id, Duration::from_secs(15), |s| {
                s["status"] == "running" && s["owner"].is_string() && s["owner"] != json!(doomed_id)
            })
            .await;
        *owners
            .entry(s["owner"].as_str().expect("owner").to_string())
            .or_default() += 1;
    }
    eprintln!(
        "rescue after {:?}: {owners:?} ({} sessions)",
        killed.elapsed(),
        ids.len()
    );
    assert_eq!(owners.len(), 2, "both survivors took a share: {owners:?}");
    for (owner, n) in &owners {
        assert!(
            (4..=8).contains(n),
            "{owner} took {n} of 12, not about half: {owners:?}"
        );
    }
    drop(b);
}
