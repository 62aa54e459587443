//! The fleet's queue: sessions ready to run that no replica had room for
//! wait as `queued`; any replica with capacity claims the oldest of them,
//! as River and Oban workers claim jobs (one statement, `FOR UPDATE SKIP
//! LOCKED`, so replicas claiming at once never take the same session).

use sqlx::PgConnection;
use uuid::Uuid;

use super::event_log;
use super::rows::{Lease, NewEvent};
use super::{Result, Store};
use crate::event::SessionEvent;
use crate::policy::lifecycle::Status;

/// Whether any session waits in the queue, read on the caller's connection
/// (a newcomer must not overtake it).
pub async fn queue_waiting(conn: &mut PgConnection) -> Result<bool> {
    // `status = 'queued'` stays a literal: the predicate of `sessions_queue`.
    Ok(sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM sessions WHERE status = 'queued') AS "waiting!""#
    )
    .fetch_one(conn)
    .await?)
}

impl Store {
    /// Claims up to `limit` queued sessions for `owner`, oldest in the queue
    /// first: each becomes `running` under a fresh lease, with its status
    /// change in its log. Sessions another replica is claiming (or a user
    /// is stopping) at this moment are skipped, not waited for.
    pub async fn claim_queued(
        &self,
        owner: Uuid,
        ttl: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<Lease>> {
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query!(
            r#"WITH waiting AS (
                 SELECT id, queued_at FROM sessions WHERE status = 'queued'
                 ORDER BY queued_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
             UPDATE sessions s SET status = $4, owner = $1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + make_interval(secs => $2), heartbeat_at = now(),
                    queued_at = NULL, updated_at = now()
             FROM waiting w WHERE s.id = w.id
             RETURNING s.id, s.lease_token AS "lease_token!", w.queued_at AS "queued_at!""#,
            owner,
            ttl.as_secs_f64(),
            limit,
            Status::Running as Status,
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut rows: Vec<_> = rows.into_iter().collect();
        // RETURNING has no order: start them oldest first.
        rows.sort_by_key(|r| (r.queued_at, r.id));
        let started =
            NewEvent::from_event(&SessionEvent::status(Some(Status::Queued), Status::Running))?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in rows {
            event_log::append(&mut tx, r.id, std::slice::from_ref(&started)).await?;
            claimed.push(Lease {
                session_id: r.id,
                token: r.lease_token,
            });
        }
        tx.commit().await?;
        for lease in &claimed {
            self.announce(lease.session_id);
        }
        Ok(claimed)
    }
}
