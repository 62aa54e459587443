//! Workspace snapshots: blobs by (tenant, SHA-256), stored once however many
//! checkpoints hold them; a manifest per checkpoint (session, iteration)
//! naming them by path, with the memory, context cycle and task queue a
//! fork starts from. Every read takes the tenant scope into its SQL.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Result, Store, TenantScope};
use crate::policy::snapshot::FileEntry;

/// Bytes of new blobs sent per statement.
const BLOB_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// A snapshot as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    /// The checkpoint's iteration.
    pub iteration: i64,
    /// Files in it.
    pub files: i64,
    /// Their bytes.
    pub bytes: i64,
    /// When it was taken.
    pub created_at: DateTime<Utc>,
}

/// A file of a stored manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// Relative path.
    pub path: String,
    /// SHA-256 of the content.
    pub digest: Vec<u8>,
    /// Bytes.
    pub size: i64,
    /// Permission bits.
    pub mode: i32,
    /// The earliest iteration of the session's snapshots since which the
    /// file has had this content.
    pub modified_iteration: i64,
}

impl StoredFile {
    /// As a manifest entry.
    pub fn entry(&self) -> FileEntry {
        let mut digest = [0u8; 32];
        if self.digest.len() == 32 {
            digest.copy_from_slice(&self.digest);
        }
        FileEntry {
            path: self.path.clone(),
            digest,
            size: self.size.max(0) as u64,
            mode: self.mode.max(0) as u32,
        }
    }
}

/// What a fork starts from beside the workspace.
#[derive(Debug, Clone)]
pub struct ForkSource {
    /// The session's memory as of the checkpoint.
    pub memory: String,
    /// Its context cycle.
    pub cycle: i32,
    /// Its task queue (`[{id, title, status, notes, priority}]`).
    pub tasks: Json<Value>,
}

/// Where a fork came from, and what it starts with.
#[derive(Debug, Clone)]
pub struct ForkStart {
    /// The session forked.
    pub session_id: Uuid,
    /// Its checkpoint's iteration.
    pub iteration: i64,
    /// Memory, cycle and tasks as of then.
    pub source: ForkSource,
    /// Guidance for the fork's first step.
    pub guidance: Option<String>,
}

impl Store {
    /// The digests of `digests` that `session_id`'s tenant has no blob of.
    pub async fn missing_blobs(
        &self,
        session_id: Uuid,
        digests: &[Vec<u8>],
    ) -> Result<Vec<Vec<u8>>> {
        Ok(sqlx::query_scalar!(
            r#"SELECT d AS "d!" FROM unnest($2::bytea[]) AS u(d)
               WHERE NOT EXISTS (SELECT 1 FROM workspace_blobs b JOIN sessions s ON s.tenant = b.tenant
                                 WHERE s.id = $1 AND b.digest = u.d)"#,
            session_id,
            digests,
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Stores the snapshot of `session_id` at checkpoint `iteration`: the
    /// new blobs (others are the tenant's already), then the manifest, in
    /// one transaction; a snapshot at the same iteration is replaced.
    pub async fn put_snapshot(
        &self,
        session_id: Uuid,
        iteration: i64,
        manifest: &[FileEntry],
        blobs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<()> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let mut batch: (Vec<Vec<u8>>, Vec<Vec<u8>>, usize) = (Vec::new(), Vec::new(), 0);
        for (digest, content) in blobs {
            batch.2 += content.len();
            batch.0.push(digest);
            batch.1.push(content);
            if batch.2 >= BLOB_BATCH_BYTES {
                insert_blobs(&mut tx, session_id, &batch.0, &batch.1).await?;
                batch = (Vec::new(), Vec::new(), 0);
            }
        }
        if !batch.0.is_empty() {
            insert_blobs(&mut tx, session_id, &batch.0, &batch.1).await?;
        }
        let bytes: u64 = manifest.iter().map(|e| e.size).sum();
        sqlx::query!(
            r#"INSERT INTO workspace_snapshots (session_id, iteration, tenant, files, bytes, memory, cycle, tasks)
               SELECT s.id, $2, s.tenant, $3, $4, s.memory, s.cycle,
                      coalesce((SELECT json_agg(json_build_object('id', t.id, 'title', t.title,
                                    'status', t.status, 'notes', t.notes, 'priority', t.priority) ORDER BY t.id)
                                FROM tasks t WHERE t.session_id = s.id), '[]'::json)
               FROM sessions s WHERE s.id = $1
               ON CONFLICT (session_id, iteration) DO UPDATE
                 SET files = EXCLUDED.files, bytes = EXCLUDED.bytes, memory = EXCLUDED.memory,
                     cycle = EXCLUDED.cycle, tasks = EXCLUDED.tasks, created_at = now()"#,
            session_id,
            iteration,
            manifest.len() as i64,
            i64::try_from(bytes).unwrap_or(i64::MAX),
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "DELETE FROM workspace_files WHERE session_id = $1 AND iteration = $2",
            session_id,
            iteration
        )
        .execute(&mut *tx)
        .await?;
        insert_manifest(&mut tx, session_id, iteration, manifest).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The snapshots of a session, oldest first.
    pub async fn snapshots(
        &self,
        session_id: Uuid,
        scope: &TenantScope,
    ) -> Result<Vec<SnapshotInfo>> {
        Ok(sqlx::query_as!(
            SnapshotInfo,
            "SELECT iteration, files, bytes, created_at FROM workspace_snapshots
             WHERE session_id = $1 AND ($2::text IS NULL OR tenant = $2) ORDER BY iteration",
            session_id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The manifest of the snapshot at `iteration` (the latest when `None`),
    /// with its iteration; `None` when there is no such snapshot in scope.
    pub async fn manifest(
        &self,
        session_id: Uuid,
        iteration: Option<i64>,
        scope: &TenantScope,
    ) -> Result<Option<(i64, Vec<StoredFile>)>> {
        let found = sqlx::query_scalar!(
            "SELECT iteration FROM workspace_snapshots
             WHERE session_id = $1 AND ($2::text IS NULL OR tenant = $2)
               AND ($3::bigint IS NULL OR iteration = $3)
             ORDER BY iteration DESC LIMIT 1",
            session_id,
            scope.tenant(),
            iteration,
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(at) = found else {
            return Ok(None);
        };
        let files = sqlx::query_as!(
            StoredFile,
            "SELECT path, digest, size, mode, modified_iteration FROM workspace_files
             WHERE session_id = $1 AND iteration = $2 AND ($3::text IS NULL OR tenant = $3)
             ORDER BY path",
            session_id,
            at,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(Some((at, files)))
    }

    /// The content of the blob `digest` of `session_id`'s tenant.
    pub async fn blob(
        &self,
        session_id: Uuid,
        digest: &[u8],
        scope: &TenantScope,
    ) -> Result<Option<Vec<u8>>> {
        Ok(sqlx::query_scalar!(
            "SELECT b.content FROM workspace_blobs b JOIN sessions s ON s.tenant = b.tenant
             WHERE s.id = $1 AND b.digest = $2 AND ($3::text IS NULL OR s.tenant = $3)",
            session_id,
            digest,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Memory, cycle and task queue of the snapshot at `iteration`.
    pub async fn fork_source(
        &self,
        session_id: Uuid,
        iteration: i64,
        scope: &TenantScope,
    ) -> Result<Option<ForkSource>> {
        Ok(sqlx::query_as!(
            ForkSource,
            r#"SELECT memory, cycle, tasks AS "tasks: Json<Value>" FROM workspace_snapshots
               WHERE session_id = $1 AND iteration = $2 AND ($3::text IS NULL OR tenant = $3)"#,
            session_id,
            iteration,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Deletes up to `limit` blobs no manifest names (their snapshots went
    /// with their sessions), older than `min_age_secs` so a snapshot being
    /// written keeps its own; the number deleted.
    pub async fn delete_unreferenced_blobs(&self, min_age_secs: i64, limit: i64) -> Result<u64> {
        Ok(sqlx::query!(
            "DELETE FROM workspace_blobs WHERE (tenant, digest) IN (
                 SELECT b.tenant, b.digest FROM workspace_blobs b
                 WHERE b.created_at < now() - make_interval(secs => $1::float8)
                   AND NOT EXISTS (SELECT 1 FROM workspace_files f
                                   WHERE f.tenant = b.tenant AND f.digest = b.digest)
                 LIMIT $2 FOR UPDATE SKIP LOCKED)",
            min_age_secs as f64,
            limit,
        )
        .execute(&self.pool)
        .await?
        .rows_affected())
    }
}

async fn insert_blobs(
    conn: &mut PgConnection,
    session_id: Uuid,
    digests: &[Vec<u8>],
    contents: &[Vec<u8>],
) -> Result<()> {
    sqlx::query!(
        "INSERT INTO workspace_blobs (tenant, digest, size, content)
         SELECT s.tenant, u.d, octet_length(u.c), u.c
         FROM sessions s, unnest($2::bytea[], $3::bytea[]) AS u(d, c)
         WHERE s.id = $1
         ON CONFLICT (tenant, digest) DO NOTHING",
        session_id,
        digests,
        contents,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The manifest's rows; a file keeps the iteration it last changed at when
/// the session's previous snapshot held it with the same content.
async fn insert_manifest(
    conn: &mut PgConnection,
    session_id: Uuid,
    iteration: i64,
    manifest: &[FileEntry],
) -> Result<()> {
    let paths: Vec<String> = manifest.iter().map(|e| e.path.clone()).collect();
    let digests: Vec<Vec<u8>> = manifest.iter().map(|e| e.digest.to_vec()).collect();
    let sizes: Vec<i64> = manifest
        .iter()
        .map(|e| i64::try_from(e.size).unwrap_or(i64::MAX))
        .collect();
    let modes: Vec<i32> = manifest.iter().map(|e| (e.mode & 0o7777) as i32).collect();
    sqlx::query!(
        "INSERT INTO workspace_files (session_id, iteration, path, tenant, digest, size, mode, modified_iteration)
         SELECT $1, $2, u.path, s.tenant, u.digest, u.size, u.mode,
                coalesce((SELECT p.modified_iteration FROM workspace_files p
                          WHERE p.session_id = $1 AND p.path = u.path AND p.digest = u.digest
                            AND p.iteration = (SELECT max(w.iteration) FROM workspace_snapshots w
                                               WHERE w.session_id = $1 AND w.iteration < $2)), $2)
         FROM sessions s, unnest($3::text[], $4::bytea[], $5::bigint[], $6::int[]) AS u(path, digest, size, mode)
         WHERE s.id = $1",
        session_id,
        iteration,
        &paths,
        &digests,
        &sizes,
        &modes,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks the new session `id` a fork of `start`, with the memory, cycle,
/// guidance and task queue it starts from (inside the create's transaction).
pub async fn start_fork(conn: &mut PgConnection, id: Uuid, start: &ForkStart) -> Result<()> {
    sqlx::query!(
        "UPDATE sessions SET forked_from_session = $2, forked_from_iteration = $3,
                memory = $4, cycle = $5, guidance = $6
         WHERE id = $1",
        id,
        start.session_id,
        start.iteration,
        start.source.memory,
        start.source.cycle.max(1),
        start.guidance,
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        r#"INSERT INTO tasks (session_id, id, title, status, notes, priority)
           SELECT $1, t.id, t.title, t.status, coalesce(t.notes, ''), coalesce(t.priority, 0)
           FROM json_to_recordset($2::text::json)
                AS t(id integer, title text, status text, notes text, priority integer)"#,
        id,
        start.source.tasks.0.to_string(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

impl Store {
    /// The iteration and state of a checkpoint of `session_id`: the one
    /// with id `id`, or the latest at `iteration`.
    pub async fn checkpoint_for_fork(
        &self,
        session_id: Uuid,
        (iteration, id): (Option<i64>, Option<i64>),
        scope: &TenantScope,
    ) -> Result<Option<(i64, Json<crate::policy::loop_state::LoopState>)>> {
        let row = sqlx::query!(
            r#"SELECT iteration, state AS "state: Json<crate::policy::loop_state::LoopState>"
               FROM checkpoints
               WHERE session_id = $1 AND ($2::bigint IS NULL OR iteration = $2)
                 AND ($3::bigint IS NULL OR id = $3)
                 AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($4::text IS NULL OR s.tenant = $4))
               ORDER BY id DESC LIMIT 1"#,
            session_id,
            iteration,
            id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (r.iteration, r.state)))
    }
}
