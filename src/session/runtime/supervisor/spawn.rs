//! Starting a session's loop here: its executor built, its lease clock
//! checked, its runner registered under its lease, each a named step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::watch;

use super::{RunnerHandle, Slot, Supervisor};
use crate::executor::Executor;
use crate::policy::lifecycle::Reason;
use crate::policy::loop_state::LoopState;
use crate::secrets::{self, ForeignSeal, SecretsError};
use crate::session::error::ServiceError;
use crate::session::runtime::lease_clock::LeaseClock;
use crate::session::runtime::live::LiveView;
use crate::session::runtime::rehydrate::build_executor;
use crate::session::runtime::runner::{Control, Exit, Runner, RunnerDeps, TreeRole};
use crate::store::{ControlAction, Lease, Session, SessionSettings};
use crate::telemetry;

impl Supervisor {
    /// Starts the loop of a session whose lease this replica already holds,
    /// counting it against `WARDEN_MAX_RUNNING` without checking it (the
    /// lease was taken before; refusing it would only strand the session).
    /// `acquired` is when the acquiring query was sent.
    pub async fn spawn(
        &self,
        lease: Lease,
        acquired: Instant,
        session: &Session,
        state: LoopState,
    ) -> Result<(), ServiceError> {
        let slot = self.take_slot();
        self.spawn_in(slot, lease, acquired, session, state).await
    }

    /// Starts the loop of a session whose lease this replica has just taken,
    /// in the place `slot`. `acquired` is when the acquiring query was sent.
    pub async fn spawn_in(
        &self,
        slot: Slot,
        lease: Lease,
        acquired: Instant,
        session: &Session,
        state: LoopState,
    ) -> Result<(), ServiceError> {
        self.check_open()?;
        let view = Arc::new(LiveView::new(session));
        let has_children = Arc::new(AtomicBool::new(session.children_count > 0));
        let on_delegated = self.on_delegated(&has_children, &view);
        let Some(executor) = self.executor_for(session, lease, on_delegated).await? else {
            return Ok(());
        };
        let Some(control) = self.control_for(acquired, lease, session, &view).await? else {
            return Ok(());
        };
        let parts = (executor, state, has_children);
        let runner = self.runner_for(session, lease, parts, &control, &view);
        let agent = self.agent_of(session);
        self.register(slot, lease, control, view, (runner, agent));
        Ok(())
    }

    /// Who the session's agent is, for its runs' `invoke_agent` spans.
    fn agent_of(&self, session: &Session) -> telemetry::AgentInfo {
        let brief = &session.executor_summary.0;
        let model = brief.kind == "llm";
        telemetry::AgentInfo {
            name: brief.kind.clone(),
            provider: if model { "openai" } else { "warden" },
            request_model: model
                .then(|| {
                    brief
                        .model
                        .clone()
                        .or_else(|| self.inner.config.models.model.clone())
                })
                .flatten(),
        }
    }

    /// The `invoke_agent` span of the run `lease` starts, linked to the
    /// request that created or last resumed the session and to its
    /// previous run (kept with the session, whichever replica ran it),
    /// its own context kept there for the next run.
    async fn agent_span(&self, lease: Lease, agent: &telemetry::AgentInfo) -> tracing::Span {
        let mut links = telemetry::RunLinks::default();
        if !telemetry::enabled() {
            return telemetry::agent_span(lease.session_id, agent, &links);
        }
        let span = telemetry::agent_span(lease.session_id, agent, &links);
        let own = telemetry::traceparent_of_span(&span);
        match self
            .inner
            .store
            .start_run_trace(&lease, own.as_deref())
            .await
        {
            Ok(stored) => {
                links.request = stored.request;
                links.previous_run = stored.previous_run;
                telemetry::link_run(&span, &links);
            }
            Err(err) => {
                tracing::warn!(session_id = %lease.session_id, error = %err, "the run's trace links could not be read; it starts unlinked");
            }
        }
        span
    }

    /// Refuses a new loop once the process shuts down.
    fn check_open(&self) -> Result<(), ServiceError> {
        if self.inner.closing.is_cancelled() {
            return Err(ServiceError::Unavailable(
                "Warden is shutting down; the session will be picked up by the next instance"
                    .into(),
            ));
        }
        Ok(())
    }

    /// What the executor calls when the session delegates a child.
    fn on_delegated(
        &self,
        has_children: &Arc<AtomicBool>,
        view: &Arc<LiveView>,
    ) -> Arc<dyn Fn() + Send + Sync> {
        let (has_children, capacity) = (has_children.clone(), self.inner.capacity.clone());
        let view = view.clone();
        Arc::new(move || {
            has_children.store(true, Ordering::SeqCst);
            // The delegation changed the row (limits carved, children
            // counted) outside an iteration: the next status reads it.
            view.invalidate();
            capacity.freed.notify_one();
        })
    }

    /// The session's executor; `None` when its secret cannot be read here
    /// (the session was handed over, or failed, instead).
    async fn executor_for(
        &self,
        session: &Session,
        lease: Lease,
        on_delegated: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<Option<Box<dyn Executor>>, ServiceError> {
        let config = &self.inner.config;
        match build_executor(
            &self.inner.store,
            config,
            session,
            lease,
            &self.inner.mcp,
            on_delegated,
        )
        .await
        {
            Ok(executor) => Ok(Some(executor)),
            Err(ServiceError::Secret(err)) => {
                // Sealed under the fleet's key after this replica's was
                // rotated away: a replica with the key takes it over.
                if let SecretsError::WrongKey { sealed_with, .. } = &err {
                    let registered = self.inner.store.registered_secret_key().await?;
                    if secrets::foreign_seal(sealed_with, registered.as_deref())
                        == ForeignSeal::HandOver
                    {
                        tracing::error!(session_id = %lease.session_id, error = %err, "this replica's secret key was rotated away; handing the session over");
                        self.after_store_failure(lease, &err.to_string()).await;
                        return Ok(None);
                    }
                }
                // Retrying cannot help: no replica is known to have the key.
                let error = err.to_string();
                self.fail_now(lease, Reason::SecretUnreadable, &error, 0)
                    .await;
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// The loop's control, its lease clock started when the lease was
    /// acquired, with the requests already recorded on the row; `None`
    /// when a rescue took the session over meanwhile.
    async fn control_for(
        &self,
        acquired: Instant,
        lease: Lease,
        session: &Session,
        view: &LiveView,
    ) -> Result<Option<Control>, ServiceError> {
        let config = &self.inner.config;
        let clock = Arc::new(LeaseClock::new(
            acquired,
            config.lease.ttl,
            config.lease.margin,
        ));
        if !self.refresh_if_stale(&clock, lease, view).await? {
            // A rescue took the session over meanwhile: it runs there.
            tracing::info!(session_id = %lease.session_id, "session taken over before its loop started");
            return Ok(None);
        }
        let control = Control::new(clock);
        if session.stop_requested {
            control.stop.cancel();
        }
        if session.pause_requested {
            control.pause.store(true, Ordering::SeqCst);
        }
        Ok(Some(control))
    }

    /// The session's runner over its executor, state and children flag,
    /// with what it shares with this supervisor.
    fn runner_for(
        &self,
        session: &Session,
        lease: Lease,
        (executor, state, has_children): (Box<dyn Executor>, LoopState, Arc<AtomicBool>),
        control: &Control,
        view: &Arc<LiveView>,
    ) -> Runner {
        let config = &self.inner.config;
        Runner::new(RunnerDeps {
            store: self.inner.store.clone(),
            config: config.clone(),
            lease,
            goal: session.goal.clone(),
            settings: SessionSettings {
                mode: session.mode,
                limits: session.limits.0,
            },
            executor,
            state,
            guidance: session.guidance.clone(),
            control: control.clone(),
            reflector: self.inner.reflector.clone(),
            tenant: session.tenant.clone(),
            model_calls: self.inner.model_calls.clone(),
            metrics: self.inner.metrics.clone(),
            view: view.clone(),
            has_children,
            tree: TreeRole {
                is_child: session.parent_id.is_some(),
                on_child_pause: session.on_child_pause,
            },
        })
    }

    /// Runs `runner` on the loops' runtime, registered under its lease and
    /// holding `slot` until it ends.
    fn register(
        &self,
        slot: Slot,
        lease: Lease,
        control: Control,
        view: Arc<LiveView>,
        (runner, agent): (Runner, telemetry::AgentInfo),
    ) {
        let (done_tx, done_rx) = watch::channel(false);
        self.forget(lease.session_id);
        let me = self.clone();
        let kept = view.clone();
        let stop = control.stop.clone();
        // Hold the registry lock across the spawn so the task cannot finish
        // and deregister before it is registered.
        let mut runners = self.runners_mut();
        let task = self.inner.loops.spawn(async move {
            let span = me.agent_span(lease, &agent).await;
            let exit = runner.run_in(span).await;
            if matches!(exit, Exit::StoreFailed(_) | Exit::LeaseLost) {
                me.remember(lease.session_id, kept);
            }
            me.deregister(lease);
            if let Exit::StoreFailed(err) = &exit {
                me.after_store_failure(lease, err).await;
            }
            let _ = done_tx.send(true);
            if matches!(exit, Exit::Finished(_)) && stop.is_cancelled() {
                me.tell_stop_ended(lease.session_id).await;
            }
        });
        runners
            .entry(lease.session_id)
            .or_default()
            .push(RunnerHandle {
                lease,
                control,
                done: done_rx,
                abort: task.abort_handle(),
                _slot: slot,
                view,
            });
    }

    /// Tells every replica that the run of `id` ended with a stop
    /// requested (its end is committed): one that waits to answer the stop
    /// need not poll for it. Sent once; a lost note costs that replica its
    /// backstop poll, nothing more.
    async fn tell_stop_ended(&self, id: uuid::Uuid) {
        if let Err(err) = self
            .inner
            .store
            .notify_control(ControlAction::Ended, id)
            .await
        {
            tracing::warn!(session_id = %id, error = %err, "cannot tell the fleet the stop landed; a waiting replica polls");
        }
    }

    fn deregister(&self, lease: Lease) {
        let mut runners = self.runners_mut();
        if let Some(handles) = runners.get_mut(&lease.session_id) {
            handles.retain(|h| h.lease.token != lease.token);
            if handles.is_empty() {
                runners.remove(&lease.session_id);
            }
        }
    }

    /// Renews `lease` at once when its clock would lapse before the next
    /// heartbeat: the clock starts when the acquiring request began, which
    /// may be long before the lease was written (a wait for a connection,
    /// building the executor), and the runner would quit at once. False
    /// when the lease is no longer held (the session was taken over).
    async fn refresh_if_stale(
        &self,
        clock: &LeaseClock,
        lease: Lease,
        view: &LiveView,
    ) -> Result<bool, ServiceError> {
        let cfg = self.inner.config.lease;
        if clock.is_valid_at(Instant::now() + cfg.heartbeat) {
            return Ok(true);
        }
        let started = Instant::now();
        let renewed = self.inner.store.renew_leases(&[lease], cfg.ttl).await?;
        let Some(r) = renewed.first() else {
            return Ok(false);
        };
        clock.renewed(started, cfg.ttl, cfg.margin);
        view.lease_renewed(r.lease_expires_at, r.heartbeat_at);
        Ok(true)
    }
}
