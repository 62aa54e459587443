//! Creating a session: validate, pre-flight, persist in one transaction,
//! then start its loop here (or queue it); a create that fails after the
//! commit is undone, so an error means nothing was created.

use std::time::Instant;

use uuid::Uuid;

use super::SessionService;
use super::create_request::{CONFIRM_WITH_SUBGOALS, CreateSession, IdempotencyKey, NewRequest};
use super::estimate::EstimateAnswer;
use super::fork_seed::ForkSeed;
use super::preflight::Preflight;
use crate::event::SessionEvent;
use crate::policy::capabilities::Placement;
use crate::policy::confirm::{self, Confirmation};
use crate::secrets::Sealed;
use crate::session::error::{Result, ServiceError};
use crate::session::event_codec::{self, to_stored};
use crate::session::persist::{self, FirstRefinement};
use crate::store::{self, NewSession, Session, TenantScope, TenantSessionDefaults};

/// What a create did.
#[derive(Debug)]
pub enum Created {
    /// A new session.
    New(Session),
    /// The session an earlier request with the same idempotency key created.
    Replayed(Session),
}

impl SessionService {
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
        self.create_seeded(req, tenant, idempotency, None).await
    }

    /// As [`SessionService::create`], for a fork when `seed` is given: its
    /// limits, checklists and workspace instead of fresh ones, and its
    /// origin, memory and task queue written with the session.
    pub(super) async fn create_seeded(
        &self,
        req: CreateSession,
        tenant: &str,
        idempotency: Option<&IdempotencyKey>,
        seed: Option<ForkSeed>,
    ) -> Result<Created> {
        let scope = TenantScope::tenant_only(tenant);
        if let Some(done) = self.replayed(&scope, tenant, idempotency).await? {
            return Ok(done);
        }
        let defaults = self.store.tenant_session_defaults(tenant).await?;
        let mut request = self.validate_create(req, tenant_max_iterations(&defaults))?;
        if let Some(seed) = &seed {
            request.limits = seed.limits;
        }
        apply_tenant_warn_at(&mut request, &defaults)?;
        let placement = self
            .placement(&request.limits, Some(&request.executor.spec))
            .await?;
        let mut plan = self.preflight(&request, tenant).await?;
        let confirmation = self.confirmation_for(&request, &plan, tenant).await?;
        let id = Uuid::new_v4();
        let workspace = self.prepare_workspace(&request, id).await?;
        if let Some(seed) = &seed {
            self.seed_fork(seed, &mut plan, workspace, id).await?;
        }
        let acquired = Instant::now();
        let slot = if plan.waits || confirmation.is_some() || placement == Placement::Queue {
            None
        } else {
            self.supervisor.try_reserve()
        };
        let persisted = self
            .persist_new(
                id,
                request,
                (plan, confirmation),
                (tenant, &scope),
                (slot.is_some(), seed.as_ref().map(|s| &s.start)),
                idempotency,
            )
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
                    crate::session::runtime::rehydrate::initial_state(&record),
                )
                .await
        {
            self.undo_create(&record).await;
            return Err(err);
        }
        Ok(Created::New(record))
    }

    /// The session an earlier create with the same idempotency key made,
    /// answered again; `None` when the key is new (or none was given).
    async fn replayed(
        &self,
        scope: &TenantScope,
        tenant: &str,
        idempotency: Option<&IdempotencyKey>,
    ) -> Result<Option<Created>> {
        let Some(key) = idempotency else {
            return Ok(None);
        };
        let Some(used) = self
            .store
            .used_idempotency_key(scope, tenant, &key.key)
            .await?
        else {
            return Ok(None);
        };
        self.replay(used.session_id, used.request_digest == key.digest, scope)
            .await
            .map(Some)
    }

    /// A fork's checklists as of its checkpoint, and its workspace restored
    /// into the new session's (removed again if the restore fails).
    async fn seed_fork(
        &self,
        seed: &ForkSeed,
        plan: &mut Preflight,
        workspace: bool,
        id: Uuid,
    ) -> Result<()> {
        plan.criteria.clone_from(&seed.criteria);
        plan.milestones.clone_from(&seed.milestones);
        if workspace && let Err(err) = seed.restore(&self.config.workspace_root, id).await {
            self.remove_workspace(id).await;
            return Err(err);
        }
        Ok(())
    }

    /// A create's `dry_run`: the request checked exactly as a create checks
    /// it (body, executor, tools and URLs), then estimated; nothing is
    /// created and no model is called.
    /// The limits estimated are those the create would give the session
    /// (the tenant's applied ones included).
    pub async fn dry_run(&self, req: CreateSession, tenant: &str) -> Result<EstimateAnswer> {
        let defaults = self.store.tenant_session_defaults(tenant).await?;
        let request = self.validate_create(req, tenant_max_iterations(&defaults))?;
        self.vet_executor(&request, tenant).await?;
        self.estimate(&request.req, &request.limits, tenant).await
    }

    /// The estimate of a create still being written (`POST
    /// /api/autonomous/estimate`, the dashboard's as-you-type line): the
    /// goal, the limits (the tenant's applied ones included), the
    /// executor's shape and the request's own rules are checked; whether
    /// the server can run the executor (a default model, an allowed URL,
    /// its tools) is left to the create and its dry run.
    pub async fn estimate_draft(
        &self,
        req: &CreateSession,
        tenant: &str,
    ) -> Result<EstimateAnswer> {
        // The executor's own shape, as its schema states it; not whether
        // the server can run it (a default model, an allowed URL).
        req.executor.validate().map_err(ServiceError::Invalid)?;
        if req.confirm_if_over.is_some() && !req.subgoals.is_empty() {
            return Err(ServiceError::Invalid(CONFIRM_WITH_SUBGOALS.into()));
        }
        if let Some(confirm) = &req.confirm_if_over {
            confirm.check().map_err(ServiceError::Invalid)?;
        }
        let defaults = self.store.tenant_session_defaults(tenant).await?;
        let mode = req.mode.unwrap_or(self.config.defaults.mode);
        let limits = self
            .base_limits(mode, tenant_max_iterations(&defaults))
            .for_create(&req.limits)?;
        self.estimate(req, &limits, tenant).await
    }

    /// What a create with `confirm_if_over` waits on, when its estimate's
    /// p90 is over a bound or unknown (`policy::confirm`); `None` when it
    /// starts. A goal that waits for refinement is not also held for a
    /// confirmation.
    async fn confirmation_for(
        &self,
        request: &NewRequest,
        plan: &Preflight,
        tenant: &str,
    ) -> Result<Option<Box<Confirmation>>> {
        let (Some(bounds), Some(asked)) = (request.confirm, &request.req.confirm_if_over) else {
            return Ok(None);
        };
        if plan.waits {
            return Ok(None);
        }
        let answer = self.estimate(&request.req, &request.limits, tenant).await?;
        let over = confirm::decide(bounds, &answer.estimate);
        if over.is_empty() {
            return Ok(None);
        }
        let timeout = chrono::TimeDelta::from_std(self.config.approval_timeout)
            .unwrap_or(chrono::TimeDelta::MAX);
        Ok(Some(Box::new(Confirmation {
            confirm_if_over: asked.clone(),
            over,
            estimate: answer.estimate,
            expires_at: chrono::Utc::now() + timeout,
        })))
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
        let root = self.config.workspace_root.clone();
        crate::executor::workspace::prepare(&request.req.executor, root, id)
            .await
            .map_err(|e| {
                ServiceError::Unavailable(format!(
                    "cannot open the session workspace (WARDEN_WORKSPACE_ROOT): {e}; nothing was created"
                ))
            })
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

    /// Persist: the session, its log and its first refinement, in one
    /// transaction; it runs here when `slot_reserved`, else it is queued.
    async fn persist_new(
        &self,
        id: Uuid,
        request: NewRequest,
        (plan, confirmation): (Preflight, Option<Box<Confirmation>>),
        (tenant, scope): (&str, &TenantScope),
        (slot_reserved, fork): (bool, Option<&store::snapshots::ForkStart>),
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
        if let Some(c) = &confirmation {
            log.push(SessionEvent::AwaitingConfirmation((**c).clone()));
        }
        let proposal_data = plan
            .proposal
            .as_ref()
            .map(|p| to_stored("refinement proposal", p))
            .transpose()?
            .unwrap_or(serde_json::Value::Null);
        let (sealed, sealed_query) = self.seal_secrets(id, &api_key, &url_query)?;
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
        } else if let Some(c) = confirmation {
            persist::Start::AwaitConfirmation(c)
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
                fork,
                scope,
            },
        )
        .await
    }

    /// The session's own model API key and its URL's query, sealed to
    /// `id`, for the store (they never enter the stored executor).
    fn seal_secrets(
        &self,
        id: Uuid,
        api_key: &Option<crate::executor::ApiKey>,
        url_query: &Option<crate::executor::UrlQuery>,
    ) -> Result<(Option<Sealed>, Option<Sealed>)> {
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
        Ok((sealed, sealed_query))
    }

    /// The key sessions' secrets are sealed with (loaded at start).
    fn sealing_key(&self) -> Result<&crate::secrets::SecretKey> {
        self.config.secret_key.key().ok_or_else(|| {
            ServiceError::Unavailable("the secret key (WARDEN_SECRET_KEY) is not loaded".into())
        })
    }
}

/// Gives a request without `limits.warn_at` its tenant's own thresholds,
/// when the tenant has some (`PUT /api/budget-warnings`).
fn apply_tenant_warn_at(request: &mut NewRequest, defaults: &TenantSessionDefaults) -> Result<()> {
    if request.req.limits.warn_at.is_some() {
        return Ok(());
    }
    if let Some(percents) = &defaults.warn_at {
        request.limits.warn_at = tenant_warn_at(percents)?;
    }
    Ok(())
}

/// The iteration limit a tenant applied (`POST
/// /api/insights/thresholds/apply`), when it has one; the column's check
/// keeps it in the create's range.
fn tenant_max_iterations(defaults: &TenantSessionDefaults) -> Option<u64> {
    defaults.max_iterations.and_then(|v| u64::try_from(v).ok())
}

/// A tenant's stored thresholds as a session's `warn_at` (checked again:
/// the column's check allows what `WarnAt` does).
fn tenant_warn_at(percents: &[i16]) -> Result<crate::policy::soft_budget::WarnAt> {
    let asked: Vec<u8> = percents
        .iter()
        .filter_map(|p| u8::try_from(*p).ok())
        .collect();
    crate::policy::soft_budget::WarnAt::new(&asked).map_err(|e| {
        ServiceError::Unavailable(format!("the tenant's stored warn_at is invalid: {e}"))
    })
}
