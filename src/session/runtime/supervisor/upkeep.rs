//! The fleet's work, each heartbeat: renew this replica's leases, rescue
//! sessions whose owner died, claim queued sessions, and end the sessions
//! that failed too often.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use uuid::Uuid;

use super::Supervisor;
use crate::event::SessionEvent;
use crate::policy::fleet::{self, FleetLoad};
use crate::policy::lifecycle::Reason;
use crate::policy::termination::{self, Facts};
use crate::session::runtime::live::LiveView;
use crate::session::runtime::rehydrate::load_for_run;
use crate::session::runtime::runner::Control;
use crate::store::{Attempt, Lease};

/// Leases renewed in one statement. A renewal holds its rows' locks until
/// it commits, and a stop, pause or commit of one of those sessions waits
/// for it: 100,000 leases in one statement held them for seconds (a stop's
/// p99 was 9 s, BENCHMARKS.md). A few hundred rows take milliseconds.
const RENEWAL_CHUNK: usize = 256;

/// A held lease with what its renewal updates: the runner's control and
/// its live view.
type Held = (Lease, Control, Arc<LiveView>);

impl Supervisor {
    /// After a runner stopped on a storage error: keep the error on the
    /// session (the failure model reports it) and give the lease up, so the
    /// next rescue (which counts the attempt) comes a heartbeat later, not a
    /// TTL. Best effort: the database may be what failed.
    pub(super) async fn after_store_failure(&self, lease: Lease, err: &str) {
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
    pub(super) async fn fail_now(&self, lease: Lease, reason: Reason, error: &str, attempts: i32) {
        let store = &self.inner.store;
        let id = lease.session_id;
        // This replica holds the lease: the session is its own to end.
        let (usage, limits) = match store.session(id, &crate::store::TenantScope::Global).await {
            Ok(Some(s)) => (s.usage(), s.limits.0),
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
        let events = match crate::session::event_codec::encode(&[event]) {
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

    /// Renews every local lease once, [`RENEWAL_CHUNK`] a statement, in
    /// session order; runners whose lease was lost are told to stop writing.
    pub async fn heartbeat(&self) {
        // Copies of what the renewal touches, taken in one pass: the
        // registry is not held while Postgres answers or while thousands of
        // clocks and views are updated (on a niced loop thread that may be
        // descheduled meanwhile, a status read would wait for it).
        let mut held: Vec<Held> = self
            .runners()
            .values()
            .flatten()
            .map(|h| (h.lease, h.control.clone(), h.view.clone()))
            .collect();
        // Session order is the order group commits lock rows in; each
        // chunk commits before the next locks anything.
        held.sort_unstable_by_key(|(lease, _, _)| lease.session_id);
        let mut chunks = held.chunks(RENEWAL_CHUNK);
        for chunk in chunks.by_ref() {
            if let Err(err) = self.renew_chunk(chunk).await {
                tracing::warn!(error = %err, "lease renewal failed");
                // From the first failed write on, statuses from memory say
                // they may be behind; the rest waits for the next heartbeat
                // rather than for a database that is not answering.
                for (_, _, view) in chunk.iter().chain(chunks.flatten()) {
                    view.write_failed();
                }
                return;
            }
        }
    }

    /// Renews one chunk of the heartbeat's leases in one statement and
    /// tells their runners the outcome.
    async fn renew_chunk(&self, held: &[Held]) -> crate::store::Result<()> {
        let leases: Vec<Lease> = held.iter().map(|(lease, _, _)| *lease).collect();
        let started = Instant::now();
        let lease_cfg = self.inner.config.lease;
        let renewed = self
            .inner
            .store
            .renew_leases(&leases, lease_cfg.ttl)
            .await?;
        // Keyed by lease, not session: a stale runner of the same session
        // must not have its clock renewed.
        let renewed: HashMap<(Uuid, Uuid), _> = renewed
            .into_iter()
            .map(|r| ((r.session_id, r.token), r))
            .collect();
        let mut exited = Vec::new();
        for (lease, control, view) in held {
            let key = (lease.session_id, lease.token);
            if !self.registered(lease) {
                // Its runner ended while the renewal ran: the renewal must
                // not delay the rescue of what it left behind.
                if renewed.contains_key(&key) {
                    exited.push(*lease);
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
                // Finished meanwhile, or taken over: the runner's own fenced
                // writes and lease clock end it either way.
                None => tracing::debug!(session_id = %lease.session_id, "lease not renewed"),
            }
        }
        for lease in exited {
            if let Err(e) = self.inner.store.expire_lease(&lease).await {
                tracing::warn!(session_id = %lease.session_id, error = %e, "cannot give up an exited runner's lease");
            }
        }
        Ok(())
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
}
