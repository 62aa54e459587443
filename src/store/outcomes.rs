//! Outcome metrics computed from the stored sessions and events.

use std::collections::BTreeMap;

use super::rows::Outcomes;
use super::{Result, Store};
use crate::policy::lifecycle::Status;

impl Store {
    /// Iterations committed per minute over the last `minutes` minutes, oldest first.
    pub async fn velocity(
        &self,
        session_id: uuid::Uuid,
        minutes: i32,
        scope: &super::TenantScope,
    ) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>> {
        // The window's iterations are the newest: where it begins is found
        // walking back from the newest step in index order, and the count
        // reads from there, so neither reads the older history (a session at
        // iteration 1,000,000 read all of it, BENCHMARKS.md "Scale, round
        // three"). A bound the planner sees, not a subquery's: it is sent.
        let before: i64 = sqlx::query_scalar!(
            r#"SELECT coalesce((SELECT number FROM iterations
                                WHERE session_id = $1 AND finished_at <= now() - make_interval(mins => $2)
                                ORDER BY number DESC LIMIT 1), 0) AS "before!""#,
            session_id,
            minutes,
        )
        .fetch_one(&self.pool)
        .await?;
        let rows = sqlx::query!(
r#"SELECT date_trunc('minute', finished_at) AS "minute!", count(*) AS "count!" FROM iterations
             WHERE session_id = $1 AND number > $4 AND finished_at > now() - make_interval(mins => $2)
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($3::text IS NULL OR s.tenant = $3))
             GROUP BY 1 ORDER BY 1"#,
session_id,
minutes,
scope.tenant(),
before,
)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.minute, r.count)).collect())
    }

    /// Number of sessions in each status, fleet-wide (see [`Store::status_counts`]).
    pub async fn sessions_by_status(&self) -> Result<BTreeMap<String, i64>> {
        self.status_counts(None).await
    }

    /// Number of sessions of one tenant (`None`: every tenant) in each
    /// status, from the counts migration 0040 keeps (their folded base and
    /// the deltas since, summed in one statement) rather than a count of
    /// the sessions table: reads in proportion to tenants × statuses, not
    /// to what is stored. Statuses with no session are left out.
    pub async fn status_counts(&self, tenant: Option<&str>) -> Result<BTreeMap<String, i64>> {
        let rows = sqlx::query!(
            r#"SELECT status AS "status!", sum(sessions)::bigint AS "count!"
               FROM (SELECT tenant, status, sessions FROM session_status_counts
                     UNION ALL
                     SELECT tenant, status, sessions FROM session_status_count_deltas) c
               WHERE $1::text IS NULL OR tenant = $1
               GROUP BY status HAVING sum(sessions) > 0"#,
            tenant,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.status, r.count)).collect())
    }

    /// Outcome metrics over the stored sessions of one tenant (`None`: every tenant).
    pub async fn outcomes(&self, scope: &super::TenantScope) -> Result<Outcomes> {
        let tenant = scope.tenant();
        let mut out = Outcomes {
            by_status: self.status_counts(tenant).await?,
            ..Outcomes::default()
        };
        for row in sqlx::query!(
            r#"SELECT reason AS "reason!", count(*) AS "count!" FROM sessions
             WHERE reason IS NOT NULL AND status <> $1 AND ($2::text IS NULL OR tenant = $2)
             GROUP BY reason"#,
            Status::Running as Status,
            tenant,
        )
        .fetch_all(&self.pool)
        .await?
        {
            out.by_reason.insert(row.reason, row.count);
        }
        out.average_iterations_to_completion = sqlx::query_scalar!(
            "SELECT avg(iterations)::float8 FROM sessions
             WHERE status = $1 AND ($2::text IS NULL OR tenant = $2)",
            Status::Completed as Status,
            tenant,
        )
        .fetch_one(&self.pool)
        .await?;
        // Both counts in one pass over the two kinds of event they read.
        let reopened = sqlx::query!(
            r#"SELECT count(DISTINCT e.session_id)
                        FILTER (WHERE e.kind = 'status_changed' AND e.data->>'to' = $1) AS "ever!",
                      count(DISTINCT e.session_id)
                        FILTER (WHERE e.kind = 'resumed' AND e.data->>'from_status' = $1) AS "reopened!"
               FROM events e JOIN sessions s ON s.id = e.session_id
               WHERE e.kind IN ('status_changed', 'resumed')
                 AND ($2::text IS NULL OR s.tenant = $2)"#,
            Status::Completed as Status,
            tenant,
        )
        .fetch_one(&self.pool)
        .await?;
        out.ever_completed = reopened.ever;
        out.reopened_after_completion = reopened.reopened;
        Ok(out)
    }
}
