//! Worker task changes told to other replicas: after the change commits,
//! coalesced, on a connection of their own.
//!
//! Postgres serializes the commits of transactions that `NOTIFY` (one
//! global lock held from the notify queue's insert to the commit's end), so
//! a `NOTIFY` inside the offer's and the completion's transactions bounded
//! the whole worker protocol: pgbench on the bench host, 32 clients, one
//! row update a transaction, gave ~2,600–2,900 tx/s plain and ~1,050 with a
//! `pg_notify` in the transaction (BENCHMARKS.md). Here the changes queue
//! up in memory while one notify is in flight and go out together in the
//! next, so the notifying commits are one per batch, none on the writers'
//! path. Postgres stays the truth: a change whose notice is lost (a crash
//! right after its commit, a notify that failed) is found by the waiters'
//! next read, as a notice missed while a listener reconnects always was.

use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, PgPool};
use uuid::Uuid;

/// The Postgres channel that announces a task offered or ended, so waiting
/// claims and steps on other replicas wake at once.
pub const WORKERS_CHANNEL: &str = "warden_workers";

/// Changes one notify carries at most: 100 × 39 bytes stays well under
/// Postgres's 8,000-byte payload limit.
const CHANGES_PER_NOTICE: usize = 100;

/// Changes held for the next batch at most; past it the batch says "any
/// task may have changed" instead (waiters read again), so a stalled
/// connection never grows memory.
const MAX_PENDING: usize = 10_000;

/// A change of a worker task, as waiting claims and steps hear of it: only
/// the step of that task wakes for it, and claims wake only for offers, so
/// a change does not make every waiter read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerChange {
    /// The task that changed; `None`: any may have (a relay was lost).
    pub task: Option<Uuid>,
    /// Whether a task became claimable (offered, offered again, released).
    pub offered: bool,
}

impl WorkerChange {
    /// Any task may have changed, and may be claimable.
    pub const ANY: WorkerChange = WorkerChange {
        task: None,
        offered: true,
    };

    /// One change's part of a notify payload (`ANY` is the empty string).
    fn payload(&self) -> String {
        match self.task {
            Some(task) => format!("{task}:{}", u8::from(self.offered)),
            None => String::new(),
        }
    }

    /// Reads one change's part of a payload; anything else is [`WorkerChange::ANY`].
    fn from_part(part: &str) -> WorkerChange {
        let parsed = part.split_once(':').and_then(|(task, offered)| {
            Some(WorkerChange {
                task: Some(task.parse().ok()?),
                offered: match offered {
                    "0" => false,
                    "1" => true,
                    _ => return None,
                },
            })
        });
        parsed.unwrap_or(WorkerChange::ANY)
    }

    /// The changes a notify payload carries (comma-separated); a garbled or
    /// empty part is [`WorkerChange::ANY`], so nothing is ever missed.
    pub fn from_payload(payload: &str) -> Vec<WorkerChange> {
        payload.split(',').map(WorkerChange::from_part).collect()
    }

    /// Whether the step waiting on `task` must read it again.
    pub fn concerns_task(&self, task: Uuid) -> bool {
        self.task.is_none_or(|t| t == task)
    }

    /// Whether a waiting claim must look for a task again.
    pub fn concerns_claims(&self) -> bool {
        self.offered || self.task.is_none()
    }
}

/// The payloads that tell `changes` from the process `origin`: one per
/// [`CHANGES_PER_NOTICE`], or a single "any" when the batch overflowed.
/// Each starts with its origin (`<hex>;`), so the sender's own listener
/// skips what this process was told already.
fn payloads(origin: u64, changes: &[WorkerChange], overflowed: bool) -> Vec<String> {
    if overflowed || changes.iter().any(|c| c.task.is_none()) {
        return vec![format!("{origin:x};{}", WorkerChange::ANY.payload())];
    }
    changes
        .chunks(CHANGES_PER_NOTICE)
        .map(|chunk| {
            let parts: Vec<String> = chunk.iter().map(WorkerChange::payload).collect();
            format!("{origin:x};{}", parts.join(","))
        })
        .collect()
}

/// The changes a notify payload tells the process `own`: none when it sent
/// them itself (its waiters were told at the commit), all of them when it
/// came from another process, or from a release that sent no origin.
pub fn heard(payload: &str, own: u64) -> Vec<WorkerChange> {
    match payload.split_once(';') {
        Some((origin, _)) if u64::from_str_radix(origin, 16) == Ok(own) => Vec::new(),
        Some((_, changes)) => WorkerChange::from_payload(changes),
        None => WorkerChange::from_payload(payload),
    }
}

/// Changes waiting for the next notify.
#[derive(Debug, Default)]
struct Pending {
    changes: Vec<WorkerChange>,
    overflowed: bool,
}

#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Arc<tokio::sync::Notify>,
}

impl Drop for Shared {
    /// Wakes the sender so it sees it is no longer needed and ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// Sends worker task changes to other replicas after their commits (see
/// the module's doc); cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerNotices {
    shared: Arc<Shared>,
}

impl WorkerNotices {
    /// Starts the sender of the process `origin` over a connection to
    /// `pool`'s database of its own (opened on first use, opened again
    /// after an error).
    pub fn start(pool: &PgPool, origin: u64) -> WorkerNotices {
        let wake = Arc::new(tokio::sync::Notify::new());
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: wake.clone(),
        });
        // A notice is a hint whose change is durable already: its commit
        // need not wait for the WAL flush (a notify takes a transaction id,
        // so each one waited for an fsync of its own).
        let options = (*pool.connect_options())
            .clone()
            .options([("synchronous_commit", "off")]);
        tokio::spawn(send_batches(Arc::downgrade(&shared), wake, options, origin));
        WorkerNotices { shared }
    }

    /// Queues `change` for the next notify; never waits.
    pub fn tell(&self, change: WorkerChange) {
        if let Ok(mut pending) = self.shared.pending.lock() {
            if pending.changes.len() < MAX_PENDING {
                pending.changes.push(change);
            } else {
                pending.overflowed = true;
            }
        }
        self.shared.wake.notify_one();
    }
}

/// Takes what is pending, leaving nothing.
fn take(shared: &Shared) -> Pending {
    shared
        .pending
        .lock()
        .map(|mut pending| std::mem::take(&mut *pending))
        .unwrap_or_default()
}

/// The sender: waits for changes, then notifies all that queued meanwhile.
/// Ends when the last [`WorkerNotices`] is dropped.
async fn send_batches(
    shared: std::sync::Weak<Shared>,
    wake: Arc<tokio::sync::Notify>,
    options: PgConnectOptions,
    origin: u64,
) {
    let mut conn: Option<PgConnection> = None;
    loop {
        let Some(batch) = shared.upgrade().map(|s| take(&s)) else {
            return;
        };
        if batch.changes.is_empty() && !batch.overflowed {
            // A `tell` since the take left a permit: this returns at once.
            wake.notified().await;
            continue;
        }
        for payload in payloads(origin, &batch.changes, batch.overflowed) {
            if let Err(err) = notify(&mut conn, &options, &payload).await {
                // Not retried: the waiters' next read finds the change.
                tracing::warn!(error = %err, "worker change notice not sent");
                conn = None;
            }
        }
    }
}

/// One notify on the sender's connection, opening it first when needed.
async fn notify(
    conn: &mut Option<PgConnection>,
    options: &PgConnectOptions,
    payload: &str,
) -> sqlx::Result<()> {
    if conn.is_none() {
        *conn = Some(options.connect().await?);
    }
    let Some(open) = conn.as_mut() else {
        return Ok(());
    };
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(WORKERS_CHANNEL)
        .bind(payload)
        .execute(open)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(offered: bool) -> WorkerChange {
        WorkerChange {
            task: Some(Uuid::new_v4()),
            offered,
        }
    }

    #[test]
    fn a_change_goes_through_its_notify_payload_unchanged() {
        for offered in [false, true] {
            let one = change(offered);
            assert_eq!(WorkerChange::from_payload(&one.payload()), vec![one]);
        }
        assert_eq!(WorkerChange::ANY.payload(), "");
        let task = Uuid::new_v4();
        for garbled in [
            "",
            "x",
            "not-a-uuid:1",
            &format!("{task}:2"),
            &format!("{task}"),
        ] {
            assert_eq!(
                WorkerChange::from_payload(garbled),
                vec![WorkerChange::ANY],
                "{garbled}"
            );
        }
    }

    #[test]
    fn a_batch_goes_out_in_payloads_under_the_limit_and_comes_back_whole() {
        let changes: Vec<WorkerChange> = (0..250).map(|i| change(i % 2 == 0)).collect();
        let sent = payloads(u64::MAX, &changes, false);
        assert_eq!(sent.len(), 3, "100 a notify");
        assert!(
            sent.iter().all(|p| p.len() < 8_000),
            "under Postgres's limit"
        );
        let heard: Vec<WorkerChange> = sent.iter().flat_map(|p| heard(p, 7)).collect();
        assert_eq!(heard, changes);
    }

    #[test]
    fn an_overflowed_or_unknown_batch_says_any_task_may_have_changed() {
        let changes = vec![change(true), change(false)];
        assert_eq!(payloads(10, &changes, true), vec!["a;".to_string()]);
        let with_any = vec![change(true), WorkerChange::ANY];
        assert_eq!(payloads(10, &with_any, false), vec!["a;".to_string()]);
        assert_eq!(
            heard(&payloads(10, &changes, true)[0], 11),
            vec![WorkerChange::ANY]
        );
        // A garbled part among good ones wakes everyone, and loses no good one.
        let good = change(true);
        let heard = WorkerChange::from_payload(&format!("{},junk", good.payload()));
        assert_eq!(heard, vec![good, WorkerChange::ANY]);
    }

    #[test]
    fn a_process_skips_its_own_notices_and_hears_everyone_elses() {
        let changes = vec![change(true), change(false)];
        let sent = payloads(0xbeef, &changes, false);
        assert!(heard(&sent[0], 0xbeef).is_empty(), "told locally already");
        assert_eq!(heard(&sent[0], 0xfeed), changes);
        // A release that sends no origin is heard whole, as before.
        let old: Vec<String> = changes.iter().map(WorkerChange::payload).collect();
        assert_eq!(heard(&old.join(","), 0xbeef), changes);
        // A garbled origin is someone else's.
        assert_eq!(
            heard(&format!("zz;{}", changes[0].payload()), 0xbeef),
            vec![changes[0]]
        );
    }

    #[tokio::test]
    async fn queued_changes_beyond_the_cap_become_one_overflow() {
        let shared = Shared {
            pending: Mutex::new(Pending::default()),
            wake: Arc::new(tokio::sync::Notify::new()),
        };
        let notices = WorkerNotices {
            shared: Arc::new(shared),
        };
        for _ in 0..MAX_PENDING + 5 {
            notices.tell(change(true));
        }
        let batch = take(&notices.shared);
        assert_eq!(batch.changes.len(), MAX_PENDING);
        assert!(batch.overflowed);
        let after = take(&notices.shared);
        assert!(after.changes.is_empty() && !after.overflowed, "taken whole");
    }
}
