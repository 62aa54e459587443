//! Which tool calls wait for a person: the approval rule of a session, and
//! the decision taken on one call from the tool's name and whether it only
//! reads. A tool's rule is found by its exact name, then by its server's
//! prefix (`server__*`, for tools of MCP servers), then the default.
//! Tools that do not say they only read count as writes: an untrusted
//! server's missing hint never lets a destructive call through unasked.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// When a call of a tool needs a person's approval before it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    /// Never: the call runs at once.
    #[default]
    Never,
    /// Always: every call waits for a decision.
    Always,
    /// Only calls of tools that may change something (not read-only).
    WhenNotReadOnly,
}

/// A session's approval rules: a default and rules per tool or per server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// The rule of tools no entry of `tools` names (default `never`).
    #[serde(default)]
    pub default: ApprovalRule,
    /// Rules by tool name (`write_file`) or by server prefix (`fs__*`, every
    /// tool of server `fs`); an exact name wins over a prefix.
    #[serde(default)]
    pub tools: BTreeMap<String, ApprovalRule>,
}

/// What a call's policy needs to know about its tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolFacts<'a> {
    /// The tool's name as the model calls it (`write_file`, `fs__delete`).
    pub name: &'a str,
    /// Whether the tool declares it only reads (MCP `readOnlyHint` without
    /// `destructiveHint`; the built-in `read_file` and `list_files`).
    pub read_only: bool,
}

/// The decision on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallDecision {
    /// Run it now.
    Run,
    /// Journal it pending and pause the session until a person decides.
    AwaitApproval(ApprovalRule),
}

/// Most entries of `tools`.
pub const MAX_TOOL_RULES: usize = 64;
/// What an entry of `tools` may be called: a tool name, or a server name
/// followed by `__*`.
pub const TOOL_RULE_PATTERN: &str = r"^[A-Za-z0-9_.-]{1,128}$|^[A-Za-z0-9_.-]{1,64}__\*$";
/// Separator of a server's name and its tool's name.
pub const SERVER_SEPARATOR: &str = "__";

impl ApprovalPolicy {
    /// Checks the rules; the message names the offending entry.
    pub fn validate(&self) -> Result<(), String> {
        if self.tools.len() > MAX_TOOL_RULES {
            return Err(format!(
                "executor.approvals.tools may name at most {MAX_TOOL_RULES} tools or servers, got {}",
                self.tools.len()
            ));
        }
        for name in self.tools.keys() {
            if !valid_tool_key(name) {
                return Err(format!(
                    "executor.approvals.tools key {name:?} must be a tool name (1 to 128 letters, digits, `_`, `.` or `-`) or a server prefix `server__*`"
                ));
            }
        }
        Ok(())
    }

    /// The rule in force for a tool: its own, its server's, or the default.
    pub fn rule_for(&self, tool: &str) -> ApprovalRule {
        if let Some(rule) = self.tools.get(tool) {
            return *rule;
        }
        if let Some((server, _)) = tool.split_once(SERVER_SEPARATOR)
            && !server.is_empty()
            && let Some(rule) = self.tools.get(&format!("{server}{SERVER_SEPARATOR}*"))
        {
            return *rule;
        }
        self.default
    }

    /// Whether a call of `tool` runs now or waits for a person.
    pub fn decide(&self, tool: ToolFacts<'_>) -> CallDecision {
        let rule = self.rule_for(tool.name);
        let wait = match rule {
            ApprovalRule::Never => false,
            ApprovalRule::Always => true,
            ApprovalRule::WhenNotReadOnly => !tool.read_only,
        };
        if wait {
            CallDecision::AwaitApproval(rule)
        } else {
            CallDecision::Run
        }
    }

    /// Whether no call can ever wait (the default policy).
    pub fn is_never(&self) -> bool {
        self.default == ApprovalRule::Never
            && self.tools.values().all(|r| *r == ApprovalRule::Never)
    }
}

/// Whether `key` is a tool name or a `server__*` prefix, as
/// [`TOOL_RULE_PATTERN`] says.
fn valid_tool_key(key: &str) -> bool {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let (body, max) = match key.strip_suffix("__*") {
        Some(server) => (server, 64),
        None => (key, 128),
    };
    !body.is_empty() && body.len() <= max && body.chars().all(name_char)
}

/// A person's (or the clock's) answer to a pending call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run the call.
    Approve,
    /// Do not run it; the agent is told so, with the message.
    Reject,
    /// Nobody decided before `WARDEN_APPROVAL_TIMEOUT_MS`: not run, and the
    /// agent is told it was not approved in time.
    Expired,
}

impl Decision {
    /// The name stored in Postgres and shown in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
            Decision::Expired => "expired",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Decision> {
        [Decision::Approve, Decision::Reject, Decision::Expired]
            .into_iter()
            .find(|d| d.as_str() == s)
    }
}

/// What the agent is told in place of a call's result when it did not run.
pub fn refusal_text(tool: &str, decision: Decision, message: Option<&str>) -> Option<String> {
    let base = match decision {
        Decision::Approve => return None,
        Decision::Reject => format!("not executed: a person rejected this call of `{tool}`"),
        Decision::Expired => format!(
            "not executed: this call of `{tool}` waited for approval and expired without a decision"
        ),
    };
    Some(match message.map(str::trim).filter(|m| !m.is_empty()) {
        Some(m) => format!("{base}. Their message: {m}"),
        None => format!("{base}. Do not retry it unchanged; choose another way or ask the user."),
    })
}

/// Checks the arguments a person gives with a decision, to run in place of
/// the agent's: only an approval carries them, they are a JSON object like
/// every tool's arguments, and their JSON text is at most `max_bytes` (the
/// cap of each text of an agent's step, `WARDEN_MAX_OUTPUT_BYTES`, so a
/// person's arguments are never larger than the agent's could be).
pub fn check_edited_arguments(
    decision: Decision,
    arguments: Option<&Value>,
    max_bytes: usize,
) -> Result<(), String> {
    let Some(arguments) = arguments else {
        return Ok(());
    };
    if decision != Decision::Approve {
        return Err(format!(
            "arguments are given only with `approve` (a call that does not run takes none), not with `{}`",
            decision.as_str()
        ));
    }
    if !arguments.is_object() {
        return Err("arguments must be a JSON object, as a tool call's are".to_string());
    }
    let bytes = arguments.to_string().len();
    if bytes > max_bytes {
        return Err(format!(
            "arguments must be at most {max_bytes} bytes of JSON (WARDEN_MAX_OUTPUT_BYTES), got {bytes}"
        ));
    }
    Ok(())
}

/// What the agent is told after the result of a call a person approved
/// with arguments of their own, so it knows the call did not run as it
/// asked (and with what it ran, excerpted when large).
pub fn edited_note(tool: &str, arguments: &Value) -> String {
    format!(
        "(a person edited the arguments of this call of `{tool}` before approving it; it ran with {})",
        super::excerpt::history_arguments(arguments)
    )
}

/// Whether a pending approval requested `age_ms` ago has expired under a
/// timeout of `timeout_ms`.
pub fn expired(age_ms: i64, timeout_ms: u64) -> bool {
    age_ms >= 0 && (age_ms as u64) >= timeout_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: [ApprovalRule; 3] = [
        ApprovalRule::Never,
        ApprovalRule::Always,
        ApprovalRule::WhenNotReadOnly,
    ];

    fn facts(name: &str, read_only: bool) -> ToolFacts<'_> {
        ToolFacts { name, read_only }
    }

    #[test]
    fn every_rule_and_read_only_flag_decides_as_the_table_says() {
        for rule in RULES {
            for read_only in [false, true] {
                let policy = ApprovalPolicy {
                    default: rule,
                    tools: BTreeMap::new(),
                };
                let wait = match (rule, read_only) {
                    (ApprovalRule::Never, _) => false,
                    (ApprovalRule::Always, _) => true,
                    (ApprovalRule::WhenNotReadOnly, ro) => !ro,
                };
                let expected = if wait {
                    CallDecision::AwaitApproval(rule)
                } else {
                    CallDecision::Run
                };
                assert_eq!(
                    policy.decide(facts("t", read_only)),
                    expected,
                    "{rule:?} read_only={read_only}"
                );
            }
        }
    }

    #[test]
    fn the_default_policy_never_waits() {
        let policy = ApprovalPolicy::default();
        assert!(policy.is_never());
        for name in ["write_file", "read_file", "fs__rm", ""] {
            for ro in [false, true] {
                assert_eq!(policy.decide(facts(name, ro)), CallDecision::Run);
            }
        }
    }

    #[test]
    fn an_exact_name_wins_over_a_server_prefix_which_wins_over_the_default() {
        let policy = ApprovalPolicy {
            default: ApprovalRule::Never,
            tools: BTreeMap::from([
                ("fs__*".to_string(), ApprovalRule::Always),
                ("fs__read".to_string(), ApprovalRule::Never),
                ("write_file".to_string(), ApprovalRule::Always),
                ("web__*".to_string(), ApprovalRule::WhenNotReadOnly),
            ]),
        };
        assert_eq!(policy.rule_for("fs__read"), ApprovalRule::Never);
        assert_eq!(policy.rule_for("fs__delete"), ApprovalRule::Always);
        assert_eq!(policy.rule_for("write_file"), ApprovalRule::Always);
        assert_eq!(policy.rule_for("read_file"), ApprovalRule::Never);
        assert_eq!(policy.rule_for("web__get"), ApprovalRule::WhenNotReadOnly);
        // Not a server's tool: no prefix applies.
        assert_eq!(policy.rule_for("fs"), ApprovalRule::Never);
        assert_eq!(policy.rule_for("__x"), ApprovalRule::Never);
        assert_eq!(policy.rule_for("fsx__delete"), ApprovalRule::Never);
        assert_eq!(policy.decide(facts("web__get", true)), CallDecision::Run);
        assert_eq!(
            policy.decide(facts("web__post", false)),
            CallDecision::AwaitApproval(ApprovalRule::WhenNotReadOnly)
        );
        assert!(!policy.is_never());
    }

    #[test]
    fn rules_naming_only_never_never_wait() {
        let policy = ApprovalPolicy {
            default: ApprovalRule::Never,
            tools: BTreeMap::from([("write_file".to_string(), ApprovalRule::Never)]),
        };
        assert!(policy.is_never());
    }

    #[test]
    fn tool_keys_are_names_or_server_prefixes() {
        // A name that merely ends in the separator is a name.
        for ok in [
            "write_file",
            "fs__*",
            "a",
            "fs__",
            "srv.v2-x__delete",
            &"x".repeat(128),
        ] {
            assert!(valid_tool_key(ok), "{ok}");
            let re = regex_lite_match(ok);
            assert!(re, "the documented pattern accepts {ok}");
        }
        for bad in ["", "__*", "*", "a b", "fs*", "x/y", &"x".repeat(129), "é"] {
            assert!(!valid_tool_key(bad), "{bad}");
            assert!(
                !regex_lite_match(bad),
                "the documented pattern refuses {bad:?}"
            );
        }
    }

    /// The documented pattern, checked by hand (no regex engine here): it
    /// must agree with [`valid_tool_key`].
    fn regex_lite_match(key: &str) -> bool {
        assert_eq!(
            TOOL_RULE_PATTERN,
            r"^[A-Za-z0-9_.-]{1,128}$|^[A-Za-z0-9_.-]{1,64}__\*$"
        );
        let class = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        let plain = (1..=128).contains(&key.len()) && key.chars().all(class);
        let prefixed = key
            .strip_suffix("__*")
            .is_some_and(|s| (1..=64).contains(&s.len()) && s.chars().all(class));
        plain || prefixed
    }

    #[test]
    fn validation_names_the_entry_and_the_limit() {
        let mut policy = ApprovalPolicy::default();
        policy.tools.insert("a b".into(), ApprovalRule::Always);
        let err = policy.validate().unwrap_err();
        assert!(err.contains("\"a b\""), "{err}");
        let many = ApprovalPolicy {
            default: ApprovalRule::Never,
            tools: (0..=MAX_TOOL_RULES)
                .map(|i| (format!("t{i}"), ApprovalRule::Always))
                .collect(),
        };
        assert!(many.validate().unwrap_err().contains("at most 64"));
        assert_eq!(ApprovalPolicy::default().validate(), Ok(()));
    }

    #[test]
    fn the_shape_reads_as_documented() {
        let policy: ApprovalPolicy = serde_json::from_value(serde_json::json!({
            "default": "when_not_read_only", "tools": { "write_file": "always" }
        }))
        .unwrap();
        assert_eq!(policy.default, ApprovalRule::WhenNotReadOnly);
        assert_eq!(policy.rule_for("write_file"), ApprovalRule::Always);
        let empty: ApprovalPolicy = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(empty, ApprovalPolicy::default());
        assert!(
            serde_json::from_value::<ApprovalPolicy>(serde_json::json!({ "defaults": "never" }))
                .is_err()
        );
    }

    #[test]
    fn decisions_round_trip_and_refusals_say_why() {
        for d in [Decision::Approve, Decision::Reject, Decision::Expired] {
            assert_eq!(Decision::parse(d.as_str()), Some(d));
        }
        assert_eq!(Decision::parse("maybe"), None);
        assert_eq!(refusal_text("write_file", Decision::Approve, None), None);
        let rejected = refusal_text("write_file", Decision::Reject, Some("not that file")).unwrap();
        assert!(rejected.contains("rejected") && rejected.contains("not that file"));
        let bare = refusal_text("write_file", Decision::Reject, Some("  ")).unwrap();
        assert!(bare.contains("rejected") && !bare.contains("Their message"));
        let expired = refusal_text("write_file", Decision::Expired, None).unwrap();
        assert!(expired.contains("expired") && !expired.contains("rejected"));
    }

    #[test]
    fn edited_arguments_come_only_with_an_approval_as_a_bounded_object() {
        let args = serde_json::json!({ "path": "docs/notes.md", "content": "hello" });
        assert_eq!(check_edited_arguments(Decision::Approve, None, 10), Ok(()));
        assert_eq!(check_edited_arguments(Decision::Reject, None, 10), Ok(()));
        assert_eq!(check_edited_arguments(Decision::Expired, None, 10), Ok(()));
        assert_eq!(
            check_edited_arguments(Decision::Approve, Some(&args), 1_000),
            Ok(())
        );
        for other in [Decision::Reject, Decision::Expired] {
            let err = check_edited_arguments(other, Some(&args), 1_000).unwrap_err();
            assert!(err.contains("only with `approve`"), "{err}");
            assert!(err.contains(other.as_str()), "{err}");
        }
        for not_object in [
            serde_json::json!([1]),
            serde_json::json!("x"),
            serde_json::json!(null),
            serde_json::json!(3),
        ] {
            let err =
                check_edited_arguments(Decision::Approve, Some(&not_object), 1_000).unwrap_err();
            assert!(err.contains("JSON object"), "{not_object}: {err}");
        }
        // The bound is on the JSON text, inclusive.
        let exact = args.to_string().len();
        assert_eq!(
            check_edited_arguments(Decision::Approve, Some(&args), exact),
            Ok(())
        );
        let err = check_edited_arguments(Decision::Approve, Some(&args), exact - 1).unwrap_err();
        assert!(
            err.contains(&format!("at most {}", exact - 1)) && err.contains(&exact.to_string()),
            "{err}"
        );
        assert_eq!(
            check_edited_arguments(Decision::Approve, Some(&serde_json::json!({})), 2),
            Ok(())
        );
    }

    #[test]
    fn the_edited_note_names_the_tool_and_the_arguments_it_ran_with() {
        let note = edited_note("fs__write_file", &serde_json::json!({ "path": "b.md" }));
        assert!(note.contains("`fs__write_file`"), "{note}");
        assert!(note.contains("edited"), "{note}");
        assert!(note.contains(r#"{"path":"b.md"}"#), "{note}");
        // Large arguments are excerpted, never repeated whole.
        let big = serde_json::json!({ "content": "x".repeat(100_000) });
        let note = edited_note("write_file", &big);
        assert!(note.len() < 10_000, "{}", note.len());
        assert!(note.contains("digest"), "{note}");
    }

    #[test]
    fn expiry_is_at_the_timeout_and_never_from_a_clock_behind() {
        assert!(!expired(999, 1_000));
        assert!(expired(1_000, 1_000));
        assert!(expired(5_000, 1_000));
        assert!(!expired(-1, 0));
        assert!(expired(0, 0));
    }
}
