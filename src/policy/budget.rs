//! The hard token budget: before each step, what the step may spend (its
//! allowance) and what it is likely to spend (its projection); after it,
//! whether it kept to its allowance. Checking only after a step has spent
//! lets a rising series overrun the budget by its whole last step, so the
//! loop pauses before a step projected not to fit, and executors are told
//! the allowance so that they can keep to it.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Recent steps whose largest cost is the floor of the projection.
pub const PEAK_WINDOW: usize = 10;

/// The tokens `usd_left` pays for at `rate_per_mtok` (USD per million
/// tokens of the dearest kind), rounded down, so the step's tokens at that
/// rate never cost more than is left. A free rate pays for any number.
pub fn affordable_tokens(usd_left: Decimal, rate_per_mtok: Decimal) -> u64 {
    if rate_per_mtok <= Decimal::ZERO {
        return u64::MAX;
    }
    if usd_left <= Decimal::ZERO {
        return 0;
    }
    let tokens = usd_left
        .checked_mul(Decimal::from(1_000_000u32))
        .and_then(|micro| micro.checked_div(rate_per_mtok))
        .map_or(Decimal::from(u64::MAX), |t| t.floor());
    u64::try_from(tokens).unwrap_or(u64::MAX)
}

/// What a step may spend: the tokens the budget has left.
pub fn allowance(max_tokens: u64, tokens_used: u64) -> u64 {
    max_tokens.saturating_sub(tokens_used)
}

/// A step's allowance in a tree of sessions: what its own budget has left
/// (`own_left`), but never more than the tree has left (`tree_left`: what
/// every live session of the tree has left, less what overspending steps
/// took that no ancestor could give back; negative when the tree is over)
/// once the allowances the tree's other steps in flight reserved are set
/// aside. Reserved before the step starts, under the root's row lock, so
/// the allowances of concurrent steps together never pass what the tree
/// has: the tree can only pass its root's budget by what steps reported
/// over their own allowance, and only steps in flight together when it ran
/// out can (each ends its session; no later step starts on tokens the tree
/// does not have).
pub fn tree_allowance(own_left: u64, tree_left: i64, reserved_by_others: u64) -> u64 {
    let free = i128::from(tree_left) - i128::from(reserved_by_others);
    let free = u64::try_from(free.max(0)).unwrap_or(u64::MAX);
    own_left.min(free)
}

/// The projected cost of the next step from the per-step token deltas,
/// oldest first; 0 before the first step.
///
/// At least the largest of the last [`PEAK_WINDOW`] steps (a spike seen
/// recently may come back). When the last two steps each cost more than
/// the one before (a rising series), the next delta is also extrapolated
/// linearly (last + its rise) and geometrically (last × the smaller of the
/// two growth ratios, so one jump does not pass for a trend), and the
/// projection is the largest of the three. Saturates instead of overflowing.
pub fn project_next_step(deltas: &[u64]) -> u64 {
    let recent = &deltas[deltas.len().saturating_sub(PEAK_WINDOW)..];
    let peak = recent.iter().copied().max().unwrap_or(0);
    let [.., a, b, c] = deltas else {
        return peak;
    };
    let (a, b, c) = (*a, *b, *c);
    if !(a < b && b < c) {
        return peak;
    }
    let linear = c.saturating_add(c - b);
    // a < b < c, so a may be 0 but b is not: the ratio c/b is defined; a
    // step from 0 has no ratio, and c/b alone then stands for the trend.
    let ratio_cb = c as f64 / b as f64;
    let ratio = if a == 0 {
        ratio_cb
    } else {
        ratio_cb.min(b as f64 / a as f64)
    };
    let geometric = (c as f64 * ratio).ceil();
    // `as` saturates at u64::MAX for values beyond it.
    let geometric = geometric as u64;
    peak.max(linear).max(geometric)
}

/// Why a step may not start: its projected cost does not fit what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectedOverrun {
    /// The tokens the next step is projected to cost.
    pub projected: u64,
    /// The tokens the budget has left.
    pub allowance: u64,
}

impl ProjectedOverrun {
    /// A line for the pause's summary.
    pub fn describe(&self) -> String {
        format!(
            "the next step is projected to cost {} tokens but only {} are left of the budget; resume with a higher max_tokens to go on",
            self.projected, self.allowance
        )
    }
}

/// `Some` when the next step, projected from `deltas`, would not fit in `allowance`.
pub fn check_next_step(deltas: &[u64], allowance: u64) -> Option<ProjectedOverrun> {
    let projected = project_next_step(deltas);
    (projected > allowance).then_some(ProjectedOverrun {
        projected,
        allowance,
    })
}

/// A step that reported more tokens than its allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overspent {
    /// Tokens the step reported.
    pub tokens: u64,
    /// Tokens it was allowed.
    pub allowance: u64,
}

impl Overspent {
    /// A line for the stop's summary.
    pub fn describe(&self, step: u64) -> String {
        format!(
            "step {step} reported {} tokens, over its allowance of {}: the token budget is used up",
            self.tokens, self.allowance
        )
    }
}

/// `Some` when a step's reported `tokens` exceed its `allowance`.
pub fn overspent(tokens: u64, allowance: u64) -> Option<Overspent> {
    (tokens > allowance).then_some(Overspent { tokens, allowance })
}

/// What is charged for usage reported (or estimated) outside a committed
/// step: the report, at most what the step was allowed.
pub fn charge(reported: u64, allowance: u64) -> u64 {
    reported.min(allowance)
}

/// A rough token count of a text of `bytes` bytes (about four a token),
/// rounded up: enough to keep a model call inside its allowance.
pub fn estimate_tokens(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(4)).unwrap_or(u64::MAX)
}

/// The most a model call may generate: its own cap (`per_call`), but never
/// more than the allowance leaves after the prompt. `None` when the prompt
/// alone uses up the allowance: the call is not made.
pub fn completion_cap(allowance: u64, prompt_tokens: u64, per_call: u64) -> Option<u64> {
    let left = allowance.checked_sub(prompt_tokens).filter(|&l| l > 0)?;
    Some(left.min(per_call)).filter(|&cap| cap > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_estimated_at_four_bytes_a_token_rounded_up() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(1), 1);
        assert_eq!(estimate_tokens(4), 1);
        assert_eq!(estimate_tokens(5), 2);
        assert_eq!(estimate_tokens(4_000), 1_000);
    }

    #[test]
    fn a_completion_is_capped_at_what_the_prompt_leaves() {
        // Plenty left: the per-call cap.
        assert_eq!(completion_cap(10_000, 1_000, 4_096), Some(4_096));
        // Little left: what remains after the prompt.
        assert_eq!(completion_cap(1_500, 1_000, 4_096), Some(500));
        assert_eq!(completion_cap(1_001, 1_000, 4_096), Some(1));
        // The prompt alone does not fit: no call.
        assert_eq!(completion_cap(1_000, 1_000, 4_096), None);
        assert_eq!(completion_cap(999, 1_000, 4_096), None);
        assert_eq!(completion_cap(0, 0, 4_096), None);
        // A zero per-call cap asks for nothing, so no call either.
        assert_eq!(completion_cap(10_000, 1_000, 0), None);
    }

    #[test]
    fn a_charge_is_the_report_at_most_the_allowance() {
        assert_eq!(charge(0, 100), 0);
        assert_eq!(charge(40, 100), 40);
        assert_eq!(charge(100, 100), 100);
        assert_eq!(charge(u64::MAX, 100), 100);
        assert_eq!(charge(40, 0), 0);
    }

    #[test]
    fn allowance_is_what_is_left_and_never_negative() {
        assert_eq!(allowance(50_000, 0), 50_000);
        assert_eq!(allowance(50_000, 49_999), 1);
        assert_eq!(allowance(50_000, 50_000), 0);
        assert_eq!(allowance(50_000, 82_030), 0);
        assert_eq!(allowance(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn a_tree_step_gets_its_own_budget_but_never_what_the_tree_lacks() {
        assert_eq!(tree_allowance(500, 10_000, 0), 500);
        assert_eq!(tree_allowance(500, 10_000, 9_700), 300);
        assert_eq!(tree_allowance(500, 10_000, 10_000), 0);
        assert_eq!(tree_allowance(500, -50, 0), 0);
        assert_eq!(tree_allowance(500, 400, 500), 0);
        assert_eq!(tree_allowance(u64::MAX, i64::MAX, 0), i64::MAX as u64);
        assert_eq!(tree_allowance(7, i64::MIN, u64::MAX), 0);
    }

    #[test]
    fn no_history_projects_nothing() {
        assert_eq!(project_next_step(&[]), 0);
    }

    #[test]
    fn one_or_two_steps_project_the_largest() {
        assert_eq!(project_next_step(&[700]), 700);
        assert_eq!(project_next_step(&[100, 200]), 200);
        assert_eq!(project_next_step(&[200, 100]), 200);
        assert_eq!(project_next_step(&[0, 0]), 0);
    }

    #[test]
    fn a_steady_series_projects_its_step() {
        assert_eq!(project_next_step(&[1_000; 49]), 1_000);
    }

    #[test]
    fn a_falling_series_projects_its_recent_peak() {
        assert_eq!(project_next_step(&[900, 500, 100]), 900);
    }

    #[test]
    fn a_doubling_series_is_projected_exactly() {
        assert_eq!(project_next_step(&[10, 20, 40]), 80);
        assert_eq!(project_next_step(&[1_000, 2_000, 4_000, 8_000]), 16_000);
        let doubling: Vec<u64> = (0..12).map(|i| 10 << i).collect();
        assert_eq!(project_next_step(&doubling), 10 << 12);
    }

    #[test]
    fn a_linear_series_projects_at_least_its_next_step() {
        assert_eq!(project_next_step(&[1_000, 2_000, 3_000]), 4_500);
        // Geometric with the smaller ratio (10/9) is a little above linear.
        assert_eq!(project_next_step(&[8_000, 9_000, 10_000]), 11_112);
        assert_eq!(project_next_step(&[0, 1, 2]), 4);
    }

    #[test]
    fn one_jump_is_a_spike_not_a_trend() {
        // Only the last step rose: the spike itself is the projection.
        assert_eq!(project_next_step(&[100, 100, 100, 100, 20_000]), 20_000);
        // A small rise then a jump: the smaller ratio keeps it sane.
        assert_eq!(project_next_step(&[100, 101, 5_000]), 9_899);
    }

    #[test]
    fn a_spike_is_remembered_for_the_peak_window() {
        let mut s = vec![100, 100, 100, 100, 20_000];
        s.extend([100; 9]);
        assert_eq!(project_next_step(&s), 20_000);
        s.push(100);
        assert_eq!(project_next_step(&s), 100);
    }

    #[test]
    fn huge_values_saturate() {
        assert_eq!(
            project_next_step(&[1, u64::MAX / 2, u64::MAX - 1]),
            u64::MAX
        );
        assert_eq!(project_next_step(&[u64::MAX]), u64::MAX);
    }

    #[test]
    fn the_next_step_is_checked_against_the_allowance() {
        assert_eq!(check_next_step(&[], 0), None);
        assert_eq!(check_next_step(&[100], 100), None);
        assert_eq!(
            check_next_step(&[100], 99),
            Some(ProjectedOverrun {
                projected: 100,
                allowance: 99
            })
        );
        assert!(check_next_step(&[10, 20, 40], 79).is_some());
        assert!(check_next_step(&[10, 20, 40], 80).is_none());
        assert!(
            check_next_step(&[10, 20, 40], 1).is_some_and(|p| p.describe().contains("80 tokens"))
        );
    }

    #[test]
    fn overspending_is_more_than_the_allowance() {
        assert_eq!(overspent(100, 100), None);
        assert_eq!(overspent(0, 0), None);
        assert_eq!(
            overspent(101, 100),
            Some(Overspent {
                tokens: 101,
                allowance: 100
            })
        );
        assert!(
            overspent(5_000, 1_000)
                .is_some_and(|o| o.describe(3).starts_with("step 3 reported 5000"))
        );
    }

    /// A small deterministic PRNG (SplitMix64): many series, no new crate.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// How a simulated session ended.
    #[derive(Debug, PartialEq)]
    enum End {
        Paused,
        CostLimit,
        Overspent,
        Ran,
    }

    /// The loop's budget rule over a series of step costs: before each
    /// step pause on a projected overrun, stop when nothing is left; after
    /// it, a step over its allowance ends the run.
    fn simulate(max_tokens: u64, costs: &[u64]) -> (u64, End) {
        let mut used = 0u64;
        let mut deltas = Vec::new();
        for &cost in costs {
            let left = allowance(max_tokens, used);
            if left == 0 {
                return (used, End::CostLimit);
            }
            if check_next_step(&deltas, left).is_some() {
                return (used, End::Paused);
            }
            used = used.saturating_add(cost);
            deltas.push(cost);
            if overspent(cost, left).is_some() {
                return (used, End::Overspent);
            }
        }
        (used, End::Ran)
    }

    /// A random series: steady, linear, geometric, spiky or noise.
    fn series(rng: &mut SplitMix) -> Vec<u64> {
        let len = 1 + rng.below(60) as usize;
        let base = rng.below(5_000);
        match rng.below(5) {
            0 => vec![base; len],
            1 => {
                let step = rng.below(2_000);
                (0..len as u64).map(|i| base + i * step).collect()
            }
            2 => {
                let factor = 2 + rng.below(3);
                (0..len as u32)
                    .map(|i| (base + 1).saturating_mul(factor.saturating_pow(i)))
                    .collect()
            }
            3 => {
                let every = 2 + rng.below(6);
                let spike = rng.below(40_000);
                (1..=len as u64)
                    .map(|i| if i % every == 0 { spike } else { base })
                    .collect()
            }
            _ => (0..len).map(|_| rng.below(30_000)).collect(),
        }
    }

    #[test]
    fn a_series_that_respects_its_allowance_never_overruns_the_budget() {
        let mut rng = SplitMix(0x5EED);
        for _ in 0..20_000 {
            let max_tokens = 1 + rng.below(200_000);
            let raw = series(&mut rng);
            // What a capped executor spends: never more than it is allowed.
            let mut used = 0u64;
            let capped: Vec<u64> = raw
                .iter()
                .map(|&c| {
                    let c = c.min(allowance(max_tokens, used));
                    used += c;
                    c
                })
                .collect();
            let (spent, end) = simulate(max_tokens, &capped);
            assert!(spent <= max_tokens, "{spent} > {max_tokens} for {capped:?}");
            assert_ne!(end, End::Overspent, "{capped:?} against {max_tokens}");
        }
    }

    #[test]
    fn an_overspending_step_is_the_only_way_past_the_budget_and_ends_the_run() {
        let mut rng = SplitMix(0xB0D6E7);
        for _ in 0..20_000 {
            let max_tokens = 1 + rng.below(200_000);
            let costs = series(&mut rng);
            let (spent, end) = simulate(max_tokens, &costs);
            if spent > max_tokens {
                assert_eq!(end, End::Overspent, "{costs:?} against {max_tokens}");
            }
            if end == End::Overspent {
                // Everything before the overspending step fitted the budget.
                let n = costs
                    .iter()
                    .scan(0u64, |sum, &c| {
                        *sum = sum.saturating_add(c);
                        Some(*sum)
                    })
                    .position(|sum| sum == spent)
                    .unwrap_or(0);
                assert!(
                    spent - costs[n] <= max_tokens,
                    "{costs:?} against {max_tokens}"
                );
            }
        }
    }

    #[test]
    fn the_corpus_series_end_within_the_budget() {
        let doubling = |first: u64| -> Vec<u64> { (0..20).map(|i| first << i).collect() };
        assert_eq!(simulate(50_000, &doubling(10)), (40_950, End::Paused));
        assert_eq!(simulate(50_000, &doubling(100)), (25_500, End::Paused));
        assert_eq!(simulate(50_000, &doubling(1_000)), (31_000, End::Paused));
        let linear: Vec<u64> = (1..=20).map(|i| i * 1_000).collect();
        assert_eq!(simulate(50_000, &linear), (45_000, End::Paused));
        let spiky: Vec<u64> = (1..=40)
            .map(|i| if i % 5 == 0 { 20_000 } else { 100 })
            .collect();
        assert_eq!(simulate(50_000, &spiky), (40_800, End::Paused));
        assert_eq!(simulate(50_000, &[1_000; 50]), (50_000, End::Ran));
        assert_eq!(simulate(50_000, &[1_000; 51]), (50_000, End::CostLimit));
        assert_eq!(simulate(1_000, &[5_000]), (5_000, End::Overspent));
    }

    #[test]
    fn a_money_budget_pays_for_the_tokens_its_rate_allows_rounded_down() {
        let d = |s: &str| s.parse::<Decimal>().expect("decimal");
        // $1 at $10 per million: 100,000 tokens.
        assert_eq!(affordable_tokens(d("1"), d("10")), 100_000);
        // $0.000015 at $10 per million: 1.5 tokens, so 1.
        assert_eq!(affordable_tokens(d("0.000015"), d("10")), 1);
        assert_eq!(affordable_tokens(d("0.000009"), d("10")), 0);
        assert_eq!(affordable_tokens(Decimal::ZERO, d("10")), 0);
        assert_eq!(affordable_tokens(d("-1"), d("10")), 0);
        // A free model: any number.
        assert_eq!(affordable_tokens(d("1"), Decimal::ZERO), u64::MAX);
        // The most a budget may be at the cheapest rate saturates.
        assert_eq!(affordable_tokens(d("1000000"), d("0.0000000001")), u64::MAX);
    }

    /// "Stops that are right", extended to money: over random sessions, a
    /// session whose steps are held to the tokens its money budget pays for
    /// at the reservation rate never spends past `max_cost_usd` when its
    /// model is priced at that rate, and by at most one step's allowance
    /// when an agent reports a dearer model than the one reserved for.
    #[test]
    fn a_money_budget_is_never_passed_by_more_than_one_steps_allowance() {
        use crate::policy::pricing::{Price, TokenUsage, cost_of};
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        for case in 0..2_000 {
            let reserved = Price {
                input_per_mtok: Decimal::new(next(5_000) as i64 + 1, 2),
                output_per_mtok: Decimal::new(next(20_000) as i64 + 1, 2),
                cached_input_per_mtok: Decimal::new(next(500) as i64, 2),
            };
            // One case in four, the agent used a dearer model than reserved.
            let dearer = next(4) == 0;
            let used = if dearer {
                Price {
                    output_per_mtok: reserved.output_per_mtok * Decimal::from(3),
                    ..reserved
                }
            } else {
                reserved
            };
            let max = Decimal::new(next(1_000_000) as i64 + 1, 6);
            let rate = reserved.dearest_per_mtok();
            let (mut spent, mut last_allowance_cost) = (Decimal::ZERO, Decimal::ZERO);
            while spent < max {
                let allowance = affordable_tokens(max - spent, rate);
                if allowance == 0 {
                    break;
                }
                // The agent reports anything; the loop holds it to the allowance.
                let tokens = charge(next(allowance.saturating_mul(2)), allowance);
                let input = next(tokens + 1);
                let usage = TokenUsage {
                    input,
                    cached_input: next(input + 1),
                    output: tokens - input,
                };
                let cost = cost_of(&used, usage);
                last_allowance_cost = Decimal::from(allowance) * used.dearest_per_mtok()
                    / Decimal::from(1_000_000u32);
                spent += cost;
            }
            if dearer {
                assert!(
                    spent <= max + last_allowance_cost,
                    "case {case}: {spent} over {max} by more than one step's allowance"
                );
            } else {
                assert!(spent <= max, "case {case}: spent {spent} of {max}");
            }
        }
    }
}
