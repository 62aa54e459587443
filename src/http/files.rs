//! `/api/autonomous/{id}/files…`, `/workspace.tar` and `/fork`: the files of
//! a session's workspace as its checkpoints' snapshots hold them, and a new
//! session forked from one of those checkpoints.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, ApiQuery, SessionId};
use super::sessions::view;
use super::views::SessionView;
use crate::auth::Principal;
use crate::policy::snapshot::byte_range;
use crate::session::service::{FileList, ForkSession, WorkspaceDiff};

/// The workspace and fork routes, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/{id}/files", get(list_files))
        .route("/{id}/files/diff", get(diff_files))
        .route("/{id}/files/{*path}", get(read_file))
        .route("/{id}/workspace.tar", get(workspace_tar))
        .route("/{id}/fork", post(fork_session))
}

/// The `{id}` and `{*path}` of a file route: the id in its one canonical
/// spelling (as `SessionId` takes it, which counts segments from the end
/// and so cannot be used after a wildcard), the path percent-decoded
/// (checked by the use case).
pub struct FileRoute {
    id: uuid::Uuid,
    path: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for FileRoute {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let not_found = || {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "session_not_found",
                "no such session (a session id is written as 8-4-4-4-12 hex digits)",
            )
        };
        let raw = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| not_found())?;
        let id = raw
            .iter()
            .find(|(k, _)| *k == "id")
            .and_then(|(_, v)| super::extract::canonical_uuid(v))
            .ok_or_else(not_found)?;
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("the file path: {e}")))?;
        Ok(FileRoute {
            id,
            path: params.get("path").cloned().unwrap_or_default(),
        })
    }
}

/// Which snapshot to read.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CheckpointQuery {
    /// The iteration of the checkpoint whose snapshot to read (default:
    /// the latest snapshot).
    #[param(minimum = 0)]
    pub checkpoint: Option<i64>,
}

/// The two snapshots to compare.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// The earlier checkpoint's iteration (default: the snapshot before `to`,
    /// or an empty workspace when there is none).
    #[param(minimum = 0)]
    pub from: Option<i64>,
    /// The later checkpoint's iteration (default: the latest snapshot).
    #[param(minimum = 0)]
    pub to: Option<i64>,
}

/// The files of a session's workspace as of a checkpoint's snapshot
/// (default the latest), with their size, SHA-256 and the iteration each
/// last changed at.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/files", tag = "workspace",
    params(("id" = Uuid, Path, description = "Session id"), CheckpointQuery),
    responses(
        (status = 200, description = "The files", body = FileList),
        (status = 404, description = "No such session, or no snapshot at that checkpoint", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_files(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<CheckpointQuery>,
) -> ApiResult<Json<FileList>> {
    let list = state
        .service
        .workspace_files(id, q.checkpoint, &caller.scope)
        .await?;
    Ok(Json(list))
}

/// One file's content as of a checkpoint's snapshot (default the latest),
/// with a content type guessed from its name; `Range: bytes=…` is honoured.
/// Paths that could leave the workspace (`..`, absolute, NUL, `\`) are 400.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/files/{path}", tag = "workspace",
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("path" = String, Path, description = "The file's path in the workspace"),
        CheckpointQuery,
    ),
    responses(
        (status = 200, description = "The content", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 206, description = "The range asked for", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "A path that could leave the workspace", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session, snapshot or file", body = Problem, content_type = "application/problem+json"),
        (status = 416, description = "The range is past the end", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    FileRoute { id, path }: FileRoute,
    ApiQuery(q): ApiQuery<CheckpointQuery>,
    request: HeaderMap,
) -> ApiResult<Response> {
    let file = state
        .service
        .workspace_file(id, &path, q.checkpoint, &caller.scope)
        .await?;
    let len = file.content.len() as u64;
    let range = request.get(header::RANGE).and_then(|v| v.to_str().ok());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(file.content_type),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", file.sha256)) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert("x-warden-checkpoint", HeaderValue::from(file.checkpoint));
    match byte_range(range, len) {
        Ok(None) => Ok((StatusCode::OK, headers, file.content).into_response()),
        Ok(Some((start, end))) => {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
                headers.insert(header::CONTENT_RANGE, v);
            }
            let part = file.content[start as usize..=end as usize].to_vec();
            Ok((StatusCode::PARTIAL_CONTENT, headers, part).into_response())
        }
        Err(err) => {
            let mut answer = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                err.to_string(),
            )
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                answer.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            Ok(answer)
        }
    }
}

/// The workspace as of a checkpoint's snapshot (default the latest), as a
/// tar archive (files with their modes; at most 512 MiB of content).
#[utoipa::path(
    get, path = "/api/autonomous/{id}/workspace.tar", tag = "workspace",
    params(("id" = Uuid, Path, description = "Session id"), CheckpointQuery),
    responses(
        (status = 200, description = "The tar archive", body = Vec<u8>, content_type = "application/x-tar"),
        (status = 404, description = "No such session or snapshot", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Too large for one archive", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn workspace_tar(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<CheckpointQuery>,
) -> ApiResult<Response> {
    let (at, tar) = state
        .service
        .workspace_tar(id, q.checkpoint, &caller.scope)
        .await?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    if let Ok(v) =
        HeaderValue::from_str(&format!("attachment; filename=\"workspace-{id}-{at}.tar\""))
    {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    headers.insert("x-warden-checkpoint", HeaderValue::from(at));
    Ok((StatusCode::OK, headers, tar).into_response())
}

/// What changed in the workspace from one checkpoint's snapshot to
/// another's: paths added, removed and changed with their digests, and a
/// unified diff for small text files.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/files/diff", tag = "workspace",
    params(("id" = Uuid, Path, description = "Session id"), DiffQuery),
    responses(
        (status = 200, description = "The changes", body = WorkspaceDiff),
        (status = 404, description = "No such session or snapshot", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn diff_files(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<WorkspaceDiff>> {
    let diff = state
        .service
        .workspace_diff(id, (q.from, q.to), &caller.scope)
        .await?;
    Ok(Json(diff))
}

/// Forks a session from one of its checkpoints (`forkable` in
/// `GET /checkpoints`): a new session of the same tenant starts from the
/// checkpoint's memory, task queue, checklists and workspace (restored
/// byte for byte), with fresh usage counters under the forked session's
/// limits (changed by `limits`). The original is never touched; an ended
/// session may be forked.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/fork", tag = "workspace",
    params(("id" = Uuid, Path, description = "The session to fork")),
    request_body = ForkSession,
    responses(
        (status = 201, description = "The new session", body = SessionView),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No such checkpoint of the session (none taken yet, when none is named), the checkpoint has no workspace snapshot, or `model` is given for a session whose executor is not `llm`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn fork_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiJson(req): ApiJson<ForkSession>,
) -> ApiResult<(StatusCode, HeaderMap, Json<SessionView>)> {
    let session = state.service.fork(id, req, &caller.scope).await?;
    let mut headers = HeaderMap::new();
    if let Ok(location) = HeaderValue::from_str(&format!("/api/autonomous/{}", session.id)) {
        headers.insert(header::LOCATION, location);
    }
    Ok((StatusCode::CREATED, headers, Json(view(&state, session))))
}
