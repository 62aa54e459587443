//! `warden replay`: policy replay (what-if) over a running server's ended
//! sessions, through `POST /api/autonomous/replay` (never the database):
//! a line per session and the totals, or with `--json` the server's answer.
//! With `--stream` the server streams (NDJSON) and each line is printed as
//! it arrives.

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use super::client::{ClientError, ServerArgs};
use super::sessions::{failed, print_out, text};

/// `warden replay`'s sessions, policy override and server.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The sessions to replay; none: the newest ones --status and --limit select
    pub ids: Vec<uuid::Uuid>,
    /// Without ids: only sessions in this status (completed, stopped, paused, …)
    #[arg(long)]
    pub status: Option<String>,
    /// Without ids: how many of the newest sessions, 1 to 1000
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,
    /// Replay under this iteration cap
    #[arg(long)]
    pub max_iterations: Option<u64>,
    /// Replay under this token budget
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Replay with reflections every N iterations
    #[arg(long)]
    pub reflection_interval: Option<u32>,
    /// Replay with a review point every N steps (0: none)
    #[arg(long)]
    pub review_every: Option<u64>,
    /// The whole policy override as JSON (`{"limits":…,"gate":…,"stuck":…}`);
    /// the flags above are laid over it
    #[arg(long, value_name = "JSON")]
    pub policy: Option<String>,
    /// Time the server may spend, ms (100 to 60000)
    #[arg(long)]
    pub deadline_ms: Option<u64>,
    /// Print each session's replay as the server computes it (with --json:
    /// the server's NDJSON lines as they come)
    #[arg(long)]
    pub stream: bool,
}

/// The request body `args` ask for.
fn body(args: &ReplayArgs) -> Result<Value, ClientError> {
    let mut policy = match &args.policy {
        Some(text) => serde_json::from_str::<Value>(text)
            .map_err(|e| ClientError::Invalid(format!("--policy is not JSON: {e}")))?,
        None => json!({}),
    };
    if !policy.is_object() {
        return Err(ClientError::Invalid(
            "--policy must be a JSON object".into(),
        ));
    }
    let limits = [
        ("max_iterations", args.max_iterations.map(Value::from)),
        ("max_tokens", args.max_tokens.map(Value::from)),
        (
            "reflection_interval",
            args.reflection_interval.map(Value::from),
        ),
        ("review_every", args.review_every.map(Value::from)),
    ];
    for (name, value) in limits {
        if let Some(value) = value {
            if !policy["limits"].is_object() {
                policy["limits"] = json!({});
            }
            policy["limits"][name] = value;
        }
    }
    let mut body = json!({ "policy": policy });
    if args.ids.is_empty() {
        let mut filter = json!({ "limit": args.limit });
        if let Some(status) = &args.status {
            filter["status"] = json!(status);
        }
        body["filter"] = filter;
    } else {
        body["session_ids"] = json!(args.ids);
    }
    if let Some(ms) = args.deadline_ms {
        body["deadline_ms"] = json!(ms);
    }
    Ok(body)
}

/// Runs `warden replay`.
pub async fn run(args: ReplayArgs) -> ExitCode {
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    let body = match body(&args) {
        Ok(body) => body,
        Err(err) => return failed(&err),
    };
    if args.stream {
        return match streamed(&client, &body, args.server.json).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => failed(&err),
        };
    }
    match client.post("api/autonomous/replay", Some(&body)).await {
        Ok(doc) if args.server.json => print_out(&format!("{doc:#}\n")),
        Ok(doc) => print_out(&lines(&doc)),
        Err(err) => failed(&err),
    }
}

/// The replay streamed: each line printed as it arrives (as sent with
/// `json`); an error line or a stream cut before its end line fails.
async fn streamed(
    client: &super::client::Client,
    body: &Value,
    json: bool,
) -> Result<(), ClientError> {
    let mut response = client.post_ndjson("api/autonomous/replay", body).await?;
    let mut pending: Vec<u8> = Vec::new();
    let mut ended = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| super::client::transport(&e))?
    {
        pending.extend_from_slice(&chunk);
        while let Some(at) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let doc: Value = serde_json::from_slice(&line)
                .map_err(|e| ClientError::Invalid(format!("a line is not JSON: {e}")))?;
            ended |= doc["line"] == "end";
            let text = if json {
                format!("{doc}\n")
            } else {
                line_text(&doc)?
            };
            if print_out(&text) != ExitCode::SUCCESS {
                return Err(ClientError::Invalid("cannot write to stdout".into()));
            }
        }
    }
    if !ended {
        return Err(ClientError::Transport(
            "the stream ended before its totals".into(),
        ));
    }
    Ok(())
}

/// What one streamed line prints: a session's line, or the end's; an error
/// line is the problem it carries.
fn line_text(doc: &Value) -> Result<String, ClientError> {
    match doc["line"].as_str() {
        Some("session") => Ok(format!("{}\n", session_line(doc))),
        Some("end") => Ok(end_lines(doc)),
        Some("error") => Err(super::client::problem_from(
            u16::try_from(doc["status"].as_u64().unwrap_or(500)).unwrap_or(500),
            None,
            doc.to_string().as_bytes(),
        )),
        _ => Err(ClientError::Invalid(format!("an unknown line: {doc}"))),
    }
}

/// `status reason (iterations)` of an end.
fn end(doc: &Value) -> String {
    let status = doc["status"].as_str().unwrap_or("beyond the record");
    let reason = doc["reason"].as_str().unwrap_or("-");
    format!("{status} {reason} ({})", doc["iterations"])
}

/// A line per session and the totals.
fn lines(doc: &Value) -> String {
    let mut out = String::new();
    for s in doc["sessions"].as_array().into_iter().flatten() {
        out.push_str(&session_line(s));
        out.push('\n');
    }
    out.push_str(&end_lines(doc));
    out
}

/// One session's replay: its recorded and replayed ends and where they part.
fn session_line(s: &Value) -> String {
    let mut line = format!(
        "{}  was {}  now {}  {}",
        text(s, "id"),
        end(&s["recorded"]),
        end(&s["replayed"]),
        text(s, "change"),
    );
    if let Some(d) = s["divergence"].as_object() {
        line.push_str(&format!(
            "  first divergence after {}: {} → {}",
            d.get("iteration").unwrap_or(&Value::Null),
            d.get("old").map_or("-".into(), Value::to_string),
            d.get("new").map_or("-".into(), Value::to_string)
        ));
    }
    if s["reproduced"] == false {
        line.push_str("  (the recorded policy does not reproduce this end)");
    }
    line
}

/// The sessions left out and the totals.
fn end_lines(doc: &Value) -> String {
    let mut out = String::new();
    for s in doc["not_replayed"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}  not replayed: {}\n",
            text(s, "id"),
            text(s, "why")
        ));
    }
    let t = &doc["totals"];
    out.push_str(&format!(
        "{} sessions: {} earlier, {} later, {} same · tokens saved {} added {} · USD saved {} added {} · completions cut short {} · reproduced {}/{}\n",
        t["sessions"], t["earlier"], t["later"], t["same"], t["tokens_saved"], t["tokens_added"],
        text(t, "cost_saved_usd"), text(t, "cost_added_usd"), t["completions_cut_short"],
        t["reproduced"], t["sessions"],
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn parse(words: &[&str]) -> ReplayArgs {
        Cli::try_parse_from(std::iter::once("replay").chain(words.iter().copied()))
            .expect("parses")
            .args
    }

    #[test]
    fn flags_lay_over_the_policy_and_ids_or_a_filter_select() {
        let id = uuid::Uuid::nil().to_string();
        let b = body(&parse(&[
            &id,
            "--max-iterations",
            "5",
            "--policy",
            r#"{"stuck":{"same_error":2}}"#,
        ]))
        .expect("a body");
        assert_eq!(b["session_ids"], json!([id]));
        assert_eq!(
            b["policy"],
            json!({"stuck": {"same_error": 2}, "limits": {"max_iterations": 5}})
        );
        let b = body(&parse(&["--status", "completed", "--limit", "7"])).expect("a body");
        assert_eq!(b["filter"], json!({"limit": 7, "status": "completed"}));
        assert!(body(&parse(&["--policy", "[1]"])).is_err());
        assert!(body(&parse(&["--policy", "{"])).is_err());
    }

    #[test]
    fn lines_name_each_end_and_the_totals() {
        let doc = json!({
            "sessions": [{
                "id": "a", "change": "earlier", "reproduced": true,
                "recorded": {"status": "completed", "reason": "goal_achieved", "iterations": 9},
                "replayed": {"status": "stopped", "reason": "max_iterations", "iterations": 5},
                "divergence": {"iteration": 5, "old": {"kind": "gate", "decision": "continue"}, "new": null}
            }],
            "not_replayed": [{"id": "b", "why": "not_found"}],
            "totals": {"sessions": 1, "earlier": 1, "later": 0, "same": 0, "tokens_saved": 40,
                       "tokens_added": 0, "cost_saved_usd": "0.1", "cost_added_usd": "0",
                       "completions_cut_short": 1, "reproduced": 1}
        });
        let text = lines(&doc);
        assert!(
            text.contains(
                "was completed goal_achieved (9)  now stopped max_iterations (5)  earlier"
            ),
            "{text}"
        );
        assert!(text.contains("b  not replayed: not_found"), "{text}");
        assert!(text.contains("completions cut short 1"), "{text}");
    }

    #[test]
    fn streamed_lines_print_as_the_whole_answer_does() {
        let session = json!({
            "line": "session", "id": "a", "change": "same", "reproduced": true,
            "recorded": {"status": "completed", "reason": "goal_achieved", "iterations": 4},
            "replayed": {"status": "completed", "reason": "goal_achieved", "iterations": 4}
        });
        let end = json!({
            "line": "end", "not_replayed": [{"id": "b", "why": "deadline"}],
            "totals": {"sessions": 1, "earlier": 0, "later": 0, "same": 1, "tokens_saved": 0,
                       "tokens_added": 0, "cost_saved_usd": "0", "cost_added_usd": "0",
                       "completions_cut_short": 0, "reproduced": 1}
        });
        let whole = json!({
            "sessions": [session.clone()], "not_replayed": end["not_replayed"].clone(),
            "totals": end["totals"].clone()
        });
        let streamed = line_text(&session).expect("a session") + &line_text(&end).expect("an end");
        assert_eq!(streamed, lines(&whole));
        assert!(streamed.contains("b  not replayed: deadline"), "{streamed}");
        let err = line_text(
            &json!({"line": "error", "status": 503, "title": "Service Unavailable",
                                    "detail": "the database is unreachable"}),
        )
        .expect_err("an error line fails");
        assert!(
            err.to_string().contains("the database is unreachable"),
            "{err}"
        );
        assert!(line_text(&json!({"line": "other"})).is_err());
    }
}
