//! The per-session task: one loop that honours control signals, checks the
//! guardrails and the continue gate, runs a step, commits it, and acts on
//! what the step said, until the session stops, pauses or is handed over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::events::{self, to_stored, to_stored_text};
use super::lease_clock::LeaseClock;
use super::live::{CommittedStep, LiveView, StepInFlight};
use super::loop_store::{LoopStore, ReflectionCommit};
use super::reflector::{Reflector, SessionFacts};
use super::state::{self, AppliedReflection, LoopState, StepEffects};
use crate::config::Config;
use crate::event::{AbandonedBecause, SessionEvent};
use crate::executor::{CycleChange, Executor, ExecutorError, StepContext, StepResult};
use crate::llm::Message;
use crate::metrics::{IterationTimes, Metrics};
use crate::policy::budget;
use crate::policy::checklist;
use crate::policy::eta;
use crate::policy::gate::{self, GateDecision, PauseCause, StopCause};
use crate::policy::guardrails::{self, Usage};
use crate::policy::history::{Outcome, StepRecord};
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::reflection::{self, Trigger};
use crate::policy::sentinel::Sentinel;
use crate::policy::termination::{self, Facts};
use crate::store::{
    ControlFlags, Counters, Lease, NewIteration, NewReflection, SessionSettings, Store, StoreError,
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

/// What a runner is built from.
pub struct RunnerDeps<S = Store> {
    /// Where the loop writes.
    pub store: S,
    /// Process configuration (gate, stuck detection, models).
    pub config: Arc<Config>,
    /// The lease this replica holds on the session.
    pub lease: Lease,
    /// The goal being run.
    pub goal: String,
    /// Mode and limits in force.
    pub settings: SessionSettings,
    /// Performs the steps.
    pub executor: Box<dyn Executor>,
    /// The state rebuilt from the session's log.
    pub state: LoopState,
    /// Guidance for the next step, from a resume.
    pub guidance: Option<String>,
    /// The signals to obey.
    pub control: Control,
    /// The reflection model, when one is configured.
    pub reflector: Option<Arc<Reflector>>,
    /// The session's tenant, whose rate limit its reflections spend.
    pub tenant: String,
    /// The per-tenant limit of calls on the server's own model.
    pub model_calls: Arc<crate::ratelimit::TenantLimiter>,
    /// Process metrics.
    pub metrics: Arc<Metrics>,
    /// The status this replica serves from memory, kept to what is committed.
    pub view: Arc<LiveView>,
}

/// Everything a runner needs to drive one session.
pub struct Runner<S = Store> {
    store: S,
    config: Arc<Config>,
    lease: Lease,
    goal: String,
    settings: SessionSettings,
    executor: Box<dyn Executor>,
    state: LoopState,
    guidance: Option<String>,
    control: Control,
    reflector: Option<Arc<Reflector>>,
    tenant: String,
    model_calls: Arc<crate::ratelimit::TenantLimiter>,
    /// A due reflection waits for the tenant's rate limit (its event is logged).
    reflection_deferred: bool,
    metrics: Arc<Metrics>,
    view: Arc<LiveView>,
    /// Running time accumulated before this process picked the session up.
    base_elapsed_ms: u64,
    started: Instant,
    /// The step whose throttle cooldown has been served.
    throttled_step: Option<u64>,
}

/// What a step of the loop tells the loop.
enum Flow<T = ()> {
    /// Go on to the next step with this.
    Go(T),
    /// Start the next pass from the top.
    Again,
    /// The loop is over.
    Exit(Exit),
}

/// Runs a step and acts on its [`Flow`] inside the loop.
macro_rules! step {
    ($flow:expr) => {
        match $flow? {
            Flow::Go(value) => value,
            Flow::Again => continue,
            Flow::Exit(exit) => return Ok(exit),
        }
    };
}

/// Timing of one pass, for the iteration metrics.
struct Pass {
    started: Instant,
    /// Time spent waiting for durable writes (checkpoints, the commit).
    writes: Duration,
}

/// The gate let a step run: its number and the decision to log with it.
struct Gated {
    step: u64,
    decision: SessionEvent,
}

/// A step the executor finished, ready to commit.
struct Executed {
    decision: SessionEvent,
    record: StepRecord,
    percent: Option<f64>,
    signal: Option<Sentinel>,
    transcript: Option<Vec<Message>>,
    events: Vec<SessionEvent>,
    cycle_change: Option<CycleChange>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    executor_time: Duration,
    /// NUL characters replaced in the executor's answer.
    sanitized: usize,
    /// The tokens the step was allowed.
    allowance: u64,
}

/// What happened to the step in flight.
enum StepEnd {
    Done(Result<StepResult, ExecutorError>),
    Stopped,
    Shutdown,
    TimedOut,
}

impl<S: LoopStore> Runner<S> {
    /// Prepares a runner for a session whose lease this replica holds.
    pub fn new(deps: RunnerDeps<S>) -> Runner<S> {
        Runner {
            base_elapsed_ms: deps.state.usage.elapsed_ms,
            store: deps.store,
            config: deps.config,
            lease: deps.lease,
            goal: deps.goal,
            settings: deps.settings,
            executor: deps.executor,
            state: deps.state,
            guidance: deps.guidance,
            control: deps.control,
            reflector: deps.reflector,
            tenant: deps.tenant,
            model_calls: deps.model_calls,
            reflection_deferred: false,
            metrics: deps.metrics,
            view: deps.view,
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

    /// One pass per step. What a step concluded (agent signals, stuck
    /// verdicts, reflections, checkpoints due) takes effect at the top of the
    /// next pass, after the control signals.
    async fn run_loop(&mut self) -> Result<Exit, StoreError> {
        loop {
            let mut pass = Pass {
                started: Instant::now(),
                writes: Duration::ZERO,
            };
            step!(self.control().await);
            step!(self.reflect_if_due().await);
            self.checkpoint_if_due(&mut pass).await?;
            step!(self.settled().await);
            let usage = step!(self.guardrails().await);
            let gated = step!(self.gate(&usage, &mut pass).await);
            let executed = step!(self.execute(gated).await);
            let overspent = budget::overspent(executed.record.tokens, executed.allowance);
            let number = executed.record.number;
            self.commit(executed, &mut pass).await?;
            if let Some(overspent) = overspent {
                return self.overspent(number, overspent).await;
            }
        }
    }

    /// Control: a user stop, a shutdown, a lease this replica can no longer trust.
    async fn control(&mut self) -> Result<Flow, StoreError> {
        if self.control.stop.is_cancelled() {
            return Ok(Flow::Exit(
                self.finish(Reason::UserStop, None, Vec::new()).await?,
            ));
        }
        if self.control.shutdown.is_cancelled() {
            return Ok(Flow::Exit(self.release().await?));
        }
        if !self.control.lease_clock.is_valid() {
            tracing::warn!("lease not renewed in time; handing the session over");
            return Ok(Flow::Exit(Exit::LeaseLost));
        }
        Ok(Flow::Go(()))
    }

    /// Signals: a reflection due in continuous mode (including the second
    /// vote on the agent's done-claim); the pass starts over after it.
    async fn reflect_if_due(&mut self) -> Result<Flow, StoreError> {
        let Some(trigger) = self.reflection_due() else {
            return Ok(Flow::Go(()));
        };
        if self.reflector.is_some() && self.reflection_deferred_by_rate_limit().await? {
            return Ok(Flow::Go(()));
        }
        // Boxed: a reflection's model call is the largest await there is.
        Ok(match Box::pin(self.reflect(trigger)).await? {
            Some(exit) => Flow::Exit(exit),
            None => Flow::Again,
        })
    }

    /// The server's model is the operator's: a tenant over its rate limit
    /// defers a due reflection to the next step (the loop goes on under its
    /// guardrails) rather than failing the session. True when deferred; the
    /// event is logged once per wait.
    async fn reflection_deferred_by_rate_limit(&mut self) -> Result<bool, StoreError> {
        let Err(limited) = self.model_calls.admit(&self.tenant) else {
            self.reflection_deferred = false;
            self.metrics.model_call(&self.tenant, true);
            return Ok(false);
        };
        self.metrics.model_call(&self.tenant, false);
        if !self.reflection_deferred {
            self.reflection_deferred = true;
            tracing::info!(tenant = %self.tenant, "reflection deferred by the tenant's model-call rate limit");
            let events = events::encode(&[SessionEvent::ReflectionDeferred {
                number: u64::from(self.state.reflection.count) + 1,
                reason: "tenant_model_rate_limit".into(),
                retry_after_ms: u64::try_from(limited.retry_after.as_millis()).unwrap_or(u64::MAX),
            }])?;
            let flags = Box::pin(self.store.append_fenced(&self.lease, &events)).await?;
            self.view.appended(&flags);
            self.apply_flags(flags);
        }
        Ok(true)
    }

    /// Checkpoint: every `checkpoint_interval` committed steps, unless the run is ending.
    async fn checkpoint_if_due(&mut self, pass: &mut Pass) -> Result<(), StoreError> {
        let done = self.state.usage.iterations;
        let interval = u64::from(self.settings.limits.checkpoint_interval.max(1));
        if done > 0
            && done.is_multiple_of(interval)
            && self.state.last_checkpoint_step < done
            && self.state.pending_end.is_none()
        {
            let started = Instant::now();
            self.checkpoint("interval").await?;
            pass.writes += started.elapsed();
        }
        Ok(())
    }

    /// Ends already decided: an agent signal or stuck verdict, the cycle
    /// limit, a user pause.
    async fn settled(&mut self) -> Result<Flow, StoreError> {
        let end = if let Some(end) = self.state.pending_end.clone() {
            Some((end.reason, end.detail))
        } else if self.state.cycle > self.settings.limits.max_cycles {
            Some((Reason::CycleLimit, None))
        } else if self.control.pause.load(Ordering::SeqCst) {
            Some((Reason::UserPause, None))
        } else {
            None
        };
        Ok(match end {
            Some((reason, detail)) => Flow::Exit(self.finish(reason, detail, Vec::new()).await?),
            None => Flow::Go(()),
        })
    }

    /// Guardrails: a limit reached ends the run.
    async fn guardrails(&mut self) -> Result<Flow<Usage>, StoreError> {
        let usage = self.current_usage();
        let limits = self.settings.limits;
        let Some(breach) = guardrails::check(&limits, &usage) else {
            return Ok(Flow::Go(usage));
        };
        let event = SessionEvent::GuardrailTripped {
            breach,
            usage,
            limits,
        };
        let exit = self.finish(breach.reason(), None, vec![event]).await?;
        Ok(Flow::Exit(exit))
    }

    /// A step reported more tokens than it was allowed: it is committed as
    /// reported (the tokens were spent), and the budget is over, whatever
    /// else the step said.
    async fn overspent(
        &mut self,
        number: u64,
        overspent: budget::Overspent,
    ) -> Result<Exit, StoreError> {
        let event = SessionEvent::GuardrailTripped {
            breach: guardrails::Breach::CostLimit,
            usage: self.current_usage(),
            limits: self.settings.limits,
        };
        let detail = Some(overspent.describe(number));
        self.finish(Reason::CostLimit, detail, vec![event]).await
    }

    /// Gate: stop, pause, throttle (a cooldown, then a new pass), checkpoint
    /// or continue.
    async fn gate(&mut self, usage: &Usage, pass: &mut Pass) -> Result<Flow<Gated>, StoreError> {
        let step = usage.iterations + 1;
        let limits = self.settings.limits;
        let deltas = self.state.token_deltas();
        let mut inputs = self.state.gate_inputs(self.settings.mode, &limits, &deltas);
        inputs.budget.time_remaining_ms = Some(guardrails::time_remaining_ms(&limits, usage));
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
        let decision = SessionEvent::GateDecision {
            step,
            decision: evaluation.decision,
            metrics: evaluation.metrics,
            inputs: to_stored("gate inputs", &inputs)?,
        };
        match evaluation.decision {
            GateDecision::Stop { cause } => {
                let reason = match cause {
                    StopCause::CoherenceLow => Reason::CoherenceLow,
                    StopCause::StepLimit => Reason::StepLimit,
                    StopCause::BudgetExhausted { .. } => Reason::BudgetExhausted,
                };
                let exit = self.finish(reason, None, vec![decision]).await?;
                return Ok(Flow::Exit(exit));
            }
            GateDecision::Pause { cause } => {
                let reason = match cause {
                    PauseCause::ReworkLoop => Reason::ReworkLoop,
                    PauseCause::Uncertainty => Reason::Uncertainty,
                    PauseCause::ProjectedOverrun | PauseCause::NextStepOverrun => {
                        Reason::BudgetProjectedOverrun
                    }
                    PauseCause::ReviewRequired => Reason::ReviewRequired,
                };
                let detail = match reason {
                    Reason::ReworkLoop => Some(format!(
                        "rework ratio {:.2} over the last {} steps",
                        evaluation.metrics.rework_ratio, self.config.gate.rework_window
                    )),
                    Reason::BudgetProjectedOverrun if cause == PauseCause::NextStepOverrun => Some(
                        budget::ProjectedOverrun {
                            projected: evaluation.metrics.next_step_tokens,
                            allowance: inputs.budget.tokens_remaining.unwrap_or(0),
                        }
                        .describe(),
                    ),
                    Reason::BudgetProjectedOverrun => {
                        evaluation.metrics.projection.map(|p| p.describe())
                    }
                    Reason::ReviewRequired => Some(termination::review_summary(
                        evaluation.metrics.steps_since_start,
                        &self.state.history,
                    )),
                    _ => None,
                };
                let exit = self.finish(reason, detail, vec![decision]).await?;
                return Ok(Flow::Exit(exit));
            }
            GateDecision::Throttle if self.throttled_step != Some(step) => {
                self.throttled_step = Some(step);
                self.throttle(decision).await?;
                return Ok(Flow::Again);
            }
            GateDecision::Checkpoint => {
                let started = Instant::now();
                self.checkpoint("gate").await?;
                pass.writes += started.elapsed();
            }
            GateDecision::Throttle | GateDecision::Continue => {}
        }
        Ok(Flow::Go(Gated { step, decision }))
    }

    /// Logs a throttle decision and waits out the cooldown; the stop checks
    /// keep running during it.
    async fn throttle(&mut self, decision: SessionEvent) -> Result<(), StoreError> {
        let events = events::encode(&[decision])?;
        let flags = Box::pin(self.store.append_fenced(&self.lease, &events)).await?;
        self.view.appended(&flags);
        self.apply_flags(flags);
        let remaining = guardrails::time_remaining_ms(&self.settings.limits, &self.current_usage());
        let cooldown = self
            .config
            .throttle_cooldown
            .min(Duration::from_millis(remaining));
        tokio::select! {
            _ = self.control.stop.cancelled() => {}
            _ = self.control.shutdown.cancelled() => {}
            _ = tokio::time::sleep(cooldown) => {}
        }
        Ok(())
    }

    /// Execute: runs the step, abandoning it on stop, shutdown or timeout.
    async fn execute(&mut self, gated: Gated) -> Result<Flow<Executed>, StoreError> {
        let Gated { step, decision } = gated;
        let limits = self.settings.limits;
        let remaining = guardrails::time_remaining_ms(&limits, &self.current_usage());
        let started_at = Utc::now();
        let t0 = Instant::now();
        // Memory only, never Postgres: the status shows the step in flight.
        self.view.step_started(StepInFlight {
            iteration: step,
            action: None,
            started_at,
            session_elapsed_ms: self.elapsed_ms(),
            median_step_ms: eta::median(self.state.history.iter().map(|s| s.duration_ms)),
        });
        let nudge = self.state.pending_nudge.clone();
        let allowance = budget::allowance(limits.max_tokens, self.state.usage.tokens);
        let end = {
            let ctx = StepContext {
                session_id: self.lease.session_id,
                goal: &self.goal,
                iteration: step,
                guidance: self.guidance.as_deref(),
                nudge: nudge.as_deref(),
                history: &self.state.history,
                token_allowance: allowance,
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
        let abandoned = |why| SessionEvent::StepAbandoned { step, why };
        let result = match end {
            StepEnd::Stopped => {
                let events = vec![decision, abandoned(AbandonedBecause::UserStop)];
                return Ok(Flow::Exit(
                    self.finish(Reason::UserStop, None, events).await?,
                ));
            }
            StepEnd::Shutdown => return Ok(Flow::Exit(self.release().await?)),
            StepEnd::TimedOut => {
                let events = vec![decision, abandoned(AbandonedBecause::Timeout)];
                return Ok(Flow::Exit(
                    self.finish(Reason::Timeout, None, events).await?,
                ));
            }
            StepEnd::Done(mut result) => {
                // Agent output is made storable before anything commits it.
                sanitized = super::control::make_storable(&mut result);
                // ...and held to the output cap: stored, kept and sent on
                // in bounded size, whatever the agent answered.
                let dropped =
                    super::control::cap_output(&mut result, self.config.quotas.max_output_bytes);
                if dropped > 0 {
                    tracing::info!(step, dropped, "agent output over the cap; the rest dropped");
                }
                result
            }
        };
        let executor_time = t0.elapsed();
        let duration_ms = executor_time.as_millis() as u64;
        let mut executed = Executed {
            decision,
            record: StepRecord {
                number: step,
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
            },
            percent: None,
            signal: None,
            transcript: None,
            events: Vec::new(),
            cycle_change: None,
            started_at,
            finished_at: Utc::now(),
            executor_time,
            sanitized,
            allowance,
        };
        match result {
            Ok(StepResult::Exhausted) => {
                let events = vec![executed.decision];
                let exit = self.finish(Reason::ExecutorExhausted, None, events).await?;
                return Ok(Flow::Exit(exit));
            }
            Ok(StepResult::OverBudget { needed, allowance }) => {
                // Not an error of the agent's: the budget cannot pay for
                // the step at all, so it ends as a budget stop.
                let events = vec![
                    executed.decision,
                    SessionEvent::GuardrailTripped {
                        breach: guardrails::Breach::CostLimit,
                        usage: self.current_usage(),
                        limits,
                    },
                ];
                let detail = format!(
                    "step {step} needs about {needed} tokens before any answer, more than the {allowance} left of the budget"
                );
                let exit = self.finish(Reason::CostLimit, Some(detail), events).await?;
                return Ok(Flow::Exit(exit));
            }
            Ok(StepResult::NoWorker { detail }) => {
                let events = vec![executed.decision];
                let exit = self.finish(Reason::NoWorker, Some(detail), events).await?;
                return Ok(Flow::Exit(exit));
            }
            Ok(StepResult::Abandoned) => {
                let events = vec![
                    executed.decision,
                    SessionEvent::StepAbandoned {
                        step,
                        why: AbandonedBecause::UserPause,
                    },
                ];
                let exit = self.finish(Reason::UserPause, None, events).await?;
                return Ok(Flow::Exit(exit));
            }
            Ok(StepResult::Step(out)) => {
                let out = *out;
                if let Some(latency) = out.model_latency {
                    self.metrics.model_seconds.observe(latency);
                }
                executed.record = StepRecord {
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
                    ..executed.record
                };
                executed.percent = out.percent_complete;
                executed.signal = out.signal;
                executed.transcript = out.transcript;
                executed.events = out.events;
                executed.cycle_change = out.cycle_change;
            }
            Err(ExecutorError::Failed {
                action,
                message,
                tokens,
            }) => {
                executed.record = StepRecord {
                    action,
                    error: Some(message),
                    tokens,
                    ..executed.record
                };
            }
        }
        self.view.step_returned(&executed.record.action);
        Ok(Flow::Go(executed))
    }

    /// Commit: persists the iteration, its counters and what the policies
    /// concluded, then takes in the durable flags.
    async fn commit(&mut self, executed: Executed, pass: &mut Pass) -> Result<(), StoreError> {
        let Executed {
            decision,
            record,
            percent,
            signal,
            transcript,
            events: executor_events,
            cycle_change,
            started_at,
            finished_at,
            executor_time,
            sanitized,
            allowance: _,
        } = executed;
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
        let usage = state::usage_after(&self.state.usage, &record, effects.elapsed_ms);
        let mut events = Vec::with_capacity(executor_events.len() + 4);
        events.push(decision);
        events.extend(executor_events);
        events.extend(step_events(&record, &effects, &usage));
        if sanitized > 0 {
            events.push(SessionEvent::AgentOutputSanitized {
                step: record.number,
                nul_replaced: sanitized,
                with: "\u{fffd}".into(),
            });
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
            record: to_stored_text("iteration record", &record)?,
            effects: to_stored_text("iteration effects", &effects)?,
            transcript: transcript
                .map(|t| to_stored_text("transcript", &t))
                .transpose()?,
            cycle: i32::try_from(self.state.cycle).unwrap_or(i32::MAX),
            next_cycle: cycle_change
                .map(|c| (i32::try_from(c.cycle).unwrap_or(i32::MAX), c.memory)),
            checkpoint: None,
            started_at,
            finished_at,
        };
        // The interval checkpoint is folded into this commit (one flush, not
        // two): a snapshot of the state as it will be once the step applies.
        // Not when the step ends the run: the end writes its own checkpoint.
        let mut next = None;
        let mut iteration = iteration;
        let interval = u64::from(self.settings.limits.checkpoint_interval.max(1));
        if usage.iterations.is_multiple_of(interval)
            && self.state.last_checkpoint_step < usage.iterations
        {
            let mut after = self.state.clone();
            after.apply(self.state.run, &record, &effects);
            if after.pending_end.is_none() {
                after.last_checkpoint_step = usage.iterations;
                // The snapshot differs from `after` only in its clock: set
                // it for the serialization instead of copying the state.
                let step_elapsed_ms = after.usage.elapsed_ms;
                after.usage.elapsed_ms = self.elapsed_ms();
                let snapshot = to_stored_text("checkpoint state", &after);
                after.usage.elapsed_ms = step_elapsed_ms;
                iteration.checkpoint = Some(snapshot?);
                events.push(SessionEvent::CheckpointSaved {
                    iteration: usage.iterations as i64,
                    reason: "interval".into(),
                });
                next = Some(after);
            }
        }
        let eta = state::eta_seconds(effects.percent_complete, effects.elapsed_ms);
        let events = events::encode(&events)?;
        let counters = Counters::from_usage(&usage, self.state.reflection.tokens);
        let next_cycle = iteration.next_cycle.clone();
        let checkpointed = iteration.checkpoint.is_some().then_some(iteration.number);
        let commit_started = Instant::now();
        self.view.committing();
        // Boxed too (one allocation per step, against a task kept a few KB
        // smaller for as long as the session waits on its steps).
        let flags = Box::pin(self.store.commit_iteration(
            &self.lease,
            iteration,
            counters,
            (effects.percent_complete, eta),
            events,
        ))
        .await?;
        pass.writes += commit_started.elapsed();
        // Committed: now the status served from memory may show it.
        let percent = effects.percent_complete;
        self.view.committed(CommittedStep {
            flags: &flags,
            finished_at,
            apply: &|r| {
                r.counters = counters;
                r.percent_complete = percent;
                r.eta_seconds = eta;
                r.guidance = None;
                if let Some((cycle, memory)) = &next_cycle {
                    r.cycle = *cycle;
                    r.memory.clone_from(memory);
                }
                if let Some(n) = checkpointed {
                    r.last_checkpoint_iteration = n;
                }
            },
        });
        match next {
            Some(after) => self.state = after,
            None => self.state.apply(self.state.run, &record, &effects),
        }
        self.guidance = None;
        self.apply_flags(flags);
        self.metrics.iteration(
            record.tokens,
            IterationTimes {
                total: pass.started.elapsed(),
                executor: executor_time,
                writes: pass.writes,
            },
        );
        Ok(())
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
                .map(|a| to_stored("reflection assessment", a))
                .transpose()?,
            error: answer.assessment.as_ref().err().cloned(),
            decision: to_stored("reflection decision", &applied)?,
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
                ReflectionCommit {
                    record: &record,
                    counters,
                    percent_complete: next.percent_complete,
                    eta_seconds: eta,
                    criteria: &next.criteria,
                    milestones: &next.milestones,
                },
            )
            .await?;
        self.view.invalidate();
        self.state = next;
        Ok(None)
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

    fn snapshot(&self) -> Result<serde_json::Value, StoreError> {
        let mut state = self.state.clone();
        state.usage.elapsed_ms = self.elapsed_ms();
        to_stored("checkpoint state", &state)
    }

    async fn checkpoint(&mut self, why: &str) -> Result<(), StoreError> {
        let n = self.state.usage.iterations;
        self.state.last_checkpoint_step = n;
        let snapshot = self.snapshot()?;
        // Boxed, as every write off the per-step path: an async fn's state
        // holds room for its largest awaits, and a runner's task lives as
        // long as its session (this and the other boxes in this file took
        // a runner's future from 23.5 KB to 6 KB).
        Box::pin(
            self.store
                .save_checkpoint(&self.lease, n as i64, why, &snapshot),
        )
        .await?;
        self.view.invalidate();
        Ok(())
    }

    /// Ends the session for `reason`; a stop requested meanwhile wins over
    /// a pause (the store checks the flag under the row lock it writes with).
    async fn finish(
        &mut self,
        reason: Reason,
        detail: Option<String>,
        events: Vec<SessionEvent>,
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
        mut events: Vec<SessionEvent>,
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
        events.push(SessionEvent::run_ended(Status::Running, &record, &usage));
        let events = events::encode(&events)?;
        let snapshot = self.snapshot()?;
        // Before the end commits: from then on only Postgres knows the status.
        self.view.close();
        Box::pin(self.store.finish(
            &self.lease,
            &record,
            detail.as_deref(),
            Counters::from_usage(&usage, self.state.reflection.tokens),
            (usage.iterations as i64, &snapshot),
            &events,
        ))
        .await?;
        self.metrics.termination(reason.as_str());
        Ok(Exit::Finished(reason))
    }

    async fn release(&mut self) -> Result<Exit, StoreError> {
        let usage = self.current_usage();
        self.state.usage = usage;
        self.state.last_checkpoint_step = usage.iterations;
        let snapshot = self.snapshot()?;
        self.view.close();
        Box::pin(self.store.release(
            &self.lease,
            Counters::from_usage(&usage, self.state.reflection.tokens),
            (usage.iterations as i64, &snapshot),
        ))
        .await?;
        Ok(Exit::Released)
    }
}

/// The events a committed step adds to the log after the executor's own.
fn step_events(record: &StepRecord, effects: &StepEffects, usage: &Usage) -> Vec<SessionEvent> {
    let mut events = vec![SessionEvent::IterationCompleted {
        number: record.number,
        action: record.action.clone(),
        outcome: record.outcome,
        tokens: record.tokens,
        duration_ms: record.duration_ms,
        rework: effects.rework.clone(),
        tokens_used: usage.tokens,
        percent_complete: effects.percent_complete,
    }];
    if let Some(finding) = &effects.stuck {
        events.push(SessionEvent::StuckDetected {
            step: record.number,
            pattern: finding.pattern.clone(),
            verdict: finding.verdict.clone(),
            description: finding.pattern.describe(),
        });
    }
    if let Some(signal) = &effects.signal {
        events.push(SessionEvent::AgentSignal {
            step: record.number,
            signal: signal.clone(),
        });
    }
    events
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use futures::FutureExt;
    use futures::future::BoxFuture;
    use serde_json::Value;

    use super::*;
    use crate::executor::StepOutput;
    use crate::policy::guardrails::Limits;
    use crate::policy::termination::Termination;
    use crate::store::NewEvent;

    /// What the loop wrote, in order.
    #[derive(Default)]
    struct Written {
        events: Vec<NewEvent>,
        commits: Vec<NewIteration>,
        checkpoints: Vec<(i64, String)>,
        finished: Option<Termination>,
        released: bool,
        fail_commits: bool,
    }

    /// The loop's storage, in memory.
    #[derive(Clone)]
    struct FakeStore {
        written: Arc<Mutex<Written>>,
        settings: SessionSettings,
    }

    impl FakeStore {
        fn new(settings: SessionSettings) -> FakeStore {
            FakeStore {
                written: Arc::default(),
                settings,
            }
        }

        fn written(&self) -> std::sync::MutexGuard<'_, Written> {
            self.written.lock().unwrap()
        }

        fn flags(&self) -> ControlFlags {
            ControlFlags {
                stop_requested: false,
                pause_requested: false,
                settings: self.settings,
                last_event_seq: 0,
                updated_at: Utc::now(),
            }
        }

        fn kinds(&self) -> Vec<&'static str> {
            self.written().events.iter().map(|e| e.kind).collect()
        }
    }

    impl LoopStore for FakeStore {
        async fn append_fenced(
            &self,
            _lease: &Lease,
            events: &[NewEvent],
        ) -> Result<ControlFlags, StoreError> {
            self.written().events.extend_from_slice(events);
            Ok(self.flags())
        }

        async fn commit_iteration(
            &self,
            lease: &Lease,
            iteration: NewIteration,
            _counters: Counters,
            _progress: (Option<f64>, Option<f64>),
            events: Vec<NewEvent>,
        ) -> Result<ControlFlags, StoreError> {
            let mut written = self.written();
            if written.fail_commits {
                return Err(StoreError::LeaseLost(lease.session_id));
            }
            if iteration.checkpoint.is_some() {
                written
                    .checkpoints
                    .push((iteration.number, "interval".to_string()));
            }
            written.commits.push(iteration);
            written.events.extend(events);
            Ok(self.flags())
        }

        async fn insert_reflection(
            &self,
            _lease: &Lease,
            _reflection: ReflectionCommit<'_>,
        ) -> Result<(), StoreError> {
            Ok(())
        }

        async fn save_checkpoint(
            &self,
            _lease: &Lease,
            iteration: i64,
            reason: &str,
            state: &Value,
        ) -> Result<(), StoreError> {
            assert!(state.is_object(), "a checkpoint is never null");
            self.written()
                .checkpoints
                .push((iteration, reason.to_string()));
            Ok(())
        }

        async fn finish(
            &self,
            _lease: &Lease,
            termination: &Termination,
            _detail: Option<&str>,
            _counters: Counters,
            _checkpoint: (i64, &Value),
            events: &[NewEvent],
        ) -> Result<(), StoreError> {
            let mut written = self.written();
            written.finished = Some(termination.clone());
            written.events.extend_from_slice(events);
            Ok(())
        }

        async fn release(
            &self,
            _lease: &Lease,
            _counters: Counters,
            _checkpoint: (i64, &Value),
        ) -> Result<(), StoreError> {
            self.written().released = true;
            Ok(())
        }
    }

    /// Succeeds with a new action every step and counts its calls.
    struct Counting(Arc<AtomicUsize>);

    impl Executor for Counting {
        fn execute<'a>(
            &'a mut self,
            ctx: StepContext<'a>,
        ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            // A new action, message and file every step, so stuck detection stays quiet.
            let out = StepOutput {
                tokens: 10,
                files_written: vec![crate::policy::history::FileWrite {
                    path: format!("part_{}.md", ctx.iteration),
                    digest: format!("{:x}", ctx.iteration),
                }],
                ..StepOutput::simple(
                    format!("action_{}", ctx.iteration),
                    format!("wrote part {}", ctx.iteration),
                )
            };
            async move { Ok(StepResult::Step(Box::new(out))) }.boxed()
        }
    }

    fn limits(max_iterations: u64, checkpoint_interval: u32) -> Limits {
        Limits {
            max_iterations,
            max_wall_time_ms: 600_000,
            max_tokens: 1_000_000,
            max_consecutive_errors: 3,
            reflection_interval: 100,
            checkpoint_interval,
            max_tool_calls: None,
            max_cycles: 10,
            context_budget_tokens: 32_000,
            review_every: None,
        }
    }

    fn config() -> Arc<Config> {
        let vars = HashMap::from([(
            "DATABASE_URL".to_string(),
            "postgres://localhost/unused".to_string(),
        )]);
        Arc::new(Config::from_vars(&vars).unwrap())
    }

    /// A runner over the fake store, with the executor's call counter.
    fn runner(limits: Limits) -> (Runner<FakeStore>, FakeStore, Arc<AtomicUsize>) {
        let settings = SessionSettings {
            mode: Mode::Fixed,
            limits,
        };
        let store = FakeStore::new(settings);
        let calls = Arc::new(AtomicUsize::new(0));
        let clock = Arc::new(LeaseClock::new(
            Instant::now(),
            Duration::from_secs(600),
            Duration::from_secs(1),
        ));
        let runner = Runner::new(RunnerDeps {
            store: store.clone(),
            config: config(),
            lease: Lease {
                session_id: Uuid::new_v4(),
                token: Uuid::new_v4(),
            },
            goal: "write the report".into(),
            settings,
            executor: Box::new(Counting(calls.clone())),
            state: LoopState::new(limits.reflection_interval),
            guidance: None,
            control: Control::new(clock),
            reflector: None,
            tenant: "t".into(),
            model_calls: Arc::new(crate::ratelimit::TenantLimiter::new(0)),
            metrics: Arc::new(Metrics::default()),
            view: Arc::default(),
        });
        (runner, store, calls)
    }

    fn last_status(store: &FakeStore) -> SessionEvent {
        let written = store.written();
        let last = written.events.last().expect("the run logged its end");
        SessionEvent::from_parts(last.kind, &last.data.to_value().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_stop_requested_before_a_step_is_honoured_before_executing() {
        let (runner, store, calls) = runner(limits(10, 5));
        runner.control.stop.cancel();
        assert_eq!(runner.run().await, Exit::Finished(Reason::UserStop));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(store.written().commits.is_empty());
        assert!(matches!(
            last_status(&store),
            SessionEvent::StatusChanged {
                reason: Some(Reason::UserStop),
                ..
            }
        ));
    }

    #[tokio::test]
    async fn a_shutdown_releases_without_finishing() {
        let (runner, store, calls) = runner(limits(10, 5));
        runner.control.shutdown.cancel();
        assert_eq!(runner.run().await, Exit::Released);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(store.written().released);
        assert!(store.written().finished.is_none());
    }

    #[tokio::test]
    async fn a_guardrail_trip_ends_the_run_with_its_reason() {
        let (runner, store, calls) = runner(limits(3, 100));
        assert_eq!(runner.run().await, Exit::Finished(Reason::MaxIterations));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(store.written().commits.len(), 3);
        let kinds = store.kinds();
        assert_eq!(
            kinds[kinds.len() - 2..],
            ["guardrail_tripped", "status_changed"]
        );
        assert_eq!(
            store.written().finished.as_ref().map(|t| t.reason),
            Some(Reason::MaxIterations)
        );
    }

    #[tokio::test]
    async fn every_commit_logs_the_gate_decision_and_the_step() {
        let (runner, store, _) = runner(limits(2, 100));
        runner.run().await;
        let kinds = store.kinds();
        assert_eq!(
            kinds[..4],
            [
                "gate_decision",
                "iteration_completed",
                "gate_decision",
                "iteration_completed"
            ]
        );
        let written = store.written();
        let first = &written.commits[0];
        assert_eq!((first.number, first.action.as_str()), (1, "action_1"));
        assert!(first.record.to_value().unwrap().is_object());
        assert!(first.effects.to_value().unwrap().is_object());
    }

    #[tokio::test]
    async fn a_failed_commit_ends_the_loop_instead_of_being_swallowed() {
        let (runner, store, calls) = runner(limits(10, 100));
        store.written().fail_commits = true;
        assert_eq!(runner.run().await, Exit::LeaseLost);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(store.written().finished.is_none());
    }

    #[tokio::test]
    async fn a_checkpoint_is_saved_every_interval_in_the_iterations_own_commit() {
        let (runner, store, _) = runner(limits(5, 2));
        assert_eq!(runner.run().await, Exit::Finished(Reason::MaxIterations));
        let written = store.written();
        assert_eq!(
            written.checkpoints,
            [(2, "interval".to_string()), (4, "interval".to_string())]
        );
        // Folded: carried by iterations 2 and 4, with their event in the same commit.
        let folded: Vec<i64> = written
            .commits
            .iter()
            .filter(|c| c.checkpoint.is_some())
            .map(|c| c.number)
            .collect();
        assert_eq!(folded, [2, 4]);
        let saved = written
            .events
            .iter()
            .filter(|e| e.kind == "checkpoint_saved")
            .count();
        assert_eq!(saved, 2);
    }

    #[tokio::test]
    async fn a_pause_finishes_after_the_step_in_flight() {
        let (mut runner, store, calls) = runner(limits(10, 100));
        runner.control.pause.store(true, Ordering::SeqCst);
        assert_eq!(
            runner.run_loop().await.unwrap(),
            Exit::Finished(Reason::UserPause)
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(
            store.written().finished.as_ref().map(|t| t.status),
            Some(Status::Paused)
        );
    }
}
