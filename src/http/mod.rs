//! The HTTP layer: routers per resource, problem+json errors, the OpenAPI
//! document and the docs page. Handlers only translate between HTTP and the
//! session service.

mod auth;
pub mod error;
mod extract;
mod health;
pub mod keys;
pub mod openapi;
pub mod sessions;
pub mod stream;
pub mod views;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::session::SessionService;
use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// Session operations.
    pub service: SessionService,
    /// This process's metrics.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Who may call what.
    pub auth: crate::auth::Authenticator,
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    use axum::response::IntoResponse;
    tracing::error!("a request handler panicked");
    ApiError::new(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        "an internal error occurred; it has been logged",
    )
    .into_response()
}

/// The whole application router.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    let api =
        sessions::router().method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let keys =
        keys::router().method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    Router::new()
        .nest("/api/autonomous", api)
        .nest("/api/keys", keys)
        .merge(health::router())
        .merge(openapi::router())
        .route("/", axum::routing::get(dashboard))
        // Every route, health and docs included, answers a wrong method with a problem.
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(|| async { ApiError::no_route() })
        // Every request, known route or not, passes the one auth gate.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::Extension(extract::BodyLimit(max_body_bytes)))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request<_>| {
                tracing::info_span!("request", method = %req.method(), path = %req.uri().path())
            }),
        )
}

/// The web dashboard: one self-contained page (no CDN) over the public API.
async fn dashboard() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("../../web/index.html"))
}

/// How long in-flight requests may take to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
