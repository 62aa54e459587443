//! Checkpoint rows, written by the loop (`iterations.rs`) and by the API
//! when it ends a session no loop runs (`sessions.rs`).

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::Result;

/// Inserts a checkpoint of `session_id` covering iterations up to `iteration`.
pub(super) async fn insert_checkpoint(
    conn: &mut PgConnection,
    session_id: Uuid,
    iteration: i64,
    reason: &str,
    state: &Value,
) -> Result<()> {
    sqlx::query!(
        "INSERT INTO checkpoints (session_id, iteration, reason, state)
         VALUES ($1, $2, $3, $4::text::json)",
        session_id,
        iteration,
        reason,
        state.to_string(),
    )
    .execute(conn)
    .await?;
    Ok(())
}
