//! `/api/autonomous/{id}/…`: a session's history. Its iterations,
//! checkpoints, events, decisions and reflections are each a [`History`]
//! served a page at a time by one handler ([`history_page`]); each route
//! keeps its own OpenAPI description. Refinements and tasks come whole.

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json};
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::event_stream;
use super::extract::{ApiQuery, SessionId};
use super::paging::{DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, Paging, fill_page, page_limit};
use super::views::{
    AfterPage, CheckpointPage, CheckpointView, DecisionQuery, EventPage, HistoryPageQuery,
    IterationPage, IterationView, RefinementList, ReflectionPage, TaskList, excerpt_strings,
    json_weight,
};
use crate::auth::Principal;
use crate::session::{LoggedEvent, SessionReads};
use crate::session::{ReflectionRecord, TenantScope};

/// The history routes, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/{id}/iterations", get(list_iterations))
        .route("/{id}/checkpoints", get(list_checkpoints))
        .route("/{id}/events", get(list_events))
        .route("/{id}/decisions", get(list_decisions))
        .route("/{id}/reflections", get(list_reflections))
        .route("/{id}/refinements", get(list_refinements))
        .route("/{id}/tasks", get(list_tasks))
}

/// A per-session list served a page at a time in the order of a number each
/// row carries (iteration number, checkpoint id, event seq, reflection
/// number): how a page is read with the caller's scope, where the next one
/// starts, and the answer its rows make.
trait History {
    /// The query: `after`, `limit` and the list's own filters.
    type Query: Paging + Send + Sync;
    /// A row as the read model gives it.
    type Row: Send;
    /// The page as the API answers it.
    type Page;
    /// Rows read at a time while a page fills; `None`: the whole page at
    /// once (a list whose rows [`History::weigh`] nothing).
    const BATCH: Option<i64> = None;

    /// The rows `at` asks for.
    fn read(
        at: PageRead<'_, Self::Query>,
    ) -> impl Future<Output = ApiResult<Vec<Self::Row>>> + Send;

    /// The row's number: the next page starts after the last one's.
    fn number(row: &Self::Row) -> i64;

    /// Shapes a row for the answer and says about how many bytes it takes
    /// there, for lists whose pages end early at `PAGE_BYTE_BUDGET`.
    fn weigh(_row: &mut Self::Row, _query: &Self::Query) -> usize {
        0
    }

    /// The answer: the rows as views, and where the next page starts.
    fn page(rows: Vec<Self::Row>, next_after: Option<i64>) -> Self::Page;
}

/// One read of a page of a session's history: up to `limit` rows of
/// session `id` numbered after `after`, as `scope` may see them.
struct PageRead<'a, Q> {
    reads: &'a SessionReads,
    id: Uuid,
    scope: &'a TenantScope,
    query: &'a Q,
    after: i64,
    limit: i64,
}

/// A page of `H` of session `id`: a 404 for a session the caller does not
/// reach (before any read, so an empty page never leaks one), a 400 for a
/// page size out of range.
async fn history_page<H: History>(
    state: &AppState,
    caller: &Principal,
    id: Uuid,
    query: H::Query,
) -> ApiResult<H::Page> {
    ensure_exists(state, id, &caller.scope).await?;
    let limit = page_limit(query.limit(), DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT)?;
    let reads = state.service.reads();
    let (rows, next_after) = fill_page(
        query.after().unwrap_or(0),
        limit,
        H::BATCH.unwrap_or(limit),
        |after, limit| {
            H::read(PageRead {
                reads,
                id,
                scope: &caller.scope,
                query: &query,
                after,
                limit,
            })
        },
        H::number,
        |row| H::weigh(row, &query),
    )
    .await?;
    Ok(H::page(rows, next_after))
}

/// A 404 for a session `scope` does not reach, before reading its history
/// (whose reads carry the same scope, so an empty page is never a leak).
async fn ensure_exists(state: &AppState, id: Uuid, scope: &TenantScope) -> ApiResult<()> {
    state.service.get(id, scope).await?;
    Ok(())
}

/// Typed rows as the views the page shapes. Writing a row that was read
/// from its type back as JSON does not fail; if it ever did, it is our fault.
fn as_views<R, V: TryFrom<R, Error = serde_json::Error>>(rows: Vec<R>) -> ApiResult<Vec<V>> {
    rows.into_iter()
        .map(V::try_from)
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::internal(&e))
}

/// Rows read at a time while a page of large rows fills up to its byte
/// budget: what is held beyond the page itself.
const LARGE_ROWS_BATCH: i64 = 25;

/// Committed iterations, in order; large texts as excerpts unless `full`.
struct Iterations;

impl History for Iterations {
    type Query = HistoryPageQuery;
    type Row = IterationView;
    type Page = IterationPage;
    const BATCH: Option<i64> = Some(LARGE_ROWS_BATCH);

    async fn read(at: PageRead<'_, HistoryPageQuery>) -> ApiResult<Vec<IterationView>> {
        let rows = at
            .reads
            .iterations(at.id, at.scope, at.after, at.limit)
            .await?;
        as_views(rows)
    }

    fn number(row: &IterationView) -> i64 {
        row.number
    }

    fn weigh(row: &mut IterationView, query: &HistoryPageQuery) -> usize {
        if !query.full.unwrap_or(false) {
            excerpt_strings(&mut row.record);
            excerpt_strings(&mut row.effects);
        }
        json_weight(&row.record) + json_weight(&row.effects) + 256
    }

    fn page(items: Vec<IterationView>, next_after: Option<i64>) -> IterationPage {
        IterationPage { items, next_after }
    }
}

/// Committed iterations of a session, in order. Texts over 4 KiB come as
/// excerpts unless `full=true`; a page ends early at about 4 MiB.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/iterations", tag = "history",
    params(("id" = Uuid, Path, description = "Session id"), HistoryPageQuery),
    responses(
        (status = 200, description = "A page of iterations", body = IterationPage),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_iterations(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<HistoryPageQuery>,
) -> ApiResult<Json<IterationPage>> {
    history_page::<Iterations>(&state, &caller, id, q)
        .await
        .map(Json)
}

/// Checkpoints, oldest first; large texts as excerpts unless `full`.
struct Checkpoints;

impl History for Checkpoints {
    type Query = HistoryPageQuery;
    type Row = CheckpointView;
    type Page = CheckpointPage;
    const BATCH: Option<i64> = Some(LARGE_ROWS_BATCH);

    async fn read(at: PageRead<'_, HistoryPageQuery>) -> ApiResult<Vec<CheckpointView>> {
        let rows = at
            .reads
            .checkpoints(at.id, at.scope, at.after, at.limit)
            .await?;
        let snapshots = at.reads.snapshot_iterations(at.id, at.scope).await?;
        let mut views: Vec<CheckpointView> = as_views(rows)?;
        for view in &mut views {
            view.forkable = snapshots.binary_search(&view.iteration).is_ok();
        }
        Ok(views)
    }

    fn number(row: &CheckpointView) -> i64 {
        row.id
    }

    fn weigh(row: &mut CheckpointView, query: &HistoryPageQuery) -> usize {
        if !query.full.unwrap_or(false) {
            excerpt_strings(&mut row.state);
        }
        json_weight(&row.state) + 256
    }

    fn page(items: Vec<CheckpointView>, next_after: Option<i64>) -> CheckpointPage {
        CheckpointPage { items, next_after }
    }
}

/// Checkpoints of a session, oldest first. Texts over 4 KiB come as
/// excerpts unless `full=true`; a page ends early at about 4 MiB.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/checkpoints", tag = "history",
    params(("id" = Uuid, Path, description = "Session id"), HistoryPageQuery),
    responses(
        (status = 200, description = "A page of checkpoints", body = CheckpointPage),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<HistoryPageQuery>,
) -> ApiResult<Json<CheckpointPage>> {
    history_page::<Checkpoints>(&state, &caller, id, q)
        .await
        .map(Json)
}

/// The session log in sequence order.
struct Events;

impl History for Events {
    type Query = AfterPage;
    type Row = LoggedEvent;
    type Page = EventPage;

    async fn read(at: PageRead<'_, AfterPage>) -> ApiResult<Vec<LoggedEvent>> {
        Ok(at.reads.events(at.id, at.scope, at.after, at.limit).await?)
    }

    fn number(row: &LoggedEvent) -> i64 {
        row.seq
    }

    fn page(rows: Vec<LoggedEvent>, next_after: Option<i64>) -> EventPage {
        event_page(rows, next_after)
    }
}

fn event_page(rows: Vec<LoggedEvent>, next_after: Option<i64>) -> EventPage {
    EventPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_after,
        compacted_through: None,
    }
}

/// `page` with how far compaction has thinned the log it was read from.
async fn with_compaction(
    state: &AppState,
    id: Uuid,
    scope: &TenantScope,
    mut page: EventPage,
) -> ApiResult<EventPage> {
    page.compacted_through = state.service.reads().compacted_through(id, scope).await?;
    Ok(page)
}

/// The session log in sequence order: a JSON page, or with
/// `Accept: text/event-stream` a live Server-Sent Events stream (the SSE id
/// is the sequence number; reconnect with `Last-Event-ID` to continue
/// without a gap; the stream ends after the event that ends the loop).
/// Routine events further back than `WARDEN_EVENT_HORIZON` are compacted
/// away, so their numbers are missing.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/events", tag = "history",
    params(("id" = Uuid, Path, description = "Session id"), AfterPage),
    responses(
        (status = 200, description = "A page of events (`EventPage`), or with `Accept: text/event-stream` the \
live stream: Server-Sent Events whose `event` is the event kind, `id` the sequence number and `data` one \
`EventView` as JSON", content(
            (EventPage = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 400, description = "Bad limit, or a negative Last-Event-ID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant has WARDEN_TENANT_MAX_STREAMS live streams open (`stream_limit`), or, as a plain read, its share of the request slots is in use (`tenant_request_limit`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<AfterPage>,
) -> ApiResult<Response> {
    if !event_stream::wants_stream(&headers) {
        let page = history_page::<Events>(&state, &caller, id, q).await?;
        let page = with_compaction(&state, id, &caller.scope, page).await?;
        return Ok(Json(page).into_response());
    }
    ensure_exists(&state, id, &caller.scope).await?;
    let after = event_stream::last_event_id(&headers)
        .or(q.after)
        .unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request(format!(
            "Last-Event-ID must be an event sequence number (0 or more), got {after}"
        )));
    }
    let compacted_through = state
        .service
        .reads()
        .compacted_through(id, &caller.scope)
        .await?;
    let slot = state.streams.acquire(&caller.tenant)?;
    let reads = state.service.reads().clone();
    let resume = event_stream::Resume {
        after,
        compacted_through,
    };
    Ok(event_stream::session_events(
        reads,
        id,
        caller.scope,
        resume,
        slot,
    ))
}

/// Why the session stopped, paused or throttled, from its log.
struct Decisions;

impl History for Decisions {
    type Query = DecisionQuery;
    type Row = LoggedEvent;
    type Page = EventPage;

    async fn read(at: PageRead<'_, DecisionQuery>) -> ApiResult<Vec<LoggedEvent>> {
        let include_continue = at.query.include_continue.unwrap_or(false);
        Ok(at
            .reads
            .decisions(at.id, at.scope, at.after, at.limit, include_continue)
            .await?)
    }

    fn number(row: &LoggedEvent) -> i64 {
        row.seq
    }

    fn page(rows: Vec<LoggedEvent>, next_after: Option<i64>) -> EventPage {
        event_page(rows, next_after)
    }
}

/// Why the session stopped, paused or throttled: gate evaluations with
/// their metrics, stuck verdicts, guardrail trips, status changes, and each
/// change of the adaptive reflection interval with the inputs it was
/// decided on (`reflection_interval_changed`).
#[utoipa::path(
    get, path = "/api/autonomous/{id}/decisions", tag = "history",
    params(("id" = Uuid, Path, description = "Session id"), DecisionQuery),
    responses(
        (status = 200, description = "A page of decision events", body = EventPage),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_decisions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<DecisionQuery>,
) -> ApiResult<Json<EventPage>> {
    let page = history_page::<Decisions>(&state, &caller, id, q).await?;
    with_compaction(&state, id, &caller.scope, page)
        .await
        .map(Json)
}

/// Reflections (continuous mode), in order.
struct Reflections;

impl History for Reflections {
    type Query = AfterPage;
    type Row = ReflectionRecord;
    type Page = ReflectionPage;

    async fn read(at: PageRead<'_, AfterPage>) -> ApiResult<Vec<ReflectionRecord>> {
        // Reflections are numbered in an `int`: past its range none is after.
        let after = i32::try_from(at.after).unwrap_or(i32::MAX);
        Ok(at
            .reads
            .reflections(at.id, at.scope, after, at.limit)
            .await?)
    }

    fn number(row: &ReflectionRecord) -> i64 {
        i64::from(row.number)
    }

    fn page(rows: Vec<ReflectionRecord>, next_after: Option<i64>) -> ReflectionPage {
        ReflectionPage {
            items: rows.into_iter().map(Into::into).collect(),
            next_after,
        }
    }
}

/// Reflections of a session (continuous mode): assessment, decision, next interval.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/reflections", tag = "history",
    params(("id" = Uuid, Path, description = "Session id"), AfterPage),
    responses(
        (status = 200, description = "A page of reflections", body = ReflectionPage),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_reflections(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<AfterPage>,
) -> ApiResult<Json<ReflectionPage>> {
    history_page::<Reflections>(&state, &caller, id, q)
        .await
        .map(Json)
}

/// The refinement history of a session's goal.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/refinements", tag = "history",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "Refinements in order", body = RefinementList),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_refinements(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Json<RefinementList>> {
    ensure_exists(&state, id, &caller.scope).await?;
    let rows = state.service.reads().refinements(id, &caller.scope).await?;
    Ok(Json(RefinementList {
        items: rows.into_iter().map(Into::into).collect(),
    }))
}

/// The agent's task queue (kept across context cycles and restarts).
#[utoipa::path(
    get, path = "/api/autonomous/{id}/tasks", tag = "history",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The task queue", body = TaskList),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Json<TaskList>> {
    ensure_exists(&state, id, &caller.scope).await?;
    Ok(Json(TaskList {
        items: state.service.reads().tasks(id, &caller.scope).await?,
    }))
}
