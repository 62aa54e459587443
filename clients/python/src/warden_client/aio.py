"""The asynchronous client, :class:`AsyncClient`: the same operations as :class:`~warden_client.Client`, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import httpx

from ._version import __version__
from .client import SETTLED, ROUTES, _answer, _create_body, _prepare, _Retrying, settled
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


class AsyncClient(_Retrying):
    """Warden's API on one event loop (``httpx.AsyncClient``): every method of
    :class:`~warden_client.Client`, as a coroutine, with the same retries and errors.

    Use it as ``async with AsyncClient(url, key) as warden: ...`` (or call :meth:`aclose`).
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
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        headers = {"accept": "application/json", "user-agent": f"warden-client-python/{__version__}"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self._timeout = timeout
        self.max_attempts = max(1, max_attempts)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._sleep = sleep

    def __repr__(self) -> str:
        # Never the key.
        return f"AsyncClient(base_url={str(self._http.base_url)!r})"

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the one place requests are made ---------------------------------

    async def request(
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

        ``max_attempts`` overrides the client's for this call (1: no retry here).
        """
        method, url, query, headers, content = _prepare(operation, path, params, body, send_body, traceparent)
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method,
                    url,
                    params=query,
                    content=content,
                    headers=headers,
                    timeout=timeout if timeout is not None else self._timeout,
                )
            except httpx.TransportError as error:
                attempt += 1
                await self._sleep(self._retry_after_error(operation, error, attempt, method, url, max_attempts))
                continue
            retry = self._retry_after_status(operation, response, attempt + 1, method, url, max_attempts)
            if retry is not None:
                attempt += 1
                await self._sleep(retry)
                continue
            return _answer(operation, response, ok_empty)

    # -- sessions ---------------------------------------------------------

    async def create_session(
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
            await self.request(
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

    async def get_session(self, session_id: str) -> Session:
        """A session's status, counters and, once ended, its termination record."""
        return cast(Session, await self.request("get_session", path={"id": session_id}))

    async def get_tree(self, session_id: str) -> Tree:
        """A session and all its child sessions, nested, with rolled-up tokens."""
        return cast(Tree, await self.request("get_tree", path={"id": session_id}))

    async def list_sessions(
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
            await self.request(
                "list_sessions",
                params={"status": status, "limit": limit, "cursor": cursor, "root_only": root_only},
            ),
        )

    async def update_session(
        self, session_id: str, *, mode: Mode | None = None, limits: LimitsPatch | None = None
    ) -> Session:
        """Retunes a live session's mode or limits (from its next iteration)."""
        body: dict[str, Any] = {}
        if mode is not None:
            body["mode"] = mode
        if limits is not None:
            body["limits"] = dict(limits)
        return cast(Session, await self.request("update_session", path={"id": session_id}, body=body))

    async def delete_session(self, session_id: str) -> None:
        """Deletes an ended session and its records."""
        await self.request("delete_session", path={"id": session_id})

    async def stop_session(self, session_id: str) -> Session:
        """Stops a session now (``interrupted / user_stop``); idempotent."""
        return cast(Session, await self.request("stop_session", path={"id": session_id}))

    async def confirm_session(self, session_id: str) -> Session:
        """Starts a session ``awaiting_confirmation`` (its estimate was over its ``confirm_if_over``)."""
        return cast(Session, await self.request("confirm_session", path={"id": session_id}))

    async def pause_session(self, session_id: str) -> Session:
        """Pauses a session after the step in flight."""
        return cast(Session, await self.request("pause_session", path={"id": session_id}))

    async def resume_session(
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
            await self.request("resume_session", path={"id": session_id}, body=body or None),
        )

    async def refine_session(
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
        return cast(Session, await self.request("refine_session", path={"id": session_id}, body=body))

    async def list_approvals(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of the calls waiting for a person across the tenant, oldest first."""
        return cast(dict[str, Any], await self.request("list_approvals", params={"limit": limit, "cursor": cursor}))

    async def decide_approval(
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
            await self.request("decide_approval", path={"id": session_id, "call_id": call_id}, body=body),
        )

    async def iterations(
        self, session_id: str, *, after: int | None = None, limit: int | None = None, full: bool | None = None
    ) -> IterationPage:
        """One page of committed iterations after number ``after``."""
        return cast(
            IterationPage,
            await self.request(
                "list_iterations",
                path={"id": session_id},
                params={"after": after, "limit": limit, "full": full},
            ),
        )

    async def events(self, session_id: str, *, after: int | None = None, limit: int | None = None) -> EventPage:
        """One page of the session's log after sequence number ``after``."""
        return cast(
            EventPage,
            await self.request(
                "list_events", path={"id": session_id}, params={"after": after, "limit": limit}
            ),
        )

    # -- keys ---------------------------------------------------------------

    async def create_key(
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
        return cast(CreatedKey, await self.request("create_key", body=body))

    async def list_keys(self) -> list[dict[str, Any]]:
        """Every key (without secrets)."""
        answer = await self.request("list_keys")
        return cast(list[dict[str, Any]], answer.get("items", []))

    async def revoke_key(self, key_id: str) -> None:
        """Revokes a key."""
        await self.request("revoke_key", path={"id": key_id})

    # -- the worker protocol ----------------------------------------------

    async def claim(
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
        answer = await self.request(
            "claim", body=body, timeout=wait_ms / 1000 + self._timeout, ok_empty=(204,)
        )
        return cast(ClaimedTask | None, answer)

    async def heartbeat(
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
            await self.request(
                "heartbeat",
                path={"task_id": task_id},
                body=body,
                traceparent=traceparent,
                timeout=wait_ms / 1000 + (self._timeout if timeout is None else timeout),
                max_attempts=max_attempts,
            ),
        )

    async def complete(
        self, task_id: str, lease_token: str, outcome: Outcome, *, traceparent: str | None = None
    ) -> Accepted:
        """Reports the step's outcome; 409 (WardenError) when the lease was lost."""
        body = {"lease_token": lease_token, "outcome": outcome}
        return cast(
            Accepted, await self.request("complete", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    async def fail(
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
            Accepted, await self.request("fail", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    async def release(
        self, task_id: str, lease_token: str, *, tokens: int | None = None, traceparent: str | None = None
    ) -> Accepted:
        """Gives the task back without counting an attempt (a worker shutting down); ``tokens`` spent."""
        body: dict[str, Any] = {"lease_token": lease_token}
        if tokens is not None:
            body["tokens"] = tokens
        return cast(
            Accepted, await self.request("release", path={"task_id": task_id}, body=body, traceparent=traceparent)
        )

    async def queues(self) -> QueueList:
        """The caller's queues: depth, oldest task age and connected workers."""
        return cast(QueueList, await self.request("list_queues"))

    async def iter_sessions(self, *, status: str | None = None, page_size: int = 50) -> AsyncIterator[Session]:
        """Every session, newest first, following the cursor page by page."""
        cursor: str | None = None
        while True:
            page = await self.list_sessions(status=status, limit=page_size, cursor=cursor)
            for session in page.get("items", []):
                yield session
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def wait_for(
        self,
        session_id: str,
        statuses: tuple[str, ...] = SETTLED,
        *,
        timeout: float = 60.0,
        poll: float = 0.1,
        waiting_for_children: bool = False,
    ) -> Session:
        """Polls until the session's status is one of ``statuses`` (see :meth:`Client.wait_for`)."""
        deadline = time.monotonic() + timeout
        while True:
            session = await self.get_session(session_id)
            if settled(session, statuses, waiting_for_children):
                return session
            if time.monotonic() >= deadline:
                raise TimeoutError(f"session {session_id} still {session.get('status')!r} after {timeout}s")
            await asyncio.sleep(poll)

    async def ready(self) -> bool:
        """Whether the server answers ``/readyz`` with 200 (one try)."""
        try:
            response = await self._http.get(ROUTES["readyz"][1], timeout=5.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200
