//! The worker protocol's use cases: claim a step (long-polling the queues),
//! heartbeat it, settle it (complete, fail, release), and list the queues.
//! Every call is scoped to the caller's tenant and, for a worker key, to
//! its queues; the HTTP routes only check input and shape the answers.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SessionService;
use crate::executor::WebhookRequest;
use crate::session::error::Result;
/// The worker a claim is for (its name and advertised labels).
pub use crate::store::Claimant;
use crate::store::{
    ClaimedWorkerTask, Heartbeat, LeaseCheck, QueueDepth, Settlement, Store, StoreError,
    TenantScope, WorkerSeen, wait_for_worker_change,
};

/// A waiting claim reads the queue at least this often (lost wake-ups).
const CLAIM_POLL: Duration = Duration::from_secs(1);

/// The worker protocol over the service's store.
#[derive(Debug, Clone, Copy)]
pub struct WorkerProtocol<'a> {
    store: &'a Store,
}

/// A claimed task with its step's context decoded.
#[derive(Debug, Clone)]
pub struct ClaimedStep {
    /// The task (its `context` taken out into [`ClaimedStep::context`]).
    pub task: ClaimedWorkerTask,
    /// The step's context: exactly what a webhook agent is sent.
    pub context: WebhookRequest,
}

impl SessionService {
    /// The worker protocol's use cases.
    pub fn workers(&self) -> WorkerProtocol<'_> {
        WorkerProtocol {
            store: self.store(),
        }
    }
}

impl WorkerProtocol<'_> {
    /// Claims the oldest task on `queues` that `worker` has the labels of, waiting up to `wait`
    /// for one to be offered; `None` when none came. A claim that found
    /// nothing records that the worker polled (for the queue listing).
    pub async fn claim(
        &self,
        scope: &TenantScope,
        queues: Option<&[String]>,
        worker: Claimant<'_>,
        wait: Duration,
    ) -> Result<Option<ClaimedStep>> {
        let mut changes = self.store.worker_changes();
        let deadline = Instant::now() + wait;
        loop {
            // Offers made while claiming stay queued in `changes`: none is lost.
            if let Some(mut task) = self.store.claim_worker_task(scope, queues, worker).await? {
                let raw = std::mem::take(&mut task.context);
                let context: WebhookRequest =
                    serde_json::from_value(raw).map_err(|e| StoreError::Corrupt {
                        id: task.session_id,
                        detail: format!("worker task context: {e}"),
                    })?;
                return Ok(Some(ClaimedStep { task, context }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // Only an offer (or a lost relay) wakes a waiting claim.
            wait_for_worker_change(&mut changes, left.min(CLAIM_POLL), |c| c.concerns_claims())
                .await;
        }
        if let (Some(tenant), Some(queues)) = (scope.tenant(), queues) {
            self.store
                .worker_polled(tenant, queues, worker.name)
                .await?;
        }
        Ok(None)
    }

    /// Extends the lease of `token` on task `id` and records its progress;
    /// tells the worker when to abandon the step.
    pub async fn heartbeat(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        progress: Option<&str>,
    ) -> Result<LeaseCheck<Heartbeat>> {
        Ok(self
            .store
            .heartbeat_worker_task(id, scope, queues, token, progress)
            .await?)
    }

    /// Ends the lease of `token` on task `id`: completed, failed or released.
    pub async fn settle(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        settlement: Settlement<'_>,
    ) -> Result<LeaseCheck<()>> {
        Ok(self
            .store
            .settle_worker_task(id, scope, queues, token, settlement)
            .await?)
    }

    /// The depth of the scope's queues (of `queues` only, when given) and
    /// the workers seen on them within `seen_within`.
    pub async fn queues(
        &self,
        scope: &TenantScope,
        queues: Option<&[String]>,
        seen_within: Duration,
    ) -> Result<(Vec<QueueDepth>, Vec<WorkerSeen>)> {
        Ok(self.store.worker_queues(scope, queues, seen_within).await?)
    }
}
