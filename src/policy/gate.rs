//! The continue gate: before every step, decide whether a long-running agent
//! should stop, pause for a person, slow down, checkpoint, or continue.
//! Long-run failures are rarely one bad call; they are loops that redo work or
//! burn tokens faster and faster, so the gate watches trends, not single steps.
//!
//! The decision table, first match wins:
//!
//! | decision | trigger |
//! |---|---|
//! | stop `coherence_low` | coherence < `coherence_min` (0.4) |
//! | stop `budget_exhausted` | tokens, then tool calls, then time left = 0 |
//! | pause `rework_loop` | rework ratio over the window > `rework_max` (0.3) |
//! | pause `uncertainty` | uncertainty > `uncertainty_max` (0.8) |
//! | pause `next_step_overrun` | the next step's projected cost ([`budget::project_next_step`]) exceeds the tokens left |
//! | pause `projected_overrun` | finishing projected over the margin for N evaluations in a row |
//! | pause `review_required` | steps since a person last looked ≥ the review interval ([`review_interval`]) |
//! | throttle | relative slope of the per-step token deltas > `slope_max` (0.02) |
//! | checkpoint | steps since the last checkpoint ≥ `checkpoint_every` (25) |
//! | continue | none of the above |
//!
//! The number of steps alone never stops a session: that is the iteration
//! guardrail's job (`max_iterations`), whose limit the user chose.

use serde::{Deserialize, Serialize};

use super::budget;
use super::lifecycle::Mode;
use super::projection::{self, ProgressPoint, Projection};

/// Thresholds of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateConfig {
    /// Stop when coherence is below this.
    pub coherence_min: f64,
    /// Default review point: pause a continuous session for a person after
    /// this many steps since one last started or resumed it (0 = never).
    /// Used only by sessions that do not set `review_every` themselves.
    pub review_every: u64,
    /// Pause when the rework ratio exceeds this.
    pub rework_max: f64,
    /// Steps over which the rework ratio is measured.
    pub rework_window: usize,
    /// Pause when uncertainty exceeds this.
    pub uncertainty_max: f64,
    /// Throttle when the relative spend slope exceeds this (per step).
    pub slope_max: f64,
    /// Steps over which the spend slope is fitted.
    pub slope_window: usize,
    /// Force a checkpoint after this many steps without one.
    pub checkpoint_every: u64,
    /// Pause when the projected tokens to finish exceed the tokens left by more than this factor...
    pub projection_margin: f64,
    /// ...for this many evaluations in a row.
    pub projection_evaluations: u32,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            coherence_min: 0.4,
            review_every: 100,
            rework_max: 0.3,
            rework_window: 10,
            uncertainty_max: 0.8,
            slope_max: 0.02,
            slope_window: 10,
            checkpoint_every: 25,
            projection_margin: 2.0,
            projection_evaluations: 3,
        }
    }
}

/// Remaining budgets; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens left.
    pub tokens_remaining: Option<u64>,
    /// Tool calls left.
    pub tool_calls_remaining: Option<u64>,
    /// Wall-clock milliseconds left.
    pub time_remaining_ms: Option<u64>,
}

/// What the gate looks at; serialized into the decision log (borrowed, so not deserializable).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GateInputs<'a> {
    /// Number of the step about to run (1-based).
    pub step: u64,
    /// Steps executed since the session last started or resumed.
    pub steps_since_start: u64,
    /// The session's mode: only continuous sessions have default review points.
    pub mode: Mode,
    /// The session's own `review_every`, when it set one (0 = never).
    pub review_every: Option<u64>,
    /// Tokens used by each recent committed step, oldest first.
    pub token_deltas: &'a [u64],
    /// Whether each recent committed step was rework, oldest first.
    pub rework_flags: &'a [bool],
    /// Tool calls so far in the session.
    pub tool_calls: u64,
    /// Coherence from the latest reflection; `None` before the first.
    pub coherence: Option<f64>,
    /// Uncertainty from the latest reflection; `None` before the first.
    pub uncertainty: Option<f64>,
    /// Budgets left.
    pub budget: Budget,
    /// Number of the last iteration covered by a checkpoint, 0 if none.
    pub last_checkpoint_step: u64,
    /// Spend and progress estimate after each recent committed step, oldest
    /// first: the newest is what finishing takes now, the run of overruns
    /// before it is how many evaluations in a row saw the budget fall short.
    /// Not logged: the metrics carry the projection and the streak.
    #[serde(skip)]
    pub progress_trail: &'a [ProgressPoint],
}

/// Which budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    /// Tokens.
    Tokens,
    /// Tool calls.
    ToolCalls,
    /// Wall clock.
    Time,
}

/// Why the gate stops the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// The work lost coherence with the goal.
    CoherenceLow,
    /// Earlier versions stopped here after a fixed number of steps without
    /// a person; kept so their logged decisions still read. Never decided now:
    /// that rule is the review point ([`PauseCause::ReviewRequired`]).
    StepLimit,
    /// A budget is used up.
    BudgetExhausted {
        /// Which budget.
        budget: BudgetKind,
    },
}

/// Why the gate pauses the session for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseCause {
    /// Too many recent steps redo earlier work.
    ReworkLoop,
    /// The agent is too uncertain.
    Uncertainty,
    /// At the progress rate so far, finishing needs far more tokens than are left.
    ProjectedOverrun,
    /// The next step, projected from the recent per-step costs, would not
    /// fit in the tokens left: paused before it spends.
    NextStepOverrun,
    /// A review point: `review_every` steps ran since a person last looked.
    ReviewRequired,
}

/// The gate's decision, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum GateDecision {
    /// Halt the session now.
    Stop {
        /// Why.
        cause: StopCause,
    },
    /// Stop and wait for a person.
    Pause {
        /// Why.
        cause: PauseCause,
    },
    /// Insert a cooldown before the step.
    Throttle,
    /// Save a checkpoint before the step.
    Checkpoint,
    /// Go on.
    Continue,
}

/// The measurements behind a decision, recorded with every evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateMetrics {
    /// Relative least-squares slope of the per-step token deltas, per step; `None` when not computable.
    pub spend_slope: Option<f64>,
    /// Share of rework among the last `rework_window` steps.
    pub rework_ratio: f64,
    /// Coherence used.
    pub coherence: Option<f64>,
    /// Uncertainty used.
    pub uncertainty: Option<f64>,
    /// Committed steps not covered by a checkpoint.
    pub steps_since_checkpoint: u64,
    /// Steps left until the gate forces a checkpoint.
    pub steps_until_checkpoint: u64,
    /// Steps since the last start or resume.
    pub steps_since_start: u64,
    /// The review interval in force; `None` when the session has no review point.
    #[serde(default)]
    pub review_every: Option<u64>,
    /// Steps left until the review point; `None` when there is none.
    #[serde(default)]
    pub steps_until_review: Option<u64>,
    /// The projection acted on.
    #[serde(default)]
    pub projection: Option<Projection>,
    /// Evaluations in a row, this one included, whose projection overran the budget.
    #[serde(default)]
    pub overrun_streak: u32,
    /// The next step's projected cost in tokens, from the recent per-step deltas.
    #[serde(default)]
    pub next_step_tokens: u64,
}

/// A decision together with the metrics it was based on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateEvaluation {
    /// The decision.
    pub decision: GateDecision,
    /// The metrics.
    pub metrics: GateMetrics,
}

/// Relative least-squares slope of the last `window` per-step token deltas (fitted change per step over their mean).
///
/// `None` until a full window exists, for windows shorter than 2 (no line to
/// fit) and when the mean is zero. Fitting deltas rather than cumulative
/// tokens means a steady spender has slope 0, whatever its rate.
pub fn spend_slope(deltas: &[u64], window: usize) -> Option<f64> {
    if window < 2 || deltas.len() < window {
        return None;
    }
    let ys = &deltas[deltas.len() - window..];
    let n = window as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().map(|&y| y as f64).sum::<f64>() / n;
    if mean_y <= 0.0 {
        return None;
    }
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, &y) in ys.iter().enumerate() {
        let dx = i as f64 - mean_x;
        sxy += dx * (y as f64 - mean_y);
        sxx += dx * dx;
    }
    // sxx > 0 whenever window >= 2, checked above.
    Some(sxy / sxx / mean_y)
}

/// Share of `true` among the last `window` flags, divided by the whole window; 0 when `window` is 0.
///
/// Dividing by the window rather than by the flags available means a young
/// session cannot cross the threshold on its first two or three steps.
pub fn rework_ratio(flags: &[bool], window: usize) -> f64 {
    if window == 0 {
        return 0.0;
    }
    let recent = &flags[flags.len().saturating_sub(window)..];
    recent.iter().filter(|&&f| f).count() as f64 / window as f64
}

/// The review interval a session runs under; `None` means no review point.
///
/// The session's own setting wins (0 = never). Without one, a continuous
/// session — which decides its own end — pauses every `default` steps
/// (0 = never), and a fixed-mode session runs to its iteration limit: that
/// limit is the user's own answer to "how long without me".
pub fn review_interval(default: u64, setting: Option<u64>, mode: Mode) -> Option<u64> {
    let every = match (setting, mode) {
        (Some(every), _) => every,
        (None, Mode::Continuous) => default,
        (None, Mode::Fixed) => 0,
    };
    (every > 0).then_some(every)
}

/// Evaluates the gate for the step about to run; the first matching decision wins.
pub fn evaluate(config: &GateConfig, inputs: &GateInputs<'_>) -> GateEvaluation {
    let review_every = review_interval(config.review_every, inputs.review_every, inputs.mode);
    let steps_since_checkpoint = inputs
        .step
        .saturating_sub(1)
        .saturating_sub(inputs.last_checkpoint_step);
    let metrics = GateMetrics {
        spend_slope: spend_slope(inputs.token_deltas, config.slope_window),
        rework_ratio: rework_ratio(inputs.rework_flags, config.rework_window),
        coherence: inputs.coherence,
        uncertainty: inputs.uncertainty,
        steps_since_checkpoint,
        steps_until_checkpoint: config
            .checkpoint_every
            .saturating_sub(steps_since_checkpoint),
        steps_since_start: inputs.steps_since_start,
        review_every,
        steps_until_review: review_every
            .map(|every| every.saturating_sub(inputs.steps_since_start)),
        projection: inputs
            .progress_trail
            .last()
            .and_then(ProgressPoint::projection),
        overrun_streak: projection::overrun_streak(
            inputs.progress_trail,
            inputs.budget.tokens_remaining,
            config.projection_margin,
        ),
        next_step_tokens: budget::project_next_step(inputs.token_deltas),
    };
    GateEvaluation {
        decision: decide(config, inputs, &metrics),
        metrics,
    }
}

/// The priority ladder over already computed metrics.
fn decide(config: &GateConfig, inputs: &GateInputs<'_>, metrics: &GateMetrics) -> GateDecision {
    let budget = inputs.budget;
    let exhausted = [
        (budget.tokens_remaining, BudgetKind::Tokens),
        (budget.tool_calls_remaining, BudgetKind::ToolCalls),
        (budget.time_remaining_ms, BudgetKind::Time),
    ]
    .into_iter()
    .find(|(left, _)| *left == Some(0))
    .map(|(_, kind)| kind);

    if metrics.coherence.is_some_and(|c| c < config.coherence_min) {
        GateDecision::Stop {
            cause: StopCause::CoherenceLow,
        }
    } else if let Some(budget) = exhausted {
        GateDecision::Stop {
            cause: StopCause::BudgetExhausted { budget },
        }
    } else if metrics.rework_ratio > config.rework_max {
        GateDecision::Pause {
            cause: PauseCause::ReworkLoop,
        }
    } else if metrics
        .uncertainty
        .is_some_and(|u| u > config.uncertainty_max)
    {
        GateDecision::Pause {
            cause: PauseCause::Uncertainty,
        }
    } else if budget
        .tokens_remaining
        .is_some_and(|left| metrics.next_step_tokens > left)
    {
        GateDecision::Pause {
            cause: PauseCause::NextStepOverrun,
        }
    } else if metrics.overrun_streak >= config.projection_evaluations.max(1) {
        GateDecision::Pause {
            cause: PauseCause::ProjectedOverrun,
        }
    } else if metrics.steps_until_review == Some(0) {
        // Deliberately blind to checkpoints: a review point is about how
        // long no person has looked, and a checkpoint is not a person looking.
        GateDecision::Pause {
            cause: PauseCause::ReviewRequired,
        }
    } else if metrics.spend_slope.is_some_and(|s| s > config.slope_max) {
        GateDecision::Throttle
    } else if metrics.steps_since_checkpoint >= config.checkpoint_every {
        GateDecision::Checkpoint
    } else {
        GateDecision::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const STEADY: [u64; 10] = [100; 10];
    const NO_REWORK: [bool; 10] = [false; 10];
    /// Relative slope 76/473 ≈ 0.1607 per step.
    const ACCELERATING: [u64; 10] = [100, 110, 125, 145, 170, 200, 240, 290, 350, 420];
    /// Four reworks in ten: ratio 0.4.
    const REWORKY: [bool; 10] = [
        true, false, true, false, true, false, true, false, false, false,
    ];
    /// Three reworks in ten: ratio exactly 0.3.
    const REWORK_AT_MAX: [bool; 10] = [
        true, true, true, false, false, false, false, false, false, false,
    ];
    /// Linear 91..=109 step 2: slope 2, mean 100, relative slope exactly 0.02.
    const SLOPE_AT_MAX: [u64; 10] = [91, 93, 95, 97, 99, 101, 103, 105, 107, 109];
    /// Linear 90..=108 step 2: slope 2, mean 99, relative slope 2/99 ≈ 0.0202.
    const SLOPE_JUST_OVER: [u64; 10] = [90, 92, 94, 96, 98, 100, 102, 104, 106, 108];
    /// Noisy around 100 with a slightly falling fit: relative slope exactly -1/150.
    const NOISY_FLAT: [u64; 10] = [120, 80, 110, 90, 130, 70, 100, 100, 95, 105];

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() < 1e-12
    }

    /// Inputs under which every check passes.
    fn calm() -> GateInputs<'static> {
        GateInputs {
            step: 11,
            steps_since_start: 10,
            mode: Mode::Continuous,
            review_every: None,
            token_deltas: &STEADY,
            rework_flags: &NO_REWORK,
            tool_calls: 10,
            coherence: Some(0.9),
            uncertainty: Some(0.1),
            budget: Budget {
                tokens_remaining: Some(1_000),
                tool_calls_remaining: Some(100),
                time_remaining_ms: Some(60_000),
            },
            last_checkpoint_step: 10,
            progress_trail: &[],
        }
    }

    fn decide(inputs: &GateInputs<'_>) -> GateDecision {
        evaluate(&GateConfig::default(), inputs).decision
    }

    fn stop(cause: StopCause) -> GateDecision {
        GateDecision::Stop { cause }
    }

    fn pause(cause: PauseCause) -> GateDecision {
        GateDecision::Pause { cause }
    }

    fn budget_stop(budget: BudgetKind) -> GateDecision {
        stop(StopCause::BudgetExhausted { budget })
    }

    // ---- defaults ----

    #[test]
    fn default_config_matches_the_design() {
        assert_eq!(
            GateConfig::default(),
            GateConfig {
                coherence_min: 0.4,
                review_every: 100,
                rework_max: 0.3,
                rework_window: 10,
                uncertainty_max: 0.8,
                slope_max: 0.02,
                slope_window: 10,
                checkpoint_every: 25,
                projection_margin: 2.0,
                projection_evaluations: 3,
            }
        );
        assert_eq!(
            Budget::default(),
            Budget {
                tokens_remaining: None,
                tool_calls_remaining: None,
                time_remaining_ms: None,
            }
        );
    }

    #[test]
    fn calm_inputs_continue() {
        assert_eq!(decide(&calm()), GateDecision::Continue);
    }

    // ---- spend slope ----

    #[test]
    fn steady_spend_of_100_tokens_per_step_has_zero_slope() {
        assert_eq!(spend_slope(&STEADY, 10), Some(0.0));
        assert_eq!(decide(&calm()), GateDecision::Continue);
    }

    #[test]
    fn constant_per_step_spend_has_zero_slope_whatever_the_rate() {
        for rate in [1u64, 7, 100, 5_000, 1_000_000] {
            let deltas = [rate; 12];
            assert_eq!(spend_slope(&deltas, 10), Some(0.0), "rate {rate}");
            let mut inputs = calm();
            inputs.token_deltas = &deltas;
            // Unlimited tokens: only the slope is looked at here.
            inputs.budget.tokens_remaining = None;
            assert_eq!(decide(&inputs), GateDecision::Continue, "rate {rate}");
        }
    }

    #[test]
    fn fitting_cumulative_tokens_would_wrongly_throttle_a_steady_spender() {
        // The mistake the design warns about: the cumulative series of a
        // steady 100 tokens/step is 100, 200, ..., 1000, whose relative slope
        // is 100/550 and would throttle. The gate fits the deltas: slope 0.
        let cumulative: Vec<u64> = (1..=10).map(|i| i * 100).collect();
        let wrong = spend_slope(&cumulative, 10).unwrap_or(f64::NAN);
        assert!(close(wrong, 100.0 / 550.0), "{wrong}");
        assert!(wrong > GateConfig::default().slope_max);
        assert_eq!(spend_slope(&STEADY, 10), Some(0.0));
    }

    #[test]
    fn accelerating_spend_throttles() {
        let slope = spend_slope(&ACCELERATING, 10).unwrap_or(f64::NAN);
        assert!(close(slope, 76.0 / 473.0), "{slope}");
        let mut inputs = calm();
        inputs.token_deltas = &ACCELERATING;
        assert_eq!(decide(&inputs), GateDecision::Throttle);
    }

    #[test]
    fn decelerating_spend_does_not_throttle() {
        let mut falling = ACCELERATING;
        falling.reverse();
        let slope = spend_slope(&falling, 10).unwrap_or(f64::NAN);
        assert!(close(slope, -76.0 / 473.0), "{slope}");
        let mut inputs = calm();
        inputs.token_deltas = &falling;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn noisy_but_flat_spend_does_not_throttle() {
        let slope = spend_slope(&NOISY_FLAT, 10).unwrap_or(f64::NAN);
        assert!(close(slope, -1.0 / 150.0), "{slope}");
        let mut inputs = calm();
        inputs.token_deltas = &NOISY_FLAT;
        assert_eq!(decide(&inputs), GateDecision::Continue);
        // A single late spike of 2 % is noise, not acceleration: 2/1837.
        let spike = [100, 100, 100, 100, 100, 100, 100, 100, 100, 102];
        let slope = spend_slope(&spike, 10).unwrap_or(f64::NAN);
        assert!(close(slope, 2.0 / 1837.0), "{slope}");
        inputs.token_deltas = &spike;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn slope_is_exact_for_a_linear_series() {
        // 10, 20, ..., 100: slope 10 per step, mean 55.
        let linear: Vec<u64> = (1..=10).map(|i| i * 10).collect();
        let slope = spend_slope(&linear, 10).unwrap_or(f64::NAN);
        assert!(close(slope, 10.0 / 55.0), "{slope}");
        // A two-point window is the plain difference over the mean.
        assert_eq!(spend_slope(&[100, 300], 2), Some(1.0));
    }

    #[test]
    fn slope_at_threshold_continues_and_just_over_throttles() {
        assert_eq!(spend_slope(&SLOPE_AT_MAX, 10), Some(0.02));
        let over = spend_slope(&SLOPE_JUST_OVER, 10).unwrap_or(f64::NAN);
        assert!(close(over, 2.0 / 99.0), "{over}");
        let mut inputs = calm();
        inputs.token_deltas = &SLOPE_AT_MAX;
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.token_deltas = &SLOPE_JUST_OVER;
        assert_eq!(decide(&inputs), GateDecision::Throttle);
    }

    #[test]
    fn slope_uses_only_the_last_window() {
        let mut series = vec![1u64, 1_000, 1, 1_000];
        series.extend_from_slice(&STEADY);
        assert_eq!(spend_slope(&series, 10), Some(0.0));
        let mut series = ACCELERATING.to_vec();
        series.extend_from_slice(&STEADY);
        assert_eq!(spend_slope(&series, 10), Some(0.0));
        // Old steady spend does not dilute a recent acceleration.
        let mut series = STEADY.to_vec();
        series.extend_from_slice(&ACCELERATING);
        let slope = spend_slope(&series, 10).unwrap_or(f64::NAN);
        assert!(close(slope, 76.0 / 473.0), "{slope}");
    }

    #[test]
    fn fewer_than_a_full_window_gives_no_slope() {
        assert_eq!(spend_slope(&[], 10), None);
        assert_eq!(spend_slope(&[100], 10), None);
        assert_eq!(spend_slope(&ACCELERATING[..9], 10), None);
        assert!(spend_slope(&ACCELERATING, 10).is_some());
        // Even a steep short series is not judged.
        let short = [10, 100, 1_000];
        let mut inputs = calm();
        inputs.token_deltas = &short;
        inputs.budget.tokens_remaining = None;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.spend_slope, None);
    }

    #[test]
    fn degenerate_windows_and_zero_spend_give_no_slope() {
        assert_eq!(spend_slope(&[1, 2, 3], 0), None);
        assert_eq!(spend_slope(&[1, 2, 3], 1), None);
        assert_eq!(spend_slope(&[0; 10], 10), None);
        // Zero spend in the window, even after earlier spend.
        let mut series = vec![500u64; 5];
        series.extend_from_slice(&[0; 10]);
        assert_eq!(spend_slope(&series, 10), None);
    }

    #[test]
    fn huge_deltas_do_not_overflow() {
        assert_eq!(spend_slope(&[u64::MAX; 10], 10), Some(0.0));
        let slope = spend_slope(&[0, u64::MAX], 2).unwrap_or(f64::NAN);
        assert!(close(slope, 2.0), "{slope}");
    }

    // ---- rework ratio ----

    #[test]
    fn rework_ratio_divides_by_the_whole_window() {
        assert_eq!(rework_ratio(&[true, true], 10), 0.2);
        assert_eq!(rework_ratio(&[true, true, true], 10), 0.3);
        assert_eq!(rework_ratio(&REWORKY, 10), 0.4);
        assert_eq!(rework_ratio(&[true; 10], 10), 1.0);
        assert_eq!(rework_ratio(&[true; 25], 10), 1.0);
        assert_eq!(rework_ratio(&[], 10), 0.0);
        assert_eq!(rework_ratio(&NO_REWORK, 10), 0.0);
        assert_eq!(rework_ratio(&[true; 4], 4), 1.0);
    }

    #[test]
    fn rework_ratio_counts_only_the_last_window() {
        let mut old_rework = vec![true; 10];
        old_rework.extend_from_slice(&[false; 10]);
        assert_eq!(rework_ratio(&old_rework, 10), 0.0);
        let mut recent_rework = vec![false; 10];
        recent_rework.extend_from_slice(&[true; 5]);
        assert_eq!(rework_ratio(&recent_rework, 10), 0.5);
    }

    #[test]
    fn rework_ratio_with_zero_window_is_zero() {
        assert_eq!(rework_ratio(&[true], 0), 0.0);
        assert_eq!(rework_ratio(&[], 0), 0.0);
    }

    #[test]
    fn a_young_session_cannot_hit_the_rework_threshold_early() {
        // Three steps, all rework: 3/10 = 0.3, not above 0.3.
        let mut inputs = calm();
        let flags = [true; 3];
        inputs.rework_flags = &flags;
        assert_eq!(decide(&inputs), GateDecision::Continue);
        let flags = [true; 4];
        inputs.rework_flags = &flags;
        assert_eq!(decide(&inputs), pause(PauseCause::ReworkLoop));
    }

    #[test]
    fn rework_at_threshold_continues_and_just_over_pauses() {
        let mut inputs = calm();
        inputs.rework_flags = &REWORK_AT_MAX;
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.rework_flags = &REWORKY;
        assert_eq!(decide(&inputs), pause(PauseCause::ReworkLoop));
    }

    // ---- single-trigger boundaries ----

    #[test]
    fn coherence_at_threshold_continues_and_just_below_stops() {
        let mut inputs = calm();
        inputs.coherence = Some(0.4);
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.coherence = Some(0.4f64.next_down());
        assert_eq!(decide(&inputs), stop(StopCause::CoherenceLow));
        inputs.coherence = Some(0.0);
        assert_eq!(decide(&inputs), stop(StopCause::CoherenceLow));
    }

    #[test]
    fn missing_coherence_and_uncertainty_skip_their_checks() {
        let mut inputs = calm();
        inputs.coherence = None;
        inputs.uncertainty = None;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.coherence, None);
        assert_eq!(eval.metrics.uncertainty, None);
    }

    #[test]
    fn uncertainty_at_threshold_continues_and_just_over_pauses() {
        let mut inputs = calm();
        inputs.uncertainty = Some(0.8);
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.uncertainty = Some(0.8f64.next_up());
        assert_eq!(decide(&inputs), pause(PauseCause::Uncertainty));
        inputs.uncertainty = Some(1.0);
        assert_eq!(decide(&inputs), pause(PauseCause::Uncertainty));
    }

    #[test]
    fn review_interval_table() {
        use Mode::{Continuous, Fixed};
        // (default, setting, mode) -> interval
        let table = [
            (100, None, Continuous, Some(100)),
            (100, None, Fixed, None),
            (100, Some(0), Continuous, None),
            (100, Some(0), Fixed, None),
            (100, Some(5), Continuous, Some(5)),
            (100, Some(5), Fixed, Some(5)),
            (100, Some(1), Fixed, Some(1)),
            (100, Some(500), Continuous, Some(500)),
            (0, None, Continuous, None),
            (0, None, Fixed, None),
            (0, Some(5), Continuous, Some(5)),
            (0, Some(5), Fixed, Some(5)),
            (0, Some(0), Continuous, None),
        ];
        for (default, setting, mode, interval) in table {
            assert_eq!(
                review_interval(default, setting, mode),
                interval,
                "default {default}, setting {setting:?}, {mode:?}"
            );
        }
    }

    #[test]
    fn a_continuous_session_pauses_for_review_at_the_interval_not_before() {
        let mut inputs = calm();
        for (since, until, decision) in [
            (0, 100, GateDecision::Continue),
            (99, 1, GateDecision::Continue),
            (100, 0, pause(PauseCause::ReviewRequired)),
            (101, 0, pause(PauseCause::ReviewRequired)),
        ] {
            inputs.steps_since_start = since;
            let eval = evaluate(&GateConfig::default(), &inputs);
            assert_eq!(eval.decision, decision, "{since} steps");
            assert_eq!(eval.metrics.review_every, Some(100), "{since} steps");
            assert_eq!(
                eval.metrics.steps_until_review,
                Some(until),
                "{since} steps"
            );
        }
    }

    #[test]
    fn a_fixed_session_has_no_default_review_point() {
        let mut inputs = calm();
        inputs.mode = Mode::Fixed;
        for since in [99, 100, 150, 10_000, u64::MAX] {
            inputs.steps_since_start = since;
            let eval = evaluate(&GateConfig::default(), &inputs);
            assert_eq!(eval.decision, GateDecision::Continue, "{since} steps");
            assert_eq!(eval.metrics.review_every, None);
            assert_eq!(eval.metrics.steps_until_review, None);
        }
    }

    #[test]
    fn the_sessions_own_setting_wins_in_either_mode() {
        for mode in [Mode::Fixed, Mode::Continuous] {
            let mut inputs = calm();
            inputs.mode = mode;
            inputs.review_every = Some(5);
            inputs.steps_since_start = 4;
            assert_eq!(decide(&inputs), GateDecision::Continue, "{mode:?}");
            inputs.steps_since_start = 5;
            assert_eq!(
                decide(&inputs),
                pause(PauseCause::ReviewRequired),
                "{mode:?}"
            );
            // 0 = never, however long.
            inputs.review_every = Some(0);
            inputs.steps_since_start = 1_000_000;
            let eval = evaluate(&GateConfig::default(), &inputs);
            assert_eq!(eval.decision, GateDecision::Continue, "{mode:?}");
            assert_eq!(eval.metrics.steps_until_review, None, "{mode:?}");
        }
    }

    #[test]
    fn the_default_interval_is_configurable_and_zero_turns_it_off() {
        let mut inputs = calm();
        inputs.steps_since_start = 10;
        let every_ten = GateConfig {
            review_every: 10,
            ..GateConfig::default()
        };
        assert_eq!(
            evaluate(&every_ten, &inputs).decision,
            pause(PauseCause::ReviewRequired)
        );
        let never = GateConfig {
            review_every: 0,
            ..GateConfig::default()
        };
        inputs.steps_since_start = 1_000;
        assert_eq!(evaluate(&never, &inputs).decision, GateDecision::Continue);
        // A session's own interval does not depend on the default.
        inputs.review_every = Some(1_000);
        assert_eq!(
            evaluate(&never, &inputs).decision,
            pause(PauseCause::ReviewRequired)
        );
    }

    #[test]
    fn the_review_point_ignores_checkpoints_and_total_length() {
        let mut inputs = calm();
        inputs.step = 101;
        inputs.steps_since_start = 100;
        // Just checkpointed: still a review.
        inputs.last_checkpoint_step = 100;
        assert_eq!(decide(&inputs), pause(PauseCause::ReviewRequired));
        // Checkpoint overdue: still a review, not a checkpoint.
        inputs.last_checkpoint_step = 0;
        assert_eq!(decide(&inputs), pause(PauseCause::ReviewRequired));
        // Before the review point, an overdue checkpoint is only a checkpoint.
        inputs.steps_since_start = 99;
        assert_eq!(decide(&inputs), GateDecision::Checkpoint);
        // A long session a person resumed recently is not paused by its total length.
        inputs.step = 1_000;
        inputs.steps_since_start = 5;
        inputs.last_checkpoint_step = 999;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn the_review_point_is_never_a_stop() {
        // Whatever the mode and the setting, the gate never stops on steps
        // alone: only the iteration guardrail does that.
        for mode in [Mode::Fixed, Mode::Continuous] {
            for setting in [None, Some(0), Some(1), Some(100)] {
                for since in [0, 1, 99, 100, 101, 100_000] {
                    let mut inputs = calm();
                    inputs.mode = mode;
                    inputs.review_every = setting;
                    inputs.steps_since_start = since;
                    let decision = decide(&inputs);
                    assert!(
                        matches!(
                            decision,
                            GateDecision::Continue
                                | GateDecision::Pause {
                                    cause: PauseCause::ReviewRequired
                                }
                        ),
                        "{mode:?} {setting:?} {since}: {decision:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn each_exhausted_budget_stops_and_one_left_continues() {
        type Set = fn(&mut Budget, Option<u64>);
        let cases: [(Set, BudgetKind); 3] = [
            (|b, v| b.tokens_remaining = v, BudgetKind::Tokens),
            (|b, v| b.tool_calls_remaining = v, BudgetKind::ToolCalls),
            (|b, v| b.time_remaining_ms = v, BudgetKind::Time),
        ];
        for (set, kind) in cases {
            let mut inputs = calm();
            // No steps yet: one token left is enough to start one.
            inputs.token_deltas = &[];
            set(&mut inputs.budget, Some(0));
            assert_eq!(decide(&inputs), budget_stop(kind), "{kind:?}");
            set(&mut inputs.budget, Some(1));
            assert_eq!(decide(&inputs), GateDecision::Continue, "{kind:?}");
            set(&mut inputs.budget, None);
            assert_eq!(decide(&inputs), GateDecision::Continue, "{kind:?}");
        }
    }

    #[test]
    fn unlimited_budgets_never_stop() {
        let mut inputs = calm();
        inputs.budget = Budget::default();
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn budgets_are_checked_tokens_then_tool_calls_then_time() {
        let zero = Some(0);
        let mut inputs = calm();
        inputs.budget = Budget {
            tokens_remaining: zero,
            tool_calls_remaining: zero,
            time_remaining_ms: zero,
        };
        assert_eq!(decide(&inputs), budget_stop(BudgetKind::Tokens));
        inputs.budget.tokens_remaining = None;
        assert_eq!(decide(&inputs), budget_stop(BudgetKind::ToolCalls));
        inputs.budget.tool_calls_remaining = Some(5);
        assert_eq!(decide(&inputs), budget_stop(BudgetKind::Time));
        // Tokens beat time without tool calls in between.
        inputs.budget.tokens_remaining = zero;
        assert_eq!(decide(&inputs), budget_stop(BudgetKind::Tokens));
    }

    #[test]
    fn checkpoint_at_the_interval_not_before() {
        let mut inputs = calm();
        inputs.last_checkpoint_step = 10;
        for (step, since, until, decision) in [
            (35, 24, 1, GateDecision::Continue),
            (36, 25, 0, GateDecision::Checkpoint),
            (37, 26, 0, GateDecision::Checkpoint),
        ] {
            inputs.step = step;
            let eval = evaluate(&GateConfig::default(), &inputs);
            assert_eq!(eval.decision, decision, "step {step}");
            assert_eq!(eval.metrics.steps_since_checkpoint, since, "step {step}");
            assert_eq!(eval.metrics.steps_until_checkpoint, until, "step {step}");
        }
    }

    #[test]
    fn first_checkpoint_counts_from_the_start() {
        let mut inputs = calm();
        inputs.last_checkpoint_step = 0;
        inputs.step = 1;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.steps_since_checkpoint, 0);
        assert_eq!(eval.metrics.steps_until_checkpoint, 25);
        inputs.step = 26;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Checkpoint);
        assert_eq!(eval.metrics.steps_since_checkpoint, 25);
    }

    #[test]
    fn checkpoint_arithmetic_saturates_on_odd_inputs() {
        let mut inputs = calm();
        // Step 0 (not 1-based) and a checkpoint ahead of the step.
        inputs.step = 0;
        inputs.last_checkpoint_step = 0;
        let m = evaluate(&GateConfig::default(), &inputs).metrics;
        assert_eq!(
            (m.steps_since_checkpoint, m.steps_until_checkpoint),
            (0, 25)
        );
        inputs.step = 5;
        inputs.last_checkpoint_step = 50;
        let m = evaluate(&GateConfig::default(), &inputs).metrics;
        assert_eq!(
            (m.steps_since_checkpoint, m.steps_until_checkpoint),
            (0, 25)
        );
        inputs.step = u64::MAX;
        inputs.last_checkpoint_step = 0;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.metrics.steps_since_checkpoint, u64::MAX - 1);
        assert_eq!(eval.metrics.steps_until_checkpoint, 0);
        assert_eq!(eval.decision, GateDecision::Checkpoint);
    }

    // ---- priority order ----

    /// Each trigger of the gate, in priority order.
    #[derive(Debug, Clone, Copy)]
    enum Trigger {
        Coherence,
        Tokens,
        ToolCalls,
        Time,
        Rework,
        Uncertainty,
        NextStep,
        Overrun,
        Review,
        Slope,
        Checkpoint,
    }

    const PRIORITY: [Trigger; 11] = [
        Trigger::Coherence,
        Trigger::Tokens,
        Trigger::ToolCalls,
        Trigger::Time,
        Trigger::Rework,
        Trigger::Uncertainty,
        Trigger::NextStep,
        Trigger::Overrun,
        Trigger::Review,
        Trigger::Slope,
        Trigger::Checkpoint,
    ];

    /// Three evaluations in a row that need 9000 tokens with 1000 left.
    static OVERRUN_TRAIL: std::sync::LazyLock<Vec<ProgressPoint>> =
        std::sync::LazyLock::new(|| slow_trail(3));

    /// Sets one trigger, leaving the others as they are.
    fn arm(trigger: Trigger, i: &mut GateInputs<'static>) {
        match trigger {
            Trigger::Coherence => i.coherence = Some(0.1),
            Trigger::Tokens => i.budget.tokens_remaining = Some(0),
            Trigger::ToolCalls => i.budget.tool_calls_remaining = Some(0),
            Trigger::Time => i.budget.time_remaining_ms = Some(0),
            Trigger::Rework => i.rework_flags = &REWORKY,
            Trigger::Uncertainty => i.uncertainty = Some(0.95),
            // 50 left: the steady 100-token step (and any other series) does not fit.
            Trigger::NextStep => {
                if i.budget.tokens_remaining != Some(0) {
                    i.budget.tokens_remaining = Some(50);
                }
            }
            Trigger::Overrun => {
                i.progress_trail = OVERRUN_TRAIL.as_slice();
                // Keep a smaller budget set earlier in the ladder.
                i.budget.tokens_remaining =
                    Some(i.budget.tokens_remaining.map_or(1_000, |t| t.min(1_000)));
            }
            Trigger::Review => i.steps_since_start = 100,
            Trigger::Slope => i.token_deltas = &ACCELERATING,
            Trigger::Checkpoint => {
                i.step = 200;
                i.last_checkpoint_step = 0;
            }
        }
    }

    fn expected(trigger: Trigger) -> GateDecision {
        match trigger {
            Trigger::Coherence => stop(StopCause::CoherenceLow),
            Trigger::Tokens => budget_stop(BudgetKind::Tokens),
            Trigger::ToolCalls => budget_stop(BudgetKind::ToolCalls),
            Trigger::Time => budget_stop(BudgetKind::Time),
            Trigger::Rework => pause(PauseCause::ReworkLoop),
            Trigger::Uncertainty => pause(PauseCause::Uncertainty),
            Trigger::NextStep => pause(PauseCause::NextStepOverrun),
            Trigger::Overrun => pause(PauseCause::ProjectedOverrun),
            Trigger::Review => pause(PauseCause::ReviewRequired),
            Trigger::Slope => GateDecision::Throttle,
            Trigger::Checkpoint => GateDecision::Checkpoint,
        }
    }

    #[test]
    fn each_trigger_alone_gives_its_decision() {
        for t in PRIORITY {
            let mut inputs = calm();
            arm(t, &mut inputs);
            assert_eq!(decide(&inputs), expected(t), "{t:?}");
        }
    }

    #[test]
    fn each_higher_trigger_beats_each_lower_one() {
        for (hi, &higher) in PRIORITY.iter().enumerate() {
            for &lower in &PRIORITY[hi + 1..] {
                let mut inputs = calm();
                arm(lower, &mut inputs);
                arm(higher, &mut inputs);
                assert_eq!(
                    decide(&inputs),
                    expected(higher),
                    "{higher:?} over {lower:?}"
                );
            }
        }
    }

    #[test]
    fn with_every_trigger_set_the_highest_remaining_wins() {
        for (k, &top) in PRIORITY.iter().enumerate() {
            let mut inputs = calm();
            for &t in &PRIORITY[k..] {
                arm(t, &mut inputs);
            }
            assert_eq!(decide(&inputs), expected(top), "from {top:?} down");
        }
    }

    // ---- metrics ----

    #[test]
    fn metrics_are_computed_whatever_the_decision() {
        let mut inputs = calm();
        for t in PRIORITY {
            arm(t, &mut inputs);
        }
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, stop(StopCause::CoherenceLow));
        let m = eval.metrics;
        assert!(close(m.spend_slope.unwrap_or(f64::NAN), 76.0 / 473.0));
        assert_eq!(m.rework_ratio, 0.4);
        assert_eq!(m.coherence, Some(0.1));
        assert_eq!(m.uncertainty, Some(0.95));
        assert_eq!(m.steps_since_checkpoint, 199);
        assert_eq!(m.steps_until_checkpoint, 0);
        assert_eq!(m.steps_since_start, 100);
        assert_eq!(m.review_every, Some(100));
        assert_eq!(m.steps_until_review, Some(0));
        assert_eq!(m.overrun_streak, 3);
        assert_eq!(m.next_step_tokens, 504);
    }

    // ---- the next step's projected cost ----

    #[test]
    fn the_next_step_pauses_when_its_projection_does_not_fit() {
        let mut inputs = calm();
        // Steady 100-token steps: 100 left is enough, 99 is not.
        inputs.budget.tokens_remaining = Some(100);
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.budget.tokens_remaining = Some(99);
        assert_eq!(decide(&inputs), pause(PauseCause::NextStepOverrun));
        // A doubling series is projected a doubling ahead.
        let doubling = [10, 20, 40, 80, 160, 320, 640, 1_280, 2_560, 5_120];
        inputs.token_deltas = &doubling;
        inputs.budget.tokens_remaining = Some(10_240);
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.metrics.next_step_tokens, 10_240);
        assert_eq!(eval.decision, GateDecision::Throttle);
        inputs.budget.tokens_remaining = Some(10_239);
        assert_eq!(decide(&inputs), pause(PauseCause::NextStepOverrun));
        // No budget, or no history: nothing to project against.
        inputs.budget.tokens_remaining = None;
        assert_eq!(decide(&inputs), GateDecision::Throttle);
        inputs.token_deltas = &[];
        inputs.budget.tokens_remaining = Some(1);
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn the_next_step_cause_reads_and_writes_as_snake_case() {
        let json = json!({ "decision": "pause", "cause": "next_step_overrun" });
        assert_eq!(
            serde_json::to_value(pause(PauseCause::NextStepOverrun)).unwrap(),
            json
        );
        let back: GateDecision = serde_json::from_value(json).unwrap();
        assert_eq!(back, pause(PauseCause::NextStepOverrun));
    }

    #[test]
    fn metrics_of_calm_inputs() {
        assert_eq!(
            evaluate(&GateConfig::default(), &calm()),
            GateEvaluation {
                decision: GateDecision::Continue,
                metrics: GateMetrics {
                    spend_slope: Some(0.0),
                    rework_ratio: 0.0,
                    coherence: Some(0.9),
                    uncertainty: Some(0.1),
                    steps_since_checkpoint: 0,
                    steps_until_checkpoint: 25,
                    steps_since_start: 10,
                    review_every: Some(100),
                    steps_until_review: Some(90),
                    projection: None,
                    overrun_streak: 0,
                    next_step_tokens: 100,
                },
            }
        );
    }

    #[test]
    fn empty_history_continues_with_empty_metrics() {
        let inputs = GateInputs {
            step: 1,
            steps_since_start: 0,
            mode: Mode::Fixed,
            review_every: None,
            token_deltas: &[],
            rework_flags: &[],
            tool_calls: 0,
            coherence: None,
            uncertainty: None,
            budget: Budget::default(),
            last_checkpoint_step: 0,
            progress_trail: &[],
        };
        assert_eq!(
            evaluate(&GateConfig::default(), &inputs),
            GateEvaluation {
                decision: GateDecision::Continue,
                metrics: GateMetrics {
                    spend_slope: None,
                    rework_ratio: 0.0,
                    coherence: None,
                    uncertainty: None,
                    steps_since_checkpoint: 0,
                    steps_until_checkpoint: 25,
                    steps_since_start: 0,
                    review_every: None,
                    steps_until_review: None,
                    projection: None,
                    overrun_streak: 0,
                    next_step_tokens: 0,
                },
            }
        );
    }

    #[test]
    fn custom_windows_are_honoured() {
        let config = GateConfig {
            rework_window: 4,
            slope_window: 3,
            ..GateConfig::default()
        };
        let mut inputs = calm();
        // Last 4 flags: two reworks, 0.5 > 0.3.
        let flags = [false, false, false, false, true, false, true, false];
        inputs.rework_flags = &flags;
        let eval = evaluate(&config, &inputs);
        assert_eq!(eval.metrics.rework_ratio, 0.5);
        assert_eq!(eval.decision, pause(PauseCause::ReworkLoop));
        // Last 3 deltas 100, 200, 300: slope 100, mean 200.
        let deltas = [100, 100, 100, 200, 300];
        inputs.rework_flags = &NO_REWORK;
        inputs.token_deltas = &deltas;
        let eval = evaluate(&config, &inputs);
        assert_eq!(eval.metrics.spend_slope, Some(0.5));
        assert_eq!(eval.decision, GateDecision::Throttle);
    }

    // ---- projected overrun ----

    /// 10 % done after 1000 tokens, `n` evaluations in a row: 9000 more to finish each time.
    fn slow_trail(n: usize) -> Vec<ProgressPoint> {
        let point = ProgressPoint {
            tokens: 1000,
            iterations: 2,
            sample: Some(projection::ProgressSample {
                percent_complete: 10.0,
                tokens: 1000,
                iterations: 2,
            }),
        };
        vec![point; n]
    }

    fn projected(trail: &[ProgressPoint], tokens_remaining: Option<u64>) -> GateEvaluation {
        let mut inputs = calm();
        inputs.progress_trail = trail;
        inputs.budget.tokens_remaining = tokens_remaining;
        evaluate(&GateConfig::default(), &inputs)
    }

    #[test]
    fn projected_overrun_pauses_on_the_third_evaluation_in_a_row() {
        // 9000 needed, 1000 left: more than twice over.
        for (n, decision) in [
            (1, GateDecision::Continue),
            (2, GateDecision::Continue),
            (3, pause(PauseCause::ProjectedOverrun)),
            (8, pause(PauseCause::ProjectedOverrun)),
        ] {
            let trail = slow_trail(n);
            let eval = projected(&trail, Some(1000));
            assert_eq!(eval.decision, decision, "{n} in a row");
            assert_eq!(eval.metrics.overrun_streak, n as u32);
            assert_eq!(
                eval.metrics.projection.map(|p| p.tokens_to_finish),
                Some(9000)
            );
        }
    }

    #[test]
    fn a_projection_within_the_margin_does_not_pause() {
        // 9000 needed, 4500 left: exactly twice, not over.
        let trail = slow_trail(5);
        let eval = projected(&trail, Some(4500));
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.overrun_streak, 0);
        let eval = projected(&trail, Some(4499));
        assert_eq!(eval.decision, pause(PauseCause::ProjectedOverrun));
    }

    #[test]
    fn no_projection_or_no_token_budget_never_overruns() {
        let eval = evaluate(&GateConfig::default(), &calm());
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.projection, None);
        let mut blind = slow_trail(5);
        for p in &mut blind {
            p.sample = None;
        }
        assert_eq!(projected(&blind, Some(0)).metrics.overrun_streak, 0);
        let trail = slow_trail(5);
        let eval = projected(&trail, None);
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.overrun_streak, 0);
    }

    #[test]
    fn projection_settings_are_honoured() {
        let config = GateConfig {
            projection_margin: 10.0,
            projection_evaluations: 1,
            ..GateConfig::default()
        };
        let trail = slow_trail(1);
        let mut inputs = calm();
        inputs.progress_trail = &trail;
        inputs.budget.tokens_remaining = Some(900);
        assert_eq!(evaluate(&config, &inputs).decision, GateDecision::Continue);
        inputs.budget.tokens_remaining = Some(899);
        assert_eq!(
            evaluate(&config, &inputs).decision,
            pause(PauseCause::ProjectedOverrun)
        );
        // Zero evaluations would pause on nothing: it counts as one.
        let config = GateConfig {
            projection_evaluations: 0,
            ..GateConfig::default()
        };
        inputs.budget.tokens_remaining = Some(1000);
        assert_eq!(
            evaluate(&config, &inputs).decision,
            pause(PauseCause::ProjectedOverrun)
        );
    }

    #[test]
    fn projected_overrun_ranks_below_the_other_pauses_and_above_throttle() {
        let trail = slow_trail(3);
        let mut inputs = calm();
        inputs.progress_trail = &trail;
        inputs.token_deltas = &ACCELERATING;
        assert_eq!(decide(&inputs), pause(PauseCause::ProjectedOverrun));
        inputs.uncertainty = Some(0.95);
        assert_eq!(decide(&inputs), pause(PauseCause::Uncertainty));
        inputs.rework_flags = &REWORKY;
        assert_eq!(decide(&inputs), pause(PauseCause::ReworkLoop));
        inputs.budget.tokens_remaining = Some(0);
        assert_eq!(decide(&inputs), budget_stop(BudgetKind::Tokens));
    }

    // ---- serialization ----

    #[test]
    fn decisions_serialize_with_a_decision_tag() {
        let cases = [
            (
                stop(StopCause::CoherenceLow),
                json!({ "decision": "stop", "cause": "coherence_low" }),
            ),
            (
                stop(StopCause::StepLimit),
                json!({ "decision": "stop", "cause": "step_limit" }),
            ),
            (
                budget_stop(BudgetKind::Tokens),
                json!({ "decision": "stop", "cause": { "budget_exhausted": { "budget": "tokens" } } }),
            ),
            (
                budget_stop(BudgetKind::ToolCalls),
                json!({ "decision": "stop", "cause": { "budget_exhausted": { "budget": "tool_calls" } } }),
            ),
            (
                budget_stop(BudgetKind::Time),
                json!({ "decision": "stop", "cause": { "budget_exhausted": { "budget": "time" } } }),
            ),
            (
                pause(PauseCause::ReworkLoop),
                json!({ "decision": "pause", "cause": "rework_loop" }),
            ),
            (
                pause(PauseCause::Uncertainty),
                json!({ "decision": "pause", "cause": "uncertainty" }),
            ),
            (
                pause(PauseCause::ProjectedOverrun),
                json!({ "decision": "pause", "cause": "projected_overrun" }),
            ),
            (
                pause(PauseCause::ReviewRequired),
                json!({ "decision": "pause", "cause": "review_required" }),
            ),
            (GateDecision::Throttle, json!({ "decision": "throttle" })),
            (
                GateDecision::Checkpoint,
                json!({ "decision": "checkpoint" }),
            ),
            (GateDecision::Continue, json!({ "decision": "continue" })),
        ];
        for (decision, expected) in cases {
            let value = serde_json::to_value(decision).unwrap();
            assert_eq!(value, expected);
            let back: GateDecision = serde_json::from_value(value).unwrap();
            assert_eq!(back, decision);
        }
    }

    #[test]
    fn evaluation_serializes_with_stable_field_names() {
        let eval = evaluate(&GateConfig::default(), &calm());
        let value = serde_json::to_value(eval).unwrap();
        assert_eq!(
            value,
            json!({
                "decision": { "decision": "continue" },
                "metrics": {
                    "spend_slope": 0.0,
                    "rework_ratio": 0.0,
                    "coherence": 0.9,
                    "uncertainty": 0.1,
                    "steps_since_checkpoint": 0,
                    "steps_until_checkpoint": 25,
                    "steps_since_start": 10,
                    "review_every": 100,
                    "steps_until_review": 90,
                    "projection": null,
                    "overrun_streak": 0,
                    "next_step_tokens": 100
                }
            })
        );
        let back: GateEvaluation = serde_json::from_value(value).unwrap();
        assert_eq!(back, eval);
    }

    #[test]
    fn decisions_logged_before_review_points_still_read() {
        // A stop on the old step rule, with metrics that have no review fields.
        let old = json!({
            "decision": { "decision": "stop", "cause": "step_limit" },
            "metrics": {
                "spend_slope": null, "rework_ratio": 0.0, "coherence": null,
                "uncertainty": null, "steps_since_checkpoint": 0,
                "steps_until_checkpoint": 25, "steps_since_start": 100
            }
        });
        let eval: GateEvaluation = serde_json::from_value(old).unwrap();
        assert_eq!(eval.decision, stop(StopCause::StepLimit));
        assert_eq!(eval.metrics.review_every, None);
        assert_eq!(eval.metrics.steps_until_review, None);
    }

    #[test]
    fn config_and_budget_round_trip() {
        let config = GateConfig::default();
        let value = serde_json::to_value(config).unwrap();
        assert_eq!(
            value,
            json!({
                "coherence_min": 0.4, "review_every": 100, "rework_max": 0.3,
                "rework_window": 10, "uncertainty_max": 0.8, "slope_max": 0.02,
                "slope_window": 10, "checkpoint_every": 25,
                "projection_margin": 2.0, "projection_evaluations": 3
            })
        );
        assert_eq!(serde_json::from_value::<GateConfig>(value).unwrap(), config);
        let budget = calm().budget;
        let value = serde_json::to_value(budget).unwrap();
        assert_eq!(
            value,
            json!({ "tokens_remaining": 1000, "tool_calls_remaining": 100, "time_remaining_ms": 60000 })
        );
        assert_eq!(serde_json::from_value::<Budget>(value).unwrap(), budget);
    }

    #[test]
    fn inputs_serialize_for_the_decision_log() {
        let deltas = [5, 6];
        let flags = [true];
        let inputs = GateInputs {
            step: 3,
            steps_since_start: 2,
            mode: Mode::Continuous,
            review_every: Some(7),
            token_deltas: &deltas,
            rework_flags: &flags,
            tool_calls: 4,
            coherence: None,
            uncertainty: Some(0.5),
            budget: Budget {
                tokens_remaining: None,
                tool_calls_remaining: Some(0),
                time_remaining_ms: None,
            },
            last_checkpoint_step: 1,
            progress_trail: &[],
        };
        assert_eq!(
            serde_json::to_value(inputs).unwrap(),
            json!({
                "step": 3, "steps_since_start": 2, "mode": "continuous",
                "review_every": 7, "token_deltas": [5, 6],
                "rework_flags": [true], "tool_calls": 4, "coherence": null,
                "uncertainty": 0.5,
                "budget": { "tokens_remaining": null, "tool_calls_remaining": 0, "time_remaining_ms": null },
                "last_checkpoint_step": 1
            })
        );
    }
}
