//! The accept loop: HTTP/1.1 connections served by hyper under limits that
//! keep idle or half-open connections from exhausting the replica's file
//! descriptors. A request's headers must arrive within
//! `WARDEN_HEADER_READ_TIMEOUT_MS`, a connection over which nothing moves
//! for `WARDEN_IDLE_TIMEOUT_MS` is closed, and connections beyond
//! `WARDEN_MAX_CONNECTIONS` (per replica) or `WARDEN_MAX_CONNECTIONS_PER_IP`
//! (per client address) are closed as soon as they are accepted, so the
//! probes and well-behaved clients keep being answered.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ConnectionLimits;

/// Serves `app` on `listener` under `limits` until `shutdown` is cancelled;
/// then stops accepting, lets every connection finish the request in
/// flight (idle ones close at once) and returns when all have closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let clients = ClientCounts::new(limits.max_connections_per_ip);
    let connections = TaskTracker::new();
    let mut refusals = Refusals::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors (or memory): nothing can be
                    // accepted until a connection closes; do not spin.
                    tracing::error!(error = %e, "cannot accept a connection; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Refused connections are dropped at once: the client reads the end
        // of the stream instead of waiting in a queue.
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refusals.note("WARDEN_MAX_CONNECTIONS", limits.max_connections);
            continue;
        };
        let Some(slot) = clients.acquire(peer.ip()) else {
            refusals.note(
                "WARDEN_MAX_CONNECTIONS_PER_IP",
                limits.max_connections_per_ip,
            );
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        connections.spawn(serve_connection(
            stream,
            app.clone(),
            limits,
            shutdown.clone(),
            (permit, slot),
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection, until it closes, times out, or shutdown drains it.
/// `_held` (its places under both caps) is given back when it ends.
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    _held: (OwnedSemaphorePermit, ClientSlot),
) {
    let opened = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked {
        inner: stream,
        opened,
        last: activity.clone(),
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        let last = opened + Duration::from_millis(activity.load(Ordering::Relaxed));
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until((last + limits.idle_timeout).into()) => {
                let moved = opened + Duration::from_millis(activity.load(Ordering::Relaxed));
                if moved.elapsed() >= limits.idle_timeout {
                    tracing::debug!(
                        idle_ms = limits.idle_timeout.as_millis() as u64,
                        "closed a connection idle for WARDEN_IDLE_TIMEOUT_MS"
                    );
                    return;
                }
            }
        }
    }
}

/// Errors of one connection that leave the listener usable.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Logs refused connections at most every 10 s, with how many there were,
/// so a flood does not flood the log too.
struct Refusals {
    logged: Option<Instant>,
    count: u64,
}

impl Refusals {
    fn new() -> Refusals {
        Refusals {
            logged: None,
            count: 0,
        }
    }

    fn note(&mut self, setting: &'static str, limit: usize) {
        self.count += 1;
        if self
            .logged
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                refused = self.count,
                limit,
                "refused connections over {setting}"
            );
            self.logged = Some(Instant::now());
            self.count = 0;
        }
    }
}

/// The address a client's connections are counted under: an IPv4 address
/// (also one mapped into IPv6), or an IPv6 address's /64, as one host is
/// commonly given a whole /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Open connections per client address, each at most `max`.
#[derive(Clone)]
struct ClientCounts {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

impl ClientCounts {
    fn new(max: usize) -> ClientCounts {
        ClientCounts {
            open: Arc::default(),
            max,
        }
    }

    /// A place for one more connection from `ip`, if it has fewer than `max`.
    fn acquire(&self, ip: IpAddr) -> Option<ClientSlot> {
        let key = client_key(ip);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            counts: self.clone(),
            key,
        })
    }

    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&client_key(ip)).copied().unwrap_or(0)
    }
}

/// One connection's place under its client's cap, given back on drop.
struct ClientSlot {
    counts: ClientCounts,
    key: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(mut count) = open.entry(self.key) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

/// A stream that records when a byte last moved either way (milliseconds
/// since `opened`), for the idle timeout.
struct Tracked {
    inner: TcpStream,
    opened: Instant,
    last: Arc<AtomicU64>,
}

impl Tracked {
    fn touch(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises this process's soft limit on open files to its hard limit, so
/// the connection caps, not the default soft limit (often 1,024), bound
/// what a replica holds. Returns the soft limit in force afterwards.
#[cfg(target_os = "linux")]
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

/// Off Linux the limit is left as it is (and not read).
#[cfg(not(target_os = "linux"))]
pub fn raise_open_files_limit() -> io::Result<u64> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the open-files limit is raised on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_counted_by_address_and_ipv6_by_its_64() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(client_key(mapped), v4);
        assert_eq!(client_key(v4), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
    }

    #[test]
    fn a_client_gets_at_most_its_cap_and_closed_connections_give_places_back() {
        let counts = ClientCounts::new(2);
        let ip: IpAddr = "198.51.100.1".parse().unwrap();
        let other: IpAddr = "198.51.100.2".parse().unwrap();
        let first = counts.acquire(ip).expect("first");
        let second = counts.acquire("::ffff:198.51.100.1".parse().unwrap());
        assert!(second.is_some());
        assert!(counts.acquire(ip).is_none(), "a third is over the cap");
        assert!(counts.acquire(other).is_some(), "another client is not");
        drop(first);
        assert_eq!(counts.open(ip), 1);
        let third = counts.acquire(ip);
        assert!(third.is_some(), "a closed connection's place is given back");
        drop((second, third));
        assert_eq!(counts.open(ip), 0);
        assert!(counts.open.lock().unwrap().is_empty(), "no entry is kept");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_open_files_limit_ends_at_the_hard_limit() {
        let soft = raise_open_files_limit().expect("raised");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in raise_open_files_limit.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(soft, limit.rlim_cur);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
