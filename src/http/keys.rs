//! `/api/keys`: create, list and revoke API keys (admin only; the gate in
//! `auth.rs` enforces it). A key's secret is answered once, at creation. A
//! tenant admin manages its own tenant's non-global keys only; a global
//! admin, every key.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiJson, KeyId};
use crate::auth::{AuthError, AuthMode, KeySpec, Principal, Role};
use crate::session::{KeyRecord, TenantScope};

/// The key routes, relative to `/api/keys`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", post(create_key).get(list_keys))
        .route("/{id}", delete(revoke_key))
}

/// A key to create.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// Tenant the key acts for: 1 to 64 letters, digits, `-`, `_` or `.`.
    pub tenant: String,
    /// What the key may do.
    pub role: Role,
    /// An admin key of every tenant (keys, sessions and `/metrics` of all
    /// tenants); `false` (the default) binds an admin key to `tenant`. Only
    /// for `role: admin`, and only a global admin may make one. The first
    /// key made without authentication must be a global admin key.
    #[serde(default)]
    pub global: bool,
    /// An optional label, for people: 1 to 64 printable characters (empty is none).
    #[serde(default)]
    pub name: Option<String>,
    /// The queues a `worker` key may claim tasks from: required (1 to 32
    /// names) for role `worker`, refused for every other role.
    #[serde(default)]
    pub queues: Vec<String>,
}

/// A stored key: public fields only, never the secret nor its hash.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct KeyView {
    /// Key id (for revocation).
    pub id: Uuid,
    /// Public prefix, e.g. `wdn_ab12cd34`: what logs and events show.
    pub prefix: String,
    /// Tenant.
    pub tenant: String,
    /// Role.
    pub role: String,
    /// An admin key of every tenant; `false` for a tenant admin and every
    /// other role (bound to `tenant`).
    pub global: bool,
    /// Label.
    pub name: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last authenticated request (updated at most once a minute).
    pub last_used_at: Option<DateTime<Utc>>,
    /// Revocation time.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The queues of a worker key (empty for other roles).
    pub queues: Vec<String>,
}

impl From<KeyRecord> for KeyView {
    fn from(k: KeyRecord) -> KeyView {
        KeyView {
            id: k.id,
            prefix: k.prefix,
            tenant: k.tenant,
            role: k.role,
            global: k.global,
            name: k.name,
            created_at: k.created_at,
            last_used_at: k.last_used_at,
            revoked_at: k.revoked_at,
            queues: k.queues,
        }
    }
}

/// A new key with its secret, shown this once.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedKey {
    /// The stored key.
    #[serde(flatten)]
    pub key: KeyView,
    /// The key to send as `Authorization: Bearer <key>`; it is not kept.
    pub secret: String,
}

/// Every key.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct KeyList {
    /// Keys, newest first.
    pub items: Vec<KeyView>,
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> ApiError {
        match err {
            AuthError::InvalidTenant(_)
            | AuthError::InvalidName
            | AuthError::GlobalNotAdmin
            | AuthError::InvalidQueues(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                err.to_string(),
            ),
            AuthError::Store(store) => ApiError::from(store),
            AuthError::Random(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "no key can be made right now",
            ),
        }
    }
}

/// Create an API key (admin). The answer holds its secret, shown only here.
/// A tenant admin may make keys of its own tenant only, none global. While
/// no key exists (protected mode), the first must be a global admin key.
#[utoipa::path(
    post, path = "/api/keys", tag = "keys",
    request_body = CreateKey,
    responses(
        (status = 201, description = "Key created", body = CreatedKey),
        (status = 403, description = "A tenant admin asked for another tenant's key or a global one", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid tenant, name or role; or a first key that is not a global admin key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<CreateKey>,
) -> ApiResult<(StatusCode, Json<CreatedKey>)> {
    if !caller.global {
        if req.tenant != caller.tenant {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "this admin key manages the keys of tenant {} only",
                    caller.tenant
                ),
            ));
        }
        if req.global {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "only a global admin may make a global key",
            ));
        }
    }
    if state.auth.mode() != AuthMode::On
        && let Some(refusal) = crate::auth::bootstrap_refusal(req.role, req.global)
        && state.auth.no_keys_yet().await?
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "first_key_must_be_global_admin",
            refusal,
        ));
    }
    let issued = state
        .auth
        .issue(&KeySpec {
            tenant: &req.tenant,
            role: req.role,
            global: req.global,
            name: req.name.as_deref(),
            queues: &req.queues,
        })
        .await?;
    tracing::info!(key = %issued.record.prefix, tenant = %req.tenant, role = req.role.as_str(), global = req.global, "API key created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            key: issued.record.into(),
            secret: issued.secret.expose().to_string(),
        }),
    ))
}

/// The keys `caller` manages: every key for a global admin; for a tenant
/// admin, the non-global keys of its tenant (a global key made under that
/// tenant name is not its to see or revoke).
fn managed_keys(caller: &Principal) -> TenantScope {
    if caller.global {
        TenantScope::Global
    } else {
        TenantScope::tenant_only(&caller.tenant)
    }
}

/// List API keys (admin): public fields only; a tenant admin sees its
/// tenant's non-global keys only.
#[utoipa::path(
    get, path = "/api/keys", tag = "keys",
    responses((status = 200, description = "Every key the caller manages", body = KeyList))
)]
pub async fn list_keys(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> ApiResult<Json<KeyList>> {
    let keys = state.auth.list(&managed_keys(&caller)).await?;
    Ok(Json(KeyList {
        items: keys.into_iter().map(Into::into).collect(),
    }))
}

/// Revoke an API key (admin); effective at once on this replica, within a
/// second on the others. Another tenant's key, and any global key, is to a
/// tenant admin not found.
#[utoipa::path(
    delete, path = "/api/keys/{id}", tag = "keys",
    params(("id" = Uuid, Path, description = "Key id")),
    responses(
        (status = 200, description = "The revoked key", body = KeyView),
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    KeyId(id): KeyId,
) -> ApiResult<Json<KeyView>> {
    match state.auth.revoke(id, &managed_keys(&caller)).await? {
        Some(key) => {
            tracing::info!(key = %key.prefix, "API key revoked");
            Ok(Json(key.into()))
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "key_not_found",
            format!("no key {id}"),
        )),
    }
}
