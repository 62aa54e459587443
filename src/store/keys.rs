//! The api_keys table and the tenant of a session: what authentication
//! reads. Only a key's hash and public prefix are ever stored.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Result, Store, TenantScope};

/// A stored API key (never its secret).
#[derive(Debug, Clone)]
pub struct KeyRecord {
    /// Key id.
    pub id: Uuid,
    /// Public prefix, e.g. `wdn_ab12cd34`.
    pub prefix: String,
    /// SHA-256 of the whole key.
    pub hash: Vec<u8>,
    /// Tenant the key acts for.
    pub tenant: String,
    /// `admin`, `operator` or `viewer`.
    pub role: String,
    /// An admin key of every tenant (`false`: bound to `tenant`).
    pub global: bool,
    /// Optional label.
    pub name: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last authenticated a request (updated at most once a minute).
    pub last_used_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The queues of a worker key (empty for other roles).
    pub queues: Vec<String>,
}

/// A key to store.
#[derive(Debug, Clone)]
pub struct NewKey<'a> {
    /// Fresh id.
    pub id: Uuid,
    /// Public prefix.
    pub prefix: &'a str,
    /// SHA-256 of the whole key.
    pub hash: &'a [u8],
    /// Tenant.
    pub tenant: &'a str,
    /// Role name.
    pub role: &'a str,
    /// A global admin key.
    pub global: bool,
    /// Optional label.
    pub name: Option<&'a str>,
    /// The queues of a worker key.
    pub queues: &'a [String],
}

impl Store {
    /// Stores a new key.
    pub async fn insert_key(&self, key: &NewKey<'_>) -> Result<KeyRecord> {
        let record = sqlx::query_as!(
            KeyRecord,
            "INSERT INTO api_keys (id, prefix, hash, tenant, role, global, name, queues)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             RETURNING id, prefix, hash, tenant, role, global, name, created_at, last_used_at, revoked_at, queues",
            key.id,
            key.prefix,
            key.hash,
            key.tenant,
            key.role,
            key.global,
            key.name,
            key.queues,
        )
        .fetch_one(&self.pool)
        .await?;
        self.keys_changed_locally();
        Ok(record)
    }

    /// The key with this public prefix, revoked or not.
    pub async fn key_by_prefix(&self, prefix: &str) -> Result<Option<KeyRecord>> {
        Ok(sqlx::query_as!(
            KeyRecord,
            "SELECT id, prefix, hash, tenant, role, global, name, created_at, last_used_at, revoked_at, queues
             FROM api_keys WHERE prefix = $1",
            prefix,
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The keys `scope` manages, newest first: every key for
    /// [`TenantScope::Global`], the non-global keys of its tenant for a
    /// tenant (a global admin key is never within a tenant admin's reach,
    /// whatever tenant it was made under).
    pub async fn list_keys(&self, scope: &TenantScope) -> Result<Vec<KeyRecord>> {
        Ok(sqlx::query_as!(
            KeyRecord,
            "SELECT id, prefix, hash, tenant, role, global, name, created_at, last_used_at, revoked_at, queues
             FROM api_keys WHERE ($1::text IS NULL OR (tenant = $1 AND NOT global))
             ORDER BY created_at DESC, id",
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Revokes a key that `scope` manages (as [`Store::list_keys`] reads
    /// them); returns it, or `None` when there is no such key within reach.
    pub async fn revoke_key(&self, id: Uuid, scope: &TenantScope) -> Result<Option<KeyRecord>> {
        let record = sqlx::query_as!(
            KeyRecord,
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
             WHERE id = $1 AND ($2::text IS NULL OR (tenant = $2 AND NOT global))
             RETURNING id, prefix, hash, tenant, role, global, name, created_at, last_used_at, revoked_at, queues",
            id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?;
        self.keys_changed_locally();
        Ok(record)
    }

    /// Whether any key that is not revoked exists.
    pub async fn any_active_key(&self) -> Result<bool> {
        Ok(sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS "any!""#
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Records that a key authenticated a request.
    pub async fn touch_key(&self, id: Uuid) -> Result<()> {
        sqlx::query!("UPDATE api_keys SET last_used_at = now() WHERE id = $1", id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
