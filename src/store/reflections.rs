//! Reflections: each metacognitive assessment, the decision taken on it and
//! the reflection bookkeeping after it, so a rebuild replays them exactly.

use sqlx::types::Json;

use super::event_log;
use super::rows::{Counters, Lease, NewEvent, NewReflection, ReflectionRecord};
use super::{Result, Store, StoreError};
use crate::policy::checklist::ChecklistItem;
use crate::policy::lifecycle::Status;
use crate::policy::loop_state::AppliedReflection;
use crate::policy::reflection::Assessment;

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
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let last_reflection = &reflection.summary;
        let summary = NewEvent::from_event(&last_reflection.event())?;
        let last: Option<i64> = sqlx::query_scalar!(
            "UPDATE sessions SET last_event_seq = last_event_seq + 1, last_reflection = $3,
                    tokens_used = warden_sat_add($4, GREATEST(tokens_charged - $11, 0)), reflection_tokens = $5,
                    agent_tokens = warden_sat_add($4, GREATEST(tokens_charged - $11, 0)) - $5::bigint,
                    percent_complete = COALESCE($6, percent_complete),
                    eta_seconds = COALESCE($7, eta_seconds), criteria = $8, milestones = $9,
                    updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $10
             RETURNING last_event_seq",
            lease.session_id,
            lease.token,
            Json(last_reflection) as _,
            counters.tokens_used(),
            counters.reflection_tokens(),
            percent_complete,
            eta_seconds,
            Json(criteria) as _,
            Json(milestones) as _,
            Status::Running as Status,
            counters.charges_seen(),
        )
        .fetch_optional(&mut *tx)
        .await?;
        let last = last.ok_or(StoreError::LeaseLost(lease.session_id))?;
        sqlx::query!(
            "INSERT INTO reflections (session_id, number, after_iteration, trigger, ok, assessment,
                                      error, decision, next_interval, tokens, raw)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            lease.session_id,
            last_reflection.number,
            last_reflection.after_iteration,
            last_reflection.trigger.as_str(),
            last_reflection.ok,
            last_reflection.assessment.as_ref().map(Json) as _,
            last_reflection.error.as_deref(),
            Json(&last_reflection.decision) as _,
            last_reflection.next_interval,
            last_reflection.tokens,
            reflection.raw.as_deref(),
        )
        .execute(&mut *tx)
        .await?;
        event_log::insert_numbered(&mut tx, lease.session_id, last, &[summary]).await?;
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
        scope: &super::TenantScope,
    ) -> Result<Vec<ReflectionRecord>> {
        Ok(sqlx::query_as!(
            ReflectionRecord,
            r#"SELECT number, after_iteration, trigger, ok, assessment AS "assessment: Json<Assessment>", error,
                    decision AS "decision: Json<AppliedReflection>", next_interval, tokens, raw, created_at
             FROM reflections WHERE session_id = $1 AND number > $2
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
}
