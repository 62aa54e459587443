//! A tenant's ended sessions, read as history for estimates: what each
//! completed session with a given executor took.

use sqlx::types::Json;

use super::{Result, Store, TenantScope};
use crate::policy::checklist::ChecklistItem;

/// Most past sessions one estimate reads (the most recent).
pub const MAX_HISTORY: i64 = 500;

/// A completed session, as history.
#[derive(Debug, Clone, PartialEq)]
pub struct PastRun {
    /// Its goal.
    pub goal: String,
    /// Its success criteria.
    pub criteria: Vec<ChecklistItem>,
    /// Iterations it took.
    pub iterations: i64,
    /// Tokens it used.
    pub tokens: i64,
    /// Running wall time it took (ms).
    pub elapsed_ms: i64,
    /// What it cost, when every step of it was priced: `None` when a step
    /// was unpriced, or when it used tokens but cost nothing (it ran before
    /// sessions were priced, so its cost is unknown, not 0).
    pub cost_usd: Option<rust_decimal::Decimal>,
}

impl Store {
    /// The most recent completed sessions of `tenant` (within `scope`) whose
    /// executor is of `kind` and names `model` (or none, when `None`).
    pub async fn completed_like(
        &self,
        scope: &TenantScope,
        tenant: &str,
        kind: &str,
        model: Option<&str>,
    ) -> Result<Vec<PastRun>> {
        let rows = sqlx::query!(
            r#"SELECT goal, criteria AS "criteria!: Json<Vec<ChecklistItem>>",
                      iterations, tokens_used, elapsed_ms, cost_usd, unpriced_steps
               FROM sessions
               WHERE tenant = $1 AND ($2::text IS NULL OR tenant = $2)
                 AND status = 'completed'
                 AND executor_summary->>'kind' = $3
                 AND (executor_summary->>'model') IS NOT DISTINCT FROM $4
               ORDER BY ended_at DESC NULLS LAST
               LIMIT $5"#,
            tenant,
            scope.tenant(),
            kind,
            model,
            MAX_HISTORY
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| PastRun {
                goal: r.goal,
                criteria: r.criteria.0,
                iterations: r.iterations,
                tokens: r.tokens_used,
                elapsed_ms: r.elapsed_ms,
                cost_usd: (r.unpriced_steps == 0 && (r.tokens_used == 0 || !r.cost_usd.is_zero()))
                    .then_some(r.cost_usd),
            })
            .collect())
    }
}
