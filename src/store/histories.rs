//! A tenant's settled sessions read as history for the threshold report:
//! how each ended, the limits it ran under, its status changes and what
//! its reflections said of its progress.

use std::collections::HashMap;

use serde::Deserialize;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Result, Store, TenantScope};
use crate::policy::guardrails::Limits;
use crate::policy::insights::{ReflectionPoint, SessionHistory, Transition};
use crate::policy::lifecycle::{Reason, Status};

/// Most sessions one report reads (the most recent).
pub const MAX_REPORTED_SESSIONS: i64 = 2_000;

/// The part of a `status_changed` event the report reads.
#[derive(Deserialize)]
struct StatusChange {
    to: Status,
    #[serde(default)]
    reason: Option<Reason>,
}

impl Store {
    /// The most recent settled sessions of `tenant` (within `scope`):
    /// ended ones and paused ones, at most [`MAX_REPORTED_SESSIONS`].
    pub async fn settled_histories(
        &self,
        scope: &TenantScope,
        tenant: &str,
    ) -> Result<Vec<SessionHistory>> {
        let mut conn = self.pool().acquire().await?;
        let rows = sqlx::query!(
            r#"SELECT id, status AS "status: Status", reason AS "reason: Reason", iterations,
                      limits AS "limits: Json<Limits>"
               FROM sessions
               WHERE tenant = $1 AND ($2::text IS NULL OR tenant = $2)
                 AND status IN ('completed', 'stopped', 'failed', 'interrupted', 'paused')
               ORDER BY updated_at DESC
               LIMIT $3"#,
            tenant,
            scope.tenant(),
            MAX_REPORTED_SESSIONS
        )
        .fetch_all(&mut *conn)
        .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let mut transitions: HashMap<Uuid, Vec<Transition>> = HashMap::new();
        for e in sqlx::query!(
            r#"SELECT e.session_id, e.data
               FROM events e JOIN sessions s ON s.id = e.session_id
               WHERE e.session_id = ANY($1) AND s.tenant = $2 AND e.kind = 'status_changed'
               ORDER BY e.session_id, e.seq"#,
            &ids,
            tenant
        )
        .fetch_all(&mut *conn)
        .await?
        {
            // An event this version cannot read is left out, not an error:
            // the report is over what can be read.
            if let Ok(change) = serde_json::from_value::<StatusChange>(e.data) {
                transitions
                    .entry(e.session_id)
                    .or_default()
                    .push(Transition {
                        to: change.to,
                        reason: change.reason,
                    });
            }
        }
        let mut reflections: HashMap<Uuid, Vec<ReflectionPoint>> = HashMap::new();
        for r in sqlx::query!(
            r#"SELECT r.session_id, r.after_iteration,
                      (r.assessment->>'percent_complete')::float8 AS "percent!"
               FROM reflections r JOIN sessions s ON s.id = r.session_id
               WHERE r.session_id = ANY($1) AND s.tenant = $2 AND r.ok
                 AND r.assessment ? 'percent_complete'
               ORDER BY r.session_id, r.number"#,
            &ids,
            tenant
        )
        .fetch_all(&mut *conn)
        .await?
        {
            reflections
                .entry(r.session_id)
                .or_default()
                .push(ReflectionPoint {
                    after_iteration: u64::try_from(r.after_iteration).unwrap_or(0),
                    percent_complete: r.percent,
                });
        }
        Ok(rows
            .into_iter()
            .map(|r| SessionHistory {
                id: r.id,
                status: r.status,
                reason: r.reason,
                iterations: u64::try_from(r.iterations).unwrap_or(0),
                limits: r.limits.0,
                transitions: transitions.remove(&r.id).unwrap_or_default(),
                reflections: reflections.remove(&r.id).unwrap_or_default(),
            })
            .collect())
    }

    /// The ids of the `limit` most recent settled sessions of `tenant`
    /// (within `scope`), newest first: the same sessions, in the same
    /// order, as [`Store::settled_histories`] reads.
    pub async fn settled_session_ids(
        &self,
        scope: &TenantScope,
        tenant: &str,
        limit: i64,
    ) -> Result<Vec<Uuid>> {
        Ok(sqlx::query_scalar!(
            r#"SELECT id FROM sessions
               WHERE tenant = $1 AND ($2::text IS NULL OR tenant = $2)
                 AND status IN ('completed', 'stopped', 'failed', 'interrupted', 'paused')
               ORDER BY updated_at DESC
               LIMIT $3"#,
            tenant,
            scope.tenant(),
            limit.min(MAX_REPORTED_SESSIONS)
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
