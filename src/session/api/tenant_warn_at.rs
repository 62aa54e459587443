//! A tenant's own soft-budget thresholds: the `limits.warn_at` its sessions
//! get when their create does not set one.

use super::SessionService;
use crate::policy::soft_budget::{DEFAULT_THRESHOLDS, WarnAt};
use crate::session::error::{Result, ServiceError};

impl SessionService {
    /// The server's thresholds and the tenants with their own (`tenant`
    /// only, when given), by name.
    pub async fn warn_ats(
        &self,
        tenant: Option<&str>,
    ) -> Result<(Vec<u8>, Vec<(String, Vec<u8>)>)> {
        let tenants = self
            .store
            .tenant_warn_ats(tenant)
            .await?
            .into_iter()
            .map(|(name, percents)| {
                let percents = percents
                    .into_iter()
                    .filter_map(|p| u8::try_from(p).ok())
                    .collect();
                (name, percents)
            })
            .collect();
        Ok((DEFAULT_THRESHOLDS.to_vec(), tenants))
    }

    /// Sets a tenant's own thresholds (`None`: back to the server's);
    /// answers them sorted, as sessions will get them. Sessions created
    /// already keep theirs.
    pub async fn set_warn_at(&self, tenant: &str, warn_at: Option<&[u8]>) -> Result<Vec<u8>> {
        if !crate::auth::valid_tenant(tenant) {
            return Err(ServiceError::Invalid(format!(
                "invalid tenant {tenant:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        let Some(asked) = warn_at else {
            self.store.set_tenant_warn_at(tenant, None).await?;
            return Ok(DEFAULT_THRESHOLDS.to_vec());
        };
        let percents = WarnAt::new(asked)
            .map_err(|e| ServiceError::Invalid(format!("warn_at: {e}")))?
            .percents();
        let stored: Vec<i16> = percents.iter().map(|p| i16::from(*p)).collect();
        self.store.set_tenant_warn_at(tenant, Some(&stored)).await?;
        Ok(percents)
    }
}
