//! What finishing will cost: the tokens and iterations a session still needs
//! at the progress rate measured so far. The continue gate pauses a session
//! whose projection dwarfs its remaining budget, instead of letting it burn
//! the rest and stop at `cost_limit` with the work unfinished.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A progress estimate and the spend it was measured at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProgressSample {
    /// Percent complete reported (by a reflection or the executor).
    pub percent_complete: f64,
    /// Tokens used when it was reported.
    pub tokens: u64,
    /// Iterations committed when it was reported.
    pub iterations: u64,
}

/// Tokens and iterations still needed, with the estimate they come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Projection {
    /// Tokens still needed to reach 100 %.
    pub tokens_to_finish: u64,
    /// Iterations still needed to reach 100 %.
    pub iterations_to_finish: u64,
    /// Tokens spent per percent of progress so far.
    pub tokens_per_percent: f64,
    /// The estimate the rate comes from.
    pub basis: ProgressSample,
}

impl Projection {
    /// One sentence: what is left and the estimate it comes from.
    pub fn describe(&self) -> String {
        format!(
            "projected {} more tokens and {} more iterations to finish, at {:.0} tokens per percent ({}% complete after {} tokens and {} iterations)",
            self.tokens_to_finish,
            self.iterations_to_finish,
            self.tokens_per_percent,
            (self.basis.percent_complete * 10.0).round() / 10.0,
            self.basis.tokens,
            self.basis.iterations
        )
    }
}

/// Projects what is left at the rate `sample` shows, from the spend now.
///
/// `None` without a usable rate: no progress yet (0 % or less, or not a
/// number) or no tokens spent. At 100 % or more nothing is left. The
/// projected total is the sample's spend scaled to 100 %; what is left is
/// that total less what has been spent since (never below zero).
pub fn project(
    sample: &ProgressSample,
    tokens_now: u64,
    iterations_now: u64,
) -> Option<Projection> {
    let p = sample.percent_complete;
    if p.is_nan() || p <= 0.0 || p.is_infinite() || sample.tokens == 0 {
        return None;
    }
    let left = |spent_at_sample: u64, spent_now: u64| -> u64 {
        if p >= 100.0 {
            return 0;
        }
        let total = spent_at_sample as f64 * 100.0 / p;
        // `as` saturates at u64::MAX for huge values, which is what we want.
        (total - spent_now as f64).max(0.0).ceil() as u64
    };
    Some(Projection {
        tokens_to_finish: left(sample.tokens, tokens_now),
        iterations_to_finish: left(sample.iterations, iterations_now),
        tokens_per_percent: sample.tokens as f64 / p,
        basis: *sample,
    })
}

/// Whether a projection exceeds the tokens left by more than `margin` times;
/// an unlimited budget (`None`) is never overrun.
pub fn overruns(projection: &Projection, tokens_remaining: Option<u64>, margin: f64) -> bool {
    tokens_remaining
        .is_some_and(|left| projection.tokens_to_finish as f64 > left as f64 * margin.max(1.0))
}

/// The spend after a committed step and the progress estimate then in force:
/// the state one gate evaluation saw. Folded from committed data, so a
/// session rebuilt after a restart sees the same trail.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProgressPoint {
    /// Tokens used by then.
    pub tokens: u64,
    /// Iterations committed by then.
    pub iterations: u64,
    /// The latest progress estimate by then.
    pub sample: Option<ProgressSample>,
}

impl ProgressPoint {
    /// The projection at this point.
    pub fn projection(&self) -> Option<Projection> {
        self.sample
            .and_then(|s| project(&s, self.tokens, self.iterations))
    }
}

/// How many of the newest points in a row overran the tokens left at their
/// time; `tokens_remaining` is what is left after the newest point.
pub fn overrun_streak(trail: &[ProgressPoint], tokens_remaining: Option<u64>, margin: f64) -> u32 {
    let (Some(newest), Some(left_now)) = (trail.last(), tokens_remaining) else {
        return 0;
    };
    let streak = trail
        .iter()
        .rev()
        .take_while(|point| {
            let left_then = left_now.saturating_add(newest.tokens.saturating_sub(point.tokens));
            point
                .projection()
                .is_some_and(|p| overruns(&p, Some(left_then), margin))
        })
        .count();
    u32::try_from(streak).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(percent: f64, tokens: u64, iterations: u64) -> ProgressSample {
        ProgressSample {
            percent_complete: percent,
            tokens,
            iterations,
        }
    }

    #[test]
    fn projects_the_rest_at_the_rate_so_far() {
        // 25 % after 1000 tokens and 5 iterations: 4000 and 20 in total.
        let p = project(&sample(25.0, 1000, 5), 1000, 5).unwrap();
        assert_eq!(p.tokens_to_finish, 3000);
        assert_eq!(p.iterations_to_finish, 15);
        assert_eq!(p.tokens_per_percent, 40.0);
        assert_eq!(p.basis, sample(25.0, 1000, 5));
    }

    #[test]
    fn spend_since_the_estimate_is_taken_off() {
        let p = project(&sample(25.0, 1000, 5), 1600, 8).unwrap();
        assert_eq!(p.tokens_to_finish, 2400);
        assert_eq!(p.iterations_to_finish, 12);
        // Spending past the projected total leaves nothing, never less.
        let p = project(&sample(25.0, 1000, 5), 9000, 40).unwrap();
        assert_eq!((p.tokens_to_finish, p.iterations_to_finish), (0, 0));
    }

    #[test]
    fn fractions_round_up() {
        // 3 % after 100 tokens: 3333.3… in total.
        let p = project(&sample(3.0, 100, 1), 100, 1).unwrap();
        assert_eq!(p.tokens_to_finish, 3234);
        assert_eq!(p.iterations_to_finish, 33);
    }

    #[test]
    fn no_rate_no_projection() {
        for s in [
            sample(0.0, 1000, 5),
            sample(-5.0, 1000, 5),
            sample(f64::NAN, 1000, 5),
            sample(f64::INFINITY, 1000, 5),
            sample(50.0, 0, 5),
        ] {
            assert_eq!(project(&s, 1000, 5), None, "{s:?}");
        }
    }

    #[test]
    fn done_means_nothing_left() {
        for percent in [100.0, 150.0] {
            let p = project(&sample(percent, 1000, 5), 1000, 5).unwrap();
            assert_eq!((p.tokens_to_finish, p.iterations_to_finish), (0, 0));
        }
    }

    #[test]
    fn tiny_progress_saturates_instead_of_overflowing() {
        let p = project(&sample(f64::MIN_POSITIVE, u64::MAX, u64::MAX), 0, 0).unwrap();
        assert_eq!(p.tokens_to_finish, u64::MAX);
    }

    #[test]
    fn overrun_needs_more_than_margin_times_what_is_left() {
        let p = project(&sample(10.0, 1000, 2), 1000, 2).unwrap(); // 9000 left to do
        assert!(!overruns(&p, Some(4500), 2.0), "exactly twice is not over");
        assert!(overruns(&p, Some(4499), 2.0));
        assert!(!overruns(&p, Some(9000), 1.0));
        assert!(overruns(&p, Some(0), 2.0));
        assert!(!overruns(&p, None, 2.0), "unlimited budgets never overrun");
        // A margin below 1 would pause sessions that can still finish: it counts as 1.
        assert!(!overruns(&p, Some(9000), 0.5));
    }

    /// After step `n` of 100 equal steps of 100 tokens each.
    fn point(n: u64) -> ProgressPoint {
        ProgressPoint {
            tokens: n * 100,
            iterations: n,
            sample: Some(sample(n as f64, n * 100, n)),
        }
    }

    #[test]
    fn a_point_projects_from_its_own_spend() {
        let p = point(10).projection().unwrap();
        assert_eq!((p.tokens_to_finish, p.iterations_to_finish), (9000, 90));
        let none = ProgressPoint {
            sample: None,
            ..point(10)
        };
        assert_eq!(none.projection(), None);
    }

    #[test]
    fn streak_counts_the_newest_overrunning_points() {
        // 10 000 tokens needed in all; a budget of 2500 leaves 2500 - spent.
        let trail: Vec<_> = (1..=5).map(point).collect();
        // After step 5: 9500 needed, 2000 left: over by more than twice.
        // After step 1: 9900 needed, 2400 left: over as well. All five count.
        assert_eq!(overrun_streak(&trail, Some(2000), 2.0), 5);
        // 4600 left now: after step k, 10000 - 100k needed against
        // 2 × (5100 - 100k) allowed — over only from step 3 on.
        assert_eq!(overrun_streak(&trail, Some(4600), 2.0), 3);
        // A margin of 3 is over nowhere.
        assert_eq!(overrun_streak(&trail, Some(4600), 3.0), 0);
    }

    #[test]
    fn a_point_within_the_margin_breaks_the_streak() {
        let mut trail: Vec<_> = (1..=5).map(point).collect();
        trail[2].sample = None;
        assert_eq!(overrun_streak(&trail, Some(2000), 2.0), 2);
        trail[4].sample = None;
        assert_eq!(overrun_streak(&trail, Some(2000), 2.0), 0);
    }

    #[test]
    fn no_trail_or_no_budget_has_no_streak() {
        assert_eq!(overrun_streak(&[], Some(0), 2.0), 0);
        assert_eq!(overrun_streak(&[point(1)], None, 2.0), 0);
    }

    #[test]
    fn describes_itself_with_its_basis() {
        let p = project(&sample(12.34, 1000, 5), 1000, 5).unwrap();
        assert_eq!(
            p.describe(),
            "projected 7104 more tokens and 36 more iterations to finish, at 81 tokens per percent (12.3% complete after 1000 tokens and 5 iterations)"
        );
    }

    #[test]
    fn projection_serializes_with_its_basis() {
        let p = project(&sample(25.0, 1000, 5), 1000, 5).unwrap();
        assert_eq!(
            serde_json::to_value(p).unwrap(),
            json!({
                "tokens_to_finish": 3000, "iterations_to_finish": 15, "tokens_per_percent": 40.0,
                "basis": { "percent_complete": 25.0, "tokens": 1000, "iterations": 5 }
            })
        );
    }
}
