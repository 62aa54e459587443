//! Calls that wait for a person: requested by a running step (fenced by
//! its lease), decided through the API (scoped by tenant), expired by the
//! sweep. A row of a step that never committed is never shown or decided:
//! every read joins the session and keeps `iteration <= sessions.iterations`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::rows::Lease;
use super::{Result, Store, StoreError, TenantScope};
use crate::policy::approval::Decision;

/// A call that waits for (or had) a person's decision: the `approvals`
/// row (the API shows it as `http::views::ApprovalView`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRow {
    /// The session.
    pub session_id: Uuid,
    /// Warden's name of the call: `{iteration}.{call_index}`.
    pub call_id: String,
    /// The step that asked.
    pub iteration: i64,
    /// Which call of the step (0-based).
    pub call_index: i32,
    /// The model's own id of the tool call, when a model made it.
    pub tool_call_id: Option<String>,
    /// The tool (or the webhook or worker agent's action).
    pub tool: String,
    /// Its arguments, as the agent asked (free-form agent data).
    pub arguments: Value,
    /// The arguments the person approved it with in place of the agent's;
    /// absent when it was not edited (it runs as asked). Free-form.
    pub edited_arguments: Option<Value>,
    /// The agent's text of the step: why it makes the call.
    pub reason: String,
    /// When it was asked for.
    pub requested_at: DateTime<Utc>,
    /// When it expires undecided (`WARDEN_APPROVAL_TIMEOUT_MS` after the request).
    pub expires_at: DateTime<Utc>,
    /// `approve`, `reject` or `expired`; absent while it waits.
    pub decision: Option<Decision>,
    /// Which key decided (its public prefix); absent when it expired.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// The person's message to the agent.
    pub message: Option<String>,
}

/// A call a running step asks a person about.
#[derive(Debug, Clone, PartialEq)]
pub struct NewApproval {
    /// The step.
    pub iteration: i64,
    /// Which call of it.
    pub call_index: i32,
    /// The model's id of the call.
    pub tool_call_id: Option<String>,
    /// The tool or action.
    pub tool: String,
    /// Its arguments (free-form agent data).
    pub arguments: Value,
    /// The agent's text of the step.
    pub reason: String,
    /// How long it may wait, ms.
    pub timeout_ms: u64,
}

/// A decision on a waiting call, as it is recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NewDecision<'a> {
    /// Approve, reject or expired.
    pub decision: Decision,
    /// Which key decided (its actor); `None` for an expiry.
    pub decided_by: Option<&'a str>,
    /// The person's message to the agent.
    pub message: Option<&'a str>,
    /// The arguments the call runs with in place of the agent's (approvals
    /// only; free-form, as the agent's are).
    pub edited_arguments: Option<&'a Value>,
}

/// Where a page of waiting approvals starts after.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalCursor {
    /// Requested at.
    pub requested_at: DateTime<Utc>,
    /// Session.
    pub session_id: Uuid,
    /// Call.
    pub call_id: String,
}

/// What deciding a call did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The decision was recorded.
    Recorded(ApprovalRow),
    /// The call had been decided already (the earlier decision).
    Already(ApprovalRow),
    /// No such call of that session (or not one the scope reaches).
    Missing,
}

/// The name of call `index` of step `iteration`.
pub fn call_id(iteration: i64, index: i32) -> String {
    format!("{iteration}.{index}")
}

impl Store {
    /// Records that a call of the step in flight waits for a person; a step
    /// run again writes its calls again (an undecided row is replaced).
    pub async fn request_approval(&self, lease: &Lease, new: &NewApproval) -> Result<()> {
        let timeout_ms = i64::try_from(new.timeout_ms).unwrap_or(i64::MAX);
        let written = sqlx::query!(
            "INSERT INTO approvals (session_id, call_id, iteration, call_index, tool_call_id, tool,
                                    arguments, reason, expires_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8,
                    now() + make_interval(secs => $9::bigint / 1000.0)
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND lease_token = $10)
             ON CONFLICT (session_id, call_id) DO UPDATE
                 SET tool_call_id = EXCLUDED.tool_call_id, tool = EXCLUDED.tool,
                     arguments = EXCLUDED.arguments, reason = EXCLUDED.reason,
                     requested_at = now(), expires_at = EXCLUDED.expires_at
                 WHERE approvals.decision IS NULL",
            lease.session_id,
            call_id(new.iteration, new.call_index),
            new.iteration,
            new.call_index,
            new.tool_call_id,
            new.tool,
            new.arguments,
            new.reason,
            timeout_ms,
            lease.token,
        )
        .execute(&self.pool)
        .await?;
        if written.rows_affected() == 0
            && !self
                .approval_decided(lease.session_id, new.iteration, new.call_index)
                .await?
        {
            return Err(StoreError::LeaseLost(lease.session_id));
        }
        Ok(())
    }

    async fn approval_decided(&self, session_id: Uuid, iteration: i64, index: i32) -> Result<bool> {
        Ok(sqlx::query_scalar!(
            "SELECT decision IS NOT NULL AS \"decided!\" FROM approvals
             WHERE session_id = $1 AND iteration = $2 AND call_index = $3",
            session_id,
            iteration,
            index,
        )
        .fetch_optional(&self.pool)
        .await?
        .unwrap_or(false))
    }

    /// The decided calls of step `iteration` of the session `lease` is
    /// for, in call order: what the next step carries out or refuses.
    pub async fn decided_calls(&self, lease: &Lease, iteration: i64) -> Result<Vec<ApprovalRow>> {
        let rows = sqlx::query_as!(
            ApprovalRow,
            r#"SELECT a.session_id, a.call_id, a.iteration, a.call_index, a.tool_call_id, a.tool,
                    a.arguments, a.edited_arguments, a.reason, a.requested_at, a.expires_at,
                    a.decision AS "decision: Decision", a.decided_by, a.decided_at, a.message
             FROM approvals a JOIN sessions s ON s.id = a.session_id
             WHERE a.session_id = $1 AND a.iteration = $2 AND a.decision IS NOT NULL
               AND s.lease_token = $3
             ORDER BY a.call_index"#,
            lease.session_id,
            iteration,
            lease.token,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The calls of a session that wait for a decision, oldest first.
    pub async fn waiting_approvals_of(
        &self,
        session_id: Uuid,
        scope: &TenantScope,
    ) -> Result<Vec<ApprovalRow>> {
        let rows = sqlx::query_as!(
            ApprovalRow,
            r#"SELECT a.session_id, a.call_id, a.iteration, a.call_index, a.tool_call_id, a.tool,
                    a.arguments, a.edited_arguments, a.reason, a.requested_at, a.expires_at,
                    a.decision AS "decision: Decision", a.decided_by, a.decided_at, a.message
             FROM approvals a JOIN sessions s ON s.id = a.session_id
             WHERE a.session_id = $1 AND a.decision IS NULL AND a.iteration <= s.iterations
               AND ($2::text IS NULL OR s.tenant = $2)
             ORDER BY a.iteration, a.call_index"#,
            session_id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// A page of the calls that wait for a decision across the sessions
    /// `scope` reaches, oldest request first.
    pub async fn waiting_approvals(
        &self,
        scope: &TenantScope,
        after: Option<&ApprovalCursor>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>> {
        let rows = sqlx::query_as!(
            ApprovalRow,
            r#"SELECT a.session_id, a.call_id, a.iteration, a.call_index, a.tool_call_id, a.tool,
                    a.arguments, a.edited_arguments, a.reason, a.requested_at, a.expires_at,
                    a.decision AS "decision: Decision", a.decided_by, a.decided_at, a.message
             FROM approvals a JOIN sessions s ON s.id = a.session_id
             WHERE a.decision IS NULL AND a.iteration <= s.iterations
               AND ($1::text IS NULL OR s.tenant = $1)
               AND ($2::timestamptz IS NULL
                    OR (a.requested_at, a.session_id, a.call_id) > ($2, $3, $4))
             ORDER BY a.requested_at, a.session_id, a.call_id
             LIMIT $5"#,
            scope.tenant(),
            after.map(|c| c.requested_at),
            after.map(|c| c.session_id),
            after.map(|c| c.call_id.as_str()),
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Waiting calls past their expiry, oldest first, at most `limit`: the
    /// sweep's own work, over every tenant.
    pub async fn expired_approvals(&self, limit: i64) -> Result<Vec<(Uuid, String)>> {
        let rows = sqlx::query!(
            "SELECT a.session_id, a.call_id FROM approvals a JOIN sessions s ON s.id = a.session_id
             WHERE a.decision IS NULL AND a.expires_at <= now() AND a.iteration <= s.iterations
             ORDER BY a.expires_at LIMIT $1",
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.session_id, r.call_id))
            .collect())
    }
}

/// Records a decision on a waiting call, inside the caller's transaction
/// (which holds the session's row lock). Edited arguments equal to the
/// agent's are no edit: the row keeps none.
pub async fn decide(
    conn: &mut PgConnection,
    session_id: Uuid,
    scope: &TenantScope,
    call_id: &str,
    made: &NewDecision<'_>,
) -> Result<Decided> {
    let recorded = sqlx::query_as!(
        ApprovalRow,
        r#"UPDATE approvals a SET decision = $4, decided_by = $5, decided_at = now(), message = $6,
                                edited_arguments = NULLIF($7::jsonb, a.arguments)
         FROM sessions s
         WHERE s.id = a.session_id AND a.session_id = $1 AND a.call_id = $2
           AND ($3::text IS NULL OR s.tenant = $3)
           AND a.iteration <= s.iterations AND a.decision IS NULL
         RETURNING a.session_id, a.call_id, a.iteration, a.call_index, a.tool_call_id, a.tool,
                   a.arguments, a.edited_arguments, a.reason, a.requested_at, a.expires_at,
                   a.decision AS "decision: Decision", a.decided_by, a.decided_at, a.message"#,
        session_id,
        call_id,
        scope.tenant(),
        made.decision.as_str(),
        made.decided_by,
        made.message,
        made.edited_arguments,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = recorded {
        return Ok(Decided::Recorded(row));
    }
    let earlier = sqlx::query_as!(
        ApprovalRow,
        r#"SELECT a.session_id, a.call_id, a.iteration, a.call_index, a.tool_call_id, a.tool,
                a.arguments, a.edited_arguments, a.reason, a.requested_at, a.expires_at,
                a.decision AS "decision: Decision", a.decided_by, a.decided_at, a.message
         FROM approvals a JOIN sessions s ON s.id = a.session_id
         WHERE a.session_id = $1 AND a.call_id = $2 AND ($3::text IS NULL OR s.tenant = $3)
           AND a.iteration <= s.iterations"#,
        session_id,
        call_id,
        scope.tenant(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match earlier {
        Some(row) => Decided::Already(row),
        None => Decided::Missing,
    })
}

/// How many calls of a session still wait, inside the caller's transaction.
pub async fn count_waiting(
    conn: &mut PgConnection,
    session_id: Uuid,
    scope: &TenantScope,
) -> Result<i64> {
    Ok(sqlx::query_scalar!(
        "SELECT count(*) AS \"n!\" FROM approvals a JOIN sessions s ON s.id = a.session_id
         WHERE a.session_id = $1 AND a.decision IS NULL AND a.iteration <= s.iterations
           AND ($2::text IS NULL OR s.tenant = $2)",
        session_id,
        scope.tenant(),
    )
    .fetch_one(&mut *conn)
    .await?)
}
