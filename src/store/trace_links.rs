//! The trace links kept with a session (`migrations/0035`): the W3C
//! traceparent of the API request that created or last resumed it, and of
//! its latest run's `invoke_agent` span, so the next run links to both on
//! whichever replica it starts. Written only while traces are exported.

use sqlx::PgConnection;
use uuid::Uuid;

use super::rows::Lease;
use super::{Result, Store, TenantScope};

/// The traceparents a run links to, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredTraceLinks {
    /// The request that created or last resumed the session.
    pub request: Option<String>,
    /// The previous run's `invoke_agent` span.
    pub previous_run: Option<String>,
}

/// Most characters of a stored traceparent (a W3C one has 55).
const MAX_TRACEPARENT_CHARS: usize = 128;

/// Records `traceparent` as the request that created or resumed session
/// `id` of `scope`, on the caller's connection (its transaction).
pub async fn set_request_traceparent(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    traceparent: &str,
) -> Result<()> {
    if traceparent.chars().count() > MAX_TRACEPARENT_CHARS {
        return Ok(());
    }
    sqlx::query!(
        "UPDATE sessions SET request_traceparent = $3
          WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
        id,
        scope.tenant(),
        traceparent,
    )
    .execute(conn)
    .await?;
    Ok(())
}

impl Store {
    /// Records `traceparent` as the span of the run `lease` starts, and
    /// answers the links that run takes: the request's and the previous
    /// run's. Nothing when the lease is no longer held.
    pub async fn start_run_trace(
        &self,
        lease: &Lease,
        traceparent: Option<&str>,
    ) -> Result<StoredTraceLinks> {
        let traceparent = traceparent.filter(|t| t.chars().count() <= MAX_TRACEPARENT_CHARS);
        let row = sqlx::query!(
            r#"UPDATE sessions s SET run_traceparent = COALESCE($3, s.run_traceparent)
                 FROM (SELECT id, request_traceparent, run_traceparent FROM sessions
                        WHERE id = $1 AND lease_token = $2 FOR UPDATE) old
                WHERE s.id = old.id
            RETURNING old.request_traceparent AS "request?", old.run_traceparent AS "previous_run?""#,
            lease.session_id,
            lease.token,
            traceparent,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|r| StoredTraceLinks {
                request: r.request,
                previous_run: r.previous_run,
            })
            .unwrap_or_default())
    }
}
