//! The fleet's queue: sessions ready to run that no replica had room for
//! wait as `queued`; any replica with capacity claims some, as River and
//! Oban workers claim jobs (`FOR UPDATE SKIP LOCKED`, so replicas claiming
//! at once never take the same session). The free places are shared among
//! the tenants that wait by their weights ([`crate::policy::fair_share`]),
//! oldest first inside each tenant.

use sqlx::PgConnection;
use uuid::Uuid;

use super::event_log;
use super::rows::{Lease, NewEvent};
use super::{Result, Store};
use crate::policy::fair_share::{self, Demand};
use crate::policy::lifecycle::Status;

/// Whether a new or resumed session of `tenant` must wait in the queue
/// though a place is free, read on the caller's connection: some session
/// waits already (a newcomer must not overtake it), or the tenant runs as
/// many sessions as its cap allows: its own (`warden tenants set`), and
/// never more than `default_cap` (`WARDEN_TENANT_MAX_RUNNING`).
pub async fn queue_waiting(
    conn: &mut PgConnection,
    tenant: &str,
    default_cap: i64,
) -> Result<bool> {
    // `status = 'queued'` stays a literal: the predicate of `sessions_queue`.
    Ok(sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM sessions WHERE status = 'queued')
               OR least(coalesce((SELECT s.max_running FROM tenant_settings s WHERE s.tenant = $1)::bigint, $2::bigint), $2::bigint)
                  <= coalesce((SELECT running FROM tenant_counts WHERE tenant = $1), 0)
                     + coalesce((SELECT sum(running) FROM tenant_count_deltas WHERE tenant = $1), 0) AS "waiting!""#,
        tenant,
        default_cap,
    )
    .fetch_one(conn)
    .await?)
}

/// A tenant with queued sessions, as the claim weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingTenant {
    /// The tenant.
    pub tenant: String,
    /// What the fair share needs of it.
    pub demand: Demand,
}

/// The tenants with queued sessions, oldest queued session first, with
/// their running counts, weights and caps (their own, never above
/// `default_cap`); `waiting` is counted up to `up_to` (more cannot be
/// claimed at once).
async fn waiting_tenants(
    conn: &mut PgConnection,
    up_to: i64,
    default_cap: u64,
) -> Result<Vec<WaitingTenant>> {
    // A skip scan of `sessions_queue_by_tenant` finds the distinct tenants
    // without reading every queued session of a big one.
    let rows = sqlx::query!(
        r#"WITH RECURSIVE tenants AS (
               (SELECT tenant FROM sessions WHERE status = 'queued' ORDER BY tenant LIMIT 1)
               UNION ALL
               SELECT (SELECT s.tenant FROM sessions s
                       WHERE s.status = 'queued' AND s.tenant > t.tenant ORDER BY s.tenant LIMIT 1)
               FROM tenants t WHERE t.tenant IS NOT NULL)
           SELECT t.tenant AS "tenant!",
                  (SELECT count(*) FROM (SELECT 1 FROM sessions q
                       WHERE q.status = 'queued' AND q.tenant = t.tenant LIMIT $1) n) AS "waiting!",
                  (coalesce((SELECT running FROM tenant_counts c WHERE c.tenant = t.tenant), 0)
                   + coalesce((SELECT sum(running) FROM tenant_count_deltas d WHERE d.tenant = t.tenant), 0))::bigint
                      AS "running!",
                  coalesce(ts.weight, 1) AS "weight!", ts.max_running
           FROM tenants t LEFT JOIN tenant_settings ts ON ts.tenant = t.tenant
           WHERE t.tenant IS NOT NULL
           ORDER BY (SELECT (q.queued_at, q.id) FROM sessions q WHERE q.status = 'queued' AND q.tenant = t.tenant
                     ORDER BY q.queued_at, q.id LIMIT 1), t.tenant"#,
        up_to,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| WaitingTenant {
            tenant: r.tenant,
            demand: Demand {
                running: u64::try_from(r.running).unwrap_or(0),
                weight: u32::try_from(r.weight).unwrap_or(1),
                cap: Some(
                    r.max_running
                        .map_or(default_cap, |c| u64::try_from(c).unwrap_or(0))
                        .min(default_cap),
                ),
                waiting: u64::try_from(r.waiting).unwrap_or(0),
            },
        })
        .collect())
}

impl Store {
    /// Claims up to `limit` queued sessions for `owner`, the places shared
    /// among the waiting tenants by weight and oldest first inside each:
    /// each becomes `running` under a fresh lease, with its status change
    /// in its log. Sessions another replica is claiming (or a user is
    /// stopping) at this moment are skipped, not waited for, and so are
    /// those that need a capability this replica lacks: they wait for a
    /// replica that has it.
    ///
    /// A tenant runs at most its cap (its own, and never more than
    /// `default_cap`, `WARDEN_TENANT_MAX_RUNNING`), children included:
    /// children are made `queued` whatever the tenant runs (a parent must
    /// not fail because its tenant is busy) and wait here for a place under
    /// the cap and their tenant's fair share. Only `running` sessions hold
    /// a place: a parent that waits for its children is `paused` and holds
    /// none, so its children can always take the place it gave back, and a
    /// tree can never wait on itself. A parent whose children were made
    /// with `wait: false` keeps running and keeps its place; its children
    /// run beside it only in places the cap leaves (under a cap of 1, none
    /// until it waits for them: if it ends first they end `parent_ended`).
    pub async fn claim_queued(
        &self,
        owner: Uuid,
        ttl: std::time::Duration,
        limit: i64,
        default_cap: u64,
    ) -> Result<Vec<Lease>> {
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        // One claim at a time across the fleet: each reads the running
        // counts the previous one left, so shares and caps hold across
        // replicas. A claim is one short transaction per tick and replica.
        sqlx::query!("SELECT pg_advisory_xact_lock(hashtext('warden.queue_claim'))")
            .execute(&mut *tx)
            .await?;
        let tenants = waiting_tenants(&mut tx, limit, default_cap).await?;
        let demands: Vec<Demand> = tenants.iter().map(|t| t.demand).collect();
        let places = fair_share::share_places(&demands, u64::try_from(limit).unwrap_or(0));
        let (names, counts): (Vec<String>, Vec<i64>) = tenants
            .into_iter()
            .zip(places)
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| (t.tenant, i64::try_from(n).unwrap_or(i64::MAX)))
            .unzip();
        if names.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let rows = sqlx::query!(
            r#"WITH shares AS (SELECT * FROM unnest($3::text[], $4::bigint[]) AS s(tenant, places)),
                    waiting AS (
                      SELECT q.id, q.queued_at FROM shares CROSS JOIN LATERAL (
                          SELECT id, queued_at FROM sessions
                          WHERE status = 'queued' AND tenant = shares.tenant
                            -- Only what this replica can run (migration 0027).
                            AND needs <@ coalesce((SELECT r.capabilities FROM replicas r WHERE r.id = $1), '{}')
                          ORDER BY queued_at, id LIMIT shares.places FOR UPDATE SKIP LOCKED) q)
             UPDATE sessions s SET status = $5, owner = $1, lease_token = gen_random_uuid(),
                    lease_expires_at = now() + make_interval(secs => $2), heartbeat_at = now(),
                    queued_at = NULL, updated_at = now()
             FROM waiting w WHERE s.id = w.id
             RETURNING s.id, s.lease_token AS "lease_token!", w.queued_at AS "queued_at!""#,
            owner,
            ttl.as_secs_f64(),
            &names,
            &counts,
            Status::Running as Status,
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut rows: Vec<_> = rows.into_iter().collect();
        // RETURNING has no order: start them oldest first.
        rows.sort_by_key(|r| (r.queued_at, r.id));
        let started = NewEvent::status(Some(Status::Queued), Status::Running)?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in rows {
            event_log::append(&mut tx, r.id, std::slice::from_ref(&started)).await?;
            claimed.push(Lease {
                session_id: r.id,
                token: r.lease_token,
            });
        }
        tx.commit().await?;
        for lease in &claimed {
            self.announce(lease.session_id);
        }
        Ok(claimed)
    }

    /// Folds every tenant's pending count deltas into its counter row, so
    /// that reads of a tenant that creates nothing stay short; the counts
    /// by status (migration 0040) likewise, so that `/metrics` reads a row
    /// per tenant and status. Safe beside the quota check's own fold and
    /// another replica's: each delta row is deleted, and added, once, and
    /// counter rows are taken in key order.
    pub async fn fold_tenant_counts(&self) -> Result<()> {
        sqlx::query!(
            "WITH folded AS (DELETE FROM session_status_count_deltas RETURNING tenant, status, sessions)
             INSERT INTO session_status_counts AS c (tenant, status, sessions)
             SELECT tenant, status, sum(sessions) FROM folded
             GROUP BY tenant, status ORDER BY tenant, status
             ON CONFLICT (tenant, status) DO UPDATE SET sessions = c.sessions + EXCLUDED.sessions"
        )
        .execute(&self.pool)
        .await?;
        sqlx::query!(
            "WITH folded AS (DELETE FROM tenant_count_deltas RETURNING tenant, active, running)
             INSERT INTO tenant_counts AS c (tenant, active, running)
             SELECT tenant, sum(active), sum(running) FROM folded GROUP BY tenant ORDER BY tenant
             ON CONFLICT (tenant) DO UPDATE
                SET active = c.active + EXCLUDED.active, running = c.running + EXCLUDED.running"
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

impl Store {
    /// Fills in the `queue_position` and `queue_tenants` of the queued
    /// sessions among `page` (a list's rows, read without them), in one
    /// statement: per tenant of the page, one count of its queue ahead of
    /// the page's first row and the ranks of the stretch from it to the
    /// page's last; the tenants waiting, once. A row's own count, as a
    /// single read does, made a page of a tenant's queue cost 50 counts of
    /// that queue (BENCHMARKS.md, "Scale, round three"). A row that left
    /// the queue since the page was read keeps no position.
    pub(super) async fn place_in_queue(
        &self,
        page: &mut [super::rows::Session],
        scope: &super::TenantScope,
    ) -> Result<()> {
        let queued: Vec<Uuid> = page
            .iter()
            .filter(|s| s.status == Status::Queued)
            .map(|s| s.id)
            .collect();
        if queued.is_empty() {
            return Ok(());
        }
        let places = sqlx::query!(
            r#"WITH page AS (
                   SELECT id, tenant, queued_at FROM sessions
                   WHERE id = ANY($1) AND status = 'queued' AND ($2::text IS NULL OR tenant = $2)),
               bounds AS (
                   SELECT tenant, min(queued_at) AS first, max(queued_at) AS last
                   FROM page GROUP BY tenant),
               ahead AS MATERIALIZED (
                   SELECT b.tenant, (SELECT count(*) FROM sessions q
                                     WHERE q.status = 'queued' AND q.tenant = b.tenant
                                       AND q.queued_at < b.first) AS before
                   FROM bounds b),
               stretch AS (
                   SELECT q.id, q.tenant,
                          row_number() OVER (PARTITION BY q.tenant ORDER BY q.queued_at, q.id) AS rank
                   FROM bounds b JOIN sessions q
                     ON q.tenant = b.tenant AND q.status = 'queued'
                    AND q.queued_at >= b.first AND q.queued_at <= b.last)
               SELECT s.id AS "id!", (a.before + s.rank)::bigint AS "position!",
                      (SELECT warden_queue_tenants()) AS "tenants!"
               FROM stretch s JOIN page p ON p.id = s.id JOIN ahead a ON a.tenant = s.tenant"#,
            &queued,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        for place in places {
            if let Some(row) = page.iter_mut().find(|s| s.id == place.id) {
                row.queue_position = Some(place.position);
                row.queue_tenants = Some(place.tenants);
            }
        }
        Ok(())
    }
}
