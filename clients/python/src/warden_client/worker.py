"""A Warden worker: claim a task, heartbeat while a function works on it, report back."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import httpx

from ._trace import child_traceparent
from .client import Client, backoff_delay
from .errors import Cancelled, StepError, WardenError, WardenUnavailable
from .types import ApprovalOutcome, ClaimedTask, HeartbeatAnswer, HistoryItem, Outcome, StepContext

log = logging.getLogger("warden_client.worker")

#: A step function: given the task, answers the step's outcome (a WebhookResponse).
#: An ``async def`` step is run to completion on an event loop of its own, a new
#: one per step; prefer :class:`~warden_client.AsyncWorker`, which keeps one loop
#: and cancels the step's task on a stop.
StepFn = Callable[["Task"], Outcome | dict[str, Any] | Awaitable[Outcome | dict[str, Any]]]

_PROGRESS_MAX_BYTES = 4096

#: Seconds between heartbeats that do not wait (``wait_heartbeats=False``, a server
#: that does not take ``wait_ms``, or while Warden refuses a waiting one): a stop
#: reaches the step within about this plus a round trip. Also the shortest time
#: between two heartbeats of a task, and between two progress messages.
DEFAULT_HEARTBEAT_INTERVAL = 0.25

#: Longest wait Warden allows a heartbeat, ms.
MAX_HEARTBEAT_WAIT_MS = 30_000

#: The largest share of its lease a heartbeat waits: Warden waits at most half
#: the lease left, and the lease must outlast a wait by a retry or two.
_MAX_WAIT_FRACTION = 0.4

#: Longest wait for the helper threads of a finished task, seconds: the report
#: ends a waiting heartbeat (Warden answers it when its task ends); one that goes
#: on is left to end by itself, its answer unread.
_JOIN_SECONDS = 1.0

#: What a server older than a heartbeat's ``wait_ms`` answers it (422, ``invalid_request``):
#: request bodies reject unknown fields.
_OLDER_THAN_WAIT_MS = "unknown field `wait_ms`"

#: What a failed heartbeat raises: answered with an error, unreachable, or
#: answered with something that is not JSON (a proxy's page).
_BEAT_ERRORS = (WardenError, WardenUnavailable, httpx.HTTPError, ValueError)


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
        #: When the claim's answer arrived (``time.monotonic()``): the lease runs from before it.
        self.claimed_at: float = time.monotonic()
        #: Called (from the step's thread) when progress is reported: the worker sends it at once.
        self._on_progress: Callable[[], None] | None = None
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
        """Sends ``text`` to Warden (at most 4,096 characters); raises :class:`Cancelled` when cancelled.

        With waiting heartbeats it goes at once on a heartbeat of its own that does not
        wait (at most one per ``progress_interval``; the latest text wins), else with the
        next heartbeat.
        """
        self.check_cancelled()
        encoded = text.encode("utf-8")[:_PROGRESS_MAX_BYTES]
        with self._lock:
            self._progress = encoded.decode("utf-8", errors="ignore")
            notify = self._on_progress
        if notify is not None:
            notify()

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

    def _restore_progress(self, progress: str | None) -> None:
        """Puts back text a failed heartbeat did not deliver, unless newer text was reported since."""
        with self._lock:
            if self._progress is None:
                self._progress = progress

    def _set_allowance(self, allowance: int | None) -> None:
        if allowance is not None:
            with self._lock:
                self._token_allowance = allowance


class _Lease:
    """What a worker knows of one task's lease, on the ``time.monotonic()`` clock."""

    def __init__(self, length: float, since: float) -> None:
        #: The lease's length, seconds (the task's ``heartbeat_timeout_ms``).
        self.length = length
        #: By then the lease has lapsed unless a heartbeat renewed it: Warden extends it
        #: when it takes a heartbeat, before its answer arrives here.
        self.lapses_at = since + length
        #: Heartbeats that failed in a row.
        self.failures = 0
        #: No waiting heartbeat before this: Warden refused one (429/503) and said when to try again.
        self.no_wait_until = 0.0

    def renewed(self, now: float) -> None:
        """A heartbeat was answered at ``now``: the lease runs a whole length from before then."""
        self.lapses_at = now + self.length
        self.failures = 0


class _Heartbeats:
    """How :class:`Worker` and ``AsyncWorker`` heartbeat a task: the decisions, not the calls.

    With ``wait_heartbeats`` (the default) one heartbeat is kept in flight, each asking
    Warden to wait (``wait_ms``, :meth:`heartbeat_wait_ms`) and sent again as it answers,
    so a stop is heard within a round trip. Otherwise (or after Warden refused
    ``wait_ms``: a server older than it answers 422 naming the field) a heartbeat every
    :meth:`heartbeat_interval`. A failed heartbeat is tried again after a backoff, with a
    heartbeat that does not wait, until the lease has surely lapsed; then the step is
    abandoned as ``lease_lost`` (Warden re-offers it). Nothing is retried for ever.
    """

    name: str
    heartbeat_fraction: float
    max_heartbeat_interval: float
    wait_heartbeats: bool
    progress_interval: float

    def heartbeat_interval(self, task: Task) -> float:
        """Seconds between heartbeats that do not wait for ``task``: also the least time between two."""
        return max(0.05, min(self.max_heartbeat_interval, task.heartbeat_timeout_ms / 1000 * self.heartbeat_fraction))

    def heartbeat_wait_ms(self, task: Task) -> int:
        """How long a waiting heartbeat of ``task`` waits, ms: ``heartbeat_fraction`` of the lease
        (at most 0.4 of it, under the half Warden allows), at most 30,000."""
        fraction = min(max(self.heartbeat_fraction, 0.0), _MAX_WAIT_FRACTION)
        return min(MAX_HEARTBEAT_WAIT_MS, int(task.heartbeat_timeout_ms * fraction))

    def _lease_of(self, task: Task) -> _Lease:
        return _Lease(task.heartbeat_timeout_ms / 1000, task.claimed_at)

    def _first_delay(self, task: Task) -> float:
        """Seconds from the start of the step to its first heartbeat: a waiting one goes at once."""
        return 0.0 if self.wait_heartbeats and self.heartbeat_wait_ms(task) > 0 else self.heartbeat_interval(task)

    def _beat_plan(self, task: Task, lease: _Lease, now: float) -> tuple[int, float]:
        """The next heartbeat's ``wait_ms`` (0 after a failure or a refused wait) and its timeout beyond the wait."""
        waits = self.wait_heartbeats and lease.failures == 0 and now >= lease.no_wait_until
        return (self.heartbeat_wait_ms(task) if waits else 0), _beat_slack(lease.length)

    def _next_delay(self, task: Task, sent_at: float, now: float) -> float:
        """Seconds from a heartbeat's answer to the next: none once a whole interval passed since
        it was sent (a wait that ended), else the rest of the interval, so a heartbeat answered at
        once (a drain answers every one at once) is not sent again at once."""
        return max(0.0, sent_at + self.heartbeat_interval(task) - now)

    def _heard(self, task: Task, lease: _Lease, answer: HeartbeatAnswer, now: float) -> str | None:
        """Takes a heartbeat's answer (the lease renewed, the allowance); answers why to abandon the step, if so."""
        lease.renewed(now)
        task._set_allowance(answer.get("token_allowance"))
        if not answer.get("cancel"):
            return None
        reason = answer.get("reason") or "cancelled"
        log.info("worker %s: task %s cancelled by Warden (%s)", self.name, task.task_id, reason)
        return reason

    def _after_failure(
        self, task: Task, lease: _Lease, wait_ms: int, error: Exception, now: float
    ) -> tuple[str | None, float]:
        """After a failed heartbeat: why to abandon the step (None: go on), and seconds before the next try."""
        status = getattr(error, "status", None)
        if isinstance(error, WardenError) and status in (404, 409):
            log.warning("worker %s: task %s: lease lost (%d)", self.name, task.task_id, status)
            return "lease_lost", 0.0
        if wait_ms and isinstance(error, WardenError) and status == 422 and _OLDER_THAN_WAIT_MS in error.detail:
            log.warning(
                "worker %s: Warden does not take a heartbeat's wait_ms (%s); heartbeating every %.2fs instead",
                self.name, error.detail, self.heartbeat_interval(task),
            )
            self.wait_heartbeats = False
            return None, 0.0
        lease.failures += 1
        refused_for = getattr(error, "retry_after", None)
        if wait_ms and refused_for is not None:
            # No place for a waiting heartbeat (429/503): beat without waiting until then.
            lease.no_wait_until = now + min(refused_for, lease.length)
        left = lease.lapses_at - now
        if left <= 0:
            log.warning(
                "worker %s: task %s: no heartbeat reached Warden within the lease (%s); abandoning the step",
                self.name, task.task_id, error,
            )
            return "lease_lost", 0.0
        base = self.heartbeat_interval(task)
        delay = min(left, backoff_delay(lease.failures - 1, base, max(base, min(5.0, lease.length / 6))))
        log.warning(
            "worker %s: heartbeat of task %s failed (%s); next try in %.2fs",
            self.name, task.task_id, error, delay,
        )
        return None, delay


def _beat_slack(lease_length: float) -> float:
    """Seconds a heartbeat may take beyond its wait: long enough for a loaded server,
    short enough that a hung connection is given up well inside the lease."""
    return min(10.0, max(1.0, lease_length / 6))


class Worker(_Heartbeats):
    """Runs ``step`` for each task claimed from ``queues`` until shut down.

    For each task a background thread keeps one waiting heartbeat in flight
    (``wait_ms``: ``heartbeat_fraction`` of the task's ``heartbeat_timeout_ms``,
    at most 0.4 of it and 30 s), so Warden answers it the moment the step is
    stopped, paused, drained or its lease lost; progress text goes at once on
    a heartbeat of its own that does not wait (at most one per
    ``progress_interval`` seconds). With ``wait_heartbeats=False``, or once a
    server older than ``wait_ms`` refused the field (422), it heartbeats every
    ``heartbeat_fraction`` of the lease instead, at most
    ``max_heartbeat_interval`` seconds apart (0.25 by default), progress
    going with the next heartbeat. A failed heartbeat is tried again with a
    backoff until the lease has surely lapsed, then the step is cancelled as
    ``lease_lost``. When Warden answers ``cancel: true`` the task is
    cancelled and heartbeats stop: a thread cannot be interrupted, so the
    step's next :meth:`Task.check_cancelled` or :meth:`Task.report_progress`
    raises :class:`~warden_client.Cancelled` (the documented way a sync step
    learns of a stop; call one between units of work).
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

        stop = threading.Event()
        progress_ready = threading.Event()
        task._on_progress = progress_ready.set
        lease = self._lease_of(task)
        helpers = [
            threading.Thread(
                target=self._heartbeat_loop, args=(task, lease, stop), name="warden-heartbeat", daemon=True
            )
        ]
        if self.wait_heartbeats:
            helpers.append(
                threading.Thread(
                    target=self._progress_loop,
                    args=(task, lease, stop, progress_ready),
                    name="warden-progress",
                    daemon=True,
                )
            )
        runner = threading.Thread(target=call_step, name="warden-step", daemon=True)
        for helper in helpers:
            helper.start()
        runner.start()
        try:
            released = self._wait_for_step(task, done)
        finally:
            stop.set()
            progress_ready.set()
            self.current = None
        if not released:
            self._report(task, result)
        # The report (or release) ends a waiting heartbeat: Warden answers it when the task ends.
        deadline = time.monotonic() + _JOIN_SECONDS
        for helper in helpers:
            helper.join(timeout=max(0.0, deadline - time.monotonic()))

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

    def _heartbeat_loop(self, task: Task, lease: _Lease, stop: threading.Event) -> None:
        """Heartbeats ``task`` until the step ends (``stop``) or Warden says to abandon it."""
        delay = self._first_delay(task)
        while not stop.wait(delay):
            sent_at = time.monotonic()
            wait_ms, slack = self._beat_plan(task, lease, sent_at)
            progress = task._take_progress()
            try:
                answer = self.client.heartbeat(
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
                if stop.is_set() or task.cancelled:
                    return  # the step ended meanwhile: the answer is no news
                reason, delay = self._after_failure(task, lease, wait_ms, error, time.monotonic())
            else:
                if stop.is_set() or task.cancelled:
                    return
                reason = self._heard(task, lease, answer, time.monotonic())
                delay = self._next_delay(task, sent_at, time.monotonic())
            if reason is not None:
                task.cancel(reason)
                return

    def _progress_loop(self, task: Task, lease: _Lease, stop: threading.Event, ready: threading.Event) -> None:
        """Sends progress as it is reported, on heartbeats that do not wait, while a waiting one is in flight."""
        sent_at = -math.inf
        while True:
            ready.wait()
            ready.clear()
            if stop.is_set() or task.cancelled:
                return
            pause = sent_at + self.progress_interval - time.monotonic()
            if pause > 0 and stop.wait(pause):
                return
            progress = task._take_progress()
            if progress is None:
                continue
            sent_at = time.monotonic()
            try:
                answer = self.client.heartbeat(
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
                if stop.is_set() or task.cancelled:
                    return
                reason, _ = self._after_failure(task, lease, 0, error, time.monotonic())
            else:
                if stop.is_set() or task.cancelled:
                    return
                reason = self._heard(task, lease, answer, time.monotonic())
            if reason is not None:
                task.cancel(reason)
                return


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer
