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
        schema_version: i64,
    ) -> Result<()> {
        sqlx::query!(
            "INSERT INTO replicas (id, capabilities, version, schema_version) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), capabilities = EXCLUDED.capabilities,
                    version = EXCLUDED.version, schema_version = EXCLUDED.schema_version",
            replica,
            capabilities,
            version,
            schema_version,
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

    /// The needs of session `id`, if `scope` reaches it, when it needs
    /// something and no live replica (heartbeat within `live_within`) has
    /// all of it: what it waits for while queued. `None` otherwise.
    pub async fn uncovered_needs(
        &self,
        id: Uuid,
        scope: &TenantScope,
        live_within: std::time::Duration,
    ) -> Result<Option<Vec<String>>> {
        Ok(sqlx::query_scalar!(
            r#"SELECT s.needs FROM sessions s
               WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)
                 AND cardinality(s.needs) > 0
                 AND NOT EXISTS (SELECT 1 FROM replicas r
                                 WHERE r.heartbeat_at > now() - make_interval(secs => $3)
                                   AND r.capabilities @> s.needs)"#,
            id,
            scope.tenant(),
            live_within.as_secs_f64(),
        )
        .fetch_optional(&self.pool)
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
        let mut tx = super::connection::begin_detached(&self.pool).await?;
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

/// Whether a live replica (heartbeat within `live_within`) has every
/// capability of `needs`: `replica` itself when given (the one that runs
/// the session), else any. Read on `conn` (under the caller's row lock: the
/// embedded store's pool has one connection).
pub async fn replica_covers_on(
    conn: &mut PgConnection,
    replica: Option<Uuid>,
    needs: &[String],
    live_within: std::time::Duration,
) -> Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM replicas
             WHERE ($1::uuid IS NULL OR id = $1)
               AND heartbeat_at > now() - make_interval(secs => $3)
               AND capabilities @> $2) AS "covered!""#,
        replica,
        needs,
        live_within.as_secs_f64(),
    )
    .fetch_one(conn)
    .await?)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::capabilities::{Capabilities, Capability};

    const TTL: Duration = Duration::from_secs(15);

    async fn session(pool: &sqlx::PgPool, status: &str, limits: &str, executor: &str) -> Uuid {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO sessions (id, goal, mode, status, limits, executor, queued_at, lease_expires_at)
             VALUES ($1, 'goal', 'fixed', $2, $3::jsonb, $4::jsonb,
                     CASE WHEN $2 = 'queued' THEN now() END,
                     CASE WHEN $2 = 'running' THEN now() - interval '1 second' END)",
        )
        .bind(id)
        .bind(status)
        .bind(limits)
        .bind(executor)
        .execute(pool)
        .await
        .unwrap();
        id
    }

    async fn replica(store: &Store, capabilities: &Capabilities) -> Uuid {
        let id = Uuid::new_v4();
        store
            .announce_replica(id, &capabilities.names(), "test", 27)
            .await
            .unwrap();
        id
    }

    const REVIEWED: &str = r#"{"review_every": 5}"#;
    const DELEGATES: &str = r#"{"kind": "scripted", "steps": [{"action": "a", "output": "o", "delegate": [{"goal": "g"}]}]}"#;
    const WEBHOOK: &str = r#"{"kind": "webhook", "url": "http://x/step"}"#;

    /// A replica without a capability never claims, from the queue or as
    /// a rescue, a session that needs it; one that has it does, and the
    /// session waited meanwhile instead of failing.
    #[tokio::test]
    async fn a_replica_claims_only_the_sessions_whose_needs_it_covers() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        let lacking = replica(
            &store,
            &Capabilities::without(&[Capability::ReviewEvery, Capability::Delegate]),
        )
        .await;
        let full = replica(&store, &Capabilities::default()).await;
        let queued = session(&db.pool, "queued", REVIEWED, WEBHOOK).await;
        let orphan = session(&db.pool, "running", "{}", DELEGATES).await;

        assert!(
            store
                .claim_queued(lacking, TTL, 10, 100)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .claim_orphans(lacking, TTL, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let (status, owner): (String, Option<Uuid>) =
            sqlx::query_as("SELECT status::text, owner FROM sessions WHERE id = $1")
                .bind(queued)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!((status.as_str(), owner), ("queued", None));

        let claimed = store.claim_queued(full, TTL, 10, 100).await.unwrap();
        assert_eq!(
            claimed.iter().map(|l| l.session_id).collect::<Vec<_>>(),
            [queued]
        );
        let rescued = store.claim_orphans(full, TTL, 10).await.unwrap();
        assert_eq!(
            rescued
                .iter()
                .map(|c| c.lease.session_id)
                .collect::<Vec<_>>(),
            [orphan]
        );
    }

    /// A release from before migration 0027 knows nothing of needs: its
    /// heartbeat leaves `capabilities` empty and its claim does not filter.
    /// The database's trigger skips the rows it cannot run, so its claim
    /// returns them not, and takes the others as before.
    #[tokio::test]
    async fn an_older_release_claim_skips_what_it_cannot_run() {
        let db = crate::store::testing::TestDb::new().await;
        let old = Uuid::new_v4();
        // The previous release's heartbeat and rescue, as it sends them.
        sqlx::query("INSERT INTO replicas (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()")
            .bind(old)
            .execute(&db.pool)
            .await
            .unwrap();
        let needing = session(&db.pool, "running", REVIEWED, WEBHOOK).await;
        let plain = session(&db.pool, "running", "{}", WEBHOOK).await;
        let taken: Vec<Uuid> = sqlx::query_scalar(
            "WITH orphans AS (
                 SELECT id FROM sessions
                 WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
                 ORDER BY lease_expires_at NULLS FIRST LIMIT 10 FOR UPDATE SKIP LOCKED)
             UPDATE sessions s SET owner = $1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + interval '15 seconds', heartbeat_at = now()
             FROM orphans o WHERE s.id = o.id RETURNING s.id",
        )
        .bind(old)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(taken, [plain]);
        let owner: Option<Uuid> = sqlx::query_scalar("SELECT owner FROM sessions WHERE id = $1")
            .bind(needing)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(owner, None);
    }

    /// The fleet covers a session's needs when a live replica other than
    /// the asking one has them all.
    #[tokio::test]
    async fn the_fleet_covers_what_a_live_peer_has() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        let me = replica(&store, &Capabilities::without(&[Capability::ReviewEvery])).await;
        let needs = ["review_every".to_string()];
        assert!(!store.fleet_covers(me, &needs, TTL).await.unwrap());
        let peer = replica(&store, &Capabilities::default()).await;
        assert!(store.fleet_covers(me, &needs, TTL).await.unwrap());
        store.leave_fleet(peer).await.unwrap();
        assert!(!store.fleet_covers(me, &needs, TTL).await.unwrap());
    }
}
