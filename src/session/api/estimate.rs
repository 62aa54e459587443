//! The estimate use case: what a create request would likely take, from the
//! tenant's completed sessions with the same executor (see
//! `policy::estimate` for the measure and the quantiles).

use serde::Serialize;
use utoipa::ToSchema;

use super::SessionService;
use super::create_request::{CreateSession, validate_goal};
use crate::policy::estimate::{self, Estimate, Figures, PastSession, Query};
use crate::policy::guardrails::Limits;
use crate::session::{Result, ServiceError};
use crate::spec::ExecutorBrief;
use crate::store::TenantScope;

/// An estimate and the limits the session would run under.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct EstimateAnswer {
    /// The figures and what they rest on.
    #[serde(flatten)]
    pub estimate: Estimate,
    /// The executor kind the history was chosen by.
    pub executor_kind: String,
    /// The model the history was chosen by, when the executor names one.
    pub model: Option<String>,
    /// Whether the p90 fits within the session's limits (iterations,
    /// tokens, wall time); with `basis: none` the figures are the limits.
    pub fits_limits: bool,
}

impl SessionService {
    /// Estimates what `req`, created by `tenant` under `limits` (those
    /// its create resolved), would take, once the create's checks have
    /// passed (`dry_run`). Reads only: nothing is created.
    pub(super) async fn estimate(
        &self,
        req: &CreateSession,
        limits: &Limits,
        tenant: &str,
    ) -> Result<EstimateAnswer> {
        let goal = validate_goal(&req.goal)?;
        let brief = ExecutorBrief::from(&req.executor);
        let scope = TenantScope::tenant_only(tenant);
        let past = self
            .store
            .completed_like(&scope, tenant, &brief.kind, brief.model.as_deref())
            .await
            .map_err(ServiceError::from)?;
        let history: Vec<PastSession> = past
            .into_iter()
            .map(|run| PastSession {
                executor_kind: brief.kind.clone(),
                model: brief.model.clone(),
                text: text_of(&run.goal, run.criteria.iter().map(|c| c.text.as_str())),
                figures: Figures {
                    iterations: count(run.iterations),
                    tokens: count(run.tokens),
                    duration_ms: count(run.elapsed_ms),
                    cost_usd: run.cost_usd,
                },
            })
            .collect();
        let defaults = Figures {
            iterations: limits.max_iterations,
            tokens: limits.max_tokens,
            duration_ms: limits.max_wall_time_ms,
            // The money budget, when one is set: a limit, never a guess.
            cost_usd: limits.max_cost_usd,
        };
        let text = text_of(&goal, req.success_criteria.iter().map(String::as_str));
        let query = Query {
            executor_kind: &brief.kind,
            model: brief.model.as_deref(),
            text: &text,
        };
        let estimate = estimate::estimate(query, &history, defaults);
        let fits_limits = estimate.iterations.p90 <= limits.max_iterations
            && estimate.tokens.p90 <= limits.max_tokens
            && estimate.duration_ms.p90 <= limits.max_wall_time_ms;
        Ok(EstimateAnswer {
            estimate,
            executor_kind: brief.kind,
            model: brief.model,
            fits_limits,
        })
    }
}

/// Goal and criteria as one text, the way history is compared.
fn text_of<'a>(goal: &'a str, criteria: impl Iterator<Item = &'a str>) -> String {
    std::iter::once(goal)
        .chain(criteria)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A stored count as the policy's unsigned one (a negative is 0).
fn count(stored: i64) -> u64 {
    u64::try_from(stored).unwrap_or(0)
}
