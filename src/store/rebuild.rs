//! The inputs a session's state is rebuilt from: its last checkpoint and
//! the iterations and reflections after it, read on a connection the caller
//! may already hold (a request handler holds at most one pooled connection
//! at a time, so this never reaches for the pool under a row lock).

use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::rows::{CheckpointRecord, IterationRecord, RebuildInputs, ReflectionRecord};
use super::{Result, Store, StoreError};
use crate::policy::history::StepRecord;
use crate::policy::loop_state::{AppliedReflection, LoopState, StepEffects};
use crate::policy::pricing::StepUsage;
use crate::policy::reflection::Assessment;

/// Reads the rebuild inputs of `session_id` on `conn` (inside the caller's
/// transaction, so under its row lock). The one reader of these inputs:
/// [`Store::rebuild_inputs`] runs it on a pooled connection.
pub async fn rebuild_inputs_on(conn: &mut PgConnection, session_id: Uuid) -> Result<RebuildInputs> {
    let checkpoint = sqlx::query_as!(
        CheckpointRecord,
        r#"SELECT id, iteration, reason, state AS "state: Json<LoopState>", created_at FROM checkpoints
         WHERE session_id = $1 ORDER BY id DESC LIMIT 1"#,
        session_id,
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| undecodable(session_id, "its latest checkpoint", e))?;
    let after = checkpoint.as_ref().map_or(0, |c| c.iteration);
    let iterations = sqlx::query_as!(
        IterationRecord,
        r#"SELECT number, run, action, outcome, tokens, duration_ms,
                    record AS "record: Json<StepRecord>", effects AS "effects: Json<StepEffects>",
                    started_at, finished_at, usage AS "usage: Json<StepUsage>", cost_usd,
                    price_pattern, price_valid_from
         FROM iterations WHERE session_id = $1 AND number > $2 ORDER BY number"#,
        session_id,
        after,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| undecodable(session_id, "an iteration", e))?;
    let reflections = sqlx::query_as!(
        ReflectionRecord,
        r#"SELECT number, after_iteration, trigger, ok, assessment AS "assessment: Json<Assessment>", error,
                    decision AS "decision: Json<AppliedReflection>", next_interval, tokens, raw, created_at
         FROM reflections WHERE session_id = $1 AND after_iteration >= $2 ORDER BY number"#,
        session_id,
        after,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| undecodable(session_id, "a reflection", e))?;
    let tokens_charged = sqlx::query_scalar!(
        "SELECT tokens_charged FROM sessions WHERE id = $1",
        session_id,
    )
    .fetch_optional(&mut *conn)
    .await?
    .unwrap_or(0);
    Ok(RebuildInputs {
        checkpoint,
        iterations,
        reflections,
        tokens_charged: u64::try_from(tokens_charged).unwrap_or(0),
    })
}

/// A stored row whose JSON no longer reads as its type makes the session
/// unrebuildable: said as such, naming the session and what failed to read.
fn undecodable(id: Uuid, what: &str, error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::ColumnDecode { index, source } => StoreError::Corrupt {
            id,
            detail: format!("{what} (column {index}): {source}"),
        },
        other => other.into(),
    }
}

impl Store {
    /// Reads the rebuild inputs of `session_id` on a pooled connection.
    pub async fn rebuild_inputs(&self, session_id: Uuid) -> Result<RebuildInputs> {
        let mut conn = self.pool.acquire().await?;
        rebuild_inputs_on(&mut conn, session_id).await
    }
}
