"""examples/langgraph_worker.py's step function against the fake model server (no Warden)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from warden_client import Cancelled, HistoryItem, Task

from .fake_warden import make_task

ROOT = Path(__file__).resolve().parents[3]


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


example = load("langgraph_worker", ROOT / "examples" / "langgraph_worker.py")
fake = load("fake_openai", ROOT / "clients" / "python" / "e2e" / "fake_openai.py")


@pytest.fixture(scope="module")
def model() -> Iterator[ChatOpenAI]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    yield ChatOpenAI(model="fake", base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)  # type: ignore[arg-type]
    server.shutdown()


def task_for(iteration: int, history: list[HistoryItem], session: int = 1) -> Task:
    claimed = make_task(session)
    claimed["iteration"] = iteration
    claimed["context"]["iteration"] = iteration
    claimed["context"]["history"] = history
    return Task(claimed)


def record(iteration: int, outcome: dict[str, Any]) -> HistoryItem:
    return {"number": iteration, "action": outcome["action"], "outcome": outcome.get("outcome") or "success", "output": outcome["output"]}


def test_each_step_is_one_model_turn_with_its_tool_calls_and_real_usage(model: ChatOpenAI, tmp_path: Path) -> None:
    agent = example.LangGraphAgent(model, tmp_path)
    history: list[HistoryItem] = []
    outcomes = []
    for iteration in (1, 2, 3):
        outcome = asyncio.run(agent(task_for(iteration, history)))
        outcomes.append(outcome)
        history.append(record(iteration, outcome))

    assert [o["action"] for o in outcomes] == ["write_file", "calculator", "answer"]
    assert [o["tokens"] for o in outcomes] == [120, 161, 202]  # the server's usage figures
    assert [o["tool_calls"] for o in outcomes] == [1, 1, 0]
    assert outcomes[1]["output"] == "calculator: 42"
    assert outcomes[2]["signal"] == "done"
    assert outcomes[2]["output"].endswith(">>") and "<<WARDEN_GOAL_DONE: " in outcomes[2]["output"]
    session_dir = tmp_path / task_for(1, []).session_id
    assert (session_dir / "notes.md").read_text() == "# Notes\n6 * 7 = ?\n"


def test_a_restarted_worker_rebuilds_the_conversation_from_history(model: ChatOpenAI, tmp_path: Path) -> None:
    history: list[HistoryItem] = [
        {"number": 1, "action": "write_file", "outcome": "success", "output": "write_file: wrote notes.md"},
        {"number": 2, "action": "calculator", "outcome": "success", "output": "calculator: 42"},
    ]
    fresh = example.LangGraphAgent(model, tmp_path)
    outcome = asyncio.run(fresh(task_for(3, history, session=7)))
    # Two earlier turns in the rebuilt conversation: the model is on its third.
    assert outcome["action"] == "answer" and outcome["signal"] == "done"


def test_a_cancelled_step_stops_before_its_tool_runs(model: ChatOpenAI, tmp_path: Path) -> None:
    agent = example.LangGraphAgent(model, tmp_path)
    task = task_for(1, [], session=3)
    original = task.report_progress

    def cancel_after_the_model_turn(text: str) -> None:
        task.cancel("stopped")  # the heartbeat's cancel lands while the model answers
        original(text)

    task.report_progress = cancel_after_the_model_turn  # type: ignore[method-assign]
    with pytest.raises(Cancelled):
        asyncio.run(agent(task))
    assert not (tmp_path / task.session_id / "notes.md").exists()
    assert task.session_id not in agent.conversations


def test_tools_stay_inside_the_workspace_and_the_calculator_only_does_arithmetic(tmp_path: Path) -> None:
    config: Any = {"configurable": {"workspace": str(tmp_path)}}
    with pytest.raises(ValueError, match="outside the workspace"):
        example.write_file.invoke({"path": "../escape.txt", "content": "x"}, config)
    assert example.evaluate("2 ** 10 - (3 * 4) / 2") == 1018
    with pytest.raises(ValueError):
        example.evaluate("__import__('os').system('true')")
