//! Where a session may run in a fleet of mixed versions: a replica runs only
//! what it has every capability for (`policy::capabilities`); what it lacks
//! waits in the queue for a live replica that has it, or is refused when no
//! replica has it.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::SessionService;
use crate::policy::capabilities::{self, Capability, Placement};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{self, Status};
use crate::session::error::{Result, ServiceError};
use crate::session::runtime::Slot;
use crate::spec::ExecutorSpec;
use crate::store::{self, TenantScope};

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

    /// What a queued session waits for when no live replica covers its
    /// needs: those needs (`None` when it needs nothing, or a live replica
    /// has it all and will claim it).
    pub async fn waiting_for_replica(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<Vec<String>>> {
        Ok(self
            .store
            .uncovered_needs(id, scope, self.config.lease.ttl)
            .await?)
    }

    /// Refuses a change that gives a session needs it did not have (`added`
    /// of `needs`) unless a replica covers them all: the live one that runs
    /// it (`owner`, while it runs), else any live one. Read on `conn`, under
    /// the caller's lock on the session, before anything is written.
    pub(super) async fn check_added_needs(
        &self,
        conn: &mut sqlx::PgConnection,
        owner: Option<Uuid>,
        needs: &BTreeSet<Capability>,
        added: &BTreeSet<Capability>,
    ) -> Result<()> {
        if added.is_empty() {
            return Ok(());
        }
        // This replica knows what it has without asking (its heartbeat may
        // be late under load).
        let here = owner == Some(self.supervisor.replica_id());
        if here && self.config.capabilities.missing(needs).is_empty() {
            return Ok(());
        }
        let names = |set: &BTreeSet<Capability>| -> Vec<String> {
            set.iter().map(|c| c.as_str().to_string()).collect()
        };
        let ttl = self.config.lease.ttl;
        if store::replica_covers_on(conn, owner, &names(needs), ttl).await? {
            Ok(())
        } else {
            Err(ServiceError::CapabilityUnavailable {
                needs: names(added),
            })
        }
    }
}
