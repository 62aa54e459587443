"""An in-memory stand-in for Warden's worker protocol, served through httpx.MockTransport."""

from __future__ import annotations

import asyncio
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
    """Answers the worker protocol's routes; records every call.

    A heartbeat with ``wait_ms`` waits as Warden's does: until there is news of its
    task (:meth:`cancel`, the task completed, failed or released, a heartbeat
    failure set) or its deadline (at most half the lease), then answers.
    """

    def __init__(self, tasks: list[ClaimedTask] | None = None) -> None:
        self.tasks = list(tasks or [])
        self.calls: list[tuple[str, str, Any]] = []
        #: Each request's kind and headers, in order.
        self.headers: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        #: A task's heartbeats from this many on (counted per lease token) answer ``cancel``.
        self.cancel_after_heartbeats: int | None = None
        self.cancel_reason = "stopped"
        self.heartbeat_status = 200
        self.complete_status = 200
        self.claim_failures: list[int | Exception] = []
        self.worker: Worker | AsyncWorker | None = None
        self.stop_when_empty = True
        self.overrides: dict[str, Callable[[httpx.Request], httpx.Response]] = {}
        #: Told when a task has news, so waiting heartbeats answer.
        self.news = threading.Condition(self.lock)
        #: False: a heartbeat's ``wait_ms`` answers 422 naming it, as a server older than the field does.
        self.knows_wait_ms = True
        #: True: every heartbeat answers at once ``reason: draining`` (not a cancel), as while a replica drains.
        self.draining = False
        #: Lease tokens told to abandon their step, with the reason (see :meth:`cancel`).
        self.cancelled: dict[str, str] = {}
        #: Lease tokens whose task was completed, failed or released: their heartbeats answer 409.
        self.ended: set[str] = set()
        #: Lease length of each claimed task's token, ms.
        self.leases: dict[str, int] = {}
        #: Heartbeats with ``wait_ms`` in flight now.
        self.waiting = 0
        #: Answers of the next heartbeats, before anything else: a status (problem+json,
        #: with ``Retry-After: retry_after`` when set) or an exception to raise.
        self.heartbeat_failures: list[int | Exception] = []
        self.retry_after: str | None = None
        #: Each heartbeat's read timeout, seconds, in order.
        self.heartbeat_read_timeouts: list[float] = []

    def client(self, **kwargs: Any) -> Client:
        """A client whose requests this fake answers (backoff sleeps recorded, not slept, unless asked)."""
        kwargs.setdefault("backoff_base", 0.001)
        kwargs.setdefault("backoff_cap", 0.002)
        return Client("http://warden.test", "wk_secret", transport=httpx.MockTransport(self.handle), **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        """An async client whose requests this fake answers (its heartbeats wait without blocking the loop)."""
        kwargs.setdefault("backoff_base", 0.001)
        kwargs.setdefault("backoff_cap", 0.002)
        return AsyncClient(
            "http://warden.test", "wk_secret", transport=httpx.MockTransport(self.handle_async), **kwargs
        )

    def cancel(self, lease_token: str, reason: str = "stopped") -> None:
        """Tells the step of ``lease_token`` to stop, as a stop of its session does: heartbeats answer ``cancel``."""
        with self.news:
            self.cancelled[lease_token] = reason
            self.news.notify_all()

    def waits(self) -> list[int]:
        """The ``wait_ms`` of each heartbeat, in order (0 for one that did not wait)."""
        return [int(body.get("wait_ms", 0)) for body in self.calls_to("heartbeat")]

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

    def _record(self, request: httpx.Request) -> tuple[str, Any]:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        kind = path.rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append((kind, path, body))
            self.headers.append((kind, dict(request.headers)))
            if kind == "heartbeat":
                self.heartbeat_read_timeouts.append(float(request.extensions["timeout"]["read"]))
        return kind, body

    def handle(self, request: httpx.Request) -> httpx.Response:
        kind, body = self._record(request)
        if kind in self.overrides:
            return self.overrides[kind](request)
        if kind != "heartbeat":
            return self._answer(kind, body)
        started = self._beat_started(body)
        if isinstance(started, httpx.Response):
            return started
        due, deadline = started
        waits = int("wait_ms" in body)
        with self.news:
            self.waiting += waits
            try:
                while (news := self._beat_news(body["lease_token"], due)) is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.news.wait(left)
            finally:
                self.waiting -= waits
        return news or beat_answer(False, None)

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        """:meth:`handle` for the async client: a waiting heartbeat polls on the loop until its deadline."""
        if not request.url.path.endswith("/heartbeat") or "heartbeat" in self.overrides:
            return self.handle(request)
        kind, body = self._record(request)
        started = self._beat_started(body)
        if isinstance(started, httpx.Response):
            return started
        due, deadline = started
        waits = int("wait_ms" in body)
        with self.lock:
            self.waiting += waits
        try:
            while True:
                with self.lock:
                    news = self._beat_news(body["lease_token"], due)
                left = deadline - time.monotonic()
                if news is not None or left <= 0:
                    return news or beat_answer(False, None)
                await asyncio.sleep(min(left, 0.002))
        finally:
            with self.lock:
                self.waiting -= waits

    def _beat_started(self, body: Any) -> httpx.Response | tuple[bool, float]:
        """A heartbeat's answer at once (a failure, an invalid ``wait_ms``), else whether it is due
        a cancel (``cancel_after_heartbeats``) and the monotonic deadline of its wait."""
        with self.lock:
            failure = self.heartbeat_failures.pop(0) if self.heartbeat_failures else None
            token = body["lease_token"]
            beats = sum(1 for kind, _path, sent in self.calls if kind == "heartbeat" and sent["lease_token"] == token)
            lease_ms = self.leases.get(token, 30_000)
        if isinstance(failure, Exception):
            raise failure
        if failure is not None:
            headers = {"retry-after": self.retry_after} if self.retry_after else {}
            return problem(failure, "refused", headers=headers)
        wait_ms = int(body.get("wait_ms", 0))
        if wait_ms and not self.knows_wait_ms:
            return problem(
                422,
                "invalid request body: unknown field `wait_ms`, expected one of `lease_token`, `progress`",
                "invalid_request",
            )
        if wait_ms > 30_000:
            return problem(422, "wait_ms must be at most 30000", "invalid_request")
        due = self.cancel_after_heartbeats is not None and beats >= self.cancel_after_heartbeats
        return due, time.monotonic() + min(wait_ms, lease_ms / 2) / 1000

    def _beat_news(self, token: str, due: bool) -> httpx.Response | None:
        """The answer a heartbeat gives at once when there is news of its task (the lock held), else None."""
        if self.heartbeat_status != 200:
            return problem(self.heartbeat_status, "lease lost")
        if token in self.ended:
            return problem(409, "the task ended")
        if token in self.cancelled or due:
            return beat_answer(True, self.cancelled.get(token, self.cancel_reason))
        if self.draining:
            return beat_answer(False, "draining")
        return None

    def _answer(self, kind: str, body: Any) -> httpx.Response:
        if kind == "claim":
            return self._claim()
        if kind in ("complete", "fail", "release"):
            with self.news:
                self.ended.add(body["lease_token"])
                self.news.notify_all()
        if kind == "complete":
            if self.complete_status != 200:
                return problem(self.complete_status, "the lease was lost")
            return httpx.Response(200, json={"accepted": True})
        if kind in ("fail", "release"):
            return httpx.Response(200, json={"accepted": True})
        return problem(404, "no such route")

    def _claim(self) -> httpx.Response:
        with self.lock:
            failure = self.claim_failures.pop(0) if self.claim_failures else None
            task = self.tasks.pop(0) if self.tasks and failure is None else None
            if task is not None:
                self.leases[task["lease_token"]] = task["heartbeat_timeout_ms"]
        if isinstance(failure, Exception):
            raise failure
        if failure is not None:
            return problem(failure, "unavailable")
        if task is None:
            if self.stop_when_empty and self.worker is not None:
                self.worker.shutdown()
            return httpx.Response(204)
        return httpx.Response(200, json=dict(task))


def beat_answer(cancel: bool, reason: str | None) -> httpx.Response:
    """A heartbeat's 200 answer."""
    return httpx.Response(
        200,
        json={
            "cancel": cancel,
            "reason": reason,
            "lease_expires_at": None if cancel else "2030-01-01T00:00:00Z",
            "token_allowance": 900,
        },
    )


def problem(status: int, detail: str, code: str = "test", headers: dict[str, str] | None = None) -> httpx.Response:
    """A problem+json answer."""
    return httpx.Response(
        status,
        headers={"content-type": "application/problem+json", **(headers or {})},
        json={"type": "about:blank", "title": "Error", "status": status, "detail": detail, "code": code},
    )
