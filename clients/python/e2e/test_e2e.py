"""End to end: a real warden binary, a fake OpenAI-compatible model, and the
LangGraph worker (examples/langgraph_worker.py) as separate processes.

Needs WARDEN_BIN (a built ``warden``); runs on the embedded store unless
DATABASE_URL is set. Run through ``clients/python/e2e/run_e2e.sh``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import queue
import random
import signal
import threading
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from warden_client import AsyncClient, AsyncWorker, Client, Outcome, Task, WorkerExecutor

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_worker.py"
ADMIN_TOKEN = "e2e-admin-token-5c0ffee5c0ffee5c0ffee5c0ffee5c0ffee5c0ff"
SECRET_KEY = "65326520736563726574206b6579206f66207468697274792074776f20627974"
SLOW_SECONDS = 4.0
TENANT = "e2e"
QUEUES = ["e2e-complete", "e2e-stop", "e2e-kill", "e2e-async"]
STOPS = 50


def wait_until(what: str, condition: Callable[[], Any], timeout: float = 30.0, poll: float = 0.05) -> Any:
    """Polls ``condition`` until it answers something truthy; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log_file = self.log_path.open("wb")
        self.popen = subprocess.Popen(argv, env=env, stdout=self.log_file, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)
        finally:
            self.log_file.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("logs")
    yield path


@pytest.fixture(scope="module")
def fake_model(logs: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FAKE_SLOW_SECONDS": str(SLOW_SECONDS), "FAKE_HANG_SECONDS": "120"}
    process = Process("fake-model", [sys.executable, str(HERE / "fake_openai.py"), str(port)], env, logs)
    base = f"http://127.0.0.1:{port}"
    wait_until("the fake model server", lambda: "listening on" in process.log(), timeout=20)
    yield base
    process.stop()


def model_stats(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/stats", timeout=5) as answer:
        return json.load(answer)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def warden(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = os.environ.get("WARDEN_BIN")
    if not binary or not Path(binary).is_file():
        pytest.fail("WARDEN_BIN must name a built warden binary (cargo build --bin warden)")
    port = free_port()
    data = tmp_path_factory.mktemp("warden")
    env = {
        **os.environ,
        "WARDEN_LISTEN_ADDR": f"127.0.0.1:{port}",
        "WARDEN_ADMIN_TOKEN": ADMIN_TOKEN,
        "WARDEN_SECRET_KEY": SECRET_KEY,
        "WARDEN_DATA_DIR": str(data / "data"),
        "WARDEN_WORKSPACE_ROOT": str(data / "workspaces"),
        "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
    }
    process = Process("warden", [binary], env, logs)
    base = f"http://127.0.0.1:{port}"
    probe = Client(base, timeout=2)
    try:
        wait_until("warden to be ready", lambda: process.popen.poll() is None and probe.ready(), timeout=90, poll=0.1)
    except AssertionError:
        raise AssertionError(f"warden did not become ready; its log:\n{process.log()[-4000:]}") from None
    yield base
    code = process.stop()
    assert code == 0 or code == -signal.SIGTERM, f"warden exited {code}:\n{process.log()[-4000:]}"


@pytest.fixture(scope="module")
def keys(warden: str) -> dict[str, str]:
    admin = Client(warden, ADMIN_TOKEN)
    operator = admin.create_key(TENANT, "operator", name="e2e operator")
    worker = admin.create_key(TENANT, "worker", name="e2e worker", queues=QUEUES)
    return {"operator": operator["secret"], "worker": worker["secret"]}


@pytest.fixture
def operator(warden: str, keys: dict[str, str]) -> Client:
    return Client(warden, keys["operator"])


class Workers:
    """Starts LangGraph workers and stops them at the end of a test."""

    def __init__(self, warden: str, model: str, key: str, logs: Path, scratch: Path) -> None:
        self.warden, self.model, self.key, self.logs, self.scratch = warden, model, key, logs, scratch
        self.started: list[Process] = []

    def start(self, name: str, queue: str) -> Process:
        env = {
            **os.environ,
            "WARDEN_URL": self.warden,
            "WARDEN_KEY": self.key,
            "WARDEN_QUEUE": queue,
            "OPENAI_BASE_URL": f"{self.model}/v1",
            "OPENAI_API_KEY": "fake",
            "OPENAI_MODEL": "fake-model",
            "WORKER_SCRATCH_DIR": str(self.scratch),
            "WORKER_NAME": name,
            "WORKER_WAIT_MS": "2000",
            "WORKER_GRACE_SECONDS": "10",
            "PYTHONUNBUFFERED": "1",
        }
        process = Process(name, [sys.executable, str(EXAMPLE)], env, self.logs)
        self.started.append(process)
        wait_until(f"{name} to start serving", lambda: "serving queues" in process.log() or process.popen.poll() is not None, timeout=60)
        assert process.popen.poll() is None, f"{name} exited:\n{process.log()}"
        return process

    def stop_all(self) -> None:
        for process in self.started:
            code = process.stop(signal.SIGTERM)
            # A graceful shutdown exits 0; a worker the test killed exits -9.
            assert code in (0, -signal.SIGKILL), f"{process.name} exited {code}:\n{process.log()[-3000:]}"


@pytest.fixture
def workers(warden: str, fake_model: str, keys: dict[str, str], logs: Path, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(warden, fake_model, keys["worker"], logs, tmp_path / "scratch")
    yield pool
    pool.stop_all()


def worker_session(client: Client, goal: str, queue: str, heartbeat_timeout_ms: int | None = None) -> str:
    executor: WorkerExecutor = {"kind": "worker", "queue": queue}
    if heartbeat_timeout_ms is not None:
        executor["heartbeat_timeout_ms"] = heartbeat_timeout_ms
    session = client.create_session(
        goal,
        executor,
        mode="fixed",
        limits={"max_iterations": 10},
    )
    return str(session["id"])


def all_iterations(client: Client, session_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: int | None = None
    while True:
        page = client.iterations(session_id, after=after)
        items += page.get("items", [])  # type: ignore[arg-type]
        after = page.get("next_after")
        if after is None:
            return items


def test_a_langgraph_session_completes_with_real_usage(operator: Client, workers: Workers, fake_model: str) -> None:
    workers.start("worker-complete", "e2e-complete")
    session_id = worker_session(operator, "Write notes.md with the value of 6 * 7", "e2e-complete")

    ended = operator.wait_for(session_id, timeout=60)
    assert ended["status"] == "completed", ended
    iterations = all_iterations(operator, session_id)
    assert [it["action"] for it in iterations] == ["write_file", "calculator", "answer"]
    # The tokens charged are the model's own usage figures, turn by turn.
    assert [it["tokens"] for it in iterations] == [120, 161, 202]
    assert ended["tokens_used"] == model_stats(fake_model)["tokens"]["plain"] == 483
    assert ended.get("tool_calls") == 2
    assert (workers.scratch / session_id / "notes.md").read_text().startswith("# Notes")


def test_a_stop_interrupts_the_worker_mid_step(operator: Client, workers: Workers, fake_model: str) -> None:
    worker = workers.start("worker-stop", "e2e-stop")
    session_id = worker_session(operator, "[slow] Write slow.md with the value of 6 * 7", "e2e-stop")

    # The worker is inside its first step: the model call is in flight.
    wait_until("the slow model call", lambda: model_stats(fake_model)["requests"].get("[slow]#0"), timeout=30)
    asked = time.monotonic()
    stopped = operator.stop_session(session_id)
    assert stopped["status"] == "interrupted", stopped

    # The cancel reaches the worker's code through its heartbeat, before the model answers.
    wait_until("the worker to see the cancel", lambda: "cancelled by Warden (stopped)" in worker.log(), timeout=10)
    seen_after = time.monotonic() - asked
    assert seen_after < SLOW_SECONDS, f"the cancel took {seen_after:.2f}s to reach the worker"
    # The step is abandoned: its tool call never runs, nothing is reported.
    wait_until("the step to be abandoned", lambda: "cancelled (stopped)" in worker.log(), timeout=SLOW_SECONDS + 10)
    assert not (workers.scratch / session_id / "slow.md").exists()
    assert operator.get_session(session_id)["status"] == "interrupted"
    assert all(it["action"] != "write_file" for it in all_iterations(operator, session_id))


def test_a_killed_workers_task_is_reoffered_and_completed_once(operator: Client, workers: Workers, fake_model: str) -> None:
    first = workers.start("worker-killed", "e2e-kill")
    session_id = worker_session(
        operator, "[hang] Write notes.md with the value of 6 * 7", "e2e-kill", heartbeat_timeout_ms=1500
    )
    wait_until("the first worker to be mid-step", lambda: model_stats(fake_model)["hung"] >= 1, timeout=30)
    first.stop(signal.SIGKILL)

    second = workers.start("worker-second", "e2e-kill")
    ended = operator.wait_for(session_id, timeout=90)
    assert ended["status"] == "completed", ended

    iterations = all_iterations(operator, session_id)
    assert [it["number"] for it in iterations] == [1, 2, 3]
    assert [it["action"] for it in iterations] == ["write_file", "calculator", "answer"]
    # The second worker took the first step over as its second attempt.
    assert "iteration 1, attempt 2" in second.log(), second.log()
    assert model_stats(fake_model)["requests"]["[hang]#0"] == 2
    assert (workers.scratch / session_id / "notes.md").exists()


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def test_a_stop_reaches_an_async_step_as_cancelled_error_within_a_second(
    operator: Client, warden: str, keys: dict[str, str], logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """50 stops, each of a step awaiting a slow call in an AsyncWorker with default settings:
    the time from asking for the stop to ``CancelledError`` inside the step, p99 under 1 s."""
    entered: queue.Queue[str] = queue.Queue()
    cancelled: queue.Queue[tuple[str, float, str | None]] = queue.Queue()

    async def step(task: Task) -> Outcome:
        entered.put(task.session_id)
        try:
            await asyncio.sleep(120)  # a model call that has not answered yet
        except asyncio.CancelledError:
            cancelled.put((task.session_id, time.monotonic(), task.cancel_reason))
            raise
        return {"action": "never"}

    worker = AsyncWorker(AsyncClient(warden, keys["worker"]), step, queues=["e2e-async"], name="e2e-async", wait_ms=2000)
    thread = threading.Thread(target=lambda: asyncio.run(worker.run(install_signal_handlers=False)), daemon=True)
    thread.start()
    latencies: list[float] = []
    answered: list[float] = []
    phases = random.Random(46)
    try:
        for n in range(STOPS):
            session_id = worker_session(operator, f"Stop number {n} of an async step", "e2e-async")
            assert entered.get(timeout=30) == session_id
            # A stop comes at any moment of the heartbeat cycle, not just after the step began:
            # a random phase (not a wait for anything), else every stop would land at one phase.
            time.sleep(phases.uniform(0, 0.5))
            asked = time.monotonic()
            assert operator.stop_session(session_id)["status"] == "interrupted"
            answered.append(time.monotonic() - asked)
            seen, at, reason = cancelled.get(timeout=10)
            assert (seen, reason) == (session_id, "stopped")
            latencies.append(at - asked)
    finally:
        worker.shutdown(hurry=True)
        thread.join(timeout=30)
    assert worker.stats["cancelled"] == STOPS and worker.stats["completed"] == 0
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    report = f"stop -> CancelledError over {STOPS} stops: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms (the stop call itself answered in p50 {percentile(answered, 0.5) * 1000:.0f} ms)"
    (logs / "stop-latency.txt").write_text(report + "\n")
    with capsys.disabled():
        print(f"\npython e2e: {report}")
    assert p99 < 1.0, report
