//! Chat-completions wire types.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content (absent on some assistant messages with tool calls).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_content"
    )]
    pub content: Option<String>,
    /// Tool calls the assistant makes.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with plain text content.
    pub fn text(role: &str, content: impl Into<String>) -> Message {
        Message {
            role: role.to_string(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>) -> Message {
        Message {
            role: "tool".into(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.to_string()),
        }
    }
}

/// A tool call made by the assistant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id (some servers omit it; one is made up then).
    #[serde(default)]
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function called.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

/// A function call: name and JSON-encoded arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string (an object is accepted and re-encoded).
    #[serde(default, deserialize_with = "lenient_arguments")]
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function.
    pub function: FunctionSpec,
}

/// A function's name, description and JSON-schema parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionSpec {
    /// Name (the built-in tools' are static; MCP tools' are made at run time).
    pub name: std::borrow::Cow<'static, str>,
    /// What it does, for the model.
    pub description: std::borrow::Cow<'static, str>,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

impl ToolSpec {
    /// A function tool.
    pub fn function(
        name: impl Into<std::borrow::Cow<'static, str>>,
        description: impl Into<std::borrow::Cow<'static, str>>,
        parameters: Value,
    ) -> ToolSpec {
        ToolSpec {
            kind: "function",
            function: FunctionSpec {
                name: name.into(),
                description: description.into(),
                parameters,
            },
        }
    }
}

/// A chat-completions request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatRequest {
    /// Model name.
    pub model: String,
    /// Conversation.
    pub messages: Vec<Message>,
    /// Tools offered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Most tokens to generate, for servers that predate `max_completion_tokens`.
    pub max_tokens: u64,
    /// Most tokens to generate (the current name); sent when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ChatResponse {
    /// The completion's id (`gen_ai.response.id`).
    #[serde(default)]
    pub id: Option<String>,
    /// The model that answered (`gen_ai.response.model`).
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Choice {
    pub message: Message,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub total_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// Of the prompt's tokens, those served from the provider's prompt cache.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

fn lenient_arguments<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Null => "{}".to_string(),
        other => other.to_string(),
    })
}

fn lenient_content<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    // Some servers send content as an array of text parts.
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        Value::Null => None,
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        other => Some(other.to_string()),
    })
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(Option::<Vec<ToolCall>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_may_be_a_string_or_an_object() {
        let as_string: ToolCall = serde_json::from_value(json!({
            "id": "c1", "type": "function",
            "function": { "name": "write_file", "arguments": "{\"path\":\"a\"}" }
        }))
        .unwrap();
        assert_eq!(as_string.function.arguments, "{\"path\":\"a\"}");
        let as_object: ToolCall = serde_json::from_value(json!({
            "function": { "name": "write_file", "arguments": { "path": "a" } }
        }))
        .unwrap();
        assert_eq!(as_object.function.arguments, "{\"path\":\"a\"}");
        assert_eq!(as_object.kind, "function");
        assert_eq!(as_object.id, "");
    }

    #[test]
    fn lenient_message_shapes() {
        let m: Message = serde_json::from_value(json!({
            "role": "assistant", "content": null, "tool_calls": null
        }))
        .unwrap();
        assert_eq!(m.content, None);
        assert!(m.tool_calls.is_empty());
        let parts: Message = serde_json::from_value(json!({
            "role": "assistant", "content": [{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }]
        }))
        .unwrap();
        assert_eq!(parts.content.as_deref(), Some("ab"));
    }
}
