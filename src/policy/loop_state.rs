//! The loop's memory between iterations. It is a pure fold over committed
//! steps: a checkpoint is a snapshot of it, and applying the iterations
//! committed after that checkpoint rebuilds it exactly.

use serde::{Deserialize, Serialize};

use crate::policy::checklist::ChecklistItem;
use crate::policy::excerpt;
use crate::policy::gate::{Budget as GateBudget, GateInputs};
use crate::policy::guardrails::{self, Limits, Usage};
use crate::policy::history::{self, Outcome, Rework, StepRecord};
use crate::policy::lifecycle::{Mode, Reason};
use crate::policy::projection::{ProgressPoint, ProgressSample};
use crate::policy::reflection::{ReflectionState, Verdict};
use crate::policy::sentinel::{self, Sentinel, SignalKind};
use crate::policy::soft_budget::{self, Budget, BudgetWarning};
use crate::policy::stuck::{self, StuckConfig, StuckPattern, StuckVerdict};

/// How many recent steps the policies look at.
pub const HISTORY_WINDOW: usize = 20;

/// An end the loop has decided on but not yet recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingEnd {
    /// Why.
    pub reason: Reason,
    /// Detail for the summary.
    pub detail: Option<String>,
    /// The agent claimed the goal is done; in continuous mode the reflector
    /// must cast the second vote before the session completes.
    #[serde(default)]
    pub review_pending: bool,
}

/// A stuck pattern and what was done about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckFinding {
    /// The pattern seen.
    pub pattern: StuckPattern,
    /// Nudge or pause.
    pub verdict: StuckVerdict,
}

/// What the policies concluded from one step; stored with the iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEffects {
    /// Whether (and why) the step was rework.
    pub rework: Option<Rework>,
    /// Stuck detection's finding.
    pub stuck: Option<StuckFinding>,
    /// A stop sentinel in the agent's message.
    pub signal: Option<Sentinel>,
    /// Cumulative running time after the step, ms.
    pub elapsed_ms: u64,
    /// The context cycle the agent moves to after this step, when it changes.
    #[serde(default)]
    pub new_cycle: Option<u32>,
    /// Progress estimate after the step, percent.
    pub percent_complete: Option<f64>,
    /// Soft-budget thresholds the step's commit crossed (warned of once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget_warnings: Vec<BudgetWarning>,
}

/// Everything the loop needs to continue a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Cumulative consumption.
    pub usage: Usage,
    /// Run the state belongs to (1 at creation, +1 per resume).
    pub run: i32,
    /// Steps executed since the session last started or resumed.
    pub steps_since_start: u64,
    /// Iteration covered by the latest checkpoint.
    pub last_checkpoint_step: u64,
    /// Recent steps, oldest first (at most `HISTORY_WINDOW`), slim
    /// (`excerpt::slim`): a few KiB each.
    pub history: Vec<StepRecord>,
    /// Rework flags of the recent steps, aligned with `history`.
    pub rework: Vec<bool>,
    /// Nudges given since the last start or resume.
    pub nudges_given: u32,
    /// Nudge to deliver with the next step.
    pub pending_nudge: Option<String>,
    /// Total time spent in waiting steps, ms.
    pub total_wait_ms: u64,
    /// An end decided by the last step (sentinel, stuck), not yet recorded.
    pub pending_end: Option<PendingEnd>,
    /// Latest progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Reflection bookkeeping.
    #[serde(default)]
    pub reflection: ReflectionState,
    /// Success criteria and whether each is reported met.
    #[serde(default)]
    pub criteria: Vec<ChecklistItem>,
    /// Milestones and whether each is reported done.
    #[serde(default)]
    pub milestones: Vec<ChecklistItem>,
    /// Context cycle the agent works in (1-based).
    #[serde(default = "first_cycle")]
    pub cycle: u32,
    /// The latest progress estimate with the spend it was measured at: the
    /// rate the cost projection is based on.
    #[serde(default)]
    pub progress: Option<ProgressSample>,
    /// Spend and progress estimate after each recent step of this run
    /// (at most `HISTORY_WINDOW`): what the gate projects from.
    #[serde(default)]
    pub progress_trail: Vec<ProgressPoint>,
    /// How much of the session's charges from outside the loop (its
    /// `tokens_charged`: usage of steps cut short) `usage.tokens` counts.
    #[serde(default)]
    pub charges_seen: u64,
    /// Soft-budget thresholds warned of so far: each warns once per session.
    #[serde(default)]
    pub budget_warnings_sent: Vec<(Budget, u8)>,
    /// The wrap-up note of the warnings the last step crossed, for the next
    /// step (delivered once).
    #[serde(default)]
    pub pending_budget_note: Option<String>,
}

fn first_cycle() -> u32 {
    1
}

/// A reflection's effect on the loop, as stored with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppliedReflection {
    /// What the loop does.
    pub verdict: Verdict,
    /// Reflection bookkeeping after it.
    pub state_after: ReflectionState,
    /// Progress it reported.
    pub percent_complete: Option<f64>,
    /// Its reasoning (summary detail when it ends or pauses the session).
    pub reasoning: Option<String>,
    /// Success criteria after it.
    #[serde(default)]
    pub criteria: Vec<ChecklistItem>,
    /// Milestones after it.
    #[serde(default)]
    pub milestones: Vec<ChecklistItem>,
}

/// Decides what follows from `record`, given the state before it.
pub fn assess(
    state: &LoopState,
    record: &StepRecord,
    signal: Option<Sentinel>,
    stuck_config: &StuckConfig,
    elapsed_ms: u64,
    percent_complete: Option<f64>,
) -> StepEffects {
    // The history keeps slim steps: the new one is judged as it will be kept.
    let slim = excerpt::slim(record);
    let rework = history::rework(&state.history, &slim);
    // References, not copies: the window is judged, never kept.
    let mut window: Vec<&StepRecord> = state.history.iter().collect();
    window.push(&slim);
    let total_wait = state.total_wait_ms
        + if record.waiting {
            record.duration_ms
        } else {
            0
        };
    let stuck = stuck::detect(stuck_config, &window, total_wait).map(|pattern| {
        let verdict = stuck::respond(&pattern, state.nudges_given);
        StuckFinding { pattern, verdict }
    });
    StepEffects {
        rework,
        stuck,
        signal: signal.or_else(|| sentinel::detect(&record.message)),
        elapsed_ms,
        new_cycle: None,
        percent_complete: percent_complete.or(state.percent_complete),
        budget_warnings: Vec::new(),
    }
}

/// Usage after a step.
pub fn usage_after(usage: &Usage, record: &StepRecord, elapsed_ms: u64) -> Usage {
    Usage {
        iterations: record.number,
        elapsed_ms,
        tokens: usage.tokens.saturating_add(record.tokens),
        consecutive_errors: if record.outcome == Outcome::Error {
            usage.consecutive_errors.saturating_add(1)
        } else {
            0
        },
        tool_calls: usage.tool_calls.saturating_add(record.tool_calls),
        // The commit adds the step's cost once it is priced.
        ..*usage
    }
}

/// Seconds left at the current velocity, from progress and running time.
pub fn eta_seconds(percent_complete: Option<f64>, elapsed_ms: u64) -> Option<f64> {
    let p = percent_complete?;
    if !(p > 0.0 && p < 100.0) {
        return (p >= 100.0).then_some(0.0);
    }
    let elapsed = elapsed_ms as f64 / 1000.0;
    Some(elapsed * (100.0 - p) / p)
}

impl LoopState {
    /// A fresh state for a new session reflecting every `reflection_interval` steps.
    pub fn new(reflection_interval: u32) -> LoopState {
        LoopState {
            run: 1,
            cycle: 1,
            reflection: ReflectionState::new(reflection_interval),
            ..LoopState::default()
        }
    }

    /// Folds one committed step (of run `run`) into the state.
    pub fn apply(&mut self, run: i32, record: &StepRecord, effects: &StepEffects) {
        self.usage = usage_after(&self.usage, record, effects.elapsed_ms);
        if run == self.run {
            self.steps_since_start += 1;
        } else {
            self.run = run;
            self.steps_since_start = 1;
            self.nudges_given = 0;
        }
        if record.waiting {
            self.total_wait_ms = self.total_wait_ms.saturating_add(record.duration_ms);
        }
        // A few KiB per step, whatever the agent sent: the window (and every
        // checkpoint, and the history sent to agents) stays small.
        self.history.push(excerpt::slim(record));
        self.rework.push(effects.rework.is_some());
        let excess = self.history.len().saturating_sub(HISTORY_WINDOW);
        self.history.drain(..excess);
        let excess = self.rework.len().saturating_sub(HISTORY_WINDOW);
        self.rework.drain(..excess);
        self.pending_nudge = None;
        match &effects.stuck {
            Some(StuckFinding {
                verdict: StuckVerdict::Nudge { message },
                ..
            }) => {
                self.nudges_given += 1;
                self.pending_nudge = Some(message.clone());
            }
            Some(StuckFinding {
                pattern,
                verdict: StuckVerdict::Pause,
            }) => {
                self.pending_end = Some(PendingEnd {
                    reason: Reason::Stuck,
                    detail: Some(pattern.describe()),
                    review_pending: false,
                });
            }
            None => {}
        }
        // An agent's own signal outranks a stuck verdict from the same step.
        if let Some(signal) = &effects.signal {
            self.pending_end = Some(PendingEnd {
                reason: match signal.kind {
                    SignalKind::Done => Reason::GoalAchieved,
                    SignalKind::Blocked => Reason::AgentBlocked,
                    SignalKind::AskUser => Reason::AskUser,
                    SignalKind::ApprovalRequired => Reason::ApprovalRequired,
                    SignalKind::WaitingForChildren => Reason::WaitingForChildren,
                },
                detail: signal.reason.clone(),
                review_pending: signal.kind == SignalKind::Done,
            });
        }
        if let Some(p) = effects.percent_complete
            && effects.percent_complete != self.percent_complete
        {
            // A new estimate: the rate is measured at the spend it came with.
            self.progress = Some(self.sample(p));
        }
        if effects.percent_complete.is_some() {
            self.percent_complete = effects.percent_complete;
        }
        self.progress_trail.push(ProgressPoint {
            tokens: self.usage.tokens,
            iterations: self.usage.iterations,
            sample: self.progress,
        });
        let excess = self.progress_trail.len().saturating_sub(HISTORY_WINDOW);
        self.progress_trail.drain(..excess);
        if let Some(cycle) = effects.new_cycle {
            self.cycle = cycle;
        }
        self.take_budget_warnings(&effects.budget_warnings);
    }

    /// Records the warnings a step crossed as sent, and tells the next step.
    fn take_budget_warnings(&mut self, warnings: &[BudgetWarning]) {
        self.budget_warnings_sent
            .extend(warnings.iter().map(|w| (w.budget, w.percent)));
        let steps = self.usage.iterations;
        let notes: Vec<String> = warnings
            .iter()
            .map(|w| soft_budget::wrap_up_note(w, steps))
            .collect();
        self.pending_budget_note = (!notes.is_empty()).then(|| notes.join(" "));
    }

    /// Folds a stored reflection into the state.
    pub fn apply_reflection(&mut self, applied: &AppliedReflection) {
        // Reflection tokens count against the session's budget like any other.
        let spent = applied
            .state_after
            .tokens
            .saturating_sub(self.reflection.tokens);
        self.usage.tokens = self.usage.tokens.saturating_add(spent);
        self.reflection = applied.state_after;
        if !applied.criteria.is_empty() {
            self.criteria = applied.criteria.clone();
        }
        if !applied.milestones.is_empty() {
            self.milestones = applied.milestones.clone();
        }
        if let Some(p) = applied.percent_complete {
            // Every reflection is a fresh estimate, even one that repeats the
            // last figure: no progress since then must raise the projection.
            self.progress = Some(self.sample(p));
            self.percent_complete = Some(p);
        }
        // The next gate evaluation sees the state after the reflection.
        if let Some(last) = self.progress_trail.last_mut() {
            last.tokens = self.usage.tokens;
            last.sample = self.progress;
        }
        let claim = self.pending_end.take_if(|e| e.review_pending);
        match &applied.verdict {
            Verdict::Complete => {
                self.pending_end = Some(PendingEnd {
                    reason: Reason::GoalAchieved,
                    detail: claim
                        .and_then(|c| c.detail)
                        .or_else(|| applied.reasoning.clone()),
                    review_pending: false,
                });
            }
            Verdict::Pause { reason } => {
                self.pending_end = Some(PendingEnd {
                    reason: *reason,
                    detail: applied.reasoning.clone(),
                    review_pending: false,
                });
            }
            Verdict::Reject { feedback } => {
                self.pending_nudge = Some(feedback.clone());
            }
            Verdict::Continue | Verdict::Monitor => {}
        }
    }

    /// The agent's done-claim awaiting the reflector's vote, if any.
    pub fn claim_under_review(&self) -> Option<&PendingEnd> {
        self.pending_end.as_ref().filter(|e| e.review_pending)
    }

    /// Counts the charges made outside the loop that the state has not
    /// seen yet (`charged`: their sum so far) in its token usage; returns
    /// how many tokens that added.
    pub fn absorb_charges(&mut self, charged: u64) -> u64 {
        let unseen = charged.saturating_sub(self.charges_seen);
        self.usage.tokens = self.usage.tokens.saturating_add(unseen);
        self.charges_seen = self.charges_seen.max(charged);
        unseen
    }

    /// Starts a new run after a person resumed the session: the step count,
    /// nudges, error streak and any unrecorded end start over.
    pub fn begin_run(&mut self, run: i32) {
        self.run = run;
        self.steps_since_start = 0;
        self.nudges_given = 0;
        self.pending_nudge = None;
        self.pending_end = None;
        self.usage.consecutive_errors = 0;
        // A person has looked: overruns seen before the resume no longer
        // count, and a wrap-up note may speak of limits since raised (the
        // thresholds sent stay sent: each warns once per session).
        self.progress_trail.clear();
        self.pending_budget_note = None;
    }

    fn sample(&self, percent_complete: f64) -> ProgressSample {
        ProgressSample {
            percent_complete,
            tokens: self.usage.tokens,
            iterations: self.usage.iterations,
        }
    }

    /// The gate's inputs for the next step of a session in `mode`.
    pub fn gate_inputs<'a>(
        &'a self,
        mode: Mode,
        limits: &Limits,
        token_deltas: &'a [u64],
    ) -> GateInputs<'a> {
        GateInputs {
            step: self.usage.iterations + 1,
            steps_since_start: self.steps_since_start,
            mode,
            review_every: limits.review_every,
            token_deltas,
            rework_flags: &self.rework,
            tool_calls: self.usage.tool_calls,
            coherence: None,
            uncertainty: None,
            budget: GateBudget {
                tokens_remaining: Some(guardrails::tokens_remaining(limits, &self.usage)),
                tool_calls_remaining: limits
                    .max_tool_calls
                    .map(|max| max.saturating_sub(self.usage.tool_calls)),
                time_remaining_ms: Some(guardrails::time_remaining_ms(limits, &self.usage)),
            },
            last_checkpoint_step: self.last_checkpoint_step,
            progress_trail: &self.progress_trail,
        }
    }

    /// Per-step token deltas of the recent steps, oldest first.
    pub fn token_deltas(&self) -> Vec<u64> {
        self.history.iter().map(|s| s.tokens).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_absorbed_once_and_saturate() {
        let mut state = LoopState::new(0);
        state.usage.tokens = 100;
        assert_eq!(state.absorb_charges(30), 30);
        assert_eq!(state.usage.tokens, 130);
        // The same sum again adds nothing; only what is new counts.
        assert_eq!(state.absorb_charges(30), 0);
        assert_eq!(state.absorb_charges(45), 15);
        assert_eq!(state.usage.tokens, 145);
        // A smaller sum than seen (never written so) adds nothing.
        assert_eq!(state.absorb_charges(10), 0);
        assert_eq!(state.charges_seen, 45);
        state.usage.tokens = u64::MAX - 1;
        state.absorb_charges(1_000);
        assert_eq!(state.usage.tokens, u64::MAX);
    }
    use crate::policy::history::tests::step;

    fn effects(elapsed_ms: u64) -> StepEffects {
        StepEffects {
            rework: None,
            stuck: None,
            signal: None,
            elapsed_ms,
            new_cycle: None,
            percent_complete: None,
            budget_warnings: Vec::new(),
        }
    }

    #[test]
    fn a_crossed_threshold_is_recorded_once_and_told_to_the_next_step_only() {
        let mut s = LoopState::new(10);
        let warning = BudgetWarning {
            budget: Budget::Iterations,
            percent: 50,
            used: 1.into(),
            limit: 2.into(),
        };
        let crossed = StepEffects {
            budget_warnings: vec![warning],
            ..effects(10)
        };
        s.apply(1, &step(1, "a"), &crossed);
        assert_eq!(s.budget_warnings_sent, vec![(Budget::Iterations, 50)]);
        let note = s.pending_budget_note.clone().expect("a note");
        assert!(note.contains("50% of the iteration budget"), "{note}");
        s.apply(1, &step(2, "b"), &effects(20));
        assert_eq!(s.pending_budget_note, None, "told once");
        assert_eq!(s.budget_warnings_sent.len(), 1);
        s.pending_budget_note = Some(note);
        s.begin_run(2);
        assert_eq!(s.pending_budget_note, None, "a person has looked");
        assert_eq!(s.budget_warnings_sent.len(), 1, "sent survives a resume");
    }

    #[test]
    fn apply_accumulates_usage_and_bounds_history() {
        let mut s = LoopState::new(10);
        for n in 1..=25 {
            let mut r = step(n, &format!("a{n}"));
            r.tokens = 10;
            r.tool_calls = 2;
            s.apply(1, &r, &effects(n * 100));
        }
        assert_eq!(s.usage.iterations, 25);
        assert_eq!(s.usage.tokens, 250);
        assert_eq!(s.usage.tool_calls, 50);
        assert_eq!(s.usage.elapsed_ms, 2500);
        assert_eq!(s.steps_since_start, 25);
        assert_eq!(s.history.len(), HISTORY_WINDOW);
        assert_eq!(s.rework.len(), HISTORY_WINDOW);
        assert_eq!(s.history[0].number, 6);
    }

    #[test]
    fn error_streak_counts_errors_and_resets_on_success() {
        let mut s = LoopState::new(10);
        let mut e = step(1, "a");
        e.outcome = Outcome::Error;
        s.apply(1, &e, &effects(1));
        e.number = 2;
        s.apply(1, &e, &effects(2));
        assert_eq!(s.usage.consecutive_errors, 2);
        let mut f = step(3, "b");
        f.outcome = Outcome::Failure;
        s.apply(1, &f, &effects(3));
        assert_eq!(s.usage.consecutive_errors, 0);
    }

    #[test]
    fn a_new_run_restarts_the_step_count() {
        let mut s = LoopState::new(10);
        s.apply(1, &step(1, "a"), &effects(1));
        s.apply(1, &step(2, "b"), &effects(2));
        s.begin_run(2);
        assert_eq!(s.steps_since_start, 0);
        s.apply(2, &step(3, "c"), &effects(3));
        assert_eq!(s.steps_since_start, 1);
        assert_eq!(s.usage.iterations, 3);
    }

    #[test]
    fn sentinel_sets_the_pending_end() {
        let mut s = LoopState::new(10);
        let mut r = step(1, "a");
        r.message = "done\n<<WARDEN_GOAL_DONE: shipped>>".into();
        let e = assess(&s, &r, None, &StuckConfig::default(), 5, None);
        s.apply(1, &r, &e);
        assert_eq!(
            s.pending_end,
            Some(PendingEnd {
                reason: Reason::GoalAchieved,
                detail: Some("shipped".into()),
                review_pending: true,
            })
        );
        s.begin_run(2);
        assert_eq!(s.pending_end, None);
    }

    #[test]
    fn stuck_nudges_once_then_pauses() {
        let cfg = StuckConfig::default();
        let mut s = LoopState::new(10);
        let mut saw_nudge = false;
        for n in 1..=6 {
            let mut r = step(n, "run_tests");
            r.outcome = Outcome::Failure;
            r.error = Some(format!("failure {n}"));
            let e = assess(&s, &r, None, &cfg, n, None);
            s.apply(1, &r, &e);
            if s.pending_nudge.is_some() {
                saw_nudge = true;
            }
            if s.pending_end.is_some() {
                break;
            }
        }
        assert!(saw_nudge);
        assert_eq!(s.nudges_given, 1);
        assert_eq!(s.pending_end.map(|e| e.reason), Some(Reason::Stuck));
    }

    #[test]
    fn replaying_from_a_snapshot_equals_the_live_state() {
        let cfg = StuckConfig::default();
        let mut live = LoopState::new(10);
        let mut log = Vec::new();
        let mut snapshot = None;
        for n in 1..=12 {
            let mut r = step(n, if n % 3 == 0 { "x" } else { "y" });
            r.arguments = serde_json::json!({ "n": n % 4 });
            let e = assess(&live, &r, None, &cfg, n * 7, Some(n as f64));
            live.apply(1, &r, &e);
            log.push((r, e));
            if n == 5 {
                snapshot = Some(serde_json::to_value(&live).unwrap());
            }
        }
        let mut rebuilt: LoopState = serde_json::from_value(snapshot.unwrap()).unwrap();
        for (r, e) in &log[5..] {
            rebuilt.apply(1, r, e);
        }
        assert_eq!(rebuilt, live);
    }

    #[test]
    fn reflection_verdicts_settle_the_agent_claim() {
        let mut s = LoopState::new(10);
        let claim = PendingEnd {
            reason: Reason::GoalAchieved,
            detail: Some("done".into()),
            review_pending: true,
        };
        let applied = |verdict| AppliedReflection {
            verdict,
            state_after: ReflectionState::new(5),
            percent_complete: Some(60.0),
            reasoning: Some("tests still fail".into()),
            criteria: Vec::new(),
            milestones: Vec::new(),
        };
        s.pending_end = Some(claim.clone());
        s.apply_reflection(&applied(Verdict::Reject {
            feedback: "not yet".into(),
        }));
        assert_eq!(s.pending_end, None);
        assert_eq!(s.pending_nudge.as_deref(), Some("not yet"));
        assert_eq!(s.percent_complete, Some(60.0));
        assert_eq!(s.reflection.interval, 5);

        s.pending_end = Some(claim.clone());
        s.apply_reflection(&applied(Verdict::Complete));
        let end = s.pending_end.clone().unwrap();
        assert_eq!(end.reason, Reason::GoalAchieved);
        assert_eq!(end.detail.as_deref(), Some("done"));
        assert!(!end.review_pending);

        s.pending_end = None;
        s.apply_reflection(&applied(Verdict::Pause {
            reason: Reason::SlowProgress,
        }));
        assert_eq!(s.pending_end.unwrap().reason, Reason::SlowProgress);
    }

    #[test]
    fn progress_estimates_carry_the_spend_they_were_measured_at() {
        let mut s = LoopState::new(10);
        let mut fx = effects(1);
        fx.percent_complete = Some(10.0);
        s.apply(1, &step(1, "a"), &fx);
        let first = ProgressSample {
            percent_complete: 10.0,
            tokens: 100,
            iterations: 1,
        };
        assert_eq!(s.progress, Some(first));
        // The same figure carried to the next step is not a new estimate.
        s.apply(1, &step(2, "b"), &fx);
        assert_eq!(s.progress, Some(first));
        fx.percent_complete = Some(20.0);
        s.apply(1, &step(3, "c"), &fx);
        assert_eq!(s.progress.map(|p| p.tokens), Some(300));
        // A reflection is always a new estimate, its own tokens included.
        let mut after = s.reflection;
        after.tokens += 50;
        s.apply_reflection(&AppliedReflection {
            verdict: Verdict::Continue,
            state_after: after,
            percent_complete: Some(20.0),
            reasoning: None,
            criteria: Vec::new(),
            milestones: Vec::new(),
        });
        assert_eq!(
            s.progress,
            Some(ProgressSample {
                percent_complete: 20.0,
                tokens: 350,
                iterations: 3,
            })
        );
    }

    #[test]
    fn the_progress_trail_follows_steps_and_reflections() {
        let mut s = LoopState::new(10);
        let mut fx = effects(1);
        fx.percent_complete = Some(25.0);
        s.apply(1, &step(1, "a"), &fx);
        s.apply(1, &step(2, "b"), &fx);
        assert_eq!(s.progress_trail.len(), 2);
        assert_eq!(s.progress_trail[1].tokens, 200);
        let p = s.progress_trail[1].projection().unwrap();
        // 25 % after 100 tokens: 400 in all, 200 spent.
        assert_eq!((p.tokens_to_finish, p.iterations_to_finish), (200, 2));
        // A reflection updates the newest point: the next evaluation sees it.
        let mut after = s.reflection;
        after.tokens += 50;
        s.apply_reflection(&AppliedReflection {
            verdict: Verdict::Continue,
            state_after: after,
            percent_complete: Some(50.0),
            reasoning: None,
            criteria: Vec::new(),
            milestones: Vec::new(),
        });
        assert_eq!(s.progress_trail.len(), 2);
        assert_eq!(s.progress_trail[1].tokens, 250);
        assert_eq!(
            s.progress_trail[1].sample.map(|p| p.percent_complete),
            Some(50.0)
        );
        let limits = crate::policy::guardrails::tests::roomy();
        assert_eq!(
            s.gate_inputs(Mode::Fixed, &limits, &[])
                .progress_trail
                .len(),
            2
        );
        // The trail is bounded like the history, and a resume clears it.
        for n in 3..=30 {
            s.apply(1, &step(n, &format!("a{n}")), &fx);
        }
        assert_eq!(s.progress_trail.len(), HISTORY_WINDOW);
        s.begin_run(2);
        assert!(s.progress_trail.is_empty());
    }

    #[test]
    fn eta_follows_velocity() {
        assert_eq!(eta_seconds(None, 1000), None);
        assert_eq!(eta_seconds(Some(0.0), 1000), None);
        assert_eq!(eta_seconds(Some(25.0), 10_000), Some(30.0));
        assert_eq!(eta_seconds(Some(100.0), 10_000), Some(0.0));
    }
}
