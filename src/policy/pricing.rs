//! Money: what a step cost, from the operator's price table and the usage
//! the step reported. Prices are per million tokens, input, cached input and
//! output apart, per model name or pattern, and dated (`valid_from`) so a
//! price change never reprices history. Amounts are exact decimals: the sum
//! of the steps' costs is the session's cost, digit for digit.
//!
//! The table's text form (the operator's setting, once money is wired
//! through the loop; issue 43) has entries separated by `;` or new lines:
//!
//! ```text
//! gpt-4o=2.50/10.00/1.25; gpt-4o-mini=0.15/0.60/0.075
//! claude-sonnet-4*=3/15/0.30@2025-05-22; *=5/20
//! ```
//!
//! `pattern=input/output[/cached_input][@YYYY-MM-DD]`: `*` in a pattern
//! matches any run of characters; a lone `*` is the default for models no
//! other entry names. A model no entry matches is `unpriced`, never 0.

use std::fmt;

use chrono::NaiveDate;
use rust_decimal::Decimal;
use serde::Serialize;

/// Highest price per million tokens the table accepts (USD).
pub const MAX_PRICE_PER_MTOK: u32 = 1_000_000;
/// Most decimal places a price may have.
pub const MAX_PRICE_SCALE: u32 = 10;
/// Most entries a table may hold.
pub const MAX_ENTRIES: usize = 500;
/// Longest model name or pattern.
pub const MAX_PATTERN_CHARS: usize = 200;

/// A model's prices per million tokens, in USD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Price {
    /// Uncached input (prompt) tokens.
    pub input_per_mtok: Decimal,
    /// Output (completion, reasoning included) tokens.
    pub output_per_mtok: Decimal,
    /// Input tokens served from the provider's prompt cache.
    pub cached_input_per_mtok: Decimal,
}

/// One line of the price table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PriceEntry {
    /// The model name, or a pattern with `*`.
    pub pattern: String,
    /// The first day the price holds (always, when absent).
    pub valid_from: Option<NaiveDate>,
    /// The prices.
    pub price: Price,
}

/// The operator's price table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PriceTable {
    entries: Vec<PriceEntry>,
}

/// The tokens one step used, as the model (or the agent) reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// All input tokens, cached ones included.
    pub input: u64,
    /// Of `input`, those served from a prompt cache.
    pub cached_input: u64,
    /// Output tokens.
    pub output: u64,
}

/// The usage a step reported, as an agent or a model API gives it (the
/// OpenAI Agents SDK's names): input tokens (cached ones included), output
/// tokens (reasoning ones included), and the model that used them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct StepUsage {
    /// All input tokens, cached ones included.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens, reasoning ones included.
    #[serde(default)]
    pub output_tokens: u64,
    /// Of `input_tokens`, those served from a prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Of `output_tokens`, those spent reasoning (reported, not priced apart).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// The model's name (the price table's key; at most 200 characters
    /// are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl StepUsage {
    /// A step that reported only a count: no split, and priced as output
    /// tokens (the dearer kind for every common model, so a cost is never
    /// under what was spent).
    pub fn unsplit(tokens: u64, model: Option<String>) -> StepUsage {
        StepUsage {
            output_tokens: tokens,
            model,
            ..StepUsage::default()
        }
    }

    /// Input plus output, saturating.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The usage held to the `tokens` the step was counted (its budgeted
    /// count, itself held to the step's allowance): input and output add
    /// up to exactly `tokens`, so the tokens priced are the tokens counted.
    /// Input is kept first (it is known before the answer); output takes
    /// the rest, whether the report was over or under. Cached tokens stay
    /// within input, reasoning within output, and the model's name within
    /// [`MAX_PATTERN_CHARS`] characters.
    pub fn bounded(mut self, tokens: u64) -> StepUsage {
        self.input_tokens = self.input_tokens.min(tokens);
        self.output_tokens = tokens - self.input_tokens;
        self.cached_tokens = self.cached_tokens.min(self.input_tokens);
        self.reasoning_tokens = self.reasoning_tokens.min(self.output_tokens);
        self.model = self
            .model
            .map(|m| m.trim().chars().take(MAX_PATTERN_CHARS).collect::<String>())
            .filter(|m| !m.is_empty());
        self
    }

    /// The counts the price table prices.
    pub fn priced_tokens(&self) -> TokenUsage {
        TokenUsage {
            input: self.input_tokens,
            cached_input: self.cached_tokens,
            output: self.output_tokens,
        }
    }
}

/// What a step cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepCost {
    /// Priced by `entry`.
    Priced {
        /// USD, exact.
        usd: Decimal,
        /// The entry that priced it (pattern and date), for the audit trail.
        pattern: String,
        /// That entry's first day.
        valid_from: Option<NaiveDate>,
    },
    /// Tokens were used but no entry prices the model: flagged, not 0.
    Unpriced,
    /// The step used no tokens.
    Free,
}

/// Why a price table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("price table entry {entry}: {problem}")]
pub struct PriceTableError {
    /// The 1-based entry.
    pub entry: usize,
    /// What is wrong with it.
    pub problem: String,
}

impl PriceTable {
    /// Parses the table's text form; empty text is an empty table.
    pub fn parse(text: &str) -> Result<PriceTable, PriceTableError> {
        let lines = text
            .split([';', '\n'])
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let mut entries: Vec<PriceEntry> = Vec::new();
        for (i, line) in lines.enumerate() {
            let fail = |problem: String| PriceTableError {
                entry: i + 1,
                problem,
            };
            if i >= MAX_ENTRIES {
                return Err(fail(format!("more than {MAX_ENTRIES} entries")));
            }
            let entry = parse_entry(line).map_err(fail)?;
            if entries
                .iter()
                .any(|e| e.pattern == entry.pattern && e.valid_from == entry.valid_from)
            {
                return Err(fail(format!(
                    "{} is priced twice from the same day",
                    entry.pattern
                )));
            }
            entries.push(entry);
        }
        Ok(PriceTable { entries })
    }

    /// The table's entries, as given.
    pub fn entries(&self) -> &[PriceEntry] {
        &self.entries
    }

    /// The entry that prices `model` on `day`: an exact name before a
    /// pattern, a longer pattern before a shorter, and among the lines of
    /// one pattern the latest that has started. `None` when no entry does.
    pub fn lookup(&self, model: Option<&str>, day: NaiveDate) -> Option<&PriceEntry> {
        let model = model.map(str::trim).unwrap_or("");
        self.entries
            .iter()
            .filter(|e| e.valid_from.is_none_or(|from| from <= day))
            .filter(|e| {
                if model.is_empty() {
                    e.pattern == "*"
                } else {
                    glob_matches(&e.pattern, model)
                }
            })
            .max_by_key(|e| (specificity(&e.pattern), e.valid_from))
    }

    /// What `usage` on `model` on `day` cost.
    pub fn cost(&self, model: Option<&str>, usage: TokenUsage, day: NaiveDate) -> StepCost {
        if usage.input == 0 && usage.output == 0 {
            return StepCost::Free;
        }
        match self.lookup(model, day) {
            Some(entry) => StepCost::Priced {
                usd: cost_of(&entry.price, usage),
                pattern: entry.pattern.clone(),
                valid_from: entry.valid_from,
            },
            None => StepCost::Unpriced,
        }
    }
}

impl Price {
    /// The dearest kind of token at this price, per million: what a token
    /// of unknown kind may cost.
    pub fn dearest_per_mtok(&self) -> Decimal {
        self.input_per_mtok
            .max(self.output_per_mtok)
            .max(self.cached_input_per_mtok)
    }
}

impl PriceTable {
    /// The rate (USD per million tokens, the dearest kind) a money budget
    /// holds a step's tokens at before the step runs: the price of
    /// `model` when an entry prices it; for a model not known before the
    /// step (an agent reports its own), the `*` default, else the dearest
    /// entry in force, so the reservation is never under the worst case.
    /// `None` for a table with no entry in force.
    pub fn reservation_rate(&self, model: Option<&str>, day: NaiveDate) -> Option<Decimal> {
        if let Some(entry) = self.lookup(model, day) {
            return Some(entry.price.dearest_per_mtok());
        }
        self.entries
            .iter()
            .filter(|e| e.valid_from.is_none_or(|from| from <= day))
            .map(|e| e.price.dearest_per_mtok())
            .max()
    }
}

/// `usage` at `price`, exact: per-million prices times token counts, the
/// division by a million a shift of the decimal point.
pub fn cost_of(price: &Price, usage: TokenUsage) -> Decimal {
    let cached = usage.cached_input.min(usage.input);
    let uncached = usage.input - cached;
    let per_mtok = price.input_per_mtok * Decimal::from(uncached)
        + price.cached_input_per_mtok * Decimal::from(cached)
        + price.output_per_mtok * Decimal::from(usage.output);
    // Prices carry at most MAX_PRICE_SCALE places, so dividing by a million
    // is a shift of the scale within Decimal's 28 places and loses nothing.
    let mut usd = per_mtok;
    match usd.set_scale(per_mtok.scale() + 6) {
        Ok(()) => usd.normalize(),
        Err(_) => (per_mtok / Decimal::from(1_000_000u32)).normalize(),
    }
}

/// Higher for a pattern that names a model more narrowly.
fn specificity(pattern: &str) -> (bool, usize) {
    let literal = pattern.chars().filter(|c| *c != '*').count();
    (!pattern.contains('*'), literal)
}

fn parse_entry(line: &str) -> Result<PriceEntry, String> {
    let (pattern, rest) = line
        .split_once('=')
        .ok_or_else(|| format!("{line:?} is not pattern=input/output[/cached_input][@date]"))?;
    let pattern = pattern.trim();
    check_pattern(pattern)?;
    let (prices, valid_from) = match rest.rsplit_once('@') {
        Some((prices, day)) => {
            let day = NaiveDate::parse_from_str(day.trim(), "%Y-%m-%d")
                .map_err(|_| format!("{:?} is not a date (YYYY-MM-DD)", day.trim()))?;
            (prices, Some(day))
        }
        None => (rest, None),
    };
    let parts: Vec<&str> = prices.split('/').map(str::trim).collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(format!(
            "{prices:?} has {} prices; give input/output or input/output/cached_input",
            parts.len()
        ));
    }
    let input = parse_price(parts[0], "input")?;
    let output = parse_price(parts[1], "output")?;
    let cached = match parts.get(2) {
        Some(p) => parse_price(p, "cached_input")?,
        None => input,
    };
    Ok(PriceEntry {
        pattern: pattern.to_string(),
        valid_from,
        price: Price {
            input_per_mtok: input,
            output_per_mtok: output,
            cached_input_per_mtok: cached,
        },
    })
}

fn check_pattern(pattern: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._:/*".contains(c);
    if pattern.is_empty() {
        Err("the model name is empty".into())
    } else if pattern.chars().count() > MAX_PATTERN_CHARS {
        Err(format!(
            "the model name is longer than {MAX_PATTERN_CHARS} characters"
        ))
    } else if let Some(c) = pattern.chars().find(|c| !allowed(*c)) {
        Err(format!(
            "{pattern:?} holds {c:?}; use letters, digits, - . _ : / and *"
        ))
    } else {
        Ok(())
    }
}

fn parse_price(text: &str, what: &str) -> Result<Decimal, String> {
    let price: Decimal = text
        .parse()
        .map_err(|_| format!("the {what} price {text:?} is not a decimal number"))?;
    if price.is_sign_negative() {
        return Err(format!("the {what} price {text} is negative"));
    }
    if price > Decimal::from(MAX_PRICE_PER_MTOK) {
        return Err(format!(
            "the {what} price {text} is over {MAX_PRICE_PER_MTOK} per million tokens"
        ));
    }
    if price.scale() > MAX_PRICE_SCALE {
        return Err(format!(
            "the {what} price {text} has more than {MAX_PRICE_SCALE} decimal places"
        ));
    }
    Ok(price.normalize())
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl fmt::Display for StepCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepCost::Priced { usd, pattern, .. } => write!(f, "${usd} ({pattern})"),
            StepCost::Unpriced => f.write_str("unpriced"),
            StepCost::Free => f.write_str("$0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("date")
    }

    fn dec(s: &str) -> Decimal {
        s.parse().expect("decimal")
    }

    fn table() -> PriceTable {
        PriceTable::parse(
            "gpt-4o=2.50/10.00/1.25; gpt-4o-mini=0.15/0.60/0.075\n\
             claude-sonnet-4*=3/15/0.30@2025-05-22\n\
             claude-sonnet-4*=4/16@2026-01-01\n\
             # a comment\n\
             gpt-*=1/2",
        )
        .expect("table")
    }

    #[test]
    fn an_exact_name_beats_a_pattern_and_a_longer_pattern_a_shorter() {
        let t = table();
        let today = day("2026-06-01");
        assert_eq!(
            t.lookup(Some("gpt-4o"), today).expect("hit").pattern,
            "gpt-4o"
        );
        assert_eq!(
            t.lookup(Some("gpt-4o-mini"), today).expect("hit").pattern,
            "gpt-4o-mini"
        );
        assert_eq!(
            t.lookup(Some("gpt-5"), today).expect("hit").pattern,
            "gpt-*"
        );
        assert_eq!(t.lookup(Some("llama-3"), today), None);
        assert_eq!(t.lookup(None, today), None);
    }

    #[test]
    fn a_dated_price_holds_from_its_day_and_the_latest_started_wins() {
        let t = table();
        let model = Some("claude-sonnet-4-5");
        assert_eq!(t.lookup(model, day("2025-05-21")), None, "before any price");
        let may = t.lookup(model, day("2025-05-22")).expect("hit");
        assert_eq!(may.price.input_per_mtok, dec("3"));
        let later = t.lookup(model, day("2026-01-01")).expect("hit");
        assert_eq!(later.price.input_per_mtok, dec("4"));
        assert_eq!(
            later.price.cached_input_per_mtok,
            dec("4"),
            "cached defaults to input"
        );
    }

    #[test]
    fn a_lone_star_is_the_default_and_prices_an_unnamed_model() {
        let t = PriceTable::parse("gpt-4o=2.5/10; *=5/20").expect("table");
        let today = day("2026-01-01");
        assert_eq!(t.lookup(Some("mystery"), today).expect("hit").pattern, "*");
        assert_eq!(t.lookup(None, today).expect("hit").pattern, "*");
        assert_eq!(
            t.lookup(Some("gpt-4o"), today).expect("hit").pattern,
            "gpt-4o"
        );
    }

    #[test]
    fn cost_prices_input_cached_input_and_output_apart_exactly() {
        let price = Price {
            input_per_mtok: dec("2.50"),
            output_per_mtok: dec("10.00"),
            cached_input_per_mtok: dec("1.25"),
        };
        let usage = TokenUsage {
            input: 1_000,
            cached_input: 400,
            output: 300,
        };
        // 600 × 2.5 + 400 × 1.25 + 300 × 10 = 1500 + 500 + 3000 per million.
        assert_eq!(cost_of(&price, usage), dec("0.005"));
        let one = TokenUsage {
            input: 1,
            cached_input: 0,
            output: 0,
        };
        let tiny = Price {
            input_per_mtok: dec("0.0000000001"),
            ..price
        };
        assert_eq!(cost_of(&tiny, one), dec("0.0000000000000001"));
    }

    #[test]
    fn cached_tokens_never_exceed_input_and_the_largest_counts_do_not_overflow() {
        let price = Price {
            input_per_mtok: Decimal::from(MAX_PRICE_PER_MTOK),
            output_per_mtok: Decimal::from(MAX_PRICE_PER_MTOK),
            cached_input_per_mtok: Decimal::ZERO,
        };
        let odd = TokenUsage {
            input: 10,
            cached_input: 50,
            output: 0,
        };
        assert_eq!(cost_of(&price, odd), Decimal::ZERO, "all ten were cached");
        let huge = TokenUsage {
            input: u64::MAX,
            cached_input: 0,
            output: u64::MAX,
        };
        let expected = Decimal::from(u64::MAX) * Decimal::from(2u8);
        assert_eq!(cost_of(&price, huge), expected);
    }

    #[test]
    fn a_step_is_priced_unpriced_or_free() {
        let t = table();
        let today = day("2026-06-01");
        let used = TokenUsage {
            input: 1_000_000,
            cached_input: 0,
            output: 0,
        };
        assert_eq!(
            t.cost(Some("gpt-4o"), used, today),
            StepCost::Priced {
                usd: dec("2.5"),
                pattern: "gpt-4o".into(),
                valid_from: None
            }
        );
        assert_eq!(t.cost(Some("llama"), used, today), StepCost::Unpriced);
        assert_eq!(
            t.cost(Some("llama"), TokenUsage::default(), today),
            StepCost::Free
        );
    }

    #[test]
    fn step_costs_sum_to_the_session_cost_digit_for_digit() {
        let t = table();
        let today = day("2026-06-01");
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let models = ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5", "gpt-5"];
        let mut total = Decimal::ZERO;
        let mut per_model = [Decimal::ZERO; 4];
        let mut tokens = [(0u64, 0u64, 0u64); 4];
        for _ in 0..10_000 {
            let m = (next() % 4) as usize;
            let input = next() % 20_000;
            let usage = TokenUsage {
                input,
                cached_input: next() % (input + 1),
                output: next() % 5_000,
            };
            let StepCost::Priced { usd, .. } = t.cost(Some(models[m]), usage, today) else {
                continue;
            };
            total += usd;
            per_model[m] += usd;
            tokens[m].0 += usage.input - usage.cached_input;
            tokens[m].1 += usage.cached_input;
            tokens[m].2 += usage.output;
        }
        // Pricing the summed tokens once gives the same amount as summing
        // the steps: nothing was rounded along the way.
        for (m, model) in models.iter().enumerate() {
            let price = t.lookup(Some(model), today).expect("priced").price;
            let (uncached, cached, output) = tokens[m];
            let once = cost_of(
                &price,
                TokenUsage {
                    input: uncached + cached,
                    cached_input: cached,
                    output,
                },
            );
            assert_eq!(once, per_model[m], "{model}");
        }
        assert_eq!(total, per_model.iter().copied().sum::<Decimal>());
    }

    #[test]
    fn reported_usage_is_held_to_the_counted_tokens() {
        let u = |i, o, c, r| StepUsage {
            input_tokens: i,
            output_tokens: o,
            cached_tokens: c,
            reasoning_tokens: r,
            model: Some(format!("  {}  ", "m".repeat(300))),
        };
        // Over: input kept, output takes the rest.
        let b = u(80, 50, 100, 40).bounded(100);
        assert_eq!(
            (
                b.input_tokens,
                b.output_tokens,
                b.cached_tokens,
                b.reasoning_tokens
            ),
            (80, 20, 80, 20)
        );
        assert_eq!(b.model.as_deref().map(str::len), Some(MAX_PATTERN_CHARS));
        // Input alone over.
        let b = u(u64::MAX, u64::MAX, u64::MAX, u64::MAX).bounded(7);
        assert_eq!(
            (
                b.input_tokens,
                b.output_tokens,
                b.cached_tokens,
                b.reasoning_tokens
            ),
            (7, 0, 7, 0)
        );
        // Under: the rest is output.
        let b = u(10, 5, 3, 1).bounded(40);
        assert_eq!((b.input_tokens, b.output_tokens, b.total()), (10, 30, 40));
        // An empty name is no name.
        let b = StepUsage {
            model: Some("  ".into()),
            ..StepUsage::default()
        }
        .bounded(0);
        assert_eq!(b.model, None);
        assert_eq!(
            StepUsage::unsplit(9, None).priced_tokens(),
            TokenUsage {
                input: 0,
                cached_input: 0,
                output: 9
            }
        );
    }

    #[test]
    fn bad_tables_are_refused_with_the_entry_and_the_reason() {
        for (text, needle) in [
            ("gpt-4o", "not pattern="),
            ("gpt-4o=1", "has 1 prices"),
            ("gpt-4o=1/2/3/4", "has 4 prices"),
            ("gpt-4o=a/2", "input price \"a\""),
            ("gpt-4o=1/-2", "negative"),
            ("gpt-4o=1/2000000", "over 1000000"),
            ("gpt-4o=0.00000000001/1", "decimal places"),
            ("gpt 4o=1/2", "holds ' '"),
            ("=1/2", "empty"),
            ("gpt-4o=1/2@2025-13-01", "not a date"),
            ("gpt-4o=1/2; gpt-4o=3/4", "priced twice"),
        ] {
            let err = PriceTable::parse(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
        let err = PriceTable::parse("a=1/2; b=1/2; c=x/1").expect_err("third");
        assert_eq!(err.entry, 3);
        assert_eq!(
            PriceTable::parse("  \n ; ").expect("empty"),
            PriceTable::default()
        );
        let many = (0..=MAX_ENTRIES)
            .map(|i| format!("m{i}=1/1"))
            .collect::<Vec<_>>();
        assert!(PriceTable::parse(&many.join(";")).is_err());
    }

    #[test]
    fn globs_match_runs_of_characters() {
        for (pattern, name, hit) in [
            ("*", "anything", true),
            ("*", "", true),
            ("gpt-*", "gpt-4o", true),
            ("gpt-*", "gpt-", true),
            ("gpt-*", "xgpt-4", false),
            ("*-mini", "gpt-4o-mini", true),
            ("*-mini", "gpt-4o-max", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_matches(pattern, name), hit, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn a_reservation_holds_a_token_at_the_dearest_kind_of_its_models_price() {
        let t = table();
        let today = day("2026-06-01");
        // gpt-4o: output (10.00) is the dearest kind.
        assert_eq!(t.reservation_rate(Some("gpt-4o"), today), Some(dec("10")));
        // A model no entry prices, or none named: the dearest entry in
        // force (claude-sonnet-4* from 2026-01-01, output 16).
        assert_eq!(t.reservation_rate(Some("llama"), today), Some(dec("16")));
        assert_eq!(t.reservation_rate(None, today), Some(dec("16")));
        // Before 2026 the later claude line is not in force.
        assert_eq!(t.reservation_rate(None, day("2025-06-01")), Some(dec("15")));
        // A `*` default prices what is unnamed.
        let with_default = PriceTable::parse("gpt-4o=2.50/10.00; *=1/3/0.5").expect("table");
        assert_eq!(with_default.reservation_rate(None, today), Some(dec("3")));
        assert_eq!(
            with_default.reservation_rate(Some("llama"), today),
            Some(dec("3"))
        );
        assert_eq!(PriceTable::default().reservation_rate(None, today), None);
    }
}
