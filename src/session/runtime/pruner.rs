//! The pruner: every `WARDEN_PRUNE_INTERVAL`, one replica of the fleet (the
//! holder of the `pruner` maintenance lease) archives the ended sessions
//! past their retention and deletes them with their workspaces, then
//! compacts the events of long sessions past the horizon. It works in small
//! batches, each a few short statements, and rests between them as long as
//! the batch took, so the session loops keep most of the database. What to
//! prune and how fast are [`crate::policy::retention`]'s decisions.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::config::RetentionConfig;
use crate::metrics::Metrics;
use crate::policy::retention::{self as rules, FIRST_PACE, Pace};
use crate::session::archive;
use crate::session::error::Result;
use crate::session::retention::remove as remove_workspace;
use crate::store::archive::EndedSession;
use crate::store::{Store, TenantScope};

/// The name of the lease that makes one replica the pruner.
const LEASE: &str = "pruner";
/// Sessions whose events are compacted per pass, the longest first.
const COMPACT_SESSIONS: i64 = 50;
/// Events read per compaction statement.
const COMPACT_PAGE: i64 = 1_000;
/// Unreferenced workspace blobs deleted per statement.
const BLOB_BATCH: i64 = 500;
/// How old an unreferenced blob must be to be deleted, seconds.
const BLOB_MIN_AGE_SECS: i64 = 3_600;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Whether this replica held the lease (another pruned otherwise).
    pub held: bool,
    /// Sessions archived and deleted.
    pub archived: usize,
    /// Sessions whose archive could not be written (kept; tried next pass).
    pub failed: usize,
    /// Archived sessions left in place because they changed meanwhile.
    pub changed: usize,
    /// Events dropped by compaction.
    pub compacted_events: u64,
    /// Workspace blobs no snapshot named any more, deleted.
    pub deleted_blobs: u64,
}

/// The pruner of one replica.
#[derive(Debug, Clone)]
pub struct Pruner {
    store: Store,
    retention: RetentionConfig,
    workspace_root: PathBuf,
    replica: Uuid,
    /// How long the pruner lease lasts: the session leases' TTL, so a
    /// successor takes pruning over after a crash as fast as it takes over
    /// sessions. Renewed before every batch, and a batch is short.
    lease_ttl: Duration,
    metrics: Arc<Metrics>,
}

impl Pruner {
    /// A pruner over `store` acting as `replica`, holding its lease for
    /// `lease_ttl` at a time.
    pub fn new(
        store: Store,
        retention: RetentionConfig,
        workspace_root: PathBuf,
        (replica, lease_ttl): (Uuid, Duration),
        metrics: Arc<Metrics>,
    ) -> Pruner {
        Pruner {
            store,
            retention,
            workspace_root,
            replica,
            lease_ttl,
            metrics,
        }
    }

    /// Runs a pass every `WARDEN_PRUNE_INTERVAL` until the task is dropped.
    pub async fn prune_forever(self) {
        let period = self.retention.prune_interval;
        crate::session::sweep::every(period, || async {
            if let Err(err) = self.pass().await {
                tracing::warn!(error = %err, "retention pass failed; the next one tries again");
            }
        })
        .await
    }

    /// One pass, if this replica takes the lease: archive, then compact.
    pub async fn pass(&self) -> Result<PassReport> {
        let mut report = PassReport::default();
        if !self.renew().await? {
            return Ok(report);
        }
        report.held = true;
        let archived = self.archive_due(&mut report).await;
        let compacted = match archived {
            Ok(()) => self.compact(&mut report).await,
            Err(err) => Err(err),
        };
        let compacted = match compacted {
            Ok(()) => self.sweep_blobs(&mut report).await,
            Err(err) => Err(err),
        };
        if let Err(err) = self
            .store
            .release_maintenance_lease(LEASE, self.replica)
            .await
        {
            tracing::debug!(error = %err, "cannot release the pruner lease; it runs out by itself");
        }
        compacted?;
        if report.archived + report.failed + report.changed > 0 || report.compacted_events > 0 {
            tracing::info!(
                archived = report.archived,
                failed = report.failed,
                changed = report.changed,
                compacted_events = report.compacted_events,
                "retention pass done"
            );
        }
        Ok(report)
    }

    async fn renew(&self) -> Result<bool> {
        Ok(self
            .store
            .take_maintenance_lease(LEASE, self.replica, self.lease_ttl)
            .await?)
    }

    /// Archives and deletes due sessions batch by batch until none is left.
    async fn archive_due(&self, report: &mut PassReport) -> Result<()> {
        let keep = self.retention.keep;
        let mut failed: HashSet<Uuid> = HashSet::new();
        let mut pace = FIRST_PACE;
        loop {
            tokio::time::sleep(pace.pause).await;
            if !self.renew().await? {
                return Ok(());
            }
            let started = Instant::now();
            let limit = (pace.batch + failed.len()) as i64;
            let due: Vec<EndedSession> = self
                .store
                .ended_sessions_due(keep, limit)
                .await?
                .into_iter()
                .filter(|s| !failed.contains(&s.id))
                .filter(|s| {
                    let retention = rules::retention_of(keep, s.tenant_retention);
                    rules::archive_due(s.ended_ago, s.imported_ago, retention)
                })
                .take(pace.batch)
                .collect();
            if due.is_empty() {
                return Ok(());
            }
            let mut written = Vec::with_capacity(due.len());
            let mut files = Vec::with_capacity(due.len());
            for session in due {
                match archive::export(&self.store, &self.retention.archive_dir, &session).await {
                    Ok(path) => {
                        tracing::debug!(session_id = %session.id, path = %path.display(), "session archived");
                        files.push(path);
                        written.push(session);
                    }
                    Err(err) => {
                        tracing::warn!(session_id = %session.id, error = %err, "cannot archive a session; it is kept and tried again next pass");
                        self.metrics.archive_failed();
                        failed.insert(session.id);
                        report.failed += 1;
                    }
                }
            }
            // No session is deleted before its archive's name is on the disk.
            archive::flush_folders(&files).await?;
            let deleted = self.store.delete_archived(&written).await?;
            report.changed += written.len() - deleted.len();
            for id in &deleted {
                if let Err(err) = remove_workspace(&self.workspace_root, *id).await {
                    tracing::warn!(session_id = %id, error = %err, "cannot remove an archived session's workspace; the workspace sweep removes it");
                }
            }
            self.metrics.archived(deleted.len() as u64);
            report.archived += deleted.len();
            if !deleted.is_empty() {
                tracing::info!(
                    sessions = deleted.len(),
                    "archived and deleted ended sessions past their retention"
                );
            }
            pace = rules::next_pace(pace.batch, started.elapsed());
        }
    }

    /// Deletes the workspace blobs no snapshot names any more (their
    /// sessions were deleted or archived), a batch at a time; a blob an
    /// hour old at least, so a snapshot being written keeps its own.
    async fn sweep_blobs(&self, report: &mut PassReport) -> Result<()> {
        loop {
            if !self.renew().await? {
                return Ok(());
            }
            let n = self
                .store
                .delete_unreferenced_blobs(BLOB_MIN_AGE_SECS, BLOB_BATCH)
                .await?;
            report.deleted_blobs += n;
            if n < BLOB_BATCH as u64 {
                return Ok(());
            }
        }
    }

    /// Compacts the events of the sessions furthest past the horizon.
    async fn compact(&self, report: &mut PassReport) -> Result<()> {
        let horizon = self.retention.event_horizon;
        if horizon == 0 {
            return Ok(());
        }
        // Compaction serves every tenant and reads no session's content
        // beyond event kinds, as the workspace sweep does.
        let scope = TenantScope::Global;
        let sessions = self
            .store
            .sessions_to_compact(
                i64::try_from(horizon).unwrap_or(i64::MAX),
                COMPACT_SESSIONS,
                &scope,
            )
            .await?;
        let mut pace = Pace {
            batch: 1,
            pause: Duration::ZERO,
        };
        for (id, last_seq, through) in sessions {
            let Some(cut) = rules::compact_through(last_seq, through, horizon) else {
                continue;
            };
            let mut after = through;
            while after < cut {
                tokio::time::sleep(pace.pause).await;
                if !self.renew().await? {
                    return Ok(());
                }
                let started = Instant::now();
                let candidates = self
                    .store
                    .compaction_candidates(
                        id,
                        after,
                        cut,
                        rules::COMPACTED_KINDS,
                        COMPACT_PAGE,
                        &scope,
                    )
                    .await?;
                let reached = match candidates.last() {
                    Some((seq, _, _)) if candidates.len() as i64 == COMPACT_PAGE => *seq,
                    _ => cut,
                };
                let dropped: Vec<i64> = candidates
                    .iter()
                    .filter(|(seq, kind, continued)| {
                        !rules::keep_event(kind, *continued, *seq, last_seq, horizon)
                    })
                    .map(|(seq, _, _)| *seq)
                    .collect();
                let n = self
                    .store
                    .drop_events(id, &dropped, reached, &scope)
                    .await?;
                self.metrics.compacted(n);
                report.compacted_events += n;
                after = reached;
                pace = rules::next_pace(pace.batch, started.elapsed());
            }
        }
        Ok(())
    }
}
