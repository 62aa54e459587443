"""The async worker: steps as tasks on one loop, a stop as CancelledError, the trace continued."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from warden_client import (
    DEFAULT_HEARTBEAT_INTERVAL,
    AsyncWorker,
    Cancelled,
    Outcome,
    StepError,
    Task,
    WorkerExecutor,
)

from .fake_warden import TRACEPARENT, FakeWarden, is_child_of, make_task


def worker_for(fake: FakeWarden, step: Any, **kwargs: Any) -> AsyncWorker:
    kwargs.setdefault("wait_ms", 50)
    kwargs.setdefault("grace_period", 5.0)
    worker = AsyncWorker(fake.async_client(), step, queues=["research"], name="test-worker", **kwargs)
    fake.worker = worker
    return worker


def run(worker: AsyncWorker, timeout: float = 10.0) -> None:
    asyncio.run(asyncio.wait_for(worker.run(install_signal_handlers=False), timeout))


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Waits on the loop (never blocking it) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.005)


def test_steps_run_on_one_loop_and_are_completed_with_the_trace_continued() -> None:
    fake = FakeWarden([make_task(1, traceparent=TRACEPARENT), make_task(2, heartbeat_timeout_ms=150)])
    loops: list[asyncio.AbstractEventLoop] = []

    async def step(task: Task) -> Outcome:
        loops.append(asyncio.get_running_loop())
        if task.task_id.endswith("1"):
            await until(lambda: len(fake.calls_to("heartbeat")) >= 2)
            task.report_progress("half way")
            await until(lambda: any(b.get("progress") == "half way" for b in fake.calls_to("heartbeat")))
        return {"action": "write_file", "tokens": 12, "output": task.goal}

    worker = worker_for(fake, step)
    run(worker)

    # One loop for every step, so clients made once are reused.
    assert len(loops) == 2 and loops[0] is loops[1]
    assert fake.calls_to("claim")[0] == {"queues": ["research"], "wait_ms": 50, "worker": "test-worker"}
    assert [c["lease_token"] for c in fake.calls_to("complete")] == ["lease-1", "lease-2"]
    assert worker.stats["completed"] == 2
    # The first task's trace is continued on its heartbeats and completion; the second has none.
    beats = [(b["lease_token"], h) for b, h in zip(fake.calls_to("heartbeat"), fake.headers_to("heartbeat", "traceparent"))]
    [continued] = {h for token, h in beats if token == "lease-1"}
    assert is_child_of(continued, TRACEPARENT)
    assert {h for token, h in beats if token == "lease-2"} <= {None}
    assert fake.headers_to("complete", "traceparent") == [continued, None]
    assert fake.headers_to("claim", "traceparent")[0] is None


def test_a_stop_cancels_the_step_with_cancelled_error_inside_it() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=300, traceparent=TRACEPARENT)])
    fake.cancel_after_heartbeats = 2
    seen: dict[str, Any] = {}

    async def step(task: Task) -> Outcome:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["at"] = time.monotonic()
            seen["reason"] = task.cancel_reason
            seen["cleaned_up"] = True
            raise
        return {"action": "never"}

    worker = worker_for(fake, step)
    started = time.monotonic()
    run(worker)

    assert seen["reason"] == "stopped" and seen["cleaned_up"]
    assert seen["at"] - started < 3.0  # (the latency itself is measured end to end)
    assert fake.calls_to("complete") == [] and fake.calls_to("fail") == [] and fake.calls_to("release") == []
    assert worker.stats["cancelled"] == 1
    # No heartbeat after the cancel.
    assert len(fake.calls_to("heartbeat")) == 2


def test_cancelled_raised_by_check_cancelled_is_a_cancel_too() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.cancel_after_heartbeats = 1

    async def step(task: Task) -> Outcome:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                # A step that must finish a unit of work first, then checks.
                task.check_cancelled()
        return {"action": "never"}

    worker = worker_for(fake, step)
    run(worker)
    assert worker.stats["cancelled"] == 1
    assert fake.calls_to("complete") == [] and fake.calls_to("fail") == []


def test_a_step_that_swallows_the_cancel_is_abandoned_after_the_grace_period() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150), make_task(2)])
    done: list[str] = []

    async def step(task: Task) -> Outcome:
        if task.task_id.endswith("2"):
            done.append(task.task_id)
            return {"action": "second"}
        fake.cancel(task.lease_token)  # its session is stopped while it runs
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # ignores the stop, and goes on until the loop itself ends
        await asyncio.sleep(60)
        return {"action": "never"}

    worker = worker_for(fake, step, grace_period=0.3)
    run(worker)
    assert worker.stats["cancelled"] == 1
    assert [c["outcome"]["action"] for c in fake.calls_to("complete")] == ["second"]


def test_a_lost_lease_cancels_the_step() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.heartbeat_status = 409
    reasons: list[str | None] = []

    async def step(task: Task) -> Outcome:
        try:
            await asyncio.sleep(60)
        finally:
            reasons.append(task.cancel_reason)
        return {"action": "never"}

    worker = worker_for(fake, step)
    run(worker)
    assert reasons == ["lease_lost"]
    assert fake.calls_to("complete") == []


def test_errors_are_reported_with_fail_and_the_trace() -> None:
    fake = FakeWarden([make_task(1, traceparent=TRACEPARENT), make_task(2)])

    async def step(task: Task) -> Outcome:
        if task.task_id.endswith("1"):
            raise RuntimeError("the model is down")
        raise StepError("bad goal", retryable=False)

    worker = worker_for(fake, step)
    run(worker)
    failures = fake.calls_to("fail")
    assert [f["retryable"] for f in failures] == [True, False]
    assert failures[0]["error"].startswith("RuntimeError: the model is down")
    failed, other = fake.headers_to("fail", "traceparent")
    assert is_child_of(failed, TRACEPARENT) and other is None
    assert worker.stats["failed"] == 2


def test_a_step_answering_no_outcome_fails_permanently() -> None:
    fake = FakeWarden([make_task(1)])

    async def step(task: Task) -> Any:
        return "not an outcome"

    run(worker_for(fake, step))
    assert fake.calls_to("fail")[0]["retryable"] is False


def test_409_on_complete_is_logged_and_the_worker_moves_on() -> None:
    fake = FakeWarden([make_task(1), make_task(2)])
    fake.complete_status = 409

    async def step(task: Task) -> Outcome:
        return {"action": "a"}

    worker = worker_for(fake, step)
    run(worker)
    assert worker.stats["lease_lost"] == 2


def test_shutdown_gives_the_step_its_grace_then_cancels_and_releases_with_the_trace() -> None:
    fake = FakeWarden([make_task(1, traceparent=TRACEPARENT)])
    fake.stop_when_empty = False
    reasons: list[str | None] = []

    async def step(task: Task) -> Outcome:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            reasons.append(task.cancel_reason)
            raise
        return {"action": "never"}

    worker = worker_for(fake, step, grace_period=0.2)

    async def main() -> None:
        running = asyncio.create_task(worker.run(install_signal_handlers=False))
        await until(lambda: worker.current is not None)
        # From another thread, as a signal handler or a supervisor would.
        threading.Thread(target=worker.shutdown).start()
        await asyncio.wait_for(running, 5)

    asyncio.run(main())
    assert reasons == ["shutdown"]
    assert fake.calls_to("release") == [{"lease_token": "lease-1"}]
    [released] = fake.headers_to("release", "traceparent")
    assert is_child_of(released, TRACEPARENT)
    assert fake.calls_to("complete") == []


def test_a_step_within_the_grace_period_finishes_and_completes() -> None:
    fake = FakeWarden([make_task(1)])
    fake.stop_when_empty = False
    gate = asyncio.Event()

    async def step(task: Task) -> Outcome:
        await gate.wait()
        return {"action": "finished"}

    worker = worker_for(fake, step, grace_period=5.0)

    async def main() -> None:
        running = asyncio.create_task(worker.run(install_signal_handlers=False))
        await until(lambda: worker.current is not None)
        worker.shutdown()
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.wait_for(running, 5)

    asyncio.run(main())
    assert [c["outcome"] for c in fake.calls_to("complete")] == [{"action": "finished"}]
    assert fake.calls_to("release") == []


def test_cancelling_the_worker_cancels_the_step_and_releases_its_task() -> None:
    fake = FakeWarden([make_task(1)])
    fake.stop_when_empty = False

    async def step(task: Task) -> Outcome:
        await asyncio.sleep(60)
        return {"action": "never"}

    worker = worker_for(fake, step)

    async def main() -> None:
        running = asyncio.create_task(worker.run(install_signal_handlers=False))
        await until(lambda: worker.current is not None)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(main())
    assert fake.calls_to("release") == [{"lease_token": "lease-1"}]


def test_claim_errors_are_retried_and_the_loop_keeps_going() -> None:
    fake = FakeWarden([make_task(1)])
    fake.claim_failures = [503]

    async def step(task: Task) -> Outcome:
        return {"action": "a"}

    worker = worker_for(fake, step, idle_backoff_cap=0.05)
    worker.client.max_attempts = 1
    run(worker)
    assert worker.stats["completed"] == 1


def test_heartbeats_that_do_not_wait_come_every_250_ms_by_default() -> None:
    assert DEFAULT_HEARTBEAT_INTERVAL <= 0.3
    worker = AsyncWorker(FakeWarden().async_client(), _never)
    assert worker.heartbeat_interval(Task(make_task(1, heartbeat_timeout_ms=30000))) == DEFAULT_HEARTBEAT_INTERVAL


async def _never(task: Task) -> Outcome:
    raise Cancelled("unused")


def test_a_typed_executor_is_a_worker_executor() -> None:
    # Not a run-time check: mypy --strict checks this file (see test_types.py for a typo).
    executor: WorkerExecutor = {"kind": "worker", "queue": "research", "heartbeat_timeout_ms": 1000}
    assert executor["queue"] == "research"


# -- waiting heartbeats ----------------------------------------------------


def test_a_stop_is_heard_at_once_while_a_waiting_heartbeat_is_in_flight() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=30000)])
    seen: dict[str, float] = {}

    async def step(task: Task) -> Outcome:
        await until(lambda: fake.waiting >= 1)
        seen["asked"] = time.monotonic()
        fake.cancel(task.lease_token)  # the session is stopped now
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["heard"] = time.monotonic()
            raise
        return {"action": "never"}

    # Heartbeats that did not wait would come 5 s apart here: only the waiting one is heard this soon.
    worker = worker_for(fake, step, max_heartbeat_interval=5.0)
    run(worker)

    latency = seen["heard"] - seen["asked"]
    assert latency < 1.0, f"the stop took {latency:.3f}s"
    assert fake.waits() == [10000]
    assert fake.heartbeat_read_timeouts[0] > 10.0
    assert worker.stats["cancelled"] == 1
    assert fake.calls_to("complete") == [] and fake.calls_to("fail") == []


def test_progress_goes_at_once_while_a_heartbeat_waits() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=30000)])
    sent_within: list[float] = []

    async def step(task: Task) -> Outcome:
        await until(lambda: fake.waiting >= 1)
        reported = time.monotonic()
        # From a thread, as a step's blocking helper would.
        await asyncio.to_thread(task.report_progress, "half way")
        await until(lambda: any(b.get("progress") == "half way" for b in fake.calls_to("heartbeat")))
        sent_within.append(time.monotonic() - reported)
        assert fake.waiting >= 1  # the waiting heartbeat is still in flight
        for text in ("a", "b", "c"):
            task.report_progress(text)
        await until(lambda: any(b.get("progress") == "c" for b in fake.calls_to("heartbeat")))
        return {"action": "write_file"}

    worker = worker_for(fake, step, max_heartbeat_interval=5.0)
    started = time.monotonic()
    run(worker)

    assert sent_within[0] < 1.0
    progress = [b for b in fake.calls_to("heartbeat") if "progress" in b]
    assert all("wait_ms" not in b for b in progress)
    assert progress[0]["progress"] == "half way" and progress[-1]["progress"] == "c"
    assert len(progress) <= 3
    assert len(fake.calls_to("complete")) == 1
    assert time.monotonic() - started < 5


def test_a_server_that_refuses_wait_ms_gets_a_heartbeat_every_interval() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=300)])
    fake.knows_wait_ms = False
    reasons: list[str | None] = []

    async def step(task: Task) -> Outcome:
        await until(lambda: len(fake.calls_to("heartbeat")) >= 3)
        fake.cancel(task.lease_token)
        try:
            await asyncio.sleep(60)
        finally:
            reasons.append(task.cancel_reason)
        return {"action": "never"}

    worker = worker_for(fake, step)
    run(worker)
    assert worker.wait_heartbeats is False
    assert reasons == ["stopped"]
    assert fake.waits()[0] == 100 and set(fake.waits()[1:]) == {0}


def test_failing_heartbeats_back_off_and_give_up_when_the_lease_has_lapsed() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=1000)])
    fake.heartbeat_failures = [429, 503]
    fake.retry_after = "30"
    fake.heartbeat_status = 502
    reasons: list[str | None] = []

    async def step(task: Task) -> Outcome:
        try:
            await asyncio.sleep(60)
        finally:
            reasons.append(task.cancel_reason)
        return {"action": "never"}

    worker = worker_for(fake, step)
    started = time.monotonic()
    run(worker)
    took = time.monotonic() - started

    assert reasons == ["lease_lost"]
    assert 0.9 <= took < 5, took
    beats = fake.waits()
    assert 3 <= len(beats) <= 10, beats
    assert beats[0] == 333 and set(beats[1:]) == {0}
