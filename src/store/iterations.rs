//! The loop's writes: committed iterations, checkpoints and the final status,
//! each fenced by the lease so a replica that lost a session writes nothing.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::events::{self, NewEvent};
use super::group_commit::PendingCommit;
use super::leases::Lease;
use super::sessions::{ControlFlags, Counters, SessionSettings};
use super::{Result, Store, StoreError};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::Mode;
use crate::policy::termination::Termination;

/// An iteration about to be committed.
#[derive(Debug, Clone)]
pub struct NewIteration {
    /// Number, 1-based and gap-free per session.
    pub number: i64,
    /// Run it belongs to.
    pub run: i32,
    /// Action name.
    pub action: String,
    /// `success`, `failure` or `error`.
    pub outcome: &'static str,
    /// Tokens used.
    pub tokens: i64,
    /// Wall time, ms.
    pub duration_ms: i64,
    /// The full step record (JSON).
    pub record: Value,
    /// What the policies concluded from it (JSON).
    pub effects: Value,
    /// The step's conversation (model executors).
    pub transcript: Option<Value>,
    /// Context cycle it ran in.
    pub cycle: i32,
    /// The cycle and memory the session moves to after this step, when it changes.
    pub next_cycle: Option<(i32, String)>,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: DateTime<Utc>,
}

/// An iteration as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct IterationRecord {
    /// Number.
    pub number: i64,
    /// Run.
    pub run: i32,
    /// Action name.
    pub action: String,
    /// Outcome.
    pub outcome: String,
    /// Tokens.
    pub tokens: i64,
    /// Wall time, ms.
    pub duration_ms: i64,
    /// Step record.
    pub record: Value,
    /// Policy effects.
    pub effects: Value,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End.
    pub finished_at: DateTime<Utc>,
}

/// A checkpoint as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointRecord {
    /// Id, increasing.
    pub id: i64,
    /// Last iteration it covers.
    pub iteration: i64,
    /// Why it was taken.
    pub reason: String,
    /// Loop state snapshot.
    pub state: Value,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// Advances the session's event counter under the lease fence and returns
/// the new last sequence number with the current control flags.
async fn fenced_update(
    conn: &mut PgConnection,
    lease: &Lease,
    events: usize,
) -> Result<(i64, ControlFlags)> {
    let row = sqlx::query(
        "UPDATE sessions SET last_event_seq = last_event_seq + $3, updated_at = now()
         WHERE id = $1 AND lease_token = $2 AND status = 'running'
         RETURNING last_event_seq, stop_requested, pause_requested, mode, limits",
    )
    .bind(lease.session_id)
    .bind(lease.token)
    .bind(events as i64)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::LeaseLost(lease.session_id))?;
    Ok((row.try_get(0)?, control_flags(lease.session_id, &row)?))
}

/// The control flags in a row returned by a fenced update of `session_id`.
pub(super) fn control_flags(session_id: Uuid, row: &PgRow) -> Result<ControlFlags> {
    let mode: String = row.try_get("mode")?;
    let limits: Json<Limits> = row.try_get("limits")?;
    Ok(ControlFlags {
        stop_requested: row.try_get("stop_requested")?,
        pause_requested: row.try_get("pause_requested")?,
        settings: SessionSettings {
            mode: Mode::parse(&mode).ok_or_else(|| StoreError::Corrupt {
                id: session_id,
                detail: format!("mode {mode}"),
            })?,
            limits: limits.0,
        },
    })
}

pub(super) async fn insert_checkpoint(
    conn: &mut PgConnection,
    session_id: Uuid,
    iteration: i64,
    reason: &str,
    state: &Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO checkpoints (session_id, iteration, reason, state) VALUES ($1, $2, $3, $4)",
    )
    .bind(session_id)
    .bind(iteration)
    .bind(reason)
    .bind(state)
    .execute(conn)
    .await?;
    Ok(())
}

impl Store {
    /// Commits one iteration with the session's counters and events, and
    /// returns the control flags as they are now. Returns once the iteration
    /// is durable; iterations of other sessions finishing at the same moment
    /// share its transaction (see `group_commit`).
    pub async fn commit_iteration(
        &self,
        lease: &Lease,
        iteration: NewIteration,
        counters: Counters,
        progress: (Option<f64>, Option<f64>),
        events: Vec<NewEvent>,
    ) -> Result<ControlFlags> {
        let pending = PendingCommit {
            lease: *lease,
            iteration,
            counters,
            progress,
            events,
        };
        let flags = self.group_commit().commit(pending).await?;
        self.announce(lease.session_id);
        Ok(flags)
    }

    /// Appends events on behalf of the loop (decisions that did not come with an iteration).
    pub async fn append_fenced(&self, lease: &Lease, events: &[NewEvent]) -> Result<ControlFlags> {
        let mut tx = self.pool.begin().await?;
        let (last_seq, flags) = fenced_update(&mut tx, lease, events.len()).await?;
        events::insert_numbered(&mut tx, lease.session_id, last_seq, events).await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        Ok(flags)
    }

    /// Saves a checkpoint of a running session.
    pub async fn save_checkpoint(
        &self,
        lease: &Lease,
        iteration: i64,
        reason: &str,
        state: &Value,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let event = NewEvent::new(
            "checkpoint_saved",
            serde_json::json!({ "iteration": iteration, "reason": reason }),
        );
        let (last_seq, _) = fenced_update(&mut tx, lease, 1).await?;
        insert_checkpoint(&mut tx, lease.session_id, iteration, reason, state).await?;
        sqlx::query("UPDATE sessions SET last_checkpoint_iteration = $2 WHERE id = $1")
            .bind(lease.session_id)
            .bind(iteration)
            .execute(&mut *tx)
            .await?;
        events::insert_numbered(&mut tx, lease.session_id, last_seq, &[event]).await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        Ok(())
    }

    /// Ends a running session: checkpoint, status, termination record and
    /// events in one transaction; releases the lease.
    pub async fn finish(
        &self,
        lease: &Lease,
        termination: &Termination,
        detail: Option<&str>,
        counters: Counters,
        checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let (last_seq, flags) = fenced_update(&mut tx, lease, events.len()).await?;
        // The flags were read under the row lock this transaction now holds:
        // a stop committed before it wins over a pause (dropping `tx` rolls back).
        if flags.stop_requested && termination.status == crate::policy::lifecycle::Status::Paused {
            return Err(StoreError::StopPending(lease.session_id));
        }
        insert_checkpoint(
            &mut tx,
            lease.session_id,
            checkpoint.0,
            termination.reason.as_str(),
            checkpoint.1,
        )
        .await?;
        sqlx::query(
            "UPDATE sessions SET status = $2, reason = $3, summary = $4, next_steps = $5,
                    checkpoint_saved = true, last_checkpoint_iteration = $6,
                    iterations = $7, tokens_used = $8, tool_calls = $9, consecutive_errors = $10, elapsed_ms = $11,
                    reflection_tokens = $12, agent_tokens = $8 - $12, reason_detail = $13,
                    percent_complete = CASE WHEN $2 = 'completed' THEN 100 ELSE percent_complete END,
                    eta_seconds = CASE WHEN $2 = 'paused' THEN eta_seconds ELSE NULL END,
                    stop_requested = false, pause_requested = false,
                    owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    ended_at = CASE WHEN $2 = 'paused' THEN NULL ELSE now() END
             WHERE id = $1",
        )
        .bind(lease.session_id)
        .bind(termination.status.as_str())
        .bind(termination.reason.as_str())
        .bind(&termination.summary)
        .bind(Json(&termination.next_steps))
        .bind(checkpoint.0)
        .bind(counters.iterations)
        .bind(counters.tokens_used)
        .bind(counters.tool_calls)
        .bind(counters.consecutive_errors)
        .bind(counters.elapsed_ms)
        .bind(counters.reflection_tokens)
        .bind(detail)
        .execute(&mut *tx)
        .await?;
        events::insert_numbered(&mut tx, lease.session_id, last_seq, events).await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        Ok(())
    }

    /// Checkpoints a running session and gives up its lease without ending it,
    /// so another process (or this one after a restart) picks it up at once.
    pub async fn release(
        &self,
        lease: &Lease,
        counters: Counters,
        checkpoint: (i64, &Value),
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let event = NewEvent::new(
            "lease_released",
            serde_json::json!({ "iteration": checkpoint.0, "reason": "shutdown" }),
        );
        let (last_seq, _) = fenced_update(&mut tx, lease, 1).await?;
        insert_checkpoint(
            &mut tx,
            lease.session_id,
            checkpoint.0,
            "shutdown",
            checkpoint.1,
        )
        .await?;
        sqlx::query(
            "UPDATE sessions SET last_checkpoint_iteration = $2, elapsed_ms = $3,
                    owner = NULL, lease_token = NULL, lease_expires_at = NULL
             WHERE id = $1",
        )
        .bind(lease.session_id)
        .bind(checkpoint.0)
        .bind(counters.elapsed_ms)
        .execute(&mut *tx)
        .await?;
        events::insert_numbered(&mut tx, lease.session_id, last_seq, &[event]).await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        Ok(())
    }

    /// The latest checkpoint of a session and every iteration committed after it.
    pub async fn rebuild_inputs(
        &self,
        session_id: Uuid,
    ) -> Result<(Option<CheckpointRecord>, Vec<IterationRecord>)> {
        let checkpoint = sqlx::query_as::<_, CheckpointRecord>(
            "SELECT id, iteration, reason, state, created_at FROM checkpoints
             WHERE session_id = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        let after = checkpoint.as_ref().map_or(0, |c| c.iteration);
        let iterations = self.iterations(session_id, after, i64::MAX).await?;
        Ok((checkpoint, iterations))
    }

    /// The conversation of the last `steps` committed iterations of the
    /// current context cycle, oldest first.
    pub async fn transcript(&self, session_id: Uuid, steps: i64) -> Result<Vec<Value>> {
        let rows: Vec<Value> = sqlx::query_scalar(
            "SELECT transcript FROM (
                 SELECT i.number, i.transcript FROM iterations i JOIN sessions s ON s.id = i.session_id
                 WHERE i.session_id = $1 AND i.transcript IS NOT NULL AND i.cycle = s.cycle
                 ORDER BY i.number DESC LIMIT $2) t
             ORDER BY number",
        )
        .bind(session_id)
        .bind(steps)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Iterations of a session numbered after `after`, in order.
    pub async fn iterations(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<IterationRecord>> {
        Ok(sqlx::query_as::<_, IterationRecord>(
            "SELECT number, run, action, outcome, tokens, duration_ms, record, effects, started_at, finished_at
             FROM iterations WHERE session_id = $1 AND number > $2 ORDER BY number LIMIT $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Checkpoints of a session with id after `after`, oldest first.
    pub async fn checkpoints(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CheckpointRecord>> {
        Ok(sqlx::query_as::<_, CheckpointRecord>(
            "SELECT id, iteration, reason, state, created_at FROM checkpoints
             WHERE session_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}
