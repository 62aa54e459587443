"""An in-memory stand-in for Warden's worker protocol, served through httpx.MockTransport."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from warden_client import AsyncClient, AsyncWorker, ClaimedTask, Client, Worker


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def is_child_of(traceparent: str | None, parent: str) -> bool:
    """Whether ``traceparent`` continues ``parent``'s trace under a span id of its own."""
    if traceparent is None:
        return False
    version, trace_id, span_id, flags = traceparent.split("-")
    _, parent_trace, parent_span, parent_flags = parent.split("-")
    return (
        version == "00"
        and trace_id == parent_trace
        and flags == parent_flags
        and len(span_id) == 16
        and span_id != parent_span
        and span_id != "0" * 16
    )


def make_task(n: int = 1, heartbeat_timeout_ms: int = 300, **context: Any) -> ClaimedTask:
    """A claimed task as the server answers it."""
    task: ClaimedTask = {
        "task_id": f"00000000-0000-0000-0000-{n:012d}",
        "lease_token": f"lease-{n}",
        "lease_expires_at": "2030-01-01T00:00:00Z",
        "heartbeat_timeout_ms": heartbeat_timeout_ms,
        "session_id": f"10000000-0000-0000-0000-{n:012d}",
        "queue": "research",
        "labels": {},
        "iteration": 1,
        "attempt": 1,
        "idempotency_key": f"idem-{n}",
        "context": {
            "session_id": f"10000000-0000-0000-0000-{n:012d}",
            "goal": "write notes.md",
            "iteration": 1,
            "token_allowance": 1000,
            "history": [],
        },
    }
    task["context"].update(context)  # type: ignore[typeddict-item]
    return task


class FakeWarden:
    """Answers the worker protocol's routes; records every call."""

    def __init__(self, tasks: list[ClaimedTask] | None = None) -> None:
        self.tasks = list(tasks or [])
        self.calls: list[tuple[str, str, Any]] = []
        #: Each request's kind and headers, in order.
        self.headers: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.cancel_after_heartbeats: int | None = None
        self.cancel_reason = "stopped"
        self.heartbeat_status = 200
        self.complete_status = 200
        self.claim_failures: list[int | Exception] = []
        self.worker: Worker | AsyncWorker | None = None
        self.stop_when_empty = True
        self.overrides: dict[str, Callable[[httpx.Request], httpx.Response]] = {}

    def client(self, **kwargs: Any) -> Client:
        """A client whose requests this fake answers (backoff sleeps recorded, not slept, unless asked)."""
        kwargs.setdefault("backoff_base", 0.001)
        kwargs.setdefault("backoff_cap", 0.002)
        return Client("http://warden.test", "wk_secret", transport=httpx.MockTransport(self.handle), **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        """An async client whose requests this fake answers."""
        kwargs.setdefault("backoff_base", 0.001)
        kwargs.setdefault("backoff_cap", 0.002)
        return AsyncClient("http://warden.test", "wk_secret", transport=httpx.MockTransport(self.handle), **kwargs)

    def headers_to(self, kind: str, name: str) -> list[str | None]:
        """The value of header ``name`` on each call to one kind of route (None where absent)."""
        with self.lock:
            return [headers.get(name) for k, headers in self.headers if k == kind]

    def calls_to(self, kind: str) -> list[Any]:
        """The bodies sent to one kind of route (claim, heartbeat, complete, fail, release)."""
        with self.lock:
            return [body for k, _path, body in self.calls if k == kind]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Polls ``predicate`` until true; fails the test after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s; calls: {self.calls}")
            time.sleep(0.01)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        kind = path.rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append((kind, path, body))
            self.headers.append((kind, dict(request.headers)))
        if kind in self.overrides:
            return self.overrides[kind](request)
        if kind == "claim":
            with self.lock:
                failure = self.claim_failures.pop(0) if self.claim_failures else None
                task = self.tasks.pop(0) if self.tasks and failure is None else None
            if isinstance(failure, Exception):
                raise failure
            if failure is not None:
                return problem(failure, "unavailable")
            if task is None:
                if self.stop_when_empty and self.worker is not None:
                    self.worker.shutdown()
                return httpx.Response(204)
            return httpx.Response(200, json=dict(task))
        if kind == "heartbeat":
            if self.heartbeat_status != 200:
                return problem(self.heartbeat_status, "lease lost")
            beats = len(self.calls_to("heartbeat"))
            cancel = self.cancel_after_heartbeats is not None and beats >= self.cancel_after_heartbeats
            return httpx.Response(
                200,
                json={
                    "cancel": cancel,
                    "reason": self.cancel_reason if cancel else None,
                    "lease_expires_at": "2030-01-01T00:00:00Z",
                    "token_allowance": 900,
                },
            )
        if kind == "complete":
            if self.complete_status != 200:
                return problem(self.complete_status, "the lease was lost")
            return httpx.Response(200, json={"accepted": True})
        if kind in ("fail", "release"):
            return httpx.Response(200, json={"accepted": True})
        return problem(404, "no such route")


def problem(status: int, detail: str, code: str = "test") -> httpx.Response:
    """A problem+json answer."""
    return httpx.Response(
        status,
        headers={"content-type": "application/problem+json"},
        json={"type": "about:blank", "title": "Error", "status": status, "detail": detail, "code": code},
    )
