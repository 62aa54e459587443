//! The client commands as clap parses them, the key kept out of every
//! printout, and what they draw from the server's answers (tables, status
//! lines, the tree, the progress line), without a server.

use clap::Parser;
use clap::error::ErrorKind;
use serde_json::json;

use super::client::{ClientError, parse_config, problem_from};
use super::sessions::{
    SessionsCommand, WorkersCommand, list_table, queues_table, status_lines, tree_lines,
};
use super::{Cli, Command, table, watch};

const ID: &str = "0190a9c4-5b1e-7d2a-8f3c-1234567890ab";

fn command(line: &str) -> Command {
    match Cli::try_parse_from(line.split_whitespace()) {
        Ok(cli) => cli.command.expect("a command"),
        Err(err) => panic!("{line}: {err}"),
    }
}

fn sessions(line: &str) -> super::sessions::SessionsArgs {
    match command(line) {
        Command::Sessions(args) => args,
        other => panic!("{line}: {other:?}"),
    }
}

#[test]
fn every_sessions_command_parses_with_the_flags_anywhere() {
    let args = sessions(&format!(
        "warden sessions --url http://h:1 show {ID} --key wdn_secret --json"
    ));
    assert_eq!(args.server.url.as_deref(), Some("http://h:1"));
    assert!(args.server.json && args.server.key.is_some());
    assert!(matches!(args.command, SessionsCommand::Show { .. }));
    for (line, ok) in [
        (
            format!("warden sessions watch {ID} --replay --retries 2"),
            true,
        ),
        (format!("warden sessions stop {ID}"), true),
        (format!("warden sessions pause {ID}"), true),
        (format!("warden sessions resume {ID} --guidance hi"), true),
        (
            format!("warden sessions approve {ID} 3.0 --reject --reason no"),
            true,
        ),
        (format!("warden sessions tree {ID}"), true),
        (
            "warden sessions list --status running --tenant acme --limit 10".into(),
            true,
        ),
        ("warden sessions list --limit 0".into(), false),
        ("warden sessions list --tenant a/b".into(), false),
        ("warden sessions show not-a-uuid".into(), false),
        (format!("warden sessions watch {ID} --retries 51"), false),
    ] {
        let parsed = Cli::try_parse_from(line.split_whitespace());
        assert_eq!(parsed.is_ok(), ok, "{line}: {:?}", parsed.err());
    }
    let Command::Workers(workers) = command("warden workers queues --json") else {
        panic!("workers queues")
    };
    assert!(workers.server.json && matches!(workers.command, WorkersCommand::Queues));
}

#[test]
fn the_key_is_never_in_debug_output() {
    let args = sessions("warden sessions list --key wdn_topsecret_123");
    let debug = format!("{args:?}");
    assert!(!debug.contains("topsecret"), "{debug}");
    assert!(debug.contains("<hidden>"), "{debug}");
    let client = args.server.client().expect("a client");
    assert!(!format!("{client:?}").contains("topsecret"));
    let err = Cli::try_parse_from(["warden", "sessions", "list", "--key", "has space"])
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::ValueValidation);
}

#[test]
fn the_config_file_is_name_equals_value() {
    let file = parse_config("# mine\nurl = \"http://w:9\"\nkey=wdn_abc\n\nnonsense\n");
    assert_eq!(file.get("url").map(String::as_str), Some("http://w:9"));
    assert_eq!(file.get("key").map(String::as_str), Some("wdn_abc"));
    assert_eq!(file.len(), 2);
}

#[test]
fn a_problem_shows_its_title_and_detail_or_the_status_alone() {
    let body = br#"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"a key is required","code":"unauthorized"}"#;
    let err = problem_from(401, Some("Unauthorized"), body);
    assert_eq!(err.to_string(), "Unauthorized (401): a key is required");
    let err = problem_from(502, Some("Bad Gateway"), b"upstream down");
    assert!(matches!(err, ClientError::Problem { status: 502, .. }));
    assert_eq!(err.to_string(), "Bad Gateway (502): upstream down");
}

#[test]
fn tables_fit_the_width_and_cut_the_goal() {
    let page = json!({ "items": [{
        "id": ID, "status": "paused", "reason": "ask_user", "iterations": 12,
        "tokens_used": 12345, "created_at": "2020-01-01T00:00:00Z",
        "goal": "a goal far too long for any narrow terminal\nwith a newline in it"
    }], "next_cursor": null });
    for width in [100, 140] {
        let text = list_table(&page, width);
        assert!(
            text.lines().all(|l| l.chars().count() <= width),
            "{width}: {text}"
        );
        assert!(text.contains(ID) && text.contains("12.3k") && text.contains("ask_user"));
    }
    // Too narrow for every column: the goal keeps its first characters.
    let narrow = list_table(&page, 60);
    assert!(narrow.contains("  a goal far …\n"), "{narrow}");
    assert!(list_table(&page, 100).contains('…'));
    assert_eq!(list_table(&json!({ "items": [] }), 80), "no sessions\n");
    let queues = json!({ "queues": [{ "queue": "gpu", "depth": 3, "oldest_task_age_ms": 65000,
        "workers": [{ "worker": "w1", "last_seen_at": "2020-01-01T00:00:00Z" }] }] });
    let text = queues_table(&queues);
    assert!(
        text.contains("gpu") && text.contains("1m05s") && text.contains("w1"),
        "{text}"
    );
}

#[test]
fn status_lines_say_what_an_operator_asks() {
    let s = json!({
        "id": ID, "tenant": "acme", "status": "paused", "reason": "approval_required",
        "goal": "ship it", "iterations": 4, "tokens_used": 900, "elapsed_ms": 125000,
        "eta_seconds": 30.0, "percent_complete": 40.0,
        "limits": { "max_iterations": 10, "max_tokens": 5000 },
        "executor": { "kind": "model", "model": "qwen3" },
        "summary": "Paused: a call waits for approval",
        "pending_approvals": [{ "call_id": "4.0", "tool": "write_file", "reason": "save" }],
        "children_needing_attention": [{ "child_id": "c1", "reason": "ask_user", "goal": "sub" }],
        "next_steps": ["approve or reject 4.0"],
        "cost_usd": "0.0125", "unpriced_steps": 1,
        "budget_warnings": [
            { "budget": "tokens", "threshold": 50 }, { "budget": "iterations", "threshold": 50 },
            { "budget": "tokens", "threshold": 80 } ],
    });
    let text = status_lines(&s);
    let pausing = status_lines(&json!({ "status": "running", "pause_requested": true }));
    let queued = status_lines(&json!({ "status": "queued", "queue_position": 1,
        "waiting_for_replica": { "capabilities": ["review_every", "delegate"] } }));
    assert!(
        queued.contains("waiting     for a replica with review_every, delegate"),
        "{queued}"
    );
    assert!(
        pausing.contains("requested   pause (after the step in flight)"),
        "{pausing}"
    );
    for want in [
        "(tenant acme)",
        "status      paused/approval_required",
        "iterations  4 / 10  (40% complete)",
        "tokens      900 / 5000  ($0.0125, 1 steps unpriced)",
        "warnings    tokens 80%, iterations 50%",
        "elapsed     2m05s  (eta 30s)",
        "executor    model (model qwen3)",
        "pending approvals:\n  - 4.0  write_file  save",
        "children needing attention:\n  - c1  ask_user  sub",
        "next steps:\n  - approve or reject 4.0",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
}

#[test]
fn the_tree_is_indented_by_depth() {
    let node = |id: &str, children: serde_json::Value| {
        json!({ "id": id, "status": "running", "goal": id, "iterations": 1,
            "tokens_used": 10, "max_tokens": 100, "children": children })
    };
    let doc = json!({
        "totals": { "sessions": 3, "live": 3, "iterations": 3, "tokens_used": 30 },
        "node": node("root", json!([node("child", json!([node("grandchild", json!([]))]))])),
    });
    let text = tree_lines(&doc);
    assert!(
        text.starts_with("3 sessions (3 live), 3 iterations, 30 tokens\n"),
        "{text}"
    );
    assert!(text.contains("\nroot  running"), "{text}");
    assert!(text.contains("\n  child  running"), "{text}");
    assert!(text.contains("\n    grandchild  running"), "{text}");
}

#[test]
fn forks_are_marked_in_the_tree_and_the_status() {
    let doc = json!({
        "totals": { "sessions": 1, "live": 1, "iterations": 1, "tokens_used": 10 },
        "node": { "id": "f1", "status": "running", "goal": "g", "iterations": 1,
            "tokens_used": 10, "max_tokens": 100, "children": [],
            "forked_from": { "session_id": "orig", "iteration": 4 },
            "forks": [{ "id": "f2", "status": "paused", "iteration": 1 }] },
    });
    let text = tree_lines(&doc);
    assert!(
        text.contains("\nf1  running  it 1  tokens 10/100  g  [fork of orig at iteration 4]"),
        "{text}"
    );
    assert!(
        text.contains("\n  ⑂ fork f2  paused  from iteration 1\n"),
        "{text}"
    );
    let status = status_lines(&json!({ "status": "running",
        "forked_from": { "session_id": "orig", "iteration": 4 } }));
    assert!(
        status.contains("forked from orig at iteration 4"),
        "{status}"
    );
    let plain = status_lines(&json!({ "status": "running", "forked_from": null }));
    assert!(!plain.contains("forked"), "{plain}");
}

#[test]
fn the_progress_line_has_the_bar_eta_step_and_tokens() {
    let s = json!({
        "status": "running", "iterations": 5, "tokens_used": 1500, "eta_seconds": 90.0,
        "limits": { "max_iterations": 10, "max_tokens": 10000 },
        "current_step": { "iteration": 6, "action": "write_file", "elapsed_ms": 3200 },
    });
    let line = watch::progress_line(&s, 200);
    assert_eq!(
        line,
        "running  [##########..........] 5/10 it  eta 1m30s  tokens 1.5k/10.0k  step: iteration 6 write_file, 3s so far"
    );
    assert!(watch::progress_line(&s, 40).chars().count() <= 40);
    let event =
        json!({ "data": { "from": "running", "to": "completed", "reason": "goal_achieved" } });
    assert_eq!(
        watch::describe("status_changed", &event),
        "running -> completed (goal_achieved)"
    );
}

#[test]
fn figures_are_written_short() {
    assert_eq!(table::tokens(999), "999");
    assert_eq!(table::tokens(1_000), "1.0k");
    assert_eq!(table::tokens(2_500_000), "2.5M");
    assert_eq!(table::duration(59), "59s");
    assert_eq!(table::duration(3_661), "1h01m");
    assert_eq!(table::duration(90_000), "1d1h");
    assert_eq!(table::fit("abcdef", 4), "abc…");
    assert_eq!(table::bar(0.5, 4), "[##..]");
    assert_eq!(table::bar(2.0, 2), "[##]");
}

#[test]
fn reconnections_back_off_to_a_ceiling() {
    let waits: Vec<u128> = (1..=7).map(|n| watch::backoff(n).as_millis()).collect();
    assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
    assert_eq!(watch::backoff(u32::MAX).as_millis(), 8000);
}
