//! The use cases of sessions, the operations the HTTP layer calls: each
//! validates its input, applies the state machine under a row lock,
//! persists, and then talks to the loop through the runtime's
//! `Supervisor`. One file per use case; the service they share, its row
//! lock (`lock_for`) and its commit are here.

mod apply_threshold;
pub mod approvals;
pub mod confirm;
mod control;
mod create;
mod create_request;
mod delete;
pub mod estimate;
mod fork;
mod fork_seed;
mod insights;
pub mod notify;
mod placement;
mod planner;
mod preflight;
mod queries;
mod reads;
mod refine;
pub mod replay;
mod stop_landing;
mod tenant_retention;
mod tenant_warn_at;
pub mod tree;
mod update;
pub mod workers;
mod workspace_files;

pub use apply_threshold::{ApplyThreshold, ThresholdChange};
pub use control::{ResumeSession, StopAnswer};
pub use create::Created;
pub use create_request::{CreateSession, IdempotencyKey, Subgoal, SubgoalTask};
pub use fork::ForkSession;
pub use queries::StatusSource;
pub use reads::{LoggedEvent, SessionReads};
pub use refine::RefinementChoice;
pub use stop_landing::StopLandings;
pub use update::UpdateSession;
pub use workers::{ClaimedStep, WorkerProtocol};
pub use workspace_files::{FileChange, FileContent, FileList, WorkspaceDiff, WorkspaceFile};

use std::sync::Arc;
use std::time::Instant;

use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::session::error::{Result, ServiceError};
use crate::session::runtime::live::StepInFlight;
use crate::session::runtime::rehydrate::rebuild_locked;
use crate::session::runtime::{Slot, Supervisor};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::policy::lifecycle::{self, Action, Status};
use crate::store::{self, Lease, Session, Store, TenantScope};
use stop_landing::PendingStop;

/// Longest goal accepted, in characters (as JSON Schema's `maxLength` counts).
pub const MAX_GOAL_CHARS: usize = 10_000;

/// Longest guidance accepted, in characters.
pub const MAX_GUIDANCE_CHARS: usize = 10_000;

/// The operations on sessions.
#[derive(Clone)]
pub struct SessionService {
    store: Store,
    reads: SessionReads,
    config: Arc<Config>,
    supervisor: Supervisor,
    /// Stops answered before they landed, for the landing task.
    landings: mpsc::UnboundedSender<PendingStop>,
}

impl SessionService {
    /// The service over `store`, running loops under `supervisor`, and the
    /// task that lands the stops it answers before they landed (the
    /// caller runs it among its background tasks).
    pub fn new(
        store: Store,
        config: Arc<Config>,
        supervisor: Supervisor,
    ) -> (SessionService, StopLandings) {
        let (landings, pending) = mpsc::unbounded_channel();
        let service = SessionService {
            reads: SessionReads::new(store.clone()),
            store,
            config,
            supervisor,
            landings,
        };
        (service.clone(), StopLandings::new(service, pending))
    }

    /// The MCP servers declared for this replica (`WARDEN_MCP_CONFIG`), by name.
    pub fn mcp_servers(&self) -> Vec<String> {
        self.config
            .mcp
            .as_ref()
            .map(|c| c.names().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The store, for the use cases of this layer's other files (never
    /// the HTTP layer's: it calls use cases).
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// The read model the read-only endpoints use.
    pub fn reads(&self) -> &SessionReads {
        &self.reads
    }

    /// The step of `id` in flight on this replica, if it runs here.
    pub fn step_in_flight(&self, id: Uuid) -> Option<StepInFlight> {
        self.supervisor.step_in_flight(id)
    }

    async fn remove_workspace(&self, id: Uuid) {
        if let Err(err) = super::retention::remove(&self.config.workspace_root, id).await {
            tracing::warn!(session_id = %id, error = %err, "cannot remove a workspace; the retention sweep will");
        }
    }

    /// Where a session ready to run goes (see [`lifecycle::admission`]): a
    /// place here when one is free and nobody waits before it, else the
    /// queue. The place is kept only when it runs here.
    async fn admit(
        &self,
        conn: &mut sqlx::PgConnection,
        tenant: &str,
    ) -> Result<(Option<Slot>, Status)> {
        let slot = self.supervisor.try_reserve();
        let queue_empty = match slot {
            Some(_) => {
                !store::queue_waiting(conn, tenant, self.config.quotas.tenant_max_running).await?
            }
            None => false,
        };
        let status = lifecycle::admission(slot.is_some(), queue_empty);
        Ok((slot.filter(|_| status == Status::Running), status))
    }

    /// Opens a transaction holding session `id`'s row (as `scope` reaches
    /// it), refused when `action` may not touch it (an imported session is
    /// read-only).
    async fn lock_for(
        &self,
        action: Action,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<(Transaction<'static, Postgres>, Session)> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_writable(action, session.status, session.imported_at.is_some())?;
        Ok((tx, session))
    }

    /// Commits a change to session `id` and wakes its readers.
    async fn commit(&self, tx: Transaction<'static, Postgres>, id: Uuid) -> Result<()> {
        Ok(self.store.commit_session(tx, id).await?)
    }

    /// Commits a (re)start of session `id` and, under `run` (its lease and
    /// place here), runs its loop here; without one it was queued.
    async fn start_run(
        &self,
        mut tx: Transaction<'static, Postgres>,
        id: Uuid,
        scope: &TenantScope,
        run: Option<(Lease, Slot)>,
        acquired: Instant,
    ) -> Result<Session> {
        // Read back on the locked connection: a handful of pool acquires
        // here would delay the loop's start behind every queued request.
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let Some((lease, slot)) = run else {
            self.commit(tx, id).await?;
            return Ok(session);
        };
        let state = rebuild_locked(&mut tx, &session).await?;
        self.commit(tx, id).await?;
        self.supervisor
            .spawn_in(slot, lease, acquired, &session, state)
            .await?;
        if self.supervisor.done_signal(id).is_none() {
            // No loop runs: it ended already, or the session could not
            // start (its secret does not decrypt). Answer what it is now.
            if let Some(now) = self.store.session(id, scope).await? {
                return Ok(now);
            }
        }
        Ok(session)
    }
}

/// Refuses a money budget the service cannot keep: with no entry in
/// `WARDEN_MODEL_PRICES` no step can be priced, so no step could start.
fn check_money_priced(
    limits: &crate::policy::guardrails::Limits,
    prices: &crate::policy::pricing::PriceTable,
) -> Result<()> {
    if limits.max_cost_usd.is_some() && prices.entries().is_empty() {
        return Err(ServiceError::Unpriced(
            "limits.max_cost_usd needs a price table: this server has no WARDEN_MODEL_PRICES, so no step's cost can be known".into(),
        ));
    }
    Ok(())
}
