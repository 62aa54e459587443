//! Answering a refinement proposal: the goal the session runs is settled
//! and the session starts.

use std::time::Instant;

use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;
use uuid::Uuid;

use super::SessionService;
use super::create_request::validate_goal;
use crate::event::SessionEvent;
use crate::policy::guardrails::LimitsPatch;
use crate::policy::lifecycle::{self, Action, Status};
use crate::session::error::{Result, ServiceError};
use crate::session::event_codec;
use crate::store::{self, Session, TenantScope};

/// How the user answers a refinement proposal.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "choice", rename_all = "snake_case", deny_unknown_fields)]
pub enum RefinementChoice {
    /// Run the suggested goal.
    AcceptSuggestion,
    /// Run this goal instead.
    Custom {
        /// The goal to run.
        goal: String,
    },
    /// Run the goal as given, bounded by this wall-clock limit.
    ProceedWithTimeLimit {
        /// Wall-clock budget in ms.
        max_wall_time_ms: u64,
    },
}

impl SessionService {
    /// Answers a refinement proposal and starts the session.
    #[tracing::instrument(skip(self, choice))]
    pub async fn refine(
        &self,
        id: Uuid,
        scope: &TenantScope,
        choice: RefinementChoice,
    ) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Refine, id, scope).await?;
        lifecycle::check_refine(session.status)?;
        let suggested = session
            .refinement
            .as_ref()
            .map(|r| r.suggested_goal.clone());
        let mut limits = session.limits.0;
        let (kind, goal) = match &choice {
            RefinementChoice::AcceptSuggestion => (
                "accept_suggestion",
                suggested.ok_or_else(|| {
                    ServiceError::Invalid(
                        "this session has no suggested goal; choose custom".into(),
                    )
                })?,
            ),
            RefinementChoice::Custom { goal } => ("custom", validate_goal(goal)?),
            RefinementChoice::ProceedWithTimeLimit { max_wall_time_ms } => {
                limits = limits.apply(&LimitsPatch {
                    max_wall_time_ms: Some(*max_wall_time_ms),
                    ..LimitsPatch::default()
                })?;
                ("proceed_with_time_limit", session.goal.clone())
            }
        };
        let data = json!({ "limits": limits, "proposal": session.refinement });
        store::insert_refinement(&mut tx, id, scope, kind, &session.goal, &goal, &data).await?;
        let executor = session.executor.as_ref().map(|e| &e.0.spec);
        let (slot, status) = self
            .admit_placed(&mut tx, &session.tenant, &limits, executor)
            .await?;
        let events = event_codec::encode(&[
            SessionEvent::GoalRefined {
                kind: kind.into(),
                from: session.goal.clone(),
                to: goal.clone(),
                limits: Some(limits),
            },
            SessionEvent::status(Some(session.status), status),
        ])?;
        let acquired = Instant::now();
        let lease = store::start_refined(
            &mut tx,
            id,
            scope,
            &goal,
            limits,
            (status == Status::Running).then(|| self.supervisor.replica_id()),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        self.start_run(tx, id, scope, lease.zip(slot), acquired)
            .await
    }
}
