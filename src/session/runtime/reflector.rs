//! The reflector: asks the reflection model for a strict JSON self-assessment
//! of the session, built from evidence (actions, results, errors, files),
//! not only the agent's prose.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::llm::{ChatRequest, LlmClient, Message};
use crate::policy::checklist::ChecklistItem;
use crate::policy::history::{Outcome, StepRecord};
use crate::policy::reflection::{self, Assessment, Trigger};

/// The instructions the reflection model answers.
pub const REFLECTION_PROMPT: &str = "You review the work of an autonomous agent for its \
supervisor. Judge only from the evidence given: the actions, their results, errors and files. \
Answer with one JSON object and nothing else, with exactly these fields:
{\"goalAchieved\": \"YES\"|\"NO\"|\"PARTIAL\", \"progress\": \"GOOD\"|\"SLOW\"|\"STUCK\", \
\"percentComplete\": 0-100, \"loopDetected\": true|false, \
\"recommendation\": \"CONTINUE\"|\"STOP\"|\"ASK_USER\", \"reasoning\": \"...\", \
\"nextSteps\": [\"...\"], \"coherence\": 0-1, \"uncertainty\": 0-1, \
\"criteriaMet\": [\"...\"], \"milestonesDone\": [\"...\"]}
goalAchieved is YES only when the evidence shows the goal is fully met. coherence says how \
well the recent work serves the goal; uncertainty how unsure the agent seems. criteriaMet and \
milestonesDone list, by their exact text or number, the success criteria and milestones the \
evidence shows are met (empty lists when there are none).";

/// What one reflection produced.
#[derive(Debug, Clone)]
pub struct ReflectionAnswer {
    /// The validated assessment, or why there is none.
    pub assessment: Result<Assessment, String>,
    /// Tokens charged.
    pub tokens: u64,
    /// The raw answer text, when there was one.
    pub raw: Option<String>,
}

/// A reflection model.
#[derive(Debug, Clone)]
pub struct Reflector {
    client: LlmClient,
    model: String,
    temperature: f64,
    top_p: f64,
}

/// The state summary the reflector sees.
#[derive(Debug, Clone, Copy)]
pub struct SessionFacts<'a> {
    /// Goal.
    pub goal: &'a str,
    /// Iterations so far.
    pub iterations: u64,
    /// Running time, ms.
    pub elapsed_ms: u64,
    /// Tokens so far.
    pub tokens: u64,
    /// Recent steps, oldest first.
    pub recent: &'a [StepRecord],
    /// Why the reflection runs.
    pub trigger: Trigger,
    /// The agent's done-claim, if that is the trigger.
    pub claim: Option<&'a str>,
    /// Success criteria.
    pub criteria: &'a [ChecklistItem],
    /// Milestones.
    pub milestones: &'a [ChecklistItem],
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let cut = (0..=max)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}…", &text[..cut])
}

/// The evidence section of the prompt.
pub fn evidence(facts: &SessionFacts<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Goal: {}", facts.goal);
    for (title, items) in [
        ("Success criteria", facts.criteria),
        ("Milestones", facts.milestones),
    ] {
        if !items.is_empty() {
            let _ = writeln!(out, "{title}:");
            for (i, item) in items.iter().enumerate() {
                let mark = if item.done { "x" } else { " " };
                let _ = writeln!(out, "{}. [{mark}] {}", i + 1, item.text);
            }
        }
    }
    let _ = writeln!(
        out,
        "State: {} iterations, {:.0} s running, {} tokens.",
        facts.iterations,
        facts.elapsed_ms as f64 / 1000.0,
        facts.tokens
    );
    let tools: BTreeSet<&str> = facts.recent.iter().map(|s| s.action.as_str()).collect();
    let successes = facts
        .recent
        .iter()
        .filter(|s| s.outcome == Outcome::Success)
        .count();
    let _ = writeln!(
        out,
        "Recent window: {} steps, {} succeeded, {} failed; tools used: {}.",
        facts.recent.len(),
        successes,
        facts.recent.len() - successes,
        tools.into_iter().collect::<Vec<_>>().join(", ")
    );
    let files: BTreeSet<&str> = facts
        .recent
        .iter()
        .flat_map(|s| s.files_written.iter().map(|f| f.path.as_str()))
        .collect();
    if !files.is_empty() {
        let _ = writeln!(
            out,
            "Files written: {}.",
            files.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    let _ = writeln!(out, "Steps (action → outcome):");
    for s in facts.recent {
        let _ = writeln!(
            out,
            "#{} {}({}) → {:?}: {}{}",
            s.number,
            s.action,
            clip(&s.arguments.to_string(), 200),
            s.outcome,
            clip(&s.observation, 300),
            s.error
                .as_deref()
                .map(|e| format!(" [error: {}]", clip(e, 200)))
                .unwrap_or_default()
        );
    }
    if let Some(claim) = facts.claim {
        let _ = writeln!(
            out,
            "The agent claims the goal is achieved: {claim}. Verify this claim against the evidence."
        );
    }
    out
}

impl Reflector {
    /// A reflector using `model` on `client`.
    pub fn new(client: LlmClient, model: String, temperature: f64, top_p: f64) -> Reflector {
        Reflector {
            client,
            model,
            temperature,
            top_p,
        }
    }

    /// Asks for an assessment; a failed call or invalid answer is reported, never raised.
    pub async fn reflect(&self, facts: &SessionFacts<'_>, max_tokens: u64) -> ReflectionAnswer {
        let request = ChatRequest {
            model: self.model.clone(),
            messages: vec![
                Message::text("system", REFLECTION_PROMPT),
                Message::text("user", evidence(facts)),
            ],
            tools: Vec::new(),
            max_tokens: max_tokens.max(1),
            max_completion_tokens: None,
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
        };
        match self.client.chat(&request).await {
            Ok(completion) => {
                let raw = completion.message.content.unwrap_or_default();
                ReflectionAnswer {
                    assessment: reflection::parse_assessment(&raw),
                    tokens: completion.usage.total,
                    raw: Some(raw),
                }
            }
            Err(err) => ReflectionAnswer {
                assessment: Err(format!("reflection call failed: {err}")),
                tokens: 0,
                raw: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::history::tests::step;

    #[test]
    fn evidence_shows_actions_errors_and_files() {
        let mut a = step(1, "write_file");
        a.files_written = vec![crate::policy::history::FileWrite {
            path: "README.md".into(),
            digest: "d".into(),
        }];
        let mut b = step(2, "run_tests");
        b.outcome = Outcome::Failure;
        b.error = Some("1 failed".into());
        let text = evidence(&SessionFacts {
            goal: "Ship it",
            iterations: 2,
            elapsed_ms: 3000,
            tokens: 200,
            recent: &[a, b],
            trigger: Trigger::AgentClaimedDone,
            claim: Some("all done"),
            criteria: &[ChecklistItem {
                text: "tests pass".into(),
                done: false,
                done_at_iteration: None,
            }],
            milestones: &[],
        });
        assert!(text.contains("Goal: Ship it"));
        assert!(text.contains("Files written: README.md"));
        assert!(text.contains("[error: 1 failed]"));
        assert!(text.contains("1 succeeded, 1 failed"));
        assert!(text.contains("claims the goal is achieved: all done"));
        assert!(text.contains("Success criteria:\n1. [ ] tests pass"));
    }
}
