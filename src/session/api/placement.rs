//! Where a session may run in a fleet of mixed versions: a replica runs only
//! what it has every capability for (`policy::capabilities`); what it lacks
//! waits in the queue for a live replica that has it, or is refused when no
//! replica has it.

use super::SessionService;
use crate::policy::capabilities::{self, Placement};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{self, Status};
use crate::session::error::{Result, ServiceError};
use crate::session::runtime::Slot;
use crate::spec::ExecutorSpec;

impl SessionService {
    /// Where a session that uses `limits` and `executor` may run, by the
    /// capabilities it needs (see [`capabilities::placement`]): here, the
    /// queue (a live replica that has what this one lacks claims it), or
    /// nowhere, refused with nothing written.
    pub(super) async fn placement(
        &self,
        limits: &Limits,
        executor: Option<&ExecutorSpec>,
    ) -> Result<Placement> {
        let needs = crate::spec::needs(limits, executor);
        if self.config.capabilities.missing(&needs).is_empty() {
            return Ok(Placement::Here);
        }
        let names: Vec<String> = needs.iter().map(|c| c.as_str().to_string()).collect();
        let elsewhere = self
            .store
            .fleet_covers(
                self.supervisor.replica_id(),
                &names,
                // Live as long as its leases would be: a busy replica's
                // heartbeat may come late, and one silent for a whole TTL
                // has lost its sessions anyway.
                self.config.lease.ttl,
            )
            .await?;
        match capabilities::placement(false, elsewhere) {
            Placement::Nowhere => Err(ServiceError::CapabilityUnavailable { needs: names }),
            placement => Ok(placement),
        }
    }

    /// [`SessionService::admit`] for a session that may need what this
    /// replica lacks: then it is queued for a replica that has it.
    pub(super) async fn admit_placed(
        &self,
        conn: &mut sqlx::PgConnection,
        tenant: &str,
        limits: &Limits,
        executor: Option<&ExecutorSpec>,
    ) -> Result<(Option<Slot>, Status)> {
        match self.placement(limits, executor).await? {
            Placement::Here => self.admit(conn, tenant).await,
            _ => Ok((None, lifecycle::admission(false, false))),
        }
    }
}
