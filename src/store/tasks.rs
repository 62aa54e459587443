//! The agent's task queue: a list it keeps across context cycles and
//! restarts, written through its tools and readable through the API.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::leases::Lease;
use super::{Result, Store, StoreError};

/// One task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, ToSchema)]
pub struct Task {
    /// Id within the session, from 1.
    pub id: i32,
    /// What to do.
    pub title: String,
    /// `pending`, `in_progress`, `done` or `blocked`.
    pub status: String,
    /// Notes.
    pub notes: String,
    /// Higher first.
    pub priority: i32,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A change to the queue: a new task (no id) or an update of given fields.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskWrite {
    /// Task to update; absent for a new task.
    #[serde(default)]
    pub id: Option<i32>,
    /// Title (required for a new task).
    #[serde(default)]
    pub title: Option<String>,
    /// New status.
    #[serde(default)]
    pub status: Option<String>,
    /// New notes.
    #[serde(default)]
    pub notes: Option<String>,
    /// New priority.
    #[serde(default)]
    pub priority: Option<i32>,
}

/// Statuses a task may have.
pub const TASK_STATUSES: [&str; 4] = ["pending", "in_progress", "done", "blocked"];

impl Store {
    /// The task queue of a session, highest priority first.
    pub async fn tasks(&self, session_id: Uuid) -> Result<Vec<Task>> {
        Ok(sqlx::query_as::<_, Task>(
            "SELECT id, title, status, notes, priority, updated_at FROM tasks
             WHERE session_id = $1 ORDER BY priority DESC, id",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Applies writes to the queue under the session's lease; returns the
    /// queue after them, or a message for the agent when a write is invalid.
    pub async fn write_tasks(
        &self,
        lease: &Lease,
        writes: &[TaskWrite],
    ) -> Result<std::result::Result<Vec<Task>, String>> {
        let mut tx = self.pool.begin().await?;
        let held: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM sessions WHERE id = $1 AND lease_token = $2 FOR UPDATE",
        )
        .bind(lease.session_id)
        .bind(lease.token)
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
                    let updated = sqlx::query(
                        "UPDATE tasks SET title = COALESCE($3, title), status = COALESCE($4, status),
                                notes = COALESCE($5, notes), priority = COALESCE($6, priority), updated_at = now()
                         WHERE session_id = $1 AND id = $2",
                    )
                    .bind(lease.session_id)
                    .bind(id)
                    .bind(&w.title)
                    .bind(&w.status)
                    .bind(&w.notes)
                    .bind(w.priority)
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
                    sqlx::query(
                        "INSERT INTO tasks (session_id, id, title, status, notes, priority)
                         SELECT $1, COALESCE(MAX(id), 0) + 1, $2, COALESCE($3, 'pending'), COALESCE($4, ''), COALESCE($5, 0)
                         FROM tasks WHERE session_id = $1",
                    )
                    .bind(lease.session_id)
                    .bind(title)
                    .bind(&w.status)
                    .bind(&w.notes)
                    .bind(w.priority)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(Ok(self.tasks(lease.session_id).await?))
    }
}
