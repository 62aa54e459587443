//! Goal planning with the model: a concrete refinement for an ambiguous goal,
//! and success criteria with milestones for a goal. Both are optional
//! improvements over the rules; any failure falls back to them.

use crate::llm::{ChatRequest, LlmClient, Message};

const REFINE_PROMPT: &str = "Rewrite the user's goal for an autonomous agent so that it has one \
concrete deliverable (a file in its workspace), a measure of done, and a clear scope. Answer with \
the rewritten goal only, in one sentence, without quotes.";

const PLAN_PROMPT: &str = "List success criteria (verifiable facts that are true when the goal \
is achieved) and milestones (intermediate results, in order) for an autonomous agent's goal. \
Answer with one JSON object and nothing else: {\"criteria\": [\"...\"], \"milestones\": [\"...\"]}, \
at most 5 of each, each under 200 characters.";

/// A model answer and the tokens it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned<T> {
    /// What was produced.
    pub value: T,
    /// Tokens charged.
    pub tokens: u64,
}

fn request(model: &str, system: &str, goal: &str) -> ChatRequest {
    ChatRequest {
        model: model.to_string(),
        messages: vec![Message::text("system", system), Message::text("user", goal)],
        tools: Vec::new(),
        max_tokens: 400,
        max_completion_tokens: None,
        temperature: Some(0.2),
        top_p: None,
    }
}

/// Asks the model for a concrete version of `goal`.
pub async fn refine_goal(
    client: &LlmClient,
    model: &str,
    goal: &str,
) -> Result<Planned<String>, String> {
    let completion = client
        .chat(&request(model, REFINE_PROMPT, goal))
        .await
        .map_err(|e| e.to_string())?;
    let text = completion
        .message
        .content
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
        .to_string();
    if text.is_empty() || text.len() > 1_000 {
        return Err("the model's refinement was empty or too long".into());
    }
    Ok(Planned {
        value: text,
        tokens: completion.usage.total,
    })
}

/// Asks the model for success criteria and milestones of `goal`.
pub async fn plan_checklists(
    client: &LlmClient,
    model: &str,
    goal: &str,
) -> Result<Planned<(Vec<String>, Vec<String>)>, String> {
    let completion = client
        .chat(&request(model, PLAN_PROMPT, goal))
        .await
        .map_err(|e| e.to_string())?;
    let text = completion.message.content.unwrap_or_default();
    let start = text
        .find('{')
        .ok_or("the model's plan has no JSON object")?;
    let end = text
        .rfind('}')
        .ok_or("the model's plan has no JSON object")?;
    #[derive(serde::Deserialize)]
    struct Plan {
        #[serde(default)]
        criteria: Vec<String>,
        #[serde(default)]
        milestones: Vec<String>,
    }
    let plan: Plan = serde_json::from_str(text.get(start..=end).unwrap_or(""))
        .map_err(|e| format!("the model's plan is invalid: {e}"))?;
    let clean = |items: Vec<String>| -> Vec<String> {
        items
            .into_iter()
            .map(|s| s.trim().chars().take(480).collect::<String>())
            .filter(|s| !s.is_empty())
            .take(5)
            .collect()
    };
    Ok(Planned {
        value: (clean(plan.criteria), clean(plan.milestones)),
        tokens: completion.usage.total,
    })
}
