//! Replica leases: which process runs which session. A lease is renewed by
//! a heartbeat; a session whose lease expired is claimed by any live replica.

use uuid::Uuid;

use super::events;
use super::rows::{Claimed, Lease, NewEvent, Renewed};
use super::{Result, Store};
use crate::event::SessionEvent;
use crate::policy::lifecycle::Status;

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
        let rows = sqlx::query!(
// Rows are locked in id order, as group commits lock them, so a
            // renewal and a group commit never wait on each other in a cycle.
            r#"WITH locked AS (
                 SELECT s.id FROM sessions s JOIN UNNEST($1::uuid[], $2::uuid[]) AS t(id, token)
                     ON s.id = t.id AND s.lease_token = t.token
                 WHERE s.status IS NOT DISTINCT FROM $4 ORDER BY s.id FOR UPDATE OF s)
             UPDATE sessions s SET lease_expires_at = now() + make_interval(secs => $3), heartbeat_at = now()
             FROM locked l, UNNEST($1::uuid[], $2::uuid[]) AS t(id, token)
             WHERE s.id = l.id AND s.id = t.id AND s.lease_token = t.token
               AND s.status IS NOT DISTINCT FROM $4
             RETURNING s.id, s.stop_requested, s.pause_requested, s.lease_token AS "lease_token!",
                       s.lease_expires_at AS "lease_expires_at!", s.heartbeat_at AS "heartbeat_at!""#,
&ids,
&tokens,
ttl.as_secs_f64(),
Status::Running as Status,
)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Renewed {
                session_id: r.id,
                token: r.lease_token,
                stop_requested: r.stop_requested,
                pause_requested: r.pause_requested,
                lease_expires_at: r.lease_expires_at,
                heartbeat_at: r.heartbeat_at,
            })
            .collect())
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
        // `status = 'running'` stays a literal: it is the predicate of the
        // partial index `sessions_running_leases` this scan relies on.
        let rows = sqlx::query!(
            r#"WITH orphans AS (
                 SELECT id, owner AS previous_owner FROM sessions
                 WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
                 ORDER BY lease_expires_at NULLS FIRST LIMIT $3 FOR UPDATE SKIP LOCKED)
             UPDATE sessions s SET owner = $1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + make_interval(secs => $2), heartbeat_at = now()
             FROM orphans o WHERE s.id = o.id
             RETURNING s.id, s.lease_token AS "lease_token!", s.stop_requested, o.previous_owner"#,
            owner,
            ttl.as_secs_f64(),
            limit,
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in rows {
            let c = Claimed {
                lease: Lease {
                    session_id: r.id,
                    token: r.lease_token,
                },
                stop_requested: r.stop_requested,
                previous_owner: r.previous_owner,
            };
            events::append(
                &mut tx,
                c.lease.session_id,
                &[NewEvent::from_event(&SessionEvent::LeaseAcquired {
                    owner,
                    previous_owner: c.previous_owner,
                })?],
            )
            .await?;
            claimed.push(c);
        }
        tx.commit().await?;
        Ok(claimed)
    }
}
