//! The replay phase: the policy-replay engine (`warden::policy::replay`)
//! over synthetic recorded sessions of 100 iterations each, in memory, as
//! the replay endpoint runs it once the rows are read: each session replayed
//! under the policy it ran with and under an override. Reading the rows
//! from Postgres is not in this figure.

use std::time::Instant;

use rust_decimal::Decimal;
use serde_json::json;
use warden::policy::delegation::ChildPausePolicy;
use warden::policy::gate::GateConfig;
use warden::policy::guardrails::{Limits, LimitsPatch};
use warden::policy::history::{Outcome, StepRecord};
use warden::policy::lifecycle::{Mode, Status};
use warden::policy::loop_state::{LoopState, StepEffects};
use warden::policy::replay::{
    self, Policy, PolicyOverride, RecordedEnd, RecordedStep, Recording, StuckPatch, Totals,
};
use warden::policy::sentinel::{Sentinel, SignalKind};
use warden::policy::soft_budget::WarnAt;
use warden::policy::stuck::StuckConfig;

/// Iterations of each synthetic session.
const STEPS: u64 = 100;

/// Session `k`'s steps: distinct work, a stretch of repeats in every
/// fifth, and a done-claim at its last step in every other.
fn steps(k: usize) -> Vec<RecordedStep> {
    (1..=STEPS)
        .map(|n| {
            let repeat = k.is_multiple_of(5) && (40..48).contains(&n);
            let action = if repeat {
                "look".to_string()
            } else {
                format!("write_{n}")
            };
            let record = StepRecord {
                number: n,
                action,
                arguments: if repeat { json!({}) } else { json!({ "n": n }) },
                outcome: Outcome::Success,
                observation: if repeat {
                    "same".into()
                } else {
                    format!("wrote {n}")
                },
                message: if repeat {
                    "looking".into()
                } else {
                    format!("step {n}")
                },
                error: None,
                tokens: 100 + (n % 7) * 10,
                tool_calls: 1,
                files_written: vec![],
                waiting: false,
                duration_ms: 50,
                context_overflow: false,
            };
            let signal = (k.is_multiple_of(2) && n == STEPS).then(|| Sentinel {
                kind: SignalKind::Done,
                reason: Some("done".into()),
            });
            RecordedStep {
                run: 1,
                record,
                effects: StepEffects {
                    rework: None,
                    stuck: None,
                    signal,
                    elapsed_ms: n * 50,
                    new_cycle: None,
                    percent_complete: Some(n as f64),
                    budget_warnings: Vec::new(),
                },
                cost_usd: Some(Decimal::new(1, 4)),
            }
        })
        .collect()
}

/// Session `k` with the end its own policy reaches.
fn recording(k: usize, policy: &Policy) -> Recording {
    let mut rec = Recording {
        start: LoopState::new(policy.limits.reflection_interval),
        mode: Mode::Fixed,
        has_children: false,
        tree: (false, ChildPausePolicy::default()),
        money_rate: None,
        steps: steps(k),
        reflections: Vec::new(),
        tokens_charged: 0,
        end: RecordedEnd {
            status: Status::Interrupted,
            reason: Some(warden::policy::lifecycle::Reason::UserStop),
            iterations: STEPS,
            tokens: 0,
            cost_usd: Decimal::ZERO,
            elapsed_ms: STEPS * 50,
            run: 1,
        },
    };
    let own = replay::run(&rec, policy);
    rec.end.status = own.status.unwrap_or(Status::Interrupted);
    rec.end.reason = own.reason;
    rec.end.iterations = own.iterations;
    rec.end.tokens = own.tokens;
    rec.end.cost_usd = own.cost_usd;
    rec
}

/// Replays `n` synthetic sessions; answers sessions per second and the totals.
pub fn phase(n: usize) -> (f64, Totals) {
    let limits = Limits {
        max_iterations: STEPS,
        max_wall_time_ms: 86_400_000,
        max_tokens: 10_000_000,
        max_consecutive_errors: 5,
        reflection_interval: 10,
        reflection_adaptive: false,
        checkpoint_interval: 10,
        max_tool_calls: None,
        max_cycles: 10,
        context_budget_tokens: 32_000,
        review_every: None,
        warn_at: WarnAt::DEFAULT,
        max_cost_usd: None,
    };
    let base = Policy::recorded(GateConfig::default(), StuckConfig::default(), limits);
    let over = PolicyOverride {
        limits: LimitsPatch {
            max_iterations: Some(80),
            ..LimitsPatch::default()
        },
        stuck: StuckPatch {
            same_observation: Some(3),
            ..StuckPatch::default()
        },
        ..PolicyOverride::default()
    }
    .apply(&base)
    .expect("an override in range");
    let sessions: Vec<Recording> = (0..n).map(|k| recording(k, &base)).collect();
    let started = Instant::now();
    let mut totals = Totals::default();
    for rec in &sessions {
        totals.add(&replay::replay(rec, &base, &over));
    }
    let secs = started.elapsed().as_secs_f64();
    (n as f64 / secs.max(f64::EPSILON), totals)
}
