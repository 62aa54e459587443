//! API keys, roles and tenants: who may call what. Keys are random 256-bit
//! secrets shown once; only their SHA-256 and a short public prefix are
//! stored. Requests authenticate from an in-memory cache of key hashes, so
//! the status read costs no extra query. The cache is dropped whenever a key
//! changes anywhere (a trigger's NOTIFY on `warden_keys`, relayed by the
//! control listener; the in-process channel on embedded), and its entries
//! expire after [`KEY_CACHE_TTL`] in case a note is lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use utoipa::ToSchema;
use uuid::Uuid;

pub use crate::config::Secret;
use crate::store::{KeyRecord, NewKey, Store, StoreError, TenantScope};

/// Every key starts with this, so a leaked one is recognisable in a scan.
pub const KEY_PREFIX: &str = "wdn_";
/// How long a cached key is trusted before it is read again: the backstop
/// of the change notes, so a revocation made anywhere takes effect within
/// this time even when its note is lost.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(1);
/// `last_used_at` is written at most this often per key.
pub const LAST_USED_INTERVAL: Duration = Duration::from_secs(60);
/// The tenant of sessions created without a key (auth off, or from before keys).
pub const DEFAULT_TENANT: &str = "default";

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Keys and sessions: of every tenant and `/metrics` when global, of
    /// its own tenant only when bound to one (a tenant admin).
    Admin,
    /// Create and control its tenant's sessions.
    Operator,
    /// Read its tenant's sessions and streams.
    Viewer,
    /// Claim and run the steps of its tenant's sessions on its queues
    /// (`/api/workers/…` only).
    Worker,
}

impl Role {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Viewer => "viewer",
            Role::Worker => "worker",
        }
    }

    /// Parses a stored or command-line name.
    pub fn parse(raw: &str) -> Option<Role> {
        match raw {
            "admin" => Some(Role::Admin),
            "operator" => Some(Role::Operator),
            "viewer" => Some(Role::Viewer),
            "worker" => Some(Role::Worker),
            _ => None,
        }
    }

    /// Whether this role may change state (create, control).
    pub fn can_write(self) -> bool {
        matches!(self, Role::Admin | Role::Operator)
    }
}

/// Longest tenant name.
pub const MAX_TENANT_CHARS: usize = 64;
/// Tenant names in the API document's terms: what [`valid_tenant`] accepts.
pub const TENANT_PATTERN: &str = "^[A-Za-z0-9._-]+$";
/// Longest key label, in characters.
pub const MAX_KEY_NAME_CHARS: usize = 64;

/// The pattern of an acceptable key label, as the document states it: empty
/// (no label), or no control or invisible formatting character and one that
/// is not a space.
pub const KEY_NAME_PATTERN: &str = "^$|^[^\\u0000-\\u001F\\u007F-\\u009F\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u206F\\uFEFF]*[^\\s\\u0000-\\u001F\\u007F-\\u009F\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u206F\\uFEFF][^\\u0000-\\u001F\\u007F-\\u009F\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u206F\\uFEFF]*$";

/// Whether a key label is acceptable: 1 to 64 printable characters (no
/// control characters, no invisible formatting such as bidi overrides or
/// zero-width spaces), not only spaces.
pub fn valid_key_name(name: &str) -> bool {
    let invisible = |c: char| {
        c.is_control()
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}')
    };
    (1..=MAX_KEY_NAME_CHARS).contains(&name.chars().count())
        && !name.trim().is_empty()
        && !name.chars().any(invisible)
}

/// Why a first key made without authentication (protected mode) is refused,
/// or `None` when it is acceptable: it must be a global admin key, or no one
/// could manage keys once authentication is on.
pub fn bootstrap_refusal(role: Role, global: bool) -> Option<&'static str> {
    (role != Role::Admin || !global).then_some(
        "no key exists yet, so the first key must be a global admin key \
(\"role\": \"admin\", \"global\": true): once it exists every request needs a key, \
and only an admin can make more",
    )
}

/// Whether a tenant name is acceptable: short, and safe to show and log.
pub fn valid_tenant(tenant: &str) -> bool {
    (1..=MAX_TENANT_CHARS).contains(&tenant.len())
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The caller of a request, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Its role.
    pub role: Role,
    /// The tenant it acts for (an admin may name another with `?tenant=`).
    pub tenant: String,
    /// Who acted, for the event log: a key's public prefix, never its secret.
    pub actor: String,
    /// The sessions this request may reach: one tenant's, or every tenant's.
    pub scope: TenantScope,
    /// Whether it acts for every tenant (auth off, the admin token, a global
    /// admin key) rather than for `tenant` only.
    pub global: bool,
    /// The queues a worker key may claim from (empty for other roles).
    pub queues: Vec<String>,
}

impl Principal {
    /// Everything allowed: auth is off.
    pub fn unrestricted(tenant: Option<String>) -> Principal {
        Principal {
            role: Role::Admin,
            tenant: tenant.clone().unwrap_or_else(|| DEFAULT_TENANT.into()),
            actor: "auth-off".into(),
            scope: tenant.map_or(TenantScope::Global, TenantScope::Tenant),
            global: true,
            queues: Vec::new(),
        }
    }

    /// The tenant a session created by this caller belongs to, refused
    /// when its name is not acceptable (see [`valid_tenant`]).
    pub fn create_tenant(&self) -> Result<&str, AuthError> {
        let tenant = self.scope.tenant().unwrap_or(&self.tenant);
        if !valid_tenant(tenant) {
            return Err(AuthError::InvalidTenant(tenant.to_string()));
        }
        Ok(tenant)
    }
}

/// A new key, with the secret that is shown this once.
#[derive(Debug, Clone)]
pub struct IssuedKey {
    /// The stored record.
    pub record: KeyRecord,
    /// The whole key: `wdn_<prefix>_<secret>`.
    pub secret: Secret,
}

/// Why a key could not be issued or checked.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The OS random source failed.
    #[error("no randomness for a new key: {0}")]
    Random(String),
    /// The tenant name is not acceptable.
    #[error("invalid tenant {0:?}: 1 to 64 letters, digits, '-', '_' or '.'")]
    InvalidTenant(String),
    /// The key label is not acceptable.
    #[error("name: 1 to 64 printable characters (no control or invisible characters)")]
    InvalidName,
    /// Only an admin key may be global.
    #[error("global: only an admin key may be global")]
    GlobalNotAdmin,
    /// A worker key needs queues, and only a worker key may have them.
    #[error("queues: {0}")]
    InvalidQueues(&'static str),
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// SHA-256 of a key, the only form in which it is kept.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The public prefix of a well-formed key (`wdn_` and 8 hex digits), or
/// `None` when `key` is not shaped like a Warden key.
pub fn key_prefix(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    let (public, secret) = rest.split_once('_')?;
    let hex_ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex_ok(public, 8) && hex_ok(secret, 64)).then(|| &key[..KEY_PREFIX.len() + 8])
}

/// Makes a fresh key: 32 random bits of public prefix, 256 of secret.
pub fn generate_key() -> Result<Secret, AuthError> {
    let mut bytes = [0u8; 36];
    getrandom::fill(&mut bytes).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(Secret::new(format!(
        "{KEY_PREFIX}{}_{}",
        hex(&bytes[..4]),
        hex(&bytes[4..])
    )))
}

/// Whether authentication is enforced, and why not when it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Keys are required (an admin token is set or keys exist).
    On,
    /// No admin token and no keys: served on loopback only, everything open.
    Protected,
    /// `WARDEN_AUTH=off`: everything open, as the operator asked.
    Off,
}

#[derive(Debug, Clone)]
struct CachedKey {
    /// `None`: no such key (so a made-up prefix is not read on every request).
    key: Option<KeyRecord>,
    fetched: Instant,
}

struct Inner {
    store: Store,
    admin_hash: Option<[u8; 32]>,
    metrics_hash: Option<[u8; 32]>,
    forced_off: bool,
    any_keys: AtomicBool,
    keys: Mutex<HashMap<String, CachedKey>>,
    used: Mutex<HashMap<Uuid, Instant>>,
}

/// Checks keys and says who the caller is.
#[derive(Clone)]
pub struct Authenticator(Arc<Inner>);

impl Authenticator {
    /// An authenticator over `store`; `admin_token` and `metrics_token` come
    /// from the environment, `forced_off` is `WARDEN_AUTH=off`.
    pub async fn new(
        store: Store,
        admin_token: Option<&Secret>,
        metrics_token: Option<&Secret>,
        forced_off: bool,
    ) -> Result<Authenticator, AuthError> {
        // Subscribed before the first read, so no change falls in between.
        let changes = store.key_changes();
        let any_keys = store.any_active_key().await?;
        let auth = Authenticator(Arc::new(Inner {
            store,
            admin_hash: admin_token.map(|t| hash_key(t.expose())),
            metrics_hash: metrics_token.map(|t| hash_key(t.expose())),
            forced_off,
            any_keys: AtomicBool::new(any_keys),
            keys: Mutex::new(HashMap::new()),
            used: Mutex::new(HashMap::new()),
        }));
        tokio::spawn(watch_keys(Arc::downgrade(&auth.0), changes));
        Ok(auth)
    }

    /// Forgets every cached key, and learns whether keys now exist (a key
    /// made by `warden keys` or another replica ends protected mode here).
    async fn keys_changed(&self) {
        if let Ok(mut keys) = self.0.keys.lock() {
            keys.clear();
        }
        self.refresh_any_keys().await;
    }

    /// Reads whether keys exist while none did: protected mode ends when one
    /// appears. Never the other way at run time (a replica whose keys were
    /// all revoked keeps requiring keys until it restarts: it fails closed).
    async fn refresh_any_keys(&self) {
        if self.0.any_keys.load(Ordering::Relaxed) {
            return;
        }
        match self.0.store.any_active_key().await {
            Ok(true) => self.0.any_keys.store(true, Ordering::Relaxed),
            Ok(false) => {}
            Err(err) => tracing::warn!(error = %err, "cannot check whether API keys exist"),
        }
    }

    /// Whether keys are required right now.
    pub fn mode(&self) -> AuthMode {
        if self.0.forced_off {
            AuthMode::Off
        } else if self.0.admin_hash.is_some() || self.0.any_keys.load(Ordering::Relaxed) {
            AuthMode::On
        } else {
            AuthMode::Protected
        }
    }

    /// Whether `token` is the metrics token.
    pub fn is_metrics_token(&self, token: &str) -> bool {
        self.0
            .metrics_hash
            .is_some_and(|h| bool::from(h.ct_eq(&hash_key(token))))
    }

    /// The principal `token` authenticates, or `None` (unknown, malformed
    /// or revoked: the caller cannot tell which).
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>, AuthError> {
        let presented = hash_key(token);
        if self
            .0
            .admin_hash
            .is_some_and(|h| bool::from(h.ct_eq(&presented)))
        {
            return Ok(Some(Principal {
                role: Role::Admin,
                tenant: DEFAULT_TENANT.into(),
                actor: "admin-token".into(),
                scope: TenantScope::Global,
                global: true,
                queues: Vec::new(),
            }));
        }
        let Some(prefix) = key_prefix(token) else {
            return Ok(None);
        };
        let Some(key) = self.cached_key(prefix).await? else {
            return Ok(None);
        };
        if key.revoked_at.is_some() || !bool::from(key.hash.as_slice().ct_eq(&presented)) {
            return Ok(None);
        }
        let Some(role) = Role::parse(&key.role) else {
            tracing::error!(key = %key.prefix, role = %key.role, "stored key has an unknown role");
            return Ok(None);
        };
        self.note_use(key.id);
        Ok(Some(Principal {
            role,
            tenant: key.tenant.clone(),
            actor: key.prefix.clone(),
            scope: if key.global && role == Role::Admin {
                TenantScope::Global
            } else {
                TenantScope::tenant_only(&key.tenant)
            },
            global: key.global && role == Role::Admin,
            queues: key.queues.clone(),
        }))
    }

    async fn cached_key(&self, prefix: &str) -> Result<Option<KeyRecord>, AuthError> {
        if let Ok(keys) = self.0.keys.lock()
            && let Some(hit) = keys.get(prefix)
            && hit.fetched.elapsed() < KEY_CACHE_TTL
        {
            return Ok(hit.key.clone());
        }
        let key = self.0.store.key_by_prefix(prefix).await?;
        if let Ok(mut keys) = self.0.keys.lock() {
            // Bounded: made-up prefixes must not grow it without end.
            if keys.len() > 10_000 {
                keys.retain(|_, v| v.fetched.elapsed() < KEY_CACHE_TTL);
            }
            keys.insert(
                prefix.to_string(),
                CachedKey {
                    key: key.clone(),
                    fetched: Instant::now(),
                },
            );
        }
        Ok(key)
    }

    /// Writes `last_used_at` in the background, at most once a minute per key.
    fn note_use(&self, id: Uuid) {
        let due = match self.0.used.lock() {
            Ok(mut used) => {
                let due = used
                    .get(&id)
                    .is_none_or(|at| at.elapsed() >= LAST_USED_INTERVAL);
                if due {
                    used.insert(id, Instant::now());
                }
                due
            }
            Err(_) => false,
        };
        if due {
            let store = self.0.store.clone();
            tokio::spawn(async move {
                if let Err(err) = store.touch_key(id).await {
                    tracing::warn!(error = %err, "could not record a key's last use");
                }
            });
        }
    }

    /// Whether no key exists yet, as far as this replica knows (read
    /// afresh while it believes so).
    pub async fn no_keys_yet(&self) -> Result<bool, AuthError> {
        if self.0.any_keys.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let any = self.0.store.any_active_key().await?;
        if any {
            self.0.any_keys.store(true, Ordering::Relaxed);
        }
        Ok(!any)
    }

    /// Creates a key; its secret is in the answer and nowhere else.
    pub async fn issue(&self, new: &KeySpec<'_>) -> Result<IssuedKey, AuthError> {
        let issued = issue_key(&self.0.store, new).await?;
        self.0.any_keys.store(true, Ordering::Relaxed);
        Ok(issued)
    }

    /// Revokes a key within `scope` (a tenant's: its non-global keys only);
    /// effective at once on this replica, within [`KEY_CACHE_TTL`] (usually
    /// milliseconds) on the others.
    pub async fn revoke(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<Option<KeyRecord>, AuthError> {
        let key = self.0.store.revoke_key(id, scope).await?;
        if let (Some(k), Ok(mut keys)) = (&key, self.0.keys.lock()) {
            keys.remove(&k.prefix);
        }
        Ok(key)
    }

    /// The stored keys within `scope` (hashes included; callers show only
    /// public fields).
    pub async fn list(&self, scope: &TenantScope) -> Result<Vec<KeyRecord>, AuthError> {
        Ok(self.0.store.list_keys(scope).await?)
    }
}

/// Keeps the key cache in step with every change note until the
/// authenticator is dropped; polls whether keys exist while none do.
async fn watch_keys(
    inner: std::sync::Weak<Inner>,
    mut changes: tokio::sync::broadcast::Receiver<()>,
) {
    let mut tick = tokio::time::interval(KEY_CACHE_TTL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = tokio::select! {
            note = changes.recv() => match note {
                // Lagged: some notes were missed, which is a change too.
                Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => false,
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let auth = Authenticator(inner);
        if changed {
            auth.keys_changed().await;
        } else {
            auth.refresh_any_keys().await;
        }
    }
}

/// A key to make.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec<'a> {
    /// Tenant it acts for.
    pub tenant: &'a str,
    /// Role.
    pub role: Role,
    /// An admin key of every tenant (only for [`Role::Admin`]).
    pub global: bool,
    /// Optional label.
    pub name: Option<&'a str>,
    /// The queues of a worker key (none for other roles).
    pub queues: &'a [String],
}

/// Most queues one worker key may name.
pub const MAX_KEY_QUEUES: usize = 32;

/// Creates and stores a key (for the API and the `warden keys` command).
pub async fn issue_key(store: &Store, new: &KeySpec<'_>) -> Result<IssuedKey, AuthError> {
    let KeySpec {
        tenant,
        role,
        global,
        name,
        queues,
    } = *new;
    if !valid_tenant(tenant) {
        return Err(AuthError::InvalidTenant(tenant.to_string()));
    }
    // An empty label is no label.
    let name = name.filter(|n| !n.is_empty());
    if name.is_some_and(|n| !valid_key_name(n)) {
        return Err(AuthError::InvalidName);
    }
    if global && role != Role::Admin {
        return Err(AuthError::GlobalNotAdmin);
    }
    match (role, queues.is_empty()) {
        (Role::Worker, true) => {
            return Err(AuthError::InvalidQueues(
                "a worker key needs at least one queue",
            ));
        }
        (Role::Worker, false) => {
            if queues.len() > MAX_KEY_QUEUES
                || !queues.iter().all(|q| crate::policy::worker::valid_queue(q))
            {
                return Err(AuthError::InvalidQueues(
                    "at most 32 queues, each 1 to 64 letters, digits, '-', '_' or '.'",
                ));
            }
        }
        (_, false) => {
            return Err(AuthError::InvalidQueues("only a worker key has queues"));
        }
        (_, true) => {}
    }
    let mut queues = queues.to_vec();
    queues.sort();
    queues.dedup();
    let secret = generate_key()?;
    let prefix = key_prefix(secret.expose())
        .ok_or_else(|| AuthError::Random("generated key is malformed".into()))?;
    let record = store
        .insert_key(&NewKey {
            id: Uuid::new_v4(),
            prefix,
            hash: &hash_key(secret.expose()),
            tenant,
            role: role.as_str(),
            global,
            name,
            queues: &queues,
        })
        .await?;
    Ok(IssuedKey { record, secret })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate_key().unwrap();
        let b = generate_key().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 4 + 8 + 1 + 64);
        assert_eq!(key_prefix(a.expose()), Some(&a.expose()[..12]));
        assert!(!format!("{a:?}").contains(a.expose()));
    }

    #[test]
    fn malformed_keys_have_no_prefix() {
        for bad in [
            "",
            "wdn_",
            "wdn_abcd1234",
            "wdn_abcd1234_",
            "xyz_abcd1234_0000000000000000000000000000000000000000000000000000000000000000",
            "wdn_abcd123g_0000000000000000000000000000000000000000000000000000000000000000",
            "wdn_abcd1234_000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert_eq!(key_prefix(bad), None, "{bad}");
        }
    }

    #[test]
    fn roles_parse_and_gate_writes() {
        for r in [Role::Admin, Role::Operator, Role::Viewer] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("root"), None);
        assert!(Role::Operator.can_write());
        assert!(!Role::Viewer.can_write());
    }

    #[test]
    fn key_names_are_short_and_printable() {
        for good in [
            "ci",
            "deploy bot",
            "clé de Zoë",
            &"x".repeat(64),
            "a-b_c.d/e:1",
        ] {
            assert!(valid_key_name(good), "{good:?}");
        }
        for bad in [
            "",
            " ",
            &"x".repeat(65),
            "tab\there",
            "new\nline",
            "nul\0",
            "bell\u{7}",
            "rtl\u{202E}gnp.exe",
            "zero\u{200B}width",
            "bom\u{FEFF}",
        ] {
            assert!(!valid_key_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_a_global_admin_may_be_the_first_key() {
        assert_eq!(bootstrap_refusal(Role::Admin, true), None);
        assert!(bootstrap_refusal(Role::Admin, false).is_some());
        assert!(bootstrap_refusal(Role::Operator, false).is_some());
        assert!(bootstrap_refusal(Role::Viewer, false).is_some());
        assert!(bootstrap_refusal(Role::Viewer, true).is_some());
    }

    #[test]
    fn tenants_are_checked() {
        assert!(valid_tenant("acme-1.prod_eu"));
        for bad in ["", "a b", "x/y", &"a".repeat(65)] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }
}
