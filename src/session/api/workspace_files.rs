//! The workspace, visible: the files of a session's workspace snapshots
//! (the latest, or a checkpoint's), one file's content, a tar of a
//! snapshot, and the difference between two. Read from Postgres, never a
//! replica's disk, within the caller's tenant like every read.

use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::SessionService;
use crate::policy::snapshot::{self as rules, ChangeKind};
use crate::session::error::{Result, ServiceError};
use crate::store::TenantScope;
use crate::store::snapshots::StoredFile;

/// Largest workspace served as one tar, bytes of content.
pub const MAX_TAR_BYTES: i64 = 512 * 1024 * 1024;

/// A file of a workspace snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkspaceFile {
    /// Path relative to the workspace, `/`-separated.
    pub path: String,
    /// Bytes.
    pub size: i64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    /// Unix permission bits.
    pub mode: i32,
    /// The iteration (of the session's snapshots) since which the file has
    /// had this content.
    pub modified_iteration: i64,
}

impl From<&StoredFile> for WorkspaceFile {
    fn from(f: &StoredFile) -> Self {
        WorkspaceFile {
            path: f.path.clone(),
            size: f.size,
            sha256: rules::hex(&f.digest),
            mode: f.mode,
            modified_iteration: f.modified_iteration,
        }
    }
}

/// The files of a workspace snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileList {
    /// The checkpoint's iteration the snapshot was taken at; `null` when
    /// the session has no snapshot yet.
    pub checkpoint: Option<i64>,
    /// The files, by path.
    pub files: Vec<WorkspaceFile>,
    /// Their bytes.
    pub total_bytes: i64,
    /// The iterations of every snapshot of the session, oldest first (the
    /// checkpoints one can read, diff and fork from).
    pub snapshots: Vec<i64>,
}

/// One file's content.
#[derive(Debug, Clone)]
pub struct FileContent {
    /// The bytes.
    pub content: Vec<u8>,
    /// Its guessed content type.
    pub content_type: &'static str,
    /// SHA-256, hex (an ETag).
    pub sha256: String,
    /// The snapshot's iteration.
    pub checkpoint: i64,
}

/// A path that differs between two snapshots.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileChange {
    /// The path.
    pub path: String,
    /// `added`, `removed` or `changed`.
    pub change: ChangeKind,
    /// SHA-256 before, unless added.
    pub from_sha256: Option<String>,
    /// SHA-256 after, unless removed.
    pub to_sha256: Option<String>,
    /// Bytes before.
    pub from_size: Option<i64>,
    /// Bytes after.
    pub to_size: Option<i64>,
    /// A unified diff, for text files of at most 256 KiB (the first 50 such
    /// changes); `null` otherwise.
    pub diff: Option<String>,
}

/// The difference between two snapshots.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkspaceDiff {
    /// The earlier checkpoint's iteration (0 with no files: no snapshot before `to`).
    pub from: i64,
    /// The later one's.
    pub to: i64,
    /// The paths that differ, by path.
    pub changes: Vec<FileChange>,
}

impl SessionService {
    /// The files of `id`'s snapshot at `checkpoint` (the latest if `None`).
    pub async fn workspace_files(
        &self,
        id: Uuid,
        checkpoint: Option<i64>,
        scope: &TenantScope,
    ) -> Result<FileList> {
        self.get(id, scope).await?;
        let snapshots = self.store().snapshots(id, scope).await?;
        let manifest = self.store().manifest(id, checkpoint, scope).await?;
        let (at, files) = match (manifest, checkpoint) {
            (Some((at, files)), _) => (Some(at), files),
            (None, None) => (None, Vec::new()),
            (None, Some(n)) => return Err(no_snapshot(n)),
        };
        Ok(FileList {
            checkpoint: at,
            total_bytes: files.iter().map(|f| f.size).sum(),
            files: files.iter().map(WorkspaceFile::from).collect(),
            snapshots: snapshots.iter().map(|s| s.iteration).collect(),
        })
    }

    /// The content of `path` in `id`'s snapshot at `checkpoint` (the latest
    /// if `None`); the path is checked first, so nothing outside the
    /// workspace is ever named.
    pub async fn workspace_file(
        &self,
        id: Uuid,
        path: &str,
        checkpoint: Option<i64>,
        scope: &TenantScope,
    ) -> Result<FileContent> {
        let path =
            rules::check_path(path).map_err(|e| ServiceError::BadPath(format!("{path:?}: {e}")))?;
        let (at, files) = self.snapshot_of(id, checkpoint, scope).await?;
        let file = files.iter().find(|f| f.path == path).ok_or_else(|| {
            ServiceError::Missing(format!(
                "no file {path:?} in the workspace as of checkpoint {at}"
            ))
        })?;
        let content = self.blob_of(id, file, scope).await?;
        Ok(FileContent {
            content_type: rules::content_type(&path, &content[..content.len().min(512)]),
            content,
            sha256: rules::hex(&file.digest),
            checkpoint: at,
        })
    }

    /// A tar of `id`'s snapshot at `checkpoint` (the latest if `None`),
    /// with its iteration.
    pub async fn workspace_tar(
        &self,
        id: Uuid,
        checkpoint: Option<i64>,
        scope: &TenantScope,
    ) -> Result<(i64, Vec<u8>)> {
        let (at, files) = self.snapshot_of(id, checkpoint, scope).await?;
        let total: i64 = files.iter().map(|f| f.size).sum();
        if total > MAX_TAR_BYTES {
            return Err(ServiceError::Invalid(format!(
                "the workspace holds {total} bytes, over the {MAX_TAR_BYTES} a tar is served with; read its files one by one"
            )));
        }
        let mut entries = Vec::with_capacity(files.len());
        for file in &files {
            entries.push((
                file.path.clone(),
                file.mode,
                self.blob_of(id, file, scope).await?,
            ));
        }
        let tar = tokio::task::spawn_blocking(move || tar_of(&entries))
            .await
            .map_err(|e| ServiceError::Unavailable(format!("cannot build the tar: {e}")))?
            .map_err(|e| ServiceError::Unavailable(format!("cannot build the tar: {e}")))?;
        Ok((at, tar))
    }

    /// What changed from `id`'s snapshot at `from` to the one at `to`
    /// (`to` by default the latest; `from` the snapshot before it, or an
    /// empty workspace when there is none).
    pub async fn workspace_diff(
        &self,
        id: Uuid,
        (from, to): (Option<i64>, Option<i64>),
        scope: &TenantScope,
    ) -> Result<WorkspaceDiff> {
        let (to, after) = self.snapshot_of(id, to, scope).await?;
        let from = match from {
            Some(n) => Some(n),
            None => self
                .store()
                .snapshots(id, scope)
                .await?
                .iter()
                .map(|s| s.iteration)
                .filter(|n| *n < to)
                .max(),
        };
        let (from, before) = match from {
            Some(n) => self.snapshot_of(id, Some(n), scope).await?,
            None => (0, Vec::new()),
        };
        let before: Vec<_> = before.iter().map(StoredFile::entry).collect();
        let after: Vec<_> = after.iter().map(StoredFile::entry).collect();
        let mut changes = Vec::new();
        let mut diffed = 0usize;
        for change in rules::diff(&before, &after) {
            let mut diff = None;
            if diffed < rules::MAX_DIFFED_FILES && rules::diffable(&change) {
                diffed += 1;
                let old = self.content_of(id, change.from, scope).await?;
                let new = self.content_of(id, change.to, scope).await?;
                diff = rules::unified_diff(change.path, old.as_deref(), new.as_deref());
            }
            changes.push(FileChange {
                path: change.path.to_string(),
                change: change.kind,
                from_sha256: change.from.map(|e| rules::hex(&e.digest)),
                to_sha256: change.to.map(|e| rules::hex(&e.digest)),
                from_size: change.from.map(|e| e.size as i64),
                to_size: change.to.map(|e| e.size as i64),
                diff,
            });
        }
        Ok(WorkspaceDiff { from, to, changes })
    }

    /// The manifest of a snapshot that must exist (404 otherwise, the
    /// session's own 404 first).
    pub(super) async fn snapshot_of(
        &self,
        id: Uuid,
        checkpoint: Option<i64>,
        scope: &TenantScope,
    ) -> Result<(i64, Vec<StoredFile>)> {
        self.get(id, scope).await?;
        match self.store().manifest(id, checkpoint, scope).await? {
            Some(found) => Ok(found),
            None => Err(match checkpoint {
                Some(n) => no_snapshot(n),
                None => {
                    ServiceError::Missing(format!("session {id} has no workspace snapshot yet"))
                }
            }),
        }
    }

    /// The content of a manifest's file.
    pub(super) async fn blob_of(
        &self,
        id: Uuid,
        file: &StoredFile,
        scope: &TenantScope,
    ) -> Result<Vec<u8>> {
        self.store()
            .blob(id, &file.digest, scope)
            .await?
            .ok_or_else(|| {
                crate::store::StoreError::Corrupt {
                    id,
                    detail: format!("workspace blob of {:?} missing", file.path),
                }
                .into()
            })
    }

    async fn content_of(
        &self,
        id: Uuid,
        entry: Option<&rules::FileEntry>,
        scope: &TenantScope,
    ) -> Result<Option<Vec<u8>>> {
        match entry {
            None => Ok(None),
            Some(e) => Ok(self.store().blob(id, &e.digest, scope).await?),
        }
    }
}

fn no_snapshot(iteration: i64) -> ServiceError {
    ServiceError::Missing(format!(
        "no workspace snapshot at checkpoint {iteration}; GET /files lists the snapshots there are"
    ))
}

/// A ustar archive of `files` (path, mode, content), in order.
fn tar_of(files: &[(String, i32, Vec<u8>)]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, mode, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode((*mode as u32) & 0o7777);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, content.as_slice())?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tar_holds_every_file_with_its_mode() {
        let files = vec![
            ("a.txt".to_string(), 0o644, b"a".to_vec()),
            ("d/b.sh".to_string(), 0o755, b"#!/bin/sh\n".to_vec()),
        ];
        let tar = tar_of(&files).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().to_string();
            let mode = entry.header().mode().unwrap();
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
            seen.push((path, mode as i32, content));
        }
        assert_eq!(seen, files);
    }
}
