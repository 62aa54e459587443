//! Commit: carries out the [`CommitPlan`] for a step in one store call, then
//! shows it in the status served from memory and takes in the durable flags.

use std::time::Instant;

use super::execute::Executed;
use super::plan::{self, CommitPlan, PlanContext, RowChange, StepOutcome};
use super::{Pass, Runner};
use crate::metrics::IterationTimes;
use crate::session::runtime::live::CommittedStep;
use crate::session::runtime::loop_store::LoopStore;
use crate::store::{ControlFlags, Session, StoreError};
use crate::telemetry;

impl<S: LoopStore> Runner<S> {
    /// Commit: persists the iteration, its counters and what the policies
    /// concluded, then takes in the durable flags.
    pub(super) async fn commit(
        &mut self,
        executed: Executed,
        pass: &mut Pass,
    ) -> Result<(), StoreError> {
        let Executed {
            outcome,
            executor_time,
            ..
        } = executed;
        // Taken apart whole: nothing of the plan but what the commit uses
        // after the write is held across it.
        let CommitPlan {
            iteration,
            events,
            row,
            state_after,
            step_tokens,
        } = self.plan(outcome)?;
        if telemetry::enabled() {
            for stuck in events.iter().filter(|e| e.kind == "stuck_detected") {
                let data = serde_json::from_str(stuck.data.as_str()).unwrap_or_default();
                telemetry::add_event("warden.stuck", || {
                    telemetry::json_attributes("warden.stuck", &data)
                });
            }
        }
        let finished_at = iteration.finished_at;
        let commit_started = Instant::now();
        self.view.committing();
        // Boxed (one allocation per step, against a task kept a few KB
        // smaller for as long as the session waits on its steps).
        let flags = Box::pin(self.store.commit_iteration(
            &self.lease,
            iteration,
            row.counters,
            (row.percent_complete, row.eta_seconds),
            events,
            // A stop does not wait for the groups queued before this commit.
            &self.control.stop,
        ))
        .await
        .inspect_err(|_| self.view.write_failed())?;
        pass.writes += commit_started.elapsed();
        self.show_committed(&row, &flags, finished_at);
        self.metrics.cost(&self.tenant, row.cost.0, row.cost.1);
        self.state = state_after;
        self.guidance = None;
        self.apply_flags(flags);
        if let Some(n) = row.checkpointed {
            self.snapshot_workspace(n as u64).await;
        }
        self.metrics.iteration(
            step_tokens,
            IterationTimes {
                total: pass.started.elapsed(),
                executor: executor_time,
                writes: pass.writes,
            },
        );
        Ok(())
    }

    /// Plans the commit of `outcome` on the loop state, which the plan takes.
    fn plan(&mut self, outcome: StepOutcome) -> Result<CommitPlan, StoreError> {
        let ctx = PlanContext {
            stuck: &self.config.stuck,
            checkpoint_interval: self.settings.limits.checkpoint_interval,
            elapsed_ms: self.elapsed_ms(),
            prices: &self.config.model_prices,
            limits: &self.settings.limits,
        };
        // Moved into the plan, not copied. On an error the loop ends: only
        // the usage is put back, for the loop's last log line.
        let committed = self.state.usage;
        let state = std::mem::take(&mut self.state);
        let plan = plan::plan_commit(state, outcome, &ctx);
        self.state.usage = committed;
        plan
    }

    /// Committed: now the status served from memory may show it.
    fn show_committed(
        &self,
        row: &RowChange,
        flags: &ControlFlags,
        finished_at: chrono::DateTime<chrono::Utc>,
    ) {
        self.view.committed(CommittedStep {
            flags,
            finished_at,
            apply: &|r: &mut Session| {
                r.set_counters(row.counters);
                // As the commit's statement adds them to the row.
                r.cost_usd += row.cost.0;
                r.unpriced_steps += i64::from(row.cost.1);
                r.percent_complete = row.percent_complete;
                r.eta_seconds = row.eta_seconds;
                r.guidance = None;
                if let Some((cycle, memory)) = &row.next_cycle {
                    r.cycle = *cycle;
                    r.memory.clone_from(memory);
                }
                if let Some(n) = row.checkpointed {
                    r.last_checkpoint_iteration = n;
                }
                r.budget_warnings.0.extend_from_slice(&row.budget_warnings);
            },
        });
    }
}
