//! Applying a threshold to a tenant (issue 44): an operator sets the
//! iteration limit a tenant's new sessions get when their create sets none,
//! and each change is logged with the policy replay that justified it, in
//! the same transaction as the change. The replay is the threshold report's
//! (the tenant's newest settled sessions) under the value applied; a return
//! to the server's default is replayed under that default.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::SessionService;
use super::replay::MAX_REPLAY_SESSIONS;
use crate::policy::guardrails::LimitsPatch;
use crate::policy::insights::{self, Justification};
use crate::session::error::{Result, ServiceError};
use crate::store::{self, Applied, NewThresholdChange, TenantScope, ThresholdChangeRow};

/// A threshold to apply to a tenant.
#[derive(Debug, Clone)]
pub struct ApplyThreshold {
    /// The tenant whose new sessions get it.
    pub tenant: String,
    /// The iteration limit (`None`: back to the server's default).
    pub max_iterations: Option<u64>,
    /// Why, in the operator's words (at most 500 characters).
    pub note: Option<String>,
    /// Who acts, as the event log names it (never a secret).
    pub applied_by: String,
}

/// One logged change of a tenant's threshold.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ThresholdChange {
    /// Its number in the log: a later change has a higher one.
    pub id: i64,
    /// The tenant.
    pub tenant: String,
    /// The threshold changed: `max_iterations`.
    pub threshold: String,
    /// The value before; null: the server's default.
    pub previous: Option<u64>,
    /// The value after; null: back to the server's default.
    pub value: Option<u64>,
    /// Who applied it: a key's public prefix, `admin-token` or `auth-off`.
    pub applied_by: String,
    /// When.
    pub applied_at: DateTime<Utc>,
    /// Why, in the operator's words.
    pub note: Option<String>,
    /// The replay that justified it.
    pub replay: Justification,
}

impl TryFrom<ThresholdChangeRow> for ThresholdChange {
    type Error = ServiceError;

    fn try_from(row: ThresholdChangeRow) -> Result<ThresholdChange> {
        let replay = serde_json::from_value(row.replay).map_err(|e| {
            ServiceError::Unavailable(format!(
                "threshold change {} has a justification this version cannot read: {e}",
                row.id
            ))
        })?;
        let count = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
        Ok(ThresholdChange {
            id: row.id,
            tenant: row.tenant,
            threshold: row.threshold,
            previous: count(row.previous_value),
            value: count(row.new_value),
            applied_by: row.applied_by,
            applied_at: row.applied_at,
            note: row.note,
            replay,
        })
    }
}

impl SessionService {
    /// Applies `change` to its tenant (within `scope`): checks it as a
    /// create's `limits.max_iterations`, replays the tenant's newest
    /// settled sessions under it, then sets it and logs it with that replay
    /// in one transaction. Sessions created already keep their limits.
    pub async fn apply_threshold(
        &self,
        scope: &TenantScope,
        change: ApplyThreshold,
    ) -> Result<ThresholdChange> {
        let tenant = change.tenant.as_str();
        if !crate::auth::valid_tenant(tenant) {
            return Err(ServiceError::Invalid(format!(
                "invalid tenant {tenant:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        let note = insights::change_note(change.note.as_deref()).map_err(ServiceError::Invalid)?;
        let defaults = self.config.defaults.limits_for(self.config.defaults.mode);
        let replayed_value = match change.max_iterations {
            Some(v) => {
                let patch = LimitsPatch {
                    max_iterations: Some(v),
                    ..LimitsPatch::default()
                };
                defaults
                    .apply(&patch)
                    .map_err(|e| ServiceError::Invalid(e.to_string()))?;
                v
            }
            None => defaults.max_iterations,
        };
        let justification = self.justify(scope, tenant, replayed_value).await?;
        let replay = event_json(&justification)?;
        let stored = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let applied = self
            .store
            .apply_tenant_max_iterations(
                scope,
                &NewThresholdChange {
                    tenant,
                    value: change.max_iterations.map(stored),
                    applied_by: &store::storable_text(&change.applied_by),
                    replay: &replay,
                    note: note.map(|n| store::storable_text(&n)).as_deref(),
                },
            )
            .await?;
        match applied {
            Applied::Changed(row) => ThresholdChange::try_from(row),
            Applied::Unchanged => Err(ServiceError::ThresholdUnchanged(format!(
                "tenant {tenant:?} has this max_iterations in force already ({}): nothing to change",
                change
                    .max_iterations
                    .map_or_else(|| "the server's default".to_string(), |v| v.to_string())
            ))),
            Applied::OutOfScope => Err(ServiceError::Missing(format!(
                "no tenant {tenant:?} for this key"
            ))),
        }
    }

    /// The replay of `tenant`'s newest settled sessions under
    /// `max_iterations`, as a change logs it.
    async fn justify(
        &self,
        scope: &TenantScope,
        tenant: &str,
        max_iterations: u64,
    ) -> Result<Justification> {
        let most = i64::try_from(MAX_REPLAY_SESSIONS).unwrap_or(i64::MAX);
        let ids = self.store.settled_session_ids(scope, tenant, most).await?;
        let selected = ids.len() as u64;
        let answer = self
            .replay_max_iterations(scope, ids, max_iterations)
            .await?;
        Ok(Justification::newest_settled(
            max_iterations,
            (MAX_REPLAY_SESSIONS as u64, selected),
            answer.totals,
        ))
    }

    /// `tenant`'s logged threshold changes (within `scope`), newest first:
    /// those numbered below `before` when given, at most `limit`.
    pub async fn threshold_changes(
        &self,
        scope: &TenantScope,
        tenant: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<ThresholdChange>> {
        self.store
            .threshold_changes(scope, tenant, before, limit)
            .await?
            .into_iter()
            .map(ThresholdChange::try_from)
            .collect()
    }
}

/// The justification as the log stores it.
fn event_json(justification: &Justification) -> Result<serde_json::Value> {
    serde_json::to_value(justification)
        .map_err(|e| ServiceError::Unavailable(format!("cannot log the justification: {e}")))
}
