//! Deterministic stuck detection: patterns in the recent steps that show an
//! agent going round in circles. It sits beside reflection because it needs no
//! model, costs nothing per step, and cannot be talked out of what it sees.

use std::borrow::Borrow;

use serde::{Deserialize, Serialize};

use super::history::{Outcome, StepRecord};

/// Thresholds of stuck detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckConfig {
    /// Same action, arguments and observation this many times in a row.
    pub same_observation: usize,
    /// Same action ending in failure or error this many times in a row.
    pub same_error: usize,
    /// Same non-empty agent message, in steps that took no action, this many times in a row.
    pub same_message: usize,
    /// A,B,A,B… (same calls, same results) over this many steps.
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
    /// The same action with the same arguments saw the same observation again and again.
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
    /// The agent said the same thing again and again without acting.
    RepeatedMessage {
        /// How many times in a row.
        count: usize,
    },
    /// The agent alternates between two actions.
    Alternation {
        /// Action of the older step of the pair.
        first: String,
        /// Action of the newer step of the pair.
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
    /// A short sentence, starting with a past-tense verb, saying what the agent repeated.
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
            StuckPattern::Alternation { first, second } if first == second => {
                // Same tool, two argument sets: naming it twice would read oddly.
                format!("alternated between two calls of `{first}` without progress")
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
    /// Pause the session for a person.
    Pause,
}

/// The first hit nudges the agent; any hit after a nudge pauses the session.
pub fn respond(pattern: &StuckPattern, nudges_given: u32) -> StuckVerdict {
    if nudges_given == 0 {
        StuckVerdict::Nudge {
            message: format!(
                "You {}. That is not making progress: try something different.",
                pattern.describe()
            ),
        }
    } else {
        StuckVerdict::Pause
    }
}

/// Actions that are a bare message rather than an act on the world (the LLM
/// executor names a turn without a tool call `respond`).
pub const BARE_MESSAGE_ACTIONS: [&str; 4] = ["respond", "message", "say", "think"];

/// Whether a step only talked: no tool call, and its action is a bare message.
pub fn took_no_action(step: &StepRecord) -> bool {
    step.tool_calls == 0
        && BARE_MESSAGE_ACTIONS
            .iter()
            .any(|a| step.action.eq_ignore_ascii_case(a))
}

/// Whether the step never reached the agent: the executor failed (model or
/// webhook unreachable) before any action, leaving no observation, message or
/// tool call. A run of those is an outage for the error-streak guardrail to
/// end, not a loop of the agent's, and nudging the agent cannot fix it.
pub fn executor_failed(step: &StepRecord) -> bool {
    step.outcome == Outcome::Error
        && step.tool_calls == 0
        && step.observation.is_empty()
        && step.message.is_empty()
}

/// Finds a stuck pattern the newest step takes part in; `history` is oldest first.
///
/// Waiting steps are left out of the repeat, message and alternation
/// patterns (polling is meant to repeat itself); when the newest step is a
/// waiting one only the context-overflow and wait-cap checks apply. The
/// message rule only counts steps that took no action: different actions that
/// happen to print the same text are progress, not a monologue. Executor
/// failures are left out like waiting steps.
///
/// `history` may hold the records or references to them: the loop judges
/// its window plus the newest step without copying the window.
pub fn detect<S: Borrow<StepRecord>>(
    config: &StuckConfig,
    history: &[S],
    total_wait_ms: u64,
) -> Option<StuckPattern> {
    let newest = history.last()?.borrow();
    if !newest.waiting && !executor_failed(newest) {
        let active: Vec<&StepRecord> = history
            .iter()
            .map(Borrow::borrow)
            .filter(|s| !s.waiting && !executor_failed(s))
            .collect();
        if let Some(pattern) = repeated_error(config, &active)
            .or_else(|| repeated_observation(config, &active))
            .or_else(|| repeated_message(config, &active))
            .or_else(|| alternation(config, &active))
        {
            return Some(pattern);
        }
    }
    if let Some(pattern) = context_overflow(config, history) {
        return Some(pattern);
    }
    (newest.waiting && total_wait_ms > config.max_total_wait_ms)
        .then_some(StuckPattern::WaitCapExceeded { total_wait_ms })
}

fn failed(step: &StepRecord) -> bool {
    matches!(step.outcome, Outcome::Failure | Outcome::Error)
}

/// Length of the run at the end of `steps` whose members match the newest one by `same`.
fn trailing_run(steps: &[&StepRecord], same: impl Fn(&StepRecord, &StepRecord) -> bool) -> usize {
    let Some(newest) = steps.last() else {
        return 0;
    };
    steps.iter().rev().take_while(|s| same(s, newest)).count()
}

// Thresholds are raised to at least 1 below: the newest step must take part,
// so a run of zero steps is never a pattern, even under a zero threshold.

fn repeated_error(config: &StuckConfig, active: &[&StepRecord]) -> Option<StuckPattern> {
    let count = trailing_run(active, |s, newest| {
        failed(s) && failed(newest) && s.action == newest.action
    });
    let newest = active.last()?;
    (count >= config.same_error.max(1)).then(|| StuckPattern::RepeatedError {
        action: newest.action.clone(),
        count,
    })
}

fn repeated_observation(config: &StuckConfig, active: &[&StepRecord]) -> Option<StuckPattern> {
    let count = trailing_run(active, |s, newest| {
        s.action == newest.action
            && s.arguments == newest.arguments
            && s.observation == newest.observation
    });
    let newest = active.last()?;
    (count >= config.same_observation.max(1)).then(|| StuckPattern::RepeatedObservation {
        action: newest.action.clone(),
        count,
    })
}

fn repeated_message(config: &StuckConfig, active: &[&StepRecord]) -> Option<StuckPattern> {
    let count = trailing_run(active, |s, newest| {
        took_no_action(newest)
            && took_no_action(s)
            && !newest.message.is_empty()
            && s.message == newest.message
    });
    (count >= config.same_message.max(1)).then_some(StuckPattern::RepeatedMessage { count })
}

fn alternation(config: &StuckConfig, active: &[&StepRecord]) -> Option<StuckPattern> {
    let len = config.alternation;
    // Two distinct keys need at least two steps.
    if len < 2 || active.len() < len {
        return None;
    }
    let tail = &active[active.len() - len..];
    let (a, b) = (key(tail[0]), key(tail[1]));
    if a == b {
        return None;
    }
    let alternates = tail
        .iter()
        .enumerate()
        .all(|(i, s)| key(s) == if i % 2 == 0 { a } else { b });
    alternates.then(|| StuckPattern::Alternation {
        first: a.0.to_string(),
        second: b.0.to_string(),
    })
}

/// What makes two steps "the same call" for alternation: the call and what it
/// saw, so two calls that keep learning something new are not a loop.
fn key(step: &StepRecord) -> (&str, &serde_json::Value, &str) {
    (&step.action, &step.arguments, &step.observation)
}

fn context_overflow<S: Borrow<StepRecord>>(
    config: &StuckConfig,
    history: &[S],
) -> Option<StuckPattern> {
    if !history.last()?.borrow().context_overflow {
        return None;
    }
    let window = &history[history.len().saturating_sub(config.overflow_window)..];
    let count = window
        .iter()
        .filter(|s| Borrow::<StepRecord>::borrow(*s).context_overflow)
        .count();
    (count >= config.overflow_repeats.max(1)).then_some(StuckPattern::ContextOverflow { count })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::history::tests::step;
    use serde_json::json;

    fn cfg() -> StuckConfig {
        StuckConfig::default()
    }

    fn detect_default(history: &[StepRecord]) -> Option<StuckPattern> {
        detect(&cfg(), history, 0)
    }

    /// Distinct successful steps `a1`, `a2`, … numbered from `from`.
    fn varied(from: u64, count: u64) -> Vec<StepRecord> {
        (from..from + count)
            .map(|n| step(n, &format!("a{n}")))
            .collect()
    }

    /// A failing step with its own arguments and error text.
    fn failing(n: u64, action: &str) -> StepRecord {
        let mut s = step(n, action);
        s.outcome = Outcome::Failure;
        s.arguments = json!({ "attempt": n });
        s.error = Some(format!("error {n}"));
        s
    }

    /// A successful step whose observation is always "same".
    fn same_obs(n: u64, action: &str) -> StepRecord {
        let mut s = step(n, action);
        s.observation = "same".into();
        s
    }

    fn with_message(mut s: StepRecord, message: &str) -> StepRecord {
        s.message = message.into();
        s
    }

    /// A step that only talked: a model turn without a tool call.
    fn talking(n: u64, message: &str) -> StepRecord {
        let mut s = step(n, "respond");
        s.tool_calls = 0;
        s.message = message.into();
        s
    }

    fn overflowing(mut s: StepRecord) -> StepRecord {
        s.context_overflow = true;
        s
    }

    /// A polling step that repeats itself exactly, as polling does.
    fn waiting(n: u64) -> StepRecord {
        let mut s = step(n, "poll_job");
        s.waiting = true;
        s.observation = "still running".into();
        s.message = "waiting".into();
        s.duration_ms = 60_000;
        s
    }

    /// Steps alternating between actions `a` and `b`, numbered from 1, each
    /// call seeing the same result as its previous occurrence.
    fn alternating(count: u64, a: &str, b: &str) -> Vec<StepRecord> {
        (1..=count)
            .map(|n| {
                let action = if n % 2 == 1 { a } else { b };
                let mut s = step(n, action);
                s.observation = format!("result of {action}");
                s
            })
            .collect()
    }

    fn error_pattern(action: &str, count: usize) -> Option<StuckPattern> {
        Some(StuckPattern::RepeatedError {
            action: action.into(),
            count,
        })
    }

    fn observation_pattern(action: &str, count: usize) -> Option<StuckPattern> {
        Some(StuckPattern::RepeatedObservation {
            action: action.into(),
            count,
        })
    }

    fn alternation_pattern(first: &str, second: &str) -> Option<StuckPattern> {
        Some(StuckPattern::Alternation {
            first: first.into(),
            second: second.into(),
        })
    }

    // ---- defaults and quiet histories ----

    #[test]
    fn default_config_matches_the_design() {
        assert_eq!(
            cfg(),
            StuckConfig {
                same_observation: 4,
                same_error: 3,
                same_message: 3,
                alternation: 6,
                overflow_window: 5,
                overflow_repeats: 2,
                max_total_wait_ms: 1_800_000,
            }
        );
    }

    #[test]
    fn empty_and_short_histories_are_not_stuck() {
        assert_eq!(detect_default(&[]), None);
        assert_eq!(detect::<StepRecord>(&cfg(), &[], u64::MAX), None);
        assert_eq!(detect_default(&[step(1, "a")]), None);
        assert_eq!(detect_default(&[failing(1, "a")]), None);
        assert_eq!(detect_default(&[failing(1, "a"), failing(2, "a")]), None);
    }

    #[test]
    fn varied_steps_are_not_stuck() {
        assert_eq!(detect_default(&varied(1, 20)), None);
    }

    // ---- repeated error ----

    #[test]
    fn same_failing_action_fires_at_three_not_two() {
        let h = vec![failing(1, "test"), failing(2, "test")];
        assert_eq!(detect_default(&h), None);
        let h = vec![failing(1, "test"), failing(2, "test"), failing(3, "test")];
        assert_eq!(detect_default(&h), error_pattern("test", 3));
    }

    #[test]
    fn error_count_is_the_whole_trailing_run() {
        let h: Vec<_> = (1..=5).map(|n| failing(n, "test")).collect();
        assert_eq!(detect_default(&h), error_pattern("test", 5));
        // Only the trailing run counts: an older run before a success does not.
        let mut h: Vec<_> = (1..=5).map(|n| failing(n, "test")).collect();
        h.push(step(6, "test"));
        h.extend((7..=9).map(|n| failing(n, "test")));
        assert_eq!(detect_default(&h), error_pattern("test", 3));
    }

    #[test]
    fn error_run_ignores_arguments_and_error_text() {
        let h = vec![failing(1, "test"), failing(2, "test"), failing(3, "test")];
        assert_ne!(h[0].arguments, h[1].arguments);
        assert_ne!(h[0].error, h[1].error);
        assert_eq!(detect_default(&h), error_pattern("test", 3));
    }

    #[test]
    fn error_and_failure_outcomes_both_count() {
        let mut h = vec![failing(1, "x"), failing(2, "x"), failing(3, "x")];
        h[0].outcome = Outcome::Error;
        h[2].outcome = Outcome::Error;
        assert_eq!(detect_default(&h), error_pattern("x", 3));
    }

    #[test]
    fn error_run_is_broken_by_a_success_or_another_action() {
        let h = vec![failing(1, "test"), step(2, "test"), failing(3, "test")];
        assert_eq!(detect_default(&h), None);
        let h = vec![failing(1, "test"), failing(2, "build"), failing(3, "test")];
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn an_error_run_that_ended_does_not_fire() {
        let mut h: Vec<_> = (1..=3).map(|n| failing(n, "test")).collect();
        h.push(step(4, "fix"));
        assert_eq!(detect_default(&h), None);
        // Nor when the newest step fails with another action.
        h.pop();
        h.push(failing(4, "build"));
        assert_eq!(detect_default(&h), None);
        // Nor when the same action finally succeeds.
        h.pop();
        h.push(step(4, "test"));
        assert_eq!(detect_default(&h), None);
    }

    // ---- repeated observation ----

    #[test]
    fn same_action_and_observation_fires_at_four_not_three() {
        let h: Vec<_> = (1..=3).map(|n| same_obs(n, "ls")).collect();
        assert_eq!(detect_default(&h), None);
        let h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        assert_eq!(detect_default(&h), observation_pattern("ls", 4));
        let h: Vec<_> = (1..=6).map(|n| same_obs(n, "ls")).collect();
        assert_eq!(detect_default(&h), observation_pattern("ls", 6));
    }

    #[test]
    fn other_arguments_or_observation_break_an_observation_run() {
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        h[1].arguments = json!({ "dir": "src" });
        assert_eq!(detect_default(&h), None);
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        h[2].observation = "changed".into();
        assert_eq!(detect_default(&h), None);
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        h[0].action = "dir".into();
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn equal_structured_arguments_are_the_same_key() {
        let h: Vec<_> = (1..=4)
            .map(|n| {
                let mut s = same_obs(n, "read");
                s.arguments = json!({ "path": "a.rs", "lines": [1, 2] });
                s
            })
            .collect();
        assert_eq!(detect_default(&h), observation_pattern("read", 4));
    }

    #[test]
    fn an_observation_run_that_ended_does_not_fire() {
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        h.push(step(5, "edit"));
        assert_eq!(detect_default(&h), None);
    }

    // ---- repeated message ----

    #[test]
    fn same_message_fires_at_three_not_two() {
        let h: Vec<_> = (1..=2).map(|n| talking(n, "I will now fix it")).collect();
        assert_eq!(detect_default(&h), None);
        let h: Vec<_> = (1..=3).map(|n| talking(n, "I will now fix it")).collect();
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::RepeatedMessage { count: 3 })
        );
    }

    #[test]
    fn a_different_message_breaks_the_run() {
        let mut h: Vec<_> = (1..=3).map(|n| talking(n, "again")).collect();
        h[1].message = "something else".into();
        assert_eq!(detect_default(&h), None);
        // A message run that ended does not fire.
        let mut h: Vec<_> = (1..=3).map(|n| talking(n, "again")).collect();
        h.push(step(4, "a4"));
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn empty_messages_are_never_a_repeat() {
        let h: Vec<_> = (1..=6).map(|n| talking(n, "")).collect();
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn different_actions_with_the_same_message_are_progress() {
        // A scripted session whose steps all print `ok`: message and
        // observation are the same text, the actions differ.
        let h: Vec<_> = (1..=10)
            .map(|n| {
                let mut s = step(n, &format!("write_part_{n}"));
                s.tool_calls = 0;
                s.message = "ok".into();
                s.observation = "ok".into();
                s
            })
            .collect();
        assert_eq!(detect_default(&h), None);
        // A model that says "Continuing." beside a different tool call each turn.
        let h: Vec<_> = varied(1, 10)
            .into_iter()
            .map(|s| with_message(s, "Continuing."))
            .collect();
        assert_eq!(detect_default(&h), None);
        // The same tool with changing arguments and the same short answer.
        let h: Vec<_> = (1..=10)
            .map(|n| {
                let mut s = with_message(step(n, "write_file"), "ok");
                s.arguments = json!({ "path": format!("part{n}.md") });
                s.observation = "ok".into();
                s
            })
            .collect();
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn acting_steps_break_a_message_run() {
        let h = vec![
            talking(1, "thinking"),
            talking(2, "thinking"),
            with_message(step(3, "edit"), "thinking"),
            talking(4, "thinking"),
        ];
        assert_eq!(detect_default(&h), None);
        // A step naming a bare-message action but making tool calls acted.
        let mut h: Vec<_> = (1..=3).map(|n| talking(n, "same")).collect();
        h[1].tool_calls = 1;
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn every_bare_message_action_counts_whatever_its_case() {
        for action in BARE_MESSAGE_ACTIONS {
            let h: Vec<_> = (1..=3)
                .map(|n| {
                    let mut s = talking(n, "hmm");
                    s.action = action.to_uppercase();
                    s
                })
                .collect();
            assert_eq!(
                detect_default(&h),
                Some(StuckPattern::RepeatedMessage { count: 3 }),
                "{action}"
            );
        }
        assert!(took_no_action(&talking(1, "x")));
        assert!(!took_no_action(&step(1, "respond")), "one tool call");
        let mut s = step(1, "write_file");
        s.tool_calls = 0;
        assert!(!took_no_action(&s), "a scripted action is an action");
    }

    // ---- alternation ----

    #[test]
    fn alternation_fires_over_six_steps_not_five() {
        let h = alternating(6, "open", "close");
        assert_eq!(detect_default(&h), alternation_pattern("open", "close"));
        assert_eq!(detect_default(&h[..5]), None);
        assert_eq!(detect_default(&h[1..]), None);
    }

    #[test]
    fn alternation_looks_at_the_last_window_only() {
        // An unrelated step before the window does not matter.
        let mut h = vec![step(0, "setup")];
        h.extend(alternating(6, "open", "close"));
        assert_eq!(detect_default(&h), alternation_pattern("open", "close"));
        // Seven alternating steps: the window starts with the second action.
        let h = alternating(7, "open", "close");
        assert_eq!(detect_default(&h), alternation_pattern("close", "open"));
    }

    #[test]
    fn a_broken_or_ended_alternation_does_not_fire() {
        let mut broken = alternating(6, "open", "close");
        broken[2] = step(3, "other");
        assert_eq!(detect_default(&broken), None);
        let mut doubled = alternating(6, "open", "close");
        doubled[4] = step(5, "close");
        assert_eq!(detect_default(&doubled), None);
        let mut ended = alternating(6, "open", "close");
        ended.push(step(7, "edit"));
        assert_eq!(detect_default(&ended), None);
    }

    #[test]
    fn alternation_is_keyed_by_action_and_arguments() {
        let mut h: Vec<_> = (1..=6).map(|n| step(n, "read")).collect();
        for (i, s) in h.iter_mut().enumerate() {
            s.arguments = json!({ "path": if i % 2 == 0 { "a" } else { "b" } });
            s.observation = format!("content {}", i % 2);
        }
        assert_eq!(detect_default(&h), alternation_pattern("read", "read"));
        // One call repeated (with changing results) is not an alternation.
        let same_call: Vec<_> = (1..=6).map(|n| step(n, "read")).collect();
        assert_eq!(detect_default(&same_call), None);
        // Same actions but drifting arguments are not an alternation.
        let mut h = alternating(6, "open", "close");
        h[3].arguments = json!({ "v": 2 });
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn productive_alternation_is_not_stuck() {
        // Edit and test in turn, each edit different: arguments change.
        let h: Vec<_> = (1..=12)
            .map(|n| {
                let mut s = step(n, if n % 2 == 1 { "edit" } else { "run_tests" });
                s.observation = "ok".into();
                if n % 2 == 1 {
                    s.arguments = json!({ "path": "lib.rs", "patch": n });
                }
                s
            })
            .collect();
        assert_eq!(detect_default(&h), None);
        // The same two calls, but each sees something new: results change.
        let h: Vec<_> = (1..=12)
            .map(|n| {
                let mut s = step(n, if n % 2 == 1 { "fetch_page" } else { "parse" });
                s.observation = format!("page {}", n / 2);
                s
            })
            .collect();
        assert_eq!(detect_default(&h), None);
        // Only when the results repeat too is it a loop.
        let mut looped = h.clone();
        for s in &mut looped {
            s.observation = format!("same for {}", s.action);
        }
        assert_eq!(
            detect_default(&looped),
            alternation_pattern("fetch_page", "parse")
        );
    }

    #[test]
    fn custom_alternation_lengths_are_honoured() {
        let config = StuckConfig {
            alternation: 4,
            ..cfg()
        };
        let h = alternating(4, "a", "b");
        assert_eq!(detect(&config, &h, 0), alternation_pattern("a", "b"));
        assert_eq!(detect(&config, &h[..3], 0), None);
        let off = StuckConfig {
            alternation: 1,
            ..cfg()
        };
        assert_eq!(detect(&off, &h, 0), None);
        let off = StuckConfig {
            alternation: 0,
            ..cfg()
        };
        assert_eq!(detect(&off, &h, 0), None);
    }

    // ---- context overflow ----

    #[test]
    fn context_overflow_fires_at_two_in_the_window_not_one() {
        let mut h = varied(1, 5);
        h[4].context_overflow = true;
        assert_eq!(detect_default(&h), None);
        h[1].context_overflow = true;
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
        h[3].context_overflow = true;
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::ContextOverflow { count: 3 })
        );
    }

    #[test]
    fn context_overflow_window_edge() {
        // Oldest step of the last five counts...
        let mut h = varied(1, 6);
        h[1].context_overflow = true;
        h[5].context_overflow = true;
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
        // ...one step further back does not.
        let mut h = varied(1, 6);
        h[0].context_overflow = true;
        h[5].context_overflow = true;
        assert_eq!(detect_default(&h), None);
    }

    #[test]
    fn context_overflow_needs_the_newest_step_to_overflow() {
        let mut h = varied(1, 5);
        h[2].context_overflow = true;
        h[3].context_overflow = true;
        assert_eq!(detect_default(&h), None);
    }

    // ---- waiting steps ----

    #[test]
    fn waiting_steps_neither_count_nor_break_error_runs() {
        let h = vec![failing(1, "test"), waiting(2), failing(3, "test")];
        assert_eq!(detect_default(&h), None);
        let h = vec![
            failing(1, "test"),
            waiting(2),
            failing(3, "test"),
            waiting(4),
            failing(5, "test"),
        ];
        assert_eq!(detect_default(&h), error_pattern("test", 3));
    }

    #[test]
    fn waiting_steps_neither_count_nor_break_message_and_alternation_runs() {
        let h = vec![
            talking(1, "retrying"),
            waiting(2),
            talking(3, "retrying"),
            waiting(4),
            talking(5, "retrying"),
        ];
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::RepeatedMessage { count: 3 })
        );
        let mut h = alternating(6, "open", "close");
        h.insert(3, waiting(100));
        h.insert(1, waiting(101));
        assert_eq!(detect_default(&h), alternation_pattern("open", "close"));
    }

    /// A step whose model call failed before the agent did anything.
    fn outage(n: u64) -> StepRecord {
        let mut s = step(n, "model_call");
        s.outcome = Outcome::Error;
        s.tool_calls = 0;
        s.observation.clear();
        s.message.clear();
        s.error = Some("HTTP 500".into());
        s
    }

    #[test]
    fn executor_failures_are_an_outage_not_a_loop() {
        let h: Vec<_> = (1..=8).map(outage).collect();
        assert_eq!(detect_default(&h), None);
        assert!(executor_failed(&outage(1)));
        // An agent's own failing action with output is still a repeat.
        let mut own = outage(1);
        own.message = "tool crashed".into();
        assert!(!executor_failed(&own));
        let mut acted = outage(1);
        acted.tool_calls = 1;
        assert!(!executor_failed(&acted));
        assert!(!executor_failed(&step(1, "model_call")), "a success");
        // Outages neither count nor break the agent's own error run.
        let h = vec![
            failing(1, "test"),
            outage(2),
            failing(3, "test"),
            outage(4),
            failing(5, "test"),
        ];
        assert_eq!(detect_default(&h), error_pattern("test", 3));
    }

    #[test]
    fn repeated_polling_is_not_stuck() {
        let polls: Vec<_> = (1..=10).map(waiting).collect();
        assert_eq!(detect(&cfg(), &polls, 600_000), None);
    }

    #[test]
    fn a_waiting_newest_step_does_not_refire_earlier_repeats() {
        // Three errors, then the agent starts waiting on a job: the errors
        // were judged when they happened and are not judged again.
        let h = vec![
            failing(1, "test"),
            failing(2, "test"),
            failing(3, "test"),
            waiting(4),
        ];
        assert_eq!(detect(&cfg(), &h, 60_000), None);
    }

    #[test]
    fn total_wait_is_capped_at_the_limit_not_before() {
        let polls: Vec<_> = (1..=3).map(waiting).collect();
        assert_eq!(detect(&cfg(), &polls, 1_800_000), None);
        assert_eq!(
            detect(&cfg(), &polls, 1_800_001),
            Some(StuckPattern::WaitCapExceeded {
                total_wait_ms: 1_800_001
            })
        );
    }

    #[test]
    fn wait_cap_is_only_checked_on_a_waiting_step() {
        let mut h: Vec<_> = (1..=3).map(waiting).collect();
        h.push(step(4, "read_log"));
        assert_eq!(detect(&cfg(), &h, 5_000_000), None);
    }

    // ---- thresholds ----

    #[test]
    fn custom_thresholds_are_honoured() {
        let config = StuckConfig {
            same_error: 5,
            same_observation: 2,
            same_message: 2,
            overflow_window: 2,
            overflow_repeats: 2,
            max_total_wait_ms: 10,
            ..cfg()
        };
        let h: Vec<_> = (1..=4).map(|n| failing(n, "t")).collect();
        assert_eq!(detect(&config, &h, 0), None);
        let h: Vec<_> = (1..=5).map(|n| failing(n, "t")).collect();
        assert_eq!(detect(&config, &h, 0), error_pattern("t", 5));
        let h: Vec<_> = (1..=2).map(|n| same_obs(n, "ls")).collect();
        assert_eq!(detect(&config, &h, 0), observation_pattern("ls", 2));
        let h = vec![talking(1, "m"), talking(2, "m")];
        assert_eq!(
            detect(&config, &h, 0),
            Some(StuckPattern::RepeatedMessage { count: 2 })
        );
        let h = vec![
            overflowing(step(1, "a")),
            step(2, "b"),
            overflowing(step(3, "c")),
        ];
        assert_eq!(detect(&config, &h, 0), None);
        assert_eq!(
            detect(&config, &h[1..], 0),
            None,
            "one wrap-up in a window of two"
        );
        let h = vec![overflowing(step(1, "a")), overflowing(step(2, "b"))];
        assert_eq!(
            detect(&config, &h, 0),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
        assert_eq!(
            detect(&config, &[waiting(1)], 11),
            Some(StuckPattern::WaitCapExceeded { total_wait_ms: 11 })
        );
    }

    #[test]
    fn zero_thresholds_still_need_the_newest_step_to_take_part() {
        let config = StuckConfig {
            same_error: 0,
            same_observation: 0,
            same_message: 0,
            overflow_repeats: 0,
            ..cfg()
        };
        // A single failure is a run of one.
        assert_eq!(
            detect(&config, &[failing(1, "t")], 0),
            error_pattern("t", 1)
        );
        // A successful step is always a run of one of itself.
        assert_eq!(
            detect(&config, &[step(1, "a")], 0),
            observation_pattern("a", 1)
        );
        // Empty messages and no overflow never fire, even at zero.
        let quiet = StuckConfig {
            same_observation: usize::MAX,
            ..config
        };
        let mut s = step(1, "a");
        s.message.clear();
        assert_eq!(detect(&quiet, &[s], 0), None);
    }

    // ---- check order ----

    #[test]
    fn error_beats_observation() {
        let h: Vec<_> = (1..=4)
            .map(|n| {
                let mut s = same_obs(n, "x");
                s.outcome = Outcome::Failure;
                s
            })
            .collect();
        assert_eq!(detect_default(&h), error_pattern("x", 4));
    }

    #[test]
    fn error_beats_message() {
        let h: Vec<_> = (1..=3)
            .map(|n| with_message(failing(n, "x"), "again"))
            .collect();
        assert_eq!(detect_default(&h), error_pattern("x", 3));
    }

    #[test]
    fn error_beats_alternation() {
        // One action, two argument sets, all failing: both patterns hold.
        let mut h: Vec<_> = (1..=6).map(|n| failing(n, "test")).collect();
        for (i, s) in h.iter_mut().enumerate() {
            s.arguments = json!({ "filter": i % 2 });
            s.observation = format!("result {}", i % 2);
        }
        assert_eq!(detect_default(&h), error_pattern("test", 6));
        for s in &mut h {
            s.outcome = Outcome::Success;
        }
        assert_eq!(detect_default(&h), alternation_pattern("test", "test"));
    }

    #[test]
    fn error_beats_context_overflow() {
        let h = vec![
            failing(1, "x"),
            overflowing(failing(2, "x")),
            overflowing(failing(3, "x")),
        ];
        assert_eq!(detect_default(&h), error_pattern("x", 3));
    }

    #[test]
    fn observation_beats_message() {
        let h: Vec<_> = (1..=4)
            .map(|n| {
                let mut s = talking(n, "again");
                s.observation = "same".into();
                s
            })
            .collect();
        assert_eq!(detect_default(&h), observation_pattern("respond", 4));
    }

    #[test]
    fn observation_beats_alternation() {
        // With default thresholds the two cannot hold at once (one needs the
        // last two keys equal, the other different); a threshold of 1 makes
        // every step an observation run, which must win over the alternation.
        let config = StuckConfig {
            same_observation: 1,
            ..cfg()
        };
        let h = alternating(6, "open", "close");
        assert_eq!(detect(&config, &h, 0), observation_pattern("close", 1));
    }

    #[test]
    fn observation_beats_context_overflow() {
        let mut h: Vec<_> = (1..=4).map(|n| same_obs(n, "ls")).collect();
        h[2].context_overflow = true;
        h[3].context_overflow = true;
        assert_eq!(detect_default(&h), observation_pattern("ls", 4));
    }

    #[test]
    fn message_beats_alternation() {
        let h: Vec<_> = alternating(6, "respond", "think")
            .into_iter()
            .map(|mut s| {
                s.tool_calls = 0;
                with_message(s, "same")
            })
            .collect();
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::RepeatedMessage { count: 6 })
        );
    }

    #[test]
    fn message_beats_context_overflow() {
        let h: Vec<_> = (1..=3).map(|n| overflowing(talking(n, "same"))).collect();
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::RepeatedMessage { count: 3 })
        );
    }

    #[test]
    fn alternation_beats_context_overflow() {
        let mut h = alternating(6, "a", "b");
        h[4].context_overflow = true;
        h[5].context_overflow = true;
        assert_eq!(detect_default(&h), alternation_pattern("a", "b"));
        h[0] = step(1, "other");
        assert_eq!(
            detect_default(&h),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
    }

    #[test]
    fn context_overflow_beats_wait_cap() {
        let h = vec![overflowing(waiting(1)), waiting(2), overflowing(waiting(3))];
        assert_eq!(
            detect(&cfg(), &h, 2_000_000),
            Some(StuckPattern::ContextOverflow { count: 2 })
        );
        let h = vec![waiting(1), waiting(2), waiting(3)];
        assert_eq!(
            detect(&cfg(), &h, 2_000_000),
            Some(StuckPattern::WaitCapExceeded {
                total_wait_ms: 2_000_000
            })
        );
    }

    #[test]
    fn repeat_patterns_and_wait_cap_never_compete() {
        // The repeats are judged on non-waiting newest steps, the wait cap on
        // waiting ones: whichever the newest step is decides which applies.
        let mut h: Vec<_> = (1..=3).map(|n| failing(n, "test")).collect();
        assert_eq!(detect(&cfg(), &h, 2_000_000), error_pattern("test", 3));
        h.push(waiting(4));
        assert_eq!(
            detect(&cfg(), &h, 2_000_000),
            Some(StuckPattern::WaitCapExceeded {
                total_wait_ms: 2_000_000
            })
        );
    }

    // ---- describe and respond ----

    fn every_pattern() -> [StuckPattern; 6] {
        [
            StuckPattern::RepeatedObservation {
                action: "ls".into(),
                count: 4,
            },
            StuckPattern::RepeatedError {
                action: "run_tests".into(),
                count: 3,
            },
            StuckPattern::RepeatedMessage { count: 3 },
            StuckPattern::Alternation {
                first: "open".into(),
                second: "close".into(),
            },
            StuckPattern::ContextOverflow { count: 2 },
            StuckPattern::WaitCapExceeded {
                total_wait_ms: 1_800_001,
            },
        ]
    }

    #[test]
    fn every_pattern_describes_itself() {
        let described: Vec<String> = every_pattern().iter().map(StuckPattern::describe).collect();
        assert_eq!(
            described,
            [
                "repeated `ls` with the same result 4 times",
                "repeated `run_tests` ending in an error 3 times",
                "repeated the same message 3 times",
                "alternated between `open` and `close` without progress",
                "ran out of context 2 times in quick succession",
                "waited 1800001 ms in total, more than allowed",
            ]
        );
        let same_tool = StuckPattern::Alternation {
            first: "read".into(),
            second: "read".into(),
        };
        assert_eq!(
            same_tool.describe(),
            "alternated between two calls of `read` without progress"
        );
    }

    #[test]
    fn first_hit_nudges_with_what_was_repeated() {
        let p = StuckPattern::RepeatedError {
            action: "run_tests".into(),
            count: 3,
        };
        assert_eq!(
            respond(&p, 0),
            StuckVerdict::Nudge {
                message: "You repeated `run_tests` ending in an error 3 times. \
                          That is not making progress: try something different."
                    .into()
            }
        );
        for p in every_pattern() {
            match respond(&p, 0) {
                StuckVerdict::Nudge { message } => {
                    assert!(message.contains(&p.describe()), "{message}");
                    assert!(message.contains("try something different"), "{message}");
                }
                StuckVerdict::Pause => panic!("first hit must nudge: {p:?}"),
            }
        }
    }

    #[test]
    fn any_hit_after_a_nudge_pauses() {
        for p in every_pattern() {
            assert_eq!(respond(&p, 1), StuckVerdict::Pause);
            assert_eq!(respond(&p, 2), StuckVerdict::Pause);
            assert_eq!(respond(&p, u32::MAX), StuckVerdict::Pause);
        }
    }

    // ---- serialization ----

    #[test]
    fn patterns_serialize_with_a_pattern_tag() {
        let expected = [
            json!({ "pattern": "repeated_observation", "action": "ls", "count": 4 }),
            json!({ "pattern": "repeated_error", "action": "run_tests", "count": 3 }),
            json!({ "pattern": "repeated_message", "count": 3 }),
            json!({ "pattern": "alternation", "first": "open", "second": "close" }),
            json!({ "pattern": "context_overflow", "count": 2 }),
            json!({ "pattern": "wait_cap_exceeded", "total_wait_ms": 1_800_001 }),
        ];
        for (p, want) in every_pattern().into_iter().zip(expected) {
            let value = serde_json::to_value(&p).unwrap();
            assert_eq!(value, want);
            assert_eq!(serde_json::from_value::<StuckPattern>(value).unwrap(), p);
        }
    }

    #[test]
    fn verdicts_serialize_with_a_verdict_tag() {
        let nudge = StuckVerdict::Nudge {
            message: "m".into(),
        };
        let value = serde_json::to_value(&nudge).unwrap();
        assert_eq!(value, json!({ "verdict": "nudge", "message": "m" }));
        assert_eq!(
            serde_json::from_value::<StuckVerdict>(value).unwrap(),
            nudge
        );
        let value = serde_json::to_value(&StuckVerdict::Pause).unwrap();
        assert_eq!(value, json!({ "verdict": "pause" }));
        assert_eq!(
            serde_json::from_value::<StuckVerdict>(value).unwrap(),
            StuckVerdict::Pause
        );
    }

    #[test]
    fn config_round_trips_with_stable_field_names() {
        let value = serde_json::to_value(cfg()).unwrap();
        assert_eq!(
            value,
            json!({
                "same_observation": 4, "same_error": 3, "same_message": 3,
                "alternation": 6, "overflow_window": 5, "overflow_repeats": 2,
                "max_total_wait_ms": 1_800_000
            })
        );
        assert_eq!(serde_json::from_value::<StuckConfig>(value).unwrap(), cfg());
    }
}
