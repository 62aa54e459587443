//! `warden report thresholds`: what a running server's settled sessions
//! teach about the thresholds, through `GET /api/insights/thresholds`
//! (never the database): tables for a person, or with `--json` the
//! server's answer. `warden report apply-threshold` applies an iteration
//! limit to a tenant and `warden report threshold-changes` lists the log
//! of those changes (`/api/insights/thresholds/apply`, `/changes`).

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
    /// Apply an iteration limit to a tenant's new sessions (admin), logged
    /// with the replay that justifies it
    ApplyThreshold(ApplyThresholdArgs),
    /// The log of a tenant's applied thresholds, newest first
    ThresholdChanges(ThresholdChangesArgs),
}

/// `warden report apply-threshold`'s value, tenant and note.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("value").required(true).args(["max_iterations", "server_default"])))]
pub struct ApplyThresholdArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The limits.max_iterations the tenant's sessions created without one get (1 – 1,000,000)
    #[arg(long)]
    pub max_iterations: Option<u64>,
    /// Back to the server's default iteration limit
    #[arg(long)]
    pub server_default: bool,
    /// Why, logged with the change (at most 500 characters)
    #[arg(long)]
    pub note: Option<String>,
    /// The tenant (a global admin key only; default: the key's)
    #[arg(long)]
    pub tenant: Option<String>,
}

/// `warden report threshold-changes`' tenant and page.
#[derive(Debug, Args)]
pub struct ThresholdChangesArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The tenant (an admin key only; default: the key's)
    #[arg(long)]
    pub tenant: Option<String>,
    /// Changes per page (1 – 200)
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Changes numbered below this (the `next_before` of a page)
    #[arg(long)]
    pub before: Option<i64>,
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
    match command {
        ReportCommand::Thresholds(args) => report_thresholds(args).await,
        ReportCommand::ApplyThreshold(args) => apply_threshold(args).await,
        ReportCommand::ThresholdChanges(args) => threshold_changes(args).await,
    }
}

/// `warden report apply-threshold`.
async fn apply_threshold(args: ApplyThresholdArgs) -> ExitCode {
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    let mut body = serde_json::json!({ "max_iterations": args.max_iterations });
    if let Some(tenant) = &args.tenant {
        body["tenant"] = tenant.as_str().into();
    }
    if let Some(note) = &args.note {
        body["note"] = note.as_str().into();
    }
    match client
        .post("api/insights/thresholds/apply", Some(&body))
        .await
    {
        Ok(doc) if args.server.json => print_out(&format!("{doc:#}\n")),
        Ok(doc) => print_out(&change_line(&doc)),
        Err(err) => failed(&err),
    }
}

/// `warden report threshold-changes`.
async fn threshold_changes(args: ThresholdChangesArgs) -> ExitCode {
    let client = match args.server.client() {
        Ok(client) => client,
        Err(err) => return failed(&err),
    };
    let mut query = vec![("limit", args.limit.to_string())];
    query.extend(args.tenant.iter().map(|t| ("tenant", t.clone())));
    query.extend(args.before.iter().map(|b| ("before", b.to_string())));
    match client.get("api/insights/thresholds/changes", &query).await {
        Ok(doc) if args.server.json => print_out(&format!("{doc:#}\n")),
        Ok(doc) => {
            let items = doc["items"].as_array().cloned().unwrap_or_default();
            let mut out: String = items.iter().map(change_line).collect();
            if items.is_empty() {
                out.push_str("no threshold changes\n");
            }
            if let Some(next) = doc["next_before"].as_i64() {
                out.push_str(&format!("more: --before {next}\n"));
            }
            print_out(&out)
        }
        Err(err) => failed(&err),
    }
}

/// One logged change as a line (and its note and replay below it).
fn change_line(c: &Value) -> String {
    let value = |v: &Value| match v.as_u64() {
        Some(n) => n.to_string(),
        None => "server default".into(),
    };
    let r = &c["replay"];
    let t = &r["totals"];
    let mut out = format!(
        "#{} {} {} {}: {} -> {} by {}\n  replayed {} of {} newest settled sessions under {}: {} earlier, {} later, {} same · tokens saved {} · completions cut short {}\n",
        c["id"],
        text(c, "applied_at"),
        text(c, "tenant"),
        text(c, "threshold"),
        value(&c["previous"]),
        value(&c["value"]),
        text(c, "applied_by"),
        t["sessions"],
        r["selection"]["selected"],
        r["max_iterations"],
        t["earlier"],
        t["later"],
        t["same"],
        t["tokens_saved"],
        t["completions_cut_short"]
    );
    if let Some(note) = c["note"].as_str() {
        out.push_str(&format!("  note: {note}\n"));
    }
    out
}

/// `warden report thresholds`.
async fn report_thresholds(args: ThresholdsArgs) -> ExitCode {
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
    out.push_str(&match doc["applied"]["max_iterations"].as_u64() {
        Some(n) => format!("applied limits.max_iterations {n} (new sessions without their own)\n"),
        None => "applied limits.max_iterations: none (the server's default)\n".into(),
    });
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
        assert!(
            text.contains("applied limits.max_iterations: none"),
            "{text}"
        );
        let none = thresholds(&json!({ "sessions": 0, "max_iterations_suggestion": null,
                                       "applied": { "max_iterations": 24 } }));
        assert!(none.contains("no suggested max_iterations"), "{none}");
        assert!(none.contains("applied limits.max_iterations 24"), "{none}");
    }

    #[test]
    fn a_change_reads_as_one_line_with_its_replay() {
        let change = json!({
            "id": 3, "tenant": "acme", "threshold": "max_iterations",
            "previous": null, "value": 24, "applied_by": "k1abc",
            "applied_at": "2026-11-02T10:00:00Z", "note": "from the report",
            "replay": { "max_iterations": 24, "not_replayed": 0,
                        "selection": { "rule": "newest_settled", "max_sessions": 1000, "selected": 9 },
                        "totals": { "sessions": 9, "earlier": 2, "later": 0, "same": 7,
                                    "tokens_saved": 300, "completions_cut_short": 0 } }
        });
        let line = change_line(&change);
        assert!(
            line.starts_with(
                "#3 2026-11-02T10:00:00Z acme max_iterations: server default -> 24 by k1abc"
            ),
            "{line}"
        );
        assert!(
            line.contains("replayed 9 of 9 newest settled sessions under 24: 2 earlier"),
            "{line}"
        );
        assert!(line.contains("note: from the report"), "{line}");
    }
}
