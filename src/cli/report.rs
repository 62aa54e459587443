//! `warden report thresholds`: what a running server's settled sessions
//! teach about the thresholds, through `GET /api/insights/thresholds`
//! (never the database): tables for a person, or with `--json` the
//! server's answer.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::client::ServerArgs;
use super::sessions::{failed, print_out, text};

/// `warden report`'s reports.
#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// How sessions ended against their thresholds, premature pauses, a
    /// suggested iteration limit with its replay, the reflector's calibration
    Thresholds(ThresholdsArgs),
}

/// `warden report thresholds`' server and tenant.
#[derive(Debug, Args)]
pub struct ThresholdsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The tenant to report on (an admin key only; default: the key's)
    #[arg(long)]
    pub tenant: Option<String>,
}

/// Runs `warden report …`.
pub async fn run(command: ReportCommand) -> ExitCode {
    let ReportCommand::Thresholds(args) = command;
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    let query: Vec<(&str, String)> = args.tenant.iter().map(|t| ("tenant", t.clone())).collect();
    match client.get("api/insights/thresholds", &query).await {
        Ok(doc) if args.server.json => print_out(&format!("{doc:#}\n")),
        Ok(doc) => print_out(&thresholds(&doc)),
        Err(err) => failed(&err),
    }
}

/// The report as text: outcomes, pauses, limits, suggestion, calibration.
fn thresholds(doc: &Value) -> String {
    let rows = |key: &str| doc[key].as_array().cloned().unwrap_or_default();
    let mut out = format!("{} settled sessions\n\noutcomes\n", doc["sessions"]);
    for o in rows("outcomes") {
        out.push_str(&format!(
            "  {:>6}  {} {}\n",
            o["sessions"],
            text(&o, "status"),
            text(&o, "reason")
        ));
    }
    out.push_str("\npauses by a policy (resumed by a person; then completed = premature)\n");
    for p in rows("pauses") {
        out.push_str(&format!(
            "  {:<24} {} paused · {} resumed · {} premature\n",
            text(&p, "reason"),
            p["pauses"],
            p["resumed"],
            p["premature"]
        ));
    }
    for l in rows("limits") {
        out.push_str(&format!(
            "\nlimits.{} (ends as {})\n",
            text(&l, "name"),
            text(&l, "reason")
        ));
        for v in l["values"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {:>12}  {} sessions · {} completed · {} ended by it\n",
                v["value"], v["sessions"], v["completed"], v["ended_by_it"]
            ));
        }
    }
    out.push_str(&suggestion(&doc["max_iterations_suggestion"]));
    out.push_str("\nreflector's percentComplete → completed within 5 / 10 / 20 steps\n");
    for c in rows("calibration").iter().filter(|c| c["reflections"] != 0) {
        out.push_str(&format!(
            "  {:>3}–{:<3} %  {} estimates · {} in completed sessions · {} / {} / {}\n",
            c["from_percent"],
            c["to_percent"],
            c["reflections"],
            c["in_completed_sessions"],
            c["completed_within_5"],
            c["completed_within_10"],
            c["completed_within_20"]
        ));
    }
    out
}

/// The suggested iteration limit and its replay's totals.
fn suggestion(s: &Value) -> String {
    if s.is_null() {
        return "\nno suggested max_iterations: no session completed yet\n".into();
    }
    let mut out = format!(
        "\nsuggested limits.max_iterations {} (longest completion {}): {} sessions end earlier, {} iterations saved, {} completions cut short\n",
        s["value"],
        s["longest_completion"],
        s["sessions_ending_earlier"],
        s["iterations_saved"],
        s["completions_cut_short"]
    );
    let r = &s["replay"];
    if !r.is_null() {
        out.push_str(&format!(
            "  replayed over {} sessions: {} earlier, {} later, {} same · tokens saved {} · completions cut short {}\n",
            r["sessions"], r["earlier"], r["later"], r["same"], r["tokens_saved"], r["completions_cut_short"]
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_text_names_every_part_of_the_report() {
        let doc = json!({
            "sessions": 4,
            "outcomes": [{ "status": "completed", "reason": "goal_achieved", "sessions": 3 }],
            "pauses": [{ "reason": "review_required", "pauses": 1, "resumed": 1, "premature": 1 }],
            "limits": [{ "name": "max_iterations", "reason": "max_iterations",
                         "values": [{ "value": 10, "sessions": 4, "completed": 3, "ended_by_it": 1 }] }],
            "max_iterations_suggestion": { "value": 6, "longest_completion": 5,
                "sessions_ending_earlier": 1, "iterations_saved": 4, "completions_cut_short": 0,
                "sessions_ending_later": 0,
                "replay": { "sessions": 4, "earlier": 1, "later": 0, "same": 3,
                            "tokens_saved": 40, "completions_cut_short": 0 } },
            "calibration": [{ "from_percent": 90, "to_percent": 100, "reflections": 2,
                              "in_completed_sessions": 2, "completed_within_5": 1,
                              "completed_within_10": 2, "completed_within_20": 2 },
                            { "from_percent": 0, "to_percent": 10, "reflections": 0,
                              "in_completed_sessions": 0, "completed_within_5": 0,
                              "completed_within_10": 0, "completed_within_20": 0 }]
        });
        let text = thresholds(&doc);
        assert!(text.starts_with("4 settled sessions"), "{text}");
        assert!(text.contains("completed goal_achieved"), "{text}");
        assert!(text.contains("review_required"), "{text}");
        assert!(text.contains("1 premature"), "{text}");
        assert!(
            text.contains("limits.max_iterations (ends as max_iterations)"),
            "{text}"
        );
        assert!(text.contains("suggested limits.max_iterations 6"), "{text}");
        assert!(
            text.contains("replayed over 4 sessions: 1 earlier"),
            "{text}"
        );
        assert!(text.contains(" 90–100 %  2 estimates"), "{text}");
        assert!(!text.contains("  0–10"), "empty bands are left out: {text}");
        let none = thresholds(&json!({ "sessions": 0, "max_iterations_suggestion": null }));
        assert!(none.contains("no suggested max_iterations"), "{none}");
    }
}
