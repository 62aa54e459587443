//! What a tenant's settled sessions teach about its thresholds (the report
//! itself is the pure `policy::insights`; the suggestion's totals are the
//! policy replay's).

use std::time::Duration;

use super::SessionService;
use super::replay::{MAX_REPLAY_SESSIONS, Selection};
use crate::policy::guardrails::LimitsPatch;
use crate::policy::insights::{self, ThresholdReport};
use crate::policy::replay::PolicyOverride;
use crate::session::error::Result;
use crate::store::TenantScope;

/// How long the suggestion's replay may take.
const REPLAY_DEADLINE: Duration = Duration::from_secs(10);

impl SessionService {
    /// The threshold report over the most recent settled sessions of
    /// `tenant` (within `scope`), its suggestion weighed by a replay of the
    /// newest of them under it.
    pub async fn threshold_report(
        &self,
        scope: &TenantScope,
        tenant: &str,
    ) -> Result<ThresholdReport> {
        let histories = self.store.settled_histories(scope, tenant).await?;
        let mut report = insights::report(&histories);
        if let Some(suggestion) = report.max_iterations_suggestion.as_mut() {
            let ids = histories.iter().map(|h| h.id).take(MAX_REPLAY_SESSIONS);
            let policy = PolicyOverride {
                limits: LimitsPatch {
                    max_iterations: Some(suggestion.value),
                    ..LimitsPatch::default()
                },
                ..PolicyOverride::default()
            };
            let selection = Selection::Ids(ids.collect());
            let replayed = self
                .replay_policy(selection, &policy, REPLAY_DEADLINE, scope)
                .await?;
            suggestion.replay = Some(replayed.totals);
        }
        Ok(report)
    }
}
