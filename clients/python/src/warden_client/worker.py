"""A Warden worker: claim a task, heartbeat while a function works on it, report back."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from ._trace import child_traceparent
from .client import Client, backoff_delay
from .errors import Cancelled, StepError, WardenError, WardenUnavailable
from .types import ApprovalOutcome, ClaimedTask, HistoryItem, Outcome, StepContext

log = logging.getLogger("warden_client.worker")

#: A step function: given the task, answers the step's outcome (a WebhookResponse).
#: An ``async def`` step is run to completion on an event loop of its own, a new
#: one per step; prefer :class:`~warden_client.AsyncWorker`, which keeps one loop
#: and cancels the step's task on a stop.
StepFn = Callable[["Task"], Outcome | dict[str, Any] | Awaitable[Outcome | dict[str, Any]]]

_PROGRESS_MAX_BYTES = 4096

#: Seconds between heartbeats by default: a stop reaches the step within about
#: this plus a round trip, well inside the one second a stop is promised in.
DEFAULT_HEARTBEAT_INTERVAL = 0.25


class Task:
    """One claimed step, as the user's function sees it.

    ``context`` is exactly what a webhook agent is sent (goal, iteration,
    guidance, nudge, token allowance, history, …). Cancellation arrives from
    the background heartbeat: ``cancelled`` turns true, ``cancel_event`` is
    set, and the next :meth:`check_cancelled` or :meth:`report_progress`
    raises :class:`Cancelled`.
    """

    def __init__(self, claimed: ClaimedTask) -> None:
        self.raw = claimed
        self.task_id: str = claimed["task_id"]
        self.lease_token: str = claimed["lease_token"]
        self.session_id: str = claimed["session_id"]
        self.queue: str = claimed.get("queue", "")
        self.labels: dict[str, str] = dict(claimed.get("labels") or {})
        self.iteration: int = int(claimed.get("iteration", 0))
        self.attempt: int = int(claimed.get("attempt", 1))
        self.idempotency_key: str = claimed.get("idempotency_key", "")
        self.heartbeat_timeout_ms: int = int(claimed.get("heartbeat_timeout_ms", 30000))
        self.context: StepContext = claimed.get("context") or {}
        self.cancel_event = threading.Event()
        self.cancel_reason: str | None = None
        #: When the cancellation was learnt (``time.monotonic()``), for measuring stop latency.
        self.cancelled_at: float | None = None
        self._token_allowance: int | None = self.context.get("token_allowance")
        self._progress: str | None = None
        self._lock = threading.Lock()
        self._worker_traceparent = child_traceparent(self.context.get("traceparent"))

    def __repr__(self) -> str:
        # Never the lease token.
        return f"Task(task_id={self.task_id!r}, session_id={self.session_id!r}, iteration={self.iteration})"

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context of the step (``context.traceparent``), when Warden exports traces.

        Start your own spans under it to see the step whole in one trace; the worker's calls
        send :attr:`worker_traceparent`, a span of its own under it.
        """
        return self.context.get("traceparent") or None

    @property
    def worker_traceparent(self) -> str | None:
        """The ``traceparent`` header of the worker's heartbeat, complete, fail and release calls.

        It continues the step's trace (:attr:`traceparent`): the same trace id and flags, and a
        span id of its own (the worker's span of the step, a child of the step's), so the server
        spans of those calls join the step's trace. ``None`` when the step has no valid one.
        """
        return self._worker_traceparent

    @property
    def goal(self) -> str:
        """The session's goal."""
        return self.context.get("goal", "")

    @property
    def history(self) -> list[HistoryItem]:
        """The session's recent steps, oldest first."""
        return list(self.context.get("history") or [])

    @property
    def guidance(self) -> str | None:
        """Guidance from the user, delivered once."""
        return self.context.get("guidance")

    @property
    def nudge(self) -> str | None:
        """A supervisor's note (stuck nudge, reviewer feedback), delivered once."""
        return self.context.get("nudge")

    @property
    def approval(self) -> ApprovalOutcome | None:
        """The decision on the action the previous step asked approval for: do it only when ``decision`` is ``approve``."""
        return self.context.get("approval")

    @property
    def token_allowance(self) -> int | None:
        """Most tokens the step may still use (updated by each heartbeat)."""
        with self._lock:
            return self._token_allowance

    @property
    def cancelled(self) -> bool:
        """Whether the step was cancelled (stop, pause, lease lost or shutdown)."""
        return self.cancel_event.is_set()

    def check_cancelled(self) -> None:
        """Raises :class:`Cancelled` when the step was cancelled; call it between units of work."""
        if self.cancel_event.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")

    def report_progress(self, text: str) -> None:
        """Sends ``text`` with the next heartbeat (at most 4,096 characters); raises :class:`Cancelled` when cancelled."""
        self.check_cancelled()
        encoded = text.encode("utf-8")[:_PROGRESS_MAX_BYTES]
        with self._lock:
            self._progress = encoded.decode("utf-8", errors="ignore")

    def cancel(self, reason: str) -> None:
        """Marks the step cancelled (the first reason sticks)."""
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
                self.cancelled_at = time.monotonic()
        self.cancel_event.set()

    def _take_progress(self) -> str | None:
        with self._lock:
            progress, self._progress = self._progress, None
            return progress

    def _set_allowance(self, allowance: int | None) -> None:
        if allowance is not None:
            with self._lock:
                self._token_allowance = allowance


class Worker:
    """Runs ``step`` for each task claimed from ``queues`` until shut down.

    For each task a background thread heartbeats every
    ``heartbeat_fraction`` of the task's ``heartbeat_timeout_ms`` (at most
    ``max_heartbeat_interval`` seconds apart, 0.25 by default); when Warden
    answers ``cancel: true`` the task is cancelled and heartbeats stop: a
    thread cannot be interrupted, so the step's next
    :meth:`Task.check_cancelled` or :meth:`Task.report_progress` raises
    :class:`~warden_client.Cancelled` (the documented way a sync step learns
    of a stop; call one between units of work). The task's
    Every call about a task continues its trace: its ``traceparent`` header
    (:attr:`Task.worker_traceparent`) has the trace id of the task's
    ``context.traceparent`` and a span id of the worker's own. The step's
    outcome is completed, an exception is reported with ``fail``, a
    :class:`Cancelled` step reports nothing (Warden already moved on), and a
    409 on complete (the lease was lost) is logged and the worker goes on.
    SIGTERM or SIGINT (when :meth:`run` installs handlers) stops claiming,
    gives the task in flight ``grace_period`` seconds to finish, then
    releases it; a second signal releases at once.
    """

    def __init__(
        self,
        client: Client,
        step: StepFn,
        *,
        queues: list[str] | None = None,
        name: str | None = None,
        wait_ms: int = 20000,
        heartbeat_fraction: float = 1 / 3,
        max_heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
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
        self.grace_period = grace_period
        self.idle_backoff_cap = idle_backoff_cap
        self._shutdown = threading.Event()
        self._hurry = threading.Event()
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
        """Asks the worker to stop after the task in flight (``hurry``: release it now)."""
        if self._shutdown.is_set() or hurry:
            self._hurry.set()
        self._shutdown.set()

    @property
    def shutting_down(self) -> bool:
        """Whether shutdown was asked for."""
        return self._shutdown.is_set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("worker %s: %s received, shutting down", self.name, signal.Signals(signum).name)
        self.shutdown()

    def run(self, install_signal_handlers: bool = True) -> None:
        """Claims and runs tasks until :meth:`shutdown` (or SIGTERM/SIGINT)."""
        previous: dict[int, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            failures = 0
            while not self._shutdown.is_set():
                try:
                    self.run_once()
                    failures = 0
                except (WardenUnavailable, WardenError) as error:
                    # The claim loop never gives up; each request inside it is bounded.
                    delay = backoff_delay(failures, 0.5, self.idle_backoff_cap)
                    failures += 1
                    log.warning("worker %s: claim failed (%s); next try in %.1fs", self.name, error, delay)
                    self._shutdown.wait(delay)
        finally:
            for restored, handler in previous.items():
                signal.signal(restored, handler)
        log.info("worker %s: stopped", self.name)

    def run_once(self) -> bool:
        """Claims one task (waiting up to ``wait_ms``) and runs it; answers whether a task ran."""
        claimed = self.client.claim(queues=self.queues, wait_ms=self.wait_ms, worker=self.name)
        if claimed is None:
            return False
        task = Task(claimed)
        self.stats["claimed"] += 1
        if self._shutdown.is_set():
            self._release(task)
            return True
        self._run_task(task)
        return True

    # -- one task ---------------------------------------------------------

    def _run_task(self, task: Task) -> None:
        self.current = task
        log.info(
            "worker %s: task %s (session %s, iteration %d, attempt %d)",
            self.name, task.task_id, task.session_id, task.iteration, task.attempt,
        )
        result: dict[str, Any] = {}
        done = threading.Event()

        def call_step() -> None:
            try:
                answer = self.step(task)
                if inspect.isawaitable(answer):
                    answer = asyncio.run(_awaited(answer))
                result["outcome"] = answer
            except BaseException as error:  # reported to Warden, never lost
                result["error"] = error
                result["traceback"] = traceback.format_exc()
            finally:
                done.set()

        stop_heartbeat = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat_loop, args=(task, stop_heartbeat), name="warden-heartbeat", daemon=True
        )
        runner = threading.Thread(target=call_step, name="warden-step", daemon=True)
        beat.start()
        runner.start()
        try:
            released = self._wait_for_step(task, done)
        finally:
            stop_heartbeat.set()
            beat.join(timeout=5)
            self.current = None
        if released:
            return
        self._report(task, result)

    def _wait_for_step(self, task: Task, done: threading.Event) -> bool:
        """Waits for the step; on shutdown, gives it the grace period, then releases. Answers whether released."""
        grace_deadline: float | None = None
        cancelled_at: float | None = None
        while not done.wait(0.05):
            now = time.monotonic()
            if self._shutdown.is_set() and grace_deadline is None:
                grace_deadline = now + self.grace_period
                log.info("worker %s: shutting down; task %s has %.0fs to finish", self.name, task.task_id, self.grace_period)
            if grace_deadline is not None and (now >= grace_deadline or self._hurry.is_set()):
                task.cancel("shutdown")
                self._release(task)
                return True
            if task.cancelled and cancelled_at is None:
                cancelled_at = now
            if cancelled_at is not None and now - cancelled_at >= self.grace_period:
                # The step ignores its cancellation; leave its thread and go on.
                log.warning(
                    "worker %s: task %s was cancelled %.0fs ago and its step has not returned; abandoning it",
                    self.name, task.task_id, self.grace_period,
                )
                self.stats["cancelled"] += 1
                return True
        return False

    def _report(self, task: Task, result: dict[str, Any]) -> None:
        error = result.get("error")
        if isinstance(error, Cancelled) or (error is None and task.cancelled):
            # Warden stopped, paused or re-offered the step: nothing to report.
            self.stats["cancelled"] += 1
            log.info("worker %s: task %s cancelled (%s)", self.name, task.task_id, task.cancel_reason)
            return
        try:
            if error is not None:
                retryable = not (isinstance(error, StepError) and not error.retryable)
                message = f"{type(error).__name__}: {error}\n{result.get('traceback', '')}"[-4000:]
                self.client.fail(
                    task.task_id, task.lease_token, message, retryable=retryable, traceparent=task.worker_traceparent
                )
                self.stats["failed"] += 1
                log.warning("worker %s: task %s failed: %s", self.name, task.task_id, error)
                return
            outcome = result.get("outcome")
            if not isinstance(outcome, dict) or not isinstance(outcome.get("action"), str):
                self.client.fail(
                    task.task_id,
                    task.lease_token,
                    f"the step answered {type(outcome).__name__}, not an outcome with an action",
                    retryable=False,
                    traceparent=task.worker_traceparent,
                )
                self.stats["failed"] += 1
                return
            self.client.complete(task.task_id, task.lease_token, outcome, traceparent=task.worker_traceparent)  # type: ignore[arg-type]
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

    def _release(self, task: Task) -> None:
        try:
            self.client.release(task.task_id, task.lease_token, traceparent=task.worker_traceparent)
            self.stats["released"] += 1
            log.info("worker %s: released task %s", self.name, task.task_id)
        except WardenError as problem:
            log.warning("worker %s: release of task %s refused: %s", self.name, task.task_id, problem)
        except WardenUnavailable as unreachable:
            log.warning("worker %s: release of task %s failed: %s", self.name, task.task_id, unreachable)

    def heartbeat_interval(self, task: Task) -> float:
        """Seconds between heartbeats for ``task``."""
        return max(0.05, min(self.max_heartbeat_interval, task.heartbeat_timeout_ms / 1000 * self.heartbeat_fraction))

    def _heartbeat_loop(self, task: Task, stop: threading.Event) -> None:
        interval = self.heartbeat_interval(task)
        while not stop.wait(interval):
            try:
                answer = self.client.heartbeat(
                    task.task_id, task.lease_token, task._take_progress(), traceparent=task.worker_traceparent
                )
            except WardenError as problem:
                if problem.status in (404, 409):
                    log.warning("worker %s: task %s: lease lost (%d)", self.name, task.task_id, problem.status)
                    task.cancel("lease_lost")
                    return
                log.warning("worker %s: heartbeat of task %s refused: %s", self.name, task.task_id, problem)
                continue
            except WardenUnavailable as unreachable:
                # Keep trying while the lease may still hold.
                log.warning("worker %s: heartbeat of task %s failed: %s", self.name, task.task_id, unreachable)
                continue
            task._set_allowance(answer.get("token_allowance"))
            if answer.get("cancel"):
                reason = answer.get("reason") or "cancelled"
                log.info("worker %s: task %s cancelled by Warden (%s)", self.name, task.task_id, reason)
                task.cancel(reason)
                return


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer
