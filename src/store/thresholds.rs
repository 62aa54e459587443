//! A tenant's applied thresholds (its own `max_iterations` in
//! `tenant_settings`) and the append-only log of their changes
//! (`threshold_changes`, migration 0036): a change and its log row are
//! written in one transaction, under the tenant's settings row lock.

use chrono::{DateTime, Utc};

use super::{Result, Store, TenantScope};

/// What a session of a tenant gets when its create leaves a limit out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantSessionDefaults {
    /// Its own soft-budget thresholds (percent), when it has some.
    pub warn_at: Option<Vec<i16>>,
    /// Its own iteration limit, when one was applied.
    pub max_iterations: Option<i64>,
}

/// A change of a tenant's iteration limit, to log and apply.
#[derive(Debug, Clone)]
pub struct NewThresholdChange<'a> {
    /// The tenant whose limit changes.
    pub tenant: &'a str,
    /// The new limit (`None`: back to the server's default); checked by
    /// the caller (1 – 1,000,000).
    pub value: Option<i64>,
    /// Who acted (a key's public prefix, never a secret).
    pub applied_by: &'a str,
    /// The replay that justified it (an object).
    pub replay: &'a serde_json::Value,
    /// Why, in the operator's words.
    pub note: Option<&'a str>,
}

/// One logged change.
#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdChangeRow {
    /// Its number: later changes have higher ones.
    pub id: i64,
    /// The tenant.
    pub tenant: String,
    /// The threshold changed (`max_iterations`).
    pub threshold: String,
    /// The value before (`None`: the server's default).
    pub previous_value: Option<i64>,
    /// The value after (`None`: the server's default).
    pub new_value: Option<i64>,
    /// Who acted.
    pub applied_by: String,
    /// When.
    pub applied_at: DateTime<Utc>,
    /// The replay that justified it.
    pub replay: serde_json::Value,
    /// Why, in the operator's words.
    pub note: Option<String>,
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The value changed; its log row.
    Changed(ThresholdChangeRow),
    /// The value was in force already: nothing was written.
    Unchanged,
    /// The tenant is outside the caller's scope: nothing was written.
    OutOfScope,
}

impl Store {
    /// What `tenant`'s sessions get when their create leaves a limit out.
    pub async fn tenant_session_defaults(&self, tenant: &str) -> Result<TenantSessionDefaults> {
        let row = sqlx::query!(
            "SELECT warn_at, max_iterations FROM tenant_settings WHERE tenant = $1",
            tenant
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(
            row.map_or_else(TenantSessionDefaults::default, |r| TenantSessionDefaults {
                warn_at: r.warn_at,
                max_iterations: r.max_iterations,
            }),
        )
    }

    /// Sets `change.tenant`'s iteration limit and logs the change, in one
    /// transaction: the tenant's settings row is locked while the value in
    /// force is compared, so two applies never log the same `previous`.
    pub async fn apply_tenant_max_iterations(
        &self,
        scope: &TenantScope,
        change: &NewThresholdChange<'_>,
    ) -> Result<Applied> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        sqlx::query!(
            "INSERT INTO tenant_settings (tenant) SELECT $1
             WHERE $2::text IS NULL OR $1 = $2
             ON CONFLICT (tenant) DO NOTHING",
            change.tenant,
            scope.tenant()
        )
        .execute(&mut *tx)
        .await?;
        let Some(previous) = sqlx::query_scalar!(
            "SELECT max_iterations FROM tenant_settings
             WHERE tenant = $1 AND ($2::text IS NULL OR tenant = $2) FOR UPDATE",
            change.tenant,
            scope.tenant()
        )
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(Applied::OutOfScope);
        };
        if previous == change.value {
            return Ok(Applied::Unchanged);
        }
        sqlx::query!(
            "UPDATE tenant_settings SET max_iterations = $2, updated_at = now() WHERE tenant = $1",
            change.tenant,
            change.value
        )
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query_as!(
            ThresholdChangeRow,
            "INSERT INTO threshold_changes
                 (tenant, threshold, previous_value, new_value, applied_by, replay, note)
             VALUES ($1, 'max_iterations', $2, $3, $4, $5, $6)
             RETURNING id, tenant, threshold, previous_value, new_value, applied_by,
                       applied_at, replay, note",
            change.tenant,
            previous,
            change.value,
            change.applied_by,
            change.replay,
            change.note
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Applied::Changed(row))
    }

    /// `tenant`'s logged changes (within `scope`), newest first, those
    /// numbered below `before` when given, at most `limit`.
    pub async fn threshold_changes(
        &self,
        scope: &TenantScope,
        tenant: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<ThresholdChangeRow>> {
        Ok(sqlx::query_as!(
            ThresholdChangeRow,
            "SELECT id, tenant, threshold, previous_value, new_value, applied_by, applied_at,
                    replay, note
             FROM threshold_changes
             WHERE tenant = $1 AND ($2::text IS NULL OR tenant = $2)
               AND ($3::bigint IS NULL OR id < $3)
             ORDER BY id DESC
             LIMIT $4",
            tenant,
            scope.tenant(),
            before,
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
