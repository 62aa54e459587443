//! The worker executor: Warden calls no one. Each step becomes a task on a
//! queue that workers (agents anywhere that can reach Warden) claim, keep
//! with heartbeats and complete with the same answer a webhook gives; the
//! step waits for that, woken by the task's changes, with a bounded poll as
//! a backstop. What to do next is decided by `policy::worker`.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::broadcast::error::TryRecvError;
use uuid::Uuid;

use super::webhook::{decided_action, external_step, request_for};
use super::{
    ApprovalDesk, ChildDesk, Executor, ExecutorError, Interruption, StepContext, StepResult,
    WebhookResponse,
};
use crate::policy::worker::{self, AttemptEnd, TaskFacts, TaskState, TaskVerdict, WorkerTaskState};
use crate::store::{
    NewWorkerTask, OfferedStep, OutcomeTicket, Store, StoreError, TaskEnd, TenantScope,
    WorkerChange, WorkerTaskSnapshot, wait_for_worker_change,
};

/// Longest a waiting step goes without reading its task (lost wake-ups,
/// pauses asked for while no worker holds it).
const POLL: Duration = Duration::from_secs(1);

/// The settings of a worker executor.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The queue its tasks go on.
    pub queue: String,
    /// Labels shown to workers.
    pub labels: std::collections::BTreeMap<String, String>,
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
    /// The run (the session's lease token) whose tasks these are.
    run: Uuid,
    /// The task of the step in flight, until the step settles it.
    open: Option<Uuid>,
    /// The session whose steps these are (known from the first step).
    session_id: Option<Uuid>,
    /// The iteration whose step this run collected without an approval
    /// request: the next step has no decision to read.
    asked_nothing_at: Option<u64>,
    /// The last iteration whose task this run opened and collected: the
    /// next iteration's open finds nothing left open (a steady open).
    collected_at: Option<u64>,
}

impl WorkerExecutor {
    /// An executor for the run `run` of a session of `tenant`, asking for
    /// approvals at `approvals`.
    pub fn new(
        store: Store,
        tenant: &str,
        settings: WorkerSettings,
        approvals: Arc<dyn ApprovalDesk>,
        children: Arc<dyn ChildDesk>,
        run: Uuid,
    ) -> WorkerExecutor {
        WorkerExecutor {
            store,
            scope: TenantScope::tenant_only(tenant),
            settings,
            approvals,
            children,
            run,
            open: None,
            session_id: None,
            asked_nothing_at: None,
            collected_at: None,
        }
    }

    /// Runs the step, and forgets its task once the step settled it (a
    /// step cut short leaves it open, for [`Executor::interrupted`]).
    async fn step(&mut self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        let result = self.wait_for_step(ctx).await;
        self.open = None;
        result
    }

    async fn wait_for_step(&mut self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        let failed = step_failed;
        let store_failed = |e: StoreError| failed(format!("worker queue unavailable: {e}"));
        // Subscribed before the task is opened: no change of it is missed,
        // and a completion on this replica hands its outcome over unread.
        let mut changes = self.store.worker_changes();
        let fresh = Uuid::new_v4();
        let mut outcome = Some(self.store.await_worker_outcome(fresh));
        let offered = self.open_task(&ctx, fresh).await?;
        let id = offered.id;
        if id != fresh {
            // A task a run before left, taken over.
            outcome = Some(self.store.await_worker_outcome(id));
        }
        self.open = Some(id);
        // A new task is first judged as opened, not read back; the change
        // its own offer told is no news to it (an outcome completed here
        // meanwhile is at the desk, anything else is found by the poll).
        let mut as_opened = offered.as_opened;
        if as_opened.is_some() {
            skip_queued(&mut changes);
        }
        loop {
            let now = match as_opened.take() {
                Some(now) => now,
                // Changes made while reading stay queued in `changes`: none is lost.
                None => self
                    .store
                    .worker_task_state(id, self.run, &self.scope)
                    .await
                    .map_err(store_failed)?
                    .ok_or_else(|| failed("the step's task disappeared".into()))?,
            };
            let wait = match self.settle_or_wait(id, now, &ctx).await? {
                Waited::Settled(result) => return result,
                Waited::Wait(wait) => wait,
            };
            let handed = wait_for_outcome(&mut outcome, &mut changes, id, wait).await;
            if let Some(value) = handed {
                self.open = None;
                return self.collect(Some(value), ctx.iteration).await;
            }
        }
    }

    /// Acts on the task as read `now`: how long to wait before the next
    /// read, or how the step settled.
    async fn settle_or_wait(
        &mut self,
        id: Uuid,
        now: WorkerTaskSnapshot,
        ctx: &StepContext<'_>,
    ) -> Result<Waited, ExecutorError> {
        let failed = step_failed;
        let store_failed = |e: StoreError| failed(format!("worker queue unavailable: {e}"));
        if now.taken_over {
            // A newer run holds the session; this one's writes are refused.
            return Err(failed("the session was taken over by another run".into()));
        }
        let facts = self.facts(&now);
        let last_error = |because| self.attempt_error(&now, facts.attempt, because);
        let settled = match worker::decide(&facts) {
            TaskVerdict::Wait { at_most_ms } => {
                return Ok(Waited::Wait(
                    Duration::from_millis(at_most_ms.saturating_add(1)).min(POLL),
                ));
            }
            TaskVerdict::Collect => {
                self.open = None;
                self.collect(now.outcome, ctx.iteration).await
            }
            TaskVerdict::Reoffer { because, .. } => {
                let error = last_error(because);
                tracing::info!(task = %id, %error, "worker task offered again");
                self.store
                    .reoffer_worker_task(id, self.run, now.attempt, &error, &self.scope)
                    .await
                    .map_err(store_failed)?;
                return Ok(Waited::Wait(Duration::ZERO));
            }
            TaskVerdict::Fail { because } => {
                let error = last_error(because);
                self.end(id, TaskEnd::AttemptsSpent)
                    .await
                    .map_err(store_failed)?;
                Err(failed(error))
            }
            TaskVerdict::NoWorker => {
                self.end(id, TaskEnd::NoWorker)
                    .await
                    .map_err(store_failed)?;
                Ok(StepResult::NoWorker {
                    detail: format!(
                        "no worker claimed step {} on queue {:?} within {} ms",
                        ctx.iteration,
                        self.settings.queue,
                        self.settings.worker_wait_timeout.as_millis()
                    ),
                })
            }
            TaskVerdict::Abandon => {
                self.end(id, TaskEnd::Paused).await.map_err(store_failed)?;
                Ok(StepResult::Abandoned)
            }
        };
        Ok(Waited::Settled(settled))
    }

    /// Why an attempt ended, for the task's `last_error`.
    fn attempt_error(&self, now: &WorkerTaskSnapshot, attempt: u32, because: AttemptEnd) -> String {
        match because {
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
        }
    }

    /// Reads the worker's completed outcome as the step's result.
    async fn collect(
        &mut self,
        outcome: Option<serde_json::Value>,
        iteration: u64,
    ) -> Result<StepResult, ExecutorError> {
        let answer: WebhookResponse = serde_json::from_value(outcome.unwrap_or_default())
            .map_err(|e| step_failed(format!("worker outcome is not a step outcome: {e}")))?;
        self.asked_nothing_at = answer.approval.is_none().then_some(iteration);
        self.collected_at = Some(iteration);
        external_step(
            self.approvals.as_ref(),
            self.children.as_ref(),
            iteration,
            answer,
        )
        .await
    }

    /// Offers the step as a task on the queue, or takes over this
    /// iteration's task a run before offered (see `open_worker_task`).
    async fn open_task(
        &mut self,
        ctx: &StepContext<'_>,
        fresh: Uuid,
    ) -> Result<OfferedStep, ExecutorError> {
        let mut request = request_for(ctx);
        // Only a step that asked for an approval has a decision to read.
        let previous_asked_nothing = self.asked_nothing_at.is_some()
            && self.asked_nothing_at == ctx.iteration.checked_sub(1);
        if !previous_asked_nothing {
            request.approval = decided_action(self.approvals.as_ref(), ctx.iteration).await?;
        }
        let context =
            serde_json::to_value(request).map_err(|e| step_failed(format!("step context: {e}")))?;
        self.session_id = Some(ctx.session_id);
        let steady = ctx
            .iteration
            .checked_sub(1)
            .is_some_and(|previous| self.collected_at == Some(previous));
        self.store
            .offer_worker_step(
                &NewWorkerTask {
                    id: fresh,
                    session_id: ctx.session_id,
                    queue: &self.settings.queue,
                    labels: &self.settings.labels,
                    iteration: ctx.iteration,
                    heartbeat_timeout_ms: self.settings.heartbeat_timeout.as_millis() as u64,
                    idempotency_key: &format!("{}:{}", ctx.session_id, ctx.iteration),
                    context: &context,
                    steady,
                },
                self.run,
                &self.scope,
            )
            .await
            .map_err(|e| step_failed(format!("worker queue unavailable: {e}")))
    }

    /// What the policy decides the task's fate from, as of the read `now`.
    fn facts(&self, now: &WorkerTaskSnapshot) -> TaskFacts {
        let ms = |t: chrono::DateTime<chrono::Utc>| (t - now.now).num_milliseconds();
        let state = match now.state {
            WorkerTaskState::Pending => TaskState::Pending,
            WorkerTaskState::Claimed => TaskState::Claimed {
                lease_left_ms: now.lease_expires_at.map_or(0, ms),
            },
            WorkerTaskState::Completed => TaskState::Completed,
            WorkerTaskState::Failed => TaskState::Failed {
                retryable: now.retryable,
            },
            WorkerTaskState::Cancelled => TaskState::Cancelled,
        };
        TaskFacts {
            state,
            attempt: u32::try_from(now.attempt).unwrap_or(u32::MAX),
            max_attempts: self.settings.max_attempts,
            offered_ms_ago: -ms(now.offered_at),
            worker_wait_timeout_ms: self.settings.worker_wait_timeout.as_millis() as u64,
            pause_requested: now.pause_requested,
        }
    }

    /// Ends the step's task (this run's only), settling the step.
    async fn end(&mut self, id: Uuid, end: TaskEnd) -> Result<(), StoreError> {
        self.open = None;
        self.store
            .end_worker_task(id, self.run, end, &self.scope)
            .await
    }
}

impl Executor for WorkerExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.step(ctx).boxed()
    }

    /// A stop or the time limit ends the task at once (its worker's next
    /// heartbeat says `stopped`, and the usage it reports then is charged;
    /// an outcome it completed but the step did not collect yet is not
    /// applied, its tokens charged); a drain leaves it with its worker, marked
    /// `draining`, for the run that takes the session over.
    fn interrupted(&mut self, why: Interruption) -> BoxFuture<'_, ()> {
        async move {
            let Some(id) = self.open.take() else {
                return;
            };
            let ended = match why {
                Interruption::Stopped => {
                    let ended = self
                        .store
                        .end_worker_task(id, self.run, TaskEnd::Stopped, &self.scope)
                        .await;
                    // A worker that completed the step just before the stop
                    // landed: the stop wins, the tokens it spent are charged.
                    match (ended, self.session_id) {
                        (Ok(()), Some(session)) => self
                            .store
                            .charge_uncollected_outcomes_of(session, &self.scope)
                            .await
                            .map(|_| ()),
                        (ended, _) => ended,
                    }
                }
                Interruption::Draining => {
                    self.store
                        .drain_worker_task(id, self.run, &self.scope)
                        .await
                }
            };
            if let Err(err) = ended {
                // The session's status still tells the worker (a stop), or
                // the next run takes the task over (a drain).
                tracing::warn!(task = %id, error = %err, ?why, "cannot mark an interrupted worker task");
            }
        }
        .boxed()
    }
}

/// A step the worker path could not carry out.
fn step_failed(message: String) -> ExecutorError {
    ExecutorError::Failed {
        action: "worker".into(),
        message,
        tokens: 0,
    }
}

/// What acting on a read of the step's task came to.
enum Waited {
    /// The step is over.
    Settled(Result<StepResult, ExecutorError>),
    /// Read again after at most this long (or a change of the task).
    Wait(Duration),
}

/// Waits up to `wait` for a change of task `id` (only its own wakes it) or
/// for its outcome completed on this replica, which it returns; the
/// outcome's place is given up once it answered.
async fn wait_for_outcome(
    outcome: &mut Option<OutcomeTicket>,
    changes: &mut tokio::sync::broadcast::Receiver<WorkerChange>,
    id: Uuid,
    wait: Duration,
) -> Option<serde_json::Value> {
    let changed = wait_for_worker_change(changes, wait, |c| c.concerns_task(id));
    let Some(ticket) = outcome.as_mut() else {
        changed.await;
        return None;
    };
    tokio::select! {
        // The outcome first: its completion's change is told just after.
        biased;
        handed = &mut ticket.outcome => {
            *outcome = None;
            handed.ok()
        }
        () = changed => None,
    }
}

/// Drops the changes queued in `changes` (at most a channel's worth, so a
/// busy channel never holds the step here).
fn skip_queued(changes: &mut tokio::sync::broadcast::Receiver<WorkerChange>) {
    for _ in 0..changes.len().min(4_096) {
        if matches!(
            changes.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {
            return;
        }
    }
}
