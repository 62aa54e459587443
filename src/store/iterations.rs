//! The loop's writes: committed iterations, checkpoints and the final status,
//! each fenced by the lease so a replica that lost a session writes nothing.

use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::checkpoints::insert_checkpoint;
use super::event_log;
use super::group_commit::PendingCommit;
use super::rows::{
    CheckpointRecord, ControlFlags, ControlRow, Counters, IterationRecord, Lease, NewEvent,
    NewIteration,
};
use super::{Result, Store, StoreError, TenantScope};
use crate::event::SessionEvent;
use crate::policy::guardrails::Limits;
use crate::policy::history::StepRecord;
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::loop_state::{LoopState, StepEffects};
use crate::policy::pricing::StepUsage;
use crate::policy::termination::Termination;

/// Advances the session's event counter under the lease fence and returns
/// the new last sequence number with the current control flags.
async fn fenced_update(
    conn: &mut PgConnection,
    lease: &Lease,
    events: usize,
) -> Result<(i64, ControlFlags)> {
    let row = sqlx::query!(
        r#"UPDATE sessions SET last_event_seq = last_event_seq + $3, updated_at = now()
           WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $4
           RETURNING last_event_seq, stop_requested, pause_requested, mode AS "mode: Mode",
                     limits AS "limits: Json<Limits>", updated_at"#,
        lease.session_id,
        lease.token,
        events as i64,
        Status::Running as Status,
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::LeaseLost(lease.session_id))?;
    let flags = ControlRow {
        stop_requested: row.stop_requested,
        pause_requested: row.pause_requested,
        mode: row.mode,
        limits: row.limits,
        last_event_seq: row.last_event_seq,
        updated_at: row.updated_at,
    };
    Ok((row.last_event_seq, flags.into()))
}

impl Store {
    /// Appends `events` after `last_seq` to the session's log in `tx`,
    /// commits, waits until it is durable and tells the session's watchers.
    async fn log_and_commit(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        session_id: Uuid,
        last_seq: i64,
        events: &[NewEvent],
    ) -> Result<()> {
        event_log::insert_numbered(&mut tx, session_id, last_seq, events).await?;
        tx.commit().await?;
        self.durable().await?;
        self.announce(session_id);
        Ok(())
    }

    /// Commits one iteration with the session's counters and events, and
    /// returns the control flags as they are now. Returns once the iteration
    /// is durable; iterations of other sessions finishing at the same moment
    /// share its transaction (see `group_commit`). Once `hurry` fires (its
    /// session was stopped) while the iteration still waits for a group, it
    /// commits alone at once: a stop's end never queues behind the groups.
    pub async fn commit_iteration(
        &self,
        lease: &Lease,
        iteration: NewIteration,
        counters: Counters,
        progress: (Option<f64>, Option<f64>),
        events: Vec<NewEvent>,
        hurry: Option<&CancellationToken>,
    ) -> Result<ControlFlags> {
        let pending = PendingCommit {
            lease: *lease,
            iteration,
            counters,
            progress,
            events,
        };
        let flags = self.group_commit().commit(pending, hurry).await?;
        // Committed is not yet durable on the embedded server: the next
        // iteration starts only once it is on the disk.
        self.durable().await?;
        self.announce(lease.session_id);
        Ok(flags)
    }

    /// Appends events on behalf of the loop (decisions that did not come with an iteration).
    pub async fn append_fenced(&self, lease: &Lease, events: &[NewEvent]) -> Result<ControlFlags> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let (last_seq, flags) = fenced_update(&mut tx, lease, events.len()).await?;
        self.log_and_commit(tx, lease.session_id, last_seq, events)
            .await?;
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
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let event = NewEvent::from_event(&SessionEvent::CheckpointSaved {
            iteration,
            reason: reason.to_string(),
        })?;
        let (last_seq, _) = fenced_update(&mut tx, lease, 1).await?;
        insert_checkpoint(&mut tx, lease.session_id, iteration, reason, state).await?;
        sqlx::query!(
            "UPDATE sessions SET last_checkpoint_iteration = $2 WHERE id = $1",
            lease.session_id,
            iteration,
        )
        .execute(&mut *tx)
        .await?;
        self.log_and_commit(tx, lease.session_id, last_seq, &[event])
            .await?;
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
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let (last_seq, flags) = fenced_update(&mut tx, lease, events.len()).await?;
        // The flags were read under the row lock this transaction now holds:
        // a stop committed before it wins over a pause (dropping `tx` rolls back).
        if flags.stop_requested && termination.status == Status::Paused {
            return Err(StoreError::StopPending(lease.session_id));
        }
        // A completed session is all done; a paused one keeps its estimate
        // and has not ended.
        let completed = termination.status == Status::Completed;
        let paused = termination.status == Status::Paused;
        insert_checkpoint(
            &mut tx,
            lease.session_id,
            checkpoint.0,
            termination.reason.as_str(),
            checkpoint.1,
        )
        .await?;
        sqlx::query!(
"UPDATE sessions SET status = $2, reason = $3, summary = $4, next_steps = $5,
                    checkpoint_saved = true, last_checkpoint_iteration = $6,
                    iterations = $7, tool_calls = $9, consecutive_errors = $10, elapsed_ms = $11,
                    tokens_used = warden_sat_add($8, GREATEST(tokens_charged - $16, 0)),
                    reflection_tokens = $12, reason_detail = $13,
                    agent_tokens = warden_sat_add($8, GREATEST(tokens_charged - $16, 0)) - $12::bigint,
                    percent_complete = CASE WHEN $14 THEN 100 ELSE percent_complete END,
                    eta_seconds = CASE WHEN $15 THEN eta_seconds ELSE NULL END,
                    stop_requested = false, pause_requested = false,
                    owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    ended_at = CASE WHEN $15 THEN NULL ELSE now() END
             WHERE id = $1",
lease.session_id,
termination.status as Status,
termination.reason as Reason,
termination.summary.as_str(),
Json(&termination.next_steps) as _,
checkpoint.0,
counters.iterations(),
counters.tokens_used(),
counters.tool_calls(),
counters.consecutive_errors(),
counters.elapsed_ms(),
counters.reflection_tokens(),
detail,
completed,
paused,
counters.charges_seen(),
)
        .execute(&mut *tx)
        .await?;
        self.log_and_commit(tx, lease.session_id, last_seq, events)
            .await?;
        Ok(())
    }

    /// Checkpoints a running session and gives up its lease without ending it,
    /// so another process (or this one after a restart) picks it up at once.
    pub async fn release(
        &self,
        lease: &Lease,
        counters: Counters,
        checkpoint: (i64, &Value),
        charges: &[NewEvent],
    ) -> Result<()> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let mut events = charges.to_vec();
        events.push(NewEvent::from_event(&SessionEvent::LeaseReleased {
            iteration: checkpoint.0,
            reason: "shutdown".into(),
        })?);
        let (last_seq, _) = fenced_update(&mut tx, lease, events.len()).await?;
        insert_checkpoint(
            &mut tx,
            lease.session_id,
            checkpoint.0,
            "shutdown",
            checkpoint.1,
        )
        .await?;
        sqlx::query!(
            "UPDATE sessions SET last_checkpoint_iteration = $2, elapsed_ms = $3,
                    tokens_used = warden_sat_add($4, GREATEST(tokens_charged - $6, 0)),
                    agent_tokens = warden_sat_add($4, GREATEST(tokens_charged - $6, 0)) - $5::bigint,
                    owner = NULL, lease_token = NULL, lease_expires_at = NULL
             WHERE id = $1",
            lease.session_id,
            checkpoint.0,
            counters.elapsed_ms(),
            counters.tokens_used(),
            counters.reflection_tokens(),
            counters.charges_seen(),
        )
        .execute(&mut *tx)
        .await?;
        self.log_and_commit(tx, lease.session_id, last_seq, &events)
            .await?;
        Ok(())
    }

    /// The conversation of the last `steps` committed iterations of the
    /// current context cycle, oldest first.
    pub async fn transcript(&self, session_id: Uuid, steps: i64) -> Result<Vec<Value>> {
        let rows: Vec<Value> = sqlx::query_scalar!(
r#"SELECT transcript AS "transcript!" FROM (
                 SELECT i.number, i.transcript FROM iterations i JOIN sessions s ON s.id = i.session_id
                 WHERE i.session_id = $1 AND i.transcript IS NOT NULL AND i.cycle = s.cycle
                 ORDER BY i.number DESC LIMIT $2) t
             ORDER BY number"#,
session_id,
steps,
)
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
        scope: &TenantScope,
    ) -> Result<Vec<IterationRecord>> {
        Ok(sqlx::query_as!(
            IterationRecord,
            r#"SELECT number, run, action, outcome, tokens, duration_ms,
                    record AS "record: Json<StepRecord>", effects AS "effects: Json<StepEffects>",
                    started_at, finished_at, usage AS "usage: Json<StepUsage>", cost_usd,
                    price_pattern, price_valid_from
             FROM iterations WHERE session_id = $1 AND number > $2
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($4::text IS NULL OR s.tenant = $4))
             ORDER BY number LIMIT $3"#,
            session_id,
            after,
            limit,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Checkpoints of a session with id after `after`, oldest first.
    pub async fn checkpoints(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<CheckpointRecord>> {
        Ok(sqlx::query_as!(
            CheckpointRecord,
            r#"SELECT id, iteration, reason, state AS "state: Json<LoopState>", created_at FROM checkpoints
             WHERE session_id = $1 AND id > $2
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($4::text IS NULL OR s.tenant = $4))
             ORDER BY id LIMIT $3"#,
            session_id,
            after,
            limit,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
