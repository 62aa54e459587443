//! The time left of a running session, from how long its recent steps took:
//! the median step duration times the steps left, counting the part of the
//! step in flight already spent. A median, not a mean, so one slow step (a
//! model timeout, a long tool run) does not swing the estimate.

use serde::Serialize;
use utoipa::ToSchema;

/// Where the number of steps left comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepsLeftSource {
    /// The progress rate so far (`projected_iterations_to_finish`).
    Progress,
    /// The steps a scripted executor has left.
    Script,
    /// The iteration limit (`limits.max_iterations`).
    IterationLimit,
}

/// What a session has to go, by the bounds that are known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Iterations committed.
    pub committed: u64,
    /// The iteration limit.
    pub max_iterations: u64,
    /// Steps of a scripted executor that does not repeat.
    pub script_steps: Option<u64>,
    /// Iterations still needed at the progress rate so far.
    pub progress_iterations_to_finish: Option<u64>,
}

/// The figures an ETA rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct EtaBasis {
    /// Median duration of the recent steps, ms (the step in flight so far
    /// when no step has finished yet in this run).
    pub median_step_ms: u64,
    /// Steps left, the one in flight included.
    pub steps_left: u64,
    /// Where `steps_left` comes from.
    pub source: StepsLeftSource,
}

/// The median of `durations` (ms), the lower middle of an even count;
/// `None` when there are none.
pub fn median(durations: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut sorted: Vec<u64> = durations.into_iter().collect();
    sorted.sort_unstable();
    let n = sorted.len();
    (n > 0).then(|| sorted[(n - 1) / 2])
}

/// The fewest steps left by any known bound while step `committed + 1` is
/// in flight (it included, so at least 1), and which bound that is.
pub fn steps_left(bounds: &Bounds) -> (u64, StepsLeftSource) {
    let c = bounds.committed;
    let candidates = [
        bounds
            .progress_iterations_to_finish
            .map(|n| (n, StepsLeftSource::Progress)),
        bounds
            .script_steps
            .map(|n| (n.saturating_sub(c), StepsLeftSource::Script)),
        Some((
            bounds.max_iterations.saturating_sub(c),
            StepsLeftSource::IterationLimit,
        )),
    ];
    let (n, source) = candidates
        .into_iter()
        .flatten()
        .min_by_key(|(n, _)| *n)
        .unwrap_or((1, StepsLeftSource::IterationLimit));
    (n.max(1), source)
}

/// Milliseconds left: what the step in flight has left of a median step
/// (nothing once it has run longer), then a median step for each step after it.
pub fn eta_ms(median_step_ms: u64, steps_left: u64, spent_ms: u64) -> u64 {
    let current = median_step_ms.saturating_sub(spent_ms);
    let after = steps_left.saturating_sub(1).saturating_mul(median_step_ms);
    current.saturating_add(after)
}

/// The ETA in ms and its basis while a step is in flight for `spent_ms`,
/// given the recent steps' median (`None` before any step finished: the
/// step in flight so far stands in for it).
pub fn estimate(median_step_ms: Option<u64>, spent_ms: u64, bounds: &Bounds) -> (u64, EtaBasis) {
    let median_step_ms = median_step_ms.unwrap_or(spent_ms);
    let (steps_left, source) = steps_left(bounds);
    let eta = eta_ms(median_step_ms, steps_left, spent_ms);
    (
        eta,
        EtaBasis {
            median_step_ms,
            steps_left,
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_and_ignores_one_outlier() {
        assert_eq!(median([]), None);
        assert_eq!(median([7]), Some(7));
        assert_eq!(median([100, 30_000, 120]), Some(120));
        assert_eq!(median([4, 1, 3, 2]), Some(2));
    }

    #[test]
    fn the_tightest_bound_gives_the_steps_left() {
        let limit_only = Bounds {
            committed: 3,
            max_iterations: 10,
            ..Bounds::default()
        };
        assert_eq!(
            steps_left(&limit_only),
            (7, StepsLeftSource::IterationLimit)
        );
        let scripted = Bounds {
            script_steps: Some(5),
            ..limit_only
        };
        assert_eq!(steps_left(&scripted), (2, StepsLeftSource::Script));
        let progressing = Bounds {
            progress_iterations_to_finish: Some(1),
            ..scripted
        };
        assert_eq!(steps_left(&progressing), (1, StepsLeftSource::Progress));
    }

    #[test]
    fn the_step_in_flight_always_counts() {
        let done = Bounds {
            committed: 10,
            max_iterations: 10,
            script_steps: Some(4),
            progress_iterations_to_finish: Some(0),
        };
        assert_eq!(steps_left(&done).0, 1);
    }

    #[test]
    fn the_part_of_the_step_already_spent_is_counted() {
        // Three steps of 30 s left, 10 s into the first: 20 + 30 + 30.
        assert_eq!(eta_ms(30_000, 3, 10_000), 80_000);
        // A step running past the median has nothing left of it.
        assert_eq!(eta_ms(30_000, 3, 45_000), 60_000);
        assert_eq!(eta_ms(30_000, 1, 45_000), 0);
        assert_eq!(eta_ms(u64::MAX, u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn before_any_step_finished_the_step_in_flight_stands_in() {
        let bounds = Bounds {
            committed: 0,
            max_iterations: 4,
            ..Bounds::default()
        };
        let (eta, basis) = estimate(None, 2_000, &bounds);
        assert_eq!(basis.median_step_ms, 2_000);
        assert_eq!(basis.steps_left, 4);
        assert_eq!(eta, 6_000);
        let (eta, basis) = estimate(Some(500), 2_000, &bounds);
        assert_eq!((eta, basis.median_step_ms), (1_500, 500));
    }
}
