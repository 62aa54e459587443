//! Reflection: in continuous mode the server's model looks at the recent
//! steps every so often, and gives the second vote on an agent's claim that
//! the goal is done. Its verdict is stored and folded into the state.

use std::time::Instant;

use super::{Exit, Flow, Runner};
use crate::event::SessionEvent;
use crate::policy::checklist;
use crate::policy::guardrails::{self, Usage};
use crate::policy::lifecycle::{Mode, Reason};
use crate::policy::loop_state::{self, AppliedReflection};
use crate::policy::reflection::{self, Trigger, Verdict};
use crate::policy::reflection_interval::{self, IntervalInputs};
use crate::policy::{gate, stuck};
use crate::session::event_codec;
use crate::session::runtime::loop_store::{LoopStore, ReflectionCommit};
use crate::session::runtime::reflector::{ReflectionAnswer, Reflector, SessionFacts};
use crate::session::runtime::storable::make_reflection_storable;
use crate::store::{Counters, NewReflection, ReflectionSummary, StoreError};
use crate::telemetry;
use opentelemetry::KeyValue;

impl<S: LoopStore> Runner<S> {
    /// Signals: a reflection due in continuous mode (including the second
    /// vote on the agent's done-claim); the pass starts over after it.
    pub(super) async fn reflect_if_due(&mut self) -> Result<Flow, StoreError> {
        let Some(trigger) = self.reflection_due() else {
            return Ok(Flow::Go(()));
        };
        if self.reflector.is_some() && self.reflection_deferred_by_rate_limit().await? {
            return Ok(Flow::Go(()));
        }
        // Boxed: a reflection's model call is the largest await there is.
        Ok(match Box::pin(self.reflect(trigger)).await? {
            Some(exit) => Flow::Exit(exit),
            None => Flow::Again,
        })
    }

    /// Whether a reflection runs now: continuous mode, a reflector, and the
    /// interval elapsed or the agent claimed the goal is done.
    fn reflection_due(&self) -> Option<Trigger> {
        if self.settings.mode != Mode::Continuous || self.reflector.is_none() {
            return None;
        }
        let claim = self.state.claim_under_review().is_some();
        let iterations = self.state.usage.iterations;
        if !claim && (iterations == 0 || iterations <= self.state.reflection.last_at) {
            return None;
        }
        reflection::due(&self.state.reflection, iterations, claim)
    }

    /// The server's model is the operator's: a tenant over its rate limit
    /// defers a due reflection to the next step (the loop goes on under its
    /// guardrails) rather than failing the session. True when deferred; the
    /// event is logged once per wait.
    async fn reflection_deferred_by_rate_limit(&mut self) -> Result<bool, StoreError> {
        let Err(limited) = self.model_calls.admit(&self.tenant).await else {
            self.reflection_deferred = false;
            self.metrics.model_call(&self.tenant, true);
            return Ok(false);
        };
        self.metrics.model_call(&self.tenant, false);
        if !self.reflection_deferred {
            self.reflection_deferred = true;
            tracing::info!(tenant = %self.tenant, "reflection deferred by the tenant's model-call rate limit");
            let events = event_codec::encode(&[SessionEvent::ReflectionDeferred {
                number: u64::from(self.state.reflection.count) + 1,
                reason: "tenant_model_rate_limit".into(),
                retry_after_ms: u64::try_from(limited.retry_after.as_millis()).unwrap_or(u64::MAX),
            }])?;
            let flags = Box::pin(self.store.append_fenced(&self.lease, &events)).await?;
            self.view.appended(&flags);
            self.apply_flags(flags);
        }
        Ok(true)
    }

    /// Runs one reflection and applies its verdict; `Some` when the session
    /// was stopped or handed over meanwhile.
    async fn reflect(&mut self, trigger: Trigger) -> Result<Option<Exit>, StoreError> {
        let Some(reflector) = self.reflector.clone() else {
            return Ok(None);
        };
        let usage = self.current_usage();
        let claim = self
            .state
            .claim_under_review()
            .map(|c| c.detail.clone().unwrap_or_default());
        let asked = self
            .ask(&reflector, trigger, &usage, claim.as_deref())
            .await;
        let Some(mut answer) = asked else {
            return if self.control.stop.is_cancelled() {
                self.finish(Reason::UserStop, None, Vec::new())
                    .await
                    .map(Some)
            } else {
                self.release().await.map(Some)
            };
        };
        // Model text is made storable before it reaches the state or a row.
        make_reflection_storable(&mut answer);
        let mut applied = self.verdict(&answer, trigger, usage.iterations, claim);
        // A completed session reflects no more: its interval is left as it was.
        let (interval, change) = if applied.verdict == Verdict::Complete {
            (self.state.reflection.interval, None)
        } else {
            self.next_interval(&answer, usage.iterations)
        };
        applied.state_after.interval = interval;
        self.store_reflection(&answer, &applied, trigger, &usage)
            .await?;
        if let Some(change) = change {
            let events = event_codec::encode(&[change])?;
            let flags = Box::pin(self.store.append_fenced(&self.lease, &events)).await?;
            self.view.appended(&flags);
            self.apply_flags(flags);
        }
        Ok(None)
    }

    /// The interval until the next reflection (`policy::reflection_interval`
    /// over the gate's rework ratio, the stuck detector and the answer) and,
    /// when the adaptive interval changed, the event that records why.
    fn next_interval(
        &self,
        answer: &ReflectionAnswer,
        iterations: u64,
    ) -> (u32, Option<SessionEvent>) {
        let limits = &self.settings.limits;
        let assessment = answer.assessment.as_ref().ok();
        let inputs = IntervalInputs {
            current: self.state.reflection.interval,
            rework_ratio: gate::rework_ratio(&self.state.rework, self.config.gate.rework_window),
            stuck: stuck::detect(
                &self.config.stuck,
                &self.state.history,
                self.state.total_wait_ms,
            )
            .is_some(),
            progress: assessment.map(|a| a.progress),
            loop_detected: assessment.is_some_and(|a| a.loop_detected),
            percent_before: self.state.percent_complete,
            percent_now: assessment.map(|a| a.percent_complete),
            uncertainty: assessment.and_then(|a| a.uncertainty),
        };
        let decision = reflection_interval::next_interval(
            limits.reflection_adaptive,
            limits.reflection_interval,
            &inputs,
        );
        let change = (limits.reflection_adaptive && decision.interval != inputs.current).then_some(
            SessionEvent::ReflectionIntervalChanged {
                after_iteration: iterations,
                from: inputs.current,
                to: decision.interval,
                cause: decision.cause,
                inputs,
            },
        );
        (decision.interval, change)
    }

    /// Asks the reflection model about the recent steps; `None` when a stop
    /// or a shutdown came first.
    async fn ask(
        &mut self,
        reflector: &Reflector,
        trigger: Trigger,
        usage: &Usage,
        claim: Option<&str>,
    ) -> Option<ReflectionAnswer> {
        let window = usize::try_from(self.state.reflection.interval)
            .unwrap_or(usize::MAX)
            .max(1);
        let recent = &self.state.history[self.state.history.len().saturating_sub(window)..];
        let facts = SessionFacts {
            goal: &self.goal,
            iterations: usage.iterations,
            elapsed_ms: usage.elapsed_ms,
            tokens: usage.tokens,
            recent,
            trigger,
            claim,
            criteria: &self.state.criteria,
            milestones: &self.state.milestones,
        };
        let allowance = guardrails::tokens_remaining(&self.settings.limits, usage)
            .min(self.config.models.max_tokens_per_call);
        let metrics = &self.metrics;
        tokio::select! {
            biased;
            _ = self.control.stop.cancelled() => None,
            _ = self.control.shutdown.cancelled() => None,
            answer = async {
                let called = Instant::now();
                let answer = reflector.reflect(&facts, allowance).await;
                metrics.model_seconds.observe(called.elapsed());
                answer
            } => Some(answer),
        }
    }

    /// The verdict on an answer: what reflection policy decides from it (or
    /// from its failure), with the checklists ticked.
    fn verdict(
        &self,
        answer: &ReflectionAnswer,
        trigger: Trigger,
        iterations: u64,
        claim: Option<String>,
    ) -> AppliedReflection {
        let base = self.settings.limits.reflection_interval;
        let prior = self.state.reflection;
        let mut criteria = self.state.criteria.clone();
        let mut milestones = self.state.milestones.clone();
        let (verdict, state_after, percent, reasoning) = match &answer.assessment {
            Ok(a) => {
                criteria = checklist::mark(&criteria, &a.criteria_met, iterations);
                milestones = checklist::mark(&milestones, &a.milestones_done, iterations);
                let unmet = checklist::unmet(&criteria);
                let (v, st) =
                    reflection::decide(&prior, a, &unmet, trigger, base, iterations, answer.tokens);
                (v, st, Some(a.percent_complete), Some(a.reasoning.clone()))
            }
            Err(err) => {
                tracing::warn!(error = %err, "reflection failed; continuing under the fixed limits");
                let (v, st) =
                    reflection::on_failure(&prior, trigger, base, iterations, answer.tokens);
                let reasoning = match &v {
                    Verdict::Pause { .. } => Some(err.clone()),
                    _ => claim,
                };
                (v, st, None, reasoning)
            }
        };
        self.metrics.tokens(answer.tokens);
        self.metrics.reflection(verdict_label(&verdict));
        telemetry::add_event("warden.reflection", || {
            let mut attributes = vec![
                KeyValue::new("warden.reflection.verdict", verdict_label(&verdict)),
                KeyValue::new("warden.reflection.trigger", format!("{trigger:?}")),
                KeyValue::new("warden.reflection.tokens", answer.tokens as i64),
            ];
            if let Ok(a) = &answer.assessment {
                attributes.extend([
                    KeyValue::new("warden.reflection.percent_complete", a.percent_complete),
                    KeyValue::new("warden.reflection.loop_detected", a.loop_detected),
                ]);
                attributes.extend(
                    a.coherence
                        .map(|c| KeyValue::new("warden.reflection.coherence", c)),
                );
                attributes.extend(
                    a.uncertainty
                        .map(|u| KeyValue::new("warden.reflection.uncertainty", u)),
                );
            }
            attributes
        });
        AppliedReflection {
            verdict,
            state_after,
            percent_complete: percent,
            reasoning,
            criteria,
            milestones,
        }
    }

    /// Stores the reflection with what it changed on the session, then
    /// folds it into the state.
    async fn store_reflection(
        &mut self,
        answer: &ReflectionAnswer,
        applied: &AppliedReflection,
        trigger: Trigger,
        usage: &Usage,
    ) -> Result<(), StoreError> {
        let mut next = self.state.clone();
        next.apply_reflection(applied);
        let record = reflection_row(answer, applied, trigger, usage.iterations);
        let counters = Counters::from_usage(
            &Usage {
                elapsed_ms: usage.elapsed_ms,
                ..next.usage
            },
            next.reflection.tokens,
            next.charges_seen,
        );
        let commit = ReflectionCommit {
            record: &record,
            counters,
            percent_complete: next.percent_complete,
            eta_seconds: loop_state::eta_seconds(next.percent_complete, usage.elapsed_ms),
            criteria: &next.criteria,
            milestones: &next.milestones,
        };
        self.store.insert_reflection(&self.lease, commit).await?;
        self.view.invalidate();
        self.state = next;
        Ok(())
    }
}

/// The metrics' name for a reflection verdict.
fn verdict_label(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Complete => "complete",
        Verdict::Pause { .. } => "pause",
        Verdict::Reject { .. } => "reject",
        Verdict::Continue => "continue",
        Verdict::Monitor => "monitor",
    }
}

/// The reflection row: the answer, the decision taken on it, and the
/// interval until the next one.
fn reflection_row(
    answer: &ReflectionAnswer,
    applied: &AppliedReflection,
    trigger: Trigger,
    after_iteration: u64,
) -> NewReflection {
    NewReflection {
        summary: ReflectionSummary {
            number: i32::try_from(applied.state_after.attempts).unwrap_or(i32::MAX),
            after_iteration: after_iteration as i64,
            trigger: match trigger {
                Trigger::Interval => "interval".into(),
                Trigger::AgentClaimedDone => "agent_claimed_done".into(),
            },
            ok: answer.assessment.is_ok(),
            assessment: answer.assessment.as_ref().ok().cloned(),
            error: answer.assessment.as_ref().err().cloned(),
            decision: applied.clone(),
            next_interval: i32::try_from(applied.state_after.interval).unwrap_or(i32::MAX),
            tokens: answer.tokens as i64,
        },
        raw: answer.raw.clone(),
    }
}
