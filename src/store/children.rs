//! Child sessions: made by a parent's step (fenced by the parent's lease)
//! or by a split at creation, with their budget carved out of the parent's
//! limits under the parent's row lock; read as a tree within a tenant.
//! Giving back what a child did not spend, and waking a parent that waits
//! for its children, happen in Postgres itself when a child's status
//! changes (`migrations/0019_child_sessions.sql`), so every path that ends
//! a session (a loop, a stop, a rescue) does it in the same transaction.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;
use sqlx::types::Json;
use utoipa::ToSchema;
use uuid::Uuid;

use super::event_log;
use super::rows::{Lease, NewEvent};
use super::{Result, Store, StoreError, TenantScope};
use crate::event::SessionEvent;
use crate::policy::checklist::ChecklistItem;
use crate::policy::delegation::{
    self, ChildBudget, ChildPausePolicy, ChildReport, ChildRequest, DELEGATED_DIR,
    DelegationRefused, ParentBudget, Shortfall, TreeLimits,
};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{Reason, Status};

/// Who asks for a child: a running step of the parent (its lease fences the
/// write), or a create that splits its goal (the parent was made in the
/// same transaction).
#[derive(Debug, Clone, Copy)]
pub enum Delegator {
    /// A step of a running parent.
    Step {
        /// The parent's lease.
        lease: Lease,
        /// Tokens the step has spent so far that are not committed yet.
        pending_tokens: u64,
    },
    /// A create that splits its goal into children.
    Split {
        /// The new parent.
        parent: Uuid,
    },
}

impl Delegator {
    fn parent(&self) -> Uuid {
        match self {
            Delegator::Step { lease, .. } => lease.session_id,
            Delegator::Split { parent } => *parent,
        }
    }
}

/// A child made (or found, when the same call made it before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delegated {
    /// The child.
    pub child_id: Uuid,
    /// Tokens it was given.
    pub tokens: u64,
    /// Iterations it was given.
    pub iterations: u64,
    /// The same call had made it already (a step run again).
    pub existed: bool,
}

/// Why a child was not made.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// The rules of the tree or the budget refuse it; the message is for the agent.
    #[error(transparent)]
    Refused(#[from] DelegationRefused),
    /// The store failed (or the parent's lease was lost).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for DelegateError {
    fn from(e: sqlx::Error) -> DelegateError {
        DelegateError::Store(StoreError::from(e))
    }
}

/// A session of a tree, as the tree view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeRow {
    /// The session.
    pub id: Uuid,
    /// Its parent (absent for the tree's top as asked for).
    pub parent_id: Option<Uuid>,
    /// Its depth (root = 0).
    pub depth: i32,
    /// Its goal.
    pub goal: String,
    /// Its status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Its summary.
    pub summary: Option<String>,
    /// Its own tokens.
    pub tokens_used: i64,
    /// Its own iterations.
    pub iterations: i64,
    /// Its limits now.
    pub limits: Json<Limits>,
    /// Tokens carved out of its parent for it.
    pub budget_tokens: Option<i64>,
    /// Progress estimate.
    pub percent_complete: Option<f64>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// What its own steps cost, USD.
    pub cost_usd: Decimal,
    /// Its own steps no price entry priced.
    pub unpriced_steps: i64,
    /// The session it was forked from, when it is a fork.
    pub forked_from_session: Option<Uuid>,
    /// The iteration of the checkpoint it was forked from.
    pub forked_from_iteration: Option<i64>,
}

/// A fork of a session, as the tree view lists it under its origin.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkRow {
    /// The fork.
    pub id: Uuid,
    /// The session it was forked from.
    pub forked_from_session: Uuid,
    /// The iteration of the checkpoint it started from.
    pub forked_from_iteration: i64,
    /// Its goal.
    pub goal: String,
    /// Its status.
    pub status: Status,
    /// Created.
    pub created_at: DateTime<Utc>,
}

/// Makes a child of the delegator's parent for `request`, named `call`
/// under it: the parent's row is locked (and, for a step, fenced by its
/// lease), the tree's limits and the budget are checked, the child's
/// budget is carved out of the parent's limits, and the child is queued
/// with the parent's mode, executor and tenant. A call that made a child
/// before finds it again, so a step run twice makes one child.
pub async fn delegate(
    conn: &mut PgConnection,
    by: Delegator,
    call: &str,
    request: &ChildRequest,
    executor: Option<&serde_json::Value>,
    tree: TreeLimits,
) -> std::result::Result<Delegated, DelegateError> {
    request.validate()?;
    let parent_id = by.parent();
    let (budget, tree, parent_limits) = lock_parent(conn, by, tree).await?;
    if let Some(existing) = sqlx::query!(
        "SELECT id, budget_tokens, budget_iterations FROM sessions WHERE parent_id = $1 AND parent_call = $2",
        parent_id,
        call,
    )
    .fetch_optional(&mut *conn)
    .await?
    {
        return Ok(Delegated {
            child_id: existing.id,
            tokens: u64::try_from(existing.budget_tokens.unwrap_or(0)).unwrap_or(0),
            iterations: u64::try_from(existing.budget_iterations.unwrap_or(0)).unwrap_or(0),
            existed: true,
        });
    }
    let shortfall = match by {
        Delegator::Step { .. } => Shortfall::Refuse,
        Delegator::Split { .. } => Shortfall::TakeWhatIsLeft,
    };
    let carved = delegation::carve(&budget, request.budget_share, tree, shortfall)?;
    let child_limits = delegation::child_limits(&parent_limits, carved);
    let child_id = Uuid::new_v4();
    let criteria =
        crate::policy::checklist::from_texts("success_criteria", &request.success_criteria)
            .map_err(DelegationRefused::Invalid)?;
    sqlx::query!(
        "INSERT INTO sessions (id, goal, mode, status, limits, executor, tenant, queued_at, criteria,
                               parent_id, lineage, parent_call, secrets_from, budget_tokens, budget_iterations,
                               on_child_pause, created_at)
         SELECT $1, $2, p.mode, 'queued', $3, coalesce($9, p.executor), p.tenant, now(), $4,
                p.id, p.lineage || p.id, $5, coalesce(p.secrets_from, p.id), $6, $7, p.on_child_pause,
                -- Children made in one transaction keep the order they were made in.
                clock_timestamp()
         FROM sessions p WHERE p.id = $8",
        child_id,
        crate::policy::text::trim(&request.goal),
        Json(child_limits) as _,
        Json(&criteria) as _,
        call,
        i64::try_from(carved.tokens).unwrap_or(i64::MAX),
        i64::try_from(carved.iterations).unwrap_or(i64::MAX),
        parent_id,
        executor,
    )
    .execute(&mut *conn)
    .await?;
    carve_from_parent(conn, parent_id, carved).await?;
    log_delegation(conn, (parent_id, child_id), call, request, carved).await?;
    Ok(Delegated {
        child_id,
        tokens: carved.tokens,
        iterations: carved.iterations,
        existed: false,
    })
}

/// Locks the delegating parent's row (fenced by the step's lease when a
/// step delegates) and reads what it may give a child: its budget left, the
/// tree's limits (the tenant's own over the server's) and its limits.
async fn lock_parent(
    conn: &mut PgConnection,
    by: Delegator,
    tree: TreeLimits,
) -> std::result::Result<(ParentBudget, TreeLimits, Limits), DelegateError> {
    let parent_id = by.parent();
    let lease_token = match by {
        Delegator::Step { lease, .. } => Some(lease.token),
        Delegator::Split { .. } => None,
    };
    let parent = sqlx::query!(
        r#"SELECT limits AS "limits: Json<Limits>", tokens_used, iterations, elapsed_ms, cost_usd,
                  cardinality(lineage) AS "depth!", tenant,
                  (SELECT count(*) FROM sessions c WHERE c.parent_id = sessions.id) AS "children!",
                  (SELECT t.max_depth FROM tenant_settings t WHERE t.tenant = sessions.tenant) AS max_depth,
                  (SELECT t.max_children FROM tenant_settings t WHERE t.tenant = sessions.tenant) AS max_children
           FROM sessions WHERE id = $1 AND ($2::uuid IS NULL OR lease_token = $2) FOR UPDATE"#,
        parent_id,
        lease_token,
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::LeaseLost(parent_id))?;
    let pending = match by {
        Delegator::Step { pending_tokens, .. } => pending_tokens,
        Delegator::Split { .. } => 0,
    };
    let budget = ParentBudget {
        limits: parent.limits.0,
        tokens_used: count(parent.tokens_used).saturating_add(pending),
        cost_used: parent.cost_usd,
        iterations: count(parent.iterations),
        elapsed_ms: count(parent.elapsed_ms),
        depth: u32::try_from(parent.depth).unwrap_or(u32::MAX),
        children: u32::try_from(parent.children).unwrap_or(u32::MAX),
    };
    // The tenant's own limits, where it has them, over the server's.
    let tree = TreeLimits {
        max_depth: parent
            .max_depth
            .and_then(|d| u32::try_from(d).ok())
            .unwrap_or(tree.max_depth),
        max_children: parent
            .max_children
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(tree.max_children),
    };
    Ok((budget, tree, parent.limits.0))
}

/// The delegation in both logs: the child's (who made it, queued) and the
/// parent's (`child_delegated`).
async fn log_delegation(
    conn: &mut PgConnection,
    (parent_id, child_id): (Uuid, Uuid),
    call: &str,
    request: &ChildRequest,
    carved: ChildBudget,
) -> std::result::Result<(), DelegateError> {
    let child_events = [
        SessionEvent::DelegatedBy {
            parent_id,
            call: call.to_string(),
        },
        SessionEvent::status(None, Status::Queued),
    ]
    .iter()
    .map(NewEvent::from_event)
    .collect::<Result<Vec<_>>>()?;
    event_log::append(conn, child_id, &child_events).await?;
    let delegated = NewEvent::from_event(&SessionEvent::ChildDelegated {
        child_id,
        goal: crate::policy::text::trim(&request.goal).to_string(),
        budget_tokens: carved.tokens,
        budget_iterations: carved.iterations,
        wait: request.wait,
    })?;
    event_log::append(conn, parent_id, std::slice::from_ref(&delegated)).await?;
    Ok(())
}

/// Shrinks the parent's limits by a child's budget.
async fn carve_from_parent(
    conn: &mut PgConnection,
    parent: Uuid,
    carved: ChildBudget,
) -> Result<()> {
    // A money budget is a decimal string in the limits, as serde writes it.
    sqlx::query!(
        r#"UPDATE sessions SET limits = CASE WHEN $4::numeric IS NULL THEN l.carved
                  ELSE jsonb_set(l.carved, '{max_cost_usd}',
                      to_jsonb(greatest((limits ->> 'max_cost_usd')::numeric - $4, 0)::text)) END,
                  updated_at = now()
           FROM (SELECT jsonb_set(jsonb_set(s.limits,
                  '{max_tokens}', to_jsonb((s.limits ->> 'max_tokens')::bigint - $2)),
                  '{max_iterations}', to_jsonb((s.limits ->> 'max_iterations')::bigint - $3)) AS carved
                 FROM sessions s WHERE s.id = $1) l
           WHERE id = $1"#,
        parent,
        i64::try_from(carved.tokens).unwrap_or(i64::MAX),
        i64::try_from(carved.iterations).unwrap_or(i64::MAX),
        carved.cost_usd,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Most files of one child named in its report.
const MAX_REPORTED_FILES: usize = 50;

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The ended children of a parent not yet given to one of its steps, and
/// those given to step `iteration` or later (a step run again gets them
/// again), marked as given to `iteration`; with how many children are
/// still live. Fenced by the parent's lease.
pub async fn take_reports(
    conn: &mut PgConnection,
    lease: Lease,
    iteration: u64,
) -> Result<(Vec<ChildReport>, u64)> {
    let iteration = i64::try_from(iteration).unwrap_or(i64::MAX);
    holds_lease(conn, lease).await?;
    sqlx::query!(
        "UPDATE sessions SET reported_iteration = $2
         WHERE parent_id = $1 AND warden_session_ended(status) AND reported_iteration IS NULL",
        lease.session_id,
        iteration,
    )
    .execute(&mut *conn)
    .await?;
    let rows = sqlx::query!(
        r#"SELECT id, goal, status AS "status: Status", reason AS "reason: Reason", summary,
                  criteria AS "criteria: Json<Vec<ChecklistItem>>", warden_saturating(tokens_used::numeric + children_tokens) AS "spent!"
           FROM sessions WHERE parent_id = $1 AND reported_iteration >= $2
           ORDER BY created_at, id"#,
        lease.session_id,
        iteration,
    )
    .fetch_all(&mut *conn)
    .await?;
    let live = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM sessions WHERE parent_id = $1 AND NOT warden_session_ended(status)"#,
        lease.session_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    // What each wrote, as the parent sees it: inside its own workspace.
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let written = files_written(conn, &ids).await?;
    let files_of = |child: Uuid| -> Vec<String> {
        written
            .iter()
            .filter(|(session_id, _)| *session_id == child)
            .take(MAX_REPORTED_FILES)
            .map(|(_, path)| format!("{DELEGATED_DIR}/{child}/{path}"))
            .collect()
    };
    let reports = rows
        .into_iter()
        .map(|r| ChildReport {
            child_id: r.id,
            goal: r.goal,
            status: r.status,
            reason: r.reason,
            summary: r.summary,
            criteria_met: r
                .criteria
                .0
                .into_iter()
                .filter(|c| c.done)
                .map(|c| c.text)
                .collect(),
            files: files_of(r.id),
            tokens_used: count(r.spent),
        })
        .collect();
    Ok((reports, count(live)))
}

/// Refuses unless `lease` still holds its session.
async fn holds_lease(conn: &mut PgConnection, lease: Lease) -> Result<()> {
    let owned = sqlx::query_scalar!(
        "SELECT id FROM sessions WHERE id = $1 AND lease_token = $2",
        lease.session_id,
        lease.token,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if owned.is_none() {
        return Err(StoreError::LeaseLost(lease.session_id));
    }
    Ok(())
}

/// The paths each of `ids` wrote, by session and path, in that order.
async fn files_written(conn: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<(Uuid, String)>> {
    let written = sqlx::query!(
        r#"SELECT DISTINCT i.session_id, f ->> 'path' AS "path!"
           FROM iterations i
           CROSS JOIN LATERAL json_array_elements(
               CASE WHEN json_typeof(i.record -> 'files_written') = 'array'
                    THEN i.record -> 'files_written' ELSE '[]'::json END) f
           WHERE i.session_id = ANY($1) AND f ->> 'path' IS NOT NULL
           ORDER BY 1, 2"#,
        ids,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(written
        .into_iter()
        .map(|w| (w.session_id, w.path))
        .collect())
}

/// Marks a session made with a split goal as waiting for its children
/// (made next, in the same transaction).
pub async fn wait_for_children(conn: &mut PgConnection, id: Uuid) -> Result<()> {
    sqlx::query!(
        "UPDATE sessions SET reason = 'waiting_for_children' WHERE id = $1 AND status = 'paused'",
        id
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A live descendant as a cascade sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveNode {
    /// The session.
    pub id: Uuid,
    /// Its status.
    pub status: Status,
    /// Why it waits, if it does.
    pub reason: Option<Reason>,
}

/// Live descendants of `id` that `scope` reaches, by depth below it
/// (children first), each level in id order.
pub async fn live_descendants(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
) -> Result<Vec<Vec<LiveNode>>> {
    // `lineage @> ARRAY[id]`, not `id = ANY(lineage)`: only the first is
    // served by the GIN index on children's lineages. The tenant compares
    // with IS NOT DISTINCT FROM so no tenant index competes: on stale
    // statistics the planner read every session of the tenant through it,
    // for each stop, under load (a cross-replica stop went from 0.13 s to 1 s).
    let rows = sqlx::query!(
        r#"SELECT d.id, cardinality(d.lineage) - cardinality(s.lineage) AS "below!",
                  d.status AS "status: Status", d.reason AS "reason: Reason"
           FROM sessions s JOIN sessions d ON d.lineage @> ARRAY[s.id]
           WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)
             AND d.tenant IS NOT DISTINCT FROM s.tenant
             AND d.parent_id IS NOT NULL AND NOT warden_session_ended(d.status)
           ORDER BY 2, d.id"#,
        id,
        scope.tenant(),
    )
    .fetch_all(conn)
    .await?;
    let mut levels: Vec<Vec<LiveNode>> = Vec::new();
    for r in rows {
        let level = usize::try_from(r.below.max(1) - 1).unwrap_or(0);
        while levels.len() <= level {
            levels.push(Vec::new());
        }
        levels[level].push(LiveNode {
            id: r.id,
            status: r.status,
            reason: r.reason,
        });
    }
    Ok(levels)
}

/// Pauses a child that waits in the queue (it has not run, so no loop
/// is told): it pauses `user_pause` like its tree. False when it was no
/// longer queued.
pub async fn pause_queued(conn: &mut PgConnection, id: Uuid, scope: &TenantScope) -> Result<bool> {
    let done = sqlx::query!(
        "UPDATE sessions SET status = 'paused', reason = 'user_pause', queued_at = NULL, updated_at = now()
         WHERE id = $1 AND status = 'queued' AND ($2::text IS NULL OR tenant = $2)",
        id,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    let paused = SessionEvent::status(Some(Status::Queued), Status::Paused);
    event_log::append(conn, id, &[NewEvent::from_event(&paused)?]).await?;
    Ok(true)
}

/// Sets what the children of a new session's tree do when they would
/// pause for a person (the create's `on_child_pause`; children copy it).
pub async fn set_child_pause_policy(
    conn: &mut PgConnection,
    id: Uuid,
    policy: ChildPausePolicy,
) -> Result<()> {
    sqlx::query!(
        "UPDATE sessions SET on_child_pause = $2 WHERE id = $1",
        id,
        policy as ChildPausePolicy,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A descendant that waits for a person, as its ancestors and the inbox
/// name it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChildAttention {
    /// The child that waits.
    pub child_id: Uuid,
    /// The top of its tree.
    pub root_id: Uuid,
    /// Its parent.
    pub parent_id: Uuid,
    /// How deep it is (its root is at 0).
    pub depth: i32,
    /// Its goal.
    pub goal: String,
    /// Why it waits.
    pub reason: Reason,
    /// What it says about it.
    pub summary: Option<String>,
    /// Since when it waits.
    pub paused_at: DateTime<Utc>,
}

impl Store {
    /// Reserves a step's allowance from its tree's budget (see
    /// [`crate::policy::budget::tree_allowance`]): reservations of one
    /// tree take turns on a lock of the tree (not a row: no row lock is
    /// held while another is waited for), taken by a statement of its own
    /// so the read after it sees every reservation made before; that read
    /// is one statement, one snapshot of the tree. Fenced by the session's lease.
    pub async fn reserve_step(&self, lease: Lease, own_allowance: u64) -> Result<u64> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let root = sqlx::query_scalar!(
            r#"SELECT root AS "root!" FROM (
                   SELECT CASE WHEN parent_id IS NULL THEN id ELSE lineage[1] END AS root
                   FROM sessions WHERE id = $1 AND lease_token = $2) me,
               LATERAL (SELECT pg_advisory_xact_lock(hashtext('warden.tree'), hashtext(me.root::text))) l"#,
            lease.session_id,
            lease.token,
        )
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::LeaseLost(lease.session_id))?;
        let tree = sqlx::query!(
            r#"SELECT coalesce(sum((d.limits ->> 'max_tokens')::bigint - d.tokens_used)
                               FILTER (WHERE NOT warden_session_ended(d.status)), 0)::bigint
                        - coalesce(sum(d.forgiven_tokens), 0)::bigint AS "tree_left!",
                      coalesce(sum(greatest(least(d.reserved_through, (d.limits ->> 'max_tokens')::bigint)
                                            - d.tokens_used, 0))
                               FILTER (WHERE d.status = 'running' AND d.id <> $2), 0)::bigint AS "reserved!"
               FROM sessions d
               WHERE d.id = $1 OR (d.parent_id IS NOT NULL AND d.lineage @> ARRAY[$1::uuid])"#,
            root,
            lease.session_id,
        )
        .fetch_one(&mut *tx)
        .await?;
        let granted = crate::policy::budget::tree_allowance(
            own_allowance,
            tree.tree_left,
            count(tree.reserved),
        );
        let done = sqlx::query!(
            "UPDATE sessions SET reserved_through = tokens_used + $3 WHERE id = $1 AND lease_token = $2",
            lease.session_id,
            lease.token,
            i64::try_from(granted).unwrap_or(i64::MAX),
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(lease.session_id));
        }
        tx.commit().await?;
        Ok(granted)
    }

    /// The descendants of `id` that wait for a person, if `scope` reaches
    /// it: nearest first, then oldest pause first. At most `limit`.
    pub async fn children_needing_attention(
        &self,
        id: Uuid,
        scope: &TenantScope,
        limit: i64,
    ) -> Result<Vec<ChildAttention>> {
        let rows = sqlx::query_as!(
            ChildAttention,
            r#"SELECT d.id AS "child_id!", d.lineage[1] AS "root_id!", d.parent_id AS "parent_id!",
                      cardinality(d.lineage) AS "depth!", d.goal AS "goal!",
                      d.reason AS "reason!: Reason", d.summary, d.updated_at AS "paused_at!"
               FROM sessions s JOIN sessions d ON d.parent_id IS NOT NULL AND d.lineage @> ARRAY[s.id]
               WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)
                 AND d.tenant IS NOT DISTINCT FROM s.tenant
                 AND d.status = 'paused' AND d.reason NOT IN ('user_pause', 'waiting_for_children')
               ORDER BY cardinality(d.lineage), d.updated_at, d.id
               LIMIT $3"#,
            id,
            scope.tenant(),
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The children of the tenant (every tenant for an unscoped caller)
    /// that wait for a person, oldest pause first, after `after` (the
    /// pause time and id of the last one of the previous page). At most `limit`.
    pub async fn attention_inbox(
        &self,
        scope: &TenantScope,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<ChildAttention>> {
        let (after_at, after_id) = after.unzip();
        let rows = sqlx::query_as!(
            ChildAttention,
            r#"SELECT d.id AS "child_id!", d.lineage[1] AS "root_id!", d.parent_id AS "parent_id!",
                      cardinality(d.lineage) AS "depth!", d.goal AS "goal!",
                      d.reason AS "reason!: Reason", d.summary, d.updated_at AS "paused_at!"
               FROM sessions d
               WHERE d.parent_id IS NOT NULL AND ($1::text IS NULL OR d.tenant = $1)
                 AND d.status = 'paused' AND d.reason NOT IN ('user_pause', 'waiting_for_children')
                 AND ($2::timestamptz IS NULL OR (d.updated_at, d.id) > ($2, $3::uuid))
               ORDER BY d.updated_at, d.id
               LIMIT $4"#,
            scope.tenant(),
            after_at,
            after_id,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Makes a child for a running parent's step (see [`delegate`]), in a
    /// transaction of its own; the child waits in the queue to be claimed.
    pub async fn delegate_child(
        &self,
        lease: Lease,
        pending_tokens: u64,
        call: &str,
        request: &ChildRequest,
        executor: Option<&serde_json::Value>,
        tree: TreeLimits,
    ) -> std::result::Result<Delegated, DelegateError> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let made = delegate(
            &mut tx,
            Delegator::Step {
                lease,
                pending_tokens,
            },
            call,
            request,
            executor,
            tree,
        )
        .await?;
        tx.commit().await?;
        self.announce(lease.session_id);
        self.announce(made.child_id);
        Ok(made)
    }

    /// The direct children of `id`, oldest first, if `scope` reaches it.
    pub async fn children_of(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<TreeRow>> {
        let rows = sqlx::query_as!(
            TreeRow,
            r#"SELECT c.id, c.parent_id, cardinality(c.lineage) AS "depth!", c.goal,
                      c.status AS "status: Status", c.reason AS "reason: Reason", c.summary,
                      c.tokens_used, c.iterations, c.limits AS "limits: Json<Limits>",
                      c.budget_tokens, c.percent_complete, c.created_at, c.ended_at,
                      c.cost_usd, c.unpriced_steps, c.forked_from_session, c.forked_from_iteration
               FROM sessions c
               WHERE c.parent_id = $1 AND ($2::text IS NULL OR c.tenant = $2)
               ORDER BY c.created_at, c.id"#,
            id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Live descendants of `id` by level (see [`live_descendants`]).
    pub async fn live_tree(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<Vec<LiveNode>>> {
        let mut conn = self.pool.acquire().await?;
        live_descendants(&mut conn, id, scope).await
    }

    /// Pauses a queued child (see [`pause_queued`]).
    pub async fn pause_queued_child(&self, id: Uuid, scope: &TenantScope) -> Result<bool> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let paused = pause_queued(&mut tx, id, scope).await?;
        tx.commit().await?;
        if paused {
            self.announce(id);
        }
        Ok(paused)
    }

    /// The ended children of a parent for its step `iteration` (see [`take_reports`]).
    pub async fn child_reports(
        &self,
        lease: Lease,
        iteration: u64,
    ) -> Result<(Vec<ChildReport>, u64)> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let taken = take_reports(&mut tx, lease, iteration).await?;
        tx.commit().await?;
        Ok(taken)
    }

    /// The session `id` and every descendant of it, if `scope` reaches it:
    /// the session first, then by depth and creation.
    pub async fn tree(&self, id: Uuid, scope: &TenantScope) -> Result<Vec<TreeRow>> {
        // Reached through the key and the lineage index, as in `live_descendants`.
        let rows = sqlx::query_as!(
            TreeRow,
            r#"SELECT d.id AS "id!", d.parent_id, cardinality(d.lineage) AS "depth!", d.goal AS "goal!",
                      d.status AS "status!: Status", d.reason AS "reason: Reason", d.summary,
                      d.tokens_used AS "tokens_used!", d.iterations AS "iterations!",
                      d.limits AS "limits!: Json<Limits>", d.budget_tokens, d.percent_complete,
                      d.created_at AS "created_at!", d.ended_at,
                      d.cost_usd AS "cost_usd!", d.unpriced_steps AS "unpriced_steps!",
                      d.forked_from_session, d.forked_from_iteration
               FROM sessions s JOIN sessions d
                    ON d.id = s.id OR (d.parent_id IS NOT NULL AND d.lineage @> ARRAY[s.id])
               WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)
                 AND d.tenant IS NOT DISTINCT FROM s.tenant
               ORDER BY d.id <> s.id, cardinality(d.lineage), d.created_at, d.id"#,
            id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The forks of any of `ids` within the caller's tenant, oldest first
    /// (index `sessions_forks`, migrations/0037).
    pub async fn forks_of(&self, ids: &[Uuid], scope: &TenantScope) -> Result<Vec<ForkRow>> {
        let rows = sqlx::query_as!(
            ForkRow,
            r#"SELECT f.id, f.forked_from_session AS "forked_from_session!",
                      f.forked_from_iteration AS "forked_from_iteration!", f.goal,
                      f.status AS "status: Status", f.created_at
               FROM sessions f
               WHERE f.forked_from_session = ANY($1) AND f.forked_from_iteration IS NOT NULL
                 AND ($2::text IS NULL OR f.tenant = $2)
               ORDER BY f.created_at, f.id
               LIMIT 1000"#,
            ids,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Live children whose parent has ended (a stop that did not reach
    /// them, or a parent that finished without waiting), and parents that
    /// wait for children of which none is live (a split whose children
    /// were never made): what the tree sweep puts right. At most `limit` of each.
    pub async fn tree_leftovers(&self, limit: i64) -> Result<(Vec<(Uuid, String)>, Vec<Uuid>)> {
        let orphans = sqlx::query!(
            "SELECT c.id, c.tenant FROM sessions c JOIN sessions p ON p.id = c.parent_id
             WHERE c.parent_id IS NOT NULL AND NOT warden_session_ended(c.status)
               AND warden_session_ended(p.status)
             ORDER BY c.id LIMIT $1",
            limit,
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|r| (r.id, r.tenant))
        .collect();
        let stranded = sqlx::query_scalar!(
            "UPDATE sessions p SET status = 'queued', reason = NULL, summary = NULL, reason_detail = NULL,
                    run = p.run + 1, queued_at = now(), updated_at = now()
             WHERE p.id IN (SELECT w.id FROM sessions w
                            WHERE w.status = 'paused' AND w.reason = 'waiting_for_children'
                              AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_id = w.id
                                              AND NOT warden_session_ended(c.status))
                            ORDER BY w.id LIMIT $1 FOR UPDATE SKIP LOCKED)
             RETURNING p.id",
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok((orphans, stranded))
    }
}
