//! Notifications: a tenant's target (`/api/notify`, tenant admins) and its
//! signing secret, a session's own target (`/api/autonomous/{id}/notify`),
//! and a session's deliveries (`/api/autonomous/{id}/notifications`). A
//! target's URL is shown back as its scheme and host only: its path and
//! query can be an incoming webhook's secret.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, ApiQuery, SessionId};
use super::paging::{MAX_LIST_LIMIT, page_limit};
use crate::auth::Principal;
use crate::policy::notify::{Format, message_id, shown_url};
use crate::session::notify::TargetSet;
use crate::session::{NotificationRow, NotifyTarget, TenantScope};

/// The tenant's routes, relative to `/api/notify`.
pub fn tenant_router() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            put(set_tenant_target)
                .get(get_tenant_target)
                .delete(delete_tenant_target),
        )
        .route("/secret/rotate", post(rotate_secret))
}

/// A session's routes, relative to `/api/autonomous`.
pub fn session_router() -> Router<AppState> {
    Router::new()
        .route(
            "/{id}/notify",
            put(set_session_target)
                .get(get_session_target)
                .delete(delete_session_target),
        )
        .route("/{id}/notifications", get(list_notifications))
}

/// Where to send notifications.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNotifyTarget {
    /// An http(s) URL the egress policy allows (at most 2048 bytes).
    #[schema(max_length = 2048)]
    pub url: String,
    /// `standard` (a signed Standard Webhooks message, the default) or
    /// `slack` (a signed `{"text": ...}` for an incoming webhook).
    #[serde(default)]
    pub format: Option<Format>,
}

/// A target as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotifyTargetView {
    /// The tenant.
    pub tenant: String,
    /// The session, for a session's own target.
    pub session_id: Option<Uuid>,
    /// The URL's scheme and host (its path and query are not shown).
    pub url: String,
    /// `standard` or `slack`.
    pub format: Format,
    /// False once a receiver answered 410 Gone; setting it again enables it.
    pub enabled: bool,
    /// When it was disabled.
    pub disabled_at: Option<DateTime<Utc>>,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
}

impl From<NotifyTarget> for NotifyTargetView {
    fn from(t: NotifyTarget) -> NotifyTargetView {
        NotifyTargetView {
            tenant: t.tenant,
            session_id: t.session_id,
            url: shown_url(&t.url),
            format: Format::parse(&t.format),
            enabled: t.disabled_at.is_none(),
            disabled_at: t.disabled_at,
            disabled_reason: t.disabled_reason,
        }
    }
}

/// A target as set, with the tenant's signing secret the one time it is made.
#[derive(Clone, Serialize, ToSchema)]
pub struct NotifyTargetSet {
    /// The target.
    pub target: NotifyTargetView,
    /// The tenant's signing secret (`whsec_…`): present only in the answer
    /// that made it. Keep it: it is never shown again (rotate for a new one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<String>,
}

impl std::fmt::Debug for NotifyTargetSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NotifyTargetSet({:?}, <secret redacted>)", self.target)
    }
}

impl From<TargetSet> for NotifyTargetSet {
    fn from(set: TargetSet) -> NotifyTargetSet {
        NotifyTargetSet {
            target: set.target.into(),
            signing_secret: set.secret.map(|s| s.expose().to_string()),
        }
    }
}

/// A new signing secret.
#[derive(Clone, Serialize, ToSchema)]
pub struct RotatedSecret {
    /// The tenant's new signing secret (`whsec_…`); the previous one keeps
    /// signing beside it for a day.
    pub signing_secret: String,
}

impl std::fmt::Debug for RotatedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RotatedSecret(<redacted>)")
    }
}

/// One delivery of a session's notification.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotificationView {
    /// The notification.
    pub id: Uuid,
    /// Its `webhook-id` header, the same on every attempt.
    pub webhook_id: String,
    /// The event's `seq` in the session's log.
    pub seq: i64,
    /// The event's kind.
    pub kind: String,
    /// Whose target: `session` or `tenant`.
    pub target: String,
    /// The target's scheme and host.
    pub url: String,
    /// `pending`, `delivered`, `failed` (attempts used up) or `disabled`
    /// (the receiver answered 410 Gone).
    pub status: String,
    /// Attempts made.
    pub attempts: i32,
    /// The last attempt's HTTP status.
    pub last_status: Option<i32>,
    /// What went wrong last.
    pub last_error: Option<String>,
    /// When it is tried next (pending only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was made (with its event).
    pub created_at: DateTime<Utc>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
}

impl From<NotificationRow> for NotificationView {
    fn from(n: NotificationRow) -> NotificationView {
        NotificationView {
            webhook_id: message_id(n.id),
            id: n.id,
            seq: n.seq,
            kind: n.kind,
            target: n.target,
            url: shown_url(&n.url),
            status: n.status,
            attempts: n.attempts,
            last_status: n.last_status,
            last_error: n.last_error,
            next_attempt_at: n.next_attempt_at,
            created_at: n.created_at,
            delivered_at: n.delivered_at,
        }
    }
}

/// A session's deliveries, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotificationList {
    /// The deliveries.
    pub items: Vec<NotificationView>,
}

/// How many deliveries to list.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NotificationQuery {
    /// 1 – 200 (default 50).
    pub limit: Option<i64>,
}

/// The tenant a tenant route acts for: the key's, or the one a global
/// admin names with `?tenant=`.
fn tenant_of(caller: &Principal) -> String {
    match &caller.scope {
        TenantScope::Tenant(t) => t.clone(),
        TenantScope::Global => caller.tenant.clone(),
    }
}

fn no_target() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "notify_target_not_found",
        "no notify target is set",
    )
}

/// Set the tenant's notify target (tenant admin; a global admin names the
/// tenant with `?tenant=`). The first target of a tenant makes its signing
/// secret and answers it, once.
#[utoipa::path(
    put, path = "/api/notify", tag = "notify",
    request_body = SetNotifyTarget,
    responses(
        (status = 200, description = "The target, with the signing secret when this call made it", body = NotifyTargetSet),
        (status = 403, description = "Not an admin, or the egress policy refuses the URL", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid URL or format", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set_tenant_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<SetNotifyTarget>,
) -> ApiResult<Json<NotifyTargetSet>> {
    let tenant = tenant_of(&caller);
    let format = req.format.unwrap_or(Format::Standard);
    let set = state
        .service
        .set_tenant_target(&tenant, req.url.trim(), format)
        .await?;
    tracing::info!(%tenant, url = %shown_url(&set.target.url), "tenant notify target set");
    Ok(Json(set.into()))
}

/// The tenant's notify target.
#[utoipa::path(
    get, path = "/api/notify", tag = "notify",
    responses(
        (status = 200, description = "The target", body = NotifyTargetView),
        (status = 404, description = "The tenant has no target", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_tenant_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<NotifyTargetView>> {
    let target = state.service.tenant_target(&tenant_of(&caller)).await?;
    target.map(|t| Json(t.into())).ok_or_else(no_target)
}

/// Remove the tenant's notify target (its pending deliveries go with it).
#[utoipa::path(
    delete, path = "/api/notify", tag = "notify",
    responses(
        (status = 204, description = "The tenant has no target now (whether or not it had one)"),
    )
)]
pub async fn delete_tenant_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<StatusCode> {
    // Idempotent: removing a target that is not there leaves none, too.
    state
        .service
        .delete_tenant_target(&tenant_of(&caller))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Make a new signing secret for the tenant and answer it, once. The
/// previous secret signs beside it (a second `v1,` signature) for a day.
#[utoipa::path(
    post, path = "/api/notify/secret/rotate", tag = "notify",
    responses((status = 200, description = "The new secret", body = RotatedSecret))
)]
pub async fn rotate_secret(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<RotatedSecret>> {
    let tenant = tenant_of(&caller);
    let secret = state.service.rotate_signing_secret(&tenant).await?;
    tracing::info!(%tenant, "notify signing secret rotated");
    Ok(Json(RotatedSecret {
        signing_secret: secret.expose().to_string(),
    }))
}

/// Set a session's own notify target (besides its tenant's). Answers the
/// tenant's signing secret when this call made it (the tenant had none).
#[utoipa::path(
    put, path = "/api/autonomous/{id}/notify", tag = "notify",
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = SetNotifyTarget,
    responses(
        (status = 200, description = "The target, with the signing secret when this call made it", body = NotifyTargetSet),
        (status = 403, description = "The egress policy refuses the URL", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid URL or format", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set_session_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiJson(req): ApiJson<SetNotifyTarget>,
) -> ApiResult<Json<NotifyTargetSet>> {
    let format = req.format.unwrap_or(Format::Standard);
    let set = state
        .service
        .set_session_target(id, &caller.scope, req.url.trim(), format)
        .await?;
    Ok(Json(set.into()))
}

/// A session's own notify target.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/notify", tag = "notify",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The target", body = NotifyTargetView),
        (status = 204, description = "The session has no target of its own (its tenant's, if any, applies)"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_session_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let target = state.service.session_target(id, &caller.scope).await?;
    Ok(match target {
        Some(t) => Json(NotifyTargetView::from(t)).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Remove a session's own notify target.
#[utoipa::path(
    delete, path = "/api/autonomous/{id}/notify", tag = "notify",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 204, description = "The session has no target of its own now (whether or not it had one)"),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_session_target(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<StatusCode> {
    // Idempotent: removing a target that is not there leaves none, too.
    state
        .service
        .delete_session_target(id, &caller.scope)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A session's notification deliveries, newest first: attempts, status,
/// the last error and when it is tried next.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/notifications", tag = "notify",
    params(("id" = Uuid, Path, description = "Session id"), NotificationQuery),
    responses(
        (status = 200, description = "The deliveries", body = NotificationList),
        (status = 404, description = "No such session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_notifications(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
    ApiQuery(q): ApiQuery<NotificationQuery>,
) -> ApiResult<Json<NotificationList>> {
    let limit = page_limit(q.limit, 50, MAX_LIST_LIMIT)?;
    let items = state
        .service
        .notifications(id, &caller.scope, limit)
        .await?
        .into_iter()
        .map(NotificationView::from)
        .collect();
    Ok(Json(NotificationList { items }))
}
