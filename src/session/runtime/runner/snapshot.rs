//! Workspace snapshot: after a checkpoint is durable, the workspace as it
//! is then (no step runs meanwhile) is walked into a manifest and stored by
//! digest; only the files whose content the tenant's store lacks are read
//! again and sent, so an unchanged file costs nothing. A session whose
//! executor has no workspace still gets a snapshot (an empty manifest):
//! the memory and task queue a fork starts from.
//!
//! A failed snapshot leaves its checkpoint unforkable and the loop going;
//! the API offers a fork only from the checkpoints whose snapshot is stored.

use std::path::PathBuf;

use super::Runner;
use crate::executor::snapshot;
use crate::policy::snapshot::FileEntry;
use crate::session::runtime::loop_store::LoopStore;
use crate::store::Lease;

/// Attempts at storing one snapshot: a blob swept between the check and
/// the write (its last manifest pruned meanwhile) makes the first fail.
const ATTEMPTS: usize = 2;

impl<S: LoopStore> Runner<S> {
    /// Stores the workspace snapshot of the checkpoint at `iteration`.
    pub(super) async fn snapshot_workspace(&mut self, iteration: u64) {
        let root = self.executor.workspace_root().map(PathBuf::from);
        for attempt in 1..=ATTEMPTS {
            match Box::pin(try_snapshot(
                &self.store,
                &self.lease,
                iteration,
                root.clone(),
            ))
            .await
            {
                Ok(()) => return,
                Err(err) if attempt < ATTEMPTS => {
                    tracing::debug!(iteration, error = %err, "workspace snapshot failed; trying again");
                }
                Err(err) => {
                    tracing::warn!(iteration, error = %err, "cannot store the workspace snapshot; this checkpoint cannot be forked from");
                }
            }
        }
    }
}

/// Walks the workspace, sends the blobs the store lacks, then the manifest.
async fn try_snapshot<S: LoopStore>(
    store: &S,
    lease: &Lease,
    iteration: u64,
    root: Option<PathBuf>,
) -> Result<(), String> {
    let manifest = match root.clone() {
        Some(root) => blocking(move || snapshot::walk(&root)).await?,
        None => Vec::new(),
    };
    let digests: Vec<Vec<u8>> = manifest.iter().map(|e| e.digest.to_vec()).collect();
    let missing = store
        .missing_blobs(lease, digests)
        .await
        .map_err(|e| e.to_string())?;
    let blobs = match root {
        Some(root) if !missing.is_empty() => {
            let wanted: Vec<FileEntry> = unique_entries(&manifest, &missing);
            blocking(move || read_blobs(&root, &wanted)).await?
        }
        _ => Vec::new(),
    };
    store
        .put_snapshot(lease, iteration as i64, &manifest, blobs)
        .await
        .map_err(|e| e.to_string())
}

/// One entry per missing digest (two paths may hold the same content).
fn unique_entries(manifest: &[FileEntry], missing: &[Vec<u8>]) -> Vec<FileEntry> {
    let mut seen = std::collections::HashSet::new();
    manifest
        .iter()
        .filter(|e| missing.iter().any(|m| m[..] == e.digest[..]) && seen.insert(e.digest))
        .cloned()
        .collect()
}

fn read_blobs(
    root: &std::path::Path,
    wanted: &[FileEntry],
) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut blobs = Vec::with_capacity(wanted.len());
    for entry in wanted {
        let content = snapshot::read_blob(root, entry)?.ok_or_else(|| {
            std::io::Error::other(format!("{} changed during the snapshot", entry.path))
        })?;
        blobs.push((entry.digest.to_vec(), content));
    }
    Ok(blobs)
}

/// Runs disk work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the workspace: {e}"))
}
