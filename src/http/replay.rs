//! `POST /api/autonomous/replay`: policy replay (what-if) over ended
//! sessions, reading only.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::admission::RequestSlot;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::ApiJson;
use super::views::ExecutorKind;
use crate::auth::Principal;
use crate::policy::lifecycle::{Mode, Status};
use crate::policy::replay::PolicyOverride;
use crate::session::replay::{
    DEFAULT_DEADLINE_MS, MAX_DEADLINE_MS, MAX_REPLAY_SESSIONS, ReplayAnswer, ReplayEnd, ReplayRun,
    Selection, SessionReplay,
};
use crate::session::{ServiceError, SessionService};

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

/// The media type of a streamed replay: a JSON document per line.
pub const NDJSON: &str = "application/x-ndjson";

/// One line of a streamed replay (`Accept: application/x-ndjson`): a
/// session's replay as it is computed, then the end (or, when the replay
/// failed after it began, the problem); nothing follows those two.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "line", rename_all = "snake_case")]
pub enum ReplayLine {
    /// One session's replay, as the JSON answer's `sessions` hold it.
    Session(Box<SessionReplay>),
    /// The last line: the totals and the sessions left out, as in the JSON answer.
    End(ReplayEnd),
    /// The last line when the replay failed after it began.
    Error(Problem),
}

/// Whether the request's `Accept` names the NDJSON stream.
fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mime = range.split(';').next().unwrap_or("").trim();
            mime.eq_ignore_ascii_case(NDJSON)
        })
}

/// `line` as one line of NDJSON.
fn ndjson_line(line: &ReplayLine) -> Bytes {
    let mut text = serde_json::to_vec(line).unwrap_or_else(|err| {
        // Our own types always encode; should one not, the client learns it.
        let problem = ApiError::internal(&err).problem();
        serde_json::to_vec(&ReplayLine::Error(problem)).unwrap_or_default()
    });
    text.push(b'\n');
    Bytes::from(text)
}

/// The streamed answer of `run`: a task replays it batch by batch (one
/// pooled connection at a time, none between batches) and sends a line per
/// session as it is computed, then the end. The task holds the request's
/// slots until it ends, which the deadline bounds; it stops early when the
/// client goes away. The lines are queued unbounded, which is bounded by
/// the sessions a request may name: a client that reads slowly holds its
/// lines, never a connection or a slot.
fn stream_replay(
    service: SessionService,
    mut run: ReplayRun,
    slot: Option<RequestSlot>,
) -> Response {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Bytes>();
    let task = async move {
        let _slot = slot;
        loop {
            if tx.is_closed() {
                return;
            }
            match service.replay_next(&mut run).await {
                Ok(Some(batch)) => {
                    for session in batch {
                        let _ =
                            tx.unbounded_send(ndjson_line(&ReplayLine::Session(Box::new(session))));
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    let problem = ApiError::from(err).problem();
                    let _ = tx.unbounded_send(ndjson_line(&ReplayLine::Error(problem)));
                    return;
                }
            }
        }
        let _ = tx.unbounded_send(ndjson_line(&ReplayLine::End(run.finish())));
    };
    tokio::spawn(task.instrument(tracing::Span::current()));
    let body = Body::from_stream(rx.map(Ok::<_, Infallible>));
    (
        [
            (header::CONTENT_TYPE, NDJSON),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
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
/// With `Accept: application/x-ndjson` the answer streams: a line per
/// session as it is replayed, then the totals; same bounds and deadline.
/// See docs/guides/replay.md.
#[utoipa::path(
    post, path = "/api/autonomous/replay", tag = "sessions",
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "Each session's replay and the totals (`ReplayAnswer`), or with \
`Accept: application/x-ndjson` the same streamed as newline-delimited JSON: one `ReplayLine` per line, \
`\"line\": \"session\"` for each session as it is replayed, then one `\"line\": \"end\"` with the \
totals and the sessions left out (or `\"line\": \"error\"` with the problem, should the replay fail \
after it began)", content(
            (ReplayAnswer = "application/json"),
            (ReplayLine = "application/x-ndjson"),
        )),
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
    slot: Option<Extension<RequestSlot>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ReplayRequest>,
) -> ApiResult<Response> {
    let deadline = body.deadline_ms.unwrap_or(DEFAULT_DEADLINE_MS);
    if !(MIN_DEADLINE_MS..=MAX_DEADLINE_MS).contains(&deadline) {
        return Err(invalid(format!(
            "deadline_ms must be {MIN_DEADLINE_MS} to {MAX_DEADLINE_MS}, got {deadline}"
        )));
    }
    let policy = body.policy;
    let selection = selection(body)?;
    let deadline = Duration::from_millis(deadline);
    let run = state
        .service
        .begin_replay(selection, policy, deadline, caller.scope)
        .await?;
    if wants_ndjson(&headers) {
        let slot = slot.map(|Extension(slot)| slot.hand_over());
        return Ok(stream_replay(state.service.clone(), run, slot));
    }
    Ok(Json(state.service.replay_rest(run).await?).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::replay::Totals;
    use crate::session::replay::{NotReplayed, Skipped};

    fn accept(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::ACCEPT, v.parse().expect("a header value"));
        }
        headers
    }

    #[test]
    fn only_an_accept_naming_ndjson_streams() {
        assert!(wants_ndjson(&accept(&["application/x-ndjson"])));
        assert!(wants_ndjson(&accept(&[
            "application/json, Application/X-NDJSON; q=0.9"
        ])));
        assert!(wants_ndjson(&accept(&[
            "text/html",
            "application/x-ndjson"
        ])));
        assert!(!wants_ndjson(&accept(&[])));
        assert!(!wants_ndjson(&accept(&["*/*"])));
        assert!(!wants_ndjson(&accept(&["application/json"])));
        assert!(!wants_ndjson(&accept(&["application/x-ndjsonx"])));
    }

    #[test]
    fn a_line_is_one_json_object_tagged_with_what_it_is() {
        let id = Uuid::from_u128(7);
        let end = ReplayLine::End(ReplayEnd {
            not_replayed: vec![NotReplayed {
                id,
                why: Skipped::Deadline,
            }],
            totals: Totals::default(),
            took_ms: 3,
        });
        let bytes = ndjson_line(&end);
        let text = std::str::from_utf8(&bytes).expect("UTF-8");
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text:?}"
        );
        let doc: serde_json::Value = serde_json::from_str(text).expect("JSON");
        assert_eq!(doc["line"], "end");
        assert_eq!(doc["not_replayed"][0]["why"], "deadline");
        assert_eq!(doc["took_ms"], 3);
        let problem = ApiError::bad_request("no").problem();
        let doc: serde_json::Value =
            serde_json::from_slice(&ndjson_line(&ReplayLine::Error(problem))).expect("JSON");
        assert_eq!(
            (doc["line"].as_str(), doc["status"].as_u64()),
            (Some("error"), Some(400))
        );
    }
}
