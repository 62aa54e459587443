//! Flushing the embedded server's files to the disk.
//!
//! The embedded PostgreSQL runs in a WASM runtime that does not pass
//! `fsync` through to the host: a commit reaches the kernel's page cache,
//! which survives a killed process but not an operating-system crash or a
//! power cut. To keep the server's promise (an acknowledged commit is on
//! the disk), the writes that promise it wait here for a `syncfs(2)` of the
//! data directory's filesystem that *started after* their commit. One
//! flush serves every waiter that arrived before it began (group commit
//! for the disk), and a timer flushes anything else written since.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// How often the background flush runs even when nobody waits: bounds what
/// an OS crash can take of the writes that do not wait for a flush.
pub const BACKGROUND_FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// Why the disk could not be flushed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot flush the embedded database to disk: {0}")]
pub struct FlushError(pub String);

/// A handle on the flusher thread; the thread stops when the last handle goes.
#[derive(Clone)]
pub struct DiskFlush {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for DiskFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiskFlush")
    }
}

struct Handle {
    shared: Arc<Shared>,
    done: watch::Receiver<Finished>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        self.shared.wake.notify_all();
    }
}

/// The last flush that finished: its number and how it went.
#[derive(Clone, Debug)]
struct Finished {
    number: u64,
    outcome: Result<(), FlushError>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves nothing half-done: the
        // counters are plain numbers.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    /// Flushes begun so far.
    started: u64,
    /// The flush number some waiter needs.
    wanted: u64,
    closed: bool,
}

impl DiskFlush {
    /// Flushes the filesystem that holds `dir` (see the module docs).
    pub fn of_directory(dir: &Path) -> Result<DiskFlush, FlushError> {
        let file =
            std::fs::File::open(dir).map_err(|e| FlushError(format!("{}: {e}", dir.display())))?;
        Ok(DiskFlush::with(move || sync_filesystem(&file)))
    }

    /// A flusher that runs `flush` for each flush (tests count them).
    pub fn with(flush: impl FnMut() -> Result<(), FlushError> + Send + 'static) -> DiskFlush {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let (tx, done) = watch::channel(Finished {
            number: 0,
            outcome: Ok(()),
        });
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("warden-disk-flush".into())
            .spawn(move || run(&thread_shared, tx, flush));
        if let Err(err) = spawned {
            // Without the thread nothing would ever flush: every waiter is
            // told so at once instead of hanging.
            tracing::error!(error = %err, "cannot start the disk flusher thread");
            shared.lock().closed = true;
        }
        DiskFlush {
            handle: Arc::new(Handle { shared, done }),
        }
    }

    /// Returns once a flush that began after this call has finished: what
    /// was committed before the call is then on the disk.
    pub async fn flush(&self) -> Result<(), FlushError> {
        let target = {
            let mut state = self.handle.shared.lock();
            if state.closed {
                return Err(FlushError("the flusher has stopped".into()));
            }
            let target = state.started + 1;
            state.wanted = state.wanted.max(target);
            self.handle.shared.wake.notify_one();
            target
        };
        let mut done = self.handle.done.clone();
        let finished = done
            .wait_for(|f| f.number >= target)
            .await
            .map_err(|_| FlushError("the flusher has stopped".into()))?;
        finished.outcome.clone()
    }
}

/// The flusher thread: waits until a flush is wanted (or the background
/// interval passes), runs one, and publishes its number and outcome.
fn run(
    shared: &Shared,
    done: watch::Sender<Finished>,
    mut flush: impl FnMut() -> Result<(), FlushError>,
) {
    loop {
        let number = {
            let mut state = shared.lock();
            while !state.closed && state.wanted <= state.started {
                let (next, timeout) = shared
                    .wake
                    .wait_timeout(state, BACKGROUND_FLUSH_INTERVAL)
                    .unwrap_or_else(PoisonError::into_inner);
                state = next;
                if timeout.timed_out() && !state.closed {
                    // The background flush counts as a flush like any other.
                    state.wanted = state.wanted.max(state.started + 1);
                }
            }
            if state.closed {
                return;
            }
            state.started += 1;
            state.started
        };
        let outcome = flush();
        if let Err(err) = &outcome {
            tracing::error!(error = %err, "the embedded database could not be flushed to disk");
        }
        done.send_replace(Finished { number, outcome });
    }
}

/// `syncfs(2)`: every dirty page and inode of the filesystem holding `file`.
#[cfg(target_os = "linux")]
fn sync_filesystem(file: &std::fs::File) -> Result<(), FlushError> {
    use std::os::fd::AsRawFd;
    // SAFETY: syncfs only reads the descriptor, which `file` keeps open.
    let rc = unsafe { libc::syncfs(file.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(FlushError(std::io::Error::last_os_error().to_string()))
    }
}

/// Elsewhere, the closest portable step: the data directory itself.
#[cfg(not(target_os = "linux"))]
fn sync_filesystem(file: &std::fs::File) -> Result<(), FlushError> {
    file.sync_all().map_err(|e| FlushError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A flusher whose flushes take `pause`; counts flushes begun and finished.
    fn counting(pause: Duration) -> (DiskFlush, Arc<AtomicU64>, Arc<AtomicU64>) {
        let begun = Arc::new(AtomicU64::new(0));
        let finished = Arc::new(AtomicU64::new(0));
        let (b, f) = (begun.clone(), finished.clone());
        let flusher = DiskFlush::with(move || {
            b.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(pause);
            f.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        (flusher, begun, finished)
    }

    #[tokio::test]
    async fn a_flush_returns_only_after_a_flush_that_began_after_the_call() {
        let (flusher, begun, finished) = counting(Duration::from_millis(40));
        // The second caller arrives while the first one's flush runs: that
        // flush began before its call, so it must wait for the next one.
        let (a, b) = tokio::join!(flusher.flush(), async {
            tokio::time::sleep(Duration::from_millis(15)).await;
            let begun_at_call = begun.load(Ordering::SeqCst);
            flusher.flush().await.unwrap();
            (begun_at_call, finished.load(Ordering::SeqCst))
        });
        a.unwrap();
        let (begun_at_call, finished_at_return) = b;
        assert!(begun_at_call >= 1, "the first flush was running");
        assert!(
            finished_at_return > begun_at_call,
            "returned after {finished_at_return} flushes, but {begun_at_call} had begun before the call"
        );
    }

    #[tokio::test]
    async fn waiters_that_arrive_together_share_flushes() {
        let (flusher, _, count) = counting(Duration::from_millis(20));
        let waits: Vec<_> = (0..50).map(|_| flusher.flush()).collect();
        for r in futures::future::join_all(waits).await {
            r.unwrap();
        }
        // 50 waiters, far fewer flushes: the first flush and the one after
        // it cover everyone (plus a background flush at most).
        assert!(count.load(Ordering::SeqCst) <= 3, "{count:?}");
    }

    #[tokio::test]
    async fn a_failed_flush_is_reported_to_its_waiters() {
        let flusher = DiskFlush::with(|| Err(FlushError("EIO".into())));
        let err = flusher.flush().await.unwrap_err();
        assert!(err.to_string().contains("EIO"), "{err}");
    }

    #[tokio::test]
    async fn nobody_waiting_still_flushes_in_the_background() {
        let (_flusher, _, count) = counting(Duration::ZERO);
        tokio::time::sleep(BACKGROUND_FLUSH_INTERVAL * 3).await;
        assert!(count.load(Ordering::SeqCst) >= 1);
    }

    #[test]
    fn a_real_directory_flushes() {
        let dir = std::env::temp_dir();
        let flusher = DiskFlush::of_directory(&dir).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(flusher.flush()).unwrap();
    }
}
