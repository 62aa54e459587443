//! Between typed session events and the rows the store appends and reads:
//! a payload that cannot be encoded is an error, never a stored `null`.

use uuid::Uuid;

use crate::event::SessionEvent;
use crate::store::{EventRecord, JsonText, NewEvent, StoreError};

/// A value that could not be encoded for storage, as a storage error: the
/// write it belonged to fails instead of storing `null`.
pub fn encode_error(what: &str, err: serde_json::Error) -> StoreError {
    StoreError::Database(sqlx::Error::Encode(
        format!("cannot encode {what}: {err}").into(),
    ))
}

/// Serializes `value` for storage; failures become storage errors.
pub fn to_stored<T: serde::Serialize + ?Sized>(
    what: &str,
    value: &T,
) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(value).map_err(|e| encode_error(what, e))
}

/// Serializes `value` for storage as JSON text, with no `Value` on the way.
pub fn to_stored_text<T: serde::Serialize + ?Sized>(
    what: &str,
    value: &T,
) -> Result<JsonText, StoreError> {
    JsonText::of(value).map_err(|e| encode_error(what, e))
}

/// Encodes events for the store.
pub fn encode(events: &[SessionEvent]) -> Result<Vec<NewEvent>, StoreError> {
    events.iter().map(NewEvent::from_event).collect()
}

/// Reads a stored event back; a row that does not decode is corrupt.
pub fn decode(session_id: Uuid, record: &EventRecord) -> Result<SessionEvent, StoreError> {
    SessionEvent::from_parts(&record.kind, &record.data).map_err(|e| StoreError::Corrupt {
        id: session_id,
        detail: format!("event {} ({}): {e}", record.seq, record.kind),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_value_that_cannot_be_json_is_an_error_not_null() {
        // JSON object keys must be strings; a tuple key cannot be encoded.
        let value: BTreeMap<(u8, u8), u8> = BTreeMap::from([((1, 2), 3)]);
        let err = to_stored("test value", &value).unwrap_err();
        assert!(
            err.to_string().contains("cannot encode test value"),
            "{err}"
        );
    }

    #[test]
    fn events_become_rows_with_their_kind_and_payload() {
        let rows = encode(&[SessionEvent::StopRequested {}]).unwrap();
        assert_eq!(
            rows,
            [NewEvent::new("stop_requested", serde_json::json!({}))]
        );
    }

    #[test]
    fn a_row_that_does_not_decode_is_corrupt() {
        let record = EventRecord {
            seq: 7,
            kind: "step_abandoned".into(),
            data: serde_json::json!({ "step": "seven" }),
            created_at: chrono::Utc::now(),
            actor: None,
        };
        let err = decode(Uuid::nil(), &record).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }
}
