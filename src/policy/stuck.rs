//! Deterministic stuck detection: patterns in the recent steps that show an
//! agent going round in circles. It sits beside reflection because it needs
//! no model and cannot be talked out of what it sees.

use serde::{Deserialize, Serialize};

use super::history::{Outcome, StepRecord};

/// Thresholds of stuck detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckConfig {
    /// Same action, arguments and observation this many times in a row.
    pub same_observation: usize,
    /// Same action ending in failure or error this many times in a row.
    pub same_error: usize,
    /// Same non-empty agent message this many times in a row.
    pub same_message: usize,
    /// A,B,A,B… over this many steps.
    pub alternation: usize,
    /// Look at this many recent steps for context-overflow wrap-ups.
    pub overflow_window: usize,
    /// This many wrap-ups within that window.
    pub overflow_repeats: usize,
    /// Cap on the total time spent in waiting steps, ms.
    pub max_total_wait_ms: u64,
}

impl Default for StuckConfig {
    fn default() -> Self {
        StuckConfig {
            same_observation: 4,
            same_error: 3,
            same_message: 3,
            alternation: 6,
            overflow_window: 5,
            overflow_repeats: 2,
            max_total_wait_ms: 1_800_000,
        }
    }
}

/// A pattern that shows the agent is stuck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "pattern", rename_all = "snake_case")]
pub enum StuckPattern {
    /// The same action saw the same observation again and again.
    RepeatedObservation {
        /// The action.
        action: String,
        /// How many times in a row.
        count: usize,
    },
    /// The same action failed again and again.
    RepeatedError {
        /// The action.
        action: String,
        /// How many times in a row.
        count: usize,
    },
    /// The agent said the same thing again and again.
    RepeatedMessage {
        /// How many times in a row.
        count: usize,
    },
    /// The agent alternates between two actions.
    Alternation {
        /// One action.
        first: String,
        /// The other.
        second: String,
    },
    /// New context cycles overflow again almost at once.
    ContextOverflow {
        /// Wrap-ups in the window.
        count: usize,
    },
    /// Waiting steps have waited longer than allowed in total.
    WaitCapExceeded {
        /// Total wait, ms.
        total_wait_ms: u64,
    },
}

impl StuckPattern {
    /// A short sentence saying what was repeated.
    pub fn describe(&self) -> String {
        match self {
            StuckPattern::RepeatedObservation { action, count } => {
                format!("repeated `{action}` with the same result {count} times")
            }
            StuckPattern::RepeatedError { action, count } => {
                format!("repeated `{action}` ending in an error {count} times")
            }
            StuckPattern::RepeatedMessage { count } => {
                format!("repeated the same message {count} times")
            }
            StuckPattern::Alternation { first, second } => {
                format!("alternated between `{first}` and `{second}` without progress")
            }
            StuckPattern::ContextOverflow { count } => {
                format!("ran out of context {count} times in quick succession")
            }
            StuckPattern::WaitCapExceeded { total_wait_ms } => {
                format!("waited {total_wait_ms} ms in total, more than allowed")
            }
        }
    }
}

/// What to do about a stuck pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum StuckVerdict {
    /// Tell the agent what it repeated and let it try something else.
    Nudge {
        /// The message for the agent.
        message: String,
    },
    /// Pause for a person.
    Pause,
}

/// The first nudge is free; any later pattern pauses.
pub fn respond(pattern: &StuckPattern, nudges_given: u32) -> StuckVerdict {
    if nudges_given == 0 {
        StuckVerdict::Nudge {
            message: format!(
                "You {}. That is not making progress: try a different approach.",
                pattern.describe()
            ),
        }
    } else {
        StuckVerdict::Pause
    }
}

fn failed(step: &StepRecord) -> bool {
    matches!(step.outcome, Outcome::Failure | Outcome::Error)
}

/// Length of the run at the end of `steps` whose members equal the last one by `same`.
fn trailing_run(steps: &[&StepRecord], same: impl Fn(&StepRecord, &StepRecord) -> bool) -> usize {
    let Some(last) = steps.last() else {
        return 0;
    };
    steps.iter().rev().take_while(|s| same(s, last)).count()
}

/// Finds a stuck pattern that the newest step takes part in. `history` is
/// oldest first; waiting steps do not count towards repeats.
pub fn detect(
    config: &StuckConfig,
    history: &[StepRecord],
    total_wait_ms: u64,
) -> Option<StuckPattern> {
    let newest = history.last()?;
    let active: Vec<&StepRecord> = history.iter().filter(|s| !s.waiting).collect();
    if !newest.waiting {
        let errors = trailing_run(&active, |s, last| {
            failed(s) && failed(last) && s.action == last.action
        });
        if errors >= config.same_error.max(1) {
            return Some(StuckPattern::RepeatedError {
                action: newest.action.clone(),
                count: errors,
            });
        }
        let same = trailing_run(&active, |s, last| {
            s.action == last.action
                && s.arguments == last.arguments
                && s.observation == last.observation
        });
        if same >= config.same_observation.max(1) {
            return Some(StuckPattern::RepeatedObservation {
                action: newest.action.clone(),
                count: same,
            });
        }
        let messages = trailing_run(&active, |s, last| {
            !last.message.is_empty() && s.message == last.message
        });
        if messages >= config.same_message.max(1) {
            return Some(StuckPattern::RepeatedMessage { count: messages });
        }
        if let Some(pattern) = alternation(&active, config.alternation) {
            return Some(pattern);
        }
    }
    let window = &history[history.len().saturating_sub(config.overflow_window)..];
    let overflows = window.iter().filter(|s| s.context_overflow).count();
    if newest.context_overflow && overflows >= config.overflow_repeats.max(1) {
        return Some(StuckPattern::ContextOverflow { count: overflows });
    }
    if newest.waiting && total_wait_ms > config.max_total_wait_ms {
        return Some(StuckPattern::WaitCapExceeded { total_wait_ms });
    }
    None
}

fn alternation(active: &[&StepRecord], len: usize) -> Option<StuckPattern> {
    if len < 4 || active.len() < len {
        return None;
    }
    let tail = &active[active.len() - len..];
    let key = |s: &StepRecord| (s.action.clone(), s.arguments.clone());
    let (a, b) = (key(tail[0]), key(tail[1]));
    if a == b {
        return None;
    }
    let alternates = tail
        .iter()
        .enumerate()
        .all(|(i, s)| key(s) == if i % 2 == 0 { a.clone() } else { b.clone() });
    alternates.then_some(StuckPattern::Alternation {
        first: a.0,
        second: b.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::history::tests::step;

    fn cfg() -> StuckConfig {
        StuckConfig::default()
    }

    fn failing(n: u64, action: &str) -> StepRecord {
        let mut s = step(n, action);
        s.outcome = Outcome::Failure;
        s.error = Some(format!("error {n}"));
        s
    }

    fn same_obs(n: u64, action: &str) -> StepRecord {
        let mut s = step(n, action);
        s.observation = "same".into();
        s
    }

    fn waiting(n: u64, ms: u64) -> StepRecord {
        let mut s = step(n, "poll_job");
        s.waiting = true;
        s.observation = "still running".into();
        s.message = "waiting".into();
        s.duration_ms = ms;
        s
    }

    #[test]
    fn varied_steps_are_not_stuck() {
        let h: Vec<_> = (1..=10).map(|n| step(n, &format!("a{n}"))).collect();
        assert_eq!(detect(&cfg(), &h, 0), None);
        assert_eq!(detect(&cfg(), &[], 0), None);
    }

    #[test]
    fn same_failing_action_three_times() {
        let h = vec![failing(1, "test"), failing(2, "test")];
        assert_eq!(detect(&cfg(), &h, 0), None);
        let h = vec![failing(1, "test"), failing(2, "test"), failing(3, "test")];
        assert_eq!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedError {
                action: "test".into(),
                count: 3
            })
        );
    }

    #[test]
    fn error_run_is_broken_by_a_success_or_another_action() {
        let h = vec![failing(1, "test"), step(2, "test"), failing(3, "test")];
        assert_eq!(detect(&cfg(), &h, 0), None);
        let h = vec![failing(1, "test"), failing(2, "build"), failing(3, "test")];
        assert_eq!(detect(&cfg(), &h, 0), None);
    }

    #[test]
    fn error_outcome_counts_like_failure() {
        let mut h = vec![failing(1, "x"), failing(2, "x"), failing(3, "x")];
        h[1].outcome = Outcome::Error;
        assert!(matches!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedError { .. })
        ));
    }

    #[test]
    fn same_action_and_observation_four_times() {
        let mut h: Vec<_> = (1..=3).map(|n| same_obs(n, "ls")).collect();
        for s in &mut h {
            s.message = format!("m{}", s.number);
        }
        assert_eq!(detect(&cfg(), &h, 0), None);
        let mut fourth = same_obs(4, "ls");
        fourth.message = "m4".into();
        h.push(fourth);
        assert_eq!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedObservation {
                action: "ls".into(),
                count: 4
            })
        );
    }

    #[test]
    fn other_arguments_break_an_observation_run() {
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        for s in &mut h {
            s.message = format!("m{}", s.number);
        }
        h[1].arguments = serde_json::json!({ "dir": "src" });
        assert_eq!(detect(&cfg(), &h, 0), None);
    }

    #[test]
    fn same_message_three_times() {
        let mut h: Vec<_> = (1..=3).map(|n| step(n, &format!("a{n}"))).collect();
        for s in &mut h {
            s.message = "I will now fix it".into();
        }
        assert_eq!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedMessage { count: 3 })
        );
        h[1].message = "something else".into();
        assert_eq!(detect(&cfg(), &h, 0), None);
    }

    #[test]
    fn empty_messages_are_not_a_repeat() {
        let mut h: Vec<_> = (1..=5).map(|n| step(n, &format!("a{n}"))).collect();
        for s in &mut h {
            s.message.clear();
        }
        assert_eq!(detect(&cfg(), &h, 0), None);
    }

    #[test]
    fn a_b_alternation_over_six_steps() {
        let h: Vec<_> = (1..=6)
            .map(|n| step(n, if n % 2 == 1 { "open" } else { "close" }))
            .collect();
        assert_eq!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::Alternation {
                first: "open".into(),
                second: "close".into()
            })
        );
        assert_eq!(detect(&cfg(), &h[..5], 0), None);
        let mut broken = h.clone();
        broken[2] = step(3, "other");
        assert_eq!(detect(&cfg(), &broken, 0), None);
    }

    #[test]
    fn a_pattern_that_ended_earlier_does_not_fire() {
        let mut h = vec![failing(1, "test"), failing(2, "test"), failing(3, "test")];
        h.push(step(4, "fix"));
        assert_eq!(detect(&cfg(), &h, 0), None);
    }

    #[test]
    fn waiting_steps_neither_count_nor_break_runs() {
        let h = vec![
            failing(1, "test"),
            waiting(2, 100),
            failing(3, "test"),
            waiting(4, 100),
        ];
        // The newest step is a waiting one: repeats are not judged on it.
        assert_eq!(detect(&cfg(), &h, 200), None);
        let mut h = h;
        h.push(failing(5, "test"));
        assert_eq!(
            detect(&cfg(), &h, 200),
            Some(StuckPattern::RepeatedError {
                action: "test".into(),
                count: 3
            })
        );
        let polls: Vec<_> = (1..=10).map(|n| waiting(n, 1_000)).collect();
        assert_eq!(detect(&cfg(), &polls, 10_000), None);
    }

    #[test]
    fn total_wait_is_capped() {
        let polls: Vec<_> = (1..=3).map(|n| waiting(n, 1_000)).collect();
        assert_eq!(detect(&cfg(), &polls, 1_800_000), None);
        assert_eq!(
            detect(&cfg(), &polls, 1_800_001),
            Some(StuckPattern::WaitCapExceeded {
                total_wait_ms: 1_800_001
            })
        );
    }

    #[test]
    fn repeated_context_overflow() {
        let mut h: Vec<_> = (1..=5).map(|n| step(n, &format!("a{n}"))).collect();
        h[4].context_overflow = true;
        assert_eq!(detect(&cfg(), &h, 0), None);
        h[1].context_overflow = true;
        assert_eq!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
        // Outside the window it does not count.
        let mut far: Vec<_> = (1..=8).map(|n| step(n, &format!("a{n}"))).collect();
        far[0].context_overflow = true;
        far[7].context_overflow = true;
        assert_eq!(detect(&cfg(), &far, 0), None);
    }

    #[test]
    fn check_order_error_then_observation_then_message_then_alternation() {
        // Same failing action, same observation and same message: error wins.
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "x")).collect();
        for s in &mut h {
            s.outcome = Outcome::Failure;
            s.message = "again".into();
        }
        assert!(matches!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedError { .. })
        ));
        // Without failures: observation beats message.
        for s in &mut h {
            s.outcome = Outcome::Success;
        }
        assert!(matches!(
            detect(&cfg(), &h, 0),
            Some(StuckPattern::RepeatedObservation { .. })
        ));
        // An alternation whose messages repeat reports the message first.
        let mut alt: Vec<_> = (1..=6)
            .map(|n| step(n, if n % 2 == 1 { "a" } else { "b" }))
            .collect();
        for s in &mut alt {
            s.message = "same".into();
        }
        assert!(matches!(
            detect(&cfg(), &alt, 0),
            Some(StuckPattern::RepeatedMessage { .. })
        ));
        // Overflow is checked after alternation.
        alt.iter_mut()
            .for_each(|s| s.message = format!("m{}", s.number));
        alt[4].context_overflow = true;
        alt[5].context_overflow = true;
        assert!(matches!(
            detect(&cfg(), &alt, 0),
            Some(StuckPattern::Alternation { .. })
        ));
    }

    #[test]
    fn first_pattern_nudges_then_pauses() {
        let p = StuckPattern::RepeatedError {
            action: "test".into(),
            count: 3,
        };
        match respond(&p, 0) {
            StuckVerdict::Nudge { message } => {
                assert!(message.contains("repeated `test` ending in an error 3 times"));
                assert!(message.contains("different approach"));
            }
            StuckVerdict::Pause => panic!("first hit must nudge"),
        }
        assert_eq!(respond(&p, 1), StuckVerdict::Pause);
        assert_eq!(respond(&p, 7), StuckVerdict::Pause);
    }

    #[test]
    fn every_pattern_describes_itself() {
        let all = [
            StuckPattern::RepeatedObservation {
                action: "a".into(),
                count: 4,
            },
            StuckPattern::RepeatedError {
                action: "a".into(),
                count: 3,
            },
            StuckPattern::RepeatedMessage { count: 3 },
            StuckPattern::Alternation {
                first: "a".into(),
                second: "b".into(),
            },
            StuckPattern::ContextOverflow { count: 2 },
            StuckPattern::WaitCapExceeded { total_wait_ms: 5 },
        ];
        for p in all {
            assert!(!p.describe().is_empty());
            let json = serde_json::to_value(&p).unwrap();
            assert!(json["pattern"].is_string());
        }
    }
}
