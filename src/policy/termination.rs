//! The termination record: for every way a session stops or waits, the
//! status, a human summary and concrete next steps, so an operator never has
//! to read logs to learn why a session ended and what to do about it.

use serde::{Deserialize, Serialize};

use super::guardrails::{Limits, Usage};
use super::history::{Outcome, StepRecord};
use super::lifecycle::{Reason, Status};

/// Facts about the session at the moment it stops.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Consumption so far.
    pub usage: &'a Usage,
    /// Limits in force.
    pub limits: &'a Limits,
    /// Extra detail from the deciding policy (sentinel reason, stuck pattern...).
    pub detail: Option<&'a str>,
}

/// What the session status shows once the loop stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Termination {
    /// The status the session moves to.
    pub status: Status,
    /// Machine-readable reason.
    pub reason: Reason,
    /// One or two sentences for a person.
    pub summary: String,
    /// What the person can do next.
    pub next_steps: Vec<String>,
}

fn with_detail(base: String, detail: Option<&str>) -> String {
    match detail.map(str::trim).filter(|d| !d.is_empty()) {
        Some(d) => format!("{base}: {d}"),
        None => base,
    }
}

/// Builds the termination record for `reason`.
pub fn record(reason: Reason, facts: Facts<'_>) -> Termination {
    let cx = Context::new(facts);
    use Reason::*;
    let (summary, next_steps) = match reason {
        GoalAchieved | AgentBlocked | AskUser | ExecutorExhausted => agent_ended(reason, &cx),
        Stuck
        | SlowProgress
        | ReworkLoop
        | Uncertainty
        | CoherenceLow
        | ReflectionFailed
        | BudgetProjectedOverrun => policy_stepped_in(reason, &cx),
        Timeout | MaxIterations | CostLimit | ErrorThreshold | StepLimit | BudgetExhausted
        | CycleLimit => limit_reached(reason, &cx),
        ReviewRequired | NoWorker | ApprovalRequired | WaitingForChildren | ConfirmationExpired => {
            waiting(reason, &cx)
        }
        UserStop | UserPause | ParentEnded | InternalError | SecretUnreadable => {
            interrupted(reason, &cx)
        }
    };
    Termination {
        status: reason.status(),
        reason,
        summary,
        next_steps,
    }
}

/// What every record's text draws on: the facts, how far the session got
/// and how to resume it.
struct Context<'a> {
    facts: Facts<'a>,
    ran: String,
    resume: String,
}

impl<'a> Context<'a> {
    fn new(facts: Facts<'a>) -> Context<'a> {
        let u = facts.usage;
        let ran = format!(
            "after {} iteration{}, {} tokens, {:.1} s",
            u.iterations,
            if u.iterations == 1 { "" } else { "s" },
            u.tokens,
            u.elapsed_ms as f64 / 1000.0
        );
        let resume = "Resume with POST /api/autonomous/{id}/resume".to_string();
        Context { facts, ran, resume }
    }
}

/// A record's summary and next steps.
type Text = (String, Vec<String>);

/// The agent ended it itself, or its scripted steps ran out. `reason` is one of `GoalAchieved`, `AgentBlocked`, `AskUser`, `ExecutorExhausted`.
fn agent_ended(reason: Reason, cx: &Context<'_>) -> Text {
    let (facts, ran, resume) = (cx.facts, &cx.ran, &cx.resume);
    match reason {
        Reason::GoalAchieved => (
            with_detail(format!("Goal achieved {ran}"), facts.detail),
            vec!["Review the deliverables in the session workspace".into()],
        ),
        Reason::AgentBlocked => (
            with_detail(
                format!("The agent reported it is blocked {ran}"),
                facts.detail,
            ),
            vec![
                "Remove the blocker the agent named".into(),
                format!("{resume} with guidance"),
            ],
        ),
        Reason::AskUser => (
            with_detail(format!("The agent needs your input {ran}"), facts.detail),
            vec![format!("{resume} with your answer as guidance")],
        ),
        // ExecutorExhausted, the last this function is given.
        _ => (
            format!("Stopped: the scripted steps ran out without a stop signal {ran}"),
            vec!["Create a new session with more steps or a DONE sentinel".into()],
        ),
    }
}

/// A policy of the loop paused or stopped it on what the steps showed. `reason` is one of `Stuck`, `SlowProgress`, `ReworkLoop`, `Uncertainty`, `CoherenceLow`, `ReflectionFailed`, `BudgetProjectedOverrun`.
fn policy_stepped_in(reason: Reason, cx: &Context<'_>) -> Text {
    let (facts, ran, resume) = (cx.facts, &cx.ran, &cx.resume);
    let (u, l) = (facts.usage, facts.limits);
    match reason {
        Reason::Stuck => (
            with_detail(
                format!("Paused: the agent kept repeating itself after a nudge {ran}"),
                facts.detail,
            ),
            vec![
                "Inspect GET /api/autonomous/{id}/decisions and the last iterations".into(),
                format!("{resume} with guidance on another approach"),
            ],
        ),
        Reason::SlowProgress => (
            with_detail(
                format!("Paused: progress has been slow {ran}"),
                facts.detail,
            ),
            vec![format!("{resume} with a narrower goal or guidance")],
        ),
        Reason::ReworkLoop => (
            with_detail(
                format!("Paused: too many recent steps redid earlier work {ran}"),
                facts.detail,
            ),
            vec![
                "Inspect GET /api/autonomous/{id}/decisions for the rework ratio".into(),
                format!("{resume} with guidance"),
            ],
        ),
        Reason::Uncertainty => (
            with_detail(
                format!("Paused: the agent is too uncertain to go on {ran}"),
                facts.detail,
            ),
            vec![format!("{resume} with clarifying guidance")],
        ),
        Reason::CoherenceLow => (
            with_detail(
                format!("Stopped: the agent's work lost coherence with the goal {ran}"),
                facts.detail,
            ),
            vec![format!("{resume} with guidance that restates the goal")],
        ),
        Reason::ReflectionFailed => (
            with_detail(
                format!("Paused: reflection failed several times in a row {ran}"),
                facts.detail,
            ),
            vec![
                "Check the reflection model (WARDEN_LLM_BASE_URL, AUTONOMOUS_REFLECTION_MODEL)"
                    .into(),
                format!("{resume} once it answers again"),
            ],
        ),
        // BudgetProjectedOverrun, the last this function is given.
        _ => (
            with_detail(
                format!(
                    "Paused: finishing would need far more than the {} tokens left of the budget {ran}",
                    l.max_tokens.saturating_sub(u.tokens)
                ),
                facts.detail,
            ),
            vec![
                format!("{resume} with a higher limits.max_tokens"),
                "Or narrow the goal so less work is left".into(),
            ],
        ),
    }
}

/// A limit the session was given ran out. `reason` is one of `Timeout`, `MaxIterations`, `CostLimit`, `ErrorThreshold`, `StepLimit`, `BudgetExhausted`, `CycleLimit`.
fn limit_reached(reason: Reason, cx: &Context<'_>) -> Text {
    let (facts, ran, resume) = (cx.facts, &cx.ran, &cx.resume);
    let (u, l) = (facts.usage, facts.limits);
    match reason {
        Reason::Timeout => (
            format!(
                "Stopped: wall-clock limit of {} ms reached {ran}",
                l.max_wall_time_ms
            ),
            vec![format!("{resume} with a higher limits.max_wall_time_ms")],
        ),
        Reason::MaxIterations => (
            format!(
                "Stopped: iteration limit of {} reached {ran}",
                l.max_iterations
            ),
            vec![format!("{resume} with a higher limits.max_iterations")],
        ),
        Reason::CostLimit => match l.max_cost_usd {
            Some(max) if u.cost_usd >= max || u.unpriced_steps > 0 => (
                with_detail(
                    format!(
                        "Stopped: money budget of {} USD used up {ran}",
                        max.normalize()
                    ),
                    facts.detail,
                ),
                vec![format!("{resume} with a higher limits.max_cost_usd")],
            ),
            _ => (
                with_detail(
                    format!("Stopped: token budget of {} used up {ran}", l.max_tokens),
                    facts.detail,
                ),
                vec![format!("{resume} with a higher limits.max_tokens")],
            ),
        },
        Reason::ErrorThreshold => (
            with_detail(
                format!("Stopped: {} consecutive errors {ran}", u.consecutive_errors),
                facts.detail,
            ),
            vec![
                "Inspect the failing iterations with GET /api/autonomous/{id}/iterations".into(),
                format!("{resume} once the cause is fixed"),
            ],
        ),
        Reason::StepLimit => (
            format!("Stopped: many steps ran without a person looking {ran}"),
            vec![
                "Review the progress so far".into(),
                format!("{resume} to allow another stretch of steps"),
            ],
        ),
        Reason::BudgetExhausted => (
            with_detail(format!("Stopped: a budget ran out {ran}"), facts.detail),
            vec![format!("{resume} with a higher limit")],
        ),
        // CycleLimit, the last this function is given.
        _ => (
            format!("Stopped: all {} context cycles used {ran}", l.max_cycles),
            vec![format!("{resume} with a higher limits.max_cycles")],
        ),
    }
}

/// It waits for a person, a worker or its children. `reason` is one of `ReviewRequired`, `NoWorker`, `ApprovalRequired`, `WaitingForChildren`, `ConfirmationExpired`.
fn waiting(reason: Reason, cx: &Context<'_>) -> Text {
    let (facts, ran, resume) = (cx.facts, &cx.ran, &cx.resume);
    match reason {
    Reason::ReviewRequired => (
        with_detail(
            format!("Paused for review: a stretch of steps ran without a person looking {ran}"),
            facts.detail,
        ),
        vec![
            "Review the recent steps with GET /api/autonomous/{id}/iterations".into(),
            format!("{resume} to continue; the count of steps starts over"),
            "Change how often it asks with PATCH /api/autonomous/{id} limits.review_every (0 = never)"
                .into(),
        ],
    ),
    Reason::NoWorker => (
        with_detail(
            format!("Paused: no worker claimed the step {ran}"),
            facts.detail,
        ),
        vec![
            "Start a worker on the session's queue (see GET /api/workers/queues)".into(),
            format!("{resume} once a worker runs; the step is offered again"),
        ],
    ),
    Reason::ApprovalRequired => (
        with_detail(
            format!("Paused: a call waits for a person's approval {ran}"),
            facts.detail,
        ),
        vec![
            "See what waits in `pending_approvals` of GET /api/autonomous/{id}, or GET /api/autonomous/approvals".into(),
            "Approve (with edited `arguments` if you like) or reject it with POST /api/autonomous/{id}/approvals/{call_id}; the session continues the same step".into(),
        ],
    ),
    Reason::WaitingForChildren => (
        with_detail(
            format!("Waiting: the tasks it delegated are running {ran}"),
            facts.detail,
        ),
        vec![
            "See its children in GET /api/autonomous/{id}/tree; it continues by itself when the last one ends".into(),
            "Stop it (POST /api/autonomous/{id}/stop) to stop the whole tree".into(),
        ],
    ),
    // ConfirmationExpired, the last this function is given.
    _ => (
        with_detail(
            format!("Stopped: nobody confirmed it (POST /api/autonomous/{{id}}/confirm) before the confirmation timeout; it never started, {ran}"),
            facts.detail,
        ),
        vec![
            format!("{resume} to start it anyway, or create it again with a higher confirm_if_over"),
        ],
    ),
    }
}

/// A person, its parent or a failure inside Warden ended it. `reason` is one of `UserStop`, `UserPause`, `ParentEnded`, `InternalError`, `SecretUnreadable`.
fn interrupted(reason: Reason, cx: &Context<'_>) -> Text {
    let (facts, ran, resume) = (cx.facts, &cx.ran, &cx.resume);
    match reason {
    Reason::UserStop => (
        format!("Interrupted by a user {ran}"),
        vec![format!("{resume} to continue from the last checkpoint")],
    ),
    Reason::UserPause => (
        format!("Paused by a user {ran}"),
        vec![format!("{resume}, optionally with guidance")],
    ),
    Reason::ParentEnded => (
        format!("Interrupted: the session that delegated it ended first {ran}"),
        vec![
            "Its parent was given its result so far; a child that ended cannot run again".into(),
            "Delegate the task again from a live session (or have the parent wait for its children)".into(),
        ],
    ),
    Reason::InternalError => (
        with_detail(format!("Failed on an internal error {ran}"), facts.detail),
        vec![format!("{resume} to retry from the last checkpoint")],
    ),
    // SecretUnreadable, the last this function is given.
    _ => (
        with_detail(
            format!("Failed: a secret of the session (its api_key or URL query) cannot be decrypted with the configured secret key {ran}"),
            facts.detail,
        ),
        vec![
            "Start Warden with the WARDEN_SECRET_KEY (or WARDEN_SECRET_KEY_FILE) the session was created under".into(),
            format!("{resume} once it is back"),
        ],
    ),
    }
}

/// Most recent steps named in a review summary.
const REVIEW_NAMED_STEPS: usize = 3;
/// Characters of a step's observation quoted in a review summary.
const REVIEW_OBSERVATION_CHARS: usize = 60;

/// A short account of the steps before a review point: how many ran since a
/// person last looked, how the recent ones (`recent`, oldest first) went,
/// and what the last few did.
pub fn review_summary(steps_since_start: u64, recent: &[StepRecord]) -> String {
    let mut text = format!(
        "{steps_since_start} step{} since a person last looked",
        if steps_since_start == 1 { "" } else { "s" }
    );
    if recent.is_empty() {
        return text;
    }
    let count = |o: Outcome| recent.iter().filter(|r| r.outcome == o).count();
    let tokens: u64 = recent.iter().map(|r| r.tokens).sum();
    let files: usize = recent.iter().map(|r| r.files_written.len()).sum();
    text.push_str(&format!(
        "; the last {}: {} succeeded, {} failed, {} errors, {tokens} tokens, {files} files written; latest:",
        recent.len(),
        count(Outcome::Success),
        count(Outcome::Failure),
        count(Outcome::Error),
    ));
    let latest = recent.iter().rev().take(REVIEW_NAMED_STEPS);
    let named: Vec<String> = latest
        .map(|r| {
            let seen = r.observation.trim();
            let mut quoted: String = seen.chars().take(REVIEW_OBSERVATION_CHARS).collect();
            if seen.chars().count() > REVIEW_OBSERVATION_CHARS {
                quoted.push('…');
            }
            let action = if r.action.is_empty() {
                "(no action)"
            } else {
                &r.action
            };
            format!(" #{} {action} → {quoted}", r.number)
        })
        .collect();
    text.push_str(&named.join(";"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::guardrails::tests::roomy;

    fn step(number: u64, action: &str, outcome: Outcome, observation: &str) -> StepRecord {
        StepRecord {
            number,
            action: action.into(),
            arguments: serde_json::Value::Null,
            outcome,
            observation: observation.into(),
            message: String::new(),
            error: None,
            tokens: 10,
            tool_calls: 0,
            files_written: Vec::new(),
            waiting: false,
            duration_ms: 1,
            context_overflow: false,
        }
    }

    #[test]
    fn review_summary_counts_the_recent_steps_and_names_the_latest() {
        let recent = vec![
            step(97, "write_part_97", Outcome::Success, "wrote part 97"),
            step(98, "run_tests", Outcome::Failure, "1 failed"),
            step(99, "deploy", Outcome::Error, "no route"),
            step(100, "write_part_100", Outcome::Success, "wrote part 100"),
        ];
        assert_eq!(
            review_summary(100, &recent),
            "100 steps since a person last looked; the last 4: 2 succeeded, 1 failed, \
             1 errors, 40 tokens, 0 files written; latest: #100 write_part_100 → wrote part 100; \
             #99 deploy → no route; #98 run_tests → 1 failed"
        );
    }

    #[test]
    fn review_summary_without_history_and_with_long_observations() {
        assert_eq!(review_summary(1, &[]), "1 step since a person last looked");
        let long = "x".repeat(200);
        let text = review_summary(5, &[step(5, "", Outcome::Success, &long)]);
        assert!(
            text.ends_with(&format!("#5 (no action) → {}…", "x".repeat(60))),
            "{text}"
        );
    }

    #[test]
    fn the_review_pause_carries_its_summary_and_how_to_go_on() {
        let l = roomy();
        let u = usage();
        let t = record(
            Reason::ReviewRequired,
            Facts {
                usage: &u,
                limits: &l,
                detail: Some("3 steps since a person last looked"),
            },
        );
        assert_eq!(t.status, Status::Paused);
        assert!(t.summary.starts_with("Paused for review"), "{}", t.summary);
        assert!(t.summary.ends_with(": 3 steps since a person last looked"));
        assert!(t.next_steps.iter().any(|s| s.contains("/resume")));
        assert!(t.next_steps.iter().any(|s| s.contains("review_every")));
    }

    fn usage() -> Usage {
        Usage {
            iterations: 3,
            elapsed_ms: 1500,
            tokens: 360,
            consecutive_errors: 2,
            tool_calls: 0,
            ..Usage::default()
        }
    }

    #[test]
    fn every_reason_has_a_summary_next_steps_and_its_status() {
        let l = roomy();
        let u = usage();
        for reason in Reason::ALL {
            let t = record(
                reason,
                Facts {
                    usage: &u,
                    limits: &l,
                    detail: None,
                },
            );
            assert_eq!(t.reason, reason);
            assert_eq!(t.status, reason.status());
            assert!(
                t.summary.contains("3 iterations"),
                "{reason:?}: {}",
                t.summary
            );
            assert!(t.summary.contains("360 tokens"), "{reason:?}");
            assert!(!t.next_steps.is_empty(), "{reason:?}");
        }
    }

    #[test]
    fn guardrail_summaries_name_the_limit() {
        let l = roomy();
        let u = usage();
        let f = Facts {
            usage: &u,
            limits: &l,
            detail: None,
        };
        assert!(record(Reason::MaxIterations, f).summary.contains("10"));
        assert!(record(Reason::CostLimit, f).summary.contains("1000"));
        assert!(record(Reason::Timeout, f).summary.contains("10000 ms"));
        assert!(record(Reason::CostLimit, f).next_steps[0].contains("max_tokens"));
        let money = Limits {
            max_cost_usd: Some(rust_decimal::Decimal::new(5, 1)),
            ..*f.limits
        };
        let spent = Usage {
            cost_usd: rust_decimal::Decimal::new(5, 1),
            ..*f.usage
        };
        let m = record(
            Reason::CostLimit,
            Facts {
                limits: &money,
                usage: &spent,
                ..f
            },
        );
        assert!(
            m.summary.contains("money budget of 0.5 USD"),
            "{}",
            m.summary
        );
        assert!(m.next_steps[0].contains("max_cost_usd"));
    }

    #[test]
    fn detail_is_appended_when_given() {
        let l = roomy();
        let u = usage();
        let t = record(
            Reason::AgentBlocked,
            Facts {
                usage: &u,
                limits: &l,
                detail: Some("need an API key"),
            },
        );
        assert!(t.summary.ends_with(": need an API key"));
        let blank = record(
            Reason::AgentBlocked,
            Facts {
                usage: &u,
                limits: &l,
                detail: Some("  "),
            },
        );
        assert!(!blank.summary.ends_with(':'));
    }

    #[test]
    fn singular_iteration() {
        let l = roomy();
        let u = Usage {
            iterations: 1,
            ..usage()
        };
        let t = record(
            Reason::UserStop,
            Facts {
                usage: &u,
                limits: &l,
                detail: None,
            },
        );
        assert!(t.summary.contains("1 iteration,"));
        assert_eq!(t.status, Status::Interrupted);
    }
}
