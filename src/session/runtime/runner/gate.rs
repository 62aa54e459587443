//! The checks before a step: the guardrails (a hard limit reached ends the
//! run), the continue gate (stop, pause, throttle, checkpoint or continue),
//! and after it the overspent budget.

use std::time::{Duration, Instant};

use super::{Flow, Pass, Runner};
use crate::event::SessionEvent;
use crate::policy::budget;
use crate::policy::gate::{self, GateDecision, GateEvaluation, GateMetrics, PauseCause, StopCause};
use crate::policy::guardrails::{self, Limits, Usage};
use crate::policy::history::StepRecord;
use crate::policy::lifecycle::Reason;
use crate::policy::termination;
use crate::session::event_codec::{self, to_stored};
use crate::session::runtime::loop_store::LoopStore;
use crate::store::StoreError;
use crate::telemetry;
use opentelemetry::KeyValue;

/// The gate let a step run: its number and the decision to log with it.
pub(super) struct Gated {
    pub(super) step: u64,
    pub(super) decision: SessionEvent,
}

/// The gate's evaluation for one step, with the event that logs it.
struct Judged {
    evaluation: GateEvaluation,
    event: SessionEvent,
    /// The token budget left when it was evaluated.
    tokens_remaining: Option<u64>,
    /// The money budget, not the token budget, set what was left.
    money_bound: bool,
}

impl<S: LoopStore> Runner<S> {
    /// Guardrails: a limit reached ends the run.
    pub(super) async fn guardrails(&mut self) -> Result<Flow<Usage>, StoreError> {
        let usage = self.current_usage();
        let limits = self.settings.limits;
        let Some(breach) = guardrails::check(&limits, &usage) else {
            return Ok(Flow::Go(usage));
        };
        let detail = breach.describe(&limits, &usage);
        let event = SessionEvent::GuardrailTripped {
            breach,
            usage,
            limits,
        };
        let exit = self.finish(breach.reason(), detail, vec![event]).await?;
        Ok(Flow::Exit(exit))
    }

    /// Gate: stop, pause, throttle (a cooldown, then a new pass), checkpoint
    /// or continue.
    pub(super) async fn gate(
        &mut self,
        usage: &Usage,
        pass: &mut Pass,
    ) -> Result<Flow<Gated>, StoreError> {
        let step = usage.iterations + 1;
        let judged = self.evaluate_gate(step, usage)?;
        let decision = judged.event;
        match judged.evaluation.decision {
            GateDecision::Stop { cause } => {
                let exit = self
                    .finish(stop_reason(cause), None, vec![decision])
                    .await?;
                Ok(Flow::Exit(exit))
            }
            GateDecision::Pause { cause } => {
                let (reason, mut detail) = pause_end(
                    cause,
                    &judged.evaluation.metrics,
                    judged.tokens_remaining,
                    self.config.gate.rework_window,
                    &self.state.history,
                );
                if judged.money_bound && reason == Reason::BudgetProjectedOverrun {
                    detail = Some(money_overrun_detail(
                        &self.settings.limits,
                        &self.state.usage,
                        judged.tokens_remaining,
                    ));
                }
                let exit = self.finish(reason, detail, vec![decision]).await?;
                Ok(Flow::Exit(exit))
            }
            GateDecision::Throttle if self.throttled_step != Some(step) => {
                self.throttled_step = Some(step);
                self.throttle(decision).await?;
                Ok(Flow::Again)
            }
            GateDecision::Checkpoint => {
                let started = Instant::now();
                self.checkpoint("gate").await?;
                pass.writes += started.elapsed();
                Ok(Flow::Go(Gated { step, decision }))
            }
            GateDecision::Throttle | GateDecision::Continue => {
                Ok(Flow::Go(Gated { step, decision }))
            }
        }
    }

    /// Evaluates the continue gate before `step` and counts its decision.
    fn evaluate_gate(&self, step: u64, usage: &Usage) -> Result<Judged, StoreError> {
        let limits = self.settings.limits;
        let deltas = self.state.token_deltas();
        let mut inputs = self.state.gate_inputs(self.settings.mode, &limits, &deltas);
        inputs.budget.time_remaining_ms = Some(guardrails::time_remaining_ms(&limits, usage));
        // A money budget is held as the tokens it pays for at the model's
        // price: the projections pause before a step that would not fit it.
        let money = self.money_allowance();
        let money_bound = inputs.budget.tokens_remaining.is_some_and(|t| money < t);
        if money_bound {
            inputs.budget.tokens_remaining = Some(money);
        }
        inputs.coherence = self.state.reflection.coherence;
        inputs.uncertainty = self.state.reflection.uncertainty;
        let evaluation = gate::evaluate(&self.config.gate, &inputs);
        self.metrics.gate(decision_label(&evaluation.decision));
        telemetry::add_event("warden.gate", || {
            let mut attributes = vec![KeyValue::new(
                "warden.gate.decision",
                decision_label(&evaluation.decision),
            )];
            if let Ok(decision) = serde_json::to_value(evaluation.decision) {
                attributes.extend(telemetry::json_attributes("warden.gate.decided", &decision));
            }
            if let Ok(metrics) = serde_json::to_value(evaluation.metrics) {
                attributes.extend(telemetry::json_attributes("warden.gate", &metrics));
            }
            attributes
        });
        let event = SessionEvent::GateDecision {
            step,
            decision: evaluation.decision,
            metrics: evaluation.metrics,
            inputs: to_stored("gate inputs", &inputs)?,
        };
        Ok(Judged {
            evaluation,
            event,
            tokens_remaining: inputs.budget.tokens_remaining,
            money_bound,
        })
    }

    /// Logs a throttle decision and waits out the cooldown; the stop checks
    /// keep running during it.
    async fn throttle(&mut self, decision: SessionEvent) -> Result<(), StoreError> {
        let events = event_codec::encode(&[decision])?;
        let flags = Box::pin(self.store.append_fenced(&self.lease, &events)).await?;
        self.view.appended(&flags);
        self.apply_flags(flags);
        let remaining = guardrails::time_remaining_ms(&self.settings.limits, &self.current_usage());
        let cooldown = self
            .config
            .throttle_cooldown
            .min(Duration::from_millis(remaining));
        tokio::select! {
            _ = self.control.stop.cancelled() => {}
            _ = self.control.shutdown.cancelled() => {}
            _ = tokio::time::sleep(cooldown) => {}
        }
        Ok(())
    }

    /// A step reported more tokens than it was allowed: it is committed as
    /// spending its whole allowance (a reported count is never taken past
    /// it), and the budget is over, whatever else the step said.
    pub(super) async fn overspent(
        &mut self,
        number: u64,
        overspent: budget::Overspent,
    ) -> Result<super::Exit, StoreError> {
        let event = SessionEvent::GuardrailTripped {
            breach: guardrails::Breach::CostLimit,
            usage: self.current_usage(),
            limits: self.settings.limits,
        };
        let detail = Some(overspent.describe(number));
        self.finish(Reason::CostLimit, detail, vec![event]).await
    }
}

/// The metrics' name for a gate decision.
fn decision_label(decision: &GateDecision) -> &'static str {
    match decision {
        GateDecision::Stop { .. } => "stop",
        GateDecision::Pause { .. } => "pause",
        GateDecision::Throttle => "throttle",
        GateDecision::Checkpoint => "checkpoint",
        GateDecision::Continue => "continue",
    }
}

/// The end a gate stop records.
fn stop_reason(cause: StopCause) -> Reason {
    match cause {
        StopCause::CoherenceLow => Reason::CoherenceLow,
        StopCause::StepLimit => Reason::StepLimit,
        StopCause::BudgetExhausted { .. } => Reason::BudgetExhausted,
    }
}

/// What a pause before a step the money budget cannot pay for says.
fn money_overrun_detail(limits: &Limits, usage: &Usage, tokens: Option<u64>) -> String {
    let max = limits.max_cost_usd.unwrap_or_default().normalize();
    let left = guardrails::cost_remaining(limits, usage)
        .unwrap_or_default()
        .normalize();
    format!(
        "the next step is projected to cost more than the {left} USD left of the money budget of {max} USD ({} tokens at the model's price); resume with a higher max_cost_usd to go on",
        tokens.unwrap_or(0)
    )
}

/// The end a gate pause records, with what the person who resumes reads.
fn pause_end(
    cause: PauseCause,
    metrics: &GateMetrics,
    tokens_remaining: Option<u64>,
    rework_window: usize,
    history: &[StepRecord],
) -> (Reason, Option<String>) {
    match cause {
        PauseCause::ReworkLoop => (
            Reason::ReworkLoop,
            Some(format!(
                "rework ratio {:.2} over the last {rework_window} steps",
                metrics.rework_ratio
            )),
        ),
        PauseCause::Uncertainty => (Reason::Uncertainty, None),
        PauseCause::NextStepOverrun => (
            Reason::BudgetProjectedOverrun,
            Some(
                budget::ProjectedOverrun {
                    projected: metrics.next_step_tokens,
                    allowance: tokens_remaining.unwrap_or(0),
                }
                .describe(),
            ),
        ),
        PauseCause::ProjectedOverrun => (
            Reason::BudgetProjectedOverrun,
            metrics.projection.map(|p| p.describe()),
        ),
        PauseCause::ReviewRequired => (
            Reason::ReviewRequired,
            Some(termination::review_summary(
                metrics.steps_since_start,
                history,
            )),
        ),
    }
}
