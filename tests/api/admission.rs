//! One tenant cannot take what every tenant shares: worker claims that wait
//! park in a pool of their own, capped per key and per tenant (429 with
//! `Retry-After` beyond); a tenant's requests hold at most its share of the
//! request slots; a body must arrive within `WARDEN_BODY_READ_TIMEOUT_MS`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{self, ADMIN_TOKEN, TestApp, client_with_key, config_with, create_key};

/// A worker key of `tenant` on queue `jobs`; returns its secret.
async fn worker_key(app: &TestApp, tenant: &str) -> String {
    let res = reqwest::Client::new()
        .post(app.url("/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": tenant, "role": "worker", "queues": ["jobs"] }))
        .send()
        .await
        .expect("sent");
    let status = res.status();
    let doc: Value = res.json().await.expect("json");
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    doc["secret"].as_str().expect("secret").to_string()
}

async fn operator_key(app: &TestApp, tenant: &str) -> String {
    create_key(&app.base, tenant, "operator").await["secret"]
        .as_str()
        .expect("secret")
        .to_string()
}

/// What a claim answered: its status, `Retry-After` and problem code.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    content_type: String,
    code: Value,
}

async fn answer(res: reqwest::Response) -> Answer {
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (retry_after, content_type) = (header("retry-after"), header("content-type"));
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        retry_after,
        content_type: content_type.unwrap_or_default(),
        code: body["code"].clone(),
    }
}

/// A claim that waits a minute for a task on an empty queue.
async fn parked_claim(base: String, key: String) -> Answer {
    let res = client_with_key(&key)
        .post(format!("{base}/api/workers/claim"))
        .json(&json!({ "wait_ms": 60_000 }))
        .send()
        .await
        .expect("sent");
    answer(res).await
}

/// The request line and headers of a create whose body will come slowly.
fn slow_create_head(key: &str, length: usize) -> String {
    format!(
        "POST /api/autonomous HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\
Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
    )
}

/// Sends a create's headers, then its body a byte every 250 ms, until the
/// server answers; returns the answer's status line (or what went wrong).
async fn trickled_create(addr: std::net::SocketAddr, key: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connected");
    stream
        .write_all(slow_create_head(key, 1_000).as_bytes())
        .await
        .expect("headers written");
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let mut answer = vec![0u8; 1_024];
    let read = tokio::time::timeout(Duration::from_secs(30), reader.read(&mut answer)).await;
    trickle.abort();
    match read {
        Ok(Ok(n)) => String::from_utf8_lossy(&answer[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Ok(Err(e)) => format!("read failed: {e}"),
        Err(_) => "no answer in 30 s".into(),
    }
}

/// The 99th percentile of `samples`.
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    let at = (samples.len() * 99).div_ceil(100).max(1) - 1;
    samples[at]
}

/// `n` lists of `client`'s sessions one after the other: each one's
/// latency, and the statuses that were not 200.
async fn timed_lists(
    app: &TestApp,
    client: &reqwest::Client,
    n: usize,
) -> (Vec<Duration>, Vec<StatusCode>) {
    let mut latencies = Vec::with_capacity(n);
    let mut failed = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let res = client
            .get(app.url("/api/autonomous?limit=20"))
            .send()
            .await
            .expect("sent");
        let status = res.status();
        let _ = res.bytes().await.expect("body read");
        latencies.push(started.elapsed());
        if status != StatusCode::OK {
            failed.push(status);
        }
    }
    (latencies, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_parking_claims_and_flooding_leaves_another_tenants_lists_as_fast() {
    let app = TestApp::start_with(config_with(&[
        // Fewer slots than the claims tenant A parks: without a pool of
        // their own, A's claims would take every one. (More than A
        // sends at once, 40: the slot is taken before the caller is
        // known, so a burst beyond them would be shed for everyone.)
        ("WARDEN_MAX_CONCURRENT_REQUESTS", "50"),
        // 8 % of 50: A's requests hold 4 slots at most.
        ("WARDEN_TENANT_REQUEST_SHARE", "8"),
        ("WARDEN_KEY_MAX_PARKED_CLAIMS", "4"),
        ("WARDEN_TENANT_MAX_PARKED_CLAIMS", "6"),
        ("WARDEN_MAX_PARKED_CLAIMS", "20"),
        ("WARDEN_BODY_READ_TIMEOUT_MS", "1000"),
    ]))
    .await;
    let addr = app.app.as_ref().expect("server").addr();
    // Tenant B lists its few sessions.
    let b = client_with_key(&operator_key(&app, "tenant-b").await);
    for _ in 0..3 {
        let res = b
            .post(app.url("/api/autonomous"))
            .json(&json!({
                "goal": "Create README.md with a project description",
                "executor": { "kind": "scripted", "steps": [{ "action": "write", "output": "done" }] },
                "limits": { "max_iterations": 1 }
            }))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    // Warmed up (connections, caches).
    let (_, failed) = timed_lists(&app, &b, 50).await;
    assert!(failed.is_empty(), "unloaded: {failed:?}");

    // Tenant A parks 60 claims a minute long from two worker keys, more
    // than there are request slots.
    let a_workers = [
        worker_key(&app, "tenant-a").await,
        worker_key(&app, "tenant-a").await,
    ];
    // One after the other: a claim not answered within half a second waits.
    let mut refused = Vec::new();
    let mut parked = Vec::new();
    for i in 0..60 {
        let mut claim = tokio::spawn(parked_claim(app.base.clone(), a_workers[i % 2].clone()));
        match tokio::time::timeout(Duration::from_millis(500), &mut claim).await {
            Ok(answer) => refused.push(answer.expect("claim task")),
            Err(_) => parked.push(claim),
        }
    }
    assert_eq!(
        parked.len(),
        6,
        "WARDEN_TENANT_MAX_PARKED_CLAIMS wait: {refused:?}"
    );
    for answer in &refused {
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
        assert_eq!(answer.code, "claim_limit", "{answer:?}");
        assert_eq!(answer.content_type, "application/problem+json");
        assert!(
            answer
                .retry_after
                .as_deref()
                .is_some_and(|s| s.parse::<u32>().is_ok_and(|s| s >= 1)),
            "{answer:?}"
        );
    }

    // A floods, in short rounds with pauses between them (A then sends
    // nothing new; its parked claims stay): B's lists are timed in both,
    // so the machine's own noise (other tests, other processes) falls on
    // both alike. A slowdown A causes shows in every measurement; the
    // machine's noise seldom in three in a row.
    let flood = Flood::start(addr, operator_key(&app, "tenant-a").await);
    let mut measured = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..3 {
        let (mut unloaded, mut loaded) = (Vec::new(), Vec::new());
        for _ in 0..8 {
            flood.pause().await;
            let (samples, refused) = timed_lists(&app, &b, 75).await;
            unloaded.extend(samples);
            failed.extend(refused);
            flood.resume().await;
            let (samples, refused) = timed_lists(&app, &b, 75).await;
            loaded.extend(samples);
            failed.extend(refused);
        }
        let (unloaded_p99, loaded_p99) = (p99(&mut unloaded), p99(&mut loaded));
        measured.push((unloaded_p99, loaded_p99));
        if loaded_p99 <= unloaded_p99 * 2 {
            break;
        }
    }
    let counts = flood.stop().await;
    for claim in parked {
        claim.abort();
    }
    eprintln!("B's list p99 (with A idle, while A flooded): {measured:?}; A had {counts}");
    assert!(failed.is_empty(), "B was refused: {failed:?}");
    assert!(
        counts.timed_out > 0,
        "A's trickled bodies were cut off: {counts}"
    );
    assert!(counts.other.is_empty(), "A was answered {:?}", counts.other);
    assert!(
        measured
            .iter()
            .any(|(unloaded, loaded)| *loaded <= *unloaded * 2),
        "B's list p99 went to more than twice its unloaded p99: {measured:?}"
    );
}

/// Tenant A's flood: 40 creates at a time whose bodies trickle in (each
/// holds a slot until WARDEN_BODY_READ_TIMEOUT_MS), each sent again once
/// answered; refusals wait as `Retry-After` says. (What the shares isolate
/// is slots: refusals sent again at once would cost the replica CPU, and
/// requests served within A's share database time, that no share of slots
/// gives back.)
struct Flood {
    state: Arc<FloodState>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct FloodState {
    on: AtomicBool,
    stopped: AtomicBool,
    in_flight: AtomicUsize,
    timed_out: AtomicUsize,
    limited: AtomicUsize,
    other: Mutex<Vec<String>>,
}

/// What A's flood was answered.
struct FloodCounts {
    timed_out: usize,
    limited: usize,
    other: Vec<String>,
}

impl std::fmt::Display for FloodCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} creates cut off at their body's deadline, {} refused",
            self.timed_out, self.limited
        )
    }
}

impl FloodState {
    /// Waits while paused; false once stopped.
    async fn go_on(&self) -> bool {
        while !self.on.load(Ordering::Relaxed) {
            if self.stopped.load(Ordering::Relaxed) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    async fn answered(&self, status: String) {
        if status.contains(" 408 ") {
            self.timed_out.fetch_add(1, Ordering::Relaxed);
        } else if status.contains(" 429 ") {
            self.limited.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else {
            self.other.lock().expect("lock").push(status);
        }
    }
}

impl Flood {
    fn start(addr: std::net::SocketAddr, key: String) -> Flood {
        let state = Arc::new(FloodState::default());
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let (state, key) = (state.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                while state.go_on().await {
                    state.in_flight.fetch_add(1, Ordering::Relaxed);
                    let status = trickled_create(addr, &key).await;
                    state.in_flight.fetch_sub(1, Ordering::Relaxed);
                    state.answered(status).await;
                }
            }));
        }
        Flood { state, tasks }
    }

    /// Pauses, and waits until nothing of A's is in progress.
    async fn pause(&self) {
        self.state.on.store(false, Ordering::Relaxed);
        common::eventually(Duration::from_secs(10), "A's flood to pause", || async {
            self.state.in_flight.load(Ordering::Relaxed) == 0
        })
        .await;
    }

    /// Resumes, and waits until A's share is taken again (A is refused).
    async fn resume(&self) {
        let limited = self.state.limited.load(Ordering::Relaxed);
        self.state.on.store(true, Ordering::Relaxed);
        common::eventually(Duration::from_secs(10), "A's share to be taken", || async {
            self.state.limited.load(Ordering::Relaxed) > limited
        })
        .await;
    }

    async fn stop(self) -> FloodCounts {
        self.state.on.store(false, Ordering::Relaxed);
        self.state.stopped.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("flood task");
        }
        let state = &self.state;
        FloodCounts {
            timed_out: state.timed_out.load(Ordering::Relaxed),
            limited: state.limited.load(Ordering::Relaxed),
            other: std::mem::take(&mut *state.other.lock().expect("lock")),
        }
    }
}

#[tokio::test]
async fn a_trickled_body_is_cut_off_and_gives_its_slot_back() {
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_MAX_CONCURRENT_REQUESTS", "1"),
        ("WARDEN_BODY_READ_TIMEOUT_MS", "1000"),
        ("WARDEN_REQUEST_TIMEOUT_MS", "30000"),
    ]))
    .await;
    let addr = app.app.as_ref().expect("server").addr();
    let mut stream = TcpStream::connect(addr).await.expect("connected");
    let started = Instant::now();
    stream
        .write_all(slow_create_head(&app.key, 1_000).as_bytes())
        .await
        .expect("headers written");
    let (mut reader, mut writer) = stream.into_split();
    // A byte every 100 ms: never idle, never done.
    let trickle = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Meanwhile the create holds the replica's one slot.
    let other = client_with_key(&app.key);
    common::eventually_ok(
        Duration::from_secs(10),
        "the slow create to hold the slot",
        || async {
            let res = other
                .get(app.url("/api/autonomous"))
                .send()
                .await
                .expect("sent");
            match res.status() {
                StatusCode::SERVICE_UNAVAILABLE => Ok(()),
                status => Err(status.to_string()),
            }
        },
    )
    .await;
    let mut answer = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut answer)).await;
    trickle.abort();
    let took = started.elapsed();
    assert!(closed.is_ok(), "the connection was still open 10 s on");
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );
    // The slot is back.
    let (status, _) = app.get("/api/autonomous").await;
    assert_eq!(status, StatusCode::OK);
    // A body sent at once is unaffected.
    let (status, body) = app
        .post(
            "/api/autonomous",
            Some(json!({
                "goal": "Create README.md with a project description",
                "executor": { "kind": "scripted", "steps": [{ "action": "write", "output": "done" }] },
                "limits": { "max_iterations": 1 }
            })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
