//! The web dashboard: its page at `/` and its files at `/assets/…`, all
//! embedded in the binary at compile time (nothing is read from disk or a
//! CDN), served with a strict Content-Security-Policy.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::ApiError;

/// The page and its scripts may load only from this server and talk only to
/// it; no inline script or style, no frames, no plugins.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// One embedded file: its name under `/assets/`, content type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file the dashboard loads.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("../../web/app.js"),
    },
    Asset {
        name: "style.css",
        content_type: CSS,
        body: include_bytes!("../../web/style.css"),
    },
    Asset {
        name: "vendor/uPlot.iife.min.js",
        content_type: JS,
        body: include_bytes!("../../web/vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "vendor/uPlot.min.css",
        content_type: CSS,
        body: include_bytes!("../../web/vendor/uPlot.min.css"),
    },
];

const INDEX: &str = include_str!("../../web/index.html");

/// The entity tag of each asset (a content hash), index-aligned with
/// [`ASSETS`], and the page's: a browser revalidates and gets 304 until a
/// new build changes the bytes.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| ASSETS.iter().map(|a| tag(a.body)).collect());
static INDEX_TAG: LazyLock<String> = LazyLock::new(|| tag(INDEX.as_bytes()));

fn tag(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// The dashboard routes: `/` and `/assets/{*path}`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard))
        .route("/assets/{*path}", get(asset))
}

/// The dashboard page.
async fn dashboard(headers: HeaderMap) -> Response {
    respond(
        &headers,
        "text/html; charset=utf-8",
        INDEX.as_bytes(),
        &INDEX_TAG,
    )
}

/// One of the dashboard's files, or a 404 problem.
async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.name == path) {
        Some(i) => respond(&headers, ASSETS[i].content_type, ASSETS[i].body, &TAGS[i]),
        None => ApiError::no_route().into_response(),
    }
}

/// `body` with its type, tag and the page's security headers; a 304 when
/// the browser already holds these bytes. `no-cache` makes it ask each
/// time, so a new build is never mixed with files of an old one.
fn respond(
    request: &HeaderMap,
    content_type: &'static str,
    body: &'static [u8],
    etag: &str,
) -> Response {
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        body.into_response()
    };
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::{ASSETS, INDEX};

    #[test]
    fn the_page_loads_only_embedded_assets() {
        for src in INDEX
            .split(['"', '\''])
            .filter(|s| s.starts_with("/assets/"))
        {
            let name = &src["/assets/".len()..];
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "{src} is not embedded"
            );
        }
        assert!(!INDEX.contains("<script>"), "no inline script (CSP)");
        assert!(!INDEX.contains("<style"), "no inline style (CSP)");
        assert!(!INDEX.contains("style=\""), "no inline style (CSP)");
    }
}
