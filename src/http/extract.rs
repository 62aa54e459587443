//! Extractors whose rejections are problem documents, so malformed JSON,
//! unknown fields, bad ids and oversized bodies all answer the same way.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::header;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::error::ApiError;

/// The `{id}` of a session route. Only the canonical spelling is taken:
/// 36 characters, hex digits (either case) in groups of 8-4-4-4-12 joined by
/// `-`, written as such on the wire. Every other spelling (percent-encoded
/// characters, braces, `urn:uuid:`, no dashes) answers the same 404 as a
/// missing session, so one session has one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for SessionId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        path_id(parts, "id")
            .map(SessionId)
            .ok_or_else(session_not_found)
    }
}

/// The `{task_id}` of a worker task route, in its one spelling (as
/// [`SessionId`]); any other answers the 404 of a missing task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        path_id(parts, "task_id").map(TaskId).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "task_not_found",
                "no such task (a task id is written as 8-4-4-4-12 hex digits)",
            )
        })
    }
}

/// The `{id}` of a key route, in its one spelling (as [`SessionId`]); any
/// other answers the 404 of a missing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for KeyId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        path_id(parts, "id").map(KeyId).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "key_not_found",
                "no such key (a key id is written as 8-4-4-4-12 hex digits)",
            )
        })
    }
}

/// The `{call_id}` of an approval route exactly as the request wrote it,
/// not percent-decoded (`1%2E0` is not the call `1.0`); `None` when the
/// route has none. The handler checks its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenCallId(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for WrittenCallId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(WrittenCallId(
            written_param(parts, "call_id").map(str::to_string),
        ))
    }
}

/// The path parameter `name` as the request wrote it (never
/// percent-decoded): the segment of the request's path standing where the
/// matched route has `{name}`. Counted from the end, because a nested
/// router sees its path without the prefix it is nested under while the
/// matched route is the whole one; a parameter holds no `/`, so segments
/// line up.
fn written_param<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    let route = parts.extensions.get::<MatchedPath>()?.as_str();
    let placeholder = format!("{{{name}}}");
    let from_end = route.split('/').rev().position(|s| s == placeholder)?;
    parts.uri.path().split('/').rev().nth(from_end)
}

/// The id in parameter `name`, when the request wrote it canonically.
fn path_id(parts: &Parts, name: &str) -> Option<Uuid> {
    written_param(parts, name).and_then(canonical_uuid)
}

fn session_not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "session_not_found",
        "no such session (a session id is written as 8-4-4-4-12 hex digits)",
    )
}

/// `text` as a UUID when it is in the canonical hyphenated form (hex digits
/// of either case), else `None`.
pub fn canonical_uuid(text: &str) -> Option<Uuid> {
    let bytes = text.as_bytes();
    let canonical = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    canonical.then(|| Uuid::try_parse(text).ok()).flatten()
}

/// Query parameters, rejected as a 400 problem.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// A required JSON body.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// A JSON body that may be absent or `null` (both mean the default).
#[derive(Debug)]
pub struct OptionalJson<T>(pub T);

/// The request body limit in force, so a 413 can say it in bytes.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The OpenAPI document bodies are checked against, handed to the
/// extractors by the router (so this module needs nothing of the module that
/// builds the document from the handlers).
#[derive(Debug, Clone, Copy)]
pub struct BodyShapes(pub &'static Value);

/// The document of the request, or a 500: a router without it is a bug,
/// and an unchecked body must never reach serde.
fn shapes_of(req: &Request) -> Result<BodyShapes, ApiError> {
    req.extensions()
        .get::<BodyShapes>()
        .copied()
        .ok_or_else(|| ApiError::internal(&"the router gives no document to check bodies against"))
}

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

fn invalid(path: &str, detail: impl std::fmt::Display) -> ApiError {
    let detail = if path.is_empty() || path == "." {
        format!("invalid request body: {detail}")
    } else {
        format!("invalid request body at `{path}`: {detail}")
    };
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
}

/// Deserializes a parsed body, reporting the full path of what is wrong.
fn deserialize<T: DeserializeOwned + ToSchema>(
    shapes: BodyShapes,
    mut value: Value,
) -> Result<T, ApiError> {
    shape::check(shapes.0, &mut value, &T::name())
        .map_err(|(path, detail)| invalid(&path, detail))?;
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        invalid(&path, err.into_inner())
    })
}

/// A request body that did not arrive in full by its deadline
/// (`WARDEN_BODY_READ_TIMEOUT_MS`).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms", .0.as_millis())]
pub struct BodyReadTimeout(pub std::time::Duration);

/// `body`, failing with [`BodyReadTimeout`] (`timeout` after the request's
/// headers) if it has not ended by `deadline`, so a body trickled in a
/// byte at a time cannot keep its request, and the slot it holds, alive.
pub fn read_by(
    body: axum::body::Body,
    deadline: tokio::time::Instant,
    timeout: std::time::Duration,
) -> axum::body::Body {
    use futures::StreamExt;
    let chunks = futures::stream::unfold(Some(body.into_data_stream()), move |data| async move {
        let mut data = data?;
        match tokio::time::timeout_at(deadline, data.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(data))),
            Ok(None) => None,
            Err(_) => Some((Err(axum::Error::new(BodyReadTimeout(timeout))), None)),
        }
    });
    axum::body::Body::from_stream(chunks)
}

/// The [`BodyReadTimeout`] somewhere in the causes of `err`, if any.
fn read_timeout<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e BodyReadTimeout> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(timeout) = err.downcast_ref::<BodyReadTimeout>() {
            return Some(timeout);
        }
        cause = err.source();
    }
    None
}

async fn body_of<S: Send + Sync>(req: Request, state: &S) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let limit = req.extensions().get::<BodyLimit>().copied();
    let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
        if let Some(BodyReadTimeout(timeout)) = read_timeout(&rejection) {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive in full within WARDEN_BODY_READ_TIMEOUT_MS={} of its headers; send it at once",
                    timeout.as_millis()
                ),
            );
        }
        let mut err = ApiError::from(rejection);
        if let (Some(BodyLimit(max)), StatusCode::PAYLOAD_TOO_LARGE) = (limit, err.status()) {
            err = ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the request body is larger than the limit of {max} bytes"),
            );
        }
        err
    })?;
    Ok((headers, bytes))
}

/// A required JSON body, parsed but not yet checked against its type.
async fn required_json<S: Send + Sync>(req: Request, state: &S) -> Result<Value, ApiError> {
    let (headers, bytes) = body_of(req, state).await?;
    check_content_type(&headers)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("a JSON request body is required"));
    }
    // Parsed first so malformed JSON (400) is told apart from well-formed
    // JSON of the wrong shape (422) whatever comes first in the text.
    Ok(serde_json::from_slice(&bytes)?)
}

impl<T: DeserializeOwned + ToSchema, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let shapes = shapes_of(&req)?;
        Ok(ApiJson(deserialize(
            shapes,
            required_json(req, state).await?,
        )?))
    }
}

/// A required JSON body with the SHA-256 of what it says: the parsed value
/// written out again with its keys in order and no spaces, so two bodies
/// that differ only in layout have the same digest.
#[derive(Debug)]
pub struct DigestedJson<T> {
    /// The body.
    pub value: T,
    /// Its digest.
    pub digest: [u8; 32],
}

impl<T: DeserializeOwned + ToSchema, S: Send + Sync> FromRequest<S> for DigestedJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use sha2::Digest;
        let shapes = shapes_of(&req)?;
        let value = required_json(req, state).await?;
        // serde_json's maps are ordered by key (no `preserve_order`).
        let canonical = serde_json::to_vec(&value)?;
        let digest = sha2::Sha256::digest(&canonical).into();
        Ok(DigestedJson {
            value: deserialize(shapes, value)?,
            digest,
        })
    }
}

impl<T: DeserializeOwned + ToSchema + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let shapes = shapes_of(&req)?;
        let (headers, bytes) = body_of(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        check_content_type(&headers)?;
        match serde_json::from_slice(&bytes)? {
            Value::Null => Ok(OptionalJson(T::default())),
            value => Ok(OptionalJson(deserialize(shapes, value)?)),
        }
    }
}

/// Checks a body against the shapes the OpenAPI document gives it, before
/// serde sees it: serde would take a JSON array for a struct, ignore extra
/// fields of a unit variant, lose the path inside a tagged enum, and refuse
/// `5.0` where JSON Schema's `integer` (and so the document) allows it.
pub(super) mod shape {
    use serde_json::{Map, Value};

    /// Where (a path like `executor.steps[0]`) and what is wrong.
    pub type Mismatch = (String, String);

    /// Checks `value` against the component schema called `name` of `doc`.
    pub fn check(doc: &Value, value: &mut Value, name: &str) -> Result<(), Mismatch> {
        storable(value, &mut String::new())?;
        match doc.pointer(&format!("/components/schemas/{name}")) {
            Some(schema) => walk(doc, value, schema, &mut String::new()),
            None => Ok(()),
        }
    }

    /// Postgres stores no NUL in text or jsonb: refused here as a 422 rather
    /// than failing the insert as a 500. (Numbers next to `f64::MAX`, which
    /// jsonb gives back in plain decimal, parse back thanks to serde_json's
    /// `float_roundtrip`.)
    fn storable(value: &Value, path: &mut String) -> Result<(), Mismatch> {
        let nul = |path: &str| {
            Err((
                path.to_string(),
                "strings may not contain NUL (\\u0000)".to_string(),
            ))
        };
        match value {
            Value::String(s) if s.contains('\0') => nul(path),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    storable(item, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            Value::Object(fields) => {
                for (name, field) in fields {
                    if name.contains('\0') {
                        return nul(path);
                    }
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(name);
                    storable(field, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => reference
                .strip_prefix('#')
                .and_then(|pointer| doc.pointer(pointer))
                .map_or(schema, |target| resolve(doc, target)),
            None => schema,
        }
    }

    fn types(schema: &Value) -> Vec<&str> {
        match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        }
    }

    fn kind(value: &Value) -> &'static str {
        match value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }

    /// Whether a `oneOf` branch is the one meant for `value`: same JSON type,
    /// and every property pinned to an enum (a tag) matches.
    fn selects(doc: &Value, branch: &Value, value: &Value) -> bool {
        let branch = resolve(doc, branch);
        let ts = types(branch);
        match value {
            Value::Null => ts.contains(&"null"),
            Value::Object(fields) => {
                if !ts.is_empty() && !ts.contains(&"object") {
                    return false;
                }
                let props = branch.get("properties");
                let required = branch.get("required").and_then(Value::as_array);
                required
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .all(|name| {
                        let tag = props
                            .and_then(|p| p.get(name))
                            .and_then(|p| resolve(doc, p).get("enum"))
                            .and_then(Value::as_array);
                        match tag {
                            Some(allowed) => fields.get(name).is_some_and(|v| allowed.contains(v)),
                            None => true,
                        }
                    })
            }
            _ => !ts.contains(&"object") || ts.len() > 1,
        }
    }

    fn walk(
        doc: &Value,
        value: &mut Value,
        schema: &Value,
        path: &mut String,
    ) -> Result<(), Mismatch> {
        let schema = resolve(doc, schema);
        for part in schema
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(doc, value, part, path)?;
        }
        if let Some(branches) = schema.get("oneOf").and_then(Value::as_array) {
            // No branch fits: serde names what is wrong (an unknown tag, say).
            return match branches.iter().find(|b| selects(doc, b, value)) {
                Some(branch) => walk(doc, value, branch, path),
                None => Ok(()),
            };
        }
        let ts = types(schema);
        if value.is_null() && ts.contains(&"null") {
            return Ok(());
        }
        if ts.contains(&"integer") {
            if let Some(whole) = integral(value) {
                *value = whole;
            }
            return check_format(value, schema, path);
        }
        if ts.contains(&"object") {
            let got = kind(value);
            let Value::Object(fields) = value else {
                return Err((path.clone(), format!("expected an object, got {got}")));
            };
            return walk_object(doc, fields, schema, path);
        }
        if ts.contains(&"array")
            && let (Value::Array(items), Some(item_schema)) = (value, schema.get("items"))
        {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(doc, item, item_schema, path)?;
                path.truncate(len);
            }
        }
        Ok(())
    }

    /// An integer inside the range its documented `format` (int32, int64) gives.
    fn check_format(value: &Value, schema: &Value, path: &str) -> Result<(), Mismatch> {
        let Value::Number(n) = value else {
            return Ok(());
        };
        let (min, max) = match schema.get("format").and_then(Value::as_str) {
            Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
            Some("int64") => (i64::MIN, i64::MAX),
            _ => return Ok(()),
        };
        match n.as_i64() {
            Some(i) if (min..=max).contains(&i) => Ok(()),
            None if n.is_f64() => Ok(()), // not an integer: serde says so
            _ => Err((
                path.to_string(),
                format!("{n} is out of range (at most {max})"),
            )),
        }
    }

    /// A float with no fractional part (`5.0`) as the integer it is.
    fn integral(value: &Value) -> Option<Value> {
        if !value.is_f64() {
            return None;
        }
        let f = value.as_f64()?;
        // Exact within ±2^53; beyond that serde reports the type as before.
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if f.fract() != 0.0 || f.abs() > EXACT {
            return None;
        }
        Some(Value::from(f as i64))
    }

    fn walk_object(
        doc: &Value,
        fields: &mut Map<String, Value>,
        schema: &Value,
        path: &mut String,
    ) -> Result<(), Mismatch> {
        // Fields the document does not name: a map's values have the schema
        // `additionalProperties` gives (walked like named fields, so their
        // whole floats become integers too); `true` or absent takes anything.
        let extra = schema.get("additionalProperties");
        let extra_schema = extra.filter(|a| a.is_object());
        let empty = Map::new();
        let props = match schema.get("properties").and_then(Value::as_object) {
            Some(props) => props,
            // A free-form object (no declared properties) takes anything.
            None if extra_schema.is_none() => return Ok(()),
            None => &empty,
        };
        let open = extra.is_none_or(|a| a != &Value::Bool(false));
        for (name, field) in fields.iter_mut() {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
            match (props.get(name), extra_schema) {
                (Some(prop), _) => walk(doc, field, prop, path)?,
                (None, Some(values)) => walk(doc, field, values, path)?,
                (None, None) if open => {}
                (None, None) => {
                    path.truncate(len);
                    let mut known: Vec<&str> = props.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    return Err((
                        path.clone(),
                        format!(
                            "unknown field `{name}`, expected one of `{}`",
                            known.join("`, `")
                        ),
                    ));
                }
            }
            path.truncate(len);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::shape::check;

    #[tokio::test]
    async fn a_body_that_misses_its_deadline_answers_408_and_one_in_time_is_read() {
        use axum::body::{Body, Bytes};
        use futures::StreamExt;
        use std::time::Duration;
        use tokio::time::Instant;
        let request = |body: Body| {
            axum::extract::Request::builder()
                .method("POST")
                .uri("/api/autonomous")
                .header("content-type", "application/json")
                .body(body)
                .expect("a request")
        };
        let timeout = Duration::from_millis(50);
        // Half a body, then nothing more: a client trickling it.
        let first = futures::stream::once(async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"{\"goal\": "))
        });
        let trickled = Body::from_stream(first.chain(futures::stream::pending()));
        let started = Instant::now();
        let slow = super::read_by(trickled, started + timeout, timeout);
        let err = super::body_of(request(slow), &())
            .await
            .expect_err("the deadline passed");
        assert_eq!(err.status(), axum::http::StatusCode::REQUEST_TIMEOUT);
        assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
        let whole = super::read_by(Body::from("{}"), Instant::now() + timeout, timeout);
        let (_, bytes) = super::body_of(request(whole), &())
            .await
            .expect("read in time");
        assert_eq!(&bytes[..], b"{}");
        // A body already here when its handler reads it, however late, is
        // read: only waiting for more bytes is bounded.
        let early = super::read_by(Body::from("{}"), Instant::now(), timeout);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (_, bytes) = super::body_of(request(early), &())
            .await
            .expect("nothing was waited for");
        assert_eq!(&bytes[..], b"{}");
    }

    fn checked(mut body: Value, schema: &str) -> Result<Value, (String, String)> {
        // The document as served; in the server the router hands it over.
        let doc = crate::http::openapi::spec();
        check(doc, &mut body, schema).map(|()| body)
    }

    #[test]
    fn whole_floats_become_integers_in_the_values_of_a_map() {
        // `executor.scripts` is a map of named scripts: its steps are
        // walked like the steps of `executor.steps`.
        let body = checked(
            json!({ "goal": "g", "executor": { "kind": "scripted",
                "steps": [{ "action": "a", "delay_ms": 5.0 }],
                "scripts": { "child": [{ "action": "b", "delay_ms": 3600000.0 }] } } }),
            "CreateSession",
        )
        .expect("a valid body");
        assert_eq!(body["executor"]["steps"][0]["delay_ms"], json!(5));
        assert_eq!(
            body["executor"]["scripts"]["child"][0]["delay_ms"],
            json!(3600000)
        );
    }

    #[test]
    fn whole_floats_become_integers_where_the_document_says_integer() {
        let body = checked(
            json!({ "max_iterations": 5.0, "max_cycles": 2 }),
            "LimitsPatch",
        );
        assert_eq!(body, Ok(json!({ "max_iterations": 5, "max_cycles": 2 })));
        // A fraction stays a float, for serde to refuse by type.
        let body = checked(json!({ "max_iterations": 5.5 }), "LimitsPatch");
        assert_eq!(body, Ok(json!({ "max_iterations": 5.5 })));
    }

    #[test]
    fn integers_outside_their_format_are_refused_with_their_path() {
        let (path, detail) = checked(json!({ "max_cycles": 3_000_000_000u64 }), "LimitsPatch")
            .expect_err("beyond int32");
        assert_eq!(path, "max_cycles");
        assert!(detail.contains("out of range"), "{detail}");
        let step = json!({ "action": "a", "tokens": u64::MAX });
        let (path, _) = checked(step, "ScriptedStep").expect_err("beyond int64");
        assert_eq!(path, "tokens");
    }

    #[test]
    fn nul_anywhere_is_refused_with_its_path() {
        let step = json!({ "action": "a", "arguments": { "list": ["ok", "x\u{0}y"] } });
        let (path, _) = checked(step, "ScriptedStep").expect_err("NUL");
        assert_eq!(path, "arguments.list[1]");
    }

    #[test]
    fn tagged_variants_are_checked_as_the_tag_selects() {
        let choice = json!({ "choice": "accept_suggestion", "goal": "g" });
        let (path, detail) = checked(choice, "RefinementChoice").expect_err("unknown field");
        assert_eq!(path, "");
        assert!(detail.contains("unknown field `goal`"), "{detail}");
        assert!(
            checked(
                json!({ "choice": "custom", "goal": "g" }),
                "RefinementChoice"
            )
            .is_ok()
        );
        // An unknown tag is left to serde, which names the variants.
        assert!(checked(json!({ "choice": "maybe" }), "RefinementChoice").is_ok());
        let spec = json!({ "kind": "scripted", "steps": [{ "action": "a" }, ["b"]] });
        let (path, detail) = checked(spec, "ExecutorSpec").expect_err("array step");
        assert_eq!(path, "steps[1]");
        assert_eq!(detail, "expected an object, got an array");
    }

    #[test]
    fn free_form_objects_take_anything_and_nullable_fields_take_null() {
        let step = json!({ "action": "a", "arguments": { "any": [1, { "x": null }] } });
        assert!(checked(step, "ScriptedStep").is_ok());
        assert!(checked(json!({ "goal": null, "guidance": null }), "ResumeSession").is_ok());
        let (path, _) = checked(json!({ "limits": null }), "ResumeSession").expect_err("null");
        assert_eq!(path, "limits");
    }

    #[test]
    fn only_the_canonical_spelling_is_a_session_id() {
        let id = "6f1c2e0a-9b3d-4c5e-8f70-112233445566";
        let parsed = super::canonical_uuid(id).expect("canonical");
        assert_eq!(parsed.to_string(), id);
        assert_eq!(
            super::canonical_uuid(&id.to_ascii_uppercase()),
            Some(parsed)
        );
        let mut mixed = id.to_string();
        mixed.replace_range(0..1, "6");
        mixed.replace_range(1..2, "F");
        assert_eq!(super::canonical_uuid(&mixed), Some(parsed));
        for other in [
            format!("{{{id}}}"),
            format!("urn:uuid:{id}"),
            id.replace('-', ""),
            format!("%36{}", &id[1..]),
            id.replace('-', "%2D"),
            format!("{id}/"),
            format!(" {id}"),
            format!("{id} "),
            id[..35].to_string(),
            format!("{id}0"),
            id.replacen('-', "_", 1),
            id.replacen('f', "g", 1),
            "6f1c2e0a9-b3d-4c5e-8f70-112233445566".into(),
            String::new(),
        ] {
            assert_eq!(super::canonical_uuid(&other), None, "{other:?}");
        }
    }
}
