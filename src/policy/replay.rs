//! Policy replay (what-if): the pure policy rerun over a session's recorded
//! steps and reflections under other thresholds, without a model call or a
//! write. The replay walks the loop's passes as the runner does — recorded
//! reflections, ends already decided, guardrails, the continue gate, then
//! the recorded step, judged again by stuck detection — and says where the
//! session would have ended or paused, and why.
//!
//! What the record cannot tell is said, not guessed: a policy that would
//! have let the session run past its last recorded step ends "beyond the
//! record", and a reflection the new interval makes due where none ran is
//! counted as unrecorded (its answer was never asked for). Ends no policy
//! decides (a user's stop or pause, an internal error, an exhausted script)
//! are carried over from the record when the replay reaches them.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::policy::checklist;
use crate::policy::delegation::{self, ChildPausePolicy};
use crate::policy::gate::{self, GateConfig, GateDecision, PauseCause, StopCause};
use crate::policy::guardrails::{self, LimitOutOfRange, Limits, LimitsPatch};
use crate::policy::history::StepRecord;
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::loop_state::{self, AppliedReflection, LoopState, StepEffects};
use crate::policy::reflection::{self, Assessment, ReflectionState, Trigger, Verdict};
use crate::policy::stuck::{StuckConfig, StuckVerdict};

/// The most sessions one replay request takes.
pub const MAX_SESSIONS: usize = 10_000;

/// The range of every override field: (schema, field, min, max), as
/// [`PolicyOverride::apply`] checks them and the OpenAPI document states them.
pub const RANGES: [(&str, &str, f64, f64); 17] = [
    ("GatePatch", "coherence_min", 0.0, 1.0),
    ("GatePatch", "review_every", 0.0, 1_000_000.0),
    ("GatePatch", "rework_max", 0.0, 1.0),
    ("GatePatch", "rework_window", 1.0, 20.0),
    ("GatePatch", "uncertainty_max", 0.0, 1.0),
    ("GatePatch", "slope_max", 0.0, 100.0),
    ("GatePatch", "slope_window", 2.0, 20.0),
    ("GatePatch", "checkpoint_every", 1.0, 1_000_000.0),
    ("GatePatch", "projection_margin", 1.0, 1_000.0),
    ("GatePatch", "projection_evaluations", 1.0, 1_000.0),
    ("StuckPatch", "same_observation", 2.0, 20.0),
    ("StuckPatch", "same_error", 2.0, 20.0),
    ("StuckPatch", "same_message", 2.0, 20.0),
    ("StuckPatch", "alternation", 4.0, 20.0),
    ("StuckPatch", "overflow_window", 1.0, 20.0),
    ("StuckPatch", "overflow_repeats", 1.0, 20.0),
    ("StuckPatch", "max_total_wait_ms", 1.0, 2_592_000_000.0),
];

/// Overrides of the continue gate's thresholds; a field left out keeps the
/// server's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GatePatch {
    /// Stop when coherence is below this (0 – 1).
    pub coherence_min: Option<f64>,
    /// Default review point of continuous sessions that set none (0 – 1,000,000; 0 = never).
    pub review_every: Option<u64>,
    /// Pause when the rework ratio exceeds this (0 – 1).
    pub rework_max: Option<f64>,
    /// Steps over which the rework ratio is measured (1 – 20).
    pub rework_window: Option<usize>,
    /// Pause when uncertainty exceeds this (0 – 1).
    pub uncertainty_max: Option<f64>,
    /// Throttle above this relative spend slope per step (0 – 100).
    pub slope_max: Option<f64>,
    /// Steps over which the spend slope is fitted (2 – 20).
    pub slope_window: Option<usize>,
    /// Force a checkpoint after this many steps without one (1 – 1,000,000).
    pub checkpoint_every: Option<u64>,
    /// Pause when finishing is projected to need more than this factor of the tokens left (1 – 1,000).
    pub projection_margin: Option<f64>,
    /// ...for this many evaluations in a row (1 – 1,000).
    pub projection_evaluations: Option<u32>,
}

/// Overrides of stuck detection's windows; a field left out keeps the server's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StuckPatch {
    /// Same action, arguments and observation this many times in a row (2 – 20).
    pub same_observation: Option<usize>,
    /// Same failing action this many times in a row (2 – 20).
    pub same_error: Option<usize>,
    /// Same message in steps without an action this many times in a row (2 – 20).
    pub same_message: Option<usize>,
    /// A,B,A,B… over this many steps (4 – 20).
    pub alternation: Option<usize>,
    /// Steps looked at for context-overflow wrap-ups (1 – 20).
    pub overflow_window: Option<usize>,
    /// Wrap-ups within that window that are stuck (1 – 20).
    pub overflow_repeats: Option<usize>,
    /// Cap on the total time in waiting steps, ms (1 – 2,592,000,000).
    pub max_total_wait_ms: Option<u64>,
}

/// A policy override: budgets, the reflection interval and review points
/// (`limits`, as a resume takes them), the gate's thresholds, stuck
/// detection's windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    /// Limits over each session's own (budgets, `reflection_interval`, `review_every`).
    #[serde(default)]
    pub limits: LimitsPatch,
    /// Gate thresholds over the server's.
    #[serde(default)]
    pub gate: GatePatch,
    /// Stuck-detection windows over the server's.
    #[serde(default)]
    pub stuck: StuckPatch,
}

/// The policy a replay runs: thresholds and a session's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// The gate's thresholds.
    pub gate: GateConfig,
    /// Stuck detection's windows.
    pub stuck: StuckConfig,
    /// The session's limits.
    pub limits: Limits,
    /// Reflections run where the interval makes them due (an overridden
    /// interval), not where they were recorded.
    pub reflect_when_due: bool,
}

impl Policy {
    /// The policy a session ran under: the server's thresholds, its limits.
    pub fn recorded(gate: GateConfig, stuck: StuckConfig, limits: Limits) -> Policy {
        Policy {
            gate,
            stuck,
            limits,
            reflect_when_due: false,
        }
    }
}

/// A value outside its range, as [`LimitOutOfRange`] says it.
fn out_of_range<T: ToString>(
    field: &'static str,
    value: T,
    min: &str,
    max: &str,
) -> LimitOutOfRange {
    LimitOutOfRange {
        field,
        value: value.to_string(),
        min: min.into(),
        max: max.into(),
    }
}

fn fraction(
    field: &'static str,
    v: Option<f64>,
    to: &mut f64,
    max: f64,
) -> Result<(), LimitOutOfRange> {
    if let Some(v) = v {
        if !(v.is_finite() && (0.0..=max).contains(&v)) {
            return Err(out_of_range(field, v, "0", &max.to_string()));
        }
        *to = v;
    }
    Ok(())
}

fn count<T: Copy + PartialOrd + ToString>(
    field: &'static str,
    v: Option<T>,
    to: &mut T,
    (min, max): (T, T),
) -> Result<(), LimitOutOfRange> {
    if let Some(v) = v {
        if v < min || v > max {
            return Err(out_of_range(field, v, &min.to_string(), &max.to_string()));
        }
        *to = v;
    }
    Ok(())
}

impl PolicyOverride {
    /// `base` with this override applied, after range checks.
    pub fn apply(&self, base: &Policy) -> Result<Policy, LimitOutOfRange> {
        let gate = self.gate.apply(base.gate)?;
        let stuck = self.stuck.apply(base.stuck)?;
        Ok(Policy {
            gate,
            stuck,
            limits: base.limits.apply(&self.limits)?,
            reflect_when_due: base.reflect_when_due || self.limits.reflection_interval.is_some(),
        })
    }
}

impl GatePatch {
    /// The server's gate thresholds with this patch laid over, each checked.
    fn apply(&self, base: GateConfig) -> Result<GateConfig, LimitOutOfRange> {
        let window = loop_state::HISTORY_WINDOW;
        let mut gate = base;
        let g = self;
        fraction(
            "coherence_min",
            g.coherence_min,
            &mut gate.coherence_min,
            1.0,
        )?;
        fraction("rework_max", g.rework_max, &mut gate.rework_max, 1.0)?;
        fraction(
            "uncertainty_max",
            g.uncertainty_max,
            &mut gate.uncertainty_max,
            1.0,
        )?;
        fraction("slope_max", g.slope_max, &mut gate.slope_max, 100.0)?;
        count(
            "review_every",
            g.review_every,
            &mut gate.review_every,
            (0, 1_000_000),
        )?;
        count(
            "rework_window",
            g.rework_window,
            &mut gate.rework_window,
            (1, window),
        )?;
        count(
            "slope_window",
            g.slope_window,
            &mut gate.slope_window,
            (2, window),
        )?;
        count(
            "checkpoint_every",
            g.checkpoint_every,
            &mut gate.checkpoint_every,
            (1, 1_000_000),
        )?;
        count(
            "projection_evaluations",
            g.projection_evaluations,
            &mut gate.projection_evaluations,
            (1, 1_000),
        )?;
        if let Some(m) = g.projection_margin {
            if !(m.is_finite() && (1.0..=1_000.0).contains(&m)) {
                return Err(out_of_range("projection_margin", m, "1", "1000"));
            }
            gate.projection_margin = m;
        }
        Ok(gate)
    }
}

impl StuckPatch {
    /// The server's stuck windows with this patch laid over, each checked.
    fn apply(&self, base: StuckConfig) -> Result<StuckConfig, LimitOutOfRange> {
        let window = loop_state::HISTORY_WINDOW;
        let mut stuck = base;
        let s = self;
        count(
            "same_observation",
            s.same_observation,
            &mut stuck.same_observation,
            (2, window),
        )?;
        count(
            "same_error",
            s.same_error,
            &mut stuck.same_error,
            (2, window),
        )?;
        count(
            "same_message",
            s.same_message,
            &mut stuck.same_message,
            (2, window),
        )?;
        count(
            "alternation",
            s.alternation,
            &mut stuck.alternation,
            (4, window),
        )?;
        count(
            "overflow_window",
            s.overflow_window,
            &mut stuck.overflow_window,
            (1, window),
        )?;
        count(
            "overflow_repeats",
            s.overflow_repeats,
            &mut stuck.overflow_repeats,
            (1, window),
        )?;
        count(
            "max_total_wait_ms",
            s.max_total_wait_ms,
            &mut stuck.max_total_wait_ms,
            (1, 2_592_000_000),
        )?;
        Ok(stuck)
    }
}

/// One committed step as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedStep {
    /// The run it belongs to (a person's resume starts the next).
    pub run: i32,
    /// What the step did.
    pub record: StepRecord,
    /// What the policies concluded from it then (its signal, progress,
    /// cycle change and warnings are taken as recorded).
    pub effects: StepEffects,
    /// What it cost; `None` for a step of a model no price entry prices.
    pub cost_usd: Option<Decimal>,
}

/// One reflection as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedReflection {
    /// The iteration it followed.
    pub after_iteration: u64,
    /// Its assessment; `None` for a failed reflection.
    pub assessment: Option<Assessment>,
    /// Why it failed, for a failed one.
    pub error: Option<String>,
    /// Tokens it spent.
    pub tokens: u64,
}

/// How a session ended, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RecordedEnd {
    /// Its status.
    pub status: Status,
    /// Why.
    pub reason: Option<Reason>,
    /// Iterations committed.
    pub iterations: u64,
    /// Tokens used.
    pub tokens: u64,
    /// What it cost, USD.
    #[schema(value_type = String)]
    pub cost_usd: Decimal,
    /// Running time, ms.
    #[serde(skip)]
    pub elapsed_ms: u64,
    /// Its latest run.
    #[serde(skip)]
    pub run: i32,
}

/// Everything a replay reads of one ended session.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    /// The state it started with (checklists, refinement tokens, cycle).
    pub start: LoopState,
    /// Fixed or continuous.
    pub mode: Mode,
    /// It delegated to child sessions: an end on their results (every one
    /// failed: `agent_blocked`) is decided from their rows, and taken from the record.
    pub has_children: bool,
    /// Delegated by a parent, and its tree's rule for a child that would wait.
    pub tree: (bool, ChildPausePolicy),
    /// USD per million tokens its model's steps are reserved at (the
    /// money budget's allowance); `None` when no price is in force.
    pub money_rate: Option<Decimal>,
    /// Its committed steps, in order.
    pub steps: Vec<RecordedStep>,
    /// Its reflections, in order.
    pub reflections: Vec<RecordedReflection>,
    /// Tokens charged outside its loop (steps cut short).
    pub tokens_charged: u64,
    /// How it ended.
    pub end: RecordedEnd,
}

/// Who decided a replayed end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The replayed policy.
    Policy,
    /// The record: an end no policy decides (a user's stop, an error).
    Record,
    /// Nothing: the policy would have run past the last recorded step.
    BeyondRecord,
}

/// One decision of a replay, at the iteration it was taken after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
// Named apart from the session's allowed `Action`s in the document.
#[schema(as = ReplayAction)]
pub enum Action {
    /// The continue gate's decision to go on (`continue`, `throttle`, `checkpoint`).
    Gate {
        /// Its name.
        decision: String,
    },
    /// Stuck detection nudged the agent.
    Nudge,
    /// A reflection's verdict (`complete`, `pause`, `reject`, `continue`, `monitor`).
    Reflection {
        /// Its name.
        verdict: String,
    },
    /// A recorded reflection the policy's interval would not have run.
    ReflectionSkipped,
    /// The session ended or paused.
    End {
        /// Status.
        status: Status,
        /// Why.
        reason: Reason,
    },
    /// A person resumed the session (as recorded).
    Resume {
        /// The run it started.
        run: i32,
    },
}

/// A decision and the iteration it followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
// Named apart from an approval's `Decision` in the document.
#[schema(as = ReplayDecision)]
pub struct Decision {
    /// Iterations committed when it was taken.
    pub iteration: u64,
    /// What was decided.
    pub action: Action,
}

/// Where a replay ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replayed {
    /// Status it would have had; `null` beyond the record.
    pub status: Option<Status>,
    /// Why.
    pub reason: Option<Reason>,
    /// Iterations it would have run (beyond the record: at least this many).
    pub iterations: u64,
    /// Tokens it would have used, by the replay's own count.
    pub tokens: u64,
    /// What it would have cost, USD, by the replay's own count.
    #[schema(value_type = String)]
    pub cost_usd: Decimal,
    /// Who decided the end.
    pub ended_by: EndedBy,
    /// The end's detail (the stuck pattern, the projection).
    pub detail: Option<String>,
    /// Recorded reflections run, and those skipped by the interval.
    pub reflections: (u32, u32),
    /// Reflections the interval made due where none was recorded.
    pub reflections_unrecorded: u32,
    /// Every decision taken, oldest first.
    #[serde(skip)]
    pub decisions: Vec<Decision>,
}

/// Whether an end is one no policy decides: the replay takes it from the record.
pub fn external(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::UserStop
            | Reason::UserPause
            | Reason::InternalError
            | Reason::SecretUnreadable
            | Reason::ExecutorExhausted
            | Reason::NoWorker
            | Reason::ParentEnded
            | Reason::ConfirmationExpired
    )
}

/// The end a gate stop records.
fn stop_reason(cause: StopCause) -> Reason {
    match cause {
        StopCause::CoherenceLow => Reason::CoherenceLow,
        StopCause::StepLimit => Reason::StepLimit,
        StopCause::BudgetExhausted { .. } => Reason::BudgetExhausted,
    }
}

/// The end a gate pause records.
fn pause_reason(cause: PauseCause) -> Reason {
    match cause {
        PauseCause::ReworkLoop => Reason::ReworkLoop,
        PauseCause::Uncertainty => Reason::Uncertainty,
        PauseCause::ProjectedOverrun | PauseCause::NextStepOverrun => {
            Reason::BudgetProjectedOverrun
        }
        PauseCause::ReviewRequired => Reason::ReviewRequired,
    }
}

/// A verdict's name.
fn verdict_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Complete => "complete",
        Verdict::Pause { .. } => "pause",
        Verdict::Reject { .. } => "reject",
        Verdict::Continue => "continue",
        Verdict::Monitor => "monitor",
    }
}

/// The replay of one recording under one policy.
struct Sim<'a> {
    rec: &'a Recording,
    policy: &'a Policy,
    state: LoopState,
    next_reflection: usize,
    decisions: Vec<Decision>,
    reflections: (u32, u32),
    unrecorded: u32,
}

/// Replays `rec` under `policy`: where it ends and every decision on the way.
pub fn run(rec: &Recording, policy: &Policy) -> Replayed {
    let mut state = rec.start.clone();
    if policy.reflect_when_due && state.reflection.count == 0 {
        state.reflection = ReflectionState::new(policy.limits.reflection_interval);
    }
    let sim = Sim {
        rec,
        policy,
        state,
        next_reflection: 0,
        decisions: Vec::with_capacity(rec.steps.len() * 2 + 2),
        reflections: (0, 0),
        unrecorded: 0,
    };
    sim.walk()
}

impl Sim<'_> {
    fn decide(&mut self, iteration: u64, action: Action) {
        self.decisions.push(Decision { iteration, action });
    }

    /// The passes: after `i` committed steps, the checks before step `i + 1`.
    fn walk(mut self) -> Replayed {
        let n = self.rec.steps.len();
        for i in 0..=n {
            let point = i as u64;
            let next_run = match self.rec.steps.get(i) {
                Some(step) => step.run,
                None => self.rec.end.run,
            };
            self.reflect(point);
            let resumed = next_run > self.state.run;
            if let Some((reason, detail)) = self.checks(point, i == n) {
                if !resumed {
                    return self.ended(point, (reason, detail), EndedBy::Policy);
                }
                // Recorded as it was: the session waited here, then went on.
                let status = delegation::run_end_status(reason, self.rec.tree.0, self.rec.tree.1);
                self.decide(point, Action::End { status, reason });
            }
            if resumed {
                // A person resumed here (as recorded): the run starts over,
                // and its first pass checks again.
                self.state.begin_run(next_run);
                self.decide(point, Action::Resume { run: next_run });
                if let Some(end) = self.checks(point, i == n) {
                    return self.ended(point, end, EndedBy::Policy);
                }
            }
            if let Some(step) = self.rec.steps.get(i) {
                self.step(step);
            }
        }
        self.out_of_record(n as u64)
    }

    /// Runs the recorded reflections after `point` the policy runs.
    fn reflect(&mut self, point: u64) {
        let mut ran = false;
        while let Some(r) = self.rec.reflections.get(self.next_reflection) {
            if r.after_iteration > point {
                break;
            }
            self.next_reflection += 1;
            if self.policy.reflect_when_due && self.due(point).is_none() {
                self.reflections.1 += 1;
                self.decide(point, Action::ReflectionSkipped);
                continue;
            }
            ran = true;
            let applied = self.redecide(point, r);
            self.reflections.0 += 1;
            let verdict = verdict_name(&applied.verdict).to_string();
            self.decide(point, Action::Reflection { verdict });
            self.state.apply_reflection(&applied);
        }
        if self.policy.reflect_when_due && !ran && self.due(point).is_some() {
            // It would have run here: its answer is unknown, so it decides
            // nothing, but the interval counts from it.
            self.unrecorded += 1;
            self.state.reflection.last_at = point;
        }
    }

    /// Whether a reflection is due after `point` steps, as the runner asks.
    fn due(&self, point: u64) -> Option<Trigger> {
        if self.rec.mode != Mode::Continuous {
            return None;
        }
        let claim = self.state.claim_under_review().is_some();
        if !claim && (point == 0 || point <= self.state.reflection.last_at) {
            return None;
        }
        reflection::due(&self.state.reflection, point, claim)
    }

    /// What the reflection policy decides from a recorded answer now.
    fn redecide(&self, point: u64, r: &RecordedReflection) -> AppliedReflection {
        let claim = self
            .state
            .claim_under_review()
            .map(|c| c.detail.clone().unwrap_or_default());
        let trigger = if claim.is_some() {
            Trigger::AgentClaimedDone
        } else {
            Trigger::Interval
        };
        let base = self.policy.limits.reflection_interval;
        let prior = self.state.reflection;
        match &r.assessment {
            Some(a) => {
                let criteria = checklist::mark(&self.state.criteria, &a.criteria_met, point);
                let milestones = checklist::mark(&self.state.milestones, &a.milestones_done, point);
                let unmet = checklist::unmet(&criteria);
                let (verdict, state_after) =
                    reflection::decide(&prior, a, &unmet, trigger, base, point, r.tokens);
                AppliedReflection {
                    verdict,
                    state_after,
                    percent_complete: Some(a.percent_complete),
                    reasoning: Some(a.reasoning.clone()),
                    criteria,
                    milestones,
                }
            }
            None => {
                let (verdict, state_after) =
                    reflection::on_failure(&prior, trigger, base, point, r.tokens);
                let reasoning = match verdict {
                    Verdict::Pause { .. } => r.error.clone(),
                    _ => claim,
                };
                AppliedReflection {
                    verdict,
                    state_after,
                    percent_complete: None,
                    reasoning,
                    criteria: self.state.criteria.clone(),
                    milestones: self.state.milestones.clone(),
                }
            }
        }
    }

    /// The checks of a pass before a step: ends already decided, the cycle
    /// limit, the guardrails, the gate. `last`: no recorded step follows,
    /// so the wall clock is the recorded end's.
    fn checks(&mut self, point: u64, last: bool) -> Option<(Reason, Option<String>)> {
        let limits = self.policy.limits;
        if let Some(end) = &self.state.pending_end {
            return Some((end.reason, end.detail.clone()));
        }
        if self.state.cycle > limits.max_cycles {
            return Some((Reason::CycleLimit, None));
        }
        let mut usage = self.state.usage;
        if last {
            usage.elapsed_ms = usage.elapsed_ms.max(self.rec.end.elapsed_ms);
        }
        if let Some(breach) = guardrails::check(&limits, &usage) {
            return Some((breach.reason(), breach.describe(&limits, &usage)));
        }
        let deltas = self.state.token_deltas();
        let mut inputs = self.state.gate_inputs(self.rec.mode, &limits, &deltas);
        inputs.budget.time_remaining_ms = Some(guardrails::time_remaining_ms(&limits, &usage));
        if let Some(left) = guardrails::cost_remaining(&limits, &usage) {
            let money = self.rec.money_rate.map_or(0, |rate| {
                crate::policy::budget::affordable_tokens(left, rate)
            });
            if inputs.budget.tokens_remaining.is_some_and(|t| money < t) {
                inputs.budget.tokens_remaining = Some(money);
            }
        }
        inputs.coherence = self.state.reflection.coherence;
        inputs.uncertainty = self.state.reflection.uncertainty;
        let evaluation = gate::evaluate(&self.policy.gate, &inputs);
        let name = match evaluation.decision {
            GateDecision::Stop { cause } => return Some((stop_reason(cause), None)),
            GateDecision::Pause { cause } => {
                let detail = evaluation.metrics.projection.map(|p| p.describe());
                return Some((pause_reason(cause), detail));
            }
            GateDecision::Checkpoint => {
                self.state.last_checkpoint_step = point;
                "checkpoint"
            }
            GateDecision::Throttle => "throttle",
            GateDecision::Continue => "continue",
        };
        let decision = name.to_string();
        self.decide(point, Action::Gate { decision });
        None
    }

    /// Folds a recorded step in, judged again by stuck detection.
    fn step(&mut self, step: &RecordedStep) {
        let recorded = &step.effects;
        let mut effects = loop_state::assess(
            &self.state,
            &step.record,
            recorded.signal.clone(),
            &self.policy.stuck,
            recorded.elapsed_ms,
            recorded.percent_complete,
        );
        effects.new_cycle = recorded.new_cycle;
        effects.budget_warnings = recorded.budget_warnings.clone();
        if let Some(finding) = &effects.stuck
            && matches!(finding.verdict, StuckVerdict::Nudge { .. })
        {
            self.decide(step.record.number, Action::Nudge);
        }
        self.state.apply(step.run, &step.record, &effects);
        match step.cost_usd {
            Some(usd) => self.state.usage.cost_usd = self.state.usage.cost_usd.saturating_add(usd),
            None => {
                self.state.usage.unpriced_steps = self.state.usage.unpriced_steps.saturating_add(1)
            }
        }
        let every = u64::from(self.policy.limits.checkpoint_interval.max(1));
        let done = self.state.usage.iterations;
        if done > 0
            && done.is_multiple_of(every)
            && self.state.last_checkpoint_step < done
            && self.state.pending_end.is_none()
        {
            self.state.last_checkpoint_step = done;
        }
    }

    /// The replay ends at `point` for `reason`.
    fn ended(
        mut self,
        point: u64,
        (reason, detail): (Reason, Option<String>),
        by: EndedBy,
    ) -> Replayed {
        let (is_child, on_pause) = self.rec.tree;
        let status = delegation::run_end_status(reason, is_child, on_pause);
        self.decide(point, Action::End { status, reason });
        self.finish(Some(status), Some(reason), point, by, detail)
    }

    /// Every recorded step ran and the policy decided no end: the record's
    /// own end when no policy decides it, else the replay runs beyond it.
    fn out_of_record(self, n: u64) -> Replayed {
        match self.rec.end.reason {
            Some(reason) if external(reason) => self.ended(n, (reason, None), EndedBy::Record),
            Some(Reason::AgentBlocked) if self.rec.has_children => {
                self.ended(n, (Reason::AgentBlocked, None), EndedBy::Record)
            }
            None if self.rec.end.status != Status::Running => {
                let status = self.rec.end.status;
                self.finish(Some(status), None, n, EndedBy::Record, None)
            }
            _ => self.finish(None, None, n, EndedBy::BeyondRecord, None),
        }
    }

    fn finish(
        mut self,
        status: Option<Status>,
        reason: Option<Reason>,
        iterations: u64,
        ended_by: EndedBy,
        detail: Option<String>,
    ) -> Replayed {
        if iterations == self.rec.steps.len() as u64 {
            // Charges of steps cut short land with the run's end.
            self.state.absorb_charges(self.rec.tokens_charged);
        }
        Replayed {
            status,
            reason,
            iterations,
            tokens: self.state.usage.tokens,
            cost_usd: self.state.usage.cost_usd,
            ended_by,
            detail,
            reflections: self.reflections,
            reflections_unrecorded: self.unrecorded,
            decisions: self.decisions,
        }
    }
}

/// How a replayed end compares with the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Fewer iterations.
    Earlier,
    /// More iterations, or beyond the record.
    Later,
    /// As many iterations.
    Same,
}

/// The first decision the override takes differently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Divergence {
    /// Iterations committed when it came.
    pub iteration: u64,
    /// The decision under the recorded policy; `null` when it had ended.
    pub old: Option<Action>,
    /// The decision under the override; `null` when it had ended.
    pub new: Option<Action>,
}

/// One session's replay: the recorded end, the end under the recorded
/// policy (which must be the same: the determinism check), the end under
/// the override, and the difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplayOutcome {
    /// What happened.
    pub recorded: RecordedEnd,
    /// The replay under the policy it ran with.
    pub baseline: Replayed,
    /// The replay under the override.
    pub replayed: Replayed,
    /// The baseline reproduces the recorded status, reason and iterations.
    pub reproduced: bool,
    /// The override's end against the recorded one.
    pub change: Change,
    /// Its status or reason differs from the recorded one.
    pub differs: bool,
    /// The first decision taken differently, if any.
    pub divergence: Option<Divergence>,
    /// Tokens it would have used: the recorded count plus the replays' difference.
    pub counterfactual_tokens: u64,
    /// What it would have cost: the recorded cost plus the replays' difference.
    #[schema(value_type = String)]
    pub counterfactual_cost_usd: Decimal,
    /// A completed session the override ends without completing.
    pub cut_short: bool,
}

/// The first place two decision logs part.
fn divergence(old: &[Decision], new: &[Decision]) -> Option<Divergence> {
    let at = old.iter().zip(new).position(|(a, b)| a != b);
    let at = match at {
        Some(at) => at,
        None if old.len() == new.len() => return None,
        None => old.len().min(new.len()),
    };
    let (a, b) = (old.get(at), new.get(at));
    Some(Divergence {
        iteration: a.or(b).map_or(0, |d| d.iteration),
        old: a.map(|d| d.action.clone()),
        new: b.map(|d| d.action.clone()),
    })
}

/// Replays `rec` under the policy it ran with (`base`) and under `policy`,
/// and compares both with the record.
pub fn replay(rec: &Recording, base: &Policy, policy: &Policy) -> ReplayOutcome {
    let baseline = run(rec, base);
    let replayed = if base == policy {
        baseline.clone()
    } else {
        run(rec, policy)
    };
    let end = rec.end;
    let reproduced = baseline.status == Some(end.status)
        && baseline.reason == end.reason
        && baseline.iterations == end.iterations;
    let change =
        if replayed.ended_by == EndedBy::BeyondRecord || replayed.iterations > end.iterations {
            Change::Later
        } else if replayed.iterations < end.iterations {
            Change::Earlier
        } else {
            Change::Same
        };
    let differs = replayed.status != Some(end.status) || replayed.reason != end.reason;
    let tokens = i128::from(end.tokens) + i128::from(replayed.tokens) - i128::from(baseline.tokens);
    let cost = end
        .cost_usd
        .saturating_add(replayed.cost_usd.saturating_sub(baseline.cost_usd));
    ReplayOutcome {
        recorded: end,
        divergence: divergence(&baseline.decisions, &replayed.decisions),
        reproduced,
        change,
        differs,
        counterfactual_tokens: u64::try_from(tokens.max(0)).unwrap_or(u64::MAX),
        counterfactual_cost_usd: cost.max(Decimal::ZERO),
        cut_short: end.status == Status::Completed
            && replayed.ended_by != EndedBy::BeyondRecord
            && replayed.status != Some(Status::Completed),
        baseline,
        replayed,
    }
}

/// What a set of replays adds up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Totals {
    /// Sessions replayed.
    pub sessions: u64,
    /// Of them, the recorded policy reproduced their recorded end.
    pub reproduced: u64,
    /// The override ends them earlier.
    pub earlier: u64,
    /// The override ends them later (or beyond the record).
    pub later: u64,
    /// The override ends them at the same iteration.
    pub same: u64,
    /// Of those, with another status or reason.
    pub same_iteration_other_end: u64,
    /// Tokens the override would have saved (sessions that use fewer).
    pub tokens_saved: u64,
    /// Tokens it would have added (sessions that use more, within the record).
    pub tokens_added: u64,
    /// USD it would have saved.
    #[schema(value_type = String)]
    pub cost_saved_usd: Decimal,
    /// USD it would have added.
    #[schema(value_type = String)]
    pub cost_added_usd: Decimal,
    /// Completed sessions it would have ended without completing.
    pub completions_cut_short: u64,
}

impl Totals {
    /// Adds one session's replay.
    pub fn add(&mut self, o: &ReplayOutcome) {
        self.sessions += 1;
        self.reproduced += u64::from(o.reproduced);
        match o.change {
            Change::Earlier => self.earlier += 1,
            Change::Later => self.later += 1,
            Change::Same => {
                self.same += 1;
                self.same_iteration_other_end += u64::from(o.differs);
            }
        }
        let (was, now) = (o.recorded.tokens, o.counterfactual_tokens);
        self.tokens_saved = self.tokens_saved.saturating_add(was.saturating_sub(now));
        self.tokens_added = self.tokens_added.saturating_add(now.saturating_sub(was));
        let (was, now) = (o.recorded.cost_usd, o.counterfactual_cost_usd);
        if now < was {
            self.cost_saved_usd = self.cost_saved_usd.saturating_add(was - now);
        } else {
            self.cost_added_usd = self.cost_added_usd.saturating_add(now - was);
        }
        self.completions_cut_short += u64::from(o.cut_short);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::guardrails::tests::roomy;
    use crate::policy::history::tests::step;
    use crate::policy::reflection::{GoalAchieved, Progress, Recommendation};
    use crate::policy::sentinel::{Sentinel, SignalKind};

    fn limits(max_iterations: u64) -> Limits {
        Limits {
            max_iterations,
            max_tokens: 1_000_000,
            max_wall_time_ms: 10_000_000,
            ..roomy()
        }
    }

    fn effects(n: u64) -> StepEffects {
        StepEffects {
            rework: None,
            stuck: None,
            signal: None,
            elapsed_ms: n * 100,
            new_cycle: None,
            percent_complete: None,
            budget_warnings: Vec::new(),
        }
    }

    /// `n` distinct steps of run 1, each 100 tokens at 0.001 USD.
    fn distinct(n: u64) -> Vec<RecordedStep> {
        (1..=n)
            .map(|i| RecordedStep {
                run: 1,
                record: step(i, &format!("write_{i}")),
                effects: effects(i),
                cost_usd: Some(Decimal::new(1, 3)),
            })
            .collect()
    }

    /// A step that repeats the same call and observation.
    fn same(n: u64) -> RecordedStep {
        let mut record = step(n, "look");
        record.observation = "nothing new".into();
        record.message = "looking".into();
        RecordedStep {
            run: 1,
            record,
            effects: effects(n),
            cost_usd: Some(Decimal::new(1, 3)),
        }
    }

    fn claim_done(mut s: RecordedStep) -> RecordedStep {
        s.effects.signal = Some(Sentinel {
            kind: SignalKind::Done,
            reason: Some("done".into()),
        });
        s
    }

    fn assessment(goal: GoalAchieved, progress: Progress, percent: f64) -> Assessment {
        Assessment {
            goal_achieved: goal,
            progress,
            percent_complete: percent,
            loop_detected: false,
            recommendation: Recommendation::Continue,
            reasoning: "because".into(),
            next_steps: vec![],
            coherence: None,
            uncertainty: None,
            milestones_done: vec![],
            criteria_met: vec![],
        }
    }

    /// A recording whose end is the one its own policy reaches, or a
    /// user's stop after its last step when the policy reaches none.
    fn recording(mode: Mode, lim: Limits, steps: Vec<RecordedStep>) -> (Recording, Policy) {
        let mut rec = Recording {
            start: LoopState::new(lim.reflection_interval),
            mode,
            has_children: false,
            tree: (false, ChildPausePolicy::default()),
            money_rate: None,
            steps,
            reflections: Vec::new(),
            tokens_charged: 0,
            end: RecordedEnd {
                status: Status::Running,
                reason: None,
                iterations: 0,
                tokens: 0,
                cost_usd: Decimal::ZERO,
                elapsed_ms: 0,
                run: 1,
            },
        };
        let policy = Policy::recorded(GateConfig::default(), StuckConfig::default(), lim);
        settle(&mut rec, &policy);
        (rec, policy)
    }

    /// Sets the recorded end to what `policy` reaches.
    fn settle(rec: &mut Recording, policy: &Policy) {
        rec.end.run = rec.steps.last().map_or(1, |s| s.run);
        rec.end.status = Status::Interrupted;
        rec.end.reason = Some(Reason::UserStop);
        let got = run(rec, policy);
        rec.end.status = got.status.expect("an end");
        rec.end.reason = got.reason;
        rec.end.iterations = got.iterations;
        rec.end.tokens = got.tokens;
        rec.end.cost_usd = got.cost_usd;
    }

    fn with(base: &Policy, patch: PolicyOverride) -> Policy {
        patch.apply(base).expect("in range")
    }

    fn max_iterations(n: u64) -> PolicyOverride {
        PolicyOverride {
            limits: LimitsPatch {
                max_iterations: Some(n),
                ..LimitsPatch::default()
            },
            ..PolicyOverride::default()
        }
    }

    #[test]
    fn the_recorded_policy_reproduces_the_record_with_no_divergence() {
        let (rec, base) = recording(Mode::Fixed, limits(5), distinct(5));
        assert_eq!(
            (rec.end.status, rec.end.reason),
            (Status::Stopped, Some(Reason::MaxIterations))
        );
        let o = replay(&rec, &base, &base);
        assert!(o.reproduced);
        assert_eq!(o.change, Change::Same);
        assert!(!o.differs && !o.cut_short);
        assert_eq!(o.divergence, None);
        assert_eq!(o.counterfactual_tokens, 500);
        assert_eq!(o.counterfactual_cost_usd, Decimal::new(5, 3));
        assert_eq!(o.baseline.ended_by, EndedBy::Policy);
        // One gate decision before each step, then the end.
        assert_eq!(o.baseline.decisions.len(), 6);
    }

    #[test]
    fn a_lower_iteration_cap_ends_earlier_and_saves_the_steps_not_run() {
        let (rec, base) = recording(Mode::Fixed, limits(5), distinct(5));
        let o = replay(&rec, &base, &with(&base, max_iterations(3)));
        assert_eq!(o.change, Change::Earlier);
        assert_eq!(o.replayed.iterations, 3);
        assert_eq!(o.replayed.reason, Some(Reason::MaxIterations));
        assert_eq!(o.counterfactual_tokens, 300);
        assert_eq!(o.counterfactual_cost_usd, Decimal::new(3, 3));
        let d = o.divergence.clone().expect("a divergence");
        assert_eq!(d.iteration, 3);
        assert_eq!(
            d.old,
            Some(Action::Gate {
                decision: "continue".into()
            })
        );
        assert_eq!(
            d.new,
            Some(Action::End {
                status: Status::Stopped,
                reason: Reason::MaxIterations
            })
        );
        let mut t = Totals::default();
        t.add(&o);
        assert_eq!((t.earlier, t.tokens_saved, t.tokens_added), (1, 200, 0));
        assert_eq!(t.cost_saved_usd, Decimal::new(2, 3));
    }

    #[test]
    fn a_higher_cap_runs_beyond_the_record() {
        let (rec, base) = recording(Mode::Fixed, limits(5), distinct(5));
        let o = replay(&rec, &base, &with(&base, max_iterations(50)));
        assert_eq!(o.replayed.ended_by, EndedBy::BeyondRecord);
        assert_eq!((o.replayed.status, o.replayed.iterations), (None, 5));
        assert_eq!(o.change, Change::Later);
        assert!(o.differs && !o.cut_short);
        let d = o.divergence.expect("a divergence");
        let stopped = Action::End {
            status: Status::Stopped,
            reason: Reason::MaxIterations,
        };
        assert_eq!(d.iteration, 5);
        assert_eq!(d.old, Some(stopped));
        assert_eq!(
            d.new,
            Some(Action::Gate {
                decision: "continue".into()
            }),
            "the override goes on"
        );
    }

    #[test]
    fn a_completion_cut_short_by_a_lower_cap_is_counted() {
        let mut steps = distinct(4);
        steps[3] = claim_done(steps[3].clone());
        let (rec, base) = recording(Mode::Fixed, limits(10), steps);
        assert_eq!((rec.end.status, rec.end.iterations), (Status::Completed, 4));
        let o = replay(&rec, &base, &with(&base, max_iterations(2)));
        assert!(o.reproduced && o.cut_short);
        let mut t = Totals::default();
        t.add(&o);
        assert_eq!(t.completions_cut_short, 1);
    }

    #[test]
    fn a_tighter_stuck_window_pauses_a_looping_session_sooner() {
        let steps: Vec<RecordedStep> = (1..=12).map(same).collect();
        let (rec, base) = recording(Mode::Fixed, limits(12), steps);
        assert_eq!(rec.end.reason, Some(Reason::Stuck), "{:?}", rec.end);
        let recorded_at = rec.end.iterations;
        let tight = PolicyOverride {
            stuck: StuckPatch {
                same_observation: Some(2),
                ..StuckPatch::default()
            },
            ..PolicyOverride::default()
        };
        let o = replay(&rec, &base, &with(&base, tight));
        assert!(o.reproduced);
        assert_eq!(o.replayed.reason, Some(Reason::Stuck));
        assert!(
            o.replayed.iterations < recorded_at,
            "{} < {recorded_at}",
            o.replayed.iterations
        );
        assert_eq!(
            o.divergence.expect("diverges").iteration,
            2,
            "the first nudge comes at step 2"
        );
    }

    #[test]
    fn an_end_no_policy_decides_is_carried_from_the_record() {
        let (rec, base) = recording(Mode::Fixed, limits(10), distinct(4));
        let o = replay(&rec, &base, &base);
        assert!(o.reproduced);
        assert_eq!(o.baseline.ended_by, EndedBy::Record);
        // A cap reached before the user's stop wins.
        let o = replay(&rec, &base, &with(&base, max_iterations(2)));
        assert_eq!(
            (o.replayed.reason, o.replayed.ended_by),
            (Some(Reason::MaxIterations), EndedBy::Policy)
        );
    }

    #[test]
    fn a_recorded_policy_end_the_replay_cannot_reach_is_not_reproduced() {
        let (mut rec, base) = recording(Mode::Fixed, limits(10), distinct(4));
        rec.end.status = Status::Paused;
        rec.end.reason = Some(Reason::Stuck);
        let o = replay(&rec, &base, &base);
        assert!(!o.reproduced, "drift is reported, not hidden");
        // A parent blocked on its children's failures: their rows decided it.
        rec.end.status = Status::Paused;
        rec.end.reason = Some(Reason::AgentBlocked);
        assert!(!replay(&rec, &base, &base).reproduced);
        rec.has_children = true;
        let o = replay(&rec, &base, &base);
        assert!(o.reproduced);
        assert_eq!(o.baseline.ended_by, EndedBy::Record);
    }

    fn continuous(
        steps: Vec<RecordedStep>,
        reflections: Vec<RecordedReflection>,
    ) -> (Recording, Policy) {
        let (mut rec, base) = recording(Mode::Continuous, limits(20), steps);
        rec.reflections = reflections;
        settle(&mut rec, &base);
        (rec, base)
    }

    fn reflection(after: u64, a: Option<Assessment>) -> RecordedReflection {
        RecordedReflection {
            after_iteration: after,
            assessment: a,
            error: Some("model down".into()),
            tokens: 50,
        }
    }

    #[test]
    fn recorded_reflections_are_decided_again_and_their_tokens_count() {
        let done = assessment(GoalAchieved::Yes, Progress::Good, 100.0);
        let (rec, base) = continuous(distinct(12), vec![reflection(10, Some(done))]);
        assert_eq!(
            (rec.end.status, rec.end.iterations),
            (Status::Completed, 10)
        );
        assert_eq!(rec.end.tokens, 1_050);
        let o = replay(&rec, &base, &base);
        assert!(o.reproduced);
        assert_eq!(o.baseline.reflections, (1, 0));
    }

    #[test]
    fn a_longer_reflection_interval_skips_a_recorded_reflection() {
        let done = assessment(GoalAchieved::Yes, Progress::Good, 100.0);
        let (rec, base) = continuous(distinct(12), vec![reflection(10, Some(done))]);
        let longer = PolicyOverride {
            limits: LimitsPatch {
                reflection_interval: Some(15),
                ..LimitsPatch::default()
            },
            ..PolicyOverride::default()
        };
        let o = replay(&rec, &base, &with(&base, longer));
        assert_eq!(o.replayed.reflections, (0, 1));
        assert_eq!(o.replayed.ended_by, EndedBy::BeyondRecord);
        assert_eq!(o.change, Change::Later);
        assert_eq!(
            o.divergence.map(|d| (d.iteration, d.new)),
            Some((10, Some(Action::ReflectionSkipped)))
        );
    }

    #[test]
    fn a_shorter_interval_counts_the_reflections_never_asked_for() {
        let slow = assessment(GoalAchieved::No, Progress::Slow, 10.0);
        let (rec, base) = continuous(distinct(12), vec![reflection(10, Some(slow))]);
        let shorter = PolicyOverride {
            limits: LimitsPatch {
                reflection_interval: Some(4),
                ..LimitsPatch::default()
            },
            ..PolicyOverride::default()
        };
        let o = replay(&rec, &base, &with(&base, shorter));
        // Due at 4, 8 and 12 with nothing recorded there; the one recorded
        // at 10 is not due under the new interval (the last was at 8).
        assert_eq!(o.replayed.reflections_unrecorded, 3);
        assert_eq!(o.replayed.reflections, (0, 1));
    }

    #[test]
    fn failed_reflections_pause_after_the_limit() {
        let steps = distinct(20);
        let failed = (1..=3).map(|k| reflection(k * 5, None)).collect();
        let (mut rec, base) = continuous(steps, failed);
        rec.start.reflection.interval = 5;
        settle(&mut rec, &base);
        assert_eq!(
            (rec.end.reason, rec.end.iterations),
            (Some(Reason::ReflectionFailed), 15)
        );
        assert!(replay(&rec, &base, &base).reproduced);
    }

    #[test]
    fn an_agent_claim_needs_the_reflectors_vote_in_continuous_mode() {
        let mut steps = distinct(6);
        steps[2] = claim_done(steps[2].clone());
        let no = assessment(GoalAchieved::No, Progress::Good, 50.0);
        let (rec, base) = continuous(steps, vec![reflection(3, Some(no))]);
        // Rejected: the claim is not an end; the session runs on to its record's end.
        assert_eq!(rec.end.iterations, 6);
        let o = replay(&rec, &base, &base);
        assert!(o.baseline.decisions.contains(&Decision {
            iteration: 3,
            action: Action::Reflection {
                verdict: "reject".into()
            }
        }));
    }

    #[test]
    fn a_pause_followed_by_a_resume_is_passed_as_recorded() {
        let mut steps: Vec<RecordedStep> = (1..=12).map(same).collect();
        let (probe, _) = recording(Mode::Fixed, limits(30), steps.clone());
        let paused_at = probe.end.iterations as usize;
        for s in &mut steps[paused_at..] {
            s.run = 2;
        }
        let (rec, base) = recording(Mode::Fixed, limits(30), steps);
        let o = replay(&rec, &base, &base);
        assert!(o.reproduced, "{:?}", o.baseline);
        assert!(o.baseline.decisions.contains(&Decision {
            iteration: paused_at as u64,
            action: Action::Resume { run: 2 }
        }));
    }

    #[test]
    fn the_gate_review_point_is_overridable() {
        let (rec, base) = continuous(distinct(12), vec![]);
        let review = PolicyOverride {
            limits: LimitsPatch {
                review_every: Some(5),
                ..LimitsPatch::default()
            },
            ..PolicyOverride::default()
        };
        let o = replay(&rec, &base, &with(&base, review));
        assert_eq!(
            (o.replayed.reason, o.replayed.iterations),
            (Some(Reason::ReviewRequired), 5)
        );
    }

    #[test]
    fn a_child_that_would_wait_fails_under_fail_child() {
        let steps: Vec<RecordedStep> = (1..=12).map(same).collect();
        let (mut rec, base) = recording(Mode::Fixed, limits(12), steps);
        rec.tree = (true, ChildPausePolicy::FailChild);
        settle(&mut rec, &base);
        assert_eq!(
            (rec.end.status, rec.end.reason),
            (Status::Failed, Some(Reason::Stuck))
        );
        assert!(replay(&rec, &base, &base).reproduced);
    }

    #[test]
    fn overrides_are_range_checked() {
        let base = Policy::recorded(GateConfig::default(), StuckConfig::default(), limits(5));
        let bad = [
            PolicyOverride {
                gate: GatePatch {
                    rework_max: Some(1.5),
                    ..GatePatch::default()
                },
                ..PolicyOverride::default()
            },
            PolicyOverride {
                gate: GatePatch {
                    coherence_min: Some(f64::NAN),
                    ..GatePatch::default()
                },
                ..PolicyOverride::default()
            },
            PolicyOverride {
                gate: GatePatch {
                    rework_window: Some(21),
                    ..GatePatch::default()
                },
                ..PolicyOverride::default()
            },
            PolicyOverride {
                gate: GatePatch {
                    projection_margin: Some(0.5),
                    ..GatePatch::default()
                },
                ..PolicyOverride::default()
            },
            PolicyOverride {
                stuck: StuckPatch {
                    same_observation: Some(1),
                    ..StuckPatch::default()
                },
                ..PolicyOverride::default()
            },
            PolicyOverride {
                stuck: StuckPatch {
                    max_total_wait_ms: Some(0),
                    ..StuckPatch::default()
                },
                ..PolicyOverride::default()
            },
            max_iterations(0),
        ];
        for patch in bad {
            assert!(patch.apply(&base).is_err(), "{patch:?}");
        }
        let fine = PolicyOverride {
            gate: GatePatch {
                rework_max: Some(1.0),
                review_every: Some(0),
                ..GatePatch::default()
            },
            ..PolicyOverride::default()
        };
        let p = fine.apply(&base).expect("in range");
        assert_eq!((p.gate.rework_max, p.gate.review_every), (1.0, 0));
        assert!(!p.reflect_when_due, "the interval is not overridden");
        let json: PolicyOverride = serde_json::from_value(
            serde_json::json!({"limits": {"max_iterations": 3}, "stuck": {"same_error": 2}}),
        )
        .expect("reads");
        assert_eq!(json.limits.max_iterations, Some(3));
        assert!(
            serde_json::from_value::<PolicyOverride>(serde_json::json!({"gates": {}})).is_err(),
            "unknown fields are refused"
        );
    }

    #[test]
    fn the_documented_ranges_are_the_ones_checked() {
        let base = Policy::recorded(GateConfig::default(), StuckConfig::default(), limits(5));
        for (schema, field, min, max) in RANGES {
            let floats = [
                "coherence_min",
                "rework_max",
                "uncertainty_max",
                "slope_max",
                "projection_margin",
            ];
            let patch = |v: f64| {
                let group = if schema == "GatePatch" {
                    "gate"
                } else {
                    "stuck"
                };
                let value = if floats.contains(&field) {
                    serde_json::json!(v)
                } else {
                    serde_json::json!(v as i64)
                };
                serde_json::from_value::<PolicyOverride>(
                    serde_json::json!({ group: { field: value } }),
                )
            };
            for ok in [min, max] {
                let p = patch(ok).unwrap_or_else(|e| panic!("{field} {ok}: {e}"));
                assert!(p.apply(&base).is_ok(), "{field} {ok} is in range");
            }
            // Past either end: refused when read (a negative count) or applied.
            for bad in [min - 1.0, max + 1.0] {
                let refused = patch(bad).map_or(true, |p| p.apply(&base).is_err());
                assert!(refused, "{field} {bad} is out of range");
            }
        }
    }

    #[test]
    fn divergence_finds_the_first_difference_or_the_shorter_end() {
        let d = |i, k: &str| Decision {
            iteration: i,
            action: Action::Gate { decision: k.into() },
        };
        assert_eq!(divergence(&[d(0, "continue")], &[d(0, "continue")]), None);
        let got = divergence(
            &[d(0, "continue"), d(1, "continue")],
            &[d(0, "continue"), d(1, "throttle")],
        )
        .expect("differs");
        assert_eq!(
            (got.iteration, got.old, got.new),
            (
                1,
                Some(d(1, "continue").action),
                Some(d(1, "throttle").action)
            )
        );
        let got =
            divergence(&[d(0, "continue")], &[d(0, "continue"), d(1, "continue")]).expect("longer");
        assert_eq!((got.iteration, got.old), (1, None));
    }

    #[test]
    fn totals_count_added_spend_and_same_iteration_ends() {
        let (rec, base) = recording(Mode::Fixed, limits(5), distinct(5));
        let mut t = Totals::default();
        t.add(&replay(&rec, &base, &base));
        let mut later = replay(&rec, &base, &base);
        later.change = Change::Same;
        later.differs = true;
        later.counterfactual_tokens = 900;
        later.counterfactual_cost_usd = Decimal::new(9, 3);
        t.add(&later);
        assert_eq!(
            (t.sessions, t.reproduced, t.same, t.same_iteration_other_end),
            (2, 2, 2, 1)
        );
        assert_eq!((t.tokens_added, t.tokens_saved), (400, 0));
        assert_eq!(t.cost_added_usd, Decimal::new(4, 3));
    }
}
