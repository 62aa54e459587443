"""The worker's loop: complete, cancel delivery, failures, 409s, backoff and SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from warden_client import Cancelled, Outcome, StepError, Task, Worker

from .fake_warden import TRACEPARENT, FakeWarden, is_child_of, make_task


def worker_for(fake: FakeWarden, step: Any, **kwargs: Any) -> Worker:
    kwargs.setdefault("wait_ms", 50)
    kwargs.setdefault("grace_period", 5.0)
    worker = Worker(fake.client(), step, queues=["research"], name="test-worker", **kwargs)
    fake.worker = worker
    return worker


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    return thread


def test_a_task_is_claimed_heartbeated_and_completed() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    seen: list[Task] = []

    def step(task: Task) -> Outcome:
        seen.append(task)
        # Works until the background heartbeat has been sent twice.
        fake.wait_for(lambda: len(fake.calls_to("heartbeat")) >= 2)
        task.report_progress("half way")
        fake.wait_for(lambda: any(b.get("progress") == "half way" for b in fake.calls_to("heartbeat")))
        return {"action": "write_file", "tokens": 12, "output": "wrote notes.md", "tool_calls": 1}

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)

    assert fake.calls_to("claim")[0] == {"queues": ["research"], "wait_ms": 50, "worker": "test-worker"}
    assert seen[0].goal == "write notes.md"
    assert seen[0].token_allowance == 900  # updated by a heartbeat's answer
    assert all(b["lease_token"] == "lease-1" for b in fake.calls_to("heartbeat"))
    assert fake.calls_to("complete") == [
        {
            "lease_token": "lease-1",
            "outcome": {"action": "write_file", "tokens": 12, "output": "wrote notes.md", "tool_calls": 1},
        }
    ]
    assert fake.calls_to("fail") == [] and fake.calls_to("release") == []
    assert worker.stats["completed"] == 1


def test_an_async_step_is_awaited_and_sees_cancellation() -> None:
    import asyncio

    fake = FakeWarden([make_task(1), make_task(2, heartbeat_timeout_ms=150)])

    async def step(task: Task) -> Outcome:
        if task.task_id.endswith("1"):
            await asyncio.sleep(0.01)
            return {"action": "async", "tokens": 3}
        fake.cancel(task.lease_token)  # its session is stopped while it runs
        while True:
            task.check_cancelled()
            await asyncio.sleep(0.01)

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    assert fake.calls_to("complete") == [{"lease_token": "lease-1", "outcome": {"action": "async", "tokens": 3}}]
    assert worker.stats["cancelled"] == 1


def test_the_heartbeat_interval_is_a_fraction_of_the_timeout_with_a_ceiling() -> None:
    worker = Worker(FakeWarden().client(), lambda task: {"action": "a"}, max_heartbeat_interval=2.0)
    assert worker.heartbeat_interval(Task(make_task(1, heartbeat_timeout_ms=3000))) == pytest.approx(1.0)
    assert worker.heartbeat_interval(Task(make_task(1, heartbeat_timeout_ms=30000))) == 2.0


def test_cancel_from_a_heartbeat_reaches_the_step_as_flag_and_exception() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.cancel_after_heartbeats = 2
    observed: dict[str, Any] = {}

    def step(task: Task) -> Outcome:
        observed["flag_at_start"] = task.cancelled
        # A long step that checks for cancellation between units of work.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                task.check_cancelled()
            except Cancelled as cancelled:
                observed["reason"] = cancelled.reason
                observed["flag"] = task.cancelled
                with pytest.raises(Cancelled):
                    task.report_progress("still here")
                raise
            time.sleep(0.01)
        return {"action": "too late"}

    worker = worker_for(fake, step)
    started = time.monotonic()
    worker.run(install_signal_handlers=False)

    assert time.monotonic() - started < 5
    assert observed == {"flag_at_start": False, "reason": "stopped", "flag": True}
    # Warden already moved on: nothing is reported, and heartbeats stopped at the cancel.
    assert fake.calls_to("complete") == [] and fake.calls_to("fail") == []
    assert len(fake.calls_to("heartbeat")) == 2
    assert worker.stats["cancelled"] == 1


def test_a_step_that_returns_after_a_cancel_is_not_completed() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.cancel_after_heartbeats = 1
    fake.cancel_reason = "paused"

    def step(task: Task) -> Outcome:
        task.cancel_event.wait(5)
        return {"action": "ignored the flag", "output": task.cancel_reason or ""}

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    assert fake.calls_to("complete") == []
    assert worker.stats["cancelled"] == 1


def test_a_lost_lease_on_heartbeat_cancels_the_step() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.heartbeat_status = 409
    reasons: list[str] = []

    def step(task: Task) -> Outcome:
        assert task.cancel_event.wait(5)
        reasons.append(task.cancel_reason or "")
        task.check_cancelled()
        return {"action": "unreachable"}

    worker_for(fake, step).run(install_signal_handlers=False)
    assert reasons == ["lease_lost"]
    assert fake.calls_to("complete") == []


def test_409_on_complete_is_logged_and_the_worker_moves_on(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeWarden([make_task(1), make_task(2)])
    fake.complete_status = 409
    steps: list[str] = []

    def step(task: Task) -> Outcome:
        steps.append(task.task_id)
        return {"action": "noop"}

    worker = worker_for(fake, step)
    with caplog.at_level(logging.WARNING, logger="warden_client.worker"):
        worker.run(install_signal_handlers=False)
    assert len(steps) == 2
    assert len(fake.calls_to("complete")) == 2
    assert worker.stats["lease_lost"] == 2
    assert "the lease was lost" in caplog.text


def test_an_exception_in_the_step_is_reported_with_fail() -> None:
    fake = FakeWarden([make_task(1), make_task(2)])

    def step(task: Task) -> Outcome:
        if task.task_id.endswith("1"):
            raise ValueError("the model said nonsense")
        raise StepError("the input file is missing", retryable=False)

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    fails = fake.calls_to("fail")
    assert len(fails) == 2
    assert fails[0]["lease_token"] == "lease-1" and fails[0]["retryable"] is True
    assert "ValueError: the model said nonsense" in fails[0]["error"]
    assert fails[1]["retryable"] is False and "the input file is missing" in fails[1]["error"]
    assert fake.calls_to("complete") == []
    assert worker.stats["failed"] == 2


def test_a_step_answering_no_outcome_fails_permanently() -> None:
    fake = FakeWarden([make_task(1)])
    worker = worker_for(fake, lambda task: "just text")
    worker.run(install_signal_handlers=False)
    [failure] = fake.calls_to("fail")
    assert failure["retryable"] is False and "not an outcome" in failure["error"]


def test_claim_errors_are_retried_with_backoff_and_the_loop_keeps_going() -> None:
    fake = FakeWarden([make_task(1)])
    # Each request gives up after 2 attempts; the loop itself goes on.
    fake.claim_failures = [503, httpx.ConnectError("refused"), 502, httpx.ReadError("reset"), 500]
    client = fake.client(max_attempts=2)
    worker = Worker(client, lambda task: {"action": "noop"}, queues=["research"], wait_ms=50, idle_backoff_cap=0.05)
    fake.worker = worker
    thread = run_in_thread(worker)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(fake.calls_to("claim")) >= 6
    assert len(fake.calls_to("complete")) == 1


def test_sigterm_releases_a_task_that_outlives_the_grace_period() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.stop_when_empty = False
    running = threading.Event()
    outcome_of_step: list[str] = []

    def step(task: Task) -> Outcome:
        running.set()
        # Ignores everything until the shutdown cancels it.
        task.cancel_event.wait(10)
        outcome_of_step.append(task.cancel_reason or "")
        return {"action": "late"}

    worker = worker_for(fake, step, grace_period=0.3)
    before = signal.getsignal(signal.SIGTERM)
    def terminate() -> None:
        running.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    started = time.monotonic()
    worker.run()  # the main thread, so the SIGTERM handler is installed

    assert time.monotonic() - started < 5
    assert fake.calls_to("release") == [{"lease_token": "lease-1"}]
    assert fake.calls_to("complete") == []
    fake.wait_for(lambda: outcome_of_step == ["shutdown"])
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert worker.stats["released"] == 1


def test_sigterm_lets_a_task_within_the_grace_period_finish() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150), make_task(2)])
    fake.stop_when_empty = False
    running = threading.Event()
    may_finish = threading.Event()

    def step(task: Task) -> Outcome:
        running.set()
        may_finish.wait(5)
        return {"action": "finished"}

    def terminate() -> None:
        running.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)
        fake.wait_for(lambda: worker.shutting_down)
        may_finish.set()

    worker = worker_for(fake, step, grace_period=5.0)
    threading.Thread(target=terminate, daemon=True).start()
    worker.run()

    assert len(fake.calls_to("complete")) == 1
    assert fake.calls_to("release") == []
    # The second task was never claimed: shutdown stops claiming.
    assert len(fake.calls_to("claim")) == 1


def test_a_second_signal_releases_at_once() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150)])
    fake.stop_when_empty = False
    running = threading.Event()

    def step(task: Task) -> Outcome:
        running.set()
        task.cancel_event.wait(10)
        return {"action": "late"}

    def terminate() -> None:
        running.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)
        fake.wait_for(lambda: worker.shutting_down)
        os.kill(os.getpid(), signal.SIGINT)

    worker = worker_for(fake, step, grace_period=30.0)
    threading.Thread(target=terminate, daemon=True).start()
    started = time.monotonic()
    worker.run()
    assert time.monotonic() - started < 5
    assert fake.calls_to("release") == [{"lease_token": "lease-1"}]


def test_a_task_claimed_during_shutdown_is_released_unrun() -> None:
    fake = FakeWarden([make_task(1)])
    fake.stop_when_empty = False
    ran: list[str] = []
    def step(task: Task) -> Outcome:
        ran.append(task.task_id)
        return {"action": "a"}

    worker = worker_for(fake, step)

    def claim_then_shutdown(request: httpx.Request) -> httpx.Response:
        worker.shutdown()  # the signal arrives while the claim is in flight
        return httpx.Response(200, json=dict(make_task(1)))

    fake.overrides["claim"] = claim_then_shutdown
    worker.run(install_signal_handlers=False)
    assert ran == []
    assert fake.calls_to("release") == [{"lease_token": "lease-1"}]


def test_the_trace_of_the_task_is_continued_on_every_call_about_it() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=150, traceparent=TRACEPARENT), make_task(2)])

    def step(task: Task) -> Outcome:
        if task.task_id.endswith("2"):
            raise RuntimeError("boom")
        fake.wait_for(lambda: len(fake.calls_to("heartbeat")) >= 1)
        return {"action": "a"}

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    beats = fake.headers_to("heartbeat", "traceparent")
    continued = beats[0]
    assert is_child_of(continued, TRACEPARENT)
    # One span of the worker's for the step: every call about it names it.
    assert seen_once(beats) <= {continued, None}
    assert fake.headers_to("complete", "traceparent") == [continued]
    assert fake.headers_to("fail", "traceparent") == [None]
    # A claim belongs to no trace yet.
    assert set(fake.headers_to("claim", "traceparent")) == {None}


def test_a_released_task_carries_its_trace() -> None:
    fake = FakeWarden([make_task(1, traceparent=TRACEPARENT)])
    fake.stop_when_empty = False
    worker = worker_for(fake, lambda task: {"action": "a"})
    worker.shutdown()
    worker.run_once()
    [released] = fake.headers_to("release", "traceparent")
    assert is_child_of(released, TRACEPARENT)


def test_heartbeats_that_do_not_wait_come_every_250_ms_or_less_by_default() -> None:
    worker = Worker(FakeWarden().client(), lambda task: {"action": "a"})
    assert worker.heartbeat_interval(Task(make_task(1, heartbeat_timeout_ms=30000))) <= 0.3


def seen_once(values: list[str | None]) -> set[str | None]:
    return set(values)


# -- waiting heartbeats ----------------------------------------------------


def test_the_wait_of_a_heartbeat_is_a_share_of_the_lease_under_half_and_at_most_30_s() -> None:
    worker = Worker(FakeWarden().client(), lambda task: {"action": "a"})
    assert worker.heartbeat_wait_ms(Task(make_task(1, heartbeat_timeout_ms=30000))) == 10000
    assert worker.heartbeat_wait_ms(Task(make_task(1, heartbeat_timeout_ms=600000))) == 30000
    greedy = Worker(FakeWarden().client(), lambda task: {"action": "a"}, heartbeat_fraction=0.9)
    # Warden waits at most half the lease left: the worker asks for 0.4 of it at most.
    assert greedy.heartbeat_wait_ms(Task(make_task(1, heartbeat_timeout_ms=30000))) == 12000


def test_a_cancel_is_heard_at_once_while_a_waiting_heartbeat_is_in_flight() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=30000)])
    asked: list[float] = []
    heard: list[float] = []

    def step(task: Task) -> Outcome:
        fake.wait_for(lambda: fake.waiting >= 1)
        asked.append(time.monotonic())
        fake.cancel(task.lease_token)  # the session is stopped now
        assert task.cancel_event.wait(10)
        heard.append(task.cancelled_at or 0.0)
        task.check_cancelled()
        return {"action": "unreachable"}

    # Heartbeats that did not wait would come 5 s apart here: only the waiting one is heard this soon.
    worker = worker_for(fake, step, max_heartbeat_interval=5.0)
    started = time.monotonic()
    worker.run(install_signal_handlers=False)

    latency = heard[0] - asked[0]
    assert latency < 1.0, f"the cancel took {latency:.3f}s"
    assert time.monotonic() - started < 5
    # One heartbeat, waiting a third of the 30 s lease, its read timeout beyond the wait.
    assert fake.waits() == [10000]
    assert fake.heartbeat_read_timeouts[0] > 10.0
    assert worker.stats["cancelled"] == 1 and fake.calls_to("complete") == []


def test_progress_goes_at_once_while_a_heartbeat_waits_and_the_report_ends_the_wait() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=30000)])
    sent_within: list[float] = []

    def step(task: Task) -> Outcome:
        fake.wait_for(lambda: fake.waiting >= 1)
        reported = time.monotonic()
        task.report_progress("half way")
        fake.wait_for(lambda: any(b.get("progress") == "half way" for b in fake.calls_to("heartbeat")))
        sent_within.append(time.monotonic() - reported)
        assert fake.waiting >= 1  # the waiting heartbeat is still in flight
        for text in ("a", "b", "c"):
            task.report_progress(text)
        fake.wait_for(lambda: any(b.get("progress") == "c" for b in fake.calls_to("heartbeat")))
        return {"action": "write_file"}

    worker = worker_for(fake, step, max_heartbeat_interval=5.0)
    started = time.monotonic()
    worker.run(install_signal_handlers=False)

    assert sent_within[0] < 1.0
    progress = [b for b in fake.calls_to("heartbeat") if "progress" in b]
    # Sent on heartbeats that do not wait; the latest text wins over texts not yet sent.
    assert all("wait_ms" not in b for b in progress)
    assert progress[0]["progress"] == "half way" and progress[-1]["progress"] == "c"
    assert len(progress) <= 3
    assert len(fake.calls_to("complete")) == 1
    # The completion ended the waiting heartbeat: the worker did not wait out its 10 s.
    assert time.monotonic() - started < 5


def test_a_server_that_refuses_wait_ms_gets_a_heartbeat_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=300), make_task(2, heartbeat_timeout_ms=300)])
    fake.knows_wait_ms = False

    def step(task: Task) -> Outcome:
        beats = len(fake.calls_to("heartbeat"))
        fake.wait_for(lambda: len(fake.calls_to("heartbeat")) >= beats + 3)
        if task.task_id.endswith("2"):
            fake.cancel(task.lease_token)
            assert task.cancel_event.wait(5)
            task.check_cancelled()
        return {"action": "a"}

    worker = worker_for(fake, step)
    with caplog.at_level(logging.WARNING, logger="warden_client.worker"):
        worker.run(install_signal_handlers=False)

    assert worker.wait_heartbeats is False
    assert "does not take a heartbeat's wait_ms" in caplog.text
    # The first heartbeat asked to wait and was refused; every later one, of either task, did not ask.
    assert fake.waits()[0] == 100 and set(fake.waits()[1:]) == {0}
    assert len(fake.calls_to("complete")) == 1 and worker.stats["cancelled"] == 1


def test_failing_heartbeats_back_off_and_give_up_when_the_lease_has_lapsed() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=1000)])
    fake.heartbeat_failures = [httpx.ConnectError("refused"), 503, httpx.ReadTimeout("slow")]
    fake.heartbeat_status = 500
    reasons: list[str | None] = []

    def step(task: Task) -> Outcome:
        assert task.cancel_event.wait(10)
        reasons.append(task.cancel_reason)
        task.check_cancelled()
        return {"action": "unreachable"}

    worker = worker_for(fake, step)
    started = time.monotonic()
    worker.run(install_signal_handlers=False)
    took = time.monotonic() - started

    assert reasons == ["lease_lost"]
    assert 0.9 <= took < 5, took
    beats = fake.waits()
    # Retried with a backoff of 0.125 to 0.25 s within the 1 s lease, never at once,
    # and only the first heartbeat waited.
    assert 3 <= len(beats) <= 10, beats
    assert beats[0] == 333 and set(beats[1:]) == {0}
    assert fake.calls_to("complete") == [] and fake.calls_to("fail") == []


def test_a_refused_wait_beats_without_waiting_until_retry_after() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=3000)])
    fake.heartbeat_failures = [429]
    fake.retry_after = "1"

    def step(task: Task) -> Outcome:
        # Waiting again once Retry-After has passed.
        fake.wait_for(lambda: fake.waits().count(1000) >= 2)
        fake.cancel(task.lease_token)
        assert task.cancel_event.wait(5)
        task.check_cancelled()
        return {"action": "unreachable"}

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    beats = fake.waits()
    assert beats[0] == 1000 and beats[1] == 0
    # Between the refusal and the next wait, heartbeats every 0.25 s: about four in the second.
    refused_for = beats[1 : beats.index(1000, 1)]
    assert set(refused_for) == {0} and 2 <= len(refused_for) <= 8, beats
    assert worker.stats["cancelled"] == 1


def test_a_draining_replica_answering_every_heartbeat_at_once_is_not_spun_on() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=30000)])
    fake.draining = True

    def step(task: Task) -> Outcome:
        time.sleep(1.0)  # the step goes on through the drain
        return {"action": "finished"}

    worker = worker_for(fake, step)
    worker.run(install_signal_handlers=False)
    # At most one heartbeat per 0.25 s interval though each is answered at once.
    assert 2 <= len(fake.calls_to("heartbeat")) <= 8, len(fake.calls_to("heartbeat"))
    assert len(fake.calls_to("complete")) == 1


def test_wait_heartbeats_off_keeps_the_interval_rhythm() -> None:
    fake = FakeWarden([make_task(1, heartbeat_timeout_ms=300)])

    def step(task: Task) -> Outcome:
        fake.wait_for(lambda: len(fake.calls_to("heartbeat")) >= 3)
        task.report_progress("with the next heartbeat")
        fake.wait_for(lambda: any(b.get("progress") for b in fake.calls_to("heartbeat")))
        return {"action": "a"}

    worker = worker_for(fake, step, wait_heartbeats=False)
    worker.run(install_signal_handlers=False)
    assert set(fake.waits()) == {0}
    assert len(fake.calls_to("complete")) == 1
