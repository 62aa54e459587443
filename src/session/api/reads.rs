//! The read model: what the HTTP read endpoints and live streams may see of
//! sessions and their history. Events come back typed; a stored event that
//! does not decode is reported as corrupt data, not passed through.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::event::SessionEvent;
use crate::session::error::Result;
use crate::session::event_codec;
use crate::store::{
    AgentTask, ApprovalCursor, ApprovalRow, CheckpointRecord, EventRecord, ForkRow,
    IterationRecord, Outcomes, RefinementRecord, ReflectionRecord, Session, Store, TenantScope,
    TreeRow, WaitingWorkerTask,
};

/// An event of a session's log, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    /// Per-session sequence number, gap-free.
    pub seq: i64,
    /// The event.
    pub event: SessionEvent,
    /// When it was appended.
    pub created_at: DateTime<Utc>,
    /// The public prefix of the key whose request appended it, if any.
    pub actor: Option<String>,
}

/// Read-only access to sessions and their history.
#[derive(Debug, Clone)]
pub struct SessionReads {
    store: Store,
}

impl SessionReads {
    /// Reads over `store`.
    pub fn new(store: Store) -> SessionReads {
        SessionReads { store }
    }

    /// Answers when Postgres answers within `timeout` (readiness probes
    /// must answer quickly, also while the database is down).
    pub async fn ping_within(&self, timeout: std::time::Duration) -> Result<()> {
        Ok(self.store.ping_within(timeout).await?)
    }

    /// Sessions per status, fleet-wide.
    pub async fn sessions_by_status(&self) -> Result<BTreeMap<String, i64>> {
        Ok(self.store.sessions_by_status().await?)
    }

    /// The iterations of a session's workspace snapshots, ascending.
    pub async fn snapshot_iterations(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<i64>> {
        let snapshots = self.store.snapshots(id, scope).await?;
        Ok(snapshots.into_iter().map(|s| s.iteration).collect())
    }

    /// One session, if it exists and `scope` reaches it.
    pub async fn session(&self, id: Uuid, scope: &TenantScope) -> Result<Option<Session>> {
        Ok(self.store.session(id, scope).await?)
    }

    /// Iterations per minute over the last `minutes` minutes.
    pub async fn velocity(
        &self,
        id: Uuid,
        scope: &TenantScope,
        minutes: i32,
    ) -> Result<Vec<(DateTime<Utc>, i64)>> {
        Ok(self.store.velocity(id, minutes, scope).await?)
    }

    /// Iterations numbered after `after`, in order.
    pub async fn iterations(
        &self,
        id: Uuid,
        scope: &TenantScope,
        after: i64,
        limit: i64,
    ) -> Result<Vec<IterationRecord>> {
        Ok(self.store.iterations(id, after, limit, scope).await?)
    }

    /// Checkpoints with ids after `after`, oldest first.
    pub async fn checkpoints(
        &self,
        id: Uuid,
        scope: &TenantScope,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CheckpointRecord>> {
        Ok(self.store.checkpoints(id, after, limit, scope).await?)
    }

    /// Events after `after_seq`, oldest first.
    pub async fn events(
        &self,
        id: Uuid,
        scope: &TenantScope,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<LoggedEvent>> {
        let rows = self.store.events(id, after_seq, limit, None, scope).await?;
        decode_all(id, rows)
    }

    /// Up to which sequence number compaction thinned the session's log,
    /// if it ever did.
    pub async fn compacted_through(&self, id: Uuid, scope: &TenantScope) -> Result<Option<i64>> {
        Ok(self.store.compacted_through(id, scope).await?)
    }

    /// Decision events after `after_seq`; gate evaluations that decided
    /// `continue` only when asked for.
    pub async fn decisions(
        &self,
        id: Uuid,
        scope: &TenantScope,
        after_seq: i64,
        limit: i64,
        include_continue: bool,
    ) -> Result<Vec<LoggedEvent>> {
        let rows = self
            .store
            .decisions(id, after_seq, limit, include_continue, scope)
            .await?;
        decode_all(id, rows)
    }

    /// Reflections numbered after `after`.
    pub async fn reflections(
        &self,
        id: Uuid,
        scope: &TenantScope,
        after: i32,
        limit: i64,
    ) -> Result<Vec<ReflectionRecord>> {
        Ok(self.store.reflections(id, after, limit, scope).await?)
    }

    /// The refinement history of a session's goal.
    pub async fn refinements(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Vec<RefinementRecord>> {
        Ok(self.store.refinements(id, scope).await?)
    }

    /// The agent's task queue.
    pub async fn tasks(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<AgentTask>> {
        Ok(self.store.tasks(id, scope).await?)
    }

    /// Outcome metrics over the sessions `scope` reaches.
    pub async fn outcomes(&self, scope: &TenantScope) -> Result<Outcomes> {
        Ok(self.store.outcomes(scope).await?)
    }

    /// Sessions `scope` reaches changed since `since`, oldest change first.
    pub async fn sessions_changed_since(
        &self,
        since: DateTime<Utc>,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<Session>> {
        Ok(self
            .store
            .sessions_changed_since(since, limit, scope)
            .await?)
    }

    /// A session and every descendant `scope` reaches, the session first.
    pub async fn tree(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<TreeRow>> {
        Ok(self.store.tree(id, scope).await?)
    }

    /// The forks of any of `ids` (the sessions of a tree), oldest first.
    pub async fn forks_of(&self, ids: &[Uuid], scope: &TenantScope) -> Result<Vec<ForkRow>> {
        Ok(self.store.forks_of(ids, scope).await?)
    }

    /// A session's direct children.
    pub async fn children_of(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<TreeRow>> {
        Ok(self.store.children_of(id, scope).await?)
    }

    /// The calls of one session that wait for a person.
    pub async fn waiting_approvals_of(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Vec<ApprovalRow>> {
        Ok(self.store.waiting_approvals_of(id, scope).await?)
    }

    /// Calls waiting for a person across the scope, oldest first, after `after`.
    pub async fn waiting_approvals(
        &self,
        scope: &TenantScope,
        after: Option<&ApprovalCursor>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>> {
        Ok(self.store.waiting_approvals(scope, after, limit).await?)
    }

    /// The queue a worker session's step waits on, and since when, if it waits.
    pub async fn waiting_for_worker(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<WaitingWorkerTask>> {
        Ok(self.store.waiting_for_worker(id, scope).await?)
    }

    /// Wakes on every in-process append to a session's log.
    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.store.subscribe()
    }
}

fn decode_all(id: Uuid, rows: Vec<EventRecord>) -> Result<Vec<LoggedEvent>> {
    rows.into_iter()
        .map(|r| {
            Ok(LoggedEvent {
                event: event_codec::decode(id, &r)?,
                seq: r.seq,
                created_at: r.created_at,
                actor: r.actor,
            })
        })
        .collect()
}
