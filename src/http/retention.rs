//! `/api/retention`: how long each tenant's ended sessions are kept before
//! the pruner archives and deletes them (admin only; the gate in `auth.rs`
//! enforces it). The server's `WARDEN_RETENTION_DAYS` applies to every
//! tenant without a retention of its own; a global admin sets a tenant's.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::ApiJson;
use crate::auth::Principal;
use crate::policy::retention::TenantRetention;

/// The retention routes, relative to `/api/retention`.
pub fn router() -> Router<AppState> {
    Router::new().route("/", get(list_retention).put(set_retention))
}

/// A retention written as the API reads it: `forever`, `default` (the
/// server's), or days (`30`) or a span with a unit (`12h`, `90s`).
fn written(retention: Option<Duration>) -> String {
    match retention {
        None => "forever".into(),
        Some(keep) if keep.as_secs() % 86_400 == 0 => format!("{}d", keep.as_secs() / 86_400),
        Some(keep) => format!("{}s", keep.as_secs()),
    }
}

/// How long one tenant's ended sessions are kept.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TenantRetentionView {
    /// The tenant.
    pub tenant: String,
    /// `forever`, or a span such as `30d` or `90s`.
    pub keep: String,
    /// The same in seconds; `null` is forever.
    pub retention_seconds: Option<u64>,
}

/// The server's retention and the tenants with one of their own.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetentionList {
    /// `WARDEN_RETENTION_DAYS`: `forever` when unset, else a span.
    pub server_default: String,
    /// The same in seconds; `null` is forever.
    pub server_default_seconds: Option<u64>,
    /// Tenants with their own retention, by name (a tenant admin sees its own only).
    pub tenants: Vec<TenantRetentionView>,
}

/// A tenant's retention to set.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRetention {
    /// The tenant: 1 to 64 letters, digits, `-`, `_` or `.`.
    pub tenant: String,
    /// `forever`; `default` (back to the server's `WARDEN_RETENTION_DAYS`);
    /// or days (`30`) or a span with a unit s, m, h or d (`12h`, `90s`).
    pub keep: String,
}

fn view(tenant: String, retention: Option<Duration>) -> TenantRetentionView {
    TenantRetentionView {
        tenant,
        keep: written(retention),
        retention_seconds: retention.map(|d| d.as_secs()),
    }
}

/// The server's retention and every tenant's own (admin; a tenant admin
/// sees its own tenant only).
#[utoipa::path(
    get, path = "/api/retention", tag = "retention",
    responses((status = 200, description = "Retention in force", body = RetentionList))
)]
pub async fn list_retention(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<RetentionList>> {
    let tenant = (!caller.global).then_some(caller.tenant.as_str());
    let (server, tenants) = state.service.retentions(tenant).await?;
    Ok(Json(RetentionList {
        server_default: written(server),
        server_default_seconds: server.map(|d| d.as_secs()),
        tenants: tenants
            .into_iter()
            .map(|(name, r)| view(name, crate::policy::retention::retention_of(server, r)))
            .collect(),
    }))
}

/// Set how long a tenant's ended sessions are kept before they are
/// archived and deleted (global admin). `default` gives the tenant the
/// server's retention again.
#[utoipa::path(
    put, path = "/api/retention", tag = "retention",
    request_body = SetRetention,
    responses(
        (status = 200, description = "The tenant's retention now", body = TenantRetentionView),
        (status = 403, description = "Only a global admin sets a tenant's retention", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid tenant or retention", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set_retention(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<SetRetention>,
) -> ApiResult<Json<TenantRetentionView>> {
    if !caller.global {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only a global admin sets a tenant's retention",
        ));
    }
    let retention = match req.keep.trim() {
        "forever" => TenantRetention::Forever,
        "default" => TenantRetention::ServerDefault,
        text => crate::config::parse_retention(text)
            .map(TenantRetention::Keep)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!(
                        "keep: {text:?} is no retention: forever, default, days (30) or a span with a unit s, m, h or d (12h)"
                    ),
                )
            })?,
    };
    state.service.set_retention(&req.tenant, retention).await?;
    tracing::info!(tenant = %req.tenant, keep = %req.keep, "tenant retention set");
    let (server, _) = state.service.retentions(Some(&req.tenant)).await?;
    Ok(Json(view(
        req.tenant,
        crate::policy::retention::retention_of(server, retention),
    )))
}
