//! Success criteria and milestones: checklists that reflection ticks off.
//! A criterion counts as met only when a reflection reports it by its exact
//! text or its number, so "done" is never inferred from prose.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most items one checklist may hold.
pub const MAX_ITEMS: usize = 20;
/// Longest item text, in characters (as JSON Schema's `maxLength` counts).
pub const MAX_ITEM_CHARS: usize = 500;

/// One criterion or milestone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChecklistItem {
    /// What must be true.
    pub text: String,
    /// Whether a reflection reported it done.
    pub done: bool,
    /// The iteration after which it was reported done.
    pub done_at_iteration: Option<u64>,
}

/// Validates and trims a request's `success_criteria` and `milestones`
/// together (criteria first, so the first bad one is the error).
pub fn criteria_and_milestones(
    criteria: &[String],
    milestones: &[String],
) -> Result<(Vec<ChecklistItem>, Vec<ChecklistItem>), String> {
    Ok((
        from_texts("success_criteria", criteria)?,
        from_texts("milestones", milestones)?,
    ))
}

/// Validates and trims the texts of a checklist given in a request.
pub fn from_texts(field: &str, texts: &[String]) -> Result<Vec<ChecklistItem>, String> {
    if texts.len() > MAX_ITEMS {
        return Err(format!(
            "{field} may hold at most {MAX_ITEMS} items, got {}",
            texts.len()
        ));
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let text = super::text::trim(t);
            if text.is_empty() || text.chars().count() > MAX_ITEM_CHARS {
                Err(format!(
                    "{field}[{i}] must be 1 to {MAX_ITEM_CHARS} characters"
                ))
            } else {
                Ok(ChecklistItem {
                    text: text.to_string(),
                    done: false,
                    done_at_iteration: None,
                })
            }
        })
        .collect()
}

fn matches(item: &ChecklistItem, number: usize, reported: &str) -> bool {
    let r = reported.trim();
    r.eq_ignore_ascii_case(item.text.trim())
        || r.trim_start_matches('#').parse::<usize>().ok() == Some(number)
}

/// Ticks the items a reflection reported done after `iteration`; items
/// already done stay done.
pub fn mark(items: &[ChecklistItem], reported: &[String], iteration: u64) -> Vec<ChecklistItem> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            if !item.done && reported.iter().any(|r| matches(item, i + 1, r)) {
                ChecklistItem {
                    done: true,
                    done_at_iteration: Some(iteration),
                    ..item.clone()
                }
            } else {
                item.clone()
            }
        })
        .collect()
}

/// Texts of the items not yet done.
pub fn unmet(items: &[ChecklistItem]) -> Vec<String> {
    items
        .iter()
        .filter(|i| !i.done)
        .map(|i| i.text.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Vec<ChecklistItem> {
        from_texts("c", &["README.md exists".into(), " tests pass ".into()]).unwrap()
    }

    #[test]
    fn criteria_are_checked_before_milestones() {
        let (c, m) = criteria_and_milestones(&["a".into()], &[" b ".into()]).unwrap();
        assert_eq!((c[0].text.as_str(), m[0].text.as_str()), ("a", "b"));
        let both_bad = criteria_and_milestones(&["".into()], &["".into()]).unwrap_err();
        assert!(both_bad.starts_with("success_criteria[0]"), "{both_bad}");
        let milestone_bad = criteria_and_milestones(&[], &["".into()]).unwrap_err();
        assert!(
            milestone_bad.starts_with("milestones[0]"),
            "{milestone_bad}"
        );
    }

    #[test]
    fn texts_are_validated_and_trimmed() {
        let l = list();
        assert_eq!(l[1].text, "tests pass");
        assert!(!l[0].done);
        assert!(
            from_texts("criteria", &["".into()])
                .unwrap_err()
                .contains("criteria[0]")
        );
        let many: Vec<String> = (0..21).map(|i| i.to_string()).collect();
        assert!(from_texts("milestones", &many).is_err());
        assert!(from_texts("c", &["x".repeat(501)]).is_err());
    }

    #[test]
    fn marking_by_text_or_number() {
        let l = mark(&list(), &["readme.md EXISTS".into()], 4);
        assert!(l[0].done);
        assert_eq!(l[0].done_at_iteration, Some(4));
        assert!(!l[1].done);
        let l = mark(&l, &["2".into()], 9);
        assert!(l[1].done);
        assert_eq!(
            l[0].done_at_iteration,
            Some(4),
            "done items keep their iteration"
        );
        assert!(unmet(&l).is_empty());
    }

    #[test]
    fn unknown_reports_mark_nothing() {
        let l = mark(&list(), &["something else".into(), "7".into()], 1);
        assert_eq!(unmet(&l), vec!["README.md exists", "tests pass"]);
    }
}
