//! What a fork starts from beside its create request: the limits in force,
//! the checklists as ticked at the checkpoint, the workspace files of the
//! checkpoint's snapshot, and its origin, memory and task queue (written
//! with the session by the create's transaction).

use std::path::Path;

use uuid::Uuid;

use crate::policy::checklist::ChecklistItem;
use crate::policy::guardrails::Limits;
use crate::session::error::{Result, ServiceError};
use crate::store::snapshots::ForkStart;

/// A fork's seed.
pub(super) struct ForkSeed {
    /// Origin, memory, cycle, guidance and task queue.
    pub(super) start: ForkStart,
    /// The limits the fork runs under.
    pub(super) limits: Limits,
    /// Success criteria, ticked as at the checkpoint.
    pub(super) criteria: Vec<ChecklistItem>,
    /// Milestones, ticked as at the checkpoint.
    pub(super) milestones: Vec<ChecklistItem>,
    /// The workspace as at the checkpoint: path, mode, content.
    pub(super) files: Vec<(String, u32, Vec<u8>)>,
}

impl ForkSeed {
    /// Writes the files into the new session `id`'s (empty) workspace.
    pub(super) async fn restore(&self, root: &Path, id: Uuid) -> Result<()> {
        let dir = crate::executor::workspace::dir_of(root, id);
        let files = self.files.clone();
        tokio::task::spawn_blocking(move || crate::executor::snapshot::restore(&dir, &files))
            .await
            .map_err(|e| ServiceError::Unavailable(format!("cannot restore the workspace: {e}")))?
            .map_err(|e| {
                ServiceError::Unavailable(format!(
                    "cannot restore the workspace (WARDEN_WORKSPACE_ROOT): {e}; nothing was created"
                ))
            })
    }
}
