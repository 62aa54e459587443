//! Forking a session from a checkpoint: a new session of the same tenant,
//! created through the create path, that starts from the checkpoint's
//! memory, context cycle, task queue, ticked checklists and workspace
//! (restored byte for byte from the checkpoint's snapshot), with optional
//! new guidance, limits or model. The original is never touched; an ended
//! session may be forked.
//!
//! As Temporal's reset restarts budgets from the reset point, the fork's
//! usage counters (iterations, tokens, tool calls, cost, running time,
//! error streak, reflections) start at zero under its own limits: what it
//! carries is the work, not the spend.

use serde::Deserialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::create::Created;
use super::create_request::CreateSession;
use super::fork_seed::ForkSeed;
use super::{MAX_GUIDANCE_CHARS, SessionService};
use crate::executor::ExecutorSpec;
use crate::policy::guardrails::LimitsPatch;
use crate::session::error::{Result, ServiceError};
use crate::store::snapshots::ForkStart;
use crate::store::{Session, TenantScope};

/// Request to fork a session from one of its checkpoints.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSession {
    /// The checkpoint, by the iteration it covers (its latest checkpoint
    /// at that iteration). With neither this nor `checkpoint_id`, the
    /// session's latest checkpoint.
    #[serde(default)]
    pub checkpoint_iteration: Option<i64>,
    /// The checkpoint, by its `id` in `GET /checkpoints`.
    #[serde(default)]
    pub checkpoint_id: Option<i64>,
    /// Guidance for the fork's first step.
    #[serde(default)]
    pub guidance: Option<String>,
    /// Limits to change from the forked session's.
    #[serde(default)]
    pub limits: LimitsPatch,
    /// Another model for an `llm` executor.
    #[serde(default)]
    pub model: Option<String>,
}

impl SessionService {
    /// Forks `id` (as `caller` may reach it) from the checkpoint `req`
    /// names, into the same tenant.
    #[tracing::instrument(skip_all, fields(session_id = %id))]
    pub async fn fork(&self, id: Uuid, req: ForkSession, caller: &TenantScope) -> Result<Session> {
        if let Some(g) = &req.guidance
            && g.chars().count() > MAX_GUIDANCE_CHARS
        {
            return Err(ServiceError::Invalid(format!(
                "guidance is over {MAX_GUIDANCE_CHARS} characters"
            )));
        }
        let source = self.get(id, caller).await?;
        // The fork belongs to the forked session's tenant, whoever asks.
        let scope = TenantScope::tenant_only(&source.tenant);
        let tenant = source.tenant.as_str();
        let (iteration, state) = self
            .store()
            .checkpoint_for_fork(id, (req.checkpoint_iteration, req.checkpoint_id), &scope)
            .await?
            .ok_or_else(|| no_checkpoint(id, &req))?;
        let start = self
            .store()
            .fork_source(id, iteration, &scope)
            .await?
            .ok_or_else(|| {
                ServiceError::NotForkable(format!(
                    "checkpoint {iteration} has no workspace snapshot (taken before snapshots \
existed, or its snapshot failed); fork from a checkpoint whose `forkable` is true"
                ))
            })?;
        let files = self.snapshot_files(id, iteration, &scope).await?;
        let request = self.fork_request(&source, &req).await?;
        let seed = ForkSeed {
            start: ForkStart {
                session_id: id,
                iteration,
                source: start,
                guidance: req.guidance.clone(),
            },
            limits: source.limits.0.apply(&req.limits)?,
            criteria: state.0.criteria.clone(),
            milestones: state.0.milestones.clone(),
            files,
        };
        match self
            .create_seeded(request, tenant, None, Some(seed))
            .await?
        {
            Created::New(session) | Created::Replayed(session) => {
                tracing::info!(fork = %session.id, iteration, "session forked");
                Ok(session)
            }
        }
    }

    /// The create request of a fork of `source`: its goal, mode, executor
    /// (with its sealed secrets, and the model asked for) and checklists.
    async fn fork_request(&self, source: &Session, req: &ForkSession) -> Result<CreateSession> {
        let mut executor =
            crate::session::runtime::rehydrate::unsealed_spec(self.store(), &self.config, source)
                .await?;
        if let Some(new_model) = &req.model {
            match &mut executor {
                ExecutorSpec::Llm { model, .. } => *model = Some(new_model.clone()),
                _ => {
                    // The request is well formed; the session's executor
                    // is what conflicts with it.
                    return Err(ServiceError::NotForkable(
                        "model applies to an `llm` executor only, and this session's is not one"
                            .into(),
                    ));
                }
            }
        }
        Ok(CreateSession {
            goal: source.goal.clone(),
            mode: Some(source.mode),
            limits: LimitsPatch::default(),
            executor,
            success_criteria: source.criteria.iter().map(|c| c.text.clone()).collect(),
            milestones: source.milestones.iter().map(|c| c.text.clone()).collect(),
            generate_criteria: false,
            subgoals: Vec::new(),
            on_child_pause: source.on_child_pause,
            // A fork starts from a person's own request: nothing to confirm.
            confirm_if_over: None,
            dry_run: false,
        })
    }

    /// Every file of the snapshot at `iteration`, with its content.
    async fn snapshot_files(
        &self,
        id: Uuid,
        iteration: i64,
        scope: &TenantScope,
    ) -> Result<Vec<(String, u32, Vec<u8>)>> {
        let (_, manifest) = self.snapshot_of(id, Some(iteration), scope).await?;
        let mut files = Vec::with_capacity(manifest.len());
        for file in &manifest {
            let content = self.blob_of(id, file, scope).await?;
            files.push((file.path.clone(), file.mode.max(0) as u32, content));
        }
        Ok(files)
    }
}

/// Why no checkpoint answers a fork of `id`: the checkpoint named does
/// not exist, or, naming none, the session has taken none yet. A 409, not a
/// 404: the session is there (the URL's resource), and a checkpoint it
/// lacks now it may take later.
fn no_checkpoint(id: Uuid, req: &ForkSession) -> ServiceError {
    let which = match (req.checkpoint_iteration, req.checkpoint_id) {
        (None, None) => {
            return ServiceError::NotForkable(format!(
                "session {id} has no checkpoint yet; it can be forked once it has taken one \
(every `checkpoint_interval` iterations, and when it pauses or ends)"
            ));
        }
        (Some(iteration), None) => format!("at iteration {iteration}"),
        (None, Some(cid)) => format!("with id {cid}"),
        (Some(iteration), Some(cid)) => format!("with id {cid} at iteration {iteration}"),
    };
    ServiceError::NotForkable(format!(
        "session {id} has no checkpoint {which}; GET /api/autonomous/{id}/checkpoints lists them"
    ))
}
