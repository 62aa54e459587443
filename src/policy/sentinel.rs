//! Agent signals. Stop sentinels are how an executor without tool calling
//! says it is done or blocked: only the final non-blank line counts, alone
//! and whole, so a sentinel quoted in prose never stops a session. Agents
//! with tools send the same signals through loop-breaking tools.

use serde::{Deserialize, Serialize};

/// Which signal the agent gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    /// The goal is done.
    Done,
    /// The agent cannot go on without help.
    Blocked,
    /// The agent asks the user a question (a loop-breaking tool).
    AskUser,
    /// A call of the step waits for a person's approval.
    ApprovalRequired,
    /// The step delegated tasks and the session waits for them to end.
    WaitingForChildren,
}

/// A signal from the agent: a sentinel in its output or a loop-breaking tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    /// Done or blocked.
    pub kind: SignalKind,
    /// The reason (or question) given, if any.
    pub reason: Option<String>,
}

/// Finds a stop sentinel on the final non-blank line of `text`.
pub fn detect(text: &str) -> Option<Sentinel> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let inner = line.strip_prefix("<<")?.strip_suffix(">>")?;
    // Both the marker and the reason live inside the brackets; a reason may
    // not contain the closing brackets, or the line would be two tokens.
    if inner.contains(">>") || inner.contains("<<") {
        return None;
    }
    let (marker, reason) = match inner.split_once(':') {
        Some((marker, reason)) => (marker, Some(reason.trim())),
        None => (inner, None),
    };
    let kind = match marker.trim().to_ascii_uppercase().as_str() {
        "WARDEN_GOAL_DONE" => SignalKind::Done,
        "WARDEN_GOAL_BLOCKED" => SignalKind::Blocked,
        _ => return None,
    };
    let reason = reason.filter(|r| !r.is_empty()).map(str::to_string);
    Some(Sentinel { kind, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(reason: Option<&str>) -> Option<Sentinel> {
        Some(Sentinel {
            kind: SignalKind::Done,
            reason: reason.map(str::to_string),
        })
    }

    fn blocked(reason: Option<&str>) -> Option<Sentinel> {
        Some(Sentinel {
            kind: SignalKind::Blocked,
            reason: reason.map(str::to_string),
        })
    }

    #[test]
    fn done_with_reason() {
        assert_eq!(
            detect("wrote the file\n<<WARDEN_GOAL_DONE: README written>>"),
            done(Some("README written"))
        );
    }

    #[test]
    fn blocked_with_reason() {
        assert_eq!(
            detect("<<WARDEN_GOAL_BLOCKED: need credentials>>"),
            blocked(Some("need credentials"))
        );
    }

    #[test]
    fn reason_is_optional() {
        assert_eq!(detect("<<WARDEN_GOAL_DONE>>"), done(None));
        assert_eq!(detect("<<WARDEN_GOAL_DONE:>>"), done(None));
        assert_eq!(detect("<<WARDEN_GOAL_BLOCKED:   >>"), blocked(None));
    }

    #[test]
    fn case_insensitive_marker_keeps_reason_case() {
        assert_eq!(
            detect("<<warden_goal_done: All Good>>"),
            done(Some("All Good"))
        );
        assert_eq!(detect("<<Warden_Goal_Blocked>>"), blocked(None));
    }

    #[test]
    fn trailing_blank_lines_and_surrounding_spaces_are_ignored() {
        assert_eq!(
            detect("work\n   <<WARDEN_GOAL_DONE: ok>>  \n\n  \t\n"),
            done(Some("ok"))
        );
        assert_eq!(detect("a\r\n<<WARDEN_GOAL_DONE>>\r\n"), done(None));
    }

    #[test]
    fn sentinel_quoted_inside_a_line_is_not_a_stop() {
        assert_eq!(
            detect("I will print <<WARDEN_GOAL_DONE: x>> when finished"),
            None
        );
        assert_eq!(detect("say `<<WARDEN_GOAL_DONE>>`"), None);
        assert_eq!(detect("\"<<WARDEN_GOAL_DONE>>\""), None);
    }

    #[test]
    fn sentinel_not_on_the_final_line_is_not_a_stop() {
        assert_eq!(detect("<<WARDEN_GOAL_DONE: early>>\nmore work to do"), None);
    }

    #[test]
    fn malformed_markers_are_not_stops() {
        for text in [
            "",
            "   \n\n",
            "<<WARDEN_GOAL_DONE",
            "WARDEN_GOAL_DONE>>",
            "<WARDEN_GOAL_DONE>",
            "<<WARDEN_GOAL_FINISHED: x>>",
            "<<WARDEN_GOAL_DONEX>>",
            "<<WARDEN_GOAL_DONE: a>> <<WARDEN_GOAL_DONE: b>>",
            "<< >>",
        ] {
            assert_eq!(detect(text), None, "{text:?}");
        }
    }

    #[test]
    fn spaces_inside_brackets_are_tolerated() {
        assert_eq!(detect("<< WARDEN_GOAL_DONE : ok >>"), done(Some("ok")));
    }

    #[test]
    fn colons_in_reason_are_kept() {
        assert_eq!(
            detect("<<WARDEN_GOAL_BLOCKED: http: 403 forbidden>>"),
            blocked(Some("http: 403 forbidden"))
        );
    }
}
