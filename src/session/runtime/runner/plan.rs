//! What committing a step writes, decided without I/O: the iteration row,
//! its events, the counters and progress, the loop state after it, and
//! whether the interval checkpoint rides along. The commit step only carries
//! the plan out, so every rule here is tested without a database.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use crate::event::SessionEvent;
use crate::executor::CycleChange;
use crate::llm::Message;
use crate::policy::guardrails::{Limits, Usage};
use crate::policy::history::{Outcome, StepRecord};
use crate::policy::loop_state::{self, LoopState, StepEffects};
use crate::policy::pricing::{PriceTable, StepCost, StepUsage};
use crate::policy::sentinel::Sentinel;
use crate::policy::soft_budget::{self, BudgetWarning, SentWarning};
use crate::policy::stuck::StuckConfig;
use crate::session::event_codec::{self, to_stored_text};
use crate::store::{Counters, NewEvent, NewIteration, StoreError};

/// What the execute step produced: a finished step, ready to commit.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The gate decision that let the step run, logged with it.
    pub decision: SessionEvent,
    /// The step as the policies see it.
    pub record: StepRecord,
    /// The agent's own progress estimate, percent.
    pub percent: Option<f64>,
    /// A stop signal the agent gave outside its message.
    pub signal: Option<Sentinel>,
    /// The step's conversation (model executors).
    pub transcript: Option<Vec<Message>>,
    /// Events the executor logged during the step.
    pub events: Vec<SessionEvent>,
    /// A context cycle the step ended, with the memory carried over.
    pub cycle_change: Option<CycleChange>,
    /// When the step started.
    pub started_at: DateTime<Utc>,
    /// When the executor returned.
    pub finished_at: DateTime<Utc>,
    /// NUL characters replaced in the executor's answer.
    pub sanitized: usize,
    /// The step's tokens split and its model, held to the record's tokens.
    pub usage: StepUsage,
}

/// What the plan needs besides the state and the step.
#[derive(Debug, Clone, Copy)]
pub struct PlanContext<'a> {
    /// Stuck detection's thresholds.
    pub stuck: &'a StuckConfig,
    /// Committed steps between interval checkpoints (0 counts as 1).
    pub checkpoint_interval: u32,
    /// The session's running time at the commit, ms.
    pub elapsed_ms: u64,
    /// The limits in force: the soft budgets warn against them.
    pub limits: &'a Limits,
    /// The operator's price table (`WARDEN_MODEL_PRICES`).
    pub prices: &'a PriceTable,
}

/// Everything one commit writes, and the state the loop goes on with.
#[derive(Debug, Clone)]
pub struct CommitPlan {
    /// The iteration row, carrying the interval checkpoint when one is folded in.
    pub iteration: NewIteration,
    /// The events, in log order.
    pub events: Vec<NewEvent>,
    /// How the session row changes: counters, progress, cycle, checkpoint.
    pub row: RowChange,
    /// The loop state once the commit is durable.
    pub state_after: LoopState,
    /// Tokens the step itself reported (for the metrics).
    pub step_tokens: u64,
}

/// How the session row changes with a commit.
#[derive(Debug, Clone, PartialEq)]
pub struct RowChange {
    /// The counters after the step.
    pub counters: Counters,
    /// Progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Estimated seconds to completion.
    pub eta_seconds: Option<f64>,
    /// The cycle and memory the session moves to, when the step changed it.
    pub next_cycle: Option<(i32, String)>,
    /// The iteration an interval checkpoint is saved at, when one is folded in.
    pub checkpointed: Option<i64>,
    /// Soft-budget warnings the commit logs, as the status lists them.
    pub budget_warnings: Vec<SentWarning>,
    /// What the step adds to the session's cost, and whether it is one
    /// more unpriced step (the row adds both in the commit's statement).
    pub cost: (Decimal, bool),
}

/// Whether an interval checkpoint is due in `state`: a multiple of the
/// interval committed and not checkpointed yet, and the run not ending (the
/// end writes its own checkpoint).
pub fn checkpoint_due(state: &LoopState, interval: u32) -> bool {
    let done = state.usage.iterations;
    done > 0
        && done.is_multiple_of(u64::from(interval.max(1)))
        && state.last_checkpoint_step < done
        && state.pending_end.is_none()
}

/// Plans the commit of `step` on `state`. The interval checkpoint is folded
/// into the iteration's own commit (one flush, not two): a snapshot of the
/// state as it will be once the step applies.
pub fn plan_commit(
    mut state: LoopState,
    mut step: StepOutcome,
    ctx: &PlanContext<'_>,
) -> Result<CommitPlan, StoreError> {
    let mut effects = loop_state::assess(
        &state,
        &step.record,
        step.signal.take(),
        ctx.stuck,
        ctx.elapsed_ms,
        step.percent,
    );
    effects.new_cycle = step.cycle_change.as_ref().map(|c| c.cycle);
    let mut iteration = iteration_row(&state, &step, &effects)?;
    price(&mut iteration, &step.usage, ctx.prices);
    let step_cost = step_cost(&iteration, &step.usage);
    effects.budget_warnings =
        budget_warnings_due(&state, &step.record, &effects, step_cost, ctx.limits);
    let run = state.run;
    state.apply(run, &step.record, &effects);
    add_cost(&mut state.usage, step_cost);
    let mut logged = Vec::with_capacity(step.events.len() + 5);
    logged.push(step.decision);
    logged.extend(step.events);
    logged.extend(step_events(&step.record, &effects, &state.usage));
    logged.extend(warning_events(&effects.budget_warnings, &state));
    if step.sanitized > 0 {
        logged.push(SessionEvent::AgentOutputSanitized {
            step: step.record.number,
            nul_replaced: step.sanitized,
            with: "\u{fffd}".into(),
        });
    }
    if checkpoint_due(&state, ctx.checkpoint_interval) {
        state.last_checkpoint_step = state.usage.iterations;
        iteration.checkpoint = Some(to_stored_text("checkpoint state", &state)?);
        logged.push(SessionEvent::CheckpointSaved {
            iteration: iteration.number,
            reason: "interval".into(),
        });
    }
    let row = RowChange {
        counters: Counters::from_usage(&state.usage, state.reflection.tokens, state.charges_seen),
        percent_complete: effects.percent_complete,
        eta_seconds: loop_state::eta_seconds(effects.percent_complete, effects.elapsed_ms),
        next_cycle: iteration.next_cycle.clone(),
        checkpointed: iteration.checkpoint.is_some().then_some(iteration.number),
        budget_warnings: sent_warnings(&effects.budget_warnings, step.record.number),
        cost: (
            iteration.cost_usd.unwrap_or(Decimal::ZERO),
            iteration.cost_usd.is_none(),
        ),
    };
    Ok(CommitPlan {
        iteration,
        events: event_codec::encode(&logged)?,
        row,
        state_after: state,
        step_tokens: step.record.tokens,
    })
}

/// Soft budgets: the thresholds the step takes a budget past, at the usage
/// it commits, that the session has not warned of yet.
fn budget_warnings_due(
    state: &LoopState,
    record: &StepRecord,
    effects: &StepEffects,
    step_cost: Option<Decimal>,
    limits: &Limits,
) -> Vec<BudgetWarning> {
    let mut usage = loop_state::usage_after(&state.usage, record, effects.elapsed_ms);
    add_cost(&mut usage, step_cost);
    let gauges = soft_budget::gauges(limits, &usage);
    soft_budget::due(
        &limits.warn_at.percents(),
        &gauges,
        &state.budget_warnings_sent,
    )
}

/// What the step cost: `None` when it used tokens of a model no entry
/// prices (`unpriced`).
fn step_cost(iteration: &NewIteration, usage: &StepUsage) -> Option<Decimal> {
    match iteration.cost_usd {
        Some(usd) => Some(usd),
        None if usage.total() == 0 => Some(Decimal::ZERO),
        None => None,
    }
}

/// Adds a step's cost to the usage; an unpriced step counts as one.
fn add_cost(usage: &mut Usage, cost: Option<Decimal>) {
    match cost {
        Some(usd) => usage.cost_usd = usage.cost_usd.saturating_add(usd),
        None => usage.unpriced_steps = usage.unpriced_steps.saturating_add(1),
    }
}

/// The `budget_warning` events of `warnings`, each with the note the next
/// step is told (`state` is the state after the step).
fn warning_events(warnings: &[BudgetWarning], state: &LoopState) -> Vec<SessionEvent> {
    warnings
        .iter()
        .map(|w| SessionEvent::BudgetWarning {
            budget: w.budget,
            threshold: w.percent,
            used: w.used,
            limit: w.limit,
            iteration: state.usage.iterations,
            note: soft_budget::wrap_up_note(w, state.usage.iterations),
        })
        .collect()
}

/// `warnings` as the status lists them, crossed at `iteration`.
fn sent_warnings(warnings: &[BudgetWarning], iteration: u64) -> Vec<SentWarning> {
    warnings
        .iter()
        .map(|w| SentWarning {
            budget: w.budget,
            threshold: w.percent,
            used: w.used,
            limit: w.limit,
            iteration,
        })
        .collect()
}

/// The iteration row for `step`, in the state's run and cycle, without a
/// checkpoint.
fn iteration_row(
    state: &LoopState,
    step: &StepOutcome,
    effects: &StepEffects,
) -> Result<NewIteration, StoreError> {
    let record = &step.record;
    Ok(NewIteration {
        number: i64::try_from(record.number).unwrap_or(i64::MAX),
        run: state.run,
        action: record.action.clone(),
        outcome: match record.outcome {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Error => "error",
        },
        // Saturates: an agent may report u64::MAX tokens.
        tokens: i64::try_from(record.tokens).unwrap_or(i64::MAX),
        duration_ms: i64::try_from(record.duration_ms).unwrap_or(i64::MAX),
        record: to_stored_text("iteration record", record)?,
        effects: to_stored_text("iteration effects", effects)?,
        transcript: step
            .transcript
            .as_ref()
            .map(|t| to_stored_text("transcript", t))
            .transpose()?,
        cycle: i32::try_from(state.cycle).unwrap_or(i32::MAX),
        next_cycle: step
            .cycle_change
            .as_ref()
            .map(|c| (i32::try_from(c.cycle).unwrap_or(i32::MAX), c.memory.clone())),
        checkpoint: None,
        started_at: step.started_at,
        finished_at: step.finished_at,
        usage: None,
        cost_usd: None,
        price_pattern: None,
        price_valid_from: None,
    })
}

/// Prices the step's usage on the day it finished: the iteration keeps the
/// usage, the cost and the entry that priced it; a step whose model no
/// entry prices keeps no cost (`unpriced`), a step without tokens costs 0.
fn price(iteration: &mut NewIteration, usage: &StepUsage, prices: &PriceTable) {
    let day = iteration.finished_at.date_naive();
    match prices.cost(usage.model.as_deref(), usage.priced_tokens(), day) {
        StepCost::Priced {
            usd,
            pattern,
            valid_from,
        } => {
            iteration.cost_usd = Some(usd);
            iteration.price_pattern = Some(pattern);
            iteration.price_valid_from = valid_from;
        }
        StepCost::Free => iteration.cost_usd = Some(Decimal::ZERO),
        StepCost::Unpriced => iteration.cost_usd = None,
    }
    iteration.usage = to_stored_text("step usage", usage).ok();
}

/// The events a committed step adds to the log after the executor's own.
fn step_events(record: &StepRecord, effects: &StepEffects, usage: &Usage) -> Vec<SessionEvent> {
    let mut events = vec![SessionEvent::IterationCompleted {
        number: record.number,
        action: record.action.clone(),
        outcome: record.outcome,
        tokens: record.tokens,
        duration_ms: record.duration_ms,
        rework: effects.rework.clone(),
        tokens_used: usage.tokens,
        percent_complete: effects.percent_complete,
    }];
    if let Some(finding) = &effects.stuck {
        events.push(SessionEvent::StuckDetected {
            step: record.number,
            pattern: finding.pattern.clone(),
            verdict: finding.verdict.clone(),
            description: finding.pattern.describe(),
        });
    }
    if let Some(signal) = &effects.signal {
        events.push(SessionEvent::AgentSignal {
            step: record.number,
            signal: signal.clone(),
        });
    }
    events
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::policy::gate::{self, GateConfig};
    use crate::policy::guardrails::Limits;
    use crate::policy::history::FileWrite;
    use crate::policy::lifecycle::{Mode, Reason};
    use crate::policy::sentinel::SignalKind;
    use crate::policy::soft_budget::{Budget, WarnAt};

    const STUCK: StuckConfig = StuckConfig {
        same_observation: 4,
        same_error: 3,
        same_message: 3,
        alternation: 6,
        overflow_window: 5,
        overflow_repeats: 2,
        max_total_wait_ms: 1_800_000,
    };

    /// Limits no test step comes near, soft budgets included.
    const LIMITS: Limits = Limits {
        max_iterations: 100,
        max_wall_time_ms: 600_000,
        max_tokens: 1_000_000,
        max_consecutive_errors: 3,
        reflection_interval: 100,
        reflection_adaptive: false,
        checkpoint_interval: 100,
        max_tool_calls: None,
        max_cycles: 10,
        context_budget_tokens: 32_000,
        review_every: None,
        warn_at: WarnAt::DEFAULT,
        max_cost_usd: None,
    };
    static PRICES: std::sync::LazyLock<PriceTable> =
        std::sync::LazyLock::new(|| PriceTable::parse("*=1/2").expect("a table"));

    fn ctx(checkpoint_interval: u32) -> PlanContext<'static> {
        PlanContext {
            stuck: &STUCK,
            checkpoint_interval,
            elapsed_ms: 5_000,
            limits: &LIMITS,
            prices: &PRICES,
        }
    }

    /// The gate's decision before the state's next step, as the loop logs it.
    fn decision(state: &LoopState) -> SessionEvent {
        let deltas = state.token_deltas();
        let inputs = state.gate_inputs(Mode::Fixed, &LIMITS, &deltas);
        let evaluation = gate::evaluate(&GateConfig::default(), &inputs);
        SessionEvent::GateDecision {
            step: state.usage.iterations + 1,
            decision: evaluation.decision,
            metrics: evaluation.metrics,
            inputs: serde_json::to_value(inputs).expect("gate inputs encode"),
        }
    }

    /// The state's next step: a new action, message and file, so stuck
    /// detection stays quiet.
    fn next_step(state: &LoopState) -> StepOutcome {
        let n = state.usage.iterations + 1;
        let at = |s: i64| {
            Utc.timestamp_opt(1_700_000_000 + s, 0)
                .single()
                .expect("a time")
        };
        StepOutcome {
            decision: decision(state),
            record: StepRecord {
                number: n,
                action: format!("action_{n}"),
                arguments: serde_json::Value::Null,
                outcome: Outcome::Success,
                observation: format!("wrote part {n}"),
                message: format!("wrote part {n}"),
                error: None,
                tokens: 10,
                tool_calls: 1,
                files_written: vec![FileWrite {
                    path: format!("part_{n}.md"),
                    digest: format!("{n:x}"),
                }],
                waiting: false,
                duration_ms: 200,
                context_overflow: false,
            },
            percent: None,
            signal: None,
            transcript: None,
            events: Vec::new(),
            cycle_change: None,
            started_at: at(0),
            finished_at: at(1),
            sanitized: 0,
            usage: StepUsage::unsplit(10, None),
        }
    }

    /// `state` after `steps` plain steps committed with `interval`.
    fn after(mut state: LoopState, steps: u64, interval: u32) -> LoopState {
        for _ in 0..steps {
            let step = next_step(&state);
            state = plan_commit(state, step, &ctx(interval))
                .expect("a plan")
                .state_after;
        }
        state
    }

    fn kinds(plan: &CommitPlan) -> Vec<&'static str> {
        plan.events.iter().map(|e| e.kind).collect()
    }

    fn event(plan: &CommitPlan, kind: &str) -> SessionEvent {
        let found = plan
            .events
            .iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} event in {:?}", kinds(plan)));
        let data = found.data.to_value().expect("event JSON");
        SessionEvent::from_parts(found.kind, &data).expect("an event")
    }

    #[test]
    fn a_plain_step_plans_its_row_events_counters_and_state() {
        let state = LoopState::new(5);
        let step = next_step(&state);
        let record = step.record.clone();
        let (started_at, finished_at) = (step.started_at, step.finished_at);
        let plan = plan_commit(state, step, &ctx(100)).expect("a plan");

        let row = &plan.iteration;
        assert_eq!((row.number, row.run, row.cycle), (1, 1, 1));
        assert_eq!((row.action.as_str(), row.outcome), ("action_1", "success"));
        assert_eq!((row.tokens, row.duration_ms), (10, 200));
        assert_eq!((row.started_at, row.finished_at), (started_at, finished_at));
        assert!(row.transcript.is_none() && row.next_cycle.is_none());
        assert!(row.checkpoint.is_none());
        let stored: StepRecord =
            serde_json::from_str(row.record.as_str()).expect("the record decodes");
        assert_eq!(stored, record);
        let effects: StepEffects =
            serde_json::from_str(row.effects.as_str()).expect("the effects decode");
        assert_eq!(effects.elapsed_ms, 5_000);
        assert!(effects.stuck.is_none() && effects.signal.is_none());

        assert_eq!(kinds(&plan), ["gate_decision", "iteration_completed"]);
        assert_eq!(
            plan.row.counters,
            Counters {
                usage: Usage {
                    iterations: 1,
                    tokens: 10,
                    tool_calls: 1,
                    consecutive_errors: 0,
                    elapsed_ms: 5_000,
                    // The step's price at the test's table.
                    cost_usd: Decimal::new(2, 5),
                    unpriced_steps: 0,
                },
                reflection_tokens: 0,
                charges_seen: 0,
            }
        );
        assert_eq!(
            (plan.row.percent_complete, plan.row.eta_seconds),
            (None, None)
        );
        assert_eq!(plan.step_tokens, 10);
        assert_eq!(plan.state_after.usage.iterations, 1);
        assert_eq!(plan.state_after.history.len(), 1);
        assert_eq!(plan.state_after.last_checkpoint_step, 0);
        assert_eq!(plan.row.checkpointed, None);
    }

    #[test]
    fn a_step_is_priced_by_its_model_and_an_unknown_model_is_unpriced() {
        // A count alone is priced by `*` as output: 10 tokens at $2 per million.
        let state = LoopState::new(5);
        let plan = plan_commit(state.clone(), next_step(&state), &ctx(100)).expect("a plan");
        assert_eq!(plan.iteration.cost_usd, Some(Decimal::new(2, 5)));
        assert_eq!(plan.iteration.price_pattern.as_deref(), Some("*"));
        assert_eq!(plan.row.cost, (Decimal::new(2, 5), false));
        let usage: StepUsage =
            serde_json::from_str(plan.iteration.usage.as_ref().expect("usage").as_str())
                .expect("the usage decodes");
        assert_eq!(usage, StepUsage::unsplit(10, None));

        let gpt = PriceTable::parse("gpt-4o=2.50/10/1.25").expect("a table");
        let mut step = next_step(&state);
        step.usage = StepUsage {
            input_tokens: 8,
            output_tokens: 2,
            cached_tokens: 4,
            reasoning_tokens: 0,
            model: Some("gpt-4o".into()),
        };
        let mut priced = ctx(100);
        priced.prices = &gpt;
        let plan = plan_commit(state.clone(), step, &priced).expect("a plan");
        // 4 × 2.50 + 4 × 1.25 + 2 × 10 = 35 per million.
        assert_eq!(plan.iteration.cost_usd, Some(Decimal::new(35, 6)));
        // No `*` here: a step naming no model is unpriced, never 0.
        let plan = plan_commit(state.clone(), next_step(&state), &priced).expect("a plan");
        assert_eq!(plan.iteration.cost_usd, None);
        assert_eq!(plan.row.cost, (Decimal::ZERO, true));
        // A step without tokens costs nothing and is not unpriced.
        let mut step = next_step(&state);
        step.record.tokens = 0;
        step.usage = StepUsage::default();
        let plan = plan_commit(state, step, &priced).expect("a plan");
        assert_eq!(plan.row.cost, (Decimal::ZERO, false));
    }

    #[test]
    fn the_interval_checkpoint_is_folded_into_the_commit_that_reaches_it() {
        let state = after(LoopState::new(5), 1, 2);
        let plan = plan_commit(state.clone(), next_step(&state), &ctx(2)).expect("a plan");

        assert_eq!(plan.row.checkpointed, Some(2));
        assert_eq!(plan.row.checkpointed, Some(2));
        assert_eq!(plan.state_after.last_checkpoint_step, 2);
        // The snapshot is the state the loop goes on with, checkpoint mark included.
        let snapshot = plan.iteration.checkpoint.as_ref().expect("a snapshot");
        let snapshot: LoopState = serde_json::from_str(snapshot.as_str()).expect("it decodes");
        assert_eq!(snapshot, plan.state_after);
        assert_eq!(
            kinds(&plan),
            ["gate_decision", "iteration_completed", "checkpoint_saved"]
        );
        assert!(matches!(
            event(&plan, "checkpoint_saved"),
            SessionEvent::CheckpointSaved { iteration: 2, ref reason } if reason == "interval"
        ));
    }

    #[test]
    fn each_threshold_warns_once_with_the_step_that_crosses_it_and_survives_a_replay() {
        let limits = Limits {
            max_iterations: 20,
            ..LIMITS
        };
        let ctx = PlanContext {
            limits: &limits,
            ..ctx(100)
        };
        let mut state = LoopState::new(5);
        let mut crossed = Vec::new();
        for _ in 1..=20 {
            let step = next_step(&state);
            let plan = plan_commit(state, step, &ctx).expect("a plan");
            for w in &plan.row.budget_warnings {
                assert_eq!(w.budget, Budget::Iterations);
                crossed.push((w.iteration, w.threshold));
                match event(&plan, "budget_warning") {
                    SessionEvent::BudgetWarning {
                        threshold, note, ..
                    } => {
                        assert_eq!(threshold, w.threshold);
                        assert!(note.contains(&format!("{threshold}% of the iteration budget")));
                    }
                    other => panic!("{other:?}"),
                }
                assert!(plan.state_after.pending_budget_note.is_some());
            }
            state = plan.state_after;
        }
        assert_eq!(crossed, [(10, 50), (16, 80), (19, 95)]);
        // The state rebuilt from the stored effects knows what was sent.
        assert_eq!(
            state.budget_warnings_sent,
            [
                (Budget::Iterations, 50),
                (Budget::Iterations, 80),
                (Budget::Iterations, 95)
            ]
        );
        let quiet = Limits {
            warn_at: WarnAt::new(&[]).expect("none"),
            ..limits
        };
        let state = LoopState::new(5);
        let plan = plan_commit(
            state.clone(),
            next_step(&state),
            &PlanContext {
                limits: &Limits {
                    max_iterations: 1,
                    ..quiet
                },
                ..ctx
            },
        )
        .expect("a plan");
        assert!(
            plan.row.budget_warnings.is_empty(),
            "warn_at [] never warns"
        );
    }

    #[test]
    fn a_steps_cost_adds_to_the_usage_and_the_money_budget_warns() {
        // Each step: 10 tokens at `*` ($2 per million output) = $0.00002.
        let limits = Limits {
            max_cost_usd: Some(Decimal::new(1, 4)),
            ..LIMITS
        };
        let ctx = PlanContext {
            limits: &limits,
            ..ctx(100)
        };
        let mut state = LoopState::new(5);
        let mut crossed = Vec::new();
        for _ in 1..=5 {
            let plan = plan_commit(state.clone(), next_step(&state), &ctx).expect("a plan");
            crossed.extend(
                plan.row
                    .budget_warnings
                    .iter()
                    .filter(|w| w.budget == Budget::CostUsd)
                    .map(|w| (w.iteration, w.threshold, w.used.normalize().to_string())),
            );
            state = plan.state_after;
        }
        assert_eq!(state.usage.cost_usd, Decimal::new(10, 5));
        assert_eq!(state.usage.unpriced_steps, 0);
        assert_eq!(
            crossed,
            [
                (3, 50, "0.00006".to_string()),
                (4, 80, "0.00008".to_string()),
                (5, 95, "0.0001".to_string())
            ]
        );
        // The next guardrail check ends it: the budget is spent.
        assert_eq!(
            crate::policy::guardrails::check(&limits, &state.usage),
            Some(crate::policy::guardrails::Breach::MoneyLimit)
        );
        // An unpriced step is counted, and adds no cost.
        let gpt = PriceTable::parse("gpt-4o=2.50/10/1.25").expect("a table");
        let unpriced = PlanContext {
            prices: &gpt,
            ..ctx
        };
        let state = LoopState::new(5);
        let plan = plan_commit(state.clone(), next_step(&state), &unpriced).expect("a plan");
        assert_eq!(plan.state_after.usage.unpriced_steps, 1);
        assert_eq!(plan.state_after.usage.cost_usd, Decimal::ZERO);
    }

    #[test]
    fn steps_between_intervals_carry_no_checkpoint() {
        let mut state = LoopState::new(5);
        for n in 1..=5 {
            let step = next_step(&state);
            let plan = plan_commit(state, step, &ctx(3)).expect("a plan");
            let folded = plan.row.checkpointed.is_some();
            assert_eq!(folded, n == 3, "step {n}");
            assert_eq!(kinds(&plan).contains(&"checkpoint_saved"), folded);
            state = plan.state_after;
        }
        assert_eq!(state.last_checkpoint_step, 3);
    }

    #[test]
    fn a_step_that_ends_the_run_carries_no_interval_checkpoint() {
        let state = after(LoopState::new(5), 1, 2);
        let mut step = next_step(&state);
        step.signal = Some(Sentinel {
            kind: SignalKind::Done,
            reason: Some("the report is written".into()),
        });
        let plan = plan_commit(state, step, &ctx(2)).expect("a plan");

        assert_eq!(plan.row.checkpointed, None);
        assert_eq!(plan.state_after.last_checkpoint_step, 0);
        let end = plan.state_after.pending_end.as_ref().expect("the run ends");
        assert_eq!(end.reason, Reason::GoalAchieved);
        assert_eq!(
            kinds(&plan),
            ["gate_decision", "iteration_completed", "agent_signal"]
        );
    }

    #[test]
    fn an_interval_of_zero_checkpoints_every_step() {
        let state = after(LoopState::new(5), 2, 0);
        assert_eq!(state.last_checkpoint_step, 2);
        let plan = plan_commit(state.clone(), next_step(&state), &ctx(0)).expect("a plan");
        assert_eq!(plan.row.checkpointed, Some(3));
    }

    #[test]
    fn errors_count_in_a_row_and_a_success_resets_them() {
        let mut state = LoopState::new(5);
        for (n, outcome, streak) in [
            (1, Outcome::Error, 1),
            (2, Outcome::Failure, 0),
            (3, Outcome::Error, 1),
            (4, Outcome::Error, 2),
            (5, Outcome::Success, 0),
        ] {
            let mut step = next_step(&state);
            step.record.outcome = outcome;
            step.record.error = (outcome != Outcome::Success).then(|| "boom".to_string());
            let plan = plan_commit(state, step, &ctx(100)).expect("a plan");
            let label = match outcome {
                Outcome::Success => "success",
                Outcome::Failure => "failure",
                Outcome::Error => "error",
            };
            assert_eq!(plan.iteration.outcome, label, "step {n}");
            assert_eq!(
                plan.row.counters.usage.consecutive_errors, streak,
                "step {n}"
            );
            assert_eq!(
                plan.state_after.usage.consecutive_errors, streak,
                "step {n}"
            );
            state = plan.state_after;
        }
    }

    #[test]
    fn tokens_add_up_with_the_reflections_share_and_saturate() {
        let mut state = after(LoopState::new(5), 2, 100);
        state.reflection.tokens = 7;
        state.usage.tokens += 7;
        let plan = plan_commit(state.clone(), next_step(&state), &ctx(100)).expect("a plan");
        assert_eq!(plan.row.counters.usage.tokens, 37);
        assert_eq!(plan.row.counters.reflection_tokens, 7);
        assert_eq!(plan.row.counters.usage.tool_calls, 3);
        assert!(matches!(
            event(&plan, "iteration_completed"),
            SessionEvent::IterationCompleted {
                tokens: 10,
                tokens_used: 37,
                ..
            }
        ));

        // An agent may report any number: the row and the counters saturate.
        let mut step = next_step(&plan.state_after);
        step.record.tokens = u64::MAX;
        let plan = plan_commit(plan.state_after, step, &ctx(100)).expect("a plan");
        assert_eq!(plan.iteration.tokens, i64::MAX);
        assert_eq!(plan.row.counters.usage.tokens, u64::MAX);
        assert_eq!(plan.state_after.usage.tokens, u64::MAX);
        assert_eq!(plan.step_tokens, u64::MAX);
    }

    #[test]
    fn the_executors_events_come_between_the_decision_and_the_step() {
        let state = after(LoopState::new(5), 1, 2);
        let mut step = next_step(&state);
        step.events = vec![SessionEvent::StopRequested {}];
        step.sanitized = 3;
        let plan = plan_commit(state, step, &ctx(2)).expect("a plan");
        assert_eq!(
            kinds(&plan),
            [
                "gate_decision",
                "stop_requested",
                "iteration_completed",
                "agent_output_sanitized",
                "checkpoint_saved"
            ]
        );
        assert!(matches!(
            event(&plan, "agent_output_sanitized"),
            SessionEvent::AgentOutputSanitized {
                step: 2,
                nul_replaced: 3,
                ..
            }
        ));
    }

    #[test]
    fn a_cycle_change_moves_the_row_and_the_state_on() {
        let state = LoopState::new(5);
        let mut step = next_step(&state);
        step.cycle_change = Some(CycleChange {
            cycle: 2,
            memory: "what cycle 1 learned".into(),
        });
        step.transcript = Some(Vec::new());
        let plan = plan_commit(state, step, &ctx(100)).expect("a plan");
        assert_eq!(plan.iteration.cycle, 1, "the step ran in cycle 1");
        assert_eq!(
            plan.row.next_cycle,
            Some((2, "what cycle 1 learned".to_string()))
        );
        assert_eq!(plan.state_after.cycle, 2);
        assert_eq!(
            plan.iteration.transcript.as_ref().map(|t| t.as_str()),
            Some("[]")
        );
    }

    #[test]
    fn progress_gives_an_eta_and_is_kept_until_the_next_estimate() {
        let state = LoopState::new(5);
        let mut step = next_step(&state);
        step.percent = Some(50.0);
        let mut ctx = ctx(100);
        ctx.elapsed_ms = 10_000;
        let plan = plan_commit(state, step, &ctx).expect("a plan");
        assert_eq!(plan.row.percent_complete, Some(50.0));
        assert_eq!(plan.row.eta_seconds, Some(10.0));

        ctx.elapsed_ms = 20_000;
        let step = next_step(&plan.state_after);
        let plan = plan_commit(plan.state_after, step, &ctx).expect("a plan");
        assert_eq!(plan.row.percent_complete, Some(50.0));
        assert_eq!(plan.row.eta_seconds, Some(20.0));
    }

    #[test]
    fn a_step_repeating_itself_is_found_stuck_and_logged() {
        let mut state = LoopState::new(5);
        let mut last = None;
        for _ in 0..STUCK.same_observation {
            let mut step = next_step(&state);
            step.record.action = "poll".into();
            step.record.observation = "nothing yet".into();
            step.record.files_written.clear();
            let plan = plan_commit(state, step, &ctx(100)).expect("a plan");
            state = plan.state_after.clone();
            last = Some(plan);
        }
        let plan = last.expect("a plan");
        assert_eq!(
            kinds(&plan),
            ["gate_decision", "iteration_completed", "stuck_detected"]
        );
        assert!(plan.state_after.pending_nudge.is_some());
    }

    #[test]
    fn a_checkpoint_is_due_at_each_multiple_not_yet_saved_while_the_run_goes_on() {
        let at = |iterations, last_checkpoint_step| {
            let mut state = LoopState::new(5);
            state.usage.iterations = iterations;
            state.last_checkpoint_step = last_checkpoint_step;
            state
        };
        assert!(!checkpoint_due(&at(0, 0), 2), "nothing committed yet");
        assert!(!checkpoint_due(&at(1, 0), 2));
        assert!(checkpoint_due(&at(2, 0), 2));
        assert!(!checkpoint_due(&at(3, 2), 2));
        assert!(checkpoint_due(&at(4, 2), 2));
        assert!(!checkpoint_due(&at(4, 4), 2), "already saved");
        assert!(checkpoint_due(&at(1, 0), 0), "0 counts as 1");
        assert!(checkpoint_due(&at(1, 0), 1));

        let mut ending = at(2, 0);
        ending.pending_end = Some(loop_state::PendingEnd {
            reason: Reason::GoalAchieved,
            detail: None,
            review_pending: true,
        });
        assert!(!checkpoint_due(&ending, 2), "the end writes its own");
    }
}
