//! Relaying stop and pause requests sent to other replicas, and the key
//! and worker changes, from Postgres's notifications to this replica.

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::Supervisor;
use crate::store::{
    CONTROL_CHANNEL, ControlAction, ControlNote, KEYS_CHANNEL, WORKERS_CHANNEL, WorkerChange,
};

impl Supervisor {
    /// Relays stop and pause requests sent to other replicas (NOTIFY makes
    /// them fast; the durable flags read at each commit and heartbeat are the truth),
    /// and the key changes of [`KEYS_CHANNEL`] to this process's key cache.
    /// On the embedded server they come through an in-process channel.
    pub async fn listen(self) {
        if let Some(mut notes) = self.inner.store.local_control() {
            loop {
                let note = tokio::select! {
                    _ = self.inner.closing.cancelled() => return,
                    note = notes.recv() => note,
                };
                match note {
                    Ok(note) => self.on_control(note),
                    // Missed notes: the durable flags still reach each loop
                    // at its next commit or heartbeat.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "control notes lagged; the durable flags still apply"
                        );
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
        loop {
            if self.inner.closing.is_cancelled() {
                return;
            }
            let mut listener = match PgListener::connect_with(self.inner.store.pool()).await {
                Ok(l) => l,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot listen for control notifications; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(err) = listener
                .listen_all([CONTROL_CHANNEL, KEYS_CHANNEL, WORKERS_CHANNEL])
                .await
            {
                tracing::warn!(error = %err, "LISTEN failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // Key notes may have been missed while no listener was connected.
            self.inner.store.keys_changed_locally();
            self.inner.store.workers_changed_locally(WorkerChange::ANY);
            loop {
                let note = tokio::select! {
                    _ = self.inner.closing.cancelled() => return,
                    note = listener.recv() => note,
                };
                match note {
                    Ok(note) if note.channel() == KEYS_CHANNEL => {
                        self.inner.store.keys_changed_locally();
                    }
                    Ok(note) if note.channel() == WORKERS_CHANNEL => {
                        self.inner.store.worker_notice_heard(note.payload());
                    }
                    Ok(note) => self.on_control_note(note.payload()),
                    Err(err) => {
                        tracing::warn!(error = %err, "control listener lost its connection");
                        break;
                    }
                }
            }
        }
    }

    fn on_control_note(&self, payload: &str) {
        let Ok(note) = payload.parse::<ControlNote>() else {
            return;
        };
        self.on_control(note);
    }

    fn on_control(&self, note: ControlNote) {
        match note.action {
            ControlAction::Stop => {
                self.signal_stop(note.session_id);
            }
            ControlAction::Pause => {
                self.signal_pause(note.session_id);
            }
            ControlAction::Changed => self.invalidate(note.session_id),
            ControlAction::Ended => {
                // No receiver means no stop is waiting here.
                let _ = self.inner.stops_ended.send(note.session_id);
            }
        }
    }
}
