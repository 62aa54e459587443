//! The session state machine. Every status change goes through these
//! functions, so an illegal transition is refused in exactly one place.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The goal was judged ambiguous; waiting for the user's choice.
    AwaitingRefinement,
    /// Its estimate is over the create's `confirm_if_over` (or unknown):
    /// it waits for `POST /{id}/confirm` before it starts.
    AwaitingConfirmation,
    /// Waiting for a replica with capacity to claim it (`WARDEN_MAX_RUNNING`).
    Queued,
    /// The loop task is (or should be) executing.
    Running,
    /// Waiting for a person.
    Paused,
    /// Goal achieved.
    Completed,
    /// Forced stop by a guardrail or the gate.
    Stopped,
    /// A user stopped it.
    Interrupted,
    /// An internal error Warden could not recover from.
    Failed,
}

impl Status {
    /// Every status, in display order.
    pub const ALL: [Status; 9] = [
        Status::AwaitingRefinement,
        Status::AwaitingConfirmation,
        Status::Queued,
        Status::Running,
        Status::Paused,
        Status::Completed,
        Status::Stopped,
        Status::Interrupted,
        Status::Failed,
    ];

    /// The snake_case name stored in Postgres and shown in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::AwaitingRefinement => "awaiting_refinement",
            Status::AwaitingConfirmation => "awaiting_confirmation",
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Completed => "completed",
            Status::Stopped => "stopped",
            Status::Interrupted => "interrupted",
            Status::Failed => "failed",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether a session in this status has ended (as Postgres's
    /// `warden_session_ended` says too): completed, stopped, interrupted or failed.
    pub fn has_ended(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Stopped | Status::Interrupted | Status::Failed
        )
    }

    /// Whether a session in this status may be resumed.
    pub fn is_resumable(self) -> bool {
        matches!(
            self,
            Status::Paused | Status::Stopped | Status::Interrupted | Status::Failed
        )
    }
}

/// The machine-readable reason attached to every waiting or ended status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The goal was achieved.
    GoalAchieved,
    /// The agent said it is blocked.
    AgentBlocked,
    /// The agent (or reflection) needs the user's input.
    AskUser,
    /// Stuck detection saw the agent repeat itself after a nudge.
    Stuck,
    /// Progress has been slow for several reflections.
    SlowProgress,
    /// Too many recent steps were rework.
    ReworkLoop,
    /// Reflection reported high uncertainty.
    Uncertainty,
    /// Reflection reported low coherence.
    CoherenceLow,
    /// Wall-clock limit reached.
    Timeout,
    /// Iteration limit reached.
    MaxIterations,
    /// Token budget exhausted.
    CostLimit,
    /// Too many consecutive errors.
    ErrorThreshold,
    /// Earlier versions stopped a session after a fixed number of steps
    /// without a person; kept so those sessions still read. Never given now:
    /// that rule pauses with [`Reason::ReviewRequired`].
    StepLimit,
    /// A budget other than tokens (tool calls) ran out.
    BudgetExhausted,
    /// A scripted executor ran out of steps without a stop signal.
    ExecutorExhausted,
    /// A user stopped the session.
    UserStop,
    /// A user paused the session.
    UserPause,
    /// Warden hit an error it could not recover from.
    InternalError,
    /// Reflection failed several times in a row.
    ReflectionFailed,
    /// The session used all its context cycles.
    CycleLimit,
    /// At the progress rate so far, finishing would need far more tokens than are left.
    BudgetProjectedOverrun,
    /// A secret of the session (its `api_key`, its URL's query) cannot be decrypted with the
    /// configured secret key (`WARDEN_SECRET_KEY`).
    SecretUnreadable,
    /// A review point: `review_every` steps ran since a person last looked.
    ReviewRequired,
    /// No worker claimed the step's task within the executor's `worker_wait_timeout_ms`.
    NoWorker,
    /// A tool call (or an agent's action) waits for a person's approval.
    ApprovalRequired,
    /// The session delegated tasks to child sessions and waits for them to end.
    WaitingForChildren,
    /// A child session was still live when its parent ended by itself (a
    /// `wait: false` child outliving its parent): it was stopped.
    ParentEnded,
    /// It waited in `awaiting_confirmation` longer than the confirmation
    /// timeout and was never started.
    ConfirmationExpired,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 28] = [
        Reason::GoalAchieved,
        Reason::AgentBlocked,
        Reason::AskUser,
        Reason::Stuck,
        Reason::SlowProgress,
        Reason::ReworkLoop,
        Reason::Uncertainty,
        Reason::CoherenceLow,
        Reason::Timeout,
        Reason::MaxIterations,
        Reason::CostLimit,
        Reason::ErrorThreshold,
        Reason::StepLimit,
        Reason::BudgetExhausted,
        Reason::ExecutorExhausted,
        Reason::UserStop,
        Reason::UserPause,
        Reason::InternalError,
        Reason::ReflectionFailed,
        Reason::CycleLimit,
        Reason::BudgetProjectedOverrun,
        Reason::SecretUnreadable,
        Reason::ReviewRequired,
        Reason::NoWorker,
        Reason::ApprovalRequired,
        Reason::WaitingForChildren,
        Reason::ParentEnded,
        Reason::ConfirmationExpired,
    ];

    /// The snake_case name stored in Postgres and shown in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::GoalAchieved => "goal_achieved",
            Reason::AgentBlocked => "agent_blocked",
            Reason::AskUser => "ask_user",
            Reason::Stuck => "stuck",
            Reason::SlowProgress => "slow_progress",
            Reason::ReworkLoop => "rework_loop",
            Reason::Uncertainty => "uncertainty",
            Reason::CoherenceLow => "coherence_low",
            Reason::Timeout => "timeout",
            Reason::MaxIterations => "max_iterations",
            Reason::CostLimit => "cost_limit",
            Reason::ErrorThreshold => "error_threshold",
            Reason::StepLimit => "step_limit",
            Reason::BudgetExhausted => "budget_exhausted",
            Reason::ExecutorExhausted => "executor_exhausted",
            Reason::UserStop => "user_stop",
            Reason::UserPause => "user_pause",
            Reason::InternalError => "internal_error",
            Reason::ReflectionFailed => "reflection_failed",
            Reason::CycleLimit => "cycle_limit",
            Reason::BudgetProjectedOverrun => "budget_projected_overrun",
            Reason::SecretUnreadable => "secret_unreadable",
            Reason::ReviewRequired => "review_required",
            Reason::NoWorker => "no_worker",
            Reason::ApprovalRequired => "approval_required",
            Reason::WaitingForChildren => "waiting_for_children",
            Reason::ParentEnded => "parent_ended",
            Reason::ConfirmationExpired => "confirmation_expired",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The status a session ends in (or waits in) for this reason.
    pub fn status(self) -> Status {
        match self {
            Reason::GoalAchieved => Status::Completed,
            Reason::AgentBlocked
            | Reason::AskUser
            | Reason::Stuck
            | Reason::SlowProgress
            | Reason::ReworkLoop
            | Reason::Uncertainty
            | Reason::UserPause
            | Reason::ReflectionFailed
            | Reason::BudgetProjectedOverrun
            | Reason::ReviewRequired
            | Reason::NoWorker
            | Reason::ApprovalRequired
            | Reason::WaitingForChildren => Status::Paused,
            Reason::CoherenceLow
            | Reason::Timeout
            | Reason::MaxIterations
            | Reason::CostLimit
            | Reason::ErrorThreshold
            | Reason::StepLimit
            | Reason::BudgetExhausted
            | Reason::ExecutorExhausted
            | Reason::CycleLimit
            | Reason::ConfirmationExpired => Status::Stopped,
            Reason::UserStop | Reason::ParentEnded => Status::Interrupted,
            Reason::InternalError | Reason::SecretUnreadable => Status::Failed,
        }
    }
}

/// How the session loop chooses between iteration limits and reflection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A fixed iteration limit; no reflection-driven stop.
    Fixed,
    /// Reflection-driven termination under all guardrails.
    Continuous,
}

impl Mode {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fixed => "fixed",
            Mode::Continuous => "continuous",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "fixed" => Some(Mode::Fixed),
            "continuous" => Some(Mode::Continuous),
            _ => None,
        }
    }
}

/// A transition that the state machine refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {action} a session that is {}: {hint}", from.as_str())]
pub struct IllegalTransition {
    /// What was asked.
    pub action: &'static str,
    /// The status the session was in.
    pub from: Status,
    /// What the caller can do instead.
    pub hint: &'static str,
}

/// What a stop request does to a session in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPlan {
    /// The loop is running: signal it and let it record `interrupted`.
    SignalRunner,
    /// Nothing runs: record `interrupted / user_stop` directly.
    InterruptNow,
    /// Already interrupted: answer with the current state (stop is idempotent).
    AlreadyStopped,
}

/// Decides what a user's stop does.
pub fn plan_stop(from: Status) -> Result<StopPlan, IllegalTransition> {
    match from {
        Status::Running => Ok(StopPlan::SignalRunner),
        Status::Paused
        | Status::AwaitingRefinement
        | Status::AwaitingConfirmation
        | Status::Queued => Ok(StopPlan::InterruptNow),
        Status::Interrupted => Ok(StopPlan::AlreadyStopped),
        Status::Completed | Status::Stopped | Status::Failed => Err(IllegalTransition {
            action: "stop",
            from,
            hint: "it has already ended; resume it first if it should run again",
        }),
    }
}

/// What a user's pause does to a session in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausePlan {
    /// Let the step in flight finish, then pause.
    SignalRunner,
    /// Already paused: answer with the current state.
    AlreadyPaused,
}

/// Decides what a user's pause does.
pub fn plan_pause(from: Status) -> Result<PausePlan, IllegalTransition> {
    match from {
        Status::Running => Ok(PausePlan::SignalRunner),
        Status::Paused => Ok(PausePlan::AlreadyPaused),
        Status::AwaitingRefinement => Err(IllegalTransition {
            action: "pause",
            from,
            hint: "it is not running yet; answer its refinement first",
        }),
        Status::AwaitingConfirmation => Err(IllegalTransition {
            action: "pause",
            from,
            hint: "it has not started; confirm it (POST /api/autonomous/{id}/confirm) or stop it",
        }),
        Status::Queued => Err(IllegalTransition {
            action: "pause",
            from,
            hint: "it waits for a replica with capacity and has not run yet; stop it, or pause it once it runs",
        }),
        Status::Completed | Status::Stopped | Status::Interrupted | Status::Failed => {
            Err(IllegalTransition {
                action: "pause",
                from,
                hint: "it is not running; resume it first",
            })
        }
    }
}

/// Checks that a session in this status may be resumed. A completed
/// session may be reopened explicitly when its work was not actually done.
pub fn check_resume(from: Status, reopen: bool) -> Result<(), IllegalTransition> {
    match from {
        s if s.is_resumable() => Ok(()),
        Status::Completed if reopen => Ok(()),
        Status::Running => Err(IllegalTransition {
            action: "resume",
            from,
            hint: "it is already running",
        }),
        Status::Queued => Err(IllegalTransition {
            action: "resume",
            from,
            hint: "it is already queued and starts when a replica has capacity",
        }),
        Status::Completed => Err(IllegalTransition {
            action: "resume",
            from,
            hint: "its goal was achieved; send \"reopen\": true if the work was not actually done",
        }),
        Status::AwaitingConfirmation => Err(IllegalTransition {
            action: "resume",
            from,
            hint: "it has not started; confirm it with POST /api/autonomous/{id}/confirm",
        }),
        _ => Err(IllegalTransition {
            action: "resume",
            from,
            hint: "answer its refinement with POST /api/autonomous/{id}/refinement",
        }),
    }
}

/// Where a session that is ready to run goes: `running` on this replica
/// when it reserved a slot under `WARDEN_MAX_RUNNING` and nobody is queued
/// before it (a newcomer never overtakes a waiting session), else `queued`
/// until a replica with capacity claims it, oldest first.
pub fn admission(slot_reserved: bool, queue_empty: bool) -> Status {
    if slot_reserved && queue_empty {
        Status::Running
    } else {
        Status::Queued
    }
}

/// Checks that a refinement choice may be applied.
pub fn check_refine(from: Status) -> Result<(), IllegalTransition> {
    if from == Status::AwaitingRefinement {
        Ok(())
    } else {
        Err(IllegalTransition {
            action: "refine",
            from,
            hint: "only a session awaiting refinement takes a refinement choice",
        })
    }
}

/// Checks that a session may be confirmed (started after its estimate was
/// shown): only one awaiting confirmation.
pub fn check_confirm(from: Status) -> Result<(), IllegalTransition> {
    if from == Status::AwaitingConfirmation {
        Ok(())
    } else {
        Err(IllegalTransition {
            action: "confirm",
            from,
            hint: "only a session awaiting confirmation is confirmed",
        })
    }
}

/// Checks that the loop may end a session in `from` with `reason`.
pub fn check_finish(from: Status, reason: Reason) -> Result<Status, IllegalTransition> {
    if from == Status::Running {
        Ok(reason.status())
    } else {
        Err(IllegalTransition {
            action: "finish",
            from,
            hint: "only a running session can end",
        })
    }
}

/// Checks that mode or limits may be changed on a session in this status.
pub fn check_update(from: Status) -> Result<(), IllegalTransition> {
    if from == Status::Completed {
        Err(IllegalTransition {
            action: "update",
            from,
            hint: "its goal was achieved; create a new session instead",
        })
    } else {
        Ok(())
    }
}

/// Checks that a session in this status may be deleted: only one that has
/// ended (completed, stopped, interrupted or failed). A live one, or one
/// waiting for a person, is stopped first.
pub fn check_delete(from: Status) -> Result<(), IllegalTransition> {
    match from {
        Status::Completed | Status::Stopped | Status::Interrupted | Status::Failed => Ok(()),
        Status::Running
        | Status::Queued
        | Status::Paused
        | Status::AwaitingRefinement
        | Status::AwaitingConfirmation => Err(IllegalTransition {
            action: "delete",
            from,
            hint: "it has not ended; stop it first (POST /api/autonomous/{id}/stop)",
        }),
    }
}

/// Something a person may do to a session through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `POST /{id}/stop`.
    Stop,
    /// `POST /{id}/pause`.
    Pause,
    /// `POST /{id}/resume`.
    Resume,
    /// `POST /{id}/resume` with `"reopen": true` (a completed session).
    Reopen,
    /// `PATCH /{id}`: mode and limits.
    Update,
    /// `POST /{id}/refinement`.
    Refine,
    /// `POST /{id}/confirm`.
    Confirm,
    /// `DELETE /{id}`.
    Delete,
}

impl Action {
    /// Every action, in display order.
    pub const ALL: [Action; 8] = [
        Action::Stop,
        Action::Pause,
        Action::Resume,
        Action::Reopen,
        Action::Update,
        Action::Refine,
        Action::Confirm,
        Action::Delete,
    ];
}

impl Action {
    /// The verb an error message names.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Stop => "stop",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Reopen => "reopen",
            Action::Update => "update",
            Action::Refine => "refine",
            Action::Confirm => "confirm",
            Action::Delete => "delete",
        }
    }
}

/// Checks that `action` may be taken on a session in `from` that is
/// `read_only` (imported from an archive): such a session may only be
/// deleted; every other action answers 409.
pub fn check_writable(
    action: Action,
    from: Status,
    read_only: bool,
) -> Result<(), IllegalTransition> {
    if read_only && action != Action::Delete {
        return Err(IllegalTransition {
            action: action.as_str(),
            from,
            hint: "it was imported from an archive and is read-only: its history can be read, not changed (DELETE removes it)",
        });
    }
    Ok(())
}

/// The actions the API takes on a session in `status` (`read_only`:
/// imported from an archive), derived from the same checks the operations
/// make so the two cannot disagree. An action that would only answer
/// "already so" (stopping an interrupted session, pausing a paused one) is
/// not offered.
pub fn allowed_actions(status: Status, read_only: bool) -> Vec<Action> {
    Action::ALL
        .into_iter()
        .filter(|action| check_writable(*action, status, read_only).is_ok())
        .filter(|action| match action {
            Action::Stop => plan_stop(status).is_ok_and(|p| p != StopPlan::AlreadyStopped),
            Action::Pause => plan_pause(status).is_ok_and(|p| p != PausePlan::AlreadyPaused),
            Action::Resume => check_resume(status, false).is_ok(),
            Action::Reopen => status == Status::Completed && check_resume(status, true).is_ok(),
            Action::Update => check_update(status).is_ok(),
            Action::Refine => check_refine(status).is_ok(),
            Action::Confirm => check_confirm(status).is_ok(),
            Action::Delete => check_delete(status).is_ok(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_actions_follow_the_state_machine() {
        use Action::*;
        let expect = |s: Status| -> Vec<Action> {
            match s {
                Status::AwaitingRefinement => vec![Stop, Update, Refine],
                Status::AwaitingConfirmation => vec![Stop, Update, Confirm],
                Status::Queued => vec![Stop, Update],
                Status::Running => vec![Stop, Pause, Update],
                Status::Paused => vec![Stop, Resume, Update],
                Status::Completed => vec![Reopen, Delete],
                Status::Stopped | Status::Failed | Status::Interrupted => {
                    vec![Resume, Update, Delete]
                }
            }
        };
        for s in Status::ALL {
            assert_eq!(allowed_actions(s, false), expect(s), "{}", s.as_str());
        }
    }

    #[test]
    fn an_imported_session_may_only_be_deleted() {
        for s in [
            Status::Completed,
            Status::Stopped,
            Status::Interrupted,
            Status::Failed,
        ] {
            assert_eq!(
                allowed_actions(s, true),
                vec![Action::Delete],
                "{}",
                s.as_str()
            );
            for action in Action::ALL {
                let refused = check_writable(action, s, true).is_err();
                assert_eq!(refused, action != Action::Delete, "{action:?}");
                assert!(check_writable(action, s, false).is_ok());
            }
        }
        let err = check_writable(Action::Resume, Status::Stopped, true).unwrap_err();
        assert!(
            err.to_string().contains("imported from an archive"),
            "{err}"
        );
        assert!(err.to_string().starts_with("cannot resume"), "{err}");
    }

    #[test]
    fn only_ended_sessions_may_be_deleted() {
        for s in Status::ALL {
            let ended = matches!(
                s,
                Status::Completed | Status::Stopped | Status::Interrupted | Status::Failed
            );
            assert_eq!(check_delete(s).is_ok(), ended, "{}", s.as_str());
        }
    }

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        for m in [Mode::Fixed, Mode::Continuous] {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        assert_eq!(Status::parse("bogus"), None);
        assert_eq!(Reason::parse("bogus"), None);
        assert_eq!(Mode::parse("bogus"), None);
    }

    #[test]
    fn each_reason_maps_to_the_documented_status() {
        use Reason::*;
        let expect = |r: Reason, s: Status| assert_eq!(r.status(), s, "{r:?}");
        expect(GoalAchieved, Status::Completed);
        for r in [
            AgentBlocked,
            AskUser,
            Stuck,
            SlowProgress,
            ReworkLoop,
            Uncertainty,
            UserPause,
            ReflectionFailed,
            BudgetProjectedOverrun,
            ReviewRequired,
            NoWorker,
            ApprovalRequired,
            WaitingForChildren,
        ] {
            expect(r, Status::Paused);
        }
        for r in [
            CoherenceLow,
            Timeout,
            MaxIterations,
            CostLimit,
            ErrorThreshold,
            StepLimit,
            BudgetExhausted,
            ExecutorExhausted,
            CycleLimit,
        ] {
            expect(r, Status::Stopped);
        }
        expect(UserStop, Status::Interrupted);
        expect(ParentEnded, Status::Interrupted);
        expect(ConfirmationExpired, Status::Stopped);
        expect(InternalError, Status::Failed);
        expect(SecretUnreadable, Status::Failed);
    }

    #[test]
    fn stop_plans() {
        assert_eq!(plan_stop(Status::Running), Ok(StopPlan::SignalRunner));
        assert_eq!(plan_stop(Status::Paused), Ok(StopPlan::InterruptNow));
        assert_eq!(
            plan_stop(Status::AwaitingRefinement),
            Ok(StopPlan::InterruptNow)
        );
        assert_eq!(plan_stop(Status::Queued), Ok(StopPlan::InterruptNow));
        assert_eq!(
            plan_stop(Status::AwaitingConfirmation),
            Ok(StopPlan::InterruptNow)
        );
        assert_eq!(plan_stop(Status::Interrupted), Ok(StopPlan::AlreadyStopped));
        for s in [Status::Completed, Status::Stopped, Status::Failed] {
            let err = plan_stop(s).unwrap_err();
            assert_eq!(err.from, s);
            assert!(err.to_string().contains(s.as_str()));
        }
    }

    #[test]
    fn pause_plans() {
        assert_eq!(plan_pause(Status::Running), Ok(PausePlan::SignalRunner));
        assert_eq!(plan_pause(Status::Paused), Ok(PausePlan::AlreadyPaused));
        for s in [
            Status::AwaitingRefinement,
            Status::AwaitingConfirmation,
            Status::Queued,
            Status::Completed,
            Status::Stopped,
            Status::Interrupted,
            Status::Failed,
        ] {
            assert!(plan_pause(s).is_err(), "{s:?}");
        }
        assert!(
            plan_pause(Status::Queued)
                .unwrap_err()
                .to_string()
                .contains("queued")
        );
    }

    #[test]
    fn resume_is_allowed_exactly_from_resumable_statuses() {
        for s in Status::ALL {
            assert_eq!(check_resume(s, false).is_ok(), s.is_resumable(), "{s:?}");
        }
        assert!(
            check_resume(Status::Completed, false)
                .unwrap_err()
                .to_string()
                .contains("completed")
        );
        assert!(check_resume(Status::Completed, true).is_ok());
        assert!(check_resume(Status::Running, true).is_err());
        assert!(check_resume(Status::AwaitingRefinement, true).is_err());
        assert!(check_resume(Status::Queued, true).is_err());
        assert!(!Status::Queued.is_resumable());
    }

    #[test]
    fn admission_runs_only_with_a_slot_and_nobody_waiting() {
        assert_eq!(admission(true, true), Status::Running);
        assert_eq!(admission(true, false), Status::Queued);
        assert_eq!(admission(false, true), Status::Queued);
        assert_eq!(admission(false, false), Status::Queued);
    }

    #[test]
    fn a_queued_session_may_be_updated_but_not_finished_or_refined() {
        assert!(check_update(Status::Queued).is_ok());
        assert!(check_finish(Status::Queued, Reason::UserStop).is_err());
        assert!(check_refine(Status::Queued).is_err());
    }

    #[test]
    fn refinement_only_while_awaiting_it() {
        for s in Status::ALL {
            assert_eq!(check_refine(s).is_ok(), s == Status::AwaitingRefinement);
        }
    }

    #[test]
    fn only_running_sessions_finish() {
        for s in Status::ALL {
            let result = check_finish(s, Reason::MaxIterations);
            if s == Status::Running {
                assert_eq!(result, Ok(Status::Stopped));
            } else {
                assert!(result.is_err());
            }
        }
    }

    #[test]
    fn updates_are_refused_only_when_completed() {
        for s in Status::ALL {
            assert_eq!(check_update(s).is_err(), s == Status::Completed);
        }
    }

    #[test]
    fn confirmation_only_while_awaiting_it() {
        for s in Status::ALL {
            assert_eq!(check_confirm(s).is_ok(), s == Status::AwaitingConfirmation);
        }
        let err = check_confirm(Status::Running).unwrap_err();
        assert!(err.to_string().starts_with("cannot confirm"), "{err}");
    }

    #[test]
    fn a_session_awaiting_confirmation_has_not_started_nor_ended() {
        let s = Status::AwaitingConfirmation;
        assert!(!s.has_ended());
        assert!(!s.is_resumable());
        assert!(
            check_resume(s, false)
                .unwrap_err()
                .to_string()
                .contains("confirm")
        );
        assert!(check_resume(s, true).is_err());
        assert!(plan_pause(s).unwrap_err().to_string().contains("confirm"));
        assert!(check_delete(s).is_err());
        assert!(check_refine(s).is_err());
        assert!(check_update(s).is_ok());
        assert!(check_finish(s, Reason::ConfirmationExpired).is_err());
        assert_eq!(Reason::ConfirmationExpired.status(), Status::Stopped);
    }
}
