//! Phase `stop_workers`: how soon a worker hears that its session was
//! stopped. As many workers as the replicas phase has sessions each claim
//! one worker session's task and heartbeat it, never completing it; a
//! sample of the sessions is stopped, and each stop is timed from its
//! request to the first heartbeat answer that says `cancel`. Twice: with
//! heartbeats every [`HEARTBEAT`] (the interval the Python workers use),
//! and with one waiting heartbeat always in flight (`wait_ms`
//! [`WAITING_MS`]), which Warden answers as soon as the step is stopped.

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

/// How often each worker heartbeats its task in the plain rhythm.
const HEARTBEAT: Duration = Duration::from_millis(250);

/// The wait of each heartbeat in the waiting rhythm, ms.
const WAITING_MS: u64 = 10_000;

/// How a worker heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rhythm {
    /// Every [`HEARTBEAT`], each answered at once.
    Every,
    /// One heartbeat always in flight, each waiting up to [`WAITING_MS`].
    Waiting,
}

/// How long the workers get to claim every task.
const CLAIM_WITHIN: Duration = Duration::from_secs(60);

/// One worker: claims a task, says which session it serves, heartbeats it
/// until an answer says `cancel` (the instant it heard) or `until` passes.
async fn heartbeating_worker(
    client: reqwest::Client,
    base: String,
    claimed: mpsc::UnboundedSender<String>,
    until: Instant,
    rhythm: Rhythm,
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
    let body = match rhythm {
        Rhythm::Every => json!({ "lease_token": token }),
        Rhythm::Waiting => json!({ "lease_token": token, "wait_ms": WAITING_MS }),
    };
    let mut refused = false;
    while Instant::now() < until {
        if rhythm == Rhythm::Every {
            tokio::time::sleep(HEARTBEAT).await;
        }
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
            other => {
                if !refused {
                    let body = res.text().await.unwrap_or_default();
                    eprintln!(
                        "warden-bench: a worker's heartbeat answered {other} (told once a worker): {body}"
                    );
                    refused = true;
                }
                // Refused (a limit): back off as a worker would.
                tokio::time::sleep(HEARTBEAT).await;
            }
        }
    }
    None
}

/// The phase's rows: stop → worker told, p50 and p99, in each rhythm.
pub(super) async fn stop_workers_phase(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let n = scale.replica_sessions;
    let mut rows = Vec::new();
    for (rhythm, how) in [
        (Rhythm::Every, format!("heartbeat every {HEARTBEAT:?}")),
        (
            Rhythm::Waiting,
            format!("one heartbeat waiting ({WAITING_MS} ms) in flight"),
        ),
    ] {
        eprintln!("warden-bench: {n} workers, {how}; stops timed to the worker");
        let mut told = stops_told(opts, admin, client, scale, rhythm).await?;
        let p50 = quantile(&mut told, 0.5);
        let p99 = quantile(&mut told, 0.99);
        rows.push(row(
            format!("stop → worker told (heartbeat answer), {n} workers, {how}, p50"),
            ms(p50),
            "—".into(),
            "—".into(),
            "",
        ));
        rows.push(
            row(
                format!("stop → worker told (heartbeat answer), {n} workers, {how}, p99"),
                ms(p99),
                "—".into(),
                "—".into(),
                "< 100 ms",
            )
            .judged(p99.map(|d| d < Duration::from_millis(100))),
        );
    }
    Ok(rows)
}

/// Workers in `rhythm`, one per session; how long after each sampled stop
/// its worker heard.
async fn stops_told(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
    rhythm: Rhythm,
) -> BenchResult<Vec<Duration>> {
    let n = scale.replica_sessions;
    let server = Server::start_with(opts, admin, "stop_workers", &LIMITS).await?;
    create_sessions(client, &server.base, n, &worker_session(&json!({}))).await?;
    let until = Instant::now() + CLAIM_WITHIN + Duration::from_secs(60);
    let (tx, mut claimed) = mpsc::unbounded_channel();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..n {
        workers.spawn(heartbeating_worker(
            client.clone(),
            server.base.clone(),
            tx.clone(),
            until,
            rhythm,
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
    let sent = send_stops(client, &server.base, sessions).await;
    let told = hear_stops(&mut workers, &sent).await;
    workers.shutdown().await;
    server.stop(admin).await;
    if told.len() < sent.len() {
        eprintln!(
            "warden-bench: warning: {} of {} stopped workers never heard",
            sent.len() - told.len(),
            sent.len()
        );
    }
    Ok(told)
}

/// The bench's 1,000 workers stand for workers on as many machines, but
/// they share one address, one caller and one tenant: room for all their
/// connections (a connection each, and the stops'), their waiting
/// heartbeats and claims among the parked requests, and all request slots
/// for the one tenant (else the stops themselves are refused).
const LIMITS: [(&str, &str); 5] = [
    ("WARDEN_MAX_CONNECTIONS_PER_IP", "10000"),
    ("WARDEN_MAX_PARKED_CLAIMS", "100000"),
    ("WARDEN_TENANT_MAX_PARKED_CLAIMS", "100000"),
    ("WARDEN_KEY_MAX_PARKED_CLAIMS", "100000"),
    ("WARDEN_TENANT_REQUEST_SHARE", "100"),
];

/// Stops each of `sessions` (four at a time); when each stop was sent.
async fn send_stops(
    client: &reqwest::Client,
    base: &str,
    sessions: Vec<String>,
) -> HashMap<String, Instant> {
    // Each stop on a connection of its own: a pooled one may have sat idle
    // past the server's keep-alive read timeout (the workers' long
    // heartbeats leave many idle), and a stop sent on it is reset unsent.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_else(|_| client.clone());
    stream::iter(sessions)
        .map(|id| {
            let (client, base) = (fresh.clone(), base.to_string());
            async move {
                let t = Instant::now();
                let sent = client
                    .post(format!("{base}/api/autonomous/{id}/stop"))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .send()
                    .await;
                match sent {
                    Ok(res) if res.status().is_success() => {}
                    Ok(res) => eprintln!("warden-bench: a stop answered {}", res.status()),
                    Err(e) => eprintln!("warden-bench: a stop failed: {e:?}"),
                }
                (id, t)
            }
        })
        .buffer_unordered(4)
        .collect()
        .await
}

/// How long after its stop each stopped worker heard (the workers not
/// stopped heartbeat on: it stops waiting once every stopped one has
/// heard, or after 30 s).
async fn hear_stops(
    workers: &mut tokio::task::JoinSet<Option<(String, Instant)>>,
    sent: &HashMap<String, Instant>,
) -> Vec<Duration> {
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
    told
}
