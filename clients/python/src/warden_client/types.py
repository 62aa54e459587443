"""The JSON shapes of Warden's API, as TypedDicts (see openapi/openapi.json).

Answers are plain dicts at run time: the server may add fields, and these
types name the ones a client relies on (``total=False`` where the server
leaves some out).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

#: A session's status.
Status = Literal[
    "awaiting_refinement",
    "awaiting_confirmation",
    "queued",
    "running",
    "paused",
    "completed",
    "stopped",
    "interrupted",
    "failed",
]

#: The stop signal an agent may give with a step's outcome.
Signal = Literal["done", "blocked", "ask_user"]

#: What a key may do.
Role = Literal["admin", "operator", "viewer", "worker"]

#: How the session loop chooses between iteration limits and reflection.
Mode = Literal["fixed", "continuous"]

#: When a tool call needs a person's approval before it runs.
ApprovalRule = Literal["never", "always", "when_not_read_only"]

#: What a child does when it would pause for a person.
ChildPausePolicy = Literal["wait", "fail_child"]


# -- request shapes (``CreateSession``): a misspelt key is a type error -------
#
# Written from openapi/openapi.json; tests/test_openapi.py checks each key and
# which are required against the document's schemas.


class LimitsPatch(TypedDict, total=False):
    """Limits to set in a create, resume or update (``LimitsPatch``); any subset."""

    max_iterations: int | None
    max_wall_time_ms: int | None
    max_tokens: int | None
    max_tool_calls: int | None
    max_consecutive_errors: int | None
    max_cycles: int | None
    context_budget_tokens: int | None
    reflection_interval: int | None
    checkpoint_interval: int | None
    review_every: int | None
    warn_at: list[int] | None
    max_cost_usd: str | None


class Limits(TypedDict, total=False):
    """The limits a session runs under, all resolved (``Limits``, in a session's view)."""

    max_iterations: int
    max_wall_time_ms: int
    max_tokens: int
    max_tool_calls: int | None
    max_consecutive_errors: int
    max_cycles: int
    context_budget_tokens: int
    reflection_interval: int
    #: False once ``reflection_interval`` was set: the interval no longer adapts.
    reflection_adaptive: bool
    checkpoint_interval: int
    review_every: int | None
    warn_at: list[int]
    max_cost_usd: str | None


class WorkerExecutor(TypedDict):
    """Steps become tasks on ``queue`` that workers claim (the worker protocol)."""

    kind: Literal["worker"]
    queue: str
    labels: NotRequired[dict[str, str]]
    heartbeat_timeout_ms: NotRequired[int | None]
    max_attempts: NotRequired[int | None]
    worker_wait_timeout_ms: NotRequired[int | None]


class WebhookExecutor(TypedDict):
    """Warden POSTs each step's context to ``url`` and reads back the outcome."""

    kind: Literal["webhook"]
    url: str
    timeout_ms: NotRequired[int | None]


class ApprovalPolicy(TypedDict, total=False):
    """Which tool calls wait for a person: a default and rules per tool or server prefix (``fs__*``)."""

    default: ApprovalRule
    tools: dict[str, ApprovalRule]


class LlmExecutor(TypedDict):
    """An OpenAI-compatible chat model with tools; unset fields come from the server's settings."""

    kind: Literal["llm"]
    api_key: NotRequired[str | None]
    approvals: NotRequired[ApprovalPolicy]
    base_url: NotRequired[str | None]
    max_tokens_per_call: NotRequired[int | None]
    model: NotRequired[str | None]
    temperature: NotRequired[float | None]
    timeout_ms: NotRequired[int | None]
    tools: NotRequired[list[str] | None]


class ScriptedFile(TypedDict):
    """A file a scripted step claims to write."""

    path: str
    digest: str


class ScriptedDelegation(TypedDict):
    """A task a scripted step delegates to a child session."""

    goal: str
    budget_share: NotRequired[float | None]
    script: NotRequired[str | None]
    success_criteria: NotRequired[list[str]]
    wait: NotRequired[bool]


class ScriptedStep(TypedDict):
    """One step of a scripted session."""

    action: str
    arguments: NotRequired[dict[str, Any]]
    delay_ms: NotRequired[int]
    delegate: NotRequired[list[ScriptedDelegation]]
    files: NotRequired[list[ScriptedFile]]
    outcome: NotRequired[Literal["success", "failure", "error"]]
    output: NotRequired[str]
    tokens: NotRequired[int]
    tool_calls: NotRequired[int]
    waiting: NotRequired[bool]


class ScriptedExecutor(TypedDict):
    """Steps given in the request (demos, tests, dry runs of policy)."""

    kind: Literal["scripted"]
    steps: list[ScriptedStep]
    repeat: NotRequired[bool]
    scripts: NotRequired[dict[str, list[ScriptedStep]]]


#: How a session's iterations are performed (``ExecutorSpec``), told apart by ``kind``.
Executor = WorkerExecutor | WebhookExecutor | LlmExecutor | ScriptedExecutor


class SubgoalTask(TypedDict):
    """One task of a split goal, in full (``SubgoalTask``)."""

    goal: str
    success_criteria: NotRequired[list[str]]
    budget_share: NotRequired[float | None]
    steps: NotRequired[list[ScriptedStep] | None]
    repeat: NotRequired[bool]


class ConfirmIfOver(TypedDict, total=False):
    """``confirm_if_over`` of a create (``ConfirmIfOver``): wait for a person's confirmation
    when the estimate's p90 cost (a decimal string of USD) or running time is over these,
    or unknown. At least one."""

    cost_usd: str
    minutes: int


class Problem(TypedDict, total=False):
    """The application/problem+json document every error answers with."""

    type: str
    title: str
    status: int
    detail: str
    code: str


class Session(TypedDict, total=False):
    """A session's view (``SessionView``): status, counters, limits, termination."""

    id: str
    goal: str
    status: Status
    reason: str | None
    summary: str | None
    iterations: int
    tokens_used: int
    tool_calls: int
    percent_complete: float | None
    mode: Mode
    limits: Limits
    executor: dict[str, Any]
    created_at: str
    updated_at: str
    waiting_for_worker: dict[str, Any] | None
    parent_id: str | None
    depth: int
    children: list[dict[str, Any]]
    delegation: dict[str, int]
    #: While ``awaiting_confirmation`` (and kept after): ``confirm_if_over``, ``over``
    #: (``cost_usd``, ``minutes`` or ``unknown``), the ``estimate`` and ``expires_at``.
    confirmation: dict[str, Any] | None


class TreeNode(TypedDict, total=False):
    """A session of a tree (``TreeNode``), its children nested."""

    id: str
    parent_id: str | None
    depth: int
    goal: str
    status: Status
    reason: str | None
    summary: str | None
    tokens_used: int
    iterations: int
    max_tokens: int
    budget_tokens: int | None
    subtree_tokens_used: int
    #: ``{session_id, iteration}`` when the session is a fork.
    forked_from: dict[str, Any] | None
    #: Sessions forked from it: ``id``, ``iteration``, ``goal``, ``status``, ``created_at``.
    forks: list[dict[str, Any]]
    children: list[TreeNode]


class Tree(TypedDict, total=False):
    """A session and its descendants (``GET /api/autonomous/{id}/tree``)."""

    totals: dict[str, int]
    node: TreeNode


class SessionPage(TypedDict, total=False):
    """A page of sessions, newest first."""

    items: list[Session]
    next_cursor: str | None


class Iteration(TypedDict, total=False):
    """A committed iteration (``IterationView``)."""

    number: int
    action: str
    outcome: str
    tokens: int
    duration_ms: int
    started_at: str
    finished_at: str
    record: dict[str, Any]
    effects: list[Any]


class IterationPage(TypedDict, total=False):
    """A page of iterations."""

    items: list[Iteration]
    next_after: int | None


class Event(TypedDict, total=False):
    """One entry of a session's log (``EventView``)."""

    seq: int
    kind: str
    data: dict[str, Any]
    at: str


class EventPage(TypedDict, total=False):
    """A page of a session's log."""

    items: list[Event]
    next_after: int | None
    compacted_through: int | None


class CreatedKey(TypedDict, total=False):
    """A key just made: its ``secret`` (sent as ``Authorization: Bearer``) is shown this once."""

    id: str
    secret: str
    prefix: str
    tenant: str
    role: Role
    name: str | None
    queues: list[str]


class HistoryItem(TypedDict):
    """One recent step as the agent is told it (``WebhookHistoryItem``)."""

    number: int
    action: str
    outcome: str
    output: str


class ActionApproval(TypedDict, total=False):
    """An action the agent asks a person to approve before doing it; only ``action`` is required."""

    action: str
    arguments: dict[str, Any]
    reason: str


class ApprovalOutcome(TypedDict, total=False):
    """The decision on the action the previous step asked approval for."""

    action: str
    arguments: dict[str, Any]
    arguments_edited: bool
    decision: Literal["approve", "reject", "expired"]
    message: str | None


class ChildTask(TypedDict, total=False):
    """A task an agent delegates to a child session; only ``goal`` is required."""

    goal: str
    success_criteria: list[str]
    budget_share: float
    wait: bool


class ChildReport(TypedDict, total=False):
    """A child session that ended, as its parent's next step is told."""

    child_id: str
    goal: str
    status: Status
    reason: str | None
    summary: str | None
    criteria_met: list[str]
    files: list[str]
    tokens_used: int


class StepContext(TypedDict, total=False):
    """What an agent is given for a step (``WebhookRequest``)."""

    session_id: str
    goal: str
    iteration: int
    guidance: str | None
    nudge: str | None
    token_allowance: int
    history: list[HistoryItem]
    approval: ApprovalOutcome
    children: list[ChildReport]
    traceparent: str | None
    budget_note: str | None


class StepUsage(TypedDict, total=False):
    """A step's tokens split and its model, for pricing it (``StepUsage``)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    model: str | None


class Outcome(TypedDict, total=False):
    """What an agent answers for a step (``WebhookResponse``); only ``action`` is required."""

    action: str
    arguments: dict[str, Any]
    outcome: Literal["success", "failure", "error"] | None
    tokens: int
    output: str
    tool_calls: int
    signal: Signal | None
    reason: str | None
    percent_complete: float | None
    waiting: bool
    approval: ActionApproval
    delegate: list[ChildTask]
    usage: StepUsage | None


class ClaimedTask(TypedDict, total=False):
    """A task handed to a worker by ``POST /api/workers/claim``."""

    task_id: str
    lease_token: str
    lease_expires_at: str
    heartbeat_timeout_ms: int
    session_id: str
    queue: str
    labels: dict[str, str]
    iteration: int
    attempt: int
    idempotency_key: str
    context: StepContext


class HeartbeatAnswer(TypedDict, total=False):
    """The answer to a heartbeat: whether to abandon the step, and the lease's new end."""

    cancel: bool
    reason: str | None
    lease_expires_at: str | None
    token_allowance: int | None


class Accepted(TypedDict):
    """The answer to complete, fail and release."""

    accepted: bool


class QueueWorker(TypedDict, total=False):
    """A worker seen recently on a queue."""

    worker: str
    last_seen_at: str
    task_id: str | None


class QueueView(TypedDict, total=False):
    """A queue's depth, oldest task age and connected workers."""

    queue: str
    tenant: str
    depth: int
    oldest_task_age_ms: int | None
    workers: list[QueueWorker]


class QueueList(TypedDict):
    """The caller's queues."""

    queues: list[QueueView]
