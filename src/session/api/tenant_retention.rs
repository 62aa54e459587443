//! How long a tenant's ended sessions are kept: the server's retention
//! and the tenants' own.

use super::SessionService;
use crate::policy::retention::TenantRetention;
use crate::session::error::{Result, ServiceError};

impl SessionService {
    /// The server's retention (`WARDEN_RETENTION_DAYS`; `None`: forever) and
    /// the tenants with one of their own (`tenant` only, when given).
    pub async fn retentions(
        &self,
        tenant: Option<&str>,
    ) -> Result<(Option<std::time::Duration>, Vec<(String, TenantRetention)>)> {
        Ok((
            self.config.retention.keep,
            self.store.tenant_retentions(tenant).await?,
        ))
    }

    /// Sets a tenant's own retention (`ServerDefault` drops it); the
    /// pruner applies it from its next pass.
    pub async fn set_retention(&self, tenant: &str, retention: TenantRetention) -> Result<()> {
        if !crate::auth::valid_tenant(tenant) {
            return Err(ServiceError::Invalid(format!(
                "invalid tenant {tenant:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        self.store.set_tenant_retention(tenant, retention).await?;
        Ok(())
    }
}
