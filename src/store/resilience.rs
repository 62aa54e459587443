//! Control-path reads and writes that run on a connection the caller already
//! holds (a request handler holds at most one pooled connection at a time,
//! so nothing here may reach for the pool while a row lock is held), and the
//! failure model's bookkeeping: attempts, `last_error`, the `failed` end.

use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::events;
use super::rows::{
    Attempt, CheckpointRecord, IterationRecord, Lease, NewEvent, RebuildInputs, ReflectionRecord,
};
use super::{Result, Store};
use crate::policy::lifecycle::{Reason, Status};
use crate::policy::termination::Termination;

/// Reads the rebuild inputs of `session_id` on `conn` (inside the caller's
/// transaction, so under its row lock). The one reader of these inputs:
/// [`Store::rebuild_inputs`] runs it on a pooled connection.
pub async fn rebuild_inputs_on(conn: &mut PgConnection, session_id: Uuid) -> Result<RebuildInputs> {
    let checkpoint = sqlx::query_as!(
        CheckpointRecord,
        "SELECT id, iteration, reason, state, created_at FROM checkpoints
         WHERE session_id = $1 ORDER BY id DESC LIMIT 1",
        session_id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let after = checkpoint.as_ref().map_or(0, |c| c.iteration);
    let iterations = sqlx::query_as!(
        IterationRecord,
        "SELECT number, run, action, outcome, tokens, duration_ms, record, effects, started_at, finished_at
         FROM iterations WHERE session_id = $1 AND number > $2 ORDER BY number",
        session_id,
        after,
    )
    .fetch_all(&mut *conn)
    .await?;
    let reflections = sqlx::query_as!(
        ReflectionRecord,
        "SELECT number, after_iteration, trigger, ok, assessment, error, decision, next_interval, tokens, raw, created_at
         FROM reflections WHERE session_id = $1 AND after_iteration > $2 ORDER BY number",
        session_id,
        after,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(RebuildInputs {
        checkpoint,
        iterations,
        reflections,
    })
}

impl Store {
    /// Reads the rebuild inputs of `session_id` on a pooled connection.
    pub async fn rebuild_inputs(&self, session_id: Uuid) -> Result<RebuildInputs> {
        let mut conn = self.pool.acquire().await?;
        rebuild_inputs_on(&mut conn, session_id).await
    }

    /// Connects the API's pool to `url`: like [`Store::connect`], but a
    /// request gives up waiting for a connection after `acquire_timeout`
    /// (and answers 503) instead of holding its client for 10 s.
    pub async fn connect_api(
        url: &str,
        max_connections: u32,
        acquire_timeout: std::time::Duration,
    ) -> Result<Store> {
        let pool = Store::pool_options(max_connections)
            .acquire_timeout(acquire_timeout)
            .connect(url)
            .await?;
        Ok(Store::from_pool(pool))
    }

    /// Answers when Postgres answers within `timeout` (readiness probes
    /// must answer quickly, also while the database is down).
    pub async fn ping_within(&self, timeout: std::time::Duration) -> Result<()> {
        match tokio::time::timeout(timeout, self.ping()).await {
            Ok(answer) => answer,
            Err(_) => Err(sqlx::Error::PoolTimedOut.into()),
        }
    }

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
        let mut tx = self.pool.begin().await?;
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
            events::append(&mut tx, lease.session_id, events).await?;
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

/// Whether `err` means the database cannot be reached or is going away
/// (connection-level failures, shutdown, too many connections) rather than
/// a fault of the query: such errors answer 503 and are retried.
pub fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // Class 08: connection exception; 57P01-03: admin/crash
            // shutdown, cannot connect now; 53300: too many connections.
            code.starts_with("08") || ["57P01", "57P02", "57P03", "53300"].contains(&&*code)
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable_query_faults_are_not() {
        assert!(is_unavailable(&sqlx::Error::PoolTimedOut));
        assert!(is_unavailable(&sqlx::Error::PoolClosed));
        assert!(is_unavailable(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(!is_unavailable(&sqlx::Error::RowNotFound));
        assert!(!is_unavailable(&sqlx::Error::ColumnNotFound("x".into())));
    }

    #[test]
    fn storable_text_replaces_nul() {
        assert_eq!(storable_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(storable_text("plain"), "plain");
    }
}
