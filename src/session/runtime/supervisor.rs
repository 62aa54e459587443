//! The supervisor: the registry of this replica's running sessions. It
//! spawns runners, signals them, renews their leases, rescues sessions whose
//! owner died, and relays stop/pause requests that reached other replicas.

mod listen;
mod spawn;
mod upkeep;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, watch};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::live::{Freshness, LiveView, StepInFlight, Velocity};
use super::reflector::Reflector;
use super::runner::Control;
use crate::config::Config;
use crate::llm::LlmClient;
use crate::metrics::Metrics;
use crate::store::{Lease, Session, Store};

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
    /// Sessions whose run ended with a stop requested, here or at another
    /// replica (relayed from the control channel).
    stops_ended: broadcast::Sender<Uuid>,
}

/// Stop endings a waiting stop may fall behind by before it reads the row
/// again anyway (a lagging receiver is told so).
const STOPS_ENDED: usize = 1_024;

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
                stops_ended: broadcast::channel(STOPS_ENDED).0,
            }),
        }
    }

    /// This process's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The sessions whose run ended with a stop requested, from now on:
    /// a stop waiting for another replica's owner wakes on its session's
    /// and reads the row, the truth, again.
    pub fn stops_ended(&self) -> broadcast::Receiver<Uuid> {
        self.inner.stops_ended.subscribe()
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

    /// The per-tenant limit of calls on the server's own model, shared by
    /// pre-flight and reflection.
    pub fn model_calls(&self) -> &Arc<crate::ratelimit::TenantLimiter> {
        &self.inner.model_calls
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
