//! The webhook executor: Warden supervises an agent written in any language
//! by POSTing each step's context to its URL and reading back the outcome.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    ApprovalAsk, ApprovalDesk, ChildDesk, Executor, ExecutorError, StepContext, StepOutput,
    StepResult,
};
use crate::egress::{
    EgressError, EgressPolicy, ReadError, read_capped, transport_error, upstream_error_summary,
};
use crate::event::SessionEvent;
use crate::policy::approval::Decision;
use crate::policy::delegation::{ChildReport, ChildRequest};
use crate::policy::excerpt;
use crate::policy::history::Outcome;
use crate::policy::pricing::StepUsage;
use crate::policy::sentinel::{Sentinel, SignalKind};
use crate::telemetry;

/// Steps of history sent with each request.
const HISTORY_ITEMS: usize = 10;

/// What Warden POSTs to the agent for each step.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookRequest {
    /// Session id.
    pub session_id: Uuid,
    /// The goal.
    pub goal: String,
    /// Number of the iteration to perform.
    pub iteration: u64,
    /// Guidance from the user, delivered once.
    pub guidance: Option<String>,
    /// A supervisor's note (stuck nudge, reviewer feedback), delivered once.
    pub nudge: Option<String>,
    /// Soft budgets: how much of a budget is spent and about how many
    /// steps are left at this rate, when the last step crossed one of the
    /// session's `limits.warn_at` thresholds (absent otherwise): time to
    /// wrap up. Delivered once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_note: Option<String>,
    /// Most tokens this step may use: what is left of the session's token
    /// budget. An answer reporting more `tokens` is charged the whole
    /// allowance (never more) and ends the session `stopped / cost_limit`.
    pub token_allowance: u64,
    /// The most recent steps, oldest first.
    pub history: Vec<WebhookHistoryItem>,
    /// The W3C trace context of the step (also sent as the `traceparent`
    /// header), when Warden exports traces: continue the trace under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The decision on the action the previous step asked approval for
    /// (absent otherwise): do it when approved, skip it otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalOutcome>,
    /// Child sessions this session delegated to that ended since the step
    /// before, with their results (absent when none did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildReport>,
}

/// An action an external agent asks a person to approve before it does it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionApproval {
    /// The action (`deploy`).
    pub action: String,
    /// Its arguments, shown to the person.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// Why the agent wants to do it.
    #[serde(default)]
    pub reason: String,
}

/// The decision on an action that waited for approval, as the next step gets it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalOutcome {
    /// The action.
    pub action: String,
    /// Its arguments: as asked, or as the person edited them when
    /// `arguments_edited` is true (do it with these).
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// Present, and true, only when the person approved the action with
    /// arguments of their own in place of the ones asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub arguments_edited: bool,
    /// `approve`, `reject` or `expired` (nobody decided in time): only an
    /// approved action may be done.
    pub decision: Decision,
    /// The person's message, if any.
    pub message: Option<String>,
}

/// One past step as the agent sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookHistoryItem {
    /// Iteration number.
    pub number: u64,
    /// Action.
    pub action: String,
    /// `success`, `failure` or `error`.
    #[schema(value_type = String)]
    pub outcome: Outcome,
    /// Output of the step: whole up to a few KiB, else an excerpt (head and
    /// tail) whose marker says how many bytes are not shown and which
    /// iteration has the whole output.
    pub output: String,
}

/// A stop signal from the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookSignal {
    /// The goal is achieved.
    Done,
    /// The agent cannot go on without help.
    Blocked,
    /// The agent asks the user a question (`reason` holds it).
    AskUser,
}

/// What the agent answers for a step.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookResponse {
    /// What it did.
    pub action: String,
    /// Its arguments (compared to detect rework).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// `success` (default), `failure` or `error`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub outcome: Option<Outcome>,
    /// Tokens the step used (charged to the session's budget); more than
    /// the request's `token_allowance` is charged as the allowance and ends
    /// the session `stopped / cost_limit`.
    #[serde(default)]
    pub tokens: u64,
    /// The step's tokens split and its model (the OpenAI Agents SDK's
    /// names), for pricing it: the budget counts the larger of `tokens` and
    /// `input_tokens + output_tokens`, and the split is held to that count.
    /// Without it the step's tokens are priced as output tokens of an
    /// unnamed model (the price table's `*` entry, else `unpriced`).
    #[serde(default)]
    pub usage: Option<StepUsage>,
    /// Output text; a final sentinel line is honoured like any executor's.
    #[serde(default)]
    pub output: String,
    /// Tool calls it made.
    #[serde(default)]
    pub tool_calls: u64,
    /// Optional stop signal.
    #[serde(default)]
    pub signal: Option<WebhookSignal>,
    /// Reason for the signal (or the question).
    #[serde(default)]
    pub reason: Option<String>,
    /// The agent's own progress estimate, percent.
    #[serde(default)]
    pub percent_complete: Option<f64>,
    /// The step is polling a long-running job.
    #[serde(default)]
    pub waiting: bool,
    /// Ask a person to approve an action before doing it: the session
    /// pauses with reason `approval_required`, and the next step's
    /// `approval` carries the decision.
    #[serde(default)]
    pub approval: Option<ActionApproval>,
    /// Tasks to delegate to child sessions, each with a share of the
    /// session's remaining budget; with `wait` (the default) the session
    /// pauses until they end, and a later step's `children` has their results.
    #[serde(default)]
    pub delegate: Vec<ChildRequest>,
}

/// Calls an external agent over HTTP.
pub struct WebhookExecutor {
    http: reqwest::Client,
    approvals: Arc<dyn ApprovalDesk>,
    children: Arc<dyn ChildDesk>,
    url: String,
    /// Largest answer read.
    max_body: usize,
}

impl WebhookExecutor {
    /// An executor posting to `url` under the outbound-request policy, each
    /// step within `timeout`.
    pub fn new(
        url: String,
        timeout: Duration,
        egress: &Arc<EgressPolicy>,
        approvals: Arc<dyn ApprovalDesk>,
        children: Arc<dyn ChildDesk>,
    ) -> Result<WebhookExecutor, EgressError> {
        Ok(WebhookExecutor {
            http: egress.client_for(&url, timeout)?,
            approvals,
            children,
            url,
            max_body: egress.max_response_bytes(),
        })
    }

    async fn step(&self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        let failed = |message: String| ExecutorError::Failed {
            action: "webhook".into(),
            message,
            tokens: 0,
        };
        let mut request = request_for(&ctx);
        request.approval = decided_action(self.approvals.as_ref(), ctx.iteration).await?;
        let mut post = self.http.post(&self.url);
        if let Some(traceparent) = &request.traceparent {
            post = post.header(telemetry::TRACEPARENT, traceparent);
        }
        let response = post
            // The same for every attempt at this iteration (a rescued session
            // repeats the step it could not commit), so the agent can deduplicate.
            .header(
                "Idempotency-Key",
                format!("{}:{}", ctx.session_id, ctx.iteration),
            )
            .json(&request)
            .send()
            .await
            .map_err(|e| failed(format!("agent unreachable: {}", transport_error(&e))))?;
        let status = response.status();
        let body = read_capped(response, self.max_body)
            .await
            .map_err(|e| match e {
                // Permanent: one error for this step, said as it is.
                ReadError::TooLarge { .. } => failed(format!("agent's {e}")),
                ReadError::Unreadable(_) => failed(format!("agent answer unreadable: {e}")),
            })?;
        if !status.is_success() {
            // Only a summary: the answer of a URL a client chose must not
            // travel back to that client (SSRF).
            return Err(failed(format!(
                "agent answered {}",
                upstream_error_summary(status, &body)
            )));
        }
        let answer: WebhookResponse = serde_json::from_slice(&body)
            .map_err(|e| failed(format!("agent answer is not a step outcome: {e}")))?;
        // Up to the egress cap: not kept a moment longer than needed.
        drop(body);
        external_step(
            self.approvals.as_ref(),
            self.children.as_ref(),
            ctx.iteration,
            answer,
        )
        .await
    }
}

/// The decision on the action step `iteration - 1` asked approval for.
pub(super) async fn decided_action(
    desk: &dyn ApprovalDesk,
    iteration: u64,
) -> Result<Option<ApprovalOutcome>, ExecutorError> {
    let Some(before) = iteration.checked_sub(1).filter(|n| *n > 0) else {
        return Ok(None);
    };
    let decided = desk
        .decided(before)
        .await
        .map_err(|e| ExecutorError::Failed {
            action: "approvals".into(),
            message: format!("cannot read the decision on the action waiting for approval: {e}"),
            tokens: 0,
        })?;
    Ok(decided.into_iter().next().map(|d| ApprovalOutcome {
        action: d.tool,
        arguments: d.arguments,
        arguments_edited: d.edited,
        decision: d.decision,
        message: d.message,
    }))
}

/// An external agent's answer as a step: the tasks it delegates become
/// child sessions (the session waits for them when one says so); an action
/// it asks approval for is journaled as waiting and the session pauses
/// after the step.
pub(super) async fn external_step(
    desk: &dyn ApprovalDesk,
    children: &dyn ChildDesk,
    iteration: u64,
    mut answer: WebhookResponse,
) -> Result<StepResult, ExecutorError> {
    let tasks = std::mem::take(&mut answer.delegate);
    let mut made = Vec::new();
    for (index, task) in tasks.iter().enumerate() {
        let ticket = children
            .delegate(iteration, index as u32, task, answer.tokens, None)
            .await
            .map_err(|e| ExecutorError::Failed {
                action: answer.action.clone(),
                message: format!("cannot delegate `{}`: {e}", task.goal),
                tokens: answer.tokens,
            })?;
        made.push(ticket.child_id.to_string());
    }
    let waits = tasks.iter().any(|t| t.wait);
    let delegated = |mut result: StepResult| {
        if let StepResult::Step(out) = &mut result
            && !made.is_empty()
        {
            out.observation = format!("{}\ndelegated to {}", out.observation, made.join(", "));
            if waits
                && out
                    .signal
                    .as_ref()
                    .is_none_or(|s| s.kind != SignalKind::ApprovalRequired)
            {
                out.signal = Some(Sentinel {
                    kind: SignalKind::WaitingForChildren,
                    reason: Some(format!("{} delegated task(s)", made.len())),
                });
            }
        }
        result
    };
    let Some(asked) = answer.approval.take() else {
        return Ok(delegated(step_result(answer)));
    };
    if crate::policy::text::is_blank(&asked.action) {
        return Err(ExecutorError::Failed {
            action: answer.action,
            message: "the answer's approval.action must not be empty".into(),
            tokens: answer.tokens,
        });
    }
    let ask = ApprovalAsk {
        call_index: 0,
        tool_call_id: None,
        tool: asked.action,
        arguments: asked.arguments,
        reason: asked.reason,
    };
    desk.ask(iteration, &ask)
        .await
        .map_err(|e| ExecutorError::Failed {
            action: answer.action.clone(),
            message: format!("cannot ask for approval: {e}"),
            tokens: answer.tokens,
        })?;
    let call_id = crate::store::approval_call_id(i64::try_from(iteration).unwrap_or(i64::MAX), 0);
    let mut result = step_result(answer);
    if let StepResult::Step(out) = &mut result {
        out.signal = Some(Sentinel {
            kind: SignalKind::ApprovalRequired,
            reason: Some(format!("`{}` (call {call_id})", ask.tool)),
        });
        out.events.push(SessionEvent::ApprovalRequested {
            call_id,
            tool: ask.tool,
            arguments: ask.arguments,
            reason: ask.reason,
        });
    }
    Ok(delegated(result))
}

/// The context of a step as an external agent (webhook or worker) gets it.
pub(super) fn request_for(ctx: &StepContext<'_>) -> WebhookRequest {
    let history = ctx.history[ctx.history.len().saturating_sub(HISTORY_ITEMS)..]
        .iter()
        .map(|s| WebhookHistoryItem {
            number: s.number,
            action: s.action.clone(),
            outcome: s.outcome,
            // The loop's history is slim already; held to the same
            // few KiB here whatever history it is given.
            output: excerpt::history_excerpt(&s.observation, s.number).into_owned(),
        })
        .collect();
    WebhookRequest {
        session_id: ctx.session_id,
        goal: ctx.goal.to_string(),
        iteration: ctx.iteration,
        guidance: ctx.guidance.map(str::to_string),
        nudge: ctx.nudge.map(str::to_string),
        budget_note: ctx.budget_note.map(str::to_string),
        token_allowance: ctx.token_allowance,
        history,
        traceparent: telemetry::traceparent(),
        children: ctx.children.to_vec(),
        approval: None,
    }
}

/// An external agent's answer as a step, mapped the same way for webhooks
/// and workers so every policy applies unchanged.
pub(super) fn step_result(answer: WebhookResponse) -> StepResult {
    let outcome = answer.outcome.unwrap_or(Outcome::Success);
    let signal = answer.signal.map(|s| Sentinel {
        kind: match s {
            WebhookSignal::Done => SignalKind::Done,
            WebhookSignal::Blocked => SignalKind::Blocked,
            WebhookSignal::AskUser => SignalKind::AskUser,
        },
        reason: answer.reason.clone(),
    });
    StepResult::Step(Box::new(StepOutput {
        arguments: answer.arguments,
        outcome,
        error: (outcome != Outcome::Success).then(|| answer.output.clone()),
        tokens: answer
            .usage
            .as_ref()
            .map_or(answer.tokens, |u| u.total().max(answer.tokens)),
        usage: answer.usage,
        tool_calls: answer.tool_calls,
        waiting: answer.waiting,
        percent_complete: answer.percent_complete.map(|p| p.clamp(0.0, 100.0)),
        signal,
        ..StepOutput::simple(answer.action, answer.output)
    }))
}

impl Executor for WebhookExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.step(ctx).boxed()
    }
}
