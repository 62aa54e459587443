//! A session's tree (`GET /api/autonomous/{id}/tree`): the session and
//! every descendant, nested, with each node's own figures and those of its
//! subtree rolled up, read within the caller's tenant. A fork shows where it
//! came from (`forked_from`), and each session lists its forks (`forks`).

use std::collections::HashMap;

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiResult, Problem};
use super::extract::SessionId;
use super::views::ForkedFrom;
use crate::auth::Principal;
use crate::policy::lifecycle::{Reason, Status};
use crate::session::{ForkRow, TreeRow};

/// The tree route, relative to `/api/autonomous`.
pub fn router() -> Router<AppState> {
    Router::new().route("/{id}/tree", get(get_tree))
}

/// A session of a tree, with its children.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TreeNode {
    /// The session.
    pub id: Uuid,
    /// Its parent (null for a top-level session).
    pub parent_id: Option<Uuid>,
    /// Its depth in the whole tree (0 for a top-level session).
    pub depth: i32,
    /// Its goal.
    pub goal: String,
    /// Its status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Its summary.
    pub summary: Option<String>,
    /// Tokens it used itself.
    pub tokens_used: i64,
    /// Iterations it committed itself.
    pub iterations: i64,
    /// Its token limit now (what it has left for itself after its live children's budgets).
    pub max_tokens: u64,
    /// Tokens carved out of its parent for it (null for a top-level session).
    pub budget_tokens: Option<i64>,
    /// Progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// Tokens it and all its descendants used.
    pub subtree_tokens_used: i64,
    /// What its own steps cost, USD (exact decimal string).
    #[schema(value_type = String, example = "0.0123")]
    pub cost_usd: Decimal,
    /// Its own steps no price entry priced.
    pub unpriced_steps: i64,
    /// What it and all its descendants' steps cost, USD: the exact sum.
    #[schema(value_type = String, example = "0.0123")]
    pub subtree_cost_usd: Decimal,
    /// The session it was forked from and the checkpoint's iteration, when
    /// it is a fork (`POST /api/autonomous/{id}/fork`).
    pub forked_from: Option<ForkedFrom>,
    /// Sessions forked from it, oldest first (they are trees of their own).
    pub forks: Vec<ForkRef>,
    /// Its children, oldest first.
    #[schema(no_recursion)]
    pub children: Vec<TreeNode>,
}

/// A fork of a session, as its origin's node lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkRef {
    /// The fork.
    pub id: Uuid,
    /// The iteration of the checkpoint it was forked from.
    pub iteration: i64,
    /// Its goal.
    pub goal: String,
    /// Its status.
    pub status: Status,
    /// Created.
    pub created_at: DateTime<Utc>,
}

/// Figures of a whole tree.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TreeTotals {
    /// Sessions in it.
    pub sessions: usize,
    /// Sessions that have not ended.
    pub live: usize,
    /// Tokens they all used.
    pub tokens_used: i64,
    /// Iterations they all committed.
    pub iterations: i64,
    /// What all their steps cost, USD (exact decimal string): the sum of
    /// every session's `cost_usd`.
    #[schema(value_type = String, example = "0.0123")]
    pub cost_usd: Decimal,
    /// Steps of theirs no price entry priced.
    pub unpriced_steps: i64,
}

/// A session and its descendants.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TreeView {
    /// Figures of the whole tree below (and with) the session.
    pub totals: TreeTotals,
    /// The session, its children nested.
    pub node: TreeNode,
}

/// A session's tree: the session, every descendant nested under its parent
/// with its own and its subtree's figures, and the tree's totals.
#[utoipa::path(
    get, path = "/api/autonomous/{id}/tree", tag = "sessions",
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session and its descendants", body = TreeView),
        (status = 404, description = "No such session (or not one of the caller's tenant)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_tree(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    SessionId(id): SessionId,
) -> ApiResult<Json<TreeView>> {
    let reads = state.service.reads();
    let rows = reads.tree(id, &caller.scope).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let forks = reads.forks_of(&ids, &caller.scope).await?;
    let view = nest(id, rows, forks).ok_or(crate::session::ServiceError::NotFound(id))?;
    Ok(Json(view))
}

/// Nests `rows` (the session `top` first) into a tree with rolled-up
/// figures, each node with its `forks`; `None` when `top` is not among them.
fn nest(top: Uuid, rows: Vec<TreeRow>, forks: Vec<ForkRow>) -> Option<TreeView> {
    let totals = TreeTotals {
        sessions: rows.len(),
        live: rows.iter().filter(|r| !r.status.has_ended()).count(),
        tokens_used: saturating_sum(rows.iter().map(|r| r.tokens_used)),
        iterations: saturating_sum(rows.iter().map(|r| r.iterations)),
        cost_usd: money_sum(rows.iter().map(|r| r.cost_usd)),
        unpriced_steps: saturating_sum(rows.iter().map(|r| r.unpriced_steps)),
    };
    let mut by_parent: HashMap<Uuid, Vec<TreeRow>> = HashMap::new();
    let mut root = None;
    for row in rows {
        if row.id == top {
            root = Some(row);
        } else if let Some(parent) = row.parent_id {
            by_parent.entry(parent).or_default().push(row);
        }
    }
    let mut forks_by_origin: HashMap<Uuid, Vec<ForkRef>> = HashMap::new();
    for f in forks {
        forks_by_origin
            .entry(f.forked_from_session)
            .or_default()
            .push(ForkRef {
                id: f.id,
                iteration: f.forked_from_iteration,
                goal: f.goal,
                status: f.status,
                created_at: f.created_at,
            });
    }
    let mut lookup = Lookup {
        by_parent,
        forks: forks_by_origin,
    };
    let node = build(root?, &mut lookup);
    Some(TreeView { totals, node })
}

/// A sum of stored counts that stops at the largest instead of wrapping.
fn saturating_sum(counts: impl Iterator<Item = i64>) -> i64 {
    counts.fold(0, i64::saturating_add)
}

/// An exact sum of amounts (saturating at Decimal's largest, far past any bill).
fn money_sum(amounts: impl Iterator<Item = Decimal>) -> Decimal {
    amounts
        .fold(Decimal::ZERO, Decimal::saturating_add)
        .normalize()
}

/// A tree's rows by parent and its forks by origin, taken as nodes are built.
struct Lookup {
    by_parent: HashMap<Uuid, Vec<TreeRow>>,
    forks: HashMap<Uuid, Vec<ForkRef>>,
}

fn build(row: TreeRow, lookup: &mut Lookup) -> TreeNode {
    let children: Vec<TreeNode> = lookup
        .by_parent
        .remove(&row.id)
        .unwrap_or_default()
        .into_iter()
        .map(|child| build(child, lookup))
        .collect();
    let forks = lookup.forks.remove(&row.id).unwrap_or_default();
    let forked_from =
        row.forked_from_session
            .zip(row.forked_from_iteration)
            .map(|(session_id, iteration)| ForkedFrom {
                session_id,
                iteration,
            });
    let subtree_tokens_used = saturating_sum(
        std::iter::once(row.tokens_used).chain(children.iter().map(|c| c.subtree_tokens_used)),
    );
    let subtree_cost_usd =
        money_sum(std::iter::once(row.cost_usd).chain(children.iter().map(|c| c.subtree_cost_usd)));
    TreeNode {
        id: row.id,
        parent_id: row.parent_id,
        depth: row.depth,
        goal: row.goal,
        status: row.status,
        reason: row.reason,
        summary: row.summary,
        tokens_used: row.tokens_used,
        iterations: row.iterations,
        max_tokens: row.limits.max_tokens,
        budget_tokens: row.budget_tokens,
        percent_complete: row.percent_complete,
        created_at: row.created_at,
        ended_at: row.ended_at,
        subtree_tokens_used,
        cost_usd: row.cost_usd.normalize(),
        unpriced_steps: row.unpriced_steps,
        subtree_cost_usd,
        forked_from,
        forks,
        children,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u128, parent: Option<u128>, tokens: i64, status: Status) -> TreeRow {
        TreeRow {
            id: Uuid::from_u128(id),
            parent_id: parent.map(Uuid::from_u128),
            depth: 0,
            goal: format!("g{id}"),
            status,
            reason: None,
            summary: None,
            tokens_used: tokens,
            iterations: 1,
            limits: sqlx::types::Json(crate::policy::guardrails::tests::roomy()),
            budget_tokens: parent.map(|_| 100),
            percent_complete: None,
            created_at: Utc::now(),
            ended_at: None,
            cost_usd: Decimal::new(tokens, 4),
            unpriced_steps: 1,
            forked_from_session: None,
            forked_from_iteration: None,
        }
    }

    #[test]
    fn rows_nest_under_their_parents_with_rolled_up_figures() {
        let rows = vec![
            row(1, None, 10, Status::Paused),
            row(2, Some(1), 20, Status::Completed),
            row(3, Some(1), 30, Status::Running),
            row(4, Some(3), 40, Status::Running),
        ];
        let view = nest(Uuid::from_u128(1), rows, Vec::new()).unwrap();
        assert_eq!(view.totals.sessions, 4);
        assert_eq!(view.totals.live, 3);
        assert_eq!(view.totals.tokens_used, 100);
        assert_eq!(view.node.subtree_tokens_used, 100);
        assert_eq!(view.totals.cost_usd, Decimal::new(100, 4));
        assert_eq!(view.node.subtree_cost_usd, Decimal::new(100, 4));
        assert_eq!(view.totals.unpriced_steps, 4);
        assert_eq!(view.node.children.len(), 2);
        assert_eq!(view.node.children[0].goal, "g2");
        assert_eq!(view.node.children[1].subtree_tokens_used, 70);
        assert_eq!(view.node.children[1].children[0].goal, "g4");
    }

    #[test]
    fn a_subtree_asked_for_has_its_session_on_top() {
        let rows = vec![
            row(3, Some(1), 30, Status::Running),
            row(4, Some(3), 40, Status::Running),
        ];
        let view = nest(Uuid::from_u128(3), rows, Vec::new()).unwrap();
        assert_eq!(view.node.parent_id, Some(Uuid::from_u128(1)));
        assert_eq!(view.node.children.len(), 1);
        assert!(nest(Uuid::from_u128(9), Vec::new(), Vec::new()).is_none());
    }

    #[test]
    fn forks_hang_under_their_origin_and_a_fork_names_it() {
        let mut fork = row(2, None, 5, Status::Running);
        fork.forked_from_session = Some(Uuid::from_u128(9));
        fork.forked_from_iteration = Some(4);
        let rows = vec![fork, row(3, Some(2), 1, Status::Running)];
        let forks = vec![
            ForkRow {
                id: Uuid::from_u128(7),
                forked_from_session: Uuid::from_u128(3),
                forked_from_iteration: 1,
                goal: "g7".into(),
                status: Status::Paused,
                created_at: Utc::now(),
            },
            ForkRow {
                id: Uuid::from_u128(8),
                forked_from_session: Uuid::from_u128(2),
                forked_from_iteration: 2,
                goal: "g8".into(),
                status: Status::Completed,
                created_at: Utc::now(),
            },
        ];
        let view = nest(Uuid::from_u128(2), rows, forks).unwrap();
        let origin = view.node.forked_from.unwrap();
        assert_eq!(
            (origin.session_id, origin.iteration),
            (Uuid::from_u128(9), 4)
        );
        assert_eq!(view.node.forks.len(), 1);
        assert_eq!(view.node.forks[0].id, Uuid::from_u128(8));
        assert_eq!(view.node.children[0].forks[0].iteration, 1);
        assert!(view.node.children[0].forked_from.is_none());
        // Forks are trees of their own: they count in no totals here.
        assert_eq!(view.totals.sessions, 2);
    }
}
