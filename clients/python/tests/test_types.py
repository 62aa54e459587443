"""A misspelt executor or limits key is a type error under mypy --strict, not a 422 at run time."""

from __future__ import annotations

from pathlib import Path

from mypy import api

SNIPPET = '''
from warden_client import Client

def create(client: Client) -> None:
    client.create_session("Write notes.md", {"kind": "worker", "queue": "research"}, limits={"max_iterations": 5})
    client.create_session("Write notes.md", {"kind": "worker", "queu": "research"})
    client.create_session("Write notes.md", {"kind": "worker", "queue": "research"}, limits={"max_iteration": 5})
    client.create_session("Write notes.md", {"kind": "wrker", "queue": "research"})
    client.create_session("Write notes.md", {"kind": "webhook", "url": "http://a.example/step", "timeout_ms": "5s"})
    client.update_session("s", mode="fxed")
'''


def test_typos_in_executor_and_limits_are_type_errors(tmp_path: Path) -> None:
    source = tmp_path / "typos.py"
    source.write_text(SNIPPET)
    out, err, status = api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)])
    assert status == 1, out + err
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    # The first call is right; every later one has one mistake.
    assert lines == {6, 7, 8, 9, 10}, out
