//! The fleet as the database sees it: which replicas heartbeat, how many
//! sessions run and how many lost their owner, whether a session's owner is
//! still there, and (on the embedded server) giving up the leases of the
//! previous process.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Result, Store, TenantScope};
use crate::policy::lifecycle::Status;

/// Rows older than this are removed when a replica heartbeats: long gone.
const FORGET_REPLICAS_AFTER_SECS: f64 = 86_400.0;

/// The fleet's load, as one replica's heartbeat read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetCounts {
    /// Replicas that heartbeat within the window, the caller included.
    pub live_replicas: i64,
    /// Sessions running, orphans included.
    pub running: i64,
    /// Running sessions whose lease lapsed.
    pub orphans: i64,
}

/// What the database says of a session's owner, with the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerLiveness {
    /// The session's status.
    pub status: Status,
    /// When its lease ends unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When its owner last renewed the lease.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// The database's clock when this was read.
    pub now: DateTime<Utc>,
}

impl Store {
    /// Records this replica's heartbeat and reads the fleet's load: live
    /// replicas (heartbeat within `live_within`; the caller always counts),
    /// running sessions and orphans among them.
    ///
    /// The heartbeat also writes what the replica runs (`capabilities`),
    /// so a row made again after peers forgot it says it too.
    pub async fn fleet_heartbeat(
        &self,
        replica: Uuid,
        live_within: std::time::Duration,
        capabilities: &[String],
    ) -> Result<FleetCounts> {
        let row = sqlx::query!(
            r#"WITH beat AS (
                 INSERT INTO replicas (id, capabilities) VALUES ($1, $4)
                 ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), capabilities = EXCLUDED.capabilities
                 RETURNING id),
               gone AS (
                 DELETE FROM replicas
                 WHERE heartbeat_at < now() - make_interval(secs => $3) AND id <> $1
                 RETURNING id)
             SELECT (SELECT count(*) FROM replicas
                     WHERE id <> $1 AND heartbeat_at > now() - make_interval(secs => $2))
                    + (SELECT count(*) FROM beat) AS "live!",
                    count(*) AS "running!",
                    count(*) FILTER (WHERE lease_expires_at IS NULL OR lease_expires_at < now()) AS "orphans!"
             FROM sessions WHERE status = 'running'"#,
            replica,
            live_within.as_secs_f64(),
            FORGET_REPLICAS_AFTER_SECS,
            capabilities,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(FleetCounts {
            live_replicas: row.live,
            running: row.running,
            orphans: row.orphans,
        })
    }

    /// Enters this replica in the fleet before it takes any session: what
    /// it runs, its version and the newest migration it knows. Its leases
    /// need the row: without it, it covers no session's needs.
    pub async fn announce_replica(
        &self,
        replica: Uuid,
        capabilities: &[String],
        version: &str,
    ) -> Result<()> {
        sqlx::query!(
            "INSERT INTO replicas (id, capabilities, version, schema_version) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), capabilities = EXCLUDED.capabilities,
                    version = EXCLUDED.version, schema_version = EXCLUDED.schema_version",
            replica,
            capabilities,
            version,
            super::schema::binary_version(),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Whether a live replica other than `replica` (heartbeat within
    /// `live_within`) has every capability of `needs`.
    pub async fn fleet_covers(
        &self,
        replica: Uuid,
        needs: &[String],
        live_within: std::time::Duration,
    ) -> Result<bool> {
        Ok(sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM replicas
                 WHERE id <> $1 AND heartbeat_at > now() - make_interval(secs => $3)
                   AND capabilities @> $2) AS "covered!""#,
            replica,
            needs,
            live_within.as_secs_f64(),
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Removes this replica from the fleet (it drains): peers stop counting
    /// it when they share out the sessions it releases.
    pub async fn leave_fleet(&self, replica: Uuid) -> Result<()> {
        sqlx::query!("DELETE FROM replicas WHERE id = $1", replica)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// On the embedded server, whose data-directory lock proves that no
    /// other process runs a session: forgets every earlier replica and
    /// expires every lease, so this process's first rescue resumes them at
    /// once. Returns how many leases it expired.
    pub async fn release_previous_process(&self) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query!("DELETE FROM replicas")
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query!(
            "UPDATE sessions SET lease_expires_at = now()
             WHERE status = 'running' AND lease_expires_at > now()"
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// What the database says of the owner of `id`, if `scope` reaches it.
    pub async fn owner_liveness(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<OwnerLiveness>> {
        let mut conn = self.pool.acquire().await?;
        owner_liveness_on(&mut conn, id, scope).await
    }
}

/// What the database says of the owner of `id`, read on `conn` (under the
/// caller's row lock, when it holds one).
pub async fn owner_liveness_on(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
) -> Result<Option<OwnerLiveness>> {
    let row = sqlx::query!(
        r#"SELECT status AS "status: Status", lease_expires_at, heartbeat_at, now() AS "now!"
           FROM sessions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"#,
        id,
        scope.tenant(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|r| OwnerLiveness {
        status: r.status,
        lease_expires_at: r.lease_expires_at,
        heartbeat_at: r.heartbeat_at,
        now: r.now,
    }))
}
