//! The create request: what a client sends to make a session, checked
//! and resolved against the server's defaults before anything runs.

use serde::Deserialize;
use utoipa::ToSchema;

use super::MAX_GOAL_CHARS;
use super::SessionService;
use crate::executor::ExecutorSpec;
use crate::llm::LlmClient;
use crate::policy::ambiguity;
use crate::policy::checklist::{self, ChecklistItem};
use crate::policy::delegation::{ChildPausePolicy, ChildRequest};
use crate::policy::guardrails::{Limits, LimitsPatch};
use crate::policy::lifecycle::Mode;
use crate::session::error::{Result, ServiceError};

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
    /// Check the request as a create would and answer `200` with its
    /// estimate (what `POST /api/autonomous/estimate` answers); nothing is
    /// created.
    #[serde(default)]
    pub dry_run: bool,
    /// Wait for a person before starting when the estimate's p90 cost or
    /// running time is over these bounds, or unknown (too little history):
    /// the session is created `awaiting_confirmation` with its estimate and
    /// starts on `POST /{id}/confirm`.
    #[serde(default)]
    pub confirm_if_over: Option<crate::policy::confirm::ConfirmIfOver>,
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

/// A create request, checked and resolved against the defaults.
pub(super) struct NewRequest {
    /// The goal as given, trimmed.
    pub(super) goal: String,
    pub(super) mode: Mode,
    pub(super) limits: Limits,
    pub(super) executor: crate::executor::StoredExecutor,
    /// The session's own model API key, stored sealed apart from `executor`.
    pub(super) api_key: Option<crate::executor::ApiKey>,
    /// The query of the client-chosen URL, stored sealed apart from `executor`.
    pub(super) url_query: Option<crate::executor::UrlQuery>,
    pub(super) criteria: Vec<ChecklistItem>,
    pub(super) milestones: Vec<ChecklistItem>,
    /// The model endpoint for refinement and checklists, when configured.
    pub(super) planner: Option<(LlmClient, String)>,
    /// The tasks of a split goal, each with the child's own executor when not the session's.
    pub(super) split: Vec<(ChildRequest, Option<serde_json::Value>)>,
    /// `confirm_if_over`, checked.
    pub(super) confirm: Option<crate::policy::confirm::Bounds>,
    pub(super) req: CreateSession,
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

/// Why a create may not both wait for confirmation and split its goal.
pub(super) const CONFIRM_WITH_SUBGOALS: &str =
    "confirm_if_over cannot be combined with subgoals: a split goal starts its children at once";

impl SessionService {
    /// Validate: the goal, the executor, the checklists and the limits
    /// (over the server's defaults, with `tenant_max_iterations`, the
    /// tenant's applied iteration limit, for a request that sets none).
    pub(super) fn validate_create(
        &self,
        req: CreateSession,
        tenant_max_iterations: Option<u64>,
    ) -> Result<NewRequest> {
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
        let (criteria, milestones) =
            checklist::criteria_and_milestones(&req.success_criteria, &req.milestones)
                .map_err(ServiceError::Invalid)?;
        let mode = req.mode.unwrap_or(self.config.defaults.mode);
        let limits = self
            .base_limits(mode, tenant_max_iterations)
            .for_create(&req.limits)?;
        super::check_money_priced(&limits, &self.config.model_prices)?;
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
        let confirm = req
            .confirm_if_over
            .as_ref()
            .map(|c| c.check().map_err(ServiceError::Invalid))
            .transpose()?;
        if confirm.is_some() && !split.is_empty() {
            return Err(ServiceError::Invalid(CONFIRM_WITH_SUBGOALS.into()));
        }
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
            confirm,
            req,
        })
    }

    /// The limits a session created in `mode` gets before its request's
    /// own: the server's defaults, the iteration limit the tenant applied
    /// in place of the server's (a default still: unlike a request's own
    /// `max_iterations`, it leaves the review point as it is).
    pub(super) fn base_limits(&self, mode: Mode, tenant_max_iterations: Option<u64>) -> Limits {
        let mut limits = self.config.defaults.limits_for(mode);
        if let Some(max_iterations) = tenant_max_iterations {
            limits.max_iterations = max_iterations;
        }
        limits
    }

    /// The default model endpoint as a client and model name, when configured.
    fn planner(&self) -> Option<(LlmClient, String)> {
        let endpoint = self.config.models.endpoint.clone()?;
        let model = self.config.models.model.clone()?;
        LlmClient::new(endpoint).ok().map(|c| (c, model))
    }
}

/// The goal as the session runs it: trimmed, not empty, not too long,
/// and not one the rules refuse outright.
pub(super) fn validate_goal(goal: &str) -> Result<String> {
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
