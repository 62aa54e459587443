//! Phase `stop_workers`: how soon a worker hears that its session was
//! stopped. As many workers as the replicas phase has sessions each claim
//! one worker session's task and heartbeat it every [`HEARTBEAT`] (the
//! interval the Python workers use), never completing it; a sample of the
//! sessions is stopped, and each stop is timed from its request to the
//! first heartbeat answer that says `cancel`. Measures the protocol as it
//! is; it does not change it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use tokio::sync::mpsc;

use super::{
    BENCH_QUEUE, BenchResult, Options, Row, Scale, Server, create_sessions, ms, quantile, row,
    worker_session,
};

/// How often each worker heartbeats its task.
const HEARTBEAT: Duration = Duration::from_millis(250);

/// How long the workers get to claim every task.
const CLAIM_WITHIN: Duration = Duration::from_secs(60);

/// One worker: claims a task, says which session it serves, heartbeats it
/// until an answer says `cancel` (the instant it heard) or `until` passes.
async fn heartbeating_worker(
    client: reqwest::Client,
    base: String,
    claimed: mpsc::UnboundedSender<String>,
    until: Instant,
) -> Option<(String, Instant)> {
    let (task, token, session) = loop {
        if Instant::now() > until {
            return None;
        }
        let answer = client
            .post(format!("{base}/api/workers/claim"))
            .json(&json!({ "queues": [BENCH_QUEUE], "wait_ms": 1_000 }))
            .send()
            .await;
        let Ok(res) = answer else { continue };
        if res.status() != reqwest::StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let Ok(doc) = res.json::<Value>().await else {
            continue;
        };
        if let (Some(t), Some(l), Some(s)) = (
            doc["task_id"].as_str(),
            doc["lease_token"].as_str(),
            doc["session_id"].as_str(),
        ) {
            break (t.to_string(), l.to_string(), s.to_string());
        }
    };
    let _ = claimed.send(session.clone());
    let body = json!({ "lease_token": token });
    while Instant::now() < until {
        tokio::time::sleep(HEARTBEAT).await;
        let answer = client
            .post(format!("{base}/api/workers/tasks/{task}/heartbeat"))
            .json(&body)
            .send()
            .await;
        let Ok(res) = answer else { continue };
        let heard = Instant::now();
        match res.status() {
            reqwest::StatusCode::OK => {
                let doc: Value = res.json().await.unwrap_or_default();
                if doc["cancel"] == true {
                    return Some((session, heard));
                }
            }
            // The lease is gone: the task ended, which a stop also does.
            reqwest::StatusCode::CONFLICT => return Some((session, heard)),
            _ => {}
        }
    }
    None
}

/// The phase's rows: stop → worker told, p50 and p99.
pub(super) async fn stop_workers_phase(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let n = scale.replica_sessions;
    eprintln!(
        "warden-bench: {n} workers heartbeating every {HEARTBEAT:?}; stops timed to the worker"
    );
    let server = Server::start(opts, admin, "stop_workers").await?;
    create_sessions(client, &server.base, n, &worker_session()).await?;
    let until = Instant::now() + CLAIM_WITHIN + Duration::from_secs(60);
    let (tx, mut claimed) = mpsc::unbounded_channel();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..n {
        workers.spawn(heartbeating_worker(
            client.clone(),
            server.base.clone(),
            tx.clone(),
            until,
        ));
    }
    drop(tx);
    let mut sessions = Vec::with_capacity(n);
    let deadline = Instant::now() + CLAIM_WITHIN;
    while sessions.len() < n {
        match tokio::time::timeout_at(deadline.into(), claimed.recv()).await {
            Ok(Some(session)) => sessions.push(session),
            _ => break,
        }
    }
    if sessions.len() < n {
        eprintln!(
            "warden-bench: warning: only {} of {n} tasks were claimed",
            sessions.len()
        );
    }
    // Every worker in its heartbeat rhythm before the first stop.
    tokio::time::sleep(HEARTBEAT * 4).await;
    sessions.truncate(scale.replica_stops);
    let base = server.base.clone();
    let sent: HashMap<String, Instant> = stream::iter(sessions)
        .map(|id| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let t = Instant::now();
                let _ = client
                    .post(format!("{base}/api/autonomous/{id}/stop"))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .send()
                    .await;
                (id, t)
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    // The workers not stopped heartbeat on: stop waiting once every
    // stopped one has heard, or after a while.
    let mut told = Vec::with_capacity(sent.len());
    let heard_by = Instant::now() + Duration::from_secs(30);
    while told.len() < sent.len() {
        match tokio::time::timeout_at(heard_by.into(), workers.join_next()).await {
            Ok(Some(Ok(Some((session, heard))))) => {
                if let Some(t) = sent.get(&session) {
                    told.push(heard.saturating_duration_since(*t));
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    workers.shutdown().await;
    server.stop(admin).await;
    if told.len() < sent.len() {
        eprintln!(
            "warden-bench: warning: {} of {} stopped workers never heard",
            sent.len() - told.len(),
            sent.len()
        );
    }
    let p50 = quantile(&mut told, 0.5);
    let p99 = quantile(&mut told, 0.99);
    Ok(vec![
        row(
            format!(
                "stop → worker told (heartbeat answer), {n} workers, heartbeat {HEARTBEAT:?}, p50"
            ),
            ms(p50),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!(
                "stop → worker told (heartbeat answer), {n} workers, heartbeat {HEARTBEAT:?}, p99"
            ),
            ms(p99),
            "—".into(),
            "—".into(),
            "< 100 ms",
        )
        .judged(p99.map(|d| d < Duration::from_millis(100))),
    ])
}
