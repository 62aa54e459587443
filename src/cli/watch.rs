//! `warden sessions watch ID`: follows a session's event stream until the
//! session ends. On a terminal a progress line (iterations against the
//! limit with the ETA, the step in flight, tokens against the budget) is
//! redrawn every second under the events as they happen; elsewhere each
//! event is a line and progress is printed at each iteration. A dropped
//! connection is resumed with `Last-Event-ID` (nothing lost, nothing
//! repeated), a bounded number of times in a row with backoff.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::client::{Client, ClientError};
use super::sessions::{failed, number, status_lines, status_reason, step_of, text};
use super::sse::{Frame, Parser};
use super::table;

/// `warden sessions watch`'s arguments.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The session's id
    pub id: uuid::Uuid,
    /// Print the session's log from its first event (default: from now on)
    #[arg(long)]
    pub replay: bool,
    /// Reconnections in a row without an event before giving up
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=50))]
    pub retries: u32,
}

/// Exit code of a session that ended other than completed.
const ENDED_OTHERWISE: u8 = 3;
/// Exit code of a session that paused for a person.
const PAUSED: u8 = 4;
/// How often the progress line is redrawn (and the status read) on a terminal.
const REDRAW: Duration = Duration::from_secs(1);
/// A stream silent this long (the server sends a keep-alive every 15 s) is dropped.
const SILENCE: Duration = Duration::from_secs(45);
/// First wait before a reconnection; doubled each time, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait before a reconnection.
const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// How often a queued session's status is read while it waits to start.
const QUEUED_POLL: Duration = Duration::from_secs(1);

/// Why one connection of the stream ended early.
enum Break {
    /// Worth reconnecting: the connection dropped, the server was busy.
    Dropped(ClientError),
    /// Not worth it: the server refused (no such session, a bad key).
    Fatal(ClientError),
}

/// One watch: the session's latest status and how far its log was read.
struct Watcher<'a> {
    client: &'a Client,
    path: String,
    status: Value,
    last_id: Option<i64>,
    json: bool,
    tty: bool,
    drawn: bool,
}

/// Runs `warden sessions watch`.
pub async fn run(client: &Client, args: WatchArgs, json: bool) -> ExitCode {
    let path = format!("api/autonomous/{}", args.id);
    let status = match client.get(&path, &[]).await {
        Ok(status) => status,
        Err(err) => return failed(&err),
    };
    let last_id = (!args.replay).then(|| number(&status, "last_event_seq"));
    let mut watcher = Watcher {
        client,
        path,
        status,
        last_id,
        json,
        tty: std::io::stdout().is_terminal(),
        drawn: false,
    };
    match watcher.follow_to_end(args.retries).await {
        Ok(()) => watcher.finish(),
        Err(err) => {
            watcher.clear_line();
            failed(&err)
        }
    }
}

impl Watcher<'_> {
    /// Follows the stream, reconnecting, until the session ended and its
    /// log was read to its last event.
    async fn follow_to_end(&mut self, retries: u32) -> Result<(), ClientError> {
        let mut failures = 0u32;
        loop {
            if self.ended() && self.caught_up() {
                return Ok(());
            }
            if text(&self.status, "status") == "queued" {
                self.draw();
                tokio::time::sleep(QUEUED_POLL).await;
                self.refresh().await?;
                continue;
            }
            let before = self.last_id;
            let outcome = self.follow().await;
            let progressed = self.last_id != before;
            let err = match outcome {
                Err(Break::Fatal(err)) => return Err(err),
                Err(Break::Dropped(err)) => err,
                Ok(()) => {
                    self.refresh().await?;
                    if self.ended() || progressed || text(&self.status, "status") == "queued" {
                        failures = 0;
                        continue;
                    }
                    ClientError::Transport("the stream ended while the session runs".into())
                }
            };
            failures = if progressed { 1 } else { failures + 1 };
            if failures > retries {
                return Err(gave_up(err, retries));
            }
            self.note(&format!("connection lost ({err}); reconnecting"));
            tokio::time::sleep(backoff(failures)).await;
            // The server may be the one that went away: its status is read
            // again with the reconnection, not before it.
            let _ = self.refresh().await;
        }
    }

    /// One connection: its events until it ends, drops or goes silent.
    async fn follow(&mut self) -> Result<(), Break> {
        let stream_path = format!("{}/events", self.path);
        let mut response = match self.client.stream(&stream_path, self.last_id).await {
            Ok(response) => response,
            Err(err) => return Err(classify(err)),
        };
        let mut parser = Parser::default();
        let mut tick = tokio::time::interval(REDRAW);
        let mut heard = Instant::now();
        loop {
            tokio::select! {
                chunk = response.chunk() => match chunk {
                    Ok(Some(bytes)) => {
                        heard = Instant::now();
                        let frames = parser.push(&bytes).map_err(|e| Break::Dropped(ClientError::Invalid(e)))?;
                        frames.into_iter().for_each(|f| self.on_frame(f));
                    }
                    Ok(None) => return Ok(()),
                    Err(err) => return Err(Break::Dropped(super::client::transport(&err))),
                },
                _ = tick.tick() => {
                    if heard.elapsed() > SILENCE {
                        return Err(Break::Dropped(ClientError::Transport("the stream went silent".into())));
                    }
                    if self.tty && !self.json {
                        let _ = self.refresh().await;
                        self.draw();
                    }
                }
            }
        }
    }

    /// Reads the session's status again.
    async fn refresh(&mut self) -> Result<(), ClientError> {
        self.status = self.client.get(&self.path, &[]).await?;
        Ok(())
    }

    /// Whether the session is where a watch ends: ended, paused for a
    /// person, or awaiting a person's confirmation before it starts.
    fn ended(&self) -> bool {
        matches!(
            text(&self.status, "status"),
            "completed" | "stopped" | "interrupted" | "failed" | "paused" | "awaiting_confirmation"
        )
    }

    /// Whether every event the status counts was read.
    fn caught_up(&self) -> bool {
        self.last_id.unwrap_or(0) >= number(&self.status, "last_event_seq")
    }

    /// Prints one event and moves the resume point past it.
    fn on_frame(&mut self, frame: Frame) {
        if let Some(id) = frame.id.as_deref().and_then(|id| id.parse::<i64>().ok()) {
            self.last_id = Some(id);
        }
        let event: Value = serde_json::from_str(&frame.data).unwrap_or(Value::Null);
        if self.json {
            self.line(&format!("{event}"));
            return;
        }
        let kind = frame.event.as_deref().unwrap_or("message");
        self.absorb(kind, &event);
        if routine(kind, &event) {
            return;
        }
        let seq = frame.id.as_deref().unwrap_or("-");
        let width = table::terminal_width();
        self.note(&table::fit(
            &format!("#{seq} {kind}: {}", describe(kind, &event)),
            width,
        ));
        if kind == "iteration_completed" && !self.tty {
            self.line(&progress_line(&self.status, usize::MAX));
        }
    }

    /// Keeps the figures an iteration reports, so the progress is current
    /// without reading the status.
    fn absorb(&mut self, kind: &str, event: &Value) {
        let data = event.get("data").cloned().unwrap_or(Value::Null);
        if kind == "iteration_completed" {
            for (from, to) in [("number", "iterations"), ("tokens_used", "tokens_used")] {
                if let Some(v) = data.get(from).filter(|v| v.is_number()) {
                    self.status[to] = v.clone();
                }
            }
            if let Some(p) = data.get("percent_complete").filter(|v| v.is_number()) {
                self.status["percent_complete"] = p.clone();
            }
            // The step and the ETA the status gave are past: a terminal's
            // next redraw reads them again.
            self.status["current_step"] = Value::Null;
            self.status["eta_seconds"] = Value::Null;
        } else if kind == "status_changed"
            && let Some(to) = data.get("to").filter(|v| v.is_string())
        {
            self.status["status"] = to.clone();
        }
    }

    /// Prints a line above the progress line.
    fn note(&mut self, text: &str) {
        if self.json {
            eprintln!("{text}");
            return;
        }
        self.clear_line();
        self.line(text);
        self.draw();
    }

    /// Prints a line to stdout (a closed pipe is ignored: the watch ends
    /// with the session all the same).
    fn line(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }

    /// Redraws the progress line (on a terminal only).
    fn draw(&mut self) {
        if !self.tty || self.json {
            return;
        }
        let width = table::terminal_width().saturating_sub(1);
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{}", progress_line(&self.status, width))
            .and_then(|()| out.flush());
        self.drawn = true;
    }

    /// Takes the progress line away.
    fn clear_line(&mut self) {
        if self.drawn {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K").and_then(|()| out.flush());
            self.drawn = false;
        }
    }

    /// Prints how the session ended; the exit code says it too.
    fn finish(&mut self) -> ExitCode {
        self.clear_line();
        if !self.json {
            self.line(status_lines(&self.status).trim_end());
        }
        match text(&self.status, "status") {
            "completed" => ExitCode::SUCCESS,
            "paused" | "awaiting_confirmation" => ExitCode::from(PAUSED),
            _ => ExitCode::from(ENDED_OTHERWISE),
        }
    }
}

/// A refusal (4xx but 408 and 429) ends the watch; anything else is retried.
fn classify(err: ClientError) -> Break {
    match err {
        ClientError::Problem { status, .. }
            if (400..500).contains(&status) && status != 408 && status != 429 =>
        {
            Break::Fatal(err)
        }
        ClientError::Invalid(_) => Break::Fatal(err),
        _ => Break::Dropped(err),
    }
}

/// The error a watch ends with after `retries` failed reconnections.
fn gave_up(err: ClientError, retries: u32) -> ClientError {
    ClientError::Transport(format!(
        "gave up after {retries} reconnections without an event: {err}"
    ))
}

/// The wait before the `failures`-th reconnection in a row.
pub(super) fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(10));
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

/// The progress line, cut to `width`: status, a bar of iterations against
/// the limit, the ETA, the step in flight and tokens against the budget.
pub(super) fn progress_line(s: &Value, width: usize) -> String {
    let limits = s.get("limits").cloned().unwrap_or(Value::Null);
    let (done, max) = (number(s, "iterations"), number(&limits, "max_iterations"));
    let fraction = match s.get("percent_complete").and_then(Value::as_f64) {
        Some(p) => p / 100.0,
        None if max > 0 => done as f64 / max as f64,
        None => 0.0,
    };
    let mut parts = vec![
        status_reason(s),
        format!("{} {done}/{max} it", table::bar(fraction, 20)),
    ];
    if let Some(eta) = s.get("eta_seconds").and_then(Value::as_f64) {
        parts.push(format!("eta {}", table::duration(eta.max(0.0) as u64)));
    }
    parts.push(format!(
        "tokens {}/{}",
        table::tokens(number(s, "tokens_used")),
        table::tokens(number(&limits, "max_tokens"))
    ));
    parts.extend(step_of(s).map(|step| format!("step: {step}")));
    table::fit(&parts.join("  "), width)
}

/// An event not worth a line of text: the gate letting a step go on
/// (`--json` prints it all the same).
fn routine(kind: &str, event: &Value) -> bool {
    kind == "gate_decision" && event.pointer("/data/decision/decision") == Some(&json!("continue"))
}

/// One event as a short line of text.
pub(super) fn describe(kind: &str, event: &Value) -> String {
    let d = event.get("data").cloned().unwrap_or(Value::Null);
    let n = |name: &str| number(&d, name);
    match kind {
        "iteration_completed" => format!(
            "iteration {} {} {}, {} tokens in {}ms",
            n("number"),
            text(&d, "action"),
            text(&d, "outcome"),
            n("tokens"),
            n("duration_ms")
        ),
        "status_changed" => {
            let mut line = format!("{} -> {}", text(&d, "from"), text(&d, "to"));
            for field in ["reason", "summary"] {
                if !text(&d, field).is_empty() {
                    line.push_str(&format!(" ({})", text(&d, field)));
                }
            }
            line
        }
        "gate_decision" => {
            let decision = d.get("decision").cloned().unwrap_or(Value::Null);
            let cause = decision.get("cause").map(compact).unwrap_or_default();
            format!(
                "before step {}: {} {cause}",
                n("step"),
                text(&decision, "decision")
            )
            .trim_end()
            .to_string()
        }
        "reflection" => format!(
            "reflection {}: {}",
            n("number"),
            compact(d.get("decision").unwrap_or(&Value::Null))
        ),
        "approval_requested" => format!(
            "call {} ({}) waits for approval: warden sessions approve <id> {}",
            text(&d, "call_id"),
            text(&d, "tool"),
            text(&d, "call_id")
        ),
        "agent_signal" => {
            let signal = d.get("signal").cloned().unwrap_or(Value::Null);
            format!("{}: {}", text(&signal, "kind"), text(&signal, "reason"))
        }
        "approval_decided" => format!("call {} {}", text(&d, "call_id"), text(&d, "decision")),
        _ => compact(&d),
    }
}

/// A JSON value on one line (`{}` for none).
fn compact(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
