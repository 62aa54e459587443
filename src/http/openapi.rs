//! The OpenAPI document (generated from the handlers and types by utoipa,
//! committed as `openapi/openapi.json`) and a docs page that works offline.

use axum::Router;
use utoipa::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

use super::AppState;

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Warden",
        description = "Runs and supervises long-running autonomous agent sessions: guardrails, a per-step continue gate, checkpoints and resume.",
        license(name = "MIT")
    ),
    paths(
        super::sessions::create_session,
        super::sessions::list_sessions,
        super::sessions::get_session,
        super::sessions::update_session,
        super::sessions::stop_session,
        super::sessions::pause_session,
        super::sessions::resume_session,
        super::sessions::list_iterations,
        super::sessions::list_checkpoints,
        super::sessions::list_events,
        super::sessions::list_decisions,
        super::sessions::list_reflections,
        super::sessions::refine_session,
        super::sessions::list_refinements,
        super::sessions::list_tasks,
        super::sessions::outcomes,
        super::sessions::session_changes,
        super::health::healthz,
        super::health::readyz,
        super::health::metrics,
    ),
    components(schemas(
        crate::executor::WebhookRequest,
        crate::executor::WebhookResponse,
        crate::executor::WebhookHistoryItem,
        crate::executor::WebhookSignal,
    )),
    tags(
        (name = "sessions", description = "Create, list and inspect sessions"),
        (name = "control", description = "Stop, pause, resume and retune sessions"),
        (name = "history", description = "Iterations, checkpoints, events and decisions"),
        (name = "health", description = "Probes"),
    )
)]
pub struct ApiDoc;

/// The document as served and committed (pretty JSON, trailing newline).
pub fn document() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    json.push('\n');
    json
}

/// `/openapi.json` and the docs page at `/docs`.
pub fn router() -> Router<AppState> {
    // SwaggerUi serves both the page (vendored assets, no CDN) and the document.
    SwaggerUi::new("/docs")
        .url("/openapi.json", ApiDoc::openapi())
        .into()
}
