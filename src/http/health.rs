//! Liveness and readiness probes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use super::AppState;
use super::views::Health;

/// `/healthz` and `/readyz`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Ready to serve: Postgres answers.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Postgres does not answer", body = Health),
    ))]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    // Its own short timeout: a probe must answer within a second, also
    // while Postgres is down and the pool waits for a connection.
    let within = std::time::Duration::from_millis(800);
    match state.service.reads().ping_within(within).await {
        Ok(()) => (
            StatusCode::OK,
            Json(Health {
                status: "ok".into(),
            }),
        ),
        Err(err) => {
            tracing::warn!(error = %err, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: "database unavailable".into(),
                }),
            )
        }
    }
}

/// Prometheus metrics of this process, with fleet-wide session counts.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 503, description = "Postgres does not answer", body = Health),
    ))]
pub async fn metrics(State(state): State<AppState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match state.service.reads().sessions_by_status().await {
        Ok(sessions) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            state
                .metrics
                .render(&sessions, state.service.workers().desk()),
        )
            .into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "metrics: cannot count sessions");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: "database unavailable".into(),
                }),
            )
                .into_response()
        }
    }
}
