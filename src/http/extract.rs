//! Extractors whose rejections are problem documents, so malformed JSON,
//! unknown fields, bad ids and oversized bodies all answer the same way.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Path parameters, rejected as a 400 problem.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Query parameters, rejected as a 400 problem.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// A required JSON body.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// A JSON body that may be absent (an empty body means the default).
#[derive(Debug)]
pub struct OptionalJson<T>(pub T);

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if mime == "application/json" || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json",
        ))
    }
}

/// Parses in two passes so that malformed JSON (400) is told apart from
/// well-formed JSON of the wrong shape (422) whatever comes first in the text.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    // Postgres stores no NUL character: refuse it here, naming the field,
    // rather than fail (500) when the text reaches the database.
    if let Some(path) = crate::session::control::find_nul(&value) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("invalid request body at `{path}`: text must not contain NUL (\\u0000)"),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let detail = if path == "." {
            format!("invalid request body: {inner}")
        } else {
            format!("invalid request body at `{path}`: {inner}")
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
    })
}

async fn body_of<S: Send + Sync>(req: Request, state: &S) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, state).await?;
    Ok((headers, bytes))
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body_of(req, state).await?;
        check_content_type(&headers)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request("a JSON request body is required"));
        }
        Ok(ApiJson(parse(&bytes)?))
    }
}

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body_of(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        check_content_type(&headers)?;
        Ok(OptionalJson(parse(&bytes)?))
    }
}
