//! Configuration from the environment, read through the settings table
//! (`settings`): every variable has its default and meaning there; a bad
//! value stops start-up with a message naming the variable.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::egress::EgressPolicy;
use crate::llm::LlmSettings;
use crate::policy::capabilities::{self, Capabilities};
use crate::policy::gate::GateConfig;
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::Mode;
use crate::policy::pricing::PriceTable;
use crate::policy::stuck::StuckConfig;
use crate::secrets::{Keyring, SecretKey};
use crate::telemetry::{Protocol, TelemetryConfig};

pub mod settings;

use settings::*;

/// A configuration value that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The variable is set but does not parse or is out of range.
    #[error("invalid value {value:?} for {var}: {expected}")]
    Invalid {
        /// Variable name.
        var: &'static str,
        /// The value found.
        value: String,
        /// What was expected instead.
        expected: String,
    },
    /// A required variable is missing.
    #[error("{var} must be set: {why}")]
    Missing {
        /// Variable name.
        var: &'static str,
        /// Why it is needed.
        why: &'static str,
    },
}

/// A secret string whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for the one place that must send or show it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Who may call the API: see `crate::auth`.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// `WARDEN_ADMIN_TOKEN`: an admin key from the environment.
    pub admin_token: Option<Secret>,
    /// `WARDEN_METRICS_TOKEN`: a token that may read `/metrics` only.
    pub metrics_token: Option<Secret>,
    /// `WARDEN_AUTH=off`: no keys required, on any address (warned at start).
    pub off: bool,
}

/// Defaults a new session gets when its create request leaves them out.
#[derive(Debug, Clone)]
pub struct SessionDefaults {
    /// `AUTONOMOUS_MODE`.
    pub mode: Mode,
    /// Limits for continuous mode (`AUTONOMOUS_MAX_*`, intervals).
    pub limits: Limits,
    /// Iteration limit of fixed mode (`AUTONOMOUS_FIXED_ITERATIONS`).
    pub fixed_iterations: u64,
}

impl SessionDefaults {
    /// The default limits for a session created in `mode`.
    pub fn limits_for(&self, mode: Mode) -> Limits {
        match mode {
            Mode::Continuous => self.limits,
            Mode::Fixed => Limits {
                max_iterations: self.fixed_iterations.min(self.limits.max_iterations),
                ..self.limits
            },
        }
    }
}

/// Timing of replica leases.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// How long a lease lasts without renewal (`WARDEN_LEASE_TTL_MS`).
    pub ttl: Duration,
    /// How often leases are renewed and orphans rescued (`WARDEN_HEARTBEAT_INTERVAL_MS`).
    pub heartbeat: Duration,
    /// Safety margin: a holder trusts its lease until renewal start + ttl - margin.
    pub margin: Duration,
}

/// The default model endpoint and the reflection model.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// `WARDEN_LLM_BASE_URL` (+ key, timeout, retries); `None` when unset.
    pub endpoint: Option<LlmSettings>,
    /// `WARDEN_LLM_MODEL`.
    pub model: Option<String>,
    /// Timeout and retries of every model call, also to endpoints a
    /// session names itself.
    pub call: crate::llm::CallPolicy,
    /// `WARDEN_LLM_MAX_TOKENS`: most tokens one call may generate.
    pub max_tokens_per_call: u64,
    /// `AUTONOMOUS_REFLECTION_MODEL`, else `WARDEN_LLM_MODEL`.
    pub reflection_model: Option<String>,
    /// `AUTONOMOUS_REFLECTION_TEMPERATURE`.
    pub reflection_temperature: f64,
    /// `AUTONOMOUS_REFLECTION_TOP_P`.
    pub reflection_top_p: f64,
    /// `WARDEN_MAX_FILE_BYTES`: largest file a tool reads or writes.
    pub max_file_bytes: u64,
}

impl ModelConfig {
    /// Whether reflection can run: an endpoint and a reflection model are configured.
    pub fn reflection_available(&self) -> bool {
        self.endpoint.is_some() && self.reflection_model.is_some()
    }
}

/// Whether start-up applies the migrations (`WARDEN_MIGRATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateMode {
    /// Apply those the schema lacks (refusing a schema newer than the binary).
    Auto,
    /// Apply none; refuse to start unless the schema is exactly this binary's.
    Off,
}

/// Everything the service reads from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `WARDEN_LISTEN_ADDR`.
    pub listen_addr: SocketAddr,
    /// `DATABASE_URL`: a Postgres server. Unset (with the `embedded`
    /// feature): an embedded PostgreSQL in `data_dir`.
    pub database_url: Option<Secret>,
    /// `WARDEN_DATA_DIR`: the embedded PostgreSQL's data
    /// (unused with `DATABASE_URL`).
    pub data_dir: PathBuf,
    /// `WARDEN_DB_MAX_CONNECTIONS`.
    pub db_max_connections: u32,
    /// `WARDEN_LOOP_THREADS`: worker threads of the runtime that runs the
    /// session loops, apart from the API's; 0 runs the loops on the API's
    /// runtime.
    pub loop_threads: usize,
    /// `WARDEN_LOOP_NICE`: scheduling niceness of those threads (0–19),
    /// so the API answers first when the CPU is saturated.
    pub loop_nice: i32,
    /// `WARDEN_WORKSPACE_ROOT`.
    pub workspace_root: PathBuf,
    /// `WARDEN_WORKSPACE_RETENTION`: how long the workspace of
    /// an ended session is kept on the disk.
    pub workspace_retention: Duration,
    /// Archiving and deleting old sessions, compacting long sessions' events.
    pub retention: RetentionConfig,
    /// `WARDEN_APPROVAL_TIMEOUT_MS`: how long a call waits for approval.
    pub approval_timeout: Duration,
    /// A new session's mode and limits when its request leaves them out.
    pub defaults: SessionDefaults,
    /// The continue gate's thresholds.
    pub gate: GateConfig,
    /// Stuck detection thresholds.
    pub stuck: StuckConfig,
    /// `WARDEN_THROTTLE_COOLDOWN_MS`.
    pub throttle_cooldown: Duration,
    /// Lease timing.
    pub lease: LeaseConfig,
    /// `WARDEN_MAX_RUNNING`: sessions this replica runs at once;
    /// beyond it sessions wait `queued` for any replica with room.
    pub max_running: usize,
    /// `WARDEN_CLAIMS_PER_TICK`: most queued or orphaned sessions one
    /// replica claims per heartbeat, so a replica that starts
    /// (or a queue that fills) never takes on a burst all at once.
    pub claims_per_tick: usize,
    /// `WARDEN_CAPABILITIES_OFF`: what this replica runs is every
    /// capability but those.
    pub capabilities: Capabilities,
    /// `WARDEN_MIGRATE`: whether start-up applies the migrations.
    pub migrate: MigrateMode,
    /// `WARDEN_STOP_WAIT_MS`: how long stop/pause requests wait for the loop to land.
    pub control_wait: Duration,
    /// `WARDEN_MAX_ATTEMPTS`: consecutive failed attempts (rescues without a
    /// committed iteration) after which a session ends `failed`.
    pub max_attempts: i32,
    /// `WARDEN_DB_ACQUIRE_TIMEOUT_MS`: how long an API request waits for a
    /// pooled connection before answering 503.
    pub db_acquire_timeout: Duration,
    /// `WARDEN_MAX_BODY_BYTES`.
    pub max_body_bytes: usize,
    /// `WARDEN_LOG_FORMAT`: `text` or `json`.
    pub log_json: bool,
    /// `RUST_LOG`: the log filter.
    pub log_filter: String,
    /// Model endpoints.
    pub models: ModelConfig,
    /// `AUTONOMOUS_REQUIRE_CONCRETE_GOALS`: ambiguous goals wait for refinement.
    pub require_concrete_goals: bool,
    /// `AUTONOMOUS_AUTO_REFINE_GOALS`: apply the suggested refinement without waiting.
    pub auto_refine_goals: bool,
    /// `WARDEN_MODEL_PRICES`: what a million tokens cost, by model, for
    /// every step's `cost_usd`.
    pub model_prices: PriceTable,
    /// The outbound-request policy for client-chosen URLs:
    /// `WARDEN_EGRESS_ALLOW` and `WARDEN_EGRESS_MAX_RESPONSE_BYTES`.
    pub egress: Arc<EgressPolicy>,
    /// Keys and tokens (`WARDEN_ADMIN_TOKEN`, `WARDEN_METRICS_TOKEN`, `WARDEN_AUTH`).
    pub auth: AuthConfig,
    /// The key that seals sessions' own secrets (`WARDEN_SECRET_KEY` or
    /// `WARDEN_SECRET_KEY_FILE`).
    pub secret_key: SecretKeySource,
    /// Earlier keys that still open what they sealed (`WARDEN_SECRET_KEYS`
    /// after its first, `WARDEN_SECRET_KEY_PREVIOUS`, and a key file's
    /// later lines once read); after start what they sealed is sealed again
    /// under the current key in the background (a rotation).
    pub secret_key_previous: Vec<SecretKey>,
    /// The OpenTelemetry exporter (`OTEL_*`, `WARDEN_TRACE_CONTENT`); `None` when off.
    pub telemetry: Option<TelemetryConfig>,
    /// Quotas (`WARDEN_TENANT_MAX_RUNNING`, …).
    pub quotas: Quotas,
    /// Limits on the HTTP connections themselves (`WARDEN_MAX_CONNECTIONS`, …).
    pub connections: ConnectionLimits,
    /// Per-tenant and per-key shares of a replica's request handling
    /// (`WARDEN_TENANT_REQUEST_SHARE`, the parked-claim caps, …).
    pub admission: AdmissionLimits,
    /// `WARDEN_MCP_CONFIG`: the MCP servers the model agent's sessions may
    /// choose tools from, read and checked at start.
    pub mcp: Option<Arc<crate::mcp::McpConfig>>,
}

/// What the pruner keeps: ended sessions for a while, then an archive
/// file of each; the latest events of each session, then only those that
/// say why it did what it did.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// `WARDEN_RETENTION_DAYS`: how long an ended session stays (unless its
    /// tenant has its own); `None` keeps sessions forever.
    pub keep: Option<Duration>,
    /// `WARDEN_ARCHIVE_DIR`: where archived sessions go.
    pub archive_dir: PathBuf,
    /// `WARDEN_EVENT_HORIZON`: events of a session kept whole; 0 keeps all.
    pub event_horizon: u64,
    /// `WARDEN_PRUNE_INTERVAL`: how often the pruner runs.
    pub prune_interval: Duration,
}

/// Limits on the HTTP connections a replica holds, so that idle or
/// half-open connections cannot exhaust its file descriptors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionLimits {
    /// `WARDEN_HEADER_READ_TIMEOUT_MS`: how long a request's line and
    /// headers may take to arrive in full, counted from the connection's
    /// accept (or, on a kept-alive connection, from the previous response);
    /// the connection is closed after it.
    pub header_read_timeout: Duration,
    /// `WARDEN_IDLE_TIMEOUT_MS`: a connection over which no byte moves in
    /// either direction for this long is closed (live
    /// streams send a keep-alive comment every 15 s).
    pub idle_timeout: Duration,
    /// `WARDEN_MAX_CONNECTIONS`: open connections per replica; more
    /// are closed as soon as they are accepted.
    pub max_connections: usize,
    /// `WARDEN_MAX_CONNECTIONS_PER_IP`: open connections from one client
    /// address (an IPv6 client's /64); more are closed as
    /// soon as they are accepted.
    pub max_connections_per_ip: usize,
}

/// What one tenant or one key may hold of a replica's request handling, so
/// that none can take what every tenant shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionLimits {
    /// `WARDEN_TENANT_REQUEST_SHARE`: percent of the request slots
    /// (`WARDEN_MAX_CONCURRENT_REQUESTS`) one tenant's requests may hold.
    pub tenant_request_share: u32,
    /// `WARDEN_BODY_READ_TIMEOUT_MS`: how long a request's body may take to
    /// arrive in full, counted from its headers.
    pub body_read_timeout: Duration,
    /// `WARDEN_MAX_PARKED_CLAIMS`: worker claims waiting for a task at once
    /// on a replica (a pool apart from the request slots).
    pub max_parked_claims: usize,
    /// `WARDEN_TENANT_MAX_PARKED_CLAIMS`: of those, one tenant's.
    pub tenant_max_parked_claims: usize,
    /// `WARDEN_KEY_MAX_PARKED_CLAIMS`: of those, one key's.
    pub key_max_parked_claims: usize,
}

/// Where the key sealing sessions' secrets comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretKeySource {
    /// `WARDEN_SECRET_KEY`, or the key already read from its file.
    Key(SecretKey),
    /// `WARDEN_SECRET_KEY_FILE` : read at
    /// start, or generated there (0600) on first start.
    File(PathBuf),
}

impl SecretKeySource {
    /// The key, once loaded (`Application::build` loads a file's).
    pub fn key(&self) -> Option<&SecretKey> {
        match self {
            SecretKeySource::Key(k) => Some(k),
            SecretKeySource::File(_) => None,
        }
    }
}

impl Config {
    /// The current key and the previous ones, once the current is loaded.
    pub fn keyring(&self) -> Option<Keyring> {
        self.secret_key
            .key()
            .map(|k| Keyring::new(k.clone(), self.secret_key_previous.clone()))
    }
}

/// Quotas, so that no tenant or session can take a replica's every resource;
/// each has a default in the settings table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quotas {
    /// `WARDEN_TENANT_MAX_RUNNING`: sessions of one tenant that may be
    /// active at once (running, awaiting refinement): a
    /// bound against one tenant taking every replica, not a capacity plan.
    pub tenant_max_running: i64,
    /// `WARDEN_MAX_TOOL_CALLS_PER_STEP`: tool calls of one model answer
    /// that are executed; the rest get an error result.
    pub max_tool_calls_per_step: usize,
    /// `WARDEN_WORKSPACE_MAX_BYTES`: bytes of files in one session's workspace.
    pub workspace_max_bytes: u64,
    /// `WARDEN_WORKSPACE_MAX_FILES`: files in one session's workspace.
    pub workspace_max_files: u64,
    /// `WARDEN_WORKSPACE_MAX_ENTRIES`: files and directories (every entry)
    /// in one session's workspace.
    pub workspace_max_entries: u64,
    /// `WARDEN_WORKSPACE_MAX_DEPTH`: components of a workspace path.
    pub workspace_max_depth: usize,
    /// `WARDEN_TENANT_MAX_STREAMS`: live event streams one tenant may hold open.
    pub tenant_max_streams: usize,
    /// `WARDEN_MAX_OUTPUT_BYTES`: bytes of each text of a step's answer
    /// (output, message, error, arguments) stored; the
    /// rest is dropped with a marker saying how much.
    pub max_output_bytes: usize,
    /// `WARDEN_REQUEST_TIMEOUT_MS`: longest a request (streams aside) may take.
    pub request_timeout: Duration,
    /// `WARDEN_MAX_CONCURRENT_REQUESTS`: requests served at once (streams
    /// aside); more are refused at once with 503.
    pub max_concurrent_requests: usize,
    /// `WARDEN_TENANT_MODEL_CALLS_PER_MINUTE`: calls one tenant may make on
    /// the server's own model (goal refinement, success criteria,
    /// reflection) per minute and replica; 0 is unlimited.
    pub tenant_model_calls_per_minute: u32,
}

impl Env<'_> {
    /// The MCP servers of the file `WARDEN_MCP_CONFIG` names; a file that
    /// cannot be read or checked stops start-up.
    fn mcp_config(&self) -> Result<Option<Arc<crate::mcp::McpConfig>>, ConfigError> {
        let Some((var, path)) = self.text(&WARDEN_MCP_CONFIG) else {
            return Ok(None);
        };
        let invalid = |expected: String| ConfigError::Invalid {
            var,
            value: path.to_string(),
            expected,
        };
        let text = std::fs::read_to_string(path.as_ref())
            .map_err(|e| invalid(format!("a readable JSON file ({e})")))?;
        let inherited: std::collections::BTreeMap<String, String> = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        crate::mcp::McpConfig::parse(&text, &inherited)
            .map(|c| Some(Arc::new(c)))
            .map_err(|e| invalid(format!("an MCP configuration ({{\"mcpServers\": …}}): {e}")))
    }

    /// `WARDEN_SECRET_KEYS`' first key (wins), `WARDEN_SECRET_KEY` or
    /// `WARDEN_SECRET_KEY_FILE`.
    fn secret_key(&self) -> Result<SecretKeySource, ConfigError> {
        if let Some(first) = self.key_list(&WARDEN_SECRET_KEYS)?.into_iter().next() {
            return Ok(SecretKeySource::Key(first));
        }
        if let Some((var, raw)) = self.text(&WARDEN_SECRET_KEY) {
            return SecretKey::parse(&raw)
                .map(SecretKeySource::Key)
                .map_err(|expected| ConfigError::Invalid {
                    var,
                    value: "<redacted>".into(),
                    expected,
                });
        }
        // The key belongs with the data it seals: a start from another
        // working directory finds the same key.
        let file = match self.string(&WARDEN_SECRET_KEY_FILE) {
            Some(file) => PathBuf::from(file),
            None => PathBuf::from(
                self.string(&WARDEN_DATA_DIR)
                    .ok_or_else(|| missing_default(&WARDEN_DATA_DIR))?,
            )
            .join("secret.key"),
        };
        Ok(SecretKeySource::File(file))
    }

    /// The keys that still open what they sealed: `WARDEN_SECRET_KEYS`
    /// after its first, then `WARDEN_SECRET_KEY_PREVIOUS`.
    fn secret_key_previous(&self) -> Result<Vec<SecretKey>, ConfigError> {
        let mut keys: Vec<SecretKey> = self
            .key_list(&WARDEN_SECRET_KEYS)?
            .into_iter()
            .skip(1)
            .collect();
        keys.extend(self.key_list(&WARDEN_SECRET_KEY_PREVIOUS)?);
        Ok(keys)
    }

    /// Keys as `WARDEN_SECRET_KEY`, comma-separated; none when unset.
    fn key_list(&self, setting: &Setting) -> Result<Vec<SecretKey>, ConfigError> {
        let Some((var, raw)) = self.text(setting) else {
            return Ok(Vec::new());
        };
        raw.split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .enumerate()
            .map(|(i, k)| {
                SecretKey::parse(k).map_err(|expected| ConfigError::Invalid {
                    var,
                    value: format!("<redacted key {}>", i + 1),
                    expected: format!("comma-separated keys, each {expected}"),
                })
            })
            .collect()
    }

    fn quotas(&self) -> Result<Quotas, ConfigError> {
        Ok(Quotas {
            tenant_max_running: self.parse(&WARDEN_TENANT_MAX_RUNNING, 1, 1_000_000)?,
            max_tool_calls_per_step: self.parse(&WARDEN_MAX_TOOL_CALLS_PER_STEP, 1, 1_000)?,
            max_output_bytes: self.parse(&WARDEN_MAX_OUTPUT_BYTES, 1_024, 104_857_600)?,
            workspace_max_bytes: self.parse(
                &WARDEN_WORKSPACE_MAX_BYTES,
                1_024,
                1_099_511_627_776,
            )?,
            workspace_max_files: self.parse(&WARDEN_WORKSPACE_MAX_FILES, 1, 10_000_000)?,
            workspace_max_entries: self.parse(&WARDEN_WORKSPACE_MAX_ENTRIES, 1, 10_000_000)?,
            workspace_max_depth: self.parse(&WARDEN_WORKSPACE_MAX_DEPTH, 1, 512)?,
            tenant_max_streams: self.parse(&WARDEN_TENANT_MAX_STREAMS, 1, 1_000_000)?,
            request_timeout: self.millis(&WARDEN_REQUEST_TIMEOUT_MS, 100, 3_600_000)?,
            max_concurrent_requests: self.parse(&WARDEN_MAX_CONCURRENT_REQUESTS, 1, 1_000_000)?,
            tenant_model_calls_per_minute: self.parse(
                &WARDEN_TENANT_MODEL_CALLS_PER_MINUTE,
                0,
                1_000_000,
            )?,
        })
    }

    fn admission(&self) -> Result<AdmissionLimits, ConfigError> {
        Ok(AdmissionLimits {
            tenant_request_share: self.parse(&WARDEN_TENANT_REQUEST_SHARE, 1, 100)?,
            body_read_timeout: self.millis(&WARDEN_BODY_READ_TIMEOUT_MS, 100, 600_000)?,
            max_parked_claims: self.parse(&WARDEN_MAX_PARKED_CLAIMS, 1, 1_000_000)?,
            tenant_max_parked_claims: self.parse(&WARDEN_TENANT_MAX_PARKED_CLAIMS, 1, 1_000_000)?,
            key_max_parked_claims: self.parse(&WARDEN_KEY_MAX_PARKED_CLAIMS, 1, 1_000_000)?,
        })
    }

    fn connections(&self) -> Result<ConnectionLimits, ConfigError> {
        Ok(ConnectionLimits {
            header_read_timeout: self.millis(&WARDEN_HEADER_READ_TIMEOUT_MS, 100, 3_600_000)?,
            idle_timeout: self.millis(&WARDEN_IDLE_TIMEOUT_MS, 100, 86_400_000)?,
            max_connections: self.parse(&WARDEN_MAX_CONNECTIONS, 1, 10_000_000)?,
            max_connections_per_ip: self.parse(&WARDEN_MAX_CONNECTIONS_PER_IP, 1, 10_000_000)?,
        })
    }
}

/// Reads configuration values through the settings table: a value set in
/// the environment, else the table's default.
struct Env<'a> {
    vars: &'a HashMap<String, String>,
}

impl Env<'_> {
    /// The text in effect and the variable to name in an error.
    fn text(&self, setting: &Setting) -> Option<(&'static str, Cow<'_, str>)> {
        setting.text(self.vars).map(|(text, origin)| match origin {
            Origin::Env(var) => (var, text),
            Origin::Default => (setting.name, text),
        })
    }

    /// A price table (`policy::pricing`); empty when unset.
    fn price_table(&self, setting: &Setting) -> Result<PriceTable, ConfigError> {
        let Some((var, raw)) = self.text(setting) else {
            return Ok(PriceTable::default());
        };
        PriceTable::parse(&raw).map_err(|e| ConfigError::Invalid {
            var,
            value: raw.to_string(),
            expected: format!("a price table (pattern=input/output[/cached][@date]; ...): {e}"),
        })
    }

    /// The trimmed text in effect, if any.
    fn string(&self, setting: &Setting) -> Option<String> {
        self.text(setting).map(|(_, t)| t.trim().to_string())
    }

    /// A secret of at least `min_len` characters; the error never shows it.
    fn secret(&self, setting: &Setting, min_len: usize) -> Result<Option<Secret>, ConfigError> {
        match self.text(setting) {
            None => Ok(None),
            Some((_, v)) if v.trim().len() >= min_len => Ok(Some(Secret::new(v.trim()))),
            Some((var, _)) => Err(ConfigError::Invalid {
                var,
                value: "<redacted>".into(),
                expected: format!(
                    "a secret of at least {min_len} characters (e.g. openssl rand -hex 32)"
                ),
            }),
        }
    }

    /// A number in `min..=max`, or `None` when the setting is unset and has no default.
    fn parse_opt<T>(&self, setting: &Setting, min: T, max: T) -> Result<Option<T>, ConfigError>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let Some((var, raw)) = self.text(setting) else {
            return Ok(None);
        };
        let invalid = || ConfigError::Invalid {
            var,
            value: raw.to_string(),
            expected: format!("a number between {min} and {max}"),
        };
        let value: T = raw.trim().parse().map_err(|_| invalid())?;
        if value < min || value > max {
            return Err(invalid());
        }
        Ok(Some(value))
    }

    /// A number in `min..=max`; the setting has a default.
    fn parse<T>(&self, setting: &Setting, min: T, max: T) -> Result<T, ConfigError>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        self.parse_opt(setting, min, max)?
            .ok_or_else(|| missing_default(setting))
    }

    fn float_opt(&self, setting: &Setting, min: f64, max: f64) -> Result<Option<f64>, ConfigError> {
        match self.parse_opt(setting, min, max)? {
            Some(value) if !value.is_finite() => Err(ConfigError::Invalid {
                var: setting.name,
                value: value.to_string(),
                expected: format!("a number between {min} and {max}"),
            }),
            other => Ok(other),
        }
    }

    fn float(&self, setting: &Setting, min: f64, max: f64) -> Result<f64, ConfigError> {
        self.float_opt(setting, min, max)?
            .ok_or_else(|| missing_default(setting))
    }

    fn url(&self, setting: &Setting) -> Result<Option<String>, ConfigError> {
        match self.text(setting) {
            None => Ok(None),
            Some((_, u)) if is_http_url(u.trim()) => {
                Ok(Some(u.trim().trim_end_matches('/').to_string()))
            }
            Some((var, u)) => Err(ConfigError::Invalid {
                var,
                value: u.trim().to_string(),
                expected: "an http:// or https:// URL such as http://127.0.0.1:11434/v1".into(),
            }),
        }
    }

    fn bool(&self, setting: &Setting) -> Result<bool, ConfigError> {
        let (var, raw) = self.text(setting).ok_or_else(|| missing_default(setting))?;
        match raw.trim().to_ascii_lowercase() {
            v if ["1", "true", "yes", "on"].contains(&v.as_str()) => Ok(true),
            v if ["0", "false", "no", "off"].contains(&v.as_str()) => Ok(false),
            v => Err(ConfigError::Invalid {
                var,
                value: v,
                expected: "true or false".into(),
            }),
        }
    }

    /// `WARDEN_CAPABILITIES_OFF`: every capability but the ones it names.
    fn capabilities(&self) -> Result<Capabilities, ConfigError> {
        let Some((var, raw)) = self.text(&WARDEN_CAPABILITIES_OFF) else {
            return Ok(Capabilities::default());
        };
        capabilities::parse_list(&raw)
            .map(|off| Capabilities::without(&off))
            .map_err(|expected| ConfigError::Invalid {
                var,
                value: raw.to_string(),
                expected,
            })
    }

    /// One of `choices` (trimmed, exactly as written).
    fn choice<T: Copy>(&self, setting: &Setting, choices: &[(&str, T)]) -> Result<T, ConfigError> {
        let (var, raw) = self.text(setting).ok_or_else(|| missing_default(setting))?;
        choices
            .iter()
            .find(|(name, _)| *name == raw.trim())
            .map(|(_, value)| *value)
            .ok_or_else(|| ConfigError::Invalid {
                var,
                value: raw.trim().to_string(),
                expected: choices
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
                    .join(" or "),
            })
    }

    /// A span of time written as a number with a unit: `90s`, `30m`,
    /// `12h`, `7d`.
    fn span(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        let (var, raw) = self.text(setting).ok_or_else(|| missing_default(setting))?;
        let text = raw.trim();
        parse_span(text).ok_or_else(|| ConfigError::Invalid {
            var,
            value: text.to_string(),
            expected: "a whole number with a unit s, m, h or d (e.g. 7d, 12h, 30m)".into(),
        })
    }

    /// A retention: a whole number of days, or a span with a unit; `None`
    /// when unset.
    fn days_or_span(&self, setting: &Setting) -> Result<Option<Duration>, ConfigError> {
        let Some((var, raw)) = self.text(setting) else {
            return Ok(None);
        };
        let text = raw.trim();
        parse_retention(text)
            .map(Some)
            .ok_or_else(|| ConfigError::Invalid {
                var,
                value: text.to_string(),
                expected: "a whole number of days (e.g. 30), or a span with a unit s, m, h or d (e.g. 12h)".into(),
            })
    }

    fn retention(&self) -> Result<RetentionConfig, ConfigError> {
        let archive_dir = self
            .string(&WARDEN_ARCHIVE_DIR)
            .ok_or_else(|| missing_default(&WARDEN_ARCHIVE_DIR))?;
        let prune_interval = self.span(&WARDEN_PRUNE_INTERVAL)?;
        if prune_interval.is_zero() {
            return Err(ConfigError::Invalid {
                var: WARDEN_PRUNE_INTERVAL.name,
                value: "0".into(),
                expected: "at least 1s".into(),
            });
        }
        Ok(RetentionConfig {
            keep: self.days_or_span(&WARDEN_RETENTION_DAYS)?,
            archive_dir: PathBuf::from(archive_dir),
            event_horizon: self.parse(&WARDEN_EVENT_HORIZON, 0, 1_000_000_000)?,
            prune_interval,
        })
    }

    fn millis(&self, setting: &Setting, min: u64, max: u64) -> Result<Duration, ConfigError> {
        self.parse(setting, min, max).map(Duration::from_millis)
    }
}

fn is_http_url(u: &str) -> bool {
    (u.starts_with("http://") || u.starts_with("https://")) && u.len() > 8
}

/// A setting read as if it had a default that the table does not give it:
/// a mistake in the table, reported rather than assumed.
fn missing_default(setting: &Setting) -> ConfigError {
    ConfigError::Missing {
        var: setting.name,
        why: "the settings table gives it no default",
    }
}

/// A retention as `WARDEN_RETENTION_DAYS` reads it: a whole number of
/// days (`30`), or a span with a unit (`12h`, `90s`); at most 100 years.
pub fn parse_retention(text: &str) -> Option<Duration> {
    let days = text
        .parse::<u64>()
        .ok()
        .and_then(|d| parse_span(&format!("{d}d")));
    days.or_else(|| parse_span(text))
}

/// What `PUT /api/retention` reads as `keep`, as the API document states
/// it: `forever`, `default`, or a retention [`parse_retention`] reads, with
/// few enough digits that every one is within its 100 years.
pub const RETENTION_PATTERN: &str =
    "^(forever|default|[0-9]{1,4}d?|[0-9]{1,5}h|[0-9]{1,7}m|[0-9]{1,9}s)$";

/// A span such as `7d`, `12h`, `30m` or `90s` (at most 100 years).
fn parse_span(text: &str) -> Option<Duration> {
    // The unit is the last character, whatever its width in bytes.
    let unit = text.chars().next_back()?;
    let number = &text[..text.len() - unit.len_utf8()];
    let seconds_per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => return None,
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds = number.parse::<u64>().ok()?.checked_mul(seconds_per)?;
    (seconds <= 100 * 365 * 86_400).then(|| Duration::from_secs(seconds))
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(&settings::process_env())
    }

    /// Reads configuration from the given variables (the process
    /// environment in production), every one through the settings table.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let env = Env { vars };
        let listen_addr = env.listen_addr()?;
        let database_url = env.database_url()?;
        let data_dir = PathBuf::from(
            env.string(&WARDEN_DATA_DIR)
                .ok_or_else(|| missing_default(&WARDEN_DATA_DIR))?,
        );
        let defaults = env.session_defaults()?;
        let gate = env.gate()?;
        let lease = env.lease()?;
        let log_json = env.choice(&WARDEN_LOG_FORMAT, &[("text", false), ("json", true)])?;
        let models = env.models()?;
        let egress = env.egress()?;
        let workspace_root = env
            .text(&WARDEN_WORKSPACE_ROOT)
            .map(|(_, root)| PathBuf::from(root.as_ref()))
            .ok_or_else(|| missing_default(&WARDEN_WORKSPACE_ROOT))?;
        Ok(Config {
            listen_addr,
            database_url: database_url.map(Secret::new),
            data_dir,
            db_max_connections: env.parse(&WARDEN_DB_MAX_CONNECTIONS, 1, 1_000)?,
            loop_threads: env.parse(&WARDEN_LOOP_THREADS, 0, 256)?,
            loop_nice: env.parse(&WARDEN_LOOP_NICE, 0, 19)?,
            workspace_root,
            workspace_retention: env.span(&WARDEN_WORKSPACE_RETENTION)?,
            retention: env.retention()?,
            approval_timeout: env.millis(&WARDEN_APPROVAL_TIMEOUT_MS, 1_000, 2_592_000_000)?,
            defaults,
            gate,
            stuck: StuckConfig::default(),
            throttle_cooldown: env.millis(&WARDEN_THROTTLE_COOLDOWN_MS, 0, 3_600_000)?,
            lease,
            max_running: env.parse(&WARDEN_MAX_RUNNING, 1, 1_000_000)?,
            claims_per_tick: env.parse(&WARDEN_CLAIMS_PER_TICK, 1, 100_000)?,
            capabilities: env.capabilities()?,
            migrate: env.choice(
                &WARDEN_MIGRATE,
                &[("auto", MigrateMode::Auto), ("off", MigrateMode::Off)],
            )?,
            control_wait: env.millis(&WARDEN_STOP_WAIT_MS, 0, 600_000)?,
            max_attempts: env.parse(&WARDEN_MAX_ATTEMPTS, 1, 1_000)?,
            db_acquire_timeout: env.millis(&WARDEN_DB_ACQUIRE_TIMEOUT_MS, 50, 60_000)?,
            max_body_bytes: env.parse(&WARDEN_MAX_BODY_BYTES, 1_024, 67_108_864)?,
            log_json,
            log_filter: env
                .string(&RUST_LOG)
                .ok_or_else(|| missing_default(&RUST_LOG))?,
            models,
            require_concrete_goals: env.bool(&AUTONOMOUS_REQUIRE_CONCRETE_GOALS)?,
            auto_refine_goals: env.bool(&AUTONOMOUS_AUTO_REFINE_GOALS)?,
            model_prices: env.price_table(&WARDEN_MODEL_PRICES)?,
            egress: Arc::new(egress),
            auth: AuthConfig {
                admin_token: env.secret(&WARDEN_ADMIN_TOKEN, 16)?,
                metrics_token: env.secret(&WARDEN_METRICS_TOKEN, 16)?,
                off: env.choice(&WARDEN_AUTH, &[("on", false), ("off", true)])?,
            },
            secret_key: env.secret_key()?,
            secret_key_previous: env.secret_key_previous()?,
            quotas: env.quotas()?,
            connections: env.connections()?,
            admission: env.admission()?,
            mcp: env.mcp_config()?,
            telemetry: env.telemetry()?,
        })
    }
}

/// The parts of `Config::from_vars`, in the order it reads them (which
/// decides which of several bad settings is reported).
impl Env<'_> {
    /// The address to listen on.
    fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        let (listen_var, listen_raw) = self
            .text(&WARDEN_LISTEN_ADDR)
            .ok_or_else(|| missing_default(&WARDEN_LISTEN_ADDR))?;
        let listen_addr = listen_raw
            .trim()
            .parse()
            .map_err(|_| ConfigError::Invalid {
                var: listen_var,
                value: listen_raw.to_string(),
                expected: "an address like 127.0.0.1:8080".into(),
            })?;
        Ok(listen_addr)
    }

    /// The Postgres URL: required unless the build embeds PostgreSQL, and
    /// a postgres:// one when set.
    fn database_url(&self) -> Result<Option<String>, ConfigError> {
        let database_url = self.text(&DATABASE_URL).map(|(_, url)| url.into_owned());
        #[cfg(not(feature = "embedded"))]
        if database_url.is_none() {
            return Err(ConfigError::Missing {
                var: DATABASE_URL.name,
                why: "Warden keeps every session in Postgres, e.g. postgres://postgres@127.0.0.1:5432/warden \
(this build has no embedded PostgreSQL: the `embedded` feature is off)",
            });
        }
        if let Some(url) = &database_url
            && !url.starts_with("postgres://")
            && !url.starts_with("postgresql://")
        {
            return Err(ConfigError::Invalid {
                var: DATABASE_URL.name,
                // It may carry a password.
                value: "<redacted>".into(),
                expected: "a postgres:// URL (or unset it for the embedded PostgreSQL)".into(),
            });
        }
        Ok(database_url)
    }

    /// A new session's mode and limits when its request does not set them.
    fn session_defaults(&self) -> Result<SessionDefaults, ConfigError> {
        let (mode_var, mode_raw) = self
            .text(&AUTONOMOUS_MODE)
            .ok_or_else(|| missing_default(&AUTONOMOUS_MODE))?;
        let mode = Mode::parse(mode_raw.trim()).ok_or_else(|| ConfigError::Invalid {
            var: mode_var,
            value: mode_raw.to_string(),
            expected: "fixed or continuous".into(),
        })?;
        let limits = Limits {
            max_iterations: self.parse(&AUTONOMOUS_MAX_ITERATIONS, 1, 1_000_000)?,
            max_wall_time_ms: self.parse(&AUTONOMOUS_MAX_WALL_TIME_MS, 100, 2_592_000_000)?,
            max_tokens: self.parse(&AUTONOMOUS_MAX_TOKENS, 1, 10_000_000_000)?,
            max_consecutive_errors: self.parse(&AUTONOMOUS_MAX_CONSECUTIVE_ERRORS, 1, 1_000)?,
            reflection_interval: self.parse(&AUTONOMOUS_REFLECTION_INTERVAL, 1, 1_000)?,
            // The default is where the adaptive interval starts.
            reflection_adaptive: true,
            checkpoint_interval: self.parse(&AUTONOMOUS_CHECKPOINT_INTERVAL, 1, 10_000)?,
            max_tool_calls: None,
            max_cycles: self.parse(&AUTONOMOUS_MAX_CYCLES, 1, 1_000)?,
            context_budget_tokens: self.parse(&AUTONOMOUS_CONTEXT_TOKENS, 500, 10_000_000)?,
            review_every: None,
            warn_at: crate::policy::soft_budget::WarnAt::DEFAULT,
            max_cost_usd: None,
        };
        Ok(SessionDefaults {
            mode,
            limits,
            fixed_iterations: self.parse(&AUTONOMOUS_FIXED_ITERATIONS, 1, 1_000_000)?,
        })
    }

    /// The continue gate's review and checkpoint cadence and its projection.
    fn gate(&self) -> Result<GateConfig, ConfigError> {
        Ok(GateConfig {
            // The table reads the earlier name too, so existing deployments keep theirs.
            review_every: self.parse(&WARDEN_GATE_REVIEW_EVERY, 0, 1_000_000)?,
            checkpoint_every: self.parse(&WARDEN_GATE_CHECKPOINT_EVERY, 1, 1_000_000)?,
            projection_margin: self.float(&WARDEN_PROJECTION_MARGIN, 1.0, 1_000.0)?,
            projection_evaluations: self.parse(&WARDEN_PROJECTION_EVALUATIONS, 1, 20)?,
            ..GateConfig::default()
        })
    }

    /// The lease's time to live and heartbeat; the heartbeat at most half
    /// the time to live.
    fn lease(&self) -> Result<LeaseConfig, ConfigError> {
        let ttl = self.millis(&WARDEN_LEASE_TTL_MS, 200, 3_600_000)?;
        let heartbeat = self.millis(&WARDEN_HEARTBEAT_INTERVAL_MS, 50, 3_600_000)?;
        if heartbeat * 2 > ttl {
            return Err(ConfigError::Invalid {
                var: WARDEN_HEARTBEAT_INTERVAL_MS.name,
                value: heartbeat.as_millis().to_string(),
                expected: format!(
                    "at most half of WARDEN_LEASE_TTL_MS ({} ms) so a lease is renewed before it expires",
                    ttl.as_millis()
                ),
            });
        }
        Ok(LeaseConfig {
            ttl,
            heartbeat,
            margin: ttl / 5,
        })
    }

    /// The default model endpoint, the call policy and the model settings.
    fn models(&self) -> Result<ModelConfig, ConfigError> {
        // Read whether or not a default endpoint is set: sessions that
        // name their own endpoint are bound by them too.
        let call = crate::llm::CallPolicy {
            timeout: self.millis(&WARDEN_LLM_TIMEOUT_MS, 100, 3_600_000)?,
            max_retries: self.parse(&WARDEN_LLM_MAX_RETRIES, 0, 10)?,
            retry_base: self.millis(&WARDEN_LLM_RETRY_BASE_MS, 1, 60_000)?,
        };
        let endpoint = self.url(&WARDEN_LLM_BASE_URL)?.map(|base_url| LlmSettings {
            base_url,
            api_key: self.string(&WARDEN_LLM_API_KEY),
            timeout: call.timeout,
            max_retries: call.max_retries,
            retry_base: call.retry_base,
        });
        Ok(ModelConfig {
            endpoint,
            call,
            // Defaults to WARDEN_LLM_MODEL through the table.
            reflection_model: self.string(&AUTONOMOUS_REFLECTION_MODEL),
            model: self.string(&WARDEN_LLM_MODEL),
            max_tokens_per_call: self.parse(&WARDEN_LLM_MAX_TOKENS, 1, 1_000_000)?,
            reflection_temperature: self.float(&AUTONOMOUS_REFLECTION_TEMPERATURE, 0.0, 2.0)?,
            reflection_top_p: self.float(&AUTONOMOUS_REFLECTION_TOP_P, 0.0, 1.0)?,
            max_file_bytes: self.parse(&WARDEN_MAX_FILE_BYTES, 1, 104_857_600)?,
        })
    }

    /// Where tools and endpoints may connect, and how much they may read.
    fn egress(&self) -> Result<EgressPolicy, ConfigError> {
        let allow = self.text(&WARDEN_EGRESS_ALLOW);
        let egress = EgressPolicy::new()
            .with_allow_list(allow.as_ref().map_or("", |(_, list)| list))
            .map_err(|why| ConfigError::Invalid {
                var: WARDEN_EGRESS_ALLOW.name,
                value: allow
                    .as_ref()
                    .map_or(String::new(), |(_, list)| list.to_string()),
                expected: format!(
                    "comma-separated hosts, host:port, addresses or CIDR ranges: {why}"
                ),
            })?
            .with_max_response_bytes(self.parse(
                &WARDEN_EGRESS_MAX_RESPONSE_BYTES,
                1_024,
                1_073_741_824,
            )?);
        Ok(egress)
    }
}

impl Env<'_> {
    /// The OpenTelemetry exporter: `None` (off) unless an OTLP endpoint is set.
    fn telemetry(&self) -> Result<Option<TelemetryConfig>, ConfigError> {
        let protocol = self.choice(
            &OTEL_EXPORTER_OTLP_PROTOCOL,
            &[
                ("http/protobuf", Protocol::HttpProtobuf),
                ("grpc", Protocol::Grpc),
            ],
        )?;
        // Validated here although the SDK reads it itself, so a typo stops
        // start-up instead of being ignored.
        self.parse::<u64>(&OTEL_BSP_SCHEDULE_DELAY, 1, 3_600_000)?;
        self.parse::<u64>(&OTEL_METRIC_EXPORT_INTERVAL, 1, 3_600_000)?;
        let content = self.bool(&WARDEN_TRACE_CONTENT)?;
        let base = self.url(&OTEL_EXPORTER_OTLP_ENDPOINT)?;
        let metrics_endpoint = match (self.url(&OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)?, &base) {
            (Some(metrics), _) => Some(metrics),
            (None, Some(base)) if protocol == Protocol::HttpProtobuf => {
                Some(format!("{base}/v1/metrics"))
            }
            (None, base) => base.clone(),
        };
        let endpoint = match (self.url(&OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)?, base) {
            (Some(traces), _) => traces,
            (None, Some(base)) if protocol == Protocol::HttpProtobuf => format!("{base}/v1/traces"),
            (None, Some(base)) => base,
            (None, None) => return Ok(None),
        };
        let named_in_attributes = self.string(&OTEL_RESOURCE_ATTRIBUTES).is_some_and(|attrs| {
            attrs
                .split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
        let service_name = match OTEL_SERVICE_NAME.lookup(self.vars) {
            Some((_, name)) => Some(name.trim().to_string()),
            None if named_in_attributes => None,
            None => self.string(&OTEL_SERVICE_NAME),
        };
        Ok(Some(TelemetryConfig {
            endpoint,
            metrics_endpoint,
            protocol,
            service_name,
            content,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_a_number_and_a_unit() {
        assert_eq!(parse_span("7d"), Some(Duration::from_secs(604_800)));
        assert_eq!(parse_span("12h"), Some(Duration::from_secs(43_200)));
        assert_eq!(parse_span("30m"), Some(Duration::from_secs(1_800)));
        assert_eq!(parse_span("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_span("0s"), Some(Duration::ZERO));
        for bad in [
            "",
            "d",
            "7",
            "7 d",
            "-1d",
            "1.5h",
            "7w",
            "+7d",
            "36500000d",
            "99999999999999999999s",
            "7é",
            "1L\u{f4}",
            "é",
        ] {
            assert_eq!(parse_span(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_mcp_file_is_read_at_start_and_a_bad_one_stops_it() {
        assert!(Config::from_vars(&vars(&[])).unwrap().mcp.is_none());
        let dir = std::env::temp_dir().join(format!("warden-mcp-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"mcpServers": {"fs": {"command": "mcp-fs"}}}"#).unwrap();
        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"mcpServers": {"fs": {}}}"#).unwrap();
        let good = good.to_string_lossy().to_string();
        let c = Config::from_vars(&vars(&[("WARDEN_MCP_CONFIG", &good)])).unwrap();
        assert_eq!(c.mcp.unwrap().names().collect::<Vec<_>>(), ["fs"]);
        for path in [bad, dir.join("missing.json")] {
            let path = path.to_string_lossy().to_string();
            let err = Config::from_vars(&vars(&[("WARDEN_MCP_CONFIG", &path)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("WARDEN_MCP_CONFIG"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        map.entry("DATABASE_URL".into())
            .or_insert_with(|| "postgres://postgres@127.0.0.1/warden".into());
        map
    }

    #[test]
    fn defaults_match_the_design() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert_eq!(c.listen_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.defaults.mode, Mode::Fixed);
        let l = c.defaults.limits;
        assert_eq!(l.max_iterations, 200);
        assert_eq!(l.max_wall_time_ms, 7_200_000);
        assert_eq!(l.max_tokens, 500_000);
        assert_eq!(l.max_consecutive_errors, 5);
        assert_eq!(l.reflection_interval, 10);
        assert_eq!(l.checkpoint_interval, 10);
        assert_eq!(c.defaults.limits_for(Mode::Fixed).max_iterations, 50);
        assert_eq!(c.defaults.limits_for(Mode::Continuous).max_iterations, 200);
        assert_eq!(c.throttle_cooldown, Duration::from_secs(5));
        assert_eq!(c.gate.review_every, 100);
        assert_eq!(c.gate.projection_margin, 2.0);
        assert_eq!(c.gate.projection_evaluations, 3);
    }

    #[test]
    fn review_every_is_read_under_its_name_or_the_old_one() {
        let every =
            |pairs: &[(&str, &str)]| Config::from_vars(&vars(pairs)).map(|c| c.gate.review_every);
        assert_eq!(every(&[("WARDEN_GATE_REVIEW_EVERY", "40")]).unwrap(), 40);
        assert_eq!(every(&[("WARDEN_GATE_STEP_LIMIT", "30")]).unwrap(), 30);
        // The new name wins when both are set.
        assert_eq!(
            every(&[
                ("WARDEN_GATE_REVIEW_EVERY", "40"),
                ("WARDEN_GATE_STEP_LIMIT", "30")
            ])
            .unwrap(),
            40
        );
        assert_eq!(every(&[("WARDEN_GATE_REVIEW_EVERY", "0")]).unwrap(), 0);
        let err = every(&[("WARDEN_GATE_REVIEW_EVERY", "many")]).unwrap_err();
        assert!(
            err.to_string().contains("WARDEN_GATE_REVIEW_EVERY"),
            "{err}"
        );
        let err = every(&[("WARDEN_GATE_STEP_LIMIT", "2000000")]).unwrap_err();
        assert!(err.to_string().contains("WARDEN_GATE_STEP_LIMIT"), "{err}");
    }

    #[test]
    fn traces_are_off_unless_an_otlp_endpoint_is_set() {
        let telemetry =
            |pairs: &[(&str, &str)]| Config::from_vars(&vars(pairs)).map(|c| c.telemetry);
        assert_eq!(telemetry(&[]).unwrap(), None);
        // Off whatever else is set.
        assert_eq!(
            telemetry(&[("WARDEN_TRACE_CONTENT", "true"), ("OTEL_SERVICE_NAME", "x")]).unwrap(),
            None
        );
        let http = telemetry(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(
            http,
            TelemetryConfig {
                endpoint: "http://127.0.0.1:4318/v1/traces".into(),
                metrics_endpoint: Some("http://127.0.0.1:4318/v1/metrics".into()),
                protocol: Protocol::HttpProtobuf,
                service_name: Some("warden".into()),
                content: false,
            }
        );
        // The traces endpoint is used as it is, and wins.
        let traces = telemetry(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://otel.example/t",
            ),
            ("WARDEN_TRACE_CONTENT", "true"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint, "https://otel.example/t");
        assert_eq!(
            traces.metrics_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/metrics")
        );
        assert!(traces.content);
        // So is the metrics endpoint.
        let metrics = telemetry(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://otel.example/t",
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "https://otel.example/m",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            metrics.metrics_endpoint.as_deref(),
            Some("https://otel.example/m")
        );
        let traces_only = telemetry(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://otel.example/t",
        )])
        .unwrap()
        .unwrap();
        assert_eq!(traces_only.metrics_endpoint, None);
        let grpc = telemetry(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(grpc.endpoint, "http://127.0.0.1:4317");
        assert_eq!(
            grpc.metrics_endpoint.as_deref(),
            Some("http://127.0.0.1:4317")
        );
        assert_eq!(grpc.protocol, Protocol::Grpc);
        // service.name in the resource attributes is kept unless
        // OTEL_SERVICE_NAME is set.
        let named = |extra: &[(&str, &str)]| {
            let mut pairs = vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_RESOURCE_ATTRIBUTES", "team=a, service.name=agents"),
            ];
            pairs.extend_from_slice(extra);
            telemetry(&pairs).unwrap().unwrap().service_name
        };
        assert_eq!(named(&[]), None);
        assert_eq!(named(&[("OTEL_SERVICE_NAME", "w")]), Some("w".into()));
        for (var, bad) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "often"),
            ("WARDEN_TRACE_CONTENT", "maybe"),
        ] {
            let err = telemetry(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                (var, bad),
            ])
            .unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn projection_settings_are_read_and_checked() {
        let c = Config::from_vars(&vars(&[
            ("WARDEN_PROJECTION_MARGIN", "5.5"),
            ("WARDEN_PROJECTION_EVALUATIONS", "7"),
        ]))
        .unwrap();
        assert_eq!(c.gate.projection_margin, 5.5);
        assert_eq!(c.gate.projection_evaluations, 7);
        for (var, value) in [
            ("WARDEN_PROJECTION_MARGIN", "0.5"),
            ("WARDEN_PROJECTION_MARGIN", "NaN"),
            ("WARDEN_PROJECTION_EVALUATIONS", "0"),
            ("WARDEN_PROJECTION_EVALUATIONS", "21"),
        ] {
            assert!(
                Config::from_vars(&vars(&[(var, value)])).is_err(),
                "{var}={value}"
            );
        }
    }

    #[test]
    fn values_are_read() {
        let c = Config::from_vars(&vars(&[
            ("AUTONOMOUS_MODE", "continuous"),
            ("AUTONOMOUS_MAX_TOKENS", "1234"),
            ("WARDEN_LISTEN_ADDR", "0.0.0.0:9000"),
            ("WARDEN_LOG_FORMAT", "json"),
        ]))
        .unwrap();
        assert_eq!(c.defaults.mode, Mode::Continuous);
        assert_eq!(c.defaults.limits.max_tokens, 1234);
        assert_eq!(c.listen_addr.port(), 9000);
        assert!(c.log_json);
    }

    #[test]
    fn failure_model_outage_and_model_call_settings() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert_eq!(c.max_attempts, 5);
        assert_eq!(c.db_acquire_timeout, Duration::from_secs(2));
        assert_eq!(c.models.call, crate::llm::CallPolicy::default());
        // Read without a default endpoint: sessions naming their own obey them.
        let c = Config::from_vars(&vars(&[
            ("WARDEN_MAX_ATTEMPTS", "3"),
            ("WARDEN_DB_ACQUIRE_TIMEOUT_MS", "500"),
            ("WARDEN_LLM_TIMEOUT_MS", "300"),
            ("WARDEN_LLM_MAX_RETRIES", "0"),
            ("WARDEN_LLM_RETRY_BASE_MS", "20"),
        ]))
        .unwrap();
        assert!(c.models.endpoint.is_none());
        assert_eq!(c.max_attempts, 3);
        assert_eq!(c.db_acquire_timeout, Duration::from_millis(500));
        assert_eq!(
            c.models.call,
            crate::llm::CallPolicy {
                timeout: Duration::from_millis(300),
                max_retries: 0,
                retry_base: Duration::from_millis(20),
            }
        );
        assert!(Config::from_vars(&vars(&[("WARDEN_MAX_ATTEMPTS", "0")])).is_err());
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("AUTONOMOUS_MAX_ITERATIONS", "lots"),
            ("AUTONOMOUS_MAX_ITERATIONS", "0"),
            ("AUTONOMOUS_MAX_TOKENS", "-5"),
            ("AUTONOMOUS_MODE", "turbo"),
            ("AUTONOMOUS_REQUIRE_CONCRETE_GOALS", "maybe"),
            ("WARDEN_LISTEN_ADDR", "localhost"),
            ("WARDEN_LOG_FORMAT", "xml"),
            ("DATABASE_URL", "mysql://x"),
            ("WARDEN_LLM_BASE_URL", "localhost:11434"),
            ("AUTONOMOUS_REFLECTION_TEMPERATURE", "9"),
            ("AUTONOMOUS_REFLECTION_TOP_P", "NaN"),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", "10000"),
        ] {
            let err = Config::from_vars(&vars(&[(var, value)])).unwrap_err();
            assert!(err.to_string().contains(var), "{var}: {err}");
        }
    }

    #[test]
    fn model_settings_are_read() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert!(c.models.endpoint.is_none());
        assert!(!c.models.reflection_available());
        let c = Config::from_vars(&vars(&[
            ("WARDEN_LLM_BASE_URL", "http://127.0.0.1:11434/v1/"),
            ("WARDEN_LLM_MODEL", "qwen3"),
            ("WARDEN_LLM_API_KEY", "sk-test"),
        ]))
        .unwrap();
        let endpoint = c.models.endpoint.clone().unwrap();
        assert_eq!(endpoint.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(endpoint.api_key.as_deref(), Some("sk-test"));
        assert!(!format!("{endpoint:?}").contains("sk-test"));
        assert_eq!(c.models.reflection_model.as_deref(), Some("qwen3"));
        assert_eq!(c.models.reflection_temperature, 0.7);
        assert_eq!(c.models.reflection_top_p, 0.6);
        assert!(c.models.reflection_available());
    }

    #[test]
    fn secrets_are_read_and_never_shown() {
        let c = Config::from_vars(&vars(&[
            ("DATABASE_URL", "postgres://u:hunter2-db@h/warden"),
            ("WARDEN_ADMIN_TOKEN", "admin-token-0123456789"),
            ("WARDEN_METRICS_TOKEN", "metrics-token-0123456789"),
        ]))
        .unwrap();
        assert_eq!(
            c.auth.admin_token.as_ref().map(Secret::expose),
            Some("admin-token-0123456789")
        );
        assert!(!c.auth.off);
        let shown = format!("{c:?}");
        for secret in [
            "hunter2-db",
            "admin-token-0123456789",
            "metrics-token-0123456789",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let err = Config::from_vars(&vars(&[("WARDEN_ADMIN_TOKEN", "short")])).unwrap_err();
        assert!(
            err.to_string().contains("WARDEN_ADMIN_TOKEN") && !err.to_string().contains("short")
        );
        let err =
            Config::from_vars(&vars(&[("DATABASE_URL", "mysql://u:pw-secret@h/x")])).unwrap_err();
        assert!(!err.to_string().contains("pw-secret"));
        assert!(
            Config::from_vars(&vars(&[("WARDEN_AUTH", "off")]))
                .unwrap()
                .auth
                .off
        );
        assert!(Config::from_vars(&vars(&[("WARDEN_AUTH", "maybe")])).is_err());
    }

    #[test]
    fn secret_key_and_quotas_are_read_and_checked() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert_eq!(
            c.secret_key,
            SecretKeySource::File(PathBuf::from("./.warden/secret.key"))
        );
        // The key lives with the data it seals, wherever the data is.
        let elsewhere = Config::from_vars(&vars(&[("WARDEN_DATA_DIR", "/srv/warden")])).unwrap();
        assert_eq!(
            elsewhere.secret_key,
            SecretKeySource::File(PathBuf::from("/srv/warden/secret.key"))
        );
        let named = vars(&[
            ("WARDEN_DATA_DIR", "/srv/warden"),
            ("WARDEN_SECRET_KEY_FILE", "/k"),
        ]);
        assert_eq!(
            Config::from_vars(&named).unwrap().secret_key,
            SecretKeySource::File(PathBuf::from("/k"))
        );
        assert_eq!(
            c.quotas,
            Quotas {
                tenant_max_running: 1_000,
                max_tool_calls_per_step: 16,
                max_output_bytes: 262_144,
                workspace_max_bytes: 104_857_600,
                workspace_max_files: 10_000,
                workspace_max_entries: 10_000,
                workspace_max_depth: 32,
                tenant_max_streams: 32,
                request_timeout: Duration::from_secs(30),
                max_concurrent_requests: 512,
                tenant_model_calls_per_minute: 60,
            }
        );
        let hex = "ab".repeat(32);
        let c = Config::from_vars(&vars(&[
            ("WARDEN_SECRET_KEY", hex.as_str()),
            ("WARDEN_TENANT_MAX_RUNNING", "3"),
            ("WARDEN_MAX_TOOL_CALLS_PER_STEP", "2"),
            ("WARDEN_WORKSPACE_MAX_BYTES", "4096"),
            ("WARDEN_WORKSPACE_MAX_FILES", "5"),
            ("WARDEN_WORKSPACE_MAX_ENTRIES", "9"),
            ("WARDEN_WORKSPACE_MAX_DEPTH", "4"),
            ("WARDEN_TENANT_MAX_STREAMS", "6"),
            ("WARDEN_REQUEST_TIMEOUT_MS", "700"),
            ("WARDEN_MAX_CONCURRENT_REQUESTS", "8"),
            ("WARDEN_TENANT_MODEL_CALLS_PER_MINUTE", "0"),
            ("WARDEN_MAX_OUTPUT_BYTES", "2048"),
        ]))
        .unwrap();
        assert!(c.secret_key.key().is_some());
        assert!(!format!("{c:?}").contains(&hex));
        assert!(c.secret_key_previous.is_empty());
        // Previous keys: comma-separated, blanks skipped, never echoed.
        let (old1, old2) = ("01".repeat(32), "02".repeat(32));
        let previous = format!(" {old1} ,,{old2}");
        let rotating = Config::from_vars(&vars(&[
            ("WARDEN_SECRET_KEY", hex.as_str()),
            ("WARDEN_SECRET_KEY_PREVIOUS", previous.as_str()),
        ]))
        .unwrap();
        assert_eq!(rotating.secret_key_previous.len(), 2);
        let ring = rotating.keyring().unwrap();
        assert_eq!(ring.ids().len(), 3);
        assert!(!format!("{rotating:?}").contains(&old1));
        let bad = format!("{old1},{}", "03".repeat(31));
        let err = Config::from_vars(&vars(&[("WARDEN_SECRET_KEY_PREVIOUS", bad.as_str())]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("WARDEN_SECRET_KEY_PREVIOUS")
                && err.contains("key 2")
                && !err.contains(&old1),
            "{err}"
        );
        // A ring in WARDEN_SECRET_KEYS: its first is current and wins over
        // WARDEN_SECRET_KEY; the rest and WARDEN_SECRET_KEY_PREVIOUS open.
        let keys = format!("{old2},{old1}");
        let ringed = Config::from_vars(&vars(&[
            ("WARDEN_SECRET_KEY", hex.as_str()),
            ("WARDEN_SECRET_KEYS", keys.as_str()),
            ("WARDEN_SECRET_KEY_PREVIOUS", hex.as_str()),
        ]))
        .unwrap();
        let ring = ringed.keyring().unwrap();
        let id = |k: &str| SecretKey::parse(k).unwrap().id().to_string();
        assert_eq!(ring.ids(), vec![id(&old2), id(&old1), id(&hex)]);
        assert!(!format!("{ringed:?}").contains(&old2));
        let err = Config::from_vars(&vars(&[("WARDEN_SECRET_KEYS", bad.as_str())]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("WARDEN_SECRET_KEYS") && !err.contains(&old1),
            "{err}"
        );
        // Without a loaded key there is no ring yet.
        assert!(Config::from_vars(&vars(&[])).unwrap().keyring().is_none());
        assert_eq!(
            c.quotas,
            Quotas {
                tenant_max_running: 3,
                max_tool_calls_per_step: 2,
                max_output_bytes: 2048,
                workspace_max_bytes: 4096,
                workspace_max_files: 5,
                workspace_max_entries: 9,
                workspace_max_depth: 4,
                tenant_max_streams: 6,
                request_timeout: Duration::from_millis(700),
                max_concurrent_requests: 8,
                tenant_model_calls_per_minute: 0,
            }
        );
        // A key of the wrong length stops start-up, naming the variable, never the value.
        for bad in ["abcd".repeat(15), "ab".repeat(33), "c2hvcnQ=".into()] {
            let err = Config::from_vars(&vars(&[("WARDEN_SECRET_KEY", bad.as_str())]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("WARDEN_SECRET_KEY") && err.contains("256-bit") && !err.contains(&bad),
                "{err}"
            );
        }
        for var in [
            "WARDEN_TENANT_MAX_RUNNING",
            "WARDEN_MAX_TOOL_CALLS_PER_STEP",
            "WARDEN_WORKSPACE_MAX_FILES",
            "WARDEN_WORKSPACE_MAX_ENTRIES",
            "WARDEN_WORKSPACE_MAX_DEPTH",
            "WARDEN_TENANT_MAX_STREAMS",
            "WARDEN_MAX_CONCURRENT_REQUESTS",
        ] {
            let err = Config::from_vars(&vars(&[(var, "0")])).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn connection_limits_are_read_and_checked() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert_eq!(c.connections.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.connections.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.connections.max_connections, 10_000);
        assert_eq!(c.connections.max_connections_per_ip, 1_000);
        let c = Config::from_vars(&vars(&[
            ("WARDEN_HEADER_READ_TIMEOUT_MS", "1500"),
            ("WARDEN_IDLE_TIMEOUT_MS", "2500"),
            ("WARDEN_MAX_CONNECTIONS", "30"),
            ("WARDEN_MAX_CONNECTIONS_PER_IP", "7"),
        ]))
        .unwrap();
        assert_eq!(
            c.connections,
            ConnectionLimits {
                header_read_timeout: Duration::from_millis(1500),
                idle_timeout: Duration::from_millis(2500),
                max_connections: 30,
                max_connections_per_ip: 7,
            }
        );
        for var in [
            "WARDEN_HEADER_READ_TIMEOUT_MS",
            "WARDEN_IDLE_TIMEOUT_MS",
            "WARDEN_MAX_CONNECTIONS",
            "WARDEN_MAX_CONNECTIONS_PER_IP",
        ] {
            let err = Config::from_vars(&vars(&[(var, "0")])).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn admission_limits_are_read_and_checked() {
        let c = Config::from_vars(&vars(&[])).unwrap();
        assert_eq!(
            c.admission,
            AdmissionLimits {
                tenant_request_share: 25,
                body_read_timeout: Duration::from_secs(5),
                max_parked_claims: 1_024,
                tenant_max_parked_claims: 256,
                key_max_parked_claims: 64,
            }
        );
        let c = Config::from_vars(&vars(&[
            ("WARDEN_TENANT_REQUEST_SHARE", "100"),
            ("WARDEN_BODY_READ_TIMEOUT_MS", "750"),
            ("WARDEN_MAX_PARKED_CLAIMS", "9"),
            ("WARDEN_TENANT_MAX_PARKED_CLAIMS", "4"),
            ("WARDEN_KEY_MAX_PARKED_CLAIMS", "2"),
        ]))
        .unwrap();
        assert_eq!(
            c.admission,
            AdmissionLimits {
                tenant_request_share: 100,
                body_read_timeout: Duration::from_millis(750),
                max_parked_claims: 9,
                tenant_max_parked_claims: 4,
                key_max_parked_claims: 2,
            }
        );
        for (var, bad) in [
            ("WARDEN_TENANT_REQUEST_SHARE", "0"),
            ("WARDEN_TENANT_REQUEST_SHARE", "101"),
            ("WARDEN_BODY_READ_TIMEOUT_MS", "0"),
            ("WARDEN_MAX_PARKED_CLAIMS", "0"),
            ("WARDEN_TENANT_MAX_PARKED_CLAIMS", "0"),
            ("WARDEN_KEY_MAX_PARKED_CLAIMS", "0"),
        ] {
            let err = Config::from_vars(&vars(&[(var, bad)])).unwrap_err();
            assert!(err.to_string().contains(var), "{var}={bad}: {err}");
        }
    }

    #[cfg(not(feature = "embedded"))]
    #[test]
    fn database_url_is_required_without_the_embedded_server() {
        let err = Config::from_vars(&HashMap::new()).unwrap_err();
        assert!(err.to_string().contains("DATABASE_URL"));
    }

    #[cfg(feature = "embedded")]
    #[test]
    fn without_database_url_the_embedded_server_keeps_data_in_dot_warden() {
        let c = Config::from_vars(&HashMap::new()).unwrap();
        assert!(c.database_url.is_none());
        assert_eq!(c.data_dir, PathBuf::from("./.warden"));
        let c = Config::from_vars(&HashMap::from([(
            "WARDEN_DATA_DIR".to_string(),
            "/var/lib/warden/db".to_string(),
        )]))
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/warden/db"));
    }

    #[test]
    fn retention_is_days_or_a_span_and_archives_go_beneath_the_data_dir() {
        let vars = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = Config::from_vars(&HashMap::new()).unwrap();
        assert_eq!(c.retention.keep, None);
        assert_eq!(c.retention.archive_dir, PathBuf::from("./.warden/archive"));
        assert_eq!(c.retention.event_horizon, 10_000);
        assert_eq!(c.retention.prune_interval, Duration::from_secs(300));
        let c = Config::from_vars(&vars(&[
            ("WARDEN_RETENTION_DAYS", "30"),
            ("WARDEN_DATA_DIR", "/var/lib/warden"),
        ]))
        .unwrap();
        assert_eq!(c.retention.keep, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(
            c.retention.archive_dir,
            PathBuf::from("/var/lib/warden/archive")
        );
        let c = Config::from_vars(&vars(&[
            ("WARDEN_RETENTION_DAYS", "90s"),
            ("WARDEN_ARCHIVE_DIR", "/srv/archive"),
        ]))
        .unwrap();
        assert_eq!(c.retention.keep, Some(Duration::from_secs(90)));
        assert_eq!(c.retention.archive_dir, PathBuf::from("/srv/archive"));
        for bad in ["-1", "1.5", "soon", "12x"] {
            let err = Config::from_vars(&vars(&[("WARDEN_RETENTION_DAYS", bad)])).unwrap_err();
            assert!(err.to_string().contains("WARDEN_RETENTION_DAYS"), "{err}");
        }
        let err = Config::from_vars(&vars(&[("WARDEN_PRUNE_INTERVAL", "0s")])).unwrap_err();
        assert!(err.to_string().contains("WARDEN_PRUNE_INTERVAL"), "{err}");
    }
}
