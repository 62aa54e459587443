//! The operations on sessions that the HTTP layer exposes: each validates
//! its input, applies the state machine under a row lock, persists, and then
//! talks to the loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{Postgres, Transaction};
use utoipa::ToSchema;
use uuid::Uuid;

pub use super::error::{Result, ServiceError};
use super::event_codec::{self, to_stored};
use super::live::{Freshness, StepInFlight, VELOCITY_MINUTES, Velocity};
use super::persist::{self, FirstRefinement};
use super::planner;
use super::reads::SessionReads;
use super::rehydrate::rebuild_locked;
use super::supervisor::{Done, Slot, Supervisor};
use crate::config::Config;
use crate::event::{RefinementProposal, SessionEvent};
use crate::executor::ExecutorSpec;
use crate::llm::LlmClient;
use crate::policy::ambiguity;
use crate::policy::approval::{self, Decision};
use crate::policy::checklist::{self, ChecklistItem};
use crate::policy::delegation::{ChildPausePolicy, ChildRequest};
use crate::policy::fleet::{self, OwnerWatch};
use crate::policy::guardrails::{self, Breach, Limits, LimitsPatch};
use crate::policy::lifecycle::{self, Action, Mode, PausePlan, Reason, Status, StopPlan};
use crate::policy::loop_state::LoopState;
use crate::policy::retention::TenantRetention;
use crate::policy::termination::{self, Facts};
use crate::store::{
    self, ControlAction, Lease, NewSession, Session, SessionCursor, SessionSettings, Store,
    StoreError, TenantScope,
};

/// Longest goal accepted, in characters (as JSON Schema's `maxLength` counts).
pub const MAX_GOAL_CHARS: usize = 10_000;
/// Longest guidance accepted, in characters.
pub const MAX_GUIDANCE_CHARS: usize = 10_000;

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
    /// Split the goal into tasks that run in parallel as child sessions
    /// (at most 8), each with an equal share of the budget (the session
    /// keeps one too). The session waits (`paused / waiting_for_children`)
    /// until they all end, then runs its own steps with their results.
    #[serde(default)]
    #[schema(max_items = 8)]
    pub subgoals: Vec<Subgoal>,
    /// What a child of this session's tree (a subgoal, or a task any of its
    /// sessions delegates) does when it would pause for a person (a budget
    /// projected to overrun, a review point, a question, an approval, …):
    /// `wait` (default: it pauses, and the tree waits with it, named in
    /// `children_needing_attention` of every ancestor's status, in a
    /// `child_needs_attention` event of every ancestor's log and in
    /// `GET /api/autonomous/attention`) or `fail_child` (it ends `failed`
    /// with the reason it would have paused for, and its parent gets that
    /// result like any failed child's). Children copy it.
    #[serde(default)]
    pub on_child_pause: ChildPausePolicy,
}

/// One task of a split goal: its text, or the text with criteria, a
/// budget share and (for a scripted session) the child's own steps.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Subgoal {
    /// Just the task's goal.
    Goal(String),
    /// The task in full.
    Task(SubgoalTask),
}

/// A task of a split goal, in full.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubgoalTask {
    /// The child's goal.
    pub goal: String,
    /// How the child knows it is done.
    #[serde(default)]
    pub success_criteria: Vec<String>,
    /// Fraction of what the session has left the child gets (0 < share ≤ 1).
    #[serde(default)]
    pub budget_share: Option<f64>,
    /// The child's own scripted steps (without them it runs with the
    /// session's executor).
    #[serde(default)]
    #[schema(no_recursion)]
    pub steps: Option<Vec<crate::executor::ScriptedStep>>,
    /// With `steps`: run them again and again (until a limit or a stop signal).
    #[serde(default)]
    pub repeat: bool,
}

/// A create's `Idempotency-Key` with the digest of its request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The key as the client sent it.
    pub key: String,
    /// SHA-256 of the request body as parsed JSON.
    pub digest: [u8; 32],
}

/// What a create did.
#[derive(Debug)]
pub enum Created {
    /// A new session.
    New(Session),
    /// The session an earlier request with the same idempotency key created.
    Replayed(Session),
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
    reads: SessionReads,
    config: Arc<Config>,
    supervisor: Supervisor,
}

/// A create request, checked and resolved against the defaults.
struct NewRequest {
    /// The goal as given, trimmed.
    goal: String,
    mode: Mode,
    limits: Limits,
    executor: crate::executor::StoredExecutor,
    /// The session's own model API key, stored sealed apart from `executor`.
    api_key: Option<crate::executor::ApiKey>,
    /// The query of the client-chosen URL, stored sealed apart from `executor`.
    url_query: Option<crate::executor::UrlQuery>,
    criteria: Vec<ChecklistItem>,
    milestones: Vec<ChecklistItem>,
    /// The model endpoint for refinement and checklists, when configured.
    planner: Option<(LlmClient, String)>,
    /// The tasks of a split goal, each with the child's own executor when not the session's.
    split: Vec<(ChildRequest, Option<serde_json::Value>)>,
    req: CreateSession,
}

/// What pre-flight decided before anything is written.
struct Preflight {
    /// The goal the session runs.
    goal: String,
    /// The refinement proposal, for an ambiguous goal.
    proposal: Option<RefinementProposal>,
    /// The session waits for the user to answer the proposal.
    waits: bool,
    criteria: Vec<ChecklistItem>,
    milestones: Vec<ChecklistItem>,
    /// Tokens the model calls used.
    tokens: u64,
    /// What pre-flight did, for the log.
    events: Vec<SessionEvent>,
}

/// The tasks of a split goal as child requests: each gets an equal share
/// of what is left when it is made, the session keeping one too. A task
/// with steps of its own runs them with the session's named `scripts`.
fn split_tasks(
    subgoals: &[Subgoal],
    scripts: Option<&serde_json::Value>,
) -> Result<Vec<(ChildRequest, Option<serde_json::Value>)>> {
    let max = crate::policy::delegation::DEFAULT_MAX_CHILDREN as usize;
    if subgoals.len() > max {
        return Err(ServiceError::Invalid(format!(
            "subgoals may name at most {max} tasks, got {}",
            subgoals.len()
        )));
    }
    let n = subgoals.len();
    subgoals
        .iter()
        .enumerate()
        .map(|(i, subgoal)| {
            let equal = 1.0 / (n + 1 - i) as f64;
            let (request, steps, repeat) = match subgoal {
                Subgoal::Goal(goal) => (
                    ChildRequest {
                        goal: goal.clone(),
                        success_criteria: Vec::new(),
                        budget_share: Some(equal),
                        wait: true,
                    },
                    None,
                    false,
                ),
                Subgoal::Task(task) => (
                    ChildRequest {
                        goal: task.goal.clone(),
                        success_criteria: task.success_criteria.clone(),
                        budget_share: Some(task.budget_share.unwrap_or(equal)),
                        wait: true,
                    },
                    task.steps.clone(),
                    task.repeat,
                ),
            };
            request
                .validate()
                .map_err(|e| ServiceError::Invalid(format!("subgoals[{i}]: {e}")))?;
            let own = match steps {
                None => None,
                Some(steps) => {
                    if steps.is_empty() || steps.len() > crate::executor::MAX_SCRIPTED_STEPS {
                        return Err(ServiceError::Invalid(format!(
                            "subgoals[{i}].steps must hold 1 to {} steps",
                            crate::executor::MAX_SCRIPTED_STEPS
                        )));
                    }
                    for (j, step) in steps.iter().enumerate() {
                        step.validate().map_err(|e| {
                            ServiceError::Invalid(format!("subgoals[{i}].steps[{j}].{e}"))
                        })?;
                    }
                    let mut own =
                        serde_json::json!({ "kind": "scripted", "steps": steps, "repeat": repeat });
                    if let (Some(scripts), Some(obj)) = (scripts, own.as_object_mut()) {
                        obj.insert("scripts".into(), scripts.clone());
                    }
                    Some(own)
                }
            };
            Ok((request, own))
        })
        .collect()
}

fn validate_goal(goal: &str) -> Result<String> {
    let goal = crate::policy::text::trim(goal);
    if goal.is_empty() {
        return Err(ServiceError::Invalid("goal must not be empty".into()));
    }
    if goal.chars().count() > MAX_GOAL_CHARS {
        return Err(ServiceError::Invalid(format!(
            "goal must be at most {MAX_GOAL_CHARS} characters, got {}",
            goal.chars().count()
        )));
    }
    if let Some(why) = ambiguity::refusal(goal) {
        return Err(ServiceError::Invalid(why));
    }
    Ok(goal.to_string())
}

/// How often a stop waiting for an absent owner looks again.
const LANDING_POLL: Duration = Duration::from_millis(50);
/// Added to the promised landing time: the look that lands it comes after.
const LANDING_SLACK: Duration = Duration::from_millis(500);
/// Most looks of a stop landed later: each waits until the owner would
/// count as gone, so a few cover an owner that renewed meanwhile.
const LANDING_TRIES: usize = 8;

/// Where a status answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSource {
    /// The loop's memory of what it committed, under a lease it trusts.
    Memory,
    /// Postgres.
    Database,
    /// Postgres is out of reach: the last committed state this replica's
    /// memory holds, possibly behind the database's.
    StaleMemory,
}

/// What a stop achieved by the time it answers.
#[derive(Debug)]
pub enum StopAnswer {
    /// The session is no longer running (interrupted, or had ended).
    Landed(Session),
    /// Recorded (`stop_requested`) but not landed yet: it will be by `lands_by`.
    Pending {
        /// The session as it is now.
        session: Session,
        /// When the stop will have landed: the owner lands it, or it counts
        /// as gone by then and the stop lands without it.
        lands_by: chrono::DateTime<chrono::Utc>,
    },
}

/// Whether a recorded stop still waits for its owner.
enum Landing {
    /// Landed, or nothing left to land.
    Done,
    /// The owner may still land it; it counts as gone after this long.
    Wait(chrono::TimeDelta),
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
            reads: SessionReads::new(store.clone()),
            store,
            config,
            supervisor,
        }
    }

    /// The MCP servers declared for this replica (`WARDEN_MCP_CONFIG`), by name.
    pub fn mcp_servers(&self) -> Vec<String> {
        self.config
            .mcp
            .as_ref()
            .map(|c| c.names().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The store, for the use cases of this layer's other files (never
    /// the HTTP layer's: it calls use cases).
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// The configuration, for the use cases of this layer's other files.
    pub(super) fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The read model the read-only endpoints use.
    pub fn reads(&self) -> &SessionReads {
        &self.reads
    }

    /// Price of a million tokens, when configured.
    pub fn token_price(&self) -> Option<f64> {
        self.config.token_price_per_million
    }

    /// The step of `id` in flight on this replica, if it runs here.
    pub fn step_in_flight(&self, id: Uuid) -> Option<StepInFlight> {
        self.supervisor.step_in_flight(id)
    }

    /// Creates a session and starts its loop: validate, pre-flight (goal
    /// refinement, generated checklists), then persist in one transaction.
    /// Everything that can fail is done before the commit, or undone after
    /// it: an error means no session was created. With an idempotency key,
    /// a repeated request (same tenant, key and body, within 24 hours)
    /// answers the session the first one created.
    #[tracing::instrument(skip_all)]
    pub async fn create(
        &self,
        req: CreateSession,
        tenant: &str,
        idempotency: Option<&IdempotencyKey>,
    ) -> Result<Created> {
        let scope = TenantScope::tenant_only(tenant);
        if let Some(key) = idempotency
            && let Some(used) = self
                .store
                .used_idempotency_key(&scope, tenant, &key.key)
                .await?
        {
            return self
                .replay(used.session_id, used.request_digest == key.digest, &scope)
                .await;
        }
        let request = self.validate_create(req)?;
        let plan = self.preflight(&request, tenant).await?;
        let id = Uuid::new_v4();
        let workspace = self.prepare_workspace(&request, id).await?;
        let acquired = Instant::now();
        let slot = if plan.waits {
            None
        } else {
            self.supervisor.try_reserve()
        };
        let persisted = self
            .persist_new(id, request, plan, tenant, slot.is_some(), idempotency)
            .await;
        let (record, lease) = match persisted {
            Ok(done) => done,
            Err(err) => {
                if workspace {
                    self.remove_workspace(id).await;
                }
                return match err {
                    // A concurrent create with the same key won.
                    ServiceError::KeyUsed {
                        session_id,
                        same_request,
                    } => self.replay(session_id, same_request, &scope).await,
                    err => Err(err),
                };
            }
        };
        tracing::info!(session_id = %record.id, status = record.status.as_str(), "session created");
        if let (Some(lease), Some(slot)) = (lease, slot)
            && let Err(err) = self
                .supervisor
                .spawn_in(
                    slot,
                    lease,
                    acquired,
                    &record,
                    super::rehydrate::initial_state(&record),
                )
                .await
        {
            self.undo_create(&record).await;
            return Err(err);
        }
        Ok(Created::New(record))
    }

    /// The answer to a create whose idempotency key was used already.
    async fn replay(&self, id: Uuid, same_request: bool, scope: &TenantScope) -> Result<Created> {
        if !same_request {
            return Err(ServiceError::KeyUsed {
                session_id: id,
                same_request,
            });
        }
        Ok(Created::Replayed(self.get(id, scope).await?))
    }

    /// Makes the workspace of a new session whose executor works in one,
    /// before anything is committed; says whether it made one.
    async fn prepare_workspace(&self, request: &NewRequest, id: Uuid) -> Result<bool> {
        if !request.req.executor.uses_workspace() {
            return Ok(false);
        }
        let root = self.config.workspace_root.clone();
        tokio::task::spawn_blocking(move || crate::executor::workspace::Workspace::open(&root, id))
            .await
            .map_err(|e| ServiceError::Unavailable(format!("cannot open the session workspace: {e}")))?
            .map_err(|e| {
                ServiceError::Unavailable(format!(
                    "cannot open the session workspace (WARDEN_WORKSPACE_ROOT): {e}; nothing was created"
                ))
            })?;
        Ok(true)
    }

    async fn remove_workspace(&self, id: Uuid) {
        if let Err(err) = super::retention::remove(&self.config.workspace_root, id).await {
            tracing::warn!(session_id = %id, error = %err, "cannot remove a workspace; the retention sweep will");
        }
    }

    /// Takes back a session whose create committed but whose loop could not
    /// start, so that the error answered means nothing was created.
    async fn undo_create(&self, record: &Session) {
        let scope = TenantScope::tenant_only(&record.tenant);
        let undone: Result<()> = async {
            let mut tx = self.store.begin().await?;
            store::delete_session(&mut tx, record.id, &scope).await?;
            self.commit(tx, record.id).await
        }
        .await;
        match undone {
            Ok(()) => {
                tracing::warn!(session_id = %record.id, "the new session's loop could not start; the create was undone")
            }
            Err(err) => {
                tracing::error!(session_id = %record.id, error = %err, "the new session's loop could not start and the create could not be undone; it is rescued like an orphan")
            }
        }
        self.remove_workspace(record.id).await;
    }

    /// Validate: the goal, the executor, the checklists and the limits.
    fn validate_create(&self, req: CreateSession) -> Result<NewRequest> {
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
        let criteria = checklist::from_texts("success_criteria", &req.success_criteria)
            .map_err(ServiceError::Invalid)?;
        let milestones =
            checklist::from_texts("milestones", &req.milestones).map_err(ServiceError::Invalid)?;
        let mode = req.mode.unwrap_or(self.config.defaults.mode);
        let limits = self
            .config
            .defaults
            .limits_for(mode)
            .for_create(&req.limits)?;
        // The key never enters the stored spec: it is sealed on its own. So
        // is the URL's query (it often is a credential); the stored
        // executor only says there is one.
        let (executor, api_key, url_query) =
            crate::executor::StoredExecutor::seal(req.executor.clone());
        // A subgoal with steps of its own still gets the session's named
        // scripts, so its own steps can delegate to them.
        let scripts = match &executor.spec {
            crate::executor::ExecutorSpec::Scripted { scripts, .. } if !scripts.is_empty() => Some(
                serde_json::to_value(scripts)
                    .map_err(|e| ServiceError::Invalid(format!("executor.scripts: {e}")))?,
            ),
            _ => None,
        };
        let split = split_tasks(&req.subgoals, scripts.as_ref())?;
        let planner = self.planner();
        if req.generate_criteria && planner.is_none() {
            return Err(ServiceError::Invalid(
                "generate_criteria needs a model endpoint (WARDEN_LLM_BASE_URL and WARDEN_LLM_MODEL)".into(),
            ));
        }
        Ok(NewRequest {
            goal,
            mode,
            limits,
            executor,
            api_key,
            url_query,
            criteria,
            milestones,
            planner,
            split,
            req,
        })
    }

    /// Pre-flight: an ambiguous goal waits for the user or is refined at
    /// once; checklists are generated when asked for.
    async fn preflight(&self, request: &NewRequest, tenant: &str) -> Result<Preflight> {
        let mut plan = Preflight {
            goal: request.goal.clone(),
            proposal: None,
            waits: false,
            criteria: request.criteria.clone(),
            milestones: request.milestones.clone(),
            tokens: 0,
            events: Vec::new(),
        };
        // The MCP servers chosen must be declared and open to the tenant.
        let no_servers = crate::mcp::McpConfig::default();
        request
            .req
            .executor
            .check_tools(self.config.mcp.as_deref().unwrap_or(&no_servers), tenant)
            .map_err(ServiceError::Invalid)?;
        request
            .req
            .executor
            .vet_urls(
                &self.config.egress,
                self.config
                    .models
                    .endpoint
                    .as_ref()
                    .map(|e| e.base_url.as_str()),
            )
            .await
            .map_err(ServiceError::EgressDenied)?;
        let report = ambiguity::assess(&request.goal);
        // A goal split into tasks is refined by its split.
        if report.ambiguous
            && request.split.is_empty()
            && (self.config.require_concrete_goals || self.config.auto_refine_goals)
        {
            // An unreadable goal has no topic to refine: it waits for a new one.
            let refiner = request.planner.as_ref().filter(|_| !report.unreadable);
            let (suggested, source) = match refiner {
                Some((client, model)) => {
                    self.admit_model_call(tenant).await?;
                    match planner::refine_goal(client, model, &request.goal).await {
                        Ok(p) => {
                            plan.tokens = plan.tokens.saturating_add(p.tokens);
                            (p.value, "model")
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "model refinement failed; using the rules");
                            (report.suggested_goal.clone(), "rules")
                        }
                    }
                }
                None => (report.suggested_goal.clone(), "rules"),
            };
            let proposal = RefinementProposal {
                suggested_goal: suggested.clone(),
                matched_patterns: report.matched_patterns.clone(),
                confidence: report.confidence,
                source: source.into(),
                choices: ["accept_suggestion", "custom", "proceed_with_time_limit"]
                    .map(String::from)
                    .to_vec(),
            };
            plan.events
                .push(SessionEvent::RefinementSuggested(proposal.clone()));
            if self.config.auto_refine_goals && !report.unreadable {
                plan.events.push(SessionEvent::GoalRefined {
                    kind: "auto".into(),
                    from: request.goal.clone(),
                    to: suggested.clone(),
                    limits: None,
                });
                plan.goal = suggested;
            } else {
                plan.waits = true;
            }
            plan.proposal = Some(proposal);
        }
        if request.req.generate_criteria
            && plan.criteria.is_empty()
            && plan.milestones.is_empty()
            && let Some((client, model)) = &request.planner
        {
            self.admit_model_call(tenant).await?;
            let p = planner::plan_checklists(client, model, &plan.goal)
                .await
                .map_err(|err| {
                    ServiceError::Unavailable(format!("could not generate success criteria: {err}"))
                })?;
            plan.tokens = plan.tokens.saturating_add(p.tokens);
            plan.criteria = checklist::from_texts("success_criteria", &p.value.0)
                .map_err(ServiceError::Invalid)?;
            plan.milestones =
                checklist::from_texts("milestones", &p.value.1).map_err(ServiceError::Invalid)?;
            plan.events.push(SessionEvent::CriteriaGenerated {
                criteria: p.value.0,
                milestones: p.value.1,
            });
        }
        Ok(plan)
    }

    /// Persist: the session, its log and its first refinement, in one
    /// transaction; it runs here when `slot_reserved`, else it is queued.
    async fn persist_new(
        &self,
        id: Uuid,
        request: NewRequest,
        plan: Preflight,
        tenant: &str,
        slot_reserved: bool,
        idempotency: Option<&IdempotencyKey>,
    ) -> Result<(Session, Option<store::Lease>)> {
        let NewRequest {
            goal,
            mode,
            limits,
            executor,
            api_key,
            url_query,
            split,
            req,
            ..
        } = request;
        let mut log = Vec::with_capacity(plan.events.len() + 1);
        log.push(SessionEvent::SessionCreated {
            goal: goal.clone(),
            mode,
            limits,
            executor: req.executor.kind().into(),
            success_criteria: req.success_criteria,
            milestones: req.milestones,
        });
        log.extend(plan.events);
        let proposal_data = plan
            .proposal
            .as_ref()
            .map(|p| to_stored("refinement proposal", p))
            .transpose()?
            .unwrap_or(serde_json::Value::Null);
        let sealed = match &api_key {
            Some(key) => Some(self.sealing_key()?.seal(
                id,
                crate::secrets::API_KEY,
                key.expose(),
            )?),
            None => None,
        };
        let sealed_query = match &url_query {
            Some(query) => Some(self.sealing_key()?.seal(
                id,
                crate::secrets::URL_QUERY,
                query.expose(),
            )?),
            None => None,
        };
        let new = NewSession {
            id,
            original_goal: (plan.goal != goal).then(|| goal.clone()),
            goal: plan.goal,
            mode,
            limits,
            executor,
            refinement: plan.proposal,
            criteria: plan.criteria,
            milestones: plan.milestones,
            refinement_tokens: i64::try_from(plan.tokens).unwrap_or(i64::MAX),
            tenant: tenant.to_string(),
        };
        let first_refinement = new.original_goal.as_ref().map(|from| FirstRefinement {
            from,
            proposal: &proposal_data,
        });
        let start = if !split.is_empty() {
            persist::Start::Split(split)
        } else if plan.waits {
            persist::Start::AwaitRefinement
        } else {
            persist::Start::Admit {
                owner: self.supervisor.replica_id(),
                slot_reserved,
            }
        };
        persist::create_session(
            &self.store,
            &new,
            start,
            self.config.lease.ttl,
            &event_codec::encode(&log)?,
            first_refinement,
            persist::Admission {
                api_key: sealed.as_ref(),
                url_query: sealed_query.as_ref(),
                tenant_max_running: self.config.quotas.tenant_max_running,
                idempotency: idempotency.map(|k| (k.key.as_str(), k.digest.as_slice())),
                on_child_pause: req.on_child_pause,
            },
        )
        .await
    }

    /// The key sessions' secrets are sealed with (loaded at start).
    fn sealing_key(&self) -> Result<&crate::secrets::SecretKey> {
        self.config.secret_key.key().ok_or_else(|| {
            ServiceError::Unavailable("the secret key (WARDEN_SECRET_KEY) is not loaded".into())
        })
    }

    /// Answers a refinement proposal and starts the session.
    #[tracing::instrument(skip(self, choice))]
    pub async fn refine(
        &self,
        id: Uuid,
        scope: &TenantScope,
        choice: RefinementChoice,
    ) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Refine, id, scope).await?;
        lifecycle::check_refine(session.status)?;
        let suggested = session
            .refinement
            .as_ref()
            .map(|r| r.suggested_goal.clone());
        let mut limits = session.limits.0;
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
        store::insert_refinement(&mut tx, id, scope, kind, &session.goal, &goal, &data).await?;
        let (slot, status) = self.admit(&mut tx, &session.tenant).await?;
        let events = event_codec::encode(&[
            SessionEvent::GoalRefined {
                kind: kind.into(),
                from: session.goal.clone(),
                to: goal.clone(),
                limits: Some(limits),
            },
            SessionEvent::status(Some(session.status), status),
        ])?;
        let acquired = Instant::now();
        let lease = store::start_refined(
            &mut tx,
            id,
            scope,
            &goal,
            limits,
            (status == Status::Running).then(|| self.supervisor.replica_id()),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        self.start_run(tx, id, scope, lease.zip(slot), acquired)
            .await
    }

    /// Where a session ready to run goes (see [`lifecycle::admission`]): a
    /// place here when one is free and nobody waits before it, else the
    /// queue. The place is kept only when it runs here.
    async fn admit(
        &self,
        conn: &mut sqlx::PgConnection,
        tenant: &str,
    ) -> Result<(Option<Slot>, Status)> {
        let slot = self.supervisor.try_reserve();
        let queue_empty = match slot {
            Some(_) => {
                !store::queue_waiting(conn, tenant, self.config.quotas.tenant_max_running).await?
            }
            None => false,
        };
        let status = lifecycle::admission(slot.is_some(), queue_empty);
        Ok((slot.filter(|_| status == Status::Running), status))
    }

    /// Opens a transaction holding session `id`'s row (as `scope` reaches
    /// it), refused when `action` may not touch it (an imported session is
    /// read-only).
    async fn lock_for(
        &self,
        action: Action,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<(Transaction<'static, Postgres>, Session)> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_writable(action, session.status, session.imported_at.is_some())?;
        Ok((tx, session))
    }

    /// Commits a change to session `id` and wakes its readers.
    async fn commit(&self, tx: Transaction<'static, Postgres>, id: Uuid) -> Result<()> {
        tx.commit().await.map_err(StoreError::from)?;
        // What the answer reports must survive a crash of the machine too.
        self.store.durable().await?;
        self.store.announce(id);
        Ok(())
    }

    /// Commits a (re)start of session `id` and, under `run` (its lease and
    /// place here), runs its loop here; without one it was queued.
    async fn start_run(
        &self,
        mut tx: Transaction<'static, Postgres>,
        id: Uuid,
        scope: &TenantScope,
        run: Option<(Lease, Slot)>,
        acquired: Instant,
    ) -> Result<Session> {
        // Read back on the locked connection: a handful of pool acquires
        // here would delay the loop's start behind every queued request.
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let Some((lease, slot)) = run else {
            self.commit(tx, id).await?;
            return Ok(session);
        };
        let state = rebuild_locked(&mut tx, &session).await?;
        self.commit(tx, id).await?;
        self.supervisor
            .spawn_in(slot, lease, acquired, &session, state)
            .await?;
        if self.supervisor.done_signal(id).is_none() {
            // No loop runs: it ended already, or the session could not
            // start (its secret does not decrypt). Answer what it is now.
            if let Some(now) = self.store.session(id, scope).await? {
                return Ok(now);
            }
        }
        Ok(session)
    }

    /// Takes one of `tenant`'s calls on the server's own model, or refuses
    /// the request (429) naming the setting that raises the limit.
    async fn admit_model_call(&self, tenant: &str) -> Result<()> {
        let admitted = self.supervisor.model_calls().admit(tenant).await;
        self.supervisor
            .metrics()
            .model_call(tenant, admitted.is_ok());
        admitted.map_err(|limited| ServiceError::Quota {
            code: "tenant_model_rate_limit",
            detail: limited.detail(),
        })
    }

    /// The default model endpoint as a client and model name, when configured.
    fn planner(&self) -> Option<(LlmClient, String)> {
        let endpoint = self.config.models.endpoint.clone()?;
        let model = self.config.models.model.clone()?;
        LlmClient::new(endpoint).ok().map(|c| (c, model))
    }

    /// A session's status and its velocity (iterations per minute, last 30
    /// minutes), as committed: from this replica's memory when it runs the
    /// session, else from Postgres. A session outside `scope` is not found,
    /// like a missing one, on both paths. The flag says whether memory
    /// answered.
    pub async fn status(
        &self,
        id: Uuid,
        scope: &TenantScope,
    ) -> Result<(Session, Velocity, StatusSource)> {
        if let Some((session, velocity, freshness)) = self.supervisor.live(id) {
            if !scope.allows(&session.tenant) {
                return Err(ServiceError::NotFound(id));
            }
            let source = match freshness {
                Freshness::Confirmed => StatusSource::Memory,
                Freshness::WriteFailed => StatusSource::StaleMemory,
            };
            return Ok((session, velocity, source));
        }
        let refill = self.supervisor.refillable(id);
        // Both reads at once: under load each waits on Postgres, so the
        // status answers in the time of the slower one rather than of both.
        let read = tokio::try_join!(
            self.get(id, scope),
            self.reads.velocity(id, scope, VELOCITY_MINUTES)
        );
        let (session, velocity) = match read {
            Ok(read) => read,
            // Postgres is out of reach: the last committed state this
            // replica knows, however old, marked stale.
            Err(ServiceError::Store(StoreError::Database(err))) if store::is_unavailable(&err) => {
                return match self.supervisor.last_known(id) {
                    Some((session, velocity)) if scope.allows(&session.tenant) => {
                        Ok((session, velocity, StatusSource::StaleMemory))
                    }
                    _ => Err(StoreError::Database(err).into()),
                };
            }
            Err(err) => return Err(err),
        };
        self.supervisor.forget(id);
        if let Some((view, generation)) = refill
            && session.status == Status::Running
            && session.owner == Some(self.supervisor.replica_id())
        {
            view.refill(generation, &session, &velocity);
        }
        Ok((session, velocity, StatusSource::Database))
    }

    /// One session, if `scope` reaches it, as it shows (see [`SessionService::shown`]).
    pub async fn get(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        self.stored(id, scope).await.map(|s| self.shown(s))
    }

    /// One session as stored, if `scope` reaches it.
    async fn stored(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        self.store
            .session(id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))
    }

    /// `session` as clients see it: `running` under a lease that lapsed
    /// and that no replica took over for two heartbeats shows `queued`,
    /// without the owner that is gone (`policy::fleet::shown_status`).
    pub fn shown(&self, mut session: Session) -> Session {
        let shown = fleet::shown_status(
            session.status,
            session.lease_expires_at,
            chrono::Utc::now(),
            self.config.lease.heartbeat * fleet::MISSED_HEARTBEATS,
        );
        if shown != session.status {
            session.status = shown;
            session.owner = None;
            session.lease_expires_at = None;
        }
        session
    }

    /// A page of the sessions `filter` lets through, in `order`.
    pub async fn list(
        &self,
        filter: &store::SessionFilter,
        order: store::SessionOrder,
        after: Option<SessionCursor>,
        limit: i64,
        scope: &TenantScope,
    ) -> Result<Vec<Session>> {
        let sessions = self
            .store
            .list_sessions(filter, order, after, limit, scope)
            .await?;
        Ok(sessions.into_iter().map(|s| self.shown(s)).collect())
    }

    /// How many sessions `scope` reaches are in each status, of those
    /// `filter` lets through (its `status` aside).
    pub async fn count_by_status(
        &self,
        filter: &store::SessionFilter,
        scope: &TenantScope,
    ) -> Result<Vec<(Status, i64)>> {
        Ok(self.store.count_sessions_by_status(filter, scope).await?)
    }

    /// Stops a session: persisted first, then signalled; waits for the loop
    /// to land. A stop whose owner is gone (lease lapsed, or silent for
    /// [`fleet::MISSED_HEARTBEATS`] heartbeats) lands here; one the owner
    /// has not landed within the wait answers when it will land.
    #[tracing::instrument(skip(self))]
    pub async fn stop(&self, id: Uuid, scope: &TenantScope) -> Result<StopAnswer> {
        let received = Instant::now();
        let (mut tx, session) = self.lock_for(Action::Stop, id, scope).await?;
        match lifecycle::plan_stop(session.status)? {
            StopPlan::AlreadyStopped => {
                self.commit(tx, id).await?;
            }
            StopPlan::InterruptNow => {
                // An outcome a worker completed but no run collected is not
                // applied (the stop wins); its tokens are charged, and so
                // counted by the state rebuilt next.
                store::charge_uncollected_outcomes(&mut tx, id, scope).await?;
                // On the locked connection: never a second one while the lock is held.
                let state = rebuild_locked(&mut tx, &session).await?;
                self.end_unowned(&mut tx, &session, scope, &state, Reason::UserStop)
                    .await?;
                self.commit(tx, id).await?;
            }
            StopPlan::SignalRunner => {
                store::request_stop(&mut tx, id, scope).await?;
                self.commit(tx, id).await?;
                match self.supervisor.signal_stop(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.stop_elsewhere(id, scope).await?,
                }
                self.supervisor
                    .metrics()
                    .stop_seconds
                    .observe(received.elapsed());
            }
        }
        let session = self.stored(id, scope).await?;
        if session.status != Status::Running {
            return Ok(StopAnswer::Landed(session));
        }
        // Recorded, not landed yet: say by when it will be, and make sure
        // it is if the owner is gone by then.
        let lands_by = match fleet::owner_watch(
            chrono::Utc::now(),
            session.lease_expires_at,
            session.heartbeat_at,
            self.config.lease.heartbeat,
        ) {
            OwnerWatch::AliveUntil(deadline) => deadline,
            OwnerWatch::Gone => chrono::Utc::now(),
        } + chrono::TimeDelta::from_std(LANDING_SLACK).unwrap_or_default();
        if session.owner != Some(self.supervisor.replica_id()) {
            self.land_later(id, scope.clone());
        }
        Ok(StopAnswer::Pending { session, lands_by })
    }

    /// A stop for a session this replica does not run: tell its owner, and
    /// if the owner is gone (or goes while the stop waits), land it here.
    async fn stop_elsewhere(&self, id: Uuid, scope: &TenantScope) -> Result<()> {
        self.store.notify_control(ControlAction::Stop, id).await?;
        let deadline = Instant::now() + self.config.control_wait;
        loop {
            if let Landing::Done = self.land_if_owner_gone(id, scope).await? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(LANDING_POLL).await;
        }
    }

    /// Lands the recorded stop of `id` here when its owner is gone: under
    /// the row lock, with the owner's liveness read again there, so a live
    /// owner (or a rescue that took the session over) is never overruled.
    async fn land_if_owner_gone(&self, id: Uuid, scope: &TenantScope) -> Result<Landing> {
        let Some(seen) = self.store.owner_liveness(id, scope).await? else {
            return Ok(Landing::Done);
        };
        if seen.status != Status::Running {
            return Ok(Landing::Done);
        }
        let heartbeat = self.config.lease.heartbeat;
        if let OwnerWatch::AliveUntil(until) = fleet::owner_watch(
            seen.now,
            seen.lease_expires_at,
            seen.heartbeat_at,
            heartbeat,
        ) {
            return Ok(Landing::Wait(until - seen.now));
        }
        let mut tx = self.store.begin().await?;
        // Everything under the lock is read on its own connection.
        let locked = store::lock_session(&mut tx, id, scope).await?;
        let under_lock = store::owner_liveness_on(&mut tx, id, scope).await?;
        if let (Some(locked), Some(l)) = (locked, under_lock)
            && locked.status == Status::Running
            && locked.stop_requested
            && fleet::owner_watch(l.now, l.lease_expires_at, l.heartbeat_at, heartbeat)
                == OwnerWatch::Gone
        {
            // As a stop of an unowned session: the stop wins over an
            // uncollected outcome, whose tokens are charged.
            store::charge_uncollected_outcomes(&mut tx, id, scope).await?;
            let state = rebuild_locked(&mut tx, &locked).await?;
            self.end_unowned(&mut tx, &locked, scope, &state, Reason::UserStop)
                .await?;
            self.commit(tx, id).await?;
            tracing::info!(session_id = %id, "owner gone: stop landed by this replica");
            return Ok(Landing::Done);
        }
        self.commit(tx, id).await?;
        Ok(Landing::Done)
    }

    /// After a stop answered 202: lands it here once the owner counts as
    /// gone, unless the owner (or a rescue) landed it first. Gives up after
    /// [`LANDING_TRIES`] looks; a rescue lands it at the latest.
    fn land_later(&self, id: Uuid, scope: TenantScope) {
        let me = self.clone();
        tokio::spawn(async move {
            for _ in 0..LANDING_TRIES {
                match me.land_if_owner_gone(id, &scope).await {
                    Ok(Landing::Done) => return,
                    Ok(Landing::Wait(until)) => {
                        let wait = until.to_std().unwrap_or_default();
                        tokio::time::sleep(wait + LANDING_POLL).await;
                    }
                    Err(err) => {
                        tracing::warn!(session_id = %id, error = %err, "cannot land the stop yet");
                        tokio::time::sleep(me.config.lease.heartbeat).await;
                    }
                }
            }
            tracing::warn!(session_id = %id, "stop left to the owner or the rescue");
        });
    }

    async fn end_unowned(
        &self,
        conn: &mut sqlx::PgConnection,
        session: &Session,
        scope: &TenantScope,
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
        let snapshot = to_stored("checkpoint state", &snapshot)?;
        let events = event_codec::encode(&[SessionEvent::run_ended(
            session.status,
            &termination,
            &usage,
        )])?;
        store::end_unowned(
            conn,
            session.id,
            scope,
            &termination,
            Some((usage.iterations as i64, snapshot)),
            &events,
        )
        .await?;
        Ok(())
    }

    /// Pauses a session after its step in flight.
    #[tracing::instrument(skip(self))]
    pub async fn pause(&self, id: Uuid, scope: &TenantScope) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Pause, id, scope).await?;
        match lifecycle::plan_pause(session.status)? {
            PausePlan::AlreadyPaused => {
                self.commit(tx, id).await?;
            }
            PausePlan::SignalRunner => {
                store::request_pause(&mut tx, id, scope).await?;
                self.commit(tx, id).await?;
                match self.supervisor.signal_pause(id) {
                    Some(done) => wait_done(Some(done), self.config.control_wait).await,
                    None => self.store.notify_control(ControlAction::Pause, id).await?,
                }
            }
        }
        self.get(id, scope).await
    }

    /// Resumes a paused, stopped, interrupted or failed session.
    #[tracing::instrument(skip(self, req))]
    pub async fn resume(
        &self,
        id: Uuid,
        scope: &TenantScope,
        req: ResumeSession,
    ) -> Result<Session> {
        let guidance = req
            .guidance
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        if let Some(g) = guidance
            && g.chars().count() > MAX_GUIDANCE_CHARS
        {
            return Err(ServiceError::Invalid(format!(
                "guidance must be at most {MAX_GUIDANCE_CHARS} characters, got {}",
                g.chars().count()
            )));
        }
        let action = if req.reopen {
            Action::Reopen
        } else {
            Action::Resume
        };
        let (mut tx, session) = self.lock_for(action, id, scope).await?;
        lifecycle::check_resume(session.status, req.reopen)?;
        let waiting = store::count_waiting_approvals(&mut tx, id, scope).await?;
        if waiting > 0 {
            return Err(ServiceError::ApprovalsWaiting {
                session_id: id,
                waiting,
            });
        }
        self.resume_locked(tx, session, scope, req, Vec::new())
            .await
    }

    /// Resumes a session whose row `tx` holds locked; `leading` events are
    /// logged before the resume's own.
    async fn resume_locked(
        &self,
        mut tx: Transaction<'static, Postgres>,
        session: Session,
        scope: &TenantScope,
        req: ResumeSession,
        leading: Vec<SessionEvent>,
    ) -> Result<Session> {
        let id = session.id;
        let guidance = req
            .guidance
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        persist::check_tenant_room(
            &mut tx,
            &session.tenant,
            self.config.quotas.tenant_max_running,
        )
        .await?;
        let new_goal = req.goal.as_deref().map(validate_goal).transpose()?;
        let limits = session.limits.apply(&req.limits)?;
        guardrails::check_child_budget(session.parent_id.is_some(), &session.limits.0, &limits)?;
        let usage = session.counters().usage();
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
        let mut events = leading;
        if limits != session.limits.0 {
            events.push(SessionEvent::LimitsChanged {
                from: session.limits.0,
                to: limits,
                by: "resume".into(),
            });
        }
        if let Some(goal) = &new_goal
            && *goal != session.goal
        {
            store::insert_refinement(
                &mut tx,
                id,
                scope,
                "resume",
                &session.goal,
                goal,
                &json!({ "guidance": guidance }),
            )
            .await?;
            events.push(SessionEvent::GoalRefined {
                kind: "resume".into(),
                from: session.goal.clone(),
                to: goal.clone(),
                limits: None,
            });
        }
        events.push(SessionEvent::Resumed {
            run: session.run + 1,
            guidance: guidance.map(str::to_string),
            reopened: req.reopen,
            from_status: session.status,
            from_reason: session.reason,
        });
        let (slot, status) = self.admit(&mut tx, &session.tenant).await?;
        events.push(SessionEvent::status(Some(session.status), status));
        let events = event_codec::encode(&events)?;
        let acquired = Instant::now();
        let lease = store::resume_session(
            &mut tx,
            id,
            scope,
            new_goal.as_deref(),
            limits,
            guidance,
            (status == Status::Running).then(|| self.supervisor.replica_id()),
            self.config.lease.ttl,
            &events,
        )
        .await?;
        self.start_run(tx, id, scope, lease.zip(slot), acquired)
            .await
    }

    /// The server's retention (`WARDEN_RETENTION_DAYS`; `None`: forever) and
    /// the tenants with one of their own (`tenant` only, when given).
    pub async fn retentions(
        &self,
        tenant: Option<&str>,
    ) -> Result<(Option<std::time::Duration>, Vec<(String, TenantRetention)>)> {
        Ok((
            self.config.retention.keep,
            self.store.tenant_retentions(tenant).await?,
        ))
    }

    /// Sets a tenant's own retention (`ServerDefault` drops it); the
    /// pruner applies it from its next pass.
    pub async fn set_retention(&self, tenant: &str, retention: TenantRetention) -> Result<()> {
        if !crate::auth::valid_tenant(tenant) {
            return Err(ServiceError::Invalid(format!(
                "invalid tenant {tenant:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        self.store.set_tenant_retention(tenant, retention).await?;
        Ok(())
    }

    /// Records a decision on a call that waits for approval. When it was
    /// the last call the session waited on, the session continues its
    /// step at once (as a resume would); `decided_by` is the key's actor,
    /// or `None` for an expiry. An approval may carry the person's own
    /// arguments, which the call then runs with; arguments equal to the
    /// agent's are no edit and are not recorded as one.
    #[tracing::instrument(skip(self, made), fields(decision = made.decision.as_str()))]
    pub async fn decide_approval(
        &self,
        id: Uuid,
        scope: &TenantScope,
        call_id: &str,
        made: store::NewDecision<'_>,
    ) -> Result<Session> {
        let message = made.message.map(str::trim).filter(|m| !m.is_empty());
        if let Some(m) = message
            && m.chars().count() > MAX_GUIDANCE_CHARS
        {
            return Err(ServiceError::Invalid(format!(
                "message must be at most {MAX_GUIDANCE_CHARS} characters, got {}",
                m.chars().count()
            )));
        }
        approval::check_edited_arguments(
            made.decision,
            made.edited_arguments,
            self.config.quotas.max_output_bytes,
        )
        .map_err(ServiceError::Invalid)?;
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        let made = store::NewDecision { message, ..made };
        let approval = match store::decide_approval(&mut tx, id, scope, call_id, &made).await? {
            store::Decided::Recorded(approval) => approval,
            store::Decided::Already(earlier) => {
                return Err(ServiceError::AlreadyDecided {
                    call_id: earlier.call_id,
                    decision: earlier.decision.map_or("decided", Decision::as_str),
                });
            }
            store::Decided::Missing => {
                return Err(ServiceError::ApprovalNotFound {
                    session_id: id,
                    call_id: call_id.to_string(),
                });
            }
        };
        let decided = SessionEvent::ApprovalDecided {
            call_id: approval.call_id,
            tool: approval.tool,
            decision: made.decision,
            decided_by: made.decided_by.map(str::to_string),
            message: message.map(str::to_string),
            edited_arguments: approval.edited_arguments,
        };
        let waiting = store::count_waiting_approvals(&mut tx, id, scope).await?;
        let continues = waiting == 0
            && session.status == Status::Paused
            && session.reason == Some(Reason::ApprovalRequired);
        if continues {
            return self
                .resume_locked(tx, session, scope, ResumeSession::default(), vec![decided])
                .await;
        }
        store::append_events(&mut tx, id, &event_codec::encode(&[decided])?).await?;
        self.commit(tx, id).await?;
        self.get(id, scope).await
    }

    /// Deletes an ended session with its whole history, then its workspace.
    /// A workspace that cannot be removed now is left to the retention sweep
    /// (its session is gone, so the sweep removes it).
    #[tracing::instrument(skip(self))]
    pub async fn delete(&self, id: Uuid, scope: &TenantScope) -> Result<()> {
        let mut tx = self.store.begin().await?;
        let session = store::lock_session(&mut tx, id, scope)
            .await?
            .ok_or(ServiceError::NotFound(id))?;
        lifecycle::check_delete(session.status)?;
        store::delete_session(&mut tx, id, scope).await?;
        self.commit(tx, id).await?;
        self.remove_workspace(id).await;
        Ok(())
    }

    /// Changes the mode or limits of a session; a running loop applies them
    /// from its next iteration.
    #[tracing::instrument(skip(self, req))]
    pub async fn update(
        &self,
        id: Uuid,
        scope: &TenantScope,
        req: UpdateSession,
    ) -> Result<Session> {
        let (mut tx, session) = self.lock_for(Action::Update, id, scope).await?;
        lifecycle::check_update(session.status)?;
        let settings = SessionSettings {
            mode: req.mode.unwrap_or(session.mode),
            limits: session.limits.apply(&req.limits)?,
        };
        guardrails::check_child_budget(
            session.parent_id.is_some(),
            &session.limits.0,
            &settings.limits,
        )?;
        let mut events = Vec::new();
        if settings.mode != session.mode {
            events.push(SessionEvent::ModeChanged {
                from: session.mode,
                to: settings.mode,
            });
        }
        if settings.limits != session.limits.0 {
            events.push(SessionEvent::LimitsChanged {
                from: session.limits.0,
                to: settings.limits,
                by: "update".into(),
            });
        }
        let changed = !events.is_empty();
        if changed {
            store::update_settings(&mut tx, id, scope, settings, &event_codec::encode(&events)?)
                .await?;
        }
        self.commit(tx, id).await?;
        if changed && session.status == Status::Running {
            // Whoever runs it serves its status from memory: tell it.
            self.supervisor.invalidate(id);
            if let Err(err) = self.store.notify_control(ControlAction::Changed, id).await {
                tracing::warn!(session_id = %id, error = %err, "cannot announce the settings change; its owner shows it after its next step");
            }
        }
        self.get(id, scope).await
    }
}
