//! The one gate every request passes: cross-site checks, then what the
//! method and path require (open, metrics, admin, read, write). Routes are
//! classified by path prefix here, so a new route is protected without
//! doing anything (the auth-matrix test checks). The gate decides who the
//! caller is and what role it has; which sessions it reaches is decided
//! where the data is: every store read and write carries the caller's
//! [`TenantScope`] in its SQL.

use super::AppState;
use super::error::ApiError;
use crate::auth::{AuthMode, Principal, Role};
use crate::session::TenantScope;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// What a request needs, decided from its method and path alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health probes, the dashboard page and its files, the API documents.
    Open,
    /// `/metrics`: an admin key or `WARDEN_METRICS_TOKEN`.
    Metrics,
    /// Keys, retention, budget-warning thresholds, notification targets
    /// and applying a tenant's thresholds: admin only.
    Admin,
    /// Reads: any valid key.
    Read,
    /// Changes: operator or admin.
    Write,
    /// The worker protocol's task routes (`POST /api/workers/…`): worker keys.
    Worker,
}

/// The access a request needs. Anything not named as open needs a key.
pub fn access(method: &Method, path: &str) -> Access {
    let read = matches!(*method, Method::GET | Method::HEAD);
    let open_path = matches!(path, "/" | "/healthz" | "/readyz" | "/openapi.json")
        || path == "/docs"
        || path.starts_with("/docs/")
        || path.starts_with("/assets/");
    if read && open_path {
        Access::Open
    } else if read && path == "/metrics" {
        Access::Metrics
    } else if path == "/api/keys"
        || path.starts_with("/api/keys/")
        || path == "/api/retention"
        || path.starts_with("/api/retention/")
        || path == "/api/budget-warnings"
        || path.starts_with("/api/budget-warnings/")
        || path == "/api/notify"
        || path.starts_with("/api/notify/")
        || path == "/api/insights/thresholds/apply"
    {
        Access::Admin
    } else if !read && (path == "/api/workers" || path.starts_with("/api/workers/")) {
        Access::Worker
    } else if read {
        Access::Read
    } else {
        Access::Write
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn unauthorized() -> Response {
    let mut res = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a valid API key is required: send Authorization: Bearer <key>",
    )
    .into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    res
}

fn forbidden(detail: &str) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail).into_response()
}

/// Whether a Host (or Origin authority) names this machine only.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A host and port as written in a Host header or an Origin's authority:
/// the name lowercased, the port when one is written.
fn host_and_port(authority: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (name, rest) = v6.split_once(']')?;
            (format!("[{name}]"), rest)
        }
        None => match authority.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), port),
            None => (authority.to_string(), ""),
        },
    };
    let port = match port {
        "" => None,
        p => Some(p.strip_prefix(':').unwrap_or(p).parse().ok()?),
    };
    let bad = |c: char| c.is_whitespace() || matches!(c, '/' | '@' | '?' | '#' | '\\');
    (!name.is_empty() && !name.contains(bad)).then(|| (name.to_ascii_lowercase(), port))
}

/// Whether a browser's `Origin` is this server as named by the `Host`
/// header. The Origin's scheme must be `http` or `https` (anything else,
/// `null` included, is foreign); its port is made explicit (80 for http,
/// 443 for https) and compared with Host's port, and a Host without a port
/// is taken to be on the default port of the Origin's scheme (Warden serves
/// http; behind a TLS proxy the page's https origin arrives with the
/// public name). So `http://h` matches Host `h` and `h:80`, `https://h`
/// matches `h` and `h:443`, and `http://h:8080` matches `h:8080` only.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    let (Some((o_name, o_port)), Some((h_name, h_port))) =
        (host_and_port(authority), host_and_port(host))
    else {
        return false;
    };
    let o_port = o_port.unwrap_or(default_port);
    let h_port = h_port.unwrap_or(default_port);
    o_name == h_name && o_port == h_port
}

/// Cross-site rules for requests that change state: a browser on another
/// site can send a "simple" form POST with cookies-less credentials, but not
/// a JSON content type nor a foreign Origin that matches our Host.
fn cross_site(req: &Request, auth_open: bool, auth_off: bool) -> Option<Response> {
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if auth_open && !host.is_some_and(loopback_host) {
        // DNS rebinding: a foreign name resolving to 127.0.0.1.
        return Some(forbidden(
            "authentication is off, so only loopback host names are served",
        ));
    }
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = matches!((origin.to_str().ok(), host), (Some(o), Some(h)) if same_origin(o, h));
        if !same {
            return Some(forbidden(
                "the Origin of this request does not match its Host",
            ));
        }
    }
    // With authentication on, a state change without a key is refused as
    // unauthenticated (401) before anything else.
    if auth_off && bearer(headers).is_none() {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
        if !json {
            return Some(
                ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "a request that changes state without a bearer key must send Content-Type: application/json",
                )
                .into_response(),
            );
        }
    }
    None
}

/// `?tenant=` from the query string, for admins.
/// `?tenant=` from the query string, for a global admin: taken as sent
/// (a tenant name has nothing to escape), so a name no tenant has matches
/// no session. Empty is absent.
fn tenant_param(req: &Request) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "tenant" && !v.is_empty()).then(|| v.to_string())
    })
}

/// The gate: every request of the router passes here.
pub async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let mode = state.auth.mode();
    let open = mode != AuthMode::On;
    // Protected mode and `WARDEN_AUTH=off` alike: without keys, a foreign
    // Host name is a DNS-rebinding page, whatever address we listen on.
    if let Some(refused) = cross_site(&req, open, open) {
        return refused;
    }
    let path = req.uri().path().to_string();
    let need = access(req.method(), &path);
    if need == Access::Open {
        return next.run(req).await;
    }
    let scope_param = tenant_param(&req);
    if open {
        req.extensions_mut()
            .insert(Principal::unrestricted(scope_param));
        if matches!(need, Access::Write | Access::Worker) {
            return crate::session::ACTOR
                .scope("auth-off".to_string(), next.run(req))
                .await;
        }
        return next.run(req).await;
    }
    let Some(token) = bearer(req.headers()).map(str::to_string) else {
        return unauthorized();
    };
    if need == Access::Metrics && state.auth.is_metrics_token(&token) {
        return next.run(req).await;
    }
    let mut principal = match state.auth.authenticate(&token).await {
        Ok(Some(p)) => p,
        Ok(None) => return unauthorized(),
        Err(err) => {
            tracing::error!(error = %err, "cannot check an API key");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "keys cannot be checked right now; retry shortly",
            )
            .into_response();
        }
    };
    // A worker key reaches the worker protocol and nothing else.
    let worker_path = path == "/api/workers" || path.starts_with("/api/workers/");
    if principal.role == Role::Worker && !worker_path {
        return forbidden("a worker key may use /api/workers only");
    }
    let allowed = match need {
        Access::Open | Access::Read => true,
        Access::Worker => principal.role == Role::Worker,
        // Metrics span every tenant: a global admin only.
        Access::Metrics => principal.global,
        Access::Admin => principal.role == Role::Admin,
        Access::Write => principal.role.can_write(),
    };
    if !allowed {
        return forbidden(&format!(
            "a key with role {} may not do this",
            principal.role.as_str()
        ));
    }
    // A global admin may narrow its view to one tenant with `?tenant=`.
    if principal.global
        && let Some(tenant) = scope_param
    {
        principal.scope = TenantScope::Tenant(tenant);
    }
    let actor = principal.actor.clone();
    req.extensions_mut().insert(principal);
    if matches!(need, Access::Write | Access::Worker) {
        crate::session::ACTOR.scope(actor, next.run(req)).await
    } else {
        next.run(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_reads_are_open() {
        for (m, p) in [
            (Method::GET, "/healthz"),
            (Method::GET, "/readyz"),
            (Method::GET, "/"),
            (Method::GET, "/openapi.json"),
            (Method::GET, "/docs/"),
            (Method::GET, "/assets/app.js"),
        ] {
            assert_eq!(access(&m, p), Access::Open, "{m} {p}");
        }
        assert_eq!(access(&Method::POST, "/healthz"), Access::Write);
        assert_eq!(access(&Method::POST, "/assets/app.js"), Access::Write);
        assert_eq!(access(&Method::GET, "/metrics"), Access::Metrics);
        assert_eq!(access(&Method::GET, "/api/keys"), Access::Admin);
        assert_eq!(access(&Method::DELETE, "/api/keys/x"), Access::Admin);
        assert_eq!(access(&Method::GET, "/api/retention"), Access::Admin);
        assert_eq!(access(&Method::PUT, "/api/retention"), Access::Admin);
        assert_eq!(access(&Method::GET, "/api/budget-warnings"), Access::Admin);
        assert_eq!(access(&Method::PUT, "/api/budget-warnings"), Access::Admin);
        assert_eq!(
            access(&Method::POST, "/api/insights/thresholds/apply"),
            Access::Admin
        );
        assert_eq!(
            access(&Method::GET, "/api/insights/thresholds"),
            Access::Read
        );
        assert_eq!(
            access(&Method::GET, "/api/insights/thresholds/changes"),
            Access::Read
        );
        assert_eq!(access(&Method::GET, "/api/autonomous"), Access::Read);
        assert_eq!(access(&Method::GET, "/anything-new"), Access::Read);
        assert_eq!(access(&Method::PATCH, "/api/autonomous/x"), Access::Write);
        assert_eq!(access(&Method::GET, "/docsx"), Access::Read);
        assert_eq!(access(&Method::POST, "/api/workers/claim"), Access::Worker);
        assert_eq!(access(&Method::GET, "/api/workers/queues"), Access::Read);
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "a.localhost",
        ] {
            assert!(loopback_host(h), "{h}");
        }
        for h in ["evil.example", "10.0.0.1:80", "localhost.evil.com", "[::2]"] {
            assert!(!loopback_host(h), "{h}");
        }
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        for (origin, host) in [
            ("http://h", "h"),
            ("http://h", "h:80"),
            ("http://h:80", "h"),
            ("https://h", "h"),
            ("https://h", "h:443"),
            ("https://h:443", "h"),
            ("http://h:8080", "h:8080"),
            ("HTTP://Example.COM:8080", "example.com:8080"),
            ("http://127.0.0.1:3000", "127.0.0.1:3000"),
            ("http://[::1]:3000", "[::1]:3000"),
            ("https://[::1]", "[::1]"),
        ] {
            assert!(same_origin(origin, host), "{origin} vs {host}");
        }
        for (origin, host) in [
            ("http://h:8080", "h"),
            ("http://h", "h:8080"),
            ("https://h", "h:80"),
            ("http://h", "h:443"),
            ("http://h:8080", "h:8081"),
            ("http://evil.example", "h"),
            ("http://h.evil.example", "h"),
            ("ftp://h", "h"),
            ("file://h", "h"),
            ("chrome-extension://h", "h"),
            ("null", "h"),
            ("h", "h"),
            ("http://user@h", "h"),
            ("http://h/path", "h"),
            ("http://h:notaport", "h"),
            ("http://h:99999", "h:99999"),
            ("http://[::1]:3000", "[::2]:3000"),
            ("http://", ""),
        ] {
            assert!(!same_origin(origin, host), "{origin} vs {host}");
        }
    }
}
