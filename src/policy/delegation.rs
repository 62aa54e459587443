//! Delegation: what a child session may be given of its parent's budget,
//! whether the tree has room for it, how ended children are reported to the
//! parent, and what a parent whose children all failed does. Pure: the
//! store applies these rules under the parent's row lock.

use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::guardrails::Limits;
use super::lifecycle::{Reason, Status};

/// Deepest a tree may grow unless the tenant's settings say otherwise (a
/// root is at depth 0, its children at 1).
pub const DEFAULT_MAX_DEPTH: u32 = 3;
/// Most children one session may have unless the tenant's settings say otherwise.
pub const DEFAULT_MAX_CHILDREN: u32 = 8;
/// Allowed depth and children limits.
pub const TREE_LIMIT_RANGE: std::ops::RangeInclusive<u32> = 1..=64;
/// Longest goal of a delegated task, in characters (the create request's limit).
pub const MAX_CHILD_GOAL_CHARS: usize = 10_000;
/// The folder of a workspace its children's workspaces live in: a child
/// works in `delegated/<child id>/` of its parent's.
pub const DELEGATED_DIR: &str = "delegated";
/// Fewest tokens a child may be given: less could not pay for one answer.
pub const MIN_CHILD_TOKENS: u64 = 100;

/// A parent's request for a child: what to do and how much of what the
/// parent has left it may spend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildRequest {
    /// The child's goal.
    pub goal: String,
    /// How the child knows it is done.
    #[serde(default)]
    pub success_criteria: Vec<String>,
    /// Fraction of the parent's remaining token and iteration budget the
    /// child is given (0 < share ≤ 1; default: an equal share among the
    /// children the parent may still make, and itself).
    #[serde(default)]
    pub budget_share: Option<f64>,
    /// Whether the parent waits (pauses) until its children end.
    #[serde(default = "default_wait")]
    pub wait: bool,
}

fn default_wait() -> bool {
    true
}

/// The tree's limits, per tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeLimits {
    /// Deepest child allowed (root = 0).
    pub max_depth: u32,
    /// Most children per session.
    pub max_children: u32,
}

impl Default for TreeLimits {
    fn default() -> TreeLimits {
        TreeLimits {
            max_depth: DEFAULT_MAX_DEPTH,
            max_children: DEFAULT_MAX_CHILDREN,
        }
    }
}

/// What the parent has when a child is asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParentBudget {
    /// The parent's limits now (already less what its live children hold).
    pub limits: Limits,
    /// Tokens the parent has used, including the step that is delegating.
    pub tokens_used: u64,
    /// USD the parent's committed steps cost (its money budget's spend).
    pub cost_used: Decimal,
    /// Iterations the parent has committed.
    pub iterations: u64,
    /// Running time the parent has used, ms.
    pub elapsed_ms: u64,
    /// The parent's depth (root = 0).
    pub depth: u32,
    /// Children it has already (live or ended).
    pub children: u32,
}

/// The budget carved out of the parent for one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildBudget {
    /// Tokens the child may spend (its subtree included); the parent's
    /// `max_tokens` shrinks by this much.
    pub tokens: u64,
    /// Iterations the child may commit; the parent's `max_iterations` shrinks by this much.
    pub iterations: u64,
    /// The child's wall-clock limit: at most what the parent has left
    /// (time is not carved: children run beside their parent).
    pub wall_time_ms: u64,
    /// USD the child may spend, when the parent has a money budget; the
    /// parent's `max_cost_usd` shrinks by this much.
    pub cost_usd: Option<Decimal>,
}

/// Why a child cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DelegationRefused {
    /// The tree would be deeper than allowed.
    #[error("a child here would be at depth {depth}, deeper than the {max} allowed")]
    TooDeep {
        /// The child's depth.
        depth: u32,
        /// The allowed depth.
        max: u32,
    },
    /// The session has as many children as allowed.
    #[error("this session has {children} children, the most allowed")]
    TooManyChildren {
        /// Children it has.
        children: u32,
    },
    /// What the parent has left cannot pay for a child.
    #[error(
        "the {what} left ({left}) cannot pay for a child: it needs at least {needed}; ask for a larger budget_share or do the work yourself"
    )]
    NoBudget {
        /// Which budget.
        what: &'static str,
        /// What is left.
        left: u64,
        /// What a child needs at the least.
        needed: u64,
    },
    /// The request itself is wrong.
    #[error("{0}")]
    Invalid(String),
}

impl ChildRequest {
    /// Checks the request's own fields; the message names the field.
    pub fn validate(&self) -> Result<(), DelegationRefused> {
        let goal = super::text::trim(&self.goal);
        if goal.is_empty() {
            return Err(DelegationRefused::Invalid(
                "`goal` must not be empty".into(),
            ));
        }
        if goal.chars().count() > MAX_CHILD_GOAL_CHARS {
            return Err(DelegationRefused::Invalid(format!(
                "`goal` must be at most {MAX_CHILD_GOAL_CHARS} characters"
            )));
        }
        if let Some(why) = super::ambiguity::refusal(goal) {
            return Err(DelegationRefused::Invalid(format!("`goal`: {why}")));
        }
        super::checklist::from_texts("`success_criteria`", &self.success_criteria)
            .map_err(DelegationRefused::Invalid)?;
        if let Some(share) = self.budget_share
            && !(share > 0.0 && share <= 1.0)
        {
            return Err(DelegationRefused::Invalid(format!(
                "`budget_share` must be more than 0 and at most 1, got {share}"
            )));
        }
        Ok(())
    }
}

/// What a carve does when what is left cannot pay for a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// Refuse the child (an agent asking is told why and can do otherwise).
    Refuse,
    /// Make it with what there is, even nothing (a split at creation: the
    /// child then stops at once on its own limit, and its parent is told).
    TakeWhatIsLeft,
}

/// Carves a child's budget out of what the parent has left, or says why
/// it cannot. Exact: the child gets at most what is left, so the parent
/// and all its descendants never spend more than the parent's limit.
pub fn carve(
    parent: &ParentBudget,
    share: Option<f64>,
    tree: TreeLimits,
    shortfall: Shortfall,
) -> Result<ChildBudget, DelegationRefused> {
    let depth = parent.depth + 1;
    if depth > tree.max_depth {
        return Err(DelegationRefused::TooDeep {
            depth,
            max: tree.max_depth,
        });
    }
    if parent.children >= tree.max_children {
        return Err(DelegationRefused::TooManyChildren {
            children: parent.children,
        });
    }
    let share = share.unwrap_or_else(|| {
        // An equal share among the children still possible and the parent.
        1.0 / f64::from(tree.max_children - parent.children + 1)
    });
    let tokens_left = parent.limits.max_tokens.saturating_sub(parent.tokens_used);
    let iterations_left = parent
        .limits
        .max_iterations
        .saturating_sub(parent.iterations);
    let wall_left = parent
        .limits
        .max_wall_time_ms
        .saturating_sub(parent.elapsed_ms);
    let tokens = portion(tokens_left, share);
    let iterations = portion(iterations_left, share).max(1).min(iterations_left);
    let cost_left = parent
        .limits
        .max_cost_usd
        .map(|max| (max - parent.cost_used).max(Decimal::ZERO));
    let cost_usd = cost_left.map(|left| money_portion(left, share));
    if shortfall == Shortfall::Refuse {
        if let (Some(left), Some(usd)) = (cost_left, cost_usd)
            && usd.is_zero()
        {
            return Err(DelegationRefused::NoBudget {
                what: "money budget (millionths of a USD)",
                left: micro_usd(left),
                needed: 1,
            });
        }
        if tokens < MIN_CHILD_TOKENS {
            return Err(DelegationRefused::NoBudget {
                what: "token budget",
                left: tokens_left,
                needed: MIN_CHILD_TOKENS,
            });
        }
        if iterations == 0 {
            return Err(DelegationRefused::NoBudget {
                what: "iteration budget",
                left: iterations_left,
                needed: 1,
            });
        }
        if wall_left == 0 {
            return Err(DelegationRefused::NoBudget {
                what: "wall-clock budget (ms)",
                left: 0,
                needed: 1,
            });
        }
    }
    Ok(ChildBudget {
        tokens,
        iterations,
        wall_time_ms: wall_left,
        cost_usd,
    })
}

/// `share` of `usd`, rounded down to a millionth of a dollar (the finest a
/// money budget takes), never more than `usd`.
fn money_portion(usd: Decimal, share: f64) -> Decimal {
    let share = Decimal::try_from(share.clamp(0.0, 1.0)).unwrap_or(Decimal::ZERO);
    (usd * share)
        .round_dp_with_strategy(super::guardrails::MAX_COST_SCALE, RoundingStrategy::ToZero)
        .min(usd)
        .normalize()
}

/// `usd` in millionths of a dollar, rounded down.
fn micro_usd(usd: Decimal) -> u64 {
    u64::try_from((usd * Decimal::from(1_000_000u32)).floor()).unwrap_or(u64::MAX)
}

/// `share` of `left`, rounded down, never more than `left`.
fn portion(left: u64, share: f64) -> u64 {
    let part = (left as f64 * share.clamp(0.0, 1.0)).floor();
    (part as u64).min(left)
}

/// The child's limits: the parent's, with the carved budget.
pub fn child_limits(parent: &Limits, budget: ChildBudget) -> Limits {
    Limits {
        max_tokens: budget.tokens,
        max_iterations: budget.iterations,
        max_wall_time_ms: budget.wall_time_ms.max(100),
        max_cost_usd: budget.cost_usd,
        ..*parent
    }
}

/// What a child does when it would pause for a person (any pause but a
/// user's own and a wait for its own children): a tree's policy, set on its
/// root at create (`on_child_pause`) and inherited by every child.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChildPausePolicy {
    /// The child pauses and its tree waits for a person: every ancestor's
    /// status names it in `children_needing_attention`, every ancestor's
    /// log gets a `child_needs_attention` event, and the tenant's inbox
    /// (`GET /api/autonomous/attention`) lists it.
    #[default]
    Wait,
    /// The child ends `failed` (with the reason it would have paused for)
    /// and its parent gets that result like any other failed child.
    FailChild,
}

impl ChildPausePolicy {
    /// The snake_case name stored in Postgres and shown in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildPausePolicy::Wait => "wait",
            ChildPausePolicy::FailChild => "fail_child",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<ChildPausePolicy> {
        [ChildPausePolicy::Wait, ChildPausePolicy::FailChild]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// Whether a session paused for `reason` waits for a person: every pause
/// but a user's own (the person is there) and a wait for its own children
/// (they go on by themselves).
pub fn needs_person(reason: Reason) -> bool {
    reason.status() == Status::Paused
        && !matches!(reason, Reason::UserPause | Reason::WaitingForChildren)
}

/// The status a session ends its run in for `reason`: the reason's own,
/// except that a child whose tree says `fail_child` ends `failed` instead
/// of pausing for a person, so that its parent is never left waiting on it.
pub fn run_end_status(reason: Reason, is_child: bool, policy: ChildPausePolicy) -> Status {
    if is_child && policy == ChildPausePolicy::FailChild && needs_person(reason) {
        Status::Failed
    } else {
        reason.status()
    }
}

/// A session of a tree as the attention check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    /// Its status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Whether it is a child (not the tree's root).
    pub is_child: bool,
}

/// The children of a tree that wait for a person, by their index in
/// `nodes`: what a root's status, its stream and the inbox name.
pub fn needing_attention(nodes: &[NodeState]) -> Vec<usize> {
    nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            n.is_child && n.status == Status::Paused && n.reason.is_some_and(needs_person)
        })
        .map(|(i, _)| i)
        .collect()
}

/// A child that ends, as its parent's budget takes it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildEnd {
    /// Its token limit now (what was carved for it, less what it carved
    /// for its own children, plus what they gave back).
    pub max_tokens: u64,
    /// Tokens it spent itself.
    pub tokens_used: u64,
    /// Tokens carved out of the parent for it.
    pub budget: u64,
    /// Tokens its ended children (and their descendants) spent.
    pub children_spent: u64,
}

impl ChildEnd {
    /// What it has left to give back: its limit less what it spent, but
    /// never more than its budget less everything its subtree spent (a
    /// limit a person raised on it is not the tree's to gain). Negative
    /// when it spent more than it had.
    pub fn left(&self) -> i128 {
        let own = i128::from(self.max_tokens) - i128::from(self.tokens_used);
        let carved = i128::from(self.budget)
            - i128::from(self.tokens_used)
            - i128::from(self.children_spent);
        own.min(carved)
    }
}

/// What a parent's token limit becomes when a child ends (the trigger of
/// `migrations/0023_saturating_counts.sql` computes the
/// same): it takes back what the child has left ([`ChildEnd::left`]). A
/// limit never goes below zero: what it cannot pay is recorded at the
/// parent as forgiven (the second value) and still counts against the
/// tree's budget. A parent that has ended takes nothing back (its budget
/// went back when it ended, less what its live children held) but is still
/// charged what its child spent over what it had. Returns the parent's new
/// limit and what is added to its forgiven tokens.
pub fn give_back(parent_max: u64, parent_ended: bool, child: ChildEnd) -> (u64, u64) {
    let base = if parent_ended { 0 } else { parent_max };
    let left = i128::from(base) + child.left();
    let forgiven = u64::try_from((-left).max(0)).unwrap_or(u64::MAX);
    if parent_ended {
        return (parent_max, forgiven);
    }
    (u64::try_from(left.max(0)).unwrap_or(u64::MAX), forgiven)
}

/// An ended child, as its parent is told of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildReport {
    /// The child session.
    pub child_id: uuid::Uuid,
    /// Its goal.
    pub goal: String,
    /// How it ended.
    pub status: Status,
    /// Why.
    pub reason: Option<Reason>,
    /// Its final summary (its answer, for a completed child).
    pub summary: Option<String>,
    /// The criteria it was given that it met.
    pub criteria_met: Vec<String>,
    /// Files it wrote, relative to the parent's workspace.
    pub files: Vec<String>,
    /// Tokens it (and its own children) spent.
    pub tokens_used: u64,
}

impl ChildReport {
    /// Whether the child did what it was asked.
    pub fn succeeded(&self) -> bool {
        self.status == Status::Completed
    }
}

/// What a parent does when its children have been reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentNext {
    /// Go on: the parent's agent (under its own gate) decides what to do
    /// with the results, failures included.
    Continue,
    /// Every child failed: the parent pauses as blocked, with their reasons.
    Blocked(String),
}

/// Decides what a parent does with the reports of its ended children:
/// when every one of them failed, it is blocked (a person decides);
/// otherwise it goes on.
pub fn after_children(reports: &[ChildReport]) -> ParentNext {
    if reports.is_empty() || reports.iter().any(ChildReport::succeeded) {
        return ParentNext::Continue;
    }
    let reasons: Vec<String> = reports
        .iter()
        .map(|r| {
            let why = r
                .summary
                .as_deref()
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .or_else(|| r.reason.map(|x| x.as_str().to_string()))
                .unwrap_or_else(|| r.status.as_str().to_string());
            format!("{} ({}): {why}", short(&r.goal), r.status.as_str())
        })
        .collect();
    ParentNext::Blocked(format!(
        "every delegated task failed: {}",
        reasons.join("; ")
    ))
}

/// Renders reports for the agent: one paragraph per child.
pub fn render_reports(reports: &[ChildReport]) -> String {
    let mut out = String::from("Results of the tasks you delegated:");
    for r in reports {
        out.push_str(&format!(
            "\n- child {} \"{}\": {}",
            r.child_id,
            short(&r.goal),
            r.status.as_str()
        ));
        if let Some(reason) = r.reason {
            out.push_str(&format!(" ({})", reason.as_str()));
        }
        out.push_str(&format!(", {} tokens", r.tokens_used));
        if let Some(summary) = r.summary.as_deref().filter(|s| !s.trim().is_empty()) {
            out.push_str(&format!(". Result: {summary}"));
        }
        if !r.criteria_met.is_empty() {
            out.push_str(&format!(". Criteria met: {}", r.criteria_met.join("; ")));
        }
        if !r.files.is_empty() {
            out.push_str(&format!(". Files: {}", r.files.join(", ")));
        }
    }
    out
}

/// A goal cut to a readable length for reports.
fn short(goal: &str) -> String {
    const MAX: usize = 120;
    if goal.chars().count() <= MAX {
        goal.to_string()
    } else {
        let cut: String = goal.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tokens: u64, iterations: u64) -> Limits {
        Limits {
            max_tokens: tokens,
            max_iterations: iterations,
            max_wall_time_ms: 60_000,
            ..crate::policy::guardrails::tests::roomy()
        }
    }

    fn parent(tokens: u64, used: u64) -> ParentBudget {
        ParentBudget {
            limits: limits(tokens, 100),
            tokens_used: used,
            cost_used: Decimal::ZERO,
            iterations: 10,
            elapsed_ms: 1_000,
            depth: 0,
            children: 0,
        }
    }

    #[test]
    fn a_share_of_what_is_left_is_carved() {
        let b = carve(
            &parent(10_000, 2_000),
            Some(0.5),
            TreeLimits::default(),
            Shortfall::Refuse,
        )
        .unwrap();
        assert_eq!(b.tokens, 4_000);
        assert_eq!(b.iterations, 45);
        assert_eq!(b.wall_time_ms, 59_000);
        assert_eq!(b.cost_usd, None);
    }

    #[test]
    fn a_money_budget_is_carved_like_tokens_to_the_millionth_rounded_down() {
        let d = |s: &str| s.parse::<Decimal>().expect("decimal");
        let mut p = parent(10_000, 2_000);
        p.limits.max_cost_usd = Some(d("1.00"));
        p.cost_used = d("0.2500005");
        let b = carve(&p, Some(0.5), TreeLimits::default(), Shortfall::Refuse).unwrap();
        // Half of 0.7499995, down to the millionth.
        assert_eq!(b.cost_usd, Some(d("0.374999")));
        let child = child_limits(&p.limits, b);
        assert_eq!(child.max_cost_usd, Some(d("0.374999")));
        // Never more than is left, even with the whole share.
        let all = carve(&p, Some(1.0), TreeLimits::default(), Shortfall::Refuse).unwrap();
        assert!(all.cost_usd.is_some_and(|c| c <= d("0.7499995")));
        // Nothing left: a step's request is refused, a split takes nothing.
        p.cost_used = d("1.2");
        let refused = carve(&p, Some(0.5), TreeLimits::default(), Shortfall::Refuse);
        assert!(matches!(
            refused,
            Err(DelegationRefused::NoBudget { what, left: 0, .. }) if what.starts_with("money")
        ));
        let split = carve(
            &p,
            Some(0.5),
            TreeLimits::default(),
            Shortfall::TakeWhatIsLeft,
        )
        .unwrap();
        assert_eq!(split.cost_usd, Some(Decimal::ZERO));
    }

    #[test]
    fn without_a_share_each_possible_child_and_the_parent_get_equal_parts() {
        let tree = TreeLimits {
            max_depth: 3,
            max_children: 3,
        };
        let b = carve(&parent(8_000, 0), None, tree, Shortfall::Refuse).unwrap();
        assert_eq!(b.tokens, 2_000);
        let mut p = parent(8_000, 0);
        p.children = 2;
        assert_eq!(
            carve(&p, None, tree, Shortfall::Refuse).unwrap().tokens,
            4_000
        );
    }

    #[test]
    fn a_whole_share_takes_everything_left_and_never_more() {
        let b = carve(
            &parent(10_000, 9_000),
            Some(1.0),
            TreeLimits::default(),
            Shortfall::Refuse,
        )
        .unwrap();
        assert_eq!(b.tokens, 1_000);
        let over = parent(10_000, 12_000);
        assert!(matches!(
            carve(&over, Some(1.0), TreeLimits::default(), Shortfall::Refuse),
            Err(DelegationRefused::NoBudget { left: 0, .. })
        ));
    }

    #[test]
    fn too_little_left_is_refused_with_what_is_left() {
        let err = carve(
            &parent(10_000, 9_950),
            Some(1.0),
            TreeLimits::default(),
            Shortfall::Refuse,
        )
        .unwrap_err();
        assert_eq!(
            err,
            DelegationRefused::NoBudget {
                what: "token budget",
                left: 50,
                needed: MIN_CHILD_TOKENS
            }
        );
        assert!(err.to_string().contains("budget_share"));
    }

    #[test]
    fn no_iteration_left_is_refused() {
        let mut p = parent(10_000, 0);
        p.iterations = 100;
        assert!(matches!(
            carve(&p, Some(0.5), TreeLimits::default(), Shortfall::Refuse),
            Err(DelegationRefused::NoBudget {
                what: "iteration budget",
                ..
            })
        ));
    }

    #[test]
    fn no_time_left_is_refused() {
        let mut p = parent(10_000, 0);
        p.elapsed_ms = 60_000;
        assert!(matches!(
            carve(&p, Some(0.5), TreeLimits::default(), Shortfall::Refuse),
            Err(DelegationRefused::NoBudget {
                what: "wall-clock budget (ms)",
                ..
            })
        ));
    }

    #[test]
    fn depth_and_children_limits_hold() {
        let tree = TreeLimits {
            max_depth: 2,
            max_children: 2,
        };
        let mut p = parent(10_000, 0);
        p.depth = 1;
        assert!(carve(&p, Some(0.1), tree, Shortfall::Refuse).is_ok());
        p.depth = 2;
        assert_eq!(
            carve(&p, Some(0.1), tree, Shortfall::Refuse),
            Err(DelegationRefused::TooDeep { depth: 3, max: 2 })
        );
        let mut p = parent(10_000, 0);
        p.children = 2;
        assert_eq!(
            carve(&p, Some(0.1), tree, Shortfall::Refuse),
            Err(DelegationRefused::TooManyChildren { children: 2 })
        );
    }

    #[test]
    fn carving_many_children_never_hands_out_more_than_was_left() {
        // The store shrinks the parent's limit by each child's budget.
        let tree = TreeLimits {
            max_depth: 3,
            max_children: 64,
        };
        let mut p = parent(10_007, 3);
        let start = p.limits.max_tokens - p.tokens_used;
        let mut given = 0;
        for share in [0.3, 0.9, 1.0, 0.01, 0.5, 0.77] {
            if let Ok(b) = carve(&p, Some(share), tree, Shortfall::Refuse) {
                given += b.tokens;
                p.limits.max_tokens -= b.tokens;
                p.limits.max_iterations -= b.iterations;
                p.children += 1;
            }
        }
        assert!(given <= start, "{given} > {start}");
    }

    #[test]
    fn a_split_takes_what_is_left_even_nothing() {
        let mut p = parent(10_000, 9_950);
        p.iterations = 100;
        let b = carve(
            &p,
            Some(0.5),
            TreeLimits::default(),
            Shortfall::TakeWhatIsLeft,
        )
        .unwrap();
        assert_eq!(b.tokens, 25);
        assert_eq!(b.iterations, 0);
        // The tree's own limits still hold.
        p.depth = 3;
        assert!(
            carve(
                &p,
                Some(0.5),
                TreeLimits::default(),
                Shortfall::TakeWhatIsLeft
            )
            .is_err()
        );
    }

    #[test]
    fn child_limits_take_the_budget_and_keep_the_rest() {
        let p = limits(10_000, 100);
        let c = child_limits(
            &p,
            ChildBudget {
                tokens: 500,
                iterations: 7,
                wall_time_ms: 30,
                cost_usd: None,
            },
        );
        assert_eq!(c.max_tokens, 500);
        assert_eq!(c.max_iterations, 7);
        assert_eq!(c.max_wall_time_ms, 100);
        assert_eq!(c.reflection_interval, p.reflection_interval);
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        let ok = ChildRequest {
            goal: "write the tests".into(),
            success_criteria: vec![],
            budget_share: Some(0.5),
            wait: true,
        };
        assert!(ok.validate().is_ok());
        for (bad, field) in [
            (
                ChildRequest {
                    goal: "  ".into(),
                    ..ok.clone()
                },
                "`goal`",
            ),
            (
                ChildRequest {
                    budget_share: Some(0.0),
                    ..ok.clone()
                },
                "`budget_share`",
            ),
            (
                ChildRequest {
                    budget_share: Some(1.5),
                    ..ok.clone()
                },
                "`budget_share`",
            ),
            (
                ChildRequest {
                    budget_share: Some(f64::NAN),
                    ..ok.clone()
                },
                "`budget_share`",
            ),
            (
                ChildRequest {
                    success_criteria: vec!["x".into(); super::super::checklist::MAX_ITEMS + 1],
                    ..ok.clone()
                },
                "`success_criteria`",
            ),
            (
                ChildRequest {
                    success_criteria: vec![" ".into()],
                    ..ok.clone()
                },
                "`success_criteria`",
            ),
            (
                ChildRequest {
                    goal: "123 456".into(),
                    ..ok.clone()
                },
                "`goal`",
            ),
            (
                ChildRequest {
                    goal: "x".repeat(MAX_CHILD_GOAL_CHARS + 1),
                    ..ok.clone()
                },
                "`goal`",
            ),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn the_wait_default_is_to_wait() {
        let r: ChildRequest = serde_json::from_str(r#"{"goal":"g"}"#).unwrap();
        assert!(r.wait);
        assert_eq!(r.budget_share, None);
    }

    fn report(status: Status, summary: &str) -> ChildReport {
        ChildReport {
            child_id: uuid::Uuid::nil(),
            goal: "write the docs".into(),
            status,
            reason: None,
            summary: Some(summary.into()),
            criteria_met: vec![],
            files: vec![],
            tokens_used: 10,
        }
    }

    #[test]
    fn a_parent_goes_on_unless_every_child_failed() {
        assert_eq!(after_children(&[]), ParentNext::Continue);
        assert_eq!(
            after_children(&[
                report(Status::Completed, "done"),
                report(Status::Failed, "x")
            ]),
            ParentNext::Continue
        );
        match after_children(&[
            report(Status::Failed, "no model"),
            report(Status::Stopped, "out of tokens"),
        ]) {
            ParentNext::Blocked(why) => {
                assert!(
                    why.contains("no model") && why.contains("out of tokens"),
                    "{why}"
                );
                assert!(why.contains("failed") && why.contains("stopped"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_pauses_for_a_person_need_one() {
        for reason in Reason::ALL {
            let expected = reason.status() == Status::Paused
                && reason != Reason::UserPause
                && reason != Reason::WaitingForChildren;
            assert_eq!(needs_person(reason), expected, "{reason:?}");
        }
        assert!(needs_person(Reason::BudgetProjectedOverrun));
        assert!(needs_person(Reason::ApprovalRequired));
        assert!(!needs_person(Reason::ParentEnded));
    }

    #[test]
    fn a_fail_child_tree_fails_children_instead_of_pausing_them() {
        use ChildPausePolicy::*;
        for reason in Reason::ALL {
            // Roots and `wait` trees: the reason's own status.
            assert_eq!(run_end_status(reason, false, FailChild), reason.status());
            assert_eq!(run_end_status(reason, true, Wait), reason.status());
            let failed = run_end_status(reason, true, FailChild);
            if needs_person(reason) {
                assert_eq!(failed, Status::Failed, "{reason:?}");
            } else {
                assert_eq!(failed, reason.status(), "{reason:?}");
            }
        }
        assert_eq!(ChildPausePolicy::default(), Wait);
        for p in [Wait, FailChild] {
            assert_eq!(ChildPausePolicy::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        assert_eq!(ChildPausePolicy::parse("pause"), None);
    }

    #[test]
    fn attention_names_paused_children_waiting_for_a_person_only() {
        let node = |status, reason, is_child| NodeState {
            status,
            reason,
            is_child,
        };
        let nodes = [
            node(Status::Paused, Some(Reason::AskUser), false),
            node(Status::Paused, Some(Reason::WaitingForChildren), true),
            node(Status::Paused, Some(Reason::BudgetProjectedOverrun), true),
            node(Status::Paused, Some(Reason::UserPause), true),
            node(Status::Running, None, true),
            node(Status::Failed, Some(Reason::BudgetProjectedOverrun), true),
            node(Status::Paused, Some(Reason::ReviewRequired), true),
        ];
        assert_eq!(needing_attention(&nodes), vec![2, 6]);
        assert!(needing_attention(&[]).is_empty());
    }

    fn ended(max_tokens: u64, tokens_used: u64, budget: u64, children_spent: u64) -> ChildEnd {
        ChildEnd {
            max_tokens,
            tokens_used,
            budget,
            children_spent,
        }
    }

    #[test]
    fn a_parent_takes_back_what_its_child_has_left() {
        // Spent 300 of 1,000: 700 back.
        assert_eq!(give_back(50, false, ended(1_000, 300, 1_000, 0)), (750, 0));
        // Its live child holds 400 of it (its limit shrank by that): not given back twice.
        assert_eq!(give_back(50, false, ended(600, 300, 1_000, 0)), (350, 0));
        // Its ended children spent 200 of theirs.
        assert_eq!(give_back(0, false, ended(800, 300, 1_000, 200)), (500, 0));
        // A limit a person raised is not the tree's to gain.
        assert_eq!(give_back(0, false, ended(5_000, 300, 1_000, 0)), (700, 0));
    }

    #[test]
    fn what_a_parent_cannot_pay_is_forgiven_and_kept() {
        // 120 over its budget: the parent pays from its 100 and 20 are forgiven.
        assert_eq!(
            give_back(100, false, ended(1_000, 1_120, 1_000, 0)),
            (0, 20)
        );
        assert_eq!(
            give_back(500, false, ended(1_000, 1_120, 1_000, 0)),
            (380, 0)
        );
        // A parent that ended takes nothing back but is charged.
        assert_eq!(give_back(100, true, ended(1_000, 400, 1_000, 0)), (100, 0));
        assert_eq!(
            give_back(100, true, ended(1_000, 1_120, 1_000, 0)),
            (100, 120)
        );
        // Extremes saturate.
        assert_eq!(
            give_back(u64::MAX, false, ended(u64::MAX, 0, u64::MAX, 0)).1,
            0
        );
        assert_eq!(give_back(0, false, ended(0, u64::MAX, 0, u64::MAX)).0, 0);
    }

    #[test]
    fn reports_name_each_child_its_end_and_its_answer() {
        let mut r = report(Status::Completed, "42");
        r.files = vec!["delegated/x/a.txt".into()];
        r.criteria_met = vec!["has a number".into()];
        r.reason = Some(Reason::GoalAchieved);
        let text = render_reports(&[r]);
        for needle in [
            "completed",
            "goal_achieved",
            "Result: 42",
            "delegated/x/a.txt",
            "has a number",
            "10 tokens",
        ] {
            assert!(text.contains(needle), "{needle} in {text}");
        }
    }
}
