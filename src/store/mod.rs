//! Postgres storage: sessions, iterations, checkpoints, events and leases.
//! Postgres is the source of truth; every write made on behalf of a running
//! session is fenced by the lease token of the replica that runs it.
//!
//! The fence compares the status with `IS NOT DISTINCT FROM`, never `=`
//! (the column is `NOT NULL`, so both mean the same). `=` lets the planner
//! reach the row through the status indexes, and on a table whose
//! statistics are stale (every fresh database) it believes "running" matches
//! one row and scans every running session for each write: at 1,000
//! sessions that halved the iteration rate until an `ANALYZE`. With the
//! comparison out of the indexes' reach, only the primary key serves.
//!
//! Modules depend one way: `rows` (every row type) depends on no other store
//! module; `events` and `checkpoints` write rows; `group_commit` writes
//! iterations in groups; `iterations` and `sessions` build on those; the
//! rest read and write one table each. `control` owns the NOTIFY channel
//! (an in-process channel on the embedded server); `embedded` runs that server;
//! `queue` claims the sessions that wait for a replica with capacity.

mod approvals;
pub mod archive;
mod batch;
mod checkpoints;
mod children;
mod connection;
mod control_channel;
#[cfg(feature = "embedded")]
pub mod embedded;
mod event_log;
mod fleet;
pub mod flush;
mod group_commit;
mod histories;
pub mod idempotency;
mod iterations;
mod journal;
mod keys;
mod leases;
mod model_calls;
mod notify;
mod outcomes;
mod past_runs;
mod queue;
pub mod quotas;
mod rebuild;
mod reflections;
mod replay;
mod rows;
pub mod schema;
mod scope;
mod secrets;
mod sessions;
pub mod snapshots;
mod tasks;
#[cfg(test)]
pub(crate) mod testing;
mod thresholds;
mod trace_links;
mod worker_desk;
mod worker_notices;
mod worker_tasks;
mod worker_writes;

pub use approvals::{
    ApprovalCursor, ApprovalRow, Decided, NewApproval, NewDecision, call_id as approval_call_id,
    count_waiting as count_waiting_approvals, decide as decide_approval,
};
pub use children::{
    ChildAttention, DelegateError, Delegated, Delegator, ForkRow, LiveNode, TreeRow,
    delegate as delegate_on, set_child_pause_policy, wait_for_children,
};
pub use connection::{begin_detached, is_unavailable};
pub use control_channel::{
    BadControlNote, CONTROL_CHANNEL, ControlAction, ControlNote, KEYS_CHANNEL,
};
pub use event_log::append as append_events;
pub use fleet::{FleetCounts, OwnerLiveness, owner_liveness_on, replica_covers_on};
pub use histories::MAX_REPORTED_SESSIONS;
pub use keys::{KeyRecord, NewKey};
pub use leases::storable_text;
pub use notify::{DueNotification, NotificationRow, NotifyTarget, Settled, StoredNotifySecret};
pub use past_runs::{MAX_HISTORY, PastRun};
pub use queue::queue_waiting;
pub use rebuild::rebuild_inputs_on;
pub use replay::{ReplayReflection, ReplayRows, ReplayStep};
pub use rows::{
    AgentTask, AgentTaskWrite, Attempt, CheckpointRecord, Claimed, ControlFlags, Counters,
    EventRecord, IterationRecord, JsonText, Lease, NewEvent, NewIteration, NewReflection,
    NewSession, Outcomes, RebuildInputs, RefinementRecord, ReflectionRecord, ReflectionSummary,
    Renewed, Session, SessionCursor, SessionFilter, SessionOrder, SessionSettings, SessionSortKey,
    TASK_STATUSES,
};
pub use scope::TenantScope;
pub use secrets::{PlaintextKey, StoredSecret, insert_secret};
pub use sessions::{
    delete as delete_session, end_unowned, insert as insert_session, insert_refinement,
    lock as lock_session, request_pause, request_stop, resume as resume_session, set_confirmation,
    start_refined, update_settings,
};
pub use thresholds::{Applied, NewThresholdChange, TenantSessionDefaults, ThresholdChangeRow};
pub use trace_links::{StoredTraceLinks, set_request_traceparent};
pub use worker_desk::{ClaimTicket, Handoff, OfferedStep, OutcomeTicket, WorkerDesk};
pub use worker_notices::{WORKERS_CHANNEL, WorkerChange};
pub use worker_tasks::{
    Claimant, ClaimedWorkerTask, Heartbeat, LeaseCheck, NewWorkerTask, OpenedTask, QueueDepth,
    Settlement, TaskEnd, WaitingWorkerTask, WorkerSeen, WorkerTaskSnapshot,
    charge_uncollected_outcomes, wait_for_worker_change,
};

use std::sync::{Arc, OnceLock};

use group_commit::GroupCommit;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;
use worker_writes::WorkerWrites;

tokio::task_local! {
    /// Who the current request acts for (an API key's public prefix, never
    /// its secret): set by the HTTP auth gate, recorded on every event the
    /// request's transactions append.
    pub static ACTOR: String;
}

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration could not be applied.
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// The database's schema has migrations this binary does not know (a
    /// newer release applied them): nothing was changed.
    #[error(
        "this database's schema is at migration {database}, newer than this binary's {binary}: \
a newer Warden has upgraded it. Run that newer version, or roll the schema back first with the \
newer version's `warden migrate --down-to {binary}` (see docs/operations/upgrades.md)"
    )]
    SchemaNewer {
        /// The newest migration applied to the database.
        database: i64,
        /// The newest migration this binary has.
        binary: i64,
    },
    /// The schema lacks migrations of this binary and migrating was not
    /// asked for (`WARDEN_MIGRATE=off`).
    #[error(
        "this database's schema is at migration {database}, behind this binary's {binary} \
({pending} to apply) and WARDEN_MIGRATE=off: run `warden migrate` (`warden migrate --dry-run` \
lists them), or start with WARDEN_MIGRATE=auto"
    )]
    SchemaBehind {
        /// The newest migration applied to the database.
        database: i64,
        /// The newest migration this binary has.
        binary: i64,
        /// How many migrations of this binary are not applied.
        pending: usize,
    },
    /// `migrate --down-to` would have to reverse a migration that has no
    /// reverse: nothing was changed.
    #[error(
        "migration {migration} cannot be reversed (it has no down script: the data it changed \
cannot be put back); nothing was changed. Restore a backup taken before it to go further back"
    )]
    Irreversible {
        /// The migration concerned.
        migration: String,
    },
    /// The writer no longer holds the session's lease; nothing was written.
    #[error("lease on session {0} is no longer held by this replica")]
    LeaseLost(Uuid),
    /// The iteration committer or the worker writer stopped (the runtime
    /// is shutting down).
    #[error("the committer has stopped (shutting down)")]
    CommitterGone,
    /// The loop tried to pause a session a user has asked to stop; nothing
    /// was written, and the loop must record the stop instead.
    #[error("session {0} has a stop request pending; a stop wins over a pause")]
    StopPending(Uuid),
    /// The embedded database's files could not be flushed to the disk.
    #[error(transparent)]
    Flush(#[from] flush::FlushError),
    /// An archived session cannot be imported as it is.
    #[error("cannot import session {id}: {detail}")]
    Import {
        /// Session concerned.
        id: Uuid,
        /// Why not.
        detail: String,
    },
    /// A key check value could not be sealed (no randomness).
    #[error("cannot seal a key check value: {0}")]
    Secret(String),
    /// A stored value could not be decoded.
    #[error("stored data for session {id} is invalid: {detail}")]
    Corrupt {
        /// Session concerned.
        id: Uuid,
        /// What was wrong.
        detail: String,
    },
}

/// Shorthand for storage results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The handle every other layer uses to reach Postgres.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// Announces, in this process, that a session's log grew; event streams
    /// wake on it and read the new events from Postgres. A lagging or absent
    /// listener never slows a writer.
    appended: tokio::sync::broadcast::Sender<Uuid>,
    /// The iteration committer, started on first use (it needs a runtime).
    committer: Arc<OnceLock<GroupCommit>>,
    /// The writer of grouped worker offers and completions, started on
    /// first use (it needs a runtime) over the pool of the first store to
    /// use it; shared by siblings.
    worker_writes: Arc<OnceLock<WorkerWrites>>,
    /// On the embedded server (one process, one backend, no second
    /// connection to LISTEN on): control notes travel in this process.
    local_control: Option<tokio::sync::broadcast::Sender<ControlNote>>,
    /// Announces, in this process, that API keys changed (made here, or
    /// relayed from [`KEYS_CHANNEL`]): the key cache drops what it holds.
    keys_changed: tokio::sync::broadcast::Sender<()>,
    /// On the embedded server, the flush that puts commits on the disk
    /// (its engine does not fsync; see `flush`).
    disk_flush: Option<flush::DiskFlush>,
    /// Every worker task change in this process (made here, or relayed
    /// from [`WORKERS_CHANNEL`]): waiting claims and steps hear of it.
    worker_tasks_changed: Arc<tokio::sync::broadcast::Sender<WorkerChange>>,
    /// Tells other replicas of worker task changes after their commits,
    /// started on first use (it needs a runtime).
    worker_notices: Arc<OnceLock<worker_notices::WorkerNotices>>,
    /// Claims waiting on this replica, handed the next step offered here.
    worker_desk: Arc<WorkerDesk>,
    /// This process's mark on the worker notices it sends, so its own
    /// listener skips them (shared by siblings: one process, one origin).
    notice_origin: u64,
}

/// Worker task changes a waiter may fall behind by before it reads again
/// anyway (a lagging receiver is told so, and treats it as a change).
const WORKER_CHANGES: usize = 4_096;

/// Idle time after which a pooled connection is checked before it is used.
const PING_WHEN_IDLE_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// A process's notice origin: random, so two replicas never share one.
fn rand_origin() -> u64 {
    Uuid::new_v4().as_u64_pair().0
}

fn announcer() -> tokio::sync::broadcast::Sender<Uuid> {
    tokio::sync::broadcast::channel(4_096).0
}

impl Store {
    /// Connects a pool to `url`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store> {
        let pool = Store::pool_options(max_connections).connect(url).await?;
        Ok(Store::from_pool(pool))
    }

    /// The options of Warden's pools. A connection is pinged before use only
    /// after it sat idle for a while: pinging on every acquire (sqlx's
    /// default) doubles the round trips of a busy pool, and a connection
    /// that breaks while busy is dropped by sqlx on its first error anyway.
    pub fn pool_options(max_connections: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_WHEN_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    /// Wraps an existing pool (tests hand one in per database).
    pub fn from_pool(pool: PgPool) -> Store {
        Store {
            pool,
            appended: announcer(),
            committer: Arc::new(OnceLock::new()),
            worker_writes: Arc::new(OnceLock::new()),
            local_control: None,
            keys_changed: tokio::sync::broadcast::channel(16).0,
            disk_flush: None,
            worker_tasks_changed: Arc::new(tokio::sync::broadcast::channel(WORKER_CHANGES).0),
            worker_notices: Arc::new(OnceLock::new()),
            worker_desk: Arc::new(WorkerDesk::default()),
            notice_origin: rand_origin(),
        }
    }

    /// Wraps the pool of an embedded server: control notes go through an
    /// in-process channel instead of LISTEN/NOTIFY (the one backend has no
    /// connection to spare for a listener, and no other process shares it).
    pub fn single_process(pool: PgPool) -> Store {
        Store {
            local_control: Some(tokio::sync::broadcast::channel(1_024).0),
            ..Store::from_pool(pool)
        }
    }

    /// The store of the embedded server: one process, and every commit that
    /// promises durability flushed to the filesystem of `data_dir`.
    pub fn embedded(pool: PgPool, data_dir: &std::path::Path) -> Result<Store> {
        let flusher = flush::DiskFlush::of_directory(data_dir)?;
        Ok(Store::single_process(pool).flushing_with(flusher))
    }

    /// Makes the commits that promise durability wait for `flusher` (the
    /// embedded server, whose engine does not fsync).
    pub fn flushing_with(self, flusher: flush::DiskFlush) -> Store {
        Store {
            disk_flush: Some(flusher),
            ..self
        }
    }

    /// Returns once what was committed before the call is on the disk: at
    /// once on a Postgres server (its commit already was), after a flush of
    /// the data directory on the embedded one.
    pub async fn durable(&self) -> Result<()> {
        match &self.disk_flush {
            Some(flusher) => Ok(flusher.flush().await?),
            None => Ok(()),
        }
    }

    /// Whether this store is the single process on its database (the
    /// embedded server): no second pool, no LISTEN.
    pub fn is_single_process(&self) -> bool {
        self.local_control.is_some()
    }

    /// The in-process control notes, when this store carries them (see
    /// [`Store::single_process`]); `None` means: LISTEN on Postgres.
    pub fn local_control(&self) -> Option<tokio::sync::broadcast::Receiver<ControlNote>> {
        self.local_control.as_ref().map(|tx| tx.subscribe())
    }

    fn worker_notices(&self) -> &worker_notices::WorkerNotices {
        self.worker_notices
            .get_or_init(|| worker_notices::WorkerNotices::start(&self.pool, self.notice_origin))
    }

    fn worker_writes(&self) -> &WorkerWrites {
        self.worker_writes
            .get_or_init(|| WorkerWrites::start(self.pool.clone()))
    }

    fn group_commit(&self) -> &GroupCommit {
        self.committer
            .get_or_init(|| GroupCommit::start(self.pool.clone()))
    }

    /// A store over another pool of the same database that shares this
    /// one's announcements, so streams served from one see appends made
    /// through the other.
    pub fn sibling(&self, pool: PgPool) -> Store {
        Store {
            pool,
            appended: self.appended.clone(),
            committer: Arc::new(OnceLock::new()),
            // One writer per process: the loops' offers and the API's
            // completions share its batches.
            worker_writes: self.worker_writes.clone(),
            local_control: self.local_control.clone(),
            keys_changed: self.keys_changed.clone(),
            disk_flush: self.disk_flush.clone(),
            worker_tasks_changed: self.worker_tasks_changed.clone(),
            worker_notices: self.worker_notices.clone(),
            worker_desk: self.worker_desk.clone(),
            notice_origin: self.notice_origin,
        }
    }

    /// Tells this process that API keys changed (other processes learn it
    /// from the trigger's NOTIFY on [`KEYS_CHANNEL`]).
    pub fn keys_changed_locally(&self) {
        // No receiver is not an error: no authenticator is running.
        let _ = self.keys_changed.send(());
    }

    /// Announcements that API keys changed, in this process.
    pub fn key_changes(&self) -> tokio::sync::broadcast::Receiver<()> {
        self.keys_changed.subscribe()
    }

    /// Tells this process's event streams that `session_id` has new events.
    pub fn announce(&self, session_id: Uuid) {
        // No receiver is not an error: nobody is watching.
        let _ = self.appended.send(session_id);
    }

    /// Wakes on every announced append (of any session).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Uuid> {
        self.appended.subscribe()
    }

    /// Answers when Postgres answers.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query_scalar!("SELECT 1")
            .fetch_one(&self.pool)
            .await?;
        Ok(())
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}
