//! The database's schema against this binary's migrations: which applied
//! migrations the binary knows, which it would apply, and the way back.
//! sqlx alone answers a schema newer than the binary with `migration 28
//! was previously applied but is missing`; this says it in an operator's
//! words before sqlx is asked anything, and refuses to start on a schema
//! that is behind when migrating at start-up is off (`WARDEN_MIGRATE=off`).
//!
//! The way back: a migration that can be reversed keeps its reverse in
//! `migrations/down/` (outside the folder sqlx reads), listed in [`DOWNS`];
//! `warden migrate --down-to N` runs them newest first, each in its own
//! transaction with the removal of its row from `_sqlx_migrations`, and
//! refuses before touching anything when one on the way has none.

use std::collections::BTreeSet;

use sqlx::migrate::Migrator;

use super::{Result, Store, StoreError};

/// The migrations compiled into this binary (`migrations/*.sql`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The migrations that can be reversed, with their reverse: the version
/// and the SQL of `migrations/down/NNNN_*.sql`. One without an entry here
/// cannot be reversed (`warden migrate --down-to` says so).
pub const DOWNS: &[(i64, &str)] = &[
    (
        21,
        include_str!("../../migrations/down/0021_worker_runs.sql"),
    ),
    (
        22,
        include_str!("../../migrations/down/0022_tree_attention_and_reservations.sql"),
    ),
    (
        23,
        include_str!("../../migrations/down/0023_saturating_counts.sql"),
    ),
    (
        25,
        include_str!("../../migrations/down/0025_model_call_buckets.sql"),
    ),
    (
        26,
        include_str!("../../migrations/down/0026_usage_charges.sql"),
    ),
    (
        27,
        include_str!("../../migrations/down/0027_replica_capabilities.sql"),
    ),
    (
        29,
        include_str!("../../migrations/down/0029_notifications.sql"),
    ),
    (
        30,
        include_str!("../../migrations/down/0030_money_and_history.sql"),
    ),
    (
        31,
        include_str!("../../migrations/down/0031_step_costs.sql"),
    ),
    (
        32,
        include_str!("../../migrations/down/0032_budget_warnings.sql"),
    ),
    (
        33,
        include_str!("../../migrations/down/0033_confirmation_and_tenant_warn_at.sql"),
    ),
    (
        34,
        include_str!("../../migrations/down/0034_workspace_snapshots.sql"),
    ),
    (
        35,
        include_str!("../../migrations/down/0035_session_traceparents.sql"),
    ),
    (
        36,
        include_str!("../../migrations/down/0036_applied_thresholds.sql"),
    ),
    (
        37,
        include_str!("../../migrations/down/0037_session_forks_index.sql"),
    ),
    (
        38,
        include_str!("../../migrations/down/0038_interval_decisions.sql"),
    ),
    (
        39,
        include_str!("../../migrations/down/0039_tenant_status_list_index.sql"),
    ),
    (
        40,
        include_str!("../../migrations/down/0040_session_status_counts.sql"),
    ),
    (
        41,
        include_str!("../../migrations/down/0041_settled_sort_keys.sql"),
    ),
    (
        42,
        include_str!("../../migrations/down/0042_unindexed_leases.sql"),
    ),
];

/// The key of the advisory lock that `migrate --down-to` holds, so two
/// operators never reverse at once (sqlx holds its own while applying).
const DOWN_LOCK: i64 = 0x7761_7264_656e_0027;

/// A migration as the operator reads it: version and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationName {
    /// Its number (the file's `NNNN`).
    pub version: i64,
    /// Its description (the rest of the file's name).
    pub description: String,
}

impl std::fmt::Display for MigrationName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04} {}", self.version, self.description)
    }
}

/// Where the database's schema stands against this binary's migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaStatus {
    /// Every migration the binary has is applied, and nothing else.
    Current,
    /// Migrations of this binary are not applied yet (these versions).
    Behind(Vec<i64>),
    /// Migrations this binary does not have were applied (by a newer
    /// release): their versions.
    Newer(Vec<i64>),
}

/// Compares the applied migrations with the binary's (pure): versions the
/// binary lacks win over versions it would apply, since a binary must not
/// apply anything to a schema it does not understand.
pub fn compare(applied: &BTreeSet<i64>, known: &BTreeSet<i64>) -> SchemaStatus {
    let unknown: Vec<i64> = applied.difference(known).copied().collect();
    if !unknown.is_empty() {
        return SchemaStatus::Newer(unknown);
    }
    let pending: Vec<i64> = known.difference(applied).copied().collect();
    if pending.is_empty() {
        SchemaStatus::Current
    } else {
        SchemaStatus::Behind(pending)
    }
}

/// The reverses `--down-to target` runs, newest first (pure): every applied
/// version above `target`, each with its down SQL; `Err` names the first
/// (newest) one that has none.
pub fn down_plan<'a>(
    applied: &BTreeSet<i64>,
    target: i64,
    downs: &[(i64, &'a str)],
) -> std::result::Result<Vec<(i64, &'a str)>, i64> {
    applied
        .iter()
        .rev()
        .take_while(|v| **v > target)
        .map(|v| {
            downs
                .iter()
                .find(|(d, _)| d == v)
                .map(|(_, sql)| (*v, *sql))
                .ok_or(*v)
        })
        .collect()
}

/// The newest migration this binary has.
pub fn binary_version() -> i64 {
    known_versions().last().copied().unwrap_or(0)
}

/// The versions of this binary's (up) migrations.
fn known_versions() -> BTreeSet<i64> {
    MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect()
}

/// The name of this binary's migration `version`.
pub fn migration_name(version: i64) -> MigrationName {
    let description = MIGRATOR
        .iter()
        .find(|m| m.version == version && !m.migration_type.is_down_migration())
        .map_or_else(
            || "(not in this binary)".into(),
            |m| m.description.to_string(),
        );
    MigrationName {
        version,
        description,
    }
}

/// [`Store::applied_migrations`] on a connection the caller holds (the
/// embedded store's pool has one: a way down holds it throughout).
async fn applied_on(conn: &mut sqlx::PgConnection) -> Result<BTreeSet<i64>> {
    // Not `query!`: `_sqlx_migrations` is sqlx's own table, absent from
    // the schema the queries are checked against.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(BTreeSet::new());
    }
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    Ok(versions.into_iter().collect())
}

impl Store {
    /// The versions applied to this database (none on an empty one). A
    /// migration left failed (`success = false`) counts as applied: sqlx
    /// refuses to go on from it, and so does the operator's procedure.
    pub async fn applied_migrations(&self) -> Result<BTreeSet<i64>> {
        let mut conn = self.pool.acquire().await?;
        applied_on(&mut conn).await
    }

    /// Where the schema stands against this binary's migrations.
    pub async fn schema_status(&self) -> Result<SchemaStatus> {
        Ok(compare(
            &self.applied_migrations().await?,
            &known_versions(),
        ))
    }

    /// Refuses a schema newer than this binary, in plain words.
    async fn refuse_newer(&self) -> Result<SchemaStatus> {
        let status = self.schema_status().await?;
        if let SchemaStatus::Newer(unknown) = &status {
            return Err(StoreError::SchemaNewer {
                database: unknown.last().copied().unwrap_or(0),
                binary: binary_version(),
            });
        }
        Ok(status)
    }

    /// Applies the migrations this binary has and the database lacks,
    /// after checking that the database has none this binary lacks.
    pub async fn migrate(&self) -> Result<()> {
        self.refuse_newer().await?;
        // Also when current: sqlx checks the applied ones' checksums.
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Checks, without migrating, that the schema is exactly this
    /// binary's: behind names the command that brings it up to date.
    pub async fn require_current_schema(&self) -> Result<()> {
        let applied = self.applied_migrations().await?;
        match compare(&applied, &known_versions()) {
            SchemaStatus::Current => Ok(()),
            SchemaStatus::Behind(pending) => Err(StoreError::SchemaBehind {
                database: applied.last().copied().unwrap_or(0),
                binary: binary_version(),
                pending: pending.len(),
            }),
            SchemaStatus::Newer(unknown) => Err(StoreError::SchemaNewer {
                database: unknown.last().copied().unwrap_or(0),
                binary: binary_version(),
            }),
        }
    }

    /// The migrations `migrate` would apply, oldest first (none when the
    /// schema is current); a newer schema is refused as by `migrate`.
    pub async fn pending_migrations(&self) -> Result<Vec<MigrationName>> {
        Ok(match self.refuse_newer().await? {
            SchemaStatus::Behind(pending) => pending.into_iter().map(migration_name).collect(),
            _ => Vec::new(),
        })
    }

    /// Reverses every applied migration above `target`, newest first, each
    /// with its down script in one transaction; refuses before changing
    /// anything when one of them cannot be reversed. Returns what it
    /// reversed.
    pub async fn migrate_down_to(&self, target: i64) -> Result<Vec<MigrationName>> {
        // Before the connection is held: the embedded store's pool has one.
        self.refuse_newer().await?;
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(DOWN_LOCK)
            .execute(&mut *conn)
            .await?;
        let reversed = self.reverse_under_lock(&mut conn, target).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(DOWN_LOCK)
            .execute(&mut *conn)
            .await;
        let reversed = reversed?;
        unlocked?;
        Ok(reversed)
    }

    async fn reverse_under_lock(
        &self,
        conn: &mut sqlx::PgConnection,
        target: i64,
    ) -> Result<Vec<MigrationName>> {
        let applied = applied_on(conn).await?;
        let plan =
            down_plan(&applied, target, DOWNS).map_err(|version| StoreError::Irreversible {
                migration: migration_name(version).to_string(),
            })?;
        let mut done = Vec::with_capacity(plan.len());
        for (version, sql) in plan {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::raw_sql(sql).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
                .bind(version)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            done.push(migration_name(version));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[i64]) -> BTreeSet<i64> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_schema_is_current_behind_or_newer() {
        assert_eq!(compare(&set(&[1, 2]), &set(&[1, 2])), SchemaStatus::Current);
        assert_eq!(
            compare(&set(&[1]), &set(&[1, 2, 3])),
            SchemaStatus::Behind(vec![2, 3])
        );
        assert_eq!(
            compare(&set(&[]), &set(&[1])),
            SchemaStatus::Behind(vec![1])
        );
        // Unknown versions win: nothing is applied over a schema not understood.
        assert_eq!(
            compare(&set(&[1, 3]), &set(&[1, 2])),
            SchemaStatus::Newer(vec![3])
        );
    }

    #[test]
    fn a_way_down_reverses_newest_first_or_names_what_cannot_be_reversed() {
        let downs = [(27, "down 27"), (28, "down 28")];
        assert_eq!(
            down_plan(&set(&[26, 27, 28]), 26, &downs),
            Ok(vec![(28, "down 28"), (27, "down 27")])
        );
        assert_eq!(down_plan(&set(&[26, 27]), 27, &downs), Ok(vec![]));
        assert_eq!(down_plan(&set(&[25, 26, 27]), 25, &downs), Err(26));
    }

    #[test]
    fn every_down_script_reverses_a_migration_of_this_binary() {
        for (version, sql) in DOWNS {
            assert!(known_versions().contains(version), "{version}");
            assert!(sql.contains(&format!("{version:04}_")), "{version}");
        }
        assert!(binary_version() >= 27);
    }

    /// The schema as the database describes it: every column, trigger and
    /// function of the public schema, in a stable order.
    async fn shape(pool: &sqlx::PgPool) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || coalesce(column_default, '')
               FROM information_schema.columns WHERE table_schema = 'public'
             UNION ALL SELECT 'trigger ' || tgname || ' ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
             UNION ALL SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid))
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
             ORDER BY 1",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    }

    async fn insert_session(pool: &sqlx::PgPool, limits: &str, executor: &str) -> uuid::Uuid {
        let id = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO sessions (id, goal, mode, status, limits, executor, queued_at)
             VALUES ($1, 'goal', 'fixed', 'queued', $2::jsonb, $3::jsonb, now())",
        )
        .bind(id)
        .bind(limits)
        .bind(executor)
        .execute(pool)
        .await
        .unwrap();
        id
    }

    async fn needs_of(pool: &sqlx::PgPool, id: uuid::Uuid) -> Vec<String> {
        sqlx::query_scalar("SELECT needs FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// Up, down, up on a database with sessions in it: the schema is the
    /// same as after the first up, the sessions are all there and their
    /// needs are derived again.
    #[tokio::test]
    async fn the_reversible_migrations_round_trip_on_a_populated_database() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        let id = insert_session(&db.pool, r#"{"review_every": 5}"#, r#"{"kind": "webhook"}"#).await;
        let plain = insert_session(&db.pool, "{}", r#"{"kind": "webhook"}"#).await;
        let before = shape(&db.pool).await;
        assert_eq!(needs_of(&db.pool, id).await, ["review_every"]);

        // Down to the previous release's schema (9276987: 0020).
        let reversed = store.migrate_down_to(20).await.unwrap();
        let above_20: Vec<i64> = known_versions().into_iter().filter(|v| *v > 20).collect();
        let newest_first: Vec<i64> = above_20.iter().rev().copied().collect();
        assert_eq!(
            reversed.iter().map(|m| m.version).collect::<Vec<_>>(),
            newest_first
        );
        assert_eq!(
            store.schema_status().await.unwrap(),
            SchemaStatus::Behind(above_20)
        );
        let down = shape(&db.pool).await;
        assert!(!down.iter().any(|c| c.starts_with("sessions.needs ")));
        assert!(!down.iter().any(|c| c.contains("capabilities")));
        assert!(
            !down
                .iter()
                .any(|c| c.starts_with("sessions.tokens_charged "))
        );
        assert!(!down.iter().any(|c| c.starts_with("model_call_buckets.")));

        store.migrate().await.unwrap();
        assert_eq!(shape(&db.pool).await, before);
        assert_eq!(needs_of(&db.pool, id).await, ["review_every"]);
        assert!(needs_of(&db.pool, plain).await.is_empty());
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(count, 2);
    }

    /// A way down through a migration without a reverse is refused whole,
    /// naming it, before anything is reversed.
    #[tokio::test]
    async fn a_way_down_through_an_irreversible_migration_changes_nothing() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        let before = shape(&db.pool).await;
        let err = store.migrate_down_to(19).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("0020 child sessions cannot be reversed"),
            "{text}"
        );
        assert_eq!(shape(&db.pool).await, before);
        assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);
    }

    /// A schema with a migration this binary lacks is refused in plain
    /// words (both versions, what to do), before sqlx is asked anything.
    #[tokio::test]
    async fn a_newer_schema_is_refused_in_plain_words() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (9001, 'from the future', true, '\\x00', 1)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let binary = binary_version();
        for err in [
            store.migrate().await.unwrap_err(),
            store.require_current_schema().await.unwrap_err(),
            store.pending_migrations().await.unwrap_err(),
        ] {
            assert!(
                matches!(err, StoreError::SchemaNewer { database: 9001, .. }),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!(
                    "this database's schema is at migration 9001, newer than this binary's {binary}"
                )),
                "{text}"
            );
            assert!(
                text.contains(&format!("warden migrate --down-to {binary}")),
                "{text}"
            );
        }
    }

    /// `WARDEN_MIGRATE=off`'s check: a schema behind the binary is refused
    /// with the command that brings it up to date, and nothing is applied.
    #[tokio::test]
    async fn a_schema_behind_is_refused_without_migrating() {
        let db = crate::store::testing::TestDb::new().await;
        let store = Store::from_pool(db.pool.clone());
        store.require_current_schema().await.unwrap();
        let known: Vec<i64> = known_versions().into_iter().collect();
        let (below, newest) = (known[known.len() - 2], known[known.len() - 1]);
        store.migrate_down_to(below).await.unwrap();
        let err = store.require_current_schema().await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("behind this binary's"), "{text}");
        assert!(text.contains("run `warden migrate`"), "{text}");
        assert_eq!(
            store.pending_migrations().await.unwrap(),
            vec![migration_name(newest)]
        );
        assert_eq!(
            store.schema_status().await.unwrap(),
            SchemaStatus::Behind(vec![newest])
        );
    }

    /// The database derives a session's needs as `spec::needs` does, from
    /// the columns as the store writes them.
    #[tokio::test]
    async fn the_database_derives_the_needs_the_code_does() {
        use crate::policy::guardrails::Limits;
        use crate::spec::{ExecutorSpec, needs};
        let db = crate::store::testing::TestDb::new().await;
        let executors = [
            serde_json::json!({"kind": "scripted", "steps": [{"action": "a", "output": "o"}]}),
            serde_json::json!({"kind": "scripted", "steps": [{"action": "a", "output": "o",
                "delegate": [{"goal": "child"}]}]}),
            serde_json::json!({"kind": "scripted", "steps": [{"action": "a", "output": "o"}],
                "scripts": {"c": [{"action": "a", "output": "o", "delegate": [{"goal": "g"}]}]}}),
            serde_json::json!({"kind": "llm", "model": "m", "base_url": "http://x/v1"}),
            serde_json::json!({"kind": "llm", "model": "m", "base_url": "http://x/v1",
                "tools": ["builtin"]}),
            serde_json::json!({"kind": "llm", "model": "m", "base_url": "http://x/v1",
                "tools": ["builtin", "fs:read"], "approvals": {"tools": {"fs:read": "always"}}}),
            serde_json::json!({"kind": "worker", "queue": "q"}),
            serde_json::json!({"kind": "webhook", "url": "http://x/step"}),
        ];
        for review_every in [None, Some(0), Some(7)] {
            let limits = Limits {
                max_iterations: 10,
                max_wall_time_ms: 60_000,
                max_tokens: 1_000,
                max_consecutive_errors: 3,
                reflection_interval: 5,
                reflection_adaptive: false,
                checkpoint_interval: 5,
                max_tool_calls: None,
                max_cycles: 10,
                context_budget_tokens: 32_000,
                review_every,
                warn_at: crate::policy::soft_budget::WarnAt::DEFAULT,
                max_cost_usd: None,
            };
            for executor in &executors {
                let spec: ExecutorSpec = serde_json::from_value(executor.clone()).unwrap();
                let stored = serde_json::to_string(&spec).unwrap();
                let id =
                    insert_session(&db.pool, &serde_json::to_string(&limits).unwrap(), &stored)
                        .await;
                let expected: Vec<String> = needs(&limits, Some(&spec))
                    .iter()
                    .map(|c| c.as_str().to_string())
                    .collect();
                let mut got = needs_of(&db.pool, id).await;
                got.sort_by_key(|n| {
                    crate::policy::capabilities::Capability::parse(n).map(|c| c as u8)
                });
                assert_eq!(got, expected, "{review_every:?} {stored}");
            }
        }
    }

    /// A type's name as the previous release's `.sqlx` data spells it
    /// (`Int8Array`) and as Postgres does (`INT8[]`), made comparable.
    fn type_key(name: &str) -> String {
        name.replace("[]", "array").to_ascii_lowercase()
    }

    /// Expand, then contract: every store query of the previous release
    /// (`tests/fixtures/queries-9276987.json`, taken from its `.sqlx`)
    /// still prepares against this tree's migrated schema, with the same
    /// parameter types and the same result columns and types it decodes, so
    /// an old replica keeps working beside a new one.
    #[tokio::test]
    async fn the_previous_releases_queries_prepare_against_this_schema() {
        use sqlx::Executor;
        use sqlx::TypeInfo;
        #[derive(serde::Deserialize)]
        struct Fixture {
            queries: Vec<Query>,
        }
        #[derive(serde::Deserialize)]
        struct Query {
            query: String,
            columns: Vec<(String, serde_json::Value)>,
            parameters: serde_json::Value,
        }
        let fixture: Fixture =
            serde_json::from_str(include_str!("../../tests/fixtures/queries-9276987.json"))
                .unwrap();
        assert!(fixture.queries.len() > 100, "{}", fixture.queries.len());
        let db = crate::store::testing::TestDb::new().await;
        let mut broken = Vec::new();
        for q in &fixture.queries {
            // The fixture is this repository's own SQL, prepared, never run.
            let sql = sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(q.query.clone()));
            let described = match (&db.pool).describe(sql).await {
                Ok(d) => d,
                Err(err) => {
                    broken.push(format!("{err}: {}", q.query));
                    continue;
                }
            };
            let columns: Vec<(String, String)> = described
                .columns()
                .iter()
                .map(|c| {
                    use sqlx::Column;
                    (c.name().to_string(), type_key(c.type_info().name()))
                })
                .collect();
            let expected: Vec<(String, Option<String>)> = q
                .columns
                .iter()
                .map(|(name, ty)| (name.clone(), ty.as_str().map(type_key)))
                .collect();
            let same = columns.len() == expected.len()
                && columns
                    .iter()
                    .zip(&expected)
                    .all(|((n, t), (en, et))| n == en && et.as_ref().is_none_or(|et| et == t));
            if !same {
                broken.push(format!("columns {columns:?} not {expected:?}: {}", q.query));
            }
            if let (Some(sqlx::Either::Left(params)), Some(old)) =
                (described.parameters(), q.parameters.as_array())
            {
                let now: Vec<String> = params.iter().map(|t| type_key(t.name())).collect();
                let before: Vec<Option<String>> =
                    old.iter().map(|t| t.as_str().map(type_key)).collect();
                let same = now.len() == before.len()
                    && now
                        .iter()
                        .zip(&before)
                        .all(|(n, b)| b.as_ref().is_none_or(|b| b == n));
                if !same {
                    broken.push(format!("parameters {now:?} not {before:?}: {}", q.query));
                }
            }
        }
        assert!(broken.is_empty(), "{}", broken.join("\n\n"));
    }
}
