//! The worker protocol's use cases: claim a step (long-polling the queues),
//! heartbeat it, settle it (complete, fail, release), and list the queues.
//! Every call is scoped to the caller's tenant and, for a worker key, to
//! its queues; the HTTP routes only check input and shape the answers.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SessionService;
use crate::executor::WebhookRequest;
use crate::policy::worker::ClaimWants;
use crate::session::error::Result;
/// The worker a claim is for (its name and advertised labels).
pub use crate::store::Claimant;
use crate::store::{
    ClaimedWorkerTask, Handoff, Heartbeat, LeaseCheck, QueueDepth, Settlement, Store, StoreError,
    TenantScope, WorkerChange, WorkerSeen, wait_for_worker_change,
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
    /// Claims the oldest task on `queues` that `worker` has the labels of,
    /// waiting up to `wait` for one to be offered; `None` when none came. A
    /// waiting claim sits at this replica's desk, where a step offered here
    /// is handed to it at once; offers made elsewhere wake it to read the
    /// queue. A claim that found nothing records that the worker polled
    /// (for the queue listing).
    pub async fn claim(
        &self,
        scope: &TenantScope,
        queues: Option<&[String]>,
        worker: Claimant<'_>,
        wait: Duration,
    ) -> Result<Option<ClaimedStep>> {
        let mut changes = self.store.worker_changes();
        let deadline = Instant::now() + wait;
        let wants = ClaimWants {
            tenant: scope.tenant(),
            queues,
            labels: worker.labels,
        };
        // A claim like this one waiting here already was handed, or woken
        // for, any task this one could take: this one queues behind it
        // without reading the queue first (a read that would find nothing).
        let mut read_queue = wait.is_zero() || !self.store.claim_like_waits(&wants);
        loop {
            // Offers made while claiming stay queued in `changes`: none is lost.
            if read_queue
                && let Some(task) = self.store.claim_worker_task(scope, queues, worker).await?
            {
                return claimed_step(task).map(Some);
            }
            read_queue = true;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let within = left.min(CLAIM_POLL);
            if let Some(task) = self
                .offer_or_change(&mut changes, &wants, worker.name, within)
                .await
            {
                return claimed_step(task).map(Some);
            }
        }
        if let (Some(tenant), Some(queues)) = (scope.tenant(), queues) {
            self.store
                .worker_polled(tenant, queues, worker.name)
                .await?;
        }
        Ok(None)
    }

    /// Waits up to `within` at the desk: the task a step offered here hands
    /// over, or `None` on an offer elsewhere (or a lost relay), the end of
    /// the wait, or a hand-off that fell through (read the queue again).
    async fn offer_or_change(
        &self,
        changes: &mut tokio::sync::broadcast::Receiver<WorkerChange>,
        wants: &ClaimWants<'_>,
        worker: &str,
        within: Duration,
    ) -> Option<ClaimedWorkerTask> {
        // Only an offer (or a lost relay) wakes a waiting claim.
        let offered_elsewhere = wait_for_worker_change(changes, within, |c| c.concerns_claims());
        let Some(mut ticket) = self.store.wait_at_desk(wants, worker) else {
            offered_elsewhere.await;
            return None;
        };
        tokio::select! {
            handed = &mut ticket.handed => return handed_task(handed),
            () = offered_elsewhere => {}
        }
        if ticket.withdraw() {
            return None;
        }
        // A step took this claim just as the wait ended: its answer follows
        // the offer's commit.
        handed_task((&mut ticket.handed).await)
    }

    /// This replica's desk, for the metrics: claims waiting here, and
    /// steps handed to them since start.
    pub fn desk(&self) -> crate::metrics::DeskGauges {
        let (waiting, handed) = self.store.worker_desk_counts();
        crate::metrics::DeskGauges {
            claims_waiting: u64::try_from(waiting).unwrap_or(u64::MAX),
            steps_handed: handed,
        }
    }

    /// Extends the lease of `token` on task `id` and records its progress;
    /// tells the worker when to abandon the step. With a `wait`, answers
    /// as soon as there is news of the step (a stop, a pause, a drain, a
    /// lost lease), else once the wait ends (at most half the lease left
    /// after the first beat), extending the lease again then.
    pub async fn heartbeat(
        &self,
        id: Uuid,
        scope: &TenantScope,
        queues: Option<&[String]>,
        token: &str,
        progress: Option<&str>,
        wait: Duration,
    ) -> Result<LeaseCheck<Heartbeat>> {
        // Subscribed before the first beat: no change after it is missed.
        let mut changes = self.store.worker_changes();
        let mut deadline = Instant::now() + wait;
        loop {
            let beat = self
                .store
                .heartbeat_worker_task(id, scope, queues, token, progress)
                .await?;
            let LeaseCheck::Held(Heartbeat {
                cancel: None,
                lease_expires_at: Some(lease),
                ..
            }) = &beat
            else {
                return Ok(beat);
            };
            if wait.is_zero() || Instant::now() >= deadline {
                return Ok(beat);
            }
            // The lease must outlast the wait by as long again.
            let lease_left = (*lease - chrono::Utc::now()).to_std().unwrap_or_default();
            deadline = deadline.min(Instant::now() + lease_left / 2);
            let left = deadline.saturating_duration_since(Instant::now());
            wait_for_worker_change(&mut changes, left, |c| c.concerns_task(id)).await;
        }
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

/// The task a desk hand-off brought, if it brought one.
fn handed_task(
    handed: std::result::Result<Handoff, tokio::sync::oneshot::error::RecvError>,
) -> Option<ClaimedWorkerTask> {
    match handed {
        Ok(Handoff::Claimed(task)) => Some(*task),
        Ok(Handoff::Retry) | Err(_) => None,
    }
}

/// A claimed task with its step's context decoded.
fn claimed_step(mut task: ClaimedWorkerTask) -> Result<ClaimedStep> {
    let raw = std::mem::take(&mut task.context);
    let context: WebhookRequest = serde_json::from_value(raw).map_err(|e| StoreError::Corrupt {
        id: task.session_id,
        detail: format!("worker task context: {e}"),
    })?;
    Ok(ClaimedStep { task, context })
}
