//! What a tenant's ended sessions teach about its thresholds: how outcomes
//! fall against each limit's value, which policy pauses a person overruled
//! (resumed, and the session then completed: a premature pause), a
//! suggested iteration limit with exactly what it would have changed, and
//! how well the reflector's `percentComplete` foretold the end.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use uuid::Uuid;

use super::guardrails::{Limits, RANGES};
use super::lifecycle::{Reason, Status};
use super::replay::Totals;

/// One ended session, as the report reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHistory {
    /// The session.
    pub id: Uuid,
    /// Its status now.
    pub status: Status,
    /// Why it ended (or waits), when recorded.
    pub reason: Option<Reason>,
    /// Iterations it ran.
    pub iterations: u64,
    /// The limits in force at its end.
    pub limits: Limits,
    /// Its status changes, oldest first.
    pub transitions: Vec<Transition>,
    /// Its reflections that said how far along it was, oldest first.
    pub reflections: Vec<ReflectionPoint>,
}

/// A status change of a session.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The status it moved to.
    pub to: Status,
    /// The reason recorded with it (ends and pauses).
    pub reason: Option<Reason>,
}

/// A reflection's estimate of how far along a session was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReflectionPoint {
    /// The iteration it reflected after.
    pub after_iteration: u64,
    /// The reflector's `percentComplete`, 0 to 100.
    pub percent_complete: f64,
}

/// How many sessions ended one way.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutcomeCount {
    /// The status they ended in.
    pub status: Status,
    /// The reason they ended for (null when none was recorded).
    pub reason: Option<Reason>,
    /// How many.
    pub sessions: u64,
}

/// What became of the pauses a policy made for one reason.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PauseOutcome {
    /// The pausing rule.
    pub reason: Reason,
    /// Pauses it made.
    pub pauses: u64,
    /// Of them, resumed by a person.
    pub resumed: u64,
    /// Of those, in sessions that then completed: the rule paused a
    /// session that was on its way (a premature pause).
    pub premature: u64,
}

/// Sessions that ran under one value of a limit.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ValueOutcome {
    /// The limit's value.
    pub value: u64,
    /// Sessions that ran under it.
    pub sessions: u64,
    /// Of them, completed.
    pub completed: u64,
    /// Of them, ended by this limit.
    pub ended_by_it: u64,
}

/// How outcomes fall against one limit's values.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LimitOutcomes {
    /// The limit (`limits.<name>`).
    pub name: String,
    /// The reason a session ended by it gets.
    pub reason: Reason,
    /// Its values, the most used first (at most [`MAX_VALUES`]).
    pub values: Vec<ValueOutcome>,
}

/// An iteration limit for every session, and exactly what it would have
/// changed over the sessions read: a lower limit ends a session at the
/// step it reaches it, and nothing before that step changes.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct IterationSuggestion {
    /// The suggested `limits.max_iterations`.
    pub value: u64,
    /// The longest completed session's iterations it leaves room for.
    pub longest_completion: u64,
    /// Sessions that ran past it without completing: they would have
    /// ended earlier.
    pub sessions_ending_earlier: u64,
    /// Iterations those sessions would not have run.
    pub iterations_saved: u64,
    /// Completed sessions it would have cut short (0 by construction).
    pub completions_cut_short: u64,
    /// Sessions that hit a lower limit of their own (they might have gone
    /// on under this one; what they would have done is not recorded).
    pub sessions_ending_later: u64,
    /// The policy replay of the same sessions with this limit (every other
    /// rule as each ran): the totals to weigh it by. Null when the replay
    /// could not run.
    pub replay: Option<Totals>,
}

/// One band of the reflector's `percentComplete`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CalibrationRow {
    /// The band's lower bound (inclusive), percent.
    pub from_percent: u32,
    /// Its upper bound (exclusive; 100 is in the last band), percent.
    pub to_percent: u32,
    /// Reflections whose estimate fell in the band.
    pub reflections: u64,
    /// Of them, in sessions that completed.
    pub in_completed_sessions: u64,
    /// Of them, the session completed within 5 iterations.
    pub completed_within_5: u64,
    /// ... within 10 iterations.
    pub completed_within_10: u64,
    /// ... within 20 iterations.
    pub completed_within_20: u64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ThresholdReport {
    /// Ended sessions read (the most recent, at most the report's cap).
    pub sessions: u64,
    /// How they ended, the most frequent first.
    pub outcomes: Vec<OutcomeCount>,
    /// What became of each policy's pauses.
    pub pauses: Vec<PauseOutcome>,
    /// How outcomes fall against each limit's value.
    pub limits: Vec<LimitOutcomes>,
    /// A suggested iteration limit; null with no completed session.
    pub max_iterations_suggestion: Option<IterationSuggestion>,
    /// How the reflector's estimates foretold the end, in bands of 10 %.
    pub calibration: Vec<CalibrationRow>,
    /// The thresholds applied to the tenant, in force for its new sessions
    /// (`POST /api/insights/thresholds/apply`).
    pub applied: AppliedThresholds,
}

/// The thresholds a tenant applied: what its sessions created without
/// them get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppliedThresholds {
    /// The tenant's own `limits.max_iterations` for sessions created
    /// without one (in either mode); null: the server's default.
    pub max_iterations: Option<u64>,
}

/// How the sessions a justification replayed were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SelectionRule {
    /// The tenant's most recent settled (ended or paused) sessions, newest
    /// first: those the threshold report's suggestion is replayed over.
    NewestSettled,
}

/// Which sessions a justification replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplaySelection {
    /// How they were chosen.
    pub rule: SelectionRule,
    /// The most it takes.
    pub max_sessions: u64,
    /// Sessions it selected.
    pub selected: u64,
}

/// The replay that justified a change of a threshold, as it is logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Justification {
    /// The `max_iterations` the sessions were replayed under: the value
    /// applied, or for a return to the server's default, that default (in
    /// the server's default mode).
    pub max_iterations: u64,
    /// Which sessions.
    pub selection: ReplaySelection,
    /// Of those selected, sessions not replayed (deleted meanwhile, or
    /// left by the replay's deadline).
    pub not_replayed: u64,
    /// What the replay adds up to.
    pub totals: Totals,
}

impl Justification {
    /// The justification of a replay under `max_iterations` of the
    /// `selected` newest settled sessions (at most `max_sessions`).
    pub fn newest_settled(
        max_iterations: u64,
        (max_sessions, selected): (u64, u64),
        totals: Totals,
    ) -> Justification {
        Justification {
            max_iterations,
            selection: ReplaySelection {
                rule: SelectionRule::NewestSettled,
                max_sessions,
                selected,
            },
            not_replayed: selected.saturating_sub(totals.sessions),
            totals,
        }
    }
}

/// Longest note an applied change may carry, in characters.
pub const MAX_NOTE_CHARS: usize = 500;

/// A change's note as it is logged: refused over [`MAX_NOTE_CHARS`] (as
/// given, the way the API document counts), then trimmed; `None` when
/// nothing is left.
pub fn change_note(note: Option<&str>) -> Result<Option<String>, String> {
    let Some(note) = note else {
        return Ok(None);
    };
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(format!("note: at most {MAX_NOTE_CHARS} characters"));
    }
    let note = note.trim();
    Ok((!note.is_empty()).then(|| note.to_string()))
}

/// Values listed per limit.
pub const MAX_VALUES: usize = 20;

/// Headroom the suggestion leaves above the longest completion, percent.
const HEADROOM_PERCENT: u64 = 20;

/// The report over `histories`.
pub fn report(histories: &[SessionHistory]) -> ThresholdReport {
    ThresholdReport {
        sessions: histories.len() as u64,
        outcomes: outcomes(histories),
        pauses: pauses(histories),
        limits: limit_outcomes(histories),
        max_iterations_suggestion: suggest_max_iterations(histories),
        calibration: calibration(histories),
        applied: AppliedThresholds::default(),
    }
}

fn outcomes(histories: &[SessionHistory]) -> Vec<OutcomeCount> {
    let mut counts: BTreeMap<(&str, Option<&str>), OutcomeCount> = BTreeMap::new();
    for h in histories {
        let key = (h.status.as_str(), h.reason.map(Reason::as_str));
        counts
            .entry(key)
            .or_insert(OutcomeCount {
                status: h.status,
                reason: h.reason,
                sessions: 0,
            })
            .sessions += 1;
    }
    let mut out: Vec<OutcomeCount> = counts.into_values().collect();
    // Stable: ties keep the key order.
    out.sort_by_key(|o| std::cmp::Reverse(o.sessions));
    out
}

/// Whether `reason` is a policy's pause a person may overrule by resuming.
fn is_policy_pause(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::Stuck
            | Reason::SlowProgress
            | Reason::ReworkLoop
            | Reason::Uncertainty
            | Reason::ReflectionFailed
            | Reason::BudgetProjectedOverrun
            | Reason::ReviewRequired
    )
}

fn pauses(histories: &[SessionHistory]) -> Vec<PauseOutcome> {
    let mut by_reason: BTreeMap<&str, PauseOutcome> = BTreeMap::new();
    for h in histories {
        let completed = h.status == Status::Completed;
        for (i, t) in h.transitions.iter().enumerate() {
            let Some(reason) = t
                .reason
                .filter(|r| t.to == Status::Paused && is_policy_pause(*r))
            else {
                continue;
            };
            let resumed = h.transitions[i + 1..]
                .first()
                .is_some_and(|next| matches!(next.to, Status::Running | Status::Queued));
            let entry = by_reason.entry(reason.as_str()).or_insert(PauseOutcome {
                reason,
                pauses: 0,
                resumed: 0,
                premature: 0,
            });
            entry.pauses += 1;
            entry.resumed += u64::from(resumed);
            entry.premature += u64::from(resumed && completed);
        }
    }
    by_reason.into_values().collect()
}

/// A limit the report reads: its name, the reason a session it ends gets,
/// which sessions it counts for, and its value.
type LimitRead = (
    &'static str,
    Reason,
    fn(&SessionHistory) -> bool,
    fn(&Limits) -> u64,
);

/// The limits the report reads.
fn limits_read() -> [LimitRead; 4] {
    [
        (
            "max_iterations",
            Reason::MaxIterations,
            |_| true,
            |l| l.max_iterations,
        ),
        // A token budget and a money budget end a session with the same
        // reason; money is not a value of this limit.
        (
            "max_tokens",
            Reason::CostLimit,
            |h| h.limits.max_cost_usd.is_none(),
            |l| l.max_tokens,
        ),
        (
            "max_wall_time_ms",
            Reason::Timeout,
            |_| true,
            |l| l.max_wall_time_ms,
        ),
        (
            "max_consecutive_errors",
            Reason::ErrorThreshold,
            |_| true,
            |l| u64::from(l.max_consecutive_errors),
        ),
    ]
}

fn limit_outcomes(histories: &[SessionHistory]) -> Vec<LimitOutcomes> {
    limits_read()
        .into_iter()
        .map(|(name, reason, counts, value_of)| {
            let mut values: BTreeMap<u64, ValueOutcome> = BTreeMap::new();
            for h in histories.iter().filter(|h| counts(h)) {
                let value = value_of(&h.limits);
                let row = values.entry(value).or_insert(ValueOutcome {
                    value,
                    sessions: 0,
                    completed: 0,
                    ended_by_it: 0,
                });
                row.sessions += 1;
                row.completed += u64::from(h.status == Status::Completed);
                row.ended_by_it += u64::from(h.reason == Some(reason));
            }
            let mut values: Vec<ValueOutcome> = values.into_values().collect();
            values.sort_by_key(|v| std::cmp::Reverse(v.sessions));
            values.truncate(MAX_VALUES);
            LimitOutcomes {
                name: name.to_string(),
                reason,
                values,
            }
        })
        .collect()
}

/// The smallest limit that cuts no completion short, with headroom; what
/// it would have changed, exactly, over the recorded sessions.
fn suggest_max_iterations(histories: &[SessionHistory]) -> Option<IterationSuggestion> {
    let longest = histories
        .iter()
        .filter(|h| h.status == Status::Completed)
        .map(|h| h.iterations)
        .max()?;
    let headroom = longest
        .saturating_mul(HEADROOM_PERCENT)
        .div_ceil(100)
        .max(1);
    let value = longest.saturating_add(headroom).min(iteration_cap());
    let mut suggestion = IterationSuggestion {
        value,
        longest_completion: longest,
        sessions_ending_earlier: 0,
        iterations_saved: 0,
        completions_cut_short: 0,
        sessions_ending_later: 0,
        replay: None,
    };
    for h in histories {
        if h.iterations > value {
            if h.status == Status::Completed {
                suggestion.completions_cut_short += 1;
            } else {
                suggestion.sessions_ending_earlier += 1;
                suggestion.iterations_saved += h.iterations - value;
            }
        } else if h.reason == Some(Reason::MaxIterations) && h.limits.max_iterations < value {
            suggestion.sessions_ending_later += 1;
        }
    }
    Some(suggestion)
}

/// The most `limits.max_iterations` may be.
fn iteration_cap() -> u64 {
    RANGES
        .iter()
        .find(|(name, _, _)| *name == "max_iterations")
        .map_or(u64::MAX, |(_, _, max)| *max)
}

/// Bands of the reflector's estimate.
const BANDS: u32 = 10;

fn calibration(histories: &[SessionHistory]) -> Vec<CalibrationRow> {
    let mut rows: Vec<CalibrationRow> = (0..BANDS)
        .map(|b| CalibrationRow {
            from_percent: b * 100 / BANDS,
            to_percent: (b + 1) * 100 / BANDS,
            reflections: 0,
            in_completed_sessions: 0,
            completed_within_5: 0,
            completed_within_10: 0,
            completed_within_20: 0,
        })
        .collect();
    for h in histories {
        let completed = h.status == Status::Completed;
        for r in &h.reflections {
            let percent = r.percent_complete.clamp(0.0, 100.0);
            let band = ((percent / 100.0 * f64::from(BANDS)) as usize).min(BANDS as usize - 1);
            let row = &mut rows[band];
            row.reflections += 1;
            if !completed {
                continue;
            }
            let left = h.iterations.saturating_sub(r.after_iteration);
            row.in_completed_sessions += 1;
            row.completed_within_5 += u64::from(left <= 5);
            row.completed_within_10 += u64::from(left <= 10);
            row.completed_within_20 += u64::from(left <= 20);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_iterations: u64) -> Limits {
        Limits {
            max_iterations,
            ..crate::policy::guardrails::tests::roomy()
        }
    }

    fn ended(
        status: Status,
        reason: Reason,
        iterations: u64,
        max_iterations: u64,
    ) -> SessionHistory {
        SessionHistory {
            id: Uuid::nil(),
            status,
            reason: Some(reason),
            iterations,
            limits: limits(max_iterations),
            transitions: vec![
                Transition {
                    to: Status::Running,
                    reason: None,
                },
                Transition {
                    to: status,
                    reason: Some(reason),
                },
            ],
            reflections: Vec::new(),
        }
    }

    fn completed(iterations: u64) -> SessionHistory {
        ended(Status::Completed, Reason::GoalAchieved, iterations, 100)
    }

    #[test]
    fn nothing_read_gives_an_empty_report_and_no_suggestion() {
        let r = report(&[]);
        assert_eq!(r.sessions, 0);
        assert!(r.outcomes.is_empty() && r.pauses.is_empty());
        assert!(r.max_iterations_suggestion.is_none());
        assert_eq!(r.calibration.len(), 10);
        assert!(r.calibration.iter().all(|c| c.reflections == 0));
        assert!(r.limits.iter().all(|l| l.values.is_empty()));
    }

    #[test]
    fn outcomes_are_counted_by_status_and_reason_most_frequent_first() {
        let r = report(&[
            completed(3),
            ended(Status::Stopped, Reason::MaxIterations, 10, 10),
            completed(4),
        ]);
        assert_eq!(
            r.outcomes,
            vec![
                OutcomeCount {
                    status: Status::Completed,
                    reason: Some(Reason::GoalAchieved),
                    sessions: 2
                },
                OutcomeCount {
                    status: Status::Stopped,
                    reason: Some(Reason::MaxIterations),
                    sessions: 1
                },
            ]
        );
    }

    #[test]
    fn a_policy_pause_a_person_resumed_before_a_completion_is_premature() {
        let mut overruled = completed(12);
        overruled.transitions = vec![
            Transition {
                to: Status::Running,
                reason: None,
            },
            Transition {
                to: Status::Paused,
                reason: Some(Reason::Stuck),
            },
            Transition {
                to: Status::Running,
                reason: None,
            },
            Transition {
                to: Status::Completed,
                reason: Some(Reason::GoalAchieved),
            },
        ];
        // Resumed, but then stopped: the pause was not premature.
        let mut resumed_then_stopped = ended(Status::Stopped, Reason::MaxIterations, 20, 20);
        resumed_then_stopped.transitions = vec![
            Transition {
                to: Status::Paused,
                reason: Some(Reason::Stuck),
            },
            Transition {
                to: Status::Queued,
                reason: None,
            },
            Transition {
                to: Status::Stopped,
                reason: Some(Reason::MaxIterations),
            },
        ];
        // Never resumed.
        let mut left_paused = ended(Status::Paused, Reason::Stuck, 7, 100);
        left_paused.transitions = vec![Transition {
            to: Status::Paused,
            reason: Some(Reason::Stuck),
        }];
        // A user's pause and a wait for children are nobody's policy.
        let mut user = completed(5);
        user.transitions = vec![
            Transition {
                to: Status::Paused,
                reason: Some(Reason::UserPause),
            },
            Transition {
                to: Status::Running,
                reason: None,
            },
            Transition {
                to: Status::Paused,
                reason: Some(Reason::WaitingForChildren),
            },
            Transition {
                to: Status::Running,
                reason: None,
            },
        ];
        let r = report(&[overruled, resumed_then_stopped, left_paused, user]);
        assert_eq!(
            r.pauses,
            vec![PauseOutcome {
                reason: Reason::Stuck,
                pauses: 3,
                resumed: 2,
                premature: 1
            }]
        );
    }

    #[test]
    fn outcomes_fall_against_each_limits_value() {
        let r = report(&[
            ended(Status::Stopped, Reason::MaxIterations, 10, 10),
            ended(Status::Stopped, Reason::MaxIterations, 10, 10),
            ended(Status::Completed, Reason::GoalAchieved, 8, 10),
            ended(Status::Completed, Reason::GoalAchieved, 30, 50),
        ]);
        let iterations = &r.limits[0];
        assert_eq!(iterations.name, "max_iterations");
        assert_eq!(
            iterations.values,
            vec![
                ValueOutcome {
                    value: 10,
                    sessions: 3,
                    completed: 1,
                    ended_by_it: 2
                },
                ValueOutcome {
                    value: 50,
                    sessions: 1,
                    completed: 1,
                    ended_by_it: 0
                },
            ]
        );
        let tokens = &r.limits[1];
        assert_eq!(tokens.name, "max_tokens");
        assert_eq!(tokens.values.len(), 1, "every session had the default");
        assert_eq!(tokens.values[0].sessions, 4);
    }

    #[test]
    fn a_money_budget_ends_no_session_by_its_token_limit() {
        let mut money = ended(Status::Stopped, Reason::CostLimit, 4, 100);
        money.limits.max_cost_usd = Some(rust_decimal::Decimal::ONE);
        let tokens = ended(Status::Stopped, Reason::CostLimit, 4, 100);
        let r = report(&[money, tokens]);
        assert_eq!(r.limits[1].values[0].sessions, 1);
        assert_eq!(r.limits[1].values[0].ended_by_it, 1);
    }

    #[test]
    fn the_suggestion_leaves_room_for_every_completion_and_counts_exactly_what_it_changes() {
        let histories = [
            completed(10),
            completed(25),
            // Ran 40 of its 100 without completing: would end at 30.
            ended(Status::Stopped, Reason::ErrorThreshold, 40, 100),
            // Ran 29: not touched.
            ended(Status::Stopped, Reason::Timeout, 29, 100),
            // Hit its own limit of 20: might have gone on to 30.
            ended(Status::Stopped, Reason::MaxIterations, 20, 20),
            // Hit its own limit of 60, above the suggestion: ends earlier.
            ended(Status::Stopped, Reason::MaxIterations, 60, 60),
        ];
        let s = report(&histories)
            .max_iterations_suggestion
            .expect("a suggestion");
        assert_eq!(
            s,
            IterationSuggestion {
                // 25 + 20 % headroom, rounded up.
                value: 30,
                longest_completion: 25,
                sessions_ending_earlier: 2,
                iterations_saved: 10 + 30,
                completions_cut_short: 0,
                sessions_ending_later: 1,
                replay: None,
            }
        );
    }

    #[test]
    fn the_suggestion_has_headroom_even_for_tiny_sessions() {
        let s = report(&[completed(1)])
            .max_iterations_suggestion
            .expect("one");
        assert_eq!(s.value, 2);
        let s = report(&[completed(900_000)])
            .max_iterations_suggestion
            .expect("one");
        assert_eq!(s.value, 1_000_000, "never past what a limit may be");
    }

    #[test]
    fn calibration_bands_the_estimates_and_counts_how_soon_sessions_completed() {
        let mut done = completed(30);
        done.reflections = vec![
            ReflectionPoint {
                after_iteration: 10,
                percent_complete: 35.0,
            },
            ReflectionPoint {
                after_iteration: 22,
                percent_complete: 90.0,
            },
            ReflectionPoint {
                after_iteration: 26,
                percent_complete: 100.0,
            },
            ReflectionPoint {
                after_iteration: 30,
                percent_complete: 150.0,
            },
        ];
        let mut stopped = ended(Status::Stopped, Reason::MaxIterations, 40, 40);
        stopped.reflections = vec![ReflectionPoint {
            after_iteration: 35,
            percent_complete: 95.0,
        }];
        let r = report(&[done, stopped]);
        let band = |from: u32| {
            r.calibration
                .iter()
                .find(|c| c.from_percent == from)
                .expect("a band")
        };
        assert_eq!(band(30).reflections, 1);
        assert_eq!(band(30).in_completed_sessions, 1);
        assert_eq!(band(30).completed_within_20, 1, "20 steps left");
        assert_eq!(band(30).completed_within_10, 0);
        // 90, 100 (in the last band), 150 (clamped) and the stopped one's 95.
        let top = band(90);
        assert_eq!(top.to_percent, 100);
        assert_eq!(top.reflections, 4);
        assert_eq!(top.in_completed_sessions, 3);
        assert_eq!(top.completed_within_5, 2, "4 and 0 steps left");
        assert_eq!(top.completed_within_10, 3, "8 steps left");
    }

    #[test]
    fn a_note_is_bounded_as_given_then_trimmed() {
        assert_eq!(change_note(None), Ok(None));
        assert_eq!(change_note(Some("   \n ")), Ok(None));
        assert_eq!(
            change_note(Some("  from the March replay \n")),
            Ok(Some("from the March replay".into()))
        );
        let longest = "é".repeat(MAX_NOTE_CHARS);
        assert_eq!(change_note(Some(&longest)), Ok(Some(longest.clone())));
        assert!(change_note(Some(&format!("{longest}x"))).is_err());
        // Counted as given: padding that trimming would remove still counts.
        assert!(change_note(Some(&format!(" {longest}"))).is_err());
    }

    #[test]
    fn a_justification_counts_the_selected_sessions_not_replayed() {
        let totals = Totals {
            sessions: 7,
            earlier: 2,
            ..Totals::default()
        };
        let j = Justification::newest_settled(12, (1_000, 9), totals);
        assert_eq!(j.max_iterations, 12);
        assert_eq!(j.selection.rule, SelectionRule::NewestSettled);
        assert_eq!((j.selection.max_sessions, j.selection.selected), (1_000, 9));
        assert_eq!(j.not_replayed, 2);
        assert_eq!(j.totals, totals);
        // Never below zero, whatever the totals say.
        let over = Totals {
            sessions: 10,
            ..Totals::default()
        };
        assert_eq!(
            Justification::newest_settled(1, (5, 3), over).not_replayed,
            0
        );
        // Logged as JSON and read back the same.
        let logged = serde_json::to_value(&j).expect("json");
        assert_eq!(logged["selection"]["rule"], "newest_settled");
        assert_eq!(
            serde_json::from_value::<Justification>(logged).ok(),
            Some(j)
        );
    }

    #[test]
    fn the_report_alone_applies_nothing() {
        assert_eq!(
            report(&[completed(3)]).applied,
            AppliedThresholds::default()
        );
    }
}
