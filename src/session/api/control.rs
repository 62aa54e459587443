//! Stop, pause and resume: each persisted under the row lock first, then
//! signalled to the loop, whose landing the answer waits for a while.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use sqlx::{Postgres, Transaction};
use utoipa::ToSchema;
use uuid::Uuid;

use super::MAX_GUIDANCE_CHARS;
use super::SessionService;
use super::create_request::validate_goal;
use super::stop_landing::LANDING_SLACK;
use crate::event::SessionEvent;
use crate::policy::fleet::{self, OwnerWatch};
use crate::policy::guardrails::{self, Breach, Limits, LimitsPatch};
use crate::policy::lifecycle::{self, Action, PausePlan, Reason, Status, StopPlan};
use crate::session::error::{Result, ServiceError};
use crate::session::event_codec;
use crate::session::persist;
use crate::session::runtime::Done;
use crate::session::runtime::rehydrate::rebuild_locked;
use crate::store::{self, ControlAction, Session, TenantScope};

/// Request to resume a session.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSession {
    /// Guidance delivered to the next iteration.
    #[serde(default)]
    pub guidance: Option<String>,
    /// Limits to raise (or lower) on resume; recorded as an event.
    #[serde(default)]
    pub limits: LimitsPatch,
    /// A refined goal to continue with (recorded in the refinement history).
    #[serde(default)]
    pub goal: Option<String>,
    /// Reopen a completed session whose work was not actually done.
    #[serde(default)]
    pub reopen: bool,
}

/// What a stop achieved by the time it answers.
#[derive(Debug)]
pub enum StopAnswer {
    /// The session is no longer running (interrupted, or had ended).
    Landed(Session),
    /// Recorded (`stop_requested`) but not landed yet: it will be by `lands_by`.
    Pending {
        /// The session as it is now.
        session: Session,
        /// When the stop will have landed: the owner lands it, or it counts
        /// as gone by then and the stop lands without it.
        lands_by: chrono::DateTime<chrono::Utc>,
    },
}

async fn wait_done(done: Option<Done>, timeout: Duration) {
    if let Some(mut done) = done {
        let _ = tokio::time::timeout(timeout, done.wait_for(|d| *d)).await;
    }
}

impl SessionService {
    /// Stops a session: persisted first, then signalled; waits for the loop
    /// to land. A stop whose owner is gone (lease lapsed, or silent for
    /// [`fleet::MISSED_HEARTBEATS`] heartbeats) lands here; one the owner
    /// has not landed within the wait answers when it will land.
    #[tracing::instrument(skip(self))]
    pub async fn stop(&self, id: Uuid, scope: &TenantScope) -> Result<StopAnswer> {
        let received = Instant::now();
        let (mut tx, session) = self.lock_for(Action::Stop, id, scope).await?;
        match lifecycle::plan_stop(session.status)? {
            StopPlan::AlreadyStopped => {
                self.commit(tx, id).await?;
            }
            StopPlan::InterruptNow => {
                // An outcome a worker completed but no run collected is not
                // applied (the stop wins); its tokens are charged, and so
                // counted by the state rebuilt next.
                store::charge_uncollected_outcomes(&mut tx, id, scope).await?;
                // On the locked connection: never a second one while the lock is held.
                let state = rebuild_locked(&mut tx, &session).await?;
                self.end_unowned(&mut tx, &session, scope, &state, Reason::UserStop)
                    .await?;
                self.commit(tx, id).await?;
            }
            StopPlan::SignalRunner => {
                store::request_stop(&mut tx, id, scope).await?;
                self.commit(tx, id).await?;
                match self.supervisor.signal_stop(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.stop_elsewhere(id, scope).await?,
                }
                self.supervisor
                    .metrics()
                    .stop_seconds
                    .observe(received.elapsed());
            }
        }
        let session = self.stored(id, scope).await?;
        if session.status != Status::Running {
            return Ok(StopAnswer::Landed(session));
        }
        // Recorded, not landed yet: say by when it will be, and make sure
        // it is if the owner is gone by then.
        let lands_by = match fleet::owner_watch(
            chrono::Utc::now(),
            session.lease_expires_at,
            session.heartbeat_at,
            self.config.lease.heartbeat,
        ) {
            OwnerWatch::AliveUntil(deadline) => deadline,
            OwnerWatch::Gone => chrono::Utc::now(),
        } + chrono::TimeDelta::from_std(LANDING_SLACK).unwrap_or_default();
        if session.owner != Some(self.supervisor.replica_id()) {
            self.land_later(id, scope.clone());
        }
        Ok(StopAnswer::Pending { session, lands_by })
    }

    /// Pauses a session after its step in flight.
    #[tracing::instrument(skip(self))]
    pub async fn pause(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Pause, id, scope).await?;
        match lifecycle::plan_pause(session.status)? {
            PausePlan::AlreadyPaused => {
                self.commit(tx, id).await?;
            }
            PausePlan::SignalRunner => {
                store::request_pause(&mut tx, id, scope).await?;
                self.commit(tx, id).await?;
                match self.supervisor.signal_pause(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.store.notify_control(ControlAction::Pause, id).await?,
                }
            }
        }
        self.get(id, scope).await
    }

    /// Resumes a paused, stopped, interrupted or failed session.
    #[tracing::instrument(skip(self, req))]
    pub async fn resume(
        &self,
        id: Uuid,
        scope: &TenantScope,
        req: ResumeSession,
    ) -> Result<Session> {
        let guidance = req
            .guidance
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        if let Some(g) = guidance
            && g.chars().count() > MAX_GUIDANCE_CHARS
        {
            return Err(ServiceError::Invalid(format!(
                "guidance must be at most {MAX_GUIDANCE_CHARS} characters, got {}",
                g.chars().count()
            )));
        }
        let action = if req.reopen {
            Action::Reopen
        } else {
            Action::Resume
        };
        let (mut tx, session) = self.lock_for(action, id, scope).await?;
        lifecycle::check_resume(session.status, req.reopen)?;
        let waiting = store::count_waiting_approvals(&mut tx, id, scope).await?;
        if waiting > 0 {
            return Err(ServiceError::ApprovalsWaiting {
                session_id: id,
                waiting,
            });
        }
        self.resume_locked(tx, session, scope, req, Vec::new())
            .await
    }

    /// Resumes a session whose row `tx` holds locked; `leading` events are
    /// logged before the resume's own.
    pub(super) async fn resume_locked(
        &self,
        mut tx: Transaction<'static, Postgres>,
        session: Session,
        scope: &TenantScope,
        req: ResumeSession,
        leading: Vec<SessionEvent>,
    ) -> Result<Session> {
        let id = session.id;
        let guidance = req
            .guidance
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        persist::check_tenant_room(
            &mut tx,
            &session.tenant,
            self.config.quotas.tenant_max_running,
        )
        .await?;
        let new_goal = req.goal.as_deref().map(validate_goal).transpose()?;
        let limits = session.limits.apply(&req.limits)?;
        super::check_money_priced(&limits, &self.config.model_prices)?;
        guardrails::check_child_budget(session.parent_id.is_some(), &session.limits.0, &limits)?;
        check_not_exhausted(&session, &limits)?;
        let mut events = leading;
        if limits != session.limits.0 {
            events.push(SessionEvent::LimitsChanged {
                from: session.limits.0,
                to: limits,
                by: "resume".into(),
            });
        }
        if let Some(goal) = &new_goal
            && *goal != session.goal
        {
            store::insert_refinement(
                &mut tx,
                id,
                scope,
                "resume",
                &session.goal,
                goal,
                &json!({ "guidance": guidance }),
            )
            .await?;
            events.push(SessionEvent::GoalRefined {
                kind: "resume".into(),
                from: session.goal.clone(),
                to: goal.clone(),
                limits: None,
            });
        }
        events.push(SessionEvent::Resumed {
            run: session.run + 1,
            guidance: guidance.map(str::to_string),
            reopened: req.reopen,
            from_status: session.status,
            from_reason: session.reason,
        });
        let executor = session.executor.as_ref().map(|e| &e.0.spec);
        let (slot, status) = self
            .admit_placed(&mut tx, &session.tenant, &limits, executor)
            .await?;
        events.push(SessionEvent::status(Some(session.status), status));
        let events = event_codec::encode(&events)?;
        let acquired = Instant::now();
        let lease = store::resume_session(
            &mut tx,
            id,
            scope,
            new_goal.as_deref(),
            limits,
            guidance,
            (status == Status::Running).then(|| self.supervisor.replica_id()),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        if let Some(traceparent) = crate::telemetry::request_traceparent() {
            store::set_request_traceparent(&mut tx, id, scope, &traceparent).await?;
        }
        self.start_run(tx, id, scope, lease.zip(slot), acquired)
            .await
    }
}

/// Refuses a resume under `limits` that one of them already stops: the
/// answer names the limit, what was used and what it allows.
fn check_not_exhausted(session: &Session, limits: &Limits) -> Result<()> {
    let usage = session.usage();
    if let Some(breach) = guardrails::exhausted_for_resume(limits, &usage) {
        let (used, limit) = match breach {
            Breach::Timeout => (usage.elapsed_ms, limits.max_wall_time_ms).into_text(),
            Breach::MaxIterations => (usage.iterations, limits.max_iterations).into_text(),
            Breach::CostLimit => (usage.tokens, limits.max_tokens).into_text(),
            Breach::MoneyLimit => (
                format!("{} USD", usage.cost_usd.normalize()),
                limits
                    .max_cost_usd
                    .map_or_else(String::new, |m| format!("{} USD", m.normalize())),
            ),
            Breach::ErrorThreshold => {
                (usage.consecutive_errors, limits.max_consecutive_errors).into_text()
            }
        };
        return Err(ServiceError::LimitExhausted {
            breach,
            field: breach.limit_field(),
            used,
            limit,
        });
    }
    Ok(())
}

/// A used/limit pair as the refusal prints it.
trait IntoText {
    fn into_text(self) -> (String, String);
}

impl<A: std::fmt::Display, B: std::fmt::Display> IntoText for (A, B) {
    fn into_text(self) -> (String, String) {
        (self.0.to_string(), self.1.to_string())
    }
}
