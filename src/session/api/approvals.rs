//! Calls that waited for a person too long: a bounded background sweep
//! decides each as `expired` (never as a person's rejection), which tells
//! the agent the call did not run and lets the session continue.

use crate::session::sweep;
use std::time::Duration;

use super::SessionService;
use crate::policy::approval::Decision;
use crate::session::ServiceError;
use uuid::Uuid;

use super::MAX_GUIDANCE_CHARS;
use super::control::ResumeSession;
use crate::event::SessionEvent;
use crate::policy::approval;
use crate::policy::lifecycle::{Reason, Status};
use crate::session::error::Result;
use crate::session::event_codec;
use crate::store::{self, NewDecision, Session, TenantScope};

/// Most calls expired per sweep; the rest wait for the next one.
const PER_SWEEP: i64 = 100;

/// How often the sweep runs for a timeout: a quarter of it, between 250 ms
/// and a minute, so a call expires at most that late.
pub fn sweep_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

/// Expires overdue calls, forever.
pub async fn expire_forever(service: SessionService, every: Duration) {
    sweep::every(every, || {
        let service = service.clone();
        async move { expire_overdue(&service).await }
    })
    .await
}

/// One sweep: every overdue call (up to [`PER_SWEEP`]) decided `expired`.
pub async fn expire_overdue(service: &SessionService) {
    let overdue = match service.store().expired_approvals(PER_SWEEP).await {
        Ok(overdue) => overdue,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read overdue approvals; the next sweep tries again");
            return;
        }
    };
    for (session_id, call_id) in overdue {
        // The sweep's own work spans every tenant.
        let decided = service
            .decide_approval(
                session_id,
                &TenantScope::Global,
                &call_id,
                NewDecision {
                    decision: Decision::Expired,
                    decided_by: None,
                    message: None,
                    edited_arguments: None,
                },
            )
            .await;
        match decided {
            Ok(_) => tracing::info!(%session_id, %call_id, "a call waiting for approval expired"),
            // A person decided in between.
            Err(ServiceError::AlreadyDecided { .. }) => {}
            Err(err) => {
                tracing::warn!(%session_id, %call_id, error = %err, "cannot expire a waiting call; the next sweep tries again");
            }
        }
    }
}

impl SessionService {
    /// Records a decision on a call that waits for approval. When it was
    /// the last call the session waited on, the session continues its
    /// step at once (as a resume would); `decided_by` is the key's actor,
    /// or `None` for an expiry. An approval may carry the person's own
    /// arguments, which the call then runs with; arguments equal to the
    /// agent's are no edit and are not recorded as one.
    #[tracing::instrument(skip(self, made), fields(decision = made.decision.as_str()))]
    pub async fn decide_approval(
        &self,
        id: Uuid,
        scope: &TenantScope,
        call_id: &str,
        made: store::NewDecision<'_>,
    ) -> Result<Session> {
        let message = made.message.map(str::trim).filter(|m| !m.is_empty());
        if let Some(m) = message
            && m.chars().count() > MAX_GUIDANCE_CHARS
        {
            return Err(ServiceError::Invalid(format!(
                "message must be at most {MAX_GUIDANCE_CHARS} characters, got {}",
                m.chars().count()
            )));
        }
        approval::check_edited_arguments(
            made.decision,
            made.edited_arguments,
            self.config.quotas.max_output_bytes,
        )
        .map_err(ServiceError::Invalid)?;
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let made = store::NewDecision { message, ..made };
        let approval = match store::decide_approval(&mut tx, id, scope, call_id, &made).await? {
            store::Decided::Recorded(approval) => approval,
            store::Decided::Already(earlier) => {
                return Err(ServiceError::AlreadyDecided {
                    call_id: earlier.call_id,
                    decision: earlier.decision.map_or("decided", Decision::as_str),
                });
            }
            store::Decided::Missing => {
                return Err(ServiceError::ApprovalNotFound {
                    session_id: id,
                    call_id: call_id.to_string(),
                });
            }
        };
        let decided = SessionEvent::ApprovalDecided {
            call_id: approval.call_id,
            tool: approval.tool,
            decision: made.decision,
            decided_by: made.decided_by.map(str::to_string),
            message: message.map(str::to_string),
            edited_arguments: approval.edited_arguments,
        };
        let waiting = store::count_waiting_approvals(&mut tx, id, scope).await?;
        let continues = waiting == 0
            && session.status == Status::Paused
            && session.reason == Some(Reason::ApprovalRequired);
        if continues {
            return self
                .resume_locked(tx, session, scope, ResumeSession::default(), vec![decided])
                .await;
        }
        store::append_events(&mut tx, id, &event_codec::encode(&[decided])?).await?;
        self.commit(tx, id).await?;
        self.get(id, scope).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_at_a_quarter_of_the_timeout_within_bounds() {
        assert_eq!(
            sweep_every(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            sweep_every(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
        assert_eq!(
            sweep_every(Duration::from_secs(86_400)),
            Duration::from_secs(60)
        );
    }
}
