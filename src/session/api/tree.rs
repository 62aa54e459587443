//! Control that follows a tree of sessions: a stop or pause of a session
//! reaches every live descendant, one level at a time (parents before
//! children, so no parent is woken by a child it is stopping), a resume
//! resumes the descendants a pause stopped, and a delete waits for the
//! whole tree to end. A background sweep puts right what a crash between
//! two levels left: live children of an ended parent are stopped, and a
//! parent waiting for children that were never made goes on.

use crate::session::sweep;
use std::time::Duration;

use futures::future::join_all;
use uuid::Uuid;

use super::SessionService;
use super::control::{ResumeSession, StopAnswer};
use crate::policy::lifecycle::{IllegalTransition, Reason, Status};
use crate::session::ServiceError;
use crate::store::{ChildAttention, LiveNode, Session, TenantScope};

/// Most leftovers the sweep handles per pass; the rest wait for the next.
const PER_SWEEP: i64 = 100;

/// What a cascade does to each live descendant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cascade {
    Stop,
    Pause,
    Resume,
}

impl SessionService {
    /// Stops a session and then every live descendant, a level at a time.
    /// The descendants are stopped even when the session itself had ended
    /// (its children outlived it).
    pub async fn stop_tree(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<StopAnswer, ServiceError> {
        let stopped = self.stop(id, scope).await;
        if matches!(stopped, Err(ServiceError::NotFound(_))) {
            return stopped;
        }
        self.cascade(id, scope, Cascade::Stop).await?;
        stopped
    }

    /// Pauses a session and every live descendant. A session that waits
    /// for its children is paused already: its children are paused.
    pub async fn pause_tree(&self, id: Uuid, scope: &TenantScope) -> Result<Session, ServiceError> {
        let session = self.get(id, scope).await?;
        let paused = if waits_for_children(&session) {
            session
        } else {
            self.pause(id, scope).await?
        };
        self.cascade(id, scope, Cascade::Pause).await?;
        Ok(paused)
    }

    /// Resumes a session and the descendants a pause stopped. A session
    /// that waits for its children stays waiting (it goes on by itself when
    /// they end); only they are resumed. A child that ended cannot run
    /// again: its budget went back to its parent.
    pub async fn resume_tree(
        &self,
        id: Uuid,
        scope: &TenantScope,
        req: ResumeSession,
    ) -> Result<Session, ServiceError> {
        let session = self.get(id, scope).await?;
        if session.parent_id.is_some() && session.status.has_ended() {
            return Err(ServiceError::Conflict(IllegalTransition {
                action: "resume",
                from: session.status,
                hint: "a child that ended gave its unspent budget back to its parent; its parent delegates the task again",
            }));
        }
        let resumed = if waits_for_children(&session) {
            check_resume_while_waiting(&session, &req)?;
            session
        } else {
            self.resume(id, scope, req).await?
        };
        self.cascade(id, scope, Cascade::Resume).await?;
        Ok(resumed)
    }

    /// The descendants of `id` that wait for a person, nearest first (at
    /// most `limit`), if `scope` reaches it.
    pub async fn children_needing_attention(
        &self,
        id: Uuid,
        scope: &TenantScope,
        limit: i64,
    ) -> Result<Vec<ChildAttention>, ServiceError> {
        Ok(self
            .store()
            .children_needing_attention(id, scope, limit)
            .await?)
    }

    /// The children of the caller's tenant that wait for a person, oldest
    /// pause first, after `after` (the previous page's last), at most `limit`.
    pub async fn attention_inbox(
        &self,
        scope: &TenantScope,
        after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<ChildAttention>, ServiceError> {
        Ok(self.store().attention_inbox(scope, after, limit).await?)
    }

    /// Deletes an ended session whose descendants have all ended too (they
    /// are deleted with it).
    pub async fn delete_tree(&self, id: Uuid, scope: &TenantScope) -> Result<(), ServiceError> {
        let live = self.store().live_tree(id, scope).await?;
        if let Some(node) = live.iter().flatten().next() {
            return Err(ServiceError::Conflict(IllegalTransition {
                action: "delete",
                from: node.status,
                hint: "a descendant of it is still live; stop the tree first (POST /api/autonomous/{id}/stop)",
            }));
        }
        self.delete(id, scope).await
    }

    /// Applies `action` to every live descendant of `id`, a level at a
    /// time, the sessions of a level at once. A descendant that changed
    /// meanwhile (ended, or was stopped by someone else) is left as it is.
    async fn cascade(
        &self,
        id: Uuid,
        scope: &TenantScope,
        action: Cascade,
    ) -> Result<(), ServiceError> {
        let levels = self.store().live_tree(id, scope).await?;
        for level in levels {
            let done = join_all(
                level
                    .iter()
                    .map(|node| self.cascade_one(*node, scope, action)),
            )
            .await;
            for (node, result) in level.iter().zip(done) {
                match result {
                    Ok(()) | Err(ServiceError::Conflict(_)) | Err(ServiceError::NotFound(_)) => {}
                    Err(err) => {
                        tracing::warn!(session_id = %node.id, ?action, error = %err, "a descendant did not follow its tree; the tree sweep tries again");
                    }
                }
            }
        }
        Ok(())
    }

    async fn cascade_one(
        &self,
        node: LiveNode,
        scope: &TenantScope,
        action: Cascade,
    ) -> Result<(), ServiceError> {
        match action {
            Cascade::Stop => self.stop(node.id, scope).await.map(|_| ()),
            Cascade::Pause => match node.status {
                Status::Queued => self
                    .store()
                    .pause_queued_child(node.id, scope)
                    .await
                    .map(|_| ())
                    .map_err(ServiceError::from),
                Status::Running => self.pause(node.id, scope).await.map(|_| ()),
                _ => Ok(()),
            },
            Cascade::Resume => {
                if node.status == Status::Paused && node.reason == Some(Reason::UserPause) {
                    self.resume(node.id, scope, ResumeSession::default())
                        .await
                        .map(|_| ())
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// A resume of a session that waits for its children only resumes the
/// children a pause stopped: the parent goes on by itself when they end.
/// So its body is checked as any resume's (bad limits are a 422) and a
/// body that asks for a change is refused rather than dropped.
fn check_resume_while_waiting(session: &Session, req: &ResumeSession) -> Result<(), ServiceError> {
    session.limits.apply(&req.limits)?;
    let guidance = req
        .guidance
        .as_deref()
        .is_some_and(|g| !g.trim().is_empty());
    let asks_for_change =
        guidance || req.goal.is_some() || req.reopen || req.limits != Default::default();
    if asks_for_change {
        return Err(ServiceError::Conflict(IllegalTransition {
            action: "resume with guidance, a goal or limits",
            from: session.status,
            hint: "it waits for its children and goes on by itself when they end; \
                   resume it without a body to resume its paused children, \
                   and change its limits with PATCH",
        }));
    }
    Ok(())
}

fn waits_for_children(session: &Session) -> bool {
    session.status == Status::Paused && session.reason == Some(Reason::WaitingForChildren)
}

/// How often the tree sweep runs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Puts leftovers of interrupted cascades right, forever.
pub async fn sweep_forever(service: SessionService, every: Duration) {
    sweep::every(every, || {
        let service = service.clone();
        async move { sweep(&service).await }
    })
    .await
}

/// One pass: live children of ended parents are stopped (with their own
/// descendants); parents waiting for no live child are queued to go on.
pub async fn sweep(service: &SessionService) {
    let (orphans, stranded) = match service.store().tree_leftovers(PER_SWEEP).await {
        Ok(found) => found,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the trees' leftovers; the next sweep tries again");
            return;
        }
    };
    for id in stranded {
        tracing::info!(session_id = %id, "a session waited for children that are not running; it goes on");
    }
    for (id, tenant) in orphans {
        let scope = TenantScope::tenant_only(&tenant);
        match service.stop_tree(id, &scope).await {
            Ok(_) | Err(ServiceError::Conflict(_)) | Err(ServiceError::NotFound(_)) => {
                tracing::info!(session_id = %id, "a child outlived its parent; it was stopped");
            }
            Err(err) => {
                tracing::warn!(session_id = %id, error = %err, "cannot stop a child whose parent ended; the next sweep tries again");
            }
        }
    }
}
