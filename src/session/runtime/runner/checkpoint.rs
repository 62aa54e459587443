//! Checkpoints outside a commit: the interval checkpoint a commit could not
//! carry, and the one the gate asks for before a step.

use std::time::Instant;

use super::plan::checkpoint_due;
use super::{Pass, Runner};
use crate::session::event_codec::to_stored;
use crate::session::runtime::loop_store::LoopStore;
use crate::store::StoreError;

impl<S: LoopStore> Runner<S> {
    /// Checkpoint: every `checkpoint_interval` committed steps, unless the
    /// run is ending. A commit folds it in when it can; this catches the
    /// rest (a changed interval, an end a reflection called off).
    pub(super) async fn checkpoint_if_due(&mut self, pass: &mut Pass) -> Result<(), StoreError> {
        if checkpoint_due(&self.state, self.settings.limits.checkpoint_interval) {
            let started = Instant::now();
            self.checkpoint("interval").await?;
            pass.writes += started.elapsed();
        }
        Ok(())
    }

    /// The loop state as a checkpoint stores it, with the clock read now.
    pub(super) fn snapshot(&self) -> Result<serde_json::Value, StoreError> {
        let mut state = self.state.clone();
        state.usage.elapsed_ms = self.elapsed_ms();
        to_stored("checkpoint state", &state)
    }

    /// Saves a checkpoint of the state as it is, for `why`.
    pub(super) async fn checkpoint(&mut self, why: &str) -> Result<(), StoreError> {
        let n = self.state.usage.iterations;
        self.state.last_checkpoint_step = n;
        let snapshot = self.snapshot()?;
        // Boxed, as every write off the per-step path: an async fn's state
        // holds room for its largest awaits, and a runner's task lives as
        // long as its session (this and the other boxes in the runner took
        // a runner's future from 23.5 KB to 6 KB).
        Box::pin(
            self.store
                .save_checkpoint(&self.lease, n as i64, why, &snapshot),
        )
        .await?;
        self.view.invalidate();
        self.snapshot_workspace(n).await;
        Ok(())
    }
}
