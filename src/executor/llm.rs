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
    ApprovalAsk, ApprovalDesk, ChildDesk, CycleChange, DecidedCall, Executor, ExecutorDeps,
    ExecutorError, StepContext, StepOutput, StepResult, TaskQueue, ToolJournal,
};
use crate::event::SessionEvent;
use crate::llm::{ChatRequest, LlmClient, Message, TokenUsage, ToolCall, ToolSpec};
use crate::mcp::{OfferedTool, Toolbox};
use crate::policy::approval::{self, ApprovalPolicy, CallDecision, Decision, ToolFacts};
use crate::policy::budget;
use crate::policy::excerpt;
use crate::policy::history::{FileWrite, Outcome};
use crate::policy::pricing::StepUsage;
use crate::policy::sentinel::{Sentinel, SignalKind};
use crate::store::{AgentTask, AgentTaskWrite};
use crate::telemetry;
use tracing::Instrument;

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
- task_queue_read(): your task list, kept across context cycles and restarts.
- task_queue_write(tasks): add tasks ({title, status?, notes?, priority?}) or update them \
({id, status?, notes?, title?, priority?}); statuses: pending, in_progress, done, blocked.
- delegate_task(goal, success_criteria?, budget_share?, wait?): hand a separate sub-task to a \
child agent that works on its own, in parallel with other children, with a share of your \
remaining budget. With wait (the default) you pause until your children end; their results \
are then given to you. A child works in `delegated/<child id>/` of your workspace.

Your context window is limited. When it is nearly full you will be told to wrap up: save what \
you learned in files and the task queue; the conversation is then summarised into your memory \
and restarted.

Paths are relative to the workspace; absolute paths and `..` are refused. Work in small, \
verifiable steps, and do not repeat an action that already failed without changing something.

If you cannot call tools, end your reply with a line that contains only \
<<WARDEN_GOAL_DONE: short reason>> when the goal is achieved, or \
<<WARDEN_GOAL_BLOCKED: short reason>> when you cannot go on.";

/// Steps of conversation kept in a request, newest last.
const TRANSCRIPT_STEPS: usize = 30;
/// Characters of tool results shown in the observation.
const OBSERVATION_CHARS: usize = 4_000;

/// The names of the built-in workspace tools (`executor.tools: ["builtin"]`).
const WORKSPACE_TOOLS: [&str; 3] = ["list_files", "read_file", "write_file"];

/// The built-in tools: the workspace ones when chosen, and always those
/// that end or pause the session and the task queue.
fn builtin_tools(workspace: bool) -> Vec<ToolSpec> {
    let path = json!({ "type": "string", "description": "Path relative to the workspace" });
    let mut tools = vec![
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
            "task_queue_read",
            "Read your task queue (kept across context cycles and restarts)",
            json!({ "type": "object", "properties": {}, "required": [] }),
        ),
        ToolSpec::function(
            "task_queue_write",
            "Add tasks (no id) or update tasks (with id) in your task queue",
            json!({ "type": "object", "properties": { "tasks": { "type": "array", "items": {
                "type": "object", "properties": {
                    "id": { "type": "integer" }, "title": { "type": "string" },
                    "status": { "type": "string", "enum": ["pending", "in_progress", "done", "blocked"] },
                    "notes": { "type": "string" }, "priority": { "type": "integer" } } } } },
                "required": ["tasks"] }),
        ),
        ToolSpec::function(
            "delegate_task",
            "Delegate a separate sub-task to a child agent with a share of your remaining budget",
            json!({ "type": "object", "properties": {
                "goal": { "type": "string", "description": "What the child must achieve" },
                "success_criteria": { "type": "array", "items": { "type": "string" } },
                "budget_share": { "type": "number", "exclusiveMinimum": 0, "maximum": 1,
                    "description": "Fraction of your remaining tokens and iterations the child gets" },
                "wait": { "type": "boolean", "description": "Pause until your children end (default true)" } },
                "required": ["goal"] }),
        ),
        ToolSpec::function(
            "converse",
            "Tell the user something that needs their attention; the session pauses",
            json!({ "type": "object", "properties": { "message": { "type": "string" } },
                    "required": ["message"] }),
        ),
    ];
    if !workspace {
        tools.retain(|t| !WORKSPACE_TOOLS.contains(&t.function.name.as_ref()));
    }
    tools
}

/// An MCP tool as an OpenAI function tool: its namespaced name, its
/// description and its own input schema.
fn mcp_tool_spec(offered: &OfferedTool) -> ToolSpec {
    let description = if offered.tool.description.is_empty() {
        format!(
            "Tool `{}` of the MCP server `{}`",
            offered.tool.name, offered.tool.server
        )
    } else {
        offered.tool.description.clone()
    };
    let mut schema = offered.tool.input_schema.clone();
    // OpenAI-compatible servers want an object schema with properties.
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("type").or_insert_with(|| json!("object"));
        obj.entry("properties").or_insert_with(|| json!({}));
    } else {
        schema = json!({ "type": "object", "properties": {} });
    }
    ToolSpec::function(offered.function.clone(), description, schema)
}

/// The GenAI `execute_tool {name}` span of one tool call.
fn tool_span(call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        target: telemetry::TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {}", call.function.name),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.function.name,
        gen_ai.tool.call.id = %call.id,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// What a finished tool call puts on its span: whether it failed, and its
/// arguments and result when content tracing is on.
fn record_tool(span: &tracing::Span, call: &ToolCall, outcome: &ToolOutcome) {
    if span.is_disabled() {
        return;
    }
    if outcome.failed {
        span.record("error.type", "tool_error");
        span.record("otel.status_code", "ERROR");
    }
    if telemetry::content_enabled() {
        span.record(
            "gen_ai.tool.call.arguments",
            telemetry::capped(&call.function.arguments).as_str(),
        );
        span.record(
            "gen_ai.tool.call.result",
            telemetry::capped(&outcome.content).as_str(),
        );
    }
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
    event: Option<SessionEvent>,
    /// Not run: it waits for a person's approval (its result comes in a later step).
    awaiting: bool,
}

impl ToolOutcome {
    fn ok(content: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            content: content.into(),
            failed: false,
            file: None,
            signal: None,
            event: None,
            awaiting: false,
        }
    }

    fn error(err: impl std::fmt::Display) -> ToolOutcome {
        ToolOutcome {
            content: format!("error: {err}"),
            failed: true,
            file: None,
            signal: None,
            event: None,
            awaiting: false,
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
            awaiting: false,
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
    /// `WARDEN_MAX_TOOL_CALLS_PER_STEP`: calls of one answer that run.
    max_tool_calls: usize,
    /// `WARDEN_MAX_OUTPUT_BYTES`: bytes of each text of a step kept.
    max_output_bytes: usize,
    journal: Arc<dyn ToolJournal>,
    /// Which calls wait for a person.
    approval_policy: ApprovalPolicy,
    /// Where they wait.
    approvals: Arc<dyn ApprovalDesk>,
    tasks: Arc<dyn TaskQueue>,
    transcript: VecDeque<Vec<Message>>,
    goal: String,
    criteria: Vec<String>,
    cycle: u32,
    memory: String,
    context_budget: u64,
    /// Wrap-up turns left in this cycle, once the context is nearly full.
    wrap_up_left: Option<u8>,
    /// The MCP tools the session chose, and whether it chose the built-in ones.
    mcp: Toolbox,
    /// Where tasks are delegated to children.
    children: Arc<dyn ChildDesk>,
    /// Tokens the step in flight has spent so far (the model's answer).
    step_tokens: u64,
    /// Tokens the step in flight spent that no answer reports yet: charged
    /// by the loop when the step is cut short
    /// ([`Executor::take_unreported_tokens`]).
    unreported: u64,
}

/// Turns the agent gets to save its findings before a cycle ends.
const WRAP_UP_TURNS: u8 = 3;
/// Most characters of memory carried across cycles (the newest are kept).
const MEMORY_CHARS: usize = 8_000;

const SUMMARY_PROMPT: &str = "Summarise this context cycle of an autonomous agent for its future \
self, who will not see the conversation: what was done, what was learned, which files hold \
results, what failed, and what to do next. Be concrete and brief (at most 300 words).";

fn format_tasks(tasks: &[AgentTask]) -> String {
    if tasks.is_empty() {
        return "(empty)".into();
    }
    tasks
        .iter()
        .map(|t| {
            let notes = if t.notes.is_empty() {
                String::new()
            } else {
                format!(" — {}", t.notes)
            };
            format!(
                "#{} [{}] (priority {}) {}{notes}",
                t.id, t.status, t.priority, t.title
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::Arguments(format!("`{name}` (a string) is required")))
}

/// What the agent works with: its workspace, the MCP tools offered to it,
/// and which calls wait for a person.
pub struct AgentTools {
    /// The session's workspace (the built-in file tools).
    pub workspace: Workspace,
    /// The MCP tools the session may use.
    pub mcp: Toolbox,
    /// Which calls need approval.
    pub approval_policy: ApprovalPolicy,
}

impl LlmExecutor {
    /// An executor continuing the conversation of `deps`.
    pub fn new(
        client: LlmClient,
        model: String,
        max_tokens_per_call: u64,
        temperature: Option<f64>,
        tools: AgentTools,
        deps: ExecutorDeps,
    ) -> LlmExecutor {
        let AgentTools {
            workspace,
            mcp,
            approval_policy,
        } = tools;
        let mut kept: VecDeque<Vec<Message>> = deps.transcript.into();
        while kept.len() > TRANSCRIPT_STEPS {
            kept.pop_front();
        }
        // Earlier steps are kept (and sent) as excerpts; the newest whole.
        let older = kept.len().saturating_sub(1);
        for step in kept.iter_mut().take(older) {
            slim_step(step);
        }
        LlmExecutor {
            client,
            model,
            max_tokens_per_call,
            temperature,
            workspace,
            max_file_bytes: deps.max_file_bytes,
            max_tool_calls: deps.max_tool_calls_per_step.max(1),
            max_output_bytes: deps.max_output_bytes.max(1),
            journal: deps.journal,
            approval_policy,
            approvals: deps.approvals,
            tasks: deps.tasks,
            transcript: kept,
            goal: deps.goal,
            criteria: deps.criteria,
            cycle: deps.cycle.max(1),
            memory: deps.memory,
            context_budget: deps.context_budget_tokens.max(1),
            wrap_up_left: None,
            mcp,
            children: deps.children,
            step_tokens: 0,
            unreported: 0,
        }
    }

    /// The system prompt: tools, goal, criteria, memory and the task queue.
    fn system_prompt(&self, tasks: &str) -> String {
        let mut prompt = format!("{SYSTEM_PROMPT}\n\nGoal: {}", self.goal);
        if !self.criteria.is_empty() {
            prompt.push_str("\nSuccess criteria (all must hold when you finish):");
            for (i, c) in self.criteria.iter().enumerate() {
                prompt.push_str(&format!("\n{}. {c}", i + 1));
            }
        }
        prompt.push_str(&format!("\n\nThis is context cycle {}.", self.cycle));
        if !self.memory.is_empty() {
            prompt.push_str(&format!("\nMemory from earlier cycles:\n{}", self.memory));
        }
        prompt.push_str(&format!("\nTask queue:\n{tasks}"));
        prompt
    }

    /// Summarises the finished cycle into memory and starts the next one.
    async fn next_cycle(&mut self) -> Result<(CycleChange, u64), String> {
        let conversation: String = self
            .transcript
            .iter()
            .flatten()
            .map(|m| {
                let calls: Vec<String> = m
                    .tool_calls
                    .iter()
                    .map(|c| format!("{}({})", c.function.name, c.function.arguments))
                    .collect();
                format!(
                    "{}: {} {}",
                    m.role,
                    m.content.as_deref().unwrap_or(""),
                    calls.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let tail: String = {
            let chars: Vec<char> = conversation.chars().collect();
            chars[chars.len().saturating_sub(24_000)..].iter().collect()
        };
        let request = ChatRequest {
            model: self.model.clone(),
            messages: vec![
                Message::text("system", SUMMARY_PROMPT),
                Message::text("user", format!("Goal: {}\n\n{tail}", self.goal)),
            ],
            tools: Vec::new(),
            max_tokens: 600,
            max_completion_tokens: None,
            temperature: Some(0.2),
            top_p: None,
        };
        let completion = self
            .client
            .chat(&request)
            .await
            .map_err(|e| e.to_string())?;
        let summary = completion.message.content.unwrap_or_default();
        let mut memory = format!(
            "{}\n## Cycle {}\n{}",
            self.memory,
            self.cycle,
            summary.trim()
        )
        .trim()
        .to_string();
        let chars = memory.chars().count();
        if chars > MEMORY_CHARS {
            memory = memory.chars().skip(chars - MEMORY_CHARS).collect();
        }
        self.memory = memory.clone();
        self.cycle += 1;
        self.transcript.clear();
        self.wrap_up_left = None;
        Ok((
            CycleChange {
                cycle: self.cycle,
                memory,
            },
            completion.usage.total,
        ))
    }

    /// Runs one tool call, replaying a journaled result when there is one,
    /// or asks a person first when the session's approval policy says so
    /// (`reason`: the model's text of the step).
    async fn run_tool(
        &self,
        iteration: u64,
        index: u32,
        call: &ToolCall,
        reason: &str,
    ) -> ToolOutcome {
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
            "delegate_task" => return self.delegate_task(iteration, index, args).await,
            "ask_question" | "converse" => return ask_user(name, &args),
            "task_queue_read" => {
                return match self.tasks.read().await {
                    Ok(tasks) => ToolOutcome::ok(format_tasks(&tasks)),
                    Err(e) => ToolOutcome::error(e),
                };
            }
            "task_queue_write" => return self.write_tasks(&args).await,
            "read_file" | "write_file" | "list_files" if self.mcp.builtin() => {}
            other if let Some(tool) = self.mcp.tool(other) => {
                // MCP tools ask for approval by their own annotations: one
                // that does not say it only reads counts as a write.
                let facts = ToolFacts {
                    name: other,
                    read_only: tool.is_read_only(),
                };
                if let CallDecision::AwaitApproval(_) = self.approval_policy.decide(facts) {
                    return self
                        .ask_approval(iteration, index, call, args, reason)
                        .await;
                }
                return self.run_mcp_tool(iteration, index, other, &args).await;
            }
            other => {
                return ToolOutcome::error(format!(
                    "unknown tool `{other}`; use only the tools offered with this request"
                ));
            }
        }
        let facts = ToolFacts {
            name,
            read_only: name != "write_file",
        };
        if let CallDecision::AwaitApproval(_) = self.approval_policy.decide(facts) {
            return self
                .ask_approval(iteration, index, call, args, reason)
                .await;
        }
        self.run_journaled(iteration, index, name, &args).await
    }

    /// Writes the task queue (`task_queue_write`) and shows it as written.
    async fn write_tasks(&self, args: &Value) -> ToolOutcome {
        let writes: Result<Vec<AgentTaskWrite>, _> =
            serde_json::from_value(args.get("tasks").cloned().unwrap_or(Value::Null));
        match writes {
            Ok(writes) => match self.tasks.write(&writes).await {
                Ok(tasks) => {
                    ToolOutcome::ok(format!("task queue updated:\n{}", format_tasks(&tasks)))
                }
                Err(e) => ToolOutcome::error(e),
            },
            Err(e) => ToolOutcome::error(format!("`tasks` must be a list of tasks: {e}")),
        }
    }

    /// Makes a child session for the call; with `wait`, the session
    /// pauses after the step until its children end.
    async fn delegate_task(&self, iteration: u64, index: u32, args: Value) -> ToolOutcome {
        let request: crate::policy::delegation::ChildRequest = match serde_json::from_value(args) {
            Ok(r) => r,
            Err(e) => return ToolOutcome::error(format!("delegate_task: {e}")),
        };
        match self
            .children
            .delegate(iteration, index, &request, self.step_tokens, None)
            .await
        {
            Ok(ticket) => ToolOutcome {
                signal: request.wait.then(|| Sentinel {
                    kind: SignalKind::WaitingForChildren,
                    reason: Some(format!("delegated: {}", request.goal.trim())),
                }),
                ..ToolOutcome::ok(format!(
                    "delegated to child {} with {} tokens and {} iterations; {}",
                    ticket.child_id,
                    ticket.tokens,
                    ticket.iterations,
                    if request.wait {
                        "you pause until your children end, then get their results"
                    } else {
                        "you get its result when it ends"
                    }
                ))
            },
            Err(e) => ToolOutcome::error(format!("cannot delegate: {e}")),
        }
    }

    /// Journals a call as waiting for a person; the session pauses after the step.
    async fn ask_approval(
        &self,
        iteration: u64,
        index: u32,
        call: &ToolCall,
        arguments: Value,
        reason: &str,
    ) -> ToolOutcome {
        let ask = ApprovalAsk {
            call_index: index,
            tool_call_id: Some(call.id.clone()).filter(|id| !id.is_empty()),
            tool: call.function.name.clone(),
            arguments,
            reason: reason.to_string(),
        };
        if let Err(e) = self.approvals.ask(iteration, &ask).await {
            return ToolOutcome::error(format!("cannot ask for approval: {e}"));
        }
        let call_id = crate::store::approval_call_id(
            i64::try_from(iteration).unwrap_or(i64::MAX),
            i32::try_from(index).unwrap_or(i32::MAX),
        );
        ToolOutcome {
            awaiting: true,
            signal: Some(Sentinel {
                kind: SignalKind::ApprovalRequired,
                reason: Some(format!("`{}` (call {call_id})", ask.tool)),
            }),
            event: Some(SessionEvent::ApprovalRequested {
                call_id,
                tool: ask.tool,
                arguments: ask.arguments,
                reason: ask.reason,
            }),
            ..ToolOutcome::ok("waiting for a person's approval")
        }
    }

    /// The answers to the calls of the step before that waited for a
    /// person: an approved call runs now (journaled under its own step, so
    /// it runs once however often this step is tried), the others are told
    /// why they did not run.
    async fn carry_out(
        &self,
        decided: &[DecidedCall],
        iteration: u64,
    ) -> Vec<(String, ToolOutcome)> {
        let mut out = Vec::new();
        for call in decided {
            let outcome =
                match approval::refusal_text(&call.tool, call.decision, call.message.as_deref()) {
                    None => {
                        let mut outcome = if self.mcp.tool(&call.tool).is_some() {
                            self.run_mcp_tool(
                                iteration,
                                call.call_index,
                                &call.tool,
                                &call.arguments,
                            )
                            .await
                        } else {
                            self.run_journaled(
                                iteration,
                                call.call_index,
                                &call.tool,
                                &call.arguments,
                            )
                            .await
                        };
                        if call.edited {
                            outcome.content = format!(
                                "{} {}",
                                outcome.content,
                                approval::edited_note(&call.tool, &call.arguments)
                            );
                        }
                        if let Some(m) = call
                            .message
                            .as_deref()
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                        {
                            outcome.content =
                                format!("{} (approved; their message: {m})", outcome.content);
                        }
                        outcome
                    }
                    Some(text) => ToolOutcome {
                        failed: call.decision == Decision::Reject
                            || call.decision == Decision::Expired,
                        ..ToolOutcome::ok(text)
                    },
                };
            out.push((call.tool.clone(), outcome));
        }
        out
    }

    /// Runs a side-effecting tool, journaled: intent before, result after.
    async fn run_journaled(
        &self,
        iteration: u64,
        index: u32,
        name: &str,
        args: &Value,
    ) -> ToolOutcome {
        if !args.is_object() {
            return ToolOutcome::error(format!("the arguments of `{name}` must be a JSON object"));
        }
        let args = args.clone();
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
            "list_files" => {
                let path = args.get("path").and_then(Value::as_str).unwrap_or("");
                match self.workspace.list(path) {
                    Ok(names) if names.is_empty() => ToolOutcome::ok("(empty)"),
                    Ok(names) => ToolOutcome::ok(names.join("\n")),
                    Err(e) => ToolOutcome::error(e),
                }
            }
            other => ToolOutcome::error(format!("`{other}` is not a workspace tool")),
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

    /// Runs a call of an MCP tool, journaled like the built-in side
    /// effects: a result recorded for the same call is returned instead of
    /// calling the server again.
    async fn run_mcp_tool(
        &self,
        iteration: u64,
        index: u32,
        function: &str,
        args: &Value,
    ) -> ToolOutcome {
        match self
            .journal
            .recorded(iteration, index, function, args)
            .await
        {
            Ok(Some(recorded)) => return ToolOutcome::from_record(&recorded),
            Ok(None) => {}
            Err(e) => return ToolOutcome::error(format!("cannot journal the call: {e}")),
        }
        if let Err(e) = self.journal.intent(iteration, index, function, args).await {
            return ToolOutcome::error(format!("cannot journal the call: {e}"));
        }
        let outcome = match self.mcp.call(function, args).await {
            Some(Ok(result)) => {
                // Held to the cap every stored text of a step has.
                let text = match excerpt::cap_stored(&result.text, self.max_output_bytes) {
                    Some(capped) => capped,
                    None => result.text,
                };
                if result.is_error {
                    ToolOutcome::error(text)
                } else {
                    ToolOutcome::ok(text)
                }
            }
            Some(Err(err)) => ToolOutcome::error(err),
            None => ToolOutcome::error(format!("unknown tool `{function}`")),
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
                event: Some(SessionEvent::CompletionVerified {
                    result: result.clone(),
                    deliverables,
                }),
                ..ToolOutcome::ok("completion accepted: every deliverable exists")
            }
        } else {
            let missing: Vec<String> = missing.into_iter().cloned().collect();
            ToolOutcome {
                event: Some(SessionEvent::CompletionRejected {
                    result,
                    deliverables,
                    missing: missing.clone(),
                }),
                ..ToolOutcome::error(format!(
                    "completion rejected: these deliverables do not exist in the workspace: {}. Create them, then call task_completion again.",
                    missing.join(", ")
                ))
            }
        }
    }

    /// One iteration: answer the calls decided since the step before, add
    /// the notes for the model, call it within the token allowance, run
    /// the tools it asks for, keep the step in the conversation, and start
    /// the next context cycle when the window is full.
    async fn step(&mut self, ctx: StepContext<'_>) -> Result<StepResult, ExecutorError> {
        self.unreported = 0;
        let mut step_messages = Vec::new();
        let decided = self.decided_before(ctx.iteration).await?;
        let carried = self
            .answer_decided(&decided, ctx.iteration, &mut step_messages)
            .await;
        self.add_notes(&ctx, &mut step_messages);
        let (messages, tools) = self.prompt(&step_messages).await;
        // What the prompt costs comes out of the allowance before any
        // answer; an estimate from its size (the tools count too).
        let prompt_tokens = estimate_prompt_tokens(&messages, &tools);
        let Some(max_tokens) =
            budget::completion_cap(ctx.token_allowance, prompt_tokens, self.max_tokens_per_call)
        else {
            return Ok(StepResult::OverBudget {
                needed: prompt_tokens.saturating_add(1),
                allowance: ctx.token_allowance,
            });
        };
        let request = self.chat_request(messages, tools, max_tokens);
        let called = std::time::Instant::now();
        // A call cut short is charged its prompt: the model read it. The
        // call does not stream, so nothing of an answer is counted before
        // it arrives whole.
        self.unreported = prompt_tokens;
        let completion = match self.client.chat(&request).await {
            Ok(completion) => completion,
            Err(e) => {
                return self.model_call_failed(e.to_string(), step_messages, &carried, called);
            }
        };
        let (calls, message_text) = self.take_answer(
            completion.message,
            ctx.iteration,
            &completion.usage,
            prompt_tokens,
            &mut step_messages,
        );
        let mut ran = ToolsRun::carried(carried);
        self.run_calls(
            ctx.iteration,
            &calls,
            &message_text,
            &mut ran,
            &mut step_messages,
        )
        .await;
        let (action, arguments) = first_action(&calls);
        let observation = clip_observation(ran.observations.join("\n"));
        let transcript = self.keep_step(step_messages);
        let (tokens, context_overflow, cycle_change) = self
            .advance_cycle(&completion.usage, calls.is_empty(), &mut ran.events)
            .await;
        Ok(StepResult::Step(Box::new(StepOutput {
            action,
            arguments,
            outcome: ran.outcome(),
            observation,
            message: message_text,
            error: ran.error(),
            tokens,
            usage: Some(self.step_usage(&completion.usage)),
            tool_calls: ran.executed as u64,
            files_written: ran.files,
            waiting: false,
            percent_complete: None,
            signal: ran.signal,
            transcript,
            events: ran.events,
            context_overflow,
            cycle_change,
            model_latency: Some(called.elapsed()),
        })))
    }
}

impl LlmExecutor {
    /// The step's tokens as the model API split them; a summary of the
    /// cycle (part of the step's tokens) is priced as output.
    fn step_usage(&self, usage: &TokenUsage) -> StepUsage {
        StepUsage {
            input_tokens: usage.prompt,
            output_tokens: usage.completion,
            cached_tokens: usage.cached,
            reasoning_tokens: 0,
            model: Some(self.model.clone()),
        }
    }
}

/// What the tool calls of one step came to, the decided calls of the step
/// before included.
struct ToolsRun {
    /// `tool: result` lines for the observation.
    observations: Vec<String>,
    /// `tool: result` lines of the calls that failed.
    failed: Vec<String>,
    /// Files the calls wrote.
    files: Vec<FileWrite>,
    /// Events the calls raised.
    events: Vec<SessionEvent>,
    /// The signal that wins among the calls' signals.
    signal: Option<Sentinel>,
    /// Calls of the answer that ran (the rest were over the limit).
    executed: usize,
}

impl ToolsRun {
    /// A step fails when any of its calls did.
    fn outcome(&self) -> Outcome {
        if self.failed.is_empty() {
            Outcome::Success
        } else {
            Outcome::Failure
        }
    }

    /// The failed calls' lines, when there are any.
    fn error(&self) -> Option<String> {
        (!self.failed.is_empty()).then(|| self.failed.join("; "))
    }

    /// Starts from the decided calls answered before the model call.
    fn carried(carried: Vec<(String, ToolOutcome)>) -> ToolsRun {
        let mut observations = Vec::new();
        let mut files = Vec::new();
        let mut failed = Vec::new();
        for (tool, outcome) in carried {
            observations.push(format!("{tool}: {}", outcome.content));
            if outcome.failed {
                failed.push(format!("{tool}: {}", outcome.content));
            }
            files.extend(outcome.file);
        }
        ToolsRun {
            observations,
            failed,
            files,
            events: Vec::new(),
            signal: None,
            executed: 0,
        }
    }
}

/// The prompt's cost in tokens, estimated from its size (messages and tools).
fn estimate_prompt_tokens(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let prompt_bytes = serde_json::to_string(messages).map_or(0, |j| j.len())
        + serde_json::to_string(tools).map_or(0, |j| j.len());
    budget::estimate_tokens(prompt_bytes)
}

/// The step's action: its first call with its arguments, or `respond`.
fn first_action(calls: &[ToolCall]) -> (String, Value) {
    match calls.first() {
        Some(c) => (
            c.function.name.clone(),
            serde_json::from_str(&c.function.arguments).unwrap_or(Value::Null),
        ),
        None => ("respond".to_string(), Value::Null),
    }
}

/// `ask_question` or `converse`: the session pauses until the user answers.
fn ask_user(name: &str, args: &Value) -> ToolOutcome {
    let key = if name == "ask_question" {
        "question"
    } else {
        "message"
    };
    match str_arg(args, key) {
        Ok(text) => ToolOutcome {
            signal: Some(Sentinel {
                kind: SignalKind::AskUser,
                reason: Some(text.to_string()),
            }),
            ..ToolOutcome::ok("the user has been asked; the session pauses until they answer")
        },
        Err(e) => ToolOutcome::error(e),
    }
}

/// The observation held to `OBSERVATION_CHARS` bytes, cut on a character.
fn clip_observation(mut observation: String) -> String {
    if observation.len() > OBSERVATION_CHARS {
        let cut = (0..=OBSERVATION_CHARS)
            .rev()
            .find(|i| observation.is_char_boundary(*i))
            .unwrap_or(0);
        observation.truncate(cut);
        observation.push('…');
    }
    observation
}

/// The steps of `step`, in the order it takes them.
impl LlmExecutor {
    /// The decisions on the calls of the step before that waited for a person.
    async fn decided_before(&self, iteration: u64) -> Result<Vec<DecidedCall>, ExecutorError> {
        let decided = match iteration.checked_sub(1).filter(|n| *n > 0) {
            Some(before) => {
                self.approvals
                    .decided(before)
                    .await
                    .map_err(|e| ExecutorError::Failed {
                        action: "approvals".into(),
                        message: format!(
                            "cannot read the decisions on calls waiting for approval: {e}"
                        ),
                        tokens: 0,
                    })?
            }
            None => Vec::new(),
        };
        Ok(decided)
    }

    /// Carries out the decided calls and answers them first, as the tool
    /// results of the step that made them.
    async fn answer_decided(
        &mut self,
        decided: &[DecidedCall],
        iteration: u64,
        step_messages: &mut Vec<Message>,
    ) -> Vec<(String, ToolOutcome)> {
        if !decided.is_empty() {
            // A decided MCP call runs through its server: list the tools
            // first (a resumed executor has not listed them yet).
            self.mcp.offered().await;
        }
        let carried = self.carry_out(decided, iteration - 1).await;
        let asked_ids: Vec<String> = self
            .transcript
            .back()
            .into_iter()
            .flatten()
            .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
            .collect();
        for (call, (tool, outcome)) in decided.iter().zip(&carried) {
            match call
                .tool_call_id
                .as_ref()
                .filter(|id| asked_ids.contains(id))
            {
                Some(id) => step_messages.push(Message::tool_result(id, outcome.content.clone())),
                // The call is no longer in the conversation (a new cycle
                // began): its answer goes in as a note.
                None => step_messages.push(Message::text(
                    "user",
                    format!(
                        "The result of your earlier call of `{tool}`: {}",
                        outcome.content
                    ),
                )),
            }
        }
        carried
    }

    /// The notes for the model: a person's guidance, the supervisor's
    /// nudge, a soft budget's warning, children's reports, the wrap-up warning, or a prompt to begin
    /// or go on when there is nothing else to answer.
    fn add_notes(&self, ctx: &StepContext<'_>, step_messages: &mut Vec<Message>) {
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
        if let Some(note) = ctx.budget_note {
            step_messages.push(Message::text("user", format!("Budget warning: {note}")));
        }
        if !ctx.children.is_empty() {
            step_messages.push(Message::text(
                "user",
                crate::policy::delegation::render_reports(ctx.children),
            ));
        }
        if let Some(left) = self.wrap_up_left {
            step_messages.push(Message::text(
                "user",
                format!(
                    "Your context window is almost full: {left} turn(s) left in this cycle. Save what you have learned now (write files, update the task queue with task_queue_write). Then this conversation is summarised into your memory and restarted."
                ),
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
    }

    /// The request's messages (system prompt, kept conversation, this
    /// step's messages) and the tools offered.
    async fn prompt(&mut self, step_messages: &[Message]) -> (Vec<Message>, Vec<ToolSpec>) {
        let tasks = match self.tasks.read().await {
            Ok(tasks) => format_tasks(&tasks),
            Err(e) => format!("(unavailable: {e})"),
        };
        let offered = self.mcp.offered().await;
        let mut system = self.system_prompt(&tasks);
        if !self.mcp.builtin() {
            system.push_str("\n\nIn this session the workspace tools (list_files, read_file, write_file) are not available.");
        }
        if !offered.is_empty() {
            system.push_str("\n\nMore tools, named server__tool, come from MCP servers; their descriptions say what they do.");
        }
        let mut messages = vec![Message::text("system", system)];
        messages.extend(self.transcript.iter().flatten().cloned());
        messages.extend(step_messages.iter().cloned());
        let mut tools = builtin_tools(self.mcp.builtin());
        tools.extend(offered.iter().map(mcp_tool_spec));
        (messages, tools)
    }

    /// The chat request for the step, its answer capped at `max_tokens`.
    fn chat_request(
        &self,
        messages: Vec<Message>,
        tools: Vec<ToolSpec>,
        max_tokens: u64,
    ) -> ChatRequest {
        ChatRequest {
            model: self.model.clone(),
            messages,
            tools,
            max_tokens,
            max_completion_tokens: Some(max_tokens),
            temperature: self.temperature,
            top_p: None,
        }
    }

    /// Takes the model's answer into the step: every call gets an id, the
    /// tokens are counted, and the answer joins the step's messages.
    /// Returns its calls and its text.
    fn take_answer(
        &mut self,
        mut assistant: Message,
        iteration: u64,
        usage: &TokenUsage,
        prompt_tokens: u64,
        step_messages: &mut Vec<Message>,
    ) -> (Vec<ToolCall>, String) {
        assistant.role = "assistant".into();
        for (i, call) in assistant.tool_calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{}_{i}", iteration);
            }
        }
        let calls = assistant.tool_calls.clone();
        let message_text = assistant.content.clone().unwrap_or_default();
        self.step_tokens = usage.total;
        // Spent, and reported only with the step's answer (tools may still
        // keep it waiting).
        self.unreported = usage.total.max(prompt_tokens);
        step_messages.push(assistant);
        (calls, message_text)
    }

    /// Runs the answer's calls up to the per-step limit; each result joins
    /// the step's messages unless the call waits for a person.
    async fn run_calls(
        &self,
        iteration: u64,
        calls: &[ToolCall],
        message_text: &str,
        ran: &mut ToolsRun,
        step_messages: &mut Vec<Message>,
    ) {
        let executed = calls.len().min(self.max_tool_calls);
        if executed < calls.len() {
            ran.events.push(SessionEvent::ToolCallsLimited {
                requested: calls.len(),
                executed,
                limit: self.max_tool_calls,
            });
        }
        ran.executed = executed;
        for (index, call) in calls.iter().enumerate() {
            let outcome = if index < executed {
                let span = tool_span(call);
                let outcome = self
                    .run_tool(iteration, index as u32, call, message_text)
                    .instrument(span.clone())
                    .await;
                record_tool(&span, call, &outcome);
                outcome
            } else {
                ToolOutcome::error(over_tool_call_limit(self.max_tool_calls))
            };
            ran.observations
                .push(format!("{}: {}", call.function.name, outcome.content));
            // A call that waits is answered in the step after the decision.
            if !outcome.awaiting {
                step_messages.push(Message::tool_result(&call.id, outcome.content.clone()));
            }
            if outcome.failed {
                ran.failed
                    .push(format!("{}: {}", call.function.name, outcome.content));
            }
            ran.files.extend(outcome.file);
            ran.events.extend(outcome.event);
            // A call waiting for a person outranks other signals of the
            // step: nothing may end the session past an open question;
            // waiting for children outranks a claim of being done.
            let waits_for_children = outcome
                .signal
                .as_ref()
                .is_some_and(|s| s.kind == SignalKind::WaitingForChildren);
            let awaits_person = ran
                .signal
                .as_ref()
                .is_some_and(|s: &Sentinel| s.kind == SignalKind::ApprovalRequired);
            if outcome.awaiting || ran.signal.is_none() || (waits_for_children && !awaits_person) {
                ran.signal = outcome.signal.or(ran.signal.take());
            }
        }
    }

    /// Keeps the step in the conversation: this step held to the output
    /// cap, the step before it, no longer the newest, to a few KiB per
    /// message. Returns the step as kept, for the record.
    fn keep_step(&mut self, mut step_messages: Vec<Message>) -> Option<Vec<Message>> {
        cap_step(&mut step_messages, self.max_output_bytes);
        let transcript = Some(step_messages.clone());
        if let Some(previous) = self.transcript.back_mut() {
            slim_step(previous);
        }
        self.transcript.push_back(step_messages);
        while self.transcript.len() > TRANSCRIPT_STEPS {
            self.transcript.pop_front();
        }
        transcript
    }

    /// Context cycles: at 80 % of the budget the agent gets a few turns to
    /// wrap up; then the cycle is summarised into memory and restarted.
    /// Returns the step's tokens (the summary's included), whether the
    /// window overflowed, and the new cycle if one began.
    async fn advance_cycle(
        &mut self,
        usage: &TokenUsage,
        no_calls: bool,
        events: &mut Vec<SessionEvent>,
    ) -> (u64, bool, Option<CycleChange>) {
        let mut tokens = usage.total;
        let mut context_overflow = false;
        let mut cycle_change = None;
        match self.wrap_up_left {
            None if usage.prompt.saturating_mul(5) >= self.context_budget.saturating_mul(4) => {
                self.wrap_up_left = Some(WRAP_UP_TURNS);
                context_overflow = true;
                events.push(SessionEvent::ContextWrapUp {
                    cycle: self.cycle,
                    prompt_tokens: usage.prompt,
                    context_budget_tokens: self.context_budget,
                });
            }
            None => {}
            Some(left) => {
                let left = left.saturating_sub(1);
                self.wrap_up_left = Some(left);
                if left == 0 || no_calls {
                    match self.next_cycle().await {
                        Ok((change, summary_tokens)) => {
                            tokens = tokens.saturating_add(summary_tokens);
                            events.push(SessionEvent::CycleStarted {
                                cycle: change.cycle,
                                memory_chars: change.memory.chars().count(),
                            });
                            cycle_change = Some(change);
                        }
                        Err(e) => {
                            // Try again after the next step rather than lose the cycle.
                            self.wrap_up_left = Some(1);
                            events.push(SessionEvent::CycleSummaryFailed {
                                cycle: self.cycle,
                                error: e,
                            });
                        }
                    }
                }
            }
        }
        (tokens, context_overflow, cycle_change)
    }
}

impl LlmExecutor {
    /// A failed model call: an error step when decided calls were answered
    /// before it, else the executor's error.
    fn model_call_failed(
        &mut self,
        error: String,
        step_messages: Vec<Message>,
        carried: &[(String, ToolOutcome)],
        called: std::time::Instant,
    ) -> Result<StepResult, ExecutorError> {
        if !carried.is_empty() {
            // Decided calls already answered are kept in the conversation,
            // so the next step does not answer them again.
            return Ok(self.model_failed_after_decisions(error, step_messages, carried, called));
        }
        Err(ExecutorError::Failed {
            action: "model_call".into(),
            message: error,
            tokens: 0,
        })
    }

    /// A step whose model call failed after decided calls were answered:
    /// an error step that keeps those answers in the conversation.
    fn model_failed_after_decisions(
        &mut self,
        error: String,
        mut step_messages: Vec<Message>,
        carried: &[(String, ToolOutcome)],
        called: std::time::Instant,
    ) -> StepResult {
        let observation = carried
            .iter()
            .map(|(tool, o)| format!("{tool}: {}", o.content))
            .collect::<Vec<_>>()
            .join("\n");
        cap_step(&mut step_messages, self.max_output_bytes);
        if let Some(previous) = self.transcript.back_mut() {
            slim_step(previous);
        }
        self.transcript.push_back(step_messages.clone());
        while self.transcript.len() > TRANSCRIPT_STEPS {
            self.transcript.pop_front();
        }
        StepResult::Step(Box::new(StepOutput {
            outcome: Outcome::Error,
            observation,
            error: Some(format!("model_call: {error}")),
            tool_calls: carried.len() as u64,
            files_written: carried.iter().filter_map(|(_, o)| o.file.clone()).collect(),
            transcript: Some(step_messages),
            model_latency: Some(called.elapsed()),
            ..StepOutput::simple("model_call", "")
        }))
    }
}

/// A step of the conversation as kept once a newer step follows it: each
/// text (content, call arguments) an excerpt of a few KiB, so the kept
/// conversation stays bounded however much earlier steps read or said.
fn slim_step(messages: &mut [Message]) {
    for m in messages {
        if let Some(c) = m.content.as_mut()
            && let std::borrow::Cow::Owned(e) = excerpt::conversation_excerpt(c)
        {
            *c = e;
        }
        for call in &mut m.tool_calls {
            if let std::borrow::Cow::Owned(e) =
                excerpt::conversation_excerpt(&call.function.arguments)
            {
                call.function.arguments = e;
            }
        }
    }
}

/// The newest step of the conversation held to `cap` bytes per text.
fn cap_step(messages: &mut [Message], cap: usize) {
    for m in messages {
        if let Some(c) = m.content.as_mut()
            && let Some(capped) = excerpt::cap_stored(c, cap)
        {
            *c = capped;
        }
        for call in &mut m.tool_calls {
            if let Some(capped) = excerpt::cap_stored(&call.function.arguments, cap) {
                call.function.arguments = capped;
            }
        }
    }
}

/// The result a tool call beyond the per-step limit gets, so the model
/// learns the limit instead of seeing its calls vanish.
fn over_tool_call_limit(limit: usize) -> String {
    format!(
        "not executed: at most {limit} tool calls of one answer run (WARDEN_MAX_TOOL_CALLS_PER_STEP); \
make the remaining calls in your next answer"
    )
}

impl Executor for LlmExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.step(ctx).boxed()
    }

    fn take_unreported_tokens(&mut self) -> u64 {
        std::mem::take(&mut self.unreported)
    }

    fn model(&self) -> Option<&str> {
        Some(&self.model)
    }

    fn workspace_root(&self) -> Option<&std::path::Path> {
        Some(self.workspace.root())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tools: &[ToolSpec]) -> Vec<String> {
        tools.iter().map(|t| t.function.name.to_string()).collect()
    }

    #[test]
    fn the_workspace_tools_are_offered_only_when_chosen_and_the_controls_always() {
        let with = names(&builtin_tools(true));
        let without = names(&builtin_tools(false));
        for name in WORKSPACE_TOOLS {
            assert!(with.iter().any(|n| n == name), "{name}");
            assert!(!without.iter().any(|n| n == name), "{name}");
        }
        for control in [
            "task_completion",
            "ask_question",
            "converse",
            "task_queue_read",
        ] {
            assert!(without.iter().any(|n| n == control), "{control}");
        }
    }

    fn offered(schema: Value, description: &str) -> OfferedTool {
        OfferedTool {
            function: "fs__read".into(),
            tool: crate::mcp::McpTool {
                server: "fs".into(),
                name: "read".into(),
                description: description.into(),
                input_schema: schema,
                read_only_hint: Some(true),
                destructive_hint: None,
            },
        }
    }

    #[test]
    fn an_mcp_tool_becomes_a_function_with_its_own_schema() {
        let schema = json!({ "type": "object", "properties": { "name": { "type": "string" } },
                             "required": ["name"] });
        let spec = mcp_tool_spec(&offered(schema.clone(), "Read a note"));
        assert_eq!(spec.function.name, "fs__read");
        assert_eq!(spec.function.description, "Read a note");
        assert_eq!(spec.function.parameters, schema);
        // A schema without properties gets an empty set; a description, a default.
        let bare = mcp_tool_spec(&offered(json!({ "type": "object" }), ""));
        assert_eq!(bare.function.parameters["properties"], json!({}));
        assert!(
            bare.function
                .description
                .contains("`read` of the MCP server `fs`")
        );
    }

    #[test]
    fn calls_over_the_per_step_limit_are_answered_with_the_limit() {
        let told = over_tool_call_limit(3);
        assert!(told.starts_with("not executed"), "{told}");
        assert!(told.contains("at most 3 tool calls"), "{told}");
        assert!(told.contains("WARDEN_MAX_TOOL_CALLS_PER_STEP"), "{told}");
    }
}
