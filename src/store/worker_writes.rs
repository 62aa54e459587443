//! Worker task writes grouped: the steady offers and the common
//! completions that sessions and workers make at about the same time are
//! written together, in one transaction, as the loop's group commit writes
//! iterations.
//!
//! Each offer and completion still waits for its own write to be durable
//! before it answers (the waiting claim is handed its task, the worker gets
//! its 200); grouping shares the round trips, the plans and the WAL flush.
//! With 32 workers each step wrote two transactions of its own besides the
//! loop's commit (BENCHMARKS.md, "Steps handed to waiting claims"). One
//! batch is written at a time: whatever arrives meanwhile forms the next.
//! When a batch fails, its members are written one by one, so one bad
//! write cannot fail another's.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::batch::columns_statement;
use super::{Result, StoreError};

/// Most writes in one batch: keeps one transaction's work (and the time
/// the last member waits for the first) bounded.
const MAX_BATCH: usize = 256;

/// A steady step's task to insert: the run that offers it opened a task
/// before and settled it, so no task of the session is left open and none
/// needs taking over or superseding (see `Store::open_worker_task`).
#[derive(Debug)]
pub(super) struct OfferWrite {
    pub id: Uuid,
    pub session_id: Uuid,
    /// The offering run's tenant: the session must be this tenant's.
    pub tenant: String,
    pub queue: String,
    /// The labels, as JSON text.
    pub labels: String,
    pub iteration: i64,
    pub heartbeat_timeout_ms: i64,
    pub idempotency_key: String,
    /// The step context, as JSON text.
    pub context: String,
    /// The offering run: the session's lease token, which fences the insert.
    pub run: Uuid,
    /// The lease digest and worker of the waiting claim it is claimed for
    /// at once (when the session may be claimed from).
    pub handed_to: Option<(Vec<u8>, String)>,
}

/// An offer as written: `None` when the session is not the tenant's or no
/// longer held by the offering run (its lease token).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OfferWritten {
    /// `claimed` (handed to the claim) or `pending`.
    pub state: String,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The database's clock at the write.
    pub now: DateTime<Utc>,
    pub pause_requested: bool,
}

/// A completion under a lease: written only when the task is claimed
/// under that lease, the lease live, its session running and not being
/// stopped; anything else is left to the long way.
#[derive(Debug)]
pub(super) struct CompleteWrite {
    pub id: Uuid,
    /// The caller's tenant, when it is one tenant's.
    pub tenant: Option<String>,
    /// The caller's queues as a JSON array, when it has a list.
    pub queues: Option<String>,
    pub lease_digest: Vec<u8>,
    /// The outcome, as JSON text.
    pub outcome: String,
}

/// One write and where its answer goes.
enum Write {
    Offer(OfferWrite, oneshot::Sender<Result<Option<OfferWritten>>>),
    Complete(CompleteWrite, oneshot::Sender<Result<bool>>),
}

/// The queue in front of the writer task.
#[derive(Debug, Clone)]
pub(super) struct WorkerWrites {
    queue: mpsc::UnboundedSender<Write>,
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Write::Offer(o, _) => f.debug_tuple("Offer").field(&o.id).finish(),
            Write::Complete(c, _) => f.debug_tuple("Complete").field(&c.id).finish(),
        }
    }
}

impl WorkerWrites {
    /// Starts the writer task on the current runtime.
    pub fn start(pool: PgPool) -> WorkerWrites {
        // Unbounded is bounded in practice: a session offers one step at a
        // time and a worker completes one task per request, each waiting.
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, rx));
        WorkerWrites { queue }
    }

    /// Inserts a steady step's task with whatever else is waiting; resolves
    /// once it is durable.
    pub async fn offer(&self, offer: OfferWrite) -> Result<Option<OfferWritten>> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Write::Offer(offer, reply))
            .map_err(|_| StoreError::CommitterGone)?;
        answer.await.map_err(|_| StoreError::CommitterGone)?
    }

    /// Completes a held task with whatever else is waiting; resolves once
    /// it is durable, `false` when the task was not completed.
    pub async fn complete(&self, complete: CompleteWrite) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Write::Complete(complete, reply))
            .map_err(|_| StoreError::CommitterGone)?;
        answer.await.map_err(|_| StoreError::CommitterGone)?
    }
}

async fn run(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Write>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        write_batch(&pool, batch).await;
    }
}

/// Writes `batch` in one transaction and answers each member; on failure,
/// each member alone.
async fn write_batch(pool: &PgPool, batch: Vec<Write>) {
    let (mut offers, mut completes) = (Vec::new(), Vec::new());
    for write in batch {
        match write {
            Write::Offer(o, reply) => offers.push((o, reply)),
            Write::Complete(c, reply) => completes.push((c, reply)),
        }
    }
    // Task rows are locked in id order, so the batch never deadlocks with
    // another statement that locks several of them in that order.
    completes.sort_unstable_by_key(|(c, _)| c.id);
    if offers.len() + completes.len() > 1 {
        let offer_writes: Vec<&OfferWrite> = offers.iter().map(|(o, _)| o).collect();
        let complete_writes: Vec<&CompleteWrite> = completes.iter().map(|(c, _)| c).collect();
        match write_together(pool, &offer_writes, &complete_writes).await {
            Ok((mut offered, completed)) => {
                for (offer, reply) in offers {
                    let _ = reply.send(Ok(offered.remove(&offer.id)));
                }
                for (complete, reply) in completes {
                    let _ = reply.send(Ok(completed.contains(&complete.id)));
                }
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, offers = offers.len(), completions = completes.len(),
                    "a batch of worker writes failed; writing them one by one");
            }
        }
    }
    for (offer, reply) in offers {
        let written = write_together(pool, &[&offer], &[])
            .await
            .map(|(mut offered, _)| offered.remove(&offer.id));
        let _ = reply.send(written);
    }
    for (complete, reply) in completes {
        let written = write_together(pool, &[], &[&complete])
            .await
            .map(|(_, completed)| completed.contains(&complete.id));
        let _ = reply.send(written);
    }
}

/// The offers written (by task id) and the tasks completed.
type Written = (HashMap<Uuid, OfferWritten>, HashSet<Uuid>);

/// A worker to note seen on a queue: its tenant, queue and name, and the
/// task it holds now (none once it completed one).
type Seen = (String, String, String, Option<Uuid>);

/// Writes `offers` and `completes` in one transaction (a single statement
/// alone when there is only one kind: no `BEGIN` and `COMMIT` round
/// trips), then notes the workers seen.
async fn write_together(
    pool: &PgPool,
    offers: &[&OfferWrite],
    completes: &[&CompleteWrite],
) -> Result<Written> {
    let mut conn = pool.acquire().await?;
    let mut seen = Vec::new();
    let written = if completes.is_empty() {
        let offered = insert_offers(&mut conn, offers, &mut seen).await?;
        (offered, HashSet::new())
    } else if offers.is_empty() {
        let completed = complete_held(&mut conn, completes, &mut seen).await?;
        (HashMap::new(), completed)
    } else {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let offered = insert_offers(&mut tx, offers, &mut seen).await?;
        let completed = complete_held(&mut tx, completes, &mut seen).await?;
        tx.commit().await?;
        (offered, completed)
    };
    if let Err(err) = note_seen(&mut conn, seen).await {
        // The queue listing's bookkeeping only: the writes stand.
        tracing::warn!(error = %err, "workers seen not noted");
    }
    Ok(written)
}

/// Notes workers seen holding a task (or none), for the queue listing: in
/// a statement of its own after the writes commit, so that it never holds
/// a listing row while the writes wait on a task or a session (claims and
/// heartbeats lock their task, then their listing row: a grouped write
/// that did both in the other order deadlocked with them).
async fn note_seen(conn: &mut PgConnection, mut seen: Vec<Seen>) -> Result<()> {
    if seen.is_empty() {
        return Ok(());
    }
    // One row per worker (the task it was just handed over the one it
    // completed), locked in key order.
    seen.sort_unstable_by(|a, b| {
        (&a.0, &a.1, &a.2, a.3.is_none()).cmp(&(&b.0, &b.1, &b.2, b.3.is_none()))
    });
    seen.dedup_by(|later, first| (&later.0, &later.1, &later.2) == (&first.0, &first.1, &first.2));
    columns_statement!(query
        "INSERT INTO workers_seen (tenant, queue, worker, last_seen_at, task_id)
         SELECT tenant, queue, worker, now(), task FROM (SELECT "
        each((t, q, w, held) in &seen) {
            tenants: &str = "unnest($1::text[]) AS tenant" <- t.as_str(),
            queues: &str = "unnest($2::text[]) AS queue" <- q.as_str(),
            workers: &str = "unnest($3::text[]) AS worker" <- w.as_str(),
            tasks: Option<Uuid> = "unnest($4::uuid[]) AS task" <- *held,
        }
        ") AS u ON CONFLICT (tenant, queue, worker)
          DO UPDATE SET last_seen_at = now(), task_id = EXCLUDED.task_id"
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The row an offer's insert returns.
struct OfferRow {
    id: Uuid,
    state: String,
    lease_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    pause_requested: bool,
    tenant: String,
    queue: String,
    worker: Option<String>,
}

/// Inserts the steady offers (in session order, as the group commit locks
/// sessions), each claimed at once for its waiting claim when its session
/// runs with no stop or pause asked; the workers handed one go to `seen`.
async fn insert_offers(
    conn: &mut PgConnection,
    offers: &[&OfferWrite],
    seen: &mut Vec<Seen>,
) -> Result<HashMap<Uuid, OfferWritten>> {
    let rows = columns_statement!(query_as(OfferRow)
        "WITH input AS (SELECT "
        each(o in offers) {
            id: Uuid = "unnest($1::uuid[]) AS id" <- o.id,
            session_id: Uuid = "unnest($2::uuid[]) AS session_id" <- o.session_id,
            tenant: &str = "unnest($3::text[]) AS tenant" <- o.tenant.as_str(),
            queue: &str = "unnest($4::text[]) AS queue" <- o.queue.as_str(),
            labels: &str = "unnest($5::text[]) AS labels" <- o.labels.as_str(),
            iteration: i64 = "unnest($6::bigint[]) AS iteration" <- o.iteration,
            heartbeat_timeout_ms: i64 = "unnest($7::bigint[]) AS heartbeat_timeout_ms"
                <- o.heartbeat_timeout_ms,
            idempotency_key: &str = "unnest($8::text[]) AS idempotency_key"
                <- o.idempotency_key.as_str(),
            context: &str = "unnest($9::text[]) AS context" <- o.context.as_str(),
            run: Uuid = "unnest($10::uuid[]) AS run" <- o.run,
            lease_digest: Option<&[u8]> = "unnest($11::bytea[]) AS lease_digest"
                <- o.handed_to.as_ref().map(|(d, _)| d.as_slice()),
            worker: Option<&str> = "unnest($12::text[]) AS worker"
                <- o.handed_to.as_ref().map(|(_, w)| w.as_str()),
        }
        r#"), inserted AS (
             INSERT INTO worker_tasks (id, session_id, tenant, queue, labels, iteration,
                                       heartbeat_timeout_ms, state, idempotency_key, context, run_token,
                                       lease_digest, lease_expires_at, claimed_at, worker)
             SELECT i.id, s.id, s.tenant, i.queue, i.labels::jsonb, i.iteration, i.heartbeat_timeout_ms,
                    CASE WHEN h.handed THEN 'claimed' ELSE 'pending' END, i.idempotency_key,
                    i.context::jsonb, i.run,
                    CASE WHEN h.handed THEN i.lease_digest END,
                    CASE WHEN h.handed THEN now() + make_interval(secs => i.heartbeat_timeout_ms / 1000.0) END,
                    CASE WHEN h.handed THEN now() END,
                    CASE WHEN h.handed THEN i.worker END
             FROM input i JOIN sessions s
               ON s.id = i.session_id AND s.tenant = i.tenant AND s.lease_token = i.run,
                  LATERAL (SELECT i.lease_digest IS NOT NULL AND s.status = 'running'
                                  AND NOT s.stop_requested AND NOT s.pause_requested AS handed) h
             ORDER BY i.session_id
             RETURNING id, session_id, tenant, queue, state, lease_expires_at, worker)
           SELECT i.id AS "id!", i.state AS "state!", i.lease_expires_at AS "lease_expires_at?", now() AS "now!",
                  s.pause_requested AS "pause_requested!", i.tenant AS "tenant!", i.queue AS "queue!",
                  i.worker AS "worker?"
           FROM inserted i JOIN sessions s ON s.id = i.session_id"#
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            if let Some(worker) = r.worker {
                seen.push((r.tenant, r.queue, worker, Some(r.id)));
            }
            let written = OfferWritten {
                state: r.state,
                lease_expires_at: r.lease_expires_at,
                now: r.now,
                pause_requested: r.pause_requested,
            };
            (r.id, written)
        })
        .collect())
}

/// Completes the tasks held under the given leases (live, their sessions
/// running and not being stopped); their workers go to `seen`, holding none.
async fn complete_held(
    conn: &mut PgConnection,
    completes: &[&CompleteWrite],
    seen: &mut Vec<Seen>,
) -> Result<HashSet<Uuid>> {
    let rows = columns_statement!(query
        "WITH input AS (SELECT "
        each(c in completes) {
            id: Uuid = "unnest($1::uuid[]) AS id" <- c.id,
            tenant: Option<&str> = "unnest($2::text[]) AS tenant" <- c.tenant.as_deref(),
            queues: Option<&str> = "unnest($3::text[]) AS queues" <- c.queues.as_deref(),
            lease_digest: &[u8] = "unnest($4::bytea[]) AS lease_digest" <- c.lease_digest.as_slice(),
            outcome: &str = "unnest($5::text[]) AS outcome" <- c.outcome.as_str(),
        }
        r#"), done AS (
             UPDATE worker_tasks t SET state = 'completed', outcome = i.outcome::jsonb, updated_at = now()
             FROM input i, sessions s
             WHERE t.id = i.id AND s.id = t.session_id
               AND (i.tenant IS NULL OR t.tenant = i.tenant)
               AND (i.queues IS NULL OR i.queues::jsonb ? t.queue)
               AND t.state = 'claimed' AND t.lease_digest = i.lease_digest AND t.lease_expires_at > now()
               AND s.status = 'running' AND NOT s.stop_requested
             RETURNING t.id, t.tenant, t.queue, t.worker)
           SELECT id AS "id!", tenant AS "tenant!", queue AS "queue!", worker AS "worker?" FROM done"#
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            if let Some(worker) = r.worker {
                seen.push((r.tenant, r.queue, worker, None));
            }
            r.id
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::TestDb;

    /// The run every test session is held by (its lease token).
    const RUN: Uuid = Uuid::from_u128(0x5eed);

    /// A running session of `tenant` held by [`RUN`] (being stopped, with
    /// `stopping`).
    async fn session(pool: &PgPool, tenant: &str, stopping: bool) -> Uuid {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO sessions (id, tenant, goal, mode, status, limits, executor,
                                   lease_token, lease_expires_at, stop_requested)
             VALUES ($1, $2, 'goal', 'fixed', 'running', '{}'::jsonb,
                     '{\"kind\": \"worker\", \"queue\": \"q\"}'::jsonb,
                     $4, now() + interval '1 minute', $3)",
        )
        .bind(id)
        .bind(tenant)
        .bind(stopping)
        .bind(RUN)
        .execute(pool)
        .await
        .expect("a session");
        id
    }

    fn offer(session_id: Uuid, tenant: &str, handed_to: Option<&str>) -> OfferWrite {
        OfferWrite {
            id: Uuid::new_v4(),
            session_id,
            tenant: tenant.into(),
            queue: "q".into(),
            labels: "{}".into(),
            iteration: 2,
            heartbeat_timeout_ms: 60_000,
            idempotency_key: format!("{session_id}:2"),
            context: r#"{"iteration": 2}"#.into(),
            run: RUN,
            handed_to: handed_to.map(|w| (vec![7; 32], w.to_owned())),
        }
    }

    fn complete(id: Uuid, tenant: Option<&str>, queues: Option<&str>, digest: u8) -> CompleteWrite {
        CompleteWrite {
            id,
            tenant: tenant.map(str::to_owned),
            queues: queues.map(str::to_owned),
            lease_digest: vec![digest; 32],
            outcome: r#"{"action": "done"}"#.into(),
        }
    }

    /// Writes `batch` as the writer task would, and the answers in order.
    async fn written(
        pool: &PgPool,
        offers: Vec<OfferWrite>,
        completes: Vec<CompleteWrite>,
    ) -> (Vec<Result<Option<OfferWritten>>>, Vec<Result<bool>>) {
        let mut batch = Vec::new();
        let mut offered = Vec::new();
        let mut completed = Vec::new();
        for o in offers {
            let (reply, answer) = oneshot::channel();
            batch.push(Write::Offer(o, reply));
            offered.push(answer);
        }
        for c in completes {
            let (reply, answer) = oneshot::channel();
            batch.push(Write::Complete(c, reply));
            completed.push(answer);
        }
        write_batch(pool, batch).await;
        let mut offers = Vec::new();
        for answer in offered {
            offers.push(answer.await.expect("answered"));
        }
        let mut completes = Vec::new();
        for answer in completed {
            completes.push(answer.await.expect("answered"));
        }
        (offers, completes)
    }

    async fn row(pool: &PgPool, id: Uuid) -> (String, Option<String>, Option<serde_json::Value>) {
        sqlx::query_as("SELECT state, worker, outcome FROM worker_tasks WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("the task")
    }

    #[tokio::test]
    async fn offers_and_completions_are_written_together_each_within_its_scope() {
        let db = TestDb::new().await;
        let (running, stopping, other) = (
            session(&db.pool, "t", false).await,
            session(&db.pool, "t", true).await,
            session(&db.pool, "u", false).await,
        );
        // Claimed tasks to complete: each under the lease digest [7; 32].
        let held = offer(running, "t", Some("w1"));
        let (held_id, held_elsewhere) = (held.id, offer(other, "u", Some("w2")));
        let elsewhere_id = held_elsewhere.id;
        let (answers, _) = written(&db.pool, vec![held, held_elsewhere], vec![]).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Ok(Some(w)) if w.state == "claimed"))
        );

        let handed = offer(running, "t", Some("w3"));
        let to_stopping = offer(stopping, "t", Some("w4"));
        let pending = offer(running, "t", None);
        let not_the_tenants = offer(other, "t", Some("w5"));
        let mut not_the_runs = offer(running, "t", None);
        not_the_runs.run = Uuid::new_v4();
        let ids = [
            handed.id,
            to_stopping.id,
            pending.id,
            not_the_tenants.id,
            not_the_runs.id,
        ];
        let (offers, completes) = written(
            &db.pool,
            vec![handed, to_stopping, pending, not_the_tenants, not_the_runs],
            vec![
                complete(held_id, Some("t"), Some(r#"["q"]"#), 7),
                // Another tenant's, a queue not the caller's, a wrong lease.
                complete(elsewhere_id, Some("t"), None, 7),
                complete(elsewhere_id, None, Some(r#"["other"]"#), 7),
                complete(elsewhere_id, Some("u"), None, 8),
            ],
        )
        .await;
        let states: Vec<Option<String>> = offers
            .into_iter()
            .map(|o| o.expect("written").map(|w| w.state))
            .collect();
        assert_eq!(
            states,
            [
                Some("claimed".into()),
                Some("pending".into()),
                Some("pending".into()),
                None,
                None
            ]
        );
        let completes: Vec<bool> = completes.into_iter().map(|c| c.expect("written")).collect();
        assert_eq!(completes, [true, false, false, false]);
        assert_eq!(row(&db.pool, ids[0]).await.1.as_deref(), Some("w3"));
        assert_eq!(row(&db.pool, ids[1]).await.1, None);
        let (state, _, outcome) = row(&db.pool, held_id).await;
        assert_eq!(
            (state.as_str(), outcome),
            ("completed", Some(serde_json::json!({"action": "done"})))
        );
        assert_eq!(row(&db.pool, elsewhere_id).await.0, "claimed");
        // The listing: w3 holds the task handed to it, w1 completed its own.
        let seen: Vec<(String, Option<Uuid>)> = sqlx::query_as(
            "SELECT worker, task_id FROM workers_seen WHERE tenant = 't' ORDER BY worker",
        )
        .fetch_all(&db.pool)
        .await
        .expect("the listing");
        assert_eq!(seen, [("w1".into(), None), ("w3".into(), Some(ids[0]))]);
        let absent: Vec<(Uuid,)> = sqlx::query_as("SELECT id FROM worker_tasks WHERE id = ANY($1)")
            .bind(&ids[3..])
            .fetch_all(&db.pool)
            .await
            .expect("read");
        assert!(
            absent.is_empty(),
            "another tenant's session, or another run's, got a task"
        );
    }

    #[tokio::test]
    async fn a_failing_batch_is_written_one_by_one() {
        let db = TestDb::new().await;
        let running = session(&db.pool, "t", false).await;
        let held = offer(running, "t", Some("w1"));
        let held_id = held.id;
        written(&db.pool, vec![held], vec![]).await.0[0]
            .as_ref()
            .expect("written");
        // An offer whose id is taken fails; the completion beside it holds.
        let mut clash = offer(running, "t", None);
        clash.id = held_id;
        let fresh = offer(running, "t", None);
        let (offers, completes) = written(
            &db.pool,
            vec![clash, fresh],
            vec![complete(held_id, Some("t"), None, 7)],
        )
        .await;
        assert!(offers[0].is_err());
        assert!(matches!(&offers[1], Ok(Some(w)) if w.state == "pending"));
        assert!(matches!(completes[0], Ok(true)));
        assert_eq!(row(&db.pool, held_id).await.0, "completed");
    }

    #[tokio::test]
    async fn the_writer_answers_writes_sent_at_once() {
        let db = TestDb::new().await;
        let writes = WorkerWrites::start(db.pool.clone());
        let running = session(&db.pool, "t", false).await;
        let offers = (0..20).map(|_| writes.offer(offer(running, "t", None)));
        let answers = futures::future::join_all(offers).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Ok(Some(w)) if w.state == "pending"))
        );
        let count: (i64,) =
            sqlx::query_as("SELECT count(*) FROM worker_tasks WHERE session_id = $1")
                .bind(running)
                .fetch_one(&db.pool)
                .await
                .expect("count");
        assert_eq!(count.0, 20);
    }
}
