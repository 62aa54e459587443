//! Replica leases: which process runs which session. A lease is renewed by
//! a heartbeat; a session whose lease expired is claimed by any live replica.

use sqlx::Row;
use uuid::Uuid;

use super::events::{self, NewEvent};
use super::{Result, Store};

/// Proof that this replica runs a session; every loop write is fenced by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Session.
    pub session_id: Uuid,
    /// Token of this acquisition; changes whenever another replica takes over.
    pub token: Uuid,
}

/// A lease that was renewed, with the durable control flags read in passing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// Session.
    pub session_id: Uuid,
    /// The token renewed (a replica may hold a stale one of the same session).
    pub token: Uuid,
    /// A stop was requested.
    pub stop_requested: bool,
    /// A pause was requested.
    pub pause_requested: bool,
}

/// An orphaned session this replica just took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// The new lease.
    pub lease: Lease,
    /// A stop had been requested: end it instead of running it.
    pub stop_requested: bool,
    /// The replica that held it before, if any.
    pub previous_owner: Option<Uuid>,
}

impl Store {
    /// Renews the leases this replica holds; those not returned are lost.
    pub async fn renew_leases(
        &self,
        leases: &[Lease],
        ttl: std::time::Duration,
    ) -> Result<Vec<Renewed>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = leases.iter().map(|l| l.session_id).collect();
        let tokens: Vec<Uuid> = leases.iter().map(|l| l.token).collect();
        let rows = sqlx::query(
            // Rows are locked in id order, as group commits lock them, so a
            // renewal and a group commit never wait on each other in a cycle.
            "WITH locked AS (
                 SELECT s.id FROM sessions s JOIN UNNEST($1::uuid[], $2::uuid[]) AS t(id, token)
                     ON s.id = t.id AND s.lease_token = t.token
                 WHERE s.status = 'running' ORDER BY s.id FOR UPDATE OF s)
             UPDATE sessions s SET lease_expires_at = now() + make_interval(secs => $3), heartbeat_at = now()
             FROM locked l, UNNEST($1::uuid[], $2::uuid[]) AS t(id, token)
             WHERE s.id = l.id AND s.id = t.id AND s.lease_token = t.token AND s.status = 'running'
             RETURNING s.id, s.stop_requested, s.pause_requested, s.lease_token",
        )
        .bind(&ids)
        .bind(&tokens)
        .bind(ttl.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(Renewed {
                    session_id: r.try_get(0)?,
                    stop_requested: r.try_get(1)?,
                    pause_requested: r.try_get(2)?,
                    token: r.try_get(3)?,
                })
            })
            .collect()
    }

    /// Takes over running sessions whose lease has expired (or was released).
    /// `SKIP LOCKED` lets several replicas rescue concurrently without
    /// claiming the same session twice.
    pub async fn claim_orphans(
        &self,
        owner: Uuid,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "WITH orphans AS (
                 SELECT id, owner AS previous_owner FROM sessions
                 WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
                 ORDER BY lease_expires_at NULLS FIRST LIMIT $3 FOR UPDATE SKIP LOCKED)
             UPDATE sessions s SET owner = $1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + make_interval(secs => $2), heartbeat_at = now()
             FROM orphans o WHERE s.id = o.id
             RETURNING s.id, s.lease_token, s.stop_requested, o.previous_owner",
        )
        .bind(owner)
        .bind(ttl.as_secs_f64())
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in rows {
            let c = Claimed {
                lease: Lease {
                    session_id: r.try_get(0)?,
                    token: r.try_get(1)?,
                },
                stop_requested: r.try_get(2)?,
                previous_owner: r.try_get(3)?,
            };
            events::append(
                &mut tx,
                c.lease.session_id,
                &[NewEvent::new(
                    "lease_acquired",
                    serde_json::json!({ "owner": owner, "previous_owner": c.previous_owner }),
                )],
            )
            .await?;
            claimed.push(c);
        }
        tx.commit().await?;
        Ok(claimed)
    }
}
