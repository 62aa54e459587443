"""The asynchronous worker, :class:`AsyncWorker`: each step is a task on one event loop,
and a stop cancels it, so ``asyncio.CancelledError`` is raised inside the step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from .aio import AsyncClient
from .client import backoff_delay
from .errors import Cancelled, StepError, WardenError, WardenUnavailable
from .types import Outcome
from .worker import _BEAT_ERRORS, DEFAULT_HEARTBEAT_INTERVAL, Task, _beat_slack, _Heartbeats, _Lease

log = logging.getLogger("warden_client.worker")

#: An async step: given the task, answers the step's outcome (a WebhookResponse).
AsyncStepFn = Callable[[Task], Awaitable[Outcome | dict[str, Any]]]


class AsyncWorker(_Heartbeats):
    """Runs the coroutine ``step(task)`` for each task claimed from ``queues`` until shut down.

    Everything runs on the caller's event loop, so clients (model SDKs, HTTP
    pools) made once are reused across steps. Each step runs as an
    :class:`asyncio.Task`; beside it one waiting heartbeat is kept in flight
    (``wait_ms``: ``heartbeat_fraction`` of the task's lease, at most 0.4 of it
    and 30 s), which Warden answers the moment the step is stopped, paused,
    drained or its lease lost, and progress text goes at once on a heartbeat
    of its own that does not wait (at most one per ``progress_interval``).
    With ``wait_heartbeats=False``, or once a server older than ``wait_ms``
    refused the field (422), a heartbeat every ``max_heartbeat_interval``
    seconds instead (default 0.25, at most ``heartbeat_fraction`` of the
    lease). A failed heartbeat is tried again with a backoff until the lease
    has surely lapsed, then the step is cancelled as ``lease_lost``.
    When Warden answers ``cancel: true`` (stopped, paused, superseded, lease
    lost) the step's task is cancelled: ``asyncio.CancelledError`` is raised at
    the ``await`` the step is in, ``task.cancel_reason`` says why, and nothing
    is reported (Warden already moved on). Let the error propagate; ``finally``
    blocks and ``async with`` exits run as usual. A step that swallows it and
    is still running ``grace_period`` seconds later is abandoned.

    The outcome is completed; an exception is reported with ``fail``
    (:class:`~warden_client.StepError` with ``retryable=False`` for a permanent
    error); a 409 on complete (the lease was lost) is logged and the worker
    goes on. SIGTERM or SIGINT (when :meth:`run` installs handlers) stops
    claiming, gives the step in flight ``grace_period`` seconds, then cancels
    it and releases the task; a second signal does so at once.
    """

    def __init__(
        self,
        client: AsyncClient,
        step: AsyncStepFn,
        *,
        queues: list[str] | None = None,
        name: str | None = None,
        wait_ms: int = 20000,
        heartbeat_fraction: float = 1 / 3,
        max_heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        wait_heartbeats: bool = True,
        progress_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        grace_period: float = 25.0,
        idle_backoff_cap: float = 30.0,
    ) -> None:
        self.client = client
        self.step = step
        self.queues = queues
        self.name = name or f"{socket.gethostname()}/pid-{os.getpid()}"
        self.wait_ms = wait_ms
        self.heartbeat_fraction = heartbeat_fraction
        self.max_heartbeat_interval = max_heartbeat_interval
        #: Keep one waiting heartbeat in flight; set to False by itself when Warden refuses ``wait_ms``.
        self.wait_heartbeats = wait_heartbeats
        self.progress_interval = progress_interval
        self.grace_period = grace_period
        self.idle_backoff_cap = idle_backoff_cap
        self._shutdown = asyncio.Event()
        self._hurry = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.current: Task | None = None
        #: Counters, for tests and logs.
        self.stats: dict[str, int] = {
            "claimed": 0,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
            "released": 0,
            "lease_lost": 0,
        }

    # -- lifecycle --------------------------------------------------------

    def shutdown(self, hurry: bool = False) -> None:
        """Asks the worker to stop after the step in flight (``hurry``: cancel and release it now).

        Safe to call from another thread or a signal handler.
        """
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop and not loop.is_closed():
            loop.call_soon_threadsafe(self._set_shutdown, hurry)
        else:
            self._set_shutdown(hurry)

    def _set_shutdown(self, hurry: bool) -> None:
        if self._shutdown.is_set() or hurry:
            self._hurry.set()
        self._shutdown.set()

    @property
    def shutting_down(self) -> bool:
        """Whether shutdown was asked for."""
        return self._shutdown.is_set()

    def _on_signal(self, signum: signal.Signals) -> None:
        log.info("worker %s: %s received, shutting down", self.name, signal.Signals(signum).name)
        self._set_shutdown(False)

    async def run(self, install_signal_handlers: bool = True) -> None:
        """Claims and runs tasks until :meth:`shutdown` (or SIGTERM/SIGINT)."""
        self._loop = loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signum)
                installed.append(signum)
        try:
            failures = 0
            while not self._shutdown.is_set():
                try:
                    await self.run_once()
                    failures = 0
                except (WardenUnavailable, WardenError) as error:
                    # The claim loop never gives up; each request inside it is bounded.
                    delay = backoff_delay(failures, 0.5, self.idle_backoff_cap)
                    failures += 1
                    log.warning("worker %s: claim failed (%s); next try in %.1fs", self.name, error, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._shutdown.wait(), delay)
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
        log.info("worker %s: stopped", self.name)

    async def run_once(self) -> bool:
        """Claims one task (waiting up to ``wait_ms``) and runs it; answers whether a task ran."""
        claimed = await self.client.claim(queues=self.queues, wait_ms=self.wait_ms, worker=self.name)
        if claimed is None:
            return False
        task = Task(claimed)
        self.stats["claimed"] += 1
        if self._shutdown.is_set():
            await self._release(task)
            return True
        await self._run_task(task)
        return True

    # -- one task ---------------------------------------------------------

    async def _run_task(self, task: Task) -> None:
        self.current = task
        log.info(
            "worker %s: task %s (session %s, iteration %d, attempt %d)",
            self.name, task.task_id, task.session_id, task.iteration, task.attempt,
        )
        step = asyncio.create_task(self._call_step(task), name=f"warden-step-{task.task_id}")
        abandoned = asyncio.Event()
        helpers = self._start_heartbeats(task, step, abandoned)
        try:
            settled = await self._wait_for_step(task, step, abandoned)
        except asyncio.CancelledError:
            # The worker itself was cancelled: cancel the step and give the task back.
            task.cancel("shutdown")
            step.cancel("shutdown")
            await asyncio.shield(self._release(task))
            raise
        finally:
            # Cancelling a waiting heartbeat closes its connection; Warden ends the wait.
            task._on_progress = None
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            self.current = None
        if not settled:
            await self._report(task, step)

    def _start_heartbeats(
        self, task: Task, step: asyncio.Task[Any], abandoned: asyncio.Event
    ) -> list[asyncio.Task[None]]:
        """Starts the task's heartbeat, and with waiting heartbeats the sender of its progress."""
        lease = self._lease_of(task)
        helpers = [
            asyncio.create_task(
                self._heartbeat_loop(task, lease, step, abandoned), name=f"warden-heartbeat-{task.task_id}"
            )
        ]
        if self.wait_heartbeats:
            loop = asyncio.get_running_loop()
            ready = asyncio.Event()

            def notify() -> None:
                # Progress may be reported from another thread (a step's executor).
                with contextlib.suppress(RuntimeError):  # the loop has closed
                    loop.call_soon_threadsafe(ready.set)

            task._on_progress = notify
            helpers.append(
                asyncio.create_task(
                    self._progress_loop(task, lease, step, abandoned, ready), name=f"warden-progress-{task.task_id}"
                )
            )
        return helpers

    async def _call_step(self, task: Task) -> Outcome | dict[str, Any]:
        return await self.step(task)

    async def _wait_for_step(self, task: Task, step: asyncio.Task[Any], abandoned: asyncio.Event) -> bool:
        """Waits for the step; answers True when it was settled here (released or abandoned), so nothing is reported."""
        shutdown = asyncio.create_task(self._shutdown.wait())
        given_up = asyncio.create_task(abandoned.wait())
        try:
            await asyncio.wait({step, shutdown, given_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            shutdown.cancel()
            given_up.cancel()
        if step.done():
            return False
        if abandoned.is_set():
            return True
        log.info("worker %s: shutting down; task %s has %.0fs to finish", self.name, task.task_id, self.grace_period)
        hurry = asyncio.create_task(self._hurry.wait())
        try:
            await asyncio.wait({step, hurry}, timeout=self.grace_period, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()
        if step.done():
            return False
        task.cancel("shutdown")
        step.cancel("shutdown")
        await asyncio.wait({step}, timeout=self.grace_period)
        await self._release(task)
        return True

    async def _heartbeat_loop(
        self, task: Task, lease: _Lease, step: asyncio.Task[Any], abandoned: asyncio.Event
    ) -> None:
        """Heartbeats ``task`` until it is cancelled here (the step ended) or Warden says to abandon it."""
        delay = self._first_delay(task)
        while True:
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at = time.monotonic()
            wait_ms, slack = self._beat_plan(task, lease, sent_at)
            progress = task._take_progress()
            try:
                answer = await self.client.heartbeat(
                    task.task_id,
                    task.lease_token,
                    progress,
                    traceparent=task.worker_traceparent,
                    wait_ms=wait_ms,
                    timeout=slack,
                    max_attempts=1,
                )
            except _BEAT_ERRORS as error:
                task._restore_progress(progress)
                reason, delay = self._after_failure(task, lease, wait_ms, error, time.monotonic())
            else:
                reason = self._heard(task, lease, answer, time.monotonic())
                delay = self._next_delay(task, sent_at, time.monotonic())
            if task.cancelled:
                return  # cancelled elsewhere (a progress heartbeat, shutdown): handled there
            if reason is not None:
                await self._cancel_step(task, step, reason, abandoned)
                return

    async def _progress_loop(
        self, task: Task, lease: _Lease, step: asyncio.Task[Any], abandoned: asyncio.Event, ready: asyncio.Event
    ) -> None:
        """Sends progress as it is reported, on heartbeats that do not wait, while a waiting one is in flight."""
        sent_at = -math.inf
        while not task.cancelled:
            await ready.wait()
            ready.clear()
            pause = sent_at + self.progress_interval - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            progress = task._take_progress()
            if progress is None:
                continue
            sent_at = time.monotonic()
            try:
                answer = await self.client.heartbeat(
                    task.task_id,
                    task.lease_token,
                    progress,
                    traceparent=task.worker_traceparent,
                    timeout=_beat_slack(lease.length),
                    max_attempts=1,
                )
            except _BEAT_ERRORS as error:
                # It goes with the next heartbeat instead.
                task._restore_progress(progress)
                reason, _ = self._after_failure(task, lease, 0, error, time.monotonic())
            else:
                reason = self._heard(task, lease, answer, time.monotonic())
            if reason is not None and not task.cancelled:
                await self._cancel_step(task, step, reason, abandoned)
                return

    async def _cancel_step(self, task: Task, step: asyncio.Task[Any], reason: str, abandoned: asyncio.Event) -> None:
        """Cancels the step's task (CancelledError inside it); abandons it after ``grace_period`` if it goes on."""
        task.cancel(reason)
        step.cancel(reason)
        done, _ = await asyncio.wait({step}, timeout=self.grace_period)
        if not done:
            log.warning(
                "worker %s: task %s was cancelled %.0fs ago and its step has not returned; abandoning it",
                self.name, task.task_id, self.grace_period,
            )
            self.stats["cancelled"] += 1
            # Unblocks _wait_for_step: the step is settled, nothing is reported.
            abandoned.set()

    async def _report(self, task: Task, step: asyncio.Task[Any]) -> None:
        error = None if step.cancelled() else step.exception()
        if task.cancelled or isinstance(error, Cancelled):
            # Warden stopped, paused or re-offered the step: nothing to report.
            self.stats["cancelled"] += 1
            log.info("worker %s: task %s cancelled (%s)", self.name, task.task_id, task.cancel_reason)
            return
        if step.cancelled():
            error = StepError("the step was cancelled by itself")
        try:
            if error is not None:
                retryable = not (isinstance(error, StepError) and not error.retryable)
                trace = "".join(traceback.format_exception(error))
                message = f"{type(error).__name__}: {error}\n{trace}"[-4000:]
                await self.client.fail(
                    task.task_id, task.lease_token, message, retryable=retryable, traceparent=task.worker_traceparent
                )
                self.stats["failed"] += 1
                log.warning("worker %s: task %s failed: %s", self.name, task.task_id, error)
                return
            outcome = step.result()
            if not isinstance(outcome, dict) or not isinstance(outcome.get("action"), str):
                await self.client.fail(
                    task.task_id,
                    task.lease_token,
                    f"the step answered {type(outcome).__name__}, not an outcome with an action",
                    retryable=False,
                    traceparent=task.worker_traceparent,
                )
                self.stats["failed"] += 1
                return
            await self.client.complete(task.task_id, task.lease_token, outcome, traceparent=task.worker_traceparent)  # type: ignore[arg-type]
            self.stats["completed"] += 1
        except WardenError as problem:
            if problem.status == 409:
                self.stats["lease_lost"] += 1
                log.warning(
                    "worker %s: task %s: the lease was lost (%s); the outcome is discarded",
                    self.name, task.task_id, problem.detail,
                )
                return
            log.error("worker %s: task %s: reporting failed: %s", self.name, task.task_id, problem)
        except WardenUnavailable as unreachable:
            # The lease will lapse and Warden re-offers the task.
            log.error("worker %s: task %s: could not report: %s", self.name, task.task_id, unreachable)

    async def _release(self, task: Task) -> None:
        try:
            await self.client.release(task.task_id, task.lease_token, traceparent=task.worker_traceparent)
            self.stats["released"] += 1
            log.info("worker %s: released task %s", self.name, task.task_id)
        except WardenError as problem:
            log.warning("worker %s: release of task %s refused: %s", self.name, task.task_id, problem)
        except WardenUnavailable as unreachable:
            log.warning("worker %s: release of task %s failed: %s", self.name, task.task_id, unreachable)
