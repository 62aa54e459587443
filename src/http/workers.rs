//! `/api/workers`: the worker protocol. Agents that Warden cannot reach call
//! in with a worker key, long-poll a queue for a step, heartbeat while they
//! work (and learn there that the session was stopped or paused), and report
//! the outcome. The contract is docs/reference/worker-protocol.md.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::admission::RequestSlot;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, TaskId};
use crate::auth::{Principal, Role};
use crate::executor::{WebhookRequest, WebhookResponse};
use crate::session::workers::Claimant;
use crate::session::{ClaimedStep, LeaseCheck, Settlement};

/// Longest wait of a heartbeat, ms.
pub const MAX_HEARTBEAT_WAIT_MS: u64 = 30_000;
/// Default wait of a claim, ms.
pub const DEFAULT_CLAIM_WAIT_MS: u64 = 30_000;
/// Longest wait of a claim, ms.
pub const MAX_CLAIM_WAIT_MS: u64 = 60_000;
/// Longest worker name.
pub const MAX_WORKER_CHARS: usize = 200;
/// Longest progress text of a heartbeat, characters.
pub const MAX_PROGRESS_CHARS: usize = 4_096;
/// Longest error text of a failed attempt, characters.
pub const MAX_ERROR_CHARS: usize = 16_384;
/// A worker name: no control characters (what `char::is_control` refuses).
pub const WORKER_NAME_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";
/// Workers seen within this long count as connected in the queue listing.
const SEEN_WITHIN: Duration = Duration::from_secs(120);

/// The worker routes, relative to `/api/workers`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/claim", post(claim))
        .route("/tasks/{task_id}/heartbeat", post(heartbeat))
        .route("/tasks/{task_id}/complete", post(complete))
        .route("/tasks/{task_id}/fail", post(fail))
        .route("/tasks/{task_id}/release", post(release))
        .route("/queues", get(queues))
}

/// A request for the next task.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Queues to take from (default: every queue of the key); each must be one of the key's.
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    /// Longest wait for a task in ms (default 30000, at most 60000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// The worker's own name, shown in the queue listing (at most 200 characters).
    #[serde(default)]
    pub worker: Option<String>,
    /// The labels this worker has (at most 32; names of 1 to 64 characters,
    /// values of at most 256): it is offered only tasks whose session's
    /// `executor.labels` it has every one of, with the same value. A worker
    /// that sends none takes only tasks without labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A claimed task: a step to perform under a lease.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClaimedTask {
    /// Task id.
    pub task_id: Uuid,
    /// The lease token: send it with every call on the task; shown only here.
    pub lease_token: String,
    /// When the lease lapses without a heartbeat.
    pub lease_expires_at: DateTime<Utc>,
    /// Lease length: heartbeat well within it.
    pub heartbeat_timeout_ms: u64,
    /// Session of the step.
    pub session_id: Uuid,
    /// Queue.
    pub queue: String,
    /// The executor's labels.
    pub labels: BTreeMap<String, String>,
    /// Iteration of the step.
    pub iteration: u64,
    /// Attempt (1-based): counts lapsed leases and failed attempts.
    pub attempt: u32,
    /// The same for every attempt of this iteration.
    pub idempotency_key: String,
    /// The step's context: exactly what a webhook agent is sent.
    pub context: WebhookRequest,
}

/// A heartbeat.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// Progress text (at most 4,096 characters).
    #[serde(default)]
    pub progress: Option<String>,
    /// Longest wait for news of the step in ms (default 0: answer at once;
    /// at most 30000, and at most half the lease): the heartbeat answers as
    /// soon as the session is stopped or paused, its replica drains or the
    /// lease is lost, else when the wait ends, the lease extended then. A
    /// heartbeat that waits holds a place among the parked claims.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    /// Abandon the step: the session is being stopped or paused, the step
    /// was offered again, or this lease lapsed (see `reason`).
    pub cancel: bool,
    /// With `cancel`: `stopped`, `paused`, `superseded` or `lease_lost`
    /// (abandon the step); without: `draining` (the session's replica shuts
    /// down: finish and complete, the next one collects the outcome) or null.
    pub reason: Option<String>,
    /// The lease's new end (none when cancelled).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Tokens the step may still use.
    pub token_allowance: u64,
}

/// A step's outcome.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// The outcome: exactly a webhook agent's answer.
    pub outcome: WebhookResponse,
}

/// A failed attempt.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// What went wrong (at most 16,384 characters).
    pub error: String,
    /// Whether another attempt may succeed (default true): the task is
    /// offered again while attempts remain; `false` fails the step at once.
    #[serde(default = "yes")]
    pub retryable: bool,
    /// Tokens the attempt spent. Charged to the session when the step was
    /// given up before this call (a cancel), at most the step's allowance.
    #[serde(default)]
    pub tokens: u64,
}

fn yes() -> bool {
    true
}

/// A task given back.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The task's lease token.
    pub lease_token: String,
    /// Tokens the worker spent on the task. Charged to the session when
    /// the step was given up before this call (a cancel), at most the
    /// step's allowance.
    #[serde(default)]
    pub tokens: u64,
}

/// A call on a task was taken.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Accepted {
    /// Always true.
    pub accepted: bool,
}

/// The queues of the caller's tenant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueueList {
    /// Queues with waiting tasks or workers seen in the last two minutes.
    pub queues: Vec<QueueView>,
}

/// One queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueueView {
    /// Tenant (shown to a global admin only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Queue name.
    pub queue: String,
    /// Tasks waiting for a worker.
    pub depth: u64,
    /// Age of the oldest waiting task, ms.
    pub oldest_task_age_ms: Option<u64>,
    /// Workers seen recently.
    pub workers: Vec<WorkerView>,
}

/// A worker seen on a queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkerView {
    /// Its name.
    pub worker: String,
    /// Its last claim or heartbeat.
    pub last_seen_at: DateTime<Utc>,
    /// The task it holds.
    pub task_id: Option<Uuid>,
}

/// The queues a claim or task call may reach: a worker key's own (those
/// asked for must be among them); every queue when authentication is off.
fn queues_of(caller: &Principal, asked: Option<Vec<String>>) -> ApiResult<Option<Vec<String>>> {
    if caller.role != Role::Worker {
        return Ok(asked);
    }
    match asked {
        None => Ok(Some(caller.queues.clone())),
        Some(asked) => {
            if let Some(other) = asked.iter().find(|q| !caller.queues.contains(q)) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!("this worker key may not claim from queue {other:?}"),
                ));
            }
            Ok(Some(asked))
        }
    }
}

fn task_not_found(id: Uuid) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "task_not_found",
        format!("no task {id} on this key's queues"),
    )
}

fn lease_lost() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "lease_lost",
        "this lease token no longer holds the task (its lease lapsed, it was offered again, or the session was stopped); the call was discarded",
    )
}

/// A call after the step was given up: refused, its usage charged.
fn charged(tokens: u64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "lease_lost",
        format!(
            "the step was given up (stopped, paused, superseded or its lease lapsed): the call was not taken, but the {tokens} tokens it reported were charged to the session"
        ),
    )
}

fn settled<T>(id: Uuid, check: LeaseCheck<T>) -> ApiResult<T> {
    match check {
        LeaseCheck::NotFound => Err(task_not_found(id)),
        LeaseCheck::Lost => Err(lease_lost()),
        LeaseCheck::Charged(tokens) => Err(charged(tokens)),
        LeaseCheck::Held(value) => Ok(value),
    }
}

/// Claim the next task (worker keys): long-polls up to `wait_ms` for the
/// oldest task on the queues; two workers never get the same task. A claim
/// that may wait (`wait_ms` above 0) holds a place among the parked claims,
/// capped per key, per tenant and per replica, and no request slot.
#[utoipa::path(
    post, path = "/api/workers/claim", tag = "workers",
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "A task, leased to the caller", body = ClaimedTask),
        (status = 204, description = "No task arrived within `wait_ms`"),
        (status = 403, description = "Not a worker key, or a queue that is not the key's", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid `wait_ms`, `worker` or queue", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The key has WARDEN_KEY_MAX_PARKED_CLAIMS claims waiting, or its tenant WARDEN_TENANT_MAX_PARKED_CLAIMS (`claim_limit`), or the tenant's share of the request slots is taken (`tenant_request_limit`); retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before claiming again"))),
        (status = 503, description = "WARDEN_MAX_PARKED_CLAIMS claims are waiting on this replica or its request slots are taken (`overloaded`), Postgres does not answer, or the service is shutting down; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before claiming again"))),
    )
)]
pub async fn claim(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    slot: Option<Extension<RequestSlot>>,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> ApiResult<Response> {
    let invalid =
        |detail: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail);
    let wait_ms = req.wait_ms.unwrap_or(DEFAULT_CLAIM_WAIT_MS);
    if wait_ms > MAX_CLAIM_WAIT_MS {
        return Err(invalid(format!(
            "wait_ms must be at most {MAX_CLAIM_WAIT_MS}"
        )));
    }
    let worker = req.worker.unwrap_or_else(|| caller.actor.clone());
    if worker.chars().count() > MAX_WORKER_CHARS || worker.chars().any(char::is_control) {
        return Err(invalid(format!(
            "worker must be at most {MAX_WORKER_CHARS} characters, none of them control characters"
        )));
    }
    if let Some(bad) = req
        .queues
        .iter()
        .flatten()
        .find(|q| !crate::policy::worker::valid_queue(q))
    {
        return Err(invalid(format!("queue {bad:?} is not a queue name")));
    }
    crate::executor::validate_labels("labels", &req.labels).map_err(invalid)?;
    let queues = queues_of(&caller, req.queues)?;
    // Held until the claim answers; a claim that cannot wait parks nowhere.
    let _parked = match slot {
        _ if wait_ms == 0 => None,
        Some(Extension(slot)) => Some(slot.park(&caller)?),
        None => {
            return Err(ApiError::internal(
                &"a claim reached its handler without the request limits",
            ));
        }
    };
    let claimed = state
        .service
        .workers()
        .claim(
            &caller.scope,
            queues.as_deref(),
            Claimant {
                name: &worker,
                labels: &req.labels,
            },
            Duration::from_millis(wait_ms),
        )
        .await?;
    let Some(ClaimedStep { task, context }) = claimed else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let answer = ClaimedTask {
        task_id: task.id,
        lease_token: task.lease_token,
        lease_expires_at: task.lease_expires_at,
        heartbeat_timeout_ms: u64::try_from(task.heartbeat_timeout_ms).unwrap_or(0),
        session_id: task.session_id,
        queue: task.queue,
        labels: task.labels,
        iteration: u64::try_from(task.iteration).unwrap_or(0),
        attempt: u32::try_from(task.attempt).unwrap_or(0),
        idempotency_key: task.idempotency_key,
        context,
    };
    Ok(Json(answer).into_response())
}

/// Heartbeat a task (worker keys): extends the lease; answers `cancel:
/// true` as soon as the session is stopped or paused. With `wait_ms`, it
/// waits for such news (or a drain) up to that long before answering.
#[utoipa::path(
    post, path = "/api/workers/tasks/{task_id}/heartbeat", tag = "workers",
    params(("task_id" = Uuid, Path, description = "Task id")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "Lease extended, or the step is to be abandoned (`cancel`)", body = HeartbeatAnswer),
        (status = 404, description = "No such task on this key's queues", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The lease is no longer this token's", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Progress text too long, or `wait_ms` above 30000", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The key or its tenant has as many claims and waiting heartbeats parked as it may; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before heartbeating again"))),
        (status = 503, description = "WARDEN_MAX_PARKED_CLAIMS claims and heartbeats are waiting on this replica; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before heartbeating again"))),
    )
)]
pub async fn heartbeat(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    slot: Option<Extension<RequestSlot>>,
    TaskId(id): TaskId,
    ApiJson(req): ApiJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatAnswer>> {
    let invalid =
        |detail: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail);
    if req
        .progress
        .as_ref()
        .is_some_and(|p| p.chars().count() > MAX_PROGRESS_CHARS)
    {
        return Err(invalid(format!(
            "progress must be at most {MAX_PROGRESS_CHARS} characters"
        )));
    }
    let wait_ms = req.wait_ms.unwrap_or(0);
    if wait_ms > MAX_HEARTBEAT_WAIT_MS {
        return Err(invalid(format!(
            "wait_ms must be at most {MAX_HEARTBEAT_WAIT_MS}"
        )));
    }
    let queues = queues_of(&caller, None)?;
    // Held until the heartbeat answers, as a waiting claim's.
    let _parked = match slot {
        _ if wait_ms == 0 => None,
        Some(Extension(slot)) => Some(slot.park(&caller)?),
        None => {
            return Err(ApiError::internal(
                &"a heartbeat reached its handler without the request limits",
            ));
        }
    };
    let beat = state
        .service
        .workers()
        .heartbeat(
            id,
            &caller.scope,
            queues.as_deref(),
            &req.lease_token,
            req.progress.as_deref(),
            Duration::from_millis(wait_ms),
        )
        .await?;
    let beat = settled(id, beat)?;
    Ok(Json(HeartbeatAnswer {
        cancel: beat.cancel.is_some_and(|r| r.abandon()),
        reason: beat.cancel.map(|r| r.as_str().to_string()),
        lease_expires_at: beat.lease_expires_at,
        token_allowance: beat.token_allowance,
    }))
}

async fn settle(
    state: &AppState,
    caller: &Principal,
    id: Uuid,
    token: &str,
    settlement: Settlement<'_>,
) -> ApiResult<Json<Accepted>> {
    let queues = queues_of(caller, None)?;
    let check = state
        .service
        .workers()
        .settle(id, &caller.scope, queues.as_deref(), token, settlement)
        .await?;
    settled(id, check)?;
    Ok(Json(Accepted { accepted: true }))
}

/// Complete a task (worker keys) with the step's outcome, the webhook
/// answer's shape. The same token completing again is accepted and changes
/// nothing; a completion after the lease was lost is refused and discarded.
#[utoipa::path(
    post, path = "/api/workers/tasks/{task_id}/complete", tag = "workers",
    params(("task_id" = Uuid, Path, description = "Task id")),
    request_body = CompleteRequest,
    responses(
        (status = 200, description = "Outcome taken", body = Accepted),
        (status = 404, description = "No such task on this key's queues", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The lease was lost; the outcome was discarded (after a cancel, the outcome's `tokens` were charged to the session)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn complete(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    TaskId(id): TaskId,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> ApiResult<Json<Accepted>> {
    let outcome = serde_json::to_value(&req.outcome)
        .map_err(|e| ApiError::bad_request(format!("outcome: {e}")))?;
    settle(
        &state,
        &caller,
        id,
        &req.lease_token,
        Settlement::Complete(&outcome),
    )
    .await
}

/// Fail an attempt (worker keys): offered again while attempts remain and
/// `retryable`, else the step fails like any executor error.
#[utoipa::path(
    post, path = "/api/workers/tasks/{task_id}/fail", tag = "workers",
    params(("task_id" = Uuid, Path, description = "Task id")),
    request_body = FailRequest,
    responses(
        (status = 200, description = "Failure taken", body = Accepted),
        (status = 404, description = "No such task on this key's queues", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The lease was lost (after a cancel, the `tokens` reported were charged to the session)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Error text too long", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn fail(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    TaskId(id): TaskId,
    ApiJson(req): ApiJson<FailRequest>,
) -> ApiResult<Json<Accepted>> {
    if req.error.chars().count() > MAX_ERROR_CHARS {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("error must be at most {MAX_ERROR_CHARS} characters"),
        ));
    }
    settle(
        &state,
        &caller,
        id,
        &req.lease_token,
        Settlement::Fail {
            error: &req.error,
            retryable: req.retryable,
            tokens: req.tokens,
        },
    )
    .await
}

/// Release a task (worker keys): gives it back without counting an attempt.
#[utoipa::path(
    post, path = "/api/workers/tasks/{task_id}/release", tag = "workers",
    params(("task_id" = Uuid, Path, description = "Task id")),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "Task offered again", body = Accepted),
        (status = 404, description = "No such task on this key's queues", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The lease was lost (after a cancel, the `tokens` reported were charged to the session)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn release(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    TaskId(id): TaskId,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> ApiResult<Json<Accepted>> {
    settle(
        &state,
        &caller,
        id,
        &req.lease_token,
        Settlement::Release { tokens: req.tokens },
    )
    .await
}

/// The caller's queues: depth, oldest waiting task and workers seen.
#[utoipa::path(
    get, path = "/api/workers/queues", tag = "workers",
    responses((status = 200, description = "Queues of the caller's tenant (every tenant's for a global admin)", body = QueueList))
)]
pub async fn queues(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<QueueList>> {
    let queues = queues_of(&caller, None)?;
    let (depths, workers) = state
        .service
        .workers()
        .queues(&caller.scope, queues.as_deref(), SEEN_WITHIN)
        .await?;
    let mut by_queue: BTreeMap<(String, String), QueueView> = BTreeMap::new();
    let show_tenant = caller.scope.tenant().is_none();
    let entry =
        |tenant: &str, queue: &str| -> (String, String) { (tenant.to_string(), queue.to_string()) };
    for d in depths {
        let key = entry(&d.tenant, &d.queue);
        by_queue.insert(
            key,
            QueueView {
                tenant: show_tenant.then(|| d.tenant.clone()),
                queue: d.queue,
                depth: u64::try_from(d.depth).unwrap_or(0),
                oldest_task_age_ms: d.oldest_task_age_ms.map(|a| u64::try_from(a).unwrap_or(0)),
                workers: Vec::new(),
            },
        );
    }
    for w in workers {
        let key = entry(&w.tenant, &w.queue);
        by_queue
            .entry(key)
            .or_insert_with(|| QueueView {
                tenant: show_tenant.then(|| w.tenant.clone()),
                queue: w.queue.clone(),
                depth: 0,
                oldest_task_age_ms: None,
                workers: Vec::new(),
            })
            .workers
            .push(WorkerView {
                worker: w.worker,
                last_seen_at: w.last_seen_at,
                task_id: w.task_id,
            });
    }
    Ok(Json(QueueList {
        queues: by_queue.into_values().collect(),
    }))
}
