//! `POST /api/autonomous/estimate`: what a create request would likely
//! take, before anything is created.

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Json, Router};

use super::AppState;
use super::error::{ApiResult, Problem};
use super::extract::ApiJson;
use crate::auth::Principal;
use crate::session::CreateSession;
use crate::session::estimate::EstimateAnswer;

/// The estimate route, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new().route("/estimate", post(estimate_session))
}

/// Estimate a session before creating it.
///
/// Takes the body a create takes and answers the likely iterations, tokens,
/// running time and cost as a p50 and a p90, drawn from the tenant's
/// completed sessions with the same executor kind and model and the most
/// similar goals (TF-IDF cosine of goal and success criteria). `basis` says
/// what the figures rest on: `similar_goals`, `same_executor` (too few
/// similar goals), or `none` (fewer than 5 such sessions: the figures are
/// the session's limits, not a prediction). The goal, the limits, the
/// executor's shape and the request's own rules (`confirm_if_over` not
/// with `subgoals`) are checked as a create checks them; whether the server
/// can run the executor (a default model, an allowed URL) is not (a
/// create's `dry_run` checks everything). Nothing is created.
#[utoipa::path(
    post, path = "/api/autonomous/estimate", tag = "sessions",
    request_body = CreateSession,
    responses(
        (status = 200, description = "The estimate and its basis", body = EstimateAnswer),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An unknown field, a wrong type, an empty or ambiguous goal, an out-of-range limit, a malformed executor, a bad `confirm_if_over`, or `confirm_if_over` with subgoals", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn estimate_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<CreateSession>,
) -> ApiResult<Json<EstimateAnswer>> {
    let tenant = super::sessions::new_session_tenant(&caller)?;
    Ok(Json(state.service.estimate_draft(&body, tenant).await?))
}
