//! A running session's status as this replica knows it from its own loop,
//! so `GET /{id}` for a session running here answers without Postgres.
//!
//! The view only ever holds what is committed: the loop applies a write to
//! it after Postgres confirmed the write, and hides it before the write that
//! ends the run. Writes the loop does not see field by field (a reflection,
//! a user's stop, pause or settings change, on this replica or announced by
//! another) make it stale; a status read from Postgres then refills it,
//! unless a write happened while that read ran (the generation changed).

use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::types::Json;

use crate::spec::ExecutorBrief;
use crate::store::{ControlFlags, Session};

/// Iterations committed per minute, oldest minute first.
pub type Velocity = Vec<(DateTime<Utc>, i64)>;

/// How far back the status's velocity goes, in minutes.
pub const VELOCITY_MINUTES: i32 = 30;

#[derive(Default)]
struct ViewState {
    /// The committed row; `None` while stale.
    record: Option<Session>,
    /// The last committed row the view held before it went stale or
    /// closed: answered, marked stale, when Postgres cannot be reached.
    last: Option<Session>,
    /// Iterations per minute; `None` until known.
    velocity: Option<Velocity>,
    /// Bumped by every write, so a refill read before one is discarded.
    generation: u64,
    /// The run is ending or ended: answer from Postgres from now on.
    closed: bool,
    /// An iteration commit is on its way: a read meanwhile may or may not
    /// include it, so it cannot refill (the velocity would count it twice).
    committing: bool,
    /// The step in flight, from its start until its iteration commits.
    step: Option<StepInFlight>,
    /// A write to Postgres failed since the last one that succeeded: the
    /// row may no longer be the latest, so statuses say `stale`.
    write_failed: bool,
}

/// Whether the row a view answers with is known to be the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Every write since it was taken succeeded.
    Confirmed,
    /// A write failed since: the row is the last committed state known.
    WriteFailed,
}

/// The in-memory status of one running session.
#[derive(Default)]
pub struct LiveView {
    state: Mutex<ViewState>,
}

/// The step in flight, as the loop recorded its start: kept apart from the
/// committed row (it is never written to Postgres) and shown while the
/// session runs here, stale row or not.
#[derive(Debug, Clone, PartialEq)]
pub struct StepInFlight {
    /// Its iteration number.
    pub iteration: u64,
    /// Its action, once the executor returned.
    pub action: Option<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// The session's running time when it started, ms.
    pub session_elapsed_ms: u64,
    /// Median duration of the recent steps the loop keeps, ms (none yet in a new session).
    pub median_step_ms: Option<u64>,
}

/// What the loop committed with an iteration, to apply to the view.
pub struct CommittedStep<'a> {
    /// The durable flags and settings the commit returned.
    pub flags: &'a ControlFlags,
    /// When the iteration finished (its velocity minute).
    pub finished_at: DateTime<Utc>,
    /// How the row changed: counters, progress, cycle.
    pub apply: &'a dyn Fn(&mut Session),
}

fn minute(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

/// `record` as the view keeps it: its executor's summary (made from the
/// spec, so it says all the status shows), not the spec itself, so a
/// waiting session does not hold its script twice.
fn compact(record: &Session) -> Session {
    let executor_summary = match &record.executor {
        Some(stored) => Json(ExecutorBrief::from(&stored.spec)),
        None => record.executor_summary.clone(),
    };
    Session {
        executor: None,
        executor_summary,
        ..record.clone()
    }
}

impl LiveView {
    /// A view of `record` as just committed; a session without iterations
    /// has an empty velocity, others learn theirs from the first refill.
    pub fn new(record: &Session) -> LiveView {
        LiveView {
            state: Mutex::new(ViewState {
                velocity: (record.iterations == 0).then(Vec::new),
                record: Some(compact(record)),
                last: None,
                generation: 0,
                closed: false,
                committing: false,
                step: None,
                write_failed: false,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, ViewState> {
        // A poisoned lock only means a panic elsewhere; the view is replaced whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The committed status and velocity, when fresh, and whether a write
    /// failed since.
    pub fn snapshot(&self) -> Option<(Session, Velocity, Freshness)> {
        let state = self.state();
        let freshness = if state.write_failed {
            Freshness::WriteFailed
        } else {
            Freshness::Confirmed
        };
        if state.closed {
            return None;
        }
        let record = state.record.clone()?;
        let since = Utc::now() - TimeDelta::minutes(i64::from(VELOCITY_MINUTES));
        // Postgres counts iterations finished after `since`; a minute is
        // shown when any of its iterations is.
        let since = minute(since);
        let velocity = state
            .velocity
            .as_ref()?
            .iter()
            .filter(|(m, _)| *m >= since)
            .copied()
            .collect();
        Some((record, velocity, freshness))
    }

    /// A write to Postgres failed (a lease renewal, a commit): from now
    /// until a write succeeds, a status from this view is marked stale.
    pub fn write_failed(&self) {
        self.state().write_failed = true;
    }

    /// The last committed status this view knew, fresh or not, and its
    /// velocity as far as known: what a status answers, marked stale, while
    /// Postgres cannot be reached.
    pub fn last_known(&self) -> Option<(Session, Velocity)> {
        let state = self.state();
        let record = state.record.as_ref().or(state.last.as_ref())?.clone();
        Some((record, state.velocity.clone().unwrap_or_default()))
    }

    /// The generation to pass to [`LiveView::refill`] after a read.
    pub fn generation(&self) -> u64 {
        self.state().generation
    }

    /// Takes a status read from Postgres, if no write happened since
    /// `generation` was taken (else the read may predate it).
    pub fn refill(&self, generation: u64, record: &Session, velocity: &Velocity) {
        let mut state = self.state();
        if state.closed || state.committing || state.generation != generation {
            return;
        }
        state.record = Some(compact(record));
        state.last = None;
        state.write_failed = false;
        state.velocity = Some(velocity.clone());
    }

    /// The step in flight, while the run goes on.
    pub fn step_in_flight(&self) -> Option<StepInFlight> {
        let state = self.state();
        if state.closed {
            return None;
        }
        state.step.clone()
    }

    /// A step started (no generation bump: the committed row is unchanged).
    pub fn step_started(&self, step: StepInFlight) {
        self.state().step = Some(step);
    }

    /// The executor returned the step in flight with `action`.
    pub fn step_returned(&self, action: &str) {
        if let Some(step) = self.state().step.as_mut() {
            step.action = Some(action.to_string());
        }
    }

    /// Something changed that the view cannot apply field by field.
    pub fn invalidate(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.keep_last();
    }

    /// The run is about to end: from now on Postgres answers.
    pub fn close(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.closed = true;
        state.step = None;
        state.keep_last();
    }

    /// An iteration commit is about to be sent.
    pub fn committing(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.committing = true;
    }

    /// Applies a committed iteration.
    pub fn committed(&self, step: CommittedStep<'_>) {
        let mut state = self.state();
        state.generation += 1;
        state.committing = false;
        state.write_failed = false;
        state.step = None;
        if let Some(velocity) = state.velocity.as_mut() {
            let m = minute(step.finished_at);
            match velocity.last_mut() {
                Some((last, n)) if *last == m => *n += 1,
                _ => velocity.push((m, 1)),
            }
            let keep = minute(Utc::now() - TimeDelta::minutes(i64::from(VELOCITY_MINUTES) + 1));
            velocity.retain(|(m, _)| *m >= keep);
        }
        if let Some(record) = state.record.as_mut() {
            (step.apply)(record);
            apply_flags(record, step.flags);
        }
    }

    /// Applies a committed write that returned the row's flags (a logged
    /// decision outside an iteration).
    pub fn appended(&self, flags: &ControlFlags) {
        let mut state = self.state();
        state.generation += 1;
        state.write_failed = false;
        if let Some(record) = state.record.as_mut() {
            apply_flags(record, flags);
        }
    }

    /// The lease was renewed until `expires_at`.
    pub fn lease_renewed(&self, expires_at: DateTime<Utc>, heartbeat_at: DateTime<Utc>) {
        let mut state = self.state();
        state.generation += 1;
        state.write_failed = false;
        if let Some(record) = state.record.as_mut() {
            record.lease_expires_at = Some(expires_at);
            record.heartbeat_at = Some(heartbeat_at);
        }
    }
}

impl ViewState {
    /// Makes the view stale, keeping its committed row as the last known.
    fn keep_last(&mut self) {
        if let Some(record) = self.record.take() {
            self.last = Some(record);
        }
    }
}

fn apply_flags(record: &mut Session, flags: &ControlFlags) {
    record.stop_requested = flags.stop_requested;
    record.pause_requested = flags.pause_requested;
    record.mode = flags.settings.mode;
    record.limits = Json(flags.settings.limits);
    record.last_event_seq = flags.last_event_seq;
    record.updated_at = flags.updated_at;
}

#[cfg(test)]
pub(crate) mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::policy::guardrails::tests::roomy;
    use crate::policy::lifecycle::{Mode, Status};
    use crate::store::SessionSettings;

    /// A running session's committed row.
    pub(crate) fn record() -> Session {
        let now = Utc::now();
        Session {
            id: Uuid::new_v4(),
            goal: "Write README.md".into(),
            mode: Mode::Fixed,
            status: Status::Running,
            reason: None,
            summary: None,
            reason_detail: None,
            original_goal: None,
            refinement: None,
            criteria: Json(Vec::new()),
            milestones: Json(Vec::new()),
            cycle: 1,
            memory: String::new(),
            refinement_tokens: 0,
            last_reflection: None,
            next_steps: Json(Vec::new()),
            percent_complete: None,
            eta_seconds: None,
            limits: Json(roomy()),
            executor: None,
            executor_summary: Json(ExecutorBrief {
                kind: "scripted".into(),
                ..ExecutorBrief::default()
            }),
            iterations: 0,
            tokens_used: 0,
            tool_calls: 0,
            consecutive_errors: 0,
            elapsed_ms: 0,
            reflection_tokens: 0,
            cost_usd: rust_decimal::Decimal::ZERO,
            unpriced_steps: 0,
            run: 1,
            checkpoint_saved: false,
            last_checkpoint_iteration: 0,
            stop_requested: false,
            pause_requested: false,
            guidance: None,
            last_event_seq: 2,
            owner: Some(Uuid::new_v4()),
            lease_expires_at: Some(now),
            heartbeat_at: Some(now),
            created_at: now,
            updated_at: now,
            ended_at: None,
            tenant: "t".into(),
            queue_position: None,
            queue_tenants: None,
            attempts: 0,
            last_error: None,
            imported_at: None,
            parent_id: None,
            lineage: Vec::new(),
            secrets_from: None,
            budget_tokens: None,
            children_tokens: 0,
            children_reserved_tokens: 0,
            children_count: 0,
            on_child_pause: Default::default(),
            budget_warnings: Json(Vec::new()),
            forked_from_session: None,
            forked_from_iteration: None,
            confirmation: None,
        }
    }

    fn flags(seq: i64) -> ControlFlags {
        ControlFlags {
            stop_requested: false,
            pause_requested: true,
            settings: SessionSettings {
                mode: Mode::Continuous,
                limits: roomy(),
            },
            last_event_seq: seq,
            updated_at: Utc::now(),
        }
    }

    fn commit(view: &LiveView, iterations: i64, seq: i64) {
        view.committed(CommittedStep {
            flags: &flags(seq),
            finished_at: Utc::now(),
            apply: &|r| r.iterations = iterations,
        });
    }

    #[test]
    fn a_commit_applies_its_counters_flags_and_velocity() {
        let view = LiveView::new(&record());
        commit(&view, 1, 4);
        commit(&view, 2, 6);
        let (r, velocity, freshness) = view.snapshot().expect("fresh");
        assert_eq!(freshness, Freshness::Confirmed);
        assert_eq!(r.iterations, 2);
        assert_eq!(r.last_event_seq, 6);
        assert_eq!(r.mode, Mode::Continuous);
        assert!(r.pause_requested);
        assert_eq!(velocity.iter().map(|(_, n)| n).sum::<i64>(), 2);
    }

    #[test]
    fn a_stale_view_answers_nothing_until_a_read_refills_it() {
        let view = LiveView::new(&record());
        view.invalidate();
        assert!(view.snapshot().is_none());
        let generation = view.generation();
        let mut read = record();
        read.iterations = 7;
        view.refill(generation, &read, &Vec::new());
        assert_eq!(view.snapshot().expect("refilled").0.iterations, 7);
    }

    #[test]
    fn a_failed_write_marks_the_view_until_a_write_succeeds() {
        let view = LiveView::new(&record());
        commit(&view, 1, 4);
        view.write_failed();
        let (r, _, freshness) = view.snapshot().expect("still answers");
        assert_eq!(freshness, Freshness::WriteFailed);
        assert_eq!(r.iterations, 1, "the last committed state");
        view.lease_renewed(Utc::now(), Utc::now());
        assert_eq!(view.snapshot().expect("fresh").2, Freshness::Confirmed);
        view.write_failed();
        commit(&view, 2, 6);
        assert_eq!(view.snapshot().expect("fresh").2, Freshness::Confirmed);
        view.write_failed();
        view.appended(&flags(7));
        assert_eq!(view.snapshot().expect("fresh").2, Freshness::Confirmed);
    }

    #[test]
    fn a_read_that_a_write_overtook_is_not_taken() {
        let view = LiveView::new(&record());
        view.invalidate();
        let generation = view.generation();
        // The loop commits while the read is in flight: the read may predate it.
        commit(&view, 3, 8);
        view.refill(generation, &record(), &Vec::new());
        assert!(view.snapshot().is_none());
    }

    #[test]
    fn a_read_during_a_commit_is_not_taken() {
        let view = LiveView::new(&record());
        view.invalidate();
        view.committing();
        // Taken while the commit is on its way: the read may include it.
        let generation = view.generation();
        view.refill(generation, &record(), &vec![(minute(Utc::now()), 1)]);
        assert!(view.snapshot().is_none());
        commit(&view, 1, 4);
        let generation = view.generation();
        view.refill(generation, &record(), &Vec::new());
        assert!(
            view.snapshot().is_some(),
            "after the commit, reads refill again"
        );
    }

    #[test]
    fn a_session_with_history_waits_for_its_velocity() {
        let mut r = record();
        r.iterations = 5;
        let view = LiveView::new(&r);
        assert!(view.snapshot().is_none(), "its velocity is in Postgres");
        let generation = view.generation();
        view.refill(generation, &r, &vec![(minute(Utc::now()), 5)]);
        assert_eq!(view.snapshot().expect("refilled").1[0].1, 5);
    }

    #[test]
    fn the_last_committed_state_outlives_staleness_and_closing() {
        let view = LiveView::new(&record());
        commit(&view, 3, 5);
        view.invalidate();
        assert!(view.snapshot().is_none());
        let (r, velocity) = view.last_known().expect("kept");
        assert_eq!(r.iterations, 3);
        assert_eq!(velocity.iter().map(|(_, n)| n).sum::<i64>(), 1);
        view.close();
        assert_eq!(view.last_known().expect("kept").0.iterations, 3);
        assert!(view.snapshot().is_none());
    }

    #[test]
    fn a_refill_replaces_the_last_known_state() {
        let view = LiveView::new(&record());
        view.invalidate();
        let generation = view.generation();
        let mut read = record();
        read.iterations = 9;
        view.refill(generation, &read, &Vec::new());
        assert_eq!(view.last_known().expect("known").0.iterations, 9);
    }

    fn in_flight(iteration: u64) -> StepInFlight {
        StepInFlight {
            iteration,
            action: None,
            started_at: Utc::now(),
            session_elapsed_ms: 1_000,
            median_step_ms: Some(200),
        }
    }

    #[test]
    fn a_step_is_in_flight_from_its_start_until_its_commit() {
        let view = LiveView::new(&record());
        assert_eq!(view.step_in_flight(), None);
        view.step_started(in_flight(1));
        view.invalidate();
        assert_eq!(
            view.step_in_flight().map(|s| s.iteration),
            Some(1),
            "a stale row does not hide the step in flight"
        );
        view.step_returned("write_file");
        assert_eq!(
            view.step_in_flight().and_then(|s| s.action).as_deref(),
            Some("write_file")
        );
        commit(&view, 1, 3);
        assert_eq!(view.step_in_flight(), None);
        view.step_started(in_flight(2));
        view.close();
        assert_eq!(view.step_in_flight(), None, "an ended run has no step");
    }

    #[test]
    fn a_closed_view_never_answers_again() {
        let view = LiveView::new(&record());
        view.close();
        let generation = view.generation();
        view.refill(generation, &record(), &Vec::new());
        commit(&view, 1, 3);
        assert!(view.snapshot().is_none());
    }
}
