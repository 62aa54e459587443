//! Connections cannot be exhausted: headers must arrive within
//! `WARDEN_HEADER_READ_TIMEOUT_MS`, silent connections close after
//! `WARDEN_IDLE_TIMEOUT_MS`, and connections beyond `WARDEN_MAX_CONNECTIONS`
//! or `WARDEN_MAX_CONNECTIONS_PER_IP` are closed as soon as accepted, while
//! the probes and authenticated reads keep answering.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::common::{TestApp, client_with_key, config_with};

/// The first lines of a request whose headers never end.
const UNFINISHED: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";

/// A connection to `to` from the loopback address `from` (Linux answers on
/// all of 127.0.0.0/8, so each stands for another client).
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bound to a loopback address");
    socket.connect(to).await.expect("connected")
}

/// A connection that has sent part of a request's headers and stops there.
async fn unfinished(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let mut stream = connect_from(from, to).await;
    stream.write_all(UNFINISHED).await.expect("written");
    stream
}

/// Reads until the server closes the connection; an error (a reset) counts
/// as closed too. Whatever it sent before (e.g. a 408) is skipped.
async fn closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Whether the server closed `stream` within 1 s of its being opened,
/// without answering anything.
async fn refused_at_once(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// `GET /healthz` over a fresh connection from `from`; the status line, or
/// what went wrong.
async fn healthz_from(from: Ipv4Addr, to: SocketAddr) -> String {
    let mut stream = connect_from(from, to).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if let Err(e) = stream.write_all(request).await {
        return format!("write failed: {e}");
    }
    let mut answer = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await {
        Ok(Ok(_)) => String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Ok(Err(e)) => format!("read failed: {e}"),
        Err(_) => "no answer in 5 s".into(),
    }
}

/// Ends the headers of an [`unfinished`] request; the answer's status line
/// (the connection stays open, kept alive).
async fn finish(stream: &mut TcpStream) -> String {
    if let Err(e) = stream.write_all(b"\r\n").await {
        return format!("write failed: {e}");
    }
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Ok(Err(e)) => format!("read failed: {e}"),
        Err(_) => "no answer in 5 s".into(),
    }
}

fn addr(app: &TestApp) -> SocketAddr {
    app.app.as_ref().expect("server").addr()
}

#[tokio::test]
async fn idle_connections_neither_starve_the_server_nor_outlive_the_header_timeout() {
    // The test holds both ends of every connection: 4,000 descriptors and more.
    let _ = warden::http::serve::raise_open_files_limit();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_HEADER_READ_TIMEOUT_MS", "2000"),
        // All of them come from 127.0.0.1.
        ("WARDEN_MAX_CONNECTIONS_PER_IP", "5000"),
    ]))
    .await;
    let id = app
        .create_scripted(
            json!([{ "action": "write", "output": "done" }]),
            json!({ "max_iterations": 1 }),
        )
        .await;
    let to = addr(&app);
    let opening = Instant::now();
    // In batches of 100 at once: quick, yet within the listen backlog.
    let mut idle = Vec::with_capacity(2_000);
    for _ in 0..20 {
        let batch = (0..100).map(|_| unfinished(Ipv4Addr::LOCALHOST, to));
        idle.extend(futures::future::join_all(batch).await);
    }
    let opened = opening.elapsed();

    // Fresh connections (no pooled one the server may have closed meanwhile).
    let probe = reqwest::Client::new();
    let started = Instant::now();
    let health = probe
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("healthz answers");
    let health_took = started.elapsed();
    assert_eq!(health.status(), StatusCode::OK);
    let started = Instant::now();
    let status = client_with_key(&app.key)
        .get(app.url(&format!("/api/autonomous/{id}")))
        .send()
        .await
        .expect("status answers");
    let status_took = started.elapsed();
    assert_eq!(status.status(), StatusCode::OK);
    let probed = opening.elapsed();
    assert!(
        health_took < Duration::from_secs(1) && status_took < Duration::from_secs(1),
        "with 2,000 idle connections: /healthz took {health_took:?}, the status {status_took:?}"
    );
    eprintln!(
        "2,000 idle connections opened in {opened:?}; /healthz {health_took:?}, status {status_took:?}, \
both answered {probed:?} after the first was opened"
    );

    // Every idle one is closed by the server after the header timeout.
    let waited = Instant::now();
    let all_closed = tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join_all(idle.iter_mut().map(closed_by_server)),
    )
    .await;
    assert!(
        all_closed.is_ok(),
        "idle connections still open 30 s after the 2 s header timeout"
    );
    eprintln!("all 2,000 closed {:?} after the probes", waited.elapsed());
    // Their places are given back: the server still takes new connections.
    let (status, _) = app.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_HEADER_READ_TIMEOUT_MS", "60000"),
        ("WARDEN_IDLE_TIMEOUT_MS", "1000"),
    ]))
    .await;
    let started = Instant::now();
    let mut silent = connect_from(Ipv4Addr::LOCALHOST, addr(&app)).await;
    let closed = tokio::time::timeout(Duration::from_secs(20), closed_by_server(&mut silent)).await;
    assert!(
        closed.is_ok(),
        "a silent connection outlived the idle timeout"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the idle timeout: {:?}",
        started.elapsed()
    );
    // A kept-alive connection that works is unaffected while it works.
    let (status, _) = app.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn connections_beyond_the_caps_are_refused_at_once_and_places_come_back() {
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_MAX_CONNECTIONS", "6"),
        ("WARDEN_MAX_CONNECTIONS_PER_IP", "3"),
        ("WARDEN_HEADER_READ_TIMEOUT_MS", "60000"),
    ]))
    .await;
    let to = addr(&app);
    let (a, b, c) = (
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 3),
    );
    // Client a takes its three places; its fourth connection is closed at once.
    let mut held_a = Vec::new();
    for _ in 0..3 {
        held_a.push(unfinished(a, to).await);
    }
    let mut fourth = unfinished(a, to).await;
    assert!(
        refused_at_once(&mut fourth).await,
        "a client's connection beyond WARDEN_MAX_CONNECTIONS_PER_IP was kept"
    );
    // Client b fills the replica's six places and is served meanwhile.
    let mut held_b = Vec::new();
    for _ in 0..3 {
        held_b.push(unfinished(b, to).await);
    }
    let answer = finish(&mut held_b[0]).await;
    assert!(
        answer.contains(" 200 "),
        "another client is served: {answer:?}"
    );
    // Anyone else is refused.
    let mut seventh = unfinished(c, to).await;
    assert!(
        refused_at_once(&mut seventh).await,
        "a connection beyond WARDEN_MAX_CONNECTIONS was kept"
    );
    // A closed connection gives its place back.
    drop(held_a.pop());
    crate::common::eventually_ok(
        Duration::from_secs(10),
        "a closed connection's place to come back",
        || async {
            let answer = healthz_from(c, to).await;
            if answer.contains("200") {
                Ok(())
            } else {
                Err(answer)
            }
        },
    )
    .await;
    drop((held_a, held_b));
}
