//! Errors at the HTTP edge, all answered as `application/problem+json`
//! (RFC 9457) with a clear `detail` and a machine-readable `code`.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::session::ServiceError;
use crate::session::StoreError;

/// The problem document every error answers with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// Problem type URI; `about:blank` means the status code says it all.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary (the HTTP reason phrase).
    pub title: String,
    /// HTTP status code.
    pub status: u16,
    /// What exactly was wrong, for a person.
    pub detail: String,
    /// Stable machine-readable code, e.g. `illegal_transition`.
    pub code: String,
}

/// An error answered to a client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    detail: String,
    /// Seconds for a `Retry-After` header, when the error says when to retry.
    retry_after: Option<u32>,
}

/// Shorthand for handler results.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with the given status, code and detail.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The same error, telling the client to retry after `seconds`.
    pub fn with_retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// 400 with code `bad_request`.
    pub fn bad_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// 404 for an unknown route.
    pub fn no_route() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
    }

    /// 405 for a known route with another method.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this endpoint does not accept that method",
        )
    }

    /// 500 for a fault of ours: the cause is logged, the answer says nothing of it.
    pub(super) fn internal(err: &dyn std::fmt::Display) -> ApiError {
        // The cause is logged, never sent: it may carry connection details.
        tracing::error!(error = %err, "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "an internal error occurred; it has been logged",
        )
    }
}

impl ApiError {
    /// The problem document this error answers with.
    pub fn problem(&self) -> Problem {
        Problem {
            kind: "about:blank".into(),
            title: self
                .status
                .canonical_reason()
                .unwrap_or("Error")
                .to_string(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let mut response = (self.status, axum::Json(problem)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        } else if matches!(
            self.code,
            "database_unavailable" | "overloaded" | "request_timeout"
        ) {
            // An outage is usually short: tell clients when to come back.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(err: ServiceError) -> ApiError {
        match err {
            ServiceError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "session_not_found", err.to_string())
            }
            ServiceError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, "illegal_transition", err.to_string())
            }
            ServiceError::LimitExhausted { .. } => {
                ApiError::new(StatusCode::CONFLICT, "limit_exhausted", err.to_string())
            }
            ServiceError::Invalid(detail) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
            }
            // The request is right; this server's configuration is what
            // conflicts with it (no WARDEN_MODEL_PRICES).
            ServiceError::Unpriced(detail) => {
                ApiError::new(StatusCode::CONFLICT, "no_price_table", detail)
            }
            ServiceError::EgressDenied(detail) => {
                ApiError::new(StatusCode::FORBIDDEN, "egress_denied", detail)
            }
            ServiceError::Unavailable(detail) => {
                tracing::error!(%detail, "service unavailable");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
            }
            ServiceError::Quota { code, detail } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, detail)
            }
            ServiceError::KeyUsed { same_request, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                if same_request {
                    "this Idempotency-Key was used already; retry to get its session".to_string()
                } else {
                    "this Idempotency-Key was used with a different request body in the last 24 hours; use a new key for a new request".to_string()
                },
            ),
            ServiceError::ApprovalNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "approval_not_found", err.to_string())
            }
            ServiceError::AlreadyDecided { .. } => {
                ApiError::new(StatusCode::CONFLICT, "already_decided", err.to_string())
            }
            ServiceError::CapabilityUnavailable { .. } => ApiError::new(
                StatusCode::CONFLICT,
                "capability_unavailable",
                err.to_string(),
            ),
            ServiceError::CarvedBudget(_) => {
                ApiError::new(StatusCode::CONFLICT, "carved_budget", err.to_string())
            }
            ServiceError::ApprovalsWaiting { .. } => {
                ApiError::new(StatusCode::CONFLICT, "approvals_waiting", err.to_string())
            }
            ServiceError::Missing(detail) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
            }
            ServiceError::BadPath(detail) => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_path", detail)
            }
            ServiceError::NotForkable(detail) => {
                ApiError::new(StatusCode::CONFLICT, "not_forkable", detail)
            }
            ServiceError::ThresholdUnchanged(detail) => {
                ApiError::new(StatusCode::CONFLICT, "threshold_unchanged", detail)
            }
            ServiceError::Secret(_) | ServiceError::Archive(_) => ApiError::internal(&err),
            ServiceError::Store(store) => ApiError::from(store),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> ApiError {
        match &err {
            StoreError::Database(db) if crate::session::is_unavailable(db) => {
                tracing::error!(error = %err, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unavailable",
                    "the database is not reachable right now; retry shortly",
                )
            }
            _ => ApiError::internal(&err),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> ApiError {
        let status = rejection.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "payload_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, code, rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> ApiError {
        ApiError::bad_request(format!("invalid path: {}", rejection.body_text()))
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(err: serde_json::Error) -> ApiError {
        use serde_json::error::Category;
        match err.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request(format!("malformed JSON: {err}"))
            }
            Category::Data => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("invalid request body: {err}"),
            ),
        }
    }
}
