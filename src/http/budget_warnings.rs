//! `/api/budget-warnings`: each tenant's own soft-budget thresholds (admin
//! only; the gate in `auth.rs` enforces it). A session created without
//! `limits.warn_at` gets its tenant's, else the server's `[50, 80, 95]`.

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

/// The routes, relative to `/api/budget-warnings`.
pub fn router() -> Router<AppState> {
    Router::new().route("/", get(list_warn_at).put(set_warn_at))
}

/// One tenant's thresholds.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TenantWarnAtView {
    /// The tenant.
    pub tenant: String,
    /// The percentages its sessions warn at, ascending (`[]`: never).
    pub warn_at: Vec<u8>,
}

/// The server's thresholds and the tenants with their own.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WarnAtList {
    /// What a session gets when neither it nor its tenant sets `warn_at`.
    pub server_default: Vec<u8>,
    /// Tenants with their own, by name (a tenant admin sees its own only).
    pub tenants: Vec<TenantWarnAtView>,
}

/// A tenant's thresholds to set.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetWarnAt {
    /// The tenant: 1 to 64 letters, digits, `-`, `_` or `.`.
    pub tenant: String,
    /// Percentages 1 to 99, at most 10 (`[]`: its sessions never warn);
    /// `null` gives the tenant the server's again.
    #[schema(value_type = Option<Vec<u8>>, example = json!([60, 90]))]
    pub warn_at: Option<Vec<u8>>,
}

/// The server's soft-budget thresholds and every tenant's own (admin; a
/// tenant admin sees its own tenant only).
#[utoipa::path(
    get, path = "/api/budget-warnings", tag = "retention",
    responses((status = 200, description = "Thresholds in force", body = WarnAtList))
)]
pub async fn list_warn_at(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<WarnAtList>> {
    let tenant = (!caller.global).then_some(caller.tenant.as_str());
    let (server, tenants) = state.service.warn_ats(tenant).await?;
    Ok(Json(WarnAtList {
        server_default: server,
        tenants: tenants
            .into_iter()
            .map(|(tenant, warn_at)| TenantWarnAtView { tenant, warn_at })
            .collect(),
    }))
}

/// Set the soft-budget thresholds a tenant's new sessions get when their
/// create does not set `limits.warn_at` (global admin). Sessions created
/// already keep theirs.
#[utoipa::path(
    put, path = "/api/budget-warnings", tag = "retention",
    request_body = SetWarnAt,
    responses(
        (status = 200, description = "The tenant's thresholds now", body = TenantWarnAtView),
        (status = 403, description = "Only a global admin sets a tenant's thresholds", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid tenant or thresholds", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set_warn_at(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<SetWarnAt>,
) -> ApiResult<Json<TenantWarnAtView>> {
    if !caller.global {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only a global admin sets a tenant's budget-warning thresholds",
        ));
    }
    let warn_at = state
        .service
        .set_warn_at(&req.tenant, req.warn_at.as_deref())
        .await?;
    tracing::info!(tenant = %req.tenant, ?warn_at, "tenant budget-warning thresholds set");
    Ok(Json(TenantWarnAtView {
        tenant: req.tenant,
        warn_at,
    }))
}
