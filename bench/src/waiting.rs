//! Phase `waiting`: resident memory per waiting session with many sessions
//! on one replica (issue 45: 100,000, ≤ 40 KB each). A waiting session here
//! is a running session whose step is in flight for a long time: a scripted
//! step that takes an hour, as an agent's long tool call or model answer
//! does. Nothing iterates while the phase measures, so the host sustains
//! the count (100,000 sessions of 1-s steps would be 100,000 iterations/s);
//! what the replica still does for them is renew their leases each
//! heartbeat. The warden process's resident set is read before the creates
//! and after they settled; the difference over the sessions is the figure.
//! A sample of them is then stopped, to show a waiting session still stops
//! in milliseconds.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::{BenchResult, Options, Row, Scale, Server, ms, quantile, row, stop_session};

/// How long each session's one step waits: the scripted executor's longest.
const STEP_MS: u64 = 3_600_000;

/// Creates in flight at once.
const CREATES_IN_FLIGHT: usize = 64;

/// Sessions stopped after the measurement, each timed.
const STOPS: usize = 200;

/// A session whose one step waits [`STEP_MS`].
fn waiting_session() -> Value {
    json!({
        "goal": "Wait for the long step",
        "mode": "fixed",
        "limits": { "max_wall_time_ms": 86_400_000 },
        "executor": { "kind": "scripted", "steps": [
            { "action": "wait_for_build", "arguments": {}, "tokens": 1,
              "output": "built", "delay_ms": STEP_MS } ] }
    })
}

/// The resident set of process `pid` in bytes: all of it (`VmRSS`) and its
/// anonymous part (`RssAnon`: the heap and stacks, without the executable's
/// pages the run happened to touch).
fn resident(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}

/// Creates `n` waiting sessions, [`CREATES_IN_FLIGHT`] at a time; their ids.
async fn create_waiting(
    client: &reqwest::Client,
    base: &str,
    n: usize,
) -> BenchResult<Vec<String>> {
    let url = format!("{base}/api/autonomous");
    let body = waiting_session();
    let results: Vec<BenchResult<String>> = stream::iter(0..n)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), &body);
            async move {
                for _ in 0..super::CREATE_ATTEMPTS {
                    let res = client.post(&url).json(body).send().await?;
                    if res.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    let status = res.status();
                    let created: Value = res.json().await?;
                    if !status.is_success() || created["status"] != "running" {
                        return Err(format!("create answered {status}: {created}").into());
                    }
                    return Ok(created["id"].as_str().unwrap_or_default().to_string());
                }
                Err("create answered 503 every time".into())
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Waits (up to `within`) until `n` sessions are running with their step
/// in flight (no iteration committed, none ended); false when they are not.
async fn all_waiting(db: &PgPool, n: usize, within: Duration) -> BenchResult<bool> {
    let deadline = Instant::now() + within;
    loop {
        let (running,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM sessions WHERE status = 'running' AND iterations = 0",
        )
        .fetch_one(db)
        .await?;
        if running as usize >= n {
            return Ok(true);
        }
        if Instant::now() > deadline {
            eprintln!("warden-bench: only {running} of {n} sessions waiting");
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs the phase: `scale.waiting_sessions` sessions waiting on one replica.
pub async fn waiting_phase(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let n = scale.waiting_sessions;
    eprintln!("warden-bench: resident memory with {n} sessions waiting on one long step");
    let server = Server::start_with(opts, admin, "waiting", &[]).await?;
    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.db_url)
        .await?;
    // A few requests first, so the base includes what serving them allocates.
    create_waiting(client, &server.base, 1).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = resident(server.pid());
    let created = Instant::now();
    let mut ids = create_waiting(client, &server.base, n).await?;
    let create_rate = n as f64 / created.elapsed().as_secs_f64();
    let settled = all_waiting(&db, n + 1, Duration::from_secs(60)).await?;
    // Two heartbeats: each lease renewed with all of them held.
    tokio::time::sleep(scale.memory_settle * 2).await;
    let after = resident(server.pid());
    ids.truncate(STOPS.min(ids.len()));
    let stopped = Instant::now();
    let mut stops: Vec<Duration> = stream::iter(ids)
        .map(|id| {
            let (client, base) = (client.clone(), server.base.clone());
            async move {
                let t = Instant::now();
                stop_session(&client, &base, &id).await.then(|| t.elapsed())
            }
        })
        .buffer_unordered(8)
        .filter_map(|d| async move { d })
        .collect()
        .await;
    let stop_span = stopped.elapsed();
    db.close().await;
    server.stop(admin).await;
    Ok(rows(
        n,
        (base, after),
        create_rate,
        settled,
        (&mut stops, stop_span),
    ))
}

/// A resident-set reading: all of it and its anonymous part, in bytes.
type Resident = Option<(u64, u64)>;

/// The phase's rows: memory per session (all of it and its anonymous
/// part), the creates' rate, the stops of a sample.
fn rows(
    n: usize,
    (base, after): (Resident, Resident),
    create_rate: f64,
    settled: bool,
    (stops, stop_span): (&mut Vec<Duration>, Duration),
) -> Vec<Row> {
    let mb = |b: u64| b as f64 / 1_048_576.0;
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64 / 1024.0;
    let (figure, raw, met, anon) = match (base, after) {
        (Some((rss0, anon0)), Some((rss1, anon1))) => (
            format!("{:.1} KB", per(rss0, rss1)),
            format!("base {:.1} MB → {:.1} MB", mb(rss0), mb(rss1)),
            Some(settled && per(rss0, rss1) <= 40.0),
            format!(
                "{:.1} KB (base {:.1} MB → {:.1} MB)",
                per(anon0, anon1),
                mb(anon0),
                mb(anon1)
            ),
        ),
        _ => ("— (no /proc)".into(), "—".into(), None, "—".into()),
    };
    let stopped = stops.len();
    let p50 = quantile(stops, 0.5);
    let p99 = quantile(stops, 0.99);
    vec![
        row(
            format!("resident memory per waiting session, {n} sessions on one replica (one 1-h step in flight each)"),
            figure,
            raw,
            "—".into(),
            "≤ 40 KB",
        )
        .judged(met),
        row(
            "  of which anonymous (RssAnon)",
            anon,
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!("  creates/s while they pile up; all {n} waiting"),
            format!("{create_rate:.0}; {}", if settled { "yes" } else { "NO" }),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!("  stop → interrupted persisted p50; p99, {stopped} of them, 8 at a time"),
            format!("{}; {}", ms(p50), ms(p99)),
            format!("{:.1} s for all", stop_span.as_secs_f64()),
            "—".into(),
            "< 50 ms",
        )
        .judged(p99.map(|d| d < Duration::from_millis(50))),
    ]
}
