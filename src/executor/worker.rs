//! The worker executor: Warden calls no one. Each step becomes a task on a
//! queue that workers (agents anywhere that can reach Warden) claim, keep
//! with heartbeats and complete with the same answer a webhook gives; the
//! step waits for that, woken by the task's changes, with a bounded poll as
//! a backstop. What to do next is decided by `policy::worker`.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use uuid::Uuid;

use super::webhook::{decided_action, external_step, request_for};
use super::{
    ApprovalDesk, ChildDesk, Executor, ExecutorError, StepContext, StepResult, WebhookResponse,
};
use crate::policy::worker::{self, AttemptEnd, TaskFacts, TaskState, TaskVerdict};
use crate::store::{NewWorkerTask, Store, StoreError, TenantScope, wait_for_worker_change};

/// Longest a waiting step goes without reading its task (lost wake-ups,
/// pauses asked for while no worker holds it).
const POLL: Duration = Duration::from_secs(1);

/// The settings of a worker executor.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The queue its tasks go on.
    pub queue: String,
    /// Labels shown to workers.
    pub labels: serde_json::Value,
    /// Lease length: a worker that does not heartbeat within it loses the task.
    pub heartbeat_timeout: Duration,
    /// Attempts a step gets.
    pub max_attempts: u32,
    /// How long a task may wait for a claim before the session pauses.
    pub worker_wait_timeout: Duration,
}

/// Offers each step to workers and waits for its outcome.
pub struct WorkerExecutor {
    store: Store,
    scope: TenantScope,
    settings: WorkerSettings,
    approvals: Arc<dyn ApprovalDesk>,
    /// Where the worker's tasks are delegated to children.
    children: Arc<dyn ChildDesk>,
}

impl WorkerExecutor {
    /// An executor for a session of `tenant`, asking for approvals at `approvals`.
    pub fn new(
        store: Store,
        tenant: &str,
        settings: WorkerSettings,
        approvals: Arc<dyn ApprovalDesk>,
        children: Arc<dyn ChildDesk>,
    ) -> WorkerExecutor {
        WorkerExecutor {
            store,
            scope: TenantScope::tenant_only(tenant),
            settings,
            approvals,
            children,
        }
    }

    async fn step(&self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        let failed = |message: String| ExecutorError::Failed {
            action: "worker".into(),
            message,
            tokens: 0,
        };
        let store_failed = |e: StoreError| failed(format!("worker queue unavailable: {e}"));
        let mut request = request_for(&ctx);
        request.approval = decided_action(self.approvals.as_ref(), ctx.iteration).await?;
        let context =
            serde_json::to_value(request).map_err(|e| failed(format!("step context: {e}")))?;
        let mut changes = self.store.worker_changes();
        let task = OpenTask {
            store: self.store.clone(),
            scope: self.scope.clone(),
            id: Uuid::new_v4(),
            settled: false,
        };
        let mut task = task;
        self.store
            .offer_worker_task(
                &NewWorkerTask {
                    id: task.id,
                    session_id: ctx.session_id,
                    queue: &self.settings.queue,
                    labels: &self.settings.labels,
                    iteration: ctx.iteration,
                    heartbeat_timeout_ms: self.settings.heartbeat_timeout.as_millis() as u64,
                    idempotency_key: &format!("{}:{}", ctx.session_id, ctx.iteration),
                    context: &context,
                },
                &self.scope,
            )
            .await
            .map_err(store_failed)?;
        loop {
            // Changes made while reading stay queued in `changes`: none is lost.
            let Some(now) = self
                .store
                .worker_task_state(task.id, &self.scope)
                .await
                .map_err(store_failed)?
            else {
                return Err(failed("the step's task disappeared".into()));
            };
            let ms = |t: chrono::DateTime<chrono::Utc>| (t - now.now).num_milliseconds();
            let state = match now.state.as_str() {
                "pending" => TaskState::Pending,
                "claimed" => TaskState::Claimed {
                    lease_left_ms: now.lease_expires_at.map_or(0, ms),
                },
                "completed" => TaskState::Completed,
                "failed" => TaskState::Failed {
                    retryable: now.retryable,
                },
                _ => TaskState::Cancelled,
            };
            let attempt = u32::try_from(now.attempt).unwrap_or(u32::MAX);
            let verdict = worker::decide(&TaskFacts {
                state,
                attempt,
                max_attempts: self.settings.max_attempts,
                offered_ms_ago: -ms(now.offered_at),
                worker_wait_timeout_ms: self.settings.worker_wait_timeout.as_millis() as u64,
                pause_requested: now.pause_requested,
            });
            let last_error = |because: AttemptEnd| match because {
                AttemptEnd::LeaseLapsed => format!(
                    "attempt {attempt}: no heartbeat within {} ms",
                    self.settings.heartbeat_timeout.as_millis()
                ),
                AttemptEnd::Failed => format!(
                    "attempt {attempt}: {}",
                    now.last_error
                        .as_deref()
                        .unwrap_or("the worker reported a failure")
                ),
            };
            match verdict {
                TaskVerdict::Wait { at_most_ms } => {
                    let wait = Duration::from_millis(at_most_ms.saturating_add(1)).min(POLL);
                    // Only a change of this task wakes it (or a lost relay).
                    wait_for_worker_change(&mut changes, wait, |c| c.concerns_task(task.id)).await;
                }
                TaskVerdict::Collect => {
                    task.settled = true;
                    let answer: WebhookResponse =
                        serde_json::from_value(now.outcome.unwrap_or_default()).map_err(|e| {
                            failed(format!("worker outcome is not a step outcome: {e}"))
                        })?;
                    return external_step(
                        self.approvals.as_ref(),
                        self.children.as_ref(),
                        ctx.iteration,
                        answer,
                    )
                    .await;
                }
                TaskVerdict::Reoffer { because, .. } => {
                    let error = last_error(because);
                    tracing::info!(task = %task.id, %error, "worker task offered again");
                    self.store
                        .reoffer_worker_task(task.id, now.attempt, &error, &self.scope)
                        .await
                        .map_err(store_failed)?;
                }
                TaskVerdict::Fail { because } => {
                    let error = last_error(because);
                    self.store
                        .end_worker_task(task.id, "failed", "attempts spent", &self.scope)
                        .await
                        .map_err(store_failed)?;
                    task.settled = true;
                    return Err(failed(error));
                }
                TaskVerdict::NoWorker => {
                    self.store
                        .end_worker_task(task.id, "cancelled", "no_worker", &self.scope)
                        .await
                        .map_err(store_failed)?;
                    task.settled = true;
                    return Ok(StepResult::NoWorker {
                        detail: format!(
                            "no worker claimed step {} on queue {:?} within {} ms",
                            ctx.iteration,
                            self.settings.queue,
                            self.settings.worker_wait_timeout.as_millis()
                        ),
                    });
                }
                TaskVerdict::Abandon => {
                    self.store
                        .end_worker_task(task.id, "cancelled", "paused", &self.scope)
                        .await
                        .map_err(store_failed)?;
                    task.settled = true;
                    return Ok(StepResult::Abandoned);
                }
            }
        }
    }
}

impl Executor for WorkerExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.step(ctx).boxed()
    }
}

/// A task the step offered: dropped unsettled (the step was cancelled by a
/// stop, a shutdown or the time limit), it is cancelled so no worker goes on
/// with it and a heartbeat answers `cancel`.
struct OpenTask {
    store: Store,
    scope: TenantScope,
    id: Uuid,
    settled: bool,
}

impl Drop for OpenTask {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, scope, id) = (self.store.clone(), self.scope.clone(), self.id);
        runtime.spawn(async move {
            if let Err(err) = store
                .end_worker_task(id, "cancelled", "stopped", &scope)
                .await
            {
                // The session's status still refuses the worker's completion.
                tracing::warn!(task = %id, error = %err, "cannot cancel an abandoned worker task");
            }
        });
    }
}
