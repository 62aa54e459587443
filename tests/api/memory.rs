//! Memory bounded whatever an agent sends. Big
//! step outputs are stored up to WARDEN_MAX_OUTPUT_BYTES with a marker,
//! travel in histories as few-KiB excerpts, and are served in bounded
//! pages; an answer over the egress cap is one permanent step error.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::fake_llm::{FakeLlm, text};
use crate::common::{ADMIN_TOKEN, TestApp, TestDb, Warden, config_with};

/// Bytes of each agent answer's `output`: under the 4 MiB egress cap.
const BIG: usize = 3_500_000;
/// Steps each session runs.
const STEPS: u64 = 30;
/// Sessions at once.
const SESSIONS: usize = 4;

/// Serializes the tests of this module (each drives four heavy sessions).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A webhook agent whose every answer carries a 3.5 MB output (distinct per
/// call); it records the size of every request it receives.
async fn big_agent() -> (String, Arc<Mutex<Vec<usize>>>) {
    async fn step(State(sizes): State<Arc<Mutex<Vec<usize>>>>, body: Bytes) -> Json<Value> {
        let n = {
            let mut sizes = sizes.lock().unwrap();
            sizes.push(body.len());
            sizes.len()
        };
        let iteration = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["iteration"].as_u64())
            .unwrap_or(0);
        let mut output = format!("call {n} of iteration {iteration}: ");
        output.push_str(&"x".repeat(BIG - output.len()));
        Json(
            json!({ "action": format!("step_{iteration}"), "arguments": { "n": n },
                     "output": output, "tokens": 1 }),
        )
    }
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/step", post(step))
        .with_state(sizes.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/step", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, sizes)
}

fn webhook_session(url: &str) -> Value {
    json!({ "goal": "Edit three parts", "executor": { "kind": "webhook", "url": url },
            "limits": { "max_iterations": STEPS } })
}

#[tokio::test]
async fn big_answers_are_capped_in_storage_histories_and_pages() {
    let _serial = SERIAL.lock().await;
    let (url, sizes) = big_agent().await;
    let app = TestApp::start().await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        ids.push(
            app.create(webhook_session(&url)).await["id"]
                .as_str()
                .expect("id")
                .to_string(),
        );
    }
    for id in &ids {
        // A session whose lease lapsed under the load shows `queued` until
        // its loop renews it: wait for its end.
        let s = app
            .wait_until(id, Duration::from_secs(240), |s| {
                s["status"] != "running" && s["status"] != "queued"
            })
            .await;
        assert_eq!(s["status"], "stopped", "{s}");
        assert_eq!(s["reason"], "max_iterations", "{s}");
        assert_eq!(s["iterations"], STEPS);
    }
    let sizes = sizes.lock().unwrap().clone();
    // At least one request per iteration; a step whose lease lapsed under
    // load is asked again by the session's rescuer (at least once).
    assert!(
        sizes.len() >= SESSIONS * STEPS as usize,
        "{} requests",
        sizes.len()
    );
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(
        largest < 1024 * 1024,
        "largest request to the agent: {largest} bytes"
    );
    // The history of 10 steps travels as excerpts: tens of KiB, not 35 MB.
    assert!(
        largest < 128 * 1024,
        "largest request to the agent: {largest} bytes"
    );

    let id = &ids[0];
    // A page of excerpts: small, every output marked.
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/iterations?limit=500")))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.bytes().await.expect("body");
    assert!(
        body.len() < 1024 * 1024,
        "page of excerpts: {} bytes",
        body.len()
    );
    let page: Value = serde_json::from_slice(&body).expect("json");
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), STEPS as usize);
    assert!(page["next_after"].is_null(), "{}", page["next_after"]);
    for it in items {
        let obs = it["record"]["observation"].as_str().expect("observation");
        assert!(obs.len() < 8 * 1024, "{}", obs.len());
        assert!(obs.contains("?full=true"), "{obs}");
    }

    // The whole stored text: capped at 256 KiB with the marker, served in
    // pages that end at their byte budget with the cursor to go on.
    let mut after = 0;
    let mut full = Vec::new();
    let mut pages = 0;
    loop {
        let res = app
            .client
            .get(app.url(&format!(
                "/api/autonomous/{id}/iterations?limit=500&full=true&after={after}"
            )))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.bytes().await.expect("body");
        assert!(
            body.len() < 6 * 1024 * 1024,
            "full page: {} bytes",
            body.len()
        );
        let page: Value = serde_json::from_slice(&body).expect("json");
        full.extend(page["items"].as_array().cloned().expect("items"));
        pages += 1;
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert!(pages > 1, "a 15 MB history takes more than one page");
    crate::common::assert_gap_free(&full);
    for it in &full {
        let obs = it["record"]["observation"].as_str().expect("observation");
        assert!(obs.len() < 256 * 1024 + 256, "{}", obs.len());
        assert!(
            obs.contains(&format!("{} bytes dropped", BIG - 256 * 1024)),
            "{}",
            &obs[obs.len().min(192 * 1024)..obs.len().min(192 * 1024 + 300)]
        );
        assert!(obs.starts_with("call "), "the head is kept");
    }

    // Checkpoints hold the slim history: small whatever the outputs were.
    let (status, page) = app
        .get(&format!(
            "/api/autonomous/{id}/checkpoints?limit=500&full=true"
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    let checkpoints = page["items"].as_array().cloned().expect("items");
    assert!(!checkpoints.is_empty());
    for c in checkpoints {
        let size = c["state"].to_string().len();
        assert!(size < 512 * 1024, "checkpoint state: {size} bytes");
    }
}

/// The anonymous resident memory of process `pid`, in bytes (Linux
/// `/proc`): what the process itself holds. The file-backed part of the
/// resident set is left out: it is the executable's code paged in as new
/// paths run (about 40 MB more of a debug build's text after the sessions
/// than at start), clean pages shared with the page cache and dropped by
/// the kernel under pressure, not memory the service keeps.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "reads a process's resident size from /proc/<pid>/status (Linux only)"
)]
async fn rss_peak_stays_bounded_with_big_answers() {
    let db = TestDb::new().await;
    let _serial = SERIAL.lock().await;
    let (url, _sizes) = big_agent().await;
    let workspaces = std::env::temp_dir().join(format!("warden-mem-{}", uuid::Uuid::new_v4()));
    let workspaces = workspaces.to_string_lossy().to_string();
    let service = Warden::on(&db.pool)
        .envs(&[
            ("WARDEN_EGRESS_ALLOW", "127.0.0.1"),
            ("WARDEN_WORKSPACE_ROOT", workspaces.as_str()),
        ])
        .serve()
        .await;
    let pid = service.pid();
    let client = crate::common::client_with_key(ADMIN_TOKEN);
    // The resting size of a ready service.
    let start = rss(pid).expect("rss");
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        let res = client
            .post(format!("{}/api/autonomous", service.base))
            .json(&webhook_session(&url))
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), StatusCode::CREATED);
        let doc: Value = res.json().await.expect("json");
        ids.push(doc["id"].as_str().expect("id").to_string());
    }
    let mut peak = start;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut pending = ids.clone();
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "sessions did not end: {pending:?}"
        );
        peak = peak.max(rss(pid).expect("rss"));
        let id = pending[0].clone();
        let s: Value = client
            .get(format!("{}/api/autonomous/{id}", service.base))
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("json");
        if s["status"] != "running" && s["status"] != "queued" {
            assert_eq!(s["iterations"], STEPS, "{s}");
            pending.remove(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the sessions add is bounded on both stores; the whole process is
    // held under 300 MB where the database is not inside it (the embedded
    // PostgreSQL alone takes about 300 MB).
    assert!(
        peak - start < 250 * 1024 * 1024,
        "RSS grew by {} MB (start {} MB, peak {} MB)",
        (peak - start) >> 20,
        start >> 20,
        peak >> 20
    );
    if !crate::common::embedded() {
        assert!(
            peak < 300 * 1024 * 1024,
            "peak RSS {} MB (start {} MB)",
            peak >> 20,
            start >> 20
        );
    }
    // What remains after the sessions end returns to within 50 MB of the
    // start: the service sets mimalloc's purge delay to 0, so pages freed on
    // idle threads go back to the system at once.
    // The service keeps answering meanwhile, as a live one does: mimalloc
    // hands blocks freed from another thread back to their page when the
    // owning thread next allocates.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = rss(pid).expect("rss");
    while now > start + 50 * 1024 * 1024 && Instant::now() < deadline {
        let _ = client
            .get(format!("{}/api/autonomous?limit=5", service.base))
            .send()
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = rss(pid).expect("rss");
    }
    eprintln!(
        "RSS: start {} MB, peak {} MB, after the sessions ended {} MB",
        start >> 20,
        peak >> 20,
        now >> 20
    );
    // Asserted where the database is not inside the process: the embedded
    // PostgreSQL runs in WebAssembly, whose linear memory grows and never
    // shrinks, so there the figure is the service's and the database's.
    if !crate::common::embedded() {
        assert!(
            now <= start + 50 * 1024 * 1024,
            "RSS did not return within 50 MB of its start: start {} MB, peak {} MB, after {} MB",
            start >> 20,
            peak >> 20,
            now >> 20
        );
    }
}

#[tokio::test]
async fn a_model_answer_over_the_cap_is_one_permanent_error_per_iteration() {
    let fake = FakeLlm::start().await;
    let big = "y".repeat(8_192);
    for _ in 0..10 {
        fake.agent(text(&big, 10));
    }
    let app =
        TestApp::start_with(config_with(&[("WARDEN_EGRESS_MAX_RESPONSE_BYTES", "4096")])).await;
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "limits": { "max_iterations": 10, "max_consecutive_errors": 2 },
            "executor": { "kind": "llm", "base_url": fake.base_url(), "model": "m" }
        }))
        .await;
    let id = doc["id"].as_str().expect("id").to_string();
    let s = app
        .wait_until(&id, Duration::from_secs(60), |s| s["status"] != "running")
        .await;
    assert_eq!(s["status"], "stopped", "{s}");
    assert_eq!(s["reason"], "error_threshold", "{s}");
    let its = app.iterations(&id).await;
    assert_eq!(its.len(), 2, "{its:?}");
    assert_eq!(
        fake.agent_requests().len(),
        its.len(),
        "exactly one request per iteration: never retried"
    );
    for it in &its {
        let error = it["record"]["error"].as_str().expect("error");
        assert!(error.contains("answer too large"), "{error}");
        assert!(error.contains("over the cap of 4096 bytes"), "{error}");
        assert!(!error.contains("unreachable"), "{error}");
    }
}
