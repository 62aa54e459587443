//! Outcome metrics computed from the stored sessions and events.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Result, Store};

/// How sessions turned out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcomes {
    /// Sessions by status.
    pub by_status: BTreeMap<String, i64>,
    /// Waiting or ended sessions by reason.
    pub by_reason: BTreeMap<String, i64>,
    /// Average iterations of completed sessions.
    pub average_iterations_to_completion: Option<f64>,
    /// Sessions that ever completed.
    pub ever_completed: i64,
    /// Sessions reopened by a user after completing.
    pub reopened_after_completion: i64,
}

impl Store {
    /// Iterations committed per minute over the last `minutes` minutes, oldest first.
    pub async fn velocity(
        &self,
        session_id: uuid::Uuid,
        minutes: i32,
    ) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>> {
        let rows = sqlx::query(
            "SELECT date_trunc('minute', finished_at) AS minute, count(*) FROM iterations
             WHERE session_id = $1 AND finished_at > now() - make_interval(mins => $2)
             GROUP BY minute ORDER BY minute",
        )
        .bind(session_id)
        .bind(minutes)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Number of sessions in each status.
    pub async fn sessions_by_status(&self) -> Result<BTreeMap<String, i64>> {
        let mut out = BTreeMap::new();
        for row in sqlx::query("SELECT status, count(*) FROM sessions GROUP BY status")
            .fetch_all(&self.pool)
            .await?
        {
            out.insert(row.try_get(0)?, row.try_get(1)?);
        }
        Ok(out)
    }

    /// Outcome metrics over every stored session.
    pub async fn outcomes(&self) -> Result<Outcomes> {
        let mut out = Outcomes {
            by_status: self.sessions_by_status().await?,
            ..Outcomes::default()
        };
        for row in sqlx::query(
            "SELECT reason, count(*) FROM sessions
             WHERE reason IS NOT NULL AND status <> 'running' GROUP BY reason",
        )
        .fetch_all(&self.pool)
        .await?
        {
            out.by_reason.insert(row.try_get(0)?, row.try_get(1)?);
        }
        out.average_iterations_to_completion = sqlx::query_scalar(
            "SELECT avg(iterations)::float8 FROM sessions WHERE status = 'completed'",
        )
        .fetch_one(&self.pool)
        .await?;
        out.ever_completed = sqlx::query_scalar(
            "SELECT count(DISTINCT session_id) FROM events
             WHERE kind = 'status_changed' AND data->>'to' = 'completed'",
        )
        .fetch_one(&self.pool)
        .await?;
        out.reopened_after_completion = sqlx::query_scalar(
            "SELECT count(DISTINCT session_id) FROM events
             WHERE kind = 'resumed' AND data->>'from_status' = 'completed'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(out)
    }
}
