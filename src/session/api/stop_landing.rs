//! Landing a stop whose session another replica runs: the owner is told,
//! and a stop whose owner is gone (or goes while the stop waits) is landed
//! here, under the row lock. A stop answered before it landed is handed to
//! the landing task the `Application` owns, which lands it once the owner
//! counts as gone.

use std::time::{Duration, Instant};

use uuid::Uuid;

use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use super::SessionService;
use crate::event::SessionEvent;
use crate::policy::fleet::{self, OwnerWatch};
use crate::policy::lifecycle::{Reason, Status};
use crate::policy::loop_state::LoopState;
use crate::policy::termination::{self, Facts};
use crate::session::error::Result;
use crate::session::event_codec::{self, to_stored};
use crate::session::runtime::rehydrate::rebuild_locked;
use crate::store::{self, ControlAction, Session, TenantScope};

/// How often a stop waiting for an absent owner looks again.
const LANDING_POLL: Duration = Duration::from_millis(50);

/// Longest a stop waiting for a live owner goes without reading the row:
/// the owner's word that the run ended wakes it at once; this only covers
/// a word lost (an owner of an earlier version, a NOTIFY that failed).
const ENDED_BACKSTOP: Duration = Duration::from_millis(250);

/// Added to the promised landing time: the look that lands it comes after.
pub(super) const LANDING_SLACK: Duration = Duration::from_millis(500);

/// Most looks of a stop landed later: each waits until the owner would
/// count as gone, so a few cover an owner that renewed meanwhile.
const LANDING_TRIES: usize = 8;

/// Whether a recorded stop still waits for its owner.
enum Landing {
    /// Landed, or nothing left to land.
    Done,
    /// The owner may still land it; it counts as gone after this long.
    Wait(chrono::TimeDelta),
}

impl SessionService {
    /// A stop for a session this replica does not run: tell its owner, and
    /// if the owner is gone (or goes while the stop waits), land it here.
    pub(super) async fn stop_elsewhere(&self, id: Uuid, scope: &TenantScope) -> Result<()> {
        // Listening before the owner is told: its word cannot come first.
        let mut ended = self.supervisor.stops_ended();
        self.store.notify_control(ControlAction::Stop, id).await?;
        let deadline = Instant::now() + self.config.control_wait;
        loop {
            let wait = match self.land_if_owner_gone(id, scope).await? {
                Landing::Done => return Ok(()),
                Landing::Wait(until) => until.to_std().unwrap_or_default() + LANDING_POLL,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let wait = wait.min(ENDED_BACKSTOP).min(deadline - now);
            ended_or_timeout(&mut ended, id, wait).await;
        }
    }

    /// Lands the recorded stop of `id` here when its owner is gone: under
    /// the row lock, with the owner's liveness read again there, so a live
    /// owner (or a rescue that took the session over) is never overruled.
    async fn land_if_owner_gone(&self, id: Uuid, scope: &TenantScope) -> Result<Landing> {
        let Some(seen) = self.store.owner_liveness(id, scope).await? else {
            return Ok(Landing::Done);
        };
        if seen.status != Status::Running {
            return Ok(Landing::Done);
        }
        let heartbeat = self.config.lease.heartbeat;
        if let OwnerWatch::AliveUntil(until) = fleet::owner_watch(
            seen.now,
            seen.lease_expires_at,
            seen.heartbeat_at,
            heartbeat,
        ) {
            return Ok(Landing::Wait(until - seen.now));
        }
        let mut tx = self.store.begin().await?;
        // Everything under the lock is read on its own connection.
        let locked = store::lock_session(&mut tx, id, scope).await?;
        let under_lock = store::owner_liveness_on(&mut tx, id, scope).await?;
        if let (Some(locked), Some(l)) = (locked, under_lock)
            && locked.status == Status::Running
            && locked.stop_requested
            && fleet::owner_watch(l.now, l.lease_expires_at, l.heartbeat_at, heartbeat)
                == OwnerWatch::Gone
        {
            // As a stop of an unowned session: the stop wins over an
            // uncollected outcome, whose tokens are charged.
            store::charge_uncollected_outcomes(&mut tx, id, scope).await?;
            let state = rebuild_locked(&mut tx, &locked).await?;
            self.end_unowned(&mut tx, &locked, scope, &state, Reason::UserStop)
                .await?;
            self.commit(tx, id).await?;
            tracing::info!(session_id = %id, "owner gone: stop landed by this replica");
            return Ok(Landing::Done);
        }
        self.commit(tx, id).await?;
        Ok(Landing::Done)
    }

    /// After a stop answered 202: hands it to the landing task (see
    /// [`StopLandings`]), which lands it here once the owner counts as gone.
    pub(super) fn land_later(&self, id: Uuid, scope: TenantScope) {
        if self.landings.send((id, scope)).is_err() {
            // The landing task ended with the application.
            tracing::warn!(session_id = %id, "stop left to the owner or the rescue");
        }
    }

    /// Lands a stop once the owner counts as gone, unless the owner (or a
    /// rescue) landed it first. Gives up after [`LANDING_TRIES`] looks; a
    /// rescue lands it at the latest.
    async fn land_when_owner_gone(&self, id: Uuid, scope: TenantScope) {
        for _ in 0..LANDING_TRIES {
            match self.land_if_owner_gone(id, &scope).await {
                Ok(Landing::Done) => return,
                Ok(Landing::Wait(until)) => {
                    let wait = until.to_std().unwrap_or_default();
                    tokio::time::sleep(wait + LANDING_POLL).await;
                }
                Err(err) => {
                    tracing::warn!(session_id = %id, error = %err, "cannot land the stop yet");
                    tokio::time::sleep(self.config.lease.heartbeat).await;
                }
            }
        }
        tracing::warn!(session_id = %id, "stop left to the owner or the rescue");
    }

    /// Ends a session no loop runs (its stop lands here): the run's end is
    /// recorded with the usage its log adds up to.
    pub(super) async fn end_unowned(
        &self,
        conn: &mut sqlx::PgConnection,
        session: &Session,
        scope: &TenantScope,
        state: &LoopState,
        reason: Reason,
    ) -> Result<()> {
        let usage = state.usage;
        let termination = termination::record(
            reason,
            Facts {
                usage: &usage,
                limits: &session.limits,
                detail: None,
            },
        );
        let mut snapshot = state.clone();
        snapshot.last_checkpoint_step = usage.iterations;
        let snapshot = to_stored("checkpoint state", &snapshot)?;
        let events = event_codec::encode(&[SessionEvent::run_ended(
            session.status,
            &termination,
            &usage,
        )])?;
        store::end_unowned(
            conn,
            session.id,
            scope,
            &termination,
            Some((usage.iterations as i64, snapshot)),
            &events,
        )
        .await?;
        Ok(())
    }
}

/// A stop that answered before it landed, handed to the landing task.
pub(super) type PendingStop = (Uuid, TenantScope);

/// The stops answered before they landed, and the task that lands them:
/// the `Application` runs it ([`StopLandings::run`]) among its background
/// tasks and ends it at shutdown, with the landings in flight.
pub struct StopLandings {
    service: SessionService,
    pending: mpsc::UnboundedReceiver<PendingStop>,
}

impl StopLandings {
    /// The landing task of `service`, fed through `pending`.
    pub(super) fn new(
        service: SessionService,
        pending: mpsc::UnboundedReceiver<PendingStop>,
    ) -> StopLandings {
        StopLandings { service, pending }
    }

    /// Lands each stop handed over, all at once, until the task is ended
    /// (ending it ends the landings in flight too).
    pub async fn run(mut self) {
        let mut landing = JoinSet::new();
        loop {
            tokio::select! {
                next = self.pending.recv() => match next {
                    Some((id, scope)) => {
                        let service = self.service.clone();
                        landing.spawn(async move { service.land_when_owner_gone(id, scope).await });
                    }
                    None => break,
                },
                // Reaps the landings done, so the set holds only those in flight.
                Some(_) = landing.join_next(), if !landing.is_empty() => {}
            }
        }
        while landing.join_next().await.is_some() {}
    }
}

/// Waits until the owner says the run of `id` ended, or `wait` passed, or
/// a word may have been missed (the receiver lagged): each calls for a
/// read of the row, which is the truth.
async fn ended_or_timeout(ended: &mut broadcast::Receiver<Uuid>, id: Uuid, wait: Duration) {
    let heard = async {
        loop {
            match ended.recv().await {
                Ok(session) if session == id => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                // No supervisor to relay words: the backstop reads the row.
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    let _ = tokio::time::timeout(wait, heard).await;
}
