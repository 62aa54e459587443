"""A fake OpenAI-compatible chat-completions server for the end-to-end test.

Each conversation is scripted by the turn it is on (the number of assistant
messages already in the request): turn 0 writes a file, turn 1 uses the
calculator, turn 2 answers finally. Every answer carries usage figures.

Markers in the goal (the first user message) change the timing:
``[slow]``   turn 0 answers after ``FAKE_SLOW_SECONDS`` (a step to stop mid-way);
``[hang]``   the first request of turn 0 waits up to ``FAKE_HANG_SECONDS`` (a
             worker to kill mid-step), later ones answer at once.

``GET /stats`` answers the requests seen per marker and turn, and the tokens
handed out per marker.
Run: ``python fake_openai.py PORT`` (prints ``listening on PORT`` when ready).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLOW_SECONDS = float(os.environ.get("FAKE_SLOW_SECONDS", "4"))
HANG_SECONDS = float(os.environ.get("FAKE_HANG_SECONDS", "60"))

_lock = threading.Lock()
_stats: dict[str, Any] = {"requests": {}, "tokens": {}, "hung": 0}


def _marker(goal: str) -> str:
    for marker in ("[slow]", "[hang]"):
        if marker in goal:
            return marker
    return "plain"


def _usage(turn: int) -> dict[str, int]:
    prompt = 100 + 40 * turn
    completion = 20 + turn
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def answer(body: dict[str, Any]) -> tuple[dict[str, Any], str, int]:
    """The scripted completion for a request; also its marker and turn."""
    messages = body.get("messages", [])
    goal = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    goal = goal if isinstance(goal, str) else json.dumps(goal)
    marker = _marker(goal)
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    message: dict[str, Any]
    if turn == 0:
        name = "slow.md" if marker == "[slow]" else "notes.md"
        message = {
            "role": "assistant",
            "content": "I will write the notes first.",
            "tool_calls": [_tool_call("write_file", {"path": name, "content": "# Notes\n6 * 7 = ?\n"})],
        }
    elif turn == 1:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [_tool_call("calculator", {"expression": "6 * 7"})],
        }
    else:
        message = {"role": "assistant", "content": "notes.md is written and 6 * 7 = 42. The goal is done."}
    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": _usage(turn),
    }
    return completion, marker, turn


class Handler(BaseHTTPRequestHandler):
    """Serves /v1/chat/completions and /stats."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/stats":
            with _lock:
                self._send(200, _stats)
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        completion, marker, turn = answer(body)
        key = f"{marker}#{turn}"
        with _lock:
            seen = _stats["requests"].get(key, 0)
            _stats["requests"][key] = seen + 1
        if marker == "[slow]" and turn == 0:
            time.sleep(SLOW_SECONDS)
        if marker == "[hang]" and turn == 0 and seen == 0:
            with _lock:
                _stats["hung"] += 1
            time.sleep(HANG_SECONDS)
        with _lock:
            _stats["tokens"][marker] = _stats["tokens"].get(marker, 0) + completion["usage"]["total_tokens"]
        try:
            self._send(200, completion)
        except (BrokenPipeError, ConnectionResetError):
            pass


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
