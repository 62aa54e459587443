//! The agent's task queue: a list it keeps across context cycles and
//! restarts, written through its tools and readable through the API.

use uuid::Uuid;

use super::rows::{AgentTask, AgentTaskWrite, Lease, TASK_STATUSES};
use super::{Result, Store, StoreError, TenantScope};

impl Store {
    /// The task queue of a session, highest priority first.
    pub async fn tasks(&self, session_id: Uuid, scope: &TenantScope) -> Result<Vec<AgentTask>> {
        Ok(sqlx::query_as!(
            AgentTask,
            "SELECT id, title, status, notes, priority, updated_at FROM tasks
             WHERE session_id = $1
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2))
             ORDER BY priority DESC, id",
            session_id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Applies writes to the queue under the session's lease; returns the
    /// queue after them, or a message for the agent when a write is invalid.
    pub async fn write_tasks(
        &self,
        lease: &Lease,
        writes: &[AgentTaskWrite],
    ) -> Result<std::result::Result<Vec<AgentTask>, String>> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let held: Option<i32> = sqlx::query_scalar!(
            r#"SELECT 1 AS "held!" FROM sessions WHERE id = $1 AND lease_token = $2 FOR UPDATE"#,
            lease.session_id,
            lease.token,
        )
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            return Err(StoreError::LeaseLost(lease.session_id));
        }
        for (i, w) in writes.iter().enumerate() {
            if let Some(status) = &w.status
                && !TASK_STATUSES.contains(&status.as_str())
            {
                return Ok(Err(format!(
                    "tasks[{i}].status must be one of {}",
                    TASK_STATUSES.join(", ")
                )));
            }
            match w.id {
                Some(id) => {
                    let updated = sqlx::query!(
"UPDATE tasks SET title = COALESCE($3, title), status = COALESCE($4, status),
                                notes = COALESCE($5, notes), priority = COALESCE($6, priority), updated_at = now()
                         WHERE session_id = $1 AND id = $2",
lease.session_id,
id,
w.title.as_deref(),
w.status.as_deref(),
w.notes.as_deref(),
w.priority,
)
                    .execute(&mut *tx)
                    .await?;
                    if updated.rows_affected() == 0 {
                        return Ok(Err(format!("tasks[{i}]: there is no task {id}")));
                    }
                }
                None => {
                    let Some(title) = w.title.as_deref().map(str::trim).filter(|t| !t.is_empty())
                    else {
                        return Ok(Err(format!("tasks[{i}]: a new task needs a title")));
                    };
                    sqlx::query!(
"INSERT INTO tasks (session_id, id, title, status, notes, priority)
                         SELECT $1, COALESCE(MAX(id), 0) + 1, $2, COALESCE($3, 'pending'), COALESCE($4, ''), COALESCE($5, 0)
                         FROM tasks WHERE session_id = $1",
lease.session_id,
title,
w.status.as_deref(),
w.notes.as_deref(),
w.priority,
)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        // The lease was just proven: the session is this replica's to read.
        Ok(Ok(self
            .tasks(lease.session_id, &TenantScope::Global)
            .await?))
    }
}
