//! Notifications, the pure part: which session events notify a person, the
//! bytes sent for one (a Standard Webhooks message or a Slack-compatible
//! `{"text"}`), its Standard Webhooks v1 signature, and when a failed
//! delivery is tried again (exponential backoff with jitter, `Retry-After`,
//! a 410 that disables the target). The outbox and the HTTP calls that use
//! these live in `session::notify` and `store::notify`.

use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;
use utoipa::ToSchema;

/// Event kinds that always notify. `budget_warning` and
/// `awaiting_confirmation` are kinds of the soft budgets and the confirmation
/// before start: they notify as soon as a session logs them. The trigger
/// `warden_notify_event` (migrations/0033_confirmation_and_tenant_warn_at.sql,
/// after 0029) names the same kinds; a test checks they agree.
pub const NOTIFYING_KINDS: [&str; 3] = [
    "approval_requested",
    "budget_warning",
    "awaiting_confirmation",
];

/// Statuses a `status_changed` event notifies on: the ends and pauses (but
/// see [`QUIET_PAUSE_REASONS`]). A wait for a confirmation notifies by its
/// own `awaiting_confirmation` event, which carries the estimate, not by
/// its status change (one notification, not two).
pub const NOTIFYING_STATUSES: [&str; 5] =
    ["completed", "stopped", "interrupted", "failed", "paused"];

/// Pauses that need no one: a person asked for it, or the session waits
/// for its own children.
pub const QUIET_PAUSE_REASONS: [&str; 2] = ["user_pause", "waiting_for_children"];

/// Largest body sent, bytes: an event larger than this is sent without its
/// data (`"truncated": true`); the session's log keeps it whole.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Delivery attempts before a notification is given up (`failed`).
pub const MAX_ATTEMPTS: u32 = 8;

/// Longest wait a `Retry-After` may ask for; longer asks wait this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The waits after the 1st, 2nd, … failed attempt (Standard Webhooks'
/// schedule); the last repeats.
const SCHEDULE: [Duration; 6] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
];

/// Prefix of a signing secret as shown to its owner (Standard Webhooks').
pub const SECRET_PREFIX: &str = "whsec_";

/// The shape of the body a target receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// A Standard Webhooks message: `{type, timestamp, data}`.
    Standard,
    /// A Slack-compatible incoming webhook: `{"text": ...}`.
    Slack,
}

impl Format {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Standard => "standard",
            Format::Slack => "slack",
        }
    }

    /// Parses a stored name; unknown names read as `standard`.
    pub fn parse(raw: &str) -> Format {
        match raw {
            "slack" => Format::Slack,
            _ => Format::Standard,
        }
    }
}

/// Whether an event of `kind` with `data` notifies a person.
pub fn notifies(kind: &str, data: &Value) -> bool {
    if NOTIFYING_KINDS.contains(&kind) {
        return true;
    }
    if kind != "status_changed" {
        return false;
    }
    let to = data.get("to").and_then(Value::as_str).unwrap_or_default();
    let reason = data
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    NOTIFYING_STATUSES.contains(&to) && !(to == "paused" && QUIET_PAUSE_REASONS.contains(&reason))
}

/// The message type of an event, as `type` of a Standard Webhooks body.
pub fn message_type(kind: &str, data: &Value) -> &'static str {
    match kind {
        "approval_requested" => "session.approval_required",
        "budget_warning" => "session.budget_warning",
        "awaiting_confirmation" => "session.awaiting_confirmation",
        _ => match data.get("to").and_then(Value::as_str).unwrap_or_default() {
            "paused" => "session.paused",
            "awaiting_confirmation" => "session.awaiting_confirmation",
            _ => "session.ended",
        },
    }
}

/// What a notification is about: the event and the session it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject<'a> {
    /// The session.
    pub session_id: uuid::Uuid,
    /// Its tenant.
    pub tenant: &'a str,
    /// Its goal (shortened for Slack).
    pub goal: &'a str,
    /// The event's place in the session's log.
    pub seq: i64,
    /// The event's kind.
    pub kind: &'a str,
    /// The event's data.
    pub data: &'a Value,
    /// When the event was logged, RFC 3339.
    pub at: &'a str,
}

/// The exact bytes sent for `subject` to a target of `format`, at most
/// [`MAX_BODY_BYTES`] (the event's data is left out when it would not fit).
pub fn body(format: Format, subject: &Subject<'_>) -> Vec<u8> {
    let whole = render(format, subject, Some(subject.data));
    if whole.len() <= MAX_BODY_BYTES {
        return whole;
    }
    render(format, subject, None)
}

fn render(format: Format, s: &Subject<'_>, data: Option<&Value>) -> Vec<u8> {
    let kind = message_type(s.kind, s.data);
    let doc = match format {
        Format::Standard => json!({
            "type": kind,
            "timestamp": s.at,
            "data": {
                "session_id": s.session_id,
                "tenant": s.tenant,
                "seq": s.seq,
                "kind": s.kind,
                "event": data.cloned().unwrap_or(Value::Null),
                "truncated": data.is_none(),
            }
        }),
        Format::Slack => json!({ "text": slack_text(kind, s, data.is_some()) }),
    };
    serde_json::to_vec(&doc).unwrap_or_default()
}

fn slack_text(kind: &str, s: &Subject<'_>, with_detail: bool) -> String {
    let goal = shorten(s.goal, 200);
    let field = |k: &str| s.data.get(k).and_then(Value::as_str).unwrap_or_default();
    let detail = match kind {
        "session.ended" | "session.paused" => {
            let summary = shorten(field("summary"), 500);
            format!("{} ({}) {summary}", field("to"), field("reason"))
        }
        "session.approval_required" => format!("waits for approval of {}", field("tool")),
        _ => String::new(),
    };
    let detail = if with_detail { detail } else { String::new() };
    format!(
        "Warden {kind}: session {} \u{2014} {goal}\n{}",
        s.session_id,
        detail.trim()
    )
    .trim_end()
    .to_string()
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max_chars).collect();
    cut.push('\u{2026}');
    cut
}

/// The `webhook-id` of a notification: stable across its retries, so a
/// receiver can drop a repeat.
pub fn message_id(id: uuid::Uuid) -> String {
    format!("msg_{}", id.simple())
}

/// A new signing secret as its owner writes it: `whsec_` and the base64 of
/// 32 random bytes.
pub fn secret_text(random: &[u8; 32]) -> String {
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(random)
    )
}

/// The key bytes of a secret written as [`secret_text`] does (or plain
/// base64); `None` when it is not one.
pub fn secret_bytes(text: &str) -> Option<Vec<u8>> {
    let raw = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
    base64::engine::general_purpose::STANDARD.decode(raw).ok()
}

/// One Standard Webhooks v1 signature: `v1,` and the base64 of
/// HMAC-SHA256(`key`, `"{id}.{timestamp}.{body}"`).
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// The `webhook-signature` header: one signature per key (the current
/// secret, and the previous one while a rotation is fresh), space-separated.
pub fn signature_header(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| signature(k, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How one delivery attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The receiver answered this HTTP status, with its `Retry-After` in
    /// seconds when it gave one.
    Status {
        /// The status.
        code: u16,
        /// `Retry-After`, seconds.
        retry_after: Option<u64>,
    },
    /// No answer: refused, timed out, or the egress policy refused the address.
    Transport,
}

/// What to do after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Delivered: nothing more.
    Delivered,
    /// Try again after this long.
    Retry(Duration),
    /// Attempts are used up: give the notification up.
    GiveUp,
    /// 410 Gone: the receiver asked to stop; disable the target.
    Disable,
}

/// What follows attempt number `attempt` (1 for the first) that got
/// `answer`, with `random` in [0, 1) for the jitter.
pub fn next_step(attempt: u32, answer: &Answer, random: f64) -> Next {
    let retry_after = match answer {
        Answer::Status { code, .. } if (200..300).contains(code) => return Next::Delivered,
        Answer::Status { code: 410, .. } => return Next::Disable,
        Answer::Status { retry_after, .. } => *retry_after,
        Answer::Transport => None,
    };
    if attempt >= MAX_ATTEMPTS {
        return Next::GiveUp;
    }
    let backoff = backoff(attempt, random);
    let asked = retry_after.map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
    Next::Retry(asked.map_or(backoff, |a| a.max(backoff)))
}

/// The wait after failed attempt `attempt` (1-based): the schedule's step,
/// scaled by a jitter of ±20 % from `random` in [0, 1), so receivers that
/// failed together are not retried together.
pub fn backoff(attempt: u32, random: f64) -> Duration {
    let index = (attempt.max(1) as usize - 1).min(SCHEDULE.len() - 1);
    let random = if random.is_finite() {
        random.clamp(0.0, 1.0)
    } else {
        0.5
    };
    SCHEDULE[index].mul_f64(0.8 + 0.4 * random)
}

/// `Retry-After` as seconds from now: delta-seconds, or an HTTP date
/// (`now` is the Unix time of the answer). `None` when unreadable.
pub fn retry_after_seconds(header: &str, now: i64) -> Option<u64> {
    let header = header.trim();
    if let Ok(secs) = header.parse::<u64>() {
        return Some(secs);
    }
    let at = chrono::DateTime::parse_from_rfc2822(header).ok()?;
    Some(at.timestamp().saturating_sub(now).max(0) as u64)
}

/// A URL as shown back (scheme, host and port): its path and query can be
/// the secret of an incoming webhook.
pub fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match (u.host_str(), u.port()) {
            (Some(h), Some(p)) => format!("{}://{h}:{p}/\u{2026}", u.scheme()),
            (Some(h), None) => format!("{}://{h}/\u{2026}", u.scheme()),
            _ => "<invalid url>".into(),
        },
        Err(_) => "<invalid url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended() -> Value {
        json!({"from": "running", "to": "completed", "reason": "goal_achieved", "summary": "done"})
    }

    fn subject(data: &Value) -> Subject<'_> {
        Subject {
            session_id: uuid::Uuid::nil(),
            tenant: "acme",
            goal: "Write the report",
            seq: 7,
            kind: "status_changed",
            data,
            at: "2026-11-27T14:00:00Z",
        }
    }

    #[test]
    fn ends_approvals_warnings_and_pauses_for_a_person_notify() {
        assert!(notifies("status_changed", &ended()));
        assert!(notifies("approval_requested", &json!({})));
        assert!(notifies("budget_warning", &json!({"threshold": 0.8})));
        assert!(notifies("awaiting_confirmation", &json!({})));
        assert!(!notifies(
            "status_changed",
            &json!({"to": "awaiting_confirmation"})
        ));
        for to in ["stopped", "interrupted", "failed"] {
            assert!(notifies("status_changed", &json!({"to": to})), "{to}");
        }
        let review = json!({"to": "paused", "reason": "review_required"});
        assert!(notifies("status_changed", &review));
    }

    #[test]
    fn running_steps_and_quiet_pauses_do_not_notify() {
        assert!(!notifies("iteration_completed", &json!({})));
        assert!(!notifies("status_changed", &json!({"to": "running"})));
        assert!(!notifies("status_changed", &json!({"to": "queued"})));
        for reason in QUIET_PAUSE_REASONS {
            let pause = json!({"to": "paused", "reason": reason});
            assert!(!notifies("status_changed", &pause), "{reason}");
        }
    }

    #[test]
    fn the_trigger_names_the_same_kinds_statuses_and_quiet_reasons() {
        let sql = include_str!("../../migrations/0033_confirmation_and_tenant_warn_at.sql");
        let sql = &sql[sql
            .find("CREATE OR REPLACE FUNCTION warden_notify_event")
            .unwrap()..];
        for name in NOTIFYING_KINDS
            .iter()
            .chain(&NOTIFYING_STATUSES)
            .chain(&QUIET_PAUSE_REASONS)
        {
            assert!(
                sql.contains(&format!("'{name}'")),
                "{name} not in the trigger"
            );
        }
    }

    #[test]
    fn message_types_name_what_happened() {
        assert_eq!(message_type("status_changed", &ended()), "session.ended");
        let pause = json!({"to": "paused"});
        assert_eq!(message_type("status_changed", &pause), "session.paused");
        let approval = message_type("approval_requested", &json!({}));
        assert_eq!(approval, "session.approval_required");
        let warning = message_type("budget_warning", &json!({}));
        assert_eq!(warning, "session.budget_warning");
    }

    #[test]
    fn a_standard_body_carries_the_event_and_a_slack_body_only_text() {
        let data = ended();
        let std: Value = serde_json::from_slice(&body(Format::Standard, &subject(&data))).unwrap();
        assert_eq!(std["type"], "session.ended");
        assert_eq!(std["data"]["seq"], 7);
        assert_eq!(std["data"]["event"]["reason"], "goal_achieved");
        assert_eq!(std["data"]["truncated"], false);
        let slack: Value = serde_json::from_slice(&body(Format::Slack, &subject(&data))).unwrap();
        let text = slack["text"].as_str().unwrap();
        assert!(text.contains("session.ended") && text.contains("Write the report"));
        assert!(text.contains("completed (goal_achieved) done"), "{text}");
        assert_eq!(slack.as_object().unwrap().len(), 1);
    }

    #[test]
    fn a_huge_event_is_sent_without_its_data() {
        let data = json!({"to": "completed", "summary": "x".repeat(MAX_BODY_BYTES * 2)});
        for format in [Format::Standard, Format::Slack] {
            let sent = body(format, &subject(&data));
            assert!(sent.len() <= MAX_BODY_BYTES, "{format:?}");
        }
        let std: Value = serde_json::from_slice(&body(Format::Standard, &subject(&data))).unwrap();
        assert_eq!(std["data"]["truncated"], true);
        assert_eq!(std["data"]["event"], Value::Null);
    }

    #[test]
    fn the_signature_is_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let key = secret_bytes("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_rotated_secret_signs_with_both_keys() {
        let header = signature_header(&[b"new".to_vec(), b"old".to_vec()], "msg_1", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature(b"new", "msg_1", 1, b"{}"));
        assert_eq!(parts[1], signature(b"old", "msg_1", 1, b"{}"));
    }

    #[test]
    fn secrets_round_trip_through_their_text() {
        let text = secret_text(&[7u8; 32]);
        assert!(text.starts_with("whsec_"));
        assert_eq!(secret_bytes(&text).unwrap(), vec![7u8; 32]);
        assert!(secret_bytes("whsec_!!").is_none());
    }

    #[test]
    fn the_schedule_backs_off_with_bounded_jitter() {
        let expect = [5, 300, 1800, 7200, 18000, 36000, 36000];
        for (i, secs) in expect.iter().enumerate() {
            let attempt = i as u32 + 1;
            let base = Duration::from_secs(*secs);
            assert_eq!(backoff(attempt, 0.5), base, "attempt {attempt}");
            assert_eq!(backoff(attempt, 0.0), base.mul_f64(0.8));
            assert!(backoff(attempt, 0.999_999) < base.mul_f64(1.2));
        }
        assert_eq!(backoff(1, f64::NAN), Duration::from_secs(5));
        assert_eq!(backoff(1, 7.0), Duration::from_secs(6));
    }

    #[test]
    fn answers_decide_delivered_retry_give_up_or_disable() {
        let ok = Answer::Status {
            code: 204,
            retry_after: None,
        };
        assert_eq!(next_step(1, &ok, 0.5), Next::Delivered);
        let gone = Answer::Status {
            code: 410,
            retry_after: None,
        };
        assert_eq!(next_step(1, &gone, 0.5), Next::Disable);
        let busy = Answer::Status {
            code: 503,
            retry_after: None,
        };
        assert_eq!(
            next_step(1, &busy, 0.5),
            Next::Retry(Duration::from_secs(5))
        );
        assert_eq!(
            next_step(2, &Answer::Transport, 0.5),
            Next::Retry(Duration::from_secs(300))
        );
        assert_eq!(next_step(MAX_ATTEMPTS, &busy, 0.5), Next::GiveUp);
    }

    #[test]
    fn retry_after_is_honoured_but_bounded() {
        let later = Answer::Status {
            code: 429,
            retry_after: Some(60),
        };
        assert_eq!(
            next_step(1, &later, 0.5),
            Next::Retry(Duration::from_secs(60))
        );
        // Never sooner than the schedule.
        let sooner = Answer::Status {
            code: 429,
            retry_after: Some(1),
        };
        assert_eq!(
            next_step(2, &sooner, 0.5),
            Next::Retry(Duration::from_secs(300))
        );
        let forever = Answer::Status {
            code: 503,
            retry_after: Some(u64::MAX),
        };
        assert_eq!(next_step(1, &forever, 0.5), Next::Retry(MAX_RETRY_AFTER));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after_seconds(" 120 ", 0), Some(120));
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        let at = chrono::DateTime::parse_from_rfc2822(date)
            .unwrap()
            .timestamp();
        assert_eq!(retry_after_seconds(date, at - 30), Some(30));
        assert_eq!(retry_after_seconds(date, at + 30), Some(0));
        assert_eq!(retry_after_seconds("soon", 0), None);
    }

    #[test]
    fn shown_urls_hide_path_query_and_credentials() {
        let shown = shown_url("https://u:p@hooks.slack.com/services/T0/B0/XXX?x=1");
        assert_eq!(shown, "https://hooks.slack.com/\u{2026}");
        assert_eq!(
            shown_url("http://127.0.0.1:9/x"),
            "http://127.0.0.1:9/\u{2026}"
        );
        assert_eq!(shown_url("nope"), "<invalid url>");
    }
}
