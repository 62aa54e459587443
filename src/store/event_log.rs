//! The append-only event log, numbered per session.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::event::SessionEvent;
use crate::policy::lifecycle::Status;

use super::rows::{EventRecord, JsonText, NewEvent};
use super::{Result, Store, StoreError, TenantScope};

/// Inserts `events` numbered after `last_seq`, which the caller has already
/// reserved by advancing `sessions.last_event_seq` in the same transaction.
pub(super) async fn insert_numbered(
    conn: &mut PgConnection,
    session_id: Uuid,
    last_seq: i64,
    events: &[NewEvent],
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let first = last_seq - events.len() as i64 + 1;
    let seqs: Vec<i64> = (first..=last_seq).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
    // Text into the `json` column: validated, not parsed into `jsonb`.
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    sqlx::query!(
        "INSERT INTO events (session_id, seq, kind, data)
         SELECT $1, s, k, d::json FROM UNNEST($2::bigint[], $3::text[], $4::text[]) AS t(s, k, d)",
        session_id,
        &seqs,
        &kinds as &[&str],
        &data as &[&str],
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Appends events to a session outside the loop (API actions), reserving
/// their sequence numbers on the session row.
pub async fn append(conn: &mut PgConnection, session_id: Uuid, events: &[NewEvent]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let last = sqlx::query_scalar!(
        "UPDATE sessions SET last_event_seq = last_event_seq + $2 WHERE id = $1 RETURNING last_event_seq",
        session_id,
        events.len() as i64,
    )
    .fetch_one(&mut *conn)
    .await?;
    insert_numbered(conn, session_id, last, events).await
}

impl Store {
    /// Up to which sequence number compaction has thinned the log of
    /// session `id` (`None`: never), if `scope` reaches it.
    pub async fn compacted_through(&self, id: Uuid, scope: &TenantScope) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar!(
            "SELECT c.through_seq FROM event_compaction c JOIN sessions s ON s.id = c.session_id
             WHERE c.session_id = $1 AND ($2::text IS NULL OR s.tenant = $2)",
            id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Events of a session after `after_seq`, oldest first; only `kinds` when given.
    pub async fn events(
        &self,
        session_id: Uuid,
        after_seq: i64,
        limit: i64,
        kinds: Option<&[&str]>,
        scope: &TenantScope,
    ) -> Result<Vec<EventRecord>> {
        Ok(sqlx::query_as!(
            EventRecord,
            "SELECT seq, kind, data, created_at, actor FROM events
             WHERE session_id = $1 AND seq > $2 AND ($4::text[] IS NULL OR kind = ANY($4))
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
             ORDER BY seq LIMIT $3",
            session_id,
            after_seq,
            limit,
            kinds as Option<&[&str]>,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Decision events of a session after `after_seq`; gate evaluations that
    /// decided `continue` only when asked for. The kinds are literals so the
    /// planner can use the partial index of decision events.
    pub async fn decisions(
        &self,
        session_id: Uuid,
        after_seq: i64,
        limit: i64,
        include_continue: bool,
        scope: &TenantScope,
    ) -> Result<Vec<EventRecord>> {
        Ok(sqlx::query_as!(
            EventRecord,
            "SELECT seq, kind, data, created_at, actor FROM events
             WHERE session_id = $1 AND seq > $2
               AND kind IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed',
                                'reflection_interval_changed')
               AND ($4 OR NOT (kind = 'gate_decision' AND data->'decision'->>'decision' = 'continue'))
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
             ORDER BY seq LIMIT $3",
            session_id,
            after_seq,
            limit,
            include_continue,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

impl NewEvent {
    /// The row of a status change from `from` (none for a new session) to `to`.
    pub fn status(from: Option<Status>, to: Status) -> Result<NewEvent> {
        NewEvent::from_event(&SessionEvent::status(from, to))
    }

    /// The row of a typed event: the only way the store makes one. A payload
    /// that cannot be encoded is an error, never a stored `null`.
    pub fn from_event(event: &SessionEvent) -> Result<NewEvent> {
        let (kind, data) = event.to_parts().map_err(|e| {
            StoreError::Database(sqlx::Error::Encode(
                format!("cannot encode event {}: {e}", event.kind()).into(),
            ))
        })?;
        Ok(NewEvent {
            kind,
            data: JsonText::from_serialized(data),
        })
    }
}
