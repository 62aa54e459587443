//! Goal pre-flight: spot goals with no concrete deliverable ("learn how to
//! run a business") before they run away, and suggest a refinement that has
//! an artifact, a measure and a scope. Rules only; a model may suggest better.

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

/// What the pre-flight found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AmbiguityReport {
    /// Whether the goal lacks a concrete deliverable.
    pub ambiguous: bool,
    /// What matched, e.g. `vague_verb:learn`, `no_artifact`, `no_measure`.
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

/// Rules-based pre-flight of a goal.
pub fn assess(goal: &str) -> AmbiguityReport {
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
