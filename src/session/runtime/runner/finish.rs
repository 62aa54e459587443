//! The ends of a run: a final or waiting status with its record and
//! checkpoint, or a release at shutdown that leaves the session to the next
//! replica.

use super::{Exit, Runner};
use crate::event::SessionEvent;
use crate::policy::delegation;
use crate::policy::lifecycle::{Reason, Status};
use crate::policy::termination::{self, Facts};
use crate::session::event_codec;
use crate::session::runtime::loop_store::LoopStore;
use crate::store::{Counters, StoreError};

impl<S: LoopStore> Runner<S> {
    /// Ends the session for `reason`; a stop requested meanwhile wins over
    /// a pause (the store checks the flag under the row lock it writes with).
    pub(super) async fn finish(
        &mut self,
        reason: Reason,
        detail: Option<String>,
        events: Vec<SessionEvent>,
    ) -> Result<Exit, StoreError> {
        match self.finish_once(reason, detail, events.clone()).await {
            Err(StoreError::StopPending(_)) => {
                self.control.stop.cancel();
                self.finish_once(Reason::UserStop, None, events).await
            }
            other => other,
        }
    }

    /// One attempt at ending the session.
    async fn finish_once(
        &mut self,
        reason: Reason,
        detail: Option<String>,
        mut events: Vec<SessionEvent>,
    ) -> Result<Exit, StoreError> {
        let usage = self.current_usage();
        self.state.usage = usage;
        self.state.last_checkpoint_step = usage.iterations;
        let mut record = termination::record(
            reason,
            Facts {
                usage: &usage,
                limits: &self.settings.limits,
                detail: detail.as_deref(),
            },
        );
        // A child of a `fail_child` tree never waits for a person: it ends
        // failed, and its parent is told why.
        let status =
            delegation::run_end_status(reason, self.tree.is_child, self.tree.on_child_pause);
        if status != record.status {
            record.summary = format!(
                "Failed instead of waiting for a person (its tree's on_child_pause is fail_child): {}",
                record.summary
            );
            record.status = status;
        }
        events.push(SessionEvent::run_ended(Status::Running, &record, &usage));
        let events = event_codec::encode(&events)?;
        let snapshot = self.snapshot()?;
        // The workspace snapshot first: an ended session's files are there
        // as soon as its end is.
        self.snapshot_workspace(usage.iterations).await;
        // Before the end commits: from then on only Postgres knows the status.
        self.view.close();
        Box::pin(self.store.finish(
            &self.lease,
            &record,
            detail.as_deref(),
            Counters::from_usage(
                &usage,
                self.state.reflection.tokens,
                self.state.charges_seen,
            ),
            (usage.iterations as i64, &snapshot),
            &events,
        ))
        .await?;
        self.metrics.termination(reason.as_str());
        Ok(Exit::Finished(reason))
    }

    /// Checkpoints and gives the lease up: the process is shutting down.
    pub(super) async fn release(&mut self) -> Result<Exit, StoreError> {
        self.release_with(&[]).await
    }

    /// As [`Runner::release`], logging the charges of a step it cut short.
    pub(super) async fn release_with(
        &mut self,
        charges: &[SessionEvent],
    ) -> Result<Exit, StoreError> {
        let charges = event_codec::encode(charges)?;
        let usage = self.current_usage();
        self.state.usage = usage;
        self.state.last_checkpoint_step = usage.iterations;
        let snapshot = self.snapshot()?;
        self.snapshot_workspace(usage.iterations).await;
        self.view.close();
        Box::pin(self.store.release(
            &self.lease,
            Counters::from_usage(
                &usage,
                self.state.reflection.tokens,
                self.state.charges_seen,
            ),
            (usage.iterations as i64, &snapshot),
            &charges,
        ))
        .await?;
        Ok(Exit::Released)
    }
}
