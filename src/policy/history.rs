//! What the policies remember of each committed step, and the measured
//! (never self-reported) notion of rework.

use serde::{Deserialize, Serialize};

/// How one step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The step did what it set out to do.
    Success,
    /// The step ran but did not achieve its aim (a test failed, a file was missing).
    Failure,
    /// The step could not run (executor or tool error).
    Error,
}

impl Outcome {
    /// Whether this outcome counts towards the consecutive-error guardrail.
    pub fn is_error(self) -> bool {
        matches!(self, Outcome::Error)
    }
}

/// A file the step wrote, identified by the digest of its new content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWrite {
    /// Path relative to the session workspace.
    pub path: String,
    /// Digest of the content written (any stable hash, hex).
    pub digest: String,
}

/// One committed step as the policies see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Iteration number, 1-based.
    pub number: u64,
    /// Name of the action (tool name, scripted action).
    pub action: String,
    /// Arguments of the action; compared structurally.
    #[serde(default)]
    pub arguments: serde_json::Value,
    /// How the step ended.
    pub outcome: Outcome,
    /// What the world answered (tool result, executor output).
    #[serde(default)]
    pub observation: String,
    /// The agent's own message in this step, if any.
    #[serde(default)]
    pub message: String,
    /// Error text when the outcome is `failure` or `error`.
    #[serde(default)]
    pub error: Option<String>,
    /// Tokens the step consumed.
    #[serde(default)]
    pub tokens: u64,
    /// Tool calls the step made.
    #[serde(default)]
    pub tool_calls: u64,
    /// Files the step wrote.
    #[serde(default)]
    pub files_written: Vec<FileWrite>,
    /// The step declared it is waiting (polling a long job).
    #[serde(default)]
    pub waiting: bool,
    /// Wall time of the step in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// The step was a wrap-up forced by context overflow.
    #[serde(default)]
    pub context_overflow: bool,
}

/// Why a step counts as rework.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Rework {
    /// Same action and arguments as a recent step.
    RepeatedAction {
        /// Number of the earlier step repeated.
        of_step: u64,
    },
    /// The same error text as a recent step.
    RepeatedError {
        /// Number of the earlier step with that error.
        of_step: u64,
    },
    /// A file was written back to content it had earlier, after other content.
    FileReverted {
        /// The file reverted.
        path: String,
    },
}

/// How many earlier steps a new step is compared with for rework.
pub const REWORK_LOOKBACK: usize = 5;

/// Decides whether `step` is rework given the steps before it (oldest first).
///
/// Waiting steps are never rework: polling is expected to repeat itself.
pub fn rework(previous: &[StepRecord], step: &StepRecord) -> Option<Rework> {
    if step.waiting {
        return None;
    }
    let recent = &previous[previous.len().saturating_sub(REWORK_LOOKBACK)..];
    if let Some(earlier) = recent
        .iter()
        .rev()
        .find(|p| !p.waiting && p.action == step.action && p.arguments == step.arguments)
    {
        return Some(Rework::RepeatedAction {
            of_step: earlier.number,
        });
    }
    if let Some(err) = step.error.as_deref().filter(|e| !e.is_empty())
        && let Some(earlier) = recent
            .iter()
            .rev()
            .find(|p| p.error.as_deref() == Some(err))
    {
        return Some(Rework::RepeatedError {
            of_step: earlier.number,
        });
    }
    for write in &step.files_written {
        // Walk this file's history backwards: the latest content must differ
        // (otherwise it is a no-op rewrite, caught above as a repeat) and an
        // older one must equal the new content.
        let mut versions = previous
            .iter()
            .rev()
            .flat_map(|p| p.files_written.iter().rev())
            .filter(|w| w.path == write.path)
            .map(|w| w.digest.as_str());
        if let Some(latest) = versions.next()
            && latest != write.digest
            && versions.any(|d| d == write.digest)
        {
            return Some(Rework::FileReverted {
                path: write.path.clone(),
            });
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A successful step with the given number and action and no arguments.
    pub(crate) fn step(number: u64, action: &str) -> StepRecord {
        StepRecord {
            number,
            action: action.to_string(),
            arguments: serde_json::Value::Null,
            outcome: Outcome::Success,
            observation: format!("observation {number}"),
            message: format!("message {number}"),
            error: None,
            tokens: 100,
            tool_calls: 1,
            files_written: vec![],
            waiting: false,
            duration_ms: 10,
            context_overflow: false,
        }
    }

    fn write(number: u64, path: &str, digest: &str) -> StepRecord {
        let mut s = step(number, "write_file");
        s.arguments = json!({ "path": path, "v": number });
        s.files_written = vec![FileWrite {
            path: path.into(),
            digest: digest.into(),
        }];
        s
    }

    #[test]
    fn distinct_steps_are_not_rework() {
        let prev = vec![step(1, "a"), step(2, "b")];
        assert_eq!(rework(&prev, &step(3, "c")), None);
    }

    #[test]
    fn same_action_and_arguments_is_rework() {
        let prev = vec![step(1, "a"), step(2, "b")];
        assert_eq!(
            rework(&prev, &step(3, "a")),
            Some(Rework::RepeatedAction { of_step: 1 })
        );
    }

    #[test]
    fn same_action_other_arguments_is_not_rework() {
        let mut first = step(1, "read");
        first.arguments = json!({"path": "a"});
        let mut second = step(2, "read");
        second.arguments = json!({"path": "b"});
        assert_eq!(rework(&[first], &second), None);
    }

    #[test]
    fn repeat_older_than_lookback_is_not_rework() {
        let mut prev = vec![step(1, "a")];
        for n in 2..=(REWORK_LOOKBACK as u64 + 1) {
            prev.push(step(n, &format!("x{n}")));
        }
        assert_eq!(rework(&prev, &step(10, "a")), None);
    }

    #[test]
    fn same_error_is_rework_even_with_other_action() {
        let mut first = step(1, "compile");
        first.outcome = Outcome::Failure;
        first.error = Some("E0308 mismatched types".into());
        let mut second = step(2, "test");
        second.outcome = Outcome::Failure;
        second.error = Some("E0308 mismatched types".into());
        assert_eq!(
            rework(&[first], &second),
            Some(Rework::RepeatedError { of_step: 1 })
        );
    }

    #[test]
    fn different_errors_are_not_rework() {
        let mut first = step(1, "compile");
        first.error = Some("one".into());
        let mut second = step(2, "test");
        second.error = Some("two".into());
        assert_eq!(rework(&[first], &second), None);
    }

    #[test]
    fn file_written_back_to_earlier_content_is_rework() {
        let prev = vec![write(1, "a.txt", "h1"), write(2, "a.txt", "h2")];
        assert_eq!(
            rework(&prev, &write(3, "a.txt", "h1")),
            Some(Rework::FileReverted {
                path: "a.txt".into()
            })
        );
    }

    #[test]
    fn file_written_forward_is_not_rework() {
        let prev = vec![write(1, "a.txt", "h1"), write(2, "a.txt", "h2")];
        assert_eq!(rework(&prev, &write(3, "a.txt", "h3")), None);
        // Same content as the latest version is not a revert either.
        assert_eq!(rework(&prev, &write(4, "a.txt", "h2")), None);
        // Another file with an old digest is not a revert of this one.
        assert_eq!(rework(&prev, &write(5, "b.txt", "h1")), None);
    }

    #[test]
    fn waiting_steps_are_never_rework() {
        let mut poll1 = step(1, "poll_job");
        poll1.waiting = true;
        let mut poll2 = step(2, "poll_job");
        poll2.waiting = true;
        assert_eq!(rework(&[poll1], &poll2), None);
    }
}
