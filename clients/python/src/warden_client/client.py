"""A synchronous client for Warden's HTTP API, on httpx."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final, cast
from urllib.parse import quote

import httpx

from ._version import __version__
from .errors import WardenError, WardenUnavailable
from .types import (
    Accepted,
    ChildPausePolicy,
    ConfirmIfOver,
    ClaimedTask,
    CreatedKey,
    EventPage,
    Executor,
    HeartbeatAnswer,
    IterationPage,
    LimitsPatch,
    Mode,
    Outcome,
    QueueList,
    Role,
    Session,
    SessionPage,
    SubgoalTask,
    Tree,
)

log = logging.getLogger("warden_client.client")

#: Every operation the client performs, as (method, path template). The
#: client builds URLs only from this table, and a test checks that each entry
#: is an operation of openapi/openapi.json, so the client cannot drift from
#: the document.
ROUTES: Final[dict[str, tuple[str, str]]] = {
    "list_sessions": ("GET", "/api/autonomous"),
    "create_session": ("POST", "/api/autonomous"),
    "get_session": ("GET", "/api/autonomous/{id}"),
    "update_session": ("PATCH", "/api/autonomous/{id}"),
    "delete_session": ("DELETE", "/api/autonomous/{id}"),
    "stop_session": ("POST", "/api/autonomous/{id}/stop"),
    "pause_session": ("POST", "/api/autonomous/{id}/pause"),
    "resume_session": ("POST", "/api/autonomous/{id}/resume"),
    "refine_session": ("POST", "/api/autonomous/{id}/refinement"),
    "confirm_session": ("POST", "/api/autonomous/{id}/confirm"),
    "get_tree": ("GET", "/api/autonomous/{id}/tree"),
    "list_approvals": ("GET", "/api/autonomous/approvals"),
    "decide_approval": ("POST", "/api/autonomous/{id}/approvals/{call_id}"),
    "list_iterations": ("GET", "/api/autonomous/{id}/iterations"),
    "list_events": ("GET", "/api/autonomous/{id}/events"),
    "list_keys": ("GET", "/api/keys"),
    "create_key": ("POST", "/api/keys"),
    "revoke_key": ("DELETE", "/api/keys/{id}"),
    "claim": ("POST", "/api/workers/claim"),
    "heartbeat": ("POST", "/api/workers/tasks/{task_id}/heartbeat"),
    "complete": ("POST", "/api/workers/tasks/{task_id}/complete"),
    "fail": ("POST", "/api/workers/tasks/{task_id}/fail"),
    "release": ("POST", "/api/workers/tasks/{task_id}/release"),
    "list_queues": ("GET", "/api/workers/queues"),
    "readyz": ("GET", "/readyz"),
}

# Operations that may be sent again after an answer was lost or was a 5xx:
# reads, stop (idempotent) and the worker protocol's calls (idempotent per
# lease token; a claim whose answer was lost only leaves a lease to lapse).
# The others are retried only when the connection was never made.
_RETRY_SAFE: Final[frozenset[str]] = frozenset(
    {
        "list_sessions",
        "get_session",
        "stop_session",
        "list_iterations",
        "list_events",
        "list_keys",
        "claim",
        "heartbeat",
        "complete",
        "fail",
        "release",
        "list_queues",
        "readyz",
    }
)

_UNSENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


#: The statuses :meth:`Client.wait_for` waits for by default: ended, paused for a person,
#: or waiting for a person's confirmation before it starts (``awaiting_confirmation``).
SETTLED: Final[tuple[str, ...]] = (
    "completed",
    "stopped",
    "interrupted",
    "failed",
    "paused",
    "awaiting_confirmation",
)


def settled(session: Session, statuses: tuple[str, ...], waiting_for_children: bool = False) -> bool:
    """Whether ``wait_for`` answers with this view: its status is one of ``statuses``, and a
    ``paused / waiting_for_children`` only when ``waiting_for_children``."""
    if session.get("status") not in statuses:
        return False
    return waiting_for_children or not (
        session.get("status") == "paused" and session.get("reason") == "waiting_for_children"
    )


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: up to ``base * 2**attempt``, at most ``cap``, never less than half."""
    ceiling = min(cap, base * (2 ** max(attempt, 0)))
    return (rng or random).uniform(ceiling / 2, ceiling)


class _Retrying:
    """The retry rules :class:`Client` and ``AsyncClient`` share: which failures are tried again, and after how long."""

    max_attempts: int
    backoff_base: float
    backoff_cap: float

    def _retry_after_error(
        self,
        operation: str,
        error: httpx.TransportError,
        attempt: int,
        method: str,
        url: str,
        max_attempts: int | None = None,
    ) -> float:
        """The delay before try ``attempt + 1`` after a network error; raises WardenUnavailable when none is due."""
        retryable = operation in _RETRY_SAFE or isinstance(error, _UNSENT_ERRORS)
        if not retryable or attempt >= (max_attempts or self.max_attempts):
            raise WardenUnavailable(
                f"{method} {url}: {type(error).__name__}: {error} (after {attempt} attempts)"
            ) from error
        delay = backoff_delay(attempt - 1, self.backoff_base, self.backoff_cap)
        log.warning("%s %s: %s; retrying in %.2fs", method, url, type(error).__name__, delay)
        return delay

    def _retry_after_status(
        self,
        operation: str,
        response: httpx.Response,
        attempt: int,
        method: str,
        url: str,
        max_attempts: int | None = None,
    ) -> float | None:
        """The delay before another try after a 5xx or 429 (None: take this answer); raises when spent."""
        status = response.status_code
        if not ((status >= 500 or status == 429) and operation in _RETRY_SAFE):
            return None
        if attempt < (max_attempts or self.max_attempts):
            delay = backoff_delay(attempt - 1, self.backoff_base, self.backoff_cap)
            log.warning("%s %s: %d; retrying in %.2fs", method, url, status, delay)
            return delay
        if status >= 500:
            raise WardenUnavailable(
                f"{method} {url}: {status} {_detail(response)} (after {attempt} attempts)",
                status=status,
                retry_after=retry_after_of(response),
            )
        return None


class Client(_Retrying):
    """Warden's API: sessions, their records, keys and the worker protocol.

    Errors answer as :class:`WardenError` (status, title, detail, code and the
    whole problem document). Network errors and 5xx are retried with
    exponential backoff and jitter, at most ``max_attempts`` times per call
    (only when the request was never sent, for calls that are not safe to
    repeat); after that :class:`WardenUnavailable` is raised.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_attempts: int = 5,
        backoff_base: float = 0.2,
        backoff_cap: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Any = time.sleep,
    ) -> None:
        headers = {"accept": "application/json", "user-agent": f"warden-client-python/{__version__}"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self._timeout = timeout
        self.max_attempts = max(1, max_attempts)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._sleep = sleep

    def __repr__(self) -> str:
        # Never the key.
        return f"Client(base_url={str(self._http.base_url)!r})"

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one place requests are made ---------------------------------

    def request(
        self,
        operation: str,
        *,
        path: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        send_body: bool = False,
        timeout: float | None = None,
        ok_empty: tuple[int, ...] = (),
        traceparent: str | None = None,
        max_attempts: int | None = None,
    ) -> Any:
        """Performs one operation of :data:`ROUTES`; answers the parsed JSON (None for an empty answer).

        ``traceparent`` (W3C trace context) is sent as the ``traceparent`` header, so the
        call joins that trace instead of starting one. ``max_attempts`` overrides the
        client's for this call (1: no retry here; the caller retries as it sees fit).
        """
        method, url, query, headers, content = _prepare(operation, path, params, body, send_body, traceparent)
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method,
                    url,
                    params=query,
                    content=content,
                    headers=headers,
                    timeout=timeout if timeout is not None else self._timeout,
                )
            except httpx.TransportError as error:
                attempt += 1
                self._sleep(self._retry_after_error(operation, error, attempt, method, url, max_attempts))
                continue
            retry = self._retry_after_status(operation, response, attempt + 1, method, url, max_attempts)
            if retry is not None:
                attempt += 1
                self._sleep(retry)
                continue
            return _answer(operation, response, ok_empty)

    # -- sessions ---------------------------------------------------------

    def create_session(
        self,
        goal: str,
        executor: Executor,
        *,
        mode: Mode | None = None,
        limits: LimitsPatch | None = None,
        success_criteria: list[str] | None = None,
        milestones: list[str] | None = None,
        subgoals: list[str | SubgoalTask] | None = None,
        on_child_pause: ChildPausePolicy | None = None,
        generate_criteria: bool | None = None,
        confirm_if_over: ConfirmIfOver | None = None,
    ) -> Session:
        """Creates a session (``POST /api/autonomous``); answers its view."""
        return cast(
            Session,
            self.request(
                "create_session",
                body=_create_body(
                    goal,
                    executor,
                    mode,
                    limits,
                    success_criteria,
                    milestones,
                    subgoals,
                    on_child_pause,
                    generate_criteria,
                    confirm_if_over,
                ),
            ),
        )

    def get_session(self, session_id: str) -> Session:
        """A session's status, counters and, once ended, its termination record."""
        return cast(Session, self.request("get_session", path={"id": session_id}))

    def get_tree(self, session_id: str) -> Tree:
        """A session and all its child sessions, nested, with rolled-up tokens."""
        return cast(Tree, self.request("get_tree", path={"id": session_id}))

    def list_sessions(
        self,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        root_only: bool | None = None,
    ) -> SessionPage:
        """One page of sessions, newest first; pass ``next_cursor`` back as ``cursor``;
        ``root_only`` leaves child sessions out."""
        return cast(
            SessionPage,
            self.request(
                "list_sessions",
                params={"status": status, "limit": limit, "cursor": cursor, "root_only": root_only},
            ),
        )

    def iter_sessions(self, *, status: str | None = None, page_size: int = 50) -> Iterator[Session]:
        """Every session, newest first, following the cursor page by page."""
        cursor: str | None = None
        while True:
            page = self.list_sessions(status=status, limit=page_size, cursor=cursor)
            yield from page.get("items", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def update_session(
        self, session_id: str, *, mode: Mode | None = None, limits: LimitsPatch | None = None
    ) -> Session:
        """Retunes a live session's mode or limits (from its next iteration)."""
        body: dict[str, Any] = {}
        if mode is not None:
            body["mode"] = mode
        if limits is not None:
            body["limits"] = dict(limits)
        return cast(Session, self.request("update_session", path={"id": session_id}, body=body))

    def delete_session(self, session_id: str) -> None:
        """Deletes an ended session and its records."""
        self.request("delete_session", path={"id": session_id})

    def stop_session(self, session_id: str) -> Session:
        """Stops a session now (``interrupted / user_stop``); idempotent."""
        return cast(Session, self.request("stop_session", path={"id": session_id}))

    def confirm_session(self, session_id: str) -> Session:
        """Starts a session ``awaiting_confirmation`` (its estimate was over its ``confirm_if_over``)."""
        return cast(Session, self.request("confirm_session", path={"id": session_id}))

    def pause_session(self, session_id: str) -> Session:
        """Pauses a session after the step in flight."""
        return cast(Session, self.request("pause_session", path={"id": session_id}))

    def resume_session(
        self,
        session_id: str,
        *,
        guidance: str | None = None,
        limits: LimitsPatch | None = None,
        goal: str | None = None,
        reopen: bool | None = None,
    ) -> Session:
        """Resumes a paused or interrupted session, optionally with guidance, limits or a new goal."""
        body: dict[str, Any] = {}
        if guidance is not None:
            body["guidance"] = guidance
        if limits is not None:
            body["limits"] = dict(limits)
        if goal is not None:
            body["goal"] = goal
        if reopen is not None:
            body["reopen"] = reopen
        return cast(
            Session,
            self.request("resume_session", path={"id": session_id}, body=body or None),
        )

    def refine_session(
        self,
        session_id: str,
        choice: str,
        *,
        goal: str | None = None,
        max_wall_time_ms: int | None = None,
    ) -> Session:
        """Answers a refinement proposal: ``accept_suggestion``, ``custom`` (with ``goal``) or ``proceed_with_time_limit``."""
        body: dict[str, Any] = {"choice": choice}
        if goal is not None:
            body["goal"] = goal
        if max_wall_time_ms is not None:
            body["max_wall_time_ms"] = max_wall_time_ms
        return cast(Session, self.request("refine_session", path={"id": session_id}, body=body))

    def list_approvals(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of the calls waiting for a person across the tenant, oldest first."""
        return cast(dict[str, Any], self.request("list_approvals", params={"limit": limit, "cursor": cursor}))

    def decide_approval(
        self,
        session_id: str,
        call_id: str,
        decision: str,
        *,
        message: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Session:
        """Approves (``approve``) or rejects (``reject``) a waiting call; the session continues its step.

        ``arguments`` (with ``approve`` only) runs the call with these in place of the agent's.
        """
        body: dict[str, Any] = {"decision": decision}
        if message is not None:
            body["message"] = message
        if arguments is not None:
            body["arguments"] = arguments
        return cast(
            Session,
            self.request("decide_approval", path={"id": session_id, "call_id": call_id}, body=body),
        )

    def iterations(
        self, session_id: str, *, after: int | None = None, limit: int | None = None, full: bool | None = None
    ) -> IterationPage:
        """One page of committed iterations after number ``after``."""
        return cast(
            IterationPage,
            self.request(
                "list_iterations",
                path={"id": session_id},
                params={"after": after, "limit": limit, "full": full},
            ),
        )

    def events(self, session_id: str, *, after: int | None = None, limit: int | None = None) -> EventPage:
        """One page of the session's log after sequence number ``after``."""
        return cast(
            EventPage,
            self.request(
                "list_events", path={"id": session_id}, params={"after": after, "limit": limit}
            ),
        )

    def wait_for(
        self,
        session_id: str,
        statuses: tuple[str, ...] = SETTLED,
        *,
        timeout: float = 60.0,
        poll: float = 0.1,
        waiting_for_children: bool = False,
    ) -> Session:
        """Polls until the session's status is one of ``statuses``; TimeoutError after ``timeout`` seconds.

        A session paused only to wait for its children (``paused / waiting_for_children``)
        goes on by itself, so it is not an answer unless ``waiting_for_children`` is true.
        """
        deadline = time.monotonic() + timeout
        while True:
            session = self.get_session(session_id)
            if settled(session, statuses, waiting_for_children):
                return session
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"session {session_id} still {session.get('status')!r} after {timeout}s"
                )
            time.sleep(poll)

    # -- keys ---------------------------------------------------------------

    def create_key(
        self,
        tenant: str,
        role: Role,
        *,
        name: str | None = None,
        queues: list[str] | None = None,
        global_admin: bool | None = None,
    ) -> CreatedKey:
        """Makes a key; its ``secret`` is in this answer only. Worker keys name their ``queues``."""
        body: dict[str, Any] = {"tenant": tenant, "role": role}
        if name is not None:
            body["name"] = name
        if queues is not None:
            body["queues"] = queues
        if global_admin is not None:
            body["global"] = global_admin
        return cast(CreatedKey, self.request("create_key", body=body))

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key (without secrets)."""
        answer = self.request("list_keys")
        return cast(list[dict[str, Any]], answer.get("items", []))

    def revoke_key(self, key_id: str) -> None:
        """Revokes a key."""
        self.request("revoke_key", path={"id": key_id})

    # -- the worker protocol ----------------------------------------------

    def claim(
        self,
        *,
        queues: list[str] | None = None,
        wait_ms: int = 30000,
        worker: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> ClaimedTask | None:
        """Long-polls for a task for up to ``wait_ms``; None when none came (204).

        ``labels``: what this worker has; it is offered only tasks whose session's
        ``executor.labels`` it has every one of (none: only tasks without labels).
        """
        body: dict[str, Any] = {"wait_ms": wait_ms}
        if queues is not None:
            body["queues"] = queues
        if worker is not None:
            body["worker"] = worker
        if labels:
            body["labels"] = labels
        answer = self.request(
            "claim", body=body, timeout=wait_ms / 1000 + self._timeout, ok_empty=(204,)
        )
        return cast(ClaimedTask | None, answer)

    def heartbeat(
        self,
        task_id: str,
        lease_token: str,
        progress: str | None = None,
        *,
        traceparent: str | None = None,
        wait_ms: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
    ) -> HeartbeatAnswer:
        """Extends the lease; the answer says whether to cancel. 409 (WardenError) when the lease was lost.

        ``traceparent``: the task's ``context.traceparent``, sent as the header (as on complete, fail, release).
        ``wait_ms`` (at most 30000): Warden answers as soon as the step is stopped, paused or drained, or
        its lease lost, else after that long, the lease extended then; one such heartbeat kept in flight
        hears a stop within milliseconds. A server older than ``wait_ms`` answers 422 naming it.
        ``timeout``: seconds the call may take beyond the wait (default the client's timeout), so the
        read timeout always exceeds the wait. ``max_attempts``: as :meth:`request`'s.
        """
        body: dict[str, Any] = {"lease_token": lease_token}
        if progress is not None:
            body["progress"] = progress
        if wait_ms:
            body["wait_ms"] = wait_ms
        return cast(
            HeartbeatAnswer,
            self.request(
                "heartbeat",
                path={"task_id": task_id},
                body=body,
                traceparent=traceparent,
                timeout=wait_ms / 1000 + (self._timeout if timeout is None else timeout),
                max_attempts=max_attempts,
            ),
        )

    def complete(
        self, task_id: str, lease_token: str, outcome: Outcome, *, traceparent: str | None = None
    ) -> Accepted:
        """Reports the step's outcome; 409 (WardenError) when the lease was lost."""
        body = {"lease_token": lease_token, "outcome": outcome}
        return cast(
            Accepted, self.request("complete", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    def fail(
        self,
        task_id: str,
        lease_token: str,
        error: str,
        *,
        retryable: bool = True,
        tokens: int | None = None,
        traceparent: str | None = None,
    ) -> Accepted:
        """Reports the step failed (an executor error; ``retryable=False``: a permanent one); ``tokens`` spent."""
        body: dict[str, Any] = {"lease_token": lease_token, "error": error, "retryable": retryable}
        if tokens is not None:
            body["tokens"] = tokens
        return cast(
            Accepted, self.request("fail", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    def release(
        self, task_id: str, lease_token: str, *, tokens: int | None = None, traceparent: str | None = None
    ) -> Accepted:
        """Gives the task back without counting an attempt (a worker shutting down); ``tokens`` spent."""
        body: dict[str, Any] = {"lease_token": lease_token}
        if tokens is not None:
            body["tokens"] = tokens
        return cast(
            Accepted, self.request("release", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    def queues(self) -> QueueList:
        """The caller's queues: depth, oldest task age and connected workers."""
        return cast(QueueList, self.request("list_queues"))

    def ready(self) -> bool:
        """Whether the server answers ``/readyz`` with 200 (one try)."""
        try:
            response = self._http.get(ROUTES["readyz"][1], timeout=5.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200


def _create_body(
    goal: str,
    executor: Executor,
    mode: Mode | None,
    limits: LimitsPatch | None,
    success_criteria: list[str] | None,
    milestones: list[str] | None,
    subgoals: list[str | SubgoalTask] | None,
    on_child_pause: ChildPausePolicy | None,
    generate_criteria: bool | None,
    confirm_if_over: ConfirmIfOver | None = None,
) -> dict[str, Any]:
    """A ``CreateSession`` body with the fields given (None: left to the server's default)."""
    body: dict[str, Any] = {"goal": goal, "executor": dict(executor)}
    optional: dict[str, Any] = {
        "mode": mode,
        "limits": dict(limits) if limits is not None else None,
        "success_criteria": success_criteria,
        "milestones": milestones,
        "subgoals": subgoals,
        "on_child_pause": on_child_pause,
        "generate_criteria": generate_criteria,
        "confirm_if_over": dict(confirm_if_over) if confirm_if_over is not None else None,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return body


def _prepare(
    operation: str,
    path: Mapping[str, str] | None,
    params: Mapping[str, Any] | None,
    body: Any,
    send_body: bool,
    traceparent: str | None,
) -> tuple[str, str, dict[str, Any], dict[str, str], bytes | None]:
    """An operation's method, URL, query, headers and body (shared by :class:`Client` and ``AsyncClient``)."""
    method, template = ROUTES[operation]
    url = template.format(**{k: quote(str(v), safe="") for k, v in (path or {}).items()})
    query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
    headers: dict[str, str] = {}
    content: bytes | None = None
    if method in ("POST", "PATCH", "PUT") or send_body:
        # A state change is JSON even with no body (the server requires it).
        headers["content-type"] = "application/json"
        if body is not None:
            content = httpx.Request("POST", "/", json=body).content
    if traceparent:
        headers["traceparent"] = traceparent
    return method, url, query, headers, content


def _answer(operation: str, response: httpx.Response, ok_empty: tuple[int, ...]) -> Any:
    """The parsed JSON of a final answer (None when empty); WardenError for 4xx/5xx."""
    status = response.status_code
    if status >= 400:
        method, template = ROUTES[operation]
        error = WardenError.from_body(status, _json_or_text(response), response.reason_phrase, method, template)
        error.retry_after = retry_after_of(response)
        raise error
    if status in ok_empty or not response.content:
        return None
    return response.json()


#: The longest ``Retry-After`` taken from an answer, seconds: a larger one is read as this.
MAX_RETRY_AFTER: Final[float] = 300.0


def retry_after_of(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (0 to :data:`MAX_RETRY_AFTER`); None when absent or not a number."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: Warden sends seconds
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _detail(response: httpx.Response) -> str:
    body = _json_or_text(response)
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or "")
    return str(body)[:200]
