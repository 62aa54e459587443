//! The API's own pool and the database's availability: how a request
//! waits for a connection, how a probe asks, which errors mean "down".

use sqlx::{PgPool, Postgres, Transaction};

use super::{Result, Store};

/// Begins a transaction on `pool` that a cancelled caller cannot leak.
/// sqlx (0.9) sends `BEGIN` and counts the transaction only once the answer
/// arrives: a future dropped in between (a request that timed out, a
/// worker that hung up on its waiting heartbeat) returned its connection to
/// the pool inside a transaction nobody would end, and every later
/// statement on that connection joined it, uncommitted. Seen: a worker's
/// completion never committed, its session stuck behind the locks. The
/// begin runs in a task of its own, which always finishes it; when no one
/// waits any more the transaction is dropped there, and its rollback is
/// queued ahead of the connection's next statement.
pub async fn begin_detached(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => Ok(begun?),
        // The task panicked or the runtime is going away.
        Err(_) => Err(sqlx::Error::WorkerCrashed.into()),
    }
}

impl Store {
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
}
