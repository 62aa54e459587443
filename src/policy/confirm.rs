//! Confirmation before start: a create may carry `confirm_if_over` (a cost
//! in USD, a number of minutes, or both); when the session's estimate is
//! over either bound, or cannot say, the session waits in
//! `awaiting_confirmation` instead of starting.
//!
//! The figure compared is the estimate's **p90**, the cautious one: nine in
//! ten sessions like this one took at most that much, so a session whose
//! p90 is within the bound starts without asking. An estimate with
//! `basis: none` (too little history) carries no prediction, so it is
//! never taken as within a bound: the session waits (`unknown`). So does a
//! cost bound when the estimate has no cost (too few priced sessions).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::estimate::{Basis, Estimate};

/// The largest `cost_usd` bound taken (USD).
pub const MAX_COST_USD: u64 = 1_000_000;
/// The largest `minutes` bound taken (a year).
pub const MAX_MINUTES: u64 = 525_600;
/// Most decimal places of a `cost_usd` bound.
pub const MAX_COST_PLACES: u32 = 12;
/// A `cost_usd` bound as the API documents it: exactly what [`parse_cost`]
/// takes (no leading zeros, 0 to [`MAX_COST_USD`], at most
/// [`MAX_COST_PLACES`] places).
pub const COST_PATTERN: &str = "^((0|[1-9][0-9]{0,5})([.][0-9]{1,12})?|1000000([.]0{1,12})?)$";

/// `confirm_if_over` of a create: the bounds above which the session waits
/// for a person's confirmation before it starts. At least one is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmIfOver {
    /// A cost in USD, as a decimal string (`"0.50"`): 0 to 1,000,000, at
    /// most 12 decimal places.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "0.50")]
    pub cost_usd: Option<String>,
    /// A running time in minutes (1 to 525,600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 30)]
    pub minutes: Option<u64>,
}

/// `confirm_if_over` checked: the bounds as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The cost bound in USD.
    pub cost_usd: Option<Decimal>,
    /// The time bound in milliseconds.
    pub duration_ms: Option<u64>,
}

impl ConfirmIfOver {
    /// Checks the bounds: at least one, each within its range; the message
    /// names the field.
    pub fn check(&self) -> Result<Bounds, String> {
        if self.cost_usd.is_none() && self.minutes.is_none() {
            return Err("confirm_if_over needs cost_usd, minutes or both".into());
        }
        let cost_usd = self.cost_usd.as_deref().map(parse_cost).transpose()?;
        let duration_ms = match self.minutes {
            None => None,
            Some(m) if (1..=MAX_MINUTES).contains(&m) => Some(m * 60_000),
            Some(m) => {
                return Err(format!(
                    "confirm_if_over.minutes must be between 1 and {MAX_MINUTES}, got {m}"
                ));
            }
        };
        Ok(Bounds {
            cost_usd,
            duration_ms,
        })
    }
}

/// A cost bound: a plain decimal string, 0 to [`MAX_COST_USD`], at most
/// [`MAX_COST_PLACES`] places.
fn parse_cost(raw: &str) -> Result<Decimal, String> {
    let bad = || {
        format!(
            "confirm_if_over.cost_usd must be a decimal string of USD between 0 and {MAX_COST_USD} with at most {MAX_COST_PLACES} places (\"0.50\"), got {raw:?}"
        )
    };
    let (whole, places) = match raw.split_once('.') {
        Some((whole, places)) => (whole, Some(places)),
        None => (raw, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let plain = digits(whole)
        && whole.len() <= 7
        && (whole == "0" || !whole.starts_with('0'))
        && places.is_none_or(|p| digits(p) && p.len() <= MAX_COST_PLACES as usize);
    if !plain {
        return Err(bad());
    }
    let usd = Decimal::from_str(raw).map_err(|_| bad())?;
    if usd.scale() > MAX_COST_PLACES || usd > Decimal::from(MAX_COST_USD) {
        return Err(bad());
    }
    Ok(usd)
}

/// A bound the estimate is over (or cannot be compared with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Over {
    /// The p90 cost is above `cost_usd`.
    CostUsd,
    /// The p90 running time is above `minutes`.
    Minutes,
    /// The estimate has no figure to compare (`basis: none`, or no cost
    /// for a cost bound): what it would cost is unknown.
    Unknown,
}

/// What a session awaiting confirmation waits on: shown in its status and
/// logged as its `awaiting_confirmation` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Confirmation {
    /// The bounds the create gave.
    pub confirm_if_over: ConfirmIfOver,
    /// Why it waits: the bounds its p90 is over, or `unknown`.
    pub over: Vec<Over>,
    /// The estimate at create (the one `POST /api/autonomous/estimate` gives).
    pub estimate: Estimate,
    /// When it ends `stopped / confirmation_expired` unless confirmed
    /// (`WARDEN_APPROVAL_TIMEOUT_MS` after the create).
    pub expires_at: DateTime<Utc>,
}

/// Whether a session with `bounds` and `estimate` starts, or waits for a
/// confirmation (and for which reasons, in a fixed order).
pub fn decide(bounds: Bounds, estimate: &Estimate) -> Vec<Over> {
    let mut over = Vec::new();
    let none = estimate.basis == Basis::None;
    let mut unknown = none;
    if let Some(limit) = bounds.cost_usd {
        match &estimate.cost_usd {
            Some(cost) if !none => {
                if cost.p90 > limit {
                    over.push(Over::CostUsd);
                }
            }
            _ => unknown = true,
        }
    }
    if let Some(limit) = bounds.duration_ms
        && !none
        && estimate.duration_ms.p90 > limit
    {
        over.push(Over::Minutes);
    }
    if unknown {
        over.push(Over::Unknown);
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::estimate::Spread;

    fn estimate(basis: Basis, cost: Option<(&str, &str)>, minutes: (u64, u64)) -> Estimate {
        Estimate {
            basis,
            sessions_used: 10,
            closest_similarity: 0.9,
            farthest_similarity: 0.5,
            iterations: Spread { p50: 3, p90: 5 },
            tokens: Spread { p50: 100, p90: 200 },
            duration_ms: Spread {
                p50: minutes.0 * 60_000,
                p90: minutes.1 * 60_000,
            },
            cost_usd: cost.map(|(p50, p90)| Spread {
                p50: p50.parse().unwrap(),
                p90: p90.parse().unwrap(),
            }),
        }
    }

    fn bounds(cost: Option<&str>, minutes: Option<u64>) -> Bounds {
        ConfirmIfOver {
            cost_usd: cost.map(str::to_string),
            minutes,
        }
        .check()
        .unwrap()
    }

    #[test]
    fn the_p90_is_compared() {
        let e = estimate(Basis::SimilarGoals, Some(("0.40", "0.60")), (10, 20));
        // p50 under, p90 over: waits.
        assert_eq!(decide(bounds(Some("0.50"), None), &e), vec![Over::CostUsd]);
        assert_eq!(decide(bounds(None, Some(15)), &e), vec![Over::Minutes]);
        assert_eq!(
            decide(bounds(Some("0.50"), Some(15)), &e),
            vec![Over::CostUsd, Over::Minutes]
        );
        // Equal to the bound is within it.
        assert!(decide(bounds(Some("0.60"), Some(20)), &e).is_empty());
        assert!(decide(bounds(Some("1"), Some(60)), &e).is_empty());
    }

    #[test]
    fn no_basis_means_unknown_and_waits() {
        let e = estimate(Basis::None, None, (1, 1));
        assert_eq!(decide(bounds(None, Some(600)), &e), vec![Over::Unknown]);
        assert_eq!(decide(bounds(Some("100"), None), &e), vec![Over::Unknown]);
        // Even figures are not trusted without a basis.
        let e = estimate(Basis::None, Some(("0", "0")), (1, 1));
        assert_eq!(
            decide(bounds(Some("100"), Some(600)), &e),
            vec![Over::Unknown]
        );
    }

    #[test]
    fn a_cost_bound_without_a_cost_estimate_waits() {
        let e = estimate(Basis::SameExecutor, None, (1, 2));
        assert_eq!(decide(bounds(Some("5"), None), &e), vec![Over::Unknown]);
        // A time bound alone is compared.
        assert!(decide(bounds(None, Some(5)), &e).is_empty());
        assert_eq!(
            decide(bounds(Some("5"), Some(1)), &e),
            vec![Over::Minutes, Over::Unknown]
        );
    }

    #[test]
    fn bounds_are_checked() {
        let check = |cost: Option<&str>, minutes: Option<u64>| {
            ConfirmIfOver {
                cost_usd: cost.map(str::to_string),
                minutes,
            }
            .check()
        };
        assert!(check(None, None).unwrap_err().contains("cost_usd, minutes"));
        for bad in [
            "",
            "-1",
            "1e3",
            ".5",
            "5.",
            "1.2.3",
            "abc",
            "0x10",
            " 1",
            "1000001",
            "01",
            "2402618.955008483477",
            "1000000.5",
        ] {
            let err = check(Some(bad), None).unwrap_err();
            assert!(err.contains("confirm_if_over.cost_usd"), "{bad}: {err}");
        }
        assert!(check(Some("0.0000000000001"), None).is_err());
        assert_eq!(
            check(Some("0.50"), None).unwrap().cost_usd,
            Some("0.5".parse().unwrap())
        );
        assert_eq!(
            check(Some("1000000"), None).unwrap().cost_usd,
            Some(Decimal::from(1_000_000))
        );
        assert!(check(None, Some(0)).unwrap_err().contains("minutes"));
        assert!(check(None, Some(MAX_MINUTES + 1)).is_err());
        assert_eq!(
            check(None, Some(30)).unwrap().duration_ms,
            Some(30 * 60_000)
        );
    }

    #[test]
    fn the_documented_cost_pattern_is_what_parse_cost_takes() {
        let pattern = regex::Regex::new(COST_PATTERN).expect("a regex");
        let alphabet = ['0', '1', '9', '.', '5'];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = 1 + (seed % 22) as usize;
            let raw: String = (0..len)
                .map(|i| alphabet[((seed >> (i % 60)) % 5) as usize])
                .collect();
            assert_eq!(
                pattern.is_match(&raw),
                parse_cost(&raw).is_ok(),
                "documented and taken disagree on {raw:?}"
            );
        }
        for edge in [
            "0",
            "0.5",
            "999999.999999999999",
            "1000000",
            "1000000.000000000000",
        ] {
            assert!(pattern.is_match(edge) && parse_cost(edge).is_ok(), "{edge}");
        }
    }
}
