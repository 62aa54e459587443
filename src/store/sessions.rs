//! The sessions table: creation, reads, listing and the guarded updates that
//! API actions make. Status changes made by the loop live in `iterations.rs`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::checkpoints::insert_checkpoint;
use super::event_log;
use super::rows::{
    Lease, NewEvent, NewSession, RefinementRecord, ReflectionSummary, Session, SessionCursor,
    SessionFilter, SessionOrder, SessionSettings, SessionSortKey, contains_pattern,
};
use super::{Result, Store, StoreError, TenantScope};
use crate::event::{RefinementProposal, SessionEvent};
use crate::policy::checklist::ChecklistItem;
use crate::policy::confirm::Confirmation;
use crate::policy::delegation::ChildPausePolicy;
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::soft_budget::SentWarning;
use crate::policy::termination::Termination;
use crate::spec::{ExecutorBrief, StoredExecutor};

/// `query_as!` over every column of `sessions`, typed as `Session`,
/// followed by the `$tail` pieces (the query text must be literals for the
/// macro).
macro_rules! select_session {
    ($($tail:literal)+ $(, $arg:expr)* $(,)?) => {
        select_session_with!(
            r#"executor AS "executor?: Json<StoredExecutor>""#,
            r#"CASE WHEN status = 'queued' THEN
                   (SELECT count(*) FROM sessions q WHERE q.status = 'queued'
                       AND q.tenant = sessions.tenant
                       AND (q.queued_at, q.id) <= (sessions.queued_at, sessions.id))
               END AS queue_position,
               CASE WHEN status = 'queued' THEN (SELECT warden_queue_tenants()) END AS queue_tenants"#,
            $($tail)+ $(, $arg)*
        )
    };
}

/// As `select_session!`, for lists: only the small `executor_summary`
/// Postgres keeps beside the executor (kind, step count, repeat, model,
/// URL) is read, so a page of sessions never reads their executor JSON;
/// and no queue position, which a row's own count would make cost the
/// page 50 × its tenant's queue: [`Store::place_in_queue`] adds them, in
/// one pass for the page.
macro_rules! select_session_summary {
    ($($tail:literal)+ $(, $arg:expr)* $(,)?) => {
        select_session_with!(
            r#"NULL::jsonb AS "executor?: Json<StoredExecutor>""#,
            "NULL::bigint AS queue_position, NULL::bigint AS queue_tenants",
            $($tail)+ $(, $arg)*
        )
    };
}

macro_rules! select_session_with {
    ($executor:literal, $queue:literal, $($tail:literal)+ $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Session,
            r#"SELECT id, goal, mode AS "mode: Mode", status AS "status: Status",
                      reason AS "reason: Reason", summary, reason_detail, original_goal,
                      refinement AS "refinement: Json<RefinementProposal>",
                      criteria AS "criteria: Json<Vec<ChecklistItem>>",
                      milestones AS "milestones: Json<Vec<ChecklistItem>>", cycle, memory,
                      refinement_tokens,
                      last_reflection AS "last_reflection: Json<ReflectionSummary>",
                      reflection_tokens, cost_usd, unpriced_steps,
                      next_steps AS "next_steps: Json<Vec<String>>", percent_complete, eta_seconds,
                      limits AS "limits: Json<Limits>", "# + $executor + r#",
                      executor_summary AS "executor_summary: Json<ExecutorBrief>", iterations, tokens_used,
                      tool_calls, consecutive_errors, elapsed_ms, run, checkpoint_saved,
                      last_checkpoint_iteration, stop_requested, pause_requested, guidance,
                      last_event_seq, owner, lease_expires_at, heartbeat_at, created_at,
                      updated_at, ended_at, tenant, attempts, last_error, imported_at,
                      parent_id, lineage, secrets_from, budget_tokens, children_tokens,
                      warden_saturating(coalesce((SELECT sum(c.budget_tokens) FROM sessions c WHERE c.parent_id = sessions.id
                                AND NOT warden_session_ended(c.status)), 0)) AS "children_reserved_tokens!",
                      (SELECT count(*) FROM sessions c WHERE c.parent_id = sessions.id) AS "children_count!",
                      on_child_pause AS "on_child_pause: ChildPausePolicy",
                      forked_from_session, forked_from_iteration,
                      (SELECT coalesce(jsonb_agg(w.data ORDER BY w.seq), '[]') FROM events w
                        WHERE w.session_id = sessions.id AND w.kind = 'budget_warning')
                        AS "budget_warnings!: Json<Vec<SentWarning>>",
                      confirmation AS "confirmation: Json<Confirmation>", "# + $queue + r#"
               FROM sessions "# $(+ $tail)+
            $(, $arg)*
        )
    };
}

/// The filters of every list statement ($1–$7, $11, $12), handed as the
/// last literal to the list macro `$m` (the text of a checked query must
/// be literals, so it cannot be a constant).
macro_rules! with_list_filters {
    ($m:ident ! ($($arg:tt)*)) => {
        $m!($($arg)*,
            "($1::text IS NULL OR status = $1)
             AND ($2::text IS NULL OR mode = $2)
             AND ($3::text IS NULL OR executor_summary ->> 'kind' = $3)
             AND ($4::text IS NULL OR goal ILIKE $4)
             AND ($5::timestamptz IS NULL OR created_at >= $5)
             AND ($6::timestamptz IS NULL OR created_at < $6)
             AND ($7::text IS NULL OR tenant = $7)
             AND (NOT $11 OR parent_id IS NULL)
             AND ($12::numeric IS NULL OR cost_usd >= $12)")
    };
}

/// A list page: `select_session_summary!` with `$tail` after `FROM
/// sessions` and the thirteen list parameters of `$page` (a [`ListPage`]).
macro_rules! list_page {
    ($page:expr, $($tail:literal)+) => {{
        let page: &ListPage<'_> = $page;
        let (at, id) = (page.after.map(|c| c.at), page.after.map(|c| c.id));
        select_session_summary!(
            $($tail)+,
            page.filter.status as Option<Status>,
            page.filter.mode as Option<Mode>,
            page.filter.executor_kind,
            page.pattern,
            page.filter.created_from,
            page.filter.created_before,
            page.tenant,
            at,
            id,
            page.limit,
            page.filter.root_only,
            page.filter.min_cost_usd,
            page.after.map(|c| c.cost),
        )
        .fetch_all(page.pool)
        .await?
    }};
}

/// A page in creation order: read off `sessions_by_created`,
/// `sessions_by_status`, `sessions_tenant_created` or
/// `sessions_tenant_status_created`, in page order.
macro_rules! created_page {
    ($page:expr, $after:literal, $order:literal, $filters:literal) => {
        list_page!(
            $page,
            "WHERE " $filters
            " AND ($8::timestamptz IS NULL AND $13::numeric IS NULL OR " $after ")
             ORDER BY " $order " LIMIT $10"
        )
    };
}

/// A page in the order of `$key` (`updated_at` or `cost_usd`), which an
/// iteration's commit writes, so no index holds it (one would cost every
/// commit its HOT update). The page is merged from two that indexes give
/// in order: the running sessions' (at most the fleet's places, sorted)
/// and the others', off `$settled` (the same value, kept only while a
/// session is not running, migration 0041). `$cmp` and `$dir` go the
/// order's way; `$cursor` is the cursor's value of the key.
macro_rules! changing_key_page {
    ($page:expr, $key:literal, $settled:literal, $cmp:literal, $cursor:literal, $dir:literal,
     $filters:literal) => {
        list_page!(
            $page,
            "WHERE id IN (SELECT id FROM (
                 (SELECT id, " $key " AS k FROM sessions
                  WHERE status = 'running' AND ($1::text IS NULL OR $1 = 'running') AND " $filters "
                    AND ($8::timestamptz IS NULL AND $13::numeric IS NULL
                         OR (" $key ", id) " $cmp " (" $cursor ", $9))
                  ORDER BY " $key " " $dir ", id " $dir " LIMIT $10)
                 UNION ALL
                 (SELECT id, " $settled " AS k FROM sessions
                  WHERE " $settled " IS NOT NULL AND ($1::text IS NULL OR $1 <> 'running')
                    AND " $filters "
                    AND ($8::timestamptz IS NULL AND $13::numeric IS NULL
                         OR (" $settled ", id) " $cmp " (" $cursor ", $9))
                  ORDER BY " $settled " " $dir ", id " $dir " LIMIT $10)) u
               ORDER BY k " $dir ", id " $dir " LIMIT $10)
             ORDER BY " $key " " $dir ", id " $dir
        )
    };
}

/// What a list statement binds: the filter, the caller's tenant scope, the
/// cursor and the page's size.
struct ListPage<'a> {
    pool: &'a sqlx::PgPool,
    filter: &'a SessionFilter,
    pattern: Option<&'a str>,
    tenant: Option<&'a str>,
    after: Option<SessionCursor>,
    limit: i64,
}

impl ListPage<'_> {
    /// A page in the order of `updated_at` or `cost_usd` (see
    /// `changing_key_page!`). The cost cursor carries its cost in $13.
    async fn by_changing_key(&self, key: SessionSortKey, descending: bool) -> Result<Vec<Session>> {
        let rows = match (key, descending) {
            (SessionSortKey::Cost, true) => with_list_filters!(changing_key_page!(
                self,
                "cost_usd",
                "settled_cost_usd",
                "<",
                "$13::numeric",
                "DESC"
            )),
            (SessionSortKey::Cost, false) => with_list_filters!(changing_key_page!(
                self,
                "cost_usd",
                "settled_cost_usd",
                ">",
                "$13::numeric",
                "ASC"
            )),
            (_, true) => with_list_filters!(changing_key_page!(
                self,
                "updated_at",
                "settled_updated_at",
                "<",
                "$8",
                "DESC"
            )),
            (_, false) => with_list_filters!(changing_key_page!(
                self,
                "updated_at",
                "settled_updated_at",
                ">",
                "$8",
                "ASC"
            )),
        };
        Ok(rows)
    }
}

impl Store {
    /// Begins a transaction.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        if let Ok(actor) = super::ACTOR.try_with(String::clone) {
            sqlx::query_scalar!("SELECT set_config('warden.actor', $1, true)", actor)
                .fetch_one(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Commits a transaction that changed session `session_id`, returns once
    /// the commit is durable (what the answer reports must survive a crash
    /// of the machine too), then wakes this process's streams of it.
    pub async fn commit_session(
        &self,
        tx: Transaction<'static, Postgres>,
        session_id: Uuid,
    ) -> Result<()> {
        tx.commit().await?;
        self.durable().await?;
        self.announce(session_id);
        Ok(())
    }

    /// Creates a session with its first events in a transaction of its own
    /// (see [`insert`]).
    pub async fn insert_session(
        &self,
        new: &NewSession,
        owner: Option<Uuid>,
        lease_ttl: std::time::Duration,
        events: &[NewEvent],
    ) -> Result<(Session, Option<Lease>)> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        let status = if owner.is_some() {
            Status::Running
        } else {
            Status::AwaitingRefinement
        };
        let lease = insert(&mut tx, new, status, owner, lease_ttl).await?;
        event_log::append(&mut tx, new.id, events).await?;
        let scope = TenantScope::tenant_only(&new.tenant);
        let record = lock(&mut tx, new.id, &scope)
            .await?
            .ok_or(StoreError::Corrupt {
                id: new.id,
                detail: "session vanished right after insert".into(),
            })?;
        tx.commit().await?;
        self.announce(new.id);
        Ok((record, lease))
    }

    /// One session by id, if `scope` reaches it.
    pub async fn session(&self, id: Uuid, scope: &TenantScope) -> Result<Option<Session>> {
        let row = select_session!(
            "WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
            id,
            scope.tenant()
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// A page of the sessions `scope` reaches that `filter` lets through,
    /// in `order`, after `after` (a cursor of the same order). Their
    /// `executor` is the summary (`steps` is a count), not the specification.
    /// One query per order, so each can walk its index.
    pub async fn list_sessions(
        &self,
        filter: &SessionFilter,
        order: SessionOrder,
        after: Option<SessionCursor>,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<Session>> {
        let pattern = filter.goal_contains.as_deref().map(contains_pattern);
        let page = ListPage {
            pool: &self.pool,
            filter,
            pattern: pattern.as_deref(),
            tenant: scope.tenant(),
            after,
            limit,
        };
        // Each order stays its own checked statement so it walks its index.
        let mut rows = match (order.key, order.descending) {
            (SessionSortKey::Created, true) => with_list_filters!(created_page!(
                &page,
                "(created_at, id) < ($8, $9)",
                "created_at DESC, id DESC"
            )),
            (SessionSortKey::Created, false) => with_list_filters!(created_page!(
                &page,
                "(created_at, id) > ($8, $9)",
                "created_at ASC, id ASC"
            )),
            (key, descending) => page.by_changing_key(key, descending).await?,
        };
        self.place_in_queue(&mut rows, scope).await?;
        Ok(rows)
    }

    /// How many sessions `scope` reaches are in each status, of those
    /// `filter` lets through (its own `status` aside).
    pub async fn count_sessions_by_status(
        &self,
        filter: &SessionFilter,
        scope: &TenantScope,
    ) -> Result<Vec<(Status, i64)>> {
        if filter.counts_every_session() {
            // The kept counts (migration 0040): no scan of every session.
            let counts = self.status_counts(scope.tenant()).await?;
            return Ok(counts
                .into_iter()
                .filter_map(|(status, n)| Some((Status::parse(&status)?, n)))
                .collect());
        }
        let pattern = filter.goal_contains.as_deref().map(contains_pattern);
        let rows = sqlx::query!(
            r#"SELECT status AS "status: Status", count(*) AS "count!" FROM sessions
             WHERE ($1::text IS NULL OR mode = $1)
               AND ($2::text IS NULL OR executor_summary ->> 'kind' = $2)
               AND ($3::text IS NULL OR goal ILIKE $3)
               AND ($4::timestamptz IS NULL OR created_at >= $4)
               AND ($5::timestamptz IS NULL OR created_at < $5)
               AND ($6::text IS NULL OR tenant = $6)
               AND (NOT $7 OR parent_id IS NULL)
             GROUP BY status"#,
            filter.mode as Option<Mode>,
            filter.executor_kind,
            pattern.as_deref(),
            filter.created_from,
            filter.created_before,
            scope.tenant(),
            filter.root_only,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.status, r.count)).collect())
    }

    /// Sessions `scope` reaches changed at or after `since`, oldest change
    /// first; `executor` is the summary, as in lists.
    pub async fn sessions_changed_since(
        &self,
        since: DateTime<Utc>,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<Session>> {
        // As a list by `updated` (`changing_key_page!`): the running
        // sessions' changes and, off `sessions_settled_by_updated`, the
        // others', so a poll reads what changed, not every session.
        let mut rows = select_session_summary!(
            "WHERE id IN (SELECT id FROM (
                 (SELECT id, updated_at AS k FROM sessions
                  WHERE status = 'running' AND updated_at >= $1
                    AND ($3::text IS NULL OR tenant = $3)
                  ORDER BY updated_at, id LIMIT $2)
                 UNION ALL
                 (SELECT id, settled_updated_at AS k FROM sessions
                  WHERE settled_updated_at >= $1 AND ($3::text IS NULL OR tenant = $3)
                  ORDER BY settled_updated_at, id LIMIT $2)) u
               ORDER BY k, id LIMIT $2)
             ORDER BY updated_at, id",
            since,
            limit,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        self.place_in_queue(&mut rows, scope).await?;
        Ok(rows)
    }

    /// The refinement history of a session.
    pub async fn refinements(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Vec<RefinementRecord>> {
        Ok(sqlx::query_as!(
            RefinementRecord,
            "SELECT number, kind, goal_before, goal_after, data, created_at FROM refinements
             WHERE session_id = $1
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2))
             ORDER BY number",
            id,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

/// Inserts a session on the caller's connection in `status`: `running`
/// under a lease held by `owner` (the lease is returned), `queued` (it
/// joins the queue now) or waiting for refinement. The caller announces it
/// once committed.
pub async fn insert(
    conn: &mut PgConnection,
    new: &NewSession,
    status: Status,
    owner: Option<Uuid>,
    lease_ttl: std::time::Duration,
) -> Result<Option<Lease>> {
    let owner = owner.filter(|_| status == Status::Running);
    let token = owner.map(|_| Uuid::new_v4());
    sqlx::query!(
        "INSERT INTO sessions (id, goal, mode, status, limits, executor, owner, lease_token, lease_expires_at, heartbeat_at,
                               original_goal, refinement, criteria, milestones, refinement_tokens, tokens_used, tenant,
                               queued_at)
         VALUES ($1, $2, $3, $14, $4, $5,
                 $6, $7, CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() + make_interval(secs => $8) END,
                 CASE WHEN $6::uuid IS NULL THEN NULL ELSE now() END, $9, $10, $11, $12, $13, $13, $15,
                 CASE WHEN $14 = 'queued' THEN now() END)",
        new.id,
        &new.goal,
        new.mode as Mode,
        Json(new.limits) as _,
        Json(&new.executor) as _,
        owner,
        token,
        lease_ttl.as_secs_f64(),
        new.original_goal.as_deref(),
        new.refinement.as_ref().map(Json) as _,
        Json(&new.criteria) as _,
        Json(&new.milestones) as _,
        new.refinement_tokens,
        status as Status,
        &new.tenant,
    )
    .execute(conn)
    .await?;
    Ok(token.map(|token| Lease {
        session_id: new.id,
        token,
    }))
}

/// Reads and row-locks one session inside a transaction, if `scope`
/// reaches it.
pub async fn lock(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
) -> Result<Option<Session>> {
    let row = select_session!(
        "WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) FOR UPDATE",
        id,
        scope.tenant()
    )
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// Records a user's stop request (the durable flag every replica obeys).
pub async fn request_stop(conn: &mut PgConnection, id: Uuid, scope: &TenantScope) -> Result<()> {
    request(conn, id, scope, SessionEvent::StopRequested {}).await
}

/// Records a user's pause request.
pub async fn request_pause(conn: &mut PgConnection, id: Uuid, scope: &TenantScope) -> Result<()> {
    request(conn, id, scope, SessionEvent::PauseRequested {}).await
}

/// The error of a scoped write that matched no row: the caller locked the
/// session under the same scope first, so this is never a user's mistake.
/// A write to a session locked under the same scope must have reached it;
/// one that did not is a broken invariant, not a missing session.
fn reached(id: Uuid, done: &sqlx::postgres::PgQueryResult) -> Result<()> {
    if done.rows_affected() == 0 {
        return Err(StoreError::Corrupt {
            id,
            detail: "a locked session was not reached by its own scope".into(),
        });
    }
    Ok(())
}

/// Sets the durable flag of a stop or pause `request` and logs it.
async fn request(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    request: SessionEvent,
) -> Result<()> {
    let stop = matches!(request, SessionEvent::StopRequested {});
    let done = sqlx::query!(
        "UPDATE sessions SET stop_requested = stop_requested OR $2,
                             pause_requested = pause_requested OR NOT $2, updated_at = now()
         WHERE id = $1 AND ($3::text IS NULL OR tenant = $3)",
        id,
        stop,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)?;
    event_log::append(conn, id, &[NewEvent::from_event(&request)?]).await
}

/// Changes mode and limits of a session.
pub async fn update_settings(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    settings: SessionSettings,
    events: &[NewEvent],
) -> Result<()> {
    let done = sqlx::query!(
        "UPDATE sessions SET mode = $2, limits = $3, updated_at = now()
         WHERE id = $1 AND ($4::text IS NULL OR tenant = $4)",
        id,
        settings.mode as Mode,
        Json(settings.limits) as _,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)?;
    event_log::append(conn, id, events).await
}

/// Puts a resumable session back to running under a fresh lease held by
/// `owner` (returned), or, without one, in the queue.
#[allow(clippy::too_many_arguments)]
pub async fn resume(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    goal: Option<&str>,
    limits: Limits,
    guidance: Option<&str>,
    owner: Option<Uuid>,
    lease_ttl: std::time::Duration,
    events: &[NewEvent],
) -> Result<Option<Lease>> {
    let token = owner.map(|_| Uuid::new_v4());
    let status = if owner.is_some() {
        Status::Running
    } else {
        Status::Queued
    };
    let done = sqlx::query!(
        "UPDATE sessions SET status = $8, reason = NULL, summary = NULL, reason_detail = NULL, next_steps = '[]',
                ended_at = NULL, checkpoint_saved = false, stop_requested = false, pause_requested = false,
                consecutive_errors = 0, run = run + 1, limits = $2, guidance = $3,
                owner = $4, lease_token = $5,
                lease_expires_at = CASE WHEN $4::uuid IS NULL THEN NULL ELSE now() + make_interval(secs => $6) END,
                heartbeat_at = CASE WHEN $4::uuid IS NULL THEN NULL ELSE now() END, updated_at = now(),
                queued_at = CASE WHEN $4::uuid IS NULL THEN now() END,
                original_goal = CASE WHEN $7::text IS NULL OR $7 = goal THEN original_goal
                                     ELSE COALESCE(original_goal, goal) END,
                goal = COALESCE($7, goal)
         WHERE id = $1 AND ($9::text IS NULL OR tenant = $9)",
        id,
        Json(limits) as _,
        guidance,
        owner,
        token,
        lease_ttl.as_secs_f64(),
        goal,
        status as Status,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)?;
    event_log::append(conn, id, events).await?;
    Ok(token.map(|token| Lease {
        session_id: id,
        token,
    }))
}

/// Ends a session that no loop is running (paused, awaiting refinement, or
/// orphaned by a dead replica), with a checkpoint of its rebuilt state.
pub async fn end_unowned(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    termination: &Termination,
    checkpoint: Option<(i64, Value)>,
    events: &[NewEvent],
) -> Result<()> {
    if let Some((iteration, state)) = &checkpoint {
        insert_checkpoint(conn, id, *iteration, termination.reason.as_str(), state).await?;
    }
    // A session left waiting for a person has not ended.
    let waits = matches!(
        termination.status,
        Status::Paused | Status::AwaitingRefinement | Status::AwaitingConfirmation
    );
    let done = sqlx::query!(
        "UPDATE sessions SET status = $2, reason = $3, summary = $4, next_steps = $5,
                checkpoint_saved = $6, stop_requested = false, pause_requested = false,
                last_checkpoint_iteration = COALESCE($7, last_checkpoint_iteration),
                owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                ended_at = CASE WHEN $8 THEN NULL ELSE now() END,
                updated_at = now()
         WHERE id = $1 AND ($9::text IS NULL OR tenant = $9)",
        id,
        termination.status as Status,
        termination.reason as Reason,
        termination.summary.as_str(),
        Json(&termination.next_steps) as _,
        checkpoint.is_some(),
        checkpoint.as_ref().map(|(n, _)| *n),
        waits,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)?;
    event_log::append(conn, id, events).await
}

/// Records a refinement in the session's history.
pub async fn insert_refinement(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    kind: &str,
    goal_before: &str,
    goal_after: &str,
    data: &Value,
) -> Result<()> {
    let done = sqlx::query!(
        "INSERT INTO refinements (session_id, number, kind, goal_before, goal_after, data)
         SELECT $1, COALESCE(MAX(number), 0) + 1, $2, $3, $4, $5 FROM refinements WHERE session_id = $1
         HAVING EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($6::text IS NULL OR s.tenant = $6))",
        id,
        kind,
        goal_before,
        goal_after,
        data,
        scope.tenant(),
    )
    .execute(conn)
    .await?;
    reached(id, &done)
}

/// Starts a session that waited for refinement, with its chosen goal and
/// limits: running under a lease held by `owner` (returned), or, without
/// one, in the queue.
#[allow(clippy::too_many_arguments)]
pub async fn start_refined(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    goal: &str,
    limits: Limits,
    owner: Option<Uuid>,
    lease_ttl: std::time::Duration,
    events: &[NewEvent],
) -> Result<Option<Lease>> {
    let token = owner.map(|_| Uuid::new_v4());
    let status = if owner.is_some() {
        Status::Running
    } else {
        Status::Queued
    };
    let done = sqlx::query!(
        "UPDATE sessions SET status = $7, reason = NULL, summary = NULL, reason_detail = NULL,
                original_goal = CASE WHEN goal = $2 THEN original_goal ELSE COALESCE(original_goal, goal) END,
                goal = $2, limits = $3, owner = $4, lease_token = $5,
                lease_expires_at = CASE WHEN $4::uuid IS NULL THEN NULL ELSE now() + make_interval(secs => $6) END,
                heartbeat_at = CASE WHEN $4::uuid IS NULL THEN NULL ELSE now() END, updated_at = now(),
                queued_at = CASE WHEN $4::uuid IS NULL THEN now() END
         WHERE id = $1 AND ($8::text IS NULL OR tenant = $8)",
        id,
        goal,
        Json(limits) as _,
        owner,
        token,
        lease_ttl.as_secs_f64(),
        status as Status,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)?;
    event_log::append(conn, id, events).await?;
    Ok(token.map(|token| Lease {
        session_id: id,
        token,
    }))
}

/// Records what a session just inserted in `awaiting_confirmation` waits
/// on, and when it expires undecided.
pub async fn set_confirmation(
    conn: &mut PgConnection,
    id: Uuid,
    scope: &TenantScope,
    confirmation: &Confirmation,
) -> Result<()> {
    let done = sqlx::query!(
        "UPDATE sessions SET confirmation = $2, confirm_by = $3
         WHERE id = $1 AND ($4::text IS NULL OR tenant = $4)",
        id,
        Json(confirmation) as _,
        confirmation.expires_at,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)
}

/// Deletes a session the caller locked under `scope`, with its whole history
/// (iterations, events and checkpoints by the delete trigger, the rest by
/// foreign keys). The caller has checked that it ended.
pub async fn delete(conn: &mut PgConnection, id: Uuid, scope: &TenantScope) -> Result<()> {
    let done = sqlx::query!(
        "DELETE FROM sessions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
        id,
        scope.tenant(),
    )
    .execute(&mut *conn)
    .await?;
    reached(id, &done)
}

impl Store {
    /// Sessions awaiting confirmation past their `confirm_by`, oldest
    /// first, at most `limit`: each with its tenant. The expiry sweep's
    /// read, across every tenant.
    pub async fn expired_confirmations(&self, limit: i64) -> Result<Vec<(Uuid, String)>> {
        let rows = sqlx::query!(
            "SELECT id, tenant FROM sessions
             WHERE status = 'awaiting_confirmation' AND confirm_by <= now()
             ORDER BY confirm_by, id LIMIT $1",
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.tenant)).collect())
    }

    /// Of the sessions `ids`, those that exist within `scope`, each with
    /// when it ended (`None`: not ended).
    pub async fn ended_at_of(
        &self,
        ids: &[Uuid],
        scope: &TenantScope,
    ) -> Result<Vec<(Uuid, Option<DateTime<Utc>>)>> {
        let rows = sqlx::query!(
            "SELECT id, ended_at FROM sessions
             WHERE id = ANY($1) AND ($2::text IS NULL OR tenant = $2)",
            ids,
            scope.tenant(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.ended_at)).collect())
    }
}
