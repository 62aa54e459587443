//! Execute: the step itself, raced against a stop, a shutdown and the time
//! left; what the executor answered becomes a [`StepOutcome`] to commit, or
//! an end when it could not run at all.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::gate::Gated;
use super::plan::StepOutcome;
use super::{Flow, Runner};
use crate::event::{AbandonedBecause, ChargeSource, SessionEvent};
use crate::executor::{ExecutorError, Interruption, StepContext, StepOutput, StepResult};
use crate::policy::budget;
use crate::policy::delegation::{self, ChildReport, ParentNext};
use crate::policy::eta;
use crate::policy::guardrails;
use crate::policy::history::{Outcome, StepRecord};
use crate::policy::lifecycle::Reason;
use crate::policy::pricing::StepUsage;
use crate::session::runtime::live::StepInFlight;
use crate::session::runtime::loop_store::LoopStore;
use crate::session::runtime::storable::{cap_output, make_storable};
use crate::store::StoreError;

/// A step the executor finished, ready to commit.
pub(super) struct Executed {
    /// What the plan of the commit is made from.
    pub(super) outcome: StepOutcome,
    /// Time spent in the executor.
    pub(super) executor_time: Duration,
    /// The tokens the step was allowed.
    pub(super) allowance: u64,
    /// The tokens it reported (its record holds them up to the allowance).
    pub(super) reported_tokens: u64,
}

impl Executed {
    /// The step's number and how far over its allowance it went, if it did.
    pub(super) fn overspent(&self) -> Option<(u64, budget::Overspent)> {
        let number = self.outcome.record.number;
        budget::overspent(self.reported_tokens, self.allowance).map(|o| (number, o))
    }
}

/// What happened to the step in flight; a step cut short carries the
/// charge of what it spent that no answer reported, if anything.
enum StepEnd {
    Done(Result<StepResult, ExecutorError>),
    Stopped(Option<SessionEvent>),
    Shutdown(Option<SessionEvent>),
    TimedOut(Option<SessionEvent>),
}

impl<S: LoopStore> Runner<S> {
    /// Execute: runs the step, abandoning it on stop, shutdown or timeout.
    pub(super) async fn execute(&mut self, gated: Gated) -> Result<Flow<Executed>, StoreError> {
        let Gated { step, decision } = gated;
        let children = match self.ended_children(step).await? {
            Ok(reports) => reports,
            Err(why) => {
                let exit = self
                    .finish(Reason::AgentBlocked, Some(why), vec![decision])
                    .await?;
                return Ok(Flow::Exit(exit));
            }
        };
        let Some(allowance) = self.allowance().await? else {
            return self.tree_used_up(decision, step).await;
        };
        let started_at = Utc::now();
        let t0 = Instant::now();
        self.show_step_started(step, started_at);
        let mut result = match self.run_executor(step, allowance, &children).await {
            StepEnd::Done(result) => result,
            StepEnd::Stopped(charge) => {
                return self
                    .abandon(decision, step, AbandonedBecause::UserStop, charge)
                    .await;
            }
            StepEnd::TimedOut(charge) => {
                return self
                    .abandon(decision, step, AbandonedBecause::Timeout, charge)
                    .await;
            }
            StepEnd::Shutdown(charge) => {
                let charges = Vec::from_iter(charge);
                return Ok(Flow::Exit(self.release_with(&charges).await?));
            }
        };
        let sanitized = self.make_storable(step, &mut result);
        let reported_tokens = crate::executor::bound_usage(&mut result, allowance);
        let executor_time = t0.elapsed();
        // The ends first: no outcome is held across their writes.
        let answer = match result {
            Ok(StepResult::Step(out)) => Ok(*out),
            Err(err) => Err(err),
            Ok(StepResult::Exhausted) => {
                let events = vec![decision];
                let exit = self.finish(Reason::ExecutorExhausted, None, events).await?;
                return Ok(Flow::Exit(exit));
            }
            Ok(StepResult::OverBudget { needed, allowance }) => {
                return self.over_budget(decision, step, needed, allowance).await;
            }
            Ok(StepResult::NoWorker { detail }) => {
                let events = vec![decision];
                let exit = self.finish(Reason::NoWorker, Some(detail), events).await?;
                return Ok(Flow::Exit(exit));
            }
            // The worker gave the step up for a pause: the session pauses,
            // and a resume offers the step again.
            Ok(StepResult::Abandoned) => {
                return self
                    .abandon(decision, step, AbandonedBecause::UserPause, None)
                    .await;
            }
        };
        let outcome = unanswered(decision, step, started_at, executor_time, sanitized);
        let outcome = match answer {
            Ok(out) => self.took(outcome, out),
            Err(ExecutorError::Failed {
                action,
                message,
                tokens,
            }) => failed(outcome, action, message, tokens),
        };
        self.view.step_returned(&outcome.record.action);
        Ok(Flow::Go(Executed {
            outcome,
            executor_time,
            allowance,
            reported_tokens,
        }))
    }

    /// The children that ended since the step before, given to this step;
    /// `Err` with why when none is left running and every one of them
    /// failed, so a person decides.
    async fn ended_children(
        &mut self,
        step: u64,
    ) -> Result<Result<Vec<ChildReport>, String>, StoreError> {
        if !self.has_children.load(Ordering::SeqCst) {
            return Ok(Ok(Vec::new()));
        }
        let (reports, live) = self.store.child_reports(&self.lease, step).await?;
        if live == 0
            && let ParentNext::Blocked(why) = delegation::after_children(&reports)
        {
            return Ok(Err(why));
        }
        Ok(Ok(reports))
    }

    /// Shows the step in flight on the status (memory only, never Postgres).
    fn show_step_started(&mut self, step: u64, started_at: DateTime<Utc>) {
        self.view.step_started(StepInFlight {
            iteration: step,
            action: None,
            started_at,
            session_elapsed_ms: self.elapsed_ms(),
            median_step_ms: eta::median(self.state.history.iter().map(|s| s.duration_ms)),
        });
    }

    /// What the step may spend: what the budget has left. In a tree,
    /// concurrent steps of other sessions spend the same budget, so it is
    /// reserved from what the tree has left; `None` when that is nothing.
    async fn allowance(&mut self) -> Result<Option<u64>, StoreError> {
        let own = budget::allowance(self.settings.limits.max_tokens, self.state.usage.tokens)
            .min(self.money_allowance());
        if !self.in_tree() {
            return Ok(Some(own));
        }
        let granted = self.store.reserve_step(&self.lease, own).await?;
        Ok((granted > 0).then_some(granted))
    }

    /// The tree has nothing left (a step elsewhere in it reported more than
    /// it was allowed): no step starts on tokens that are not there.
    async fn tree_used_up(
        &mut self,
        decision: SessionEvent,
        step: u64,
    ) -> Result<Flow<Executed>, StoreError> {
        let detail = format!(
            "step {step} cannot start: the token budget of its tree of sessions is used up (a step elsewhere in the tree reported more than it was allowed)"
        );
        let exit = self
            .finish(Reason::CostLimit, Some(detail), vec![decision])
            .await?;
        Ok(Flow::Exit(exit))
    }

    /// A step cut short by a stop, the time limit or a pause ends the run.
    async fn abandon(
        &mut self,
        decision: SessionEvent,
        step: u64,
        why: AbandonedBecause,
        charge: Option<SessionEvent>,
    ) -> Result<Flow<Executed>, StoreError> {
        let reason = match why {
            AbandonedBecause::UserStop => Reason::UserStop,
            AbandonedBecause::Timeout => Reason::Timeout,
            AbandonedBecause::UserPause => Reason::UserPause,
        };
        let mut events = vec![decision, SessionEvent::StepAbandoned { step, why }];
        events.extend(charge);
        Ok(Flow::Exit(self.finish(reason, None, events).await?))
    }

    /// Asks the executor for `step`, until a stop, a shutdown or the time
    /// left cuts it short.
    async fn run_executor(
        &mut self,
        step: u64,
        allowance: u64,
        children: &[ChildReport],
    ) -> StepEnd {
        let remaining = guardrails::time_remaining_ms(&self.settings.limits, &self.current_usage());
        let nudge = self.state.pending_nudge.clone();
        let budget_note = self.state.pending_budget_note.clone();
        let ctx = StepContext {
            session_id: self.lease.session_id,
            goal: &self.goal,
            iteration: step,
            guidance: self.guidance.as_deref(),
            nudge: nudge.as_deref(),
            budget_note: budget_note.as_deref(),
            history: &self.state.history,
            token_allowance: allowance,
            children,
        };
        let end = tokio::select! {
            biased;
            _ = self.control.stop.cancelled() => StepEnd::Stopped(None),
            _ = self.control.shutdown.cancelled() => StepEnd::Shutdown(None),
            _ = tokio::time::sleep(Duration::from_millis(remaining)) => StepEnd::TimedOut(None),
            result = self.executor.execute(ctx) => StepEnd::Done(result),
        };
        // The executor hears why its step was cut short: a worker's task
        // is given up on a stop, and kept for the next run on a drain.
        let why = match end {
            StepEnd::Done(_) => return end,
            StepEnd::Stopped(_) | StepEnd::TimedOut(_) => Interruption::Stopped,
            StepEnd::Shutdown(_) => Interruption::Draining,
        };
        self.executor.interrupted(why).await;
        let charge = self.charge_unreported(step, allowance);
        match end {
            StepEnd::Stopped(_) => StepEnd::Stopped(charge),
            StepEnd::TimedOut(_) => StepEnd::TimedOut(charge),
            StepEnd::Shutdown(_) => StepEnd::Shutdown(charge),
            StepEnd::Done(result) => StepEnd::Done(result),
        }
    }

    /// What the step cut short spent that no answer will report (an
    /// abandoned model call), at most its allowance, counted in the usage
    /// the end writes; its event, when there is anything to charge.
    fn charge_unreported(&mut self, step: u64, allowance: u64) -> Option<SessionEvent> {
        let reported = self.executor.take_unreported_tokens();
        let tokens = budget::charge(reported, allowance);
        if tokens == 0 {
            return None;
        }
        self.state.usage.tokens = self.state.usage.tokens.saturating_add(tokens);
        tracing::info!(step, tokens, "abandoned model call charged");
        Some(SessionEvent::UsageCharged {
            source: ChargeSource::AbandonedModelCall,
            iteration: step,
            tokens,
            reported,
        })
    }

    /// Agent output is made storable before anything commits it, and held to
    /// the output cap: stored, kept and sent on in bounded size, whatever the
    /// agent answered. Returns the NUL characters replaced.
    fn make_storable(&self, step: u64, result: &mut Result<StepResult, ExecutorError>) -> usize {
        let sanitized = make_storable(result);
        let dropped = cap_output(result, self.config.quotas.max_output_bytes);
        if dropped > 0 {
            tracing::info!(step, dropped, "agent output over the cap; the rest dropped");
        }
        sanitized
    }

    /// A step the executor performed, taken into the outcome.
    fn took(&self, outcome: StepOutcome, out: StepOutput) -> StepOutcome {
        if let Some(latency) = out.model_latency {
            self.metrics.model_seconds.observe(latency);
        }
        StepOutcome {
            record: StepRecord {
                action: out.action,
                arguments: out.arguments,
                outcome: out.outcome,
                observation: out.observation,
                message: out.message,
                error: out.error,
                tokens: out.tokens,
                tool_calls: out.tool_calls,
                files_written: out.files_written,
                waiting: out.waiting,
                context_overflow: out.context_overflow,
                ..outcome.record
            },
            percent: out.percent_complete,
            signal: out.signal,
            transcript: out.transcript,
            events: out.events,
            cycle_change: out.cycle_change,
            // Held to the tokens (bound_usage); a count alone is unsplit.
            usage: out
                .usage
                .unwrap_or_else(|| StepUsage::unsplit(out.tokens, None)),
            ..outcome
        }
    }

    /// Not an error of the agent's: the budget cannot pay for the step at
    /// all, so it ends as a budget stop.
    async fn over_budget(
        &mut self,
        decision: SessionEvent,
        step: u64,
        needed: u64,
        allowance: u64,
    ) -> Result<Flow<Executed>, StoreError> {
        let events = vec![
            decision,
            SessionEvent::GuardrailTripped {
                breach: guardrails::Breach::CostLimit,
                usage: self.current_usage(),
                limits: self.settings.limits,
            },
        ];
        let detail = format!(
            "step {step} needs about {needed} tokens before any answer, more than the {allowance} left of the budget"
        );
        let exit = self.finish(Reason::CostLimit, Some(detail), events).await?;
        Ok(Flow::Exit(exit))
    }
}

/// A step the executor failed, taken into the outcome as an error.
fn failed(outcome: StepOutcome, action: String, message: String, tokens: u64) -> StepOutcome {
    StepOutcome {
        record: StepRecord {
            action,
            error: Some(message),
            tokens,
            ..outcome.record
        },
        usage: StepUsage::unsplit(tokens, None),
        ..outcome
    }
}

/// A step the executor returned from, before its answer is read: an error
/// until the answer says otherwise.
fn unanswered(
    decision: SessionEvent,
    number: u64,
    started_at: DateTime<Utc>,
    executor_time: Duration,
    sanitized: usize,
) -> StepOutcome {
    StepOutcome {
        decision,
        record: blank_record(number, executor_time.as_millis() as u64),
        percent: None,
        signal: None,
        transcript: None,
        events: Vec::new(),
        cycle_change: None,
        started_at,
        finished_at: Utc::now(),
        sanitized,
        usage: StepUsage::default(),
    }
}

/// A record with nothing in it but its number and time.
fn blank_record(number: u64, duration_ms: u64) -> StepRecord {
    StepRecord {
        number,
        action: String::new(),
        arguments: serde_json::Value::Null,
        outcome: Outcome::Error,
        observation: String::new(),
        message: String::new(),
        error: None,
        tokens: 0,
        tool_calls: 0,
        files_written: Vec::new(),
        waiting: false,
        duration_ms,
        context_overflow: false,
    }
}
