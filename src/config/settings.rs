//! Every setting, defined once: its name, default, meaning, the layer that
//! reads it and the create-request field that overrides it per session.
//! Loading the configuration, `warden config` and the configuration reference's table (docs/reference/configuration.md) all
//! read this table, so none of them can drift from the others.

use std::borrow::Cow;
use std::collections::HashMap;

/// The part of the service that reads a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// The HTTP edge: listening, connections, requests.
    Http,
    /// Keys and tokens.
    Auth,
    /// The session loops, their supervisor and the session service.
    Session,
    /// What runs a step: tools, workspaces, outbound requests.
    Executor,
    /// Calls to the model.
    Llm,
    /// The database.
    Store,
    /// Logging.
    Log,
    /// OpenTelemetry traces.
    Telemetry,
    /// The memory allocator, mimalloc, which reads its own settings at start.
    Allocator,
}

impl Layer {
    /// The layer's name as the table prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Http => "http",
            Layer::Auth => "auth",
            Layer::Session => "session",
            Layer::Executor => "executor",
            Layer::Llm => "llm",
            Layer::Store => "store",
            Layer::Log => "log",
            Layer::Telemetry => "telemetry",
            Layer::Allocator => "allocator",
        }
    }
}

/// What a setting is when the environment leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// This text, read exactly as if the variable were set to it.
    Text(&'static str),
    /// No value: what the setting enables is off.
    Unset,
    /// The number of CPU cores.
    Cores,
    /// The value of another setting.
    SameAs(&'static str),
    /// A directory of this name inside the path another setting gives.
    Beneath(&'static str, &'static str),
}

/// One setting, read from the environment variable of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// The layer that reads it.
    pub layer: Layer,
    /// Its value when unset.
    pub default: DefaultValue,
    /// What it means, in one line.
    pub meaning: &'static str,
    /// A secret: never printed, only whether it is set.
    pub secret: bool,
    /// An earlier name, still read when the current one is unset.
    pub old_name: Option<&'static str>,
    /// The create-request field that overrides it for one session.
    pub per_session: Option<&'static str>,
}

/// Where the value in effect came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The table's default.
    Default,
    /// The environment variable of this name (the setting's or its old name).
    Env(&'static str),
}

impl Setting {
    const fn new(
        name: &'static str,
        layer: Layer,
        default: DefaultValue,
        meaning: &'static str,
    ) -> Setting {
        Setting {
            name,
            layer,
            default,
            meaning,
            secret: false,
            old_name: None,
            per_session: None,
        }
    }

    const fn secret(mut self) -> Setting {
        self.secret = true;
        self
    }

    const fn old(mut self, name: &'static str) -> Setting {
        self.old_name = Some(name);
        self
    }

    const fn session(mut self, field: &'static str) -> Setting {
        self.per_session = Some(field);
        self
    }

    /// The variable that is set (the current name first, then the old
    /// one) and its text as set; blank counts as unset.
    pub fn lookup<'v>(&self, vars: &'v HashMap<String, String>) -> Option<(&'static str, &'v str)> {
        [Some(self.name), self.old_name]
            .into_iter()
            .flatten()
            .find_map(|var| {
                vars.get(var)
                    .map(String::as_str)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (var, v))
            })
    }

    /// The text in effect (as set, untrimmed, or the default) and where it
    /// came from; `None` when neither the environment nor a default gives one.
    pub fn text<'v>(&self, vars: &'v HashMap<String, String>) -> Option<(Cow<'v, str>, Origin)> {
        if let Some((var, text)) = self.lookup(vars) {
            return Some((Cow::Borrowed(text), Origin::Env(var)));
        }
        let text = match self.default {
            DefaultValue::Text(text) => Cow::Borrowed(text),
            DefaultValue::Unset => return None,
            DefaultValue::Cores => Cow::Owned(
                std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .to_string(),
            ),
            DefaultValue::SameAs(other) => find(other)?.text(vars)?.0,
            DefaultValue::Beneath(other, name) => {
                let parent = find(other)?.text(vars)?.0;
                Cow::Owned(
                    std::path::Path::new(parent.trim())
                        .join(name)
                        .to_string_lossy()
                        .into_owned(),
                )
            }
        };
        Some((text, Origin::Default))
    }

    /// The value in effect, trimmed, for readers outside configuration
    /// loading (the CLI's subcommands).
    pub fn value(&self, vars: &HashMap<String, String>) -> Option<String> {
        self.text(vars).map(|(text, _)| text.trim().to_string())
    }
}

/// The setting of this name (or old name).
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS
        .iter()
        .find(|s| s.name == name || s.old_name == Some(name))
}

/// The process environment, as text (variables that are not UTF-8 are
/// none of Warden's and are left out).
pub fn process_env() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

macro_rules! default_value {
    (unset) => {
        DefaultValue::Unset
    };
    (cores) => {
        DefaultValue::Cores
    };
    (same_as $other:ident) => {
        DefaultValue::SameAs(stringify!($other))
    };
    (beneath $other:ident $name:literal) => {
        DefaultValue::Beneath(stringify!($other), $name)
    };
    ($text:literal) => {
        DefaultValue::Text($text)
    };
}

/// Defines each setting as a constant named as its variable, and
/// [`SETTINGS`] listing them all in order.
macro_rules! settings {
    ($(
        $name:ident ($layer:ident $(, $flag:ident $($arg:literal)?)*)
            = $default:tt $($default_arg:ident)? $($default_name:literal)? => $meaning:literal;
    )*) => {
        $(
            #[doc = $meaning]
            pub const $name: Setting = Setting::new(
                stringify!($name),
                Layer::$layer,
                default_value!($default $($default_arg)? $($default_name)?),
                $meaning,
            )$(.$flag($($arg)?))*;
        )*

        /// Every setting, in the order the configuration reference lists them.
        pub const SETTINGS: &[Setting] = &[$($name),*];
    };
}

settings! {
    // Named by the tools that define them (Postgres clients, tracing, mimalloc, OpenTelemetry).
    DATABASE_URL (Store, secret) = unset =>
        "Postgres server URL; unset, an embedded PostgreSQL in `WARDEN_DATA_DIR` (builds with the default `embedded` feature; required without it)";
    RUST_LOG (Log) = "info" =>
        "log filter (`info`, `warden=debug`, …)";
    MIMALLOC_PURGE_DELAY (Allocator) = "0" =>
        "milliseconds before freed memory goes back to the system (read by mimalloc itself); Warden sets `0` at start unless this is set, mimalloc's own default is `1000`";
    OTEL_EXPORTER_OTLP_ENDPOINT (Telemetry) = unset =>
        "OTLP collector base URL (`http://127.0.0.1:4318`, gRPC `http://127.0.0.1:4317`); set, Warden exports traces and the GenAI client metrics (HTTP: to `/v1/traces` and `/v1/metrics` under it)";
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (Telemetry) = unset =>
        "the traces URL itself, used as is; wins over `OTEL_EXPORTER_OTLP_ENDPOINT`";
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (Telemetry) = unset =>
        "the metrics URL itself, used as is; wins over `OTEL_EXPORTER_OTLP_ENDPOINT` (with neither, no metrics are exported)";
    OTEL_METRIC_EXPORT_INTERVAL (Telemetry) = "60000" =>
        "milliseconds between exports of the GenAI client metrics (read by the SDK itself)";
    OTEL_EXPORTER_OTLP_PROTOCOL (Telemetry) = "http/protobuf" =>
        "`http/protobuf` or `grpc` (plaintext; use `http/protobuf` for TLS)";
    OTEL_EXPORTER_OTLP_HEADERS (Telemetry, secret) = unset =>
        "headers sent with every export, `key1=value1,key2=value2` (read by the exporter itself)";
    OTEL_SERVICE_NAME (Telemetry) = "warden" =>
        "the traces' `service.name` (unset with `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, that one)";
    OTEL_RESOURCE_ATTRIBUTES (Telemetry) = unset =>
        "more resource attributes, `key1=value1,key2=value2` (read by the SDK itself)";
    OTEL_BSP_SCHEDULE_DELAY (Telemetry) = "5000" =>
        "milliseconds between exports of buffered spans (read by the SDK itself)";
    WARDEN_TRACE_CONTENT (Telemetry) = "false" =>
        "`true` records prompts and answers on the spans (`gen_ai.input.messages`, `gen_ai.output.messages`, capped at 16,384 characters each); off, no content leaves in traces";

    // The service.
    WARDEN_DATA_DIR (Store) = "./.warden" =>
        "the embedded PostgreSQL's data (unused with `DATABASE_URL`); one process at a time";
    WARDEN_MIGRATE (Store) = "auto" =>
        "`auto`: apply this binary's migrations at start-up; `off`: never, and refuse to start on a schema that is behind (apply them with `warden migrate`); a schema newer than the binary is always refused";
    WARDEN_DB_MAX_CONNECTIONS (Store) = "16" =>
        "pool of the session loops; the API has a pool of its own, a quarter of this (at least 2), unless `WARDEN_LOOP_THREADS=0` makes them share one";
    WARDEN_DB_ACQUIRE_TIMEOUT_MS (Store) = "2000" =>
        "how long an API request waits for a pooled connection before answering 503";
    WARDEN_LISTEN_ADDR (Http) = "127.0.0.1:8080" =>
        "listen address, unless `warden --listen ADDR` names another (beyond loopback only with auth, see Security)";
    WARDEN_LOG_FORMAT (Log) = "text" =>
        "`text` or `json` (one object per line); the level is `RUST_LOG`'s";
    WARDEN_ADMIN_TOKEN (Auth, secret) = unset =>
        "an admin key from the environment (at least 16 characters)";
    WARDEN_METRICS_TOKEN (Auth, secret) = unset =>
        "a token that may read `/metrics` only (at least 16 characters)";
    WARDEN_AUTH (Auth) = "on" =>
        "`off` serves without keys on any address (warned at start), to loopback `Host` names only";
    WARDEN_SECRET_KEY (Session, secret) = unset =>
        "256-bit key (64 hex digits or base64) sealing sessions' own API keys; a wrong length stops start-up";
    WARDEN_SECRET_KEY_FILE (Session) = unset =>
        "where the keys are kept when `WARDEN_SECRET_KEY(S)` is unset (default `secret.key` in `WARDEN_DATA_DIR`, beside the data it seals): one a line, the current first (generated, mode 0600, on first start; `warden secrets rotate` adds one)";
    WARDEN_SECRET_KEYS (Session, secret) = unset =>
        "the key ring, comma-separated keys: the first seals new secrets, the others still open what they sealed (wins over `WARDEN_SECRET_KEY` and the key file); see `warden secrets`";
    WARDEN_SECRET_KEY_PREVIOUS (Session, secret) = unset =>
        "earlier keys, comma-separated, that still open what they sealed; after start their secrets are sealed again under the current key in the background (rotation)";
    WARDEN_MAX_BODY_BYTES (Http) = "1048576" =>
        "request body limit (413 above)";
    WARDEN_REQUEST_TIMEOUT_MS (Http) = "30000" =>
        "longest a request may run (live streams and probes exempt); 503 `request_timeout` after";
    WARDEN_MAX_CONCURRENT_REQUESTS (Http) = "512" =>
        "requests served at once (live streams and probes exempt); 503 `overloaded` beyond";
    WARDEN_TENANT_REQUEST_SHARE (Http) = "25" =>
        "percent of `WARDEN_MAX_CONCURRENT_REQUESTS` one tenant's requests may hold at once (at least 1), so a tenant flooding a replica leaves the others their slots; 429 `tenant_request_limit` (with `Retry-After`) beyond";
    WARDEN_BODY_READ_TIMEOUT_MS (Http) = "5000" =>
        "a request's body must arrive in full within this of its headers; 408 `body_timeout` after (and the connection closed), so a body trickled in cannot hold a request slot";
    WARDEN_MAX_PARKED_CLAIMS (Http) = "1024" =>
        "worker claims waiting for a task (`wait_ms`) at once per replica, in a pool of their own: a waiting claim holds no request slot; 503 `overloaded` beyond";
    WARDEN_TENANT_MAX_PARKED_CLAIMS (Http) = "256" =>
        "waiting worker claims per tenant and replica; 429 `claim_limit` (with `Retry-After`) beyond";
    WARDEN_KEY_MAX_PARKED_CLAIMS (Http) = "64" =>
        "waiting worker claims per worker key and replica; 429 `claim_limit` (with `Retry-After`) beyond";
    WARDEN_HEADER_READ_TIMEOUT_MS (Http) = "10000" =>
        "a request's line and headers must arrive within this of the connection's accept (or, kept alive, of the previous response); the connection is closed after it";
    WARDEN_IDLE_TIMEOUT_MS (Http) = "60000" =>
        "a connection over which no byte moves either way for this long is closed (live streams send a keep-alive every 15 s: keep it above that)";
    WARDEN_MAX_CONNECTIONS (Http) = "10000" =>
        "open connections per replica; more are closed as soon as accepted (keep it under `ulimit -n`)";
    WARDEN_MAX_CONNECTIONS_PER_IP (Http) = "1000" =>
        "open connections from one client address (an IPv6 client's /64); more are closed as soon as accepted";
    WARDEN_TENANT_MAX_STREAMS (Http) = "32" =>
        "open live streams per tenant; 429 `stream_limit` beyond";
    WARDEN_TENANT_MAX_RUNNING (Session) = "1000" =>
        "active sessions (running, awaiting refinement) per tenant; 429 `tenant_running_limit` beyond; also the most of a tenant's sessions, children included, that the queue starts at once";
    WARDEN_TENANT_MODEL_CALLS_PER_MINUTE (Session) = "60" =>
        "calls per tenant, fleet-wide, on the server's model (refinement, criteria, reflection); 429 `tenant_model_rate_limit` on create, reflection deferred in the loop; `0` unlimited";
    WARDEN_LOOP_THREADS (Session) = cores =>
        "worker threads of the session loops' own runtime; `0` runs them on the API's";
    WARDEN_LOOP_NICE (Session) = "10" =>
        "niceness of those threads (0–19), so the API answers first on a saturated machine";
    WARDEN_LEASE_TTL_MS (Session) = "15000" =>
        "how long a replica's lease on a session lasts without renewal";
    WARDEN_HEARTBEAT_INTERVAL_MS (Session) = "5000" =>
        "lease renewal, orphan rescue and queue claim interval (at most half the lease)";
    WARDEN_MAX_RUNNING (Session) = "1000" =>
        "sessions this replica runs at once; beyond it a created or resumed session waits `queued` (with its `queue_position`) until some replica has room";
    WARDEN_CLAIMS_PER_TICK (Session) = "100" =>
        "most queued or orphaned sessions a replica claims per heartbeat (a freed place claims at once)";
    WARDEN_CAPABILITIES_OFF (Session) = unset =>
        "capabilities this replica does not announce, comma-separated (`delegate`, `review_every`, `approvals`, `mcp_tools`): it never runs a session that needs one, and a create needing one goes to a replica that has it (409 when none does)";
    WARDEN_MAX_ATTEMPTS (Session) = "5" =>
        "failed attempts in a row (rescues without progress) before a session ends `failed / internal_error`";
    WARDEN_STOP_WAIT_MS (Session) = "5000" =>
        "how long stop/pause wait for the loop to land before answering";
    WARDEN_THROTTLE_COOLDOWN_MS (Session) = "5000" =>
        "delay inserted by a gate throttle";
    WARDEN_GATE_REVIEW_EVERY (Session, old "WARDEN_GATE_STEP_LIMIT", session "limits.review_every") = "100" =>
        "steps since the last start/resume after which a continuous session pauses `review_required` (0 = never; fixed-mode sessions have none unless they set it); `WARDEN_GATE_STEP_LIMIT`, its earlier name, is read when it is unset";
    WARDEN_GATE_CHECKPOINT_EVERY (Session) = "25" =>
        "steps since the last checkpoint before the gate forces one";
    WARDEN_PROJECTION_MARGIN (Session) = "2.0" =>
        "pause (`budget_projected_overrun`) when the projected tokens to finish exceed this many times the tokens left…";
    WARDEN_PROJECTION_EVALUATIONS (Session) = "3" =>
        "…for this many gate evaluations in a row (1–20)";
    WARDEN_MODEL_PRICES (Session) = unset =>
        "prices per million tokens by model, for every step's and session's `cost_usd`: `pattern=input/output[/cached_input][@YYYY-MM-DD]` entries separated by `;` (e.g. `gpt-4o=2.50/10/1.25; claude-sonnet-4*=3/15/0.30; *=5/20`); `*` in a pattern matches any run of characters, a lone `*` prices every model no other entry names; without one, steps of such models are counted `unpriced_steps`, never 0 (docs/guides/money.md)";
    WARDEN_APPROVAL_TIMEOUT_MS (Session) = "86400000" =>
        "how long a tool call (or an agent's action) waits for a person's approval before it expires, told to the agent as not approved; also how long a session `awaiting_confirmation` waits before it ends `stopped / confirmation_expired` (1000 to 30 days)";
    WARDEN_WORKSPACE_RETENTION (Session) = "7d" =>
        "how long an ended session's workspace stays on the disk (`90s`, `30m`, `12h`, `7d`); swept in the background";
    WARDEN_RETENTION_DAYS (Session) = unset =>
        "ended sessions whose end is older than this are archived to `WARDEN_ARCHIVE_DIR`, then deleted with their history and workspace: days (`30`), or a span with a unit (`12h`, `90s`); unset keeps them forever; a tenant's own: `PUT /api/retention`";
    WARDEN_ARCHIVE_DIR (Session) = beneath WARDEN_DATA_DIR "archive" =>
        "where archived sessions go, one file each: `<tenant>/<yyyy-mm>/<session id>.jsonl.zst`";
    WARDEN_EVENT_HORIZON (Session) = "10000" =>
        "events of a session kept whole; older ones are compacted away except decisions, reflections, status changes and control events (`0` keeps every event)";
    WARDEN_PRUNE_INTERVAL (Session) = "5m" =>
        "how often the pruner (one replica at a time) looks for sessions past their retention and events past the horizon (`30s`, `5m`, `1h`)";
    WARDEN_WORKSPACE_ROOT (Executor) = "./workspaces" =>
        "per-session workspaces";
    WARDEN_WORKSPACE_MAX_BYTES (Executor) = "104857600" =>
        "bytes of files in one session's workspace";
    WARDEN_WORKSPACE_MAX_FILES (Executor) = "10000" =>
        "files in one session's workspace";
    WARDEN_WORKSPACE_MAX_ENTRIES (Executor) = "10000" =>
        "entries of every kind (files and directories) in one session's workspace";
    WARDEN_WORKSPACE_MAX_DEPTH (Executor) = "32" =>
        "components of a workspace path (paths are also held to 1,024 bytes, 255 per name)";
    WARDEN_MAX_FILE_BYTES (Executor) = "1048576" =>
        "largest file a tool reads or writes";
    WARDEN_MAX_TOOL_CALLS_PER_STEP (Executor) = "16" =>
        "tool calls of one model answer that run; the rest get an error result";
    WARDEN_MAX_OUTPUT_BYTES (Executor) = "262144" =>
        "bytes stored of each text of a step's answer (output, message, error, arguments, conversation messages); the rest is dropped, head and tail kept, with a marker saying how many bytes were dropped";
    WARDEN_EGRESS_ALLOW (Executor) = unset =>
        "client-chosen URLs (`executor.base_url`, webhook `url`) may reach these too despite being loopback/private: hosts, `host:port`, addresses, CIDR ranges, comma-separated";
    WARDEN_EGRESS_MAX_RESPONSE_BYTES (Executor) = "4194304" =>
        "largest answer read from a client-chosen URL";
    WARDEN_MCP_CONFIG (Executor) = unset =>
        "a JSON file of MCP servers (`{\"mcpServers\": {…}}`: stdio `command`s or Streamable HTTP `url`s) whose tools `llm` sessions may choose with `executor.tools`; read at start";
    WARDEN_LLM_BASE_URL (Llm, session "executor.base_url") = unset =>
        "default OpenAI-compatible endpoint, up to `/v1`; also enables reflection";
    WARDEN_LLM_MODEL (Llm, session "executor.model") = unset =>
        "default model name";
    WARDEN_LLM_API_KEY (Llm, secret) = unset =>
        "bearer token for that endpoint, sent to it only";
    WARDEN_LLM_TIMEOUT_MS (Llm, session "executor.timeout_ms") = "120000" =>
        "timeout of one model call, for every endpoint";
    WARDEN_LLM_MAX_RETRIES (Llm) = "3" =>
        "retries of a failed call (429, 5xx, connection errors), for every endpoint";
    WARDEN_LLM_RETRY_BASE_MS (Llm) = "500" =>
        "first backoff delay (doubles per retry, honours `Retry-After`), for every endpoint";
    WARDEN_LLM_MAX_TOKENS (Llm) = "2048" =>
        "most tokens one call may generate (less when the budget has less left)";

    // The loop's defaults, under the seed specification's names.
    AUTONOMOUS_MODE (Session, session "mode") = "fixed" =>
        "default mode: `fixed` or `continuous`";
    AUTONOMOUS_FIXED_ITERATIONS (Session, session "limits.max_iterations") = "50" =>
        "default iteration limit in fixed mode";
    AUTONOMOUS_MAX_ITERATIONS (Session, session "limits.max_iterations") = "200" =>
        "default iteration limit in continuous mode";
    AUTONOMOUS_MAX_WALL_TIME_MS (Session, session "limits.max_wall_time_ms") = "7200000" =>
        "default wall-clock budget (running time)";
    AUTONOMOUS_MAX_TOKENS (Session, session "limits.max_tokens") = "500000" =>
        "default token budget";
    AUTONOMOUS_MAX_CONSECUTIVE_ERRORS (Session, session "limits.max_consecutive_errors") = "5" =>
        "default error threshold";
    AUTONOMOUS_REFLECTION_INTERVAL (Session, session "limits.reflection_interval") = "10" =>
        "reflect every N iterations (continuous mode)";
    AUTONOMOUS_CHECKPOINT_INTERVAL (Session, session "limits.checkpoint_interval") = "10" =>
        "checkpoint every N iterations";
    AUTONOMOUS_MAX_CYCLES (Session, session "limits.max_cycles") = "10" =>
        "default context-cycle limit";
    AUTONOMOUS_CONTEXT_TOKENS (Session, session "limits.context_budget_tokens") = "32000" =>
        "default context budget per cycle (wrap-up at 80 %)";
    AUTONOMOUS_REQUIRE_CONCRETE_GOALS (Session) = "true" =>
        "ambiguous goals wait in `awaiting_refinement`";
    AUTONOMOUS_AUTO_REFINE_GOALS (Session) = "false" =>
        "apply the suggested refinement without waiting";
    AUTONOMOUS_REFLECTION_MODEL (Session) = same_as WARDEN_LLM_MODEL =>
        "reflection model";
    AUTONOMOUS_REFLECTION_TEMPERATURE (Session) = "0.7" =>
        "reflection temperature (0–2)";
    AUTONOMOUS_REFLECTION_TOP_P (Session) = "0.6" =>
        "reflection top_p (0–1)";
}

/// A setting with the value in effect and where it came from; a secret's
/// value is only whether it is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InEffect {
    /// The setting.
    pub setting: &'static Setting,
    /// Its value as text, or `(set)` / `(unset)`.
    pub value: String,
    /// Where the value came from.
    pub origin: Origin,
}

/// Every setting's value in effect under `vars`, in table order.
pub fn in_effect(vars: &HashMap<String, String>) -> Vec<InEffect> {
    SETTINGS
        .iter()
        .map(|setting| {
            let found = setting.text(vars);
            let origin = found.as_ref().map_or(Origin::Default, |(_, o)| *o);
            let value = match found {
                None => "(unset)".to_string(),
                Some(_) if setting.secret => "(set)".to_string(),
                Some((text, _)) => text.trim().to_string(),
            };
            InEffect {
                setting,
                value,
                origin,
            }
        })
        .collect()
}

/// The settings as `warden config` prints them: one per line, the name,
/// the value in effect and where it came from.
pub fn render_in_effect(vars: &HashMap<String, String>) -> String {
    let rows = in_effect(vars);
    let name_width = rows.iter().map(|r| r.setting.name.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|r| r.value.chars().count())
        .max()
        .unwrap_or(0)
        .min(40);
    let mut out = String::new();
    for row in rows {
        let origin = match row.origin {
            Origin::Default => "default".to_string(),
            Origin::Env(var) if var == row.setting.name => "env".to_string(),
            Origin::Env(var) => format!("env ({var})"),
        };
        out.push_str(&format!(
            "{:name_width$}  {:value_width$}  {origin}\n",
            row.setting.name, row.value
        ));
    }
    out
}

/// The opening marker of the settings table in docs/reference/configuration.md.
pub const README_BEGIN: &str =
    "<!-- settings:begin (generated: cargo run -q -- config --markdown) -->";
/// The closing marker of the settings table in docs/reference/configuration.md.
pub const README_END: &str = "<!-- settings:end -->";

/// The settings section of docs/reference/configuration.md between its markers, rendered from the table.
pub fn markdown() -> String {
    let mut out = String::from(
        "Every setting is an environment variable, read once at start; a bad value stops \
start-up with a message naming it, and `warden config` prints each with the value in \
effect and where it came from (secrets only as `(set)`). The prefix says whose setting it is:\n\
\n\
- `AUTONOMOUS_*`: the loop's defaults, under the seed specification's names: what a \
session gets when its create request leaves the field out (the *per session* column names \
the field that overrides it, within documented ranges; out of range → 422 naming the field).\n\
- `WARDEN_*`: the service itself (listening, storage, the fleet, quotas, the model \
endpoint); a session cannot change them.\n\
- `DATABASE_URL`, `RUST_LOG` and `MIMALLOC_PURGE_DELAY` keep the names of the tools that \
define them (sqlx and Postgres clients, tracing, the mimalloc allocator).\n\
\n\
| variable | default | read by | per session | meaning |\n\
|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let default = match s.default {
            DefaultValue::Text(text) => format!("`{text}`"),
            DefaultValue::Unset => "(unset)".to_string(),
            DefaultValue::Cores => "cores".to_string(),
            DefaultValue::SameAs(other) => format!("`{other}`"),
            DefaultValue::Beneath(other, name) => format!("`{other}`/{name}"),
        };
        let per_session = s.per_session.map_or(String::new(), |f| format!("`{f}`"));
        let secret = if s.secret {
            "; a secret: never logged nor printed"
        } else {
            ""
        };
        out.push_str(&format!(
            "| `{}` | {default} | {} | {per_session} | {}{secret} |\n",
            s.name,
            s.layer.as_str(),
            s.meaning
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_are_unique_and_carry_a_known_prefix() {
        let mut names: Vec<&str> = SETTINGS
            .iter()
            .flat_map(|s| [Some(s.name), s.old_name])
            .flatten()
            .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name is defined twice");
        for name in names {
            assert!(
                name.starts_with("WARDEN_")
                    || name.starts_with("AUTONOMOUS_")
                    // OpenTelemetry's standard variables, as every OTel SDK reads them.
                    || name.starts_with("OTEL_")
                    || ["DATABASE_URL", "RUST_LOG", "MIMALLOC_PURGE_DELAY"].contains(&name),
                "{name}: a new setting is WARDEN_* (the service) or AUTONOMOUS_* (the loop's defaults)"
            );
        }
        for s in SETTINGS {
            if let DefaultValue::SameAs(other) | DefaultValue::Beneath(other, _) = s.default {
                assert!(find(other).is_some(), "{}: no setting {other}", s.name);
            }
        }
    }

    #[test]
    fn the_egress_default_is_the_one_the_model_client_uses() {
        assert_eq!(
            WARDEN_EGRESS_MAX_RESPONSE_BYTES.default,
            DefaultValue::Text("4194304")
        );
        assert_eq!(crate::egress::DEFAULT_MAX_RESPONSE_BYTES, 4_194_304);
    }

    #[test]
    fn values_in_effect_say_where_they_came_from_and_hide_secrets() {
        let env = vars(&[
            ("WARDEN_MAX_RUNNING", " 7 "),
            ("WARDEN_GATE_STEP_LIMIT", "30"),
            ("WARDEN_ADMIN_TOKEN", "admin-token-0123456789"),
            ("DATABASE_URL", "postgres://u:hunter2@h/w"),
            ("WARDEN_LLM_MODEL", "qwen3"),
            ("WARDEN_LOG_FORMAT", "   "),
        ]);
        let shown = in_effect(&env);
        let row = |name: &str| shown.iter().find(|r| r.setting.name == name).unwrap();
        assert_eq!(row("WARDEN_MAX_RUNNING").value, "7");
        assert_eq!(
            row("WARDEN_MAX_RUNNING").origin,
            Origin::Env("WARDEN_MAX_RUNNING")
        );
        assert_eq!(row("WARDEN_GATE_REVIEW_EVERY").value, "30");
        assert_eq!(
            row("WARDEN_GATE_REVIEW_EVERY").origin,
            Origin::Env("WARDEN_GATE_STEP_LIMIT")
        );
        assert_eq!(row("WARDEN_ADMIN_TOKEN").value, "(set)");
        assert_eq!(row("DATABASE_URL").value, "(set)");
        assert_eq!(row("WARDEN_METRICS_TOKEN").value, "(unset)");
        assert_eq!(row("WARDEN_LOG_FORMAT").value, "text");
        assert_eq!(row("WARDEN_LOG_FORMAT").origin, Origin::Default);
        assert_eq!(row("AUTONOMOUS_REFLECTION_MODEL").value, "qwen3");
        assert_eq!(row("AUTONOMOUS_REFLECTION_MODEL").origin, Origin::Default);
        assert!(row("WARDEN_LOOP_THREADS").value.parse::<usize>().is_ok());
        assert_eq!(shown.len(), SETTINGS.len());
        let printed = render_in_effect(&env);
        assert_eq!(printed.lines().count(), SETTINGS.len());
        assert!(
            printed.contains("env (WARDEN_GATE_STEP_LIMIT)"),
            "{printed}"
        );
        for secret in ["admin-token-0123456789", "hunter2"] {
            assert!(!printed.contains(secret), "{printed}");
        }
    }

    /// The page that holds the settings table.
    const CONFIGURATION_PAGE: &str = "docs/reference/configuration.md";

    fn manifest_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// The text between the configuration page's settings markers.
    fn readme_section(readme: &str) -> Option<&str> {
        let start = readme.find(README_BEGIN)? + README_BEGIN.len();
        let end = start + readme[start..].find(README_END)?;
        Some(readme[start..end].trim_start_matches('\n'))
    }

    #[test]
    fn the_readme_table_is_the_code_table() {
        let path = manifest_dir().join(CONFIGURATION_PAGE);
        let readme = std::fs::read_to_string(&path).expect("the configuration page is readable");
        let section = readme_section(&readme).unwrap_or_else(|| {
            panic!("{CONFIGURATION_PAGE} has no {README_BEGIN} … {README_END} section")
        });
        let rendered = markdown();
        if section == rendered {
            return;
        }
        if std::env::var_os("UPDATE_README").is_some() {
            let start = readme.find(README_BEGIN).expect("found above") + README_BEGIN.len();
            let end = start + readme[start..].find(README_END).expect("found above");
            let updated = format!("{}\n{rendered}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).expect("the configuration page is writable");
            return;
        }
        panic!(
            "{CONFIGURATION_PAGE}'s settings table differs from src/config/settings.rs; rewrite it with \
`UPDATE_README=1 cargo test --lib the_readme_table_is_the_code_table` (or paste the output \
of `cargo run -q -- config --markdown` between the markers)"
        );
    }

    /// Every `.rs` file below `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("source directory is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Names with a settings prefix that are not settings: the goal
    /// sentinels a model writes in its output, the README's shell variable
    /// holding the reader's key, the Python worker's own variables
    /// (where its Warden is, which queue it serves, which binary its end-to-end run starts),
    /// and the key the `warden sessions` client sends (src/cli/client.rs).
    fn not_a_setting(name: &str) -> bool {
        name.starts_with("WARDEN_GOAL")
            || [
                "WARDEN_KEY",
                "WARDEN_URL",
                "WARDEN_QUEUE",
                "WARDEN_BIN",
                "WARDEN_API_KEY",
            ]
            .contains(&name)
    }

    /// Each `WARDEN_*` / `AUTONOMOUS_*` name in `text`, where `quoted` asks
    /// only for those that open a string literal.
    fn setting_names(text: &str, quoted: bool) -> Vec<String> {
        let mut out = Vec::new();
        for prefix in ["WARDEN_", "AUTONOMOUS_"] {
            for (at, _) in text.match_indices(prefix) {
                let before = text[..at].chars().next_back();
                let starts_word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                if !starts_word || (quoted && before != Some('"')) {
                    continue;
                }
                let name: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let name = name.trim_end_matches('_').to_string();
                if name.len() > prefix.len() && !not_a_setting(&name) {
                    out.push(name);
                }
            }
        }
        out
    }

    #[test]
    fn code_reads_no_variable_outside_the_table() {
        let root = manifest_dir();
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        sources(&root.join("tests"), &mut files);
        sources(&root.join("bench"), &mut files);
        let mut unknown = Vec::new();
        let mut direct = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source is readable");
            let relative = file.strip_prefix(&root).expect("below the root");
            for name in setting_names(&text, true) {
                if find(&name).is_none() {
                    unknown.push(format!("{}: {name}", relative.display()));
                }
            }
            // Only configuration loading reads the environment; the test
            // harness and the benchmark read their own database's URL.
            let allowed = [
                "src/config",
                "src/store/testing.rs",
                "src/bin/",
                "tests/",
                "bench/",
            ];
            let path = relative.to_string_lossy().replace('\\', "/");
            if !allowed.iter().any(|a| path.starts_with(a))
                && (text.contains("env::var(") || text.contains("env::var_os("))
            {
                direct.push(path);
            }
        }
        assert!(
            unknown.is_empty(),
            "names that are not in the settings table (src/config/settings.rs):\n{}",
            unknown.join("\n")
        );
        assert!(
            direct.is_empty(),
            "read the environment through the settings table (config::settings), not std::env: {direct:?}"
        );
    }

    #[test]
    fn the_readme_and_the_container_files_name_only_settings() {
        let root = manifest_dir();
        let mut unknown = Vec::new();
        let mut files = vec![
            "README.md".to_string(),
            "Dockerfile".to_string(),
            "docker-compose.yml".to_string(),
        ];
        for folder in ["docs", "docs/guides", "docs/reference", "docs/operations"] {
            for entry in std::fs::read_dir(root.join(folder)).expect("docs are readable") {
                let path = entry.expect("an entry").path();
                if path.extension().is_some_and(|e| e == "md") {
                    files.push(
                        path.strip_prefix(&root)
                            .expect("below root")
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        for file in &files {
            let text = std::fs::read_to_string(root.join(file)).expect("file is readable");
            for name in setting_names(&text, false) {
                if find(&name).is_none() {
                    unknown.push(format!("{file}: {name}"));
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "names that are not in the settings table (src/config/settings.rs):\n{}",
            unknown.join("\n")
        );
    }

    #[test]
    fn names_are_found_in_text() {
        let text = r#"let a = "WARDEN_MAX_RUNNING"; // WARDEN_LOOP_NICE
            ("AUTONOMOUS_MODE=fixed") "WARDEN_GOAL_DONE>>" XWARDEN_NOT "#;
        assert_eq!(
            setting_names(text, true),
            ["WARDEN_MAX_RUNNING", "AUTONOMOUS_MODE"]
        );
        assert_eq!(
            setting_names(text, false),
            ["WARDEN_MAX_RUNNING", "WARDEN_LOOP_NICE", "AUTONOMOUS_MODE"]
        );
    }
}
