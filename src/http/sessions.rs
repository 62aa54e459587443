//! `/api/autonomous`: create, list, inspect, stop, pause, resume, refine,
//! update and delete sessions, and follow their changes (their history is
//! `http::history`).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::event_stream;
use super::extract::{ApiJson, ApiQuery, DigestedJson, OptionalJson, SessionId};
use super::paging::{MAX_LIST_LIMIT, next_after, page_limit};
use super::views::{
    CountsQuery, ExecutorKind, ListQuery, MAX_GOAL_FILTER_CHARS, OutcomeMetrics, SessionCounts,
    SessionPage, SessionView, SortKey, SortOrder, VelocityPoint,
};
use crate::auth::Principal;
use crate::policy::lifecycle::{Mode, Status};
use crate::session::estimate::EstimateAnswer;
use crate::session::service::{Created, IdempotencyKey, StatusSource, StopAnswer};
use crate::session::{CreateSession, RefinementChoice, ResumeSession, UpdateSession};
use crate::session::{SessionCursor, SessionFilter, SessionOrder, SessionSortKey};

/// The session routes, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", post(create_session).get(list_sessions))
        .route("/counts", get(count_sessions))
        .route(
            "/{id}",
            get(get_session)
                .patch(update_session)
                .delete(delete_session),
        )
        .route("/{id}/stop", post(stop_session))
        .route("/{id}/pause", post(pause_session))
        .route("/{id}/resume", post(resume_session))
        .route("/{id}/refinement", post(refine_session))
        .route("/{id}/confirm", post(confirm_session))
        .route("/outcomes", get(outcomes))
        .route("/events", get(session_changes))
}

/// The status document of a session, priced.
pub(super) fn view(state: &AppState, session: crate::session::Session) -> SessionView {
    let step = state.service.step_in_flight(session.id);
    SessionView::from(session).with_step(step, Utc::now())
}

/// A cursor as the list gives it: `<position>_<id>`, the position being
/// the creation or update time in microseconds, or the cost in the order
/// by cost (one shape, so the documented pattern covers both).
fn encode_cursor(c: &SessionCursor, key: SessionSortKey) -> String {
    match key {
        SessionSortKey::Cost => format!("{}_{}", c.cost.normalize(), c.id),
        _ => format!("{}_{}", c.at.timestamp_micros(), c.id),
    }
}

/// A cursor's position: up to 18 digits, then up to 16 decimal places
/// (a cost's most), kept to Decimal's 28 significant digits.
fn cursor_position(text: &str) -> Option<Decimal> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 18
        || fraction.len() > 16
        || (text.contains('.') && fraction.is_empty())
        || !digits(whole)
        || !digits(fraction)
    {
        return None;
    }
    let kept = fraction.len().min(28 - whole.len());
    let text = match kept {
        0 => whole.to_string(),
        _ => format!("{whole}.{}", &fraction[..kept]),
    };
    text.parse().ok()
}

/// A filter's amount of money: not negative, at most 12 places.
fn check_amount(usd: Decimal) -> ApiResult<Decimal> {
    if usd.is_sign_negative() || usd.scale() > 12 {
        return Err(ApiError::bad_request(format!(
            "min_cost_usd {usd} is not an amount of USD (0 or more, at most 12 decimal places)"
        )));
    }
    Ok(usd)
}

fn decode_cursor(raw: &str, key: SessionSortKey) -> ApiResult<SessionCursor> {
    let raw = raw.trim();
    let invalid = || ApiError::bad_request(format!("cursor {raw:?} is not a cursor from this API"));
    let (position, id) = raw.split_once('_').ok_or_else(invalid)?;
    let position = cursor_position(position).ok_or_else(invalid)?;
    let id: Uuid = id.parse().map_err(|_| invalid())?;
    if key == SessionSortKey::Cost {
        // The time only says there is a cursor; the order by cost reads its cost.
        return Ok(SessionCursor {
            at: DateTime::<Utc>::UNIX_EPOCH,
            id,
            cost: position,
        });
    }
    let micros =
        rust_decimal::prelude::ToPrimitive::to_i64(&position.trunc()).ok_or_else(invalid)?;
    // Before the epoch no session was created; far ones are outside Postgres' range.
    if !(0..=999_999_999_999_999_999).contains(&micros) {
        return Err(invalid());
    }
    let at = DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(invalid)?;
    Ok(SessionCursor {
        at,
        id,
        cost: Decimal::ZERO,
    })
}

/// Create a session and start it.
///
/// Send `Idempotency-Key: <1 to 255 visible ASCII characters>` to make the
/// create safe to retry: a repeat with the same key and body (same tenant,
/// within 24 hours) creates nothing and answers the session the first
/// request created, with `Idempotent-Replayed: true`; the same key with
/// another body is refused with 422 `idempotency_key_reused`.
///
/// With `"dry_run": true` the request is checked exactly as a create checks
/// it and answered `200` with its estimate (the answer of
/// `POST /api/autonomous/estimate`); nothing is created. With
/// `confirm_if_over` a session whose estimate's p90 cost or running time is
/// over a bound (or unknown: `basis: none`) is created
/// `awaiting_confirmation` and starts on `POST /{id}/confirm`.
#[utoipa::path(
    post, path = "/api/autonomous", tag = "sessions",
    request_body = CreateSession,
    responses(
        (status = 200, description = "`dry_run`: the request is valid; its estimate and basis. Nothing was created.", body = EstimateAnswer),
        (status = 201, description = "Session created: running, `queued` when no replica has room (see `queue_position`), `awaiting_refinement`, or `awaiting_confirmation` (see `confirmation`). Any error answer means no session was created.", body = SessionView,
            headers(("Idempotent-Replayed" = String, description = "`true` when the answer is the session an earlier request with the same Idempotency-Key created"))),
        (status = 400, description = "Malformed JSON, or a malformed Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The executor's URL is refused by the outbound-request policy (code `egress_denied`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session needs a capability (`delegate`, `review_every`, `approvals`, `mcp_tools`) that no live replica has, e.g. during a rolling upgrade (`capability_unavailable`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown field, wrong type or out-of-range limit; or an Idempotency-Key used with another body (`idempotency_key_reused`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant has WARDEN_TENANT_MAX_RUNNING active sessions (`tenant_running_limit`), or its share of the request slots is in use (`tenant_request_limit`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The session could not be created right now (its workspace cannot be made, the database is unreachable, Warden is shutting down); nothing was created, retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    request_headers: HeaderMap,
    body: DigestedJson<CreateSession>,
) -> ApiResult<Response> {
    let tenant = new_session_tenant(&caller)?;
    let idempotency = idempotency_key(&request_headers)?.map(|key| IdempotencyKey {
        key,
        digest: body.digest,
    });
    if body.value.dry_run {
        let estimate = state.service.dry_run(body.value, tenant).await?;
        return Ok(Json(estimate).into_response());
    }
    let (session, replayed) = match state
        .service
        .create(body.value, tenant, idempotency.as_ref())
        .await?
    {
        Created::New(session) => (session, false),
        Created::Replayed(session) => (session, true),
    };
    let mut headers = HeaderMap::new();
    if let Ok(location) = HeaderValue::from_str(&format!("/api/autonomous/{}", session.id)) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok((StatusCode::CREATED, headers, Json(view(&state, session))).into_response())
}

/// The tenant a session created (or estimated) by `caller` belongs to.
pub(super) fn new_session_tenant(caller: &Principal) -> ApiResult<&str> {
    caller
        .create_tenant()
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Response header of a create answered from an earlier request with the
/// same `Idempotency-Key`.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Longest `Idempotency-Key` taken.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's `Idempotency-Key`: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bytes = raw.as_bytes();
    if bytes.is_empty()
        || bytes.len() > MAX_IDEMPOTENCY_KEY
        || !bytes.iter().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::bad_request(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters (a UUID is a good one)"
        )));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// List sessions: filtered by status, mode, executor kind, goal text and
/// creation time; ordered by creation or update time, either way.
#[utoipa::path(
    get, path = "/api/autonomous", tag = "sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of sessions", body = SessionPage),
        (status = 400, description = "Bad filter or cursor", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<SessionPage>> {
    let limit = page_limit(q.limit, 50, MAX_LIST_LIMIT)?;
    let filter = SessionFilter {
        status: q.status,
        root_only: q.root_only.unwrap_or(false),
        min_cost_usd: q.min_cost_usd.map(check_amount).transpose()?,
        ..session_filter(q.mode, q.executor, q.q, q.created_from, q.created_before)?
    };
    let order = SessionOrder {
        key: match q.sort {
            None | Some(SortKey::Created) => SessionSortKey::Created,
            Some(SortKey::Updated) => SessionSortKey::Updated,
            Some(SortKey::Cost) => SessionSortKey::Cost,
        },
        descending: q.order != Some(SortOrder::Asc),
    };
    let after = q
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, order.key))
        .transpose()?;
    let rows = state
        .service
        .list(&filter, order, after, limit, &caller.scope)
        .await?;
    let next_cursor = next_after(&rows, limit, |s| {
        encode_cursor(&order.cursor_of(s), order.key)
    });
    Ok(Json(SessionPage {
        items: rows.into_iter().map(|s| view(&state, s)).collect(),
        next_cursor,
    }))
}

/// How many sessions are in each status, of those the filters let through
/// (the list's filters but status): the dashboard's counts.
#[utoipa::path(
    get, path = "/api/autonomous/counts", tag = "sessions",
    params(CountsQuery),
    responses(
        (status = 200, description = "Sessions per status", body = SessionCounts),
        (status = 400, description = "Bad filter", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn count_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<CountsQuery>,
) -> ApiResult<Json<SessionCounts>> {
    let filter = SessionFilter {
        root_only: q.root_only.unwrap_or(false),
        ..session_filter(q.mode, q.executor, q.q, q.created_from, q.created_before)?
    };
    let counted = state
        .service
        .count_by_status(&filter, &caller.scope)
        .await?;
    let mut by_status: std::collections::BTreeMap<String, i64> = Status::ALL
        .iter()
        .map(|s| (s.as_str().to_string(), 0))
        .collect();
    for (status, n) in &counted {
        by_status.insert(status.as_str().to_string(), *n);
    }
    Ok(Json(SessionCounts {
        total: counted.iter().map(|(_, n)| n).sum(),
        by_status,
    }))
}

/// The filter the list and the counts share; a 400 for a goal text over
/// [`MAX_GOAL_FILTER_CHARS`] or with a control character.
pub(super) fn session_filter(
    mode: Option<Mode>,
    executor: Option<ExecutorKind>,
    goal: Option<String>,
    created_from: Option<DateTime<Utc>>,
    created_before: Option<DateTime<Utc>>,
) -> ApiResult<SessionFilter> {
    if let Some(text) = &goal {
        if text.chars().count() > MAX_GOAL_FILTER_CHARS {
            return Err(ApiError::bad_request(format!(
                "q must be at most {MAX_GOAL_FILTER_CHARS} characters"
            )));
        }
        if text.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}') {
            return Err(ApiError::bad_request(
                "q must not contain control characters",
            ));
        }
    }
    Ok(SessionFilter {
        status: None,
        mode,
        executor_kind: executor.map(ExecutorKind::as_str),
        // An empty text filters nothing.
        goal_contains: goal.filter(|t| !t.is_empty()),
        created_from,
        created_before,
        root_only: false,
        min_cost_usd: None,
    })
}

/// A session's status: progress, counters, limits, termination.
#[utoipa::path(
    get, path = "/api/autonomous/{id}", tag = "sessions",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 404, description = "No such session (or not one of the caller's tenant, or an id not written in the canonical 8-4-4-4-12 form)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<(HeaderMap, Json<SessionView>)> {
    let (session, velocity, source) = state.service.status(id, &caller.scope).await?;
    let committed_at = session.updated_at;
    // Children are read only for a session that has any: a status from
    // memory stays a memory read for every other (a delegation invalidates
    // the parent's view, so its next status reads the count afresh).
    let has_children = session.children_count > 0;
    let mut doc = view(&state, session);
    if source == StatusSource::StaleMemory {
        doc.stale = true;
        doc.committed_at = Some(committed_at);
    }
    // Postgres is known to be away: the status answers from memory alone,
    // without the parts only Postgres holds, rather than wait for them.
    if source != StatusSource::StaleMemory {
        let extras = show_database_parts(&state, &mut doc, &caller.scope, has_children).await;
        // From memory, the status answers without them when Postgres went
        // away just now; read from Postgres, it fails as the read would.
        if let Err(err) = extras
            && source == StatusSource::Database
        {
            return Err(err);
        }
    }
    doc.velocity = Some(
        velocity
            .into_iter()
            .map(|(minute, iterations)| VelocityPoint { minute, iterations })
            .collect(),
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        STATUS_SOURCE,
        HeaderValue::from_static(if source == StatusSource::Database {
            "database"
        } else {
            "memory"
        }),
    );
    Ok((headers, Json(doc)))
}

/// Shows the calls a session paused with `approval_required` waits on; a
/// plain resume is not among its actions while they wait.
pub(super) async fn show_pending_approvals(
    state: &AppState,
    doc: &mut SessionView,
    scope: &crate::session::TenantScope,
) -> ApiResult<()> {
    use crate::policy::lifecycle::{Action, Reason, Status};
    if doc.status != Status::Paused || doc.reason != Some(Reason::ApprovalRequired) {
        return Ok(());
    }
    doc.pending_approvals = state
        .service
        .reads()
        .waiting_approvals_of(doc.id, scope)
        .await?
        .into_iter()
        .map(super::views::ApprovalView::from)
        .collect();
    if !doc.pending_approvals.is_empty() {
        doc.allowed_actions.retain(|a| *a != Action::Resume);
    }
    Ok(())
}

/// Fills the parts of a status only Postgres holds: the worker queue a
/// running worker session waits on, pending approvals, and its children.
async fn show_database_parts(
    state: &AppState,
    doc: &mut SessionView,
    scope: &crate::session::TenantScope,
    has_children: bool,
) -> ApiResult<()> {
    if doc.executor.kind == "worker" && doc.status == crate::policy::lifecycle::Status::Running {
        doc.waiting_for_worker = state
            .service
            .reads()
            .waiting_for_worker(doc.id, scope)
            .await?
            .map(super::views::WaitingForWorker::of);
    }
    if doc.status == crate::policy::lifecycle::Status::Queued {
        doc.waiting_for_replica = state
            .service
            .waiting_for_replica(doc.id, scope)
            .await?
            .map(|capabilities| super::views::WaitingForReplica { capabilities });
    }
    show_pending_approvals(state, doc, scope).await?;
    if has_children {
        show_children(state, doc, scope).await?;
        doc.children_needing_attention = state
            .service
            .children_needing_attention(doc.id, scope, ATTENTION_IN_STATUS)
            .await?;
    }
    Ok(())
}

/// Most descendants waiting for a person a status names.
const ATTENTION_IN_STATUS: i64 = 50;

/// Lists a session's direct children in its status.
async fn show_children(
    state: &AppState,
    doc: &mut SessionView,
    scope: &crate::session::TenantScope,
) -> ApiResult<()> {
    doc.children = state
        .service
        .reads()
        .children_of(doc.id, scope)
        .await?
        .into_iter()
        .map(|c| super::views::ChildView {
            id: c.id,
            goal: c.goal,
            status: c.status,
            reason: c.reason,
            tokens_used: c.tokens_used,
            budget_tokens: c.budget_tokens,
        })
        .collect();
    Ok(())
}

/// Response header of `GET /{id}`: `memory` when the replica running the
/// session answered from its loop's committed state, `database` otherwise.
pub const STATUS_SOURCE: &str = "warden-status-source";

/// Stop a session at once (idempotent). The in-flight step is abandoned,
/// a checkpoint saved, and the session ends `interrupted / user_stop`;
/// then every live descendant is stopped the same way, a level at a time.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/stop", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The stop landed: the session is `interrupted` (or had ended already)", body = SessionView),
        (status = 202, description = "The stop is recorded (`stop_requested`) but its owner has not landed it yet; it will have by `stop_lands_by` (also as seconds in `Retry-After`): the owner lands it, or counts as gone by then and the stop lands without it", body = SessionView,
            headers(("Retry-After" = u64, description = "Seconds until `stop_lands_by`, at least 1"))),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session already ended another way", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn stop_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Response> {
    Ok(match state.service.stop_tree(id, &caller.scope).await? {
        StopAnswer::Landed(session) => Json(view(&state, session)).into_response(),
        StopAnswer::Pending { session, lands_by } => {
            let mut doc = view(&state, session);
            doc.stop_lands_by = Some(lands_by);
            let wait = (lands_by - Utc::now()).num_milliseconds().max(0);
            let seconds = (wait as u64).div_ceil(1_000).max(1);
            let mut headers = HeaderMap::new();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            (StatusCode::ACCEPTED, headers, Json(doc)).into_response()
        }
    })
}

/// Pause a session once its step in flight finishes (`paused / user_pause`),
/// with every live descendant (a queued child pauses at once).
#[utoipa::path(
    post, path = "/api/autonomous/{id}/pause", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session; `pause_requested` is true while a long step finishes", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is not running", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn pause_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Json<SessionView>> {
    Ok(Json(view(
        &state,
        state.service.pause_tree(id, &caller.scope).await?,
    )))
}

/// Resume a paused, stopped, interrupted or failed session from its last
/// checkpoint, optionally with guidance and raised limits; descendants a
/// pause stopped resume too. A session waiting for its children stays
/// waiting (only they resume); a child that ended cannot be resumed.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/resume", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    request_body(content = Option<ResumeSession>,
        description = "Optional guidance, limits, goal or reopen; an absent or `null` body means no changes"),
    responses(
        (status = 200, description = "The session, running again (or `queued` when no replica has room)", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not resumable, a budget is exhausted and must be raised, a child's carved budget was asked to change (`carved_budget`), a parent waiting for its children was sent changes, or the session needs a capability no live replica has (`capability_unavailable`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid guidance or limits", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant has WARDEN_TENANT_MAX_RUNNING active sessions (`tenant_running_limit`), or its share of the request slots is in use (`tenant_request_limit`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn resume_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    OptionalJson(req): OptionalJson<ResumeSession>,
) -> ApiResult<Json<SessionView>> {
    let session = state.service.resume_tree(id, &caller.scope, req).await?;
    Ok(Json(view(&state, session)))
}

/// Change the mode or limits of a session; a running session applies them
/// from its next iteration.
#[utoipa::path(
    patch, path = "/api/autonomous/{id}", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = UpdateSession,
    responses(
        (status = 200, description = "The updated session", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is completed, or a child's carved budget was asked to change (`carved_budget`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid mode or limits", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn update_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiJson(req): ApiJson<UpdateSession>,
) -> ApiResult<Json<SessionView>> {
    let session = state.service.update(id, &caller.scope, req).await?;
    Ok(Json(view(&state, session)))
}

/// Delete an ended session: its iterations, events, checkpoints and other
/// history, its child sessions, and its workspace on the disk. A session
/// that has not ended (or has a descendant that has not) is stopped first.
#[utoipa::path(
    delete, path = "/api/autonomous/{id}", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 204, description = "Deleted, with its history and workspace"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session has not ended; stop it first (`illegal_transition`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<StatusCode> {
    state.service.delete_tree(id, &caller.scope).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A live stream of session changes for list views: every time a session's
/// status or progress changes, its status document (`event: session`).
#[utoipa::path(
    get, path = "/api/autonomous/events", tag = "sessions",
    responses(
        (status = 200, description = "Server-Sent Events, each `event: session` with `data` one \
`SessionView` as JSON and `id` its change time (send it back as `Last-Event-ID` to continue)",
            content((String = "text/event-stream"))),
        (status = 400, description = "Last-Event-ID is not an id of this stream", body = Problem, content_type = "application/problem+json"),
        (status = 406, description = "The request accepts no `text/event-stream`", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant has WARDEN_TENANT_MAX_STREAMS live streams open (`stream_limit`), or, as a plain read, its share of the request slots is in use (`tenant_request_limit`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn session_changes(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // This URL has no other form: a client that takes no event stream is told
    // so at once instead of being held on an endless answer.
    if !accepts_stream(&headers) {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable",
            "this endpoint answers only text/event-stream; send Accept: text/event-stream",
        ));
    }
    let since = match event_stream::last_event_id(&headers) {
        None => DateTime::<Utc>::UNIX_EPOCH,
        // Ids of this stream are change times in µs since 1970; anything
        // else would overflow the time arithmetic of the stream (a panic).
        Some(micros) => (0..=MAX_CHANGE_MICROS)
            .contains(&micros)
            .then(|| DateTime::<Utc>::from_timestamp_micros(micros))
            .flatten()
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Last-Event-ID must be an id this stream sent (a time in µs since 1970), got {micros}"
                ))
            })?,
    };
    let slot = state.streams.acquire(&caller.tenant)?;
    Ok(event_stream::session_changes(
        state.service.clone(),
        since,
        caller.scope,
        slot,
    ))
}

/// Largest `Last-Event-ID` of the change stream: the start of year 9999, in µs.
const MAX_CHANGE_MICROS: i64 = 253_370_764_800_000_000;

/// Whether the `Accept` header (absent means anything) allows an event stream.
fn accepts_stream(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT) else {
        return true;
    };
    accept.to_str().is_ok_and(|v| {
        v.split(',').any(|range| {
            let mime = range.split(';').next().unwrap_or("").trim();
            matches!(mime, "*/*" | "text/*" | "text/event-stream")
        })
    })
}

/// Answer a refinement proposal: accept the suggestion, give your own goal,
/// or proceed with the goal as given under a time limit. Starts the session.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/refinement", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = RefinementChoice,
    responses(
        (status = 200, description = "The session, now running", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is not awaiting refinement", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid choice, goal or time limit", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn refine_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiJson(choice): ApiJson<RefinementChoice>,
) -> ApiResult<Json<SessionView>> {
    let session = state.service.refine(id, &caller.scope, choice).await?;
    Ok(Json(view(&state, session)))
}

/// Confirm a session awaiting confirmation (its estimate was over its
/// `confirm_if_over`, or unknown): it starts, `running` or `queued`.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/confirm", tag = "control",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session, now running (or `queued` when no replica has room)", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is not awaiting confirmation (confirmed already, stopped, or expired), or it needs a capability no live replica has (`capability_unavailable`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant has WARDEN_TENANT_MAX_RUNNING active sessions (`tenant_running_limit`), or its share of the request slots is in use (`tenant_request_limit`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn confirm_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Json<SessionView>> {
    let session = state.service.confirm(id, &caller.scope).await?;
    Ok(Json(view(&state, session)))
}

/// Outcome metrics over all sessions: completion rate, iterations to
/// completion, termination reasons, premature-stop rate.
#[utoipa::path(
    get, path = "/api/autonomous/outcomes", tag = "sessions",
    responses((status = 200, description = "Outcome metrics", body = OutcomeMetrics))
)]
pub async fn outcomes(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<OutcomeMetrics>> {
    Ok(Json(
        state.service.reads().outcomes(&caller.scope).await?.into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "00000000-0000-0000-0000-000000000001";

    #[test]
    fn a_cursor_round_trips_in_every_order() {
        let c = SessionCursor {
            at: DateTime::<Utc>::from_timestamp_micros(1_790_000_000_123_456).expect("time"),
            id: ID.parse().expect("uuid"),
            cost: "12.0037500000000000".parse().expect("cost"),
        };
        let by_time = decode_cursor(
            &encode_cursor(&c, SessionSortKey::Created),
            SessionSortKey::Created,
        )
        .expect("time cursor");
        assert_eq!((by_time.at, by_time.id), (c.at, c.id));
        let text = encode_cursor(&c, SessionSortKey::Cost);
        assert_eq!(text, format!("12.00375_{ID}"));
        let by_cost = decode_cursor(&text, SessionSortKey::Cost).expect("cost cursor");
        assert_eq!((by_cost.cost, by_cost.id), (c.cost, c.id));
    }

    #[test]
    fn every_cursor_the_pattern_allows_is_a_position_in_either_order() {
        for position in [
            "0",
            "999999999999999999",
            "1.5",
            "999999999999999999.9999999999999999",
        ] {
            let raw = format!("{position}_{ID}");
            for key in [SessionSortKey::Created, SessionSortKey::Cost] {
                assert!(decode_cursor(&raw, key).is_ok(), "{raw} {key:?}");
            }
        }
        for bad in [
            "",
            "1",
            "x_1",
            "-1_",
            "1._",
            ".5_",
            "1.12345678901234567_",
            "1e3_",
        ] {
            let raw = if bad.ends_with('_') {
                format!("{bad}{ID}")
            } else {
                bad.to_string()
            };
            for key in [SessionSortKey::Created, SessionSortKey::Cost] {
                assert!(decode_cursor(&raw, key).is_err(), "{raw} {key:?}");
            }
        }
    }
}
