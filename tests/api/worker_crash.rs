//! Exactly-once for workers across `kill -9` and drains: a completion
//! Warden accepted is applied to its session once, its step never runs
//! again, and a done step does not wait a lease TTL for a dead owner. A real
//! `warden` process is killed and restarted on the same database (the
//! `DATABASE_URL` server's, or the same embedded data directory), with
//! workers calling it throughout; and a drain tells the worker `draining`
//! and keeps its step.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ADMIN_TOKEN, ServiceProcess, TestApp, TestDb, client_with_key};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The session lease of these tests: long enough that a step waiting a
/// TTL for its dead owner is told apart from one handed over at once.
const LEASE_TTL: Duration = Duration::from_millis(8_000);
/// Lease renewals: an owner silent for two of them counts as gone.
const HEARTBEAT: Duration = Duration::from_millis(250);

/// Where the killed and restarted processes keep their sessions.
enum Home {
    Server(String),
    DataDir(std::path::PathBuf),
}

impl Home {
    fn new(db: &TestDb) -> Home {
        if common::embedded() {
            let dir =
                std::env::temp_dir().join(format!("warden-wk9-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).expect("data dir");
            Home::DataDir(dir)
        } else {
            Home::Server(common::database_url(&db.pool))
        }
    }

    /// Starts a `warden` on it (on `port`, for a restart) and waits until ready.
    async fn serve(&self, port: Option<u16>) -> ServiceProcess {
        let warden = match self {
            Home::Server(url) => common::Warden::at_url(url),
            Home::DataDir(dir) => common::Warden::on_data_dir(dir),
        };
        let ttl = LEASE_TTL.as_millis().to_string();
        let beat = HEARTBEAT.as_millis().to_string();
        let warden = warden.envs(&[
            ("WARDEN_LEASE_TTL_MS", &ttl),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", &beat),
        ]);
        match port {
            Some(port) => warden.port(port).serve().await,
            None => warden.serve().await,
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Home::DataDir(dir) = self {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A worker key of the tests' tenant on `queue`.
async fn worker_key(base: &str, queue: &str) -> String {
    let res = reqwest::Client::new()
        .post(format!("{base}/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": common::TEST_TENANT, "role": "worker", "queues": [queue] }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::CREATED);
    let doc: Value = res.json().await.expect("json");
    doc["secret"].as_str().expect("secret").to_string()
}

/// A session whose `steps` steps are run by workers on `queue`; a worker
/// lease long enough to outlive a restart.
async fn worker_session(app: &TestApp, queue: &str, steps: u64) -> String {
    let doc = app
        .create(json!({
            "goal": "Create README.md with a project description",
            "mode": "continuous",
            "executor": { "kind": "worker", "queue": queue, "heartbeat_timeout_ms": 20_000 },
            "limits": { "max_iterations": steps },
        }))
        .await;
    doc["id"].as_str().expect("id").to_string()
}

/// A worker's calls; one that finds no process (killed, restarting) is
/// sent again until one answers.
#[derive(Clone)]
struct Caller {
    client: reqwest::Client,
    base: String,
}

impl Caller {
    /// POSTs `body` to `path` until a process answers; also says whether
    /// an earlier try found none.
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value, bool) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut retried = false;
        loop {
            if let Ok(res) = self
                .client
                .post(format!("{}{path}", self.base))
                .json(body)
                .send()
                .await
            {
                let status = res.status();
                let body = res.json().await.unwrap_or(Value::Null);
                return (status, body, retried);
            }
            assert!(Instant::now() < deadline, "no warden answered {path}");
            retried = true;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn claim(&self, wait_ms: u64) -> Option<Value> {
        let (status, body, _) = self
            .post("/api/workers/claim", &json!({ "wait_ms": wait_ms }))
            .await;
        match status {
            StatusCode::OK => Some(body),
            StatusCode::NO_CONTENT => None,
            other => panic!("claim answered {other}: {body}"),
        }
    }

    async fn task(&self, task: &Value, call: &str, mut body: Value) -> (StatusCode, Value, bool) {
        let id = task["task_id"].as_str().expect("task id");
        body["lease_token"] = task["lease_token"].clone();
        self.post(&format!("/api/workers/tasks/{id}/{call}"), &body)
            .await
    }
}

/// The outcome of a task: its own id in the arguments, so the committed
/// iteration says which completion it applied.
fn outcome_of(task: &Value) -> Value {
    json!({ "outcome": {
        "action": format!("step_{}", task["iteration"]),
        "arguments": { "task": task["task_id"] },
        "tokens": 1,
        "output": "done",
    } })
}

/// What the soak's workers did, in the order they saw it.
#[derive(Default)]
struct Log {
    /// (session, iteration, when the claim answered).
    claims: Vec<(String, u64, Instant)>,
    /// (session, iteration, task, when `accepted: true` came back).
    accepted: Vec<(String, u64, String, Instant)>,
    /// Completions refused with 409 (the worker was told).
    refused: usize,
    /// Completions that found no process and were sent again.
    across_a_kill: usize,
}

/// One soak worker: claim, heartbeat through a short piece of work, complete.
async fn soak_worker(caller: Caller, log: Arc<Mutex<Log>>, done: Arc<AtomicBool>) {
    while !done.load(Ordering::SeqCst) {
        let Some(task) = caller.claim(300).await else {
            continue;
        };
        let session = task["session_id"].as_str().expect("session").to_string();
        let iteration = task["iteration"].as_u64().expect("iteration");
        log.lock()
            .expect("log")
            .claims
            .push((session.clone(), iteration, Instant::now()));
        let mut abandoned = false;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let (status, beat, _) = caller.task(&task, "heartbeat", json!({})).await;
            if status != StatusCode::OK || beat["cancel"] == true {
                abandoned = true;
                break;
            }
        }
        if abandoned {
            continue;
        }
        let (status, body, retried) = caller.task(&task, "complete", outcome_of(&task)).await;
        let mut log = log.lock().expect("log");
        log.across_a_kill += usize::from(retried);
        match status {
            StatusCode::OK => {
                assert_eq!(body["accepted"], true, "{body}");
                let id = task["task_id"].as_str().expect("id").to_string();
                log.accepted.push((session, iteration, id, Instant::now()));
            }
            StatusCode::CONFLICT => log.refused += 1,
            other => panic!("complete answered {other}: {body}"),
        }
    }
}

/// The time in `from..to` that no process was up (the kill to the restart's ready).
fn downtime_within(downs: &[(Instant, Instant)], from: Instant, to: Instant) -> Duration {
    downs
        .iter()
        .map(|&(down, up)| {
            let (start, end) = (down.max(from), up.min(to));
            end.saturating_duration_since(start)
        })
        .sum()
}

/// Item 11's soak: 10 sessions of 10 steps, 12 workers, three `kill -9`s
/// while completions are in flight, each followed by a restart on the same
/// database. Every accepted completion is applied exactly once (the
/// committed iteration carries that task's outcome, and each committed
/// iteration was an accepted completion), no step is claimed again after
/// its completion was accepted, and no done step waits three quarters of a
/// lease TTL (time with no process up not counted): a step left for a dead
/// owner waits a whole TTL, and a loaded CI machine needs the margin.
#[tokio::test]
async fn accepted_worker_completions_survive_kill_nine_exactly_once() {
    let (sessions, steps, workers, kills) = (10usize, 10u64, 12usize, 3usize);
    let db = TestDb::new().await;
    let home = Home::new(&db);
    let mut process = home.serve(None).await;
    let port = process.port();
    let app = TestApp::connect(None, process.base.clone()).await;
    let caller = Caller {
        client: client_with_key(&worker_key(&process.base, "soak").await),
        base: process.base.clone(),
    };
    let mut ids = Vec::new();
    for _ in 0..sessions {
        ids.push(worker_session(&app, "soak", steps).await);
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let done = Arc::new(AtomicBool::new(false));
    let crew: Vec<_> = (0..workers)
        .map(|_| tokio::spawn(soak_worker(caller.clone(), log.clone(), done.clone())))
        .collect();
    // When each session's iterations were first seen committed.
    let committed: Arc<Mutex<HashMap<(String, u64), Instant>>> = Arc::default();
    let watcher = {
        let (committed, done, ids) = (committed.clone(), done.clone(), ids.clone());
        let client = app.client.clone();
        let base = app.base.clone();
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                for id in &ids {
                    let Ok(res) = client
                        .get(format!("{base}/api/autonomous/{id}"))
                        .send()
                        .await
                    else {
                        continue;
                    };
                    // While the service restarts it answers 503, or not at all.
                    if res.status() != reqwest::StatusCode::OK {
                        continue;
                    }
                    let Ok(s) = res.json::<Value>().await else {
                        continue;
                    };
                    let seen = Instant::now();
                    let upto = common::view::<common::SessionView>(&s).iterations;
                    let mut committed = committed.lock().expect("committed");
                    for n in 1..=upto {
                        committed.entry((id.clone(), n as u64)).or_insert(seen);
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    let total = sessions * steps as usize;
    let mut downs = Vec::new();
    for kill in 1..=kills {
        let at = total * kill / (kills + 1);
        common::eventually(Duration::from_secs(60), "completions before a kill", || {
            let accepted = log.lock().expect("log").accepted.len();
            async move { accepted >= at }
        })
        .await;
        // SIGKILL while workers are mid-call: nothing checkpointed or released.
        let down = Instant::now();
        process.kill();
        process = home.serve(Some(port)).await;
        downs.push((down, Instant::now()));
    }
    for id in &ids {
        let s = app
            .wait_until(id, Duration::from_secs(60), |s| {
                s["status"] != "running" && s["status"] != "queued"
            })
            .await;
        assert_eq!(s["iterations"], steps, "{s}");
        assert_eq!(s["tokens_used"], steps, "no step counted twice: {s}");
    }
    done.store(true, Ordering::SeqCst);
    for worker in crew {
        worker.await.expect("worker");
    }
    watcher.await.expect("watcher");

    let log = std::mem::take(&mut *log.lock().expect("log"));
    let committed = std::mem::take(&mut *committed.lock().expect("committed"));
    eprintln!(
        "worker soak: {} accepted, {} refused (told), {} completions sent across a kill",
        log.accepted.len(),
        log.refused,
        log.across_a_kill
    );
    let mut accepted_tasks = HashSet::new();
    let mut accepted_steps = HashMap::new();
    for (session, iteration, task, at) in &log.accepted {
        assert!(
            accepted_steps
                .insert((session.clone(), *iteration), *at)
                .is_none(),
            "step {iteration} of {session} accepted twice"
        );
        accepted_tasks.insert(task.clone());
    }
    for id in &ids {
        let iterations = app.iterations(id).await;
        common::assert_gap_free(&iterations);
        for it in app.iteration_views(id).await {
            let n = it.number as u64;
            let task = it.record["arguments"]["task"].as_str().expect("task");
            assert!(
                accepted_tasks.contains(task),
                "iteration {n} of {id} applied an outcome never accepted: {it:?}"
            );
            let accepted = log
                .accepted
                .iter()
                .find(|(s, i, _, _)| s == id && *i == n)
                .expect("every committed step was accepted");
            assert_eq!(
                task, accepted.2,
                "iteration {n} of {id} applied another task"
            );
        }
    }
    let mut slowest = Duration::ZERO;
    for (session, iteration, _, accepted_at) in &log.accepted {
        assert!(
            !log.claims
                .iter()
                .any(|(s, i, at)| s == session && i == iteration && at > accepted_at),
            "step {iteration} of {session} ran again after its completion was accepted"
        );
        let seen = committed
            .get(&(session.clone(), *iteration))
            .copied()
            .unwrap_or_else(Instant::now);
        let stalled = seen.saturating_duration_since(*accepted_at)
            - downtime_within(&downs, *accepted_at, seen.max(*accepted_at));
        slowest = slowest.max(stalled);
        assert!(
            stalled < LEASE_TTL * 3 / 4,
            "step {iteration} of {session} was done but waited {stalled:?} to be applied"
        );
    }
    eprintln!("worker soak: the slowest done step was applied {slowest:?} after it was accepted");
    drop(process);
}

/// The bug as it was reported: five steps claimed, one `kill -9`, a
/// restart, then the five completions. Each is accepted, applied to its
/// session at once (not a lease TTL later), and never offered again.
#[tokio::test]
async fn steps_claimed_before_a_kill_nine_are_completed_after_it_once() {
    let db = TestDb::new().await;
    let home = Home::new(&db);
    let mut process = home.serve(None).await;
    let app = TestApp::connect(None, process.base.clone()).await;
    let caller = Caller {
        client: client_with_key(&worker_key(&process.base, "k9").await),
        base: process.base.clone(),
    };
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(worker_session(&app, "k9", 3).await);
    }
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(caller.claim(5_000).await.expect("a task"));
    }
    process.kill();
    let restarted = home.serve(Some(process.port())).await;
    let ready = Instant::now();
    for task in &tasks {
        let (status, body, _) = caller.task(task, "complete", outcome_of(task)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["accepted"], true);
    }
    for id in &ids {
        app.wait_until(id, LEASE_TTL / 2, |s| s["iterations"].as_u64() >= Some(1))
            .await;
    }
    eprintln!(
        "every completed step applied {:?} after the restart",
        ready.elapsed()
    );
    // What is offered now is each session's second step, never the first again.
    let mut next = HashSet::new();
    while let Some(task) = caller.claim(1_000).await {
        assert_eq!(task["iteration"], 2, "a step ran again: {task}");
        next.insert(task["session_id"].as_str().expect("id").to_string());
        if next.len() == ids.len() {
            break;
        }
    }
    assert_eq!(next.len(), ids.len(), "every session went on");
    for (id, task) in ids.iter().zip(&tasks) {
        let task = tasks
            .iter()
            .find(|t| t["session_id"] == id.as_str())
            .unwrap_or(task);
        let iterations = app.iterations(id).await;
        assert_eq!(iterations.len(), 1, "{iterations:?}");
        assert_eq!(
            iterations[0]["record"]["arguments"]["task"],
            task["task_id"]
        );
        let (status, _) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
        assert!(status.is_success());
    }
    drop(restarted);
}

/// Item 12: a drain of the replica running the session tells its worker
/// `draining` with `cancel: false` (nobody stopped the session), and the
/// outcome it then completes is the one the next replica applies: the step
/// is not run again.
#[tokio::test]
async fn a_drain_tells_the_worker_draining_and_the_next_replica_applies_its_outcome() {
    let db = TestDb::new().await;
    let mut owner = TestApp::spawn(db.pool.clone()).await;
    // The other replica is full (one place, taken by a slow session), so it
    // cannot take the drained session over until that ends.
    let other = TestApp::spawn_with(
        db.pool.clone(),
        common::config_with(&[("WARDEN_MAX_RUNNING", "1")]),
    )
    .await;
    let filler = other
        .create_scripted(common::distinct_steps(400, 1, 100), json!({}))
        .await;
    let caller = Caller {
        client: client_with_key(&worker_key(&owner.base, "drain").await),
        base: other.base.clone(),
    };
    let id = worker_session(&owner, "drain", 2).await;
    let task = caller.claim(5_000).await.expect("a task");
    assert_eq!(task["session_id"], id.as_str());
    owner.shutdown().await;

    let (status, beat, _) = caller.task(&task, "heartbeat", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{beat}");
    assert_eq!(beat["cancel"], false, "a drain does not cancel: {beat}");
    assert_eq!(beat["reason"], "draining");
    assert!(beat["lease_expires_at"].is_string(), "{beat}");
    let (status, body, _) = caller.task(&task, "complete", outcome_of(&task)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The other replica gets room, takes the session over and applies it.
    let (status, _) = other
        .post(&format!("/api/autonomous/{filler}/stop"), None)
        .await;
    assert!(status.is_success());
    other
        .wait_until(&id, Duration::from_secs(20), |s| {
            s["iterations"].as_u64() >= Some(1)
        })
        .await;
    let next = caller.claim(5_000).await.expect("the next step");
    assert_eq!(next["iteration"], 2, "the drained step ran again: {next}");
    let iterations = other.iterations(&id).await;
    assert_eq!(iterations.len(), 1);
    assert_eq!(
        iterations[0]["record"]["arguments"]["task"],
        task["task_id"]
    );

    // A stop cancels with `stopped`.
    let (status, _) = other
        .post(&format!("/api/autonomous/{id}/stop"), None)
        .await;
    assert!(status.is_success());
    let (status, beat, _) = caller.task(&next, "heartbeat", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{beat}");
    assert_eq!(beat["cancel"], true);
    assert_eq!(beat["reason"], "stopped");
}
