//! `warden sessions …` and `warden workers queues`: a running server's
//! sessions and queues over its HTTP API (never the database), as tables
//! and readable lines, or with `--json` the server's answer as it is.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Client, ClientError, ServerArgs};
use super::table;
use super::watch;

/// `warden sessions`: the flags that name the server, and the command.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(subcommand)]
    pub command: SessionsCommand,
}

/// What to do with a running server's sessions.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List sessions, newest first, as a table sized to the terminal
    List(ListArgs),
    /// A session's status as readable lines
    Show {
        /// The session's id
        id: uuid::Uuid,
    },
    /// Follow a session live until it ends: progress, current step, tokens, decisions
    ///
    /// Exit code: 0 when it completed, 3 when it ended otherwise (stopped,
    /// interrupted, failed), 4 when it paused for a person or awaits a
    /// confirmation before it starts, 1 on an error
    /// (the server refused, or could not be reached again after retries).
    Watch(watch::WatchArgs),
    /// Stop a session at once (its step in flight is abandoned, a checkpoint saved)
    Stop {
        /// The session's id
        id: uuid::Uuid,
    },
    /// Pause a session after its step in flight
    Pause {
        /// The session's id
        id: uuid::Uuid,
    },
    /// Resume a paused or ended session from its checkpoint
    Resume {
        /// The session's id
        id: uuid::Uuid,
        /// Guidance for its next iteration
        #[arg(long)]
        guidance: Option<String>,
    },
    /// Approve (or with --reject, reject) a call that waits for a person
    Approve {
        /// The session's id
        id: uuid::Uuid,
        /// The call's id, as `show` lists it (`ITERATION.INDEX`)
        call_id: String,
        /// Reject the call instead of approving it
        #[arg(long)]
        reject: bool,
        /// A message to the agent, given with the call's result
        #[arg(long, alias = "message", value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Confirm a session awaiting confirmation (its estimate was over its
    /// confirm_if_over, or unknown): it starts
    Confirm {
        /// The session's id
        id: uuid::Uuid,
    },
    /// A session and its child sessions, as an indented tree
    Tree {
        /// The session's id
        id: uuid::Uuid,
    },
    /// The files of a session's workspace as of a checkpoint (default the latest)
    Files {
        /// The session's id
        id: uuid::Uuid,
        /// The checkpoint's iteration
        #[arg(long)]
        checkpoint: Option<u64>,
    },
    /// Start a new session from a checkpoint of this one, its workspace as it was then
    Fork {
        /// The session's id
        id: uuid::Uuid,
        /// The checkpoint's iteration
        #[arg(long)]
        checkpoint: u64,
        /// Guidance for the fork's first step
        #[arg(long)]
        guidance: Option<String>,
        /// Another model for an `llm` executor
        #[arg(long)]
        model: Option<String>,
    },
}

/// `warden sessions list`'s filters (the list endpoint's query).
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only sessions in this status (running, paused, completed, …)
    #[arg(long)]
    pub status: Option<String>,
    /// Only this tenant's sessions (a global admin key's filter)
    #[arg(long, value_parser = super::tenant_name)]
    pub tenant: Option<String>,
    /// How many sessions, 1 to 200
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=200))]
    pub limit: u16,
    /// Top-level sessions only (no children)
    #[arg(long)]
    pub root_only: bool,
}

/// `warden workers`: the flags that name the server, and the command.
#[derive(Debug, Args)]
pub struct WorkersArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(subcommand)]
    pub command: WorkersCommand,
}

/// What to see of the workers.
#[derive(Debug, Subcommand)]
pub enum WorkersCommand {
    /// The queues: waiting tasks, the oldest one's age, the workers seen
    Queues,
}

/// Runs `warden sessions …`.
pub async fn run(args: SessionsArgs) -> ExitCode {
    let json = args.server.json;
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    if let SessionsCommand::Watch(watch) = args.command {
        return watch::run(&client, watch, json).await;
    }
    let answer = sessions_answer(&client, &args.command).await;
    finish(answer, json, |doc| render(&args.command, doc))
}

/// Runs `warden workers queues`.
pub async fn run_workers(args: WorkersArgs) -> ExitCode {
    let json = args.server.json;
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    let WorkersCommand::Queues = args.command;
    let answer = client.get("api/workers/queues", &[]).await;
    finish(answer, json, queues_table)
}

/// The server's answer to `command` (not `watch`).
async fn sessions_answer(client: &Client, command: &SessionsCommand) -> Result<Value, ClientError> {
    let path = |id: &uuid::Uuid, tail: &str| format!("api/autonomous/{id}{tail}");
    match command {
        SessionsCommand::List(list) => client.get("api/autonomous", &list_query(list)).await,
        SessionsCommand::Show { id } => client.get(&path(id, ""), &[]).await,
        SessionsCommand::Tree { id } => client.get(&path(id, "/tree"), &[]).await,
        SessionsCommand::Stop { id } => client.post(&path(id, "/stop"), None).await,
        SessionsCommand::Pause { id } => client.post(&path(id, "/pause"), None).await,
        SessionsCommand::Confirm { id } => client.post(&path(id, "/confirm"), None).await,
        SessionsCommand::Resume { id, guidance } => {
            let body = guidance.as_ref().map(|g| json!({ "guidance": g }));
            client.post(&path(id, "/resume"), body.as_ref()).await
        }
        SessionsCommand::Approve {
            id,
            call_id,
            reject,
            reason,
        } => {
            let decision = if *reject { "reject" } else { "approve" };
            let mut body = json!({ "decision": decision });
            if let Some(reason) = reason {
                body["message"] = json!(reason);
            }
            let call = url::form_urlencoded::byte_serialize(call_id.as_bytes()).collect::<String>();
            client
                .post(&path(id, &format!("/approvals/{call}")), Some(&body))
                .await
        }
        SessionsCommand::Files { id, checkpoint } => {
            let query: Vec<(&'static str, String)> = checkpoint
                .map(|n| vec![("checkpoint", n.to_string())])
                .unwrap_or_default();
            client.get(&path(id, "/files"), &query).await
        }
        SessionsCommand::Fork {
            id,
            checkpoint,
            guidance,
            model,
        } => {
            let mut body = json!({ "checkpoint_iteration": checkpoint });
            if let Some(g) = guidance {
                body["guidance"] = json!(g);
            }
            if let Some(m) = model {
                body["model"] = json!(m);
            }
            client.post(&path(id, "/fork"), Some(&body)).await
        }
        SessionsCommand::Watch(_) => Err(ClientError::Invalid("watch is run apart".into())),
    }
}

/// The list endpoint's query for `list`'s flags.
fn list_query(list: &ListArgs) -> Vec<(&'static str, String)> {
    let mut query = vec![("limit", list.limit.to_string())];
    if let Some(status) = &list.status {
        query.push(("status", status.clone()));
    }
    if let Some(tenant) = &list.tenant {
        query.push(("tenant", tenant.clone()));
    }
    if list.root_only {
        query.push(("root_only", "true".into()));
    }
    query
}

/// The text of `command`'s answer `doc`.
fn render(command: &SessionsCommand, doc: &Value) -> String {
    match command {
        SessionsCommand::List(_) => list_table(doc, table::terminal_width()),
        SessionsCommand::Tree { .. } => tree_lines(doc),
        SessionsCommand::Files { .. } => file_lines(doc),
        _ => status_lines(doc),
    }
}

/// Prints the answer (as JSON or as `text` makes it) and says the exit code.
fn finish(
    answer: Result<Value, ClientError>,
    json: bool,
    text: impl FnOnce(&Value) -> String,
) -> ExitCode {
    match answer {
        Ok(doc) if json => print_out(&format!("{doc:#}\n")),
        Ok(doc) => print_out(&text(&doc)),
        Err(err) => failed(&err),
    }
}

/// Writes `text` to stdout; a closed pipe is exit 1, not a panic.
pub(super) fn print_out(text: &str) -> ExitCode {
    super::write_out("sessions", text.as_bytes())
}

/// Prints `err` to stderr; exit 1.
pub(super) fn failed(err: &ClientError) -> ExitCode {
    eprintln!("warden: {err}");
    ExitCode::FAILURE
}

/// A string field of `doc` (empty when absent or null).
pub(super) fn text<'a>(doc: &'a Value, name: &str) -> &'a str {
    doc.get(name).and_then(Value::as_str).unwrap_or("")
}

/// A number field of `doc` (0 when absent).
pub(super) fn number(doc: &Value, name: &str) -> i64 {
    doc.get(name).and_then(Value::as_i64).unwrap_or(0)
}

/// `status` or `status/reason`.
pub(super) fn status_reason(doc: &Value) -> String {
    match text(doc, "reason") {
        "" => text(doc, "status").to_string(),
        reason => format!("{}/{reason}", text(doc, "status")),
    }
}

/// The session page as a table: the goal takes what the terminal has left.
pub(super) fn list_table(page: &Value, width: usize) -> String {
    let now = chrono::Utc::now();
    let items = page.get("items").and_then(Value::as_array);
    let rows: Vec<Vec<String>> = items
        .into_iter()
        .flatten()
        .map(|s| {
            vec![
                text(s, "id").to_string(),
                text(s, "status").to_string(),
                text(s, "reason").to_string(),
                number(s, "iterations").to_string(),
                table::tokens(number(s, "tokens_used")),
                table::age(s.get("created_at").and_then(Value::as_str), now),
                text(s, "goal").to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no sessions\n".into();
    }
    let headers = ["ID", "STATUS", "REASON", "ITER", "TOKENS", "AGE", "GOAL"];
    let mut out = table::render(&headers, &rows, width);
    if let Some(cursor) = page.get("next_cursor").and_then(Value::as_str) {
        out.push_str(&format!(
            "(more: the next page starts at cursor {cursor})\n"
        ));
    }
    out
}

/// A session's status as `label  value` lines.
pub(super) fn status_lines(s: &Value) -> String {
    let limits = s.get("limits").cloned().unwrap_or(Value::Null);
    let mut lines = vec![
        (
            "session",
            format!("{}  (tenant {})", text(s, "id"), text(s, "tenant")),
        ),
        ("status", status_reason(s)),
        ("goal", table::fit(text(s, "goal"), 200)),
        ("iterations", progress_of(s, &limits)),
        ("tokens", tokens_of(s, &limits)),
        ("elapsed", elapsed_of(s)),
        ("executor", executor_of(s)),
    ];
    lines.extend(forked_from_of(s).map(|f| ("forked from", f)));
    lines.extend(step_of(s).map(|step| ("step", step)));
    lines.extend(waiting_of(s).map(|w| ("waiting", w)));
    lines.extend(requested_of(s).map(|r| ("requested", r)));
    lines.extend(warnings_of(s).map(|w| ("warnings", w)));
    lines.extend(confirmation_of(s).map(|c| ("confirm", c)));
    if !text(s, "summary").is_empty() {
        lines.push(("summary", text(s, "summary").to_string()));
    }
    let mut out: String = lines
        .iter()
        .map(|(label, value)| format!("{label:<11} {value}\n"))
        .collect();
    out.push_str(&list_section(
        s,
        "pending_approvals",
        "pending approvals",
        approval_line,
    ));
    out.push_str(&list_section(
        s,
        "children_needing_attention",
        "children needing attention",
        attention_line,
    ));
    out.push_str(&list_section(s, "next_steps", "next steps", |v| {
        v.as_str().unwrap_or_default().to_string()
    }));
    out
}

/// `iterations / max` with percent complete when known.
fn progress_of(s: &Value, limits: &Value) -> String {
    let mut out = format!(
        "{} / {}",
        number(s, "iterations"),
        number(limits, "max_iterations")
    );
    if let Some(p) = s.get("percent_complete").and_then(Value::as_f64) {
        out.push_str(&format!("  ({p:.0}% complete)"));
    }
    out
}

/// `used / budget` tokens, with the cost when priced.
fn tokens_of(s: &Value, limits: &Value) -> String {
    let mut out = format!(
        "{} / {}",
        number(s, "tokens_used"),
        number(limits, "max_tokens")
    );
    if let Some(cost) = s.get("cost_usd").and_then(Value::as_str) {
        out.push_str(&format!("  (${cost}"));
        match s.get("unpriced_steps").and_then(Value::as_u64) {
            Some(n) if n > 0 => out.push_str(&format!(", {n} steps unpriced)")),
            _ => out.push(')'),
        }
    }
    out
}

/// Elapsed running time, and the ETA when the status has one.
fn elapsed_of(s: &Value) -> String {
    let elapsed = u64::try_from(number(s, "elapsed_ms")).unwrap_or(0) / 1000;
    let mut out = table::duration(elapsed);
    if let Some(eta) = s.get("eta_seconds").and_then(Value::as_f64) {
        out.push_str(&format!("  (eta {})", table::duration(eta.max(0.0) as u64)));
    }
    out
}

/// The executor's kind, with its model or queue.
fn executor_of(s: &Value) -> String {
    let executor = s.get("executor").cloned().unwrap_or(Value::Null);
    let detail = [("model", "model"), ("queue", "queue")]
        .iter()
        .find_map(|(field, label)| {
            executor
                .get(*field)
                .and_then(Value::as_str)
                .map(|v| format!(" ({label} {v})"))
        })
        .unwrap_or_default();
    format!("{}{detail}", text(&executor, "kind"))
}

/// The step in flight: its iteration, action and time so far.
pub(super) fn step_of(s: &Value) -> Option<String> {
    let step = s.get("current_step").filter(|v| v.is_object())?;
    let action = match text(step, "action") {
        "" => String::new(),
        action => format!(" {action}"),
    };
    let secs = u64::try_from(number(step, "elapsed_ms")).unwrap_or(0) / 1000;
    Some(format!(
        "iteration {}{action}, {} so far",
        number(step, "iteration"),
        table::duration(secs)
    ))
}

/// Why a session waits: on a worker's queue, or in the queue to start.
fn waiting_of(s: &Value) -> Option<String> {
    if let Some(w) = s.get("waiting_for_worker").filter(|v| v.is_object()) {
        return Some(format!(
            "since {}: {}",
            text(w, "since"),
            text(w, "message")
        ));
    }
    if let Some(needs) = s
        .pointer("/waiting_for_replica/capabilities")
        .and_then(Value::as_array)
    {
        let needs: Vec<&str> = needs.iter().filter_map(Value::as_str).collect();
        return Some(format!("for a replica with {}", needs.join(", ")));
    }
    let position = s.get("queue_position").and_then(Value::as_i64)?;
    Some(format!("to start: {position} in its tenant's queue"))
}

/// What a session awaiting confirmation waits on: why, its estimate and
/// when it expires (`warden sessions confirm ID` starts it).
fn confirmation_of(s: &Value) -> Option<String> {
    if text(s, "status") != "awaiting_confirmation" {
        return None;
    }
    let c = s.get("confirmation").filter(|v| v.is_object())?;
    let over: Vec<&str> = c
        .get("over")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let e = c.get("estimate").cloned().unwrap_or(Value::Null);
    let figures = if text(&e, "basis") == "none" {
        "no history to estimate from".to_string()
    } else {
        let minutes = |q: &str| {
            e.pointer(&format!("/duration_ms/{q}"))
                .and_then(Value::as_u64)
                .map_or(0, |ms| ms.div_ceil(60_000))
        };
        let cost = match e.get("cost_usd").filter(|v| v.is_object()) {
            Some(cost) => format!("${}–${}", text(cost, "p50"), text(cost, "p90")),
            None => "cost unknown".into(),
        };
        format!("p50–p90 {cost}, {}–{} min", minutes("p50"), minutes("p90"))
    };
    Some(format!(
        "over {} ({figures}); expires {}; run `warden sessions confirm {}`",
        over.join(", "),
        text(c, "expires_at"),
        text(s, "id")
    ))
}

/// The soft-budget warnings sent so far, each budget at the highest
/// threshold it crossed: `tokens 80%, iterations 50%`.
fn warnings_of(s: &Value) -> Option<String> {
    let mut highest: Vec<(String, u64)> = Vec::new();
    for w in s.get("budget_warnings")?.as_array()? {
        let budget = text(w, "budget").replace('_', " ");
        let threshold = w.get("threshold").and_then(Value::as_u64).unwrap_or(0);
        match highest.iter_mut().find(|(b, _)| *b == budget) {
            Some(entry) => entry.1 = entry.1.max(threshold),
            None => highest.push((budget, threshold)),
        }
    }
    (!highest.is_empty()).then(|| {
        highest
            .iter()
            .map(|(budget, threshold)| format!("{budget} {threshold}%"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// A stop or pause asked for that has not landed yet.
fn requested_of(s: &Value) -> Option<String> {
    let asked = |name: &str| s.get(name).and_then(Value::as_bool) == Some(true);
    if asked("stop_requested") {
        return Some(match text(s, "stop_lands_by") {
            "" => "stop (not landed yet)".to_string(),
            by => format!("stop (lands by {by})"),
        });
    }
    asked("pause_requested").then(|| "pause (after the step in flight)".to_string())
}

/// A titled list of `field`'s items, one line each; nothing when empty.
fn list_section(s: &Value, field: &str, title: &str, line: impl Fn(&Value) -> String) -> String {
    let items = s.get(field).and_then(Value::as_array);
    match items {
        Some(items) if !items.is_empty() => {
            let lines: String = items.iter().map(|i| format!("  - {}\n", line(i))).collect();
            format!("{title}:\n{lines}")
        }
        _ => String::new(),
    }
}

/// A waiting call: its id, tool and why.
fn approval_line(a: &Value) -> String {
    format!(
        "{}  {}  {}",
        text(a, "call_id"),
        text(a, "tool"),
        table::fit(text(a, "reason"), 100)
    )
}

/// A descendant that waits for a person.
fn attention_line(c: &Value) -> String {
    format!(
        "{}  {}  {}",
        text(c, "child_id"),
        text(c, "reason"),
        table::fit(text(c, "goal"), 80)
    )
}

/// `<session> at iteration <n>` when the session is a fork.
fn forked_from_of(s: &Value) -> Option<String> {
    let from = s.get("forked_from").filter(|f| f.is_object())?;
    Some(format!(
        "{} at iteration {}",
        text(from, "session_id"),
        number(from, "iteration")
    ))
}

/// The tree as indented lines under its totals.
pub(super) fn tree_lines(doc: &Value) -> String {
    let totals = doc.get("totals").cloned().unwrap_or(Value::Null);
    let mut out = format!(
        "{} sessions ({} live), {} iterations, {} tokens\n",
        number(&totals, "sessions"),
        number(&totals, "live"),
        number(&totals, "iterations"),
        table::tokens(number(&totals, "tokens_used")),
    );
    if let Some(node) = doc.get("node") {
        node_lines(node, 0, &mut out);
    }
    out
}

/// Deepest level drawn; a deeper tree is cut with `…`.
const MAX_TREE_DEPTH: usize = 32;

/// One node and, indented below it, its children.
fn node_lines(node: &Value, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    if depth > MAX_TREE_DEPTH {
        out.push_str(&format!("{indent}…\n"));
        return;
    }
    let fork_mark = forked_from_of(node)
        .map(|f| format!("  [fork of {f}]"))
        .unwrap_or_default();
    out.push_str(&format!(
        "{indent}{}  {}  it {}  tokens {}/{}  {}{fork_mark}\n",
        text(node, "id"),
        status_reason(node),
        number(node, "iterations"),
        table::tokens(number(node, "tokens_used")),
        table::tokens(number(node, "max_tokens")),
        table::fit(text(node, "goal"), 60),
    ));
    for fork in node
        .get("forks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "{indent}  ⑂ fork {}  {}  from iteration {}\n",
            text(fork, "id"),
            text(fork, "status"),
            number(fork, "iteration"),
        ));
    }
    for child in node
        .get("children")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        node_lines(child, depth + 1, out);
    }
}

/// The queues as a table.
pub(super) fn queues_table(doc: &Value) -> String {
    let queues = doc.get("queues").and_then(Value::as_array);
    let rows: Vec<Vec<String>> = queues
        .into_iter()
        .flatten()
        .map(|q| {
            let workers: Vec<&str> = q
                .get("workers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|w| text(w, "worker"))
                .collect();
            let oldest = q.get("oldest_task_age_ms").and_then(Value::as_u64);
            vec![
                text(q, "tenant").to_string(),
                text(q, "queue").to_string(),
                number(q, "depth").to_string(),
                oldest.map_or("-".into(), |ms| table::duration(ms / 1000)),
                workers.join(", "),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no queues (no waiting task, no worker seen in the last two minutes)\n".into();
    }
    let headers = ["TENANT", "QUEUE", "WAITING", "OLDEST", "WORKERS"];
    table::render(&headers, &rows, table::terminal_width())
}

/// A workspace listing: one file a line (size, last changed, path), then
/// the snapshots there are.
fn file_lines(doc: &Value) -> String {
    let Some(at) = doc["checkpoint"].as_i64() else {
        return "no workspace snapshot yet\n".into();
    };
    let mut out = format!("workspace as of checkpoint {at}\n");
    for f in doc["files"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:>10}  it {:>5}  {}\n",
            f["size"].as_i64().unwrap_or(0),
            f["modified_iteration"].as_i64().unwrap_or(0),
            f["path"].as_str().unwrap_or("")
        ));
    }
    let snapshots: Vec<String> = doc["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .map(|n| n.to_string())
        .collect();
    out.push_str(&format!(
        "{} bytes; checkpoints with a snapshot: {}\n",
        doc["total_bytes"].as_i64().unwrap_or(0),
        snapshots.join(" ")
    ));
    out
}
