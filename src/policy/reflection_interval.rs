//! The adaptive reflection interval: after each reflection, how many steps
//! until the next one. A session reflects more often when something looks
//! wrong (the stuck detector sees a pattern, the gate's rework ratio climbs,
//! the reflector is uncertain or its `percentComplete` stalls), down to
//! every [`MIN_INTERVAL`] steps, and less often while progress is steady, up
//! to every [`MAX_INTERVAL`]. A session that set `limits.reflection_interval`
//! itself keeps that interval: the rule is off for it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::reflection::Progress;

/// The shortest adaptive interval: reflect every 5 steps while stuck.
pub const MIN_INTERVAL: u32 = 5;
/// The longest adaptive interval: every 20 steps while progress is steady.
pub const MAX_INTERVAL: u32 = 20;
/// A rework ratio at or above this shortens the interval (the gate pauses
/// at 0.3 by default: this looks again before it gets there).
pub const REWORK_RISING: f64 = 0.2;
/// An uncertainty the reflector reports at or above this shortens it.
pub const UNCERTAIN: f64 = 0.6;
/// Fewer percentage points of progress than this since the previous
/// estimate is a stall.
pub const STALL_POINTS: f64 = 2.0;

/// What the rule looks at after a reflection; recorded with every change.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IntervalInputs {
    /// The interval in force before this reflection.
    pub current: u32,
    /// Share of rework among the gate's recent window of steps, 0–1.
    pub rework_ratio: f64,
    /// The stuck detector sees a pattern in the recent steps.
    pub stuck: bool,
    /// The reflector's progress verdict; `None` when the reflection failed.
    #[schema(value_type = Option<String>)]
    pub progress: Option<Progress>,
    /// The reflector saw the agent loop.
    pub loop_detected: bool,
    /// The progress estimate before this reflection, percent.
    pub percent_before: Option<f64>,
    /// The reflector's estimate now, percent.
    pub percent_now: Option<f64>,
    /// The reflector's uncertainty, 0–1, when it gave one.
    pub uncertainty: Option<f64>,
}

/// Why the interval is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IntervalCause {
    /// The session set its interval: it stays.
    Fixed,
    /// The stuck detector or the reflector sees no progress or a loop.
    Stuck,
    /// The gate's rework ratio is rising.
    Rework,
    /// The reflector is uncertain.
    Uncertain,
    /// The progress estimate stalled since the last reflection.
    Stalled,
    /// Progress is good and the estimate advances.
    Steady,
    /// Nothing points either way (slow progress, a failed reflection).
    Hold,
}

/// The next interval and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalDecision {
    /// Steps until the next reflection.
    pub interval: u32,
    /// Why.
    pub cause: IntervalCause,
}

/// The interval after a reflection: `base` when the session set it
/// (`adaptive` false), otherwise the adaptive rule over `inputs`.
pub fn next_interval(adaptive: bool, base: u32, inputs: &IntervalInputs) -> IntervalDecision {
    if !adaptive {
        return IntervalDecision {
            interval: base.max(1),
            cause: IntervalCause::Fixed,
        };
    }
    let current = inputs.current.clamp(MIN_INTERVAL, MAX_INTERVAL);
    let shorter = (current / 2).max(MIN_INTERVAL);
    let (interval, cause) =
        if inputs.stuck || inputs.loop_detected || inputs.progress == Some(Progress::Stuck) {
            (MIN_INTERVAL, IntervalCause::Stuck)
        } else if inputs.rework_ratio >= REWORK_RISING {
            (shorter, IntervalCause::Rework)
        } else if inputs.uncertainty.is_some_and(|u| u >= UNCERTAIN) {
            (shorter, IntervalCause::Uncertain)
        } else if stalled(inputs) {
            (shorter, IntervalCause::Stalled)
        } else if inputs.progress == Some(Progress::Good) {
            (
                current.saturating_mul(2).min(MAX_INTERVAL),
                IntervalCause::Steady,
            )
        } else {
            (current, IntervalCause::Hold)
        };
    IntervalDecision { interval, cause }
}

/// Whether the estimate moved less than [`STALL_POINTS`] since the last one
/// (both known, the goal not yet reported done).
fn stalled(inputs: &IntervalInputs) -> bool {
    match (inputs.percent_before, inputs.percent_now) {
        (Some(before), Some(now)) => now < 100.0 && now - before < STALL_POINTS,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(current: u32) -> IntervalInputs {
        IntervalInputs {
            current,
            rework_ratio: 0.0,
            stuck: false,
            progress: Some(Progress::Good),
            loop_detected: false,
            percent_before: Some(20.0),
            percent_now: Some(40.0),
            uncertainty: Some(0.1),
        }
    }

    fn adapt(inputs: IntervalInputs) -> (u32, IntervalCause) {
        let d = next_interval(true, 10, &inputs);
        (d.interval, d.cause)
    }

    #[test]
    fn an_explicit_interval_is_kept_whatever_happens() {
        let mut i = steady(10);
        i.stuck = true;
        let d = next_interval(false, 7, &i);
        assert_eq!((d.interval, d.cause), (7, IntervalCause::Fixed));
        assert_eq!(next_interval(false, 0, &steady(3)).interval, 1);
    }

    #[test]
    fn steady_progress_doubles_up_to_the_maximum() {
        assert_eq!(adapt(steady(10)), (20, IntervalCause::Steady));
        assert_eq!(adapt(steady(20)), (20, IntervalCause::Steady));
        assert_eq!(adapt(steady(5)), (10, IntervalCause::Steady));
        assert_eq!(adapt(steady(8)), (16, IntervalCause::Steady));
        // A first estimate (nothing before it) with good progress is steady.
        let mut first = steady(10);
        first.percent_before = None;
        assert_eq!(adapt(first), (20, IntervalCause::Steady));
        // An interval from outside the range is brought into it first.
        assert_eq!(adapt(steady(1_000)), (20, IntervalCause::Steady));
    }

    #[test]
    fn stuck_in_any_form_drops_to_the_minimum() {
        for f in [
            |i: &mut IntervalInputs| i.stuck = true,
            |i: &mut IntervalInputs| i.loop_detected = true,
            |i: &mut IntervalInputs| i.progress = Some(Progress::Stuck),
        ] {
            let mut i = steady(20);
            f(&mut i);
            assert_eq!(adapt(i), (MIN_INTERVAL, IntervalCause::Stuck));
        }
    }

    #[test]
    fn rework_uncertainty_and_stalls_halve_down_to_the_minimum() {
        let mut rework = steady(20);
        rework.rework_ratio = REWORK_RISING;
        assert_eq!(adapt(rework), (10, IntervalCause::Rework));
        rework.current = 8;
        assert_eq!(adapt(rework), (5, IntervalCause::Rework));
        rework.rework_ratio = 0.19;
        assert_eq!(adapt(rework).1, IntervalCause::Steady);

        let mut unsure = steady(20);
        unsure.uncertainty = Some(UNCERTAIN);
        assert_eq!(adapt(unsure), (10, IntervalCause::Uncertain));
        unsure.uncertainty = Some(0.59);
        assert_eq!(adapt(unsure).1, IntervalCause::Steady);
        unsure.uncertainty = None;
        assert_eq!(adapt(unsure).1, IntervalCause::Steady);

        let mut stall = steady(10);
        stall.percent_now = Some(21.9);
        assert_eq!(adapt(stall), (5, IntervalCause::Stalled));
        stall.percent_now = Some(22.0);
        assert_eq!(adapt(stall).1, IntervalCause::Steady);
        // Going backwards is a stall too; reaching 100 is not.
        stall.percent_now = Some(10.0);
        assert_eq!(adapt(stall).1, IntervalCause::Stalled);
        stall.percent_before = Some(100.0);
        stall.percent_now = Some(100.0);
        assert_eq!(adapt(stall).1, IntervalCause::Steady);
    }

    #[test]
    fn the_signals_rank_stuck_rework_uncertain_stalled() {
        let mut all = steady(20);
        all.stuck = true;
        all.rework_ratio = 0.5;
        all.uncertainty = Some(0.9);
        all.percent_now = all.percent_before;
        assert_eq!(adapt(all).1, IntervalCause::Stuck);
        all.stuck = false;
        assert_eq!(adapt(all).1, IntervalCause::Rework);
        all.rework_ratio = 0.0;
        assert_eq!(adapt(all).1, IntervalCause::Uncertain);
        all.uncertainty = None;
        assert_eq!(adapt(all).1, IntervalCause::Stalled);
    }

    #[test]
    fn slow_progress_or_a_failed_reflection_holds() {
        let mut slow = steady(15);
        slow.progress = Some(Progress::Slow);
        assert_eq!(adapt(slow), (15, IntervalCause::Hold));
        let failed = IntervalInputs {
            progress: None,
            percent_now: None,
            uncertainty: None,
            ..steady(10)
        };
        assert_eq!(adapt(failed), (10, IntervalCause::Hold));
        // A failed reflection still sees the stuck detector and the gate.
        let stuck = IntervalInputs {
            stuck: true,
            ..failed
        };
        assert_eq!(adapt(stuck).1, IntervalCause::Stuck);
    }

    #[test]
    fn the_interval_always_lands_in_range() {
        let progresses = [
            None,
            Some(Progress::Good),
            Some(Progress::Slow),
            Some(Progress::Stuck),
        ];
        for current in [0, 1, 5, 7, 10, 19, 20, 21, 1_000, u32::MAX] {
            for progress in progresses {
                for rework_ratio in [0.0, 0.5] {
                    for stuck in [false, true] {
                        let i = IntervalInputs {
                            current,
                            rework_ratio,
                            stuck,
                            progress,
                            ..steady(current)
                        };
                        let got = next_interval(true, 10, &i).interval;
                        assert!(
                            (MIN_INTERVAL..=MAX_INTERVAL).contains(&got),
                            "{i:?} → {got}"
                        );
                    }
                }
            }
        }
    }
}
