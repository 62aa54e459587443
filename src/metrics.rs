//! Prometheus metrics of one Warden process: counters and histograms kept in
//! atomics, rendered in the text exposition format at `/metrics`. Session
//! counts by status come from Postgres at scrape time, so every replica
//! reports the same fleet-wide gauge.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rust_decimal::Decimal;

/// A cumulative histogram with fixed bucket bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            d.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

const FAST: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const SLOW: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Fine buckets for the supervisor's own time per iteration, where the
/// interesting range is tens of microseconds to a few milliseconds.
const OVERHEAD: &[f64] = &[
    0.00005, 0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The metrics of this process.
#[derive(Debug)]
pub struct Metrics {
    iterations: AtomicU64,
    archived_sessions: AtomicU64,
    archive_failures: AtomicU64,
    compacted_events: AtomicU64,
    tokens: AtomicU64,
    terminations: Mutex<BTreeMap<String, u64>>,
    reflections: Mutex<BTreeMap<String, u64>>,
    gate: Mutex<BTreeMap<String, u64>>,
    model_calls: Mutex<BTreeMap<String, u64>>,
    model_calls_limited: Mutex<BTreeMap<String, u64>>,
    /// Money the committed steps of each tenant cost (exact), and its
    /// steps no price entry priced.
    tenant_cost: Mutex<BTreeMap<String, Decimal>>,
    tenant_unpriced: Mutex<BTreeMap<String, u64>>,
    /// Wall time of whole iterations.
    pub iteration_seconds: Histogram,
    /// Latency of model calls (agent and reflection).
    pub model_seconds: Histogram,
    /// Stop request received → stop recorded.
    pub stop_seconds: Histogram,
    /// Wall time of an iteration minus the executor's own time: the loop,
    /// the policies and the commit.
    pub overhead_seconds: Histogram,
    /// The part of the overhead spent waiting for durable writes.
    pub writes_seconds: Histogram,
    /// The overhead without the durable writes: the loop and the policies alone.
    pub supervisor_seconds: Histogram,
}

/// Where the wall time of one iteration went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IterationTimes {
    /// The whole iteration, from the top of the loop to its commit.
    pub total: Duration,
    /// The executor's own time (the step).
    pub executor: Duration,
    /// Waiting for durable writes: the iteration's commit and any checkpoint.
    pub writes: Duration,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            iterations: AtomicU64::new(0),
            archived_sessions: AtomicU64::new(0),
            archive_failures: AtomicU64::new(0),
            compacted_events: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            terminations: Mutex::new(BTreeMap::new()),
            reflections: Mutex::new(BTreeMap::new()),
            model_calls: Mutex::new(BTreeMap::new()),
            model_calls_limited: Mutex::new(BTreeMap::new()),
            tenant_cost: Mutex::new(BTreeMap::new()),
            tenant_unpriced: Mutex::new(BTreeMap::new()),
            gate: Mutex::new(BTreeMap::new()),
            iteration_seconds: Histogram::new(SLOW),
            model_seconds: Histogram::new(SLOW),
            stop_seconds: Histogram::new(FAST),
            overhead_seconds: Histogram::new(OVERHEAD),
            writes_seconds: Histogram::new(OVERHEAD),
            supervisor_seconds: Histogram::new(OVERHEAD),
        }
    }
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(key.to_string()).or_insert(0) += 1;
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Counts a committed iteration and where its wall time went.
    pub fn iteration(&self, tokens: u64, times: IterationTimes) {
        self.iterations.fetch_add(1, Ordering::Relaxed);
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        let overhead = times.total.saturating_sub(times.executor);
        self.iteration_seconds.observe(times.total);
        self.overhead_seconds.observe(overhead);
        self.writes_seconds.observe(times.writes);
        self.supervisor_seconds
            .observe(overhead.saturating_sub(times.writes));
    }

    /// Adds a committed step's cost to its tenant's (an unpriced step is
    /// counted apart).
    pub fn cost(&self, tenant: &str, usd: Decimal, unpriced: bool) {
        if unpriced {
            bump(&self.tenant_unpriced, tenant);
        }
        if !usd.is_zero() {
            let mut map = self.tenant_cost.lock().unwrap_or_else(|p| p.into_inner());
            let sum = map.entry(tenant.to_string()).or_insert(Decimal::ZERO);
            *sum = sum.saturating_add(usd);
        }
    }

    /// Counts sessions archived and deleted by retention.
    pub fn archived(&self, sessions: u64) {
        self.archived_sessions
            .fetch_add(sessions, Ordering::Relaxed);
    }

    /// Counts a session whose archive could not be written.
    pub fn archive_failed(&self) {
        self.archive_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts events dropped by compaction.
    pub fn compacted(&self, events: u64) {
        self.compacted_events.fetch_add(events, Ordering::Relaxed);
    }

    /// Counts tokens spent outside iterations (reflection).
    pub fn tokens(&self, tokens: u64) {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Counts a session's loop ending with `reason`.
    pub fn termination(&self, reason: &str) {
        bump(&self.terminations, reason);
    }

    /// Counts a reflection decision.
    pub fn reflection(&self, decision: &str) {
        bump(&self.reflections, decision);
    }

    /// Counts a call of `tenant` on the server's own model: made, or
    /// refused by the tenant's rate limit.
    pub fn model_call(&self, tenant: &str, allowed: bool) {
        if allowed {
            bump(&self.model_calls, tenant);
        } else {
            bump(&self.model_calls_limited, tenant);
        }
    }

    /// Counts a gate decision.
    pub fn gate(&self, decision: &str) {
        bump(&self.gate, decision);
    }

    /// The text exposition, with `sessions` (status → count) as a gauge.
    pub fn render(&self, sessions: &BTreeMap<String, i64>, desk: DeskGauges) -> String {
        let mut out = String::new();
        render_sessions(&mut out, sessions);
        render_desk(&mut out, desk);
        self.render_totals(&mut out);
        self.render_labelled(&mut out);
        self.render_cost(&mut out);
        self.render_durations(&mut out);
        out
    }

    /// The process's plain counters.
    fn render_totals(&self, out: &mut String) {
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        counter(
            out,
            "warden_iterations_total",
            "Iterations committed by this process.",
            self.iterations.load(Ordering::Relaxed),
        );
        counter(
            out,
            "warden_tokens_total",
            "Tokens charged by this process (agent and reflection).",
            self.tokens.load(Ordering::Relaxed),
        );
        counter(
            out,
            "warden_archived_sessions_total",
            "Ended sessions archived and deleted by retention in this process.",
            self.archived_sessions.load(Ordering::Relaxed),
        );
        counter(
            out,
            "warden_archive_failures_total",
            "Sessions whose archive file could not be written (kept, tried again).",
            self.archive_failures.load(Ordering::Relaxed),
        );
        counter(
            out,
            "warden_compacted_events_total",
            "Events dropped by compaction past the horizon in this process.",
            self.compacted_events.load(Ordering::Relaxed),
        );
    }

    /// The counters kept by a label (reason, decision, tenant).
    fn render_labelled(&self, out: &mut String) {
        for (name, help, label, map) in [
            (
                "warden_terminations_total",
                "Session loops ended by this process, by reason.",
                "reason",
                &self.terminations,
            ),
            (
                "warden_reflections_total",
                "Reflections by decision.",
                "decision",
                &self.reflections,
            ),
            (
                "warden_gate_decisions_total",
                "Continue-gate evaluations by decision.",
                "decision",
                &self.gate,
            ),
            (
                "warden_tenant_model_calls_total",
                "Calls on the server's own model (refinement, criteria, reflection) by tenant.",
                "tenant",
                &self.model_calls,
            ),
            (
                "warden_tenant_model_calls_limited_total",
                "Calls on the server's own model refused by the tenant's rate limit, by tenant.",
                "tenant",
                &self.model_calls_limited,
            ),
            (
                "warden_tenant_unpriced_steps_total",
                "Committed steps whose model no WARDEN_MODEL_PRICES entry prices, by tenant.",
                "tenant",
                &self.tenant_unpriced,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let map = map.lock().unwrap_or_else(|p| p.into_inner());
            for (key, value) in map.iter() {
                let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {value}", escape(key));
            }
        }
    }

    /// The money counter: USD, exact decimals, by tenant.
    fn render_cost(&self, out: &mut String) {
        let name = "warden_tenant_cost_usd_total";
        let _ = writeln!(
            out,
            "# HELP {name} Money the steps committed in this process cost at WARDEN_MODEL_PRICES, USD, by tenant."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        let map = self.tenant_cost.lock().unwrap_or_else(|p| p.into_inner());
        for (tenant, usd) in map.iter() {
            let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {usd}", escape(tenant));
        }
    }

    /// The duration histograms.
    fn render_durations(&self, out: &mut String) {
        self.iteration_seconds.render(
            out,
            "warden_iteration_duration_seconds",
            "Wall time of an iteration, executor included.",
        );
        self.model_seconds.render(
            out,
            "warden_model_latency_seconds",
            "Latency of model calls.",
        );
        self.stop_seconds.render(
            out,
            "warden_stop_latency_seconds",
            "Stop request received to stop recorded.",
        );
        self.overhead_seconds.render(
            out,
            "warden_iteration_overhead_seconds",
            "Iteration wall time minus the executor's time: loop, policies and commit.",
        );
        self.writes_seconds.render(
            out,
            "warden_iteration_writes_seconds",
            "Time an iteration waited for durable writes (its commit, checkpoints).",
        );
        self.supervisor_seconds.render(
            out,
            "warden_iteration_supervisor_seconds",
            "Iteration overhead without durable writes: the loop and policies alone.",
        );
    }
}

/// This replica's worker desk: claims waiting here, and steps handed to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeskGauges {
    /// Worker claims waiting here for a step.
    pub claims_waiting: u64,
    /// Steps handed to a claim waiting here, since start.
    pub steps_handed: u64,
}

fn render_desk(out: &mut String, desk: DeskGauges) {
    let _ = writeln!(
        out,
        "# HELP warden_worker_claims_waiting Worker claims waiting at this replica for a step."
    );
    let _ = writeln!(out, "# TYPE warden_worker_claims_waiting gauge");
    let _ = writeln!(out, "warden_worker_claims_waiting {}", desk.claims_waiting);
    let _ = writeln!(
        out,
        "# HELP warden_worker_steps_handed_total Steps handed to a claim waiting at this replica as they were offered."
    );
    let _ = writeln!(out, "# TYPE warden_worker_steps_handed_total counter");
    let _ = writeln!(
        out,
        "warden_worker_steps_handed_total {}",
        desk.steps_handed
    );
}

/// The sessions gauge, by status (every status, zero when none).
fn render_sessions(out: &mut String, sessions: &BTreeMap<String, i64>) {
    let _ = writeln!(
        out,
        "# HELP warden_sessions Sessions by status (all replicas)."
    );
    let _ = writeln!(out, "# TYPE warden_sessions gauge");
    for status in crate::policy::lifecycle::Status::ALL {
        let n = sessions.get(status.as_str()).copied().unwrap_or(0);
        let _ = writeln!(out, "warden_sessions{{status=\"{}\"}} {n}", status.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_labels_and_cumulative_buckets() {
        let m = Metrics::default();
        m.iteration(
            10,
            IterationTimes {
                total: Duration::from_micros(30_080),
                executor: Duration::from_millis(30),
                writes: Duration::from_micros(50),
            },
        );
        m.iteration(
            5,
            IterationTimes {
                total: Duration::from_micros(300_900),
                executor: Duration::from_millis(300),
                writes: Duration::from_micros(700),
            },
        );
        m.termination("goal_achieved");
        m.gate("continue");
        m.gate("continue");
        m.stop_seconds.observe(Duration::from_millis(3));
        let mut sessions = BTreeMap::new();
        sessions.insert("completed".to_string(), 2);
        let text = m.render(
            &sessions,
            DeskGauges {
                claims_waiting: 3,
                steps_handed: 7,
            },
        );
        assert!(text.contains("warden_worker_claims_waiting 3\n"), "{text}");
        assert!(
            text.contains("warden_worker_steps_handed_total 7\n"),
            "{text}"
        );
        assert!(text.contains("warden_sessions{status=\"completed\"} 2"));
        assert!(text.contains("warden_sessions{status=\"running\"} 0"));
        assert!(text.contains("warden_iterations_total 2"));
        assert!(text.contains("warden_tokens_total 15"));
        assert!(text.contains("warden_terminations_total{reason=\"goal_achieved\"} 1"));
        assert!(text.contains("warden_gate_decisions_total{decision=\"continue\"} 2"));
        assert!(text.contains("warden_iteration_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("warden_iteration_duration_seconds_bucket{le=\"0.5\"} 2"));
        assert!(text.contains("warden_iteration_duration_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("warden_iteration_duration_seconds_count 2"));
        assert!(text.contains("warden_stop_latency_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("warden_iteration_overhead_seconds_bucket{le=\"0.0001\"} 1"));
        assert!(text.contains("warden_iteration_overhead_seconds_bucket{le=\"0.001\"} 2"));
        // The supervisor's own part is the overhead less the writes: 30 and 200 µs.
        assert!(text.contains("warden_iteration_supervisor_seconds_bucket{le=\"0.00005\"} 1"));
        assert!(text.contains("warden_iteration_supervisor_seconds_bucket{le=\"0.0002\"} 2"));
        assert!(text.contains("warden_iteration_writes_seconds_bucket{le=\"0.001\"} 2"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
