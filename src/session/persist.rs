//! Writing a new session: the row, its first events and (for a goal refined
//! at once) its first refinement, in one transaction, so a crash never
//! leaves a refined session without its refinement history.
//!
//! The session INSERT mirrors `Store::insert_session`, but on the caller's
//! connection; it belongs in the store and moves there once the store's
//! queries are compile-time checked.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::store::{self, Lease, NewEvent, NewSession, SessionRecord, Store, StoreError};

/// The first refinement of a goal refined before the session started.
pub struct FirstRefinement<'a> {
    /// The goal as given.
    pub from: &'a str,
    /// The proposal it was refined by.
    pub proposal: &'a Value,
}

/// Inserts a session on `conn`: running under a lease held by `owner` when
/// given, otherwise waiting for refinement.
async fn insert_session(
    conn: &mut PgConnection,
    new: &NewSession,
    owner: Option<Uuid>,
    lease_ttl: Duration,
) -> Result<Option<Lease>, StoreError> {
    let token = owner.map(|_| Uuid::new_v4());
    sqlx::query(
        "INSERT INTO sessions (id, goal, mode, status, limits, executor, owner, lease_token, lease_expires_at, heartbeat_at,
                               original_goal, refinement, criteria, milestones, refinement_tokens, tokens_used)
         VALUES ($1, $2, $3, CASE WHEN $6::uuid IS NULL THEN 'awaiting_refinement' ELSE 'running' END, $4, $5,
                 $6, $7, CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() + make_interval(secs => $8) END,
                 CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() END, $9, $10, $11, $12, $13, $13)",
    )
    .bind(new.id)
    .bind(&new.goal)
    .bind(new.mode.as_str())
    .bind(Json(new.limits))
    .bind(&new.executor)
    .bind(owner)
    .bind(token)
    .bind(lease_ttl.as_secs_f64())
    .bind(&new.original_goal)
    .bind(&new.refinement)
    .bind(Json(&new.criteria))
    .bind(Json(&new.milestones))
    .bind(new.refinement_tokens)
    .execute(conn)
    .await?;
    Ok(token.map(|token| Lease {
        session_id: new.id,
        token,
    }))
}

/// Creates a session with its events and first refinement in one transaction.
pub async fn create_session(
    store: &Store,
    new: &NewSession,
    owner: Option<Uuid>,
    lease_ttl: Duration,
    events: &[NewEvent],
    refinement: Option<FirstRefinement<'_>>,
) -> Result<(SessionRecord, Option<Lease>), StoreError> {
    let mut tx = store.begin().await?;
    let lease = insert_session(&mut tx, new, owner, lease_ttl).await?;
    store::append_events(&mut tx, new.id, events).await?;
    if let Some(r) = refinement {
        store::insert_refinement(&mut tx, new.id, "auto", r.from, &new.goal, r.proposal).await?;
    }
    let record = store::lock_session(&mut tx, new.id)
        .await?
        .ok_or(StoreError::Corrupt {
            id: new.id,
            detail: "session vanished right after insert".into(),
        })?;
    tx.commit().await?;
    store.announce(new.id);
    Ok((record, lease))
}
