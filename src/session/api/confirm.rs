//! Confirmation before start: a session created `awaiting_confirmation`
//! (its estimate over its `confirm_if_over`, or unknown) starts when a
//! person confirms it, and a bounded background sweep ends those nobody
//! confirmed within `WARDEN_APPROVAL_TIMEOUT_MS` as
//! `stopped / confirmation_expired`.

use crate::session::sweep;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SessionService;
use crate::event::SessionEvent;
use crate::policy::lifecycle::{self, Action, Reason, Status};
use crate::session::error::{Result, ServiceError};
use crate::session::event_codec;
use crate::session::persist;
use crate::session::runtime::rehydrate::rebuild_locked;
use crate::store::{self, Session, TenantScope};

/// Most confirmations expired per sweep; the rest wait for the next one.
const PER_SWEEP: i64 = 100;

/// Expires overdue confirmations, forever, every `every` (the approvals'
/// sweep interval: a confirmation expires at most that late).
pub async fn expire_forever(service: SessionService, every: Duration) {
    sweep::every(every, || {
        let service = service.clone();
        async move { expire_overdue(&service).await }
    })
    .await
}

/// One sweep: every session awaiting confirmation past its `expires_at`
/// (up to [`PER_SWEEP`]) ends `stopped / confirmation_expired`.
pub async fn expire_overdue(service: &SessionService) {
    let overdue = match service.store().expired_confirmations(PER_SWEEP).await {
        Ok(overdue) => overdue,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read overdue confirmations; the next sweep tries again");
            return;
        }
    };
    for (session_id, tenant) in overdue {
        let scope = TenantScope::tenant_only(&tenant);
        match service.expire_confirmation(session_id, &scope).await {
            Ok(true) => {
                tracing::info!(%session_id, "a session awaiting confirmation expired")
            }
            // Confirmed or stopped in between.
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(%session_id, error = %err, "cannot expire a session awaiting confirmation; the next sweep tries again");
            }
        }
    }
}

impl SessionService {
    /// Starts a session awaiting confirmation: `running` here when this
    /// replica has room, else `queued`. 409 in any other status.
    #[tracing::instrument(skip(self))]
    pub async fn confirm(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Confirm, id, scope).await?;
        lifecycle::check_confirm(session.status)?;
        // Waiting for a confirmation holds no place in the tenant's quota:
        // starting takes one, as a resume does.
        persist::check_tenant_room(
            &mut tx,
            &session.tenant,
            self.config.quotas.tenant_max_running,
        )
        .await?;
        let limits = session.limits.0;
        let executor = session.executor.as_ref().map(|e| &e.0.spec);
        let (slot, status) = self
            .admit_placed(&mut tx, &session.tenant, &limits, executor)
            .await?;
        let events = event_codec::encode(&[SessionEvent::status(Some(session.status), status)])?;
        let acquired = Instant::now();
        let lease = store::start_refined(
            &mut tx,
            id,
            scope,
            &session.goal,
            limits,
            (status == Status::Running).then(|| self.supervisor.replica_id()),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        self.start_run(tx, id, scope, lease.zip(slot), acquired)
            .await
    }

    /// Ends session `id` `stopped / confirmation_expired` if it still
    /// awaits confirmation; says whether it did.
    pub(crate) async fn expire_confirmation(&self, id: Uuid, scope: &TenantScope) -> Result<bool> {
        let (mut tx, session) = match self.lock_for(Action::Stop, id, scope).await {
            Ok(locked) => locked,
            Err(ServiceError::NotFound(_)) => return Ok(false),
            Err(err) => return Err(err),
        };
        if session.status != Status::AwaitingConfirmation {
            self.commit(tx, id).await?;
            return Ok(false);
        }
        let state = rebuild_locked(&mut tx, &session).await?;
        self.end_unowned(
            &mut tx,
            &session,
            scope,
            &state,
            Reason::ConfirmationExpired,
        )
        .await?;
        self.commit(tx, id).await?;
        Ok(true)
    }
}
