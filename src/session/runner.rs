//! The per-session task: one loop that honours control signals, checks the
//! guardrails and the continue gate, runs a step, commits it, and acts on
//! what the step said, until the session stops, pauses or is handed over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::lease_clock::LeaseClock;
use super::reflector::{Reflector, SessionFacts};
use super::state::{self, AppliedReflection, LoopState, StepEffects};
use crate::config::Config;
use crate::executor::{Executor, ExecutorError, StepContext, StepResult};
use crate::metrics::{IterationTimes, Metrics};
use crate::policy::checklist;
use crate::policy::gate::{self, GateDecision, PauseCause, StopCause};
use crate::policy::guardrails::{self, Usage};
use crate::policy::history::{Outcome, StepRecord};
use crate::policy::lifecycle::{Mode, Reason};
use crate::policy::reflection::{self, Trigger};
use crate::policy::termination::{self, Facts};
use crate::store::{
    ControlFlags, Counters, Lease, NewEvent, NewIteration, NewReflection, SessionSettings, Store,
    StoreError,
};

/// Signals a runner obeys; shared with the supervisor.
#[derive(Debug, Clone)]
pub struct Control {
    /// A user stop: cancel the step in flight and record `interrupted`.
    pub stop: CancellationToken,
    /// Process shutdown: cancel the step, checkpoint, release the lease.
    pub shutdown: CancellationToken,
    /// A user pause: finish the step in flight, then pause.
    pub pause: Arc<AtomicBool>,
    /// Until when this replica may trust its lease.
    pub lease_clock: Arc<LeaseClock>,
}

impl Control {
    /// Fresh signals, with a lease trusted until `lease_clock` says otherwise.
    pub fn new(lease_clock: Arc<LeaseClock>) -> Control {
        Control {
            stop: CancellationToken::new(),
            shutdown: CancellationToken::new(),
            pause: Arc::new(AtomicBool::new(false)),
            lease_clock,
        }
    }
}

/// How a runner ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// The session reached a waiting or final status.
    Finished(Reason),
    /// The process is shutting down; the session was checkpointed and released.
    Released,
    /// Another replica holds the session now; nothing more was written.
    LeaseLost,
    /// Postgres failed; the lease will expire and the session be rescued.
    StoreFailed(String),
}

/// Everything a runner needs to drive one session.
pub struct Runner {
    store: Store,
    config: Arc<Config>,
    lease: Lease,
    goal: String,
    settings: SessionSettings,
    executor: Box<dyn Executor>,
    state: LoopState,
    guidance: Option<String>,
    control: Control,
    reflector: Option<Arc<Reflector>>,
    metrics: Arc<Metrics>,
    /// Running time accumulated before this process picked the session up.
    base_elapsed_ms: u64,
    started: Instant,
    /// The step whose throttle cooldown has been served.
    throttled_step: Option<u64>,
}

/// What happened to the step in flight.
enum StepEnd {
    Done(Result<StepResult, ExecutorError>),
    Stopped,
    Shutdown,
    TimedOut,
}

impl Runner {
    /// Prepares a runner for a session whose lease this replica holds.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        config: Arc<Config>,
        lease: Lease,
        goal: String,
        settings: SessionSettings,
        executor: Box<dyn Executor>,
        state: LoopState,
        guidance: Option<String>,
        control: Control,
        reflector: Option<Arc<Reflector>>,
        metrics: Arc<Metrics>,
    ) -> Runner {
        Runner {
            metrics,
            reflector,
            store,
            config,
            lease,
            goal,
            settings,
            base_elapsed_ms: state.usage.elapsed_ms,
            executor,
            state,
            guidance,
            control,
            started: Instant::now(),
            throttled_step: None,
        }
    }

    /// The session this runner drives.
    pub fn session_id(&self) -> Uuid {
        self.lease.session_id
    }

    /// Runs the loop to its end.
    #[tracing::instrument(name = "session", skip(self), fields(session_id = %self.lease.session_id))]
    pub async fn run(mut self) -> Exit {
        let exit = match self.run_loop().await {
            Ok(exit) => exit,
            Err(StoreError::LeaseLost(_)) => Exit::LeaseLost,
            Err(err) => {
                tracing::error!(error = %err, "session loop stopped on a storage error; the lease will lapse and the session be rescued");
                Exit::StoreFailed(err.to_string())
            }
        };
        tracing::info!(
            ?exit,
            iterations = self.state.usage.iterations,
            "session loop ended"
        );
        exit
    }

    fn elapsed_ms(&self) -> u64 {
        self.base_elapsed_ms + self.started.elapsed().as_millis() as u64
    }

    fn current_usage(&self) -> Usage {
        Usage {
            elapsed_ms: self.elapsed_ms(),
            ..self.state.usage
        }
    }

    async fn run_loop(&mut self) -> Result<Exit, StoreError> {
        loop {
            let loop_started = Instant::now();
            // Time spent waiting for durable writes (checkpoints, the commit).
            let mut writes = Duration::ZERO;
            // 1. Control: stop, shutdown, lost lease, decided ends, pause.
            if self.control.stop.is_cancelled() {
                return self.finish(Reason::UserStop, None, Vec::new()).await;
            }
            if self.control.shutdown.is_cancelled() {
                return self.release().await;
            }
            if !self.control.lease_clock.is_valid() {
                tracing::warn!("lease not renewed in time; handing the session over");
                return Ok(Exit::LeaseLost);
            }
            // 7. Reflection (continuous mode), including the second vote on
            // the agent's done-claim, then 8. the periodic checkpoint.
            if let Some(trigger) = self.reflection_due() {
                if let Some(exit) = self.reflect(trigger).await? {
                    return Ok(exit);
                }
                continue;
            }
            let done = self.state.usage.iterations;
            let interval = u64::from(self.settings.limits.checkpoint_interval.max(1));
            if done > 0
                && done.is_multiple_of(interval)
                && self.state.last_checkpoint_step < done
                && self.state.pending_end.is_none()
            {
                let started = Instant::now();
                self.checkpoint("interval").await?;
                writes += started.elapsed();
            }
            if let Some(end) = self.state.pending_end.clone() {
                return self.finish(end.reason, end.detail, Vec::new()).await;
            }
            if self.state.cycle > self.settings.limits.max_cycles {
                return self.finish(Reason::CycleLimit, None, Vec::new()).await;
            }
            if self.control.pause.load(Ordering::SeqCst) {
                return self.finish(Reason::UserPause, None, Vec::new()).await;
            }

            // 2. Guardrails.
            let usage = self.current_usage();
            let limits = self.settings.limits;
            if let Some(breach) = guardrails::check(&limits, &usage) {
                let event = NewEvent::new(
                    "guardrail_tripped",
                    json!({ "breach": breach, "usage": usage, "limits": limits }),
                );
                return self.finish(breach.reason(), None, vec![event]).await;
            }

            // 3. Continue gate.
            let step = usage.iterations + 1;
            let deltas = self.state.token_deltas();
            let mut inputs = self.state.gate_inputs(&limits, &deltas);
            inputs.budget.time_remaining_ms = Some(guardrails::time_remaining_ms(&limits, &usage));
            inputs.coherence = self.state.reflection.coherence;
            inputs.uncertainty = self.state.reflection.uncertainty;
            let evaluation = gate::evaluate(&self.config.gate, &inputs);
            self.metrics.gate(match evaluation.decision {
                GateDecision::Stop { .. } => "stop",
                GateDecision::Pause { .. } => "pause",
                GateDecision::Throttle => "throttle",
                GateDecision::Checkpoint => "checkpoint",
                GateDecision::Continue => "continue",
            });
            let decision_event = NewEvent::new(
                "gate_decision",
                json!({ "step": step, "decision": evaluation.decision,
                        "metrics": evaluation.metrics, "inputs": inputs }),
            );
            match evaluation.decision {
                GateDecision::Stop { cause } => {
                    let reason = match cause {
                        StopCause::CoherenceLow => Reason::CoherenceLow,
                        StopCause::StepLimit => Reason::StepLimit,
                        StopCause::BudgetExhausted { .. } => Reason::BudgetExhausted,
                    };
                    return self.finish(reason, None, vec![decision_event]).await;
                }
                GateDecision::Pause { cause } => {
                    let reason = match cause {
                        PauseCause::ReworkLoop => Reason::ReworkLoop,
                        PauseCause::Uncertainty => Reason::Uncertainty,
                    };
                    let detail = format!(
                        "rework ratio {:.2} over the last {} steps",
                        evaluation.metrics.rework_ratio, self.config.gate.rework_window
                    );
                    let detail = (reason == Reason::ReworkLoop).then_some(detail);
                    return self.finish(reason, detail, vec![decision_event]).await;
                }
                GateDecision::Throttle if self.throttled_step != Some(step) => {
                    self.throttled_step = Some(step);
                    let flags = self
                        .store
                        .append_fenced(&self.lease, &[decision_event])
                        .await?;
                    self.apply_flags(flags);
                    let remaining =
                        guardrails::time_remaining_ms(&self.settings.limits, &self.current_usage());
                    let cooldown = self
                        .config
                        .throttle_cooldown
                        .min(Duration::from_millis(remaining));
                    // The stop checks keep running during the cooldown.
                    tokio::select! {
                        _ = self.control.stop.cancelled() => {}
                        _ = self.control.shutdown.cancelled() => {}
                        _ = tokio::time::sleep(cooldown) => {}
                    }
                    continue;
                }
                GateDecision::Checkpoint => {
                    let started = Instant::now();
                    self.checkpoint("gate").await?;
                    writes += started.elapsed();
                }
                GateDecision::Throttle | GateDecision::Continue => {}
            }

            // 4. Execute, abandoning the step on stop, shutdown or timeout.
            let remaining = guardrails::time_remaining_ms(&limits, &self.current_usage());
            let started_at = Utc::now();
            let t0 = Instant::now();
            let nudge = self.state.pending_nudge.clone();
            let end = {
                let ctx = StepContext {
                    session_id: self.lease.session_id,
                    goal: &self.goal,
                    iteration: step,
                    guidance: self.guidance.as_deref(),
                    nudge: nudge.as_deref(),
                    history: &self.state.history,
                    token_allowance: guardrails::tokens_remaining(&limits, &self.state.usage),
                };
                tokio::select! {
                    biased;
                    _ = self.control.stop.cancelled() => StepEnd::Stopped,
                    _ = self.control.shutdown.cancelled() => StepEnd::Shutdown,
                    _ = tokio::time::sleep(Duration::from_millis(remaining)) => StepEnd::TimedOut,
                    result = self.executor.execute(ctx) => StepEnd::Done(result),
                }
            };
            let sanitized;
            let abandoned =
                |why: &str| NewEvent::new("step_abandoned", json!({ "step": step, "why": why }));
            let result = match end {
                StepEnd::Stopped => {
                    let events = vec![decision_event, abandoned("user_stop")];
                    return self.finish(Reason::UserStop, None, events).await;
                }
                StepEnd::Shutdown => return self.release().await,
                StepEnd::TimedOut => {
                    let events = vec![decision_event, abandoned("timeout")];
                    return self.finish(Reason::Timeout, None, events).await;
                }
                StepEnd::Done(mut result) => {
                    // Agent output is made storable before anything commits it.
                    sanitized = super::control::make_storable(&mut result);
                    result
                }
            };
            let executor_time = t0.elapsed();
            let duration_ms = executor_time.as_millis() as u64;
            let finished_at = Utc::now();
            let mut cycle_change = None;
            let (record, percent, signal, transcript, executor_events) = match result {
                Ok(StepResult::Exhausted) => {
                    return self
                        .finish(Reason::ExecutorExhausted, None, vec![decision_event])
                        .await;
                }
                Ok(StepResult::Step(out)) => {
                    let out = *out;
                    cycle_change = out.cycle_change;
                    if let Some(latency) = out.model_latency {
                        self.metrics.model_seconds.observe(latency);
                    }
                    (
                        StepRecord {
                            number: step,
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
                            duration_ms,
                            context_overflow: false,
                        },
                        out.percent_complete,
                        out.signal,
                        out.transcript,
                        out.events,
                    )
                }
                Err(ExecutorError::Failed {
                    action,
                    message,
                    tokens,
                }) => (
                    StepRecord {
                        number: step,
                        action,
                        arguments: serde_json::Value::Null,
                        outcome: Outcome::Error,
                        observation: String::new(),
                        message: String::new(),
                        error: Some(message),
                        tokens,
                        tool_calls: 0,
                        files_written: Vec::new(),
                        waiting: false,
                        duration_ms,
                        context_overflow: false,
                    },
                    None,
                    None,
                    None,
                    Vec::new(),
                ),
            };

            // 5. Persist the iteration, its counters and what the policies concluded.
            let elapsed_ms = self.elapsed_ms();
            let mut effects = state::assess(
                &self.state,
                &record,
                signal,
                &self.config.stuck,
                elapsed_ms,
                percent,
            );
            effects.new_cycle = cycle_change.as_ref().map(|c| c.cycle);
            let mut events = vec![decision_event];
            events.extend(
                executor_events
                    .into_iter()
                    .map(|e| NewEvent::new(e.kind, e.data)),
            );
            if sanitized > 0 {
                events.push(NewEvent::new(
                    "agent_output_sanitized",
                    json!({ "step": step, "nul_replaced": sanitized, "with": "\u{fffd}" }),
                ));
            }
            let commit_started = Instant::now();
            let flags = self
                .commit(
                    &record,
                    &effects,
                    events,
                    transcript,
                    cycle_change.map(|c| (i32::try_from(c.cycle).unwrap_or(i32::MAX), c.memory)),
                    (started_at, finished_at),
                )
                .await?;
            writes += commit_started.elapsed();
            self.state.apply(self.state.run, &record, &effects);
            self.guidance = None;
            self.apply_flags(flags);
            self.metrics.iteration(
                record.tokens,
                IterationTimes {
                    total: loop_started.elapsed(),
                    executor: executor_time,
                    writes,
                },
            );
            // 6. Agent signals and stuck verdicts take effect at the top of the loop.
        }
    }

    /// Whether a reflection runs now: continuous mode, a reflector, and the
    /// interval elapsed or the agent claimed the goal is done.
    fn reflection_due(&self) -> Option<Trigger> {
        if self.settings.mode != Mode::Continuous || self.reflector.is_none() {
            return None;
        }
        let claim = self.state.claim_under_review().is_some();
        let iterations = self.state.usage.iterations;
        if !claim && (iterations == 0 || iterations <= self.state.reflection.last_at) {
            return None;
        }
        reflection::due(&self.state.reflection, iterations, claim)
    }

    /// Runs one reflection and applies its verdict; `Some` when the session
    /// was stopped or handed over meanwhile.
    async fn reflect(&mut self, trigger: Trigger) -> Result<Option<Exit>, StoreError> {
        let Some(reflector) = self.reflector.clone() else {
            return Ok(None);
        };
        let usage = self.current_usage();
        let window = usize::try_from(self.state.reflection.interval)
            .unwrap_or(usize::MAX)
            .max(1);
        let recent = &self.state.history[self.state.history.len().saturating_sub(window)..];
        let claim = self
            .state
            .claim_under_review()
            .map(|c| c.detail.clone().unwrap_or_default());
        let facts = SessionFacts {
            goal: &self.goal,
            iterations: usage.iterations,
            elapsed_ms: usage.elapsed_ms,
            tokens: usage.tokens,
            recent,
            trigger,
            claim: claim.as_deref(),
            criteria: &self.state.criteria,
            milestones: &self.state.milestones,
        };
        let allowance = guardrails::tokens_remaining(&self.settings.limits, &usage)
            .min(self.config.models.max_tokens_per_call);
        let answer = tokio::select! {
            biased;
            _ = self.control.stop.cancelled() => None,
            _ = self.control.shutdown.cancelled() => None,
            answer = {
                let called = Instant::now();
                let metrics = self.metrics.clone();
                async move {
                    let answer = reflector.reflect(&facts, allowance).await;
                    metrics.model_seconds.observe(called.elapsed());
                    answer
                }
            } => Some(answer),
        };
        let Some(mut answer) = answer else {
            return if self.control.stop.is_cancelled() {
                self.finish(Reason::UserStop, None, Vec::new())
                    .await
                    .map(Some)
            } else {
                self.release().await.map(Some)
            };
        };
        // Model text is made storable before it reaches the state or a row.
        super::control::make_reflection_storable(&mut answer);
        let base = self.settings.limits.reflection_interval;
        let prior = self.state.reflection;
        let mut criteria = self.state.criteria.clone();
        let mut milestones = self.state.milestones.clone();
        let (verdict, state_after, percent, reasoning) = match &answer.assessment {
            Ok(a) => {
                criteria = checklist::mark(&criteria, &a.criteria_met, usage.iterations);
                milestones = checklist::mark(&milestones, &a.milestones_done, usage.iterations);
                let (v, st) = reflection::decide(
                    &prior,
                    a,
                    &checklist::unmet(&criteria),
                    trigger,
                    base,
                    usage.iterations,
                    answer.tokens,
                );
                (v, st, Some(a.percent_complete), Some(a.reasoning.clone()))
            }
            Err(err) => {
                tracing::warn!(error = %err, "reflection failed; continuing under the fixed limits");
                let (v, st) =
                    reflection::on_failure(&prior, trigger, base, usage.iterations, answer.tokens);
                let reasoning = match &v {
                    reflection::Verdict::Pause { .. } => Some(err.clone()),
                    _ => claim.clone(),
                };
                (v, st, None, reasoning)
            }
        };
        self.metrics.tokens(answer.tokens);
        self.metrics.reflection(match &verdict {
            reflection::Verdict::Complete => "complete",
            reflection::Verdict::Pause { .. } => "pause",
            reflection::Verdict::Reject { .. } => "reject",
            reflection::Verdict::Continue => "continue",
            reflection::Verdict::Monitor => "monitor",
        });
        let applied = AppliedReflection {
            verdict,
            state_after,
            percent_complete: percent,
            reasoning,
            criteria,
            milestones,
        };
        let mut next = self.state.clone();
        next.apply_reflection(&applied);
        let eta = state::eta_seconds(next.percent_complete, usage.elapsed_ms);
        let record = NewReflection {
            number: i32::try_from(state_after.attempts).unwrap_or(i32::MAX),
            after_iteration: usage.iterations as i64,
            trigger: match trigger {
                Trigger::Interval => "interval".into(),
                Trigger::AgentClaimedDone => "agent_claimed_done".into(),
            },
            ok: answer.assessment.is_ok(),
            assessment: answer
                .assessment
                .as_ref()
                .ok()
                .and_then(|a| serde_json::to_value(a).ok()),
            error: answer.assessment.as_ref().err().cloned(),
            decision: serde_json::to_value(&applied).unwrap_or_default(),
            next_interval: i32::try_from(state_after.interval).unwrap_or(i32::MAX),
            tokens: answer.tokens as i64,
            raw: answer.raw.clone(),
        };
        let counters = Counters::from_usage(
            &Usage {
                elapsed_ms: usage.elapsed_ms,
                ..next.usage
            },
            next.reflection.tokens,
        );
        self.store
            .insert_reflection(
                &self.lease,
                &record,
                counters,
                next.percent_complete,
                eta,
                &next.criteria,
                &next.milestones,
            )
            .await?;
        self.state = next;
        Ok(None)
    }

    async fn commit(
        &mut self,
        record: &StepRecord,
        effects: &StepEffects,
        mut events: Vec<NewEvent>,
        transcript: Option<serde_json::Value>,
        next_cycle: Option<(i32, String)>,
        (started_at, finished_at): (chrono::DateTime<Utc>, chrono::DateTime<Utc>),
    ) -> Result<ControlFlags, StoreError> {
        let usage = state::usage_after(&self.state.usage, record, effects.elapsed_ms);
        events.push(NewEvent::new(
            "iteration_completed",
            json!({
                "number": record.number,
                "action": record.action,
                "outcome": record.outcome,
                "tokens": record.tokens,
                "duration_ms": record.duration_ms,
                "rework": effects.rework,
                "tokens_used": usage.tokens,
                "percent_complete": effects.percent_complete,
            }),
        ));
        if let Some(finding) = &effects.stuck {
            events.push(NewEvent::new(
                "stuck_detected",
                json!({ "step": record.number, "pattern": finding.pattern, "verdict": finding.verdict,
                        "description": finding.pattern.describe() }),
            ));
        }
        if let Some(signal) = &effects.signal {
            events.push(NewEvent::new(
                "agent_signal",
                json!({ "step": record.number, "signal": signal }),
            ));
        }
        let iteration = NewIteration {
            number: record.number as i64,
            run: self.state.run,
            action: record.action.clone(),
            outcome: match record.outcome {
                Outcome::Success => "success",
                Outcome::Failure => "failure",
                Outcome::Error => "error",
            },
            // Saturates: an agent may report u64::MAX tokens.
            tokens: i64::try_from(record.tokens).unwrap_or(i64::MAX),
            duration_ms: record.duration_ms as i64,
            record: serde_json::to_value(record).unwrap_or_default(),
            effects: serde_json::to_value(effects).unwrap_or_default(),
            transcript,
            cycle: i32::try_from(self.state.cycle).unwrap_or(i32::MAX),
            next_cycle,
            started_at,
            finished_at,
        };
        let eta = state::eta_seconds(effects.percent_complete, effects.elapsed_ms);
        self.store
            .commit_iteration(
                &self.lease,
                iteration,
                Counters::from_usage(&usage, self.state.reflection.tokens),
                (effects.percent_complete, eta),
                events,
            )
            .await
    }

    /// Takes in what Postgres says now: new settings, and stop or pause
    /// requests that reached another replica.
    fn apply_flags(&mut self, flags: ControlFlags) {
        if flags.settings != self.settings {
            tracing::info!(?flags.settings, "settings changed");
            self.settings = flags.settings;
        }
        if flags.stop_requested {
            self.control.stop.cancel();
        }
        if flags.pause_requested {
            self.control.pause.store(true, Ordering::SeqCst);
        }
    }

    fn snapshot(&self) -> serde_json::Value {
        let mut state = self.state.clone();
        state.usage.elapsed_ms = self.elapsed_ms();
        serde_json::to_value(&state).unwrap_or_default()
    }

    async fn checkpoint(&mut self, why: &str) -> Result<(), StoreError> {
        let n = self.state.usage.iterations;
        self.state.last_checkpoint_step = n;
        let snapshot = self.snapshot();
        self.store
            .save_checkpoint(&self.lease, n as i64, why, &snapshot)
            .await
    }

    /// Ends the session for `reason`; a stop requested meanwhile wins over
    /// a pause (the store checks the flag under the row lock it writes with).
    async fn finish(
        &mut self,
        reason: Reason,
        detail: Option<String>,
        events: Vec<NewEvent>,
    ) -> Result<Exit, StoreError> {
        match self.finish_once(reason, detail, events.clone()).await {
            Err(StoreError::StopPending(_)) => {
                self.control.stop.cancel();
                self.finish_once(Reason::UserStop, None, events).await
            }
            other => other,
        }
    }

    async fn finish_once(
        &mut self,
        reason: Reason,
        detail: Option<String>,
        mut events: Vec<NewEvent>,
    ) -> Result<Exit, StoreError> {
        let usage = self.current_usage();
        self.state.usage = usage;
        self.state.last_checkpoint_step = usage.iterations;
        let record = termination::record(
            reason,
            Facts {
                usage: &usage,
                limits: &self.settings.limits,
                detail: detail.as_deref(),
            },
        );
        events.push(NewEvent::new(
            "status_changed",
            json!({
                "from": "running",
                "to": record.status,
                "reason": record.reason,
                "summary": record.summary,
                "next_steps": record.next_steps,
                "iterations": usage.iterations,
                "tokens_used": usage.tokens,
                "checkpoint_saved": true,
            }),
        ));
        let snapshot = self.snapshot();
        self.store
            .finish(
                &self.lease,
                &record,
                detail.as_deref(),
                Counters::from_usage(&usage, self.state.reflection.tokens),
                (usage.iterations as i64, &snapshot),
                &events,
            )
            .await?;
        self.metrics.termination(reason.as_str());
        Ok(Exit::Finished(reason))
    }

    async fn release(&mut self) -> Result<Exit, StoreError> {
        let usage = self.current_usage();
        self.state.usage = usage;
        self.state.last_checkpoint_step = usage.iterations;
        let snapshot = self.snapshot();
        self.store
            .release(
                &self.lease,
                Counters::from_usage(&usage, self.state.reflection.tokens),
                (usage.iterations as i64, &snapshot),
            )
            .await?;
        Ok(Exit::Released)
    }
}
