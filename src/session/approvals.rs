//! Calls that waited for a person too long: a bounded background sweep
//! decides each as `expired` (never as a person's rejection), which tells
//! the agent the call did not run and lets the session continue.

use std::time::Duration;

use super::ServiceError;
use super::service::SessionService;
use crate::policy::approval::Decision;
use crate::store::{NewDecision, TenantScope};

/// Most calls expired per sweep; the rest wait for the next one.
const PER_SWEEP: i64 = 100;

/// How often the sweep runs for a timeout: a quarter of it, between 250 ms
/// and a minute, so a call expires at most that late.
pub fn sweep_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

/// Expires overdue calls, forever.
pub async fn expire_forever(service: SessionService, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        expire_overdue(&service).await;
    }
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
