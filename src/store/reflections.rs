//! Reflections: each metacognitive assessment, the decision taken on it and
//! the reflection bookkeeping after it, so a rebuild replays them exactly.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::events::{self, NewEvent};
use super::leases::Lease;
use super::sessions::Counters;
use super::{Result, Store, StoreError};
use crate::policy::checklist::ChecklistItem;

/// A reflection about to be stored.
#[derive(Debug, Clone)]
pub struct NewReflection {
    /// 1-based number.
    pub number: i32,
    /// Iteration it followed.
    pub after_iteration: i64,
    /// `interval` or `agent_claimed_done`.
    pub trigger: String,
    /// Whether the reflector answered validly.
    pub ok: bool,
    /// The validated assessment.
    pub assessment: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// Verdict, state after, feedback.
    pub decision: Value,
    /// Interval until the next reflection.
    pub next_interval: i32,
    /// Tokens it used.
    pub tokens: i64,
    /// The model's raw answer.
    pub raw: Option<String>,
}

/// A stored reflection.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReflectionRecord {
    /// Number.
    pub number: i32,
    /// Iteration it followed.
    pub after_iteration: i64,
    /// Trigger.
    pub trigger: String,
    /// Valid answer?
    pub ok: bool,
    /// Assessment.
    pub assessment: Option<Value>,
    /// Failure.
    pub error: Option<String>,
    /// Decision.
    pub decision: Value,
    /// Next interval.
    pub next_interval: i32,
    /// Tokens.
    pub tokens: i64,
    /// Raw answer.
    pub raw: Option<String>,
    /// When.
    pub created_at: DateTime<Utc>,
}

impl Store {
    /// Stores a reflection with its event and the session's token counters.
    #[allow(clippy::too_many_arguments)]
    pub async fn insert_reflection(
        &self,
        lease: &Lease,
        reflection: &NewReflection,
        counters: Counters,
        percent_complete: Option<f64>,
        eta_seconds: Option<f64>,
        criteria: &[ChecklistItem],
        milestones: &[ChecklistItem],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let summary = serde_json::json!({
            "number": reflection.number,
            "after_iteration": reflection.after_iteration,
            "trigger": reflection.trigger,
            "ok": reflection.ok,
            "assessment": reflection.assessment,
            "error": reflection.error,
            "decision": reflection.decision,
            "next_interval": reflection.next_interval,
            "tokens": reflection.tokens,
        });
        let last: Option<i64> = sqlx::query_scalar(
            "UPDATE sessions SET last_event_seq = last_event_seq + 1, last_reflection = $3,
                    tokens_used = $4, reflection_tokens = $5, agent_tokens = $4 - $5,
                    percent_complete = COALESCE($6, percent_complete),
                    eta_seconds = COALESCE($7, eta_seconds), criteria = $8, milestones = $9,
                    updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status = 'running'
             RETURNING last_event_seq",
        )
        .bind(lease.session_id)
        .bind(lease.token)
        .bind(&summary)
        .bind(counters.tokens_used)
        .bind(counters.reflection_tokens)
        .bind(percent_complete)
        .bind(eta_seconds)
        .bind(sqlx::types::Json(criteria))
        .bind(sqlx::types::Json(milestones))
        .fetch_optional(&mut *tx)
        .await?;
        let last = last.ok_or(StoreError::LeaseLost(lease.session_id))?;
        sqlx::query(
            "INSERT INTO reflections (session_id, number, after_iteration, trigger, ok, assessment, error, decision, next_interval, tokens, raw)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(lease.session_id)
        .bind(reflection.number)
        .bind(reflection.after_iteration)
        .bind(&reflection.trigger)
        .bind(reflection.ok)
        .bind(&reflection.assessment)
        .bind(&reflection.error)
        .bind(&reflection.decision)
        .bind(reflection.next_interval)
        .bind(reflection.tokens)
        .bind(&reflection.raw)
        .execute(&mut *tx)
        .await?;
        events::insert_numbered(
            &mut tx,
            lease.session_id,
            last,
            &[NewEvent::new("reflection", summary)],
        )
        .await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        Ok(())
    }

    /// Reflections of a session numbered after `after`, in order.
    pub async fn reflections(
        &self,
        session_id: uuid::Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<ReflectionRecord>> {
        Ok(sqlx::query_as::<_, ReflectionRecord>(
            "SELECT number, after_iteration, trigger, ok, assessment, error, decision, next_interval, tokens, raw, created_at
             FROM reflections WHERE session_id = $1 AND number > $2 ORDER BY number LIMIT $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Reflections that followed iterations after `iteration` (for rebuilding state).
    pub async fn reflections_after_iteration(
        &self,
        session_id: uuid::Uuid,
        iteration: i64,
    ) -> Result<Vec<ReflectionRecord>> {
        Ok(sqlx::query_as::<_, ReflectionRecord>(
            "SELECT number, after_iteration, trigger, ok, assessment, error, decision, next_interval, tokens, raw, created_at
             FROM reflections WHERE session_id = $1 AND after_iteration > $2 ORDER BY number",
        )
        .bind(session_id)
        .bind(iteration)
        .fetch_all(&self.pool)
        .await?)
    }
}
