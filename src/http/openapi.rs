//! The OpenAPI document (generated from the handlers and types by utoipa,
//! committed as `openapi/openapi.json`) and a docs page that works offline.
//!
//! Two things utoipa cannot say from attributes are added here: the bounds
//! the validators enforce, taken from their own constants so the document
//! cannot drift from them, and the error answers every operation shares.

use std::sync::LazyLock;

use axum::Router;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;
use utoipa_swagger_ui::{Config, SwaggerUi};

use super::AppState;
use super::paging::{MAX_LIST_LIMIT, MAX_PAGE_LIMIT};
use crate::executor::{MAX_ACTION_CHARS, MAX_DELAY_MS, MAX_OUTPUT_CHARS};
use crate::executor::{MAX_ATTEMPTS, MAX_LABEL_NAME_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS};
use crate::executor::{
    MAX_SCRIPTED_STEPS, MAX_SCRIPTS, MAX_TOKENS_PER_CALL, SCRIPT_NAME_PATTERN, TEMPERATURE,
    TIMEOUT_MS, WORKER_WAIT_MS,
};
use crate::policy::ambiguity::GOAL_HAS_LETTER_PATTERN;
use crate::policy::checklist::{MAX_ITEM_CHARS, MAX_ITEMS};
use crate::policy::delegation::{DEFAULT_MAX_CHILDREN, MAX_CHILD_GOAL_CHARS};
use crate::policy::guardrails::RANGES;
use crate::policy::history::Outcome;
use crate::session::service::{MAX_GOAL_CHARS, MAX_GUIDANCE_CHARS};

/// The API description as utoipa derives it (see [`spec`] for the served one).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Warden",
        description = "Runs and supervises long-running autonomous agent sessions: guardrails, a per-step continue gate, checkpoints and resume.",
        license(name = "MIT", identifier = "MIT")
    ),
    servers((url = "http://127.0.0.1:8080", description = "A Warden on its default address (WARDEN_LISTEN_ADDR)")),
    paths(
        super::sessions::create_session,
        super::estimate::estimate_session,
        super::replay::replay_sessions,
        super::sessions::list_sessions,
        super::sessions::count_sessions,
        super::sessions::get_session,
        super::sessions::update_session,
        super::sessions::delete_session,
        super::sessions::stop_session,
        super::sessions::pause_session,
        super::sessions::resume_session,
        super::tree::get_tree,
        super::history::list_iterations,
        super::history::list_checkpoints,
        super::history::list_events,
        super::history::list_decisions,
        super::history::list_reflections,
        super::sessions::refine_session,
        super::sessions::confirm_session,
        super::approvals::list_approvals,
        super::approvals::list_attention,
        super::approvals::decide,
        super::history::list_refinements,
        super::history::list_tasks,
        super::files::list_files,
        super::files::read_file,
        super::files::workspace_tar,
        super::files::diff_files,
        super::files::fork_session,
        super::sessions::outcomes,
        super::sessions::session_changes,
        super::health::healthz,
        super::health::readyz,
        super::health::metrics,
        super::keys::create_key,
        super::keys::list_keys,
        super::keys::revoke_key,
        super::retention::list_retention,
        super::retention::set_retention,
        super::budget_warnings::list_warn_at,
        super::insights::threshold_report,
        super::insights::apply_threshold,
        super::insights::threshold_changes,
        super::budget_warnings::set_warn_at,
        super::workers::claim,
        super::workers::heartbeat,
        super::workers::complete,
        super::workers::fail,
        super::workers::release,
        super::workers::queues,
        super::notify::set_tenant_target,
        super::notify::get_tenant_target,
        super::notify::delete_tenant_target,
        super::notify::rotate_secret,
        super::notify::set_session_target,
        super::notify::get_session_target,
        super::notify::delete_session_target,
        super::notify::list_notifications,
    ),
    components(schemas(
        super::views::EventView,
        super::views::SessionView,
        crate::executor::ScriptedDelegation,
        super::views::ExecutorKind,
        super::views::SortKey,
        super::views::SortOrder,
        crate::executor::WebhookRequest,
        crate::executor::WebhookResponse,
        crate::executor::WebhookHistoryItem,
        crate::executor::WebhookSignal,
    )),
    tags(
        (name = "sessions", description = "Create, list and inspect sessions"),
        (name = "control", description = "Stop, pause, resume and retune sessions"),
        (name = "history", description = "Iterations, checkpoints, events and decisions"),
        (name = "workspace", description = "The files of a session's workspace as of its checkpoints, and forks from them"),
        (name = "health", description = "Probes"),
        (name = "retention", description = "Per-tenant settings: how long ended sessions are kept before they are archived and deleted, and the soft-budget thresholds"),
        (name = "keys", description = "API keys (admin)"),
        (name = "approvals", description = "Calls that wait for a person: the inbox, approve and reject"),
        (name = "workers", description = "The worker protocol: claim, heartbeat and complete the steps of `worker` sessions"),
        (name = "notify", description = "Notifications: signed webhooks to a tenant's or a session's target, and their deliveries"),
    )
)]
pub struct ApiDoc;

static SPEC: LazyLock<Value> = LazyLock::new(build);

/// The document as served: utoipa's, with bounds and shared errors added.
pub fn spec() -> &'static Value {
    &SPEC
}

/// The document as served and committed (pretty JSON, trailing newline).
pub fn document() -> String {
    let mut json =
        serde_json::to_string_pretty(spec()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    json.push('\n');
    json
}

/// The document as a replica with these MCP servers declared serves it:
/// the pattern of `executor.tools` items names them, so that every value
/// the document allows is one the server takes. The committed document is
/// that of a replica with none.
pub fn served(mcp_servers: &[String]) -> Value {
    let mut doc = spec().clone();
    if !mcp_servers.is_empty()
        && let Some(items) =
            doc.pointer_mut(&format!("{}/items", branch("ExecutorSpec", 1, "tools")))
    {
        let names: Vec<&str> = mcp_servers.iter().map(String::as_str).collect();
        items["pattern"] = crate::mcp::config::tool_item_pattern(&names).into();
    }
    doc
}

/// `/openapi.json` and the docs page at `/docs`, for a replica with these
/// MCP servers declared.
pub fn router(mcp_servers: &[String]) -> Router<AppState> {
    // SwaggerUi serves both the page (vendored assets, no CDN) and the
    // document; `validatorUrl: none` keeps it from fetching a badge from an
    // outside validator, so nothing the page loads leaves this server.
    SwaggerUi::new("/docs")
        .external_url_unchecked("/openapi.json", served(mcp_servers))
        .config(Config::new(["/openapi.json"]).validator_url("none"))
        .into()
}

fn build() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi())
        .unwrap_or_else(|e| json!({ "error": e.to_string() }));
    add_bounds(&mut doc);
    add_shared_errors(&mut doc);
    add_streams(&mut doc);
    refuse_nul(&mut doc);
    doc
}

/// The pattern of a string that holds no NUL (U+0000).
pub const NO_NUL_PATTERN: &str = "^[^\\u0000]*$";

/// The schema of any JSON value with no NUL in a key or string, at any depth.
const NUL_FREE_JSON: &str = "NulFreeJson";

/// [`NUL_FREE_JSON`]: what a free-form object of the API may hold.
fn nul_free_json() -> Value {
    let me = json!({ "$ref": format!("#/components/schemas/{NUL_FREE_JSON}") });
    json!({
        "description": "Any JSON value with no NUL (U+0000) in a key or a string, at any depth (Postgres stores none)",
        "anyOf": [
            { "type": "string", "pattern": NO_NUL_PATTERN },
            { "type": ["number", "boolean", "null"] },
            { "type": "array", "items": me },
            { "type": "object", "propertyNames": { "pattern": NO_NUL_PATTERN }, "additionalProperties": me }
        ]
    })
}

/// Whether a schema types a string (alone or among other types).
fn is_string(schema: &serde_json::Map<String, Value>) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    }
}

/// Whether a schema is an object of no declared shape: free-form data.
fn is_free_object(schema: &serde_json::Map<String, Value>) -> bool {
    let shaped = [
        "properties",
        "additionalProperties",
        "propertyNames",
        "$ref",
    ]
    .iter()
    .chain(&["allOf", "oneOf", "anyOf"])
    .any(|k| schema.contains_key(*k));
    schema.get("type") == Some(&json!("object")) && !shaped
}

/// One rule for text: Postgres stores no NUL, so no string of the API may
/// hold one, and the document says so on every string, nested ones too. A
/// string with no pattern gets [`NO_NUL_PATTERN`]; one that has a pattern
/// keeps it and gets `not: {pattern: "\u0000"}` beside it. Strings with a
/// `format`, an `enum` or a `const` already admit no NUL.
fn refuse_nul(doc: &mut Value) {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(schema) => {
                let constrained = ["format", "enum", "const", "contentMediaType"]
                    .iter()
                    .any(|k| schema.contains_key(*k));
                if is_free_object(schema) {
                    // Free-form agent data: any JSON, but no NUL in a key
                    // or in a string at any depth (Postgres' jsonb has none).
                    schema.insert("propertyNames".into(), json!({ "pattern": NO_NUL_PATTERN }));
                    schema.insert(
                        "additionalProperties".into(),
                        json!({ "$ref": format!("#/components/schemas/{NUL_FREE_JSON}") }),
                    );
                }
                if is_string(schema) && !constrained {
                    if schema.contains_key("pattern") {
                        // Typed, so that `null` (of a nullable string) is not refused.
                        schema.insert(
                            "not".into(),
                            json!({ "type": "string", "pattern": "\\u0000" }),
                        );
                    } else {
                        schema.insert("pattern".into(), NO_NUL_PATTERN.into());
                    }
                }
                for (key, child) in schema.iter_mut() {
                    // Examples and defaults are values, not schemas.
                    if !matches!(key.as_str(), "example" | "examples" | "default" | "not") {
                        walk(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(schemas) = doc.pointer_mut("/components/schemas") {
        walk(schemas);
        // Added after the walk: its own strings carry their pattern already.
        schemas[NUL_FREE_JSON] = nul_free_json();
    }
    // Inline schemas of bodies, parameters and headers; not of query
    // parameters, which reach no storage and are taken as sent (`%00` in a
    // query stays those three characters).
    if let Some(Value::Object(paths)) = doc.get_mut("paths") {
        for op in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .filter_map(Value::as_object_mut)
        {
            for (key, part) in op.iter_mut() {
                match (key.as_str(), part) {
                    ("parameters", Value::Array(params)) => params
                        .iter_mut()
                        .filter(|p| p.get("in") != Some(&json!("query")))
                        .for_each(walk),
                    (_, part) => walk(part),
                }
            }
        }
    }
}

/// One Server-Sent Event whose `data` is a JSON document of schema `payload`.
fn sse_frame(description: &str, payload: &str) -> Value {
    json!({
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {
            "event": { "type": "string", "description": "The SSE `event` field." },
            "id": { "type": "string", "description": "The SSE `id` field; send it back as `Last-Event-ID` to continue." },
            "retry": { "type": "integer", "description": "The SSE `retry` field (not sent)." },
            "data": {
                "type": "string",
                "description": format!("The SSE `data` field: one `{payload}` as JSON text."),
                "contentMediaType": "application/json",
                "contentSchema": { "$ref": format!("#/components/schemas/{payload}") }
            }
        }
    })
}

/// `text/event-stream` answers: in OpenAPI 3.1 the media type's schema
/// describes one event (the fields of an SSE frame, `data` being JSON text of
/// the payload schema), never the stream as one JSON document.
fn add_streams(doc: &mut Value) {
    let frames = [
        (
            "/api/autonomous/{id}/events",
            "SessionLogFrame",
            sse_frame(
                "One event of a session's log: `event` is its kind, `id` its sequence number.",
                "EventView",
            ),
        ),
        (
            "/api/autonomous/events",
            "SessionChangeFrame",
            sse_frame(
                "One change of a session: `event` is `session`, `id` the change time in microseconds.",
                "SessionView",
            ),
        ),
    ];
    for (path, name, frame) in frames {
        if let Some(schemas) = doc
            .pointer_mut("/components/schemas")
            .and_then(Value::as_object_mut)
        {
            schemas.insert(name.to_string(), frame);
        }
        let media = format!(
            "/paths/{}/get/responses/200/content/text~1event-stream",
            json_pointer_escape(path)
        );
        if let Some(media) = doc.pointer_mut(&media) {
            media["schema"] = json!({ "$ref": format!("#/components/schemas/{name}") });
        }
    }
}

/// One constraint: where (a JSON pointer to a schema) and what to add.
pub type Bound = (String, &'static str, Value);

fn prop(schema: &str, field: &str) -> String {
    format!("/components/schemas/{schema}/properties/{field}")
}

fn branch(schema: &str, index: usize, field: &str) -> String {
    format!("/components/schemas/{schema}/oneOf/{index}/properties/{field}")
}

fn range(at: String, min: impl Into<Value>, max: impl Into<Value>) -> [Bound; 2] {
    [
        (at.clone(), "minimum", min.into()),
        (at, "maximum", max.into()),
    ]
}

/// Every bound the validators enforce, from their own constants.
pub fn bounds() -> Vec<Bound> {
    let mut out: Vec<Bound> = Vec::new();
    key_and_limit_bounds(&mut out);
    executor_bounds(&mut out);
    goal_bounds(&mut out);
    child_bounds(&mut out);
    scripted_step_bounds(&mut out);
    query_bounds(&mut out);
    path_bounds(&mut out);
    replay_bounds(&mut out);
    threshold_bounds(&mut out);
    out.push((
        prop("SetNotifyTarget", "url"),
        "maxLength",
        crate::session::notify::MAX_URL_BYTES.into(),
    ));
    out
}

/// Bounds of applying a threshold to a tenant: the value a create's
/// `limits.max_iterations` takes, the tenant's name, the note's length.
fn threshold_bounds(out: &mut Vec<Bound>) {
    let (_, min, max) = RANGES
        .iter()
        .copied()
        .find(|(field, _, _)| *field == "max_iterations")
        .unwrap_or(("max_iterations", 1, 1_000_000));
    out.extend(range(
        prop("ApplyThresholdRequest", "max_iterations"),
        min,
        max,
    ));
    let tenant = prop("ApplyThresholdRequest", "tenant");
    // The log's `?tenant=` as the auth layer reads it: a tenant's name, or
    // empty for none (the caller's own).
    let changes = format!(
        "{}/tenant",
        query_parameters("/api/insights/thresholds/changes")
    );
    out.extend([
        (tenant.clone(), "minLength", 1.into()),
        (
            tenant.clone(),
            "maxLength",
            crate::auth::MAX_TENANT_CHARS.into(),
        ),
        (tenant, "pattern", crate::auth::TENANT_PATTERN.into()),
        (
            changes.clone(),
            "maxLength",
            crate::auth::MAX_TENANT_CHARS.into(),
        ),
        (changes, "pattern", "^[A-Za-z0-9._-]*$".into()),
    ]);
    out.extend([(
        prop("ApplyThresholdRequest", "note"),
        "maxLength",
        crate::policy::insights::MAX_NOTE_CHARS.into(),
    )]);
}

/// Bounds of a policy replay: its sessions, deadline and override ranges.
fn replay_bounds(out: &mut Vec<Bound>) {
    use crate::session::replay::{MAX_DEADLINE_MS, MAX_REPLAY_SESSIONS};
    let ids = prop("ReplayRequest", "session_ids");
    out.push((ids.clone(), "minItems", 1.into()));
    out.push((ids, "maxItems", MAX_REPLAY_SESSIONS.into()));
    out.extend(range(
        prop("ReplayRequest", "deadline_ms"),
        super::replay::MIN_DEADLINE_MS,
        MAX_DEADLINE_MS,
    ));
    out.extend(range(prop("ReplayFilter", "limit"), 1, MAX_REPLAY_SESSIONS));
    for (schema, field, min, max) in crate::policy::replay::RANGES {
        let floats = [
            "coherence_min",
            "rework_max",
            "uncertainty_max",
            "slope_max",
            "projection_margin",
        ];
        let (min, max): (Value, Value) = if floats.contains(&field) {
            (min.into(), max.into())
        } else {
            ((min as u64).into(), (max as u64).into())
        };
        out.extend(range(prop(schema, field), min, max));
    }
}

/// Bounds of keys, retention and limit patches, and which queues a key may name.
fn key_and_limit_bounds(out: &mut Vec<Bound>) {
    out.extend([
        (prop("CreateKey", "tenant"), "minLength", 1.into()),
        (
            prop("CreateKey", "tenant"),
            "maxLength",
            crate::auth::MAX_TENANT_CHARS.into(),
        ),
        (
            prop("CreateKey", "tenant"),
            "pattern",
            crate::auth::TENANT_PATTERN.into(),
        ),
        (
            prop("CreateKey", "name"),
            "maxLength",
            crate::auth::MAX_KEY_NAME_CHARS.into(),
        ),
        (
            prop("CreateKey", "name"),
            "pattern",
            crate::auth::KEY_NAME_PATTERN.into(),
        ),
    ]);
    out.extend([
        (prop("SetRetention", "tenant"), "minLength", 1.into()),
        (
            prop("SetRetention", "tenant"),
            "maxLength",
            crate::auth::MAX_TENANT_CHARS.into(),
        ),
        (
            prop("SetRetention", "tenant"),
            "pattern",
            crate::auth::TENANT_PATTERN.into(),
        ),
        (
            prop("SetRetention", "keep"),
            "pattern",
            crate::config::RETENTION_PATTERN.into(),
        ),
    ]);
    budget_bounds(out);
    for (field, min, max) in RANGES {
        out.extend(range(prop("LimitsPatch", field), min, max));
    }
    let worker_queues = "/components/schemas/CreateKey/allOf/0/then/properties/queues";
    out.push((worker_queues.into(), "minItems", 1.into()));
    out.push((
        worker_queues.into(),
        "maxItems",
        crate::auth::MAX_KEY_QUEUES.into(),
    ));
    out.push((
        format!("{worker_queues}/items"),
        "pattern",
        crate::policy::worker::QUEUE_PATTERN.into(),
    ));
    out.push((
        "/components/schemas/CreateKey/allOf/0/else/properties/queues".into(),
        "maxItems",
        0.into(),
    ));
}

/// Bounds of the budgets: money, the confirmation before start, and the
/// soft budgets' thresholds (a session's and a tenant's).
fn budget_bounds(out: &mut Vec<Bound>) {
    out.push((
        prop("LimitsPatch", "max_cost_usd"),
        "pattern",
        crate::policy::guardrails::COST_PATTERN.into(),
    ));
    out.extend([
        (prop("SetWarnAt", "tenant"), "minLength", 1.into()),
        (
            prop("SetWarnAt", "tenant"),
            "maxLength",
            crate::auth::MAX_TENANT_CHARS.into(),
        ),
        (
            prop("SetWarnAt", "tenant"),
            "pattern",
            crate::auth::TENANT_PATTERN.into(),
        ),
        (
            prop("ConfirmIfOver", "cost_usd"),
            "pattern",
            crate::policy::confirm::COST_PATTERN.into(),
        ),
    ]);
    out.extend(range(
        prop("ConfirmIfOver", "minutes"),
        1,
        crate::policy::confirm::MAX_MINUTES,
    ));
    // Soft budgets' thresholds, as `soft_budget::thresholds` checks them.
    let (lowest, highest) = crate::policy::soft_budget::PERCENTS;
    for schema in ["LimitsPatch", "Limits", "SetWarnAt"] {
        let warn_at = prop(schema, "warn_at");
        out.extend(range(format!("{warn_at}/items"), lowest, highest));
        out.push((
            warn_at,
            "maxItems",
            crate::policy::soft_budget::MAX_THRESHOLDS.into(),
        ));
    }
}

/// Bounds of the model, webhook and worker executors and the worker API.
fn executor_bounds(out: &mut Vec<Bound>) {
    // ExecutorSpec: scripted (0), llm (1), webhook (2), worker (3).
    let tools = branch("ExecutorSpec", 1, "tools");
    out.push((
        tools.clone(),
        "maxItems",
        crate::mcp::config::MAX_TOOL_ITEMS.into(),
    ));
    // No MCP server declared: `builtin` is the one item taken (see [`served`]).
    out.push((
        format!("{tools}/items"),
        "pattern",
        crate::mcp::config::tool_item_pattern(&[]).into(),
    ));
    out.push((
        branch("ExecutorSpec", 3, "queue"),
        "pattern",
        crate::policy::worker::QUEUE_PATTERN.into(),
    ));
    out.extend(range(
        branch("ExecutorSpec", 3, "heartbeat_timeout_ms"),
        *TIMEOUT_MS.start(),
        *TIMEOUT_MS.end(),
    ));
    out.extend(range(
        branch("ExecutorSpec", 3, "max_attempts"),
        *MAX_ATTEMPTS.start(),
        *MAX_ATTEMPTS.end(),
    ));
    out.extend(range(
        branch("ExecutorSpec", 3, "worker_wait_timeout_ms"),
        *WORKER_WAIT_MS.start(),
        *WORKER_WAIT_MS.end(),
    ));
    let labels = branch("ExecutorSpec", 3, "labels");
    out.push((labels.clone(), "maxProperties", MAX_LABELS.into()));
    out.push((format!("{labels}/propertyNames"), "minLength", 1.into()));
    out.push((
        format!("{labels}/propertyNames"),
        "maxLength",
        MAX_LABEL_NAME_CHARS.into(),
    ));
    out.push((
        format!("{labels}/additionalProperties"),
        "maxLength",
        MAX_LABEL_VALUE_CHARS.into(),
    ));
    worker_protocol_bounds(out);
}

/// Bounds of the worker protocol's requests.
fn worker_protocol_bounds(out: &mut Vec<Bound>) {
    out.push((
        prop("ClaimRequest", "worker"),
        "pattern",
        super::workers::WORKER_NAME_PATTERN.into(),
    ));
    out.push((
        format!("{}/items", prop("ClaimRequest", "queues")),
        "pattern",
        crate::policy::worker::QUEUE_PATTERN.into(),
    ));
    out.push((
        prop("HeartbeatRequest", "progress"),
        "maxLength",
        super::workers::MAX_PROGRESS_CHARS.into(),
    ));
    out.push((
        prop("FailRequest", "error"),
        "maxLength",
        super::workers::MAX_ERROR_CHARS.into(),
    ));
    out.push((
        prop("ClaimRequest", "wait_ms"),
        "maximum",
        super::workers::MAX_CLAIM_WAIT_MS.into(),
    ));
    out.push((
        prop("ClaimRequest", "worker"),
        "maxLength",
        super::workers::MAX_WORKER_CHARS.into(),
    ));
    out.push((
        prop("HeartbeatRequest", "wait_ms"),
        "maximum",
        super::workers::MAX_HEARTBEAT_WAIT_MS.into(),
    ));
}

/// Bounds of goals, their refinement, criteria and milestones.
fn goal_bounds(out: &mut Vec<Bound>) {
    let (wall_min, wall_max) = RANGES
        .iter()
        .find(|(f, _, _)| *f == "max_wall_time_ms")
        .map_or((0, 0), |(_, min, max)| (*min, *max));
    // RefinementChoice: accept_suggestion (0), custom (1), proceed_with_time_limit (2).
    out.extend(range(
        branch("RefinementChoice", 2, "max_wall_time_ms"),
        wall_min,
        wall_max,
    ));
    for goal in [
        prop("CreateSession", "goal"),
        prop("ResumeSession", "goal"),
        branch("RefinementChoice", 1, "goal"),
    ] {
        out.push((goal.clone(), "maxLength", MAX_GOAL_CHARS.into()));
    }
    for goal in [
        prop("CreateSession", "goal"),
        prop("ResumeSession", "goal"),
        branch("RefinementChoice", 1, "goal"),
    ] {
        out.push((goal.clone(), "minLength", 1.into()));
        out.push((goal, "pattern", GOAL_HAS_LETTER_PATTERN.into()));
    }
    for guidance in [
        prop("ResumeSession", "guidance"),
        prop("ForkSession", "guidance"),
    ] {
        out.push((guidance, "maxLength", MAX_GUIDANCE_CHARS.into()));
    }
    for list in ["success_criteria", "milestones"] {
        let at = prop("CreateSession", list);
        out.push((at.clone(), "maxItems", MAX_ITEMS.into()));
        let item = format!("{at}/items");
        out.push((item.clone(), "minLength", 1.into()));
        out.push((item.clone(), "maxLength", MAX_ITEM_CHARS.into()));
        out.push((item, "pattern", "\\S".into()));
    }
}

/// Bounds of child sessions and scripted scripts.
fn child_bounds(out: &mut Vec<Bound>) {
    // Child sessions: a task's goal reads as a create's, its criteria as
    // a create's checklist, its share of the budget in (0, 1].
    for goal in [
        "/components/schemas/Subgoal/oneOf/0".to_string(),
        prop("SubgoalTask", "goal"),
        prop("ChildRequest", "goal"),
        prop("ScriptedDelegation", "goal"),
    ] {
        out.push((goal.clone(), "minLength", 1.into()));
        out.push((goal.clone(), "maxLength", MAX_CHILD_GOAL_CHARS.into()));
        out.push((goal, "pattern", GOAL_HAS_LETTER_PATTERN.into()));
    }
    for task in ["SubgoalTask", "ChildRequest", "ScriptedDelegation"] {
        let criteria = prop(task, "success_criteria");
        out.push((criteria.clone(), "maxItems", MAX_ITEMS.into()));
        let item = format!("{criteria}/items");
        out.push((item.clone(), "minLength", 1.into()));
        out.push((item.clone(), "maxLength", MAX_ITEM_CHARS.into()));
        out.push((item, "pattern", "\\S".into()));
        let share = prop(task, "budget_share");
        out.push((share.clone(), "exclusiveMinimum", 0.into()));
        out.push((share, "maximum", 1.into()));
    }
    let task_steps = prop("SubgoalTask", "steps");
    out.push((task_steps.clone(), "minItems", 1.into()));
    out.push((task_steps, "maxItems", MAX_SCRIPTED_STEPS.into()));
    out.push((
        prop("CreateSession", "subgoals"),
        "maxItems",
        DEFAULT_MAX_CHILDREN.into(),
    ));
    out.push((
        prop("ScriptedStep", "delegate"),
        "maxItems",
        DEFAULT_MAX_CHILDREN.into(),
    ));
    out.push((
        prop("ScriptedDelegation", "script"),
        "pattern",
        SCRIPT_NAME_PATTERN.into(),
    ));
    let scripts = branch("ExecutorSpec", 0, "scripts");
    out.push((scripts.clone(), "maxProperties", MAX_SCRIPTS.into()));
    out.push((
        format!("{scripts}/propertyNames"),
        "pattern",
        SCRIPT_NAME_PATTERN.into(),
    ));
    out.push((
        format!("{scripts}/additionalProperties"),
        "minItems",
        1.into(),
    ));
    out.push((
        format!("{scripts}/additionalProperties"),
        "maxItems",
        MAX_SCRIPTED_STEPS.into(),
    ));
}

/// Bounds of scripted steps, executor timeouts and URLs.
fn scripted_step_bounds(out: &mut Vec<Bound>) {
    let action = prop("ScriptedStep", "action");
    out.push((action.clone(), "minLength", 1.into()));
    out.push((action.clone(), "maxLength", MAX_ACTION_CHARS.into()));
    out.push((action, "pattern", "\\S".into()));
    out.push((
        prop("ScriptedStep", "delay_ms"),
        "maximum",
        MAX_DELAY_MS.into(),
    ));
    out.push((
        prop("ScriptedStep", "output"),
        "maxLength",
        MAX_OUTPUT_CHARS.into(),
    ));
    let outcomes = [Outcome::Success, Outcome::Failure, Outcome::Error]
        .iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect::<Vec<_>>();
    out.push((prop("ScriptedStep", "outcome"), "enum", outcomes.into()));
    // ExecutorSpec: scripted (0), llm (1), webhook (2).
    let steps = branch("ExecutorSpec", 0, "steps");
    out.push((steps.clone(), "minItems", 1.into()));
    out.push((steps, "maxItems", MAX_SCRIPTED_STEPS.into()));
    for timeout in [
        branch("ExecutorSpec", 1, "timeout_ms"),
        branch("ExecutorSpec", 2, "timeout_ms"),
    ] {
        out.extend(range(timeout, *TIMEOUT_MS.start(), *TIMEOUT_MS.end()));
    }
    out.extend(range(
        branch("ExecutorSpec", 1, "max_tokens_per_call"),
        *MAX_TOKENS_PER_CALL.start(),
        *MAX_TOKENS_PER_CALL.end(),
    ));
    out.extend(range(
        branch("ExecutorSpec", 1, "temperature"),
        *TEMPERATURE.start(),
        *TEMPERATURE.end(),
    ));
    out.push((branch("ExecutorSpec", 1, "model"), "pattern", "\\S".into()));
    // A fork's model replaces the executor's, checked the same way.
    out.push((prop("ForkSession", "model"), "pattern", "\\S".into()));
    out.push((
        "/components/schemas/CreateSession/allOf/0/then/properties/subgoals".into(),
        "maxItems",
        0.into(),
    ));
    // `check_url`: http:// or https://, something after it (more than
    // "https://"), printable ASCII, and no `@` before the path, query or
    // fragment (no userinfo).
    let url = "^https?://[!-\"$-.0->A-~]*([/?#][!-~]*)?$";
    for at in [
        branch("ExecutorSpec", 1, "base_url"),
        branch("ExecutorSpec", 2, "url"),
    ] {
        out.push((at.clone(), "pattern", url.into()));
        out.push((at, "minLength", ("https://".len() + 1).into()));
    }
}

/// Bounds of cursors, approval rules and the query parameters of lists.
/// Bounds of path parameters beyond ids.
fn path_bounds(out: &mut Vec<Bound>) {
    // A file's path: what `check_path` takes (a path that could leave the
    // workspace is a 400).
    out.push((
        format!(
            "/paths/{}/get/parameters/1/schema",
            json_pointer_escape("/api/autonomous/{id}/files/{path}")
        ),
        "pattern",
        crate::policy::snapshot::PATH_PATTERN.into(),
    ));
}

/// The goal filter `q` of the list, the counts and a replay's filter (the
/// list's, in a body): at most 200 characters, no control characters.
fn goal_filter_bounds(out: &mut Vec<Bound>) {
    let list = ["/api/autonomous", "/api/autonomous/counts"]
        .map(|path| format!("{}/q", query_parameters(path)));
    for q in list.into_iter().chain([prop("ReplayFilter", "q")]) {
        out.push((
            q.clone(),
            "maxLength",
            super::views::MAX_GOAL_FILTER_CHARS.into(),
        ));
        out.push((q, "pattern", super::views::GOAL_FILTER_PATTERN.into()));
    }
}

fn query_bounds(out: &mut Vec<Bound>) {
    // `decode_cursor`: the position (micros since the epoch, at most 18
    // digits, so within Postgres' range; or a cost, with up to 16 decimal
    // places), `_`, a UUID.
    out.push((
        format!("{}/cursor", query_parameters("/api/autonomous")),
        "pattern",
        "^[0-9]{1,18}([.][0-9]{1,16})?_[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
            .into(),
    ));
    // `min_cost_usd`: an amount `check_amount` takes (0 or more, at most 12
    // decimal places), written as a plain decimal.
    out.push((
        format!("{}/min_cost_usd", query_parameters("/api/autonomous")),
        "pattern",
        "^[0-9]{1,16}([.][0-9]{1,12})?$".into(),
    ));
    // The approvals inbox's cursor: micros, `_`, the session, `_`, the call.
    out.push((
        format!("{}/cursor", query_parameters("/api/autonomous/approvals")),
        "pattern",
        "^[0-9]{1,18}_[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}_[0-9]{1,19}[.][0-9]{1,10}$"
            .into(),
    ));
    // The attention inbox's cursor: micros, `_`, the child.
    out.push((
        format!("{}/cursor", query_parameters("/api/autonomous/attention")),
        "pattern",
        "^[0-9]{1,18}_[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
            .into(),
    ));
    out.push((
        format!(
            "/paths/{}/post/parameters/1/schema",
            json_pointer_escape("/api/autonomous/{id}/approvals/{call_id}")
        ),
        "pattern",
        super::approvals::CALL_ID_PATTERN.into(),
    ));
    out.push((
        prop("DecideApproval", "message"),
        "maxLength",
        super::approvals::MAX_MESSAGE_CHARS.into(),
    ));
    let rules = prop("ApprovalPolicy", "tools");
    out.push((
        rules.clone(),
        "maxProperties",
        crate::policy::approval::MAX_TOOL_RULES.into(),
    ));
    out.push((
        format!("{rules}/propertyNames"),
        "pattern",
        crate::policy::approval::TOOL_RULE_PATTERN.into(),
    ));
    goal_filter_bounds(out);
    for (path, max) in [
        ("/api/autonomous", MAX_LIST_LIMIT),
        ("/api/autonomous/approvals", MAX_LIST_LIMIT),
        ("/api/autonomous/attention", MAX_LIST_LIMIT),
        ("/api/autonomous/{id}/notifications", MAX_LIST_LIMIT),
        ("/api/insights/thresholds/changes", MAX_LIST_LIMIT),
        ("/api/autonomous/{id}/iterations", MAX_PAGE_LIMIT),
        ("/api/autonomous/{id}/checkpoints", MAX_PAGE_LIMIT),
        ("/api/autonomous/{id}/events", MAX_PAGE_LIMIT),
        ("/api/autonomous/{id}/decisions", MAX_PAGE_LIMIT),
        ("/api/autonomous/{id}/reflections", MAX_PAGE_LIMIT),
    ] {
        let at = format!("{}/limit", query_parameters(path));
        out.extend(range(at, 1, max));
    }
}

/// Where [`bounds`] names a query parameter of a GET: resolved by [`add_bounds`].
fn query_parameters(path: &str) -> String {
    format!("query:{path}")
}

fn json_pointer_escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The pointer to the schema of a query parameter, or `at` if it is one.
fn locate(doc: &Value, at: &str) -> Option<String> {
    let Some(rest) = at.strip_prefix("query:") else {
        return Some(at.to_string());
    };
    let (path, name) = rest.rsplit_once('/')?;
    let op = format!("/paths/{}/get", json_pointer_escape(path));
    let params = doc.pointer(&format!("{op}/parameters"))?.as_array()?;
    let index = params.iter().position(|p| {
        p.get("name") == Some(&json!(name)) && p.get("in") == Some(&json!("query"))
    })?;
    Some(format!("{op}/parameters/{index}/schema"))
}

/// Rules of presence serde keeps and a property list cannot say: which
/// fields must be there, and which exclude each other.
fn presence_rules(doc: &mut Value) {
    // A confirmation needs a bound: a cost, a running time or both.
    if let Some(confirm) = doc.pointer_mut("/components/schemas/ConfirmIfOver") {
        confirm["anyOf"] = json!([
            { "required": ["cost_usd"], "properties": { "cost_usd": { "type": "string" } } },
            { "required": ["minutes"], "properties": { "minutes": { "type": "integer" } } }
        ]);
    }
    // A replay names its sessions one way: ids or a filter, not both.
    if let Some(replay) = doc.pointer_mut("/components/schemas/ReplayRequest") {
        // Under `allOf`, so the body's own properties (the filter's with
        // them) are still what the extractor walks.
        replay["allOf"] = json!([{ "oneOf": [
            { "required": ["session_ids"],
              "properties": { "session_ids": { "type": "array" }, "filter": { "type": "null" } } },
            { "required": ["filter"],
              "properties": { "filter": { "type": "object" }, "session_ids": { "type": "null" } } }
        ] }]);
    }
}

fn add_bounds(doc: &mut Value) {
    // A worker key names queues, every other role none: the branches whose
    // bounds `bounds()` gives.
    if let Some(key) = doc.pointer_mut("/components/schemas/CreateKey") {
        key["allOf"] = json!([{
            "if": { "properties": { "role": { "const": "worker" } }, "required": ["role"] },
            "then": { "required": ["queues"], "properties": { "queues": { "items": {} } } },
            "else": { "properties": { "queues": {} } }
        }]);
    }
    // A split goal starts its children at once: nothing to confirm first
    // (`confirm_if_over` with `subgoals` is refused).
    if let Some(create) = doc.pointer_mut("/components/schemas/CreateSession") {
        create["allOf"] = json!([{
            "if": { "properties": { "confirm_if_over": { "type": "object" } },
                    "required": ["confirm_if_over"] },
            "then": { "properties": { "subgoals": {} } }
        }]);
    }
    presence_rules(doc);
    // Only an approval carries arguments of the person's own
    // (`check_edited_arguments`).
    if let Some(decide) = doc.pointer_mut("/components/schemas/DecideApproval") {
        decide["if"] = json!({ "properties": { "decision": { "const": "approve" } }, "required": ["decision"] });
        decide["else"] = json!({ "properties": { "arguments": false } });
    }
    for (at, key, value) in bounds() {
        let target = locate(doc, &at).and_then(|p| doc.pointer_mut(&p));
        match target.and_then(Value::as_object_mut) {
            Some(schema) => {
                schema.insert(key.to_string(), value);
            }
            // The bounds test fails on this; the document still serves.
            None => tracing::warn!(at, key, "OpenAPI bound names no schema"),
        }
    }
    // Files a scripted step claims to write: both fields required, as serde has them.
    if let Some(files) = doc.pointer_mut(&prop("ScriptedStep", "files")) {
        files["items"] = json!({
            "type": "object",
            "required": ["path", "digest"],
            "properties": {
                "path": { "type": "string", "description": "Path relative to the session workspace." },
                "digest": { "type": "string", "description": "Digest of the content written (any stable hash, hex)." }
            },
            "additionalProperties": false
        });
    }
    // Variants of tagged enums reject unknown fields like every other body.
    // Only an admin key may be global (the key service refuses the rest).
    if let Some(key) = doc.pointer_mut("/components/schemas/CreateKey") {
        key["if"] =
            json!({ "properties": { "global": { "const": true } }, "required": ["global"] });
        key["then"] = json!({ "properties": { "role": { "const": "admin" } } });
    }
    for name in ["ExecutorSpec", "RefinementChoice"] {
        let pointer = format!("/components/schemas/{name}/oneOf");
        for variant in doc
            .pointer_mut(&pointer)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(obj) = variant.as_object_mut() {
                obj.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
    }
}

fn problem(description: &str) -> Value {
    json!({
        "description": description,
        "content": {
            "application/problem+json": {
                "schema": { "$ref": "#/components/schemas/Problem" }
            }
        }
    })
}

/// The answers any operation can give for its kind of input: path and query
/// parameters (400), a JSON body (400, 413, 415, 422), storage (500, 503).
fn add_shared_errors(doc: &mut Value) {
    add_shared_components(doc);
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        // The probes are the only operations open without a key.
        let open = matches!(path.as_str(), "/healthz" | "/readyz");
        for (method, op) in item.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            add_operation_errors(op);
            add_access_errors(method, op, open);
        }
    }
}

/// The shared error responses and the bearer scheme, in `components`.
fn add_shared_components(doc: &mut Value) {
    let shared = [
        (
            "BadRequest",
            "Not a UUID, a parameter out of range or unknown, or malformed JSON",
        ),
        (
            "PayloadTooLarge",
            "The body is larger than the configured limit (the detail says it in bytes)",
        ),
        (
            "UnsupportedMediaType",
            "The body is not sent as application/json",
        ),
        (
            "InvalidBody",
            "Well-formed JSON of the wrong shape: unknown field, wrong type or value out of range (the detail names the path); \
no string may contain NUL (U+0000), which Postgres cannot store",
        ),
        (
            "Unauthorized",
            "No key, a malformed, unknown or revoked key: send Authorization: Bearer <key>",
        ),
        (
            "Forbidden",
            "The key's role may not do this, or a cross-site request (foreign Origin, not JSON) was refused",
        ),
        (
            "BodyTimeout",
            "The body did not arrive in full within WARDEN_BODY_READ_TIMEOUT_MS of the headers (`body_timeout`); the connection is closed",
        ),
        (
            "TenantRequestLimit",
            "The caller's tenant already has its share of this replica's request slots in progress \
(WARDEN_TENANT_REQUEST_SHARE percent of WARDEN_MAX_CONCURRENT_REQUESTS, `tenant_request_limit`); retry after `Retry-After` seconds",
        ),
        (
            "InternalError",
            "An internal error; it is logged, never detailed",
        ),
        (
            "Unavailable",
            "Postgres does not answer, the service is shutting down, more than WARDEN_MAX_CONCURRENT_REQUESTS \
requests are in progress (`overloaded`) or the request ran past WARDEN_REQUEST_TIMEOUT_MS (`request_timeout`); retry shortly",
        ),
    ];
    let components = doc
        .as_object_mut()
        .map(|d| d.entry("components").or_insert_with(|| json!({})));
    if let Some(Value::Object(components)) = components {
        let responses = components.entry("responses").or_insert_with(|| json!({}));
        for (name, description) in shared {
            responses[name] = problem(description);
        }
        let schemes = components
            .entry("securitySchemes")
            .or_insert_with(|| json!({}));
        schemes["bearer"] = json!({
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (wdn_…) from POST /api/keys, `warden keys create` or WARDEN_ADMIN_TOKEN",
        });
    }
}

/// The answers of the HTTP gate: 415 for a state change not sent as JSON,
/// and, on all but the probes, the key's 401, 403 and 429.
fn add_access_errors(method: &str, op: &mut Map<String, Value>, open: bool) {
    // With authentication off, a state change without a key must be
    // sent as JSON, body or not (the cross-site rule).
    if matches!(method, "post" | "patch" | "delete")
        && let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut)
    {
        responses
            .entry("415")
            .or_insert_with(|| json!({ "$ref": "#/components/responses/UnsupportedMediaType" }));
    }
    if open {
        // Said outright, so no reader (or linter) takes a probe for an
        // operation that forgot its key.
        op.insert("security".into(), json!([]));
    } else {
        op.insert("security".into(), json!([{ "bearer": [] }]));
        if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
            for (code, name) in [
                ("401", "Unauthorized"),
                ("403", "Forbidden"),
                ("429", "TenantRequestLimit"),
            ] {
                responses
                    .entry(code)
                    .or_insert_with(|| json!({ "$ref": format!("#/components/responses/{name}") }));
            }
        }
    }
}

fn add_operation_errors(op: &mut Map<String, Value>) {
    let param_in = |place: &str| {
        op.get("parameters")
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(|p| p.get("in") == Some(&json!(place))))
    };
    let mut codes = Vec::new();
    if param_in("path") || param_in("query") {
        codes.push(("400", "BadRequest"));
    }
    if op.contains_key("requestBody") {
        codes.extend([
            ("400", "BadRequest"),
            ("413", "PayloadTooLarge"),
            ("415", "UnsupportedMediaType"),
            ("422", "InvalidBody"),
            ("408", "BodyTimeout"),
        ]);
    }
    let tags = op.get("tags").cloned().unwrap_or(Value::Null);
    if tags != json!(["health"]) {
        codes.extend([("500", "InternalError"), ("503", "Unavailable")]);
    }
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    for (code, name) in codes {
        // An operation's own wording of the same status stays.
        responses
            .entry(code)
            .or_insert_with(|| json!({ "$ref": format!("#/components/responses/{name}") }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string schema under `value`, with where it is.
    fn strings<'a>(value: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
        match value {
            Value::Object(fields) => {
                if fields.get("type") == Some(&json!("string"))
                    || fields
                        .get("type")
                        .and_then(Value::as_array)
                        .is_some_and(|ts| ts.contains(&json!("string")))
                {
                    out.push((at.clone(), value));
                }
                for (key, child) in fields {
                    if !matches!(key.as_str(), "example" | "examples" | "default" | "not") {
                        strings(child, format!("{at}/{key}"), out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    strings(item, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn no_string_of_the_document_admits_nul() {
        let doc = spec();
        let mut found = Vec::new();
        strings(&doc["components"], "components".into(), &mut found);
        // Query parameters are taken as sent and stored nowhere: left out.
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                for (key, part) in op.as_object().into_iter().flatten() {
                    let at = format!("{method} {path} {key}");
                    match part.as_array() {
                        Some(params) if key == "parameters" => params
                            .iter()
                            .filter(|p| p["in"] != "query")
                            .for_each(|p| strings(p, at.clone(), &mut found)),
                        _ => strings(part, at, &mut found),
                    }
                }
            }
        }
        assert!(found.len() > 100, "{} strings", found.len());
        for (at, schema) in found {
            let refused = schema.get("pattern") == Some(&json!(NO_NUL_PATTERN))
                || schema.pointer("/not/pattern") == Some(&json!("\\u0000"))
                || ["format", "enum", "const", "contentMediaType"]
                    .iter()
                    .any(|k| schema.get(*k).is_some());
            assert!(refused, "{at} admits NUL: {schema}");
        }
    }

    fn committed() -> Value {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
                .expect("openapi/openapi.json is committed");
        serde_json::from_str(&text).expect("the committed document is JSON")
    }

    const BOUND_KEYS: [&str; 7] = [
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
    ];

    /// Every bound keyword in the document, with its pointer.
    fn documented(value: &Value, at: &str, out: &mut Vec<(String, String, Value)>) {
        match value {
            Value::Object(map) => {
                // Under `properties` the keys are field names, not keywords
                // (an event has a field called `pattern`).
                let names_fields = at.ends_with("/properties");
                for (k, v) in map {
                    if !names_fields && BOUND_KEYS.contains(&k.as_str()) {
                        out.push((at.to_string(), k.clone(), v.clone()));
                    }
                    documented(v, &format!("{at}/{}", json_pointer_escape(k)), out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    documented(v, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_documented_bound_is_a_validator_constant() {
        let doc = committed();
        let expected: Vec<(String, String, Value)> = bounds()
            .into_iter()
            .filter(|(_, k, _)| BOUND_KEYS.contains(k))
            .map(|(at, k, v)| {
                let pointer =
                    locate(&doc, &at).unwrap_or_else(|| panic!("{at} is in the document"));
                (pointer, k.to_string(), v)
            })
            .collect();
        for (at, key, value) in &expected {
            let got = doc.pointer(at).and_then(|s| s.get(key));
            assert_eq!(got, Some(value), "{at} documents {key} = {value}");
        }
        let mut found = Vec::new();
        documented(&doc, "", &mut found);
        for (at, key, value) in found {
            // utoipa's own `minimum: 0` for unsigned types is what serde enforces.
            if key == "minimum" && value == json!(0) {
                continue;
            }
            // The body check refuses NUL in every string (`extract::shape`).
            if key == "pattern"
                && (value == json!(NO_NUL_PATTERN)
                    || (at.ends_with("/not") && value == json!("\\u0000")))
            {
                continue;
            }
            assert!(
                expected
                    .iter()
                    .any(|(a, k, v)| *a == at && *k == key && *v == value),
                "{at} documents {key} = {value}, which no validator constant gives"
            );
        }
    }

    #[test]
    fn the_limit_ranges_are_the_guardrails_ranges() {
        let doc = committed();
        for (field, min, max) in RANGES {
            let schema = doc
                .pointer(&prop("LimitsPatch", field))
                .expect("field documented");
            assert_eq!(schema["minimum"], json!(min), "{field}");
            assert_eq!(schema["maximum"], json!(max), "{field}");
            // And the validator agrees at the edges.
            let base: crate::policy::guardrails::Limits = serde_json::from_value(json!({
                "max_iterations": 1, "max_wall_time_ms": 100, "max_tokens": 1,
                "max_consecutive_errors": 1, "reflection_interval": 1, "checkpoint_interval": 1
            }))
            .expect("limits");
            let patch = |v: u64| -> crate::policy::guardrails::LimitsPatch {
                serde_json::from_value(json!({ field: v })).expect("patch")
            };
            assert!(base.apply(&patch(min)).is_ok(), "{field} = {min}");
            assert!(base.apply(&patch(max)).is_ok(), "{field} = {max}");
            assert!(base.apply(&patch(max + 1)).is_err(), "{field} = {max} + 1");
            if min > 0 {
                assert!(base.apply(&patch(min - 1)).is_err(), "{field} = {min} - 1");
            }
        }
    }

    /// Reads the bounds from the committed document and holds each
    /// validator to them at both edges.
    #[test]
    fn the_validators_agree_with_the_documented_bounds_at_their_edges() {
        use crate::executor::{ExecutorSpec, ScriptedStep};
        let doc = committed();
        let num = |at: &str, key: &str| -> u64 {
            let at = locate(&doc, at).expect("located");
            doc.pointer(&at)
                .and_then(|s| s.get(key))
                .and_then(Value::as_u64)
                .unwrap_or_else(|| panic!("{at} documents {key}"))
        };
        let step = |v: Value| {
            serde_json::from_value::<ScriptedStep>(v)
                .expect("a step")
                .validate()
        };
        let action = num(&prop("ScriptedStep", "action"), "maxLength") as usize;
        assert!(step(json!({ "action": "a".repeat(action) })).is_ok());
        assert!(
            step(json!({ "action": "é".repeat(action) })).is_ok(),
            "characters, not bytes"
        );
        assert!(step(json!({ "action": "a".repeat(action + 1) })).is_err());
        assert!(step(json!({ "action": " " })).is_err(), "pattern \\S");
        let delay = num(&prop("ScriptedStep", "delay_ms"), "maximum");
        assert!(step(json!({ "action": "a", "delay_ms": delay })).is_ok());
        assert!(step(json!({ "action": "a", "delay_ms": delay + 1 })).is_err());
        let output = num(&prop("ScriptedStep", "output"), "maxLength") as usize;
        assert!(step(json!({ "action": "a", "output": "ü".repeat(output) })).is_ok());
        assert!(step(json!({ "action": "a", "output": "u".repeat(output + 1) })).is_err());

        let spec = |v: Value| {
            serde_json::from_value::<ExecutorSpec>(v)
                .expect("a spec")
                .validate()
        };
        let steps = num(&branch("ExecutorSpec", 0, "steps"), "maxItems") as usize;
        let script =
            |n: usize| json!({ "kind": "scripted", "steps": vec![json!({ "action": "a" }); n] });
        assert!(spec(script(steps)).is_ok());
        assert!(spec(script(steps + 1)).is_err());
        assert!(spec(script(0)).is_err(), "minItems 1");
        for (variant, field) in [
            (1, "timeout_ms"),
            (1, "max_tokens_per_call"),
            (2, "timeout_ms"),
        ] {
            let at = branch("ExecutorSpec", variant, field);
            let (min, max) = (num(&at, "minimum"), num(&at, "maximum"));
            let with = |v: u64| match variant {
                1 => json!({ "kind": "llm", field: v }),
                _ => json!({ "kind": "webhook", "url": "http://agent.test/step", field: v }),
            };
            assert!(
                spec(with(min)).is_ok() && spec(with(max)).is_ok(),
                "{field}"
            );
            assert!(
                spec(with(min - 1)).is_err() && spec(with(max + 1)).is_err(),
                "{field}"
            );
        }
        let at = locate(&doc, &branch("ExecutorSpec", 1, "temperature")).expect("temperature");
        let (min, max) = (
            doc.pointer(&at).expect("t")["minimum"].as_f64(),
            doc.pointer(&at).expect("t")["maximum"].as_f64(),
        );
        let (min, max) = (min.expect("minimum"), max.expect("maximum"));
        let temp = |t: f64| spec(json!({ "kind": "llm", "temperature": t }));
        assert!(temp(min).is_ok() && temp(max).is_ok());
        assert!(temp(min - 0.01).is_err() && temp(max + 0.01).is_err());

        let items = num(&prop("CreateSession", "milestones"), "maxItems") as usize;
        let text = num(
            &format!("{}/items", prop("CreateSession", "milestones")),
            "maxLength",
        ) as usize;
        let list =
            |n: usize, t: &str| crate::policy::checklist::from_texts("m", &vec![t.to_string(); n]);
        assert!(list(items, &"ß".repeat(text)).is_ok());
        assert!(list(items + 1, "x").is_err());
        assert!(list(1, &"x".repeat(text + 1)).is_err());
        assert!(list(1, "  ").is_err(), "pattern \\S");
    }

    #[test]
    fn every_operation_documents_the_shared_errors() {
        let doc = spec();
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for (method, op) in item.as_object().expect("path item") {
                let responses = op["responses"].as_object().expect("responses");
                let has = |code: &str| responses.contains_key(code);
                if path.contains("{id}") {
                    assert!(has("400") && has("404"), "{method} {path}: 400 and 404");
                }
                if op.get("requestBody").is_some() {
                    for code in ["400", "413", "415", "422"] {
                        assert!(has(code), "{method} {path}: {code}");
                    }
                }
                if !path.starts_with("/healthz")
                    && !path.starts_with("/readyz")
                    && !path.starts_with("/metrics")
                {
                    assert!(has("500") && has("503"), "{method} {path}: 500 and 503");
                }
            }
        }
    }
}
