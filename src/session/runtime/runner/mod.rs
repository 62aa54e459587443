//! The per-session task: one loop that honours control signals, checks the
//! guardrails and the continue gate, runs a step, commits it, and acts on
//! what the step said, until the session stops, pauses or is handed over.
//!
//! The loop reads on one screen in [`Runner::run_loop`]; each of its steps
//! lives in the file named after it, and what a commit writes is decided by
//! the pure [`plan`] module, which the commit step only carries out.

mod checkpoint;
mod commit;
mod execute;
mod finish;
mod gate;
pub mod plan;
mod reflect;
mod snapshot;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::lease_clock::LeaseClock;
use super::live::LiveView;
use super::loop_store::LoopStore;
use super::reflector::Reflector;
use crate::config::Config;
use crate::executor::Executor;
use crate::metrics::Metrics;
use crate::policy::budget;
use crate::policy::delegation::ChildPausePolicy;
use crate::policy::guardrails::{self, Usage};
use crate::policy::lifecycle::{Reason, Status};
use crate::policy::loop_state::LoopState;
use crate::store::{ControlFlags, Lease, SessionSettings, Store, StoreError};
use crate::telemetry;

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

impl Exit {
    /// How the run ended as (status, reason) names, for its span: the
    /// session's status and reason when it reached one; `released` with
    /// `shutdown`, `lease_lost` or `store_error` when another run goes on.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Exit::Finished(reason) => (reason.status().as_str(), reason.as_str()),
            Exit::Released => ("released", "shutdown"),
            Exit::LeaseLost => ("released", "lease_lost"),
            Exit::StoreFailed(_) => ("released", "store_error"),
        }
    }
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
    /// The session has children (their ends are read before each step);
    /// set by the desk that makes them, whatever became of the step.
    pub has_children: Arc<AtomicBool>,
    /// Its place in a tree of sessions.
    pub tree: TreeRole,
}

/// A session's place in a tree of sessions, as its loop needs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeRole {
    /// It was delegated by a parent.
    pub is_child: bool,
    /// What it does when it would pause for a person (its tree's policy).
    pub on_child_pause: ChildPausePolicy,
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
    /// The session has children: their ends are read before each step.
    has_children: Arc<AtomicBool>,
    tree: TreeRole,
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

/// Runs a step and acts on its [`Flow`] inside a pass.
macro_rules! step {
    ($flow:expr) => {
        match $flow? {
            Flow::Go(value) => value,
            Flow::Again => return Ok(None),
            Flow::Exit(exit) => return Ok(Some(exit)),
        }
    };
}

/// Timing of one pass, for the iteration metrics.
struct Pass {
    started: Instant,
    /// Time spent waiting for durable writes (checkpoints, the commit).
    writes: Duration,
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
            has_children: deps.has_children,
            tree: deps.tree,
        }
    }

    /// The session this runner drives.
    pub fn session_id(&self) -> Uuid {
        self.lease.session_id
    }

    /// Runs the loop to its end, in an `invoke_agent` span without links.
    pub async fn run(self) -> Exit {
        let agent = telemetry::AgentInfo {
            name: "session".into(),
            provider: "warden",
            request_model: None,
        };
        let span = telemetry::agent_span(
            self.lease.session_id,
            &agent,
            &telemetry::RunLinks::default(),
        );
        self.run_in(span).await
    }

    /// Runs the loop to its end in `agent`, the run's `invoke_agent` span,
    /// which records how it ended.
    #[tracing::instrument(name = "session", skip_all, fields(session_id = %self.lease.session_id))]
    pub async fn run_in(mut self, agent: tracing::Span) -> Exit {
        let ended = self.run_loop().instrument(agent.clone()).await;
        let exit = match ended {
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
        if !agent.is_disabled() {
            let (status, reason) = exit.labels();
            agent.record("warden.session.exit.status", status);
            agent.record("warden.session.exit.reason", reason);
            if status == Status::Failed.as_str() || matches!(exit, Exit::StoreFailed(_)) {
                agent.record("error.type", reason);
                agent.record("otel.status_code", "ERROR");
            }
        }
        exit
    }

    /// Whether the session is part of a tree: its steps reserve their
    /// allowance from the tree's budget.
    fn in_tree(&self) -> bool {
        self.tree.is_child || self.has_children.load(Ordering::SeqCst)
    }

    fn elapsed_ms(&self) -> u64 {
        self.base_elapsed_ms + self.started.elapsed().as_millis() as u64
    }

    /// The tokens the money budget has left for the next step, at the
    /// reservation rate of the executor's model (`u64::MAX` without a money
    /// budget; 0 when no price is in force, as the budget cannot be kept).
    fn money_allowance(&self) -> u64 {
        let Some(left) = guardrails::cost_remaining(&self.settings.limits, &self.state.usage)
        else {
            return u64::MAX;
        };
        let day = chrono::Utc::now().date_naive();
        self.config
            .model_prices
            .reservation_rate(self.executor.model(), day)
            .map_or(0, |rate| budget::affordable_tokens(left, rate))
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
        // The span of the step about to run: kept across the passes a
        // throttle repeats, closed once its step is committed, so a span
        // stands for one iteration (none for the pass that only ends the run).
        let mut iteration: Option<(u64, tracing::Span)> = None;
        loop {
            if let Some(exit) = self.pass(&mut iteration).await? {
                return Ok(exit);
            }
        }
    }

    /// One pass: `None` to go on with the next, or how the loop ended. The
    /// checks before the step run in the run's span, the step in its
    /// iteration's.
    async fn pass(
        &mut self,
        iteration: &mut Option<(u64, tracing::Span)>,
    ) -> Result<Option<Exit>, StoreError> {
        let mut pass = Pass {
            started: Instant::now(),
            writes: Duration::ZERO,
        };
        step!(self.control().await);
        step!(self.reflect_if_due().await);
        self.checkpoint_if_due(&mut pass).await?;
        step!(self.settled().await);
        let usage = step!(self.guardrails().await);
        let number = usage.iterations + 1;
        let span = match iteration {
            Some((n, span)) if *n == number => span.clone(),
            _ => {
                let span = tracing::info_span!(
                    target: telemetry::TARGET,
                    "warden.iteration",
                    warden.iteration.number = telemetry::int(number),
                );
                *iteration = Some((number, span.clone()));
                span
            }
        };
        let stepped = self.step(usage, pass).instrument(span).await;
        if self.state.usage.iterations >= number {
            *iteration = None;
        }
        stepped
    }

    /// The step of a pass: the gate, the executor, the commit.
    async fn step(&mut self, usage: Usage, mut pass: Pass) -> Result<Option<Exit>, StoreError> {
        let gated = step!(self.gate(&usage, &mut pass).await);
        let executed = step!(self.execute(gated).await);
        let overspent = executed.overspent();
        self.commit(executed, &mut pass).await?;
        if let Some((number, overspent)) = overspent {
            return self.overspent(number, overspent).await.map(Some);
        }
        Ok(None)
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
}
