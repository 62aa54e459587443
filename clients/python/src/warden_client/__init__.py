"""Warden's Python client: the HTTP API (:class:`Client`) and a worker (:class:`Worker`)
that runs any Python function as a supervised agent's steps."""

from .client import ROUTES, Client, backoff_delay
from .errors import Cancelled, StepError, WardenError, WardenUnavailable
from .types import (
    ActionApproval,
    ApprovalOutcome,
    ChildReport,
    ChildTask,
    ClaimedTask,
    HeartbeatAnswer,
    HistoryItem,
    Outcome,
    Problem,
    Session,
    SessionPage,
    StepContext,
    Tree,
    TreeNode,
)
from .worker import StepFn, Task, Worker

__all__ = [
    "ROUTES",
    "ActionApproval",
    "ApprovalOutcome",
    "Cancelled",
    "ChildReport",
    "ChildTask",
    "ClaimedTask",
    "Client",
    "HeartbeatAnswer",
    "HistoryItem",
    "Outcome",
    "Problem",
    "Session",
    "SessionPage",
    "StepContext",
    "StepError",
    "StepFn",
    "Task",
    "Tree",
    "TreeNode",
    "WardenError",
    "WardenUnavailable",
    "Worker",
    "backoff_delay",
]
__version__ = "0.1.0"
