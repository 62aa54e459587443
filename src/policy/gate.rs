//! The continue gate: before every step, decide whether a long-running agent
//! should stop, pause for a person, slow down, checkpoint, or continue.
//! Long-run failures are rarely one bad call; they are loops that redo work
//! or burn tokens faster and faster, so the gate watches trends, not steps.

use serde::{Deserialize, Serialize};

/// Thresholds of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateConfig {
    /// Stop when coherence is below this.
    pub coherence_min: f64,
    /// Stop when this many steps ran since the session last started or resumed.
    pub step_limit: u64,
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
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            coherence_min: 0.4,
            step_limit: 100,
            rework_max: 0.3,
            rework_window: 10,
            uncertainty_max: 0.8,
            slope_max: 0.02,
            slope_window: 10,
            checkpoint_every: 25,
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

/// What the gate looks at (serialized into the decision log).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GateInputs<'a> {
    /// Number of the step about to run (1-based).
    pub step: u64,
    /// Steps executed since the session last started or resumed.
    pub steps_since_start: u64,
    /// Tokens of each recent committed step, oldest first.
    pub token_deltas: &'a [u64],
    /// Whether each recent committed step was rework, oldest first.
    pub rework_flags: &'a [bool],
    /// Tool calls so far.
    pub tool_calls: u64,
    /// Coherence from the latest reflection; `None` before the first.
    pub coherence: Option<f64>,
    /// Uncertainty from the latest reflection; `None` before the first.
    pub uncertainty: Option<f64>,
    /// Budgets left.
    pub budget: Budget,
    /// Last iteration covered by a checkpoint (0 if none).
    pub last_checkpoint_step: u64,
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
    /// Too many steps since a person last started or resumed the session.
    StepLimit,
    /// A budget is used up.
    BudgetExhausted {
        /// Which one.
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
}

/// The gate's decision, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum GateDecision {
    /// Halt now.
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
    /// Least-squares slope of the per-step token deltas relative to their mean.
    pub spend_slope: Option<f64>,
    /// Share of rework among the last `rework_window` steps.
    pub rework_ratio: f64,
    /// Coherence used.
    pub coherence: Option<f64>,
    /// Uncertainty used.
    pub uncertainty: Option<f64>,
    /// Committed steps not covered by a checkpoint.
    pub steps_since_checkpoint: u64,
    /// Steps until the gate forces a checkpoint.
    pub steps_until_checkpoint: u64,
    /// Steps since the last start or resume.
    pub steps_since_start: u64,
}

/// A decision with its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateEvaluation {
    /// The decision.
    pub decision: GateDecision,
    /// The metrics it was based on.
    pub metrics: GateMetrics,
}

/// Relative least-squares slope of the last `window` per-step token deltas:
/// the fitted change per step divided by the mean. `None` until a full
/// window exists or when the mean is zero. Fitting deltas (not cumulative
/// tokens) means a steady spender has slope 0, whatever its rate.
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
    Some(sxy / sxx / mean_y)
}

/// Share of `true` among the last `window` flags, over the whole window, so
/// a young session cannot cross the threshold on two or three steps.
pub fn rework_ratio(flags: &[bool], window: usize) -> f64 {
    if window == 0 {
        return 0.0;
    }
    let recent = &flags[flags.len().saturating_sub(window)..];
    recent.iter().filter(|&&f| f).count() as f64 / window as f64
}

/// Evaluates the gate; the first matching decision wins.
pub fn evaluate(config: &GateConfig, inputs: &GateInputs<'_>) -> GateEvaluation {
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
    };
    let budget = inputs.budget;
    let exhausted = [
        (budget.tokens_remaining, BudgetKind::Tokens),
        (budget.tool_calls_remaining, BudgetKind::ToolCalls),
        (budget.time_remaining_ms, BudgetKind::Time),
    ]
    .into_iter()
    .find(|(left, _)| *left == Some(0))
    .map(|(_, kind)| kind);

    let decision = if metrics.coherence.is_some_and(|c| c < config.coherence_min) {
        GateDecision::Stop {
            cause: StopCause::CoherenceLow,
        }
    } else if inputs.steps_since_start >= config.step_limit {
        GateDecision::Stop {
            cause: StopCause::StepLimit,
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
    } else if metrics.spend_slope.is_some_and(|s| s > config.slope_max) {
        GateDecision::Throttle
    } else if steps_since_checkpoint >= config.checkpoint_every {
        GateDecision::Checkpoint
    } else {
        GateDecision::Continue
    };
    GateEvaluation { decision, metrics }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEADY: [u64; 10] = [100; 10];
    const NO_REWORK: [bool; 10] = [false; 10];

    /// Inputs under which every check passes.
    fn calm<'a>() -> GateInputs<'a> {
        GateInputs {
            step: 11,
            steps_since_start: 10,
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
        }
    }

    fn decide(inputs: &GateInputs<'_>) -> GateDecision {
        evaluate(&GateConfig::default(), inputs).decision
    }

    const ACCELERATING: [u64; 10] = [100, 110, 125, 145, 170, 200, 240, 290, 350, 420];
    const REWORKY: [bool; 10] = [
        true, false, true, false, true, false, true, false, false, false,
    ];

    fn stop(cause: StopCause) -> GateDecision {
        GateDecision::Stop { cause }
    }

    fn pause(cause: PauseCause) -> GateDecision {
        GateDecision::Pause { cause }
    }

    #[test]
    fn calm_inputs_continue() {
        assert_eq!(decide(&calm()), GateDecision::Continue);
    }

    #[test]
    fn steady_spend_has_zero_slope_whatever_the_rate() {
        assert_eq!(spend_slope(&[100; 10], 10), Some(0.0));
        assert_eq!(spend_slope(&[5_000; 12], 10), Some(0.0));
    }

    #[test]
    fn cumulative_style_growth_of_deltas_is_not_what_is_fitted() {
        // A steady 100 tokens/step is a straight line in cumulative tokens;
        // fitting cumulative tokens would report a large slope. Deltas say 0.
        let deltas = [100u64; 10];
        assert_eq!(spend_slope(&deltas, 10), Some(0.0));
        let mut inputs = calm();
        inputs.token_deltas = &deltas;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn accelerating_spend_throttles() {
        let slope = spend_slope(&ACCELERATING, 10).unwrap();
        assert!(slope > 0.02, "{slope}");
        let mut inputs = calm();
        inputs.token_deltas = &ACCELERATING;
        assert_eq!(decide(&inputs), GateDecision::Throttle);
    }

    #[test]
    fn decelerating_spend_does_not_throttle() {
        let mut falling = ACCELERATING;
        falling.reverse();
        assert!(spend_slope(&falling, 10).unwrap() < 0.0);
        let mut inputs = calm();
        inputs.token_deltas = &falling;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn noisy_but_flat_spend_does_not_throttle() {
        let noisy = [120, 80, 110, 90, 130, 70, 100, 100, 95, 105];
        let slope = spend_slope(&noisy, 10).unwrap();
        assert!(slope.abs() <= 0.02, "{slope}");
        let mut inputs = calm();
        inputs.token_deltas = &noisy;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn slope_is_exact_for_a_linear_series() {
        // deltas 10, 20, ..., 100: slope 10 per step, mean 55.
        let linear: Vec<u64> = (1..=10).map(|i| i * 10).collect();
        let slope = spend_slope(&linear, 10).unwrap();
        assert!((slope - 10.0 / 55.0).abs() < 1e-12, "{slope}");
    }

    #[test]
    fn slope_uses_only_the_last_window() {
        let mut series = vec![1u64, 1_000, 1, 1_000];
        series.extend_from_slice(&[100; 10]);
        assert_eq!(spend_slope(&series, 10), Some(0.0));
    }

    #[test]
    fn slope_needs_a_full_window_and_spend() {
        assert_eq!(spend_slope(&[100, 200, 400], 10), None);
        assert_eq!(spend_slope(&[], 10), None);
        assert_eq!(spend_slope(&[0; 10], 10), None);
        assert_eq!(spend_slope(&[1, 2], 1), None);
        let mut inputs = calm();
        let short = [10, 100, 1_000];
        inputs.token_deltas = &short;
        assert_eq!(decide(&inputs), GateDecision::Continue);
        assert_eq!(
            evaluate(&GateConfig::default(), &inputs)
                .metrics
                .spend_slope,
            None
        );
    }

    #[test]
    fn rework_ratio_is_over_the_whole_window() {
        assert_eq!(rework_ratio(&[true, true], 10), 0.2);
        assert_eq!(rework_ratio(&REWORKY, 10), 0.4);
        assert_eq!(rework_ratio(&[true; 25], 10), 1.0);
        assert_eq!(rework_ratio(&[], 10), 0.0);
        assert_eq!(rework_ratio(&[true], 0), 0.0);
        // Only the last `window` flags count.
        let mut old_rework = vec![true; 10];
        old_rework.extend_from_slice(&[false; 10]);
        assert_eq!(rework_ratio(&old_rework, 10), 0.0);
    }

    #[test]
    fn rework_above_threshold_pauses_and_at_threshold_does_not() {
        let mut inputs = calm();
        inputs.rework_flags = &REWORKY;
        assert_eq!(decide(&inputs), pause(PauseCause::ReworkLoop));
        let at = [
            true, true, true, false, false, false, false, false, false, false,
        ];
        inputs.rework_flags = &at;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn uncertainty_above_threshold_pauses() {
        let mut inputs = calm();
        inputs.uncertainty = Some(0.81);
        assert_eq!(decide(&inputs), pause(PauseCause::Uncertainty));
        inputs.uncertainty = Some(0.8);
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.uncertainty = None;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn coherence_below_threshold_stops() {
        let mut inputs = calm();
        inputs.coherence = Some(0.39);
        assert_eq!(decide(&inputs), stop(StopCause::CoherenceLow));
        inputs.coherence = Some(0.4);
        assert_eq!(decide(&inputs), GateDecision::Continue);
        inputs.coherence = None;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn step_limit_stops_regardless_of_checkpoints() {
        let mut inputs = calm();
        inputs.steps_since_start = 100;
        inputs.step = 101;
        inputs.last_checkpoint_step = 100;
        assert_eq!(decide(&inputs), stop(StopCause::StepLimit));
        inputs.last_checkpoint_step = 0;
        assert_eq!(decide(&inputs), stop(StopCause::StepLimit));
        inputs.steps_since_start = 99;
        inputs.last_checkpoint_step = 100;
        assert_eq!(decide(&inputs), GateDecision::Continue);
    }

    #[test]
    fn each_exhausted_budget_stops() {
        for (budget, kind) in [
            (
                Budget {
                    tokens_remaining: Some(0),
                    ..calm().budget
                },
                BudgetKind::Tokens,
            ),
            (
                Budget {
                    tool_calls_remaining: Some(0),
                    ..calm().budget
                },
                BudgetKind::ToolCalls,
            ),
            (
                Budget {
                    time_remaining_ms: Some(0),
                    ..calm().budget
                },
                BudgetKind::Time,
            ),
        ] {
            let mut inputs = calm();
            inputs.budget = budget;
            assert_eq!(
                decide(&inputs),
                stop(StopCause::BudgetExhausted { budget: kind })
            );
        }
        let mut unlimited = calm();
        unlimited.budget = Budget::default();
        assert_eq!(decide(&unlimited), GateDecision::Continue);
        let mut all = calm();
        all.budget = Budget {
            tokens_remaining: Some(0),
            tool_calls_remaining: Some(0),
            time_remaining_ms: Some(0),
        };
        assert_eq!(
            decide(&all),
            stop(StopCause::BudgetExhausted {
                budget: BudgetKind::Tokens
            })
        );
    }

    #[test]
    fn checkpoint_after_the_interval() {
        let mut inputs = calm();
        inputs.step = 36;
        inputs.last_checkpoint_step = 10;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Checkpoint);
        assert_eq!(eval.metrics.steps_since_checkpoint, 25);
        assert_eq!(eval.metrics.steps_until_checkpoint, 0);
        inputs.step = 35;
        let eval = evaluate(&GateConfig::default(), &inputs);
        assert_eq!(eval.decision, GateDecision::Continue);
        assert_eq!(eval.metrics.steps_until_checkpoint, 1);
    }

    /// Inputs that trigger every decision at once, from which each test
    /// removes the triggers above the one it checks.
    fn everything<'a>() -> GateInputs<'a> {
        GateInputs {
            step: 200,
            steps_since_start: 150,
            token_deltas: &ACCELERATING,
            rework_flags: &REWORKY,
            tool_calls: 0,
            coherence: Some(0.1),
            uncertainty: Some(0.95),
            budget: Budget {
                tokens_remaining: Some(0),
                tool_calls_remaining: Some(0),
                time_remaining_ms: Some(0),
            },
            last_checkpoint_step: 0,
        }
    }

    #[test]
    fn priority_order_is_stop_pause_throttle_checkpoint_continue() {
        let mut i = everything();
        assert_eq!(decide(&i), stop(StopCause::CoherenceLow));
        i.coherence = Some(0.9);
        assert_eq!(decide(&i), stop(StopCause::StepLimit));
        i.steps_since_start = 1;
        assert_eq!(
            decide(&i),
            stop(StopCause::BudgetExhausted {
                budget: BudgetKind::Tokens
            })
        );
        i.budget = Budget::default();
        assert_eq!(decide(&i), pause(PauseCause::ReworkLoop));
        i.rework_flags = &NO_REWORK;
        assert_eq!(decide(&i), pause(PauseCause::Uncertainty));
        i.uncertainty = Some(0.1);
        assert_eq!(decide(&i), GateDecision::Throttle);
        i.token_deltas = &STEADY;
        assert_eq!(decide(&i), GateDecision::Checkpoint);
        i.last_checkpoint_step = 199;
        assert_eq!(decide(&i), GateDecision::Continue);
    }

    #[test]
    fn metrics_are_reported_whatever_the_decision() {
        let eval = evaluate(&GateConfig::default(), &everything());
        assert!(matches!(eval.decision, GateDecision::Stop { .. }));
        assert!(eval.metrics.spend_slope.unwrap() > 0.02);
        assert_eq!(eval.metrics.rework_ratio, 0.4);
        assert_eq!(eval.metrics.coherence, Some(0.1));
        assert_eq!(eval.metrics.uncertainty, Some(0.95));
        assert_eq!(eval.metrics.steps_since_checkpoint, 199);
        assert_eq!(eval.metrics.steps_since_start, 150);
    }

    #[test]
    fn decisions_serialize_for_the_decision_log() {
        let json = serde_json::to_value(stop(StopCause::BudgetExhausted {
            budget: BudgetKind::Time,
        }))
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "decision": "stop", "cause": { "budget_exhausted": { "budget": "time" } } })
        );
        assert_eq!(
            serde_json::to_value(GateDecision::Throttle).unwrap(),
            serde_json::json!({ "decision": "throttle" })
        );
    }
}
