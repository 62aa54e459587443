//! Bounded text: how much of an agent's output is stored, and how much of
//! it travels in histories (to agents, workers, models) and in pages of the
//! API. Whatever an agent sends, what Warden keeps per step is bounded.

use std::borrow::Cow;

use super::history::StepRecord;

/// Bytes of one output a history entry carries (head and tail), besides the marker.
pub const HISTORY_EXCERPT_BYTES: usize = 4_096;
/// Bytes of one output field a page of iterations shows without `?full=true`.
pub const PAGE_EXCERPT_BYTES: usize = 4_096;
/// A text at most this much longer than the excerpt size is kept whole, so
/// that an excerpt (excerpt size plus its marker) is never cut again.
const SLACK: usize = 512;

/// The largest char boundary of `text` at or below `i`.
fn floor_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest char boundary of `text` at or above `i`.
fn ceil_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `text` with at most `keep` bytes of its own: three quarters from its head
/// and one from its tail (where a final sentinel line or the end of a log
/// is), and between them the marker `marker(dropped)` gives.
fn cut(text: &str, keep: usize, marker: impl FnOnce(usize) -> String) -> String {
    let head = floor_boundary(text, keep - keep / 4);
    let tail = ceil_boundary(text, text.len() - (keep - head).min(text.len() - head));
    let dropped = tail - head;
    let marker = marker(dropped);
    let mut out = String::with_capacity(head + marker.len() + text.len() - tail);
    out.push_str(&text[..head]);
    out.push_str(&marker);
    out.push_str(&text[tail..]);
    out
}

/// The text stored of one output: whole up to `cap` bytes, otherwise cut to
/// `cap` bytes with a marker saying how many bytes were dropped. `None` when
/// it fits.
pub fn cap_stored(text: &str, cap: usize) -> Option<String> {
    (text.len() > cap).then(|| {
        cut(text, cap, |dropped| {
            format!(
                "\n[… {dropped} bytes dropped: the output was over the cap of {cap} bytes (WARDEN_MAX_OUTPUT_BYTES) …]\n"
            )
        })
    })
}

/// A stable 64-bit FNV-1a digest, hex: two excerpts of different texts
/// differ even when their kept bytes are the same.
fn digest(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What a history entry carries of one output of iteration `iteration`: the
/// whole text up to a few KiB, otherwise an excerpt whose marker names the
/// iteration that has the rest (and a digest of the whole, so equal
/// excerpts mean equal outputs).
pub fn history_excerpt(text: &str, iteration: u64) -> Cow<'_, str> {
    if text.len() <= HISTORY_EXCERPT_BYTES + SLACK {
        return Cow::Borrowed(text);
    }
    Cow::Owned(cut(text, HISTORY_EXCERPT_BYTES, |dropped| {
        format!(
            "\n[… {dropped} bytes not shown (digest {}); iteration {iteration} has the whole output …]\n",
            digest(text)
        )
    }))
}

/// What a page of iterations shows of one stored output without `?full=true`.
pub fn page_excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= PAGE_EXCERPT_BYTES + SLACK {
        return Cow::Borrowed(text);
    }
    Cow::Owned(cut(text, PAGE_EXCERPT_BYTES, |dropped| {
        format!("\n[… {dropped} bytes not shown: ?full=true gives the whole stored text …]\n")
    }))
}

/// What a model's conversation keeps of a message of an earlier step: the
/// whole text up to a few KiB, otherwise an excerpt.
pub fn conversation_excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= HISTORY_EXCERPT_BYTES + SLACK {
        return Cow::Borrowed(text);
    }
    Cow::Owned(cut(text, HISTORY_EXCERPT_BYTES, |dropped| {
        format!(
            "\n[… {dropped} bytes of an earlier step not shown; its iteration has them whole …]\n"
        )
    }))
}

/// Arguments as a history entry carries them: whole when their JSON is
/// small, otherwise an object with an excerpt, their size and a digest
/// (equal arguments still compare equal).
pub fn history_arguments(arguments: &serde_json::Value) -> Cow<'_, serde_json::Value> {
    if matches!(
        arguments,
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_)
    ) {
        return Cow::Borrowed(arguments);
    }
    let text = arguments.to_string();
    if text.len() <= HISTORY_EXCERPT_BYTES + SLACK {
        return Cow::Borrowed(arguments);
    }
    let head = floor_boundary(&text, HISTORY_EXCERPT_BYTES);
    Cow::Owned(serde_json::json!({
        "excerpt": &text[..head],
        "bytes": text.len(),
        "digest": digest(&text),
    }))
}

/// A step as the history keeps it: outputs, error and arguments excerpted
/// to a few KiB each, so the window of recent steps stays small whatever
/// the agent sent. Idempotent.
pub fn slim(record: &StepRecord) -> StepRecord {
    let n = record.number;
    StepRecord {
        number: n,
        action: history_excerpt(&record.action, n).into_owned(),
        arguments: history_arguments(&record.arguments).into_owned(),
        outcome: record.outcome,
        observation: history_excerpt(&record.observation, n).into_owned(),
        message: history_excerpt(&record.message, n).into_owned(),
        error: record
            .error
            .as_deref()
            .map(|e| history_excerpt(e, n).into_owned()),
        tokens: record.tokens,
        tool_calls: record.tool_calls,
        files_written: record.files_written.clone(),
        waiting: record.waiting,
        duration_ms: record.duration_ms,
        context_overflow: record.context_overflow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::history::tests::step;

    #[test]
    fn a_text_under_the_cap_is_stored_whole() {
        assert_eq!(cap_stored("short", 10), None);
        assert_eq!(cap_stored(&"x".repeat(10), 10), None);
    }

    #[test]
    fn a_text_over_the_cap_keeps_head_and_tail_and_says_what_was_dropped() {
        let text = format!("{}{}", "h".repeat(3_000), "t".repeat(1_000));
        let capped = cap_stored(&text, 1_000).unwrap();
        assert!(capped.starts_with(&"h".repeat(750)));
        assert!(capped.ends_with(&"t".repeat(250)));
        assert!(capped.contains("3000 bytes dropped"), "{capped}");
        assert!(capped.contains("cap of 1000 bytes"));
        let own = capped.len() - capped.find('\n').unwrap();
        assert!(capped.len() < 1_000 + 200, "{own}");
    }

    #[test]
    fn cuts_respect_character_boundaries() {
        let text = "é".repeat(5_000); // 10,000 bytes, two per char
        for cap in [999, 1_000, 1_001, 4_095] {
            let capped = cap_stored(&text, cap).unwrap();
            let kept = capped.chars().filter(|c| *c == 'é').count() * 2;
            assert!(kept <= cap, "{cap}: {kept}");
            assert!(kept + 2 >= cap, "{cap}: {kept}");
        }
    }

    #[test]
    fn a_history_excerpt_names_the_iteration_and_is_bounded() {
        let big = "a".repeat(3_500_000);
        let e = history_excerpt(&big, 7);
        assert!(e.len() < HISTORY_EXCERPT_BYTES + 256, "{}", e.len());
        assert!(e.contains("iteration 7 has the whole output"));
        assert!(e.contains(&format!("{} bytes not shown", 3_500_000 - 4_096)));
        // Small texts travel whole.
        assert_eq!(history_excerpt("ok", 1), "ok");
    }

    #[test]
    fn excerpts_of_different_texts_differ_and_excerpting_is_idempotent() {
        let a = format!("{}{}{}", "x".repeat(5_000), "A", "x".repeat(5_000));
        let b = format!("{}{}{}", "x".repeat(5_000), "B", "x".repeat(5_000));
        let ea = history_excerpt(&a, 1);
        assert_ne!(ea, history_excerpt(&b, 1));
        assert_eq!(ea, history_excerpt(&a, 1));
        assert_eq!(history_excerpt(&ea, 1), ea);
        assert_eq!(page_excerpt(&page_excerpt(&a)), page_excerpt(&a));
    }

    #[test]
    fn big_arguments_are_replaced_by_an_excerpt_with_a_digest() {
        let small = serde_json::json!({ "path": "a.txt" });
        assert_eq!(history_arguments(&small).as_ref(), &small);
        let big = serde_json::json!({ "content": "z".repeat(100_000) });
        let other = serde_json::json!({ "content": "y".repeat(100_000) });
        let slim = history_arguments(&big);
        assert!(slim.to_string().len() < HISTORY_EXCERPT_BYTES + 256);
        assert_eq!(slim, history_arguments(&big));
        assert_ne!(slim, history_arguments(&other));
        assert_eq!(history_arguments(&slim), slim);
    }

    #[test]
    fn a_slim_step_is_small_and_slimming_twice_changes_nothing() {
        let mut s = step(3, "act");
        s.observation = "o".repeat(3_500_000);
        s.message = "m".repeat(3_500_000);
        s.error = Some("e".repeat(1_000_000));
        let slim1 = slim(&s);
        let size = serde_json::to_string(&slim1).unwrap().len();
        assert!(size < 4 * (HISTORY_EXCERPT_BYTES + 256), "{size}");
        assert_eq!(slim(&slim1), slim1);
        let small = step(4, "act");
        assert_eq!(slim(&small), small);
    }
}
