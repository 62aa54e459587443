//! The sessions table: creation, reads, listing and the guarded updates that
//! API actions make. Status changes made by the loop live in `iterations.rs`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::events::{self, NewEvent};
use super::leases::Lease;
use super::{Result, Store, StoreError};
use crate::policy::checklist::ChecklistItem;
use crate::policy::guardrails::{Limits, Usage};
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::termination::Termination;

/// The counters the loop keeps on the session row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Iterations committed.
    pub iterations: i64,
    /// Tokens used.
    pub tokens_used: i64,
    /// Tool calls made.
    pub tool_calls: i64,
    /// Current error streak.
    pub consecutive_errors: i32,
    /// Running wall time, ms.
    pub elapsed_ms: i64,
    /// Tokens spent on reflection (part of `tokens_used`).
    pub reflection_tokens: i64,
}

impl Counters {
    /// The counters as guardrail usage.
    pub fn usage(&self) -> Usage {
        Usage {
            iterations: self.iterations.max(0) as u64,
            elapsed_ms: self.elapsed_ms.max(0) as u64,
            tokens: self.tokens_used.max(0) as u64,
            consecutive_errors: self.consecutive_errors.max(0) as u32,
            tool_calls: self.tool_calls.max(0) as u64,
        }
    }

    /// Counters from guardrail usage and the reflection share of its tokens.
    pub fn from_usage(u: &Usage, reflection_tokens: u64) -> Counters {
        let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Counters {
            iterations: big(u.iterations),
            tokens_used: big(u.tokens),
            tool_calls: big(u.tool_calls),
            consecutive_errors: i32::try_from(u.consecutive_errors).unwrap_or(i32::MAX),
            elapsed_ms: big(u.elapsed_ms),
            reflection_tokens: big(reflection_tokens),
        }
    }
}

/// One session as stored.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    /// Id.
    pub id: Uuid,
    /// The goal text.
    pub goal: String,
    /// Fixed or continuous.
    pub mode: Mode,
    /// Current status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Human summary of the termination.
    pub summary: Option<String>,
    /// Detail of the reason: the agent's question, the blocker, the stuck pattern.
    pub reason_detail: Option<String>,
    /// The goal as first given, when refinement changed it.
    pub original_goal: Option<String>,
    /// The pending or last refinement proposal.
    pub refinement: Option<Value>,
    /// Success criteria checklist.
    pub criteria: Vec<ChecklistItem>,
    /// Milestones checklist.
    pub milestones: Vec<ChecklistItem>,
    /// Current context cycle.
    pub cycle: i32,
    /// Memory carried across context cycles.
    pub memory: String,
    /// Tokens spent writing refinements and checklists (part of `tokens_used`).
    pub refinement_tokens: i64,
    /// Latest reflection (assessment and decision).
    pub last_reflection: Option<Value>,
    /// What to do next.
    pub next_steps: Vec<String>,
    /// Progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Estimated seconds to completion.
    pub eta_seconds: Option<f64>,
    /// Limits in force.
    pub limits: Limits,
    /// Executor specification as given.
    pub executor: Value,
    /// Usage counters.
    pub counters: Counters,
    /// Run number: 1 at creation, +1 on every resume.
    pub run: i32,
    /// Whether the latest stop saved a checkpoint.
    pub checkpoint_saved: bool,
    /// Iteration covered by the latest checkpoint.
    pub last_checkpoint_iteration: i64,
    /// A user asked to stop.
    pub stop_requested: bool,
    /// A user asked to pause.
    pub pause_requested: bool,
    /// Guidance for the next iteration.
    pub guidance: Option<String>,
    /// Sequence number of the latest event.
    pub last_event_seq: i64,
    /// Replica holding the lease.
    pub owner: Option<Uuid>,
    /// When the lease ends unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Last heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it ended (terminal statuses).
    pub ended_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    id: Uuid,
    goal: String,
    mode: String,
    status: String,
    reason: Option<String>,
    summary: Option<String>,
    reason_detail: Option<String>,
    original_goal: Option<String>,
    refinement: Option<Value>,
    criteria: Json<Vec<ChecklistItem>>,
    milestones: Json<Vec<ChecklistItem>>,
    cycle: i32,
    memory: String,
    refinement_tokens: i64,
    last_reflection: Option<Value>,
    reflection_tokens: i64,
    next_steps: Json<Vec<String>>,
    percent_complete: Option<f64>,
    eta_seconds: Option<f64>,
    limits: Json<Limits>,
    executor: Value,
    iterations: i64,
    tokens_used: i64,
    tool_calls: i64,
    consecutive_errors: i32,
    elapsed_ms: i64,
    run: i32,
    checkpoint_saved: bool,
    last_checkpoint_iteration: i64,
    stop_requested: bool,
    pause_requested: bool,
    guidance: Option<String>,
    last_event_seq: i64,
    owner: Option<Uuid>,
    lease_expires_at: Option<DateTime<Utc>>,
    heartbeat_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
}

impl TryFrom<SessionRow> for SessionRecord {
    type Error = StoreError;

    fn try_from(r: SessionRow) -> Result<SessionRecord> {
        let corrupt = |detail: String| StoreError::Corrupt { id: r.id, detail };
        let mode = Mode::parse(&r.mode).ok_or_else(|| corrupt(format!("mode {}", r.mode)))?;
        let status =
            Status::parse(&r.status).ok_or_else(|| corrupt(format!("status {}", r.status)))?;
        let reason = match r.reason.as_deref() {
            None => None,
            Some(s) => Some(Reason::parse(s).ok_or_else(|| corrupt(format!("reason {s}")))?),
        };
        Ok(SessionRecord {
            id: r.id,
            goal: r.goal,
            mode,
            status,
            reason,
            summary: r.summary,
            reason_detail: r.reason_detail,
            original_goal: r.original_goal,
            refinement: r.refinement,
            criteria: r.criteria.0,
            milestones: r.milestones.0,
            cycle: r.cycle,
            memory: r.memory,
            refinement_tokens: r.refinement_tokens,
            last_reflection: r.last_reflection,
            next_steps: r.next_steps.0,
            percent_complete: r.percent_complete,
            eta_seconds: r.eta_seconds,
            limits: r.limits.0,
            executor: r.executor,
            counters: Counters {
                iterations: r.iterations,
                tokens_used: r.tokens_used,
                tool_calls: r.tool_calls,
                consecutive_errors: r.consecutive_errors,
                elapsed_ms: r.elapsed_ms,
                reflection_tokens: r.reflection_tokens,
            },
            run: r.run,
            checkpoint_saved: r.checkpoint_saved,
            last_checkpoint_iteration: r.last_checkpoint_iteration,
            stop_requested: r.stop_requested,
            pause_requested: r.pause_requested,
            guidance: r.guidance,
            last_event_seq: r.last_event_seq,
            owner: r.owner,
            lease_expires_at: r.lease_expires_at,
            heartbeat_at: r.heartbeat_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            ended_at: r.ended_at,
        })
    }
}

/// A session about to be created.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Fresh id.
    pub id: Uuid,
    /// The goal.
    pub goal: String,
    /// Mode.
    pub mode: Mode,
    /// Resolved limits.
    pub limits: Limits,
    /// Executor specification.
    pub executor: Value,
    /// The goal as first given, when a refinement replaced it.
    pub original_goal: Option<String>,
    /// Refinement proposal (for sessions awaiting refinement, or applied automatically).
    pub refinement: Option<Value>,
    /// Success criteria.
    pub criteria: Vec<ChecklistItem>,
    /// Milestones.
    pub milestones: Vec<ChecklistItem>,
    /// Tokens spent on refinement and checklists before the first step.
    pub refinement_tokens: i64,
}

/// The settings the loop re-reads after each committed iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionSettings {
    /// Mode in force.
    pub mode: Mode,
    /// Limits in force.
    pub limits: Limits,
}

/// The durable control flags and settings, as seen by the loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlFlags {
    /// Stop requested by a user.
    pub stop_requested: bool,
    /// Pause requested by a user.
    pub pause_requested: bool,
    /// Current settings.
    pub settings: SessionSettings,
}

/// Position in the session list: the last row of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCursor {
    /// Its creation time.
    pub created_at: DateTime<Utc>,
    /// Its id (tie-breaker).
    pub id: Uuid,
}

macro_rules! select_session {
    ($tail:literal) => {
        concat!(
            "SELECT id, goal, mode, status, reason, summary, reason_detail, original_goal, refinement, criteria, milestones, cycle, memory, refinement_tokens, last_reflection, reflection_tokens, next_steps, percent_complete, eta_seconds, limits, executor, iterations, tokens_used, tool_calls, consecutive_errors, elapsed_ms, run, checkpoint_saved, last_checkpoint_iteration, stop_requested, pause_requested, guidance, last_event_seq, owner, lease_expires_at, heartbeat_at, created_at, updated_at, ended_at FROM sessions ",
            $tail
        )
    };
}

impl Store {
    /// Begins a transaction.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }

    /// Creates a session: running under a lease held by `owner` when
    /// `owner` is given, otherwise waiting for refinement.
    pub async fn insert_session(
        &self,
        new: &NewSession,
        owner: Option<Uuid>,
        lease_ttl: std::time::Duration,
        events: &[NewEvent],
    ) -> Result<(SessionRecord, Option<Lease>)> {
        let mut tx = self.pool.begin().await?;
        let token = owner.map(|_| Uuid::new_v4());
        sqlx::query(
            "INSERT INTO sessions (id, goal, mode, status, limits, executor, owner, lease_token, lease_expires_at, heartbeat_at,
                                   original_goal, refinement, criteria, milestones, refinement_tokens, tokens_used)
             VALUES ($1, $2, $3, CASE WHEN $6::uuid IS NULL THEN 'awaiting_refinement' ELSE 'running' END, $4, $5,
                     $6, $7, CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() + make_interval(secs => $8) END,
                     CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() END, $9, $10, $11, $12, $13, $13)",
        )
        .bind(new.id)
        .bind(&new.goal)
        .bind(new.mode.as_str())
        .bind(Json(new.limits))
        .bind(&new.executor)
        .bind(owner)
        .bind(token)
        .bind(lease_ttl.as_secs_f64())
        .bind(&new.original_goal)
        .bind(&new.refinement)
        .bind(Json(&new.criteria))
        .bind(Json(&new.milestones))
        .bind(new.refinement_tokens)
        .execute(&mut *tx)
        .await?;
        events::append(&mut tx, new.id, events).await?;
        let record = lock(&mut tx, new.id).await?.ok_or(StoreError::Corrupt {
            id: new.id,
            detail: "session vanished right after insert".into(),
        })?;
        tx.commit().await?;
        self.announce(new.id);
        let lease = token.map(|token| Lease {
            session_id: new.id,
            token,
        });
        Ok((record, lease))
    }

    /// One session by id.
    pub async fn session(&self, id: Uuid) -> Result<Option<SessionRecord>> {
        let row = sqlx::query_as::<_, SessionRow>(select_session!("WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(SessionRecord::try_from).transpose()
    }

    /// A page of sessions, newest first, optionally of one status.
    pub async fn list_sessions(
        &self,
        status: Option<Status>,
        after: Option<SessionCursor>,
        limit: i64,
    ) -> Result<Vec<SessionRecord>> {
        let rows = sqlx::query_as::<_, SessionRow>(select_session!(
            "WHERE ($1::text IS NULL OR status = $1)
               AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
             ORDER BY created_at DESC, id DESC LIMIT $4"
        ))
        .bind(status.map(Status::as_str))
        .bind(after.map(|c| c.created_at))
        .bind(after.map(|c| c.id))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(SessionRecord::try_from).collect()
    }
}

/// Reads and row-locks one session inside a transaction.
pub async fn lock(conn: &mut PgConnection, id: Uuid) -> Result<Option<SessionRecord>> {
    let row = sqlx::query_as::<_, SessionRow>(select_session!("WHERE id = $1 FOR UPDATE"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.map(SessionRecord::try_from).transpose()
}

/// Records a user's stop request (the durable flag every replica obeys).
pub async fn request_stop(conn: &mut PgConnection, id: Uuid) -> Result<()> {
    sqlx::query("UPDATE sessions SET stop_requested = true, updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    events::append(
        conn,
        id,
        &[NewEvent::new("stop_requested", serde_json::json!({}))],
    )
    .await
}

/// Records a user's pause request.
pub async fn request_pause(conn: &mut PgConnection, id: Uuid) -> Result<()> {
    sqlx::query("UPDATE sessions SET pause_requested = true, updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    events::append(
        conn,
        id,
        &[NewEvent::new("pause_requested", serde_json::json!({}))],
    )
    .await
}

/// Changes mode and limits of a session.
pub async fn update_settings(
    conn: &mut PgConnection,
    id: Uuid,
    settings: SessionSettings,
    events: &[NewEvent],
) -> Result<()> {
    sqlx::query("UPDATE sessions SET mode = $2, limits = $3, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(settings.mode.as_str())
        .bind(Json(settings.limits))
        .execute(&mut *conn)
        .await?;
    events::append(conn, id, events).await
}

/// Puts a resumable session back to running under a fresh lease held by `owner`.
#[allow(clippy::too_many_arguments)]
pub async fn resume(
    conn: &mut PgConnection,
    id: Uuid,
    goal: Option<&str>,
    limits: Limits,
    guidance: Option<&str>,
    owner: Uuid,
    lease_ttl: std::time::Duration,
    events: &[NewEvent],
) -> Result<Lease> {
    let token = Uuid::new_v4();
    sqlx::query(
        "UPDATE sessions SET status = 'running', reason = NULL, summary = NULL, reason_detail = NULL, next_steps = '[]',
                ended_at = NULL, checkpoint_saved = false, stop_requested = false, pause_requested = false,
                consecutive_errors = 0, run = run + 1, limits = $2, guidance = $3,
                owner = $4, lease_token = $5, lease_expires_at = now() + make_interval(secs => $6),
                heartbeat_at = now(), updated_at = now(),
                original_goal = CASE WHEN $7::text IS NULL OR $7 = goal THEN original_goal
                                     ELSE COALESCE(original_goal, goal) END,
                goal = COALESCE($7, goal)
         WHERE id = $1",
    )
    .bind(id)
    .bind(Json(limits))
    .bind(guidance)
    .bind(owner)
    .bind(token)
    .bind(lease_ttl.as_secs_f64())
    .bind(goal)
    .execute(&mut *conn)
    .await?;
    events::append(conn, id, events).await?;
    Ok(Lease {
        session_id: id,
        token,
    })
}

/// Ends a session that no loop is running (paused, awaiting refinement, or
/// orphaned by a dead replica), with a checkpoint of its rebuilt state.
pub async fn end_unowned(
    conn: &mut PgConnection,
    id: Uuid,
    termination: &Termination,
    checkpoint: Option<(i64, Value)>,
    events: &[NewEvent],
) -> Result<()> {
    if let Some((iteration, state)) = &checkpoint {
        super::iterations::insert_checkpoint(
            conn,
            id,
            *iteration,
            termination.reason.as_str(),
            state,
        )
        .await?;
    }
    sqlx::query(
        "UPDATE sessions SET status = $2, reason = $3, summary = $4, next_steps = $5,
                checkpoint_saved = $6, stop_requested = false, pause_requested = false,
                last_checkpoint_iteration = COALESCE($7, last_checkpoint_iteration),
                owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                ended_at = CASE WHEN $2 IN ('paused', 'awaiting_refinement') THEN NULL ELSE now() END,
                updated_at = now()
         WHERE id = $1",
    )
    .bind(id)
    .bind(termination.status.as_str())
    .bind(termination.reason.as_str())
    .bind(&termination.summary)
    .bind(Json(&termination.next_steps))
    .bind(checkpoint.is_some())
    .bind(checkpoint.as_ref().map(|(n, _)| *n))
    .execute(&mut *conn)
    .await?;
    events::append(conn, id, events).await
}

impl Store {
    /// Whether a running session's lease has lapsed (its owner is gone).
    pub async fn lease_lapsed(&self, id: Uuid) -> Result<bool> {
        let lapsed: Option<bool> = sqlx::query_scalar(
            "SELECT status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
             FROM sessions WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(lapsed.unwrap_or(false))
    }

    /// Tells every replica that a control flag of `id` changed.
    pub async fn notify_control(&self, action: &str, id: Uuid) -> Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(crate::session::CONTROL_CHANNEL)
            .bind(format!("{action}:{id}"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Records a refinement in the session's history.
pub async fn insert_refinement(
    conn: &mut PgConnection,
    id: Uuid,
    kind: &str,
    goal_before: &str,
    goal_after: &str,
    data: &Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO refinements (session_id, number, kind, goal_before, goal_after, data)
         SELECT $1, COALESCE(MAX(number), 0) + 1, $2, $3, $4, $5 FROM refinements WHERE session_id = $1",
    )
    .bind(id)
    .bind(kind)
    .bind(goal_before)
    .bind(goal_after)
    .bind(data)
    .execute(conn)
    .await?;
    Ok(())
}

/// Starts a session that waited for refinement, with its chosen goal and limits.
pub async fn start_refined(
    conn: &mut PgConnection,
    id: Uuid,
    goal: &str,
    limits: Limits,
    owner: Uuid,
    lease_ttl: std::time::Duration,
    events: &[NewEvent],
) -> Result<Lease> {
    let token = Uuid::new_v4();
    sqlx::query(
        "UPDATE sessions SET status = 'running', reason = NULL, summary = NULL, reason_detail = NULL,
                original_goal = CASE WHEN goal = $2 THEN original_goal ELSE COALESCE(original_goal, goal) END,
                goal = $2, limits = $3, owner = $4, lease_token = $5,
                lease_expires_at = now() + make_interval(secs => $6), heartbeat_at = now(), updated_at = now()
         WHERE id = $1",
    )
    .bind(id)
    .bind(goal)
    .bind(Json(limits))
    .bind(owner)
    .bind(token)
    .bind(lease_ttl.as_secs_f64())
    .execute(&mut *conn)
    .await?;
    events::append(conn, id, events).await?;
    Ok(Lease {
        session_id: id,
        token,
    })
}

/// A refinement as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefinementRecord {
    /// Number, from 1.
    pub number: i32,
    /// `suggested`, `accept_suggestion`, `custom`, `proceed_with_time_limit`, `auto`, `resume`.
    pub kind: String,
    /// Goal before.
    pub goal_before: String,
    /// Goal after.
    pub goal_after: String,
    /// Details (patterns, confidence, limits).
    pub data: Value,
    /// When.
    pub created_at: DateTime<Utc>,
}

impl Store {
    /// The refinement history of a session.
    pub async fn refinements(&self, id: Uuid) -> Result<Vec<RefinementRecord>> {
        Ok(sqlx::query_as::<_, RefinementRecord>(
            "SELECT number, kind, goal_before, goal_after, data, created_at FROM refinements
             WHERE session_id = $1 ORDER BY number",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?)
    }
}

impl Store {
    /// Sessions changed at or after `since`, oldest change first.
    pub async fn sessions_changed_since(
        &self,
        since: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<SessionRecord>> {
        let rows = sqlx::query_as::<_, SessionRow>(select_session!(
            "WHERE updated_at >= $1 ORDER BY updated_at, id LIMIT $2"
        ))
        .bind(since)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(SessionRecord::try_from).collect()
    }
}
