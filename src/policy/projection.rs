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

/// Consecutive gate evaluations, one per step, whose projection overran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrunStreak {
    /// Step of the latest evaluation counted (0 before any).
    pub step: u64,
    /// Overrunning evaluations in a row, up to and including that step.
    pub count: u32,
}

impl OverrunStreak {
    /// The streak before an evaluation of `step`: a step evaluated again
    /// (after a throttle) does not count twice, and a gap breaks the streak.
    pub fn before(&self, step: u64) -> u32 {
        if self.step + 1 == step {
            self.count
        } else if self.step == step {
            self.count.saturating_sub(1)
        } else {
            0
        }
    }

    /// The streak after an evaluation of `step` that did (or did not) overrun.
    pub fn after(&self, step: u64, overran: bool) -> OverrunStreak {
        OverrunStreak {
            step,
            count: if overran {
                self.before(step).saturating_add(1)
            } else {
                0
            },
        }
    }
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

    #[test]
    fn streak_counts_consecutive_steps() {
        let s = OverrunStreak::default();
        let s = s.after(1, true);
        assert_eq!(s, OverrunStreak { step: 1, count: 1 });
        let s = s.after(2, true);
        assert_eq!(s.count, 2);
        let s = s.after(3, false);
        assert_eq!(s.count, 0);
        let s = s.after(4, true);
        assert_eq!(s.count, 1);
    }

    #[test]
    fn a_step_evaluated_again_counts_once() {
        let s = OverrunStreak::default().after(1, true).after(2, true);
        assert_eq!(s.before(2), 1);
        assert_eq!(s.after(2, true).count, 2);
        assert_eq!(s.after(2, false).count, 0);
        let quiet = OverrunStreak::default().after(1, true).after(2, false);
        assert_eq!(quiet.before(2), 0);
    }

    #[test]
    fn a_gap_breaks_the_streak() {
        let s = OverrunStreak::default().after(1, true).after(2, true);
        assert_eq!(s.before(5), 0);
        assert_eq!(s.after(5, true).count, 1);
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
