//! The SQL of retention: which ended sessions are due for the archive, their
//! rows as JSON for the archive file (`row_to_json`, so a file holds every
//! column as stored and imports back equal), the batched delete that follows,
//! event compaction, tenants' own retention, and the lease that lets one
//! replica of the fleet prune at a time.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::sessions::delete as delete_session;
use super::{Result, Store, StoreError, TenantScope};
use crate::policy::retention::TenantRetention;

/// An ended session the retention query found, with what says whether it
/// changed since (its row's `updated_at` and latest event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedSession {
    /// The session.
    pub id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// How long ago it ended.
    pub ended_ago: std::time::Duration,
    /// How long ago it was imported from an archive, if it was.
    pub imported_ago: Option<std::time::Duration>,
    /// When it ended (names the archive's month folder).
    pub ended_at: DateTime<Utc>,
    /// Its tenant's own retention.
    pub tenant_retention: TenantRetention,
    /// The row's last change when read.
    pub updated_at: DateTime<Utc>,
    /// Its latest event when read.
    pub last_event_seq: i64,
}

/// The tables of a session's history, in the order an archive lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryTable {
    /// `iterations`, by number.
    Iterations,
    /// `reflections`, by number.
    Reflections,
    /// `events` of the decision kinds, by sequence number.
    Decisions,
    /// Every other event, by sequence number.
    Events,
    /// `checkpoints`, by id.
    Checkpoints,
    /// `tool_calls`, by iteration and call.
    ToolCalls,
    /// `refinements`, by number.
    Refinements,
    /// `tasks` (the agent's task queue), by id.
    Tasks,
}

impl HistoryTable {
    /// The database table its rows go to.
    pub fn table(self) -> &'static str {
        match self {
            HistoryTable::Iterations => "iterations",
            HistoryTable::Reflections => "reflections",
            HistoryTable::Decisions | HistoryTable::Events => "events",
            HistoryTable::Checkpoints => "checkpoints",
            HistoryTable::ToolCalls => "tool_calls",
            HistoryTable::Refinements => "refinements",
            HistoryTable::Tasks => "tasks",
        }
    }

    /// Every table, in the archive's order.
    pub const ALL: [HistoryTable; 8] = [
        HistoryTable::Iterations,
        HistoryTable::Reflections,
        HistoryTable::Decisions,
        HistoryTable::Events,
        HistoryTable::Checkpoints,
        HistoryTable::ToolCalls,
        HistoryTable::Refinements,
        HistoryTable::Tasks,
    ];
}

/// One row of a history table as JSON, with its place in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    /// The row's key (a second part only for tool calls), for the next page.
    pub key: (i64, i64),
    /// The row as `row_to_json` writes it.
    pub json: String,
}

/// A session's rows to import, as JSON objects of each table's columns.
#[derive(Debug, Clone, Default)]
pub struct ImportRows {
    /// The `sessions` row.
    pub session: String,
    /// Rows of the other tables, each a JSON array of row objects.
    pub tables: Vec<(HistoryTable, String)>,
}

impl Store {
    /// Up to `limit` ended sessions without children left, oldest end
    /// first, whose end (or import) is older than their tenant's retention, or the server's
    /// (`server_keep`, `None`: forever). Serves every tenant: the pruner's
    /// own work, scoped by each row's tenant from here on.
    pub async fn ended_sessions_due(
        &self,
        server_keep: Option<std::time::Duration>,
        limit: i64,
    ) -> Result<Vec<EndedSession>> {
        let rows = sqlx::query!(
            r#"SELECT s.id, s.tenant, s.ended_at AS "ended_at!", s.imported_at, s.updated_at,
                      s.last_event_seq, now() AS "now!",
                      r.tenant IS NOT NULL AS "has_row!", r.retention_seconds AS "retention_seconds?"
               FROM sessions s LEFT JOIN tenant_retention r ON r.tenant = s.tenant
               WHERE s.ended_at IS NOT NULL
                 AND s.status IN ('completed', 'stopped', 'interrupted', 'failed')
                 -- Children first: a parent's delete takes its children with
                 -- it, so it waits until they are archived and gone.
                 AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_id = s.id)
                 AND greatest(s.ended_at, s.imported_at) < now() - make_interval(secs =>
                       CASE WHEN r.tenant IS NULL THEN $1::float8 ELSE r.retention_seconds::float8 END)
               ORDER BY s.ended_at, s.id
               LIMIT $2"#,
            server_keep.map(|d| d.as_secs_f64()),
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        let ago = |now: DateTime<Utc>, at: DateTime<Utc>| (now - at).to_std().unwrap_or_default();
        Ok(rows
            .into_iter()
            .map(|r| EndedSession {
                id: r.id,
                tenant: r.tenant,
                ended_ago: ago(r.now, r.ended_at),
                imported_ago: r.imported_at.map(|at| ago(r.now, at)),
                ended_at: r.ended_at,
                tenant_retention: match (r.has_row, r.retention_seconds) {
                    (false, _) => TenantRetention::ServerDefault,
                    (true, None) => TenantRetention::Forever,
                    (true, Some(secs)) => TenantRetention::Keep(std::time::Duration::from_secs(
                        u64::try_from(secs).unwrap_or(0),
                    )),
                },
                updated_at: r.updated_at,
                last_event_seq: r.last_event_seq,
            })
            .collect())
    }

    /// The `sessions` row of `id` as JSON, if `scope` reaches it.
    pub async fn session_row_json(&self, id: Uuid, scope: &TenantScope) -> Result<Option<String>> {
        Ok(sqlx::query_scalar!(
            r#"SELECT row_to_json(s)::text AS "json!" FROM sessions s
               WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)"#,
            id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A page of `table`'s rows of session `id` after `after`, in key order
    /// (the key's second part counts for tool calls only; start from
    /// `(0, -1)`).
    pub async fn history_page(
        &self,
        table: HistoryTable,
        id: Uuid,
        after: (i64, i64),
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<HistoryRow>> {
        let tenant = scope.tenant();
        macro_rules! page {
            ($sql:literal) => {
                sqlx::query!($sql, id, after.0, after.1, limit, tenant)
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(|r| HistoryRow {
                        key: (r.k1, r.k2),
                        json: r.json,
                    })
                    .collect()
            };
        }
        let rows: Vec<HistoryRow> = match table {
            HistoryTable::Iterations => page!(
                r#"SELECT number AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM iterations t WHERE session_id = $1 AND number > $2::bigint AND $3::bigint IS NOT NULL
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY number LIMIT $4"#
            ),
            HistoryTable::Reflections => page!(
                r#"SELECT number::bigint AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM reflections t WHERE session_id = $1 AND number > $2::bigint AND $3::bigint IS NOT NULL
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY number LIMIT $4"#
            ),
            HistoryTable::Decisions => page!(
                r#"SELECT seq AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM events t WHERE session_id = $1 AND seq > $2::bigint AND $3::bigint IS NOT NULL
                     AND kind IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed',
                                'reflection_interval_changed')
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY seq LIMIT $4"#
            ),
            HistoryTable::Events => page!(
                r#"SELECT seq AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM events t WHERE session_id = $1 AND seq > $2::bigint AND $3::bigint IS NOT NULL
                     AND kind NOT IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed',
                                'reflection_interval_changed')
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY seq LIMIT $4"#
            ),
            HistoryTable::Checkpoints => page!(
                r#"SELECT id AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM checkpoints t WHERE session_id = $1 AND id > $2::bigint AND $3::bigint IS NOT NULL
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY id LIMIT $4"#
            ),
            HistoryTable::ToolCalls => page!(
                r#"SELECT iteration AS "k1!", call_index::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM tool_calls t WHERE session_id = $1 AND (iteration, call_index) > ($2, $3::bigint)
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY iteration, call_index LIMIT $4"#
            ),
            HistoryTable::Refinements => page!(
                r#"SELECT number::bigint AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM refinements t WHERE session_id = $1 AND number > $2::bigint AND $3::bigint IS NOT NULL
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY number LIMIT $4"#
            ),
            HistoryTable::Tasks => page!(
                r#"SELECT id::bigint AS "k1!", 0::bigint AS "k2!", row_to_json(t)::text AS "json!"
                   FROM tasks t WHERE session_id = $1 AND id > $2::bigint AND $3::bigint IS NOT NULL
                     AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($5::text IS NULL OR s.tenant = $5))
                   ORDER BY id LIMIT $4"#
            ),
        };
        Ok(rows)
    }

    /// Deletes, in one transaction, the archived sessions that have not
    /// changed since they were read for the archive (same `updated_at`,
    /// same latest event, still ended) and that no one else holds locked,
    /// each through the deletion path of `DELETE /{id}` under its own
    /// tenant; returns the ids deleted. A session that changed (resumed,
    /// say) stays, and is archived again once it is due again.
    pub async fn delete_archived(&self, archived: &[EndedSession]) -> Result<Vec<Uuid>> {
        if archived.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = archived.iter().map(|s| s.id).collect();
        let updated: Vec<DateTime<Utc>> = archived.iter().map(|s| s.updated_at).collect();
        let seqs: Vec<i64> = archived.iter().map(|s| s.last_event_seq).collect();
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let unchanged = sqlx::query!(
            r#"SELECT s.id, s.tenant FROM sessions s
               JOIN unnest($1::uuid[], $2::timestamptz[], $3::bigint[]) AS x(id, updated_at, last_seq)
                 ON s.id = x.id
               WHERE s.updated_at = x.updated_at AND s.last_event_seq = x.last_seq
                 AND s.status IN ('completed', 'stopped', 'interrupted', 'failed')
               FOR UPDATE OF s SKIP LOCKED"#,
            &ids,
            &updated,
            &seqs,
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut deleted = Vec::with_capacity(unchanged.len());
        for row in unchanged {
            delete_session(&mut tx, row.id, &TenantScope::tenant_only(row.tenant)).await?;
            deleted.push(row.id);
        }
        tx.commit().await?;
        Ok(deleted)
    }

    /// Imports one session's rows in one transaction: its `sessions` row
    /// marked imported (read-only) and without an owner, then its history.
    /// Fails, importing nothing, when a session of that id exists.
    pub async fn import_session(&self, id: Uuid, rows: &ImportRows) -> Result<()> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        // An archive written before a migration added a NOT NULL column
        // lacks it: the column's default fills it, as the migration did.
        let session = with_defaults(&mut tx, id, "sessions", &rows.session).await?;
        let mut tables = Vec::with_capacity(rows.tables.len());
        for (table, json) in &rows.tables {
            tables.push((
                *table,
                with_defaults(&mut tx, id, table.table(), json).await?,
            ));
        }
        Self::check_placed(&mut tx, id, &session).await?;
        Self::insert_ended(&mut tx, id, &session).await?;
        Self::insert_history(&mut tx, id, &tables).await?;
        tx.commit().await?;
        self.durable().await?;
        Ok(())
    }

    /// Refuses a `sessions` row whose place in a tree this database does
    /// not hold.
    async fn check_placed(conn: &mut PgConnection, id: Uuid, session: &str) -> Result<()> {
        // The row's place in a tree is checked against this database, not
        // taken from the file: a root has no parent, lineage or borrowed
        // secrets; a child's parent is here, of the same tenant, its lineage
        // is its parent's and the parent, and the secrets it uses are an
        // ancestor's. (Checked before the insert, whose foreign key would
        // otherwise answer for a missing parent.)
        let placed = sqlx::query_scalar!(
            r#"SELECT coalesce(
                   (r.parent_id IS NULL AND cardinality(r.lineage) = 0 AND r.secrets_from IS NULL)
                   OR EXISTS (SELECT 1 FROM sessions p
                              WHERE p.id = r.parent_id AND p.tenant = r.tenant
                                AND r.lineage = p.lineage || p.id
                                AND r.secrets_from = ANY (r.lineage)),
                   false) AS "placed!"
               FROM json_populate_record(NULL::sessions, $1::text::json) r"#,
            session,
        )
        .fetch_one(&mut *conn)
        .await?;
        if !placed {
            return Err(StoreError::Import {
                id,
                detail: "its parent, lineage or secrets do not match this database: a child \
                         imports only under its own parent, of the same tenant, imported first"
                    .into(),
            });
        }
        Ok(())
    }

    /// Inserts the `sessions` row, refused when the id is taken, and marks
    /// it imported and ownerless, refused when it had not ended.
    async fn insert_ended(conn: &mut PgConnection, id: Uuid, session: &str) -> Result<()> {
        let inserted = sqlx::query!(
            "INSERT INTO sessions SELECT * FROM json_populate_record(NULL::sessions, $1::text::json)
             ON CONFLICT (id) DO NOTHING",
            session,
        )
        .execute(&mut *conn)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::Import {
                id,
                detail: "a session with this id exists already; delete it first to import it again"
                    .into(),
            });
        }
        let marked = sqlx::query!(
            "UPDATE sessions SET imported_at = now(), owner = NULL, lease_token = NULL,
                    lease_expires_at = NULL, heartbeat_at = NULL,
                    stop_requested = false, pause_requested = false
             WHERE id = $1 AND ended_at IS NOT NULL
               AND status IN ('completed', 'stopped', 'interrupted', 'failed')",
            id,
        )
        .execute(&mut *conn)
        .await?;
        if marked.rows_affected() == 0 {
            return Err(StoreError::Import {
                id,
                detail: "the archived session had not ended; only ended sessions are archived"
                    .into(),
            });
        }
        Ok(())
    }

    /// Inserts the session's history, table by table.
    async fn insert_history(
        conn: &mut PgConnection,
        id: Uuid,
        tables: &[(HistoryTable, String)],
    ) -> Result<()> {
        for (table, json) in tables {
            let done = match table {
                HistoryTable::Iterations => sqlx::query!(
                    "INSERT INTO iterations SELECT * FROM json_populate_recordset(NULL::iterations, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
                HistoryTable::Reflections => sqlx::query!(
                    "INSERT INTO reflections SELECT * FROM json_populate_recordset(NULL::reflections, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
                HistoryTable::Decisions | HistoryTable::Events => sqlx::query!(
                    "INSERT INTO events SELECT * FROM json_populate_recordset(NULL::events, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
                // Checkpoint ids are the database's own: numbered anew here.
                HistoryTable::Checkpoints => sqlx::query!(
                    "INSERT INTO checkpoints (session_id, iteration, reason, state, created_at)
                     SELECT session_id, iteration, reason, state, created_at
                     FROM json_populate_recordset(NULL::checkpoints, $1::text::json) WHERE session_id = $2 ORDER BY id",
                    json, id
                ).execute(&mut *conn).await?,
                HistoryTable::ToolCalls => sqlx::query!(
                    "INSERT INTO tool_calls SELECT * FROM json_populate_recordset(NULL::tool_calls, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
                HistoryTable::Refinements => sqlx::query!(
                    "INSERT INTO refinements SELECT * FROM json_populate_recordset(NULL::refinements, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
                HistoryTable::Tasks => sqlx::query!(
                    "INSERT INTO tasks SELECT * FROM json_populate_recordset(NULL::tasks, $1::text::json) WHERE session_id = $2",
                    json, id
                ).execute(&mut *conn).await?,
            };
            let _ = done;
        }
        Ok(())
    }

    /// Sessions whose events grew past `horizon` since their last
    /// compaction by at least a tenth of it: (id, latest event, compacted
    /// through). Serves every tenant, as the pruner does.
    pub async fn sessions_to_compact(
        &self,
        horizon: i64,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<(Uuid, i64, i64)>> {
        let rows = sqlx::query!(
            r#"SELECT s.id, s.last_event_seq, coalesce(c.through_seq, 0) AS "through!"
               FROM sessions s LEFT JOIN event_compaction c ON c.session_id = s.id
               WHERE s.last_event_seq - $1 - coalesce(c.through_seq, 0) >= greatest($1 / 10, 1)
                 AND ($3::text IS NULL OR s.tenant = $3)
               ORDER BY s.last_event_seq - coalesce(c.through_seq, 0) DESC
               LIMIT $2"#,
            horizon,
            limit,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.id, r.last_event_seq, r.through))
            .collect())
    }

    /// Events of session `id` in `after..=through` that compaction may
    /// drop by kind (`kinds`, and gate evaluations): (seq, kind, whether a
    /// gate evaluation decided `continue`), at most `limit`.
    pub async fn compaction_candidates(
        &self,
        id: Uuid,
        after: i64,
        through: i64,
        kinds: &[&str],
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<(i64, String, bool)>> {
        let rows = sqlx::query!(
            r#"SELECT seq, kind,
                      (kind = 'gate_decision' AND data->'decision'->>'decision' = 'continue') AS "gate_continued!"
               FROM events
               WHERE session_id = $1 AND seq > $2 AND seq <= $3
                 AND (kind = ANY($4) OR kind = 'gate_decision')
                 AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($6::text IS NULL OR s.tenant = $6))
               ORDER BY seq LIMIT $5"#,
            id,
            after,
            through,
            kinds as &[&str],
            limit,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.seq, r.kind, r.gate_continued))
            .collect())
    }

    /// Drops the events `seqs` of session `id` and records that its events
    /// are compacted through `through`, in one short transaction.
    pub async fn drop_events(
        &self,
        id: Uuid,
        seqs: &[i64],
        through: i64,
        scope: &TenantScope,
    ) -> Result<u64> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let dropped = sqlx::query!(
            "DELETE FROM events WHERE session_id = $1 AND seq = ANY($2)
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($3::text IS NULL OR s.tenant = $3))",
            id,
            seqs,
            scope.tenant(),
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query!(
            "INSERT INTO event_compaction (session_id, through_seq, dropped)
             SELECT $1, $2, $3 WHERE EXISTS
                 (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($4::text IS NULL OR s.tenant = $4))
             ON CONFLICT (session_id) DO UPDATE
                 SET through_seq = greatest(event_compaction.through_seq, EXCLUDED.through_seq),
                     dropped = event_compaction.dropped + EXCLUDED.dropped,
                     compacted_at = now()",
            id,
            through,
            i64::try_from(dropped).unwrap_or(i64::MAX),
            scope.tenant(),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(dropped)
    }

    /// Takes (or renews) the lease `name` for `holder` for `ttl`, unless
    /// another holder's lease still runs; returns whether `holder` holds it.
    pub async fn take_maintenance_lease(
        &self,
        name: &str,
        holder: Uuid,
        ttl: std::time::Duration,
    ) -> Result<bool> {
        let held = sqlx::query_scalar!(
            "INSERT INTO maintenance_leases (name, holder, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))
             ON CONFLICT (name) DO UPDATE
                 SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
                 WHERE maintenance_leases.expires_at < now()
                    OR maintenance_leases.holder = EXCLUDED.holder
             RETURNING holder",
            name,
            holder,
            ttl.as_secs_f64(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(held == Some(holder))
    }

    /// Gives the lease `name` up, if `holder` holds it.
    pub async fn release_maintenance_lease(&self, name: &str, holder: Uuid) -> Result<()> {
        sqlx::query!(
            "DELETE FROM maintenance_leases WHERE name = $1 AND holder = $2",
            name,
            holder
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The tenants that have a retention of their own (only `tenant`, when
    /// given), by name.
    pub async fn tenant_retentions(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<(String, TenantRetention)>> {
        let rows = sqlx::query!(
            "SELECT tenant, retention_seconds FROM tenant_retention
             WHERE ($1::text IS NULL OR tenant = $1) ORDER BY tenant",
            tenant
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let retention = match r.retention_seconds {
                    None => TenantRetention::Forever,
                    Some(secs) => TenantRetention::Keep(std::time::Duration::from_secs(
                        u64::try_from(secs).unwrap_or(0),
                    )),
                };
                (r.tenant, retention)
            })
            .collect())
    }

    /// Sets a tenant's own retention (`ServerDefault` removes its row).
    pub async fn set_tenant_retention(
        &self,
        tenant: &str,
        retention: TenantRetention,
    ) -> Result<()> {
        let seconds = match retention {
            TenantRetention::ServerDefault => {
                sqlx::query!("DELETE FROM tenant_retention WHERE tenant = $1", tenant)
                    .execute(&self.pool)
                    .await?;
                return Ok(());
            }
            TenantRetention::Forever => None,
            TenantRetention::Keep(keep) => Some(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX)),
        };
        sqlx::query!(
            "INSERT INTO tenant_retention (tenant, retention_seconds) VALUES ($1, $2)
             ON CONFLICT (tenant) DO UPDATE
                 SET retention_seconds = EXCLUDED.retention_seconds, updated_at = now()",
            tenant,
            seconds,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// `json` (one row, or an array of rows, of `table` as `row_to_json` wrote
/// them) with every NOT NULL column that has a default and that the rows
/// lack set to that default, evaluated by this database. Keys the table
/// does not have are left for `json_populate_record` to ignore.
async fn with_defaults(
    conn: &mut PgConnection,
    id: Uuid,
    table: &'static str,
    json: &str,
) -> Result<String> {
    let mut rows: serde_json::Value =
        serde_json::from_str(json).map_err(|e| StoreError::Import {
            id,
            detail: format!("its {table} rows are not JSON: {e}"),
        })?;
    let defaults: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, column_default::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1
           AND is_nullable = 'NO' AND column_default IS NOT NULL",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await?;
    let objects: Vec<&mut serde_json::Map<String, serde_json::Value>> = match &mut rows {
        serde_json::Value::Object(row) => vec![row],
        serde_json::Value::Array(all) => all.iter_mut().filter_map(|r| r.as_object_mut()).collect(),
        _ => Vec::new(),
    };
    let mut objects = objects;
    for (column, default) in defaults {
        if objects.iter().all(|row| row.contains_key(&column)) {
            continue;
        }
        // The expression comes from this database's catalog, never from
        // the archive: evaluating it is the migration's own default.
        let value: serde_json::Value =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT to_jsonb({default})")))
                .fetch_one(&mut *conn)
                .await?;
        for row in objects.iter_mut() {
            row.entry(column.clone()).or_insert_with(|| value.clone());
        }
    }
    serde_json::to_string(&rows).map_err(|e| StoreError::Import {
        id,
        detail: format!("its {table} rows: {e}"),
    })
}
