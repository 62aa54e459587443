//! Counts behind the per-tenant quotas, taken under a per-tenant
//! transaction lock so concurrent creates cannot both see room for one.

use sqlx::PgConnection;

use super::Result;

/// Takes the tenant's quota lock for the rest of the caller's transaction
/// and counts its active sessions (running, awaiting refinement or queued:
/// every session that holds or waits for a loop).
pub async fn lock_and_count_active(conn: &mut PgConnection, tenant: &str) -> Result<i64> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtext('warden.tenant_active'), hashtext($1))",
        tenant
    )
    .execute(&mut *conn)
    .await?;
    let active = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM sessions
           WHERE tenant = $1 AND status IN ('running', 'awaiting_refinement', 'queued')"#,
        tenant
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(active)
}
