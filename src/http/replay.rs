//! `POST /api/autonomous/replay`: policy replay (what-if) over ended
//! sessions, reading only.

use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::ApiJson;
use super::views::ExecutorKind;
use crate::auth::Principal;
use crate::policy::lifecycle::{Mode, Status};
use crate::policy::replay::PolicyOverride;
use crate::session::ServiceError;
use crate::session::replay::{
    DEFAULT_DEADLINE_MS, MAX_DEADLINE_MS, MAX_REPLAY_SESSIONS, ReplayAnswer, Selection,
};

/// Sessions a filter selects when it names no limit.
pub const DEFAULT_FILTER_LIMIT: u64 = 100;
/// The shortest deadline a request may ask for, ms.
pub const MIN_DEADLINE_MS: u64 = 100;

/// The replay route, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new().route("/replay", post(replay_sessions))
}

/// Which sessions the list's filters select for a replay (the newest first).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayFilter {
    /// Only sessions in this status.
    pub status: Option<Status>,
    /// Only sessions in this mode.
    pub mode: Option<Mode>,
    /// Only sessions with an executor of this kind.
    pub executor: Option<ExecutorKind>,
    /// Only sessions whose goal contains this text (any case); at most 200
    /// characters, no control characters.
    pub q: Option<String>,
    /// Only sessions created at or after this time (RFC 3339).
    pub created_from: Option<DateTime<Utc>>,
    /// Only sessions created before this time (RFC 3339).
    pub created_before: Option<DateTime<Utc>>,
    /// Only top-level sessions: no child sessions.
    pub root_only: Option<bool>,
    /// At most this many sessions, 1 – 1,000 (default 100).
    pub limit: Option<u64>,
}

/// A replay request: the sessions (ids or a filter, one of them) and the
/// policy override.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// The sessions to replay, 1 – 1,000 ids.
    pub session_ids: Option<Vec<Uuid>>,
    /// Or the newest sessions these filters select.
    pub filter: Option<ReplayFilter>,
    /// The policy to replay them under; empty replays the policy they ran with.
    #[serde(default)]
    pub policy: PolicyOverride,
    /// Time the replay may take, ms (100 – 60,000; default 10,000):
    /// sessions not reached by then are listed as `deadline`.
    pub deadline_ms: Option<u64>,
}

/// A 422 saying what is wrong with the request.
fn invalid(detail: String) -> ApiError {
    ServiceError::Invalid(detail).into()
}

/// The selection a request names, checked.
fn selection(req: ReplayRequest) -> ApiResult<Selection> {
    match (req.session_ids, req.filter) {
        (Some(ids), None) => {
            if ids.is_empty() || ids.len() > MAX_REPLAY_SESSIONS {
                return Err(invalid(format!(
                    "session_ids must hold 1 to {MAX_REPLAY_SESSIONS} ids, got {}",
                    ids.len()
                )));
            }
            let mut seen = std::collections::HashSet::new();
            Ok(Selection::Ids(
                ids.into_iter().filter(|id| seen.insert(*id)).collect(),
            ))
        }
        (None, Some(f)) => {
            let limit = f.limit.unwrap_or(DEFAULT_FILTER_LIMIT);
            if !(1..=MAX_REPLAY_SESSIONS as u64).contains(&limit) {
                return Err(invalid(format!(
                    "filter.limit must be 1 to {MAX_REPLAY_SESSIONS}, got {limit}"
                )));
            }
            let mut filter = super::sessions::session_filter(
                f.mode,
                f.executor,
                f.q,
                f.created_from,
                f.created_before,
            )?;
            filter.status = f.status;
            filter.root_only = f.root_only.unwrap_or(false);
            Ok(Selection::Filter(filter, limit as usize))
        }
        _ => Err(invalid(
            "name the sessions to replay with exactly one of session_ids and filter".into(),
        )),
    }
}

/// Replay a policy over ended sessions (what-if).
///
/// Reruns the pure policy — guardrails, the continue gate, stuck
/// detection, reflection decisions — over each ended session's recorded
/// steps and reflections under `policy` (budgets, the reflection interval
/// and review points as `limits`; `gate` thresholds; `stuck` windows),
/// with no model call and no write. Per session: where it would have ended
/// or paused and why against what happened, the first decision taken
/// differently, and the counterfactual iterations, tokens and cost; then
/// the totals. `reproduced` says the policy it ran with reproduces its
/// recorded end. Sessions of another tenant read as `not_found`, running
/// ones as `not_ended`; those the deadline leaves unread as `deadline`.
/// See docs/guides/replay.md.
#[utoipa::path(
    post, path = "/api/autonomous/replay", tag = "sessions",
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "Each session's replay and the totals", body = ReplayAnswer),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Neither or both of session_ids and filter, too many sessions, an unknown field or an out-of-range threshold", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn replay_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<ReplayRequest>,
) -> ApiResult<Json<ReplayAnswer>> {
    let deadline = body.deadline_ms.unwrap_or(DEFAULT_DEADLINE_MS);
    if !(MIN_DEADLINE_MS..=MAX_DEADLINE_MS).contains(&deadline) {
        return Err(invalid(format!(
            "deadline_ms must be {MIN_DEADLINE_MS} to {MAX_DEADLINE_MS}, got {deadline}"
        )));
    }
    let policy = body.policy;
    let selection = selection(body)?;
    let answer = state
        .service
        .replay_policy(
            selection,
            &policy,
            Duration::from_millis(deadline),
            &caller.scope,
        )
        .await?;
    Ok(Json(answer))
}
