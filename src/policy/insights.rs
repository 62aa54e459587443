//! Learning from outcomes (issue 44 part 3, begun): how far the
//! reflector's `percentComplete` can be trusted, measured against where
//! sessions really ended — a reliability table: of the estimates in each
//! band (say 90 – 100 %), how many came from sessions that completed, and
//! how many of those completed within N further steps. Pure: the caller
//! reads the reflections and ends, this only counts.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One reflector estimate of an ended session.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The iteration it followed.
    pub after_iteration: u64,
    /// The percent complete it reported (0 – 100; others are ignored).
    pub percent_complete: f64,
}

/// An ended session as the table reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedSession {
    /// Its reflector's estimates, in any order.
    pub estimates: Vec<Estimate>,
    /// It completed (goal achieved).
    pub completed: bool,
    /// The iteration it ended at.
    pub ended_at: u64,
}

/// One band of the reliability table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReliabilityRow {
    /// The band's lowest percent (inclusive).
    pub from_percent: u8,
    /// The band's highest percent (exclusive, but 100 is in the last band).
    pub to_percent: u8,
    /// Estimates in the band.
    pub estimates: u64,
    /// Of them, from sessions that completed.
    pub completed: u64,
    /// For each horizon N asked for: estimates whose session completed
    /// within N further steps.
    pub completed_within: Vec<(u64, u64)>,
}

/// The reliability table over `sessions`, in bands `edges` apart (e.g.
/// `[0, 50, 90, 100]`: 0 – 50, 50 – 90, 90 – 100), with completion counted
/// within each of `horizons` steps. Edges that do not rise are skipped.
pub fn reliability(
    sessions: &[EndedSession],
    edges: &[u8],
    horizons: &[u64],
) -> Vec<ReliabilityRow> {
    let mut rows: Vec<ReliabilityRow> = edges
        .windows(2)
        .filter(|w| w[0] < w[1])
        .map(|w| ReliabilityRow {
            from_percent: w[0],
            to_percent: w[1],
            estimates: 0,
            completed: 0,
            completed_within: horizons.iter().map(|&n| (n, 0)).collect(),
        })
        .collect();
    let last = rows.len().saturating_sub(1);
    for session in sessions {
        for e in &session.estimates {
            let p = e.percent_complete;
            if !(0.0..=100.0).contains(&p) {
                continue;
            }
            let band = rows
                .iter()
                .position(|r| p >= f64::from(r.from_percent) && p < f64::from(r.to_percent));
            let band = band.or_else(|| {
                // 100 % (the top edge) belongs to the last band.
                rows.last()
                    .filter(|r| p == f64::from(r.to_percent))
                    .map(|_| last)
            });
            let Some(row) = band.and_then(|b| rows.get_mut(b)) else {
                continue;
            };
            row.estimates += 1;
            if !session.completed {
                continue;
            }
            row.completed += 1;
            let left = session.ended_at.saturating_sub(e.after_iteration);
            for (n, count) in &mut row.completed_within {
                *count += u64::from(left <= *n);
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(completed: bool, ended_at: u64, estimates: &[(u64, f64)]) -> EndedSession {
        EndedSession {
            estimates: estimates
                .iter()
                .map(|&(after_iteration, percent_complete)| Estimate {
                    after_iteration,
                    percent_complete,
                })
                .collect(),
            completed,
            ended_at,
        }
    }

    #[test]
    fn estimates_fall_in_their_band_and_completion_is_counted_within_each_horizon() {
        let sessions = [
            // Called 90 % at 10, done at 12: within 5 and 20.
            session(true, 12, &[(5, 40.0), (10, 90.0)]),
            // Called 95 % at 10, done at 30: within 20 and 50, not 5.
            session(true, 30, &[(10, 95.0)]),
            // Called 100 % at 8 and stopped: counted, never completed.
            session(false, 9, &[(8, 100.0)]),
            // Out of range: ignored.
            session(true, 3, &[(1, -1.0), (2, 101.0), (2, f64::NAN)]),
        ];
        let rows = reliability(&sessions, &[0, 50, 90, 100], &[5, 20]);
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[0].estimates, rows[0].completed), (1, 1));
        assert_eq!(rows[0].completed_within, vec![(5, 0), (20, 1)]);
        assert_eq!((rows[1].estimates, rows[1].completed), (0, 0));
        assert_eq!((rows[2].estimates, rows[2].completed), (3, 2));
        assert_eq!(rows[2].completed_within, vec![(5, 1), (20, 2)]);
    }

    #[test]
    fn edges_that_do_not_rise_make_no_band_and_no_edges_no_table() {
        assert!(reliability(&[], &[], &[5]).is_empty());
        assert!(reliability(&[], &[50], &[5]).is_empty());
        let rows = reliability(&[], &[0, 50, 50, 100], &[]);
        assert_eq!(
            rows.iter()
                .map(|r| (r.from_percent, r.to_percent))
                .collect::<Vec<_>>(),
            vec![(0, 50), (50, 100)]
        );
    }
}
