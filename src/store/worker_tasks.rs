//! Worker tasks: the steps of sessions whose executor is `worker`, offered
//! on a queue to workers that call in. A worker claims the oldest task of
//! its queues (`FOR UPDATE SKIP LOCKED`, so two never get the same one)
//! under a lease it keeps with heartbeats; only a digest of the lease token
//! is stored. Every function takes the caller's [`TenantScope`] (and a
//! worker's queues), so a task of another tenant or queue is not found.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::rows::NewEvent;
use super::worker_notices::WorkerChange;
use super::worker_writes::{CompleteWrite, OfferWrite};
use super::{Result, Store, TenantScope, event_log};
use crate::event::{ChargeSource, SessionEvent};
use crate::policy::budget;
use crate::policy::worker::{self, BeatFacts, BeatReason, BeatVerdict, WorkerTaskState};

/// A step to offer.
#[derive(Debug, Clone)]
pub struct NewWorkerTask<'a> {
    /// Fresh id.
    pub id: Uuid,
    /// Session of the step.
    pub session_id: Uuid,
    /// The queue it goes on.
    pub queue: &'a str,
    /// Labels a worker may select on.
    pub labels: &'a BTreeMap<String, String>,
    /// Iteration of the step.
    pub iteration: u64,
    /// Lease length, ms.
    pub heartbeat_timeout_ms: u64,
    /// The same for every attempt of this iteration.
    pub idempotency_key: &'a str,
    /// The step context: the executor layer's webhook request, handed to
    /// the worker as it is (the store reads only its `token_allowance`).
    pub context: &'a serde_json::Value,
    /// The offering run opened the previous iteration's task and collected
    /// it: no task of the session is left open (its first open took over or
    /// superseded any older run's), so the task is simply inserted, grouped
    /// with other writes (see `worker_writes`).
    pub steady: bool,
}

impl NewWorkerTask<'_> {
    /// The task as its first claim answers it, under `lease_token`.
    fn claimed(&self, lease_token: String, lease_expires_at: DateTime<Utc>) -> ClaimedWorkerTask {
        ClaimedWorkerTask {
            id: self.id,
            lease_token,
            lease_expires_at,
            heartbeat_timeout_ms: i64::try_from(self.heartbeat_timeout_ms).unwrap_or(i64::MAX),
            session_id: self.session_id,
            queue: self.queue.to_owned(),
            labels: self.labels.clone(),
            iteration: i64::try_from(self.iteration).unwrap_or(i64::MAX),
            attempt: 1,
            idempotency_key: self.idempotency_key.to_owned(),
            context: self.context.clone(),
        }
    }
}

/// What the open's statement returns: the task taken over, or the new
/// task's state with the database's clock and the session's pause flag.
struct OpenRow {
    adopted: Option<Uuid>,
    state: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    pause_requested: Option<bool>,
}

/// The task a step waits on, as opened.
#[derive(Debug, Clone)]
pub struct OpenedTask {
    /// Its id.
    pub id: Uuid,
    /// When it was claimed at once for the waiting claim named: the task
    /// as that claim answers it.
    pub handed: Option<ClaimedWorkerTask>,
    /// A new task as a read of it right after the open would find it (none
    /// for a task taken over: read it).
    pub as_opened: Option<WorkerTaskSnapshot>,
}

/// Where a task stands, as the waiting step reads it.
#[derive(Debug, Clone)]
pub struct WorkerTaskSnapshot {
    /// Its state.
    pub state: WorkerTaskState,
    /// Attempt number (1-based).
    pub attempt: i32,
    /// When it was (last) offered.
    pub offered_at: DateTime<Utc>,
    /// When the current lease lapses.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The outcome a worker reported: free-form agent data, read as the
    /// webhook answer by the waiting step.
    pub outcome: Option<serde_json::Value>,
    /// The last error (a failed attempt, a lapsed lease).
    pub last_error: Option<String>,
    /// Whether a failure may be retried.
    pub retryable: bool,
    /// The database's clock, for comparisons with the times above.
    pub now: DateTime<Utc>,
    /// A pause of the session was asked for.
    pub pause_requested: bool,
    /// A newer run of the session took the task over: this one lost the session.
    pub taken_over: bool,
}

/// The worker a claim is for: its name and the labels it advertises.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The worker's own name (for the queue listing).
    pub name: &'a str,
    /// Its labels: it takes only tasks whose labels it has every one of.
    pub labels: &'a BTreeMap<String, String>,
}

/// A task a worker claimed.
#[derive(Debug, Clone)]
pub struct ClaimedWorkerTask {
    /// Task id.
    pub id: Uuid,
    /// The lease token, shown this once.
    pub lease_token: String,
    /// When the lease lapses without a heartbeat.
    pub lease_expires_at: DateTime<Utc>,
    /// Lease length, ms.
    pub heartbeat_timeout_ms: i64,
    /// Session.
    pub session_id: Uuid,
    /// Queue.
    pub queue: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Iteration.
    pub iteration: i64,
    /// Attempt.
    pub attempt: i32,
    /// Idempotency key.
    pub idempotency_key: String,
    /// Step context (the webhook request, as offered).
    pub context: serde_json::Value,
}

/// What a worker's call on a task it names found.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseCheck<T> {
    /// No such task for this caller (unknown, another tenant's or queue's).
    NotFound,
    /// The lease is no longer this token's.
    Lost,
    /// The step was given up (stopped, paused, superseded, its lease
    /// lapsed): what the call reported is not taken, but the usage it
    /// reported was charged to the session (this many tokens, once per lease).
    Charged(u64),
    /// Done.
    Held(T),
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// What the worker is told of its step: abandon it (when
    /// [`BeatReason::abandon`]), or finish it though its replica drains.
    pub cancel: Option<BeatReason>,
    /// The lease's new end.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Tokens the step may still use.
    pub token_allowance: u64,
}

/// One queue of the listing.
#[derive(Debug, Clone)]
pub struct QueueDepth {
    /// Tenant.
    pub tenant: String,
    /// Queue.
    pub queue: String,
    /// Tasks waiting for a worker.
    pub depth: i64,
    /// Age of the oldest waiting task, ms.
    pub oldest_task_age_ms: Option<i64>,
}

/// A worker seen on a queue.
#[derive(Debug, Clone)]
pub struct WorkerSeen {
    /// Tenant.
    pub tenant: String,
    /// Queue.
    pub queue: String,
    /// The worker's own name.
    pub worker: String,
    /// Its last claim or heartbeat.
    pub last_seen_at: DateTime<Utc>,
    /// The task it holds, if any.
    pub task_id: Option<Uuid>,
}

/// SHA-256 of a lease token, the only form in which it is kept.
fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A fresh lease token (two random UUIDs' worth of hex).
fn new_token() -> String {
    format!("wlt_{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

/// Waits up to `within` for a change that `concerns` the waiter; a waiter
/// that fell behind (or a closed channel) returns at once, to read again.
pub async fn wait_for_worker_change(
    changes: &mut tokio::sync::broadcast::Receiver<WorkerChange>,
    within: std::time::Duration,
    concerns: impl Fn(&WorkerChange) -> bool,
) {
    let wait = async {
        loop {
            match changes.recv().await {
                Ok(change) if concerns(&change) => return,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let _ = tokio::time::timeout(within, wait).await;
}

impl Store {
    /// Tells this process's waiting claims and steps that a task changed.
    pub fn workers_changed_locally(&self, change: WorkerChange) {
        // No receiver is no one waiting: nothing to tell.
        let _ = self.worker_tasks_changed.send(change);
    }

    /// Tells this process's waiters the changes of a notice heard on
    /// [`WORKERS_CHANNEL`], unless this process sent it.
    pub fn worker_notice_heard(&self, payload: &str) {
        for change in super::worker_notices::heard(payload, self.notice_origin) {
            self.workers_changed_locally(change);
        }
    }

    /// Hears every task change announced in this process (relayed from
    /// [`WORKERS_CHANNEL`] for other replicas'), from now on.
    pub fn worker_changes(&self) -> tokio::sync::broadcast::Receiver<WorkerChange> {
        self.worker_tasks_changed.subscribe()
    }

    /// Tells waiting claims and steps, here and on other replicas, of a
    /// committed task change (other replicas' after the commit, coalesced
    /// with others: see `worker_notices`).
    fn worker_task_changed(&self, change: WorkerChange) {
        self.workers_changed_locally(change);
        if !self.is_single_process() {
            self.worker_notices().tell(change);
        }
    }

    /// Opens the step of `task.iteration` for the run `run` (the session's
    /// lease token) and returns the task it waits on. A task of that
    /// iteration a run before this one left (a takeover, a drain) is taken
    /// over, not offered again: a done one is collected, a claimed one stays
    /// with its worker, a pending one gets this run's context. Any other
    /// task of the session still open is cancelled (`superseded`). A new
    /// task is claimed at once for `to` (a claim waiting on this replica)
    /// when its session may be claimed from: running, no stop or pause asked.
    pub async fn open_worker_task(
        &self,
        task: &NewWorkerTask<'_>,
        run: Uuid,
        scope: &TenantScope,
        to: Option<&str>,
    ) -> Result<OpenedTask> {
        let token = to.map(|_| new_token());
        let lease_digest = token.as_deref().map(digest);
        let row = match (task.steady, scope.tenant()) {
            (true, Some(tenant)) => {
                self.insert_steady_task(task, run, tenant, lease_digest, to)
                    .await?
            }
            _ => {
                self.open_task_row(task, run, scope, lease_digest, to)
                    .await?
            }
        };
        if let Some(id) = row.adopted {
            tracing::info!(task = %id, iteration = task.iteration, "worker task taken over by a new run");
            return Ok(OpenedTask {
                id,
                handed: None,
                as_opened: None,
            });
        }
        let Some(state) = row.state else {
            return Err(super::StoreError::Corrupt {
                id: task.session_id,
                detail: "the session of a worker task is not within its own scope".into(),
            });
        };
        let handed = match (state.as_str(), token, row.lease_expires_at) {
            ("claimed", Some(lease_token), Some(expires)) => {
                Some(task.claimed(lease_token, expires))
            }
            _ => None,
        };
        let change = WorkerChange {
            task: Some(task.id),
            // A task handed over is nobody else's to claim.
            offered: handed.is_none(),
        };
        if handed.is_some() {
            // No one elsewhere waits on a task new and handed here (should
            // the hand-off fall through, putting it back tells everyone).
            self.workers_changed_locally(change);
        } else {
            self.worker_task_changed(change);
        }
        let as_opened = WorkerTaskSnapshot {
            state: if handed.is_some() {
                WorkerTaskState::Claimed
            } else {
                WorkerTaskState::Pending
            },
            attempt: 1,
            offered_at: row.now,
            lease_expires_at: row.lease_expires_at,
            outcome: None,
            last_error: None,
            retryable: true,
            now: row.now,
            pause_requested: row.pause_requested.unwrap_or(false),
            taken_over: false,
        };
        Ok(OpenedTask {
            id: task.id,
            handed,
            as_opened: Some(as_opened),
        })
    }

    /// A steady step's open: its task inserted with other worker writes
    /// (see [`NewWorkerTask::steady`]).
    async fn insert_steady_task(
        &self,
        task: &NewWorkerTask<'_>,
        run: Uuid,
        tenant: &str,
        lease_digest: Option<Vec<u8>>,
        to: Option<&str>,
    ) -> Result<OpenRow> {
        let written = self
            .worker_writes()
            .offer(OfferWrite {
                id: task.id,
                session_id: task.session_id,
                tenant: tenant.to_owned(),
                queue: task.queue.to_owned(),
                labels: serde_json::to_string(task.labels).map_err(|e| {
                    super::StoreError::Corrupt {
                        id: task.session_id,
                        detail: format!("worker task labels: {e}"),
                    }
                })?,
                iteration: i64::try_from(task.iteration).unwrap_or(i64::MAX),
                heartbeat_timeout_ms: i64::try_from(task.heartbeat_timeout_ms).unwrap_or(i64::MAX),
                idempotency_key: task.idempotency_key.to_owned(),
                context: task.context.to_string(),
                run,
                handed_to: lease_digest.zip(to.map(str::to_owned)),
            })
            .await?;
        Ok(match written {
            Some(w) => OpenRow {
                adopted: None,
                state: Some(w.state),
                lease_expires_at: w.lease_expires_at,
                now: w.now,
                pause_requested: Some(w.pause_requested),
            },
            // The session is another run's now (or not this tenant's):
            // nothing was written.
            None => return Err(super::StoreError::LeaseLost(task.session_id)),
        })
    }

    /// The open's statement (see [`Store::open_worker_task`]).
    async fn open_task_row(
        &self,
        task: &NewWorkerTask<'_>,
        run: Uuid,
        scope: &TenantScope,
        lease_digest: Option<Vec<u8>>,
        to: Option<&str>,
    ) -> Result<OpenRow> {
        // One statement, one round trip: its parts see one snapshot, and
        // the task left open (locked first) is never also superseded.
        Ok(sqlx::query_as!(
            OpenRow,
            r#"WITH left_open AS (
                 SELECT id FROM worker_tasks
                 WHERE session_id = $2 AND iteration = $5
                   AND state IN ('pending', 'claimed', 'completed', 'failed')
                   AND ($9::text IS NULL OR tenant = $9)
                 ORDER BY offered_at DESC, created_at DESC LIMIT 1 FOR UPDATE),
               adopted AS (
                 UPDATE worker_tasks t SET run_token = $10, cancel_reason = NULL, updated_at = now(),
                        context = CASE WHEN t.state = 'pending' THEN $8 ELSE t.context END
                 FROM left_open WHERE t.id = left_open.id
                 RETURNING t.id),
               superseded AS (
                 UPDATE worker_tasks SET state = 'cancelled', cancel_reason = 'superseded', updated_at = now()
                 WHERE session_id = $2 AND state IN ('pending', 'claimed')
                   AND id NOT IN (SELECT id FROM left_open) AND ($9::text IS NULL OR tenant = $9)),
               inserted AS (
                 INSERT INTO worker_tasks (id, session_id, tenant, queue, labels, iteration,
                                           heartbeat_timeout_ms, state, idempotency_key, context, run_token,
                                           lease_digest, lease_expires_at, claimed_at, worker)
                 SELECT $1, s.id, s.tenant, $3, $4, $5, $6,
                        CASE WHEN h.handed THEN 'claimed' ELSE 'pending' END, $7, $8, $10,
                        CASE WHEN h.handed THEN $11::bytea END,
                        CASE WHEN h.handed THEN now() + make_interval(secs => $6::bigint / 1000.0) END,
                        CASE WHEN h.handed THEN now() END,
                        CASE WHEN h.handed THEN $12::text END
                 FROM sessions s,
                      LATERAL (SELECT $11::bytea IS NOT NULL AND s.status = 'running'
                                      AND NOT s.stop_requested AND NOT s.pause_requested AS handed) h
                 WHERE s.id = $2 AND ($9::text IS NULL OR s.tenant = $9)
                   AND NOT EXISTS (SELECT 1 FROM left_open)
                 RETURNING tenant, queue, state, lease_expires_at),
               seen AS (
                 INSERT INTO workers_seen (tenant, queue, worker, last_seen_at, task_id)
                 SELECT i.tenant, i.queue, $12::text, now(), $1 FROM inserted i WHERE i.state = 'claimed'
                 ON CONFLICT (tenant, queue, worker)
                 DO UPDATE SET last_seen_at = now(), task_id = EXCLUDED.task_id)
               SELECT (SELECT id FROM adopted) AS adopted, i.state AS "state?", i.lease_expires_at,
                      now() AS "now!", s.pause_requested AS "pause_requested?"
               FROM (SELECT 1) AS one LEFT JOIN inserted i ON true
                    LEFT JOIN sessions s ON s.id = $2"#,
            task.id,
            task.session_id,
            task.queue,
            Json(task.labels) as _,
            task.iteration as i64,
            task.heartbeat_timeout_ms as i64,
            task.idempotency_key,
            Json(task.context) as _,
            scope.tenant(),
            run,
            lease_digest,
            to,
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Offers again a task claimed for a waiting claim that was gone
    /// before it could be handed over (its request ended): `pending`, as a
    /// released one, without counting an attempt.
    pub async fn unhand_worker_task(&self, handed: &ClaimedWorkerTask) -> Result<()> {
        let released = sqlx::query!(
            "UPDATE worker_tasks SET state = 'pending', lease_digest = NULL, lease_expires_at = NULL,
                    claimed_at = NULL, worker = NULL, updated_at = now()
             WHERE id = $1 AND state = 'claimed' AND lease_digest = $2",
            handed.id,
            digest(&handed.lease_token),
        )
        .execute(&self.pool)
        .await?;
        if released.rows_affected() > 0 {
            self.worker_task_changed(WorkerChange {
                task: Some(handed.id),
                offered: true,
            });
        }
        Ok(())
    }

    /// Where a task stands, with the session's pause flag and whether a
    /// newer run than `run` took it over.
    pub async fn worker_task_state(
        &self,
        id: Uuid,
        run: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<WorkerTaskSnapshot>> {
        Ok(sqlx::query_as!(
            WorkerTaskSnapshot,
            r#"SELECT t.state AS "state: WorkerTaskState", t.attempt, t.offered_at, t.lease_expires_at,
                      t.outcome AS "outcome: serde_json::Value", t.last_error, t.retryable,
                      now() AS "now!", s.pause_requested,
                      t.run_token IS DISTINCT FROM $3 AS "taken_over!"
               FROM worker_tasks t JOIN sessions s ON s.id = t.session_id
               WHERE t.id = $1 AND ($2::text IS NULL OR t.tenant = $2)"#,
            id,
            scope.tenant(),
            run,
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Offers a task of the run `run` again as attempt `attempt + 1` (its
    /// lease lapsed or its attempt failed); `false` when it is no longer at
    /// `attempt` or no longer that run's.
    pub async fn reoffer_worker_task(
        &self,
        id: Uuid,
        run: Uuid,
        attempt: i32,
        error: &str,
        scope: &TenantScope,
    ) -> Result<bool> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let done = sqlx::query!(
            "UPDATE worker_tasks SET state = 'pending', attempt = attempt + 1, offered_at = now(),
                    lease_digest = NULL, lease_expires_at = NULL, worker = NULL,
                    last_error = $3, updated_at = now()
             WHERE id = $1 AND attempt = $2 AND state IN ('claimed', 'failed')
               AND ($4::text IS NULL OR tenant = $4) AND run_token = $5",
            id,
            attempt,
            error,
            scope.tenant(),
            run,
        )
        .execute(&mut *tx)
        .await?;
        let change = WorkerChange {
            task: Some(id),
            offered: true,
        };
        tx.commit().await?;
        if done.rows_affected() == 1 {
            self.worker_task_changed(change);
        }
        Ok(done.rows_affected() == 1)
    }

    /// Ends a task of the run `run` the step gave up on (`cancelled`, with
    /// why) or that failed for good (`failed`), whatever its lease. A task a
    /// newer run took over is left to it.
    pub async fn end_worker_task(
        &self,
        id: Uuid,
        run: Uuid,
        end: TaskEnd,
        scope: &TenantScope,
    ) -> Result<()> {
        let (state, reason) = end.as_row();
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let ended = sqlx::query!(
            "UPDATE worker_tasks SET state = $2, cancel_reason = $3, updated_at = now()
             WHERE id = $1 AND state IN ('pending', 'claimed', 'failed')
               AND ($4::text IS NULL OR tenant = $4) AND run_token = $5",
            id,
            state.as_str(),
            reason,
            scope.tenant(),
            run,
        )
        .execute(&mut *tx)
        .await?;
        let change = WorkerChange {
            task: Some(id),
            offered: false,
        };
        tx.commit().await?;
        if ended.rows_affected() > 0 {
            self.worker_task_changed(change);
        }
        Ok(())
    }

    /// Marks the task of the run `run` as left by a replica that drains:
    /// it stays with its worker (whose heartbeat says `draining`) for the
    /// run that takes the session over next.
    pub async fn drain_worker_task(&self, id: Uuid, run: Uuid, scope: &TenantScope) -> Result<()> {
        sqlx::query!(
            "UPDATE worker_tasks SET cancel_reason = 'draining', updated_at = now()
             WHERE id = $1 AND state IN ('pending', 'claimed')
               AND ($2::text IS NULL OR tenant = $2) AND run_token = $3",
            id,
            scope.tenant(),
            run,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Hands the sessions whose step a worker completed, but whose owner
    /// went silent for `silence` (its lease not yet lapsed), to the next
    /// rescue at once: their lease ends as a released one does (no expiry,
    /// so the rescue takes them before sessions whose lease merely lapsed).
    /// Without it a done step would wait a whole lease TTL for a dead
    /// owner. Returns how many.
    pub async fn expire_silent_owners_of_done_steps(
        &self,
        silence: std::time::Duration,
    ) -> Result<u64> {
        // `status = 'running'` stays a literal (the partial index's predicate).
        let expired = sqlx::query!(
            "UPDATE sessions s SET lease_expires_at = NULL
             WHERE s.status = 'running' AND s.lease_expires_at > now()
               AND s.heartbeat_at < now() - make_interval(secs => $1)
               AND EXISTS (SELECT 1 FROM worker_tasks t
                           WHERE t.session_id = s.id AND t.iteration > s.iterations
                             AND t.state = 'completed')",
            silence.as_secs_f64(),
        )
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(expired)
    }

    /// Claims the oldest task offered on one of `queues` whose session runs
    /// and is not being stopped or paused, and whose labels the worker has
    /// every one of (`policy::worker::worker_has_labels`, as jsonb
    /// containment), for `worker`; `None` when there is none right now.
    /// Tasks another worker is claiming are skipped.
    pub async fn claim_worker_task(
        &self,
        scope: &TenantScope,
        queues: Option<&[String]>,
        worker: Claimant<'_>,
    ) -> Result<Option<ClaimedWorkerTask>> {
        let token = new_token();
        // One statement: the claim and the worker's listing entry commit
        // together, and a claim that finds nothing costs one round trip.
        let row = sqlx::query!(
            r#"WITH next AS (
                 SELECT t.id FROM worker_tasks t JOIN sessions s ON s.id = t.session_id
                 WHERE t.state = 'pending' AND ($2::text[] IS NULL OR t.queue = ANY($2))
                   AND ($1::text IS NULL OR t.tenant = $1)
                   AND t.labels <@ $5::jsonb
                   AND s.status = 'running' AND NOT s.stop_requested AND NOT s.pause_requested
                 ORDER BY t.offered_at, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED),
               claimed AS (
                 UPDATE worker_tasks w SET state = 'claimed', lease_digest = $3,
                        lease_expires_at = now() + make_interval(secs => w.heartbeat_timeout_ms / 1000.0),
                        claimed_at = now(), worker = $4, charged_tokens = NULL, updated_at = now()
                 FROM next WHERE w.id = next.id
                 RETURNING w.id, w.lease_expires_at, w.heartbeat_timeout_ms, w.session_id, w.tenant,
                           w.queue, w.labels, w.iteration, w.attempt, w.idempotency_key, w.context),
               seen AS (
                 INSERT INTO workers_seen (tenant, queue, worker, last_seen_at, task_id)
                 SELECT c.tenant, c.queue, $4, now(), c.id FROM claimed c
                 ON CONFLICT (tenant, queue, worker)
                 DO UPDATE SET last_seen_at = now(), task_id = EXCLUDED.task_id)
               SELECT c.id AS "id!", c.lease_expires_at AS "lease_expires_at!",
                      c.heartbeat_timeout_ms AS "heartbeat_timeout_ms!", c.session_id AS "session_id!",
                      c.queue AS "queue!", c.labels AS "labels!: Json<BTreeMap<String, String>>",
                      c.iteration AS "iteration!", c.attempt AS "attempt!",
                      c.idempotency_key AS "idempotency_key!", c.context AS "context!: serde_json::Value"
               FROM claimed c"#,
            scope.tenant(),
            queues as Option<&[String]>,
            digest(&token),
            worker.name,
            Json(worker.labels) as _,
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(ClaimedWorkerTask {
            id: row.id,
            lease_token: token,
            lease_expires_at: row.lease_expires_at,
            heartbeat_timeout_ms: row.heartbeat_timeout_ms,
            session_id: row.session_id,
            queue: row.queue,
            labels: row.labels.0,
            iteration: row.iteration,
            attempt: row.attempt,
            idempotency_key: row.idempotency_key,
            context: row.context,
        }))
    }

    /// Notes that `worker` polled `queues` without getting a task, so the
    /// listing shows it connected.
    pub async fn worker_polled(&self, tenant: &str, queues: &[String], worker: &str) -> Result<()> {
        sqlx::query!(
            "INSERT INTO workers_seen (tenant, queue, worker, last_seen_at, task_id)
             SELECT $1, q, $3, now(), NULL FROM unnest($2::text[]) AS q
             ON CONFLICT (tenant, queue, worker)
             DO UPDATE SET last_seen_at = now(), task_id = NULL",
            tenant,
            queues,
            worker,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Extends the lease of `token` on a task and records its progress;
    /// tells the worker why to abandon the step (`policy::worker::heartbeat`),
    /// or that its replica drains.
    pub async fn heartbeat_worker_task(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        progress: Option<&str>,
    ) -> Result<LeaseCheck<Heartbeat>> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let Some(row) = lock_task(&mut tx, id, scope, queues).await? else {
            return Ok(LeaseCheck::NotFound);
        };
        if !row.held_by(token) {
            return Ok(LeaseCheck::Lost);
        }
        let allowance = u64::try_from(row.allowance).unwrap_or(0);
        let verdict = worker::heartbeat(&BeatFacts {
            state: row.state,
            cancel_reason: row.cancel_reason.as_deref(),
            lease_live: row.live,
            status: &row.status,
            stop_requested: row.stop_requested,
            pause_requested: row.pause_requested,
        });
        let note = match verdict {
            BeatVerdict::Lost => return Ok(LeaseCheck::Lost),
            BeatVerdict::Extend { note } => note,
            BeatVerdict::Cancel { reason, end_task } => {
                let cancelled = WorkerChange {
                    task: Some(id),
                    offered: false,
                };
                if end_task {
                    // The waiting step ends now instead of at the lease's end.
                    sqlx::query!(
                        "UPDATE worker_tasks SET state = 'cancelled', cancel_reason = $2, updated_at = now()
                         WHERE id = $1",
                        id,
                        reason.as_str(),
                    )
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                if end_task {
                    self.worker_task_changed(cancelled);
                }
                return Ok(LeaseCheck::Held(Heartbeat {
                    cancel: Some(reason),
                    lease_expires_at: None,
                    token_allowance: allowance,
                }));
            }
        };
        let expires = sqlx::query_scalar!(
            r#"UPDATE worker_tasks SET updated_at = now(),
                      lease_expires_at = now() + make_interval(secs => heartbeat_timeout_ms / 1000.0),
                      progress = coalesce($2, progress)
               WHERE id = $1 RETURNING lease_expires_at AS "lease_expires_at!""#,
            id,
            progress,
        )
        .fetch_one(&mut *tx)
        .await?;
        row.seen_holding(&mut tx, Some(id)).await?;
        tx.commit().await?;
        Ok(LeaseCheck::Held(Heartbeat {
            cancel: note,
            lease_expires_at: Some(expires),
            token_allowance: allowance,
        }))
    }

    /// Ends the lease of `token` on a task: `completed` with an outcome,
    /// `failed` with an error, or back to `pending` (released). The same
    /// token completing again is accepted and changes nothing; a lease that
    /// lapsed, was re-offered or whose session is being stopped is lost.
    pub async fn settle_worker_task(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        settlement: Settlement<'_>,
    ) -> Result<LeaseCheck<()>> {
        if let Settlement::Complete(outcome) = settlement
            && self
                .complete_held_task(id, scope, queues, token, outcome)
                .await?
        {
            return Ok(LeaseCheck::Held(()));
        }
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let Some(row) = lock_task(&mut tx, id, scope, queues).await? else {
            return Ok(LeaseCheck::NotFound);
        };
        if !row.held_by(token) {
            return Ok(LeaseCheck::Lost);
        }
        if row.state == WorkerTaskState::Completed && matches!(settlement, Settlement::Complete(_))
        {
            return Ok(LeaseCheck::Held(()));
        }
        if row.state != WorkerTaskState::Claimed
            || !row.live
            || row.stop_requested
            || row.status != "running"
        {
            // Given up: the outcome is never taken, the usage is (once).
            let check = self
                .charge_after_cancel(&mut tx, id, &row, settlement.reported_tokens())
                .await?;
            tx.commit().await?;
            return Ok(check);
        }
        match settlement {
            Settlement::Complete(outcome) => {
                sqlx::query!(
                    "UPDATE worker_tasks SET state = 'completed', outcome = $2, updated_at = now()
                     WHERE id = $1",
                    id,
                    Json(outcome) as _,
                )
                .execute(&mut *tx)
                .await?;
            }
            Settlement::Fail {
                error, retryable, ..
            } => {
                sqlx::query!(
                    "UPDATE worker_tasks SET state = 'failed', last_error = $2, retryable = $3,
                            updated_at = now()
                     WHERE id = $1",
                    id,
                    error,
                    retryable,
                )
                .execute(&mut *tx)
                .await?;
            }
            Settlement::Release { .. } => {
                sqlx::query!(
                    "UPDATE worker_tasks SET state = 'pending', lease_digest = NULL,
                            lease_expires_at = NULL, worker = NULL, updated_at = now()
                     WHERE id = $1",
                    id,
                )
                .execute(&mut *tx)
                .await?;
            }
        }
        row.seen_holding(&mut tx, None).await?;
        let change = WorkerChange {
            task: Some(id),
            offered: matches!(settlement, Settlement::Release { .. }),
        };
        tx.commit().await?;
        self.worker_task_changed(change);
        Ok(LeaseCheck::Held(()))
    }

    /// The common completion, written with other worker writes (see
    /// `worker_writes`): the task is claimed under `token`, its lease live,
    /// its session running and not being stopped. `false` changes nothing:
    /// the caller settles it the long way, which tells every other case
    /// apart (a repeat, a lost lease, a stop).
    async fn complete_held_task(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        outcome: &serde_json::Value,
    ) -> Result<bool> {
        let queues = match queues {
            Some(q) => Some(
                serde_json::to_string(q).map_err(|e| super::StoreError::Corrupt {
                    id,
                    detail: format!("worker queues: {e}"),
                })?,
            ),
            None => None,
        };
        let completed = self
            .worker_writes()
            .complete(CompleteWrite {
                id,
                tenant: scope.tenant().map(str::to_owned),
                queues,
                lease_digest: digest(token),
                outcome: outcome.to_string(),
            })
            .await?;
        if !completed {
            return Ok(false);
        }
        // The step waiting here takes the outcome as written, unread.
        self.worker_desk.completed(id, outcome);
        self.worker_task_changed(WorkerChange {
            task: Some(id),
            offered: false,
        });
        Ok(true)
    }

    /// What a call of the lease holder on a task whose step was given up
    /// gets: the usage it reports is charged once per lease (the same
    /// report again answers the first charge), its outcome never taken.
    async fn charge_after_cancel(
        &self,
        conn: &mut PgConnection,
        id: Uuid,
        row: &LockedTask,
        reported: u64,
    ) -> Result<LeaseCheck<()>> {
        if let Some(charged) = row.charged_tokens {
            return Ok(LeaseCheck::Charged(u64::try_from(charged).unwrap_or(0)));
        }
        if !row.given_up() || reported == 0 {
            return Ok(LeaseCheck::Lost);
        }
        let charge = Charge {
            session_id: row.session_id,
            tenant: &row.tenant,
            source: ChargeSource::WorkerAfterCancel,
            iteration: row.iteration,
            reported,
            allowance: u64::try_from(row.allowance).unwrap_or(0),
        };
        let tokens = charge_session(conn, &charge).await?;
        sqlx::query!(
            "UPDATE worker_tasks SET charged_tokens = $2, updated_at = now() WHERE id = $1",
            id,
            i64::try_from(tokens).unwrap_or(i64::MAX),
        )
        .execute(&mut *conn)
        .await?;
        Ok(LeaseCheck::Charged(tokens))
    }

    /// [`charge_uncollected_outcomes`] in a transaction of its own: a
    /// step cut short by a stop after its worker completed it.
    pub async fn charge_uncollected_outcomes_of(
        &self,
        session_id: Uuid,
        scope: &TenantScope,
    ) -> Result<u64> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let charged = charge_uncollected_outcomes(&mut tx, session_id, scope).await?;
        tx.commit().await?;
        Ok(charged)
    }

    /// Depth and oldest task of every queue with a waiting task or a worker
    /// seen within `seen_within`, of the scope's tenants (of `queues` only,
    /// when given).
    pub async fn worker_queues(
        &self,
        scope: &TenantScope,
        queues: Option<&[String]>,
        seen_within: std::time::Duration,
    ) -> Result<(Vec<QueueDepth>, Vec<WorkerSeen>)> {
        let depths = sqlx::query_as!(
            QueueDepth,
            r#"SELECT t.tenant, t.queue, count(*) AS "depth!",
                      (extract(epoch FROM now() - min(t.offered_at)) * 1000)::bigint AS oldest_task_age_ms
               FROM worker_tasks t JOIN sessions s ON s.id = t.session_id
               WHERE t.state = 'pending' AND ($1::text IS NULL OR t.tenant = $1)
                 AND ($2::text[] IS NULL OR t.queue = ANY($2))
                 AND s.status = 'running' AND NOT s.stop_requested AND NOT s.pause_requested
               GROUP BY t.tenant, t.queue ORDER BY t.tenant, t.queue"#,
            scope.tenant(),
            queues as Option<&[String]>,
        )
        .fetch_all(&self.pool)
        .await?;
        let workers = sqlx::query_as!(
            WorkerSeen,
            "SELECT tenant, queue, worker, last_seen_at, task_id FROM workers_seen
             WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text[] IS NULL OR queue = ANY($2))
               AND last_seen_at > now() - make_interval(secs => $3)
             ORDER BY tenant, queue, worker",
            scope.tenant(),
            queues as Option<&[String]>,
            seen_within.as_secs_f64(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok((depths, workers))
    }

    /// The session's task nobody has claimed, if it has one: its queue,
    /// tenant and offer time, and when a worker last polled that queue.
    pub async fn waiting_for_worker(
        &self,
        session_id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<WaitingWorkerTask>> {
        let row = sqlx::query!(
            r#"SELECT t.queue, t.tenant, t.offered_at,
                      (SELECT max(w.last_seen_at) FROM workers_seen w
                        WHERE w.tenant = t.tenant AND w.queue = t.queue) AS last_worker_seen_at
                 FROM worker_tasks t
                WHERE t.session_id = $1 AND t.state = 'pending'
                  AND ($2::text IS NULL OR t.tenant = $2)
                ORDER BY t.offered_at DESC LIMIT 1"#,
            session_id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| WaitingWorkerTask {
            queue: r.queue,
            tenant: r.tenant,
            since: r.offered_at,
            last_worker_seen_at: r.last_worker_seen_at,
        }))
    }
}

/// A session's step offered to workers and not claimed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingWorkerTask {
    /// The queue it waits on.
    pub queue: String,
    /// The tenant whose workers may claim it.
    pub tenant: String,
    /// When it was offered.
    pub since: DateTime<Utc>,
    /// The last claim or heartbeat of any worker of that tenant on that
    /// queue; none when no such worker was ever seen.
    pub last_worker_seen_at: Option<DateTime<Utc>>,
}

/// How a run ends a task it gives up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// The session was stopped or ended while the step was in flight.
    Stopped,
    /// The step was given up for a pause.
    Paused,
    /// Nobody claimed it in time.
    NoWorker,
    /// Its attempts are spent: the step failed.
    AttemptsSpent,
}

impl TaskEnd {
    /// The task's state and stored reason.
    fn as_row(self) -> (WorkerTaskState, &'static str) {
        match self {
            TaskEnd::Stopped => (WorkerTaskState::Cancelled, BeatReason::Stopped.as_str()),
            TaskEnd::Paused => (WorkerTaskState::Cancelled, BeatReason::Paused.as_str()),
            TaskEnd::NoWorker => (WorkerTaskState::Cancelled, "no_worker"),
            TaskEnd::AttemptsSpent => (WorkerTaskState::Failed, "attempts spent"),
        }
    }
}

/// How a worker ends its lease.
#[derive(Debug, Clone, Copy)]
pub enum Settlement<'a> {
    /// With the step's outcome (the webhook answer).
    Complete(&'a serde_json::Value),
    /// With an error.
    Fail {
        /// What went wrong.
        error: &'a str,
        /// Whether another attempt may succeed.
        retryable: bool,
        /// Tokens the worker spent (charged only after a cancel).
        tokens: u64,
    },
    /// Given back without counting an attempt.
    Release {
        /// Tokens the worker spent (charged only after a cancel).
        tokens: u64,
    },
}

impl Settlement<'_> {
    /// The tokens the worker says it spent: an outcome's `tokens`, or
    /// what a failure or a release reports.
    pub fn reported_tokens(&self) -> u64 {
        match self {
            Settlement::Complete(outcome) => outcome_tokens(outcome),
            Settlement::Fail { tokens, .. } | Settlement::Release { tokens } => *tokens,
        }
    }
}

/// The `tokens` of a step outcome (0 when missing or not a count).
fn outcome_tokens(outcome: &serde_json::Value) -> u64 {
    outcome
        .get("tokens")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// A charge of tokens to a session outside its loop.
struct Charge<'a> {
    session_id: Uuid,
    tenant: &'a str,
    source: ChargeSource,
    iteration: i64,
    /// What was reported (or estimated).
    reported: u64,
    /// The step's allowance: the most that is charged.
    allowance: u64,
}

/// Charges a session (of `charge.tenant` only) outside its loop: at most
/// the step's allowance, added (saturating) to `tokens_used` and to the
/// charges a run folds into its budget (`tokens_charged`), with a
/// `usage_charged` event; never its status or outcome. Returns the tokens
/// charged (0 charges nothing and writes nothing).
async fn charge_session(conn: &mut PgConnection, charge: &Charge<'_>) -> Result<u64> {
    let tokens = budget::charge(charge.reported, charge.allowance);
    if tokens == 0 {
        return Ok(0);
    }
    let amount = i64::try_from(tokens).unwrap_or(i64::MAX);
    let charged = sqlx::query!(
        "UPDATE sessions SET tokens_charged = warden_sat_add(tokens_charged, $2),
                tokens_used = warden_sat_add(tokens_used, $2),
                agent_tokens = warden_sat_add(agent_tokens, $2), updated_at = now()
         WHERE id = $1 AND tenant = $3",
        charge.session_id,
        amount,
        charge.tenant,
    )
    .execute(&mut *conn)
    .await?;
    if charged.rows_affected() == 0 {
        return Ok(0);
    }
    let event = NewEvent::from_event(&SessionEvent::UsageCharged {
        source: charge.source,
        iteration: u64::try_from(charge.iteration).unwrap_or(0),
        tokens,
        reported: charge.reported,
    })?;
    event_log::append(conn, charge.session_id, &[event]).await?;
    tracing::info!(session = %charge.session_id, tokens, source = ?charge.source, "usage charged outside the loop");
    Ok(tokens)
}

/// Charges the tokens of every outcome of session `session_id` that was
/// completed but not collected (a stop won over it), and cancels those
/// tasks (`stopped`): the outcome is never applied, not even by a resume.
/// Returns the tokens charged.
pub async fn charge_uncollected_outcomes(
    conn: &mut PgConnection,
    session_id: Uuid,
    scope: &TenantScope,
) -> Result<u64> {
    let rows = sqlx::query!(
        r#"SELECT t.id, t.tenant, t.iteration, t.outcome AS "outcome: serde_json::Value",
                  coalesce((t.context->>'token_allowance')::bigint, 0) AS "allowance!"
           FROM worker_tasks t JOIN sessions s ON s.id = t.session_id
           WHERE t.session_id = $1 AND t.state = 'completed' AND t.iteration > s.iterations
             AND ($2::text IS NULL OR t.tenant = $2)
           FOR UPDATE OF t"#,
        session_id,
        scope.tenant(),
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut total = 0u64;
    for row in rows {
        let charge = Charge {
            session_id,
            tenant: &row.tenant,
            source: ChargeSource::UncollectedOutcome,
            iteration: row.iteration,
            reported: row.outcome.as_ref().map_or(0, outcome_tokens),
            allowance: u64::try_from(row.allowance).unwrap_or(0),
        };
        let tokens = charge_session(conn, &charge).await?;
        sqlx::query!(
            "UPDATE worker_tasks SET state = 'cancelled', cancel_reason = $2, charged_tokens = $3,
                    updated_at = now()
             WHERE id = $1",
            row.id,
            BeatReason::Stopped.as_str(),
            i64::try_from(tokens).unwrap_or(i64::MAX),
        )
        .execute(&mut *conn)
        .await?;
        total = total.saturating_add(tokens);
    }
    Ok(total)
}

/// A task locked for a heartbeat or a settlement, with what its session
/// says about going on.
struct LockedTask {
    state: WorkerTaskState,
    lease_digest: Option<Vec<u8>>,
    live: bool,
    cancel_reason: Option<String>,
    tenant: String,
    queue: String,
    worker: Option<String>,
    allowance: i64,
    stop_requested: bool,
    pause_requested: bool,
    status: String,
    session_id: Uuid,
    iteration: i64,
    charged_tokens: Option<i64>,
}

impl LockedTask {
    /// Whether the step of the task was given up while this lease held it
    /// (cancelled, or its session stopped or no longer running, or the
    /// lease lapsed): its worker's usage may be charged, its outcome not taken.
    fn given_up(&self) -> bool {
        self.state == WorkerTaskState::Cancelled
            || (self.state == WorkerTaskState::Claimed
                && (!self.live || self.stop_requested || self.status != "running"))
    }

    /// Whether `token` is this task's lease token.
    fn held_by(&self, token: &str) -> bool {
        self.lease_digest.as_deref() == Some(digest(token).as_slice())
    }

    /// Marks the task's worker as seen now, holding `task` (none once settled).
    async fn seen_holding(&self, conn: &mut PgConnection, task: Option<Uuid>) -> Result<()> {
        let Some(worker) = &self.worker else {
            return Ok(());
        };
        sqlx::query!(
            "UPDATE workers_seen SET last_seen_at = now(), task_id = $4
             WHERE tenant = $1 AND queue = $2 AND worker = $3",
            self.tenant,
            self.queue,
            worker,
            task,
        )
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// Locks task `id` if it is in the scope's tenants (and on `queues`, when
/// given), for the rest of the caller's transaction.
async fn lock_task(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    queues: Option<&[String]>,
) -> Result<Option<LockedTask>> {
    Ok(sqlx::query_as!(
        LockedTask,
        r#"SELECT t.state AS "state: WorkerTaskState", t.lease_digest, t.lease_expires_at > now() AS "live!",
                  t.cancel_reason, t.tenant, t.queue, t.worker,
                  coalesce((t.context->>'token_allowance')::bigint, 0) AS "allowance!",
                  s.stop_requested, s.pause_requested, s.status,
                  t.session_id, t.iteration, t.charged_tokens
           FROM worker_tasks t JOIN sessions s ON s.id = t.session_id
           WHERE t.id = $1 AND ($2::text IS NULL OR t.tenant = $2)
             AND ($3::text[] IS NULL OR t.queue = ANY($3))
           FOR UPDATE OF t"#,
        id,
        scope.tenant(),
        queues as Option<&[String]>,
    )
    .fetch_optional(conn)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_the_step_of_the_task_and_claims_for_offers_wake() {
        let (mine, other) = (Uuid::new_v4(), Uuid::new_v4());
        let of = |task, offered| WorkerChange {
            task: Some(task),
            offered,
        };
        assert!(of(mine, false).concerns_task(mine));
        assert!(of(mine, true).concerns_task(mine));
        assert!(!of(other, true).concerns_task(mine));
        assert!(WorkerChange::ANY.concerns_task(mine));
        assert!(of(other, true).concerns_claims());
        assert!(!of(other, false).concerns_claims());
        assert!(WorkerChange::ANY.concerns_claims());
    }

    #[tokio::test]
    async fn a_waiter_returns_on_its_change_on_falling_behind_or_at_the_deadline() {
        let (tx, mut rx) = tokio::sync::broadcast::channel(2);
        let (mine, other) = (Uuid::new_v4(), Uuid::new_v4());
        let of = |task| WorkerChange {
            task: Some(task),
            offered: false,
        };
        // Another task's change does not end the wait; the deadline does.
        tx.send(of(other)).expect("sent");
        let started = std::time::Instant::now();
        wait_for_worker_change(&mut rx, Duration::from_millis(50), |c| {
            c.concerns_task(mine)
        })
        .await;
        assert!(started.elapsed() >= Duration::from_millis(50));
        // Its own change ends it at once.
        tx.send(of(mine)).expect("sent");
        wait_for_worker_change(&mut rx, Duration::from_secs(60), |c| c.concerns_task(mine)).await;
        // Falling behind ends it at once too (it cannot know what it missed).
        for _ in 0..3 {
            tx.send(of(other)).expect("sent");
        }
        wait_for_worker_change(&mut rx, Duration::from_secs(60), |c| c.concerns_task(mine)).await;
    }
}
