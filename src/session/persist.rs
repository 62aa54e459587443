//! Writing a new session: the row, its first events and (for a goal refined
//! at once) its first refinement, in one transaction, so a crash never
//! leaves a refined session without its refinement history.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use sqlx::PgConnection;

use super::ServiceError;
use crate::policy::delegation::{ChildPausePolicy, ChildRequest, TreeLimits};
use crate::policy::lifecycle::{self, Status};
use crate::secrets::Sealed;
use crate::store::{self, Lease, NewEvent, NewSession, Session, Store, StoreError, TenantScope};

/// How a new session starts.
#[derive(Debug, Clone)]
pub enum Start {
    /// Its goal waits for the user's refinement choice.
    AwaitRefinement,
    /// Its estimate is over its `confirm_if_over`: it waits for a person's
    /// confirmation, which this records.
    AwaitConfirmation(Box<crate::policy::confirm::Confirmation>),
    /// It runs under a lease of `owner` when that replica reserved a place
    /// and nobody is queued before it; otherwise it joins the queue.
    Admit {
        /// The replica that would run it.
        owner: Uuid,
        /// Whether that replica has a place for it.
        slot_reserved: bool,
    },
    /// Its goal is split: it waits (`paused / waiting_for_children`) while
    /// these tasks run as its children, queued in the same transaction.
    Split(Vec<(ChildRequest, Option<Value>)>),
}

/// The first refinement of a goal refined before the session started.
pub struct FirstRefinement<'a> {
    /// The goal as given.
    pub from: &'a str,
    /// The proposal it was refined by.
    pub proposal: &'a Value,
}

/// What a new session brings beside its row: its sealed API key, and the
/// tenant quota it must fit in.
pub struct Admission<'a> {
    /// The session's own model API key, sealed.
    pub api_key: Option<&'a Sealed>,
    /// The query of the session's client-chosen URL, sealed.
    pub url_query: Option<&'a Sealed>,
    /// `WARDEN_TENANT_MAX_RUNNING`.
    pub tenant_max_running: i64,
    /// The client's `Idempotency-Key` and the digest of its request body.
    pub idempotency: Option<(&'a str, &'a [u8])>,
    /// What the children of its tree do when they would pause for a person.
    pub on_child_pause: ChildPausePolicy,
    /// For a fork: where it came from and what it starts with.
    pub fork: Option<&'a store::snapshots::ForkStart>,
    /// The new session's tenant as a scope (the create's own).
    pub scope: &'a TenantScope,
}

/// Creates a session with its events (then the status it starts in) and
/// first refinement in one transaction.
pub async fn create_session(
    store: &Store,
    new: &NewSession,
    start: Start,
    lease_ttl: Duration,
    events: &[NewEvent],
    refinement: Option<FirstRefinement<'_>>,
    admission: Admission<'_>,
) -> Result<(Session, Option<Lease>), ServiceError> {
    let Admission {
        api_key,
        url_query,
        tenant_max_running,
        idempotency,
        on_child_pause,
        fork,
        scope,
    } = admission;
    let mut tx = store.begin().await?;
    check_tenant_room(&mut tx, &new.tenant, tenant_max_running).await?;
    let confirmation = match &start {
        Start::AwaitConfirmation(c) => Some(c.clone()),
        _ => None,
    };
    let (status, owner, split) =
        first_status(&mut tx, &new.tenant, start, tenant_max_running).await?;
    let lease = store::insert_session(&mut tx, new, status, owner, lease_ttl).await?;
    if let Some(traceparent) = crate::telemetry::request_traceparent() {
        store::set_request_traceparent(&mut tx, new.id, scope, &traceparent).await?;
    }
    if let Some(fork) = fork {
        store::snapshots::start_fork(&mut tx, new.id, fork).await?;
    }
    if let Some(confirmation) = &confirmation {
        store::set_confirmation(&mut tx, new.id, scope, confirmation).await?;
    }
    if on_child_pause != ChildPausePolicy::default() {
        // Before its children are made: they copy it.
        store::set_child_pause_policy(&mut tx, new.id, on_child_pause).await?;
    }
    if let Some((key, digest)) = idempotency
        && let Some(used) =
            store::idempotency::claim(&mut tx, &new.tenant, key, digest, new.id).await?
    {
        // A concurrent create with the same key committed first: this one
        // rolls back and answers with that one's session.
        return Err(ServiceError::KeyUsed {
            session_id: used.session_id,
            same_request: used.request_digest == digest,
        });
    }
    if let Some(sealed) = api_key {
        store::insert_secret(&mut tx, new.id, crate::secrets::API_KEY, sealed).await?;
    }
    if let Some(sealed) = url_query {
        store::insert_secret(&mut tx, new.id, crate::secrets::URL_QUERY, sealed).await?;
    }
    let mut log = events.to_vec();
    log.push(NewEvent::status(None, status)?);
    store::append_events(&mut tx, new.id, &log).await?;
    queue_subgoals(&mut tx, new.id, &split).await?;
    if let Some(r) = refinement {
        store::insert_refinement(
            &mut tx, new.id, scope, "auto", r.from, &new.goal, r.proposal,
        )
        .await?;
    }
    let record = store::lock_session(&mut tx, new.id, scope)
        .await?
        .ok_or(StoreError::Corrupt {
            id: new.id,
            detail: "session vanished right after insert".into(),
        })?;
    store.commit_session(tx, new.id).await?;
    Ok((record, lease))
}

/// The status a new session starts in, the replica that runs it (when it
/// is admitted) and the subgoals it waits for (when its goal is split).
async fn first_status(
    tx: &mut PgConnection,
    tenant: &str,
    start: Start,
    tenant_max_running: i64,
) -> Result<(Status, Option<Uuid>, Vec<(ChildRequest, Option<Value>)>), ServiceError> {
    Ok(match start {
        Start::AwaitRefinement => (Status::AwaitingRefinement, None, Vec::new()),
        Start::AwaitConfirmation(_) => (Status::AwaitingConfirmation, None, Vec::new()),
        Start::Split(tasks) => (Status::Paused, None, tasks),
        Start::Admit {
            owner,
            slot_reserved,
        } => {
            let queue_empty =
                slot_reserved && !store::queue_waiting(tx, tenant, tenant_max_running).await?;
            (
                lifecycle::admission(slot_reserved, queue_empty),
                Some(owner),
                Vec::new(),
            )
        }
    })
}

/// Queues a split goal's subgoals as children of `parent`, which waits for
/// them; nothing when the goal is not split.
async fn queue_subgoals(
    tx: &mut PgConnection,
    parent: Uuid,
    split: &[(ChildRequest, Option<Value>)],
) -> Result<(), ServiceError> {
    if split.is_empty() {
        return Ok(());
    }
    store::wait_for_children(tx, parent).await?;
    for (n, (request, executor)) in split.iter().enumerate() {
        store::delegate_on(
            tx,
            store::Delegator::Split { parent },
            &format!("subgoal.{n}"),
            request,
            executor.as_ref(),
            TreeLimits::default(),
        )
        .await
        .map_err(|e| match e {
            store::DelegateError::Refused(refused) => {
                ServiceError::Invalid(format!("subgoals[{n}]: {refused}"))
            }
            store::DelegateError::Store(err) => ServiceError::Store(err),
        })?;
    }
    Ok(())
}

/// Moves every plaintext `api_key` earlier versions left in sessions'
/// executor JSON into `session_secrets`, sealed under `key`; returns how
/// many. Run at start, before any loop is rebuilt.
pub async fn seal_plaintext_keys(
    store: &Store,
    key: &crate::secrets::SecretKey,
) -> Result<usize, ServiceError> {
    let mut moved = 0;
    loop {
        let batch = store.plaintext_keys(100).await?;
        if batch.is_empty() {
            return Ok(moved);
        }
        for found in batch {
            let sealed = key.seal(found.session_id, crate::secrets::API_KEY, &found.api_key)?;
            store.seal_plaintext_key(found.session_id, &sealed).await?;
            moved += 1;
        }
    }
}

/// What a rotation sealed again, and what it could not open.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    /// Secrets now sealed under the current key.
    pub resealed: usize,
    /// Secrets under a previous key that did not open (damaged); left as they are.
    pub unreadable: usize,
}

/// Secrets sealed again per batch: each batch is one page read and one
/// update per secret, so a rotation never holds much at once.
pub const RESEAL_BATCH: i64 = 200;

/// Seals again, under the ring's current key, every secret a previous key
/// of the ring sealed, [`RESEAL_BATCH`] at a time, logging progress after
/// each batch. Idempotent and resumable: each update applies only while
/// the secret is still under the key it was read under, and a replica
/// started later with the same ring does what is left. Pages through them
/// once, so a secret that does not open is reported, not retried.
pub async fn reseal_under_current(
    store: &Store,
    ring: &crate::secrets::Keyring,
) -> Result<Resealed, ServiceError> {
    let previous = ring.previous_ids();
    let total: i64 = store
        .secret_counts()
        .await?
        .iter()
        .filter(|(id, _)| previous.contains(id))
        .map(|(_, n)| n)
        .sum();
    let mut done = Resealed::default();
    let mut after = None;
    loop {
        let batch = store
            .secrets_sealed_under(&previous, after, RESEAL_BATCH)
            .await?;
        let Some(last) = batch.last() else {
            return Ok(done);
        };
        after = Some((last.session_id, last.name.clone()));
        for secret in batch {
            let plain = match ring.open(secret.session_id, &secret.name, &secret.sealed) {
                Ok(plain) => plain,
                Err(err) => {
                    tracing::warn!(session_id = %secret.session_id, name = %secret.name, error = %err, "a secret under a previous key does not open");
                    done.unreadable += 1;
                    continue;
                }
            };
            let sealed = ring
                .current()
                .seal(secret.session_id, &secret.name, &plain)?;
            if store
                .reseal_secret(
                    secret.session_id,
                    &secret.name,
                    &secret.sealed.key_id,
                    &sealed,
                )
                .await?
            {
                done.resealed += 1;
            }
        }
        tracing::info!(
            resealed = done.resealed,
            unreadable = done.unreadable,
            total,
            to = ring.current().id(),
            "re-sealing secrets under the current key"
        );
    }
}

/// [`reseal_under_current`] as a background task of a replica started
/// with previous keys; a failure is logged and left for the next start.
pub async fn reseal_in_background(store: Store, ring: crate::secrets::Keyring) {
    match reseal_under_current(&store, &ring).await {
        Ok(done) => tracing::info!(
            resealed = done.resealed,
            unreadable = done.unreadable,
            to = ring.current().id(),
            "secrets sealed by previous keys moved to the current key; `warden secrets status` shows what each key still seals"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "re-sealing secrets under the current key stopped; a replica started with the same keys resumes it"
        ),
    }
}

/// Refuses one more active session of `tenant` when it has `max` already
/// (`WARDEN_TENANT_MAX_RUNNING`). Holds the tenant's quota lock until the
/// caller's transaction ends, so concurrent creates are counted one by one.
pub async fn check_tenant_room(
    conn: &mut PgConnection,
    tenant: &str,
    max: i64,
) -> Result<(), ServiceError> {
    let active = store::quotas::lock_and_count_active(conn, tenant).await?;
    if active >= max {
        return Err(ServiceError::Quota {
            code: "tenant_running_limit",
            detail: format!(
                "tenant {tenant:?} already has {active} active sessions (running, queued or awaiting refinement), \
the most WARDEN_TENANT_MAX_RUNNING={max} allows: stop or wait for one to end"
            ),
        });
    }
    Ok(())
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
            executor: serde_json::from_value(json!({ "kind": "scripted", "steps": [] })).unwrap(),
            tenant: "default".into(),
            original_goal: Some(original.into()),
            refinement: Some(crate::event::RefinementProposal {
                suggested_goal: goal.into(),
                matched_patterns: Vec::new(),
                confidence: 0.9,
                source: "rules".into(),
                choices: Vec::new(),
            }),
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
            Start::Admit {
                owner: Uuid::new_v4(),
                slot_reserved: true,
            },
            Duration::from_secs(60),
            &events,
            Some(FirstRefinement {
                from: "make it better",
                proposal: &proposal,
            }),
            Admission {
                api_key: None,
                url_query: None,
                tenant_max_running: 100,
                idempotency: None,
                on_child_pause: ChildPausePolicy::default(),
                fork: None,
                scope: &TenantScope::tenant_only(&new.tenant),
            },
        )
        .await
        .unwrap();
        assert_eq!(record.status, Status::Running);
        assert!(lease.is_some());
        let refinements = store
            .refinements(new.id, &TenantScope::Global)
            .await
            .unwrap();
        assert_eq!(refinements.len(), 1);
        // The given event, then the status it started in.
        assert_eq!(
            store
                .events(new.id, 0, 10, None, &TenantScope::Global)
                .await
                .unwrap()
                .len(),
            2
        );
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
            Start::AwaitRefinement,
            Duration::from_secs(60),
            &[],
            Some(FirstRefinement {
                from: "bad\0goal",
                proposal: &json!({}),
            }),
            Admission {
                api_key: None,
                url_query: None,
                tenant_max_running: 100,
                idempotency: None,
                on_child_pause: ChildPausePolicy::default(),
                fork: None,
                scope: &TenantScope::tenant_only(&new.tenant),
            },
        )
        .await;
        assert!(result.is_err());
        assert!(
            store
                .session(new.id, &TenantScope::Global)
                .await
                .unwrap()
                .is_none()
        );
    }
}
