//! Deleting an ended session with its whole history, then its workspace.

use uuid::Uuid;

use super::SessionService;
use crate::policy::lifecycle;
use crate::session::error::{Result, ServiceError};
use crate::store::{self, TenantScope};

impl SessionService {
    /// Deletes an ended session with its whole history, then its workspace.
    /// A workspace that cannot be removed now is left to the retention sweep
    /// (its session is gone, so the sweep removes it).
    #[tracing::instrument(skip(self))]
    pub async fn delete(&self, id: Uuid, scope: &TenantScope) -> Result<()> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_delete(session.status)?;
        store::delete_session(&mut tx, id, scope).await?;
        self.commit(tx, id).await?;
        self.remove_workspace(id).await;
        Ok(())
    }
}
