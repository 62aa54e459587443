//! The supervisor: the registry of this replica's running sessions. It
//! spawns runners, signals them, renews their leases, rescues sessions whose
//! owner died, and relays stop/pause requests that reached other replicas.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::error::ServiceError;
use super::lease_clock::LeaseClock;
use super::live::{Freshness, LiveView, StepInFlight, Velocity};
use super::reflector::Reflector;
use super::rehydrate::{build_executor, load_for_run};
use super::runner::{Control, Exit, Runner, RunnerDeps, TreeRole};
use crate::config::Config;
use crate::event::SessionEvent;
use crate::llm::LlmClient;
use crate::metrics::Metrics;
use crate::policy::fleet::{self, FleetLoad};
use crate::policy::lifecycle::Reason;
use crate::policy::loop_state::LoopState;
use crate::policy::termination::{self, Facts};
use crate::secrets::{self, ForeignSeal, SecretsError};
use crate::store::{
    Attempt, CONTROL_CHANNEL, ControlAction, ControlNote, KEYS_CHANNEL, Lease, Session,
    SessionSettings, Store, WORKERS_CHANNEL, WorkerChange,
};

/// This replica's runners by session id: one each, two for a moment while
/// the stale runner of an old lease finishes. Keyed by session so a status
/// read finds its session without scanning the others.
type Registry = HashMap<Uuid, Vec<RunnerHandle>>;

struct RunnerHandle {
    lease: Lease,
    control: Control,
    done: watch::Receiver<bool>,
    abort: AbortHandle,
    /// Its place under `WARDEN_MAX_RUNNING`, freed when the runner ends.
    _slot: Slot,
    /// The status it keeps in memory.
    view: Arc<LiveView>,
}

/// How many places under `WARDEN_MAX_RUNNING` are taken, and a wake-up for
/// the claimer when one frees.
#[derive(Default)]
struct Capacity {
    taken: AtomicUsize,
    freed: Notify,
}

/// A place under `WARDEN_MAX_RUNNING`, taken before a session is admitted
/// to run here and held by its runner; dropping it frees the place and
/// wakes the claimer, so a queued session starts at once.
pub struct Slot {
    capacity: Arc<Capacity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.capacity.taken.fetch_sub(1, Ordering::SeqCst);
        self.capacity.freed.notify_one();
    }
}

struct Inner {
    replica_id: Uuid,
    store: Store,
    config: Arc<Config>,
    /// Each runner under its lease token too: a late start of an old lease
    /// must never replace the live runner of the same session. Read-locked
    /// by status reads and the lease renewals alike, so neither waits for
    /// the other; no holder does more than a lookup or a copy under it.
    runners: RwLock<Registry>,
    /// The reflection model, when one is configured.
    reflector: Option<Arc<Reflector>>,
    /// The per-tenant limit of calls on the server's own model.
    model_calls: Arc<crate::ratelimit::TenantLimiter>,
    metrics: Arc<Metrics>,
    /// Cancelled when the process shuts down: no new runners, background loops end.
    closing: CancellationToken,
    /// The runtime the loops run on, so that busy sessions never delay the API.
    loops: tokio::runtime::Handle,
    /// Places taken under `WARDEN_MAX_RUNNING`.
    capacity: Arc<Capacity>,
    /// The views of runners that ended because Postgres failed or the
    /// lease was lost: their last committed state answers a status, marked
    /// stale, while Postgres cannot. At most `WARDEN_MAX_RUNNING` of them;
    /// one goes when its session runs here again or Postgres answers for it.
    remembered: std::sync::Mutex<HashMap<Uuid, Arc<LiveView>>>,
    /// This replica's MCP servers, shared by its sessions' model agents.
    mcp: Arc<crate::mcp::McpRegistry>,
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
        // Counted in Postgres, so the limit holds for the fleet as a whole.
        let model_calls = Arc::new(crate::ratelimit::TenantLimiter::shared(
            config.quotas.tenant_model_calls_per_minute,
            Arc::new(store.clone()),
        ));
        let mcp = Arc::new(crate::mcp::McpRegistry::new(
            config.mcp.clone(),
            config.egress.clone(),
        ));
        Supervisor {
            inner: Arc::new(Inner {
                mcp,
                replica_id,
                store,
                config,
                reflector,
                model_calls,
                metrics,
                runners: RwLock::new(HashMap::new()),
                closing: CancellationToken::new(),
                loops,
                capacity: Arc::default(),
                remembered: std::sync::Mutex::default(),
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

    fn runners(&self) -> RwLockReadGuard<'_, Registry> {
        // A poisoned lock only means a panic elsewhere; the map is still consistent.
        self.inner
            .runners
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn runners_mut(&self) -> RwLockWriteGuard<'_, Registry> {
        self.inner
            .runners
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The local runners of session `id`.
    fn of_session(runners: &Registry, id: Uuid) -> &[RunnerHandle] {
        runners.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Whether the runner of `lease` is still registered here.
    fn registered(&self, lease: &Lease) -> bool {
        Self::of_session(&self.runners(), lease.session_id)
            .iter()
            .any(|h| h.lease.token == lease.token)
    }

    /// Number of sessions running here.
    pub fn running(&self) -> usize {
        self.runners().len()
    }

    /// Takes a place under `WARDEN_MAX_RUNNING`, if one is free.
    pub fn try_reserve(&self) -> Option<Slot> {
        let max = self.inner.config.max_running;
        let taken = &self.inner.capacity.taken;
        let mut current = taken.load(Ordering::SeqCst);
        loop {
            if current >= max || self.inner.closing.is_cancelled() {
                return None;
            }
            match taken.compare_exchange(current, current + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    return Some(Slot {
                        capacity: self.inner.capacity.clone(),
                    });
                }
                Err(now) => current = now,
            }
        }
    }

    /// Free places under `WARDEN_MAX_RUNNING`, at most `n`: how many a
    /// claim may take. Not reserved while the claim's query runs (that would
    /// turn away the creates meanwhile), so a create racing a claim can put
    /// this replica over the cap by the sessions admitted in that moment.
    fn free_up_to(&self, n: usize) -> usize {
        if self.inner.closing.is_cancelled() {
            return 0;
        }
        self.inner
            .config
            .max_running
            .saturating_sub(self.taken())
            .min(n)
    }

    /// A place for a session this replica has just claimed.
    fn take_slot(&self) -> Slot {
        self.inner.capacity.taken.fetch_add(1, Ordering::SeqCst);
        Slot {
            capacity: self.inner.capacity.clone(),
        }
    }

    /// Places taken under `WARDEN_MAX_RUNNING` (runners, and sessions being admitted).
    pub fn taken(&self) -> usize {
        self.inner.capacity.taken.load(Ordering::SeqCst)
    }

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
        if self.inner.closing.is_cancelled() {
            return Err(ServiceError::Unavailable(
                "Warden is shutting down; the session will be picked up by the next instance"
                    .into(),
            ));
        }
        let config = &self.inner.config;
        let view = Arc::new(LiveView::new(session));
        let has_children = Arc::new(AtomicBool::new(session.children_count > 0));
        let on_delegated = {
            let (has_children, capacity) = (has_children.clone(), self.inner.capacity.clone());
            let view = view.clone();
            Arc::new(move || {
                has_children.store(true, Ordering::SeqCst);
                // The delegation changed the row (limits carved, children
                // counted) outside an iteration: the next status reads it.
                view.invalidate();
                capacity.freed.notify_one();
            })
        };
        let executor = match build_executor(
            &self.inner.store,
            config,
            session,
            lease,
            &self.inner.mcp,
            on_delegated,
        )
        .await
        {
            Ok(executor) => executor,
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
                        return Ok(());
                    }
                }
                // Retrying cannot help: no replica is known to have the key.
                let error = err.to_string();
                self.fail_now(lease, Reason::SecretUnreadable, &error, 0)
                    .await;
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let clock = Arc::new(LeaseClock::new(
            acquired,
            config.lease.ttl,
            config.lease.margin,
        ));
        if !self.refresh_if_stale(&clock, lease, &view).await? {
            // A rescue took the session over meanwhile: it runs there.
            tracing::info!(session_id = %lease.session_id, "session taken over before its loop started");
            return Ok(());
        }
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
        });
        let (done_tx, done_rx) = watch::channel(false);
        self.forget(lease.session_id);
        let me = self.clone();
        let kept = view.clone();
        // Hold the registry lock across the spawn so the task cannot finish
        // and deregister before it is registered.
        let mut runners = self.runners_mut();
        let task = self.inner.loops.spawn(async move {
            let exit = runner.run().await;
            if matches!(exit, Exit::StoreFailed(_) | Exit::LeaseLost) {
                me.remember(lease.session_id, kept);
            }
            me.deregister(lease);
            if let Exit::StoreFailed(err) = &exit {
                me.after_store_failure(lease, err).await;
            }
            let _ = done_tx.send(true);
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
        Ok(())
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

    /// Signals every local runner of `id` to stop; the completion signal of
    /// one of them, `None` when the session does not run here.
    pub fn signal_stop(&self, id: Uuid) -> Option<Done> {
        let runners = self.runners();
        let mut done = None;
        for handle in Self::of_session(&runners, id) {
            handle.control.stop.cancel();
            handle.view.invalidate();
            done = Some(handle.done.clone());
        }
        done
    }

    /// Signals every local runner of `id` to pause after its step; `None` when not here.
    pub fn signal_pause(&self, id: Uuid) -> Option<Done> {
        let runners = self.runners();
        let mut done = None;
        for handle in Self::of_session(&runners, id) {
            handle.control.pause.store(true, Ordering::SeqCst);
            handle.view.invalidate();
            done = Some(handle.done.clone());
        }
        done
    }

    /// The one local runner of `id` whose lease this replica still trusts.
    fn trusted_view(&self, id: Uuid) -> Option<Arc<LiveView>> {
        let runners = self.runners();
        // Two runners of one session (a stale one finishing): ask Postgres.
        let [handle] = Self::of_session(&runners, id) else {
            return None;
        };
        if !handle.control.lease_clock.is_valid() {
            return None;
        }
        Some(handle.view.clone())
    }

    /// The committed status and velocity of `id` from memory, when it runs
    /// here under a lease this replica trusts and the view is fresh.
    pub fn live(&self, id: Uuid) -> Option<(Session, Velocity, Freshness)> {
        self.trusted_view(id)?.snapshot()
    }

    /// The step of `id` in flight, when it runs here under a lease this
    /// replica trusts.
    pub fn step_in_flight(&self, id: Uuid) -> Option<StepInFlight> {
        self.trusted_view(id)?.step_in_flight()
    }

    /// The last committed status and velocity of `id` this replica knows,
    /// however old: from its runner's view, or from the view of a runner
    /// that ended when Postgres failed. For answering while Postgres cannot.
    pub fn last_known(&self, id: Uuid) -> Option<(Session, Velocity)> {
        let running = Self::of_session(&self.runners(), id)
            .last()
            .map(|h| h.view.clone());
        let view = running.or_else(|| self.remembered().get(&id).cloned())?;
        view.last_known()
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<LiveView>>> {
        // A poisoned lock only means a panic elsewhere; the map is still consistent.
        self.inner
            .remembered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps the view of a runner that ended on a storage failure.
    fn remember(&self, id: Uuid, view: Arc<LiveView>) {
        let mut remembered = self.remembered();
        if remembered.len() >= self.inner.config.max_running
            && !remembered.contains_key(&id)
            && let Some(evict) = remembered.keys().next().copied()
        {
            remembered.remove(&evict);
        }
        remembered.insert(id, view);
    }

    /// Drops the kept view of `id`: Postgres answered for it, or it runs here again.
    pub fn forget(&self, id: Uuid) {
        let mut remembered = self.remembered();
        if !remembered.is_empty() {
            remembered.remove(&id);
        }
    }

    /// The view of `id` to refill from a Postgres read, with its generation
    /// taken before the read.
    pub fn refillable(&self, id: Uuid) -> Option<(Arc<LiveView>, u64)> {
        let view = self.trusted_view(id)?;
        let generation = view.generation();
        Some((view, generation))
    }

    /// Something changed on `id` that its view cannot apply field by field.
    pub fn invalidate(&self, id: Uuid) {
        for handle in Self::of_session(&self.runners(), id) {
            handle.view.invalidate();
        }
    }

    /// The completion signal of a local runner, if the session runs here.
    pub fn done_signal(&self, id: Uuid) -> Option<Done> {
        Self::of_session(&self.runners(), id)
            .first()
            .map(|h| h.done.clone())
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

    /// After a runner stopped on a storage error: keep the error on the
    /// session (the failure model reports it) and give the lease up, so the
    /// next rescue (which counts the attempt) comes a heartbeat later, not a
    /// TTL. Best effort: the database may be what failed.
    async fn after_store_failure(&self, lease: Lease, err: &str) {
        let store = &self.inner.store;
        if let Err(e) = store.record_error(&lease, err).await {
            tracing::warn!(session_id = %lease.session_id, error = %e, "cannot record the loop's error");
        }
        if let Err(e) = store.expire_lease(&lease).await {
            tracing::warn!(session_id = %lease.session_id, error = %e, "session left to lease expiry after a storage failure");
        }
    }

    /// Ends a session that failed `attempt.attempts` attempts in a row:
    /// `failed / internal_error`, with the last error in its record.
    async fn fail_attempts(&self, lease: Lease, attempt: &Attempt) {
        let error = attempt
            .last_error
            .clone()
            .unwrap_or_else(|| "the session's loop stopped without recording an error".into());
        let error = format!(
            "gave up after {} failed attempts; last error: {error}",
            attempt.attempts
        );
        self.fail_now(lease, Reason::InternalError, &error, attempt.attempts)
            .await;
    }

    /// Ends a session this replica holds the lease of `failed` for `reason`,
    /// with `error` in its record.
    async fn fail_now(&self, lease: Lease, reason: Reason, error: &str, attempts: i32) {
        let store = &self.inner.store;
        let id = lease.session_id;
        // This replica holds the lease: the session is its own to end.
        let (usage, limits) = match store.session(id, &crate::store::TenantScope::Global).await {
            Ok(Some(s)) => (s.counters().usage(), s.limits.0),
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "cannot read the failing session");
                return;
            }
        };
        let termination = termination::record(
            reason,
            Facts {
                usage: &usage,
                limits: &limits,
                detail: Some(error),
            },
        );
        let event = SessionEvent::failed(&termination, &usage, error, attempts);
        let events = match super::event_codec::encode(&[event]) {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "cannot record the failure");
                return;
            }
        };
        match store
            .fail_session(&lease, &termination, error, &events)
            .await
        {
            Ok(true) => {
                tracing::error!(session_id = %id, %error, "session failed");
                self.inner.metrics.termination(termination.reason.as_str());
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(session_id = %id, error = %e, "cannot record the failure"),
        }
    }

    /// Renews every local lease once; runners whose lease was lost are told to stop writing.
    pub async fn heartbeat(&self) {
        // Copies of what the renewal touches, taken in one pass: the
        // registry is not held while Postgres answers or while thousands of
        // clocks and views are updated (on a niced loop thread that may be
        // descheduled meanwhile, a status read would wait for it).
        let held: Vec<(Lease, Control, Arc<LiveView>)> = self
            .runners()
            .values()
            .flatten()
            .map(|h| (h.lease, h.control.clone(), h.view.clone()))
            .collect();
        if held.is_empty() {
            return;
        }
        let leases: Vec<Lease> = held.iter().map(|(lease, _, _)| *lease).collect();
        let started = Instant::now();
        let lease_cfg = self.inner.config.lease;
        match self.inner.store.renew_leases(&leases, lease_cfg.ttl).await {
            Ok(renewed) => {
                // Keyed by lease, not session: a stale runner of the same
                // session must not have its clock renewed.
                let renewed: HashMap<(Uuid, Uuid), _> = renewed
                    .into_iter()
                    .map(|r| ((r.session_id, r.token), r))
                    .collect();
                let mut exited = Vec::new();
                for (lease, control, view) in held {
                    let key = (lease.session_id, lease.token);
                    if !self.registered(&lease) {
                        // Its runner ended while the renewal ran: the renewal
                        // must not delay the rescue of what it left behind.
                        if renewed.contains_key(&key) {
                            exited.push(lease);
                        }
                        continue;
                    }
                    match renewed.get(&key) {
                        Some(r) => {
                            control
                                .lease_clock
                                .renewed(started, lease_cfg.ttl, lease_cfg.margin);
                            view.lease_renewed(r.lease_expires_at, r.heartbeat_at);
                            if r.stop_requested {
                                control.stop.cancel();
                            }
                            if r.pause_requested {
                                control.pause.store(true, Ordering::SeqCst);
                            }
                        }
                        // Finished meanwhile, or taken over: the runner's own
                        // fenced writes and lease clock end it either way.
                        None => {
                            tracing::debug!(session_id = %lease.session_id, "lease not renewed")
                        }
                    }
                }
                for lease in exited {
                    if let Err(e) = self.inner.store.expire_lease(&lease).await {
                        tracing::warn!(session_id = %lease.session_id, error = %e, "cannot give up an exited runner's lease");
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "lease renewal failed");
                // From the first failed write on, statuses from memory say
                // they may be behind.
                for (_, _, view) in &held {
                    view.write_failed();
                }
            }
        }
    }

    /// Takes over sessions whose owner stopped renewing its lease (or
    /// released it on shutdown), as many as this replica has room for, at
    /// most `WARDEN_CLAIMS_PER_TICK`.
    pub async fn rescue(&self) -> usize {
        self.rescue_up_to(self.inner.config.claims_per_tick).await
    }

    async fn rescue_up_to(&self, budget: usize) -> usize {
        let free = self.free_up_to(budget);
        if free == 0 {
            return 0;
        }
        let started = Instant::now();
        let store = &self.inner.store;
        let lease = self.inner.config.lease;
        // This replica's heartbeat in the fleet, and the fleet's load: a
        // survivor claims its fair share of the orphans, not all of them.
        let counts = match store
            .fleet_heartbeat(
                self.inner.replica_id,
                lease.heartbeat * fleet::MISSED_HEARTBEATS,
                &self.inner.config.capabilities.names(),
            )
            .await
        {
            Ok(counts) => counts,
            Err(err) => {
                tracing::warn!(error = %err, "fleet heartbeat failed");
                return 0;
            }
        };
        let share = fleet::fair_share(FleetLoad {
            live_replicas: u64::try_from(counts.live_replicas).unwrap_or(1),
            running: u64::try_from(counts.running).unwrap_or(0),
            orphans: u64::try_from(counts.orphans).unwrap_or(0),
            mine: self.taken() as u64,
            free: free as u64,
            budget: budget as u64,
        });
        if share == 0 {
            return 0;
        }
        let claimed = match store
            .claim_orphans(self.inner.replica_id, lease.ttl, share as i64)
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                tracing::warn!(error = %err, "rescue scan failed");
                return 0;
            }
        };
        let mut resumed = 0;
        let max_attempts = self.inner.config.max_attempts;
        for c in claimed {
            let id = c.lease.session_id;
            // The failure model: every rescue without progress since the
            // previous one is a failed attempt; after too many, end it. A
            // session released on shutdown (no previous owner) did not fail.
            let counted = match c.previous_owner {
                Some(_) => store.count_attempt(&c.lease).await,
                None => Ok(Some(Attempt {
                    attempts: 0,
                    last_error: None,
                })),
            };
            match counted {
                Ok(Some(attempt)) if attempt.attempts >= max_attempts => {
                    self.fail_attempts(c.lease, &attempt).await;
                    continue;
                }
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(session_id = %id, error = %err, "cannot count the attempt; leaving the session to the next rescue");
                    continue;
                }
            }
            tracing::info!(session_id = %id, previous_owner = ?c.previous_owner, "rescuing session");
            if self.start_claimed(c.lease, started).await {
                resumed += 1;
            }
        }
        resumed
    }

    /// A step a worker completed for a session whose owner went silent is
    /// not left waiting for the owner's lease to lapse: the lease ends now
    /// and this tick's rescue (or a peer's) collects the outcome. On the
    /// embedded server there is no other owner to go silent.
    async fn hand_over_done_steps(&self) {
        let store = &self.inner.store;
        if store.is_single_process() {
            return;
        }
        let silence = self.inner.config.lease.heartbeat * fleet::MISSED_HEARTBEATS;
        match store.expire_silent_owners_of_done_steps(silence).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                sessions = n,
                "silent owners' done worker steps handed to a rescue"
            ),
            Err(err) => tracing::warn!(error = %err, "cannot look for done steps of silent owners"),
        }
    }

    /// Claims queued sessions, oldest first, as many as this replica has
    /// room for and at most `budget`; returns how many started here.
    pub async fn claim_queued(&self, budget: usize) -> usize {
        let free = self.free_up_to(budget);
        if free == 0 {
            return 0;
        }
        let started = Instant::now();
        let store = &self.inner.store;
        let claimed = match store
            .claim_queued(
                self.inner.replica_id,
                self.inner.config.lease.ttl,
                free as i64,
                u64::try_from(self.inner.config.quotas.tenant_max_running).unwrap_or(0),
            )
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                tracing::warn!(error = %err, "queue claim failed");
                return 0;
            }
        };
        let mut spawned = 0;
        for lease in claimed {
            let id = lease.session_id;
            if self.start_claimed(lease, started).await {
                tracing::info!(session_id = %id, "queued session started");
                spawned += 1;
            }
        }
        spawned
    }

    /// Runs a session this replica has just claimed (rescued or from the
    /// queue) in a place of its own; when it cannot be rebuilt or started,
    /// the failure model takes the lease back. Whether it runs.
    async fn start_claimed(&self, lease: Lease, claimed_at: Instant) -> bool {
        let id = lease.session_id;
        let slot = self.take_slot();
        let started = match load_for_run(&self.inner.store, id).await {
            Ok((session, state)) => {
                self.spawn_in(slot, lease, claimed_at, &session, state)
                    .await
            }
            Err(err) => Err(err),
        };
        match started {
            Ok(()) => true,
            Err(err) => {
                tracing::error!(session_id = %id, error = %err, "cannot start a claimed session");
                self.after_store_failure(lease, &err.to_string()).await;
                false
            }
        }
    }

    /// One tick of the fleet's work: renew leases, rescue orphans, then
    /// claim from the queue, at most `WARDEN_CLAIMS_PER_TICK` in all.
    pub async fn tick(&self) {
        self.heartbeat().await;
        self.hand_over_done_steps().await;
        let budget = self.inner.config.claims_per_tick;
        let rescued = self.rescue_up_to(budget).await;
        self.claim_queued(budget.saturating_sub(rescued)).await;
        // Keeps the per-tenant counters' pending deltas few (see store::quotas).
        if let Err(err) = self.inner.store.fold_tenant_counts().await {
            tracing::warn!(error = %err, "folding tenant counts failed");
        }
    }

    /// Heartbeat, rescue and claims, forever (until shutdown); a place
    /// freed by an ending runner claims the next queued session at once.
    pub async fn maintain(self) {
        let interval = self.inner.config.lease.heartbeat;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.inner.closing.cancelled() => return,
                _ = ticker.tick() => self.tick().await,
                _ = self.inner.capacity.freed.notified() => {
                    self.claim_queued(self.inner.config.claims_per_tick).await;
                }
            }
        }
    }

    /// The per-tenant limit of calls on the server's own model, shared by
    /// pre-flight and reflection.
    pub fn model_calls(&self) -> &Arc<crate::ratelimit::TenantLimiter> {
        &self.inner.model_calls
    }

    /// Relays stop and pause requests sent to other replicas (NOTIFY makes
    /// them fast; the durable flags read at each commit and heartbeat are the truth),
    /// and the key changes of [`KEYS_CHANNEL`] to this process's key cache.
    /// On the embedded server they come through an in-process channel.
    pub async fn listen(self) {
        if let Some(mut notes) = self.inner.store.local_control() {
            loop {
                let note = tokio::select! {
                    _ = self.inner.closing.cancelled() => return,
                    note = notes.recv() => note,
                };
                match note {
                    Ok(note) => self.on_control(note),
                    // Missed notes: the durable flags still reach each loop
                    // at its next commit or heartbeat.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "control notes lagged; the durable flags still apply"
                        );
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
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
            if let Err(err) = listener
                .listen_all([CONTROL_CHANNEL, KEYS_CHANNEL, WORKERS_CHANNEL])
                .await
            {
                tracing::warn!(error = %err, "LISTEN failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // Key notes may have been missed while no listener was connected.
            self.inner.store.keys_changed_locally();
            self.inner.store.workers_changed_locally(WorkerChange::ANY);
            loop {
                let note = tokio::select! {
                    _ = self.inner.closing.cancelled() => return,
                    note = listener.recv() => note,
                };
                match note {
                    Ok(note) if note.channel() == KEYS_CHANNEL => {
                        self.inner.store.keys_changed_locally();
                    }
                    Ok(note) if note.channel() == WORKERS_CHANNEL => {
                        self.inner
                            .store
                            .workers_changed_locally(WorkerChange::from_payload(note.payload()));
                    }
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
        self.on_control(note);
    }

    fn on_control(&self, note: ControlNote) {
        match note.action {
            ControlAction::Stop => {
                self.signal_stop(note.session_id);
            }
            ControlAction::Pause => {
                self.signal_pause(note.session_id);
            }
            ControlAction::Changed => self.invalidate(note.session_id),
        }
    }

    /// Checkpoints and releases every running session, waiting up to `timeout`.
    pub async fn shutdown(&self, timeout: Duration) {
        self.inner.closing.cancel();
        // Out of the fleet first: peers share out what this replica
        // releases without counting it.
        self.leave_fleet().await;
        let waits: Vec<Done> = {
            let runners = self.runners();
            runners
                .values()
                .flatten()
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
        // Again, in case a heartbeat in flight wrote the row back meanwhile.
        self.leave_fleet().await;
    }

    /// Removes this replica's heartbeat row. Best effort: a row left behind
    /// ages out after two heartbeat intervals.
    async fn leave_fleet(&self) {
        if let Err(err) = self.inner.store.leave_fleet(self.inner.replica_id).await {
            tracing::warn!(error = %err, "cannot leave the fleet; peers stop counting this replica after two heartbeats");
        }
    }

    /// Kills every runner without a checkpoint, as a crash would (tests use it).
    pub fn abort_all(&self) {
        self.inner.closing.cancel();
        for handle in self.runners().values().flatten() {
            handle.abort.abort();
        }
    }
}
