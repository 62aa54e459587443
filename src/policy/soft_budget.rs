//! Soft budgets: warn, don't terminate. Every hard budget (tokens, cost,
//! wall time, iterations, tool calls) warns when its spend crosses a
//! threshold (50 %, 80 % and 95 % unless the session or its tenant says
//! otherwise), once per threshold per session, so the agent can wrap up and
//! a person can step in before the hard limit ends the session.

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

use super::guardrails::{Limits, Usage};

/// The thresholds a session warns at unless told otherwise (percent).
pub const DEFAULT_THRESHOLDS: [u8; 3] = [50, 80, 95];
/// Most thresholds a session may ask for.
pub const MAX_THRESHOLDS: usize = 10;
/// The lowest and highest threshold (percent): 100 would be the hard limit.
pub const PERCENTS: (u8, u8) = (1, 99);

/// A budget that can warn.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// `limits.max_tokens`.
    Tokens,
    /// `limits.max_cost_usd`.
    CostUsd,
    /// `limits.max_wall_time_ms`.
    WallTime,
    /// `limits.max_iterations`.
    Iterations,
    /// `limits.max_tool_calls`.
    ToolCalls,
}

impl Budget {
    /// How the budget reads in a sentence.
    pub fn noun(self) -> &'static str {
        match self {
            Budget::Tokens => "token budget",
            Budget::CostUsd => "cost budget",
            Budget::WallTime => "time budget",
            Budget::Iterations => "iteration budget",
            Budget::ToolCalls => "tool-call budget",
        }
    }
}

/// How much of one budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    /// Which budget.
    pub budget: Budget,
    /// Spent so far.
    pub used: Decimal,
    /// The hard limit.
    pub limit: Decimal,
}

impl Gauge {
    /// A gauge over whole units (tokens, ms, iterations, calls).
    pub fn whole(budget: Budget, used: u64, limit: u64) -> Gauge {
        Gauge {
            budget,
            used: Decimal::from(used),
            limit: Decimal::from(limit),
        }
    }

    /// Whether at least `percent` of the budget is spent; a zero limit is
    /// never "crossed" (there is nothing to warn about before it stops).
    fn reached(&self, percent: u8) -> bool {
        self.limit > Decimal::ZERO
            && self.used * Decimal::ONE_HUNDRED >= Decimal::from(percent) * self.limit
    }
}

/// A threshold crossed: what the event, the status and the agent are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BudgetWarning {
    /// Which budget.
    pub budget: Budget,
    /// The threshold crossed (percent).
    pub percent: u8,
    /// Spent when it was crossed.
    #[schema(value_type = String)]
    pub used: Decimal,
    /// The hard limit.
    #[schema(value_type = String)]
    pub limit: Decimal,
}

/// Checks a list of thresholds: 1–99 percent, at most [`MAX_THRESHOLDS`];
/// returned sorted without repeats.
pub fn thresholds(asked: &[u8]) -> Result<Vec<u8>, String> {
    if asked.len() > MAX_THRESHOLDS {
        return Err(format!(
            "warn_at: at most {MAX_THRESHOLDS} thresholds, got {}",
            asked.len()
        ));
    }
    let (lowest, highest) = PERCENTS;
    if let Some(bad) = asked.iter().find(|p| !(lowest..=highest).contains(*p)) {
        return Err(format!(
            "warn_at: {bad} is not a percentage between {lowest} and {highest}"
        ));
    }
    let mut sorted = asked.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    Ok(sorted)
}

/// The thresholds a session warns at (`limits.warn_at`), checked by
/// [`thresholds`] when read: a set of percentages 1–99, kept as bits so the
/// limits stay a plain copyable value. Written as a sorted JSON array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarnAt(u128);

impl WarnAt {
    /// [`DEFAULT_THRESHOLDS`]: 50, 80 and 95 %.
    pub const DEFAULT: WarnAt = WarnAt((1 << 50) | (1 << 80) | (1 << 95));
    /// No thresholds: the session never warns.
    pub const NONE: WarnAt = WarnAt(0);

    /// Thresholds from a checked list (see [`thresholds`]).
    pub fn new(asked: &[u8]) -> Result<WarnAt, String> {
        let bits = thresholds(asked)?
            .into_iter()
            .fold(0u128, |bits, p| bits | (1u128 << p));
        Ok(WarnAt(bits))
    }

    /// The thresholds, ascending.
    pub fn percents(self) -> Vec<u8> {
        (PERCENTS.0..=PERCENTS.1)
            .filter(|p| self.0 & (1u128 << p) != 0)
            .collect()
    }
}

impl Default for WarnAt {
    fn default() -> WarnAt {
        WarnAt::DEFAULT
    }
}

impl Serialize for WarnAt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.percents().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for WarnAt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<WarnAt, D::Error> {
        let asked = Vec::<u8>::deserialize(deserializer)?;
        WarnAt::new(&asked).map_err(serde::de::Error::custom)
    }
}

/// A warning a session has sent, as its status lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SentWarning {
    /// Which budget.
    pub budget: Budget,
    /// The threshold crossed (percent).
    pub threshold: u8,
    /// Spent when it was crossed (a decimal string).
    #[schema(value_type = String)]
    pub used: Decimal,
    /// The hard limit (a decimal string).
    #[schema(value_type = String)]
    pub limit: Decimal,
    /// The iteration whose commit crossed it.
    pub iteration: u64,
}

/// The gauges of every budget `limits` puts a hard limit on, at `usage`:
/// tool calls and money only when capped.
pub fn gauges(limits: &Limits, usage: &Usage) -> Vec<Gauge> {
    let mut gauges = vec![
        Gauge::whole(Budget::Tokens, usage.tokens, limits.max_tokens),
        Gauge::whole(Budget::WallTime, usage.elapsed_ms, limits.max_wall_time_ms),
        Gauge::whole(Budget::Iterations, usage.iterations, limits.max_iterations),
    ];
    if let Some(max) = limits.max_tool_calls {
        gauges.push(Gauge::whole(Budget::ToolCalls, usage.tool_calls, max));
    }
    if let Some(max) = limits.max_cost_usd {
        gauges.push(Gauge {
            budget: Budget::CostUsd,
            used: usage.cost_usd,
            limit: max,
        });
    }
    gauges
}

/// The warnings due now: for each budget, the highest threshold its spend
/// has reached, unless that threshold or a higher one was warned of before
/// (`sent`). A step that jumps past several thresholds warns once, at the
/// highest, and recording that one is enough to silence those below.
pub fn due(thresholds: &[u8], gauges: &[Gauge], sent: &[(Budget, u8)]) -> Vec<BudgetWarning> {
    gauges
        .iter()
        .filter_map(|g| {
            let highest = thresholds.iter().rev().find(|p| g.reached(**p))?;
            let warned = sent.iter().any(|(b, p)| *b == g.budget && *p >= *highest);
            (!warned).then_some(BudgetWarning {
                budget: g.budget,
                percent: *highest,
                used: g.used,
                limit: g.limit,
            })
        })
        .collect()
}

/// What the agent is told in its next step: how much is spent and, at the
/// rate so far (`steps` steps spent `used`), about how many steps are left.
pub fn wrap_up_note(warning: &BudgetWarning, steps: u64) -> String {
    let left = steps_left(warning, steps);
    let spent = format!(
        "{}% of the {} is spent ({} of {})",
        warning.percent,
        warning.budget.noun(),
        warning.used.normalize(),
        warning.limit.normalize()
    );
    match left {
        Some(0) => format!("{spent}; this is likely the last step: wrap up now."),
        Some(1) => format!("{spent}; about 1 step is left at this rate: wrap up."),
        Some(n) => format!("{spent}; about {n} steps are left at this rate: plan to wrap up."),
        None => format!("{spent}; plan to wrap up."),
    }
}

/// Steps left at the average spend per step so far, if it can be told.
pub fn steps_left(warning: &BudgetWarning, steps: u64) -> Option<u64> {
    let remaining = (warning.limit - warning.used).max(Decimal::ZERO);
    if warning.budget == Budget::Iterations {
        return u64::try_from(remaining.trunc()).ok();
    }
    if steps == 0 || warning.used <= Decimal::ZERO {
        return None;
    }
    let per_step = warning.used / Decimal::from(steps);
    u64::try_from((remaining / per_step).trunc()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(used: u64, limit: u64) -> Gauge {
        Gauge::whole(Budget::Tokens, used, limit)
    }

    #[test]
    fn each_threshold_warns_once_at_the_highest_reached() {
        let t = DEFAULT_THRESHOLDS;
        assert!(due(&t, &[tokens(499, 1000)], &[]).is_empty());
        let half = due(&t, &[tokens(500, 1000)], &[]);
        assert_eq!(half.len(), 1);
        assert_eq!(half[0].percent, 50);
        assert!(due(&t, &[tokens(700, 1000)], &[(Budget::Tokens, 50)]).is_empty());
        let jump = due(&t, &[tokens(990, 1000)], &[(Budget::Tokens, 50)]);
        assert_eq!(jump[0].percent, 95, "one warning, at the highest");
        assert!(due(&t, &[tokens(1000, 1000)], &[(Budget::Tokens, 95)]).is_empty());
    }

    #[test]
    fn budgets_warn_apart_and_a_zero_limit_never_warns() {
        let gauges = [
            tokens(900, 1000),
            Gauge::whole(Budget::Iterations, 2, 10),
            Gauge {
                budget: Budget::CostUsd,
                used: "0.40".parse().expect("dec"),
                limit: "0.50".parse().expect("dec"),
            },
            Gauge::whole(Budget::ToolCalls, 5, 0),
        ];
        let warnings = due(&DEFAULT_THRESHOLDS, &gauges, &[(Budget::Tokens, 80)]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].budget, Budget::CostUsd);
        assert_eq!(warnings[0].percent, 80);
    }

    #[test]
    fn cost_thresholds_are_exact_at_the_cent() {
        let gauge = |used: &str| Gauge {
            budget: Budget::CostUsd,
            used: used.parse().expect("dec"),
            limit: "0.30".parse().expect("dec"),
        };
        assert!(due(&[50], &[gauge("0.149999")], &[]).is_empty());
        assert_eq!(due(&[50], &[gauge("0.15")], &[]).len(), 1);
    }

    #[test]
    fn warn_at_reads_and_writes_a_checked_sorted_list() {
        assert_eq!(WarnAt::default().percents(), DEFAULT_THRESHOLDS.to_vec());
        let read: WarnAt = serde_json::from_str("[90, 10, 10]").expect("valid");
        assert_eq!(read.percents(), vec![10, 90]);
        assert_eq!(serde_json::to_string(&read).expect("json"), "[10,90]");
        assert!(serde_json::from_str::<WarnAt>("[0]").is_err());
        assert!(serde_json::from_str::<WarnAt>("[100]").is_err());
        assert!(serde_json::from_str::<WarnAt>("[300]").is_err());
        assert_eq!(WarnAt::new(&[]), Ok(WarnAt::NONE));
        assert_eq!(WarnAt::NONE.percents(), Vec::<u8>::new());
        assert_eq!(
            WarnAt::new(&[1, 99]).expect("edges").percents(),
            vec![1, 99]
        );
    }

    #[test]
    fn every_hard_limit_has_a_gauge_and_tool_calls_only_when_capped() {
        let limits = crate::policy::guardrails::tests::roomy();
        let usage = Usage {
            iterations: 3,
            elapsed_ms: 10,
            tokens: 40,
            consecutive_errors: 0,
            tool_calls: 2,
            cost_usd: Decimal::new(125, 2),
            unpriced_steps: 0,
        };
        let budgets = |g: Vec<Gauge>| g.iter().map(|g| g.budget).collect::<Vec<_>>();
        assert_eq!(
            budgets(gauges(&limits, &usage)),
            [Budget::Tokens, Budget::WallTime, Budget::Iterations]
        );
        let capped = Limits {
            max_tool_calls: Some(4),
            max_cost_usd: Some(Decimal::new(250, 2)),
            ..limits
        };
        let all = gauges(&capped, &usage);
        assert_eq!(
            budgets(all.clone()),
            [
                Budget::Tokens,
                Budget::WallTime,
                Budget::Iterations,
                Budget::ToolCalls,
                Budget::CostUsd
            ]
        );
        assert_eq!(all[3], Gauge::whole(Budget::ToolCalls, 2, 4));
        let money = Gauge {
            budget: Budget::CostUsd,
            used: Decimal::new(125, 2),
            limit: Decimal::new(25, 1),
        };
        assert_eq!(all[4], money);
        // $1.25 of $2.50 is half: the 50 % threshold, exactly.
        assert!(money.reached(50));
        assert!(!money.reached(51));
    }

    #[test]
    fn thresholds_are_percentages_sorted_without_repeats() {
        assert_eq!(thresholds(&[95, 50, 80, 50]), Ok(vec![50, 80, 95]));
        assert_eq!(thresholds(&[]), Ok(vec![]));
        assert!(thresholds(&[0]).is_err());
        assert!(thresholds(&[100]).is_err());
        assert!(thresholds(&[1; 11]).is_err());
        assert!(thresholds(&[1, 99]).is_ok());
    }

    #[test]
    fn the_agent_is_told_the_spend_and_the_steps_left_at_this_rate() {
        let w = BudgetWarning {
            budget: Budget::Tokens,
            percent: 80,
            used: Decimal::from(8_000),
            limit: Decimal::from(10_000),
        };
        // 8,000 over 4 steps is 2,000 a step: 2,000 left is one step.
        assert_eq!(steps_left(&w, 4), Some(1));
        assert_eq!(steps_left(&w, 8), Some(2));
        assert_eq!(steps_left(&w, 0), None);
        let note = wrap_up_note(&w, 8);
        assert!(
            note.contains("80% of the token budget is spent (8000 of 10000)"),
            "{note}"
        );
        assert!(note.contains("about 2 steps are left"), "{note}");
        assert!(wrap_up_note(&w, 1).contains("last step"));
        let iterations = BudgetWarning {
            budget: Budget::Iterations,
            percent: 95,
            used: Decimal::from(19),
            limit: Decimal::from(20),
        };
        assert_eq!(steps_left(&iterations, 19), Some(1));
        let over = BudgetWarning {
            used: Decimal::from(25),
            ..iterations
        };
        assert_eq!(steps_left(&over, 25), Some(0));
    }
}
