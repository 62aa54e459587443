//! Idempotency keys of creates: which session a tenant's key created, and
//! with which request, for [`KEPT_HOURS`] hours.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Result, Store, TenantScope};

/// How long a key is remembered.
pub const KEPT_HOURS: i32 = 24;

/// A key already used within the last [`KEPT_HOURS`] hours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsedKey {
    /// The session its first request created.
    pub session_id: Uuid,
    /// The digest of that request's body.
    pub request_digest: Vec<u8>,
}

impl Store {
    /// The live use of `key` by the tenant of `scope`, if any.
    pub async fn used_idempotency_key(
        &self,
        scope: &TenantScope,
        tenant: &str,
        key: &str,
    ) -> Result<Option<UsedKey>> {
        Ok(sqlx::query_as!(
            UsedKey,
            "SELECT session_id, request_digest FROM idempotency_keys
             WHERE tenant = $1 AND key = $2 AND created_at > now() - make_interval(hours => $3)
               AND ($4::text IS NULL OR tenant = $4)",
            tenant,
            key,
            KEPT_HOURS,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Forgets keys older than [`KEPT_HOURS`] hours, every tenant's; returns
    /// how many.
    pub async fn purge_idempotency_keys(&self) -> Result<u64> {
        let done = sqlx::query!(
            "DELETE FROM idempotency_keys WHERE created_at <= now() - make_interval(hours => $1)",
            KEPT_HOURS,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Records, in the create's transaction, that `key` of `tenant` created
/// `session_id`. When a concurrent create holds the key, waits for it to
/// end and answers its use instead (`Some`): the caller then rolls back.
pub async fn claim(
    conn: &mut PgConnection,
    tenant: &str,
    key: &str,
    request_digest: &[u8],
    session_id: Uuid,
) -> Result<Option<UsedKey>> {
    sqlx::query!(
        "DELETE FROM idempotency_keys
         WHERE tenant = $1 AND key = $2 AND created_at <= now() - make_interval(hours => $3)",
        tenant,
        key,
        KEPT_HOURS,
    )
    .execute(&mut *conn)
    .await?;
    let claimed = sqlx::query!(
        "INSERT INTO idempotency_keys (tenant, key, request_digest, session_id)
         VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, key) DO NOTHING",
        tenant,
        key,
        request_digest,
        session_id,
    )
    .execute(&mut *conn)
    .await?;
    if claimed.rows_affected() == 1 {
        return Ok(None);
    }
    Ok(sqlx::query_as!(
        UsedKey,
        "SELECT session_id, request_digest FROM idempotency_keys WHERE tenant = $1 AND key = $2",
        tenant,
        key,
    )
    .fetch_optional(&mut *conn)
    .await?)
}
