//! The supervisor: the registry of this replica's running sessions. It
//! spawns runners, signals them, renews their leases, rescues sessions whose
//! owner died, and relays stop/pause requests that reached other replicas.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::error::ServiceError;
use super::lease_clock::LeaseClock;
use super::reflector::Reflector;
use super::rehydrate::{build_executor, load_for_run};
use super::runner::{Control, Exit, Runner, RunnerDeps};
use super::state::LoopState;
use crate::config::Config;
use crate::llm::LlmClient;
use crate::metrics::Metrics;
use crate::store::{
    CONTROL_CHANNEL, ControlAction, ControlNote, Lease, SessionRecord, SessionSettings, Store,
};

struct RunnerHandle {
    lease: Lease,
    control: Control,
    done: watch::Receiver<bool>,
    abort: AbortHandle,
}

struct Inner {
    replica_id: Uuid,
    store: Store,
    config: Arc<Config>,
    runners: Mutex<HashMap<Uuid, RunnerHandle>>,
    /// The reflection model, when one is configured.
    reflector: Option<Arc<Reflector>>,
    metrics: Arc<Metrics>,
    /// Cancelled when the process shuts down: no new runners, background loops end.
    closing: CancellationToken,
    /// The runtime the loops run on, so that busy sessions never delay the API.
    loops: tokio::runtime::Handle,
}

/// This replica's registry of running sessions.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

/// A started runner: what a caller may wait on.
pub type Done = watch::Receiver<bool>;

impl Supervisor {
    /// A supervisor for replica `replica_id` whose loops run on `loops`.
    pub fn new(
        store: Store,
        config: Arc<Config>,
        replica_id: Uuid,
        metrics: Arc<Metrics>,
        loops: tokio::runtime::Handle,
    ) -> Supervisor {
        let models = &config.models;
        let reflector = match (&models.endpoint, &models.reflection_model) {
            (Some(endpoint), Some(model)) => match LlmClient::new(endpoint.clone()) {
                Ok(client) => Some(Arc::new(Reflector::new(
                    client,
                    model.clone(),
                    models.reflection_temperature,
                    models.reflection_top_p,
                ))),
                Err(err) => {
                    tracing::error!(error = %err, "reflection model client could not be built; reflection is off");
                    None
                }
            },
            _ => None,
        };
        Supervisor {
            inner: Arc::new(Inner {
                replica_id,
                store,
                config,
                reflector,
                metrics,
                runners: Mutex::new(HashMap::new()),
                closing: CancellationToken::new(),
                loops,
            }),
        }
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// This replica's id (the `owner` of its leases).
    pub fn replica_id(&self) -> Uuid {
        self.inner.replica_id
    }

    fn runners(&self) -> MutexGuard<'_, HashMap<Uuid, RunnerHandle>> {
        // A poisoned lock only means a panic elsewhere; the map is still consistent.
        self.inner
            .runners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of sessions running here.
    pub fn running(&self) -> usize {
        self.runners().len()
    }

    /// Starts the loop of a session whose lease this replica has just taken.
    /// `acquired` is when the acquiring query was sent.
    pub async fn spawn(
        &self,
        lease: Lease,
        acquired: Instant,
        session: &SessionRecord,
        state: LoopState,
    ) -> Result<(), ServiceError> {
        if self.inner.closing.is_cancelled() {
            return Err(ServiceError::Unavailable(
                "Warden is shutting down; the session will be picked up by the next instance"
                    .into(),
            ));
        }
        let config = &self.inner.config;
        let executor = build_executor(&self.inner.store, config, session, lease).await?;
        let clock = Arc::new(LeaseClock::new(
            acquired,
            config.lease.ttl,
            config.lease.margin,
        ));
        let control = Control::new(clock);
        if session.stop_requested {
            control.stop.cancel();
        }
        if session.pause_requested {
            control.pause.store(true, Ordering::SeqCst);
        }
        let runner = Runner::new(RunnerDeps {
            store: self.inner.store.clone(),
            config: config.clone(),
            lease,
            goal: session.goal.clone(),
            settings: SessionSettings {
                mode: session.mode,
                limits: session.limits,
            },
            executor,
            state,
            guidance: session.guidance.clone(),
            control: control.clone(),
            reflector: self.inner.reflector.clone(),
            metrics: self.inner.metrics.clone(),
        });
        let (done_tx, done_rx) = watch::channel(false);
        let me = self.clone();
        // Hold the registry lock across the spawn so the task cannot finish
        // and deregister before it is registered.
        let mut runners = self.runners();
        let task = self.inner.loops.spawn(async move {
            let exit = runner.run().await;
            me.deregister(lease);
            if matches!(exit, Exit::StoreFailed(_)) {
                tracing::warn!(session_id = %lease.session_id, "session left to lease expiry after a storage failure");
            }
            let _ = done_tx.send(true);
        });
        runners.insert(
            lease.session_id,
            RunnerHandle {
                lease,
                control,
                done: done_rx,
                abort: task.abort_handle(),
            },
        );
        Ok(())
    }

    fn deregister(&self, lease: Lease) {
        let mut runners = self.runners();
        if runners.get(&lease.session_id).map(|h| h.lease) == Some(lease) {
            runners.remove(&lease.session_id);
        }
    }

    /// Signals a local runner to stop; `None` when the session does not run here.
    pub fn signal_stop(&self, id: Uuid) -> Option<Done> {
        let runners = self.runners();
        let handle = runners.get(&id)?;
        handle.control.stop.cancel();
        Some(handle.done.clone())
    }

    /// Signals a local runner to pause after its step; `None` when not here.
    pub fn signal_pause(&self, id: Uuid) -> Option<Done> {
        let runners = self.runners();
        let handle = runners.get(&id)?;
        handle.control.pause.store(true, Ordering::SeqCst);
        Some(handle.done.clone())
    }

    /// The completion signal of a local runner, if the session runs here.
    pub fn done_signal(&self, id: Uuid) -> Option<Done> {
        self.runners().get(&id).map(|h| h.done.clone())
    }

    /// Renews every local lease once; runners whose lease was lost are told to stop writing.
    pub async fn heartbeat(&self) {
        let leases: Vec<Lease> = self.runners().values().map(|h| h.lease).collect();
        if leases.is_empty() {
            return;
        }
        let started = Instant::now();
        let lease_cfg = self.inner.config.lease;
        match self.inner.store.renew_leases(&leases, lease_cfg.ttl).await {
            Ok(renewed) => {
                let renewed: HashMap<Uuid, _> =
                    renewed.into_iter().map(|r| (r.session_id, r)).collect();
                let runners = self.runners();
                for lease in leases {
                    let Some(handle) = runners.get(&lease.session_id) else {
                        continue;
                    };
                    if handle.lease != lease {
                        continue;
                    }
                    match renewed.get(&lease.session_id) {
                        Some(r) => {
                            handle.control.lease_clock.renewed(
                                started,
                                lease_cfg.ttl,
                                lease_cfg.margin,
                            );
                            if r.stop_requested {
                                handle.control.stop.cancel();
                            }
                            if r.pause_requested {
                                handle.control.pause.store(true, Ordering::SeqCst);
                            }
                        }
                        // Finished meanwhile, or taken over: the runner's own
                        // fenced writes and lease clock end it either way.
                        None => {
                            tracing::debug!(session_id = %lease.session_id, "lease not renewed")
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "lease renewal failed"),
        }
    }

    /// Takes over sessions whose owner stopped renewing its lease.
    pub async fn rescue(&self) -> usize {
        if self.inner.closing.is_cancelled() {
            return 0;
        }
        let started = Instant::now();
        let store = &self.inner.store;
        let claimed = match store
            .claim_orphans(self.inner.replica_id, self.inner.config.lease.ttl, 100)
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                tracing::warn!(error = %err, "rescue scan failed");
                return 0;
            }
        };
        let mut resumed = 0;
        for c in claimed {
            let id = c.lease.session_id;
            match load_for_run(store, id).await {
                Ok((session, state)) => {
                    tracing::info!(session_id = %id, previous_owner = ?c.previous_owner, "rescuing session");
                    if let Err(err) = self.spawn(c.lease, started, &session, state).await {
                        tracing::error!(session_id = %id, error = %err, "cannot rescue session");
                    } else {
                        resumed += 1;
                    }
                }
                Err(err) => {
                    tracing::error!(session_id = %id, error = %err, "cannot rebuild session")
                }
            }
        }
        resumed
    }

    /// Heartbeat and rescue, forever (until shutdown).
    pub async fn maintain(self) {
        let interval = self.inner.config.lease.heartbeat;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.inner.closing.cancelled() => return,
                _ = ticker.tick() => {}
            }
            self.heartbeat().await;
            self.rescue().await;
        }
    }

    /// Relays stop and pause requests sent to other replicas (NOTIFY makes
    /// them fast; the durable flags read at each commit and heartbeat are the truth).
    pub async fn listen(self) {
        loop {
            if self.inner.closing.is_cancelled() {
                return;
            }
            let mut listener = match PgListener::connect_with(self.inner.store.pool()).await {
                Ok(l) => l,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot listen for control notifications; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(err) = listener.listen(CONTROL_CHANNEL).await {
                tracing::warn!(error = %err, "LISTEN failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            loop {
                let note = tokio::select! {
                    _ = self.inner.closing.cancelled() => return,
                    note = listener.recv() => note,
                };
                match note {
                    Ok(note) => self.on_control_note(note.payload()),
                    Err(err) => {
                        tracing::warn!(error = %err, "control listener lost its connection");
                        break;
                    }
                }
            }
        }
    }

    fn on_control_note(&self, payload: &str) {
        let Ok(note) = payload.parse::<ControlNote>() else {
            return;
        };
        match note.action {
            ControlAction::Stop => {
                self.signal_stop(note.session_id);
            }
            ControlAction::Pause => {
                self.signal_pause(note.session_id);
            }
        }
    }

    /// Checkpoints and releases every running session, waiting up to `timeout`.
    pub async fn shutdown(&self, timeout: Duration) {
        self.inner.closing.cancel();
        let waits: Vec<Done> = {
            let runners = self.runners();
            runners
                .values()
                .map(|h| {
                    h.control.shutdown.cancel();
                    h.done.clone()
                })
                .collect()
        };
        let all = futures::future::join_all(waits.into_iter().map(|mut done| async move {
            let _ = done.wait_for(|d| *d).await;
        }));
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!("some sessions did not checkpoint before the shutdown timeout");
        }
    }

    /// Kills every runner without a checkpoint, as a crash would (tests use it).
    pub fn abort_all(&self) {
        self.inner.closing.cancel();
        for handle in self.runners().values() {
            handle.abort.abort();
        }
    }
}
