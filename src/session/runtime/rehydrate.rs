//! Rehydration: a session loaded for a run (its loop state rebuilt from the
//! latest checkpoint plus the steps after it) and its executor rebuilt.
//! Used by the service (refine, resume, stop) and the supervisor (spawn, rescue).

use std::sync::Arc;

use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::journal::{StoreApprovalDesk, StoreChildDesk, StoreJournal, StoreTaskQueue};
use crate::config::Config;
use crate::executor::{ApiKey, Executor, ExecutorDeps, ExecutorSpec, StoredExecutor, UrlQuery};
use crate::llm::Message;
use crate::policy::delegation::TreeLimits;
use crate::policy::loop_state::LoopState;
use crate::secrets::{API_KEY, URL_QUERY};
use crate::session::error::{Result, ServiceError};
use crate::store::{self, Lease, RebuildInputs, Session, Store, StoreError, TenantScope};

/// Loads a session and rebuilds its loop state from its latest checkpoint
/// plus the iterations committed after it. Called by the replica that holds
/// or is taking the session's lease, for whichever tenant owns it.
pub async fn load_for_run(store: &Store, id: Uuid) -> Result<(Session, LoopState)> {
    let session = store
        .session(id, &TenantScope::Global)
        .await?
        .ok_or(ServiceError::NotFound(id))?;
    let inputs = store.rebuild_inputs(id).await?;
    let state = replay(&session, inputs);
    Ok((session, state))
}

/// Rebuilds the loop state of a session the caller has row-locked on
/// `conn`. Everything is read on that same connection: a handler that held
/// the lock and asked the pool for a second connection could exhaust the
/// pool with a handful of concurrent stops.
pub async fn rebuild_locked(conn: &mut PgConnection, session: &Session) -> Result<LoopState> {
    let inputs = store::rebuild_inputs_on(conn, session.id).await?;
    Ok(replay(session, inputs))
}

/// The state a session starts with: its checklists, its context cycle,
/// and the tokens already spent on refining it.
pub fn initial_state(session: &Session) -> LoopState {
    let mut state = LoopState::new(session.limits.reflection_interval);
    state.criteria = session.criteria.0.clone();
    state.milestones = session.milestones.0.clone();
    state.usage.tokens = session.refinement_tokens.max(0) as u64;
    state.cycle = u32::try_from(session.cycle).unwrap_or(1).max(1);
    state
}

/// Rebuilds the loop state of `session` from what `inputs` holds: its latest
/// checkpoint plus the iterations (and reflections) committed after it.
/// The rows come typed from the store (a row that does not read as its type
/// is refused there, as corrupt), so the fold itself cannot fail.
pub fn replay(session: &Session, inputs: RebuildInputs) -> LoopState {
    let (mut state, from) = match inputs.checkpoint {
        Some(c) => (c.state.0, c.iteration),
        None => (initial_state(session), 0),
    };
    // An interval checkpoint rides with its step's commit, before the
    // reflection that follows the same step: that one is not in the state
    // yet, and is told apart from those that are by its number.
    let known = i64::from(state.reflection.attempts);
    let mut reflections = inputs
        .reflections
        .into_iter()
        .filter(|r| i64::from(r.number) > known)
        .peekable();
    while let Some(r) = reflections.next_if(|r| r.after_iteration <= from) {
        state.apply_reflection(&r.decision);
    }
    for it in inputs.iterations {
        state.apply(it.run, &it.record, &it.effects);
        // Reflections replay right after the iteration they followed.
        while let Some(r) = reflections.next_if(|r| r.after_iteration <= it.number) {
            state.apply_reflection(&r.decision);
        }
    }
    // A newer run than the state knows means a person resumed after the
    // last stored step: the per-run counters start over.
    if session.run > state.run {
        state.begin_run(session.run);
    }
    // Usage charged outside the loop since the state was saved (steps cut
    // short) counts against the budget from now on.
    state.absorb_charges(inputs.tokens_charged);
    // The row sums every committed step's cost in the commit's statement:
    // the money spent is the row's, whatever the checkpoint held.
    state.usage.cost_usd = session.cost_usd;
    state.usage.unpriced_steps = u64::try_from(session.unpriced_steps).unwrap_or(0);
    state
}

/// Builds the executor of a session whose lease this replica holds,
/// continuing its conversation from the stored transcript.
pub async fn build_executor(
    store: &Store,
    config: &Config,
    session: &Session,
    lease: Lease,
    mcp: &Arc<crate::mcp::McpRegistry>,
    on_delegated: Arc<dyn Fn() + Send + Sync>,
) -> Result<Box<dyn Executor>> {
    let spec = unsealed_spec(store, config, session).await?;
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
        llm_call: config.models.call,
        llm_max_tokens: config.models.max_tokens_per_call,
        workspace_root: config.workspace_root.clone(),
        max_file_bytes: config.models.max_file_bytes,
        max_tool_calls_per_step: config.quotas.max_tool_calls_per_step,
        max_output_bytes: config.quotas.max_output_bytes,
        workspace_limits: crate::executor::workspace::Limits::from_quotas(&config.quotas),
        journal: Arc::new(StoreJournal::new(store.clone(), lease)),
        approvals: Arc::new(StoreApprovalDesk::new(
            store.clone(),
            lease,
            config.approval_timeout,
        )),
        transcript,
        tasks: Arc::new(StoreTaskQueue::new(store.clone(), lease)),
        children: Arc::new(StoreChildDesk::new(
            store.clone(),
            lease,
            TreeLimits::default(),
            on_delegated,
        )),
        lineage: session.lineage.clone(),
        cycle: u32::try_from(session.cycle).unwrap_or(1),
        memory: session.memory.clone(),
        context_budget_tokens: session.limits.context_budget_tokens,
        criteria: session.criteria.iter().map(|c| c.text.clone()).collect(),
        egress: config.egress.clone(),
        store: store.clone(),
        run: lease.token,
        tenant: session.tenant.clone(),
        mcp: mcp.clone(),
    };
    spec.build(deps).map_err(ServiceError::Unavailable)
}

/// The session's stored executor spec with the secrets sealed at creation
/// put back: the model key of an `llm` executor and a URL's query.
pub async fn unsealed_spec(
    store: &Store,
    config: &Config,
    session: &Session,
) -> Result<ExecutorSpec> {
    let Some(Json(StoredExecutor {
        mut spec,
        query_sealed,
    })) = session.executor.clone()
    else {
        return Err(StoreError::Corrupt {
            id: session.id,
            detail: "executor: read without its spec".into(),
        }
        .into());
    };
    let ring = || {
        config.keyring().ok_or_else(|| {
            ServiceError::Unavailable("the secret key (WARDEN_SECRET_KEY) is not loaded".into())
        })
    };
    // The session's own secrets (a child's are its ancestor's), read
    // within its own tenant.
    let own = TenantScope::tenant_only(&session.tenant);
    let sealer = session.secrets_from.unwrap_or(session.id);
    if matches!(spec, ExecutorSpec::Llm { .. })
        && let Some(sealed) = store.session_secret(sealer, API_KEY, &own).await?
    {
        // A spec from before sealing may still carry its key: it wins (and
        // is moved at the next start).
        spec = spec.with_api_key(ApiKey::new(ring()?.open(sealer, API_KEY, &sealed)?));
    }
    if query_sealed {
        // The URL's query, sealed at creation, goes back on the URL.
        let sealed = store
            .session_secret(sealer, URL_QUERY, &own)
            .await?
            .ok_or_else(|| StoreError::Corrupt {
                id: session.id,
                detail: "executor: its URL's sealed query is missing".into(),
            })?;
        spec = spec.with_url_query(&UrlQuery::new(ring()?.open(sealer, URL_QUERY, &sealed)?));
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::policy::loop_state::AppliedReflection;
    use crate::policy::reflection::{ReflectionState, Verdict};
    use crate::store::{CheckpointRecord, ReflectionRecord};

    fn checkpoint_at(iteration: i64, state: LoopState) -> CheckpointRecord {
        CheckpointRecord {
            id: 1,
            iteration,
            reason: "interval".into(),
            state: Json(state),
            created_at: Utc::now(),
        }
    }

    fn reflection(number: i32, after: i64, tokens: u64) -> ReflectionRecord {
        let mut after_state = ReflectionState::new(10);
        after_state.attempts = u32::try_from(number).unwrap();
        after_state.count = after_state.attempts;
        after_state.last_at = u64::try_from(after).unwrap();
        after_state.tokens = tokens;
        ReflectionRecord {
            number,
            after_iteration: after,
            trigger: "interval".into(),
            ok: true,
            assessment: None,
            error: None,
            decision: Json(AppliedReflection {
                verdict: Verdict::Continue,
                state_after: after_state,
                percent_complete: Some(40.0),
                reasoning: None,
                criteria: Vec::new(),
                milestones: Vec::new(),
            }),
            next_interval: 10,
            tokens: 50,
            raw: None,
            created_at: Utc::now(),
        }
    }

    fn inputs(checkpoint: CheckpointRecord, reflections: Vec<ReflectionRecord>) -> RebuildInputs {
        RebuildInputs {
            checkpoint: Some(checkpoint),
            iterations: Vec::new(),
            reflections,
            tokens_charged: 0,
        }
    }

    #[test]
    fn a_reflection_after_the_checkpoint_of_its_own_step_is_replayed_once() {
        let session = crate::session::runtime::live::tests::record();
        // The interval checkpoint rode with step 10; reflection 1 followed it.
        let before = LoopState::new(10);
        let state = replay(
            &session,
            inputs(
                checkpoint_at(10, before.clone()),
                vec![reflection(1, 10, 50)],
            ),
        );
        assert_eq!(
            state.reflection.attempts, 1,
            "not run again with the same number"
        );
        assert_eq!(state.reflection.last_at, 10);
        assert_eq!(state.usage.tokens, before.usage.tokens + 50);
        // A checkpoint taken after it already holds it: not applied twice.
        let mut after = before;
        after.apply_reflection(&reflection(1, 10, 50).decision);
        let again = replay(
            &session,
            inputs(
                checkpoint_at(10, after.clone()),
                vec![reflection(1, 10, 50)],
            ),
        );
        assert_eq!(again.reflection, after.reflection);
        assert_eq!(again.usage.tokens, after.usage.tokens);
    }
}
