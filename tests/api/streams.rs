//! Live streams and metrics over HTTP: every event of a session in order
//! with the terminal event last, reconnects without gap or duplicate,
//! stalled clients that do not slow sessions, the global session stream,
//! and Prometheus counters that match what ran.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{ServiceProcess, SessionView, TestApp, Warden, distinct_steps};
use serde_json::{Value, json};
use sqlx::PgPool;

/// One parsed SSE frame.
#[derive(Debug, Clone)]
struct Frame {
    id: Option<String>,
    event: Option<String>,
    data: Value,
}

/// A minimal HTTP/1.1 SSE client over a plain socket: it reads the chunked
/// body itself, so the test depends on nothing but the server's bytes.
struct RawSse {
    reader: std::io::BufReader<std::net::TcpStream>,
    pending: String,
    ended: bool,
}

impl RawSse {
    fn open(base: &str, path: &str, last_event_id: Option<&str>) -> RawSse {
        use std::io::{BufRead, Write};
        let addr = base.trim_start_matches("http://");
        let mut sock = std::net::TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let last = last_event_id
            .map(|id| format!("Last-Event-ID: {id}\r\n"))
            .unwrap_or_default();
        write!(
            sock,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{last}Authorization: Bearer {}\r\nConnection: close\r\n\r\n",
            crate::common::ADMIN_TOKEN
        )
        .unwrap();
        let mut reader = std::io::BufReader::new(sock);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        let mut chunked = false;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("content-type:") {
                assert!(lower.contains("text/event-stream"), "{line}");
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
            if line == "\r\n" {
                break;
            }
        }
        assert!(chunked, "an event stream is sent chunked");
        RawSse {
            reader,
            pending: String::new(),
            ended: false,
        }
    }

    /// Reads one chunk of the body into `pending`; false at the end of the body.
    fn fill(&mut self) -> bool {
        use std::io::{BufRead, Read};
        if self.ended {
            return false;
        }
        let mut size = String::new();
        if self.reader.read_line(&mut size).unwrap_or(0) == 0 {
            panic!("connection closed inside a chunked body");
        }
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).expect("chunk data");
        if size == 0 {
            self.ended = true;
            return false;
        }
        self.pending
            .push_str(&String::from_utf8_lossy(&data[..size]));
        true
    }

    /// The next event frame; `None` at the end of the body.
    fn next(&mut self) -> Option<Frame> {
        loop {
            while let Some(end) = self.pending.find("\n\n") {
                let raw: String = self.pending.drain(..end + 2).collect();
                let mut frame = Frame {
                    id: None,
                    event: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        frame.id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        frame.event = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if frame.id.is_none() && data.is_empty() {
                    continue; // keep-alive comment
                }
                frame.data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some(frame);
            }
            if !self.fill() {
                return None;
            }
        }
    }
}

/// Reads a stream until it ends, `until` holds for a frame, or `max` frames arrived.
async fn collect(
    base: String,
    path: String,
    last_event_id: Option<String>,
    until: impl Fn(&Frame) -> bool + Send + 'static,
    max: usize,
) -> Vec<Frame> {
    let (opened, _) = tokio::sync::oneshot::channel();
    collect_telling(base, path, last_event_id, until, max, opened).await
}

/// [`collect`], telling `opened` once the stream's head has arrived: the
/// server has subscribed the stream to changes by then.
async fn collect_telling(
    base: String,
    path: String,
    last_event_id: Option<String>,
    until: impl Fn(&Frame) -> bool + Send + 'static,
    max: usize,
    opened: tokio::sync::oneshot::Sender<()>,
) -> Vec<Frame> {
    tokio::task::spawn_blocking(move || {
        let mut sse = RawSse::open(&base, &path, last_event_id.as_deref());
        let _ = opened.send(());
        let mut frames = Vec::new();
        while frames.len() < max {
            let Some(frame) = sse.next() else { break };
            let stop = until(&frame);
            frames.push(frame);
            if stop {
                break;
            }
        }
        frames
    })
    .await
    .unwrap()
}

/// Warden as a separate process (streams are tested as a network client sees them).
async fn service(pool: PgPool) -> (ServiceProcess, TestApp) {
    let process = Warden::on(&pool).serve().await;
    let app = TestApp::connect(None, process.base.clone()).await;
    (process, app)
}

fn script(steps: usize, delay_ms: u64) -> Value {
    let mut s = distinct_steps(steps, 10, delay_ms)
        .as_array()
        .cloned()
        .unwrap();
    s.push(json!({ "action": "finish", "tokens": 10, "output": "<<WARDEN_GOAL_DONE: done>>" }));
    Value::Array(s)
}

fn ids(frames: &[Frame]) -> Vec<i64> {
    frames
        .iter()
        .map(|f| f.id.as_ref().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_stream_delivers_every_event_in_order_and_ends_after_the_terminal_one() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    let id = app.create_scripted(script(5, 40), json!({})).await;
    let path = format!("/api/autonomous/{id}/events");
    let frames = collect(app.base.clone(), path, None, |_| false, 10_000).await;
    let s = app.session(&id).await;
    assert_eq!(s["status"], "completed");
    let expected: Vec<i64> = (1..=common::view::<SessionView>(&s).last_event_seq).collect();
    assert_eq!(ids(&frames), expected, "every event, in order, once");
    let last = frames.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("status_changed"));
    assert_eq!(last.data["data"]["to"], "completed");
    let iterations = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("iteration_completed"))
        .count();
    assert_eq!(iterations, 6);
}

#[tokio::test]
async fn a_reconnect_with_last_event_id_loses_and_repeats_nothing() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    let id = app.create_scripted(script(8, 60), json!({})).await;
    let path = format!("/api/autonomous/{id}/events");
    let head = collect(app.base.clone(), path.clone(), None, |_| false, 7).await;
    let resume_from = head.last().unwrap().id.clone().unwrap();
    // Events go on while the client is away: the resume must cover them.
    let away_from: i64 = resume_from.parse().expect("an event id is its seq");
    app.wait_until(&id, Duration::from_secs(10), |s| {
        common::view::<SessionView>(s).last_event_seq >= away_from + 2
    })
    .await;
    let tail = collect(app.base.clone(), path, Some(resume_from), |_| false, 10_000).await;
    let mut all = ids(&head);
    all.extend(ids(&tail));
    let s = app.session(&id).await;
    let expected: Vec<i64> = (1..=common::view::<SessionView>(&s).last_event_seq).collect();
    assert_eq!(all, expected);
    assert_eq!(tail.last().unwrap().data["data"]["to"], "completed");
}

/// A client that opens a stream and never reads a byte. Its receive buffer
/// is the smallest the kernel allows and it advertises a small segment size,
/// from which the server sizes its send buffer: a hundred KB or so of events
/// fill both, and the server's writes to it block.
struct Stalled {
    sock: std::net::TcpStream,
}

impl Stalled {
    fn open(base: &str, path: &str) -> Stalled {
        use socket2::{Domain, Protocol, Socket, Type};
        use std::io::Write;
        let addr: std::net::SocketAddr = base
            .trim_start_matches("http://")
            .parse()
            .expect("an address");
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.set_recv_buffer_size(1).unwrap(); // rounded up to the kernel's minimum
        socket.set_tcp_mss(536).unwrap();
        socket.connect(&addr.into()).unwrap();
        let mut sock: std::net::TcpStream = socket.into();
        write!(
            sock,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            crate::common::ADMIN_TOKEN
        )
        .unwrap();
        Stalled { sock }
    }

    /// Bytes the server has written but not had acknowledged, and bytes
    /// waiting unread here, from the kernel's table of TCP sockets.
    fn queues(&self) -> (u64, u64) {
        let local = self.sock.local_addr().unwrap();
        let server = self.sock.peer_addr().unwrap();
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let queue = |from: std::net::SocketAddr, to: std::net::SocketAddr, rx: bool| {
            let hex = |a: std::net::SocketAddr| match a.ip() {
                std::net::IpAddr::V4(ip) => {
                    format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
                }
                std::net::IpAddr::V6(_) => panic!("the service listens on IPv4"),
            };
            let (from, to) = (hex(from), hex(to));
            table
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.len() > 4 && f[1] == from && f[2] == to)
                .map(|f| {
                    let (tx, rx_q) = f[4].split_once(':').expect("tx_queue:rx_queue");
                    u64::from_str_radix(if rx { rx_q } else { tx }, 16).expect("hex")
                })
                .unwrap_or_else(|| panic!("socket {from} -> {to} not in /proc/net/tcp"))
        };
        (queue(server, local, false), queue(local, server, true))
    }

    /// Reads the rest of the response; the server closes it after the
    /// terminal event. Returns every byte it sent, headers included.
    fn drain(mut self) -> u64 {
        use std::io::Read;
        self.sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut all = Vec::new();
        self.sock
            .read_to_end(&mut all)
            .expect("the stream to its end");
        assert!(
            String::from_utf8_lossy(&all).contains("\"to\":\"completed\""),
            "the stalled client still gets the whole stream"
        );
        all.len() as u64
    }
}

#[tokio::test]
async fn clients_that_never_read_do_not_slow_a_session() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    // Long actions (4-byte characters) make each step's events weigh a few
    // KB, so the stream outgrows what the stalled sockets can hold.
    // 90 steps stay under the gate's step limit (100 without a check-in).
    let pad = "\u{1D11E}".repeat(190);
    let mut steps = script(90, 0);
    for step in steps.as_array_mut().unwrap() {
        let action = format!("{} {pad}", step["action"].as_str().unwrap());
        step["action"] = json!(action);
    }
    let id = app
        .create_scripted(steps, json!({ "max_iterations": 1000 }))
        .await;
    let path = format!("/api/autonomous/{id}/events");
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let (base, path) = (app.base.clone(), path.clone());
        stalled.push(
            tokio::task::spawn_blocking(move || Stalled::open(&base, &path))
                .await
                .unwrap(),
        );
    }
    // The session ends on its own while they stay connected, unread.
    let s = app
        .wait_until(&id, Duration::from_secs(60), |s| s["status"] != "running")
        .await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 91);

    // Proof they were stalled: once the queues settle, the server has held
    // back bytes that neither socket took (it could not write them).
    for client in stalled {
        let mut queues = client.queues();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            // Polled, not waited out: settled is two equal reads in a row.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                std::time::Instant::now() < deadline,
                "the socket queues never settle: {queues:?}"
            );
            let now = client.queues();
            if now == queues {
                break;
            }
            queues = now;
        }
        let (in_flight, unread) = queues;
        let sent = tokio::task::spawn_blocking(move || client.drain())
            .await
            .unwrap();
        assert!(
            sent > in_flight + unread,
            "the server could write the whole stream ({sent} bytes: {in_flight} in its \
             send queue, {unread} unread here): the client was not stalled"
        );
    }
}

#[tokio::test]
async fn the_session_list_stream_shows_status_changes() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    let (opened, subscribed) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn(collect_telling(
        app.base.clone(),
        "/api/autonomous/events".to_string(),
        None,
        |f| f.data["status"] == "completed",
        1_000,
        opened,
    ));
    // The reader subscribes before the session exists.
    tokio::time::timeout(Duration::from_secs(10), subscribed)
        .await
        .expect("the stream opens within 10 s")
        .expect("the reader tells it opened");
    let id = app.create_scripted(script(2, 50), json!({})).await;
    let frames = tokio::time::timeout(Duration::from_secs(15), reader)
        .await
        .expect("the stream shows the completion")
        .unwrap();
    assert!(frames.iter().all(|f| f.event.as_deref() == Some("session")));
    let seen: Vec<String> = frames
        .iter()
        .filter(|f| f.data["id"] == id.as_str())
        .map(|f| f.data["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("running"),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("completed"),
        "{seen:?}"
    );
}

/// A number of the status document; fails the test when it is absent.
fn figure(doc: &Value, pointer: &str) -> f64 {
    doc.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {doc}"))
}

#[tokio::test]
async fn a_long_step_shows_its_clock_and_a_nonzero_eta_while_in_flight() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    // Three short steps give a median; the fourth takes 3 s; a finish follows.
    let mut steps = script(4, 150);
    steps[3]["delay_ms"] = json!(3_000);
    let reader = tokio::spawn(collect(
        app.base.clone(),
        "/api/autonomous/events".to_string(),
        None,
        |f| f.data["current_step"]["iteration"] == 4,
        1_000,
    ));
    let id = app.create_scripted(steps, json!({})).await;
    let in_flight = |s: &Value| s["current_step"]["iteration"] == 4;
    let first = app
        .wait_until(&id, Duration::from_secs(15), in_flight)
        .await;
    let first_step_ms = figure(&first, "/current_step/elapsed_ms");
    // A second read well into the same step.
    let second = app
        .wait_until(&id, Duration::from_secs(15), |s| {
            in_flight(s) && figure(s, "/current_step/elapsed_ms") >= first_step_ms + 800.0
        })
        .await;
    for s in [&first, &second] {
        assert_eq!(s["status"], "running", "{s}");
        assert!(s["current_step"]["started_at"].is_string(), "{s}");
        assert!(figure(s, "/eta_seconds") > 0.0, "a nonzero ETA: {s}");
        // The script reports its progress: both bounds say two steps.
        assert!(
            ["progress", "script"].contains(&s["eta_basis"]["source"].as_str().expect("source")),
            "{s}"
        );
        assert_eq!(s["eta_basis"]["steps_left"], 2, "{s}");
        assert!(figure(s, "/eta_basis/median_step_ms") >= 100.0, "{s}");
    }
    assert!(
        figure(&second, "/elapsed_ms") >= figure(&first, "/elapsed_ms") + 800.0,
        "the session's clock moves during the step: {first} then {second}"
    );
    assert!(
        figure(&second, "/elapsed_ms") >= figure(&second, "/current_step/elapsed_ms"),
        "the session's running time includes the step in flight: {second}"
    );
    let frames = tokio::time::timeout(Duration::from_secs(15), reader)
        .await
        .expect("the list stream shows the step in flight")
        .expect("reader");
    let shown = frames
        .iter()
        .find(|f| f.data["id"] == id.as_str() && f.data["current_step"]["iteration"] == 4)
        .expect("a session event with the step in flight");
    assert!(figure(&shown.data, "/eta_seconds") > 0.0, "{}", shown.data);
    let ended = app.wait_settled(&id).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert!(ended["current_step"].is_null(), "{ended}");
    assert!(ended["eta_basis"].is_null(), "{ended}");
}

/// Parses Prometheus text into `name{labels}` → value, checking every line's shape.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name_end = key.find('{').unwrap_or(key.len());
        assert!(
            key[..name_end]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad metric name in {line:?}"
        );
        if name_end < key.len() {
            assert!(key.ends_with('}'), "bad labels in {line:?}");
        }
        out.insert(
            key.to_string(),
            value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        );
    }
    out
}

#[tokio::test]
async fn metrics_parse_and_match_the_sessions_that_ran() {
    let app = TestApp::start().await;
    let done = app.create_scripted(script(2, 0), json!({})).await;
    let capped = app
        .create_scripted(distinct_steps(5, 10, 0), json!({ "max_iterations": 2 }))
        .await;
    let long = app
        .create_scripted(distinct_steps(3, 10, 30_000), json!({}))
        .await;
    app.wait_settled(&done).await;
    app.wait_settled(&capped).await;
    app.post(&format!("/api/autonomous/{long}/stop"), None)
        .await;

    let res = app.admin_get("/metrics").await;
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let m = parse_prometheus(&res.text().await.unwrap());
    assert_eq!(m["warden_iterations_total"], 5.0);
    assert_eq!(m["warden_tokens_total"], 50.0);
    assert_eq!(m["warden_sessions{status=\"completed\"}"], 1.0);
    assert_eq!(m["warden_sessions{status=\"stopped\"}"], 1.0);
    assert_eq!(m["warden_sessions{status=\"interrupted\"}"], 1.0);
    assert_eq!(m["warden_sessions{status=\"running\"}"], 0.0);
    assert_eq!(
        m["warden_terminations_total{reason=\"goal_achieved\"}"],
        1.0
    );
    assert_eq!(
        m["warden_terminations_total{reason=\"max_iterations\"}"],
        1.0
    );
    assert_eq!(m["warden_terminations_total{reason=\"user_stop\"}"], 1.0);
    assert_eq!(m["warden_gate_decisions_total{decision=\"continue\"}"], 6.0);
    assert_eq!(m["warden_iteration_duration_seconds_count"], 5.0);
    assert_eq!(m["warden_stop_latency_seconds_count"], 1.0);
    assert_eq!(
        m["warden_iteration_duration_seconds_bucket{le=\"+Inf\"}"],
        5.0
    );
}

#[tokio::test]
async fn replay_of_a_resumed_session_runs_through_every_run_to_the_live_tail() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let (_process, app) = service(pool).await;
    let id = app.create_scripted(script(6, 100), json!({})).await;
    app.wait_until(&id, Duration::from_secs(20), |s| {
        s["iterations"].as_i64() >= Some(1)
    })
    .await;
    let (status, body) = app.post(&format!("/api/autonomous/{id}/stop"), None).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert_eq!(body["status"], "interrupted");
    let (status, body) = app
        .post(&format!("/api/autonomous/{id}/resume"), None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    // From 0 while the second run is live: past the first run's end event,
    // through the second run, to its end.
    let path = format!("/api/autonomous/{id}/events");
    let frames = collect(app.base.clone(), path, None, |_| false, 10_000).await;
    let s = app.session(&id).await;
    assert_eq!(s["status"], "completed");
    let expected: Vec<i64> = (1..=common::view::<SessionView>(&s).last_event_seq).collect();
    assert_eq!(ids(&frames), expected, "every event of both runs, in order");
    let ends: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("status_changed"))
        .map(|f| &f.data["data"]["to"])
        .filter(|to| *to != "running")
        .collect();
    assert_eq!(ends, [&json!("interrupted"), &json!("completed")]);
}

#[tokio::test]
async fn a_resume_from_inside_the_compacted_log_is_told_of_the_gap_first() {
    let app = TestApp::start_with(crate::common::config_with(&[
        ("WARDEN_PRUNE_INTERVAL", "1s"),
        ("WARDEN_EVENT_HORIZON", "10"),
    ]))
    .await;
    let id = app.create_scripted(script(30, 0), json!({})).await;
    let ended = app.wait_settled(&id).await;
    let last_seq = ended["last_event_seq"].as_i64().expect("seq");
    let through = crate::common::eventually_ok(
        Duration::from_secs(60),
        "the log to be compacted",
        || async {
            let (_, page) = app
                .get(&format!("/api/autonomous/{id}/events?limit=1"))
                .await;
            page["compacted_through"]
                .as_i64()
                .ok_or_else(|| page.to_string())
        },
    )
    .await;
    let path = format!("/api/autonomous/{id}/events");

    // From inside the thinned part: a `gap` first, without an id (the
    // client's resume point stays its own), then what is left, in order.
    let frames = collect(
        app.base.clone(),
        path.clone(),
        Some("2".into()),
        |_| false,
        10_000,
    )
    .await;
    let gap = frames.first().expect("a first frame");
    assert_eq!(gap.event.as_deref(), Some("gap"), "{gap:?}");
    assert_eq!(gap.id, None, "{gap:?}");
    assert_eq!(gap.data["after"], 2, "{gap:?}");
    assert_eq!(gap.data["compacted_through"], through, "{gap:?}");
    let rest = ids(&frames[1..]);
    assert!(rest.windows(2).all(|w| w[0] < w[1]), "{rest:?}");
    assert!(rest.iter().all(|seq| *seq > 2), "{rest:?}");
    assert_eq!(rest.last().copied(), Some(last_seq));
    assert!(
        rest.len() < (last_seq - 2) as usize,
        "some events were compacted away"
    );

    // From past the mark: no gap, every later event.
    let frames = collect(
        app.base.clone(),
        path,
        Some(through.to_string()),
        |_| false,
        10_000,
    )
    .await;
    assert!(frames.iter().all(|f| f.event.as_deref() != Some("gap")));
    assert_eq!(ids(&frames), ((through + 1)..=last_seq).collect::<Vec<_>>());
}
