//! A session's run under a replica, in one place as River and Oban keep a
//! job's: the lease (claimed, renewed by a heartbeat, claimed by any live
//! replica once expired, given up), the attempts a rescue counts, the error
//! a loop stopped on, and the `failed` end when attempts run out.

use sqlx::types::Json;
use uuid::Uuid;

use super::event_log;
use super::rows::{Attempt, Claimed, Lease, NewEvent, Renewed};
use super::{Result, Store};
use crate::event::SessionEvent;
use crate::policy::lifecycle::{Reason, Status};
use crate::policy::termination::Termination;

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
            // renewal and a group commit never wait on each other in a cycle;
            // `NO KEY UPDATE`, the lock the UPDATE takes itself, so a renewal
            // never waits for a transaction whose insert names a session (a
            // workspace snapshot's foreign key holds `KEY SHARE` on its row,
            // which `FOR UPDATE` would wait for while holding the rows it
            // locked already).
            r#"WITH locked AS (
                 SELECT s.id FROM sessions s JOIN UNNEST($1::uuid[], $2::uuid[]) AS t(id, token)
                     ON s.id = t.id AND s.lease_token = t.token
                 WHERE s.status IS NOT DISTINCT FROM $4 ORDER BY s.id FOR NO KEY UPDATE OF s)
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

    /// Takes over running sessions whose lease has expired (or was released)
    /// and whose needs this replica covers (its row in `replicas` says).
    /// `SKIP LOCKED` lets several replicas rescue concurrently without
    /// claiming the same session twice.
    pub async fn claim_orphans(
        &self,
        owner: Uuid,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        // `status = 'running'` stays a literal: the running rows are found
        // by `sessions_by_status` and their leases checked on the rows (no
        // index holds `lease_expires_at`, so renewals stay HOT: 0042).
        let rows = sqlx::query!(
            r#"WITH orphans AS (
                 SELECT id, owner AS previous_owner FROM sessions
                 WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
                   -- Only what this replica can run (migration 0027).
                   AND needs <@ coalesce((SELECT r.capabilities FROM replicas r WHERE r.id = $1), '{}')
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
            event_log::append(
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

impl Store {
    /// Counts a rescue of `lease`'s session as a failed attempt of the run
    /// before it: one more while run and iteration count are where the
    /// previous attempt left them, else the count starts over at 1. `None`
    /// when the lease is no longer held.
    pub async fn count_attempt(&self, lease: &Lease) -> Result<Option<Attempt>> {
        Ok(sqlx::query_as!(
            Attempt,
            "UPDATE sessions SET
                    attempts = CASE WHEN attempt_run = run AND attempt_iteration = iterations
                                    THEN attempts + 1 ELSE 1 END,
                    attempt_run = run, attempt_iteration = iterations
             WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $3
             RETURNING attempts, last_error",
            lease.session_id,
            lease.token,
            Status::Running as Status,
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Records the error a session's loop stopped on (best effort: the
    /// database may be the thing that failed). Fenced by the lease.
    pub async fn record_error(&self, lease: &Lease, error: &str) -> Result<()> {
        sqlx::query!(
            "UPDATE sessions SET last_error = $3
             WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $4",
            lease.session_id,
            lease.token,
            storable_text(error),
            Status::Running as Status,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Ends a session this replica holds the lease of but cannot run (it
    /// failed too many attempts): `failed`, with the error in its
    /// termination record, without a checkpoint (its state may be what
    /// cannot be read). Returns false when the lease was no longer held.
    pub async fn fail_session(
        &self,
        lease: &Lease,
        termination: &Termination,
        error: &str,
        events: &[NewEvent],
    ) -> Result<bool> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let done = sqlx::query!(
            "UPDATE sessions SET status = $3, reason = $4, summary = $5, next_steps = $6,
                    reason_detail = $7, last_error = $7, checkpoint_saved = false,
                    stop_requested = false, pause_requested = false,
                    owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    ended_at = now(), updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $8",
            lease.session_id,
            lease.token,
            termination.status as Status,
            termination.reason as Reason,
            termination.summary.as_str(),
            Json(&termination.next_steps) as _,
            storable_text(error),
            Status::Running as Status,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if done {
            event_log::append(&mut tx, lease.session_id, events).await?;
        }
        tx.commit().await?;
        if done {
            self.announce(lease.session_id);
        }
        Ok(done)
    }

    /// Gives up a lease whose runner has ended, so the session is rescued
    /// at once rather than a TTL later (a heartbeat may have renewed it
    /// while the runner was exiting).
    pub async fn expire_lease(&self, lease: &Lease) -> Result<()> {
        sqlx::query!(
            "UPDATE sessions SET lease_expires_at = now()
             WHERE id = $1 AND lease_token = $2 AND status IS NOT DISTINCT FROM $3",
            lease.session_id,
            lease.token,
            Status::Running as Status,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// `text` with NUL characters (which Postgres cannot store) replaced.
pub fn storable_text(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storable_text_replaces_nul() {
        assert_eq!(storable_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(storable_text("plain"), "plain");
    }
}
