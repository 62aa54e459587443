//! Foresight: what a session will likely take, before it starts, from the
//! tenant's ended sessions most like it, never from a model's own guess.
//!
//! "Like it" is the same executor kind and model and a similar goal: the
//! TF-IDF cosine of the words of goal and criteria (lower-cased, split on
//! anything not a letter or digit, words of one letter and common English
//! stop words dropped), computed over the candidates themselves. The
//! figures are order statistics of the closest sessions: with `n` of them,
//! the p50 is the ⌈0.5·(n+1)⌉-th smallest and the p90 the ⌈0.9·(n+1)⌉-th
//! (capped at `n`), so a new session like them falls under the p90 about
//! nine times in ten. Too few sessions and the answer says so
//! (`basis: none`) with the configured defaults.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Fewest past sessions an estimate is drawn from.
pub const MIN_SESSIONS: usize = 5;
/// Most past sessions an estimate is drawn from (the closest).
pub const MAX_NEIGHBOURS: usize = 25;
/// Least goal similarity for a past session to count as like this one.
pub const MIN_SIMILARITY: f64 = 0.2;

/// Words too common to tell goals apart.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it",
    "its", "of", "on", "or", "that", "the", "this", "to", "with", "all", "each", "every", "our",
    "your", "then", "than", "so", "do", "does", "make", "sure",
];

/// An ended session, as history for estimates.
#[derive(Debug, Clone, PartialEq)]
pub struct PastSession {
    /// Executor kind (`llm`, `webhook`, `worker`, `scripted`).
    pub executor_kind: String,
    /// The model, when the executor names one.
    pub model: Option<String>,
    /// Goal and criteria, as one text.
    pub text: String,
    /// What it took.
    pub figures: Figures,
}

/// What a session took (or will likely take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Figures {
    /// Iterations.
    pub iterations: u64,
    /// Tokens.
    pub tokens: u64,
    /// Running wall time in milliseconds.
    pub duration_ms: u64,
    /// Cost in USD, when every step was priced.
    #[schema(value_type = Option<String>)]
    pub cost_usd: Option<Decimal>,
}

/// The session to estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'a> {
    /// Executor kind.
    pub executor_kind: &'a str,
    /// The model, when the executor names one.
    pub model: Option<&'a str>,
    /// Goal and criteria, as one text.
    pub text: &'a str,
}

/// A p50 and a p90.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Spread<T> {
    /// Half of the like sessions took at most this.
    pub p50: T,
    /// Nine in ten took at most this.
    pub p90: T,
}

/// What an estimate rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Ended sessions with the same executor and a similar goal.
    SimilarGoals,
    /// Too few similar goals: ended sessions with the same executor.
    SameExecutor,
    /// Too little history: the configured defaults, not a prediction.
    None,
}

/// The answer: spreads and their basis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Estimate {
    /// What it rests on.
    pub basis: Basis,
    /// How many past sessions it used.
    pub sessions_used: usize,
    /// The highest goal similarity among them (0–1).
    pub closest_similarity: f64,
    /// The lowest goal similarity among them (0–1).
    pub farthest_similarity: f64,
    /// Iterations.
    pub iterations: Spread<u64>,
    /// Tokens.
    pub tokens: Spread<u64>,
    /// Running wall time in milliseconds.
    pub duration_ms: Spread<u64>,
    /// Cost in USD; absent when too few of the sessions used were priced.
    #[schema(value_type = Option<Spread<String>>)]
    pub cost_usd: Option<Spread<Decimal>>,
}

/// Estimates `query` from `history`; `defaults` stand in when history is
/// too thin (`basis: none`, both quantiles the default).
pub fn estimate(query: Query<'_>, history: &[PastSession], defaults: Figures) -> Estimate {
    let same: Vec<&PastSession> = history
        .iter()
        .filter(|p| p.executor_kind == query.executor_kind && p.model.as_deref() == query.model)
        .collect();
    if same.len() < MIN_SESSIONS {
        return from_defaults(defaults);
    }
    let scored = similarities(query.text, &same);
    let mut close: Vec<(f64, &PastSession)> = scored
        .into_iter()
        .zip(same.iter().copied())
        .filter(|(s, _)| *s >= MIN_SIMILARITY)
        .collect();
    close.sort_by(|a, b| b.0.total_cmp(&a.0));
    close.truncate(MAX_NEIGHBOURS);
    if close.len() >= MIN_SESSIONS {
        from_neighbours(Basis::SimilarGoals, &close)
    } else {
        let all: Vec<(f64, &PastSession)> = same.iter().map(|p| (0.0, *p)).collect();
        from_neighbours(Basis::SameExecutor, &all)
    }
}

fn from_defaults(defaults: Figures) -> Estimate {
    fn same<T: Copy>(v: T) -> Spread<T> {
        Spread { p50: v, p90: v }
    }
    Estimate {
        basis: Basis::None,
        sessions_used: 0,
        closest_similarity: 0.0,
        farthest_similarity: 0.0,
        iterations: same(defaults.iterations),
        tokens: same(defaults.tokens),
        duration_ms: same(defaults.duration_ms),
        cost_usd: defaults.cost_usd.map(same),
    }
}

fn from_neighbours(basis: Basis, close: &[(f64, &PastSession)]) -> Estimate {
    let pick = |f: fn(&Figures) -> u64| spread(close.iter().map(|(_, p)| f(&p.figures)).collect());
    let costs: Vec<Decimal> = close
        .iter()
        .filter_map(|(_, p)| p.figures.cost_usd)
        .collect();
    Estimate {
        basis,
        sessions_used: close.len(),
        closest_similarity: close.iter().map(|c| c.0).fold(0.0, f64::max),
        farthest_similarity: close.iter().map(|c| c.0).fold(1.0, f64::min),
        iterations: pick(|f| f.iterations),
        tokens: pick(|f| f.tokens),
        duration_ms: pick(|f| f.duration_ms),
        cost_usd: (costs.len() >= MIN_SESSIONS).then(|| spread(costs)),
    }
}

/// The p50 and p90 order statistics of `values` (not empty).
fn spread<T: Ord + Copy + Default>(mut values: Vec<T>) -> Spread<T> {
    values.sort_unstable();
    let at = |q: f64| {
        let n = values.len();
        let rank = (q * (n as f64 + 1.0)).ceil() as usize;
        values
            .get(rank.clamp(1, n.max(1)) - 1)
            .copied()
            .unwrap_or_default()
    };
    Spread {
        p50: at(0.5),
        p90: at(0.9),
    }
}

/// The words of a goal that tell it apart.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() > 1 && !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// The TF-IDF cosine of `text` with each of `past`, in its order; the
/// document frequencies come from `past` and `text` together.
pub fn similarities(text: &str, past: &[&PastSession]) -> Vec<f64> {
    let query = words(text);
    let docs: Vec<Vec<String>> = past.iter().map(|p| words(&p.text)).collect();
    let mut df: BTreeMap<&str, usize> = BTreeMap::new();
    for doc in docs.iter().chain(std::iter::once(&query)) {
        for w in doc.iter().map(String::as_str).collect::<BTreeSet<_>>() {
            *df.entry(w).or_default() += 1;
        }
    }
    let n = docs.len() as f64 + 1.0;
    let idf = |w: &str| ((n + 1.0) / (*df.get(w).unwrap_or(&0) as f64 + 1.0)).ln() + 1.0;
    let q = weigh(&query, &idf);
    docs.iter().map(|d| cosine(&q, &weigh(d, &idf))).collect()
}

/// Term frequency times inverse document frequency, per word.
fn weigh<'w>(doc: &'w [String], idf: &dyn Fn(&str) -> f64) -> BTreeMap<&'w str, f64> {
    let mut tf: BTreeMap<&str, f64> = BTreeMap::new();
    for w in doc {
        *tf.entry(w.as_str()).or_default() += 1.0;
    }
    tf.into_iter().map(|(w, c)| (w, c * idf(w))).collect()
}

fn cosine(a: &BTreeMap<&str, f64>, b: &BTreeMap<&str, f64>) -> f64 {
    let dot: f64 = a.iter().filter_map(|(w, x)| b.get(w).map(|y| x * y)).sum();
    let norm = |v: &BTreeMap<&str, f64>| v.values().map(|x| x * x).sum::<f64>().sqrt();
    let denominator = norm(a) * norm(b);
    if denominator == 0.0 {
        0.0
    } else {
        (dot / denominator).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic generator, so the calibration is the same each run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        /// A log-normal draw by Box-Muller.
        fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
            let (u, v) = (self.unit().max(1e-12), self.unit());
            let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            median * (sigma * z).exp()
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    /// Kinds of work with their own typical size and spread; the words
    /// that name a kind, and the words that vary within it.
    const FAMILIES: &[(&str, f64, f64)] = &[
        (
            "write unit tests covering the parser module edge cases",
            4_000.0,
            0.5,
        ),
        (
            "summarize quarterly report findings into briefing notes",
            1_500.0,
            0.4,
        ),
        (
            "refactor legacy billing service into smaller components",
            20_000.0,
            0.7,
        ),
        (
            "research competitor pricing pages and compile comparison table",
            8_000.0,
            0.6,
        ),
        (
            "translate onboarding guide documentation into spanish",
            3_000.0,
            0.3,
        ),
    ];
    const VARIANTS: &[&str] = &[
        "quickly",
        "carefully",
        "v2",
        "draft",
        "final",
        "team",
        "new",
    ];

    fn session(rng: &mut Rng, family: usize, kind: &str) -> PastSession {
        let (goal, median, sigma) = FAMILIES[family];
        let tokens = rng.log_normal(median, sigma).max(1.0) as u64;
        let per_token = Decimal::new(3, 6); // $3 per million
        PastSession {
            executor_kind: kind.into(),
            model: Some("gpt-4o".into()),
            text: format!("{goal} {} {}", rng.pick(VARIANTS), rng.pick(VARIANTS)),
            figures: Figures {
                iterations: tokens / 700 + 1,
                tokens,
                duration_ms: tokens * 3,
                cost_usd: Some(per_token * Decimal::from(tokens)),
            },
        }
    }

    fn defaults() -> Figures {
        Figures {
            iterations: 50,
            tokens: 100_000,
            duration_ms: 3_600_000,
            cost_usd: None,
        }
    }

    #[test]
    fn the_estimate_is_calibrated_over_a_seeded_history() {
        for seed in [7_u64, 1_234_567, 0xdead_beef] {
            let mut rng = Rng(seed);
            let history: Vec<PastSession> = (0..250)
                .map(|i| session(&mut rng, i % FAMILIES.len(), "llm"))
                .collect();
            let (mut under_p50, mut under_p90, trials) = (0, 0, 300);
            for i in 0..trials {
                let new = session(&mut rng, i % FAMILIES.len(), "llm");
                let query = Query {
                    executor_kind: "llm",
                    model: Some("gpt-4o"),
                    text: &new.text,
                };
                let e = estimate(query, &history, defaults());
                assert_eq!(e.basis, Basis::SimilarGoals, "{}", new.text);
                let cost = e.cost_usd.expect("priced");
                let truth = new.figures.cost_usd.expect("priced");
                under_p50 += usize::from(truth <= cost.p50);
                under_p90 += usize::from(truth <= cost.p90);
            }
            let (r50, r90) = (
                under_p50 as f64 / trials as f64,
                under_p90 as f64 / trials as f64,
            );
            println!("seed {seed}: {r50:.3} under p50, {r90:.3} under p90");
            assert!(r90 >= 0.85, "seed {seed}: only {r90:.3} under p90");
            assert!(r50 >= 0.40, "seed {seed}: only {r50:.3} under p50");
        }
    }

    #[test]
    fn with_too_little_history_the_answer_says_none_and_gives_the_defaults() {
        let mut rng = Rng(42);
        let few: Vec<PastSession> = (0..MIN_SESSIONS - 1)
            .map(|_| session(&mut rng, 0, "llm"))
            .collect();
        let query = Query {
            executor_kind: "llm",
            model: Some("gpt-4o"),
            text: &few[0].text,
        };
        let e = estimate(query, &few, defaults());
        assert_eq!(e.basis, Basis::None);
        assert_eq!(e.sessions_used, 0);
        assert_eq!(
            e.tokens,
            Spread {
                p50: 100_000,
                p90: 100_000
            }
        );
        assert_eq!(e.cost_usd, None, "no default cost: none is made up");
    }

    #[test]
    fn another_executor_or_model_is_not_history_for_this_one() {
        let mut rng = Rng(9);
        let history: Vec<PastSession> = (0..40).map(|_| session(&mut rng, 0, "webhook")).collect();
        let text = history[0].text.clone();
        let query = Query {
            executor_kind: "llm",
            model: Some("gpt-4o"),
            text: &text,
        };
        assert_eq!(estimate(query, &history, defaults()).basis, Basis::None);
        let other_model = Query {
            executor_kind: "webhook",
            model: Some("claude"),
            ..query
        };
        assert_eq!(
            estimate(other_model, &history, defaults()).basis,
            Basis::None
        );
    }

    #[test]
    fn an_unlike_goal_falls_back_to_the_same_executor_and_says_so() {
        let mut rng = Rng(11);
        let history: Vec<PastSession> = (0..30).map(|i| session(&mut rng, i % 5, "llm")).collect();
        let query = Query {
            executor_kind: "llm",
            model: Some("gpt-4o"),
            text: "bake sourdough bread",
        };
        let e = estimate(query, &history, defaults());
        assert_eq!(e.basis, Basis::SameExecutor);
        assert_eq!(e.sessions_used, 30);
        assert!(e.tokens.p50 <= e.tokens.p90);
    }

    #[test]
    fn similar_goals_are_closer_than_unlike_ones() {
        let past: Vec<PastSession> = [
            "write unit tests for the parser",
            "write unit tests for the lexer",
            "translate the guide into spanish",
        ]
        .iter()
        .map(|t| PastSession {
            executor_kind: "llm".into(),
            model: None,
            text: (*t).into(),
            figures: defaults(),
        })
        .collect();
        let refs: Vec<&PastSession> = past.iter().collect();
        let s = similarities("Write unit tests for the PARSER module", &refs);
        assert!(s[0] > s[1] && s[1] > s[2], "{s:?}");
        assert_eq!(s[2], 0.0);
        assert_eq!(similarities("", &refs), vec![0.0; 3]);
    }

    #[test]
    fn the_quantiles_are_prediction_ranks() {
        let s = spread((1..=20).collect::<Vec<u64>>());
        // ⌈0.5·21⌉ = 11 and ⌈0.9·21⌉ = 19.
        assert_eq!(s, Spread { p50: 11, p90: 19 });
        assert_eq!(spread(vec![5_u64]), Spread { p50: 5, p90: 5 });
        assert_eq!(spread(vec![3_u64, 1]), Spread { p50: 3, p90: 3 });
    }

    #[test]
    fn words_drop_case_punctuation_and_stop_words() {
        assert_eq!(
            words("Write the README, and a CHANGELOG for v2!"),
            vec!["write", "readme", "changelog", "v2"]
        );
    }
}
