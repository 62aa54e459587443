//! The model executor: each iteration is one chat-completions call plus the
//! tool calls it makes, inside the session's workspace. Loop-breaking tools
//! end or pause the session; every other tool result feeds the next call.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::workspace::{ToolError, Workspace};
use super::{
    Executor, ExecutorError, ExecutorEvent, StepContext, StepOutput, StepResult, ToolJournal,
};
use crate::llm::{ChatRequest, LlmClient, Message, ToolCall, ToolSpec};
use crate::policy::history::{FileWrite, Outcome};
use crate::policy::sentinel::{Sentinel, SignalKind};

/// How the agent is told to work: its tools and how to stop.
pub const SYSTEM_PROMPT: &str = "You are an autonomous agent supervised by Warden. You work \
step by step towards the goal below, inside a private workspace directory.

Tools:
- list_files(path): list a directory of the workspace (\"\" for its root).
- read_file(path): read a UTF-8 file of the workspace.
- write_file(path, content): create or replace a file of the workspace.
- task_completion(result, deliverables): call this when the goal is achieved. `deliverables` \
lists the workspace files you produced; each is checked, and the claim is rejected if one is missing.
- ask_question(question): call this when you cannot go on without the user's answer. The \
session pauses until they reply.
- converse(message): say something to the user that needs their attention; the session pauses.

Paths are relative to the workspace; absolute paths and `..` are refused. Work in small, \
verifiable steps, and do not repeat an action that already failed without changing something.

If you cannot call tools, end your reply with a line that contains only \
<<WARDEN_GOAL_DONE: short reason>> when the goal is achieved, or \
<<WARDEN_GOAL_BLOCKED: short reason>> when you cannot go on.";

/// Steps of conversation kept in a request, newest last.
const TRANSCRIPT_STEPS: usize = 30;
/// Characters of tool results shown in the observation.
const OBSERVATION_CHARS: usize = 4_000;

fn tools() -> Vec<ToolSpec> {
    let path = json!({ "type": "string", "description": "Path relative to the workspace" });
    vec![
        ToolSpec::function(
            "list_files",
            "List the entries of a workspace directory",
            json!({ "type": "object", "properties": { "path": path }, "required": [] }),
        ),
        ToolSpec::function(
            "read_file",
            "Read a UTF-8 file from the workspace",
            json!({ "type": "object", "properties": { "path": path }, "required": ["path"] }),
        ),
        ToolSpec::function(
            "write_file",
            "Create or replace a file in the workspace",
            json!({ "type": "object", "properties": {
                "path": path, "content": { "type": "string" } }, "required": ["path", "content"] }),
        ),
        ToolSpec::function(
            "task_completion",
            "Declare the goal achieved, with the result and the workspace files delivered",
            json!({ "type": "object", "properties": {
                "result": { "type": "string" },
                "deliverables": { "type": "array", "items": { "type": "string" } } },
                "required": ["result"] }),
        ),
        ToolSpec::function(
            "ask_question",
            "Ask the user a question you cannot go on without; the session pauses",
            json!({ "type": "object", "properties": { "question": { "type": "string" } },
                    "required": ["question"] }),
        ),
        ToolSpec::function(
            "converse",
            "Tell the user something that needs their attention; the session pauses",
            json!({ "type": "object", "properties": { "message": { "type": "string" } },
                    "required": ["message"] }),
        ),
    ]
}

/// What one tool call did.
struct ToolOutcome {
    /// Text returned to the model.
    content: String,
    /// Whether it failed.
    failed: bool,
    /// File written.
    file: Option<FileWrite>,
    /// Loop-breaking signal.
    signal: Option<Sentinel>,
    /// Event to record.
    event: Option<ExecutorEvent>,
}

impl ToolOutcome {
    fn ok(content: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            content: content.into(),
            failed: false,
            file: None,
            signal: None,
            event: None,
        }
    }

    fn error(err: impl std::fmt::Display) -> ToolOutcome {
        ToolOutcome {
            content: format!("error: {err}"),
            failed: true,
            file: None,
            signal: None,
            event: None,
        }
    }

    fn record(&self) -> Value {
        json!({ "content": self.content, "failed": self.failed, "file": self.file })
    }

    fn from_record(v: &Value) -> ToolOutcome {
        ToolOutcome {
            content: v["content"].as_str().unwrap_or_default().to_string(),
            failed: v["failed"].as_bool().unwrap_or(false),
            file: serde_json::from_value(v["file"].clone()).ok(),
            signal: None,
            event: None,
        }
    }
}

/// An executor backed by an OpenAI-compatible model.
pub struct LlmExecutor {
    client: LlmClient,
    model: String,
    max_tokens_per_call: u64,
    temperature: Option<f64>,
    workspace: Workspace,
    max_file_bytes: u64,
    journal: Arc<dyn ToolJournal>,
    transcript: VecDeque<Vec<Message>>,
    goal: String,
}

fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::Arguments(format!("`{name}` (a string) is required")))
}

impl LlmExecutor {
    /// An executor continuing the conversation in `transcript`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: LlmClient,
        model: String,
        max_tokens_per_call: u64,
        temperature: Option<f64>,
        workspace: Workspace,
        max_file_bytes: u64,
        journal: Arc<dyn ToolJournal>,
        transcript: Vec<Vec<Message>>,
        goal: String,
    ) -> LlmExecutor {
        let mut kept: VecDeque<Vec<Message>> = transcript.into();
        while kept.len() > TRANSCRIPT_STEPS {
            kept.pop_front();
        }
        LlmExecutor {
            client,
            model,
            max_tokens_per_call,
            temperature,
            workspace,
            max_file_bytes,
            journal,
            transcript: kept,
            goal,
        }
    }

    /// Runs one tool call, replaying a journaled result when there is one.
    async fn run_tool(&self, iteration: u64, index: u32, call: &ToolCall) -> ToolOutcome {
        let name = call.function.name.as_str();
        let args: Value = match serde_json::from_str(&call.function.arguments) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                return ToolOutcome::error(format!(
                    "the arguments of `{name}` must be a JSON object, got {:?}",
                    call.function.arguments
                ));
            }
        };
        match name {
            "task_completion" => return self.complete(&args),
            "ask_question" | "converse" => {
                let key = if name == "ask_question" {
                    "question"
                } else {
                    "message"
                };
                return match str_arg(&args, key) {
                    Ok(text) => ToolOutcome {
                        signal: Some(Sentinel {
                            kind: SignalKind::AskUser,
                            reason: Some(text.to_string()),
                        }),
                        ..ToolOutcome::ok(
                            "the user has been asked; the session pauses until they answer",
                        )
                    },
                    Err(e) => ToolOutcome::error(e),
                };
            }
            "read_file" | "write_file" | "list_files" => {}
            other => {
                return ToolOutcome::error(format!(
                    "unknown tool `{other}`; the tools are list_files, read_file, write_file, task_completion, ask_question, converse"
                ));
            }
        }
        // Side-effecting tools are journaled: intent before, result after.
        match self.journal.recorded(iteration, index, name, &args).await {
            Ok(Some(recorded)) => return ToolOutcome::from_record(&recorded),
            Ok(None) => {}
            Err(e) => return ToolOutcome::error(format!("cannot journal the call: {e}")),
        }
        if let Err(e) = self.journal.intent(iteration, index, name, &args).await {
            return ToolOutcome::error(format!("cannot journal the call: {e}"));
        }
        let outcome = match name {
            "read_file" => match str_arg(&args, "path")
                .and_then(|p| self.workspace.read(p, self.max_file_bytes))
            {
                Ok(content) => ToolOutcome::ok(content),
                Err(e) => ToolOutcome::error(e),
            },
            "write_file" => {
                let written = str_arg(&args, "path").and_then(|p| {
                    let content = str_arg(&args, "content")?;
                    self.workspace.write(p, content, self.max_file_bytes)
                });
                match written {
                    Ok(file) => ToolOutcome {
                        file: Some(file.clone()),
                        ..ToolOutcome::ok(format!("wrote {}", file.path))
                    },
                    Err(e) => ToolOutcome::error(e),
                }
            }
            _ => {
                let path = args.get("path").and_then(Value::as_str).unwrap_or("");
                match self.workspace.list(path) {
                    Ok(names) if names.is_empty() => ToolOutcome::ok("(empty)"),
                    Ok(names) => ToolOutcome::ok(names.join("\n")),
                    Err(e) => ToolOutcome::error(e),
                }
            }
        };
        if let Err(e) = self
            .journal
            .result(iteration, index, &outcome.record())
            .await
        {
            tracing::warn!(error = %e, "tool result not journaled");
        }
        outcome
    }

    /// Verifies a completion claim: every declared deliverable must exist.
    fn complete(&self, args: &Value) -> ToolOutcome {
        let result = args
            .get("result")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let deliverables: Vec<String> = args
            .get("deliverables")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let missing: Vec<&String> = deliverables
            .iter()
            .filter(|d| !self.workspace.has_file(d))
            .collect();
        if missing.is_empty() {
            ToolOutcome {
                signal: Some(Sentinel {
                    kind: SignalKind::Done,
                    reason: Some(result.clone()),
                }),
                event: Some(ExecutorEvent {
                    kind: "completion_verified",
                    data: json!({ "result": result, "deliverables": deliverables }),
                }),
                ..ToolOutcome::ok("completion accepted: every deliverable exists")
            }
        } else {
            let missing: Vec<String> = missing.into_iter().cloned().collect();
            ToolOutcome {
                event: Some(ExecutorEvent {
                    kind: "completion_rejected",
                    data: json!({ "result": result, "deliverables": deliverables, "missing": missing }),
                }),
                ..ToolOutcome::error(format!(
                    "completion rejected: these deliverables do not exist in the workspace: {}. Create them, then call task_completion again.",
                    missing.join(", ")
                ))
            }
        }
    }

    async fn step(&mut self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        let mut step_messages = Vec::new();
        if let Some(guidance) = ctx.guidance {
            step_messages.push(Message::text(
                "user",
                format!("Guidance from the user: {guidance}"),
            ));
        }
        if let Some(nudge) = ctx.nudge {
            step_messages.push(Message::text(
                "user",
                format!("Note from your supervisor: {nudge}"),
            ));
        }
        let last_is_assistant_text = self
            .transcript
            .back()
            .and_then(|m| m.last())
            .is_some_and(|m| m.role == "assistant");
        if step_messages.is_empty() && (self.transcript.is_empty() || last_is_assistant_text) {
            step_messages.push(Message::text(
                "user",
                if self.transcript.is_empty() {
                    "Begin working on the goal."
                } else {
                    "Continue working on the goal."
                },
            ));
        }
        let mut messages = vec![Message::text(
            "system",
            format!("{SYSTEM_PROMPT}\n\nGoal: {}", self.goal),
        )];
        messages.extend(self.transcript.iter().flatten().cloned());
        messages.extend(step_messages.iter().cloned());
        let max_tokens = self.max_tokens_per_call.min(ctx.token_allowance);
        if max_tokens == 0 {
            return Err(ExecutorError::Failed {
                action: "model_call".into(),
                message: "the token budget is used up".into(),
                tokens: 0,
            });
        }
        let request = ChatRequest {
            model: self.model.clone(),
            messages,
            tools: tools(),
            max_tokens,
            temperature: self.temperature,
            top_p: None,
        };
        let completion = self
            .client
            .chat(&request)
            .await
            .map_err(|e| ExecutorError::Failed {
                action: "model_call".into(),
                message: e.to_string(),
                tokens: 0,
            })?;
        let mut assistant = completion.message;
        assistant.role = "assistant".into();
        for (i, call) in assistant.tool_calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{}_{i}", ctx.iteration);
            }
        }
        let calls = assistant.tool_calls.clone();
        let message_text = assistant.content.clone().unwrap_or_default();
        step_messages.push(assistant);

        let mut observations = Vec::new();
        let mut files = Vec::new();
        let mut events = Vec::new();
        let mut signal = None;
        let mut failed = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let outcome = self.run_tool(ctx.iteration, index as u32, call).await;
            observations.push(format!("{}: {}", call.function.name, outcome.content));
            step_messages.push(Message::tool_result(&call.id, outcome.content.clone()));
            if outcome.failed {
                failed.push(format!("{}: {}", call.function.name, outcome.content));
            }
            files.extend(outcome.file);
            events.extend(outcome.event);
            if signal.is_none() {
                signal = outcome.signal;
            }
        }
        let (action, arguments) = match calls.first() {
            Some(c) => (
                c.function.name.clone(),
                serde_json::from_str(&c.function.arguments).unwrap_or(Value::Null),
            ),
            None => ("respond".to_string(), Value::Null),
        };
        let mut observation = observations.join("\n");
        if observation.len() > OBSERVATION_CHARS {
            let cut = (0..=OBSERVATION_CHARS)
                .rev()
                .find(|i| observation.is_char_boundary(*i))
                .unwrap_or(0);
            observation.truncate(cut);
            observation.push('…');
        }
        let transcript = serde_json::to_value(&step_messages).ok();
        self.transcript.push_back(step_messages);
        while self.transcript.len() > TRANSCRIPT_STEPS {
            self.transcript.pop_front();
        }
        Ok(StepResult::Step(Box::new(StepOutput {
            action,
            arguments,
            outcome: if failed.is_empty() {
                Outcome::Success
            } else {
                Outcome::Failure
            },
            observation,
            message: message_text,
            error: (!failed.is_empty()).then(|| failed.join("; ")),
            tokens: completion.usage.total,
            tool_calls: calls.len() as u64,
            files_written: files,
            waiting: false,
            percent_complete: None,
            signal,
            transcript,
            events,
        })))
    }
}

impl Executor for LlmExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.step(ctx).boxed()
    }
}
