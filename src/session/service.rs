//! The operations on sessions that the HTTP layer exposes: each validates
//! its input, applies the state machine under a row lock, persists, and then
//! talks to the loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use uuid::Uuid;

use super::journal::{StoreJournal, StoreTaskQueue};
use super::planner;
use super::state::{AppliedReflection, LoopState, StepEffects};
use super::supervisor::{Done, Supervisor};
use crate::config::Config;
use crate::executor::{Executor, ExecutorDeps, ExecutorSpec};
use crate::llm::{LlmClient, Message};
use crate::policy::guardrails::{self, Breach, LimitOutOfRange, LimitsPatch};
use crate::policy::history::StepRecord;
use crate::policy::lifecycle::{
    self, IllegalTransition, Mode, PausePlan, Reason, Status, StopPlan,
};
use crate::policy::termination::{self, Facts};
use crate::policy::{ambiguity, checklist};
use crate::store::{
    self, Lease, NewEvent, NewSession, SessionCursor, SessionRecord, SessionSettings, Store,
    StoreError,
};

/// Longest goal accepted, in bytes.
pub const MAX_GOAL_BYTES: usize = 10_000;
/// Longest guidance accepted, in bytes.
pub const MAX_GUIDANCE_BYTES: usize = 10_000;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No session has that id.
    #[error("no session with id {0}")]
    NotFound(Uuid),
    /// The state machine refuses the operation.
    #[error(transparent)]
    Conflict(#[from] IllegalTransition),
    /// A resume would stop again at once on an exhausted budget.
    #[error("cannot resume: {field} is exhausted ({used} used of {limit}); raise it in \"limits\"")]
    LimitExhausted {
        /// The guardrail that would trip.
        breach: Breach,
        /// The limit field to raise.
        field: &'static str,
        /// Amount used.
        used: u64,
        /// Current limit.
        limit: u64,
    },
    /// The request is well-formed JSON but its content is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The service is shutting down or could not start the loop.
    #[error("{0}")]
    Unavailable(String),
}

impl From<LimitOutOfRange> for ServiceError {
    fn from(err: LimitOutOfRange) -> Self {
        ServiceError::Invalid(format!("limits.{err}"))
    }
}

/// Shorthand for service results.
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// Request to create a session.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// What the session should achieve.
    #[schema(example = "Create README.md with a project description")]
    pub goal: String,
    /// `fixed` or `continuous`; default from `AUTONOMOUS_MODE`.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Per-session overrides of the default limits.
    #[serde(default)]
    pub limits: LimitsPatch,
    /// How iterations are performed.
    pub executor: ExecutorSpec,
    /// Facts that must all be reported met before the session completes.
    #[serde(default)]
    pub success_criteria: Vec<String>,
    /// Intermediate results, ticked as reflections report them.
    #[serde(default)]
    pub milestones: Vec<String>,
    /// Ask the model to write success criteria and milestones for the goal
    /// (needs a model endpoint; given lists take precedence).
    #[serde(default)]
    pub generate_criteria: bool,
}

/// How the user answers a refinement proposal.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "choice", rename_all = "snake_case", deny_unknown_fields)]
pub enum RefinementChoice {
    /// Run the suggested goal.
    AcceptSuggestion,
    /// Run this goal instead.
    Custom {
        /// The goal to run.
        goal: String,
    },
    /// Run the goal as given, bounded by this wall-clock limit.
    ProceedWithTimeLimit {
        /// Wall-clock budget in ms.
        max_wall_time_ms: u64,
    },
}

/// Request to resume a session.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSession {
    /// Guidance delivered to the next iteration.
    #[serde(default)]
    pub guidance: Option<String>,
    /// Limits to raise (or lower) on resume; recorded as an event.
    #[serde(default)]
    pub limits: LimitsPatch,
    /// A refined goal to continue with (recorded in the refinement history).
    #[serde(default)]
    pub goal: Option<String>,
    /// Reopen a completed session whose work was not actually done.
    #[serde(default)]
    pub reopen: bool,
}

/// Request to change a session's mode or limits.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSession {
    /// New mode.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Limits to change.
    #[serde(default)]
    pub limits: LimitsPatch,
}

/// The operations on sessions.
#[derive(Clone)]
pub struct SessionService {
    store: Store,
    config: Arc<Config>,
    supervisor: Supervisor,
}

fn validate_goal(goal: &str) -> Result<String> {
    let goal = goal.trim();
    if goal.is_empty() {
        return Err(ServiceError::Invalid("goal must not be empty".into()));
    }
    if goal.len() > MAX_GOAL_BYTES {
        return Err(ServiceError::Invalid(format!(
            "goal must be at most {MAX_GOAL_BYTES} bytes, got {}",
            goal.len()
        )));
    }
    Ok(goal.to_string())
}

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
        llm_call: config.models.call,
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
    };
    spec.build(deps).map_err(ServiceError::Unavailable)
}

async fn wait_done(done: Option<Done>, timeout: Duration) {
    if let Some(mut done) = done {
        let _ = tokio::time::timeout(timeout, done.wait_for(|d| *d)).await;
    }
}

impl SessionService {
    /// The service over `store`, running loops under `supervisor`.
    pub fn new(store: Store, config: Arc<Config>, supervisor: Supervisor) -> SessionService {
        SessionService {
            store,
            config,
            supervisor,
        }
    }

    /// Price of a million tokens, when configured.
    pub fn token_price(&self) -> Option<f64> {
        self.config.token_price_per_million
    }

    /// The storage handle (read-only endpoints use it directly).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Creates a session and starts its loop.
    #[tracing::instrument(skip_all)]
    pub async fn create(&self, req: CreateSession) -> Result<SessionRecord> {
        let goal = validate_goal(&req.goal)?;
        req.executor.validate().map_err(ServiceError::Invalid)?;
        if let ExecutorSpec::Llm {
            model, base_url, ..
        } = &req.executor
        {
            if base_url.is_none() && self.config.models.endpoint.is_none() {
                return Err(ServiceError::Invalid(
                    "executor.base_url is required: no default model endpoint is configured (WARDEN_LLM_BASE_URL)".into(),
                ));
            }
            if model.is_none() && self.config.models.model.is_none() {
                return Err(ServiceError::Invalid(
                    "executor.model is required: no default model is configured (WARDEN_LLM_MODEL)"
                        .into(),
                ));
            }
        }
        let mut criteria = checklist::from_texts("success_criteria", &req.success_criteria)
            .map_err(ServiceError::Invalid)?;
        let mut milestones =
            checklist::from_texts("milestones", &req.milestones).map_err(ServiceError::Invalid)?;
        let mode = req.mode.unwrap_or(self.config.defaults.mode);
        let limits = self.config.defaults.limits_for(mode).apply(&req.limits)?;
        let executor = serde_json::to_value(&req.executor)
            .map_err(|e| ServiceError::Invalid(format!("executor: {e}")))?;
        let planner = self.planner();
        if req.generate_criteria && planner.is_none() {
            return Err(ServiceError::Invalid(
                "generate_criteria needs a model endpoint (WARDEN_LLM_BASE_URL and WARDEN_LLM_MODEL)".into(),
            ));
        }
        let mut refinement_tokens = 0u64;
        let mut events = Vec::new();

        // Pre-flight: an ambiguous goal waits for the user, or is refined at once.
        let report = ambiguity::assess(&goal);
        let mut run_goal = goal.clone();
        let mut refinement = None;
        let mut waits = false;
        if report.ambiguous && (self.config.require_concrete_goals || self.config.auto_refine_goals)
        {
            let (suggested, source) = match &planner {
                Some((client, model)) => match planner::refine_goal(client, model, &goal).await {
                    Ok(p) => {
                        refinement_tokens += p.tokens;
                        (p.value, "model")
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "model refinement failed; using the rules");
                        (report.suggested_goal.clone(), "rules")
                    }
                },
                None => (report.suggested_goal.clone(), "rules"),
            };
            let proposal = json!({
                "suggested_goal": suggested,
                "matched_patterns": report.matched_patterns,
                "confidence": report.confidence,
                "source": source,
                "choices": ["accept_suggestion", "custom", "proceed_with_time_limit"],
            });
            events.push(NewEvent::new("refinement_suggested", proposal.clone()));
            if self.config.auto_refine_goals {
                run_goal = suggested;
                events.push(NewEvent::new(
                    "goal_refined",
                    json!({ "kind": "auto", "from": goal, "to": run_goal }),
                ));
            } else {
                waits = true;
            }
            refinement = Some(proposal);
        }
        if req.generate_criteria
            && criteria.is_empty()
            && milestones.is_empty()
            && let Some((client, model)) = &planner
        {
            match planner::plan_checklists(client, model, &run_goal).await {
                Ok(p) => {
                    refinement_tokens += p.tokens;
                    criteria = checklist::from_texts("success_criteria", &p.value.0)
                        .map_err(ServiceError::Invalid)?;
                    milestones = checklist::from_texts("milestones", &p.value.1)
                        .map_err(ServiceError::Invalid)?;
                    events.push(NewEvent::new(
                        "criteria_generated",
                        json!({ "criteria": p.value.0, "milestones": p.value.1 }),
                    ));
                }
                Err(err) => {
                    return Err(ServiceError::Unavailable(format!(
                        "could not generate success criteria: {err}"
                    )));
                }
            }
        }
        let new = NewSession {
            id: Uuid::new_v4(),
            goal: run_goal.clone(),
            mode,
            limits,
            executor,
            original_goal: (run_goal != goal).then(|| goal.clone()),
            refinement,
            criteria,
            milestones,
            refinement_tokens: i64::try_from(refinement_tokens).unwrap_or(i64::MAX),
        };
        let status = if waits {
            Status::AwaitingRefinement
        } else {
            Status::Running
        };
        events.insert(
            0,
            NewEvent::new(
                "session_created",
                json!({ "goal": goal, "mode": mode, "limits": limits, "executor": req.executor.kind(),
                        "success_criteria": req.success_criteria, "milestones": req.milestones }),
            ),
        );
        events.push(NewEvent::new(
            "status_changed",
            json!({ "from": null, "to": status }),
        ));
        let acquired = Instant::now();
        let owner = (!waits).then(|| self.supervisor.replica_id());
        let (record, lease) = self
            .store
            .insert_session(&new, owner, self.config.lease.ttl, &events)
            .await?;
        if record.original_goal.is_some() {
            let mut conn = self
                .store
                .pool()
                .acquire()
                .await
                .map_err(StoreError::from)?;
            store::insert_refinement(
                &mut conn,
                record.id,
                "auto",
                &goal,
                &record.goal,
                record
                    .refinement
                    .as_ref()
                    .unwrap_or(&serde_json::Value::Null),
            )
            .await?;
        }
        tracing::info!(session_id = %record.id, status = status.as_str(), "session created");
        if let Some(lease) = lease {
            self.supervisor
                .spawn(lease, acquired, &record, LoopState::for_session(&record))
                .await?;
        }
        Ok(record)
    }

    /// Answers a refinement proposal and starts the session.
    #[tracing::instrument(skip(self, choice))]
    pub async fn refine(&self, id: Uuid, choice: RefinementChoice) -> Result<SessionRecord> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_refine(session.status)?;
        let suggested = session
            .refinement
            .as_ref()
            .and_then(|r| r.get("suggested_goal"))
            .and_then(|g| g.as_str())
            .map(str::to_string);
        let mut limits = session.limits;
        let (kind, goal) = match &choice {
            RefinementChoice::AcceptSuggestion => (
                "accept_suggestion",
                suggested.ok_or_else(|| {
                    ServiceError::Invalid(
                        "this session has no suggested goal; choose custom".into(),
                    )
                })?,
            ),
            RefinementChoice::Custom { goal } => ("custom", validate_goal(goal)?),
            RefinementChoice::ProceedWithTimeLimit { max_wall_time_ms } => {
                limits = limits.apply(&LimitsPatch {
                    max_wall_time_ms: Some(*max_wall_time_ms),
                    ..LimitsPatch::default()
                })?;
                ("proceed_with_time_limit", session.goal.clone())
            }
        };
        let data = json!({ "limits": limits, "proposal": session.refinement });
        store::insert_refinement(&mut tx, id, kind, &session.goal, &goal, &data).await?;
        let events = [
            NewEvent::new(
                "goal_refined",
                json!({ "kind": kind, "from": session.goal, "to": goal, "limits": limits }),
            ),
            NewEvent::new(
                "status_changed",
                json!({ "from": session.status, "to": Status::Running }),
            ),
        ];
        let acquired = Instant::now();
        let lease = store::start_refined(
            &mut tx,
            id,
            &goal,
            limits,
            self.supervisor.replica_id(),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        // Read back on the locked connection: a handful of pool acquires
        // here would delay the loop's start behind every queued request.
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let state = super::control::rebuild_locked(&mut tx, &session).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.store.announce(id);
        self.supervisor
            .spawn(lease, acquired, &session, state)
            .await?;
        Ok(session)
    }

    /// The default model endpoint as a client and model name, when configured.
    fn planner(&self) -> Option<(LlmClient, String)> {
        let endpoint = self.config.models.endpoint.clone()?;
        let model = self.config.models.model.clone()?;
        LlmClient::new(endpoint).ok().map(|c| (c, model))
    }

    /// One session.
    pub async fn get(&self, id: Uuid) -> Result<SessionRecord> {
        self.store
            .session(id)
            .await?
            .ok_or(ServiceError::NotFound(id))
    }

    /// A page of sessions, newest first.
    pub async fn list(
        &self,
        status: Option<Status>,
        after: Option<SessionCursor>,
        limit: i64,
    ) -> Result<Vec<SessionRecord>> {
        Ok(self.store.list_sessions(status, after, limit).await?)
    }

    /// Stops a session: persisted first, then signalled; waits for the loop to land.
    #[tracing::instrument(skip(self))]
    pub async fn stop(&self, id: Uuid) -> Result<SessionRecord> {
        let received = Instant::now();
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        match lifecycle::plan_stop(session.status)? {
            StopPlan::AlreadyStopped => {
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
            }
            StopPlan::InterruptNow => {
                // On the locked connection: never a second one while the lock is held.
                let state = super::control::rebuild_locked(&mut tx, &session).await?;
                self.end_unowned(&mut tx, &session, &state, Reason::UserStop)
                    .await?;
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
            }
            StopPlan::SignalRunner => {
                store::request_stop(&mut tx, id).await?;
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
                match self.supervisor.signal_stop(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.stop_elsewhere(id).await?,
                }
                self.supervisor
                    .metrics()
                    .stop_seconds
                    .observe(received.elapsed());
            }
        }
        self.get(id).await
    }

    /// A stop for a session this replica does not run: tell its owner, and
    /// if it has no live owner, record the stop here.
    async fn stop_elsewhere(&self, id: Uuid) -> Result<()> {
        self.store.notify_control("stop", id).await?;
        let deadline = Instant::now() + self.config.control_wait;
        loop {
            let session = self.get(id).await?;
            if session.status != Status::Running {
                return Ok(());
            }
            if self.store.lease_lapsed(id).await? {
                let mut tx = self.store.begin().await?;
                let locked = store::lock_session(&mut tx, id).await?;
                // Everything under the lock is read on its own connection.
                if let Some(locked) = locked
                    && locked.status == Status::Running
                    && super::control::lease_lapsed_locked(&mut tx, id).await?
                {
                    let state = super::control::rebuild_locked(&mut tx, &locked).await?;
                    self.end_unowned(&mut tx, &locked, &state, Reason::UserStop)
                        .await?;
                }
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn end_unowned(
        &self,
        conn: &mut sqlx::PgConnection,
        session: &SessionRecord,
        state: &LoopState,
        reason: Reason,
    ) -> Result<()> {
        let usage = state.usage;
        let termination = termination::record(
            reason,
            Facts {
                usage: &usage,
                limits: &session.limits,
                detail: None,
            },
        );
        let mut snapshot = state.clone();
        snapshot.last_checkpoint_step = usage.iterations;
        let snapshot = serde_json::to_value(&snapshot)
            .map_err(|e| ServiceError::Unavailable(format!("cannot snapshot state: {e}")))?;
        let event = NewEvent::new(
            "status_changed",
            json!({
                "from": session.status,
                "to": termination.status,
                "reason": termination.reason,
                "summary": termination.summary,
                "next_steps": termination.next_steps,
                "iterations": usage.iterations,
                "tokens_used": usage.tokens,
                "checkpoint_saved": true,
            }),
        );
        store::end_unowned(
            conn,
            session.id,
            &termination,
            Some((usage.iterations as i64, snapshot)),
            &[event],
        )
        .await?;
        Ok(())
    }

    /// Pauses a session after its step in flight.
    #[tracing::instrument(skip(self))]
    pub async fn pause(&self, id: Uuid) -> Result<SessionRecord> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        match lifecycle::plan_pause(session.status)? {
            PausePlan::AlreadyPaused => {
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
            }
            PausePlan::SignalRunner => {
                store::request_pause(&mut tx, id).await?;
                tx.commit().await.map_err(StoreError::from)?;
                self.store.announce(id);
                match self.supervisor.signal_pause(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.store.notify_control("pause", id).await?,
                }
            }
        }
        self.get(id).await
    }

    /// Resumes a paused, stopped, interrupted or failed session.
    #[tracing::instrument(skip(self, req))]
    pub async fn resume(&self, id: Uuid, req: ResumeSession) -> Result<SessionRecord> {
        let guidance = req
            .guidance
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        if let Some(g) = guidance
            && g.len() > MAX_GUIDANCE_BYTES
        {
            return Err(ServiceError::Invalid(format!(
                "guidance must be at most {MAX_GUIDANCE_BYTES} bytes, got {}",
                g.len()
            )));
        }
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_resume(session.status, req.reopen)?;
        let new_goal = req.goal.as_deref().map(validate_goal).transpose()?;
        let limits = session.limits.apply(&req.limits)?;
        let usage = session.counters.usage();
        if let Some(breach) = guardrails::exhausted_for_resume(&limits, &usage) {
            let (used, limit) = match breach {
                Breach::Timeout => (usage.elapsed_ms, limits.max_wall_time_ms),
                Breach::MaxIterations => (usage.iterations, limits.max_iterations),
                Breach::CostLimit => (usage.tokens, limits.max_tokens),
                Breach::ErrorThreshold => (
                    u64::from(usage.consecutive_errors),
                    u64::from(limits.max_consecutive_errors),
                ),
            };
            return Err(ServiceError::LimitExhausted {
                breach,
                field: breach.limit_field(),
                used,
                limit,
            });
        }
        let mut events = Vec::new();
        if limits != session.limits {
            events.push(NewEvent::new(
                "limits_changed",
                json!({ "from": session.limits, "to": limits, "by": "resume" }),
            ));
        }
        if let Some(goal) = &new_goal
            && *goal != session.goal
        {
            store::insert_refinement(
                &mut tx,
                id,
                "resume",
                &session.goal,
                goal,
                &json!({ "guidance": guidance }),
            )
            .await?;
            events.push(NewEvent::new(
                "goal_refined",
                json!({ "kind": "resume", "from": session.goal, "to": goal }),
            ));
        }
        events.push(NewEvent::new(
            "resumed",
            json!({ "run": session.run + 1, "guidance": guidance, "reopened": req.reopen,
                    "from_status": session.status, "from_reason": session.reason }),
        ));
        events.push(NewEvent::new(
            "status_changed",
            json!({ "from": session.status, "to": Status::Running }),
        ));
        let acquired = Instant::now();
        let lease = store::resume_session(
            &mut tx,
            id,
            new_goal.as_deref(),
            limits,
            guidance,
            self.supervisor.replica_id(),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        // Read back on the locked connection: a handful of pool acquires
        // here would delay the loop's start behind every queued request.
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let state = super::control::rebuild_locked(&mut tx, &session).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.store.announce(id);
        self.supervisor
            .spawn(lease, acquired, &session, state)
            .await?;
        Ok(session)
    }

    /// Changes the mode or limits of a session; a running loop applies them
    /// from its next iteration.
    #[tracing::instrument(skip(self, req))]
    pub async fn update(&self, id: Uuid, req: UpdateSession) -> Result<SessionRecord> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_update(session.status)?;
        let settings = SessionSettings {
            mode: req.mode.unwrap_or(session.mode),
            limits: session.limits.apply(&req.limits)?,
        };
        let mut events = Vec::new();
        if settings.mode != session.mode {
            events.push(NewEvent::new(
                "mode_changed",
                json!({ "from": session.mode, "to": settings.mode }),
            ));
        }
        if settings.limits != session.limits {
            events.push(NewEvent::new(
                "limits_changed",
                json!({ "from": session.limits, "to": settings.limits, "by": "update" }),
            ));
        }
        if !events.is_empty() {
            store::update_settings(&mut tx, id, settings, &events).await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        self.store.announce(id);
        self.get(id).await
    }
}
