"""Errors raised by the client and the worker."""

from __future__ import annotations

from typing import Any

from .types import Problem


class WardenError(Exception):
    """Warden answered with an error: the problem+json document, parsed."""

    def __init__(self, status: int, problem: Problem, method: str = "", path: str = "") -> None:
        self.status = status
        self.problem = problem
        self.title: str = problem.get("title", "")
        self.detail: str = problem.get("detail", "")
        self.code: str = problem.get("code", "")
        self.method = method
        self.path = path
        #: The answer's ``Retry-After``, seconds (429 and 503 carry one), else None.
        self.retry_after: float | None = None
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status} {self.title}: {self.detail}".rstrip(": "))

    @classmethod
    def from_body(cls, status: int, body: Any, reason: str, method: str, path: str) -> WardenError:
        """Builds the error from an answer's body, whatever it holds."""
        problem: Problem
        if isinstance(body, dict):
            problem = {
                "type": str(body.get("type", "about:blank")),
                "title": str(body.get("title", reason)),
                "status": int(body.get("status", status)),
                "detail": str(body.get("detail", "")),
                "code": str(body.get("code", "")),
            }
        else:
            text = body if isinstance(body, str) else ""
            problem = {
                "type": "about:blank",
                "title": reason,
                "status": status,
                "detail": text[:500],
                "code": "",
            }
        return cls(status, problem, method, path)


class WardenUnavailable(Exception):
    """Warden could not be reached (or kept answering 5xx) through every retry.

    ``status`` is the last answer's status when Warden answered (a 5xx), None when it
    could not be reached; ``retry_after`` its ``Retry-After`` in seconds, if any.
    """

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


class Cancelled(Exception):
    """The step was cancelled (session stopped or paused, lease lost, worker shutting down).

    Raised by :meth:`warden_client.Task.check_cancelled` and
    :meth:`warden_client.Task.report_progress`; let it propagate out of the step.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"step cancelled: {reason}")


class StepError(Exception):
    """Raise from a step to report it failed; ``retryable=False`` makes it a permanent error."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        self.retryable = retryable
        super().__init__(message)
