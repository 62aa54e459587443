//! Hard safety limits. A session never runs past its wall clock, iteration
//! cap, token budget or consecutive-error threshold; these are checked before
//! every step against usage that is cumulative over the session's whole life.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::lifecycle::Reason;
use super::soft_budget::WarnAt;

/// The limits one session runs under (all resolved, none optional but tool calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// Iteration cap over the session's life.
    pub max_iterations: u64,
    /// Wall-clock budget in milliseconds of running time.
    pub max_wall_time_ms: u64,
    /// Token budget over the session's life.
    pub max_tokens: u64,
    /// Consecutive failing steps (`error` outcome) that stop the session.
    pub max_consecutive_errors: u32,
    /// Reflect every this many iterations (continuous mode): where the
    /// adaptive interval starts, or the fixed one when the session set it.
    pub reflection_interval: u32,
    /// Whether the reflection interval adapts (every 5 to 20 steps, by
    /// stuckness, rework, uncertainty and velocity): true unless the session
    /// set `reflection_interval` itself, at create or by a later patch.
    #[serde(default)]
    pub reflection_adaptive: bool,
    /// Save a checkpoint every this many iterations.
    pub checkpoint_interval: u32,
    /// Optional cap on tool calls over the session's life.
    #[serde(default)]
    pub max_tool_calls: Option<u64>,
    /// Context cycles a session may use (model executors).
    #[serde(default = "default_max_cycles")]
    pub max_cycles: u32,
    /// Context window budget in tokens; at 80 % the agent wraps up the cycle.
    #[serde(default = "default_context_tokens")]
    pub context_budget_tokens: u64,
    /// Pause for a person's review after this many steps since one last
    /// looked (started or resumed the session); 0 = never. Unset (`null`):
    /// `WARDEN_GATE_REVIEW_EVERY` in continuous mode, never in fixed mode.
    /// A create that sets `max_iterations` but not this gets 0: the user's
    /// own limit is the only stop.
    #[serde(default)]
    pub review_every: Option<u64>,
    /// Percentages of each budget at which the session warns (soft
    /// budgets): 1–99, at most 10; `[]` warns never.
    #[serde(default)]
    #[schema(value_type = Vec<u8>, example = json!([50, 80, 95]))]
    pub warn_at: WarnAt,
    /// Money budget over the session's life, USD (an exact decimal in a
    /// string), at `WARDEN_MODEL_PRICES`: as hard as the token budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "2.50")]
    pub max_cost_usd: Option<Decimal>,
}

fn default_max_cycles() -> u32 {
    10
}

fn default_context_tokens() -> u64 {
    32_000
}

/// A partial set of limits, as given in a create, resume or update request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsPatch {
    /// Iteration cap (1 – 1,000,000).
    pub max_iterations: Option<u64>,
    /// Wall-clock budget in ms (100 – 2,592,000,000, i.e. 30 days).
    pub max_wall_time_ms: Option<u64>,
    /// Token budget (1 – 10,000,000,000).
    pub max_tokens: Option<u64>,
    /// Consecutive-error threshold (1 – 1,000).
    pub max_consecutive_errors: Option<u32>,
    /// Reflection interval in iterations (1 – 1,000). Unset, the interval
    /// adapts after each reflection from the default (10): 5 when stuck,
    /// halved when rework, uncertainty or a stalled `percentComplete` rise,
    /// doubled up to 20 while progress is steady; each change is a
    /// `reflection_interval_changed` event. Set (here or in a later patch),
    /// it stays fixed at this value.
    pub reflection_interval: Option<u32>,
    /// Checkpoint interval in iterations (1 – 10,000).
    pub checkpoint_interval: Option<u32>,
    /// Tool-call cap (1 – 10,000,000).
    pub max_tool_calls: Option<u64>,
    /// Context cycles (1 – 1,000).
    pub max_cycles: Option<u32>,
    /// Context budget in tokens (500 – 10,000,000).
    pub context_budget_tokens: Option<u64>,
    /// Steps between review points (0 – 1,000,000; 0 = never).
    pub review_every: Option<u64>,
    /// Percentages of each budget to warn at (each 1 – 99, at most 10;
    /// `[]` for none). Default `[50, 80, 95]`.
    #[schema(value_type = Option<Vec<u8>>)]
    pub warn_at: Option<WarnAt>,
    /// Money budget in USD, a decimal string (more than 0, at most
    /// 1,000,000, at most 6 decimal places); needs `WARDEN_MODEL_PRICES`.
    #[schema(value_type = Option<String>, example = "2.50")]
    #[serde(default, deserialize_with = "cost_text")]
    pub max_cost_usd: Option<Decimal>,
}

/// Reads a money budget from its text form only ([`COST_PATTERN`]): a
/// number, or text the pattern refuses, is refused, so what the document
/// allows and what is taken are the same.
fn cost_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Decimal>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    parse_cost(&text).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "max_cost_usd must be a decimal string of USD, more than 0 and at most {MAX_COST_USD}, \
             with at most {MAX_COST_SCALE} decimal places and no leading zeros (e.g. \"2.50\"), got {text:?}"
        ))
    })
}

/// A money budget's text as [`COST_PATTERN`] takes it: `0` or digits
/// without a leading zero, at most 7 of them, then at most six places;
/// more than 0 and at most [`MAX_COST_USD`]. `None` otherwise.
pub fn parse_cost(text: &str) -> Option<Decimal> {
    let (whole, places) = match text.split_once('.') {
        Some((w, p)) => (w, Some(p)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let whole_ok = digits(whole) && whole.len() <= 7 && (whole == "0" || !whole.starts_with('0'));
    let places_ok = places.is_none_or(|p| digits(p) && p.len() <= MAX_COST_SCALE as usize);
    if !(whole_ok && places_ok) {
        return None;
    }
    let usd: Decimal = text.parse().ok()?;
    (usd > Decimal::ZERO && usd <= Decimal::from(MAX_COST_USD)).then_some(usd)
}

/// The largest money budget a session may have, USD.
pub const MAX_COST_USD: u32 = 1_000_000;
/// Most decimal places a money budget may have (a millionth of a dollar).
pub const MAX_COST_SCALE: u32 = 6;

/// The money budgets' text form, as the API document states it (the range
/// itself, more than 0 and at most [`MAX_COST_USD`], is checked by
/// [`check_cost_budget`]).
pub const COST_PATTERN: &str = "^([1-9][0-9]{0,5}([.][0-9]{1,6})?|0[.]([1-9][0-9]{0,5}|0[1-9][0-9]{0,4}|00[1-9][0-9]{0,3}|000[1-9][0-9]{0,2}|0000[1-9][0-9]?|00000[1-9])|1000000([.]0{1,6})?)$";

/// Checks a money budget: more than 0, at most [`MAX_COST_USD`], at most
/// [`MAX_COST_SCALE`] places (trailing zeros do not count).
pub fn check_cost_budget(usd: Decimal) -> Result<Decimal, LimitOutOfRange> {
    let usd_n = usd.normalize();
    let ok = usd_n > Decimal::ZERO
        && usd_n <= Decimal::from(MAX_COST_USD)
        && usd_n.scale() <= MAX_COST_SCALE;
    if ok {
        Ok(usd_n)
    } else {
        Err(LimitOutOfRange {
            field: "max_cost_usd",
            value: usd.to_string(),
            min: "0.000001".into(),
            max: format!("{MAX_COST_USD} (at most {MAX_COST_SCALE} decimal places)"),
        })
    }
}

/// A limit outside its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be between {min} and {max}, got {value}")]
pub struct LimitOutOfRange {
    /// The JSON field name.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// Smallest allowed value.
    pub min: String,
    /// Largest allowed value.
    pub max: String,
}

/// Allowed range of each limit: (field, min, max).
pub const RANGES: [(&str, u64, u64); 10] = [
    ("max_iterations", 1, 1_000_000),
    ("max_wall_time_ms", 100, 2_592_000_000),
    ("max_tokens", 1, 10_000_000_000),
    ("max_consecutive_errors", 1, 1_000),
    ("reflection_interval", 1, 1_000),
    ("checkpoint_interval", 1, 10_000),
    ("max_tool_calls", 1, 10_000_000),
    ("max_cycles", 1, 1_000),
    ("context_budget_tokens", 500, 10_000_000),
    ("review_every", 0, 1_000_000),
];

fn in_range(field: &'static str, value: u64) -> Result<u64, LimitOutOfRange> {
    let (_, min, max) = RANGES
        .iter()
        .copied()
        .find(|(f, _, _)| *f == field)
        .unwrap_or((field, 0, u64::MAX));
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(LimitOutOfRange {
            field,
            value: value.to_string(),
            min: min.to_string(),
            max: max.to_string(),
        })
    }
}

impl Limits {
    /// Returns these limits with every field of `patch` applied, after range checks.
    pub fn apply(&self, patch: &LimitsPatch) -> Result<Limits, LimitOutOfRange> {
        let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(Limits {
            max_iterations: match patch.max_iterations {
                Some(v) => in_range("max_iterations", v)?,
                None => self.max_iterations,
            },
            max_wall_time_ms: match patch.max_wall_time_ms {
                Some(v) => in_range("max_wall_time_ms", v)?,
                None => self.max_wall_time_ms,
            },
            max_tokens: match patch.max_tokens {
                Some(v) => in_range("max_tokens", v)?,
                None => self.max_tokens,
            },
            max_consecutive_errors: match patch.max_consecutive_errors {
                Some(v) => narrow(in_range("max_consecutive_errors", u64::from(v))?),
                None => self.max_consecutive_errors,
            },
            reflection_interval: match patch.reflection_interval {
                Some(v) => narrow(in_range("reflection_interval", u64::from(v))?),
                None => self.reflection_interval,
            },
            // An interval the caller chose is kept as given.
            reflection_adaptive: self.reflection_adaptive && patch.reflection_interval.is_none(),
            checkpoint_interval: match patch.checkpoint_interval {
                Some(v) => narrow(in_range("checkpoint_interval", u64::from(v))?),
                None => self.checkpoint_interval,
            },
            max_tool_calls: match patch.max_tool_calls {
                Some(v) => Some(in_range("max_tool_calls", v)?),
                None => self.max_tool_calls,
            },
            max_cycles: match patch.max_cycles {
                Some(v) => narrow(in_range("max_cycles", u64::from(v))?),
                None => self.max_cycles,
            },
            context_budget_tokens: match patch.context_budget_tokens {
                Some(v) => in_range("context_budget_tokens", v)?,
                None => self.context_budget_tokens,
            },
            review_every: match patch.review_every {
                Some(v) => Some(in_range("review_every", v)?),
                None => self.review_every,
            },
            // Checked when read (`WarnAt`'s deserializer).
            warn_at: patch.warn_at.unwrap_or(self.warn_at),
            max_cost_usd: match patch.max_cost_usd {
                Some(v) => Some(check_cost_budget(v)?),
                None => self.max_cost_usd,
            },
        })
    }

    /// The limits a new session gets: `self` (the mode's defaults) with the
    /// request's `patch` applied. A request that sets `max_iterations` but
    /// not `review_every` asked for that many steps: it gets no review
    /// point before its own limit (`review_every` 0).
    pub fn for_create(&self, patch: &LimitsPatch) -> Result<Limits, LimitOutOfRange> {
        let mut limits = self.apply(patch)?;
        if patch.max_iterations.is_some() && patch.review_every.is_none() {
            limits.review_every = Some(0);
        }
        Ok(limits)
    }

    /// Checks every field against its allowed range.
    pub fn validate(&self) -> Result<(), LimitOutOfRange> {
        in_range("max_iterations", self.max_iterations)?;
        in_range("max_wall_time_ms", self.max_wall_time_ms)?;
        in_range("max_tokens", self.max_tokens)?;
        in_range(
            "max_consecutive_errors",
            u64::from(self.max_consecutive_errors),
        )?;
        in_range("reflection_interval", u64::from(self.reflection_interval))?;
        in_range("checkpoint_interval", u64::from(self.checkpoint_interval))?;
        if let Some(v) = self.max_tool_calls {
            in_range("max_tool_calls", v)?;
        }
        in_range("max_cycles", u64::from(self.max_cycles))?;
        in_range("context_budget_tokens", self.context_budget_tokens)?;
        if let Some(v) = self.review_every {
            in_range("review_every", v)?;
        }
        if let Some(v) = self.max_cost_usd {
            check_cost_budget(v)?;
        }
        Ok(())
    }
}

/// What a session has consumed so far, over its whole life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Iterations committed.
    pub iterations: u64,
    /// Running wall time in milliseconds.
    pub elapsed_ms: u64,
    /// Tokens used.
    pub tokens: u64,
    /// Current streak of `error` outcomes.
    pub consecutive_errors: u32,
    /// Tool calls made.
    pub tool_calls: u64,
    /// What the committed steps cost at the price table, USD.
    #[serde(default)]
    pub cost_usd: Decimal,
    /// Committed steps that used tokens of a model no price entry prices.
    #[serde(default)]
    pub unpriced_steps: u64,
}

/// A guardrail that has been hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Breach {
    /// Wall clock used up.
    Timeout,
    /// Iteration cap reached.
    MaxIterations,
    /// Token budget used up.
    CostLimit,
    /// Money budget (`max_cost_usd`) used up, or a step of a model no
    /// price entry prices, so the budget cannot be kept.
    MoneyLimit,
    /// Consecutive-error threshold reached.
    ErrorThreshold,
}

impl Breach {
    /// The termination reason for this breach.
    pub fn reason(self) -> Reason {
        match self {
            Breach::Timeout => Reason::Timeout,
            Breach::MaxIterations => Reason::MaxIterations,
            Breach::CostLimit | Breach::MoneyLimit => Reason::CostLimit,
            Breach::ErrorThreshold => Reason::ErrorThreshold,
        }
    }

    /// The limit field a user raises to get past this breach.
    pub fn limit_field(self) -> &'static str {
        match self {
            Breach::Timeout => "max_wall_time_ms",
            Breach::MaxIterations => "max_iterations",
            Breach::CostLimit => "max_tokens",
            Breach::MoneyLimit => "max_cost_usd",
            Breach::ErrorThreshold => "max_consecutive_errors",
        }
    }

    /// A line for the end's summary, with the figures that tripped it.
    pub fn describe(self, limits: &Limits, usage: &Usage) -> Option<String> {
        match (self, limits.max_cost_usd) {
            (Breach::MoneyLimit, Some(max)) if usage.unpriced_steps > 0 => Some(format!(
                "{} step(s) used a model WARDEN_MODEL_PRICES does not price, so the money budget of {max} USD cannot be kept",
                usage.unpriced_steps
            )),
            (Breach::MoneyLimit, Some(max)) => Some(format!(
                "the steps cost {} USD of the money budget of {max} USD",
                usage.cost_usd.normalize()
            )),
            _ => None,
        }
    }
}

/// The first guardrail that forbids another step, in the order time,
/// iterations, tokens, errors.
pub fn check(limits: &Limits, usage: &Usage) -> Option<Breach> {
    if usage.elapsed_ms >= limits.max_wall_time_ms {
        Some(Breach::Timeout)
    } else if usage.iterations >= limits.max_iterations {
        Some(Breach::MaxIterations)
    } else if usage.tokens >= limits.max_tokens {
        Some(Breach::CostLimit)
    } else if money_spent(limits, usage) {
        Some(Breach::MoneyLimit)
    } else if usage.consecutive_errors >= limits.max_consecutive_errors {
        Some(Breach::ErrorThreshold)
    } else {
        None
    }
}

/// The budget guardrail a resume would hit at once. The error streak is not
/// counted: a person resuming has looked at the errors, so it starts over.
pub fn exhausted_for_resume(limits: &Limits, usage: &Usage) -> Option<Breach> {
    check(
        limits,
        &Usage {
            consecutive_errors: 0,
            ..*usage
        },
    )
}

/// Whether the money budget, when there is one, is spent, or cannot be
/// kept because a step's model is unpriced.
fn money_spent(limits: &Limits, usage: &Usage) -> bool {
    limits
        .max_cost_usd
        .is_some_and(|max| usage.cost_usd >= max || usage.unpriced_steps > 0)
}

/// USD left of the money budget; `None` when the session has none.
pub fn cost_remaining(limits: &Limits, usage: &Usage) -> Option<Decimal> {
    limits
        .max_cost_usd
        .map(|max| (max - usage.cost_usd).max(Decimal::ZERO))
}

/// Milliseconds of wall time left before the timeout guardrail.
pub fn time_remaining_ms(limits: &Limits, usage: &Usage) -> u64 {
    limits.max_wall_time_ms.saturating_sub(usage.elapsed_ms)
}

/// Tokens left in the budget.
pub fn tokens_remaining(limits: &Limits, usage: &Usage) -> u64 {
    limits.max_tokens.saturating_sub(usage.tokens)
}

/// The `max_tokens` a model call may ask for: never more than the budget has left.
pub fn token_allowance(limits: &Limits, usage: &Usage, requested: u64) -> u64 {
    requested.min(tokens_remaining(limits, usage))
}

/// A change a child session's carved budget refuses: the request is
/// well-formed, the session being a child is what conflicts with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a child session's max_tokens, max_iterations and max_cost_usd are carved out of its \
     parent's and change only through its parent's limits"
)]
pub struct CarvedBudget;

/// Refuses a change of a child session's carved budget (`max_tokens`,
/// `max_iterations`) from `carved` to `asked`: its parent carved it out of
/// its own and gets back what is left when it ends, so it changes only
/// through the parent's. Other limits, and a root's, change freely.
pub fn check_child_budget(
    is_child: bool,
    carved: &Limits,
    asked: &Limits,
) -> Result<(), CarvedBudget> {
    let changed = asked.max_tokens != carved.max_tokens
        || asked.max_iterations != carved.max_iterations
        || asked.max_cost_usd != carved.max_cost_usd;
    if is_child && changed {
        Err(CarvedBudget)
    } else {
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_childs_carved_budget_changes_only_through_its_parent() {
        let carved = roomy();
        let more_tokens = Limits {
            max_tokens: 1_000_000,
            ..carved
        };
        let more_steps = Limits {
            max_iterations: 200,
            ..carved
        };
        let fewer_tokens = Limits {
            max_tokens: 1,
            ..carved
        };
        for asked in [more_tokens, more_steps, fewer_tokens] {
            assert!(check_child_budget(true, &carved, &asked).is_err());
            assert_eq!(check_child_budget(false, &carved, &asked), Ok(()));
        }
        let other = Limits {
            max_wall_time_ms: 99_999,
            max_consecutive_errors: 7,
            ..carved
        };
        assert_eq!(check_child_budget(true, &carved, &other), Ok(()));
        assert_eq!(check_child_budget(true, &carved, &carved), Ok(()));
    }

    /// Limits large enough that nothing trips unless a test says so.
    pub(crate) fn roomy() -> Limits {
        Limits {
            max_iterations: 10,
            max_wall_time_ms: 10_000,
            max_tokens: 1_000,
            max_consecutive_errors: 3,
            reflection_interval: 10,
            reflection_adaptive: false,
            checkpoint_interval: 10,
            max_tool_calls: None,
            max_cycles: 10,
            context_budget_tokens: 32_000,
            review_every: None,
            warn_at: WarnAt::DEFAULT,
            max_cost_usd: None,
        }
    }

    #[test]
    fn nothing_trips_under_every_limit() {
        let usage = Usage {
            iterations: 9,
            elapsed_ms: 9_999,
            tokens: 999,
            consecutive_errors: 2,
            tool_calls: 5,
            ..Usage::default()
        };
        assert_eq!(check(&roomy(), &usage), None);
    }

    #[test]
    fn each_guardrail_trips_at_its_limit() {
        let l = roomy();
        let at = |u: Usage| check(&l, &u);
        assert_eq!(
            at(Usage {
                elapsed_ms: 10_000,
                ..Default::default()
            }),
            Some(Breach::Timeout)
        );
        assert_eq!(
            at(Usage {
                iterations: 10,
                ..Default::default()
            }),
            Some(Breach::MaxIterations)
        );
        assert_eq!(
            at(Usage {
                tokens: 1_000,
                ..Default::default()
            }),
            Some(Breach::CostLimit)
        );
        assert_eq!(
            at(Usage {
                tokens: 5_000,
                ..Default::default()
            }),
            Some(Breach::CostLimit)
        );
        assert_eq!(
            at(Usage {
                consecutive_errors: 3,
                ..Default::default()
            }),
            Some(Breach::ErrorThreshold)
        );
    }

    #[test]
    fn priority_is_time_then_iterations_then_tokens_then_errors() {
        let l = roomy();
        let all = Usage {
            iterations: 10,
            elapsed_ms: 10_000,
            tokens: 1_000,
            consecutive_errors: 3,
            tool_calls: 0,
            ..Usage::default()
        };
        assert_eq!(check(&l, &all), Some(Breach::Timeout));
        let no_time = Usage {
            elapsed_ms: 0,
            ..all
        };
        assert_eq!(check(&l, &no_time), Some(Breach::MaxIterations));
        let no_iter = Usage {
            iterations: 0,
            ..no_time
        };
        assert_eq!(check(&l, &no_iter), Some(Breach::CostLimit));
        let no_tokens = Usage {
            tokens: 0,
            ..no_iter
        };
        assert_eq!(check(&l, &no_tokens), Some(Breach::ErrorThreshold));
    }

    #[test]
    fn breaches_map_to_reasons_and_fields() {
        assert_eq!(Breach::Timeout.reason(), Reason::Timeout);
        assert_eq!(Breach::MaxIterations.reason(), Reason::MaxIterations);
        assert_eq!(Breach::CostLimit.reason(), Reason::CostLimit);
        assert_eq!(Breach::ErrorThreshold.reason(), Reason::ErrorThreshold);
        assert_eq!(Breach::CostLimit.limit_field(), "max_tokens");
        assert_eq!(Breach::Timeout.limit_field(), "max_wall_time_ms");
    }

    #[test]
    fn resume_ignores_the_error_streak_but_not_budgets() {
        let l = roomy();
        let streak = Usage {
            consecutive_errors: 3,
            ..Default::default()
        };
        assert_eq!(exhausted_for_resume(&l, &streak), None);
        let spent = Usage {
            tokens: 1_000,
            consecutive_errors: 3,
            ..Default::default()
        };
        assert_eq!(exhausted_for_resume(&l, &spent), Some(Breach::CostLimit));
    }

    #[test]
    fn token_allowance_never_exceeds_the_budget_left() {
        let l = roomy();
        let u = Usage {
            tokens: 900,
            ..Default::default()
        };
        assert_eq!(token_allowance(&l, &u, 4096), 100);
        assert_eq!(token_allowance(&l, &u, 50), 50);
        let over = Usage {
            tokens: 2_000,
            ..Default::default()
        };
        assert_eq!(token_allowance(&l, &over, 50), 0);
        assert_eq!(tokens_remaining(&l, &over), 0);
        assert_eq!(time_remaining_ms(&l, &Usage::default()), 10_000);
    }

    #[test]
    fn apply_patches_only_given_fields() {
        let l = roomy();
        let patched = l
            .apply(&LimitsPatch {
                max_tokens: Some(5_000),
                max_tool_calls: Some(7),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(patched.max_tokens, 5_000);
        assert_eq!(patched.max_tool_calls, Some(7));
        assert_eq!(patched.max_iterations, l.max_iterations);
        assert_eq!(l.apply(&LimitsPatch::default()).unwrap(), l);
    }

    #[test]
    fn out_of_range_values_are_refused_with_the_field_name() {
        let l = roomy();
        let cases = [
            LimitsPatch {
                max_iterations: Some(0),
                ..Default::default()
            },
            LimitsPatch {
                max_iterations: Some(1_000_001),
                ..Default::default()
            },
            LimitsPatch {
                max_wall_time_ms: Some(99),
                ..Default::default()
            },
            LimitsPatch {
                max_tokens: Some(0),
                ..Default::default()
            },
            LimitsPatch {
                max_consecutive_errors: Some(0),
                ..Default::default()
            },
            LimitsPatch {
                reflection_interval: Some(1_001),
                ..Default::default()
            },
            LimitsPatch {
                checkpoint_interval: Some(0),
                ..Default::default()
            },
            LimitsPatch {
                max_tool_calls: Some(0),
                ..Default::default()
            },
        ];
        let fields = [
            "max_iterations",
            "max_iterations",
            "max_wall_time_ms",
            "max_tokens",
            "max_consecutive_errors",
            "reflection_interval",
            "checkpoint_interval",
            "max_tool_calls",
        ];
        for (patch, field) in cases.iter().zip(fields) {
            let err = l.apply(patch).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().starts_with(field));
        }
    }

    #[test]
    fn review_every_is_patched_and_zero_is_allowed() {
        let l = roomy();
        let patch = |v| LimitsPatch {
            review_every: Some(v),
            ..Default::default()
        };
        assert_eq!(l.apply(&patch(0)).unwrap().review_every, Some(0));
        assert_eq!(l.apply(&patch(5)).unwrap().review_every, Some(5));
        assert_eq!(
            l.apply(&patch(1_000_000)).unwrap().review_every,
            Some(1_000_000)
        );
        assert_eq!(
            l.apply(&patch(1_000_001)).unwrap_err().field,
            "review_every"
        );
        // Not given: kept as it was.
        let set = l.apply(&patch(7)).unwrap();
        assert_eq!(
            set.apply(&LimitsPatch::default()).unwrap().review_every,
            Some(7)
        );
        let mut bad = roomy();
        bad.review_every = Some(2_000_000);
        assert_eq!(bad.validate().unwrap_err().field, "review_every");
    }

    #[test]
    fn an_explicit_iteration_limit_at_create_means_no_review_point_unless_asked() {
        let defaults = roomy();
        let create = |max_iterations, review_every| {
            defaults
                .for_create(&LimitsPatch {
                    max_iterations,
                    review_every,
                    ..Default::default()
                })
                .unwrap()
                .review_every
        };
        // Neither given: the mode's default rule applies later.
        assert_eq!(create(None, None), None);
        // Only max_iterations: its own limit is the only stop.
        assert_eq!(create(Some(200), None), Some(0));
        // review_every given: it wins, with or without max_iterations.
        assert_eq!(create(Some(200), Some(50)), Some(50));
        assert_eq!(create(None, Some(50)), Some(50));
        assert_eq!(create(None, Some(0)), Some(0));
        // Range checks still apply.
        assert!(
            defaults
                .for_create(&LimitsPatch {
                    max_iterations: Some(0),
                    ..Default::default()
                })
                .is_err()
        );
    }

    #[test]
    fn setting_the_reflection_interval_turns_its_adaptation_off_for_good() {
        let defaults = Limits {
            reflection_adaptive: true,
            ..roomy()
        };
        let untouched = defaults.for_create(&LimitsPatch::default()).unwrap();
        assert!(untouched.reflection_adaptive);
        let other = untouched
            .apply(&LimitsPatch {
                max_tokens: Some(500),
                ..Default::default()
            })
            .unwrap();
        assert!(
            other.reflection_adaptive,
            "another limit leaves it adaptive"
        );
        let set = LimitsPatch {
            reflection_interval: Some(10),
            ..Default::default()
        };
        let fixed = defaults.for_create(&set).unwrap();
        assert!(!fixed.reflection_adaptive, "even at the default's value");
        assert!(!untouched.apply(&set).unwrap().reflection_adaptive);
        // Once set, a later patch without it does not bring adaptation back.
        assert!(
            !fixed
                .apply(&LimitsPatch::default())
                .unwrap()
                .reflection_adaptive
        );
        // Limits stored before the flag existed read as fixed.
        let stored = serde_json::to_value(roomy()).unwrap();
        let mut stored = stored.as_object().unwrap().clone();
        stored.remove("reflection_adaptive");
        let l: Limits = serde_json::from_value(stored.into()).unwrap();
        assert!(!l.reflection_adaptive);
    }

    #[test]
    fn stored_limits_without_review_every_still_read() {
        let stored = serde_json::json!({
            "max_iterations": 10, "max_wall_time_ms": 10_000, "max_tokens": 1_000,
            "max_consecutive_errors": 3, "reflection_interval": 10, "checkpoint_interval": 10
        });
        let l: Limits = serde_json::from_value(stored).unwrap();
        assert_eq!(l.review_every, None);
    }

    #[test]
    fn validate_accepts_bounds_and_rejects_outside() {
        let mut l = roomy();
        l.max_iterations = 1_000_000;
        l.max_wall_time_ms = 100;
        assert_eq!(l.validate(), Ok(()));
        l.max_consecutive_errors = 0;
        assert_eq!(l.validate().unwrap_err().field, "max_consecutive_errors");
    }

    #[test]
    fn a_money_budget_trips_when_spent_or_when_a_step_is_unpriced() {
        let d = |s: &str| s.parse::<Decimal>().expect("decimal");
        let limits = Limits {
            max_cost_usd: Some(d("1.50")),
            ..roomy()
        };
        let under = Usage {
            cost_usd: d("1.499999"),
            ..Usage::default()
        };
        assert_eq!(check(&limits, &under), None);
        assert_eq!(cost_remaining(&limits, &under), Some(d("0.000001")));
        let spent = Usage {
            cost_usd: d("1.5"),
            ..Usage::default()
        };
        assert_eq!(check(&limits, &spent), Some(Breach::MoneyLimit));
        assert_eq!(cost_remaining(&limits, &spent), Some(Decimal::ZERO));
        assert_eq!(Breach::MoneyLimit.reason(), Reason::CostLimit);
        assert_eq!(Breach::MoneyLimit.limit_field(), "max_cost_usd");
        assert_eq!(
            Breach::MoneyLimit.describe(&limits, &spent).as_deref(),
            Some("the steps cost 1.5 USD of the money budget of 1.50 USD")
        );
        let unpriced = Usage {
            unpriced_steps: 1,
            ..Usage::default()
        };
        assert_eq!(check(&limits, &unpriced), Some(Breach::MoneyLimit));
        assert!(
            Breach::MoneyLimit
                .describe(&limits, &unpriced)
                .is_some_and(|d| d.contains("cannot be kept"))
        );
        // Without a money budget, neither spend nor unpriced steps trip it.
        assert_eq!(check(&roomy(), &spent), None);
        assert_eq!(check(&roomy(), &unpriced), None);
        assert_eq!(cost_remaining(&roomy(), &spent), None);
        assert_eq!(Breach::CostLimit.describe(&limits, &spent), None);
        // Tokens trip first: the order is time, iterations, tokens, money.
        let both = Usage {
            tokens: 1_000,
            ..spent
        };
        assert_eq!(check(&limits, &both), Some(Breach::CostLimit));
    }

    #[test]
    fn a_money_budget_is_a_positive_amount_of_at_most_six_places() {
        let d = |s: &str| s.parse::<Decimal>().expect("decimal");
        assert_eq!(check_cost_budget(d("2.50")), Ok(d("2.5")));
        assert_eq!(check_cost_budget(d("0.000001")), Ok(d("0.000001")));
        assert_eq!(check_cost_budget(d("1000000")), Ok(d("1000000")));
        assert_eq!(check_cost_budget(d("1.1000000")), Ok(d("1.1")));
        for bad in ["0", "-1", "0.0000001", "1000000.000001"] {
            let err = check_cost_budget(d(bad)).expect_err(bad);
            assert_eq!(err.field, "max_cost_usd");
            assert!(err.to_string().contains(bad), "{err}");
        }
        let patch = LimitsPatch {
            max_cost_usd: Some(d("3")),
            ..LimitsPatch::default()
        };
        assert_eq!(
            roomy().apply(&patch).map(|l| l.max_cost_usd),
            Ok(Some(d("3")))
        );
        let kept = Limits {
            max_cost_usd: Some(d("3")),
            ..roomy()
        };
        assert_eq!(
            kept.apply(&LimitsPatch::default()).map(|l| l.max_cost_usd),
            Ok(Some(d("3")))
        );
        let zero = LimitsPatch {
            max_cost_usd: Some(Decimal::ZERO),
            ..LimitsPatch::default()
        };
        assert!(roomy().apply(&zero).is_err());
        // The text form: what COST_PATTERN allows, nothing else.
        for good in [
            "1",
            "2.50",
            "0.000001",
            "999999.999999",
            "1000000",
            "1000000.000000",
            "0.1",
        ] {
            assert!(parse_cost(good).is_some(), "{good}");
        }
        for bad in [
            "0",
            "0.0",
            "0.0000001",
            "01",
            "00.5",
            ".5",
            "5.",
            "1000000.000001",
            "1000001",
            "-1",
            "1e3",
            " 1",
            "1,5",
            "",
            "0.1000000",
        ] {
            assert_eq!(parse_cost(bad), None, "{bad}");
        }
        let read = |json: &str| serde_json::from_str::<LimitsPatch>(json).map(|p| p.max_cost_usd);
        assert_eq!(
            read(r#"{"max_cost_usd": "2.50"}"#).ok(),
            Some(Some(d("2.50")))
        );
        assert_eq!(read(r#"{"max_cost_usd": null}"#).ok(), Some(None));
        assert_eq!(read("{}").ok(), Some(None));
        assert!(
            read(r#"{"max_cost_usd": 2.5}"#).is_err(),
            "a number is refused"
        );
        assert!(read(r#"{"max_cost_usd": "01"}"#).is_err());
        let child_more = Limits {
            max_cost_usd: Some(d("4")),
            ..kept
        };
        assert!(check_child_budget(true, &kept, &child_more).is_err());
        assert_eq!(check_child_budget(false, &kept, &child_more), Ok(()));
    }
}
