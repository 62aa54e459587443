//! What a tenant's settled sessions teach about its thresholds (the report
//! itself is the pure `policy::insights`; the suggestion's totals are the
//! policy replay's), and the thresholds the tenant applied.

use std::time::Duration;

use uuid::Uuid;

use super::SessionService;
use super::replay::{MAX_REPLAY_SESSIONS, ReplayAnswer, Selection};
use crate::policy::guardrails::LimitsPatch;
use crate::policy::insights::{self, AppliedThresholds, ThresholdReport};
use crate::policy::replay::PolicyOverride;
use crate::session::error::Result;
use crate::store::TenantScope;

/// How long the suggestion's replay may take.
const REPLAY_DEADLINE: Duration = Duration::from_secs(10);

impl SessionService {
    /// The threshold report over the most recent settled sessions of
    /// `tenant` (within `scope`), its suggestion weighed by a replay of the
    /// newest of them under it, and the thresholds the tenant applied.
    pub async fn threshold_report(
        &self,
        scope: &TenantScope,
        tenant: &str,
    ) -> Result<ThresholdReport> {
        let histories = self.store.settled_histories(scope, tenant).await?;
        let mut report = insights::report(&histories);
        if let Some(suggestion) = report.max_iterations_suggestion.as_mut() {
            let ids = histories.iter().map(|h| h.id).take(MAX_REPLAY_SESSIONS);
            let replayed = self
                .replay_max_iterations(scope, ids.collect(), suggestion.value)
                .await?;
            suggestion.replay = Some(replayed.totals);
        }
        report.applied = self.applied_thresholds(tenant).await?;
        Ok(report)
    }

    /// The thresholds `tenant` applied, in force for its new sessions.
    pub(super) async fn applied_thresholds(&self, tenant: &str) -> Result<AppliedThresholds> {
        let defaults = self.store.tenant_session_defaults(tenant).await?;
        Ok(AppliedThresholds {
            max_iterations: defaults.max_iterations.and_then(|v| u64::try_from(v).ok()),
        })
    }

    /// The policy replay of the sessions `ids` (within `scope`) with
    /// `max_iterations` as their iteration limit, every other rule as each
    /// ran.
    pub(super) async fn replay_max_iterations(
        &self,
        scope: &TenantScope,
        ids: Vec<Uuid>,
        max_iterations: u64,
    ) -> Result<ReplayAnswer> {
        let policy = PolicyOverride {
            limits: LimitsPatch {
                max_iterations: Some(max_iterations),
                ..LimitsPatch::default()
            },
            ..PolicyOverride::default()
        };
        self.replay_policy(Selection::Ids(ids), &policy, REPLAY_DEADLINE, scope)
            .await
    }
}
