//! The JSON documents the API answers with. Field names are the stable
//! contract clients rely on: snake_case, never renamed; a change is a new
//! field (the OpenAPI document, kept in sync by a test, is that contract).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::event::{RefinementProposal, SessionEvent};
use crate::policy::approval::Decision;
use crate::policy::checklist::ChecklistItem;
use crate::policy::eta::{self, EtaBasis};
use crate::policy::excerpt;
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{Action, Mode, Reason, Status, allowed_actions};
use crate::policy::loop_state::AppliedReflection;
use crate::policy::pricing::StepUsage;
use crate::policy::projection::{self, ProgressSample};
use crate::policy::reflection::Assessment;
use crate::session::LoggedEvent;
use crate::session::live::StepInFlight;
use crate::session::{ApprovalRow, CheckpointRecord, IterationRecord, ReflectionSummary, Session};
use crate::spec::ExecutorBrief;

/// A call that waits for (or had) a person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = Approval)]
pub struct ApprovalView {
    /// The session.
    pub session_id: Uuid,
    /// Warden's name of the call: `{iteration}.{call_index}`.
    pub call_id: String,
    /// The step that asked.
    pub iteration: i64,
    /// Which call of the step (0-based).
    pub call_index: i32,
    /// The model's own id of the tool call, when a model made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool (or the webhook or worker agent's action).
    pub tool: String,
    /// Its arguments, as the agent asked.
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// The arguments the person approved it with in place of the agent's;
    /// absent when it was not edited (it runs as asked).
    #[schema(value_type = Option<Object>)]
    pub edited_arguments: Option<serde_json::Value>,
    /// The agent's text of the step: why it makes the call.
    pub reason: String,
    /// When it was asked for.
    pub requested_at: DateTime<Utc>,
    /// When it expires undecided (`WARDEN_APPROVAL_TIMEOUT_MS` after the request).
    pub expires_at: DateTime<Utc>,
    /// `approve`, `reject` or `expired`; absent while it waits.
    pub decision: Option<Decision>,
    /// Which key decided (its public prefix); absent when it expired.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// The person's message to the agent.
    pub message: Option<String>,
}

impl From<ApprovalRow> for ApprovalView {
    fn from(r: ApprovalRow) -> ApprovalView {
        ApprovalView {
            session_id: r.session_id,
            call_id: r.call_id,
            iteration: r.iteration,
            call_index: r.call_index,
            tool_call_id: r.tool_call_id,
            tool: r.tool,
            arguments: r.arguments,
            edited_arguments: r.edited_arguments,
            reason: r.reason,
            requested_at: r.requested_at,
            expires_at: r.expires_at,
            decision: r.decision,
            decided_by: r.decided_by,
            decided_at: r.decided_at,
            message: r.message,
        }
    }
}

impl ExecutorSummary {
    /// What the status shows of a row's executor: from its spec when the
    /// row was read whole, else from the summary Postgres keeps (lists).
    fn of_row(s: &Session) -> ExecutorSummary {
        let brief = match &s.executor {
            Some(stored) => ExecutorBrief::from(&stored.spec),
            None => s.executor_summary.0.clone(),
        };
        ExecutorSummary {
            kind: brief.kind,
            steps: brief.steps,
            repeat: brief.repeat,
            model: brief.model,
            // Credentials in the userinfo or the query are never shown back.
            url: brief.url.as_deref().map(crate::egress::redact_url),
            queue: brief.queue,
            tools: brief.tools,
        }
    }
}

/// Which executor a session uses.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecutorSummary {
    /// `scripted`, `llm`, `webhook` or `worker`.
    pub kind: String,
    /// Number of scripted steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Whether scripted steps repeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<bool>,
    /// Model name (llm), when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Endpoint (llm base URL or webhook URL), when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The queue of a worker executor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The tools a model agent chose (`executor.tools`), when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// A step offered to workers that none has claimed yet.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaitingForWorker {
    /// The queue it waits on.
    pub queue: String,
    /// The tenant whose worker keys may claim it: a worker of another
    /// tenant never sees it.
    pub tenant: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// The last claim or heartbeat of a worker of that tenant on that
    /// queue; null when none was ever seen.
    pub last_worker_seen_at: Option<DateTime<Utc>>,
    /// What it waits for, in words.
    pub message: String,
}

impl WaitingForWorker {
    /// The view of a waiting task.
    pub fn of(task: crate::session::WaitingWorkerTask) -> WaitingForWorker {
        let message = match task.last_worker_seen_at {
            None => format!(
                "waiting for a worker of tenant {:?} on queue {:?}: no worker of that tenant has polled that queue (a worker needs a key of that tenant with that queue: POST /api/keys {{\"tenant\": {:?}, \"role\": \"worker\", \"queues\": [{:?}]}})",
                task.tenant, task.queue, task.tenant, task.queue
            ),
            Some(at) => format!(
                "waiting for a worker of tenant {:?} on queue {:?}: the last one polled at {}",
                task.tenant,
                task.queue,
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        };
        WaitingForWorker {
            queue: task.queue,
            tenant: task.tenant,
            since: task.since,
            last_worker_seen_at: task.last_worker_seen_at,
            message,
        }
    }
}

/// What a queued session waits for when no live replica can run it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaitingForReplica {
    /// The capabilities it needs of the replica that runs it (`delegate`,
    /// `review_every`, `approvals`, `mcp_tools`): no live replica has them
    /// all, so it stays `queued` until one that does starts.
    pub capabilities: Vec<String>,
}

/// Iterations committed in one minute.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VelocityPoint {
    /// Start of the minute.
    pub minute: DateTime<Utc>,
    /// Iterations committed in it.
    pub iterations: i64,
}

/// Tokens by what they were spent on.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokensBySource {
    /// The agent's own steps.
    pub agent: i64,
    /// Reflection.
    pub reflection: i64,
    /// Goal refinement and generated checklists.
    pub refinement: i64,
}

/// The step in flight of a running session.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CurrentStep {
    /// Its iteration number (the one after the last committed).
    pub iteration: u64,
    /// Its action; null until the executor returns.
    pub action: Option<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// How long it has run so far, ms (at the time of the answer).
    pub elapsed_ms: u64,
}

/// A session's status document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionView {
    /// Session id.
    pub id: Uuid,
    /// The tenant the session belongs to (its creator's key's tenant, or
    /// `default` for a session made with the admin token).
    pub tenant: String,
    /// The goal.
    pub goal: String,
    /// `fixed` or `continuous`.
    pub mode: Mode,
    /// Current status.
    pub status: Status,
    /// Place among its tenant's queued sessions while `queued` (1 is the
    /// tenant's next to start; null otherwise). Free places are shared
    /// among the waiting tenants by weight, so the place counts only this
    /// tenant's sessions.
    pub queue_position: Option<i64>,
    /// Tenants with queued sessions, this one's included, while `queued`
    /// (null otherwise): the fair share divides free places among them.
    pub queue_tenants: Option<i64>,
    /// Why it waits or ended (null while running).
    pub reason: Option<Reason>,
    /// Human summary of why it waits or ended.
    pub summary: Option<String>,
    /// Detail of the reason: the blocker, the stuck pattern, the reviewer's reasoning.
    pub reason_detail: Option<String>,
    /// The agent's question while it waits with `ask_user`.
    pub question: Option<String>,
    /// The goal as first given, when a refinement replaced it.
    pub original_goal: Option<String>,
    /// The refinement proposal: `suggested_goal`, `matched_patterns`,
    /// `confidence`, `source` and the `choices` (while `awaiting_refinement`).
    #[schema(value_type = Option<Object>)]
    pub refinement: Option<RefinementProposal>,
    /// Success criteria; completion needs every one reported met.
    pub success_criteria: Vec<ChecklistItem>,
    /// Milestones, ticked as reflections report them.
    pub milestones: Vec<ChecklistItem>,
    /// Current context cycle (1-based); the limit is `limits.max_cycles`.
    pub cycle: i32,
    /// Characters of memory carried across context cycles.
    pub memory_chars: usize,
    /// Iterations committed.
    pub iterations: i64,
    /// Tokens used over the session's life.
    pub tokens_used: i64,
    /// Tokens by what they were spent on.
    pub tokens_by_source: TokensBySource,
    /// Share of all tokens spent on reflection (0–1).
    pub reflection_share: f64,
    /// Latest reflection: assessment, decision and next interval.
    #[schema(value_type = Option<Object>)]
    pub last_reflection: Option<ReflectionSummary>,
    /// What the committed steps cost at `WARDEN_MODEL_PRICES`, USD, as an
    /// exact decimal in a string (`"0.0123"`): the sum of the iterations'
    /// `cost_usd`. Steps no price entry priced add nothing here and are
    /// counted in `unpriced_steps`.
    #[schema(value_type = String, example = "0.0123")]
    pub cost_usd: Decimal,
    /// Committed steps that used tokens of a model no `WARDEN_MODEL_PRICES`
    /// entry prices (no `*` default): `cost_usd` leaves them out.
    pub unpriced_steps: i64,
    /// Iterations per minute over the last 30 minutes (only on `GET /{id}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub velocity: Option<Vec<VelocityPoint>>,
    /// Tool calls made over the session's life.
    pub tool_calls: i64,
    /// Current streak of failing iterations.
    pub consecutive_errors: i32,
    /// Running wall time over the session's life, ms; while a step is in
    /// flight, up to the time of the answer.
    pub elapsed_ms: i64,
    /// Progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Estimated seconds to completion: while a step is in flight, from the
    /// median step duration (see `eta_basis`); otherwise from the progress
    /// rate committed with the last iteration.
    pub eta_seconds: Option<f64>,
    /// What `eta_seconds` rests on while a step is in flight (null when it
    /// is the progress-rate estimate).
    pub eta_basis: Option<EtaBasis>,
    /// The step in flight while the session runs (null otherwise, and
    /// briefly between steps).
    pub current_step: Option<CurrentStep>,
    /// Tokens still needed to finish at the progress rate so far (null before any progress).
    pub projected_tokens_to_finish: Option<u64>,
    /// Iterations still needed to finish at the progress rate so far.
    pub projected_iterations_to_finish: Option<u64>,
    /// What those tokens would cost at the session's price per token so
    /// far (`cost_usd / tokens_used`), USD as a decimal string rounded to
    /// 6 places (null before any progress or any priced token).
    #[schema(value_type = Option<String>, example = "0.394")]
    pub projected_cost_to_finish_usd: Option<Decimal>,
    /// The estimate behind the projection: the latest percent complete and the spend so far.
    pub projection_basis: Option<ProgressSample>,
    /// Limits in force.
    pub limits: Limits,
    /// The executor.
    pub executor: ExecutorSummary,
    /// 1 at creation, +1 per resume.
    pub run: i32,
    /// Whether the latest stop or pause saved a checkpoint.
    pub checkpoint_saved: bool,
    /// Iteration covered by the latest checkpoint.
    pub last_checkpoint_iteration: i64,
    /// What to do next.
    pub next_steps: Vec<String>,
    /// A stop was requested and has not landed yet.
    pub stop_requested: bool,
    /// A pause was requested and has not landed yet.
    pub pause_requested: bool,
    /// Guidance waiting to be delivered to the next iteration.
    pub guidance: Option<String>,
    /// Sequence number of the latest event.
    pub last_event_seq: i64,
    /// Replica running the session.
    pub owner: Option<Uuid>,
    /// When that replica's lease ends unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it ended (completed, stopped, interrupted, failed).
    pub ended_at: Option<DateTime<Utc>>,
    /// When it was imported from an archive (`warden archive import`): it
    /// is read-only, and only `DELETE` changes it.
    pub imported_at: Option<DateTime<Utc>>,
    /// What may be done to it now, by the same rules the API applies.
    pub allowed_actions: Vec<Action>,
    /// Attempts at running it in a row without progress (each rescue after
    /// its replica died, or a failed start, counts one).
    pub attempts: i32,
    /// The error the previous attempt ended on, if one was recorded.
    pub last_error: Option<String>,
    /// True when Postgres could not be reached and the status is the last
    /// committed state this replica's memory holds (it may be behind).
    pub stale: bool,
    /// With `stale`: when the state shown was committed; null otherwise.
    pub committed_at: Option<DateTime<Utc>>,
    /// On a `202` answer to a stop: when the stop will have landed (its
    /// owner lands it, or counts as gone by then and it lands without it);
    /// null otherwise.
    pub stop_lands_by: Option<DateTime<Utc>>,
    /// The current step waits for a worker to claim it (worker executors,
    /// on `GET /{id}` only); after the executor's `worker_wait_timeout_ms`
    /// the session pauses with reason `no_worker`.
    pub waiting_for_worker: Option<WaitingForWorker>,
    /// While `queued` (on `GET /{id}` only): the capabilities it needs that
    /// no live replica has all of, in a fleet of mixed versions or with
    /// `WARDEN_CAPABILITIES_OFF`; it waits, it does not fail. Null when a
    /// live replica covers it (or it needs nothing).
    pub waiting_for_replica: Option<WaitingForReplica>,
    /// The calls that wait for a person's approval (reason
    /// `approval_required`; on `GET /{id}` and decisions only): the tool,
    /// its arguments and the agent's reason, and the `call_id` to decide on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<ApprovalView>,
    /// The session that delegated this one (null for a top-level session).
    pub parent_id: Option<Uuid>,
    /// How deep in its tree it is: 0 for a top-level session.
    pub depth: usize,
    /// Its direct children, oldest first (on `GET /{id}` only).
    pub children: Vec<ChildView>,
    /// Its descendants (at any depth) that wait for a person, nearest
    /// first, and why (on `GET /{id}` only; at most 50): a tree whose
    /// children paused for a person waits on them, and this names them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children_needing_attention: Vec<crate::session::ChildAttention>,
    /// What a child of its tree does when it would pause for a person:
    /// `wait` or `fail_child` (set at create, copied to children).
    pub on_child_pause: crate::policy::delegation::ChildPausePolicy,
    /// What its children hold of its budget: its `limits.max_tokens` is
    /// what it has left for itself.
    pub delegation: DelegationView,
    /// Soft budgets: the warnings sent so far, oldest first, one per budget
    /// and threshold of `limits.warn_at` crossed (each also logged as a
    /// `budget_warning` event and told to the agent in its next step).
    pub budget_warnings: Vec<crate::policy::soft_budget::SentWarning>,
    /// For a fork: the session and checkpoint it started from.
    pub forked_from: Option<ForkedFrom>,
    /// Confirmation before start (a create with `confirm_if_over`): the
    /// estimate at create, the bounds its p90 is over (or `unknown`), and
    /// when it expires. Shown while `awaiting_confirmation` and kept after.
    pub confirmation: Option<crate::policy::confirm::Confirmation>,
}

/// A child as its parent's status lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChildView {
    /// The child session.
    pub id: Uuid,
    /// Its goal.
    pub goal: String,
    /// Its status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Tokens it used itself.
    pub tokens_used: i64,
    /// Tokens carved out of the parent for it (its subtree's budget).
    pub budget_tokens: Option<i64>,
}

/// What a session's children hold of its token budget.
#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub struct DelegationView {
    /// Tokens its live children were given and may still spend.
    pub tokens_reserved: i64,
    /// Tokens its ended children (and their descendants) spent.
    pub tokens_spent_by_children: i64,
}

impl SessionView {
    /// Adds the live figures of `step`, in flight at `now`: the step, the
    /// running time up to `now` and the ETA from the median step duration.
    /// Nothing changes unless the session is running.
    pub fn with_step(mut self, step: Option<StepInFlight>, now: DateTime<Utc>) -> SessionView {
        let Some(step) = step.filter(|_| self.status == Status::Running) else {
            return self;
        };
        let spent_ms = u64::try_from((now - step.started_at).num_milliseconds()).unwrap_or(0);
        let session_ms = step.session_elapsed_ms.saturating_add(spent_ms);
        self.elapsed_ms = self
            .elapsed_ms
            .max(i64::try_from(session_ms).unwrap_or(i64::MAX));
        let script_steps = (self.executor.kind == "scripted" && self.executor.repeat != Some(true))
            .then_some(self.executor.steps)
            .flatten()
            .map(|n| n as u64);
        let bounds = eta::Bounds {
            committed: step.iteration.saturating_sub(1),
            max_iterations: self.limits.max_iterations,
            script_steps,
            progress_iterations_to_finish: self.projected_iterations_to_finish,
        };
        let (eta_ms, basis) = eta::estimate(step.median_step_ms, spent_ms, &bounds);
        self.eta_seconds = Some(eta_ms as f64 / 1000.0);
        self.eta_basis = Some(basis);
        self.current_step = Some(CurrentStep {
            iteration: step.iteration,
            action: step.action,
            started_at: step.started_at,
            elapsed_ms: spent_ms,
        });
        self
    }
}

/// `tokens` more at the price per token `cost` over `used` tokens came to,
/// rounded to 6 places; `None` when nothing was priced yet.
fn projected_cost(cost: Decimal, used: i64, tokens: u64) -> Option<Decimal> {
    if used <= 0 || cost.is_zero() {
        return None;
    }
    let per_token = cost.checked_div(Decimal::from(used))?;
    let projected = per_token.checked_mul(Decimal::from(tokens))?;
    Some(projected.round_dp(6).normalize())
}

/// Where the session is heading at its pace so far, once the reflector
/// has said how far along it is.
fn projection_of(s: &Session) -> Option<projection::Projection> {
    let percent_complete = s.percent_complete?;
    let tokens = u64::try_from(s.tokens_used).unwrap_or(0);
    let iterations = u64::try_from(s.iterations).unwrap_or(0);
    let sample = ProgressSample {
        percent_complete,
        tokens,
        iterations,
    };
    projection::project(&sample, tokens, iterations)
}

/// The agent's question, while a session is paused to ask one.
fn question_of(s: &Session) -> Option<String> {
    s.reason_detail
        .clone()
        .filter(|_| s.reason == Some(Reason::AskUser) && s.status == Status::Paused)
}

/// The share of the session's tokens spent on reflection, 0 before any.
fn reflection_share(s: &Session) -> f64 {
    if s.tokens_used > 0 {
        s.reflection_tokens as f64 / s.tokens_used as f64
    } else {
        0.0
    }
}

impl TokensBySource {
    /// The session's tokens split by who spent them.
    fn of(s: &Session) -> TokensBySource {
        TokensBySource {
            agent: s.tokens_used - s.reflection_tokens - s.refinement_tokens,
            reflection: s.reflection_tokens,
            refinement: s.refinement_tokens,
        }
    }
}

impl ForkedFrom {
    /// Where the session was forked from, if it is a fork.
    fn of(s: &Session) -> Option<ForkedFrom> {
        let (session_id, iteration) = s.forked_from_session.zip(s.forked_from_iteration)?;
        Some(ForkedFrom {
            session_id,
            iteration,
        })
    }
}

impl From<Session> for SessionView {
    /// The one place the status document is made from the stored row.
    fn from(s: Session) -> SessionView {
        let executor = ExecutorSummary::of_row(&s);
        let projection = projection_of(&s);
        let (question, tokens_by_source) = (question_of(&s), TokensBySource::of(&s));
        let (reflection_share, forked_from) = (reflection_share(&s), ForkedFrom::of(&s));
        SessionView {
            id: s.id,
            tenant: s.tenant.clone(),
            goal: s.goal,
            mode: s.mode,
            status: s.status,
            queue_position: s.queue_position,
            queue_tenants: s.queue_tenants,
            reason: s.reason,
            summary: s.summary,
            question,
            reason_detail: s.reason_detail,
            tokens_by_source,
            original_goal: s.original_goal,
            refinement: s.refinement.map(|r| r.0),
            success_criteria: s.criteria.0,
            milestones: s.milestones.0,
            cycle: s.cycle,
            memory_chars: s.memory.chars().count(),
            reflection_share,
            last_reflection: s.last_reflection.map(|r| r.0),
            cost_usd: s.cost_usd.normalize(),
            unpriced_steps: s.unpriced_steps,
            velocity: None,
            iterations: s.iterations,
            tokens_used: s.tokens_used,
            tool_calls: s.tool_calls,
            consecutive_errors: s.consecutive_errors,
            elapsed_ms: s.elapsed_ms,
            percent_complete: s.percent_complete,
            eta_seconds: s.eta_seconds,
            eta_basis: None,
            current_step: None,
            projected_tokens_to_finish: projection.map(|p| p.tokens_to_finish),
            projected_iterations_to_finish: projection.map(|p| p.iterations_to_finish),
            projected_cost_to_finish_usd: projection
                .and_then(|p| projected_cost(s.cost_usd, s.tokens_used, p.tokens_to_finish)),
            projection_basis: projection.map(|p| p.basis),
            limits: s.limits.0,
            executor,
            run: s.run,
            checkpoint_saved: s.checkpoint_saved,
            last_checkpoint_iteration: s.last_checkpoint_iteration,
            next_steps: s.next_steps.0,
            stop_requested: s.stop_requested,
            pause_requested: s.pause_requested,
            guidance: s.guidance,
            last_event_seq: s.last_event_seq,
            owner: s.owner,
            lease_expires_at: s.lease_expires_at,
            created_at: s.created_at,
            updated_at: s.updated_at,
            ended_at: s.ended_at,
            allowed_actions: allowed_actions(s.status, s.imported_at.is_some()),
            imported_at: s.imported_at,
            attempts: s.attempts,
            last_error: s.last_error,
            stale: false,
            committed_at: None,
            stop_lands_by: None,
            waiting_for_worker: None,
            waiting_for_replica: None,
            pending_approvals: Vec::new(),
            parent_id: s.parent_id,
            depth: s.lineage.len(),
            children: Vec::new(),
            children_needing_attention: Vec::new(),
            on_child_pause: s.on_child_pause,
            delegation: DelegationView {
                tokens_reserved: s.children_reserved_tokens,
                tokens_spent_by_children: s.children_tokens,
            },
            budget_warnings: s.budget_warnings.0,
            forked_from,
            confirmation: s.confirmation.map(|c| c.0),
        }
    }
}

/// Where a fork started: the session and the checkpoint's iteration.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct ForkedFrom {
    /// The session forked.
    pub session_id: Uuid,
    /// The iteration of the checkpoint it was forked from.
    pub iteration: i64,
}

/// One page of sessions.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionPage {
    /// Sessions, in the order asked for (newest first by default).
    pub items: Vec<SessionView>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// One committed iteration.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IterationView {
    /// Number, 1-based, gap-free.
    pub number: i64,
    /// Run it belongs to.
    pub run: i32,
    /// Action name.
    pub action: String,
    /// `success`, `failure` or `error`.
    pub outcome: String,
    /// Tokens used.
    pub tokens: i64,
    /// Wall time, ms.
    pub duration_ms: i64,
    /// The full step record (arguments, output, error, files...).
    #[schema(value_type = Object)]
    pub record: serde_json::Value,
    /// What the policies concluded: rework, stuck finding, stop signal.
    #[schema(value_type = Object)]
    pub effects: serde_json::Value,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End.
    pub finished_at: DateTime<Utc>,
    /// Its tokens split (input, output, cached, reasoning) and the model,
    /// as priced (null for steps committed before money was counted).
    pub usage: Option<StepUsage>,
    /// What it cost at `WARDEN_MODEL_PRICES`, USD (exact decimal string);
    /// null when no entry priced its model (`unpriced`).
    #[schema(value_type = Option<String>, example = "0.0045")]
    pub cost_usd: Option<Decimal>,
    /// The entry that priced it: its model pattern...
    pub price_pattern: Option<String>,
    /// ...and the first day of that price (null: always).
    pub price_valid_from: Option<chrono::NaiveDate>,
}

/// The typed record as a JSON tree, which the page shortens in place
/// (`excerpt_strings`) unless the caller asks for it in full.
impl TryFrom<IterationRecord> for IterationView {
    type Error = serde_json::Error;

    fn try_from(i: IterationRecord) -> Result<IterationView, serde_json::Error> {
        Ok(IterationView {
            number: i.number,
            run: i.run,
            action: i.action,
            outcome: i.outcome,
            tokens: i.tokens,
            duration_ms: i.duration_ms,
            record: serde_json::to_value(i.record.0)?,
            effects: serde_json::to_value(i.effects.0)?,
            started_at: i.started_at,
            finished_at: i.finished_at,
            usage: i.usage.map(|u| u.0),
            cost_usd: i.cost_usd.map(|c| c.normalize()),
            price_pattern: i.price_pattern,
            price_valid_from: i.price_valid_from,
        })
    }
}

/// One page of iterations.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IterationPage {
    /// Iterations in order.
    pub items: Vec<IterationView>,
    /// Pass as `after` to get the next page; null on the last page.
    pub next_after: Option<i64>,
}

/// A saved checkpoint.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckpointView {
    /// Id, increasing.
    pub id: i64,
    /// Last iteration it covers.
    pub iteration: i64,
    /// Why it was taken (`interval`, `gate`, `user_stop`, `shutdown`...).
    pub reason: String,
    /// The loop state snapshot.
    #[schema(value_type = Object)]
    pub state: serde_json::Value,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Its workspace snapshot is stored: `POST /fork` may start from it.
    pub forkable: bool,
}

/// As for iterations: the typed state as a JSON tree the page may shorten.
impl TryFrom<CheckpointRecord> for CheckpointView {
    type Error = serde_json::Error;

    fn try_from(c: CheckpointRecord) -> Result<CheckpointView, serde_json::Error> {
        Ok(CheckpointView {
            id: c.id,
            iteration: c.iteration,
            reason: c.reason,
            state: serde_json::to_value(c.state.0)?,
            created_at: c.created_at,
            forkable: false,
        })
    }
}

/// One page of checkpoints.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckpointPage {
    /// Checkpoints, oldest first.
    pub items: Vec<CheckpointView>,
    /// Pass as `after` to get the next page; null on the last page.
    pub next_after: Option<i64>,
}

/// An entry of the session log: its sequence number, its kind and payload
/// (`kind`, `data`: one of the session event kinds), and when it was appended.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventView {
    /// Per-session sequence number, increasing; gap-free but for routine
    /// events compacted away past `WARDEN_EVENT_HORIZON`.
    pub seq: i64,
    /// The event: `kind` and its `data`.
    #[serde(flatten)]
    pub event: SessionEvent,
    /// When it was appended.
    pub created_at: DateTime<Utc>,
    /// Which key's request appended it (its public prefix, e.g. `wdn_ab12cd34`;
    /// `admin-token`, `auth-off`), or null when the loop did.
    pub actor: Option<String>,
}

impl From<LoggedEvent> for EventView {
    fn from(e: LoggedEvent) -> EventView {
        EventView {
            seq: e.seq,
            event: e.event,
            created_at: e.created_at,
            actor: e.actor,
        }
    }
}

/// One page of events.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventPage {
    /// Events in sequence order.
    pub items: Vec<EventView>,
    /// Pass as `after` to get the next page; null on the last page.
    pub next_after: Option<i64>,
    /// Routine events up to this sequence number were compacted away
    /// (`WARDEN_EVENT_HORIZON`), so their numbers are missing; null when the
    /// session's log was never compacted.
    pub compacted_through: Option<i64>,
}

/// Paging of ordered per-session collections.
#[derive(Debug, Clone, serde::Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AfterPage {
    /// Return items after this number (iteration number, checkpoint id or event seq).
    pub after: Option<i64>,
    /// Page size, 1 – 500 (default 100).
    pub limit: Option<i64>,
}

/// Paging of iterations and checkpoints, whose stored texts can be large.
#[derive(Debug, Clone, serde::Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryPageQuery {
    /// Return items after this number (iteration number or checkpoint id).
    pub after: Option<i64>,
    /// Page size, 1 – 500 (default 100). A page also ends early once it
    /// holds about `PAGE_BYTE_BUDGET` (4 MiB) of items; `next_after` goes on.
    pub limit: Option<i64>,
    /// Every stored text whole (default false: texts over 4 KiB are shown
    /// as an excerpt whose marker says how many bytes are not shown).
    pub full: Option<bool>,
}

/// About how many bytes of items one page of iterations or checkpoints holds
/// before it ends early (at least one item is always given).
pub const PAGE_BYTE_BUDGET: usize = 4 * 1024 * 1024;

/// Every string of `value` longer than a few KiB replaced by its excerpt
/// (`policy::excerpt::page_excerpt`).
pub fn excerpt_strings(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) => {
            if let std::borrow::Cow::Owned(e) = excerpt::page_excerpt(s) {
                *s = e;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(excerpt_strings),
        serde_json::Value::Object(map) => map.values_mut().for_each(excerpt_strings),
        _ => {}
    }
}

/// About how many bytes `value` takes as JSON: its strings' lengths plus a
/// little per node (a bound for page budgets, not an exact size).
pub fn json_weight(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::String(s) => s.len() + 2,
        serde_json::Value::Array(items) => items.iter().map(json_weight).sum::<usize>() + 2,
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(k, v)| k.len() + 4 + json_weight(v))
            .sum::<usize>()
            .saturating_add(2),
        _ => 8,
    }
}

/// Whether a page of `taken` items of `used` bytes may take one more of
/// `weight` bytes under `budget`: the first item always fits.
pub fn fits_budget(taken: usize, used: usize, weight: usize, budget: usize) -> bool {
    taken == 0 || used.saturating_add(weight) <= budget
}

/// Paging of decisions.
#[derive(Debug, Clone, serde::Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DecisionQuery {
    /// Return decisions after this event seq.
    pub after: Option<i64>,
    /// Page size, 1 – 500 (default 100).
    pub limit: Option<i64>,
    /// Include gate evaluations that decided `continue` (default false).
    pub include_continue: Option<bool>,
}

/// Filtering, ordering and paging of the session list.
#[derive(Debug, Clone, serde::Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only sessions in this status.
    pub status: Option<Status>,
    /// Only sessions in this mode.
    pub mode: Option<Mode>,
    /// Only sessions with an executor of this kind.
    pub executor: Option<ExecutorKind>,
    /// Only sessions whose goal contains this text (any case; `%` and `_`
    /// match themselves); at most 200 characters, no control characters.
    pub q: Option<String>,
    /// Only sessions created at or after this time (RFC 3339).
    pub created_from: Option<DateTime<Utc>>,
    /// Only sessions created before this time (RFC 3339).
    pub created_before: Option<DateTime<Utc>>,
    /// Order by creation (default), last update time or cost.
    pub sort: Option<SortKey>,
    /// `desc` (default, newest first) or `asc`.
    pub order: Option<SortOrder>,
    /// Only top-level sessions: no child sessions.
    pub root_only: Option<bool>,
    /// Only sessions whose steps cost at least this much, USD (a decimal,
    /// e.g. `0.50`).
    #[param(value_type = Option<String>, example = "0.50")]
    pub min_cost_usd: Option<Decimal>,
    /// `next_cursor` of the previous page, asked for with the same `sort` and `order`.
    pub cursor: Option<String>,
    /// Page size, 1 – 200 (default 50).
    pub limit: Option<i64>,
    /// Admins only: the sessions of this tenant (default: every tenant).
    /// Other keys always see their own tenant's.
    pub tenant: Option<String>,
}

/// The filters of the per-status counts: those of the list, but status.
#[derive(Debug, Clone, serde::Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CountsQuery {
    /// Only sessions in this mode.
    pub mode: Option<Mode>,
    /// Only sessions with an executor of this kind.
    pub executor: Option<ExecutorKind>,
    /// Only sessions whose goal contains this text (any case); at most 200
    /// characters, no control characters.
    pub q: Option<String>,
    /// Only sessions created at or after this time (RFC 3339).
    pub created_from: Option<DateTime<Utc>>,
    /// Only sessions created before this time (RFC 3339).
    pub created_before: Option<DateTime<Utc>>,
    /// Only top-level sessions: no child sessions.
    pub root_only: Option<bool>,
    /// Admins only: the sessions of this tenant (default: every tenant).
    pub tenant: Option<String>,
}

/// Longest goal text the list filters by, in characters.
pub const MAX_GOAL_FILTER_CHARS: usize = 200;

/// The goal filter's rule, as the document states it: no control characters.
pub const GOAL_FILTER_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f]*$";

/// The kind of a session's executor, as lists filter by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    /// Scripted steps.
    Scripted,
    /// A model server.
    Llm,
    /// An HTTP webhook.
    Webhook,
    /// External workers polling a queue.
    Worker,
}

impl ExecutorKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Scripted => "scripted",
            ExecutorKind::Llm => "llm",
            ExecutorKind::Webhook => "webhook",
            ExecutorKind::Worker => "worker",
        }
    }
}

/// The time the session list is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortKey {
    /// Creation time.
    Created,
    /// Last update time.
    Updated,
    /// What its steps cost (`cost_usd`).
    Cost,
}

/// Which way the session list runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    /// Oldest first.
    Asc,
    /// Newest first.
    Desc,
}

/// How many sessions are in each status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionCounts {
    /// Sessions per status; every status is named, zero or not.
    pub by_status: std::collections::BTreeMap<String, i64>,
    /// All of them.
    pub total: i64,
}

/// A stored reflection.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReflectionView {
    /// Number, from 1.
    pub number: i32,
    /// Iteration it followed.
    pub after_iteration: i64,
    /// `interval` or `agent_claimed_done`.
    pub trigger: String,
    /// Whether the reflector gave a valid answer.
    pub ok: bool,
    /// The validated assessment (goal_achieved, progress, percent_complete, …).
    #[schema(value_type = Option<Object>)]
    pub assessment: Option<Assessment>,
    /// Why the reflection failed, when it did.
    pub error: Option<String>,
    /// What the loop did: verdict and reflection state after it.
    #[schema(value_type = Object)]
    pub decision: AppliedReflection,
    /// Iterations until the next reflection (5 when stuck, 20 when progress is good).
    pub next_interval: i32,
    /// Tokens it used.
    pub tokens: i64,
    /// The model's raw answer.
    pub raw: Option<String>,
    /// When.
    pub created_at: DateTime<Utc>,
}

impl From<crate::session::ReflectionRecord> for ReflectionView {
    fn from(r: crate::session::ReflectionRecord) -> ReflectionView {
        ReflectionView {
            number: r.number,
            after_iteration: r.after_iteration,
            trigger: r.trigger,
            ok: r.ok,
            assessment: r.assessment.map(|a| a.0),
            error: r.error,
            decision: r.decision.0,
            next_interval: r.next_interval,
            tokens: r.tokens,
            raw: r.raw,
            created_at: r.created_at,
        }
    }
}

/// One page of reflections.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReflectionPage {
    /// Reflections in order.
    pub items: Vec<ReflectionView>,
    /// Pass as `after` to get the next page; null on the last page.
    pub next_after: Option<i64>,
}

/// One refinement of a session's goal.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RefinementView {
    /// Number, from 1.
    pub number: i32,
    /// `accept_suggestion`, `custom`, `proceed_with_time_limit`, `auto` or `resume`.
    pub kind: String,
    /// Goal before.
    pub goal_before: String,
    /// Goal after.
    pub goal_after: String,
    /// The proposal and the limits that applied.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    /// When.
    pub created_at: DateTime<Utc>,
}

impl From<crate::session::RefinementRecord> for RefinementView {
    fn from(r: crate::session::RefinementRecord) -> RefinementView {
        RefinementView {
            number: r.number,
            kind: r.kind,
            goal_before: r.goal_before,
            goal_after: r.goal_after,
            data: r.data,
            created_at: r.created_at,
        }
    }
}

/// A session's refinement history.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RefinementList {
    /// Refinements in order.
    pub items: Vec<RefinementView>,
}

/// A session's task queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskList {
    /// Tasks, highest priority first.
    pub items: Vec<crate::session::AgentTask>,
}

/// How sessions turned out, from the stored data.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutcomeMetrics {
    /// All sessions.
    pub sessions: i64,
    /// Sessions by status.
    pub by_status: std::collections::BTreeMap<String, i64>,
    /// Sessions that ended (completed, stopped, interrupted or failed).
    pub ended: i64,
    /// Completed sessions.
    pub completed: i64,
    /// completed / ended (null when none ended).
    pub goal_completion_rate: Option<f64>,
    /// Average iterations of completed sessions.
    pub average_iterations_to_completion: Option<f64>,
    /// Waiting and ended sessions by reason.
    pub termination_reasons: std::collections::BTreeMap<String, i64>,
    /// Sessions that ever completed.
    pub ever_completed: i64,
    /// Sessions a user reopened after they completed, because the work was not done.
    pub reopened_after_completion: i64,
    /// reopened_after_completion / ever_completed (null when none completed).
    pub premature_stop_rate: Option<f64>,
}

impl From<crate::session::Outcomes> for OutcomeMetrics {
    fn from(o: crate::session::Outcomes) -> OutcomeMetrics {
        let count = |s: &str| o.by_status.get(s).copied().unwrap_or(0);
        let completed = count("completed");
        let ended = completed + count("stopped") + count("interrupted") + count("failed");
        let ratio = |n: i64, d: i64| (d > 0).then(|| n as f64 / d as f64);
        OutcomeMetrics {
            sessions: o.by_status.values().sum(),
            ended,
            completed,
            goal_completion_rate: ratio(completed, ended),
            average_iterations_to_completion: o.average_iterations_to_completion,
            termination_reasons: o.by_reason,
            ever_completed: o.ever_completed,
            reopened_after_completion: o.reopened_after_completion,
            premature_stop_rate: ratio(o.reopened_after_completion, o.ever_completed),
            by_status: o.by_status,
        }
    }
}

/// Health answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or what is wrong.
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_strings_anywhere_in_a_record_are_excerpted() {
        let mut record = json!({
            "observation": "o".repeat(300_000),
            "arguments": { "content": ["a".repeat(10_000), "short"] },
            "message": "ok",
            "tokens": 3,
        });
        excerpt_strings(&mut record);
        let text = record.to_string();
        assert!(text.len() < 3 * 5_000, "{}", text.len());
        assert!(text.contains("?full=true"));
        assert_eq!(record["message"], "ok");
        assert_eq!(record["arguments"]["content"][1], "short");
        assert!(json_weight(&record) >= text.len() / 2);
    }

    #[test]
    fn a_step_in_flight_moves_the_clock_and_the_eta() {
        let mut record = crate::session::live::tests::record();
        record.iterations = 3;
        record.elapsed_ms = 900;
        record.executor_summary.0.steps = Some(6);
        let started_at = Utc::now();
        let step = StepInFlight {
            iteration: 4,
            action: None,
            started_at,
            session_elapsed_ms: 1_000,
            median_step_ms: Some(200),
        };
        let now = started_at + chrono::TimeDelta::milliseconds(1_500);
        let view = SessionView::from(record.clone()).with_step(Some(step.clone()), now);
        assert_eq!(view.elapsed_ms, 2_500);
        let current = view.current_step.expect("in flight");
        assert_eq!((current.iteration, current.elapsed_ms), (4, 1_500));
        // Past the median: two more steps of 200 ms after this one.
        assert_eq!(view.eta_seconds, Some(0.4));
        let basis = view.eta_basis.expect("basis");
        assert_eq!(basis.steps_left, 3);
        assert_eq!(basis.source, eta::StepsLeftSource::Script);

        record.status = Status::Paused;
        let paused = SessionView::from(record).with_step(Some(step), now);
        assert!(paused.current_step.is_none() && paused.eta_basis.is_none());
        assert_eq!(paused.elapsed_ms, 900);
    }

    #[test]
    fn a_page_ends_at_its_byte_budget_but_never_empty() {
        assert!(fits_budget(0, 0, 10_000, 100));
        assert!(fits_budget(1, 50, 50, 100));
        assert!(!fits_budget(1, 50, 51, 100));
        assert!(!fits_budget(3, usize::MAX, 1, 100));
    }
}
