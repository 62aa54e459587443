//! Metacognitive reflection, the pure part: validating the reflector's JSON
//! strictly, the decision matrix, and the two-vote rule between the agent's
//! done-signal and the reflector's verdict. The interval until the next
//! reflection is `reflection_interval.rs`'s to decide.

use serde::{Deserialize, Serialize};

use super::lifecycle::Reason;

/// Whether the goal is achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GoalAchieved {
    /// Yes.
    Yes,
    /// No.
    No,
    /// In part.
    Partial,
}

/// How progress is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Progress {
    /// Steady progress.
    Good,
    /// Progress, but slow.
    Slow,
    /// No progress.
    Stuck,
}

/// What the reflector recommends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Recommendation {
    /// Keep going.
    Continue,
    /// Stop.
    Stop,
    /// Ask the user.
    AskUser,
}

/// A validated reflection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assessment {
    /// Goal achieved?
    pub goal_achieved: GoalAchieved,
    /// Progress.
    pub progress: Progress,
    /// Percent complete, 0–100.
    pub percent_complete: f64,
    /// Whether the agent loops.
    pub loop_detected: bool,
    /// Recommendation.
    pub recommendation: Recommendation,
    /// Why.
    pub reasoning: String,
    /// What to do next.
    pub next_steps: Vec<String>,
    /// How coherent the work is with the goal, 0–1 (optional in the answer).
    pub coherence: Option<f64>,
    /// How uncertain the agent seems, 0–1 (optional in the answer).
    pub uncertainty: Option<f64>,
    /// Milestones the reflector reports as done.
    pub milestones_done: Vec<String>,
    /// Success criteria the reflector reports as met.
    pub criteria_met: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAssessment {
    goal_achieved: String,
    progress: String,
    percent_complete: f64,
    loop_detected: bool,
    recommendation: String,
    reasoning: String,
    #[serde(default)]
    next_steps: Vec<String>,
    #[serde(default)]
    coherence: Option<f64>,
    #[serde(default)]
    uncertainty: Option<f64>,
    #[serde(default)]
    milestones_done: Vec<String>,
    #[serde(default)]
    criteria_met: Vec<String>,
}

fn one_of<T: Copy>(field: &str, value: &str, options: &[(&str, T)]) -> Result<T, String> {
    options
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value.trim()))
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            format!("{field} must be one of {}, got {value:?}", names.join("/"))
        })
}

fn unit_interval(field: &str, value: Option<f64>) -> Result<Option<f64>, String> {
    match value {
        Some(v) if !(0.0..=1.0).contains(&v) => {
            Err(format!("{field} must be between 0 and 1, got {v}"))
        }
        other => Ok(other),
    }
}

/// The JSON object in a reflector's answer, tolerating a fenced code block
/// or prose around it.
fn json_object(text: &str) -> Option<&str> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    (end > start).then(|| &text[start..=end])
}

/// Parses and strictly validates a reflector's answer.
pub fn parse_assessment(text: &str) -> Result<Assessment, String> {
    let json = json_object(text).ok_or("the answer contains no JSON object")?;
    let raw: RawAssessment = serde_json::from_str(json)
        .map_err(|e| format!("the answer is not a valid assessment: {e}"))?;
    if !(0.0..=100.0).contains(&raw.percent_complete) {
        return Err(format!(
            "percentComplete must be between 0 and 100, got {}",
            raw.percent_complete
        ));
    }
    Ok(Assessment {
        goal_achieved: one_of(
            "goalAchieved",
            &raw.goal_achieved,
            &[
                ("YES", GoalAchieved::Yes),
                ("NO", GoalAchieved::No),
                ("PARTIAL", GoalAchieved::Partial),
            ],
        )?,
        progress: one_of(
            "progress",
            &raw.progress,
            &[
                ("GOOD", Progress::Good),
                ("SLOW", Progress::Slow),
                ("STUCK", Progress::Stuck),
            ],
        )?,
        percent_complete: raw.percent_complete,
        loop_detected: raw.loop_detected,
        recommendation: one_of(
            "recommendation",
            &raw.recommendation,
            &[
                ("CONTINUE", Recommendation::Continue),
                ("STOP", Recommendation::Stop),
                ("ASK_USER", Recommendation::AskUser),
            ],
        )?,
        reasoning: raw.reasoning,
        next_steps: raw.next_steps,
        coherence: unit_interval("coherence", raw.coherence)?,
        uncertainty: unit_interval("uncertainty", raw.uncertainty)?,
        milestones_done: raw.milestones_done,
        criteria_met: raw.criteria_met,
    })
}

/// Reflection bookkeeping carried in the loop state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReflectionState {
    /// Current interval (adapts to progress unless the session set it).
    pub interval: u32,
    /// Iteration of the latest reflection (0 if none).
    pub last_at: u64,
    /// Reflections so far.
    pub count: u32,
    /// SLOW answers in a row.
    pub slow_streak: u32,
    /// Failed reflections in a row.
    pub failures: u32,
    /// Times the reflector disagreed with the agent's done-claim.
    pub disagreements: u32,
    /// Latest coherence.
    pub coherence: Option<f64>,
    /// Latest uncertainty.
    pub uncertainty: Option<f64>,
    /// Tokens spent on reflection.
    pub tokens: u64,
    /// Reflections attempted, failed ones included (numbers them).
    #[serde(default)]
    pub attempts: u32,
}

impl Default for ReflectionState {
    fn default() -> Self {
        ReflectionState::new(10)
    }
}

impl ReflectionState {
    /// Bookkeeping before the first reflection.
    pub fn new(interval: u32) -> ReflectionState {
        ReflectionState {
            interval: interval.max(1),
            last_at: 0,
            count: 0,
            slow_streak: 0,
            failures: 0,
            disagreements: 0,
            coherence: None,
            uncertainty: None,
            tokens: 0,
            attempts: 0,
        }
    }
}

/// SLOW answers in a row that ask the user.
pub const SLOW_STREAK_LIMIT: u32 = 3;
/// Failures in a row that pause the session.
pub const FAILURE_LIMIT: u32 = 3;
/// Disagreements with the agent's done-claim that ask the user.
pub const DISAGREEMENT_LIMIT: u32 = 2;

/// Why a reflection runs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The interval elapsed.
    Interval,
    /// The agent claimed the goal is done: the reflector casts the second vote.
    AgentClaimedDone,
}

/// Whether a reflection is due after `iterations` committed steps.
pub fn due(state: &ReflectionState, iterations: u64, agent_claims_done: bool) -> Option<Trigger> {
    if agent_claims_done {
        Some(Trigger::AgentClaimedDone)
    } else if iterations >= state.last_at + u64::from(state.interval.max(1)) {
        Some(Trigger::Interval)
    } else {
        None
    }
}

/// What the loop does after a reflection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Verdict {
    /// The goal is achieved: complete the session.
    Complete,
    /// Pause for a person with this reason.
    Pause {
        /// Why.
        reason: Reason,
    },
    /// Keep going; tell the agent why its done-claim was not accepted.
    Reject {
        /// Feedback for the agent.
        feedback: String,
    },
    /// Keep going with good progress (an ETA is meaningful).
    Continue,
    /// Keep going and keep watching.
    Monitor,
}

/// Applies the decision matrix to a valid assessment. `unmet_criteria`
/// are the success criteria still not reported met (after this assessment):
/// the goal is not achieved while one remains.
pub fn decide(
    prior: &ReflectionState,
    assessment: &Assessment,
    unmet_criteria: &[String],
    trigger: Trigger,
    base_interval: u32,
    iterations: u64,
    tokens: u64,
) -> (Verdict, ReflectionState) {
    let a = assessment;
    let mut next = next_state(prior, a, base_interval, iterations, tokens);
    let criteria_open = !unmet_criteria.is_empty();
    let verdict = if a.goal_achieved == GoalAchieved::Yes && !criteria_open {
        Verdict::Complete
    } else if trigger == Trigger::AgentClaimedDone {
        next.disagreements += 1;
        if next.disagreements >= DISAGREEMENT_LIMIT {
            Verdict::Pause {
                reason: Reason::AskUser,
            }
        } else {
            Verdict::Reject {
                feedback: disagreement(a, unmet_criteria),
            }
        }
    } else if a.goal_achieved == GoalAchieved::Yes {
        Verdict::Reject {
            feedback: format!(
                "The goal is not complete while these success criteria are unmet: {}.",
                unmet_criteria.join("; ")
            ),
        }
    } else if a.loop_detected && a.progress == Progress::Stuck {
        Verdict::Pause {
            reason: Reason::Stuck,
        }
    } else if a.progress == Progress::Good && a.percent_complete < 90.0 {
        Verdict::Continue
    } else if next.slow_streak >= SLOW_STREAK_LIMIT {
        Verdict::Pause {
            reason: Reason::SlowProgress,
        }
    } else if a.recommendation == Recommendation::AskUser {
        Verdict::Pause {
            reason: Reason::AskUser,
        }
    } else {
        Verdict::Monitor
    };
    (verdict, next)
}

/// The state after a valid assessment: the slow streak and the running
/// counts; the interval is the base one until the runner applies
/// `reflection_interval::next_interval`.
fn next_state(
    prior: &ReflectionState,
    a: &Assessment,
    base_interval: u32,
    iterations: u64,
    tokens: u64,
) -> ReflectionState {
    ReflectionState {
        interval: base_interval.max(1),
        last_at: iterations,
        count: prior.count + 1,
        slow_streak: if a.progress == Progress::Slow {
            prior.slow_streak + 1
        } else {
            0
        },
        failures: 0,
        disagreements: prior.disagreements,
        coherence: a.coherence.or(prior.coherence),
        uncertainty: a.uncertainty.or(prior.uncertainty),
        tokens: prior.tokens.saturating_add(tokens),
        attempts: prior.attempts + 1,
    }
}

/// What the agent is told when the reviewer disagrees with its claim of
/// being done: the reasoning, the criteria still open, what is left.
fn disagreement(a: &Assessment, unmet_criteria: &[String]) -> String {
    let mut feedback = format!(
        "A reviewer checked your claim that the goal is done and disagrees: {}",
        a.reasoning
    );
    if !unmet_criteria.is_empty() {
        feedback.push_str(&format!(
            " Success criteria not yet met: {}.",
            unmet_criteria.join("; ")
        ));
    }
    if !a.next_steps.is_empty() {
        feedback.push_str(&format!(" Still to do: {}", a.next_steps.join("; ")));
    }
    feedback
}

/// What a failed reflection (model down, invalid answer) leads to: fall back
/// to the fixed limits, and pause after too many failures in a row rather than spin.
pub fn on_failure(
    prior: &ReflectionState,
    trigger: Trigger,
    base_interval: u32,
    iterations: u64,
    tokens: u64,
) -> (Verdict, ReflectionState) {
    let next = ReflectionState {
        interval: base_interval.max(1),
        last_at: iterations,
        failures: prior.failures + 1,
        tokens: prior.tokens.saturating_add(tokens),
        attempts: prior.attempts + 1,
        ..*prior
    };
    let verdict = if next.failures >= FAILURE_LIMIT {
        Verdict::Pause {
            reason: Reason::ReflectionFailed,
        }
    } else if trigger == Trigger::AgentClaimedDone {
        // Without a working reviewer the agent's own vote decides, as in fixed mode.
        Verdict::Complete
    } else {
        Verdict::Monitor
    };
    (verdict, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(goal: &str, progress: &str, percent: f64, looped: bool, rec: &str) -> String {
        format!(
            r#"{{"goalAchieved":"{goal}","progress":"{progress}","percentComplete":{percent},"loopDetected":{looped},"recommendation":"{rec}","reasoning":"because","nextSteps":["a","b"]}}"#
        )
    }

    fn assess(goal: &str, progress: &str, percent: f64, looped: bool, rec: &str) -> Assessment {
        parse_assessment(&answer(goal, progress, percent, looped, rec)).unwrap()
    }

    fn run(prior: &ReflectionState, a: &Assessment) -> (Verdict, ReflectionState) {
        decide(prior, a, &[], Trigger::Interval, 10, 30, 100)
    }

    #[test]
    fn parses_a_plain_answer() {
        let a = assess("NO", "GOOD", 40.0, false, "CONTINUE");
        assert_eq!(a.goal_achieved, GoalAchieved::No);
        assert_eq!(a.progress, Progress::Good);
        assert_eq!(a.percent_complete, 40.0);
        assert_eq!(a.next_steps, vec!["a", "b"]);
        assert_eq!(a.coherence, None);
    }

    #[test]
    fn tolerates_a_fenced_block_and_prose() {
        let text = format!(
            "Here is my assessment:\n```json\n{}\n```\nThanks.",
            answer("PARTIAL", "SLOW", 50.0, false, "CONTINUE")
        );
        assert_eq!(
            parse_assessment(&text).unwrap().goal_achieved,
            GoalAchieved::Partial
        );
    }

    #[test]
    fn enum_case_is_tolerated_but_wrong_values_are_not() {
        assert!(parse_assessment(&answer("yes", "good", 1.0, false, "ask_user")).is_ok());
        let err = parse_assessment(&answer("MAYBE", "GOOD", 1.0, false, "CONTINUE")).unwrap_err();
        assert!(err.contains("goalAchieved"), "{err}");
        let err = parse_assessment(&answer("NO", "FAST", 1.0, false, "CONTINUE")).unwrap_err();
        assert!(err.contains("progress"), "{err}");
        let err = parse_assessment(&answer("NO", "GOOD", 1.0, false, "PANIC")).unwrap_err();
        assert!(err.contains("recommendation"), "{err}");
    }

    #[test]
    fn out_of_range_numbers_and_missing_fields_are_rejected() {
        assert!(
            parse_assessment(&answer("NO", "GOOD", 101.0, false, "CONTINUE"))
                .unwrap_err()
                .contains("percentComplete")
        );
        assert!(parse_assessment(&answer("NO", "GOOD", -1.0, false, "CONTINUE")).is_err());
        let bad_coherence = r#"{"goalAchieved":"NO","progress":"GOOD","percentComplete":5,"loopDetected":false,"recommendation":"CONTINUE","reasoning":"r","coherence":1.5}"#;
        assert!(
            parse_assessment(bad_coherence)
                .unwrap_err()
                .contains("coherence")
        );
        let missing = r#"{"goalAchieved":"NO","progress":"GOOD"}"#;
        assert!(parse_assessment(missing).is_err());
        assert!(parse_assessment("no json here").is_err());
        assert!(parse_assessment("").is_err());
        assert!(parse_assessment("} {").is_err());
    }

    #[test]
    fn yes_completes_whatever_else_is_said() {
        let a = assess("YES", "STUCK", 100.0, true, "ASK_USER");
        assert_eq!(run(&ReflectionState::new(10), &a).0, Verdict::Complete);
    }

    #[test]
    fn loop_and_stuck_pause_as_stuck() {
        let a = assess("NO", "STUCK", 30.0, true, "CONTINUE");
        let (v, _) = run(&ReflectionState::new(10), &a);
        assert_eq!(
            v,
            Verdict::Pause {
                reason: Reason::Stuck
            }
        );
        // Stuck without a loop does not pause (the interval rule shortens
        // the wait for the next look).
        let a = assess("NO", "STUCK", 30.0, false, "CONTINUE");
        let (v, s) = run(&ReflectionState::new(10), &a);
        assert_eq!(v, Verdict::Monitor);
        assert_eq!(s.interval, 10);
    }

    #[test]
    fn good_progress_continues() {
        let a = assess("NO", "GOOD", 40.0, false, "CONTINUE");
        let (v, s) = run(&ReflectionState::new(10), &a);
        assert_eq!(v, Verdict::Continue);
        assert_eq!(s.interval, 10);
        // At 90 % and above, good progress falls through to monitoring.
        let a = assess("PARTIAL", "GOOD", 90.0, false, "CONTINUE");
        assert_eq!(run(&ReflectionState::new(10), &a).0, Verdict::Monitor);
    }

    #[test]
    fn third_slow_reflection_in_a_row_asks_the_user() {
        let slow = assess("NO", "SLOW", 20.0, false, "CONTINUE");
        let (v1, s1) = run(&ReflectionState::new(10), &slow);
        assert_eq!(v1, Verdict::Monitor);
        let (v2, s2) = run(&s1, &slow);
        assert_eq!(v2, Verdict::Monitor);
        let (v3, s3) = run(&s2, &slow);
        assert_eq!(
            v3,
            Verdict::Pause {
                reason: Reason::SlowProgress
            }
        );
        assert_eq!(s3.slow_streak, 3);
        assert_eq!(s3.interval, 10);
        // A good answer in between resets the streak.
        let good = assess("NO", "GOOD", 30.0, false, "CONTINUE");
        let (_, reset) = run(&s2, &good);
        assert_eq!(reset.slow_streak, 0);
    }

    #[test]
    fn ask_user_recommendation_pauses() {
        let a = assess("NO", "SLOW", 20.0, false, "ASK_USER");
        assert_eq!(
            run(&ReflectionState::new(10), &a).0,
            Verdict::Pause {
                reason: Reason::AskUser
            }
        );
    }

    #[test]
    fn loop_stuck_outranks_slow_streak_and_ask_user() {
        let mut prior = ReflectionState::new(10);
        prior.slow_streak = 5;
        let a = assess("NO", "STUCK", 10.0, true, "ASK_USER");
        assert_eq!(
            run(&prior, &a).0,
            Verdict::Pause {
                reason: Reason::Stuck
            }
        );
    }

    #[test]
    fn agent_done_claim_needs_the_second_vote() {
        let no = assess("NO", "GOOD", 60.0, false, "CONTINUE");
        let s0 = ReflectionState::new(10);
        let (v1, s1) = decide(&s0, &no, &[], Trigger::AgentClaimedDone, 10, 5, 10);
        match v1 {
            Verdict::Reject { feedback } => {
                assert!(feedback.contains("because"));
                assert!(feedback.contains("a; b"));
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        assert_eq!(s1.disagreements, 1);
        let (v2, s2) = decide(&s1, &no, &[], Trigger::AgentClaimedDone, 10, 8, 10);
        assert_eq!(
            v2,
            Verdict::Pause {
                reason: Reason::AskUser
            }
        );
        assert_eq!(s2.disagreements, 2);
        let yes = assess("YES", "GOOD", 100.0, false, "STOP");
        assert_eq!(
            decide(&s1, &yes, &[], Trigger::AgentClaimedDone, 10, 9, 10).0,
            Verdict::Complete
        );
    }

    #[test]
    fn unmet_criteria_refuse_completion() {
        let yes = assess("YES", "GOOD", 100.0, false, "STOP");
        let open = vec!["tests pass".to_string()];
        let s0 = ReflectionState::new(10);
        match decide(&s0, &yes, &open, Trigger::Interval, 10, 5, 0).0 {
            Verdict::Reject { feedback } => assert!(feedback.contains("tests pass")),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let (v, s1) = decide(&s0, &yes, &open, Trigger::AgentClaimedDone, 10, 5, 0);
        match v {
            Verdict::Reject { feedback } => assert!(feedback.contains("not yet met: tests pass")),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(s1.disagreements, 1);
        assert_eq!(
            decide(&s0, &yes, &[], Trigger::Interval, 10, 5, 0).0,
            Verdict::Complete
        );
    }

    #[test]
    fn reported_criteria_and_milestones_are_parsed() {
        let text = r#"{"goalAchieved":"NO","progress":"GOOD","percentComplete":50,"loopDetected":false,"recommendation":"CONTINUE","reasoning":"r","criteriaMet":["1"],"milestonesDone":["draft written"]}"#;
        let a = parse_assessment(text).unwrap();
        assert_eq!(a.criteria_met, vec!["1"]);
        assert_eq!(a.milestones_done, vec!["draft written"]);
    }

    #[test]
    fn state_tracks_counts_tokens_and_signals() {
        let mut a = assess("NO", "GOOD", 40.0, false, "CONTINUE");
        a.coherence = Some(0.7);
        let (_, s) = decide(
            &ReflectionState::new(10),
            &a,
            &[],
            Trigger::Interval,
            10,
            12,
            250,
        );
        assert_eq!(s.count, 1);
        assert_eq!(s.last_at, 12);
        assert_eq!(s.tokens, 250);
        assert_eq!(s.coherence, Some(0.7));
        assert_eq!(s.uncertainty, None);
    }

    #[test]
    fn failures_fall_back_then_pause() {
        let s0 = ReflectionState::new(10);
        let (v1, s1) = on_failure(&s0, Trigger::Interval, 10, 10, 5);
        assert_eq!(v1, Verdict::Monitor);
        let (v2, s2) = on_failure(&s1, Trigger::Interval, 10, 20, 5);
        assert_eq!(v2, Verdict::Monitor);
        let (v3, s3) = on_failure(&s2, Trigger::Interval, 10, 30, 5);
        assert_eq!(
            v3,
            Verdict::Pause {
                reason: Reason::ReflectionFailed
            }
        );
        assert_eq!(s3.failures, 3);
        assert_eq!(s3.tokens, 15);
        // A success resets the count.
        let good = assess("NO", "GOOD", 10.0, false, "CONTINUE");
        assert_eq!(run(&s2, &good).1.failures, 0);
        // The agent's claim stands when the reviewer cannot answer.
        assert_eq!(
            on_failure(&s0, Trigger::AgentClaimedDone, 10, 3, 0).0,
            Verdict::Complete
        );
    }

    #[test]
    fn due_by_interval_or_claim() {
        let mut s = ReflectionState::new(10);
        assert_eq!(due(&s, 9, false), None);
        assert_eq!(due(&s, 10, false), Some(Trigger::Interval));
        assert_eq!(due(&s, 3, true), Some(Trigger::AgentClaimedDone));
        s.last_at = 10;
        s.interval = 5;
        assert_eq!(due(&s, 14, false), None);
        assert_eq!(due(&s, 15, false), Some(Trigger::Interval));
    }
}
