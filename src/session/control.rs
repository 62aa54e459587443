//! Helpers of the control path and the failure model: rebuilding a
//! session's loop state on the connection that holds its row lock, and
//! making an agent's output storable before it is committed.

use serde_json::Value;
use uuid::Uuid;

use super::service::ServiceError;
use super::state::{AppliedReflection, LoopState, StepEffects};
use crate::executor::{ExecutorError, StepResult};
use crate::policy::history::StepRecord;
use crate::store::{self, RebuildInputs, SessionRecord, StoreError};

/// Rebuilds the loop state of `session` from what `inputs` holds: its latest
/// checkpoint plus the iterations (and reflections) committed after it.
pub fn replay(session: &SessionRecord, inputs: RebuildInputs) -> Result<LoopState, StoreError> {
    let id = session.id;
    let corrupt = |detail: String| StoreError::Corrupt { id, detail };
    let mut state = match inputs.checkpoint {
        Some(c) => serde_json::from_value::<LoopState>(c.state)
            .map_err(|e| corrupt(format!("checkpoint {}: {e}", c.id)))?,
        None => LoopState::for_session(session),
    };
    let mut reflections = inputs.reflections.into_iter().peekable();
    for it in inputs.iterations {
        let record: StepRecord = serde_json::from_value(it.record)
            .map_err(|e| corrupt(format!("iteration {}: {e}", it.number)))?;
        let effects: StepEffects = serde_json::from_value(it.effects)
            .map_err(|e| corrupt(format!("iteration {} effects: {e}", it.number)))?;
        state.apply(it.run, &record, &effects);
        // Reflections replay right after the iteration they followed.
        while let Some(r) = reflections.next_if(|r| r.after_iteration <= it.number) {
            let applied: AppliedReflection = serde_json::from_value(r.decision)
                .map_err(|e| corrupt(format!("reflection {}: {e}", r.number)))?;
            state.apply_reflection(&applied);
        }
    }
    // A newer run than the state knows means a person resumed after the
    // last stored step: the per-run counters start over.
    if session.run > state.run {
        state.begin_run(session.run);
    }
    Ok(state)
}

/// Rebuilds the loop state of a session the caller has row-locked on
/// `conn`. Everything is read on that same connection: a handler that held
/// the lock and asked the pool for a second connection could exhaust the
/// pool with a handful of concurrent stops (issue 13, defect 1).
pub async fn rebuild_locked(
    conn: &mut sqlx::PgConnection,
    session: &SessionRecord,
) -> Result<LoopState, ServiceError> {
    let inputs = store::rebuild_inputs_on(conn, session.id).await?;
    Ok(replay(session, inputs)?)
}

/// Whether the lease of `id` lapsed, read under the caller's lock on `conn`.
pub async fn lease_lapsed_locked(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
) -> Result<bool, ServiceError> {
    Ok(store::lease_lapsed_on(conn, id).await?)
}

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

/// Replaces NUL characters in `s`; returns how many.
pub fn strip_nul(s: &mut String) -> usize {
    let n = s.matches('\0').count();
    if n > 0 {
        *s = store::storable_text(s);
    }
    n
}

/// Makes what an executor answered storable: an agent that sends a NUL
/// must not make every commit of its session fail (issue 13, defect 5).
/// Returns how many characters were replaced, for the record.
pub fn make_storable(result: &mut Result<StepResult, ExecutorError>) -> usize {
    match result {
        Ok(StepResult::Exhausted) => 0,
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
                n += strip_nul_value(t);
            }
            for e in &mut out.events {
                n += strip_nul_value(&mut e.data);
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

/// The first string in `value` (or key) that holds a NUL character, as a
/// path such as `executor.steps[0].output`; `None` when there is none.
pub fn find_nul(value: &Value) -> Option<String> {
    fn walk(value: &Value, path: &mut String) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().enumerate().any(|(i, v)| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = walk(v, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::Object(map) => map.iter().any(|(k, v)| {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&k.replace('\0', "\\u0000"));
                let found = k.contains('\0') || walk(v, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            _ => false,
        }
    }
    let mut path = String::new();
    walk(value, &mut path).then(|| if path.is_empty() { ".".into() } else { path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_path_of_the_first_nul() {
        assert_eq!(find_nul(&json!({"goal": "ok"})), None);
        assert_eq!(
            find_nul(&json!({"goal": "a\u{0}b"})).as_deref(),
            Some("goal")
        );
        let v =
            json!({"goal": "ok", "executor": {"steps": [{"output": "x"}, {"output": "\u{0}"}]}});
        assert_eq!(find_nul(&v).as_deref(), Some("executor.steps[1].output"));
        assert_eq!(find_nul(&json!("\u{0}")).as_deref(), Some("."));
        assert!(find_nul(&json!({"a\u{0}": 1})).is_some());
    }

    #[test]
    fn strips_nul_everywhere_and_counts() {
        let mut v = json!({"a": ["x\u{0}y", {"k\u{0}": "\u{0}\u{0}"}], "n": 1});
        assert_eq!(strip_nul_value(&mut v), 4);
        assert_eq!(find_nul(&v), None);
        assert_eq!(v["a"][0], "x\u{FFFD}y");
    }
}
