//! Pre-flight of a create: the tools and URLs it names are vetted, an
//! ambiguous goal is refined or waits for the user, and checklists are
//! generated when asked for; nothing is written yet.

use super::SessionService;
use super::create_request::NewRequest;
use super::planner;
use crate::event::{RefinementProposal, SessionEvent};
use crate::executor::Refused;
use crate::policy::ambiguity;
use crate::policy::checklist::{self, ChecklistItem};
use crate::session::error::{Result, ServiceError};

/// What pre-flight decided before anything is written.
pub(super) struct Preflight {
    /// The goal the session runs.
    pub(super) goal: String,
    /// The refinement proposal, for an ambiguous goal.
    pub(super) proposal: Option<RefinementProposal>,
    /// The session waits for the user to answer the proposal.
    pub(super) waits: bool,
    pub(super) criteria: Vec<ChecklistItem>,
    pub(super) milestones: Vec<ChecklistItem>,
    /// Tokens the model calls used.
    pub(super) tokens: u64,
    /// What pre-flight did, for the log.
    pub(super) events: Vec<SessionEvent>,
}

impl SessionService {
    /// Pre-flight: an ambiguous goal waits for the user or is refined at
    /// once; checklists are generated when asked for.
    pub(super) async fn preflight(&self, request: &NewRequest, tenant: &str) -> Result<Preflight> {
        let mut plan = Preflight {
            goal: request.goal.clone(),
            proposal: None,
            waits: false,
            criteria: request.criteria.clone(),
            milestones: request.milestones.clone(),
            tokens: 0,
            events: Vec::new(),
        };
        self.vet_executor(request, tenant).await?;
        self.refine_if_ambiguous(request, tenant, &mut plan).await?;
        self.generate_checklists(request, tenant, &mut plan).await?;
        Ok(plan)
    }

    /// The tools and URLs the executor names: declared, open to `tenant`
    /// and allowed by the egress policy.
    pub(super) async fn vet_executor(&self, request: &NewRequest, tenant: &str) -> Result<()> {
        // The MCP servers chosen must be declared and open to the tenant.
        let no_servers = crate::mcp::McpConfig::default();
        let operator_base_url = self.config.models.endpoint.as_ref();
        request
            .req
            .executor
            .vet(
                self.config.mcp.as_deref().unwrap_or(&no_servers),
                tenant,
                &self.config.egress,
                operator_base_url.map(|e| e.base_url.as_str()),
            )
            .await
            .map_err(|refused| match refused {
                Refused::Tools(e) => ServiceError::Invalid(e),
                Refused::Egress(e) => ServiceError::EgressDenied(e),
            })?;
        Ok(())
    }

    /// An ambiguous goal (unless split into tasks) is refined at once or
    /// waits for the user's answer to a proposal.
    async fn refine_if_ambiguous(
        &self,
        request: &NewRequest,
        tenant: &str,
        plan: &mut Preflight,
    ) -> Result<()> {
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
        Ok(())
    }

    /// Success criteria and milestones from the model, when asked for and
    /// none were given.
    async fn generate_checklists(
        &self,
        request: &NewRequest,
        tenant: &str,
        plan: &mut Preflight,
    ) -> Result<()> {
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
            (plan.criteria, plan.milestones) =
                checklist::criteria_and_milestones(&p.value.0, &p.value.1)
                    .map_err(ServiceError::Invalid)?;
            plan.events.push(SessionEvent::CriteriaGenerated {
                criteria: p.value.0,
                milestones: p.value.1,
            });
        }
        Ok(())
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
}
