//! Notifications: the targets of a tenant and of a session, the tenant's
//! sealed signing secret, and the outbox the trigger `warden_notify_event`
//! fills in the transaction that logs an event (migration 0029). Replicas
//! take due rows with `FOR UPDATE SKIP LOCKED` and move them a lease ahead,
//! so two never send the same row at once and a killed one's row is taken
//! again when its lease runs out.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{Result, Store, TenantScope};
use crate::secrets::Sealed;

/// A place notifications go: a tenant's, or one session's.
#[derive(Clone, PartialEq)]
pub struct NotifyTarget {
    /// Its id.
    pub id: i64,
    /// The tenant.
    pub tenant: String,
    /// The session, for a session's own target.
    pub session_id: Option<Uuid>,
    /// Where to send (may hold a receiver's secret: never logged whole).
    pub url: String,
    /// `standard` or `slack`.
    pub format: String,
    /// When a 410 Gone disabled it.
    pub disabled_at: Option<DateTime<Utc>>,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
}

impl std::fmt::Debug for NotifyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NotifyTarget({}, {}, <url>)", self.id, self.tenant)
    }
}

/// A tenant's signing secret, sealed, and the previous one while a
/// rotation is fresh (a day).
#[derive(Debug, Clone)]
pub struct StoredNotifySecret {
    /// The current secret.
    pub current: Sealed,
    /// The previous secret, within a day of a rotation.
    pub previous: Option<Sealed>,
}

/// A notification taken for delivery, with what its body is made from.
#[derive(Clone)]
pub struct DueNotification {
    /// Its id (the `webhook-id`).
    pub id: Uuid,
    /// The session's tenant.
    pub tenant: String,
    /// The session.
    pub session_id: Uuid,
    /// The event's place in the log.
    pub seq: i64,
    /// The event's kind.
    pub kind: String,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
    /// The bytes of earlier attempts; absent before the first.
    pub body: Option<Vec<u8>>,
    /// The target's URL.
    pub url: String,
    /// The target's format.
    pub format: String,
    /// The target.
    pub target_id: i64,
    /// The session's goal.
    pub goal: String,
    /// The event's data (absent when the log no longer has it).
    pub data: Option<Value>,
    /// When the event was logged.
    pub logged_at: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for DueNotification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DueNotification({}, attempt {})", self.id, self.attempt)
    }
}

/// One delivery of a session's notification, as the API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct NotificationRow {
    /// Its id (`webhook-id` is `msg_` and its simple form).
    pub id: Uuid,
    /// The event's place in the log.
    pub seq: i64,
    /// The event's kind.
    pub kind: String,
    /// Whose target: `session` or `tenant`.
    pub target: String,
    /// The target's URL.
    pub url: String,
    /// `pending`, `delivered`, `failed` or `disabled`.
    pub status: String,
    /// Attempts made.
    pub attempts: i32,
    /// The last attempt's HTTP status.
    pub last_status: Option<i32>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it is tried next (pending only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
}

/// How an attempt ended, as stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// Delivered with this status.
    Delivered(i32),
    /// Tried again after this many seconds.
    Retry {
        /// Seconds until the next attempt.
        after_secs: f64,
        /// The status, when the receiver answered.
        status: Option<i32>,
        /// What went wrong.
        error: String,
    },
    /// Given up after the last attempt.
    Failed {
        /// The status, when the receiver answered.
        status: Option<i32>,
        /// What went wrong.
        error: String,
    },
    /// The receiver answered 410: the target and its pending rows are disabled.
    Disabled,
}

impl Store {
    /// Sets the tenant's target (enabling it again when it was disabled).
    pub async fn set_tenant_target(
        &self,
        tenant: &str,
        url: &str,
        format: &str,
    ) -> Result<NotifyTarget> {
        let row = sqlx::query_as!(
            NotifyTarget,
            "INSERT INTO notify_targets (tenant, url, format) VALUES ($1, $2, $3)
             ON CONFLICT (tenant) WHERE session_id IS NULL DO UPDATE
                SET url = EXCLUDED.url, format = EXCLUDED.format, disabled_at = NULL,
                    disabled_reason = NULL, updated_at = now()
             RETURNING id, tenant, session_id, url, format, disabled_at, disabled_reason",
            tenant,
            url,
            format,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row)
    }

    /// The tenant's target, if it has one.
    pub async fn tenant_target(&self, tenant: &str) -> Result<Option<NotifyTarget>> {
        let row = sqlx::query_as!(
            NotifyTarget,
            "SELECT id, tenant, session_id, url, format, disabled_at, disabled_reason
             FROM notify_targets WHERE tenant = $1 AND session_id IS NULL",
            tenant,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// Removes the tenant's target (and its pending notifications); whether it had one.
    pub async fn delete_tenant_target(&self, tenant: &str) -> Result<bool> {
        let done = sqlx::query!(
            "DELETE FROM notify_targets WHERE tenant = $1 AND session_id IS NULL",
            tenant
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets a session's own target; `None` when the session is not in `scope`.
    pub async fn set_session_target(
        &self,
        id: Uuid,
        scope: &TenantScope,
        url: &str,
        format: &str,
    ) -> Result<Option<NotifyTarget>> {
        let row = sqlx::query_as!(
            NotifyTarget,
            "INSERT INTO notify_targets (tenant, session_id, url, format)
             SELECT s.tenant, s.id, $3, $4 FROM sessions s
              WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)
             ON CONFLICT (session_id) WHERE session_id IS NOT NULL DO UPDATE
                SET url = EXCLUDED.url, format = EXCLUDED.format, disabled_at = NULL,
                    disabled_reason = NULL, updated_at = now()
             RETURNING id, tenant, session_id, url, format, disabled_at, disabled_reason",
            id,
            scope.tenant(),
            url,
            format,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// A session's own target, if it has one and is in `scope`.
    pub async fn session_target(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<NotifyTarget>> {
        let row = sqlx::query_as!(
            NotifyTarget,
            "SELECT t.id, t.tenant, t.session_id, t.url, t.format, t.disabled_at, t.disabled_reason
             FROM notify_targets t JOIN sessions s ON s.id = t.session_id
             WHERE t.session_id = $1 AND ($2::text IS NULL OR s.tenant = $2)",
            id,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// Removes a session's own target; whether it had one in `scope`.
    pub async fn delete_session_target(&self, id: Uuid, scope: &TenantScope) -> Result<bool> {
        let done = sqlx::query!(
            "DELETE FROM notify_targets t USING sessions s
             WHERE t.session_id = $1 AND s.id = t.session_id AND ($2::text IS NULL OR s.tenant = $2)",
            id,
            scope.tenant(),
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The tenant's signing secret, sealed; the previous one only within a
    /// day of a rotation.
    pub async fn notify_secret(&self, tenant: &str) -> Result<Option<StoredNotifySecret>> {
        let row = sqlx::query!(
            r#"SELECT key_id, nonce, ciphertext, previous_key_id, previous_nonce, previous_ciphertext,
                      coalesce(rotated_at > now() - interval '1 day', false) AS "fresh!"
               FROM notify_secrets WHERE tenant = $1"#,
            tenant,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            let previous = match (
                r.fresh,
                r.previous_key_id,
                r.previous_nonce,
                r.previous_ciphertext,
            ) {
                (true, Some(key_id), Some(nonce), Some(ciphertext)) => Some(Sealed {
                    key_id,
                    nonce,
                    ciphertext,
                }),
                _ => None,
            };
            StoredNotifySecret {
                current: Sealed {
                    key_id: r.key_id,
                    nonce: r.nonce,
                    ciphertext: r.ciphertext,
                },
                previous,
            }
        }))
    }

    /// Stores the tenant's first signing secret; false when it has one
    /// already (another request made it first: that one stands).
    pub async fn insert_notify_secret(&self, tenant: &str, sealed: &Sealed) -> Result<bool> {
        let done = sqlx::query!(
            "INSERT INTO notify_secrets (tenant, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4)
             ON CONFLICT (tenant) DO NOTHING",
            tenant,
            &sealed.key_id,
            &sealed.nonce,
            &sealed.ciphertext,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Replaces the tenant's signing secret, keeping the current one as the
    /// previous (it signs too for a day).
    pub async fn rotate_notify_secret(&self, tenant: &str, sealed: &Sealed) -> Result<()> {
        sqlx::query!(
            "INSERT INTO notify_secrets (tenant, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4)
             ON CONFLICT (tenant) DO UPDATE
                SET previous_key_id = notify_secrets.key_id, previous_nonce = notify_secrets.nonce,
                    previous_ciphertext = notify_secrets.ciphertext, rotated_at = now(),
                    key_id = EXCLUDED.key_id, nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext",
            tenant,
            &sealed.key_id,
            &sealed.nonce,
            &sealed.ciphertext,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Takes up to `limit` due notifications of every tenant (this replica's
    /// own work) and moves each `lease_secs` ahead, counting the attempt.
    pub async fn take_due_notifications(
        &self,
        limit: i64,
        lease_secs: f64,
    ) -> Result<Vec<DueNotification>> {
        let rows = sqlx::query_as!(
            DueNotification,
            r#"WITH due AS (
                   SELECT id FROM notifications
                    WHERE status = 'pending' AND next_attempt_at <= now()
                    ORDER BY next_attempt_at LIMIT $1
                    FOR UPDATE SKIP LOCKED),
               taken AS (
                   UPDATE notifications n
                      SET attempts = n.attempts + 1,
                          next_attempt_at = now() + make_interval(secs => $2)
                     FROM due WHERE n.id = due.id
                   RETURNING n.id, n.tenant, n.session_id, n.seq, n.kind, n.target_id, n.body, n.attempts)
               SELECT t.id AS "id!", t.tenant AS "tenant!", t.session_id AS "session_id!",
                      t.seq AS "seq!", t.kind AS "kind!", t.attempts AS "attempt!", t.body,
                      g.url, g.format, g.id AS target_id, s.goal, e.data AS "data?",
                      e.created_at AS "logged_at?"
                 FROM taken t
                 JOIN notify_targets g ON g.id = t.target_id
                 JOIN sessions s ON s.id = t.session_id
                 LEFT JOIN events e ON e.session_id = t.session_id AND e.seq = t.seq"#,
            limit,
            lease_secs,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Keeps the exact bytes of a notification's first attempt, which every
    /// retry sends and signs again; the bytes already kept win.
    pub async fn keep_notification_body(&self, id: Uuid, body: &[u8]) -> Result<Vec<u8>> {
        let kept = sqlx::query_scalar!(
            r#"UPDATE notifications SET body = coalesce(body, $2) WHERE id = $1 RETURNING body AS "body!""#,
            id,
            body,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(kept.unwrap_or_else(|| body.to_vec()))
    }

    /// Records how an attempt ended.
    pub async fn settle_notification(&self, id: Uuid, settled: &Settled) -> Result<()> {
        match settled {
            Settled::Delivered(status) => {
                sqlx::query!(
                    "UPDATE notifications SET status = 'delivered', delivered_at = now(),
                        last_status = $2, last_error = NULL WHERE id = $1",
                    id,
                    status,
                )
                .execute(&self.pool)
                .await?;
            }
            Settled::Retry {
                after_secs,
                status,
                error,
            } => {
                sqlx::query!(
                    "UPDATE notifications SET next_attempt_at = now() + make_interval(secs => $2),
                        last_status = $3, last_error = $4 WHERE id = $1 AND status = 'pending'",
                    id,
                    after_secs,
                    *status,
                    error,
                )
                .execute(&self.pool)
                .await?;
            }
            Settled::Failed { status, error } => {
                sqlx::query!(
                    "UPDATE notifications SET status = 'failed', last_status = $2, last_error = $3
                     WHERE id = $1",
                    id,
                    *status,
                    error,
                )
                .execute(&self.pool)
                .await?;
            }
            Settled::Disabled => self.disable_target_of(id).await?,
        }
        Ok(())
    }

    /// A receiver answered 410 Gone: its target is disabled and every
    /// pending notification to it is given up, in one statement.
    async fn disable_target_of(&self, id: Uuid) -> Result<()> {
        sqlx::query!(
            "WITH target AS (
                 UPDATE notify_targets t
                    SET disabled_at = now(), disabled_reason = 'the receiver answered 410 Gone'
                   FROM notifications n WHERE n.id = $1 AND t.id = n.target_id
                 RETURNING t.id)
             UPDATE notifications n
                SET status = 'disabled', last_status = CASE WHEN n.id = $1 THEN 410 ELSE n.last_status END,
                    last_error = 'the target was disabled: the receiver answered 410 Gone'
               FROM target WHERE n.target_id = target.id AND (n.status = 'pending' OR n.id = $1)",
            id,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A session's notifications in `scope`, newest first, at most `limit`.
    pub async fn session_notifications(
        &self,
        id: Uuid,
        scope: &TenantScope,
        limit: i64,
    ) -> Result<Vec<NotificationRow>> {
        let rows = sqlx::query_as!(
            NotificationRow,
            r#"SELECT n.id, n.seq, n.kind,
                      CASE WHEN t.session_id IS NULL THEN 'tenant' ELSE 'session' END AS "target!",
                      t.url, n.status, n.attempts, n.last_status, n.last_error,
                      CASE WHEN n.status = 'pending' THEN n.next_attempt_at END AS next_attempt_at,
                      n.created_at, n.delivered_at
                 FROM notifications n
                 JOIN sessions s ON s.id = n.session_id
                 JOIN notify_targets t ON t.id = n.target_id
                WHERE n.session_id = $1 AND ($2::text IS NULL OR s.tenant = $2)
                ORDER BY n.created_at DESC, n.id DESC
                LIMIT $3"#,
            id,
            scope.tenant(),
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}
