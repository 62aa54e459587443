//! Helpers of the failure model: making an agent's output storable (and
//! of bounded size) before it is committed. (The control path reads a lease
//! under the session's row lock with `store::owner_liveness_on`, and
//! rebuilds its state there with `rehydrate::rebuild_locked`.)

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::executor::{ExecutorError, StepResult};
use crate::policy::{excerpt, sentinel};
use crate::store;

/// Replaces NUL characters (which Postgres can store neither in `text` nor
/// in `jsonb`) in every string of `value`, keys included; returns how many.
pub fn strip_nul_value(value: &mut Value) -> usize {
    match value {
        Value::String(s) => strip_nul(s),
        Value::Array(items) => items.iter_mut().map(strip_nul_value).sum(),
        Value::Object(map) => {
            let mut n = 0;
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (mut k, v) in old {
                    n += strip_nul(&mut k);
                    map.insert(k, v);
                }
            }
            n + map.values_mut().map(strip_nul_value).sum::<usize>()
        }
        _ => 0,
    }
}

/// Replaces NUL characters in every string of a typed value (a transcript,
/// an executor's event) through its JSON form; returns how many. Replacing
/// a character inside a string keeps the value's shape, so it reads back.
fn strip_nul_typed<T: Serialize + DeserializeOwned>(value: &mut T) -> usize {
    let Ok(mut json) = serde_json::to_value(&*value) else {
        return 0;
    };
    let n = strip_nul_value(&mut json);
    if n == 0 {
        return 0;
    }
    match serde_json::from_value(json) {
        Ok(clean) => {
            *value = clean;
            n
        }
        // Left as it was: its commit fails, and the failure model counts it.
        Err(_) => 0,
    }
}

/// Replaces NUL characters in `s`; returns how many.
pub fn strip_nul(s: &mut String) -> usize {
    let n = s.matches('\0').count();
    if n > 0 {
        *s = store::storable_text(s);
    }
    n
}

/// Holds what an executor answered to `cap` bytes per text (outputs,
/// message, error, arguments, signal reason, transcript messages), each cut
/// with a marker saying how much was dropped, so a step stores and keeps a
/// bounded size whatever the agent sent. A stop sentinel is read from the
/// whole message first. Returns the bytes dropped.
pub fn cap_output(result: &mut Result<StepResult, ExecutorError>, cap: usize) -> usize {
    let text = |s: &mut String| match excerpt::cap_stored(s, cap) {
        Some(capped) => {
            let dropped = s.len().saturating_sub(cap);
            *s = capped;
            dropped
        }
        None => 0,
    };
    match result {
        Ok(
            StepResult::Exhausted
            | StepResult::OverBudget { .. }
            | StepResult::NoWorker { .. }
            | StepResult::Abandoned,
        ) => 0,
        Ok(StepResult::Step(out)) => {
            if out.signal.is_none() {
                out.signal = sentinel::detect(&out.message);
            }
            // A name and a reason travel in events too: a few KiB at most.
            let short = |s: &mut String| match excerpt::cap_stored(s, SHORT_TEXT_BYTES.min(cap)) {
                Some(capped) => {
                    let dropped = s.len().saturating_sub(SHORT_TEXT_BYTES.min(cap));
                    *s = capped;
                    dropped
                }
                None => 0,
            };
            let mut n =
                short(&mut out.action) + text(&mut out.observation) + text(&mut out.message);
            if let Some(e) = out.error.as_mut() {
                n += text(e);
            }
            if let Some(r) = out.signal.as_mut().and_then(|s| s.reason.as_mut()) {
                n += short(r);
            }
            if !out.arguments.is_null() {
                let mut json = out.arguments.to_string();
                let dropped = text(&mut json);
                if dropped > 0 {
                    n += dropped;
                    out.arguments = serde_json::json!({ "capped": json });
                }
            }
            for m in out.transcript.iter_mut().flatten() {
                if let Some(c) = m.content.as_mut() {
                    n += text(c);
                }
                for call in &mut m.tool_calls {
                    n += text(&mut call.function.arguments);
                }
            }
            n
        }
        Err(ExecutorError::Failed {
            action, message, ..
        }) => {
            let n = excerpt::cap_stored(action, SHORT_TEXT_BYTES.min(cap)).map_or(0, |capped| {
                let dropped = action.len().saturating_sub(SHORT_TEXT_BYTES.min(cap));
                *action = capped;
                dropped
            });
            n + text(message)
        }
    }
}

/// Bytes kept of an action name or a signal's reason, which events carry too.
const SHORT_TEXT_BYTES: usize = 4_096;

/// Makes what an executor answered storable: an agent that sends a NUL
/// must not make every commit of its session fail.
/// Returns how many characters were replaced, for the record.
pub fn make_storable(result: &mut Result<StepResult, ExecutorError>) -> usize {
    match result {
        Ok(
            StepResult::Exhausted
            | StepResult::OverBudget { .. }
            | StepResult::NoWorker { .. }
            | StepResult::Abandoned,
        ) => 0,
        Ok(StepResult::Step(out)) => {
            let mut n = strip_nul(&mut out.action)
                + strip_nul_value(&mut out.arguments)
                + strip_nul(&mut out.observation)
                + strip_nul(&mut out.message);
            if let Some(e) = out.error.as_mut() {
                n += strip_nul(e);
            }
            for f in &mut out.files_written {
                n += strip_nul(&mut f.path) + strip_nul(&mut f.digest);
            }
            if let Some(r) = out.signal.as_mut().and_then(|s| s.reason.as_mut()) {
                n += strip_nul(r);
            }
            if let Some(t) = out.transcript.as_mut() {
                n += strip_nul_typed(t);
            }
            for e in &mut out.events {
                n += strip_nul_typed(e);
            }
            if let Some(c) = out.cycle_change.as_mut() {
                n += strip_nul(&mut c.memory);
            }
            n
        }
        Err(ExecutorError::Failed {
            action, message, ..
        }) => strip_nul(action) + strip_nul(message),
    }
}

/// Makes a reflection model's answer storable (NUL characters replaced in
/// its raw text, its error and every text of its assessment); returns how
/// many were replaced.
pub fn make_reflection_storable(answer: &mut super::reflector::ReflectionAnswer) -> usize {
    let mut n = answer.raw.as_mut().map_or(0, strip_nul);
    match &mut answer.assessment {
        Ok(a) => {
            n += strip_nul(&mut a.reasoning);
            for s in a
                .next_steps
                .iter_mut()
                .chain(a.milestones_done.iter_mut())
                .chain(a.criteria_met.iter_mut())
            {
                n += strip_nul(s);
            }
        }
        Err(e) => n += strip_nul(e),
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strips_nul_everywhere_and_counts() {
        let mut v = json!({"a": ["x\u{0}y", {"k\u{0}": "\u{0}\u{0}"}], "n": 1});
        assert_eq!(strip_nul_value(&mut v), 4);
        assert!(!v.to_string().contains("\\u0000"));
        assert_eq!(v["a"][0], "x\u{FFFD}y");
    }
}
