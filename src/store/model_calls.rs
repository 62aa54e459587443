//! The fleet-wide token buckets behind the per-tenant model-call limit:
//! each replica takes from the same row, so N replicas allow the limit
//! once, not N times.

use std::time::Duration;

use super::{Result, Store};

impl Store {
    /// Takes one model call from `tenant`'s bucket of `per_minute` calls
    /// (refilled continuously, at most `per_minute` in a burst): `None`
    /// when admitted, else how long until the next call would be.
    pub async fn take_model_call(&self, tenant: &str, per_minute: u32) -> Result<Option<Duration>> {
        let capacity = f64::from(per_minute.max(1));
        // One statement: refill by the elapsed time on the database's clock,
        // debit one call when a whole one is there, say whether it was.
        let taken = sqlx::query!(
            r#"INSERT INTO model_call_buckets AS b (tenant, tokens, refilled_at, admitted)
               VALUES ($1, $2::float8 - 1, now(), true)
               ON CONFLICT (tenant) DO UPDATE SET
                   tokens = LEAST($2::float8, b.tokens
                                 + EXTRACT(EPOCH FROM now() - b.refilled_at)::float8 * $2::float8 / 60.0)
                            - CASE WHEN LEAST($2::float8, b.tokens
                                 + EXTRACT(EPOCH FROM now() - b.refilled_at)::float8 * $2::float8 / 60.0) >= 1
                              THEN 1 ELSE 0 END,
                   admitted = LEAST($2::float8, b.tokens
                                 + EXTRACT(EPOCH FROM now() - b.refilled_at)::float8 * $2::float8 / 60.0) >= 1,
                   refilled_at = GREATEST(b.refilled_at, now())
               RETURNING tokens AS "tokens!", admitted AS "admitted!""#,
            tenant,
            capacity,
        )
        .fetch_one(self.pool())
        .await?;
        if taken.admitted {
            return Ok(None);
        }
        Ok(Some(crate::ratelimit::wait_for_one(
            taken.tokens,
            per_minute,
        )))
    }
}

impl crate::ratelimit::SharedBuckets for Store {
    fn take<'a>(&'a self, tenant: &'a str, per_minute: u32) -> crate::ratelimit::Taken<'a> {
        Box::pin(async move {
            self.take_model_call(tenant, per_minute)
                .await
                .map_err(|err| err.to_string())
        })
    }
}
