//! The tool-call journal: intent before a side effect, result after, fenced
//! by the lease so a replica that lost the session records nothing.

use serde_json::Value;

use super::rows::Lease;
use super::{Result, Store, StoreError};

impl Store {
    /// A finished result of call `index` of `iteration`, if the same tool ran with the same arguments.
    pub async fn journaled_result(
        &self,
        lease: &Lease,
        iteration: i64,
        index: i32,
        tool: &str,
        arguments: &Value,
    ) -> Result<Option<Value>> {
        let row: Option<Option<Value>> = sqlx::query_scalar!(
            "SELECT result FROM tool_calls
             WHERE session_id = $1 AND iteration = $2 AND call_index = $3
               AND tool = $4 AND arguments = $5 AND status = 'finished'",
            lease.session_id,
            iteration,
            index,
            tool,
            arguments,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.flatten())
    }

    /// Journals a call's intent (replacing an unfinished or different earlier attempt).
    pub async fn journal_intent(
        &self,
        lease: &Lease,
        iteration: i64,
        index: i32,
        tool: &str,
        arguments: &Value,
    ) -> Result<()> {
        let written = sqlx::query!(
            "INSERT INTO tool_calls (session_id, iteration, call_index, tool, arguments, status)
             SELECT $1, $2, $3, $4, $5, 'started'
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND lease_token = $6)
             ON CONFLICT (session_id, iteration, call_index) DO UPDATE
                 SET tool = EXCLUDED.tool, arguments = EXCLUDED.arguments, status = 'started',
                     result = NULL, started_at = now(), finished_at = NULL",
            lease.session_id,
            iteration,
            index,
            tool,
            arguments,
            lease.token,
        )
        .execute(&self.pool)
        .await?;
        if written.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.session_id));
        }
        Ok(())
    }

    /// Journals a call's result.
    pub async fn journal_result(
        &self,
        lease: &Lease,
        iteration: i64,
        index: i32,
        result: &Value,
    ) -> Result<()> {
        sqlx::query!(
            "UPDATE tool_calls SET status = 'finished', result = $4, finished_at = now()
             WHERE session_id = $1 AND iteration = $2 AND call_index = $3
               AND EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND lease_token = $5)",
            lease.session_id,
            iteration,
            index,
            result,
            lease.token,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
