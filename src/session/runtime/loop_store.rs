//! The handful of storage operations a session loop performs, as a narrow
//! trait: Postgres in production, an in-memory fake in the loop's unit tests.

use std::future::Future;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::policy::checklist::ChecklistItem;
use crate::policy::delegation::ChildReport;
use crate::policy::snapshot::FileEntry;
use crate::policy::termination::Termination;
use crate::store::{
    ControlFlags, Counters, Lease, NewEvent, NewIteration, NewReflection, Store, StoreError,
};

/// A reflection with what it changed on the session row.
#[derive(Debug, Clone)]
pub struct ReflectionCommit<'a> {
    /// The reflection row.
    pub record: &'a NewReflection,
    /// Counters after it.
    pub counters: Counters,
    /// Progress estimate after it, percent.
    pub percent_complete: Option<f64>,
    /// Estimated seconds to completion.
    pub eta_seconds: Option<f64>,
    /// Success criteria, ticked.
    pub criteria: &'a [ChecklistItem],
    /// Milestones, ticked.
    pub milestones: &'a [ChecklistItem],
}

/// What the loop writes; every write is fenced by the lease.
pub trait LoopStore: Send + Sync + 'static {
    /// Appends events outside an iteration; returns the durable control flags.
    fn append_fenced(
        &self,
        lease: &Lease,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<ControlFlags, StoreError>> + Send;

    /// Commits one iteration with its counters, progress and events; once
    /// `stop` fires while it waits for a group, it commits alone at once.
    fn commit_iteration(
        &self,
        lease: &Lease,
        iteration: NewIteration,
        counters: Counters,
        progress: (Option<f64>, Option<f64>),
        events: Vec<NewEvent>,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<ControlFlags, StoreError>> + Send;

    /// Stores a reflection and its effects on the session.
    fn insert_reflection(
        &self,
        lease: &Lease,
        reflection: ReflectionCommit<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Saves a checkpoint of the loop state.
    fn save_checkpoint(
        &self,
        lease: &Lease,
        iteration: i64,
        reason: &str,
        state: &Value,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Ends the run: final status, counters, a checkpoint and the events.
    fn finish(
        &self,
        lease: &Lease,
        termination: &Termination,
        detail: Option<&str>,
        counters: Counters,
        checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The session's ended children not yet given to a step, for step
    /// `iteration`, and how many of its children are still live.
    fn child_reports(
        &self,
        lease: &Lease,
        iteration: u64,
    ) -> impl Future<Output = Result<(Vec<ChildReport>, u64), StoreError>> + Send;

    /// Reserves the next step's allowance for a session of a tree: what
    /// its own budget has left (`own_allowance`), never more than the tree
    /// has left beside the other steps in flight in it
    /// ([`crate::policy::budget::tree_allowance`]). The tokens granted.
    fn reserve_step(
        &self,
        lease: &Lease,
        own_allowance: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The digests among `digests` the session's tenant holds no blob of
    /// (a store without snapshots holds none).
    fn missing_blobs(
        &self,
        lease: &Lease,
        digests: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>, StoreError>> + Send {
        let _ = lease;
        std::future::ready(Ok(digests))
    }

    /// Stores the workspace snapshot of checkpoint `iteration`: the new
    /// blobs, then the manifest (nothing for a store without snapshots).
    fn put_snapshot(
        &self,
        lease: &Lease,
        iteration: i64,
        manifest: &[FileEntry],
        blobs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (lease, iteration, manifest, blobs);
        std::future::ready(Ok(()))
    }

    /// Checkpoints and gives the lease up at shutdown, logging `events`
    /// (a charge of the step cut short) with the release.
    fn release(
        &self,
        lease: &Lease,
        counters: Counters,
        checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl LoopStore for Store {
    fn reserve_step(
        &self,
        lease: &Lease,
        own_allowance: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        Store::reserve_step(self, *lease, own_allowance)
    }

    fn child_reports(
        &self,
        lease: &Lease,
        iteration: u64,
    ) -> impl Future<Output = Result<(Vec<ChildReport>, u64), StoreError>> + Send {
        Store::child_reports(self, *lease, iteration)
    }

    fn append_fenced(
        &self,
        lease: &Lease,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<ControlFlags, StoreError>> + Send {
        Store::append_fenced(self, lease, events)
    }

    fn commit_iteration(
        &self,
        lease: &Lease,
        iteration: NewIteration,
        counters: Counters,
        progress: (Option<f64>, Option<f64>),
        events: Vec<NewEvent>,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<ControlFlags, StoreError>> + Send {
        Store::commit_iteration(
            self,
            lease,
            iteration,
            counters,
            progress,
            events,
            Some(stop),
        )
    }

    fn insert_reflection(
        &self,
        lease: &Lease,
        r: ReflectionCommit<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Store::insert_reflection(
            self,
            lease,
            r.record,
            r.counters,
            r.percent_complete,
            r.eta_seconds,
            r.criteria,
            r.milestones,
        )
    }

    fn save_checkpoint(
        &self,
        lease: &Lease,
        iteration: i64,
        reason: &str,
        state: &Value,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Store::save_checkpoint(self, lease, iteration, reason, state)
    }

    fn finish(
        &self,
        lease: &Lease,
        termination: &Termination,
        detail: Option<&str>,
        counters: Counters,
        checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Store::finish(
            self,
            lease,
            termination,
            detail,
            counters,
            checkpoint,
            events,
        )
    }

    fn release(
        &self,
        lease: &Lease,
        counters: Counters,
        checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Store::release(self, lease, counters, checkpoint, events)
    }

    fn missing_blobs(
        &self,
        lease: &Lease,
        digests: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>, StoreError>> + Send {
        let session_id = lease.session_id;
        async move { Store::missing_blobs(self, session_id, &digests).await }
    }

    fn put_snapshot(
        &self,
        lease: &Lease,
        iteration: i64,
        manifest: &[FileEntry],
        blobs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Store::put_snapshot(self, lease.session_id, iteration, manifest, blobs)
    }
}
