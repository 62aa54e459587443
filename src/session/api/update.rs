//! Changing a session's mode or limits; a running loop applies them from
//! its next iteration.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::SessionService;
use crate::event::SessionEvent;
use crate::policy::guardrails::{self, LimitsPatch};
use crate::policy::lifecycle::{self, Action, Mode, Status};
use crate::session::error::Result;
use crate::session::event_codec;
use crate::store::{self, ControlAction, Session, SessionSettings, TenantScope};

/// Request to change a session's mode or limits.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSession {
    /// New mode.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Limits to change.
    #[serde(default)]
    pub limits: LimitsPatch,
}

impl SessionService {
    /// Changes the mode or limits of a session; a running loop applies them
    /// from its next iteration.
    #[tracing::instrument(skip(self, req))]
    pub async fn update(
        &self,
        id: Uuid,
        scope: &TenantScope,
        req: UpdateSession,
    ) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Update, id, scope).await?;
        lifecycle::check_update(session.status)?;
        let settings = SessionSettings {
            mode: req.mode.unwrap_or(session.mode),
            limits: session.limits.apply(&req.limits)?,
        };
        super::check_money_priced(&settings.limits, &self.config.model_prices)?;
        guardrails::check_child_budget(
            session.parent_id.is_some(),
            &session.limits.0,
            &settings.limits,
        )?;
        let executor = session.executor.as_ref().map(|e| &e.0.spec);
        let before = crate::spec::needs(&session.limits.0, executor);
        let after = crate::spec::needs(&settings.limits, executor);
        let added = after.difference(&before).copied().collect();
        // A running session keeps its replica: that one must cover a new need.
        let owner = session.owner.filter(|_| session.status == Status::Running);
        self.check_added_needs(&mut tx, owner, &after, &added)
            .await?;
        let mut events = Vec::new();
        if settings.mode != session.mode {
            events.push(SessionEvent::ModeChanged {
                from: session.mode,
                to: settings.mode,
            });
        }
        if settings.limits != session.limits.0 {
            events.push(SessionEvent::LimitsChanged {
                from: session.limits.0,
                to: settings.limits,
                by: "update".into(),
            });
        }
        let changed = !events.is_empty();
        if changed {
            store::update_settings(&mut tx, id, scope, settings, &event_codec::encode(&events)?)
                .await?;
        }
        self.commit(tx, id).await?;
        if changed && session.status == Status::Running {
            // Whoever runs it serves its status from memory: tell it.
            self.supervisor.invalidate(id);
            if let Err(err) = self.store.notify_control(ControlAction::Changed, id).await {
                tracing::warn!(session_id = %id, error = %err, "cannot announce the settings change; its owner shows it after its next step");
            }
        }
        self.get(id, scope).await
    }
}
