//! When a session's workspace is removed from the disk: a pure decision over
//! what the database says of the session and how old the directory is.

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
}
