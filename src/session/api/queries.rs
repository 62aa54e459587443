//! Reading sessions: a status (from this replica's memory when it runs
//! the session, else Postgres), one session, a page of them, counts.

use uuid::Uuid;

use super::SessionService;
use crate::policy::fleet;
use crate::policy::lifecycle::Status;
use crate::session::error::{Result, ServiceError};
use crate::session::runtime::live::{Freshness, VELOCITY_MINUTES, Velocity};
use crate::store::{self, Session, SessionCursor, StoreError, TenantScope};

/// Where a status answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSource {
    /// The loop's memory of what it committed, under a lease it trusts.
    Memory,
    /// Postgres.
    Database,
    /// Postgres is out of reach: the last committed state this replica's
    /// memory holds, possibly behind the database's.
    StaleMemory,
}

impl SessionService {
    /// A session's status and its velocity (iterations per minute, last 30
    /// minutes), as committed: from this replica's memory when it runs the
    /// session, else from Postgres. A session outside `scope` is not found,
    /// like a missing one, on both paths. The flag says whether memory
    /// answered.
    pub async fn status(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<(Session, Velocity, StatusSource)> {
        if let Some((session, velocity, freshness)) = self.supervisor.live(id) {
            if !scope.allows(&session.tenant) {
                return Err(ServiceError::NotFound(id));
            }
            let source = match freshness {
                Freshness::Confirmed => StatusSource::Memory,
                Freshness::WriteFailed => StatusSource::StaleMemory,
            };
            return Ok((session, velocity, source));
        }
        let refill = self.supervisor.refillable(id);
        // Both reads at once: under load each waits on Postgres, so the
        // status answers in the time of the slower one rather than of both.
        let read = tokio::try_join!(
            self.get(id, scope),
            self.reads.velocity(id, scope, VELOCITY_MINUTES)
        );
        let (session, velocity) = match read {
            Ok(read) => read,
            // Postgres is out of reach: the last committed state this
            // replica knows, however old, marked stale.
            Err(ServiceError::Store(StoreError::Database(err))) if store::is_unavailable(&err) => {
                return match self.supervisor.last_known(id) {
                    Some((session, velocity)) if scope.allows(&session.tenant) => {
                        Ok((session, velocity, StatusSource::StaleMemory))
                    }
                    _ => Err(StoreError::Database(err).into()),
                };
            }
            Err(err) => return Err(err),
        };
        self.supervisor.forget(id);
        if let Some((view, generation)) = refill
            && session.status == Status::Running
            && session.owner == Some(self.supervisor.replica_id())
        {
            view.refill(generation, &session, &velocity);
        }
        Ok((session, velocity, StatusSource::Database))
    }

    /// One session, if `scope` reaches it, as it shows (see [`SessionService::shown`]).
    pub async fn get(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        self.stored(id, scope).await.map(|s| self.shown(s))
    }

    /// One session as stored, if `scope` reaches it.
    pub(super) async fn stored(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        self.store
            .session(id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))
    }

    /// `session` as clients see it: `running` under a lease that lapsed
    /// and that no replica took over for two heartbeats shows `queued`,
    /// without the owner that is gone (`policy::fleet::shown_status`).
    pub fn shown(&self, mut session: Session) -> Session {
        let shown = fleet::shown_status(
            session.status,
            session.lease_expires_at,
            chrono::Utc::now(),
            self.config.lease.heartbeat * fleet::MISSED_HEARTBEATS,
        );
        if shown != session.status {
            session.status = shown;
            session.owner = None;
            session.lease_expires_at = None;
        }
        session
    }

    /// A page of the sessions `filter` lets through, in `order`.
    pub async fn list(
        &self,
        filter: &store::SessionFilter,
        order: store::SessionOrder,
        after: Option<SessionCursor>,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<Session>> {
        let sessions = self
            .store
            .list_sessions(filter, order, after, limit, scope)
            .await?;
        Ok(sessions.into_iter().map(|s| self.shown(s)).collect())
    }

    /// How many sessions `scope` reaches are in each status, of those
    /// `filter` lets through (its `status` aside).
    pub async fn count_by_status(
        &self,
        filter: &store::SessionFilter,
        scope: &TenantScope,
    ) -> Result<Vec<(Status, i64)>> {
        Ok(self.store.count_sessions_by_status(filter, scope).await?)
    }
}
