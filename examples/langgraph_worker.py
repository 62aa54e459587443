"""A LangGraph agent supervised by Warden, as an async worker.

It runs on one event loop under ``warden_client.AsyncWorker`` (the model
client is made once and reused across steps). A stop cancels the step's
task: ``asyncio.CancelledError`` is raised at the ``await`` the step is in
(the model call in flight is abandoned), and no tool runs after it.

Each Warden step is one LangGraph run: one model turn plus the tool calls it
asks for (read_file, write_file, list_files in a scratch directory per
session, and a calculator). The step reports the model's real token usage and
the tool calls it made; when the model answers without calling a tool, the
step signals ``done``. The conversation is kept in memory per session and
rebuilt from the task's history when missing (a restarted worker, or a step
another worker did).

Run (after ``pip install ./clients/python -r examples/requirements.txt``):

    WARDEN_URL=http://127.0.0.1:8080 WARDEN_KEY=<worker key> WARDEN_QUEUE=langgraph \\
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=unused OPENAI_MODEL=qwen3:8b \\
    python examples/langgraph_worker.py
"""

from __future__ import annotations

import ast
import asyncio
import logging
import operator
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from warden_client import AsyncClient, AsyncWorker, Outcome, Task

log = logging.getLogger("langgraph_worker")

SYSTEM_PROMPT = (
    "You are an agent working towards a goal in a scratch directory. Use the tools "
    "to read and write files and to calculate. When the goal is achieved, answer "
    "with a short summary and call no tool."
)


# -- tools ------------------------------------------------------------------


def _workspace(config: RunnableConfig) -> Path:
    root = Path(config["configurable"]["workspace"])
    root.mkdir(parents=True, exist_ok=True)
    return root


def _inside(config: RunnableConfig, relative: str) -> Path:
    root = _workspace(config).resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"{relative!r} is outside the workspace")
    return path


def _check(config: RunnableConfig) -> None:
    # A cancelled step performs no further side effect.
    task: Task | None = config["configurable"].get("task")
    if task is not None:
        task.check_cancelled()


@tool
def read_file(path: str, config: RunnableConfig) -> str:
    """Read a text file from the workspace."""
    _check(config)
    return _inside(config, path).read_text(encoding="utf-8")


@tool
def write_file(path: str, content: str, config: RunnableConfig) -> str:
    """Write a text file in the workspace (creating directories)."""
    _check(config)
    target = _inside(config, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return f"wrote {path} ({len(content)} characters)"


@tool
def list_files(config: RunnableConfig) -> str:
    """List the files in the workspace."""
    _check(config)
    root = _workspace(config)
    return "\n".join(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())) or "(empty)"


_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float | int:
    """Arithmetic on numbers only (no names, calls or attributes)."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")

    return walk(ast.parse(expression, mode="eval"))  # type: ignore[no-any-return]


@tool
def calculator(expression: str, config: RunnableConfig) -> str:
    """Evaluate an arithmetic expression, e.g. '6 * 7'."""
    _check(config)
    return str(evaluate(expression))


TOOLS: list[BaseTool] = [read_file, write_file, list_files, calculator]


# -- the graph: one run is one supervisor step --------------------------------


def build_graph(model: ChatOpenAI) -> Any:
    """agent -> (tools ->) END: one model turn plus the tool calls it asks for."""
    bound = model.bind_tools(TOOLS)

    async def agent(state: MessagesState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
        _check(config)
        return {"messages": [await bound.ainvoke(state["messages"], config)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", END)
    return graph.compile()


@dataclass
class Conversation:
    """A session's messages after its last step done here."""

    iteration: int
    messages: list[BaseMessage] = field(default_factory=list)


def rebuild(task: Task) -> list[BaseMessage]:
    """The conversation as the task's history tells it (after a restart, or another worker's steps)."""
    messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT), HumanMessage(f"Goal: {task.goal}")]
    for item in task.history:
        messages.append(AIMessage(f"Step {item['number']}: {item['action']} ({item['outcome']})\n{item['output']}"))
    return messages


class LangGraphAgent:
    """The step function: runs one LangGraph step for a Warden task."""

    def __init__(self, model: ChatOpenAI, scratch: Path) -> None:
        self.graph = build_graph(model)
        self.scratch = scratch
        self.conversations: dict[str, Conversation] = {}
        self.lock = threading.Lock()

    async def __call__(self, task: Task) -> Outcome:
        with self.lock:
            known = self.conversations.get(task.session_id)
        if known is not None and known.iteration == task.iteration - 1:
            messages = list(known.messages)
        else:
            # Missing, or not the step before this one (a retried or re-offered step).
            messages = rebuild(task)
            log.info("session %s: conversation rebuilt from %d history items", task.session_id, len(task.history))
        for note, text in (("Guidance from the user", task.guidance), ("Supervisor's note", task.nudge)):
            if text:
                messages.append(HumanMessage(f"{note}: {text}"))

        config: RunnableConfig = {
            "configurable": {"workspace": str(self.scratch / task.session_id), "task": task},
        }
        new: list[BaseMessage] = []
        async for update in self.graph.astream({"messages": messages}, config, stream_mode="updates"):
            for node, change in update.items():
                new.extend(change.get("messages", []))
                task.report_progress(f"{node} finished")  # raises Cancelled when stopped
        task.check_cancelled()

        with self.lock:
            self.conversations[task.session_id] = Conversation(task.iteration, messages + new)
        return outcome_of(new)


def outcome_of(new: list[BaseMessage]) -> Outcome:
    """The step's outcome: real token usage, the tool calls, and ``done`` on a final answer."""
    turns = [m for m in new if isinstance(m, AIMessage)]
    results = [m for m in new if isinstance(m, ToolMessage)]
    tokens = sum(m.usage_metadata["total_tokens"] for m in turns if m.usage_metadata)
    calls = [call for m in turns for call in m.tool_calls]
    text = "\n".join(str(m.content) for m in turns if m.content)
    failed = [r for r in results if r.status == "error"]
    lines = [text] if text else []
    lines += [f"{r.name}: {str(r.content)[:2000]}" for r in results]
    output = "\n".join(lines)
    if not calls:
        summary = (text or "done").splitlines()[0][:200]
        return {
            "action": "answer",
            "tokens": tokens,
            "output": f"{output}\n<<WARDEN_GOAL_DONE: {summary}>>",
            "tool_calls": 0,
            "signal": "done",
            "reason": summary,
        }
    return {
        "action": "+".join(call["name"] for call in calls),
        "arguments": {"tool_calls": [{"name": c["name"], "args": c["args"]} for c in calls]},
        "outcome": "failure" if failed else "success",
        "tokens": tokens,
        "output": output,
        "tool_calls": len(calls),
    }


async def serve() -> None:
    """Serves the queues until SIGTERM or SIGINT."""
    model = ChatOpenAI(
        model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),  # type: ignore[arg-type]
        timeout=float(os.environ.get("OPENAI_TIMEOUT", "120")),
        max_retries=2,
    )
    agent = LangGraphAgent(model, Path(os.environ.get("WORKER_SCRATCH_DIR", "scratch")).resolve())
    client = AsyncClient(os.environ.get("WARDEN_URL", "http://127.0.0.1:8080"), os.environ.get("WARDEN_KEY"))
    queues = [q for q in os.environ.get("WARDEN_QUEUE", "langgraph").split(",") if q]
    worker = AsyncWorker(
        client,
        agent,
        queues=queues,
        name=os.environ.get("WORKER_NAME"),
        wait_ms=int(os.environ.get("WORKER_WAIT_MS", "20000")),
        grace_period=float(os.environ.get("WORKER_GRACE_SECONDS", "25")),
    )
    log.info("worker %s: serving queues %s of %s", worker.name, queues, os.environ.get("WARDEN_URL"))
    async with client:
        await worker.run()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve())


if __name__ == "__main__":
    main()
