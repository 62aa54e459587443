//! The session log's vocabulary: every kind of event a session records, with
//! its payload. Events are only made and read through [`SessionEvent`]; on
//! the wire and in Postgres an event is `{kind, data}` (adjacently tagged),
//! so the stored and served format is the one the log always had.
//!
//! This module depends on nothing above `policy`, so the store, the
//! executors, the session layer and the HTTP layer can all use it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::policy::gate::{GateDecision, GateMetrics};
use crate::policy::guardrails::{Breach, Limits, Usage};
use crate::policy::history::{Outcome, Rework};
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::loop_state::AppliedReflection;
use crate::policy::reflection::Assessment;
use crate::policy::reflection_interval::{IntervalCause, IntervalInputs};
use crate::policy::sentinel::Sentinel;
use crate::policy::soft_budget::Budget;
use crate::policy::stuck::{StuckPattern, StuckVerdict};

/// Kinds the decisions view reads; the partial index `events_decisions`
/// (last defined in `migrations/0038_interval_decisions.sql`) covers
/// exactly these (a test checks it).
pub const DECISION_KINDS: [&str; 5] = [
    "gate_decision",
    "stuck_detected",
    "guardrail_tripped",
    "status_changed",
    "reflection_interval_changed",
];

/// Why a step in flight was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AbandonedBecause {
    /// A user stop cancelled it.
    UserStop,
    /// The wall-clock limit ran out during it.
    Timeout,
    /// A user pause reached the worker running it, which gave it up.
    UserPause,
}

/// Where tokens charged outside a committed step were spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChargeSource {
    /// A worker reported the usage of a step it was told to abandon.
    WorkerAfterCancel,
    /// A model call cut short: its prompt estimate and what it streamed.
    AbandonedModelCall,
    /// A step's outcome a stop won over: not applied, its tokens charged.
    UncollectedOutcome,
}

/// A refinement proposal for an ambiguous goal; also kept on the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RefinementProposal {
    /// The goal Warden suggests running instead.
    pub suggested_goal: String,
    /// The ambiguity patterns the goal matched.
    pub matched_patterns: Vec<String>,
    /// How sure the ambiguity check is, 0..1.
    pub confidence: f64,
    /// Who wrote the suggestion: `model` or `rules`.
    pub source: String,
    /// The answers the user may give.
    pub choices: Vec<String>,
}

/// One entry of a session's log: its kind (`kind`) and payload (`data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum SessionEvent {
    /// The session was created.
    SessionCreated {
        /// The goal as given.
        goal: String,
        /// Mode.
        mode: Mode,
        /// Effective limits.
        limits: Limits,
        /// Executor kind.
        executor: String,
        /// Success criteria as given.
        success_criteria: Vec<String>,
        /// Milestones as given.
        milestones: Vec<String>,
    },
    /// The session's status changed; ends of a run carry the termination record.
    StatusChanged {
        /// Previous status; null at creation.
        #[schema(required = true)]
        from: Option<Status>,
        /// New status.
        to: Status,
        /// Termination reason (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Reason>,
        /// Termination summary (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// Suggested next steps (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_steps: Option<Vec<String>>,
        /// Iterations done (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iterations: Option<u64>,
        /// Tokens used (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_used: Option<u64>,
        /// A checkpoint was saved with the change (ends of a run only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint_saved: Option<bool>,
        /// The error a `failed` session gave up on (the failure model only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Failed attempts in a row before it gave up (the failure model only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<i32>,
    },
    /// The continue gate decided before a step.
    GateDecision {
        /// The step about to run.
        step: u64,
        /// The decision.
        #[schema(value_type = Object)]
        decision: GateDecision,
        /// The metrics it was based on.
        #[schema(value_type = Object)]
        metrics: GateMetrics,
        /// The inputs the metrics came from.
        #[schema(value_type = Object)]
        inputs: Value,
    },
    /// A guardrail limit was reached.
    GuardrailTripped {
        /// Which limit.
        #[schema(value_type = String)]
        breach: Breach,
        /// Usage at the time.
        #[schema(value_type = Object)]
        usage: Usage,
        /// The limits.
        limits: Limits,
    },
    /// A step in flight was abandoned.
    StepAbandoned {
        /// The step.
        step: u64,
        /// Why.
        why: AbandonedBecause,
    },
    /// NUL characters in an agent's output (which Postgres cannot store)
    /// were replaced before the step was committed.
    AgentOutputSanitized {
        /// The step.
        step: u64,
        /// How many characters were replaced.
        nul_replaced: usize,
        /// What each was replaced with.
        with: String,
    },
    /// A step was committed.
    IterationCompleted {
        /// Step number.
        number: u64,
        /// Action taken.
        action: String,
        /// How it ended.
        #[schema(value_type = String)]
        outcome: Outcome,
        /// Tokens the step used.
        tokens: u64,
        /// How long it ran, ms.
        duration_ms: u64,
        /// Whether (and why) it was rework.
        #[schema(value_type = Option<Object>, required = true)]
        rework: Option<Rework>,
        /// Session tokens after it.
        tokens_used: u64,
        /// Progress estimate after it, percent.
        #[schema(required = true)]
        percent_complete: Option<f64>,
    },
    /// Stuck detection saw a pattern.
    StuckDetected {
        /// The step it was seen after.
        step: u64,
        /// The pattern.
        #[schema(value_type = Object)]
        pattern: StuckPattern,
        /// What was done about it.
        #[schema(value_type = Object)]
        verdict: StuckVerdict,
        /// The pattern in words.
        description: String,
    },
    /// The agent gave a stop signal.
    AgentSignal {
        /// The step that carried it.
        step: u64,
        /// The signal.
        #[schema(value_type = Object)]
        signal: Sentinel,
    },
    /// An ambiguous goal got a refinement proposal.
    RefinementSuggested(RefinementProposal),
    /// The goal was refined (automatically, by the user, or on resume).
    GoalRefined {
        /// `auto`, `accept_suggestion`, `custom`, `proceed_with_time_limit` or `resume`.
        kind: String,
        /// Goal before.
        from: String,
        /// Goal after.
        to: String,
        /// Limits after (refinement answers only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limits: Option<Limits>,
    },
    /// Success criteria and milestones were written by the model.
    CriteriaGenerated {
        /// Success criteria.
        criteria: Vec<String>,
        /// Milestones.
        milestones: Vec<String>,
    },
    /// The limits changed.
    LimitsChanged {
        /// Limits before.
        from: Limits,
        /// Limits after.
        to: Limits,
        /// `resume` or `update`.
        by: String,
    },
    /// The mode changed.
    ModeChanged {
        /// Mode before.
        from: Mode,
        /// Mode after.
        to: Mode,
    },
    /// A person resumed the session.
    Resumed {
        /// The run that starts.
        run: i32,
        /// Guidance for the next step.
        #[schema(required = true)]
        guidance: Option<String>,
        /// A completed session was reopened.
        reopened: bool,
        /// Status it was resumed from.
        from_status: Status,
        /// Reason it had stopped for.
        #[schema(required = true)]
        from_reason: Option<Reason>,
    },
    /// A stop was requested.
    StopRequested {},
    /// A pause was requested.
    PauseRequested {},
    /// A reflection ran.
    Reflection {
        /// Reflection number.
        number: i32,
        /// The iteration it followed.
        after_iteration: i64,
        /// `interval` or `agent_claimed_done`.
        trigger: String,
        /// Whether the model answered usably.
        ok: bool,
        /// The model's assessment.
        #[schema(value_type = Option<Object>, required = true)]
        assessment: Option<Assessment>,
        /// Why it failed.
        #[schema(required = true)]
        error: Option<String>,
        /// What was decided.
        #[schema(value_type = Object)]
        decision: AppliedReflection,
        /// Iterations until the next reflection.
        next_interval: i32,
        /// Tokens it used.
        tokens: i64,
    },
    /// A checkpoint was saved.
    CheckpointSaved {
        /// Iterations it covers.
        iteration: i64,
        /// Why it was taken.
        reason: String,
    },
    /// A replica took the session's lease.
    LeaseAcquired {
        /// The new owner.
        owner: Uuid,
        /// The owner before, if any.
        #[schema(required = true)]
        previous_owner: Option<Uuid>,
    },
    /// The replica released the lease at shutdown.
    LeaseReleased {
        /// Iterations the release checkpoint covers.
        iteration: i64,
        /// Why.
        reason: String,
    },
    /// The agent's completion claim was checked and accepted.
    CompletionVerified {
        /// The agent's result text.
        result: String,
        /// Declared deliverables.
        deliverables: Vec<String>,
    },
    /// The agent's completion claim was rejected: deliverables are missing.
    CompletionRejected {
        /// The agent's result text.
        result: String,
        /// Declared deliverables.
        deliverables: Vec<String>,
        /// Those that do not exist.
        missing: Vec<String>,
    },
    /// The context window is nearly full: the agent wraps up its cycle.
    ContextWrapUp {
        /// The cycle.
        cycle: u32,
        /// Prompt tokens of the last call.
        prompt_tokens: u64,
        /// The context budget.
        context_budget_tokens: u64,
    },
    /// A new context cycle started.
    CycleStarted {
        /// Its number.
        cycle: u32,
        /// Size of the memory carried into it.
        memory_chars: usize,
    },
    /// The model asked for more tool calls in one answer than
    /// `WARDEN_MAX_TOOL_CALLS_PER_STEP` allows; the rest got an error result.
    ToolCallsLimited {
        /// Tool calls the answer asked for.
        requested: usize,
        /// Tool calls executed (the first ones).
        executed: usize,
        /// The limit.
        limit: usize,
    },
    /// A reflection was due but the tenant's rate limit of calls on the
    /// server's model (`WARDEN_TENANT_MODEL_CALLS_PER_MINUTE`) was spent: it
    /// is tried again after each step until it runs; logged once per wait.
    ReflectionDeferred {
        /// The reflection number that was due.
        number: u64,
        /// Why: `tenant_model_rate_limit`.
        reason: String,
        /// When the limit allows the next call, in milliseconds.
        retry_after_ms: u64,
    },
    /// The adaptive reflection interval changed after a reflection (the
    /// session did not set `limits.reflection_interval`): the decision of
    /// `policy::reflection_interval` with everything it looked at.
    ReflectionIntervalChanged {
        /// The iteration of the reflection it followed.
        after_iteration: u64,
        /// Steps between reflections before.
        from: u32,
        /// Steps between reflections now.
        to: u32,
        /// Why: `stuck`, `rework`, `uncertain`, `stalled`, `steady` or `hold`.
        cause: IntervalCause,
        /// What the rule looked at.
        inputs: IntervalInputs,
    },
    /// Summarising a cycle failed; retried after the next step.
    CycleSummaryFailed {
        /// The cycle.
        cycle: u32,
        /// Why.
        error: String,
    },
    /// A call waits for a person's approval; the session pauses after the step.
    ApprovalRequested {
        /// Warden's name of the call (`{iteration}.{call_index}`), as in
        /// `POST /api/autonomous/{id}/approvals/{call_id}`.
        call_id: String,
        /// The tool or action.
        tool: String,
        /// Its arguments.
        arguments: Value,
        /// The agent's text of the step.
        reason: String,
    },
    /// A person decided on a waiting call, or it expired.
    ApprovalDecided {
        /// The call.
        call_id: String,
        /// The tool or action.
        tool: String,
        /// `approve`, `reject` or `expired`.
        decision: crate::policy::approval::Decision,
        /// Which key decided (its public prefix); absent when it expired.
        decided_by: Option<String>,
        /// The message to the agent.
        message: Option<String>,
        /// The arguments the person approved the call with in place of the
        /// agent's (the `arguments` of its `approval_requested`); absent
        /// when it ran as asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        edited_arguments: Option<Value>,
    },
    /// The session delegated a task to a child session, its budget carved
    /// out of this session's limits.
    ChildDelegated {
        /// The child.
        child_id: Uuid,
        /// Its goal.
        goal: String,
        /// Tokens it was given (this session's `max_tokens` shrank by them).
        budget_tokens: u64,
        /// Iterations it was given (this session's `max_iterations` shrank by them).
        budget_iterations: u64,
        /// Whether this session waits for it.
        wait: bool,
    },
    /// This session was made by its parent to do a delegated task.
    DelegatedBy {
        /// The parent.
        parent_id: Uuid,
        /// What of the parent made it: `{iteration}.{call}` or `subgoal.{n}`.
        call: String,
    },
    /// A child ended; what it did not spend came back to this session's limits.
    ChildEnded {
        /// The child.
        child_id: Uuid,
        /// Its goal.
        goal: String,
        /// How it ended.
        status: Status,
        /// Why.
        reason: Option<Reason>,
        /// Its summary.
        summary: Option<String>,
        /// Tokens it and its own children spent.
        tokens_used: u64,
        /// Iterations it and its own children committed.
        iterations: u64,
        /// Tokens given back to this session.
        tokens_returned: u64,
    },
    /// A descendant paused for a person: the tree waits on it (its tree's
    /// `on_child_pause` is `wait`). Logged on every ancestor, nearest first.
    ChildNeedsAttention {
        /// The descendant that waits.
        child_id: Uuid,
        /// Its goal.
        goal: String,
        /// Why it waits.
        reason: Reason,
        /// What it says about it.
        summary: Option<String>,
        /// Its depth in the tree (the root is at 0).
        depth: u32,
    },
    /// Tokens spent by a step that was cut short were charged to the
    /// session (counted in `tokens_used` and against the budget); the
    /// session's status and outcome are unchanged.
    UsageCharged {
        /// Where they were spent.
        source: ChargeSource,
        /// The iteration of the step.
        iteration: u64,
        /// Tokens charged: what was reported, at most the step's allowance.
        tokens: u64,
        /// Tokens reported (or estimated), before the cap.
        reported: u64,
    },
    /// A soft budget: a step's commit took a budget past one of the
    /// session's `limits.warn_at` thresholds (once per threshold per
    /// session). Nothing stops; the next step is told `note`, and the
    /// session's notify targets hear of it.
    BudgetWarning {
        /// Which budget.
        budget: Budget,
        /// The threshold crossed (percent).
        threshold: u8,
        /// Spent at that commit (a decimal string).
        #[schema(value_type = String)]
        used: rust_decimal::Decimal,
        /// The hard limit (a decimal string).
        #[schema(value_type = String)]
        limit: rust_decimal::Decimal,
        /// The iteration whose commit crossed it.
        iteration: u64,
        /// What the agent is told in its next step.
        note: String,
    },
    /// The session's estimate is over its create's `confirm_if_over` (or
    /// unknown): it waits in `awaiting_confirmation` for
    /// `POST /{id}/confirm`; its notify targets hear of it.
    AwaitingConfirmation(crate::policy::confirm::Confirmation),
}

impl SessionEvent {
    /// The kind as stored (the serde tag).
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::SessionCreated { .. } => "session_created",
            SessionEvent::StatusChanged { .. } => "status_changed",
            SessionEvent::GateDecision { .. } => "gate_decision",
            SessionEvent::GuardrailTripped { .. } => "guardrail_tripped",
            SessionEvent::StepAbandoned { .. } => "step_abandoned",
            SessionEvent::UsageCharged { .. } => "usage_charged",
            SessionEvent::AgentOutputSanitized { .. } => "agent_output_sanitized",
            SessionEvent::IterationCompleted { .. } => "iteration_completed",
            SessionEvent::StuckDetected { .. } => "stuck_detected",
            SessionEvent::AgentSignal { .. } => "agent_signal",
            SessionEvent::RefinementSuggested(_) => "refinement_suggested",
            SessionEvent::GoalRefined { .. } => "goal_refined",
            SessionEvent::CriteriaGenerated { .. } => "criteria_generated",
            SessionEvent::LimitsChanged { .. } => "limits_changed",
            SessionEvent::ModeChanged { .. } => "mode_changed",
            SessionEvent::Resumed { .. } => "resumed",
            SessionEvent::StopRequested {} => "stop_requested",
            SessionEvent::PauseRequested {} => "pause_requested",
            SessionEvent::Reflection { .. } => "reflection",
            SessionEvent::CheckpointSaved { .. } => "checkpoint_saved",
            SessionEvent::LeaseAcquired { .. } => "lease_acquired",
            SessionEvent::LeaseReleased { .. } => "lease_released",
            SessionEvent::CompletionVerified { .. } => "completion_verified",
            SessionEvent::CompletionRejected { .. } => "completion_rejected",
            SessionEvent::ContextWrapUp { .. } => "context_wrap_up",
            SessionEvent::CycleStarted { .. } => "cycle_started",
            SessionEvent::CycleSummaryFailed { .. } => "cycle_summary_failed",
            SessionEvent::ToolCallsLimited { .. } => "tool_calls_limited",
            SessionEvent::ReflectionDeferred { .. } => "reflection_deferred",
            SessionEvent::ReflectionIntervalChanged { .. } => "reflection_interval_changed",
            SessionEvent::ApprovalRequested { .. } => "approval_requested",
            SessionEvent::ApprovalDecided { .. } => "approval_decided",
            SessionEvent::ChildDelegated { .. } => "child_delegated",
            SessionEvent::DelegatedBy { .. } => "delegated_by",
            SessionEvent::ChildEnded { .. } => "child_ended",
            SessionEvent::ChildNeedsAttention { .. } => "child_needs_attention",
            SessionEvent::BudgetWarning { .. } => "budget_warning",
            SessionEvent::AwaitingConfirmation(_) => "awaiting_confirmation",
        }
    }

    /// The change of status into `to` that ends a run, with its termination record.
    pub fn run_ended(
        from: Status,
        termination: &crate::policy::termination::Termination,
        usage: &Usage,
    ) -> SessionEvent {
        Self::ended(from, termination, usage, true, None)
    }

    /// The change of status that ends a session the failure model gave up
    /// on after `attempts` failed attempts: no checkpoint, `error` recorded.
    pub fn failed(
        termination: &crate::policy::termination::Termination,
        usage: &Usage,
        error: &str,
        attempts: i32,
    ) -> SessionEvent {
        Self::ended(
            Status::Running,
            termination,
            usage,
            false,
            Some((error.to_string(), attempts)),
        )
    }

    fn ended(
        from: Status,
        termination: &crate::policy::termination::Termination,
        usage: &Usage,
        checkpoint_saved: bool,
        failure: Option<(String, i32)>,
    ) -> SessionEvent {
        let (error, attempts) = failure.unzip();
        SessionEvent::StatusChanged {
            from: Some(from),
            to: termination.status,
            reason: Some(termination.reason),
            summary: Some(termination.summary.clone()),
            next_steps: Some(termination.next_steps.clone()),
            iterations: Some(usage.iterations),
            tokens_used: Some(usage.tokens),
            checkpoint_saved: Some(checkpoint_saved),
            error,
            attempts,
        }
    }

    /// A plain change of status, without a termination record.
    pub fn status(from: Option<Status>, to: Status) -> SessionEvent {
        SessionEvent::StatusChanged {
            from,
            to,
            reason: None,
            summary: None,
            next_steps: None,
            iterations: None,
            tokens_used: None,
            checkpoint_saved: None,
            error: None,
            attempts: None,
        }
    }

    /// Splits the event into its stored kind and its payload as JSON text;
    /// fails only when a payload cannot be represented as JSON (never
    /// stored as `null`). Serialized once, as text, and the payload cut out
    /// of it: the tagged form is `{"kind":"…","data":…}` as serde_json
    /// writes it, and only if it is not (a variant without data) is the
    /// text parsed to find the payload.
    pub fn to_parts(&self) -> Result<(&'static str, String), serde_json::Error> {
        /// The tagged form with its payload left as written.
        #[derive(Deserialize)]
        struct Tagged<'a> {
            #[serde(borrow)]
            data: Option<&'a RawValue>,
        }
        let kind = self.kind();
        let tagged_text = serde_json::to_string(self)?;
        if let Some(data) = tagged_text
            .strip_prefix("{\"kind\":\"")
            .and_then(|rest| rest.strip_prefix(kind))
            .and_then(|rest| rest.strip_prefix("\",\"data\":"))
            .and_then(|rest| rest.strip_suffix('}'))
        {
            return Ok((kind, data.to_owned()));
        }
        let tagged: Tagged<'_> = serde_json::from_str(&tagged_text)?;
        let data = tagged.data.map_or("{}", RawValue::get);
        Ok((kind, data.to_owned()))
    }

    /// Reads a stored event back from its kind and payload.
    pub fn from_parts(kind: &str, data: &Value) -> Result<SessionEvent, serde_json::Error> {
        serde_json::from_value(serde_json::json!({ "kind": kind, "data": data }))
    }

    /// Whether this status change ends the session's loop (nothing follows
    /// it until a person acts).
    pub fn ends_loop(&self) -> bool {
        matches!(self, SessionEvent::StatusChanged { to, .. }
            if !matches!(to, Status::Running | Status::AwaitingRefinement | Status::AwaitingConfirmation))
    }

    /// Whether the decisions view lists this kind.
    pub fn is_decision(&self) -> bool {
        DECISION_KINDS.contains(&self.kind())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn limits() -> Limits {
        Limits {
            max_iterations: 50,
            max_wall_time_ms: 60_000,
            max_tokens: 1_000,
            max_consecutive_errors: 3,
            reflection_interval: 5,
            reflection_adaptive: false,
            checkpoint_interval: 10,
            max_tool_calls: None,
            max_cycles: 10,
            context_budget_tokens: 32_000,
            review_every: None,
            warn_at: crate::policy::soft_budget::WarnAt::DEFAULT,
            max_cost_usd: None,
        }
    }

    /// One event of every kind, with the payload the log had before the enum.
    fn samples() -> Vec<(SessionEvent, Value)> {
        let l = limits();
        let lj = serde_json::to_value(l).unwrap();
        vec![
            (
                SessionEvent::SessionCreated {
                    goal: "g".into(),
                    mode: Mode::Fixed,
                    limits: l,
                    executor: "scripted".into(),
                    success_criteria: vec!["c".into()],
                    milestones: vec![],
                },
                json!({ "goal": "g", "mode": "fixed", "limits": lj, "executor": "scripted",
                        "success_criteria": ["c"], "milestones": [] }),
            ),
            (
                SessionEvent::status(None, Status::Running),
                json!({ "from": null, "to": "running" }),
            ),
            (
                SessionEvent::StatusChanged {
                    from: Some(Status::Running),
                    to: Status::Stopped,
                    reason: Some(Reason::UserStop),
                    summary: Some("s".into()),
                    next_steps: Some(vec!["n".into()]),
                    iterations: Some(3),
                    tokens_used: Some(10),
                    checkpoint_saved: Some(true),
                    error: None,
                    attempts: None,
                },
                json!({ "from": "running", "to": "stopped", "reason": "user_stop", "summary": "s",
                        "next_steps": ["n"], "iterations": 3, "tokens_used": 10,
                        "checkpoint_saved": true }),
            ),
            (
                SessionEvent::StatusChanged {
                    from: Some(Status::Running),
                    to: Status::Failed,
                    reason: Some(Reason::InternalError),
                    summary: Some("s".into()),
                    next_steps: Some(vec![]),
                    iterations: Some(0),
                    tokens_used: Some(0),
                    checkpoint_saved: Some(false),
                    error: Some("e".into()),
                    attempts: Some(5),
                },
                json!({ "from": "running", "to": "failed", "reason": "internal_error", "summary": "s",
                        "next_steps": [], "iterations": 0, "tokens_used": 0,
                        "checkpoint_saved": false, "error": "e", "attempts": 5 }),
            ),
            (
                SessionEvent::AgentOutputSanitized {
                    step: 2,
                    nul_replaced: 3,
                    with: "\u{fffd}".into(),
                },
                json!({ "step": 2, "nul_replaced": 3, "with": "\u{fffd}" }),
            ),
            (
                SessionEvent::StepAbandoned {
                    step: 4,
                    why: AbandonedBecause::Timeout,
                },
                json!({ "step": 4, "why": "timeout" }),
            ),
            (
                SessionEvent::UsageCharged {
                    source: ChargeSource::WorkerAfterCancel,
                    iteration: 2,
                    tokens: 50,
                    reported: 900,
                },
                json!({ "source": "worker_after_cancel", "iteration": 2, "tokens": 50, "reported": 900 }),
            ),
            (
                SessionEvent::BudgetWarning {
                    budget: Budget::Iterations,
                    threshold: 80,
                    used: 16.into(),
                    limit: 20.into(),
                    iteration: 16,
                    note: "80% of the iteration budget is spent".into(),
                },
                json!({ "budget": "iterations", "threshold": 80, "used": "16", "limit": "20",
                        "iteration": 16, "note": "80% of the iteration budget is spent" }),
            ),
            (
                SessionEvent::IterationCompleted {
                    number: 1,
                    action: "a".into(),
                    outcome: Outcome::Success,
                    tokens: 5,
                    duration_ms: 7,
                    rework: None,
                    tokens_used: 5,
                    percent_complete: Some(12.5),
                },
                json!({ "number": 1, "action": "a", "outcome": "success", "tokens": 5,
                        "duration_ms": 7, "rework": null, "tokens_used": 5,
                        "percent_complete": 12.5 }),
            ),
            (
                SessionEvent::RefinementSuggested(RefinementProposal {
                    suggested_goal: "s".into(),
                    matched_patterns: vec!["p".into()],
                    confidence: 0.5,
                    source: "rules".into(),
                    choices: vec!["custom".into()],
                }),
                json!({ "suggested_goal": "s", "matched_patterns": ["p"], "confidence": 0.5,
                        "source": "rules", "choices": ["custom"] }),
            ),
            (
                SessionEvent::GoalRefined {
                    kind: "auto".into(),
                    from: "a".into(),
                    to: "b".into(),
                    limits: None,
                },
                json!({ "kind": "auto", "from": "a", "to": "b" }),
            ),
            (
                SessionEvent::Resumed {
                    run: 2,
                    guidance: None,
                    reopened: false,
                    from_status: Status::Paused,
                    from_reason: Some(Reason::UserPause),
                },
                json!({ "run": 2, "guidance": null, "reopened": false, "from_status": "paused",
                        "from_reason": "user_pause" }),
            ),
            (SessionEvent::StopRequested {}, json!({})),
            (SessionEvent::PauseRequested {}, json!({})),
            (
                SessionEvent::LeaseAcquired {
                    owner: Uuid::nil(),
                    previous_owner: None,
                },
                json!({ "owner": Uuid::nil(), "previous_owner": null }),
            ),
            (
                SessionEvent::CycleStarted {
                    cycle: 2,
                    memory_chars: 40,
                },
                json!({ "cycle": 2, "memory_chars": 40 }),
            ),
            (
                SessionEvent::ApprovalRequested {
                    call_id: "3.0".into(),
                    tool: "write_file".into(),
                    arguments: json!({ "path": "a" }),
                    reason: "r".into(),
                },
                json!({ "call_id": "3.0", "tool": "write_file", "arguments": { "path": "a" },
                        "reason": "r" }),
            ),
            (
                SessionEvent::ApprovalDecided {
                    call_id: "3.0".into(),
                    tool: "write_file".into(),
                    decision: crate::policy::approval::Decision::Reject,
                    decided_by: Some("wdn_ab".into()),
                    message: None,
                    edited_arguments: None,
                },
                json!({ "call_id": "3.0", "tool": "write_file", "decision": "reject",
                        "decided_by": "wdn_ab", "message": null }),
            ),
            (
                SessionEvent::ApprovalDecided {
                    call_id: "3.1".into(),
                    tool: "write_file".into(),
                    decision: crate::policy::approval::Decision::Approve,
                    decided_by: Some("wdn_ab".into()),
                    message: Some("in docs/".into()),
                    edited_arguments: Some(json!({ "path": "docs/a" })),
                },
                json!({ "call_id": "3.1", "tool": "write_file", "decision": "approve",
                        "decided_by": "wdn_ab", "message": "in docs/",
                        "edited_arguments": { "path": "docs/a" } }),
            ),
        ]
    }

    #[test]
    fn payloads_keep_the_stored_format_and_read_back() {
        for (event, data) in samples() {
            let (kind, got) = event.to_parts().unwrap();
            let got: Value = serde_json::from_str(&got).unwrap();
            assert_eq!(got, data, "payload of {kind}");
            let back = SessionEvent::from_parts(kind, &data).unwrap();
            assert_eq!(back, event, "read back {kind}");
        }
    }

    #[test]
    fn kind_is_the_serde_tag() {
        for (event, _) in samples() {
            let tagged = serde_json::to_value(&event).unwrap();
            assert_eq!(tagged["kind"], event.kind());
        }
    }

    #[test]
    fn unknown_kinds_and_wrong_payloads_are_errors() {
        assert!(SessionEvent::from_parts("no_such_kind", &json!({})).is_err());
        assert!(SessionEvent::from_parts("step_abandoned", &json!({ "step": "x" })).is_err());
    }

    #[test]
    fn only_final_status_changes_end_the_loop() {
        assert!(!SessionEvent::status(None, Status::Running).ends_loop());
        assert!(!SessionEvent::status(None, Status::AwaitingRefinement).ends_loop());
        assert!(!SessionEvent::status(None, Status::AwaitingConfirmation).ends_loop());
        assert!(SessionEvent::status(Some(Status::Running), Status::Paused).ends_loop());
        assert!(!SessionEvent::StopRequested {}.ends_loop());
    }

    /// The decisions query is served by a partial index; its predicate must
    /// list exactly the decision kinds, or the query falls off the index.
    #[test]
    fn decision_kinds_match_the_partial_index() {
        // The latest migration that (re)creates the index.
        let migration = include_str!("../migrations/0038_interval_decisions.sql");
        let start = migration
            .find("CREATE INDEX events_decisions")
            .expect("the migration defines events_decisions");
        let index = &migration[start..];
        let index = &index[..index.find(';').expect("the statement ends")];
        let list = index
            .split_once("kind IN (")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(list, _)| list)
            .expect("the index predicate is a kind IN (...) list");
        let in_index: Vec<&str> = list
            .split(',')
            .map(|k| k.trim().trim_matches('\''))
            .collect();
        assert_eq!(in_index, DECISION_KINDS);
        // The decisions query repeats the list as literals (a bound array
        // would not let the planner prove the index predicate).
        let query: String = include_str!("store/event_log.rs")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let literal = DECISION_KINDS.map(|k| format!("'{k}'")).join(", ");
        assert!(
            query.contains(&format!("kind IN ({literal})")),
            "the decisions query in store/event_log.rs lists other kinds than DECISION_KINDS"
        );
        assert!(SessionEvent::status(None, Status::Running).is_decision());
        assert!(!SessionEvent::StopRequested {}.is_decision());
        // The archive splits a session's log the same way.
        let archive: String = include_str!("store/archive.rs")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(archive.contains(&format!("AND kind IN ({literal})")));
        assert!(archive.contains(&format!("AND kind NOT IN ({literal})")));
    }
}
