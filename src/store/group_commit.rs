//! Group commit: the iterations that sessions finish at about the same time
//! are committed together, in one statement and one transaction.
//!
//! Each session still waits for its own iteration to be committed before it
//! starts the next one; grouping only shares the round trip, the plan and
//! the WAL flush among the sessions that are waiting at the same moment. A
//! lone session commits alone and waits no longer than it would without
//! grouping. When a group fails, its members are committed one by one, so
//! one bad iteration cannot fail another session's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::pool::PoolConnection;
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Postgres};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::batch::columns_statement;
use super::rows::{ControlFlags, ControlRow, Counters, JsonText, Lease, NewEvent, NewIteration};
use super::{Result, StoreError};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{Mode, Status};

/// Most iterations in one group: keeps one statement's work (and the time the
/// last member waits for the first) bounded.
const MAX_GROUP: usize = 128;
/// Groups being committed at once. While they are in flight the next group
/// gathers; the rest of the pool stays free for the API and the leases.
/// Two, not more: with four, 32 sessions flat out formed groups of ~8 and
/// made 1.19x the raw rate; with two, larger groups share each flush
/// (1.34-1.39x), and 1,000 sessions are unchanged. Not fewer: the idle
/// committer holds one slot, and a lone iteration commits in the other.
const IN_FLIGHT: usize = 2;
/// Fewest members a group needs to start while another is in flight; a
/// smaller one waits for that one to end, and whatever arrives meanwhile
/// joins it. Started at once, such groups formed right behind a large one
/// (32 sessions flat out: 9.3 members on average, most under 8), each
/// paying a statement's fixed cost for a few rows. Measured at 32 sessions
/// (warden-bench): 8 made 1.48x raw, 16 1.79x, 32 1.64x, never starting
/// beside (128) 1.55x; with 16, 1,000 sessions went from 2.2x to 2.6x and
/// one session (which commits alone) is unchanged.
const MIN_BESIDE: usize = 16;
/// How long the committer keeps a connection before it hands it back to
/// the pool, so the pool's health test and lifetime still reach it.
const KEEP_FOR: Duration = Duration::from_secs(60);

/// One iteration waiting to be committed.
#[derive(Debug)]
pub(super) struct PendingCommit {
    pub lease: Lease,
    pub iteration: NewIteration,
    pub counters: Counters,
    pub progress: (Option<f64>, Option<f64>),
    pub events: Vec<NewEvent>,
}

type Reply = oneshot::Sender<Result<ControlFlags>>;

/// An iteration in the queue. Whoever takes it out first commits it: the
/// committer, in a group, or its own session, alone, when the session is
/// stopped while it waits (see [`GroupCommit::commit`]).
type Entry = Arc<Mutex<Option<PendingCommit>>>;

/// Takes the iteration out of `entry`, unless it was taken already.
fn take(entry: &Entry) -> Option<PendingCommit> {
    // A poisoned lock only means a panic elsewhere; the option is intact.
    entry
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
}

/// The queue in front of the committer task.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<(Entry, Reply)>,
    shared: Arc<Shared>,
}

/// What the committer and the sessions that commit both see.
#[derive(Debug)]
struct Shared {
    connections: KeptConnections,
    /// Slots for statements in flight; the idle committer holds one.
    in_flight: Arc<Semaphore>,
    /// Iterations sent to the committer that it has not taken yet.
    queued: AtomicUsize,
}

impl GroupCommit {
    /// Starts the committer task on the current runtime.
    pub fn start(pool: PgPool) -> GroupCommit {
        // Unbounded is bounded in practice: a session has at most one
        // iteration waiting, so the queue never holds more than the sessions.
        let (queue, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            connections: KeptConnections::new(pool),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            queued: AtomicUsize::new(0),
        });
        tokio::spawn(run(shared.clone(), rx));
        let closing = shared.connections.pool.close_event();
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            closing.await;
            if let Some(shared) = weak.upgrade() {
                shared.connections.give_all_back();
            }
        });
        GroupCommit { queue, shared }
    }

    /// Commits `pending` with whatever else is waiting; resolves once it is
    /// durable. Once `hurry` fires (its session was stopped) while it still
    /// waits for a group, it commits alone at once, beside the groups in
    /// flight: the stop's end never waits for the groups queued before it.
    pub async fn commit(
        &self,
        pending: PendingCommit,
        hurry: Option<&CancellationToken>,
    ) -> Result<ControlFlags> {
        // Nothing waiting and nothing in flight (the idle committer holds
        // the one slot taken): there is no group to join, so the iteration
        // commits from here, without two hand-offs between tasks on the way
        // (a lone session's commit latency is its whole iteration rate).
        // One such commit at a time: a second sees a slot fewer and queues.
        if self.shared.queued.load(Ordering::Acquire) == 0
            && self.shared.in_flight.available_permits() == IN_FLIGHT - 1
            && let Ok(_slot) = self.shared.in_flight.try_acquire()
        {
            return commit_alone(&self.shared.connections, &pending).await;
        }
        let (reply, mut answer) = oneshot::channel();
        let entry: Entry = Arc::new(Mutex::new(Some(pending)));
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.send((entry.clone(), reply)).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::CommitterGone);
        }
        if let Some(hurry) = hurry {
            tokio::select! {
                biased;
                answered = &mut answer => return answered.map_err(|_| StoreError::CommitterGone)?,
                () = hurry.cancelled() => {
                    // Still queued: the committer will find the entry empty.
                    if let Some(pending) = take(&entry) {
                        return commit_alone(&self.shared.connections, &pending).await;
                    }
                    // Already in a group: its answer comes with the group's.
                }
            }
        }
        answer.await.map_err(|_| StoreError::CommitterGone)?
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<(Entry, Reply)>) {
    loop {
        // Wait for a free slot first: whatever arrives meanwhile joins the group.
        let Ok(slot) = shared.in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut group = vec![first];
        drain(&mut rx, &mut group);
        // Another group in flight and only a few waiting: let more join
        // until it ends, rather than start a small group beside it.
        while group.len() < MIN_BESIDE && shared.in_flight.available_permits() < IN_FLIGHT - 1 {
            tokio::select! {
                biased;
                other = shared.in_flight.acquire() => {
                    drop(other);
                    break;
                }
                next = rx.recv() => match next {
                    Some(next) => {
                        group.push(next);
                        drain(&mut rx, &mut group);
                    }
                    None => break,
                },
            }
        }
        shared.queued.fetch_sub(group.len(), Ordering::AcqRel);
        // Those their stopped sessions took back are committed already.
        let group: Vec<(PendingCommit, Reply)> = group
            .into_iter()
            .filter_map(|(entry, reply)| take(&entry).map(|pending| (pending, reply)))
            .collect();
        if group.is_empty() {
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            commit_group(&shared.connections, group).await;
            drop(slot);
        });
    }
}

/// Moves whatever is waiting into `group`, up to [`MAX_GROUP`].
fn drain(rx: &mut mpsc::UnboundedReceiver<(Entry, Reply)>, group: &mut Vec<(Entry, Reply)>) {
    while group.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(next) => group.push(next),
            Err(_) => break,
        }
    }
}

/// Connections the committer keeps checked out between its statements.
/// sqlx tests each connection given back to its pool with a round trip (a
/// `Sync` and its answer); giving one back after each commit woke a
/// Postgres backend and a loop thread once more per iteration (15 % of the
/// loops' CPU in a profile of one session; both processes' CPU per
/// iteration went from 0.63 to 0.55 ms without it). At most [`IN_FLIGHT`]
/// statements run at once, so that many are kept (fewer on a small pool);
/// a connection whose statement failed goes back to the pool, which tests
/// it, and all go back when the pool closes (closing waits for every
/// connection).
#[derive(Debug)]
struct KeptConnections {
    pool: PgPool,
    /// Most connections kept idle.
    keep: usize,
    idle: Mutex<Idle>,
}

/// The kept connections not in use.
#[derive(Debug, Default)]
struct Idle {
    kept: Vec<Kept>,
    /// The pool is closing: nothing more is kept.
    pool_closing: bool,
}

/// A connection taken for one statement, and since when the committer has had it.
#[derive(Debug)]
struct Kept {
    conn: PoolConnection<Postgres>,
    since: Instant,
}

impl KeptConnections {
    fn new(pool: PgPool) -> KeptConnections {
        // A quarter of the pool at most: the leases, claims and rare writes
        // of the loops need the rest.
        let keep = IN_FLIGHT.min(pool.options().get_max_connections() as usize / 4);
        KeptConnections {
            pool,
            keep,
            idle: Mutex::new(Idle::default()),
        }
    }

    /// A kept connection, else one from the pool.
    async fn take(&self) -> Result<Kept> {
        let kept = self.idle.lock().ok().and_then(|mut idle| idle.kept.pop());
        match kept {
            Some(kept) => Ok(kept),
            None => Ok(Kept {
                conn: self.pool.acquire().await?,
                since: Instant::now(),
            }),
        }
    }

    /// Keeps a connection whose statement completed, unless enough are
    /// kept or it is due back; dropped, it goes back to the pool.
    fn keep(&self, kept: Kept) {
        if kept.since.elapsed() < KEEP_FOR
            && let Ok(mut idle) = self.idle.lock()
            && !idle.pool_closing
            && idle.kept.len() < self.keep
        {
            idle.kept.push(kept);
        }
    }

    /// Gives every kept connection back and keeps none from now on: the
    /// pool is closing, and its `close()` waits for them.
    fn give_all_back(&self) {
        let kept = match self.idle.lock() {
            Ok(mut idle) => {
                idle.pool_closing = true;
                std::mem::take(&mut idle.kept)
            }
            Err(_) => Vec::new(),
        };
        drop(kept);
    }
}

impl Drop for KeptConnections {
    fn drop(&mut self) {
        // sqlx gives a connection back to its pool from a task it spawns,
        // which it cannot do outside a runtime: close these instead.
        if tokio::runtime::Handle::try_current().is_err()
            && let Ok(idle) = self.idle.get_mut()
        {
            for kept in idle.kept.drain(..) {
                drop(kept.conn.detach());
            }
        }
    }
}

/// [`commit_one`] on a kept connection.
async fn commit_alone(connections: &KeptConnections, p: &PendingCommit) -> Result<ControlFlags> {
    let mut kept = connections.take().await?;
    let flags = commit_one(&mut *kept.conn, p).await;
    // A lost lease is an answer: the statement completed.
    if matches!(flags, Ok(_) | Err(StoreError::LeaseLost(_))) {
        connections.keep(kept);
    }
    flags
}

/// [`commit_many`] on a kept connection.
async fn commit_many_kept(
    connections: &KeptConnections,
    group: &[&PendingCommit],
) -> Result<std::collections::HashMap<Uuid, Result<ControlFlags>>> {
    let mut kept = connections.take().await?;
    let committed = commit_many(&mut *kept.conn, group).await?;
    connections.keep(kept);
    Ok(committed)
}

async fn commit_group(connections: &KeptConnections, group: Vec<(PendingCommit, Reply)>) {
    if group.len() > 1 && distinct_sessions(&group) {
        let mut pending: Vec<&PendingCommit> = group.iter().map(|(p, _)| p).collect();
        // The statement locks the rows in this order: always by id, as the
        // lease renewal does, so two statements never wait on each other.
        pending.sort_unstable_by_key(|p| p.lease.session_id);
        match commit_many_kept(connections, &pending).await {
            Ok(mut committed) => {
                for (pending, reply) in group {
                    let id = pending.lease.session_id;
                    let flags = committed
                        .remove(&id)
                        .unwrap_or(Err(StoreError::LeaseLost(id)));
                    let _ = reply.send(flags);
                }
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, size = group.len(),
                    "group commit failed; committing its iterations one by one");
            }
        }
    }
    for (pending, reply) in group {
        let _ = reply.send(commit_alone(connections, &pending).await);
    }
}

/// Whether no session appears twice in `group`. A session waits for each
/// commit before its next, but a runner that lost its lease may still be
/// finishing a step beside the one that took over; the grouped statement
/// matches events by session, so such a pair is committed one by one.
fn distinct_sessions(group: &[(PendingCommit, Reply)]) -> bool {
    let mut ids: Vec<Uuid> = group.iter().map(|(p, _)| p.lease.session_id).collect();
    ids.sort_unstable();
    ids.windows(2).all(|w| w[0] != w[1])
}

/// One iteration in one statement: the fenced update of the session row
/// feeds both inserts, which insert nothing when the lease was lost. Kept
/// apart from `commit_many` on purpose: for a single row the grouped
/// statement's arrays made one session about a third slower (warden-bench);
/// here each column is one scalar parameter, named once as `commit_many`'s are.
async fn commit_one<'e>(db: impl PgExecutor<'e>, p: &PendingCommit) -> Result<ControlFlags> {
    let event_kinds: Vec<&str> = p.events.iter().map(|e| e.kind).collect();
    let event_data: Vec<&str> = p.events.iter().map(|e| e.data.as_str()).collect();
    let it = &p.iteration;
    // An interval checkpoint rides in the same statement: one WAL flush.
    // JSON goes in as text into `json` columns: validated and stored as
    // sent, never parsed into `jsonb` (migrations/0008_lighter_commits.sql).
    let flags = columns_statement!(query_as(ControlRow)
        "WITH i AS (SELECT "
        one {
            id: Uuid = "$1::uuid AS id" <- p.lease.session_id,
            token: Uuid = "$2::uuid AS token" <- p.lease.token,
            kinds: &[&str] = "$3::text[] AS kinds" <- &event_kinds,
            data: &[&str] = "$4::text[] AS data" <- &event_data,
            iterations: i64 = "$5::bigint AS iterations" <- p.counters.iterations(),
            tokens_used: i64 = "$6::bigint AS tokens_used" <- p.counters.tokens_used(),
            tool_calls: i64 = "$7::bigint AS tool_calls" <- p.counters.tool_calls(),
            consecutive_errors: i32 = "$8::int AS consecutive_errors"
                <- p.counters.consecutive_errors(),
            elapsed_ms: i64 = "$9::bigint AS elapsed_ms" <- p.counters.elapsed_ms(),
            percent: Option<f64> = "$10::float8 AS percent" <- p.progress.0,
            eta: Option<f64> = "$11::float8 AS eta" <- p.progress.1,
            reflection_tokens: i64 = "$12::bigint AS reflection_tokens"
                <- p.counters.reflection_tokens(),
            next_cycle: Option<i32> = "$13::int AS next_cycle"
                <- it.next_cycle.as_ref().map(|(n, _)| *n),
            memory: Option<&str> = "$14::text AS memory"
                <- it.next_cycle.as_ref().map(|(_, m)| m.as_str()),
            number: i64 = "$15::bigint AS number" <- it.number,
            run: i32 = "$16::int AS run" <- it.run,
            action: &str = "$17::text AS action" <- it.action.as_str(),
            outcome: &str = "$18::text AS outcome" <- it.outcome,
            tokens: i64 = "$19::bigint AS tokens" <- it.tokens,
            duration_ms: i64 = "$20::bigint AS duration_ms" <- it.duration_ms,
            record: &str = "$21::text AS record" <- it.record.as_str(),
            effects: &str = "$22::text AS effects" <- it.effects.as_str(),
            started_at: DateTime<Utc> = "$23::timestamptz AS started_at" <- it.started_at,
            finished_at: DateTime<Utc> = "$24::timestamptz AS finished_at" <- it.finished_at,
            transcript: Option<&str> = "$25::text AS transcript"
                <- it.transcript.as_ref().map(JsonText::as_str),
            cycle: i32 = "$26::int AS cycle" <- it.cycle,
            checkpoint: Option<&str> = "$27::text AS checkpoint"
                <- it.checkpoint.as_ref().map(JsonText::as_str),
            // The fence: the status a running session's row must still have.
            status: &str = "$28::text AS status" <- Status::Running.as_str(),
            charges_seen: i64 = "$29::bigint AS charges_seen" <- p.counters.charges_seen(),
            usage: Option<&str> = "$30::text AS usage" <- it.usage.as_ref().map(JsonText::as_str),
            cost_usd: Option<Decimal> = "$31::numeric AS cost_usd" <- it.cost_usd,
            price_pattern: Option<&str> = "$32::text AS price_pattern"
                <- it.price_pattern.as_deref(),
            price_valid_from: Option<NaiveDate> = "$33::date AS price_valid_from"
                <- it.price_valid_from,
        }
        r#"), s AS (
             UPDATE sessions SET last_event_seq = sessions.last_event_seq + cardinality(i.kinds),
                    updated_at = now(), iterations = i.iterations,
                    tokens_used = warden_sat_add(i.tokens_used,
                        GREATEST(sessions.tokens_charged - i.charges_seen, 0)),
                    tool_calls = i.tool_calls, consecutive_errors = i.consecutive_errors,
                    elapsed_ms = i.elapsed_ms, percent_complete = i.percent, eta_seconds = i.eta,
                    reflection_tokens = i.reflection_tokens,
                    -- Added here, in the statement that inserts the
                    -- iteration: the session's cost is the sum of its steps'.
                    cost_usd = sessions.cost_usd + COALESCE(i.cost_usd, 0),
                    unpriced_steps = sessions.unpriced_steps + (i.cost_usd IS NULL)::int,
                    agent_tokens = warden_sat_add(i.tokens_used,
                        GREATEST(sessions.tokens_charged - i.charges_seen, 0)) - i.reflection_tokens,
                    guidance = NULL,
                    cycle = COALESCE(i.next_cycle, sessions.cycle),
                    memory = COALESCE(i.memory, sessions.memory),
                    last_checkpoint_iteration = CASE WHEN i.checkpoint IS NULL
                                                     THEN sessions.last_checkpoint_iteration
                                                     ELSE i.number END
             FROM i
             WHERE sessions.id = i.id AND sessions.lease_token = i.token
                   AND sessions.status IS NOT DISTINCT FROM i.status
             RETURNING sessions.last_event_seq, sessions.stop_requested, sessions.pause_requested,
                       sessions.mode, sessions.limits, sessions.updated_at
         ), it AS (
             INSERT INTO iterations (session_id, number, run, action, outcome, tokens, duration_ms,
                                     record, effects, started_at, finished_at, transcript, cycle,
                                     usage, cost_usd, price_pattern, price_valid_from)
             SELECT i.id, i.number, i.run, i.action, i.outcome, i.tokens, i.duration_ms,
                    i.record::json, i.effects::json, i.started_at, i.finished_at,
                    i.transcript::json, i.cycle, i.usage::json, i.cost_usd, i.price_pattern,
                    i.price_valid_from
             FROM i, s
         ), cp AS (
             INSERT INTO checkpoints (session_id, iteration, reason, state)
             SELECT i.id, i.number, 'interval', i.checkpoint::json
             FROM i, s WHERE i.checkpoint IS NOT NULL
         ), ev AS (
             INSERT INTO events (session_id, seq, kind, data)
             SELECT i.id, s.last_event_seq - cardinality(i.kinds) + t.ord, t.kind, t.data::json
             FROM i, s, UNNEST(i.kinds, i.data) WITH ORDINALITY AS t(kind, data, ord)
         )
         SELECT stop_requested AS "stop_requested!", pause_requested AS "pause_requested!",
                mode AS "mode!: Mode", limits AS "limits!: Json<Limits>",
                last_event_seq AS "last_event_seq!", updated_at AS "updated_at!" FROM s"#
    )
    .fetch_optional(db)
    .await?
    .ok_or(StoreError::LeaseLost(p.lease.session_id))?;
    Ok(flags.into())
}

/// A whole group in one statement. The session rows are locked in id order
/// first, so two groups (or a group and the lease renewal) never deadlock.
/// Returns the control flags of each session whose lease held.
async fn commit_many<'e>(
    db: impl PgExecutor<'e>,
    group: &[&PendingCommit],
) -> Result<std::collections::HashMap<Uuid, Result<ControlFlags>>> {
    let events = group.iter().flat_map(|p| {
        (1..)
            .zip(&p.events)
            .map(move |(ord, e): (i32, _)| (p.lease.session_id, ord, e))
    });
    let rows = columns_statement!(query
        "WITH input AS (SELECT "
        each(p in group) {
            id: Uuid = "unnest($1::uuid[]) AS id" <- p.lease.session_id,
            token: Uuid = "unnest($2::uuid[]) AS token" <- p.lease.token,
            event_count: i32 = "unnest($3::int[]) AS event_count"
                <- i32::try_from(p.events.len()).unwrap_or(i32::MAX),
            iterations: i64 = "unnest($4::bigint[]) AS iterations" <- p.counters.iterations(),
            tokens_used: i64 = "unnest($5::bigint[]) AS tokens_used" <- p.counters.tokens_used(),
            tool_calls: i64 = "unnest($6::bigint[]) AS tool_calls" <- p.counters.tool_calls(),
            consecutive_errors: i32 = "unnest($7::int[]) AS consecutive_errors"
                <- p.counters.consecutive_errors(),
            elapsed_ms: i64 = "unnest($8::bigint[]) AS elapsed_ms" <- p.counters.elapsed_ms(),
            percent: Option<f64> = "unnest($9::float8[]) AS percent" <- p.progress.0,
            eta: Option<f64> = "unnest($10::float8[]) AS eta" <- p.progress.1,
            reflection_tokens: i64 = "unnest($11::bigint[]) AS reflection_tokens"
                <- p.counters.reflection_tokens(),
            next_cycle: Option<i32> = "unnest($12::int[]) AS next_cycle"
                <- p.iteration.next_cycle.as_ref().map(|(n, _)| *n),
            memory: Option<&str> = "unnest($13::text[]) AS memory"
                <- p.iteration.next_cycle.as_ref().map(|(_, m)| m.as_str()),
            number: i64 = "unnest($14::bigint[]) AS number" <- p.iteration.number,
            run: i32 = "unnest($15::int[]) AS run" <- p.iteration.run,
            action: &str = "unnest($16::text[]) AS action" <- p.iteration.action.as_str(),
            outcome: &str = "unnest($17::text[]) AS outcome" <- p.iteration.outcome,
            tokens: i64 = "unnest($18::bigint[]) AS tokens" <- p.iteration.tokens,
            duration_ms: i64 = "unnest($19::bigint[]) AS duration_ms" <- p.iteration.duration_ms,
            record: &str = "unnest($20::text[]) AS record" <- p.iteration.record.as_str(),
            effects: &str = "unnest($21::text[]) AS effects" <- p.iteration.effects.as_str(),
            started_at: DateTime<Utc> = "unnest($22::timestamptz[]) AS started_at"
                <- p.iteration.started_at,
            finished_at: DateTime<Utc> = "unnest($23::timestamptz[]) AS finished_at"
                <- p.iteration.finished_at,
            transcript: Option<&str> = "unnest($24::text[]) AS transcript"
                <- p.iteration.transcript.as_ref().map(JsonText::as_str),
            cycle: i32 = "unnest($25::int[]) AS cycle" <- p.iteration.cycle,
            checkpoint: Option<&str> = "unnest($26::text[]) AS checkpoint"
                <- p.iteration.checkpoint.as_ref().map(JsonText::as_str),
            // The fence: the status a running session's row must still have.
            status: &str = "unnest($27::text[]) AS status" <- Status::Running.as_str(),
            charges_seen: i64 = "unnest($28::bigint[]) AS charges_seen"
                <- p.counters.charges_seen(),
            usage: Option<&str> = "unnest($29::text[]) AS usage"
                <- p.iteration.usage.as_ref().map(JsonText::as_str),
            cost_usd: Option<Decimal> = "unnest($30::numeric[]) AS cost_usd"
                <- p.iteration.cost_usd,
            price_pattern: Option<&str> = "unnest($31::text[]) AS price_pattern"
                <- p.iteration.price_pattern.as_deref(),
            price_valid_from: Option<NaiveDate> = "unnest($32::date[]) AS price_valid_from"
                <- p.iteration.price_valid_from,
        }
        // Events, flattened: the session each belongs to and its place among them.
        "), event_input AS (SELECT "
        each((session, ord, e) in events) {
            event_session: Uuid = "unnest($33::uuid[]) AS id" <- session,
            event_ord: i32 = "unnest($34::int[]) AS ord" <- ord,
            event_kind: &str = "unnest($35::text[]) AS kind" <- e.kind,
            event_data: &str = "unnest($36::text[]) AS data" <- e.data.as_str(),
        }
        r#"), locked AS (
             -- One primary-key probe per member, in the input's (id) order:
             -- a join here let stale statistics pick a scan of every session.
             -- NO KEY UPDATE, as the UPDATE below locks: a member's row is
             -- not waited for behind an insert that names it (a snapshot's).
             SELECT l.id FROM input i CROSS JOIN LATERAL (
                 SELECT s.id FROM sessions s
                 WHERE s.id = i.id AND s.lease_token = i.token
                   AND s.status IS NOT DISTINCT FROM i.status
                 FOR NO KEY UPDATE) l
         ), s AS (
             UPDATE sessions SET last_event_seq = sessions.last_event_seq + i.event_count,
                    updated_at = now(), iterations = i.iterations,
                    tokens_used = warden_sat_add(i.tokens_used,
                        GREATEST(sessions.tokens_charged - i.charges_seen, 0)),
                    tool_calls = i.tool_calls, consecutive_errors = i.consecutive_errors,
                    elapsed_ms = i.elapsed_ms, percent_complete = i.percent, eta_seconds = i.eta,
                    reflection_tokens = i.reflection_tokens,
                    -- Added here, in the statement that inserts the
                    -- iteration: the session's cost is the sum of its steps'.
                    cost_usd = sessions.cost_usd + COALESCE(i.cost_usd, 0),
                    unpriced_steps = sessions.unpriced_steps + (i.cost_usd IS NULL)::int,
                    agent_tokens = warden_sat_add(i.tokens_used,
                        GREATEST(sessions.tokens_charged - i.charges_seen, 0)) - i.reflection_tokens,
                    guidance = NULL,
                    cycle = COALESCE(i.next_cycle, sessions.cycle),
                    memory = COALESCE(i.memory, sessions.memory),
                    last_checkpoint_iteration = CASE WHEN i.checkpoint IS NULL
                                                     THEN sessions.last_checkpoint_iteration
                                                     ELSE i.number END
             FROM input i JOIN locked l ON l.id = i.id
             WHERE sessions.id = i.id AND sessions.lease_token = i.token
                   AND sessions.status IS NOT DISTINCT FROM i.status
             RETURNING sessions.id, sessions.last_event_seq, sessions.stop_requested,
                       sessions.pause_requested, sessions.mode, sessions.limits, sessions.updated_at
         ), cp AS (
             INSERT INTO checkpoints (session_id, iteration, reason, state)
             SELECT i.id, i.number, 'interval', i.checkpoint::json
             FROM input i JOIN s ON s.id = i.id WHERE i.checkpoint IS NOT NULL
         ), it AS (
             INSERT INTO iterations (session_id, number, run, action, outcome, tokens, duration_ms,
                                     record, effects, started_at, finished_at, transcript, cycle,
                                     usage, cost_usd, price_pattern, price_valid_from)
             SELECT i.id, i.number, i.run, i.action, i.outcome, i.tokens, i.duration_ms,
                    i.record::json, i.effects::json, i.started_at, i.finished_at,
                    i.transcript::json, i.cycle, i.usage::json, i.cost_usd, i.price_pattern,
                    i.price_valid_from
             FROM input i JOIN s ON s.id = i.id
         ), ev AS (
             INSERT INTO events (session_id, seq, kind, data)
             SELECT e.id, s.last_event_seq - i.event_count + e.ord, e.kind, e.data::json
             FROM event_input e JOIN input i ON i.id = e.id JOIN s ON s.id = e.id
         )
         SELECT id AS "id!", stop_requested AS "stop_requested!",
                pause_requested AS "pause_requested!", mode AS "mode!: Mode",
                limits AS "limits!: Json<Limits>", last_event_seq AS "last_event_seq!",
                updated_at AS "updated_at!" FROM s"#
    )
    .fetch_all(db)
    .await?;
    let mut committed = std::collections::HashMap::with_capacity(rows.len());
    for r in rows {
        let flags = ControlRow {
            stop_requested: r.stop_requested,
            pause_requested: r.pause_requested,
            mode: r.mode,
            limits: r.limits,
            last_event_seq: r.last_event_seq,
            updated_at: r.updated_at,
        };
        committed.insert(r.id, Ok(flags.into()));
    }
    Ok(committed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use sqlx::postgres::PgPoolOptions;

    use super::*;
    use crate::policy::guardrails::Usage;

    const LIMITS: Limits = Limits {
        max_iterations: 10,
        max_wall_time_ms: 60_000,
        max_tokens: 1_000,
        max_consecutive_errors: 3,
        reflection_interval: 5,
        reflection_adaptive: false,
        checkpoint_interval: 5,
        max_tool_calls: None,
        max_cycles: 10,
        context_budget_tokens: 32_000,
        review_every: None,
        warn_at: crate::policy::soft_budget::WarnAt::DEFAULT,
        max_cost_usd: None,
    };

    async fn running_session(pool: &PgPool, mode: Mode) -> Lease {
        let lease = Lease {
            session_id: Uuid::new_v4(),
            token: Uuid::new_v4(),
        };
        sqlx::query(
            "INSERT INTO sessions (id, goal, mode, status, limits, executor, lease_token)
             VALUES ($1, 'goal', $2, 'running', $3, '{}', $4)",
        )
        .bind(lease.session_id)
        .bind(mode)
        .bind(Json(LIMITS))
        .bind(lease.token)
        .execute(pool)
        .await
        .unwrap();
        lease
    }

    fn pending(lease: Lease, events: usize, next_cycle: Option<(i32, String)>) -> PendingCommit {
        let now = Utc::now();
        PendingCommit {
            lease,
            iteration: NewIteration {
                number: 1,
                run: 1,
                action: "act".into(),
                outcome: "success",
                tokens: 7,
                duration_ms: 3,
                record: JsonText::from(&json!({ "action": "act" })),
                effects: JsonText::from(&json!({})),
                transcript: None,
                cycle: 0,
                next_cycle,
                checkpoint: None,
                started_at: now,
                finished_at: now,
                usage: Some(JsonText::from(
                    &json!({ "input_tokens": 3, "output_tokens": 4 }),
                )),
                cost_usd: Some(Decimal::new(123, 7)),
                price_pattern: Some("m*".into()),
                price_valid_from: None,
            },
            counters: Counters {
                usage: Usage {
                    iterations: 1,
                    tokens: 7,
                    ..Usage::default()
                },
                ..Counters::default()
            },
            progress: (Some(50.0), None),
            events: (0..events)
                .map(|i| NewEvent::new("iteration_completed", json!({ "i": i })))
                .collect(),
        }
    }

    async fn event_seqs(pool: &PgPool, session_id: Uuid) -> Vec<i64> {
        sqlx::query_scalar("SELECT seq FROM events WHERE session_id = $1 ORDER BY seq")
            .bind(session_id)
            .fetch_all(pool)
            .await
            .unwrap()
    }

    /// The grouped statement commits each member whose lease holds, numbers
    /// its events in order, and leaves out a member whose lease is lost. A
    /// failing group falls back to one-by-one commits, which would hide a
    /// broken statement from every test that goes through the committer.
    #[tokio::test]
    async fn a_group_commits_its_members_in_one_statement() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let a = running_session(&pool, Mode::Fixed).await;
        let b = running_session(&pool, Mode::Continuous).await;
        let lost = Lease {
            token: Uuid::new_v4(),
            ..running_session(&pool, Mode::Fixed).await
        };
        let mut with_checkpoint = pending(a, 2, None);
        with_checkpoint.iteration.checkpoint =
            Some(JsonText::from(&json!({ "state": "after step 1" })));
        let group = [
            with_checkpoint,
            pending(b, 1, Some((1, "memory".into()))),
            pending(lost, 1, None),
        ];
        let members: Vec<&PendingCommit> = group.iter().collect();

        let committed = commit_many(&pool, &members).await.unwrap();

        assert_eq!(committed.len(), 2);
        let flags = |id: Uuid| committed[&id].as_ref().unwrap().settings;
        assert_eq!(flags(a.session_id).mode, Mode::Fixed);
        assert_eq!(flags(a.session_id).limits, LIMITS);
        assert_eq!(flags(b.session_id).mode, Mode::Continuous);
        assert_eq!(event_seqs(&pool, a.session_id).await, vec![1, 2]);
        assert_eq!(event_seqs(&pool, b.session_id).await, vec![1]);
        assert!(event_seqs(&pool, lost.session_id).await.is_empty());
        let (cycle, memory, iterations): (i32, String, i64) =
            sqlx::query_as("SELECT cycle, memory, iterations FROM sessions WHERE id = $1")
                .bind(b.session_id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!((cycle, memory.as_str(), iterations), (1, "memory", 1));
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM iterations")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(stored, 2);
        // The folded checkpoint is in the same statement, for its member only.
        let checkpoints: Vec<(uuid::Uuid, i64, String)> =
            sqlx::query_as("SELECT session_id, iteration, reason FROM checkpoints")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(checkpoints, vec![(a.session_id, 1, "interval".to_string())]);
        let covered: Vec<i64> = sqlx::query_scalar(
            "SELECT last_checkpoint_iteration FROM sessions WHERE id = ANY($1) ORDER BY id = $2 DESC",
        )
        .bind(vec![a.session_id, b.session_id])
        .bind(a.session_id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(covered, vec![1, 0]);
        // Each session's cost grew by its step's, an unpriced step counted.
        let mut unpriced = pending(b, 0, None);
        unpriced.iteration.number = 2;
        unpriced.iteration.cost_usd = None;
        commit_many(&pool, &[&unpriced]).await.unwrap();
        let money: Vec<(Decimal, i64)> = sqlx::query_as(
            "SELECT cost_usd, unpriced_steps FROM sessions WHERE id = ANY($1) ORDER BY id = $2 DESC",
        )
        .bind(vec![a.session_id, b.session_id])
        .bind(a.session_id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            money,
            vec![(Decimal::new(123, 7), 0), (Decimal::new(123, 7), 1)]
        );
    }

    #[tokio::test]
    async fn a_lone_commit_is_fenced_by_its_lease() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let held = running_session(&pool, Mode::Continuous).await;
        let mut with_checkpoint = pending(held, 2, None);
        with_checkpoint.iteration.checkpoint = Some(JsonText::from(&json!({ "state": 1 })));
        let flags = commit_one(&pool, &with_checkpoint).await.unwrap();
        assert_eq!(flags.settings.mode, Mode::Continuous);
        assert_eq!(flags.last_event_seq, 2);
        assert_eq!(event_seqs(&pool, held.session_id).await, vec![1, 2]);
        let checkpoints: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM checkpoints WHERE session_id = $1 AND iteration = 1",
        )
        .bind(held.session_id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            checkpoints, 1,
            "the checkpoint rode in the iteration's statement"
        );

        let lost = Lease {
            token: Uuid::new_v4(),
            ..running_session(&pool, Mode::Fixed).await
        };
        let refused = commit_one(&pool, &pending(lost, 1, None)).await;
        assert!(matches!(refused, Err(StoreError::LeaseLost(id)) if id == lost.session_id));
        assert!(event_seqs(&pool, lost.session_id).await.is_empty());
    }

    /// A commit keeps its connection for the next one, a lost lease too (the
    /// statement completed); a failed statement's connection goes back to
    /// the pool; a small pool keeps none.
    #[tokio::test]
    async fn the_committer_keeps_its_connections_between_statements() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let idle = |c: &KeptConnections| c.idle.lock().unwrap().kept.len();
        let connections = KeptConnections::new(pool.clone());
        let held = running_session(&pool, Mode::Fixed).await;
        commit_alone(&connections, &pending(held, 1, None))
            .await
            .unwrap();
        if pool.options().get_max_connections() < 4 {
            // The embedded server's pool has one connection: none is kept.
            assert_eq!(idle(&connections), 0);
            return;
        }
        assert_eq!(idle(&connections), 1);
        let backend = |c: &KeptConnections| {
            let mut kept = c.idle.lock().unwrap().kept.pop().unwrap();
            async move {
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *kept.conn)
                    .await
                    .unwrap();
                (pid, kept)
            }
        };
        let (first, kept) = backend(&connections).await;
        connections.keep(kept);

        let mut second = pending(held, 1, None);
        second.iteration.number = 2;
        second.counters.usage.iterations = 2;
        commit_alone(&connections, &second).await.unwrap();
        let (again, kept) = backend(&connections).await;
        assert_eq!(again, first, "the next commit ran on the kept connection");
        connections.keep(kept);

        let lost = Lease {
            token: Uuid::new_v4(),
            ..held
        };
        let refused = commit_alone(&connections, &pending(lost, 1, None)).await;
        assert!(matches!(refused, Err(StoreError::LeaseLost(_))));
        assert_eq!(idle(&connections), 1, "a lost lease is an answer");

        let mut invalid = pending(held, 1, None);
        invalid.iteration.number = 0;
        let failed = commit_alone(&connections, &invalid).await;
        assert!(matches!(failed, Err(StoreError::Database(_))), "{failed:?}");
        assert_eq!(
            idle(&connections),
            0,
            "a failed statement's connection is not kept"
        );

        let small = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        assert_eq!(KeptConnections::new(small).keep, 0);
    }

    /// Closing the pool waits for every connection: the committer gives
    /// back the ones it keeps, and keeps none after.
    #[tokio::test]
    async fn a_closing_pool_gets_the_kept_connections_back() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let committer = GroupCommit::start(pool.clone());
        let held = running_session(&pool, Mode::Fixed).await;
        committer
            .commit(pending(held, 1, None), None)
            .await
            .unwrap();
        let kept = committer.shared.connections.idle.lock().unwrap().kept.len();
        // None on the embedded server's one-connection pool.
        let expected = usize::from(pool.options().get_max_connections() >= 4);
        assert_eq!(kept, expected);
        tokio::time::timeout(Duration::from_secs(5), pool.close())
            .await
            .expect("the pool closed");
        assert!(
            committer
                .shared
                .connections
                .idle
                .lock()
                .unwrap()
                .pool_closing
        );
    }

    /// Status and mode are checked by a trigger when they are written, with
    /// the error a CHECK raises; commits, which never set them, skip it.
    #[tokio::test]
    async fn a_status_or_mode_outside_their_lists_is_refused() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let code = |err: sqlx::Error| {
            err.as_database_error()
                .and_then(|e| e.code())
                .map(|c| c.into_owned())
        };
        let bad_insert = sqlx::query(
            "INSERT INTO sessions (id, goal, mode, status, limits, executor)
             VALUES ($1, 'goal', 'fixed', 'sleeping', '{}', '{}')",
        )
        .bind(Uuid::new_v4())
        .execute(&pool)
        .await
        .unwrap_err();
        assert_eq!(code(bad_insert).as_deref(), Some("23514"));

        let held = running_session(&pool, Mode::Fixed).await;
        for update in [
            "UPDATE sessions SET status = 'sleeping' WHERE id = $1",
            "UPDATE sessions SET mode = 'sometimes' WHERE id = $1",
        ] {
            let bad_update = sqlx::query(update)
                .bind(held.session_id)
                .execute(&pool)
                .await
                .unwrap_err();
            assert_eq!(code(bad_update).as_deref(), Some("23514"), "{update}");
        }
        sqlx::query("UPDATE sessions SET status = 'paused' WHERE id = $1")
            .bind(held.session_id)
            .execute(&pool)
            .await
            .unwrap();
    }

    /// The slot the idle committer leaves, once it has taken its own.
    async fn the_other_slot(committer: &GroupCommit) -> tokio::sync::OwnedSemaphorePermit {
        while committer.shared.in_flight.available_permits() == IN_FLIGHT {
            tokio::task::yield_now().await;
        }
        committer
            .shared
            .in_flight
            .clone()
            .try_acquire_owned()
            .unwrap()
    }

    /// A stopped session's iteration does not wait for the groups before
    /// it: once its stop fires it commits alone, at once, and the committer
    /// skips the entry it took back (committed once, not twice).
    #[tokio::test]
    async fn a_stopped_sessions_iteration_commits_alone_at_once() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let committer = GroupCommit::start(pool.clone());
        // Standing for a group in flight: the next group waits for it.
        let in_flight = the_other_slot(&committer).await;
        let stopped = running_session(&pool, Mode::Fixed).await;
        let stop = CancellationToken::new();
        let waiting = tokio::spawn({
            let (committer, stop) = (committer.clone(), stop.clone());
            async move {
                committer
                    .commit(pending(stopped, 1, None), Some(&stop))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "it waits for a group until stopped");
        stop.cancel();
        let flags = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("a stopped session's iteration commits with a group still in flight")
            .unwrap()
            .unwrap();
        assert_eq!(flags.last_event_seq, 1);
        drop(in_flight);
        // The committer goes on, and leaves the entry taken back alone.
        let next = running_session(&pool, Mode::Fixed).await;
        let committed = tokio::time::timeout(
            Duration::from_secs(10),
            committer.commit(pending(next, 1, None), None),
        )
        .await
        .expect("the committer goes on");
        assert_eq!(committed.unwrap().last_event_seq, 1);
        assert_eq!(event_seqs(&pool, stopped.session_id).await, vec![1]);
    }

    /// A small group waits for the one in flight instead of starting beside
    /// it, and commits as soon as that one ends; a group of `MIN_BESIDE`
    /// starts beside it at once.
    #[tokio::test]
    async fn a_small_group_waits_for_the_one_in_flight_and_a_large_one_does_not() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let committer = GroupCommit::start(pool.clone());
        // Standing for a group in flight.
        let in_flight = the_other_slot(&committer).await;

        let lone = running_session(&pool, Mode::Fixed).await;
        let waiting = tokio::spawn({
            let committer = committer.clone();
            async move { committer.commit(pending(lone, 1, None), None).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "a group of one started beside another"
        );
        assert!(event_seqs(&pool, lone.session_id).await.is_empty());
        drop(in_flight);
        let flags = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the small group commits once the other ends")
            .unwrap()
            .unwrap();
        assert_eq!(flags.last_event_seq, 1);

        let in_flight = committer
            .shared
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .unwrap();
        let mut large = Vec::new();
        for _ in 0..MIN_BESIDE {
            let lease = running_session(&pool, Mode::Fixed).await;
            let committer = committer.clone();
            large.push(tokio::spawn(async move {
                committer.commit(pending(lease, 1, None), None).await
            }));
        }
        for member in large {
            let committed = tokio::time::timeout(Duration::from_secs(10), member)
                .await
                .expect("a group of MIN_BESIDE starts beside the one in flight");
            assert_eq!(committed.unwrap().unwrap().last_event_seq, 1);
        }
        drop(in_flight);
    }
}
