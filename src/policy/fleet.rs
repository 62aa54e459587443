//! Decisions of the fleet about owners that may be gone: whether a stop can
//! wait for a session's owner or must land where it was received, how many
//! orphaned sessions one survivor claims, and what status a session whose
//! owner is gone shows. Pure: the caller passes the database's clock.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::lifecycle::Status;

/// Heartbeats an owner may miss before it counts as gone, though its lease
/// has not lapsed yet.
pub const MISSED_HEARTBEATS: u32 = 2;

/// What a replica that received a stop for a session it does not run knows
/// of the session's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerWatch {
    /// The lease lapsed or the owner stopped heartbeating: the receiving
    /// replica lands the stop itself.
    Gone,
    /// The owner may still land the stop; if it has not by this time, it
    /// counts as gone.
    AliveUntil(DateTime<Utc>),
}

/// Whether the owner of a running session is gone at `now`: its lease
/// lapsed (or there is none), or its last heartbeat is older than
/// [`MISSED_HEARTBEATS`] intervals of `heartbeat`. Otherwise, the time it
/// counts as gone by if nothing changes: the earlier of its lease's expiry
/// and that heartbeat deadline.
pub fn owner_watch(
    now: DateTime<Utc>,
    lease_expires_at: Option<DateTime<Utc>>,
    heartbeat_at: Option<DateTime<Utc>>,
    heartbeat: Duration,
) -> OwnerWatch {
    let Some(expires) = lease_expires_at else {
        return OwnerWatch::Gone;
    };
    let silence = heartbeat
        .checked_mul(MISSED_HEARTBEATS)
        .and_then(|d| TimeDelta::from_std(d).ok())
        .unwrap_or(TimeDelta::MAX);
    let deadline = match heartbeat_at.and_then(|at| at.checked_add_signed(silence)) {
        Some(silent_by) => expires.min(silent_by),
        None => expires,
    };
    if deadline <= now {
        OwnerWatch::Gone
    } else {
        OwnerWatch::AliveUntil(deadline)
    }
}

/// What one replica knows of the fleet when it rescues orphans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetLoad {
    /// Replicas that heartbeat recently, this one included (at least 1 is assumed).
    pub live_replicas: u64,
    /// Sessions running in the whole fleet, orphans included.
    pub running: u64,
    /// Running sessions whose lease lapsed: nobody runs them.
    pub orphans: u64,
    /// Sessions this replica runs (or is admitting).
    pub mine: u64,
    /// Free places under this replica's `WARDEN_MAX_RUNNING`.
    pub free: u64,
    /// Most sessions this replica may claim in this tick.
    pub budget: u64,
}

/// How many orphans this replica claims: enough to bring it up to an even
/// share of the fleet's running sessions (`ceil(running / live)`), never
/// more than there are orphans, free places or budget. Each survivor that
/// ticks in turn tops itself up to the same share, so after every live
/// replica ticked once no orphan is left while any has room, and none
/// takes them all.
pub fn fair_share(load: FleetLoad) -> u64 {
    let live = load.live_replicas.max(1);
    let target = load.running.div_ceil(live);
    target
        .saturating_sub(load.mine)
        .min(load.orphans)
        .min(load.free)
        .min(load.budget)
}

/// The status a session shows: `running` under a lease that lapsed more
/// than `unplaced_after` ago (every live replica rescues on each heartbeat,
/// so none had a place for it) means nothing runs it: it waits for a place
/// and shows `queued`. Every other status shows as stored.
pub fn shown_status(
    status: Status,
    lease_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    unplaced_after: Duration,
) -> Status {
    let grace = TimeDelta::from_std(unplaced_after).unwrap_or(TimeDelta::MAX);
    match (status, lease_expires_at) {
        (Status::Running, None) => Status::Queued,
        (Status::Running, Some(expires))
            if expires.checked_add_signed(grace).is_some_and(|t| t < now) =>
        {
            Status::Queued
        }
        (status, _) => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("valid time")
    }

    const HB: Duration = Duration::from_secs(5);

    #[test]
    fn an_owner_without_a_lease_is_gone() {
        assert_eq!(owner_watch(at(0), None, Some(at(0)), HB), OwnerWatch::Gone);
        assert_eq!(owner_watch(at(0), None, None, HB), OwnerWatch::Gone);
    }

    #[test]
    fn a_lapsed_lease_means_gone_even_with_a_fresh_heartbeat() {
        assert_eq!(
            owner_watch(at(10), Some(at(9)), Some(at(9)), HB),
            OwnerWatch::Gone
        );
        assert_eq!(
            owner_watch(at(10), Some(at(10)), Some(at(10)), HB),
            OwnerWatch::Gone,
            "a lease that ends now has ended"
        );
    }

    #[test]
    fn a_silent_owner_is_gone_before_its_lease_lapses() {
        // Lease until 15, last heartbeat at 0: silent for two intervals at 10.
        assert_eq!(
            owner_watch(at(10), Some(at(15)), Some(at(0)), HB),
            OwnerWatch::Gone
        );
        assert_eq!(
            owner_watch(at(9), Some(at(15)), Some(at(0)), HB),
            OwnerWatch::AliveUntil(at(10))
        );
    }

    #[test]
    fn a_heartbeating_owner_is_trusted_until_the_earlier_deadline() {
        assert_eq!(
            owner_watch(at(1), Some(at(15)), Some(at(0)), HB),
            OwnerWatch::AliveUntil(at(10))
        );
        // A lease shorter than two heartbeats bounds the wait.
        assert_eq!(
            owner_watch(at(1), Some(at(6)), Some(at(0)), HB),
            OwnerWatch::AliveUntil(at(6))
        );
        // Without a heartbeat on record, the lease alone decides.
        assert_eq!(
            owner_watch(at(1), Some(at(15)), None, HB),
            OwnerWatch::AliveUntil(at(15))
        );
    }

    #[test]
    fn a_huge_heartbeat_does_not_overflow() {
        assert_eq!(
            owner_watch(at(1), Some(at(15)), Some(at(0)), Duration::MAX),
            OwnerWatch::AliveUntil(at(15))
        );
    }

    fn load(live: u64, running: u64, orphans: u64, mine: u64) -> FleetLoad {
        FleetLoad {
            live_replicas: live,
            running,
            orphans,
            mine,
            free: 1_000,
            budget: 100,
        }
    }

    #[test]
    fn two_survivors_split_the_orphans_of_a_third() {
        // Three replicas of 10; one dies with 29 (its 10 + 19 more).
        let first = fair_share(load(2, 49, 29, 10));
        assert_eq!(first, 15);
        let second = fair_share(load(2, 49, 29 - first, 10));
        assert_eq!(second, 14);
        assert_eq!(first + second, 29, "no orphan left behind");
    }

    #[test]
    fn the_emptier_survivor_takes_more() {
        let busy = fair_share(load(2, 30, 10, 20));
        assert_eq!(busy, 0, "already above its share");
        assert_eq!(fair_share(load(2, 30, 10, 0)), 10);
    }

    #[test]
    fn a_lone_survivor_takes_every_orphan() {
        assert_eq!(fair_share(load(1, 29, 29, 0)), 29);
        assert_eq!(fair_share(load(1, 39, 29, 10)), 29);
    }

    #[test]
    fn no_live_replica_on_record_counts_as_one() {
        assert_eq!(fair_share(load(0, 5, 5, 0)), 5);
    }

    #[test]
    fn nothing_to_claim_without_orphans() {
        assert_eq!(fair_share(load(3, 30, 0, 0)), 0);
    }

    #[test]
    fn free_places_and_the_budget_bound_the_claim() {
        let mut l = load(2, 40, 40, 0);
        l.free = 3;
        assert_eq!(fair_share(l), 3);
        l.free = 1_000;
        l.budget = 7;
        assert_eq!(fair_share(l), 7);
        l.free = 0;
        assert_eq!(fair_share(l), 0);
    }

    #[test]
    fn rounding_up_leaves_no_orphan_behind() {
        // 3 orphans over 2 empty survivors: 2 and then 1.
        let first = fair_share(load(2, 3, 3, 0));
        assert_eq!(first, 2);
        assert_eq!(fair_share(load(2, 3, 3 - first, 0)), 1);
        // Every survivor counted, each ticking once, claims all orphans
        // for any split of the load.
        for live in 1..=4u64 {
            for orphans in 0..=20u64 {
                for spread in 0..=10u64 {
                    let mut mine: Vec<u64> = (0..live).map(|i| (spread * i) % 7).collect();
                    let running = mine.iter().sum::<u64>() + orphans;
                    let mut left = orphans;
                    for m in mine.iter_mut() {
                        let took = fair_share(load(live, running, left, *m));
                        left -= took;
                        *m += took;
                    }
                    assert_eq!(left, 0, "live {live}, orphans {orphans}, spread {spread}");
                }
            }
        }
    }

    #[test]
    fn a_running_session_long_under_a_lapsed_lease_shows_queued() {
        assert_eq!(
            shown_status(Status::Running, Some(at(0)), at(11), HB * 2),
            Status::Queued
        );
        assert_eq!(
            shown_status(Status::Running, None, at(1), HB * 2),
            Status::Queued
        );
    }

    #[test]
    fn a_lease_that_just_lapsed_still_shows_running_until_a_rescue_had_its_turn() {
        assert_eq!(
            shown_status(Status::Running, Some(at(0)), at(1), HB * 2),
            Status::Running
        );
        assert_eq!(
            shown_status(Status::Running, Some(at(0)), at(10), HB * 2),
            Status::Running,
            "exactly at the grace"
        );
        assert_eq!(
            shown_status(Status::Running, Some(at(2)), at(1), HB * 2),
            Status::Running
        );
        assert_eq!(
            shown_status(Status::Running, Some(at(0)), at(1), Duration::MAX),
            Status::Running
        );
    }

    #[test]
    fn other_statuses_show_as_stored() {
        for status in Status::ALL {
            if status == Status::Running {
                continue;
            }
            assert_eq!(shown_status(status, None, at(100), HB), status);
            assert_eq!(shown_status(status, Some(at(0)), at(100), HB), status);
        }
    }
}
