//! Writing a new session: the row, its first events and (for a goal refined
//! at once) its first refinement, in one transaction, so a crash never
//! leaves a refined session without its refinement history.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::store::{self, Lease, NewEvent, NewSession, SessionRecord, Store, StoreError};

/// The first refinement of a goal refined before the session started.
pub struct FirstRefinement<'a> {
    /// The goal as given.
    pub from: &'a str,
    /// The proposal it was refined by.
    pub proposal: &'a Value,
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
    let lease = store::insert_session(&mut tx, new, owner, lease_ttl).await?;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::policy::guardrails::tests::roomy;
    use crate::policy::lifecycle::{Mode, Status};

    fn new_session(goal: &str, original: &str) -> NewSession {
        NewSession {
            id: Uuid::new_v4(),
            goal: goal.into(),
            mode: Mode::Fixed,
            limits: roomy(),
            executor: json!({ "kind": "scripted", "steps": [] }),
            tenant: "default".into(),
            original_goal: Some(original.into()),
            refinement: Some(json!({ "suggested_goal": goal })),
            criteria: Vec::new(),
            milestones: Vec::new(),
            refinement_tokens: 0,
        }
    }

    #[tokio::test]
    async fn the_session_and_its_first_refinement_are_written_together() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let store = Store::from_pool(pool);
        let new = new_session("Write README.md", "make it better");
        let proposal = json!({ "suggested_goal": "Write README.md" });
        let events = [NewEvent::new("stop_requested", json!({}))];
        let (record, lease) = create_session(
            &store,
            &new,
            Some(Uuid::new_v4()),
            Duration::from_secs(60),
            &events,
            Some(FirstRefinement {
                from: "make it better",
                proposal: &proposal,
            }),
        )
        .await
        .unwrap();
        assert_eq!(record.status, Status::Running);
        assert!(lease.is_some());
        let refinements = store.refinements(new.id).await.unwrap();
        assert_eq!(refinements.len(), 1);
        assert_eq!(store.events(new.id, 0, 10, None).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_refinement_leaves_no_session_behind() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let store = Store::from_pool(pool);
        let new = new_session("Write README.md", "make it better");
        // Postgres text cannot hold NUL: the refinement insert fails after the session's.
        let result = create_session(
            &store,
            &new,
            None,
            Duration::from_secs(60),
            &[],
            Some(FirstRefinement {
                from: "bad\0goal",
                proposal: &json!({}),
            }),
        )
        .await;
        assert!(result.is_err());
        assert!(store.session(new.id).await.unwrap().is_none());
    }
}
