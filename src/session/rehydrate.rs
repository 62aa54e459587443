//! Rehydration: a session loaded for a run (its loop state rebuilt from the
//! latest checkpoint plus the steps after it) and its executor rebuilt.
//! Used by the service (refine, resume, stop) and the supervisor (spawn, rescue).

use std::sync::Arc;

use uuid::Uuid;

use super::error::{Result, ServiceError};
use super::journal::{StoreJournal, StoreTaskQueue};
use super::state::{AppliedReflection, LoopState, StepEffects};
use crate::config::Config;
use crate::executor::{Executor, ExecutorDeps, ExecutorSpec};
use crate::llm::Message;
use crate::policy::history::StepRecord;
use crate::store::{Lease, SessionRecord, Store, StoreError};

/// Loads a session and rebuilds its loop state from its latest checkpoint
/// plus the iterations committed after it.
pub async fn load_for_run(store: &Store, id: Uuid) -> Result<(SessionRecord, LoopState)> {
    let session = store.session(id).await?.ok_or(ServiceError::NotFound(id))?;
    let (checkpoint, iterations) = store.rebuild_inputs(id).await?;
    let corrupt = |detail: String| StoreError::Corrupt { id, detail };
    let covered = checkpoint.as_ref().map_or(0, |c| c.iteration);
    let mut state = match checkpoint {
        Some(c) => serde_json::from_value::<LoopState>(c.state)
            .map_err(|e| corrupt(format!("checkpoint {}: {e}", c.id)))?,
        None => LoopState::for_session(&session),
    };
    let mut reflections = store
        .reflections_after_iteration(id, covered)
        .await?
        .into_iter()
        .peekable();
    for it in iterations {
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
    Ok((session, state))
}

/// Builds the executor of a session whose lease this replica holds,
/// continuing its conversation from the stored transcript.
pub async fn build_executor(
    store: &Store,
    config: &Config,
    session: &SessionRecord,
    lease: Lease,
) -> Result<Box<dyn Executor>> {
    let spec: ExecutorSpec =
        serde_json::from_value(session.executor.clone()).map_err(|e| StoreError::Corrupt {
            id: session.id,
            detail: format!("executor: {e}"),
        })?;
    let transcript = match spec {
        ExecutorSpec::Llm { .. } => store
            .transcript(session.id, 30)
            .await?
            .into_iter()
            .filter_map(|v| serde_json::from_value::<Vec<Message>>(v).ok())
            .collect(),
        _ => Vec::new(),
    };
    let deps = ExecutorDeps {
        session_id: session.id,
        goal: session.goal.clone(),
        llm: config.models.endpoint.clone(),
        llm_model: config.models.model.clone(),
        llm_max_tokens: config.models.max_tokens_per_call,
        workspace_root: config.workspace_root.clone(),
        max_file_bytes: config.models.max_file_bytes,
        journal: Arc::new(StoreJournal::new(store.clone(), lease)),
        transcript,
        tasks: Arc::new(StoreTaskQueue::new(store.clone(), lease)),
        cycle: u32::try_from(session.cycle).unwrap_or(1),
        memory: session.memory.clone(),
        context_budget_tokens: session.limits.context_budget_tokens,
        criteria: session.criteria.iter().map(|c| c.text.clone()).collect(),
        egress: config.egress.clone(),
    };
    spec.build(deps).map_err(ServiceError::Unavailable)
}
