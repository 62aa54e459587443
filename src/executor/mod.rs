//! Executors: how one iteration of work gets done. The session loop only sees
//! the `Executor` trait; a scripted list of steps, an OpenAI-compatible model
//! with tools, or a webhook to an external agent plug in behind it.

mod llm;
mod scripted;
pub mod snapshot;
mod webhook;
mod worker;
pub mod workspace;

pub use crate::spec::{ApiKey, ExecutorSpec, ScriptedDelegation, ScriptedStep, StoredExecutor};
pub use llm::{LlmExecutor, SYSTEM_PROMPT};
pub use scripted::{
    MAX_ACTION_CHARS, MAX_DELAY_MS, MAX_OUTPUT_CHARS, MAX_SCRIPTS, SCRIPT_NAME_PATTERN,
    ScriptedExecutor,
};
pub use webhook::{
    ActionApproval, ApprovalOutcome, WebhookExecutor, WebhookHistoryItem, WebhookRequest,
    WebhookResponse, WebhookSignal,
};
pub use worker::{WorkerExecutor, WorkerSettings};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use uuid::Uuid;

use crate::egress::EgressPolicy;
use crate::event::SessionEvent;
use crate::llm::{LlmClient, LlmSettings, Message};
use crate::policy::approval::Decision;
use crate::policy::delegation::{ChildReport, ChildRequest};
use crate::policy::history::{FileWrite, Outcome, StepRecord};
use crate::policy::pricing::StepUsage;
use crate::policy::sentinel::Sentinel;
use crate::store::{AgentTask, AgentTaskWrite};

/// What an executor is told about the step it is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct StepContext<'a> {
    /// The session the step is of.
    pub session_id: Uuid,
    /// The goal.
    pub goal: &'a str,
    /// Number of the iteration to perform (1-based).
    pub iteration: u64,
    /// Guidance a person gave on resume, delivered once.
    pub guidance: Option<&'a str>,
    /// A nudge from stuck detection or reflection, delivered once.
    pub nudge: Option<&'a str>,
    /// Soft budgets: the wrap-up note of the thresholds the last step
    /// crossed ("80% of the token budget is spent; …"), delivered once.
    pub budget_note: Option<&'a str>,
    /// Recent committed steps, oldest first.
    pub history: &'a [StepRecord],
    /// Most tokens this step may use: what is left of the session's token
    /// budget. A model call never asks for more, and a step that reports
    /// more ends the session `stopped / cost_limit`.
    pub token_allowance: u64,
    /// Children that ended since the step before, with their results.
    pub children: &'a [ChildReport],
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Action name.
    pub action: String,
    /// Action arguments.
    pub arguments: serde_json::Value,
    /// How it ended.
    pub outcome: Outcome,
    /// What the world answered.
    pub observation: String,
    /// The agent's own message (checked for stop sentinels).
    pub message: String,
    /// Error text for failures and errors.
    pub error: Option<String>,
    /// Tokens consumed (input plus output): what the token budget counts.
    pub tokens: u64,
    /// The same tokens split (input, cached input, output) and the model
    /// that used them, when the executor knows; priced by the price table.
    pub usage: Option<StepUsage>,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Files written.
    pub files_written: Vec<FileWrite>,
    /// The step is waiting on something long-running.
    pub waiting: bool,
    /// Progress estimate reported by the executor, percent.
    pub percent_complete: Option<f64>,
    /// A signal given through a loop-breaking tool or the webhook's answer.
    pub signal: Option<Sentinel>,
    /// The conversation of this step (model executors), replayed on resume.
    pub transcript: Option<Vec<Message>>,
    /// Events to record with the iteration.
    pub events: Vec<SessionEvent>,
    /// This step found the context window nearly full and started a wrap-up.
    pub context_overflow: bool,
    /// The agent moved to a new context cycle after this step, with this memory.
    pub cycle_change: Option<CycleChange>,
    /// Time spent waiting for the model, when a model was called.
    pub model_latency: Option<std::time::Duration>,
}

/// A new context cycle: its number and the memory carried into it.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleChange {
    /// The new cycle's number.
    pub cycle: u32,
    /// Memory of all earlier cycles.
    pub memory: String,
}

impl StepOutput {
    /// A successful step with just an action and its output.
    pub fn simple(action: impl Into<String>, output: impl Into<String>) -> StepOutput {
        let output = output.into();
        StepOutput {
            action: action.into(),
            arguments: serde_json::Value::Null,
            outcome: Outcome::Success,
            observation: output.clone(),
            message: output,
            error: None,
            tokens: 0,
            usage: None,
            tool_calls: 0,
            files_written: Vec::new(),
            waiting: false,
            percent_complete: None,
            signal: None,
            transcript: None,
            events: Vec::new(),
            context_overflow: false,
            cycle_change: None,
            model_latency: None,
        }
    }
}

/// The result of asking an executor for a step.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// A step was performed.
    Step(Box<StepOutput>),
    /// The executor has nothing more to do (a script ran out).
    Exhausted,
    /// The step was not attempted: it needs more tokens before any answer
    /// (a model's prompt) than the budget has left.
    OverBudget {
        /// Tokens the step needs at the least.
        needed: u64,
        /// Tokens it was allowed.
        allowance: u64,
    },
    /// The step was not performed: no worker claimed it in time, and the
    /// session pauses (`no_worker`) until a person resumes it.
    NoWorker {
        /// What waited, where and for how long.
        detail: String,
    },
    /// The step was given up because the session is being paused.
    Abandoned,
}

/// An executor could not perform the step; the loop records an `error` iteration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecutorError {
    /// The step failed in a way the executor could describe.
    #[error("{action}: {message}")]
    Failed {
        /// Action attempted.
        action: String,
        /// What went wrong.
        message: String,
        /// Tokens consumed before it failed.
        tokens: u64,
    },
}

/// The most tool calls one step may report: the largest `max_tool_calls`
/// a session may have, so one step can use a whole budget and no more.
pub const MAX_STEP_TOOL_CALLS: u64 = 10_000_000;

/// Holds the counts a step reports to what it may have spent, before any
/// of them touches state: its tokens to its allowance (more is charged as
/// the whole allowance, and the budget is over), its tool calls to
/// [`MAX_STEP_TOOL_CALLS`], its usage split to those tokens (see
/// [`StepUsage::bounded`]). Every executor's outcome, a step or a failure,
/// comes through here; returns the tokens as reported, for the
/// overspend check.
pub fn bound_usage(result: &mut Result<StepResult, ExecutorError>, allowance: u64) -> u64 {
    match result {
        Ok(StepResult::Step(out)) => {
            out.tool_calls = out.tool_calls.min(MAX_STEP_TOOL_CALLS);
            let reported = out.tokens;
            out.tokens = reported.min(allowance);
            out.usage = out.usage.take().map(|u| u.bounded(out.tokens));
            reported
        }
        Err(ExecutorError::Failed { tokens, .. }) => {
            let reported = *tokens;
            *tokens = reported.min(allowance);
            reported
        }
        Ok(_) => 0,
    }
}

/// Performs iterations for one session.
pub trait Executor: Send {
    /// Performs iteration `ctx.iteration`. Dropping the future cancels the step.
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>>;

    /// The step in flight was cut short (its future dropped), for `why`:
    /// an executor whose step goes on outside this process (a worker's
    /// task) tells it here. Nothing to do for the others.
    fn interrupted(&mut self, why: Interruption) -> BoxFuture<'_, ()> {
        let _ = why;
        Box::pin(async {})
    }

    /// Tokens the step cut short spent that no answer will report (a model
    /// call abandoned: its prompt's estimate plus what it streamed), taken
    /// once; the loop charges them. 0 for executors whose usage is
    /// reported another way (a worker reports its own).
    fn take_unreported_tokens(&mut self) -> u64 {
        0
    }

    /// The model the steps use, when the executor knows it before a step
    /// (a money budget reserves at its price); `None` when the agent
    /// reports its model with its usage.
    fn model(&self) -> Option<&str> {
        None
    }

    /// The workspace directory the executor works in, if it has one: what
    /// a checkpoint's workspace snapshot walks.
    fn workspace_root(&self) -> Option<&std::path::Path> {
        None
    }
}

/// Why the loop cut a step short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// The session was stopped, or ran out of time: the step is given up.
    Stopped,
    /// This replica drains: the session goes on elsewhere, with the step.
    Draining,
}

/// Records a tool call's intent before it runs and its result after, so a
/// re-executed iteration replays a recorded result instead of repeating a side effect.
pub trait ToolJournal: Send + Sync {
    /// A finished result recorded for this call, if the same tool and arguments ran before.
    fn recorded<'a>(
        &'a self,
        iteration: u64,
        index: u32,
        tool: &'a str,
        arguments: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, String>>;
    /// Records that the call is about to run.
    fn intent<'a>(
        &'a self,
        iteration: u64,
        index: u32,
        tool: &'a str,
        arguments: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), String>>;
    /// Records the call's result.
    fn result<'a>(
        &'a self,
        iteration: u64,
        index: u32,
        result: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// A call the step asks a person about before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalAsk {
    /// Which call of the step (0-based).
    pub call_index: u32,
    /// The model's id of the call.
    pub tool_call_id: Option<String>,
    /// The tool or action.
    pub tool: String,
    /// Its arguments.
    pub arguments: serde_json::Value,
    /// The agent's text of the step: why.
    pub reason: String,
}

/// A person's decision on a call the step before asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidedCall {
    /// Which call of that step.
    pub call_index: u32,
    /// The model's id of the call.
    pub tool_call_id: Option<String>,
    /// The tool or action.
    pub tool: String,
    /// The arguments it runs with: the person's when they edited them,
    /// otherwise the agent's.
    pub arguments: serde_json::Value,
    /// Whether a person approved it with arguments of their own.
    pub edited: bool,
    /// Approve, reject or expired.
    pub decision: Decision,
    /// The person's message to the agent.
    pub message: Option<String>,
}

/// Where a step asks a person about a call, and reads what was decided.
pub trait ApprovalDesk: Send + Sync {
    /// Records that call `ask` of `iteration` waits for a decision.
    fn ask<'a>(&'a self, iteration: u64, ask: &'a ApprovalAsk)
    -> BoxFuture<'a, Result<(), String>>;
    /// The decided calls of `iteration`, in call order.
    fn decided(&self, iteration: u64) -> BoxFuture<'_, Result<Vec<DecidedCall>, String>>;
}

/// A child session made for a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildTicket {
    /// The child.
    pub child_id: Uuid,
    /// Tokens it was given.
    pub tokens: u64,
    /// Iterations it was given.
    pub iterations: u64,
}

/// Where a step delegates tasks to child sessions.
pub trait ChildDesk: Send + Sync {
    /// Makes a child for call `index` of `iteration` (the same call finds
    /// the child it made before); `pending_tokens`: what the step has
    /// spent so far; `executor`: the child's own specification, when not
    /// its parent's. `Err` carries a message for the agent.
    fn delegate<'a>(
        &'a self,
        iteration: u64,
        index: u32,
        request: &'a ChildRequest,
        pending_tokens: u64,
        executor: Option<serde_json::Value>,
    ) -> BoxFuture<'a, Result<ChildTicket, String>>;
}

/// The agent's persistent task queue.
pub trait TaskQueue: Send + Sync {
    /// The queue, highest priority first.
    fn read(&self) -> BoxFuture<'_, Result<Vec<AgentTask>, String>>;
    /// Applies changes; `Err` carries a message for the agent.
    fn write<'a>(
        &'a self,
        writes: &'a [AgentTaskWrite],
    ) -> BoxFuture<'a, Result<Vec<AgentTask>, String>>;
}

/// The query of a client-chosen URL (`?…`): often a credential (`?key=…`,
/// a signed token), so it is kept like an API key: sealed apart from the
/// stored spec, never shown, its `Debug` redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct UrlQuery(String);

impl UrlQuery {
    /// Wraps a query (without its `?`).
    pub fn new(query: impl Into<String>) -> UrlQuery {
        UrlQuery(query.into())
    }

    /// The query itself, for sealing and for the requests it goes in.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for UrlQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlQuery(<redacted>)")
    }
}

impl StoredExecutor {
    /// Takes the secrets out of `spec`: what is stored, and the API key and
    /// URL query to seal apart.
    pub fn seal(mut spec: ExecutorSpec) -> (StoredExecutor, Option<ApiKey>, Option<UrlQuery>) {
        let api_key = spec.take_api_key();
        let url_query = spec.take_url_query();
        let stored = StoredExecutor {
            spec,
            query_sealed: url_query.is_some(),
        };
        (stored, api_key, url_query)
    }
}

/// Why [`ExecutorSpec::vet`] refused an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Its MCP tools are not declared here or not open to the tenant.
    Tools(String),
    /// A URL it would call is refused by the outbound-request policy.
    Egress(String),
}

/// Most scripted steps one session may carry.
pub const MAX_SCRIPTED_STEPS: usize = 10_000;
/// Allowed timeout of one model call or webhook step, ms.
pub const TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;
/// Allowed attempts of one worker step.
pub const MAX_ATTEMPTS: std::ops::RangeInclusive<u32> = 1..=20;
/// Allowed wait of a worker task for a claim, ms (up to a day).
pub const WORKER_WAIT_MS: std::ops::RangeInclusive<u64> = 100..=86_400_000;
/// Most labels of a worker executor.
pub const MAX_LABELS: usize = 32;
/// Longest label name, in characters.
pub const MAX_LABEL_NAME_CHARS: usize = 64;
/// Longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 256;

/// Allowed most tokens one model call may generate.
pub const MAX_TOKENS_PER_CALL: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// Allowed sampling temperature.
pub const TEMPERATURE: std::ops::RangeInclusive<f64> = 0.0..=2.0;

/// Defaults and shared parts executors are built from.
#[derive(Clone)]
pub struct ExecutorDeps {
    /// The session the executor works for (its workspace is named by it).
    pub session_id: Uuid,
    /// The goal (the model executor's system prompt names it).
    pub goal: String,
    /// Default model endpoint, if configured.
    pub llm: Option<LlmSettings>,
    /// Default model name.
    pub llm_model: Option<String>,
    /// Timeout and retries of model calls (the environment's).
    pub llm_call: crate::llm::CallPolicy,
    /// Default most tokens per call.
    pub llm_max_tokens: u64,
    /// Where workspaces live.
    pub workspace_root: PathBuf,
    /// Largest file a tool may read or write.
    pub max_file_bytes: u64,
    /// Tool calls of one model answer that are executed.
    pub max_tool_calls_per_step: usize,
    /// Bytes of each text of a step's answer kept (`WARDEN_MAX_OUTPUT_BYTES`).
    pub max_output_bytes: usize,
    /// What the session's workspace may hold.
    pub workspace_limits: workspace::Limits,
    /// The tool-call journal of this session.
    pub journal: Arc<dyn ToolJournal>,
    /// Where this session's calls wait for approval.
    pub approvals: Arc<dyn ApprovalDesk>,
    /// Where this session delegates tasks to children.
    pub children: Arc<dyn ChildDesk>,
    /// Its ancestors, root first (a child's workspace is inside its parent's).
    pub lineage: Vec<Uuid>,
    /// The conversation of the current cycle, one entry per committed step.
    pub transcript: Vec<Vec<Message>>,
    /// The agent's task queue.
    pub tasks: Arc<dyn TaskQueue>,
    /// Current context cycle.
    pub cycle: u32,
    /// Memory carried from earlier cycles.
    pub memory: String,
    /// Context window budget, tokens.
    pub context_budget_tokens: u64,
    /// Success criteria, shown to the agent.
    pub criteria: Vec<String>,
    /// The outbound-request policy for URLs the session's creator chose.
    pub egress: Arc<EgressPolicy>,
    /// Where worker tasks are offered.
    pub store: crate::store::Store,
    /// The run's lease token: the worker tasks it waits on are fenced by it.
    pub run: Uuid,
    /// The session's tenant (its worker tasks are of it).
    pub tenant: String,
    /// This replica's MCP servers.
    pub mcp: Arc<crate::mcp::McpRegistry>,
}

impl ExecutorSpec {
    /// Checks the specification; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ExecutorSpec::Scripted { steps, scripts, .. } => {
                validate_scripts(scripts)?;
                validate_steps(steps)
            }
            ExecutorSpec::Llm {
                model,
                base_url,
                timeout_ms,
                max_tokens_per_call,
                temperature,
                tools,
                approvals,
                ..
            } => {
                approvals.validate()?;
                if let Some(url) = base_url {
                    check_url("executor.base_url", url)?;
                }
                crate::mcp::ToolChoice::parse(tools.as_deref())?;
                if model.as_deref().is_some_and(crate::policy::text::is_blank) {
                    return Err("executor.model must not be empty".into());
                }
                check_range("executor.timeout_ms", *timeout_ms, &TIMEOUT_MS)?;
                check_range(
                    "executor.max_tokens_per_call",
                    *max_tokens_per_call,
                    &MAX_TOKENS_PER_CALL,
                )?;
                check_range("executor.temperature", *temperature, &TEMPERATURE)
            }
            ExecutorSpec::Webhook { url, timeout_ms } => {
                check_url("executor.url", url)?;
                check_range("executor.timeout_ms", *timeout_ms, &TIMEOUT_MS)
            }
            ExecutorSpec::Worker {
                queue,
                labels,
                heartbeat_timeout_ms,
                max_attempts,
                worker_wait_timeout_ms,
            } => {
                validate_queue_and_labels(queue, labels)?;
                check_range(
                    "executor.heartbeat_timeout_ms",
                    *heartbeat_timeout_ms,
                    &TIMEOUT_MS,
                )?;
                check_range("executor.max_attempts", *max_attempts, &MAX_ATTEMPTS)?;
                check_range(
                    "executor.worker_wait_timeout_ms",
                    *worker_wait_timeout_ms,
                    &WORKER_WAIT_MS,
                )
            }
        }
    }

    /// Checks the MCP servers `executor.tools` names against those
    /// declared and those `tenant` may use; the message names the item.
    pub fn check_tools(&self, mcp: &crate::mcp::McpConfig, tenant: &str) -> Result<(), String> {
        match self {
            ExecutorSpec::Llm { tools, .. } => {
                let choice = crate::mcp::ToolChoice::parse(tools.as_deref())?;
                mcp.check_choice(&choice, tenant)
            }
            _ => Ok(()),
        }
    }

    /// The executor's kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorSpec::Scripted { .. } => "scripted",
            ExecutorSpec::Llm { .. } => "llm",
            ExecutorSpec::Webhook { .. } => "webhook",
            ExecutorSpec::Worker { .. } => "worker",
        }
    }

    /// Whether the executor works in a workspace on this replica's disk.
    pub fn uses_workspace(&self) -> bool {
        matches!(self, ExecutorSpec::Llm { .. })
    }

    /// Builds the executor for a session.
    pub fn build(&self, deps: ExecutorDeps) -> Result<Box<dyn Executor>, String> {
        match self {
            ExecutorSpec::Scripted {
                steps,
                repeat,
                scripts,
            } => Ok(Box::new(
                ScriptedExecutor::new(steps.clone(), *repeat)
                    .with_children(deps.children.clone(), scripts.clone()),
            )),
            ExecutorSpec::Llm {
                model,
                base_url,
                api_key,
                timeout_ms,
                max_tokens_per_call,
                temperature,
                tools,
                approvals,
            } => {
                let choice = crate::mcp::ToolChoice::parse(tools.as_deref())?;
                let toolbox = deps.mcp.toolbox(&choice, &deps.tenant);
                let defaults = deps.llm.clone();
                let endpoint = ModelEndpoint::choose(base_url.as_deref(), defaults.as_ref())?;
                let model = model
                    .clone()
                    .or_else(|| deps.llm_model.clone())
                    .ok_or("no model name: set WARDEN_LLM_MODEL or executor.model")?;
                let settings = endpoint.settings(
                    api_key.as_ref(),
                    *timeout_ms,
                    defaults.as_ref(),
                    &deps.llm_call,
                );
                let client = endpoint.client(settings, &deps.egress)?;
                let workspace = open_workspace(&deps)?;
                Ok(Box::new(LlmExecutor::new(
                    client,
                    model,
                    max_tokens_per_call.unwrap_or(deps.llm_max_tokens),
                    *temperature,
                    llm::AgentTools {
                        workspace,
                        mcp: toolbox,
                        approval_policy: approvals.clone(),
                    },
                    deps,
                )))
            }
            ExecutorSpec::Webhook { url, timeout_ms } => Ok(Box::new(
                WebhookExecutor::new(
                    url.clone(),
                    Duration::from_millis(timeout_ms.unwrap_or(60_000)),
                    &deps.egress,
                    deps.approvals.clone(),
                    deps.children.clone(),
                )
                .map_err(|e| format!("executor.url {e}"))?,
            )),
            ExecutorSpec::Worker {
                queue,
                labels,
                heartbeat_timeout_ms,
                max_attempts,
                worker_wait_timeout_ms,
            } => Ok(Box::new(WorkerExecutor::new(
                deps.store.clone(),
                &deps.tenant,
                worker_settings(
                    queue,
                    labels,
                    *heartbeat_timeout_ms,
                    *max_attempts,
                    *worker_wait_timeout_ms,
                ),
                deps.approvals.clone(),
                deps.children.clone(),
                deps.run,
            ))),
        }
    }

    /// Vets the executor against this replica before a session is made:
    /// its MCP tools (see [`ExecutorSpec::check_tools`]), then its URLs
    /// (see [`ExecutorSpec::vet_urls`]).
    pub async fn vet(
        &self,
        mcp: &crate::mcp::McpConfig,
        tenant: &str,
        egress: &EgressPolicy,
        operator_base_url: Option<&str>,
    ) -> Result<(), Refused> {
        self.check_tools(mcp, tenant).map_err(Refused::Tools)?;
        self.vet_urls(egress, operator_base_url)
            .await
            .map_err(Refused::Egress)
    }

    /// Checks every URL the client chose against the outbound-request
    /// policy, resolving host names now, so a refused destination is a 403
    /// at creation rather than a failing session. `operator_base_url` (the
    /// server's own endpoint) is trusted. The message names the field.
    pub async fn vet_urls(
        &self,
        egress: &EgressPolicy,
        operator_base_url: Option<&str>,
    ) -> Result<(), String> {
        let (field, url) = match self {
            ExecutorSpec::Scripted { .. } | ExecutorSpec::Worker { .. } => return Ok(()),
            ExecutorSpec::Llm { base_url, .. } => match base_url {
                Some(url) if !same_endpoint(Some(url), operator_base_url) => {
                    ("executor.base_url", url)
                }
                _ => return Ok(()),
            },
            ExecutorSpec::Webhook { url, .. } => ("executor.url", url),
        };
        egress
            .vet_url(url)
            .await
            .map_err(|e| format!("{field} {e}"))
    }

    /// Takes the session's own API key out of the spec (it is stored
    /// sealed, apart from the spec).
    pub fn take_api_key(&mut self) -> Option<ApiKey> {
        match self {
            ExecutorSpec::Llm { api_key, .. } => api_key.take(),
            _ => None,
        }
    }

    /// Puts a key read back from its sealed store into the spec (model
    /// executors only; a key already in the spec wins).
    pub fn with_api_key(mut self, key: ApiKey) -> ExecutorSpec {
        if let ExecutorSpec::Llm { api_key, .. } = &mut self
            && api_key.is_none()
        {
            *api_key = Some(key);
        }
        self
    }

    /// The URL the client chose (a model executor's `base_url`, a webhook's `url`).
    fn client_url_mut(&mut self) -> Option<&mut String> {
        match self {
            ExecutorSpec::Llm { base_url, .. } => base_url.as_mut(),
            ExecutorSpec::Webhook { url, .. } => Some(url),
            ExecutorSpec::Scripted { .. } | ExecutorSpec::Worker { .. } => None,
        }
    }

    /// Takes the query off the client-chosen URL (it is stored sealed,
    /// apart from the spec), and the fragment, which is never sent.
    pub fn take_url_query(&mut self) -> Option<UrlQuery> {
        let url = self.client_url_mut()?;
        let (without, query) = crate::egress::split_query(url);
        let query = query.map(str::to_string);
        *url = without.to_string();
        query.map(UrlQuery::new)
    }

    /// Puts a query read back from its sealed store onto the client-chosen URL.
    pub fn with_url_query(mut self, query: &UrlQuery) -> ExecutorSpec {
        if let Some(url) = self.client_url_mut() {
            *url = format!("{url}?{}", query.expose());
        }
        self
    }

    /// The spec as shown to clients: secrets removed, URLs without
    /// credentials or query.
    pub fn redacted(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut value = serde_json::to_value(self)?;
        if let Some(obj) = value.as_object_mut() {
            if obj.get("api_key").is_some_and(|k| !k.is_null()) {
                obj.insert(
                    "api_key".into(),
                    serde_json::Value::String("<redacted>".into()),
                );
            }
            for field in ["base_url", "url"] {
                if let Some(serde_json::Value::String(url)) = obj.get_mut(field) {
                    *url = crate::egress::redact_url(url);
                }
            }
        }
        Ok(value)
    }
}

/// Checks the named scripts a scripted executor may run: how many, their
/// names and their steps.
fn validate_scripts(scripts: &BTreeMap<String, Vec<ScriptedStep>>) -> Result<(), String> {
    if scripts.len() > MAX_SCRIPTS {
        return Err(format!(
            "executor.scripts may name at most {MAX_SCRIPTS} scripts, got {}",
            scripts.len()
        ));
    }
    for (name, script) in scripts {
        if !scripted::valid_script_name(name) {
            return Err(format!(
                "executor.scripts: {name:?} is not a script name (1 to 64 letters, digits, '_' or '-')"
            ));
        }
        if script.is_empty() || script.len() > MAX_SCRIPTED_STEPS {
            return Err(format!(
                "executor.scripts.{name} must hold 1 to {MAX_SCRIPTED_STEPS} steps"
            ));
        }
        for (i, step) in script.iter().enumerate() {
            step.validate()
                .map_err(|e| format!("executor.scripts.{name}[{i}].{e}"))?;
        }
    }
    Ok(())
}

/// Checks a scripted executor's main steps: at least one, not too many,
/// each valid.
fn validate_steps(steps: &[ScriptedStep]) -> Result<(), String> {
    if steps.is_empty() {
        return Err("executor.steps must contain at least one step".into());
    }
    if steps.len() > MAX_SCRIPTED_STEPS {
        return Err(format!(
            "executor.steps may contain at most {MAX_SCRIPTED_STEPS} steps, got {}",
            steps.len()
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        step.validate()
            .map_err(|e| format!("executor.steps[{i}].{e}"))?;
    }
    Ok(())
}

/// Checks a worker executor's queue name and its labels' count and sizes.
fn validate_queue_and_labels(queue: &str, labels: &BTreeMap<String, String>) -> Result<(), String> {
    if !crate::policy::worker::valid_queue(queue) {
        return Err("executor.queue must be 1 to 64 letters, digits, '-', '_' or '.'".into());
    }
    validate_labels("executor.labels", labels)
}

/// Checks a set of labels' count and sizes (an executor's, or the ones a
/// worker advertises in its claim); the message names `field`.
pub fn validate_labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS
        || labels.iter().any(|(k, v)| {
            k.is_empty()
                || k.chars().count() > MAX_LABEL_NAME_CHARS
                || v.chars().count() > MAX_LABEL_VALUE_CHARS
        })
    {
        return Err(format!(
            "{field} may hold at most {MAX_LABELS} labels, names of 1 to {MAX_LABEL_NAME_CHARS} characters, values of at most {MAX_LABEL_VALUE_CHARS}"
        ));
    }
    Ok(())
}

/// A worker executor's settings, its defaults filled in.
fn worker_settings(
    queue: &str,
    labels: &BTreeMap<String, String>,
    heartbeat_timeout_ms: Option<u64>,
    max_attempts: Option<u32>,
    worker_wait_timeout_ms: Option<u64>,
) -> WorkerSettings {
    WorkerSettings {
        queue: queue.to_string(),
        labels: labels.clone(),
        heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms.unwrap_or(30_000)),
        max_attempts: max_attempts.unwrap_or(3),
        worker_wait_timeout: Duration::from_millis(worker_wait_timeout_ms.unwrap_or(600_000)),
    }
}

/// The session's workspace, beneath its tree's root, with the limits set.
fn open_workspace(deps: &ExecutorDeps) -> Result<workspace::Workspace, String> {
    let base = workspace::base_for(&deps.workspace_root, &deps.lineage);
    let workspace = workspace::Workspace::open(&base, deps.session_id)
        .map_err(|e| format!("cannot open the session workspace: {e}"))?
        .with_limits(deps.workspace_limits);
    Ok(workspace)
}

/// The model endpoint a session calls, and whether it is the operator's own.
struct ModelEndpoint {
    base_url: String,
    /// The server's `WARDEN_LLM_BASE_URL`: trusted, and the only endpoint
    /// that may receive the server's `WARDEN_LLM_API_KEY`.
    is_operators: bool,
}

impl ModelEndpoint {
    fn choose(
        session_base_url: Option<&str>,
        defaults: Option<&LlmSettings>,
    ) -> Result<ModelEndpoint, String> {
        let operators = defaults.map(|d| d.base_url.as_str());
        match session_base_url {
            Some(url) => Ok(ModelEndpoint {
                base_url: url.to_string(),
                is_operators: same_endpoint(Some(url), operators),
            }),
            None => operators
                .map(|url| ModelEndpoint {
                    base_url: url.to_string(),
                    is_operators: true,
                })
                .ok_or_else(|| {
                    "no model endpoint: set WARDEN_LLM_BASE_URL or executor.base_url".to_string()
                }),
        }
    }

    /// The client settings for this endpoint: the session's key, else the
    /// server's for the server's own endpoint, and the server's call policy.
    fn settings(
        &self,
        api_key: Option<&ApiKey>,
        timeout_ms: Option<u64>,
        defaults: Option<&LlmSettings>,
        call: &crate::llm::CallPolicy,
    ) -> LlmSettings {
        LlmSettings {
            base_url: self.base_url.clone(),
            // The server's own key goes only to the server's own
            // endpoint; a session naming another brings its own.
            api_key: api_key.map(|k| k.expose().to_string()).or_else(|| {
                self.is_operators
                    .then(|| defaults.and_then(|d| d.api_key.clone()))
                    .flatten()
            }),
            // The environment's policy, whichever endpoint; a
            // session's own timeout overrides only the timeout.
            timeout: timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(call.timeout),
            max_retries: call.max_retries,
            retry_base: call.retry_base,
        }
    }

    /// The client: the operator's endpoint is trusted, any other goes
    /// through the outbound-request policy.
    fn client(
        &self,
        settings: LlmSettings,
        egress: &Arc<EgressPolicy>,
    ) -> Result<LlmClient, String> {
        let client = if self.is_operators {
            LlmClient::new(settings).map_err(|e| e.to_string())?
        } else {
            let http = egress
                .client_for(&settings.base_url, settings.timeout)
                .map_err(|e| format!("executor.base_url {e}"))?;
            LlmClient::with_http(settings, http, egress.max_response_bytes())
        };
        Ok(client)
    }
}

/// Whether two base URLs name the same endpoint (a trailing `/` aside).
fn same_endpoint(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.trim_end_matches('/') == b.trim_end_matches('/'),
        _ => false,
    }
}

/// Refuses a `field` set outside `range`, naming both ends.
fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    value: Option<T>,
    range: &std::ops::RangeInclusive<T>,
) -> Result<(), String> {
    match value {
        Some(v) if !range.contains(&v) => Err(format!(
            "{field} must be between {} and {}",
            range.start(),
            range.end()
        )),
        _ => Ok(()),
    }
}

fn check_url(field: &str, url: &str) -> Result<(), String> {
    // Printable ASCII only (an IDN goes in its punycode form): the same
    // characters the OpenAPI document's pattern allows.
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "https://".len()
        && url.chars().all(|c| c.is_ascii_graphic());
    if !ok {
        return Err(format!(
            "{field} must be an http:// or https:// URL of printable ASCII, got {:?}",
            crate::egress::redact_url(url)
        ));
    }
    if has_userinfo(url) {
        let instead = if field == "executor.base_url" {
            "put the model server's key in executor.api_key"
        } else {
            "a webhook's URL may not carry a login; use a token in its query, which is kept secret"
        };
        return Err(format!(
            "{field} must not carry credentials (user:password@host): {instead}"
        ));
    }
    Ok(())
}

/// Whether an http(s) URL's authority carries userinfo (`user:pass@`).
fn has_userinfo(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.contains('@')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: a deterministic source of cases (no property-testing
    /// crate is a dependency).
    struct Cases(u64);

    impl Cases {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// A count an outside party could report: mostly the edges.
        fn extreme(&mut self, near: u64) -> u64 {
            let edges = [
                0,
                1,
                near.saturating_sub(1),
                near,
                near.saturating_add(1),
                i64::MAX as u64 - 1,
                i64::MAX as u64,
                i64::MAX as u64 + 1,
                u64::MAX - 1,
                u64::MAX,
            ];
            match self.next() % 12 {
                i @ 0..10 => edges[i as usize],
                10 => self.next(),
                _ => self.next() % near.saturating_add(2),
            }
        }
    }

    /// Every executor's outcome for a step reporting `tokens` and
    /// `tool_calls`: scripted, the webhook and worker answer (one mapping),
    /// and a failure (the model executor's, or any other's).
    async fn outcomes(
        tokens: u64,
        tool_calls: u64,
    ) -> Vec<(&'static str, Result<StepResult, ExecutorError>)> {
        let step = serde_json::from_value(serde_json::json!({
            "action": "a", "tokens": tokens, "tool_calls": tool_calls
        }))
        .expect("a scripted step");
        let mut scripted = scripted::ScriptedExecutor::new(vec![step], false);
        let ctx = StepContext {
            session_id: Uuid::nil(),
            goal: "g",
            iteration: 1,
            guidance: None,
            nudge: None,
            budget_note: None,
            history: &[],
            token_allowance: 0,
            children: &[],
        };
        let answer = serde_json::from_value(serde_json::json!({
            "action": "a", "tokens": tokens, "tool_calls": tool_calls
        }))
        .expect("an answer");
        vec![
            ("scripted", scripted.execute(ctx).await),
            ("webhook or worker", Ok(webhook::step_result(answer))),
            (
                "failure",
                Err(ExecutorError::Failed {
                    action: "a".into(),
                    message: "m".into(),
                    tokens,
                }),
            ),
        ]
    }

    #[test]
    fn a_reported_usage_is_counted_and_held_to_the_allowance() {
        let answer = serde_json::from_value(serde_json::json!({
            "action": "a", "tokens": 5,
            "usage": { "input_tokens": u64::MAX, "output_tokens": u64::MAX,
                       "cached_tokens": u64::MAX, "reasoning_tokens": u64::MAX, "model": "m" }
        }))
        .expect("an answer");
        let mut result = Ok(webhook::step_result(answer));
        assert_eq!(bound_usage(&mut result, 1_000), u64::MAX);
        let Ok(StepResult::Step(out)) = result else {
            panic!("a step")
        };
        assert_eq!(out.tokens, 1_000);
        let usage = out.usage.expect("usage");
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.cached_tokens),
            (1_000, 0, 1_000)
        );
        assert_eq!(usage.reasoning_tokens, 0);
        // Under the count: the rest is output, and `tokens` wins.
        let answer = serde_json::from_value(serde_json::json!({
            "action": "a", "tokens": 50, "usage": { "input_tokens": 10, "output_tokens": 5 }
        }))
        .expect("an answer");
        let mut result = Ok(webhook::step_result(answer));
        assert_eq!(bound_usage(&mut result, 1_000), 50);
        let Ok(StepResult::Step(out)) = result else {
            panic!("a step")
        };
        let usage = out.usage.expect("usage");
        assert_eq!(
            (out.tokens, usage.input_tokens, usage.output_tokens),
            (50, 10, 40)
        );
    }

    #[tokio::test]
    async fn reported_counts_are_held_to_the_allowance_on_every_outcome_path() {
        let mut cases = Cases(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2_000 {
            let allowance = cases.extreme(10_000_000_000).min(10_000_000_000);
            let tokens = cases.extreme(allowance);
            let tool_calls = cases.extreme(MAX_STEP_TOOL_CALLS);
            for (path, mut result) in outcomes(tokens, tool_calls).await {
                let reported = bound_usage(&mut result, allowance);
                let case =
                    format!("{path}: {tokens} tokens, {tool_calls} calls, allowance {allowance}");
                assert_eq!(reported, tokens, "{case}");
                let (held, calls) = match &result {
                    Ok(StepResult::Step(out)) => (out.tokens, Some(out.tool_calls)),
                    Err(ExecutorError::Failed { tokens, .. }) => (*tokens, None),
                    Ok(other) => panic!("{case}: {other:?}"),
                };
                assert_eq!(held, tokens.min(allowance), "{case}");
                if let Some(calls) = calls {
                    assert_eq!(calls, tool_calls.min(MAX_STEP_TOOL_CALLS), "{case}");
                }
                // What is stored next: a session's counters, which stay
                // inside bigint whatever came before.
                let usage = crate::policy::guardrails::Usage {
                    tokens: cases.extreme(10_000_000_000).min(10_000_000_000),
                    ..Default::default()
                };
                let after = usage.tokens.saturating_add(held);
                assert!(i64::try_from(after).is_ok(), "{case}: {after}");
            }
        }
    }

    fn llm_with_key() -> ExecutorSpec {
        serde_json::from_value(serde_json::json!({
            "kind": "llm", "base_url": "https://u:pw@llm.example/v1?k=q", "api_key": "sk-spec-secret-1"
        }))
        .unwrap()
    }

    #[test]
    fn the_api_key_never_shows_in_debug_and_is_taken_out_before_storing() {
        let mut spec = llm_with_key();
        assert!(!format!("{spec:?}").contains("sk-spec-secret-1"));
        let key = spec.take_api_key().expect("the key");
        assert_eq!(key.expose(), "sk-spec-secret-1");
        assert!(!format!("{key:?}").contains("sk-spec-secret-1"));
        let stored = serde_json::to_value(&spec).unwrap();
        assert!(stored.get("api_key").is_none(), "{stored}");
        // Read back and given its key again, it is the spec as created.
        let back: ExecutorSpec = serde_json::from_value(stored).unwrap();
        assert_eq!(back.with_api_key(key), llm_with_key());
        let shown = llm_with_key().redacted().unwrap().to_string();
        assert!(
            !shown.contains("sk-spec") && !shown.contains("pw") && !shown.contains("k=q"),
            "{shown}"
        );
    }

    fn spec(value: serde_json::Value) -> ExecutorSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_stored_executor_round_trips_with_its_secrets_sealed_apart() {
        let (stored, key, query) = StoredExecutor::seal(llm_with_key());
        assert_eq!(
            key.map(|k| k.expose().to_string()).as_deref(),
            Some("sk-spec-secret-1")
        );
        assert_eq!(query.as_ref().map(UrlQuery::expose), Some("k=q"));
        assert!(stored.query_sealed);
        let json = serde_json::to_value(&stored).unwrap();
        assert!(!json.to_string().contains("sk-spec") && !json.to_string().contains("k=q"));
        assert_eq!(
            serde_json::from_value::<StoredExecutor>(json.clone()).unwrap(),
            stored
        );
        // Given its secrets back, it is the spec as created.
        let back = stored
            .spec
            .with_api_key(ApiKey::new("sk-spec-secret-1"))
            .with_url_query(&UrlQuery::new("k=q"));
        assert_eq!(back, llm_with_key());
        // Without a query, nothing says there was one.
        let (plain, _, none) = StoredExecutor::seal(spec(serde_json::json!({
            "kind": "webhook", "url": "https://agent.example/step"
        })));
        assert!(none.is_none() && !plain.query_sealed);
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get(crate::spec::SEALED_QUERY_KEY).is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<StoredExecutor>(json.clone()).unwrap(),
            plain
        );
    }

    #[test]
    fn rows_written_by_older_versions_still_read() {
        use serde_json::json;
        // The marker older versions put beside the spec's fields.
        let sealed = json!({ "kind": "webhook", "url": "https://agent.example/step",
                             "timeout_ms": null, "url_query": "<sealed>" });
        let read = serde_json::from_value::<StoredExecutor>(sealed).unwrap();
        assert!(read.query_sealed);
        assert_eq!(
            read.spec,
            spec(json!({ "kind": "webhook", "url": "https://agent.example/step" }))
        );
        // A key left in the spec from before keys were sealed still reads.
        let keyed = json!({ "kind": "llm", "api_key": "sk-old" });
        let read = serde_json::from_value::<StoredExecutor>(keyed).unwrap();
        assert!(!read.query_sealed);
        assert_eq!(
            read.spec.clone().take_api_key(),
            Some(ApiKey::new("sk-old"))
        );
        // A field no version wrote is refused (the row is corrupt), as is a non-object.
        assert!(
            serde_json::from_value::<StoredExecutor>(
                json!({ "kind": "scripted", "steps": [], "x": 1 })
            )
            .is_err()
        );
        assert!(serde_json::from_value::<StoredExecutor>(json!("scripted")).is_err());
    }

    #[test]
    fn numbers_outside_their_range_are_refused_naming_the_field_and_both_ends() {
        use serde_json::json;
        for (value, said) in [
            (
                json!({ "kind": "llm", "timeout_ms": 99 }),
                "executor.timeout_ms must be between 100 and 3600000",
            ),
            (
                json!({ "kind": "llm", "max_tokens_per_call": 0 }),
                "executor.max_tokens_per_call must be between 1 and 1000000",
            ),
            (
                json!({ "kind": "llm", "temperature": 2.5 }),
                "executor.temperature must be between 0 and 2",
            ),
            (
                json!({ "kind": "webhook", "url": "https://agent.example/step", "timeout_ms": 3_600_001 }),
                "executor.timeout_ms must be between 100 and 3600000",
            ),
            (
                json!({ "kind": "worker", "queue": "q", "heartbeat_timeout_ms": 50 }),
                "executor.heartbeat_timeout_ms must be between 100 and 3600000",
            ),
            (
                json!({ "kind": "worker", "queue": "q", "max_attempts": 21 }),
                "executor.max_attempts must be between 1 and 20",
            ),
            (
                json!({ "kind": "worker", "queue": "q", "worker_wait_timeout_ms": 86_400_001 }),
                "executor.worker_wait_timeout_ms must be between 100 and 86400000",
            ),
        ] {
            assert_eq!(
                spec(value.clone()).validate(),
                Err(said.to_string()),
                "{value}"
            );
        }
        // Both ends are in range.
        for value in [
            json!({ "kind": "llm", "timeout_ms": 100, "max_tokens_per_call": 1_000_000, "temperature": 0.0 }),
            json!({ "kind": "worker", "queue": "q", "max_attempts": 1, "worker_wait_timeout_ms": 86_400_000 }),
        ] {
            assert_eq!(spec(value.clone()).validate(), Ok(()), "{value}");
        }
    }

    #[test]
    fn urls_with_credentials_are_refused_naming_where_they_go() {
        for (value, field) in [
            (
                serde_json::json!({ "kind": "llm", "base_url": "https://u:pw@llm.example/v1" }),
                "executor.base_url",
            ),
            (
                serde_json::json!({ "kind": "llm", "base_url": "https://tok@llm.example/v1" }),
                "executor.base_url",
            ),
            (
                serde_json::json!({ "kind": "webhook", "url": "http://:pw@agent.example/step" }),
                "executor.url",
            ),
        ] {
            let err = spec(value).validate().unwrap_err();
            assert!(
                err.starts_with(field) && err.contains("credentials") && !err.contains("pw"),
                "{err}"
            );
        }
        assert!(
            spec(serde_json::json!({ "kind": "llm", "base_url": "https://u:pw@h/v1" }))
                .validate()
                .unwrap_err()
                .contains("executor.api_key")
        );
        // An @ after the authority is not userinfo.
        for ok in [
            "https://llm.example/v1/@team?who=a@b",
            "https://llm.example/v1?mail=a@b",
        ] {
            assert_eq!(
                spec(serde_json::json!({ "kind": "webhook", "url": ok })).validate(),
                Ok(()),
                "{ok}"
            );
        }
    }

    #[test]
    fn the_url_query_is_taken_off_and_put_back() {
        let original = spec(serde_json::json!({
            "kind": "llm", "base_url": "https://llm.example/v1?key=q-secret&x=1#frag"
        }));
        let mut public = original.clone();
        let query = public.take_url_query().expect("a query");
        assert_eq!(query.expose(), "key=q-secret&x=1");
        assert!(!format!("{query:?}").contains("q-secret"));
        let stored = serde_json::to_value(&public).unwrap();
        assert_eq!(stored["base_url"], "https://llm.example/v1", "{stored}");
        let back = public.with_url_query(&query);
        assert!(matches!(&back, ExecutorSpec::Llm { base_url: Some(u), .. }
            if u == "https://llm.example/v1?key=q-secret&x=1"));

        let mut hook =
            spec(serde_json::json!({ "kind": "webhook", "url": "http://a.example/s?t=1" }));
        assert_eq!(
            hook.take_url_query().map(|q| q.expose().to_string()),
            Some("t=1".into())
        );
        for (kind, value) in [
            (
                "no query",
                serde_json::json!({ "kind": "webhook", "url": "http://a.example/s" }),
            ),
            (
                "empty query",
                serde_json::json!({ "kind": "webhook", "url": "http://a.example/s?" }),
            ),
            ("default endpoint", serde_json::json!({ "kind": "llm" })),
            (
                "scripted",
                serde_json::json!({ "kind": "scripted", "steps": [{ "action": "a" }] }),
            ),
        ] {
            let mut s = spec(value);
            assert!(s.take_url_query().is_none(), "{kind}");
        }
    }
}
