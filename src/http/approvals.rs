//! Calls that wait for a person: the inbox of a tenant
//! (`GET /api/autonomous/approvals`) and the decision on one call
//! (`POST /api/autonomous/{id}/approvals/{call_id}`), which continues the
//! session's step when it was the last call it waited on.

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, ApiQuery, SessionId, WrittenCallId};
use super::paging::{MAX_LIST_LIMIT, next_after, page_limit};
use super::views::{ApprovalView, SessionView};
use crate::auth::Principal;
use crate::policy::approval::Decision;
use crate::session::{ApprovalCursor, ChildAttention, NewDecision};

/// The approval routes, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/approvals", get(list_approvals))
        .route("/attention", get(list_attention))
        .route("/{id}/approvals/{call_id}", post(decide))
}

/// Longest message to the agent, in characters.
pub const MAX_MESSAGE_CHARS: usize = crate::session::service::MAX_GUIDANCE_CHARS;
/// What a call id looks like: `{iteration}.{call_index}`.
pub const CALL_ID_PATTERN: &str = r"^[0-9]{1,19}\.[0-9]{1,10}$";

/// A person's decision on a waiting call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PersonDecision {
    /// Run the call (exactly once).
    Approve,
    /// Do not run it; the agent gets the rejection (and the message) as its result.
    Reject,
}

/// The body of a decision.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideApproval {
    /// `approve` or `reject`.
    pub decision: PersonDecision,
    /// A message to the agent, given with the call's result (at most 10000 characters).
    #[serde(default)]
    pub message: Option<String>,
    /// With `approve` only: the arguments to run the call with in place of
    /// the agent's (a JSON object, at most `WARDEN_MAX_OUTPUT_BYTES` bytes
    /// of JSON). The approval records them as `edited_arguments`, and the
    /// agent is told with the result that a person changed them. Arguments
    /// equal to the agent's are no edit.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: Option<serde_json::Value>,
}

/// Paging of the approvals inbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ApprovalListQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 – 200 (default 50).
    pub limit: Option<i64>,
    /// Admins only: the approvals of this tenant (default: every tenant).
    /// Other keys always see their own tenant's.
    pub tenant: Option<String>,
}

/// A page of waiting calls, oldest request first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalPage {
    /// The calls.
    pub items: Vec<ApprovalView>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

fn encode_cursor(a: &ApprovalView) -> String {
    format!(
        "{}_{}_{}",
        a.requested_at.timestamp_micros(),
        a.session_id,
        a.call_id
    )
}

fn decode_cursor(raw: &str) -> ApiResult<ApprovalCursor> {
    let invalid = || ApiError::bad_request(format!("cursor {raw:?} is not a cursor from this API"));
    let mut parts = raw.trim().splitn(3, '_');
    let (Some(micros), Some(session), Some(call_id)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid());
    };
    let micros: i64 = micros.parse().map_err(|_| invalid())?;
    if !(0..=999_999_999_999_999_999).contains(&micros) || !valid_call_id(call_id) {
        return Err(invalid());
    }
    Ok(ApprovalCursor {
        requested_at: DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(invalid)?,
        session_id: session.parse::<Uuid>().map_err(|_| invalid())?,
        call_id: call_id.to_string(),
    })
}

/// Whether `id` is written as [`CALL_ID_PATTERN`] says.
fn valid_call_id(id: &str) -> bool {
    let Some((step, index)) = id.split_once('.') else {
        return false;
    };
    let digits =
        |s: &str, max: usize| (1..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    digits(step, 19) && digits(index, 10)
}

/// Calls waiting for a person across the caller's tenant, oldest first.
#[utoipa::path(
    get, path = "/api/autonomous/approvals", tag = "approvals",
    params(ApprovalListQuery),
    responses(
        (status = 200, description = "A page of calls waiting for approval", body = ApprovalPage),
        (status = 400, description = "Bad cursor or limit", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_approvals(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ApprovalListQuery>,
) -> ApiResult<Json<ApprovalPage>> {
    let limit = page_limit(q.limit, 50, MAX_LIST_LIMIT)?;
    let after = q.cursor.as_deref().map(decode_cursor).transpose()?;
    let items = state
        .service
        .reads()
        .waiting_approvals(&caller.scope, after.as_ref(), limit)
        .await?
        .into_iter()
        .map(ApprovalView::from)
        .collect::<Vec<_>>();
    let next_cursor = next_after(&items, limit, encode_cursor);
    Ok(Json(ApprovalPage { items, next_cursor }))
}

/// Paging of the inbox of children needing attention.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AttentionListQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 – 200 (default 50).
    pub limit: Option<i64>,
    /// Admins only: the children of this tenant (default: every tenant).
    /// Other keys always see their own tenant's.
    pub tenant: Option<String>,
}

/// A page of child sessions that wait for a person, oldest pause first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttentionPage {
    /// The children, each with its tree's root, its parent and why it waits.
    pub items: Vec<ChildAttention>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

fn encode_attention_cursor(a: &ChildAttention) -> String {
    format!("{}_{}", a.paused_at.timestamp_micros(), a.child_id)
}

fn decode_attention_cursor(raw: &str) -> ApiResult<(DateTime<Utc>, Uuid)> {
    let invalid = || ApiError::bad_request(format!("cursor {raw:?} is not a cursor from this API"));
    let (micros, child) = raw.trim().split_once('_').ok_or_else(invalid)?;
    let micros: i64 = micros.parse().map_err(|_| invalid())?;
    if !(0..=999_999_999_999_999_999).contains(&micros) {
        return Err(invalid());
    }
    Ok((
        DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(invalid)?,
        child.parse::<Uuid>().map_err(|_| invalid())?,
    ))
}

/// Child sessions across the caller's tenant that paused for a person
/// (a budget projected to overrun, a review point, a question, an
/// approval, …) while their tree waits on them, oldest pause first: the
/// trees' `on_child_pause` is `wait`. Resume, stop or answer the child
/// itself; its parent goes on when it ends.
#[utoipa::path(
    get, path = "/api/autonomous/attention", tag = "approvals",
    params(AttentionListQuery),
    responses(
        (status = 200, description = "A page of children waiting for a person", body = AttentionPage),
        (status = 400, description = "Bad cursor or limit", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_attention(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<AttentionListQuery>,
) -> ApiResult<Json<AttentionPage>> {
    let limit = page_limit(q.limit, 50, MAX_LIST_LIMIT)?;
    let after = q
        .cursor
        .as_deref()
        .map(decode_attention_cursor)
        .transpose()?;
    let items = state
        .service
        .attention_inbox(&caller.scope, after, limit)
        .await?;
    let next_cursor = next_after(&items, limit, encode_attention_cursor);
    Ok(Json(AttentionPage { items, next_cursor }))
}

/// Approve or reject a call that waits for a person. An approved call runs
/// exactly once, with the person's `arguments` when they give them; a
/// rejected one is answered to the agent as rejected, with the message.
/// When no other call of the session waits, the session continues the same
/// step at once. Who decided, and any edit, is recorded.
#[utoipa::path(
    post, path = "/api/autonomous/{id}/approvals/{call_id}", tag = "approvals",
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("call_id" = String, Path, description = "The call, as `pending_approvals[].call_id` shows it (`{iteration}.{call_index}`)"),
    ),
    request_body = DecideApproval,
    responses(
        (status = 200, description = "Decided: the session (running again, or still paused while other calls wait)", body = SessionView),
        (status = 404, description = "No such session, or no such call of it (or not the caller's tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The call was decided already (`already_decided`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid decision, message or arguments (arguments with `reject`, not an object, or too large)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn decide(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    WrittenCallId(call_id): WrittenCallId,
    ApiJson(body): ApiJson<DecideApproval>,
) -> ApiResult<Json<SessionView>> {
    let Some(call_id) = call_id.filter(|c| valid_call_id(c)) else {
        // A missing session answers as one, whatever the call is called.
        state.service.get(id, &caller.scope).await?;
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "approval_not_found",
            "no such call (a call id is written `{iteration}.{call_index}`)",
        ));
    };
    let decision = match body.decision {
        PersonDecision::Approve => Decision::Approve,
        PersonDecision::Reject => Decision::Reject,
    };
    let message = body.message.as_deref().map(crate::session::storable_text);
    let session = state
        .service
        .decide_approval(
            id,
            &caller.scope,
            &call_id,
            NewDecision {
                decision,
                decided_by: Some(&caller.actor),
                message: message.as_deref(),
                edited_arguments: body.arguments.as_ref(),
            },
        )
        .await?;
    let mut doc = super::sessions::view(&state, session);
    super::sessions::show_pending_approvals(&state, &mut doc, &caller.scope).await?;
    Ok(Json(doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_are_a_step_and_an_index() {
        for ok in ["1.0", "12.3", "9999999999999999999.4294967295"] {
            assert!(valid_call_id(ok), "{ok}");
        }
        for bad in [
            "",
            "1",
            ".1",
            "1.",
            "a.0",
            "1.0.0",
            "1,0",
            "-1.0",
            "1.a",
            "01234567890123456789.0",
        ] {
            assert!(!valid_call_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_cursor_reads_back() {
        let approval = ApprovalView {
            session_id: Uuid::nil(),
            call_id: "3.1".into(),
            iteration: 3,
            call_index: 1,
            tool_call_id: None,
            tool: "write_file".into(),
            arguments: serde_json::json!({}),
            edited_arguments: None,
            reason: String::new(),
            requested_at: DateTime::<Utc>::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
            expires_at: DateTime::<Utc>::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
            decision: None,
            decided_by: None,
            decided_at: None,
            message: None,
        };
        let cursor = decode_cursor(&encode_cursor(&approval)).unwrap();
        assert_eq!(cursor.call_id, "3.1");
        assert_eq!(cursor.session_id, Uuid::nil());
        assert_eq!(cursor.requested_at, approval.requested_at);
        for bad in ["", "x", "1_2", "1_00000000-0000-0000-0000-000000000000_x"] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }
}
