//! What retention removes, as pure decisions: when a session's workspace
//! leaves the disk, when an ended session is archived and deleted, how big
//! the pruner's batches are and how long it rests between them, and which
//! events of a long session compaction keeps.

use std::time::Duration;

/// What the database says of the session a workspace directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// No such session: it was deleted, or its create never committed.
    Missing,
    /// The session has not ended (running, queued, paused, awaiting refinement).
    Live,
    /// The session ended this long ago.
    EndedAgo(Duration),
}

/// A directory whose session is missing is kept this long after its last
/// change: the row of a session being created may not be visible yet.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(3_600);

/// Whether to remove a workspace: its session ended more than `retention`
/// ago, or it has no session and was untouched for [`ORPHAN_GRACE`]. A live
/// session's workspace is always kept.
pub fn remove_workspace(owner: Owner, untouched_for: Duration, retention: Duration) -> bool {
    match owner {
        Owner::Live => false,
        Owner::EndedAgo(ago) => ago > retention,
        Owner::Missing => untouched_for > ORPHAN_GRACE,
    }
}

/// How often to sweep for a given retention: a tenth of it, at least once a
/// second and at most once an hour, so a workspace outlives its retention
/// by a tenth at most (an hour at most).
pub fn sweep_every(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(3_600))
}

/// A tenant's own retention, as its `tenant_retention` row says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantRetention {
    /// No row: the server's `WARDEN_RETENTION_DAYS`.
    ServerDefault,
    /// A row without a duration: this tenant's sessions are kept forever.
    Forever,
    /// A row with a duration.
    Keep(Duration),
}

/// How long a tenant's ended sessions are kept; `None` is forever.
pub fn retention_of(server: Option<Duration>, tenant: TenantRetention) -> Option<Duration> {
    match tenant {
        TenantRetention::ServerDefault => server,
        TenantRetention::Forever => None,
        TenantRetention::Keep(keep) => Some(keep),
    }
}

/// Whether an ended session is archived and deleted now: it ended (or, if
/// it was imported from an archive, was imported) more than `retention`
/// ago. Nothing is due under a retention of forever.
pub fn archive_due(
    ended_ago: Duration,
    imported_ago: Option<Duration>,
    retention: Option<Duration>,
) -> bool {
    let Some(retention) = retention else {
        return false;
    };
    let age = imported_ago.map_or(ended_ago, |imported| imported.min(ended_ago));
    age > retention
}

/// Most sessions archived and deleted in one transaction.
pub const MAX_BATCH: usize = 50;
/// How long one batch should take at most: its transaction holds the
/// sessions it deletes, and on the embedded server the one connection.
pub const BATCH_TARGET: Duration = Duration::from_millis(250);
/// The shortest rest between two batches.
pub const MIN_PAUSE: Duration = Duration::from_millis(50);

/// The size of the next batch and the rest before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Sessions in the next batch.
    pub batch: usize,
    /// Rest before it starts.
    pub pause: Duration,
}

/// The first batch of a pass: small, until the time of one is known.
pub const FIRST_PACE: Pace = Pace {
    batch: 10,
    pause: Duration::ZERO,
};

/// The pace after a batch of `batch` sessions took `took`: halved when it
/// took longer than [`BATCH_TARGET`], grown by half when it took less than
/// half of it, within 1..=[`MAX_BATCH`]; the rest is twice as long as the
/// batch took (at least [`MIN_PAUSE`]), so the pruner works at most a third
/// of the time and the session loops keep the rest.
pub fn next_pace(batch: usize, took: Duration) -> Pace {
    let batch = if took > BATCH_TARGET {
        batch / 2
    } else if took < BATCH_TARGET / 2 {
        batch + batch / 2 + 1
    } else {
        batch
    };
    Pace {
        batch: batch.clamp(1, MAX_BATCH),
        pause: (took * 2).max(MIN_PAUSE),
    }
}

/// The kinds of event compaction may drop past the horizon: the routine
/// record of a step and of leases, all of which the iterations and the
/// session row keep too. Every other kind is kept: the decisions (gate,
/// stuck, guardrail), status changes (every end), reflections, the agent's
/// signals and what people did (stop, pause, resume, limits, refinement).
pub const COMPACTED_KINDS: &[&str] = &[
    "iteration_completed",
    "checkpoint_saved",
    "lease_acquired",
    "lease_released",
    "step_abandoned",
    "agent_output_sanitized",
    "context_wrap_up",
    "cycle_started",
    "tool_calls_limited",
    "reflection_deferred",
];

/// Whether compaction keeps an event: any of the latest `horizon` events
/// of its session (whose latest is `last_seq`); past them, every kind but
/// [`COMPACTED_KINDS`] and gate evaluations that decided `continue` (a
/// gate decision that changed nothing). A horizon of 0 keeps everything.
pub fn keep_event(kind: &str, gate_continued: bool, seq: i64, last_seq: i64, horizon: u64) -> bool {
    let horizon = i64::try_from(horizon).unwrap_or(i64::MAX);
    if horizon == 0 || seq > last_seq.saturating_sub(horizon) {
        return true;
    }
    if kind == "gate_decision" {
        return !gate_continued;
    }
    !COMPACTED_KINDS.contains(&kind)
}

/// Up to which sequence number a session's events are compacted now, or
/// `None` when too few new events passed the horizon since the last
/// compaction (`through_seq`) to be worth a pass: a tenth of the horizon.
pub fn compact_through(last_seq: i64, through_seq: i64, horizon: u64) -> Option<i64> {
    let horizon = i64::try_from(horizon).ok().filter(|h| *h > 0)?;
    let cut = last_seq.saturating_sub(horizon);
    (cut - through_seq >= (horizon / 10).max(1)).then_some(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: Duration = Duration::from_secs(7 * 86_400);
    const LONG: Duration = Duration::from_secs(365 * 86_400);

    #[test]
    fn sweeps_come_a_tenth_of_the_retention_apart_within_bounds() {
        assert_eq!(sweep_every(WEEK), Duration::from_secs(3_600));
        assert_eq!(
            sweep_every(Duration::from_secs(600)),
            Duration::from_secs(60)
        );
        assert_eq!(sweep_every(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(sweep_every(Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn a_live_sessions_workspace_is_kept_however_old() {
        assert!(!remove_workspace(Owner::Live, LONG, WEEK));
        assert!(!remove_workspace(Owner::Live, LONG, Duration::ZERO));
    }

    #[test]
    fn an_ended_sessions_workspace_goes_after_the_retention() {
        assert!(!remove_workspace(Owner::EndedAgo(WEEK), LONG, WEEK));
        assert!(remove_workspace(
            Owner::EndedAgo(WEEK + Duration::from_secs(1)),
            Duration::ZERO,
            WEEK
        ));
        assert!(!remove_workspace(
            Owner::EndedAgo(Duration::ZERO),
            LONG,
            WEEK
        ));
    }

    #[test]
    fn an_orphan_goes_after_the_grace_whatever_the_retention() {
        assert!(!remove_workspace(Owner::Missing, ORPHAN_GRACE, LONG));
        assert!(remove_workspace(
            Owner::Missing,
            ORPHAN_GRACE + Duration::from_secs(1),
            LONG
        ));
        assert!(!remove_workspace(
            Owner::Missing,
            Duration::ZERO,
            Duration::ZERO
        ));
    }

    #[test]
    fn a_tenants_row_wins_over_the_server_setting() {
        let day = Duration::from_secs(86_400);
        assert_eq!(
            retention_of(Some(WEEK), TenantRetention::ServerDefault),
            Some(WEEK)
        );
        assert_eq!(retention_of(None, TenantRetention::ServerDefault), None);
        assert_eq!(retention_of(Some(WEEK), TenantRetention::Forever), None);
        assert_eq!(retention_of(None, TenantRetention::Keep(day)), Some(day));
        assert_eq!(
            retention_of(Some(WEEK), TenantRetention::Keep(day)),
            Some(day)
        );
    }

    #[test]
    fn a_session_is_due_once_its_end_is_older_than_the_retention() {
        let over = WEEK + Duration::from_secs(1);
        assert!(archive_due(over, None, Some(WEEK)));
        assert!(!archive_due(WEEK, None, Some(WEEK)));
        assert!(!archive_due(Duration::ZERO, None, Some(WEEK)));
        assert!(archive_due(
            Duration::from_secs(1),
            None,
            Some(Duration::ZERO)
        ));
        assert!(!archive_due(LONG, None, None), "forever keeps everything");
    }

    #[test]
    fn an_imported_session_counts_its_retention_from_its_import() {
        let over = WEEK + Duration::from_secs(1);
        assert!(!archive_due(LONG, Some(Duration::from_secs(5)), Some(WEEK)));
        assert!(archive_due(LONG, Some(over), Some(WEEK)));
        // An import never makes a session older than its end.
        assert!(!archive_due(Duration::ZERO, Some(LONG), Some(WEEK)));
    }

    #[test]
    fn batches_shrink_when_slow_grow_when_fast_and_rest_twice_as_long_as_they_took() {
        let slow = BATCH_TARGET + Duration::from_millis(1);
        assert_eq!(next_pace(40, slow).batch, 20);
        assert_eq!(next_pace(1, slow).batch, 1, "never below one");
        assert_eq!(next_pace(40, slow).pause, slow * 2);
        let fast = Duration::from_millis(10);
        assert_eq!(next_pace(10, fast).batch, 16);
        assert_eq!(next_pace(40, fast).batch, MAX_BATCH, "never above the most");
        assert_eq!(next_pace(10, fast).pause, MIN_PAUSE);
        let steady = BATCH_TARGET * 3 / 4;
        assert_eq!(
            next_pace(12, steady),
            Pace {
                batch: 12,
                pause: steady * 2
            }
        );
        assert_eq!(next_pace(0, steady).batch, 1);
        // Growing from the first pace reaches the most within a few batches.
        let mut pace = FIRST_PACE;
        for _ in 0..5 {
            pace = next_pace(pace.batch, fast);
        }
        assert_eq!(pace.batch, MAX_BATCH);
    }

    #[test]
    fn compaction_keeps_the_latest_events_whole() {
        for kind in COMPACTED_KINDS {
            assert!(keep_event(kind, false, 91, 100, 10));
            assert!(keep_event(kind, false, 100, 100, 10));
            assert!(!keep_event(kind, false, 90, 100, 10));
            assert!(
                keep_event(kind, false, 1, 100, 0),
                "a horizon of 0 keeps all"
            );
            assert!(
                keep_event(kind, false, 1, 5, 10),
                "a short session keeps all"
            );
        }
    }

    #[test]
    fn compaction_keeps_decisions_ends_reflections_and_what_people_did() {
        for kind in [
            "gate_decision",
            "stuck_detected",
            "guardrail_tripped",
            "status_changed",
            "reflection",
            "agent_signal",
            "session_created",
            "stop_requested",
            "pause_requested",
            "resumed",
            "limits_changed",
            "mode_changed",
            "goal_refined",
            "refinement_suggested",
            "completion_verified",
            "completion_rejected",
            "criteria_generated",
            "cycle_summary_failed",
            "a_kind_added_later",
        ] {
            assert!(keep_event(kind, false, 1, 1_000, 10), "{kind}");
        }
        assert!(
            !keep_event("gate_decision", true, 1, 1_000, 10),
            "a gate evaluation that decided continue changed nothing"
        );
        assert!(keep_event("gate_decision", true, 995, 1_000, 10));
    }

    #[test]
    fn compaction_waits_for_a_tenth_of_the_horizon_of_new_events() {
        assert_eq!(compact_through(100, 0, 0), None, "off");
        assert_eq!(compact_through(10, 0, 20), None, "short session");
        assert_eq!(compact_through(21, 0, 20), None);
        assert_eq!(compact_through(22, 0, 20), Some(2));
        assert_eq!(compact_through(1_050, 0, 1_000), None);
        assert_eq!(compact_through(1_100, 0, 1_000), Some(100));
        assert_eq!(compact_through(1_150, 100, 1_000), None);
        assert_eq!(compact_through(1_200, 100, 1_000), Some(200));
        assert_eq!(compact_through(3, 0, 1), Some(2));
    }
}
