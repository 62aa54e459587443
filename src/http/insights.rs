//! `/api/insights`: what a tenant's stored sessions teach about its
//! thresholds, and applying one to the tenant as an audited decision.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, ApiQuery};
use super::paging::{MAX_LIST_LIMIT, next_after, page_limit};
use crate::auth::Principal;
use crate::policy::insights::ThresholdReport;
use crate::session::{ApplyThreshold, TenantScope, ThresholdChange};

/// The routes, relative to `/api/insights`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/thresholds", get(threshold_report))
        .route("/thresholds/apply", post(apply_threshold))
        .route("/thresholds/changes", get(threshold_changes))
}

/// How a tenant's sessions ended against their thresholds.
///
/// Reads the tenant's most recent settled sessions (ended or paused, at
/// most 2,000) and answers: how they ended; for each policy pause, how
/// many a person resumed and how many of those then completed (a
/// premature pause); how outcomes fall against each limit's value; an
/// iteration limit that cuts no completion short, with exactly what it
/// would have changed; how the reflector's `percentComplete` foretold
/// the end (of the reflections in each 10 % band, how many were in
/// sessions that completed within 5, 10 and 20 iterations); and the
/// thresholds applied to the tenant (`applied`). An admin names another
/// tenant with `?tenant=`.
#[utoipa::path(
    get, path = "/api/insights/thresholds", tag = "sessions",
    responses(
        (status = 200, description = "The report", body = ThresholdReport),
        (status = 503, description = "The database is unreachable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn threshold_report(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<ThresholdReport>> {
    let tenant = super::sessions::new_session_tenant(&caller)?;
    Ok(Json(
        state
            .service
            .threshold_report(&caller.scope, tenant)
            .await?,
    ))
}

/// A threshold to apply to a tenant.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyThresholdRequest {
    /// The tenant whose new sessions get it: any for a global admin; a
    /// tenant's admin may name only its own. Default: the key's tenant
    /// (a global admin's `?tenant=`).
    pub tenant: Option<String>,
    /// The `limits.max_iterations` the tenant's sessions created without
    /// one get (in either mode); `null`: back to the server's default.
    /// Required.
    #[serde(deserialize_with = "nullable")]
    #[schema(required = true, value_type = Option<u64>, example = 24)]
    pub max_iterations: Option<u64>,
    /// Why, in the operator's words (at most 500 characters), logged with
    /// the change.
    pub note: Option<String>,
}

/// A field that must be present and may be `null`.
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

/// The tenant a change is applied to: the one named (a global admin's
/// choice, or a tenant admin's own), else the caller's.
fn apply_tenant<'a>(caller: &'a Principal, named: Option<&'a str>) -> ApiResult<&'a str> {
    let own = super::sessions::new_session_tenant(caller)?;
    match named {
        None => Ok(own),
        Some(tenant) if caller.global || tenant == own => Ok(tenant),
        Some(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a tenant's admin applies thresholds to its own tenant only",
        )),
    }
}

/// Apply a threshold to a tenant (admin: a global admin for any tenant, a
/// tenant's admin for its own): the `limits.max_iterations` its sessions
/// created without one get from now on (sessions created already keep
/// theirs; a create's own value wins). The tenant's newest settled
/// sessions (at most 1,000, as the threshold report's suggestion) are
/// replayed under the value first — for `null`, under the server's
/// default — and the change is logged with that replay, who applied it
/// and when, in the same transaction. Answers the logged change.
#[utoipa::path(
    post, path = "/api/insights/thresholds/apply", tag = "sessions",
    request_body = ApplyThresholdRequest,
    responses(
        (status = 201, description = "Applied; the logged change", body = ThresholdChange),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin, or a tenant's admin naming another tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The value is in force for the tenant already (`threshold_unchanged`): nothing was logged", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An unknown field, a wrong type, a missing `max_iterations`, a value out of range, an invalid tenant or a note over 500 characters", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn apply_threshold(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<ApplyThresholdRequest>,
) -> ApiResult<(StatusCode, Json<ThresholdChange>)> {
    let tenant = apply_tenant(&caller, req.tenant.as_deref())?.to_string();
    let scope = if caller.global {
        TenantScope::tenant_only(&tenant)
    } else {
        caller.scope.clone()
    };
    let change = state
        .service
        .apply_threshold(
            &scope,
            ApplyThreshold {
                tenant,
                max_iterations: req.max_iterations,
                note: req.note,
                applied_by: caller.actor.clone(),
            },
        )
        .await?;
    tracing::info!(tenant = %change.tenant, previous = ?change.previous, value = ?change.value,
        applied_by = %change.applied_by, "threshold applied");
    Ok((StatusCode::CREATED, Json(change)))
}

/// Paging of a tenant's threshold changes.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ChangesQuery {
    /// `next_before` of the previous page: changes numbered below it.
    pub before: Option<i64>,
    /// Page size, 1 – 200 (default 50).
    pub limit: Option<i64>,
    /// A global admin: this tenant's changes (default: the key's tenant).
    pub tenant: Option<String>,
}

/// A page of threshold changes, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ThresholdChangePage {
    /// The changes.
    pub items: Vec<ThresholdChange>,
    /// Pass as `before` for the next page; absent on the last.
    pub next_before: Option<i64>,
}

/// The log of a tenant's applied thresholds, newest first: each change
/// with the value before and after, who applied it and when, its note and
/// the replay that justified it. An admin names another tenant with
/// `?tenant=`.
#[utoipa::path(
    get, path = "/api/insights/thresholds/changes", tag = "sessions",
    params(ChangesQuery),
    responses(
        (status = 200, description = "A page of changes", body = ThresholdChangePage),
        (status = 400, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn threshold_changes(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ChangesQuery>,
) -> ApiResult<Json<ThresholdChangePage>> {
    let tenant = super::sessions::new_session_tenant(&caller)?;
    let limit = page_limit(q.limit, 50, MAX_LIST_LIMIT)?;
    let items = state
        .service
        .threshold_changes(&caller.scope, tenant, q.before, limit)
        .await?;
    let next_before = next_after(&items, limit, |c| c.id);
    Ok(Json(ThresholdChangePage { items, next_before }))
}
