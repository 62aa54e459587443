//! What a tenant's settled sessions teach about its thresholds (the report
//! itself is the pure `policy::insights`).

use super::SessionService;
use crate::policy::insights::{self, ThresholdReport};
use crate::session::error::Result;
use crate::store::TenantScope;

impl SessionService {
    /// The threshold report over the most recent settled sessions of
    /// `tenant` (within `scope`).
    pub async fn threshold_report(
        &self,
        scope: &TenantScope,
        tenant: &str,
    ) -> Result<ThresholdReport> {
        let histories = self.store.settled_histories(scope, tenant).await?;
        Ok(insights::report(&histories))
    }
}
