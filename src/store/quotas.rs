//! Counts behind the per-tenant quotas and the queue's fair share, read
//! from per-tenant counters (migration 0017) rather than by scanning the
//! tenant's sessions: a trigger appends a delta row on each change of a
//! session's activity, and the quota check folds the tenant's deltas into
//! its counter row under the tenant's lock.

use sqlx::PgConnection;

use super::{Result, Store};

/// Takes the tenant's quota lock for the rest of the caller's transaction
/// and counts its active sessions (running, awaiting refinement or queued:
/// every session that holds or waits for a loop). Folds the tenant's
/// pending deltas into its counter on the way, so the next check reads few.
pub async fn lock_and_count_active(conn: &mut PgConnection, tenant: &str) -> Result<i64> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtext('warden.tenant_active'), hashtext($1))",
        tenant
    )
    .execute(&mut *conn)
    .await?;
    // One statement: the deltas removed are exactly those added to the base.
    let active = sqlx::query_scalar!(
        r#"WITH folded AS (
               DELETE FROM tenant_count_deltas WHERE tenant = $1 RETURNING active, running),
           upsert AS (
               INSERT INTO tenant_counts AS c (tenant, active, running)
               SELECT $1, coalesce(sum(active), 0), coalesce(sum(running), 0) FROM folded
               ON CONFLICT (tenant) DO UPDATE
                   SET active = c.active + EXCLUDED.active, running = c.running + EXCLUDED.running
               RETURNING active)
           SELECT active AS "n!" FROM upsert"#,
        tenant
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(active)
}

/// A tenant's share settings (`warden tenants set`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    /// The tenant.
    pub tenant: String,
    /// Its weight in the queue's fair share (1 by default).
    pub weight: i32,
    /// Its cap on running sessions across the fleet, if any.
    pub max_running: Option<i32>,
    /// How deep its trees of sessions may grow (default 3).
    pub max_depth: Option<i32>,
    /// Most children one of its sessions may have (default 8).
    pub max_children: Option<i32>,
    /// Its running sessions now.
    pub running: i64,
    /// Its active sessions now (running, queued or awaiting refinement).
    pub active: i64,
}

impl Store {
    /// Sets `tenant`'s weight and running cap (`None`: no cap).
    pub async fn set_tenant_settings(
        &self,
        tenant: &str,
        weight: i32,
        max_running: Option<i32>,
    ) -> Result<()> {
        sqlx::query!(
            "INSERT INTO tenant_settings (tenant, weight, max_running) VALUES ($1, $2, $3)
             ON CONFLICT (tenant) DO UPDATE
                SET weight = EXCLUDED.weight, max_running = EXCLUDED.max_running, updated_at = now()",
            tenant,
            weight,
            max_running,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Sets how deep `tenant`'s trees may grow and how many children one
    /// of its sessions may have (`None`: the defaults, 3 and 8).
    pub async fn set_tenant_tree_limits(
        &self,
        tenant: &str,
        max_depth: Option<i32>,
        max_children: Option<i32>,
    ) -> Result<()> {
        sqlx::query!(
            "INSERT INTO tenant_settings (tenant, max_depth, max_children) VALUES ($1, $2, $3)
             ON CONFLICT (tenant) DO UPDATE
                SET max_depth = EXCLUDED.max_depth, max_children = EXCLUDED.max_children, updated_at = now()",
            tenant,
            max_depth,
            max_children,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Sets `tenant`'s own soft-budget thresholds (`None`: the server's).
    /// The caller has checked them (1–99, at most 10).
    pub async fn set_tenant_warn_at(&self, tenant: &str, warn_at: Option<&[i16]>) -> Result<()> {
        sqlx::query!(
            "INSERT INTO tenant_settings (tenant, warn_at) VALUES ($1, $2)
             ON CONFLICT (tenant) DO UPDATE SET warn_at = EXCLUDED.warn_at, updated_at = now()",
            tenant,
            warn_at,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The tenants with thresholds of their own (`tenant` only, when
    /// given), by name.
    pub async fn tenant_warn_ats(&self, tenant: Option<&str>) -> Result<Vec<(String, Vec<i16>)>> {
        let rows = sqlx::query!(
            r#"SELECT tenant, warn_at AS "warn_at!" FROM tenant_settings
               WHERE warn_at IS NOT NULL AND ($1::text IS NULL OR tenant = $1)
               ORDER BY tenant"#,
            tenant
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.tenant, r.warn_at)).collect())
    }

    /// Every tenant with settings or sessions: its settings and counts.
    pub async fn tenant_settings(&self) -> Result<Vec<TenantSettings>> {
        let rows = sqlx::query!(
            r#"WITH counts AS (
                   SELECT tenant, sum(active) AS active, sum(running) AS running FROM (
                       SELECT tenant, active, running FROM tenant_counts
                       UNION ALL SELECT tenant, active, running FROM tenant_count_deltas) c
                   GROUP BY tenant)
               SELECT coalesce(s.tenant, c.tenant) AS "tenant!", coalesce(s.weight, 1) AS "weight!",
                      s.max_running, s.max_depth, s.max_children,
                      coalesce(c.running, 0)::bigint AS "running!",
                      coalesce(c.active, 0)::bigint AS "active!"
               FROM tenant_settings s FULL JOIN counts c ON c.tenant = s.tenant
               ORDER BY 1"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| TenantSettings {
                tenant: r.tenant,
                weight: r.weight,
                max_running: r.max_running,
                max_depth: r.max_depth,
                max_children: r.max_children,
                running: r.running,
                active: r.active,
            })
            .collect())
    }
}
