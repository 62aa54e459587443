//! The HTTP layer: routers per resource, problem+json errors, the OpenAPI
//! document and the docs page. Handlers only translate between HTTP and the
//! session service.

pub mod admission;
pub mod approvals;
mod assets;
mod auth;
pub mod budget_warnings;
pub mod error;
pub mod estimate;
pub mod event_stream;
mod extract;
mod files;
mod health;
pub mod history;
pub mod insights;
pub mod keys;
pub mod notify;
pub mod openapi;
mod paging;
pub mod replay;
pub mod retention;
pub mod serve;
pub mod sessions;
pub mod tree;
pub mod views;
pub mod workers;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnResponse, OnResponse, TraceLayer};

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
    /// Live-stream slots per tenant.
    pub streams: event_stream::StreamSlots,
}

/// The request timeout, the global concurrency limit, the body's read
/// deadline and the per-tenant and per-key shares
/// (`WARDEN_REQUEST_TIMEOUT_MS`, `WARDEN_MAX_CONCURRENT_REQUESTS`,
/// `WARDEN_BODY_READ_TIMEOUT_MS`, [`admission`]).
#[derive(Clone)]
pub struct RequestLimits {
    timeout: Duration,
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
    body_read_timeout: Duration,
    admission: admission::Admission,
}

impl RequestLimits {
    /// At most `max` requests at once, each for at most `timeout`, shared
    /// among tenants and keys as `shares` says.
    pub fn new(
        timeout: Duration,
        max: usize,
        shares: &crate::config::AdmissionLimits,
    ) -> RequestLimits {
        RequestLimits {
            timeout,
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(max)),
            max,
            body_read_timeout: shares.body_read_timeout,
            admission: admission::Admission::new(max, shares),
        }
    }
}

/// Whether a request is exempt from the timeout and the concurrency limit:
/// the probes (they must answer under load) and the documented live
/// streams, `GET /api/autonomous/events` and `GET /api/autonomous/{id}/events`
/// asked for as `text/event-stream` (they are meant to last; their own quota
/// is per tenant). Decided by method and route shape, so an event-stream
/// `Accept` on any other route changes nothing.
fn unlimited(req: &Request<axum::body::Body>) -> bool {
    exempt_route(
        req.method(),
        req.uri().path(),
        event_stream::wants_stream(req.headers()),
    )
}

/// The decision of [`unlimited`] from the method, the path as routed
/// (not decoded) and whether the request asks for an event stream.
pub fn exempt_route(method: &axum::http::Method, path: &str, wants_stream: bool) -> bool {
    use axum::http::Method;
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    if matches!(path, "/healthz" | "/readyz") {
        return true;
    }
    if method != Method::GET || !wants_stream {
        return false;
    }
    let Some(rest) = path.strip_prefix("/api/autonomous/") else {
        return false;
    };
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["events"] => true,
        [id, "events"] => uuid::Uuid::try_parse(id).is_ok(),
        _ => false,
    }
}

/// The longest wait a request may ask for on top of the request timeout:
/// a worker's claim (`wait_ms`) or waiting heartbeat; nothing for others.
fn long_poll_allowance<B>(req: &Request<B>) -> Duration {
    let path = req.uri().path();
    if req.method() != axum::http::Method::POST {
        Duration::ZERO
    } else if path == "/api/workers/claim" {
        Duration::from_millis(workers::MAX_CLAIM_WAIT_MS)
    } else if path.starts_with("/api/workers/tasks/") && path.ends_with("/heartbeat") {
        Duration::from_millis(workers::MAX_HEARTBEAT_WAIT_MS)
    } else {
        Duration::ZERO
    }
}

/// Sheds load rather than queueing it: a request over the concurrency
/// limit is answered 503 at once, and one that runs past the timeout is
/// cancelled (its transaction rolls back) and answered 503. A body must
/// arrive within `WARDEN_BODY_READ_TIMEOUT_MS` of the headers (408 and the
/// connection closed after). The slot is handed to the request
/// ([`admission::RequestSlot`]), so the gate can add the tenant's share and
/// a waiting claim can give both back.
async fn request_limits(
    axum::extract::State(limits): axum::extract::State<RequestLimits>,
    mut req: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::body::HttpBody;
    use axum::response::IntoResponse;
    if unlimited(&req) {
        return next.run(req).await;
    }
    let Ok(permit) = limits.permits.clone().try_acquire_owned() else {
        return ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "{} requests are in progress, the most WARDEN_MAX_CONCURRENT_REQUESTS allows; retry shortly",
                limits.max
            ),
        )
        .into_response();
    };
    let slot = admission::RequestSlot::new(limits.admission.clone(), permit);
    req.extensions_mut().insert(slot.clone());
    if !req.body().is_end_stream() {
        let read_by = tokio::time::Instant::now() + limits.body_read_timeout;
        req = req.map(|body| extract::read_by(body, read_by, limits.body_read_timeout));
    }
    // A claim or a heartbeat long-polls for up to its own bounded wait on top.
    let timeout = limits.timeout + long_poll_allowance(&req);
    let answered = tokio::time::timeout(timeout, next.run(req)).await;
    slot.release();
    match answered {
        Ok(mut response) => {
            if response.status() == axum::http::StatusCode::REQUEST_TIMEOUT {
                // The rest of a late body is not waited for.
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            response
        }
        Err(_) => ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            format!(
                "the request took longer than WARDEN_REQUEST_TIMEOUT_MS={} and was cancelled; retry shortly",
                limits.timeout.as_millis()
            ),
        )
        .into_response(),
    }
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
pub fn router(state: AppState, max_body_bytes: usize, limits: RequestLimits) -> Router {
    let mcp_servers = state.service.mcp_servers();
    let api = sessions::router()
        .merge(estimate::router())
        .merge(replay::router())
        .merge(history::router())
        .merge(files::router())
        .merge(approvals::router())
        .merge(tree::router())
        .merge(notify::session_router())
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let keys =
        keys::router().method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let workers =
        workers::router().method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let retention = retention::router()
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let budget_warnings = budget_warnings::router()
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let notify = notify::tenant_router()
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let insights =
        insights::router().method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    Router::new()
        .nest("/api/autonomous", api)
        .nest("/api/keys", keys)
        .nest("/api/workers", workers)
        .nest("/api/retention", retention)
        .nest("/api/budget-warnings", budget_warnings)
        .nest("/api/notify", notify)
        .nest("/api/insights", insights)
        .merge(health::router())
        .merge(openapi::router(&mcp_servers))
        .merge(assets::router())
        // Every route, health and docs included, answers a wrong method with a problem.
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(|| async { ApiError::no_route() })
        // Once the gate knows the caller, its tenant's share of the slots.
        .layer(axum::middleware::from_fn(admission::tenant_share))
        // Every request, known route or not, passes the one auth gate.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::Extension(extract::BodyLimit(max_body_bytes)))
        .layer(axum::Extension(extract::BodyShapes(openapi::spec())))
        .layer(axum::middleware::from_fn_with_state(limits, request_limits))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(axum::middleware::from_fn(request_trace))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| request_span(req))
                .on_response(
                    |res: &axum::http::Response<_>, latency: Duration, span: &tracing::Span| {
                        if crate::telemetry::enabled() && !span.is_disabled() {
                            let status = res.status();
                            span.record("http.response.status_code", i64::from(status.as_u16()));
                            if status.is_server_error() {
                                span.record("error.type", status.as_str());
                                span.record("otel.status_code", "ERROR");
                            }
                        }
                        DefaultOnResponse::default().on_response(res, latency, span);
                    },
                ),
        )
}

/// Serves the request with its server span's `traceparent` at hand
/// ([`crate::telemetry::request_traceparent`]), so what the request starts
/// (a session's runs) can link back to it.
async fn request_trace(
    req: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if !crate::telemetry::enabled() {
        return next.run(req).await;
    }
    let traceparent = crate::telemetry::traceparent();
    crate::telemetry::with_request_traceparent(traceparent, next.run(req)).await
}

/// The span of one request: the log's `request` span, exported as an HTTP
/// server span named by its route template (`http.route`, from axum's
/// matched path; the raw path is `url.path`, the query `url.query`: the
/// API takes no secret in a query),
/// under the caller's `traceparent` when it sends one.
fn request_span<B>(req: &Request<B>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str);
    let method = req.method().as_str();
    // The attribute names of the HTTP conventions, in the log too.
    let span = tracing::info_span!(
        "request",
        http.request.method = method,
        url.path = req.uri().path(),
        url.scheme = tracing::field::Empty,
        url.query = tracing::field::Empty,
        http.route = tracing::field::Empty,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if !crate::telemetry::enabled() || span.is_disabled() {
        return span;
    }
    span.record("otel.kind", "server");
    span.record("url.scheme", req.uri().scheme_str().unwrap_or("http"));
    if let Some(query) = req.uri().query().filter(|q| !q.is_empty()) {
        span.record("url.query", query);
    }
    match route {
        Some(route) => {
            span.record("otel.name", format!("{method} {route}").as_str());
            span.record("http.route", route);
        }
        None => {
            span.record("otel.name", method);
        }
    }
    let traceparent = req
        .headers()
        .get(crate::telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    if let Some(traceparent) = traceparent {
        crate::telemetry::continue_trace(&span, traceparent);
    }
    span
}

/// How long in-flight requests may take to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::{exempt_route, long_poll_allowance};
    use axum::http::Method;
    use std::time::Duration;

    #[test]
    fn only_a_claim_and_a_heartbeat_may_wait_past_the_request_timeout() {
        let req = |method: Method, path: &str| {
            axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .expect("a request")
        };
        let beat = "/api/workers/tasks/0b6f6a3e-3d7c-4c59-9d8a-1f2e3d4c5b6a/heartbeat";
        let claim_wait = Duration::from_millis(super::workers::MAX_CLAIM_WAIT_MS);
        let beat_wait = Duration::from_millis(super::workers::MAX_HEARTBEAT_WAIT_MS);
        assert_eq!(
            long_poll_allowance(&req(Method::POST, "/api/workers/claim")),
            claim_wait
        );
        assert_eq!(long_poll_allowance(&req(Method::POST, beat)), beat_wait);
        for (method, path) in [
            (Method::GET, "/api/workers/claim"),
            (Method::GET, beat),
            (Method::POST, "/api/workers/tasks/x/complete"),
            (Method::POST, "/api/autonomous"),
        ] {
            assert_eq!(
                long_poll_allowance(&req(method, path)),
                Duration::ZERO,
                "{path}"
            );
        }
    }

    #[test]
    fn only_the_probes_and_the_stream_routes_are_exempt() {
        let id = "0b6f6a3e-3d7c-4c59-9d8a-1f2e3d4c5b6a";
        let session_events = format!("/api/autonomous/{id}/events");
        let session = format!("/api/autonomous/{id}");
        let pause = format!("/api/autonomous/{id}/pause");
        let twice = format!("/api/autonomous/{id}/events/events");
        // (method, path, asks for an event stream, exempt)
        let table: &[(Method, &str, bool, bool)] = &[
            (Method::GET, "/healthz", false, true),
            (Method::HEAD, "/healthz", false, true),
            (Method::GET, "/readyz", true, true),
            (Method::POST, "/healthz", false, false),
            (Method::GET, "/api/autonomous/events", true, true),
            (Method::GET, &session_events, true, true),
            // The stream routes as plain reads are ordinary requests.
            (Method::GET, "/api/autonomous/events", false, false),
            (Method::GET, &session_events, false, false),
            (Method::HEAD, &session_events, true, false),
            (Method::POST, &session_events, true, false),
            (Method::POST, "/api/autonomous/events", true, false),
            // Any other route, event-stream Accept or not.
            (Method::GET, "/api/autonomous", true, false),
            (Method::GET, "/api/autonomous/", true, false),
            (Method::GET, &session, true, false),
            (Method::POST, &pause, true, false),
            (Method::GET, "/api/autonomous/outcomes", true, false),
            (Method::GET, "/api/keys", true, false),
            (Method::GET, "/metrics", true, false),
            (Method::GET, "/", true, false),
            (Method::GET, "/nope/events", true, false),
            // Near misses of the route shape.
            (Method::GET, "/api/autonomous/events/", true, false),
            (Method::GET, "/api/autonomous//events", true, false),
            (
                Method::GET,
                "/api/autonomous/not-a-uuid/events",
                true,
                false,
            ),
            (Method::GET, &twice, true, false),
            (Method::GET, "/api/autonomous/%65vents", true, false),
            (Method::GET, "/API/autonomous/events", true, false),
            (Method::GET, "/healthz/", false, false),
            (Method::GET, "/api/keys/events", true, false),
        ];
        for (method, path, wants, exempt) in table {
            assert_eq!(
                exempt_route(method, path, *wants),
                *exempt,
                "{method} {path} stream={wants}"
            );
        }
    }
}
