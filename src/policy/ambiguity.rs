//! Goal pre-flight: spot goals with no concrete deliverable ("learn how to
//! run a business") before they run away, and suggest a refinement that has
//! an artifact, a measure and a scope. Rules only; a model may suggest better.
//! It also spots goals that are not language at all (keyboard mashes,
//! punctuation, one bare word): those cannot be refined, only replaced.

use serde::{Deserialize, Serialize};

/// Verbs that describe open-ended activity rather than a result.
const VAGUE_VERBS: [&str; 17] = [
    "learn",
    "understand",
    "explore",
    "research",
    "investigate",
    "study",
    "optimize",
    "optimise",
    "improve",
    "enhance",
    "figure out",
    "look into",
    "think about",
    "master",
    "get better",
    "know more",
    "discover",
];

/// Words that name something to deliver.
const ARTIFACTS: [&str; 26] = [
    "file",
    "report",
    "document",
    "readme",
    "script",
    "function",
    "test",
    "tests",
    "page",
    "endpoint",
    "api",
    "list",
    "table",
    "summary",
    "plan",
    "diagram",
    "pull request",
    "pr",
    "commit",
    "module",
    "class",
    "chart",
    "spreadsheet",
    "csv",
    "json",
    "markdown",
];

/// Words that bound the work with a measure.
const MEASURES: [&str; 12] = [
    "%",
    "percent",
    "at least",
    "at most",
    "under",
    "below",
    "above",
    "within",
    "less than",
    "more than",
    "by ",
    "ms",
];

/// Runs of five keys along a keyboard row: no word in any language has them.
const KEYBOARD_RUNS: [&str; 17] = [
    "qwert", "werty", "ertyu", "rtyui", "tyuio", "yuiop", "asdfg", "sdfgh", "dfghj", "fghjk",
    "ghjkl", "zxcvb", "xcvbn", "cvbnm", "asdf", "qwer", "zxcv",
];

/// The suggestion for a goal that names nothing: ask for the deliverable itself.
pub const DELIVERABLE_PROMPT: &str = "Say what to deliver: name the file or artifact, what it must contain and how to tell it is done, e.g. \"Write NOTES.md listing the 5 open bugs in the parser with a fix for each\"";

/// What the pre-flight found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AmbiguityReport {
    /// Whether the goal lacks a concrete deliverable.
    pub ambiguous: bool,
    /// The goal is not a readable request at all (`no_words`, `too_short`):
    /// it waits for a new goal, whatever the refinement settings say.
    #[serde(default)]
    pub unreadable: bool,
    /// What matched, e.g. `vague_verb:learn`, `no_artifact`, `no_measure`,
    /// `no_words`, `keyboard_mash`, `too_short`.
    pub matched_patterns: Vec<String>,
    /// How sure the rules are that the goal is ambiguous, 0–1.
    pub confidence: f64,
    /// A concrete goal to propose instead (rules-based).
    pub suggested_goal: String,
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '.' && c != '_' && c != '-' && c != '/')
        .filter(|w| !w.is_empty())
        .map(|w| w.trim_matches('.').to_string())
        .collect()
}

fn has_file_name(goal: &str) -> bool {
    words(goal).iter().any(|w| {
        w.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty()
                && (1..=5).contains(&ext.len())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
        }) || w.contains('/')
    })
}

fn contains_phrase(lower: &str, phrase: &str) -> bool {
    if phrase.contains(' ') || !phrase.chars().all(char::is_alphanumeric) {
        return lower.contains(phrase);
    }
    words(lower).iter().any(|w| {
        w == phrase || w.strip_suffix('s') == Some(phrase) || w.strip_suffix("ing") == Some(phrase)
    })
}

/// The same rule as [`refusal`] in the API document's terms: a goal must
/// contain a letter (any script). `[^\W\d_]` is a word character that is
/// neither a digit nor `_`: a letter, in Unicode-aware regex engines.
pub const GOAL_HAS_LETTER_PATTERN: &str = r"[^\W\d_]";

/// Why a goal is refused outright, if it is: one with no letters at all
/// (punctuation, numbers) says nothing a refinement could start from.
pub fn refusal(goal: &str) -> Option<String> {
    (!goal.chars().any(char::is_alphabetic))
        .then(|| format!("goal has no words: {DELIVERABLE_PROMPT}"))
}

fn is_vowel(c: char) -> bool {
    "aeiouy".contains(c)
}

/// Longest run of consonants and longest run of one repeated letter.
fn runs(lower: &str) -> (usize, usize) {
    let (mut consonants, mut longest_consonants) = (0, 0);
    let (mut same, mut longest_same) = (0, 0);
    let mut prev = None;
    for c in lower.chars() {
        consonants = if is_vowel(c) { 0 } else { consonants + 1 };
        longest_consonants = longest_consonants.max(consonants);
        same = if prev == Some(c) { same + 1 } else { 1 };
        longest_same = longest_same.max(same);
        prev = Some(c);
    }
    (longest_consonants, longest_same)
}

/// Whether ASCII letters look typed by sliding along the keyboard.
fn mashed(lower: &str) -> bool {
    KEYBOARD_RUNS.iter().any(|run| lower.contains(run)) || runs(lower).0 > 4
}

/// Whether a token reads as a word: a file name or path, an acronym, a word
/// in a script the rules cannot judge (accented Latin, CJK, Cyrillic…), or
/// an ASCII word with vowels, no long consonant run and no keyboard run.
fn readable(token: &str) -> bool {
    let letters: String = token.chars().filter(|c| c.is_alphabetic()).collect();
    if letters.is_empty() {
        return false;
    }
    if has_file_name(token) || !letters.is_ascii() {
        return true;
    }
    if letters.chars().all(|c| c.is_ascii_uppercase()) && (2..=6).contains(&letters.len()) {
        return true;
    }
    let lower = letters.to_ascii_lowercase();
    let vowels = lower.chars().filter(|&c| is_vowel(c)).count();
    let (_, same) = runs(&lower);
    vowels > 0 && !mashed(&lower) && same <= 2 && lower.len() <= 25 && vowels * 7 >= lower.len()
}

/// Tokens with at least one letter.
fn letter_tokens(goal: &str) -> Vec<String> {
    words(goal)
        .into_iter()
        .filter(|w| w.chars().any(char::is_alphabetic))
        .collect()
}

/// Patterns saying the goal is not a readable request: `no_words` (not one
/// token reads as a word), `keyboard_mash`, `too_short` (one word and no file).
pub fn unreadable_patterns(goal: &str) -> Vec<String> {
    let tokens = letter_tokens(goal);
    let mut found = Vec::new();
    if !tokens.iter().any(|t| readable(t)) {
        found.push("no_words".to_string());
        let mash = tokens.iter().any(|t| {
            let letters: String = t.chars().filter(char::is_ascii_alphabetic).collect();
            mashed(&letters.to_ascii_lowercase())
        });
        if mash {
            found.push("keyboard_mash".to_string());
        }
    }
    // Scripts without spaces (CJK) put a whole request in one token.
    let long_unspaced = tokens.iter().any(|t| {
        t.chars()
            .filter(|c| c.is_alphabetic() && !c.is_ascii())
            .count()
            >= 4
    });
    if tokens.len() < 2 && !has_file_name(goal) && !long_unspaced {
        found.push("too_short".to_string());
    }
    found
}

/// Rules-based pre-flight of a goal.
pub fn assess(goal: &str) -> AmbiguityReport {
    let unreadable = unreadable_patterns(goal);
    if !unreadable.is_empty() {
        let confidence = if unreadable.iter().any(|p| p == "no_words") {
            0.95
        } else {
            0.8
        };
        return AmbiguityReport {
            ambiguous: true,
            unreadable: true,
            matched_patterns: unreadable,
            confidence,
            suggested_goal: DELIVERABLE_PROMPT.to_string(),
        };
    }
    let lower = goal.to_lowercase();
    let mut matched: Vec<String> = VAGUE_VERBS
        .iter()
        .filter(|v| contains_phrase(&lower, v))
        .map(|v| format!("vague_verb:{v}"))
        .collect();
    let vague = matched.len();
    let artifact = has_file_name(goal) || ARTIFACTS.iter().any(|a| contains_phrase(&lower, a));
    let measure =
        lower.chars().any(|c| c.is_ascii_digit()) || MEASURES.iter().any(|m| lower.contains(m));
    if !artifact {
        matched.push("no_artifact".into());
    }
    if !measure {
        matched.push("no_measure".into());
    }
    let ambiguous = vague > 0 && !artifact;
    let confidence = if ambiguous {
        let base: f64 = 0.6 + 0.1 * (vague.min(3) as f64) + if measure { 0.0 } else { 0.1 };
        base.min(0.95)
    } else if vague > 0 {
        0.3
    } else {
        0.0
    };
    AmbiguityReport {
        ambiguous,
        unreadable: false,
        matched_patterns: if vague > 0 || !artifact {
            matched
        } else {
            Vec::new()
        },
        confidence: (confidence * 100.0).round() / 100.0,
        suggested_goal: suggest(goal),
    }
}

/// A concrete version of a vague goal: one deliverable file, a measure, a scope.
pub fn suggest(goal: &str) -> String {
    let topic = goal.trim().trim_end_matches(['.', '!', '?']);
    let lower = topic.to_lowercase();
    let mut topic_start = 0;
    for verb in VAGUE_VERBS {
        if let Some(pos) = lower.find(verb)
            && pos == 0
        {
            topic_start = verb.len();
        }
    }
    let topic = topic[topic_start..].trim();
    let topic = topic
        .strip_prefix("about ")
        .or_else(|| topic.strip_prefix("more about "))
        .unwrap_or(topic)
        .trim();
    let topic = if topic.is_empty() { goal.trim() } else { topic };
    format!(
        "Write REPORT.md explaining {topic}: at least 5 key points with the reasoning or source for each, and 3 concrete next actions"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_ended_goals_are_ambiguous() {
        for goal in [
            "Learn how to run a business",
            "Understand quantum computing",
            "Explore the codebase",
            "Research competitors",
            "Optimize performance",
            "Improve the code",
        ] {
            let r = assess(goal);
            assert!(r.ambiguous, "{goal}: {r:?}");
            assert!(r.confidence >= 0.6, "{goal}");
            assert!(
                r.matched_patterns
                    .iter()
                    .any(|p| p.starts_with("vague_verb:")),
                "{goal}"
            );
            assert!(
                r.matched_patterns.contains(&"no_artifact".to_string()),
                "{goal}"
            );
        }
    }

    #[test]
    fn concrete_goals_are_not() {
        for goal in [
            "Create README.md with a project description",
            "Write a report on competitors",
            "Add tests for the parser",
            "Optimize the /search endpoint to answer within 50 ms",
            "Fix the bug in src/main.rs",
            "Research competitors and write a summary table",
        ] {
            let r = assess(goal);
            assert!(!r.ambiguous, "{goal}: {r:?}");
        }
        assert_eq!(assess("Create README.md").confidence, 0.0);
    }

    #[test]
    fn a_measure_without_an_artifact_is_still_vague_but_less_sure() {
        let with = assess("Improve performance by 20%");
        let without = assess("Improve performance");
        assert!(with.ambiguous && without.ambiguous);
        assert!(with.confidence < without.confidence);
        assert!(!with.matched_patterns.contains(&"no_measure".to_string()));
    }

    /// Real goals in several languages, terse or long: none is unreadable.
    const REAL_GOALS: [&str; 20] = [
        "Écris README.md",
        "README.md を作成して",
        "fix flaky test in ci.yml",
        "Create README.md with a project description",
        "Schreibe eine Zusammenfassung der Tests in NOTES.md",
        "Напиши отчёт о тестах",
        "修复登录页面的测试",
        "Escribe un informe de rendimiento",
        "Przygotuj raport z testów",
        "Bump tokio to 1.40 and fix the build",
        "Add a CSV export endpoint",
        "Write strengths and weaknesses in SWOT.md",
        "npm audit fix",
        "Refactor src/lib.rs",
        "deploy api",
        "Learn how to run a business",
        "Make the tests pass",
        "Rédige un résumé de l'article",
        "Traduci il manuale in inglese",
        "Add HTTP2 support to the proxy",
    ];

    /// Gibberish goals with letters, and the patterns each must show.
    const GIBBERISH: [(&str, &[&str]); 10] = [
        (
            "lsdjflasjdf;ljasdlfja;sldjfalsdjf",
            &["no_words", "keyboard_mash"],
        ),
        ("asdf asdf asdf", &["no_words", "keyboard_mash"]),
        ("qwertyuiop", &["no_words", "keyboard_mash", "too_short"]),
        ("jfkdlsa fjdkslaf", &["no_words", "keyboard_mash"]),
        ("xkcd zzz bbb", &["no_words"]),
        ("aaaaaaaaaa bbbb", &["no_words"]),
        ("hello", &["too_short"]),
        ("x", &["no_words", "too_short"]),
        ("README", &["too_short"]),
        ("?? ok !!", &["too_short"]),
    ];

    #[test]
    fn real_goals_in_any_language_are_readable() {
        for goal in REAL_GOALS {
            assert_eq!(unreadable_patterns(goal), Vec::<String>::new(), "{goal}");
            assert_eq!(refusal(goal), None, "{goal}");
            assert!(!assess(goal).unreadable, "{goal}");
        }
    }

    #[test]
    fn terse_concrete_goals_run() {
        for goal in [
            "Écris README.md",
            "README.md を作成して",
            "fix flaky test in ci.yml",
        ] {
            let r = assess(goal);
            assert!(!r.ambiguous, "{goal}: {r:?}");
        }
    }

    #[test]
    fn gibberish_goals_are_held_with_the_reason() {
        for (goal, patterns) in GIBBERISH {
            let r = assess(goal);
            assert!(r.ambiguous && r.unreadable, "{goal}: {r:?}");
            assert_eq!(r.matched_patterns, patterns.to_vec(), "{goal}");
            assert_eq!(r.suggested_goal, DELIVERABLE_PROMPT, "{goal}");
            assert!(r.confidence >= 0.8, "{goal}");
            assert_eq!(refusal(goal), None, "{goal} has letters");
        }
        assert_eq!(assess("asdf asdf").confidence, 0.95);
        assert_eq!(assess("hello").confidence, 0.8);
        assert!(DELIVERABLE_PROMPT.contains("what to deliver"));
    }

    #[test]
    fn goals_without_letters_are_refused() {
        for goal in ["???!!!...", "12345", "42 1337 !!!", "..  --", "😀😀😀"] {
            let why = refusal(goal).unwrap_or_else(|| panic!("{goal} must be refused"));
            assert!(why.starts_with("goal has no words"), "{why}");
            assert!(why.contains("what to deliver"), "{why}");
        }
    }

    #[test]
    fn word_rules_at_their_edges() {
        // Acronyms of two to six capitals read as words, longer ones do not.
        assert!(readable("SQL") && readable("HTTPS"));
        assert!(!readable("QWXZPLKT"));
        // Four consonants in a row is a word ("twelfth"), five is not.
        assert!(readable("twelfth"));
        assert!(!readable("sdlfjk"));
        // A doubled letter is a word ("committee"), a tripled one is not.
        assert!(readable("committee"));
        assert!(!readable("cooool"));
        // Vowels must be at least a seventh of the letters.
        assert!(readable("rhythm"));
        assert!(!readable("bcdfabcd"));
        // File names and paths always read, however they are spelled.
        assert!(readable("xqzw.rs") && readable("zz/kk"));
        assert!(!readable("1234"));
    }

    #[test]
    fn suggestions_name_a_deliverable_and_keep_the_topic() {
        let s = suggest("Learn how to run a business");
        assert!(
            s.starts_with("Write REPORT.md explaining how to run a business"),
            "{s}"
        );
        assert!(
            !assess(&s).ambiguous,
            "the suggestion itself is concrete: {s}"
        );
        let s = suggest("Explore more about Rust lifetimes.");
        assert!(s.contains("Rust lifetimes"), "{s}");
        assert!(suggest("learn").contains("learn"));
    }
}
