//! Workspaces on the disk: removed with their session, and swept when their
//! session ended longer than `WARDEN_WORKSPACE_RETENTION` ago (or has no
//! row at all). The decision is [`crate::policy::retention`]; this is the I/O.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::executor::workspace;
use crate::policy::retention::{self, Owner};
use crate::store::{Store, TenantScope};

/// How many directories are judged per database read.
const BATCH: usize = 500;

/// Removes the workspace of `session_id` under `root`, if there is one.
pub async fn remove(root: &Path, session_id: Uuid) -> std::io::Result<()> {
    let dir = workspace::dir_of(root, session_id);
    match tokio::fs::remove_dir_all(&dir).await {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// The session directories under `root` with how long each was untouched.
fn session_dirs(root: &Path) -> std::io::Result<Vec<(Uuid, PathBuf, Duration)>> {
    let now = SystemTime::now();
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(root) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| Uuid::try_parse(n).ok())
        else {
            continue;
        };
        let meta = entry.metadata()?;
        if !meta.is_dir() {
            continue;
        }
        let untouched = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        out.push((id, entry.path(), untouched));
    }
    Ok(out)
}

/// One sweep: removes every workspace the retention policy gives up;
/// returns how many were removed.
pub async fn sweep(store: &Store, root: &Path, keep: Duration) -> crate::store::Result<usize> {
    let root = root.to_path_buf();
    let dirs = tokio::task::spawn_blocking(move || session_dirs(&root))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    let dirs = match dirs {
        Ok(dirs) => dirs,
        Err(err) => {
            tracing::warn!(error = %err, "cannot list the workspace root; retention sweep skipped");
            return Ok(0);
        }
    };
    let now = Utc::now();
    let mut removed = 0;
    for batch in dirs.chunks(BATCH) {
        let ids: Vec<Uuid> = batch.iter().map(|(id, _, _)| *id).collect();
        // The sweep serves every tenant: it reads no session's content.
        let ended: HashMap<Uuid, Option<DateTime<Utc>>> = store
            .ended_at_of(&ids, &TenantScope::Global)
            .await?
            .into_iter()
            .collect();
        for (id, dir, untouched) in batch {
            let owner = match ended.get(id) {
                None => Owner::Missing,
                Some(None) => Owner::Live,
                Some(Some(at)) => Owner::EndedAgo((now - *at).to_std().unwrap_or(Duration::ZERO)),
            };
            if !retention::remove_workspace(owner, *untouched, keep) {
                continue;
            }
            match tokio::fs::remove_dir_all(dir).await {
                Ok(()) => {
                    removed += 1;
                    tracing::info!(session_id = %id, ?owner, "workspace removed by retention");
                }
                Err(err) => {
                    tracing::warn!(session_id = %id, error = %err, "cannot remove a workspace; the next sweep tries again");
                }
            }
        }
    }
    Ok(removed)
}

/// Sweeps every `every` until the task is dropped (and purges idempotency
/// keys older than a day).
pub async fn sweep_forever(store: Store, root: PathBuf, keep: Duration, every: Duration) {
    super::sweep::every(every, || async {
        if let Err(err) = sweep(&store, &root, keep).await {
            tracing::warn!(error = %err, "workspace retention sweep failed; it runs again later");
        }
        // Idempotency keys are kept a day, whatever the retention.
        if let Err(err) = store.purge_idempotency_keys().await {
            tracing::warn!(error = %err, "cannot purge old idempotency keys; the next sweep tries again");
        }
    })
    .await
}
