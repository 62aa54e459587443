//! What a session is asked to run with: the executor specification as the
//! create request gives it, and as a session row stores it. Kept below the
//! store so that the row is typed; how an executor is built from a spec,
//! checked and shown lives in `executor`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

use crate::policy::approval::ApprovalPolicy;
use crate::policy::capabilities::Capability;
use crate::policy::delegation::ChildRequest;
use crate::policy::guardrails::Limits;
use crate::policy::history::{FileWrite, Outcome};

/// How a session's iterations are performed, as given in the create request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutorSpec {
    /// Steps given in the request: for demos, tests and dry runs of policy.
    Scripted {
        /// The steps, performed in order.
        steps: Vec<ScriptedStep>,
        /// Start again from the first step when the list runs out.
        #[serde(default)]
        repeat: bool,
        /// Named scripts the tasks its steps delegate run (`delegate[].script`),
        /// passed on to those children so that they can delegate too.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        scripts: BTreeMap<String, Vec<ScriptedStep>>,
    },
    /// An OpenAI-compatible chat-completions model with tools, working in
    /// the session's workspace. Unset fields come from the environment.
    Llm {
        /// Model name (default `WARDEN_LLM_MODEL`).
        #[serde(default)]
        model: Option<String>,
        /// Base URL up to `/v1` (default `WARDEN_LLM_BASE_URL`).
        #[serde(default)]
        base_url: Option<String>,
        /// API key for that endpoint (default `WARDEN_LLM_API_KEY`); stored
        /// encrypted apart from the session, never shown back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<String>)]
        api_key: Option<ApiKey>,
        /// Timeout of one model call in ms (default `WARDEN_LLM_TIMEOUT_MS`).
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Most tokens one call may generate (default `WARDEN_LLM_MAX_TOKENS`).
        #[serde(default)]
        max_tokens_per_call: Option<u64>,
        /// Sampling temperature.
        #[serde(default)]
        temperature: Option<f64>,
        /// The tools the agent may use: `builtin` (the workspace tools), an
        /// MCP server's name (all its tools) or `server:tool` (one tool);
        /// servers are those the operator declared (`WARDEN_MCP_CONFIG`)
        /// for the session's tenant. Absent: the built-in tools only. The
        /// tools that end or pause a session are always offered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<Vec<String>>,
        /// Which tool calls wait for a person's approval (default: none).
        #[serde(default, skip_serializing_if = "ApprovalPolicy::is_never")]
        approvals: ApprovalPolicy,
    },
    /// An external agent: Warden POSTs each step's context to `url` and
    /// reads back the outcome (see `WebhookRequest` / `WebhookResponse`).
    Webhook {
        /// The agent's step endpoint (http or https).
        url: String,
        /// Timeout of one step in ms (default 60000).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// Agents that call Warden: each step becomes a task on `queue` that a
    /// worker claims, heartbeats and completes (see `/api/workers`).
    Worker {
        /// The queue: 1 to 64 letters, digits, `-`, `_` or `.`.
        queue: String,
        /// Labels shown to workers with each task (at most 32, string values).
        #[serde(default)]
        labels: std::collections::BTreeMap<String, String>,
        /// Lease of a claimed task in ms: a worker that does not heartbeat
        /// within it loses the task, which is offered again (default 30000).
        #[serde(default)]
        heartbeat_timeout_ms: Option<u64>,
        /// Attempts one step gets before it fails (default 3).
        #[serde(default)]
        max_attempts: Option<u32>,
        /// How long a task may wait for a claim, in ms, before the session
        /// pauses with reason `no_worker` (default 600000).
        #[serde(default)]
        worker_wait_timeout_ms: Option<u64>,
    },
}

/// A session's own model API key: its `Debug` never shows it, and it is
/// taken out of the spec before the spec is stored (see [`ExecutorSpec::take_api_key`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for sealing and for the one request header it goes in.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The key a stored executor JSON carries when its URL's query was taken
/// off and sealed as the session secret of the same name.
pub const SEALED_QUERY_KEY: &str = crate::secrets::URL_QUERY;

/// An executor as a session row stores it (`sessions.executor`): the spec
/// with its secrets taken out, and whether its URL's query was sealed apart.
/// Written at creation and read at rehydration: one typed round trip. Its
/// JSON keeps the layout every version wrote (the spec's fields, plus
/// `url_query: "<sealed>"` beside them when sealed), which the summary
/// Postgres keeps and the secret migration read, so older rows read as
/// they are.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredExecutor {
    /// The spec, without its API key or its URL's query.
    pub spec: ExecutorSpec,
    /// The URL's query was taken off and sealed as the session secret `url_query`.
    pub query_sealed: bool,
}

impl Serialize for StoredExecutor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut value = serde_json::to_value(&self.spec).map_err(S::Error::custom)?;
        if self.query_sealed {
            let fields = value
                .as_object_mut()
                .ok_or_else(|| S::Error::custom("an executor spec is a JSON object"))?;
            fields.insert(SEALED_QUERY_KEY.into(), "<sealed>".into());
        }
        value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StoredExecutor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let query_sealed = fields.remove(SEALED_QUERY_KEY).is_some();
        let spec = ExecutorSpec::deserialize(serde_json::Value::Object(fields))
            .map_err(D::Error::custom)?;
        Ok(StoredExecutor { spec, query_sealed })
    }
}

fn default_outcome() -> Outcome {
    Outcome::Success
}

/// One step of a scripted session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptedStep {
    /// Action name, e.g. `write_file`.
    pub action: String,
    /// Arguments of the action (compared to detect rework).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// `success` (default), `failure` or `error`.
    #[serde(default = "default_outcome")]
    #[schema(value_type = String, example = "success")]
    pub outcome: Outcome,
    /// Tokens the step reports as used; more than the step's allowance
    /// (what is left of the budget) is charged as the allowance and ends
    /// the session `stopped / cost_limit`.
    #[serde(default)]
    pub tokens: u64,
    /// Output text; a final line `<<WARDEN_GOAL_DONE: …>>` or `<<WARDEN_GOAL_BLOCKED: …>>` is a stop signal.
    #[serde(default)]
    pub output: String,
    /// How long the step takes, in ms (at most one hour).
    #[serde(default)]
    pub delay_ms: u64,
    /// Tool calls the step reports.
    #[serde(default)]
    pub tool_calls: u64,
    /// The step is polling a long-running job (exempt from repeat detection).
    #[serde(default)]
    pub waiting: bool,
    /// Files the step claims to write: path and content digest.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub files: Vec<FileWrite>,
    /// Tasks the step delegates to child sessions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub delegate: Vec<ScriptedDelegation>,
}

/// A task a scripted step delegates: the request, and the script of the
/// executor's `scripts` the child runs (without one, the child runs its
/// parent's steps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptedDelegation {
    /// The child's goal.
    pub goal: String,
    /// How the child knows it is done.
    #[serde(default)]
    pub success_criteria: Vec<String>,
    /// Fraction of the session's remaining budget the child gets (0 < share ≤ 1).
    #[serde(default)]
    pub budget_share: Option<f64>,
    /// Whether the session waits (pauses) until its children end (default true).
    #[serde(default = "wait_by_default")]
    pub wait: bool,
    /// The name of the child's script in `executor.scripts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
}

fn wait_by_default() -> bool {
    true
}

impl ScriptedDelegation {
    /// The task as a request for a child.
    pub fn request(&self) -> ChildRequest {
        ChildRequest {
            goal: self.goal.clone(),
            success_criteria: self.success_criteria.clone(),
            budget_share: self.budget_share,
            wait: self.wait,
        }
    }
}

/// What lists and the status show of an executor: the summary Postgres
/// keeps beside the spec (`sessions.executor_summary`, so a page of
/// sessions never reads the spec), or the same made from a spec here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecutorBrief {
    /// `scripted`, `llm`, `webhook` or `worker`.
    pub kind: String,
    /// Number of scripted steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Whether scripted steps repeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<bool>,
    /// Model name (llm), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The client-chosen URL (llm `base_url`, webhook `url`), as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The queue of a worker executor (not in Postgres' summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The tools a model agent chose (not in Postgres' summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl From<&ExecutorSpec> for ExecutorBrief {
    fn from(spec: &ExecutorSpec) -> ExecutorBrief {
        match spec {
            ExecutorSpec::Scripted { steps, repeat, .. } => ExecutorBrief {
                kind: "scripted".into(),
                steps: Some(steps.len()),
                repeat: Some(*repeat),
                ..ExecutorBrief::default()
            },
            ExecutorSpec::Llm {
                model,
                base_url,
                tools,
                ..
            } => ExecutorBrief {
                kind: "llm".into(),
                model: model.clone(),
                url: base_url.clone(),
                tools: tools.clone(),
                ..ExecutorBrief::default()
            },
            ExecutorSpec::Webhook { url, .. } => ExecutorBrief {
                kind: "webhook".into(),
                url: Some(url.clone()),
                ..ExecutorBrief::default()
            },
            ExecutorSpec::Worker { queue, .. } => ExecutorBrief {
                kind: "worker".into(),
                queue: Some(queue.clone()),
                ..ExecutorBrief::default()
            },
        }
    }
}

/// What a session asking for `limits` and `executor` needs of the replica
/// that runs it (see [`crate::policy::capabilities`]). Migration 0027's
/// `warden_session_needs` derives the same in the database, from the
/// columns as stored; a test on Postgres compares the two.
pub fn needs(limits: &Limits, executor: Option<&ExecutorSpec>) -> BTreeSet<Capability> {
    let mut needs = BTreeSet::new();
    if limits.review_every.is_some_and(|n| n > 0) {
        needs.insert(Capability::ReviewEvery);
    }
    match executor {
        Some(ExecutorSpec::Scripted { steps, scripts, .. }) => {
            if steps
                .iter()
                .chain(scripts.values().flatten())
                .any(|s| !s.delegate.is_empty())
            {
                needs.insert(Capability::Delegate);
            }
        }
        Some(ExecutorSpec::Llm {
            tools, approvals, ..
        }) => {
            if !approvals.is_never() {
                needs.insert(Capability::Approvals);
            }
            if tools.iter().flatten().any(|t| t != "builtin") {
                needs.insert(Capability::McpTools);
            }
        }
        Some(ExecutorSpec::Webhook { .. } | ExecutorSpec::Worker { .. }) | None => {}
    }
    needs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_brief_of_a_spec_says_what_postgres_summary_says() {
        let scripted: ExecutorSpec =
            serde_json::from_value(json!({ "kind": "scripted", "steps": [{ "action": "a" }] }))
                .unwrap();
        // What warden_executor_summary makes of the same spec.
        let summary: ExecutorBrief =
            serde_json::from_value(json!({ "kind": "scripted", "steps": 1, "repeat": false }))
                .unwrap();
        assert_eq!(ExecutorBrief::from(&scripted), summary);
        let llm: ExecutorSpec = serde_json::from_value(
            json!({ "kind": "llm", "model": "m", "base_url": "http://x/v1", "tools": ["builtin"] }),
        )
        .unwrap();
        let brief = ExecutorBrief::from(&llm);
        assert_eq!(brief.url.as_deref(), Some("http://x/v1"));
        assert_eq!(brief.tools, Some(vec!["builtin".to_string()]));
    }
}
