//! Notifications, the use cases: setting a tenant's or a session's target
//! (every URL vetted by the egress policy), the tenant's signing secret
//! (made on first need, answered once, rotatable), a session's deliveries,
//! and the background delivery of the outbox: due rows are taken, signed
//! per Standard Webhooks v1 over the exact stored bytes, sent, and retried
//! by `policy::notify`'s schedule.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT};
use uuid::Uuid;

use super::SessionService;
use crate::egress::EgressPolicy;
use crate::policy::notify::{self as policy, Answer, Format, Next, Subject};
use crate::secrets::{Keyring, Sealed};
use crate::session::{Result, ServiceError};
use crate::store::{DueNotification, NotificationRow, NotifyTarget, Settled, Store, TenantScope};

/// How often an idle replica looks for due notifications: a notification
/// leaves within this of its event's commit (well under a second).
pub const POLL_EVERY: Duration = Duration::from_millis(200);
/// Most notifications taken (and sent at once) per look.
pub const BATCH: i64 = 16;
/// How long one delivery may take: connect, send and the answer's head.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a taken notification is this replica's: longer than a send, so
/// a replica killed mid-send leaves it to another after this.
pub const LEASE: Duration = Duration::from_secs(60);
/// Longest error kept per attempt, characters.
const MAX_ERROR_CHARS: usize = 300;
/// Longest target URL accepted, bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// A tenant's signing secret in the clear, answered only when made or
/// rotated; its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(String);

impl SigningSecret {
    /// The secret text (`whsec_…`), for the one answer that shows it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

/// A target as set, with the tenant's signing secret when this call made it.
#[derive(Debug, Clone)]
pub struct TargetSet {
    /// The target.
    pub target: NotifyTarget,
    /// The tenant's new signing secret: only on the call that made it.
    pub secret: Option<SigningSecret>,
}

/// The name a tenant's signing secret is sealed under (authenticated with
/// it, so a sealed secret copied to another tenant does not open).
fn sealed_name(tenant: &str) -> String {
    format!("notify_signing_secret:{tenant}")
}

impl SessionService {
    fn keyring(&self) -> Result<Keyring> {
        self.config.keyring().ok_or_else(|| {
            ServiceError::Unavailable(
                "no secret key is configured (WARDEN_SECRET_KEY), so no signing secret can be kept"
                    .into(),
            )
        })
    }

    async fn vet_target(&self, url: &str) -> Result<()> {
        if url.len() > MAX_URL_BYTES {
            return Err(ServiceError::Invalid(format!(
                "url is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        self.config
            .egress
            .vet_url(url)
            .await
            .map_err(|e| ServiceError::EgressDenied(format!("url {e}")))
    }

    /// Makes the tenant's signing secret if it has none; the new secret
    /// when this call made it.
    async fn ensure_signing_secret(&self, tenant: &str) -> Result<Option<SigningSecret>> {
        if self.store.notify_secret(tenant).await?.is_some() {
            return Ok(None);
        }
        let (text, sealed) = self.new_secret(tenant)?;
        let made = self.store.insert_notify_secret(tenant, &sealed).await?;
        Ok(made.then_some(text))
    }

    fn new_secret(&self, tenant: &str) -> Result<(SigningSecret, Sealed)> {
        let mut random = [0u8; 32];
        getrandom::fill(&mut random)
            .map_err(|e| ServiceError::Unavailable(format!("no randomness for a secret: {e}")))?;
        let text = policy::secret_text(&random);
        let sealed = self
            .keyring()?
            .current()
            .seal(Uuid::nil(), &sealed_name(tenant), &text)?;
        Ok((SigningSecret(text), sealed))
    }

    /// Sets the tenant's target (vetted by the egress policy); answers the
    /// tenant's signing secret when this call made it.
    pub async fn set_tenant_target(
        &self,
        tenant: &str,
        url: &str,
        format: Format,
    ) -> Result<TargetSet> {
        self.vet_target(url).await?;
        let secret = self.ensure_signing_secret(tenant).await?;
        let target = self
            .store()
            .set_tenant_target(tenant, url, format.as_str())
            .await?;
        Ok(TargetSet { target, secret })
    }

    /// The tenant's target.
    pub async fn tenant_target(&self, tenant: &str) -> Result<Option<NotifyTarget>> {
        Ok(self.store.tenant_target(tenant).await?)
    }

    /// Removes the tenant's target; whether it had one.
    pub async fn delete_tenant_target(&self, tenant: &str) -> Result<bool> {
        Ok(self.store.delete_tenant_target(tenant).await?)
    }

    /// A new signing secret for the tenant; the previous one keeps signing
    /// for a day beside it.
    pub async fn rotate_signing_secret(&self, tenant: &str) -> Result<SigningSecret> {
        let (text, sealed) = self.new_secret(tenant)?;
        self.store.rotate_notify_secret(tenant, &sealed).await?;
        Ok(text)
    }

    /// Sets a session's own target; answers its tenant's signing secret
    /// when this call made it.
    pub async fn set_session_target(
        &self,
        id: Uuid,
        scope: &TenantScope,
        url: &str,
        format: Format,
    ) -> Result<TargetSet> {
        let session = self.get(id, scope).await?;
        self.vet_target(url).await?;
        let secret = self.ensure_signing_secret(&session.tenant).await?;
        let target = self
            .store()
            .set_session_target(id, scope, url, format.as_str())
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        Ok(TargetSet { target, secret })
    }

    /// A session's own target (`NotFound` when the session is not in `scope`).
    pub async fn session_target(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<NotifyTarget>> {
        self.get(id, scope).await?;
        Ok(self.store.session_target(id, scope).await?)
    }

    /// Removes a session's own target; whether it had one.
    pub async fn delete_session_target(&self, id: Uuid, scope: &TenantScope) -> Result<bool> {
        self.get(id, scope).await?;
        Ok(self.store.delete_session_target(id, scope).await?)
    }

    /// A session's deliveries, newest first.
    pub async fn notifications(
        &self,
        id: Uuid,
        scope: &TenantScope,
        limit: i64,
    ) -> Result<Vec<NotificationRow>> {
        self.get(id, scope).await?;
        Ok(self.store.session_notifications(id, scope, limit).await?)
    }

    /// The deliverer of this replica's notifications.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            store: self.store.clone(),
            egress: self.config.egress.clone(),
            keyring: self.config.keyring(),
        }
    }
}

/// Sends due notifications: owned by the application, one per replica.
#[derive(Clone)]
pub struct Notifier {
    store: Store,
    egress: Arc<EgressPolicy>,
    keyring: Option<Keyring>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notifier")
    }
}

/// Delivers notifications forever: a full batch looks again at once, a
/// short one waits [`POLL_EVERY`].
pub async fn deliver_forever(notifier: Notifier) {
    loop {
        let sent = notifier.deliver_due().await;
        if sent < BATCH as usize {
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
}

impl Notifier {
    /// Takes the due notifications (up to [`BATCH`]) and sends them at
    /// once; how many it took.
    pub async fn deliver_due(&self) -> usize {
        let due = match self
            .store
            .take_due_notifications(BATCH, LEASE.as_secs_f64())
            .await
        {
            Ok(due) => due,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read due notifications; the next look tries again");
                return 0;
            }
        };
        let taken = due.len();
        let mut sends = tokio::task::JoinSet::new();
        for row in due {
            let me = self.clone();
            sends.spawn(async move { me.deliver(row).await });
        }
        while sends.join_next().await.is_some() {}
        taken
    }

    async fn deliver(&self, row: DueNotification) {
        let id = row.id;
        let settled = match self.attempt(&row).await {
            Ok(answer) => settle(row.attempt, &answer, jitter()),
            Err(why) => settle_error(row.attempt, why, jitter()),
        };
        match &settled {
            Settled::Delivered(_) => {
                tracing::info!(notification = %id, session_id = %row.session_id, kind = %row.kind, "notification delivered")
            }
            Settled::Disabled => {
                tracing::warn!(notification = %id, target = row.target_id, "a receiver answered 410 Gone: its notify target is disabled")
            }
            Settled::Retry { error, .. } | Settled::Failed { error, .. } => {
                tracing::warn!(notification = %id, attempt = row.attempt, error = %error, "a notification was not delivered")
            }
        }
        if let Err(err) = self.store.settle_notification(id, &settled).await {
            tracing::warn!(notification = %id, error = %err, "cannot record a notification's attempt; it is tried again after its lease");
        }
    }

    /// One attempt: the stored bytes (made at the first), signed now, sent.
    async fn attempt(
        &self,
        row: &DueNotification,
    ) -> std::result::Result<(Answer, Option<String>), String> {
        let body = match &row.body {
            Some(body) => body.clone(),
            None => {
                let made = first_body(row);
                self.store
                    .keep_notification_body(row.id, &made)
                    .await
                    .map_err(|e| format!("cannot keep the body: {e}"))?
            }
        };
        let keys = self.signing_keys(&row.tenant).await?;
        let message_id = policy::message_id(row.id);
        let now = chrono::Utc::now().timestamp();
        let mut headers = HeaderMap::new();
        let header = |v: &str| HeaderValue::from_str(v).map_err(|_| "bad header".to_string());
        headers.insert("webhook-id", header(&message_id)?);
        headers.insert("webhook-timestamp", header(&now.to_string())?);
        headers.insert(
            "webhook-signature",
            header(&policy::signature_header(&keys, &message_id, now, &body))?,
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(USER_AGENT, HeaderValue::from_static("warden-notify"));
        let client = self
            .egress
            .client_for(&row.url, SEND_TIMEOUT)
            .map_err(|e| format!("url {e}"))?;
        let sent = client
            .post(&row.url)
            .headers(headers)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(res) => {
                let retry_after = res
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| policy::retry_after_seconds(v, now));
                let code = res.status().as_u16();
                // The answer's body is not read: nothing in it matters.
                drop(res);
                Ok((Answer::Status { code, retry_after }, None))
            }
            Err(e) => Ok((Answer::Transport, Some(crate::egress::transport_error(&e)))),
        }
    }

    /// The tenant's signing keys: the current secret, and the previous one
    /// while a rotation is fresh.
    async fn signing_keys(&self, tenant: &str) -> std::result::Result<Vec<Vec<u8>>, String> {
        let ring = self
            .keyring
            .as_ref()
            .ok_or("no secret key is configured to open the signing secret")?;
        let stored = self
            .store
            .notify_secret(tenant)
            .await
            .map_err(|e| format!("cannot read the signing secret: {e}"))?
            .ok_or("the tenant has no signing secret (set a target or rotate one)")?;
        let name = sealed_name(tenant);
        let mut keys = Vec::new();
        for sealed in std::iter::once(&stored.current).chain(stored.previous.as_ref()) {
            let text = ring
                .open(Uuid::nil(), &name, sealed)
                .map_err(|e| format!("the signing secret does not open: {e}"))?;
            keys.push(policy::secret_bytes(&text).ok_or("the signing secret is damaged")?);
        }
        Ok(keys)
    }
}

/// The body of a notification's first attempt, from its event.
fn first_body(row: &DueNotification) -> Vec<u8> {
    let data = row.data.clone().unwrap_or(serde_json::Value::Null);
    let at = row
        .logged_at
        .unwrap_or_else(chrono::Utc::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    policy::body(
        Format::parse(&row.format),
        &Subject {
            session_id: row.session_id,
            tenant: &row.tenant,
            goal: &row.goal,
            seq: row.seq,
            kind: &row.kind,
            data: &data,
            at: &at,
        },
    )
}

/// What is stored after an attempt that got an answer (or a transport error).
fn settle(attempt: i32, answer: &(Answer, Option<String>), random: f64) -> Settled {
    let (answer, transport) = answer;
    let status = match answer {
        Answer::Status { code, .. } => Some(i32::from(*code)),
        Answer::Transport => None,
    };
    let error = match (answer, transport) {
        (_, Some(why)) => crate::egress::sanitize(why, MAX_ERROR_CHARS),
        (Answer::Status { code, .. }, None) => format!("the receiver answered {code}"),
        (Answer::Transport, None) => "no answer".to_string(),
    };
    match policy::next_step(attempt.max(1) as u32, answer, random) {
        Next::Delivered => Settled::Delivered(status.unwrap_or(200)),
        Next::Disable => Settled::Disabled,
        Next::Retry(after) => Settled::Retry {
            after_secs: after.as_secs_f64(),
            status,
            error,
        },
        Next::GiveUp => Settled::Failed { status, error },
    }
}

/// What is stored after an attempt that could not be made (no secret, a
/// refused URL): retried as a failed attempt.
fn settle_error(attempt: i32, why: String, random: f64) -> Settled {
    settle(attempt, &(Answer::Transport, Some(why)), random)
}

/// A number in [0, 1) for the jitter; the middle when no randomness is at hand.
fn jitter() -> f64 {
    let mut bytes = [0u8; 4];
    match getrandom::fill(&mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_stored_as_their_policy_says() {
        let ok = (
            Answer::Status {
                code: 200,
                retry_after: None,
            },
            None,
        );
        assert_eq!(settle(1, &ok, 0.5), Settled::Delivered(200));
        let gone = (
            Answer::Status {
                code: 410,
                retry_after: None,
            },
            None,
        );
        assert_eq!(settle(1, &gone, 0.5), Settled::Disabled);
        let busy = (
            Answer::Status {
                code: 503,
                retry_after: None,
            },
            None,
        );
        assert_eq!(
            settle(1, &busy, 0.5),
            Settled::Retry {
                after_secs: 5.0,
                status: Some(503),
                error: "the receiver answered 503".into()
            }
        );
        let refused = settle_error(policy::MAX_ATTEMPTS as i32, "url refused".into(), 0.5);
        assert_eq!(
            refused,
            Settled::Failed {
                status: None,
                error: "url refused".into()
            }
        );
    }

    #[test]
    fn the_jitter_is_in_the_unit_interval() {
        for _ in 0..100 {
            let r = jitter();
            assert!((0.0..1.0).contains(&r), "{r}");
        }
    }

    #[test]
    fn a_signing_secret_never_prints() {
        let secret = SigningSecret("whsec_abc".into());
        assert_eq!(format!("{secret:?}"), "SigningSecret(<redacted>)");
        assert_eq!(secret.expose(), "whsec_abc");
    }
}
