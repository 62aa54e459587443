//! The control channel: a Postgres NOTIFY that carries stop and pause
//! requests to every replica, and the owner's word that a stopped run
//! ended. NOTIFY only makes them fast; the durable flags and status on the
//! session row, read at each commit and heartbeat, are the truth.
//! On the embedded server the notes travel in this process instead.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use super::{Result, Store};

/// The Postgres channel that carries stop and pause requests between replicas.
pub const CONTROL_CHANNEL: &str = "warden_control";

/// The Postgres channel on which a trigger announces that an API key was
/// created, revoked or changed (payload: its public prefix), by any writer.
pub const KEYS_CHANNEL: &str = "warden_keys";

/// What a control notification asks of the replica running the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlAction {
    /// Stop the session.
    Stop,
    /// Pause the session.
    Pause,
    /// Settings (mode, limits) changed: the owner refreshes what it serves
    /// from memory.
    Changed,
    /// The owner's run of the session ended with a stop requested: a
    /// replica waiting to answer that stop reads the row again. Replicas of
    /// earlier versions ignore it (and poll the row).
    Ended,
}

impl ControlAction {
    /// The name sent on the channel.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Stop => "stop",
            ControlAction::Pause => "pause",
            ControlAction::Changed => "changed",
            ControlAction::Ended => "ended",
        }
    }
}

/// One control notification. On the wire it is `action:session_id` (e.g.
/// `stop:6f1c…`), the format replicas of earlier versions send and expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlNote {
    /// What to do.
    pub action: ControlAction,
    /// To which session.
    pub session_id: Uuid,
}

impl fmt::Display for ControlNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.action.as_str(), self.session_id)
    }
}

/// A payload that is not a control note.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a control note: {0:?}")]
pub struct BadControlNote(pub String);

impl FromStr for ControlNote {
    type Err = BadControlNote;

    fn from_str(payload: &str) -> std::result::Result<ControlNote, BadControlNote> {
        let bad = || BadControlNote(payload.to_string());
        let (action, id) = payload.split_once(':').ok_or_else(bad)?;
        let action = match action {
            "stop" => ControlAction::Stop,
            "pause" => ControlAction::Pause,
            "changed" => ControlAction::Changed,
            "ended" => ControlAction::Ended,
            _ => return Err(bad()),
        };
        let session_id = id.parse().map_err(|_| bad())?;
        Ok(ControlNote { action, session_id })
    }
}

impl Store {
    /// Tells every replica that a control flag of `id` changed.
    pub async fn notify_control(&self, action: ControlAction, id: Uuid) -> Result<()> {
        let note = ControlNote {
            action,
            session_id: id,
        };
        if let Some(local) = &self.local_control {
            // No receiver means no supervisor is listening (shutting down):
            // the durable flag still reaches the loop at its next commit.
            let _ = local.send(note);
            return Ok(());
        }
        sqlx::query!(
            "SELECT pg_notify($1, $2)",
            CONTROL_CHANNEL,
            note.to_string()
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_survives_the_wire() {
        for action in [
            ControlAction::Stop,
            ControlAction::Pause,
            ControlAction::Changed,
            ControlAction::Ended,
        ] {
            let note = ControlNote {
                action,
                session_id: Uuid::new_v4(),
            };
            assert_eq!(note.to_string().parse::<ControlNote>(), Ok(note));
        }
    }

    #[test]
    fn the_wire_format_is_action_colon_id() {
        let id = Uuid::nil();
        let note: ControlNote = format!("pause:{id}").parse().unwrap();
        assert_eq!(note.action, ControlAction::Pause);
        assert_eq!(note.session_id, id);
        assert_eq!(note.to_string(), format!("pause:{id}"));
    }

    #[test]
    fn other_payloads_are_refused() {
        for payload in [
            "",
            "stop",
            "stop:",
            "resume:00000000-0000-0000-0000-000000000000",
            "stop:not-a-uuid",
        ] {
            assert!(payload.parse::<ControlNote>().is_err(), "{payload:?}");
        }
    }
}
