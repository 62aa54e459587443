//! `/api/insights`: what a tenant's stored sessions teach about its
//! thresholds.

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Json, Router};

use super::AppState;
use super::error::{ApiResult, Problem};
use crate::auth::Principal;
use crate::policy::insights::ThresholdReport;

/// The routes, relative to `/api/insights`.
pub fn router() -> Router<AppState> {
    Router::new().route("/thresholds", get(threshold_report))
}

/// How a tenant's sessions ended against their thresholds.
///
/// Reads the tenant's most recent settled sessions (ended or paused, at
/// most 2,000) and answers: how they ended; for each policy pause, how
/// many a person resumed and how many of those then completed (a
/// premature pause); how outcomes fall against each limit's value; an
/// iteration limit that cuts no completion short, with exactly what it
/// would have changed; and how the reflector's `percentComplete` foretold
/// the end (of the reflections in each 10 % band, how many were in
/// sessions that completed within 5, 10 and 20 iterations). An admin
/// names another tenant with `?tenant=`.
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
