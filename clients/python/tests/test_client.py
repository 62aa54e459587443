"""The client's requests, errors and retries, against httpx.MockTransport."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from warden_client import Client, WardenError, WardenUnavailable, backoff_delay

from .fake_warden import problem


def client_for(handler: Any, **kwargs: Any) -> tuple[Client, list[float]]:
    delays: list[float] = []
    kwargs.setdefault("max_attempts", 4)
    client = Client(
        "http://warden.test/",
        "sk_test",
        transport=httpx.MockTransport(handler),
        sleep=delays.append,
        **kwargs,
    )
    return client, delays


def test_problem_answers_raise_warden_error_with_the_document() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return problem(409, "the session is completed", code="illegal_transition")

    client, _ = client_for(handler)
    with pytest.raises(WardenError) as caught:
        client.resume_session("abc")
    error = caught.value
    assert error.status == 409
    assert error.title == "Error"
    assert error.detail == "the session is completed"
    assert error.code == "illegal_transition"
    assert error.problem["status"] == 409
    assert "POST /api/autonomous/{id}/resume" in str(error)


def test_an_error_without_a_problem_document_still_raises_warden_error() -> None:
    client, _ = client_for(lambda request: httpx.Response(404, text="nope"))
    with pytest.raises(WardenError) as caught:
        client.get_session("x")
    assert caught.value.status == 404
    assert caught.value.detail == "nope"
    assert caught.value.title == "Not Found"


def test_requests_carry_the_key_as_bearer_and_json_bodies() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"id": "s1", "status": "running"})

    client, _ = client_for(handler)
    session = client.create_session("Write README.md", {"kind": "scripted", "steps": [{"action": "a"}]}, limits={"max_iterations": 3})
    assert session["id"] == "s1"
    request = seen[0]
    assert request.method == "POST"
    assert request.url.path == "/api/autonomous"
    assert request.headers["authorization"] == "Bearer sk_test"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {
        "goal": "Write README.md",
        "executor": {"kind": "scripted", "steps": [{"action": "a"}]},
        "limits": {"max_iterations": 3},
    }
    assert "sk_test" not in repr(client)


def test_a_heartbeat_asks_to_wait_only_when_told_and_waits_that_much_longer_for_its_answer() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"cancel": False, "reason": None, "lease_expires_at": None, "token_allowance": 5})

    client, _ = client_for(handler, timeout=2.0)
    client.heartbeat("t1", "lease")
    client.heartbeat("t1", "lease", wait_ms=10_000)
    assert json.loads(seen[0].content) == {"lease_token": "lease"}
    assert json.loads(seen[1].content) == {"lease_token": "lease", "wait_ms": 10_000}
    assert seen[0].extensions["timeout"]["read"] == 2.0
    assert seen[1].extensions["timeout"]["read"] == 12.0
    # A timeout of the caller's own is beyond the wait too.
    client.heartbeat("t1", "lease", wait_ms=10_000, timeout=0.5)
    assert seen[2].extensions["timeout"]["read"] == 10.5


def test_a_call_may_be_tried_once_and_its_retry_after_is_kept() -> None:
    answers = [
        problem(503, "full", headers={"retry-after": "5"}),
        problem(429, "full", headers={"retry-after": "99999"}),
        problem(429, "full", headers={"retry-after": "soon"}),
    ]
    client, delays = client_for(lambda request: answers.pop(0))
    with pytest.raises(WardenUnavailable) as unavailable:
        client.heartbeat("t1", "lease", wait_ms=1000, max_attempts=1)
    assert (unavailable.value.status, unavailable.value.retry_after) == (503, 5.0)
    with pytest.raises(WardenError) as refused:
        client.heartbeat("t1", "lease", wait_ms=1000, max_attempts=1)
    # Bounded: a Retry-After beyond five minutes is read as five minutes.
    assert (refused.value.status, refused.value.retry_after) == (429, 300.0)
    with pytest.raises(WardenError) as unreadable:
        client.heartbeat("t1", "lease", max_attempts=1)
    assert unreadable.value.retry_after is None
    assert delays == []  # tried once each, no retry


def test_stop_is_sent_as_json_with_no_body_and_ids_are_escaped() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "a/b", "status": "interrupted"})

    client, _ = client_for(handler)
    assert client.stop_session("a/b")["status"] == "interrupted"
    assert seen[0].url.raw_path == b"/api/autonomous/a%2Fb/stop"
    assert seen[0].headers["content-type"] == "application/json"
    assert seen[0].content == b""


def test_5xx_on_a_safe_call_is_retried_with_growing_jittered_delays() -> None:
    answers = [503, 502, 500, 200]

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers.pop(0)
        if status == 200:
            return httpx.Response(200, json={"id": "s1", "status": "running"})
        return problem(status, "down")

    client, delays = client_for(handler, backoff_base=0.1, backoff_cap=10.0)
    assert client.get_session("s1")["status"] == "running"
    assert len(delays) == 3
    for attempt, delay in enumerate(delays):
        ceiling = 0.1 * 2**attempt
        assert ceiling / 2 <= delay <= ceiling


def test_retries_are_bounded_and_end_in_warden_unavailable() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ReadError("connection reset")

    client, delays = client_for(handler, max_attempts=4)
    with pytest.raises(WardenUnavailable, match="after 4 attempts"):
        client.get_session("s1")
    assert calls == 4
    assert len(delays) == 3


def test_persistent_5xx_ends_in_warden_unavailable() -> None:
    client, delays = client_for(lambda request: problem(503, "down"), max_attempts=3)
    with pytest.raises(WardenUnavailable):
        client.heartbeat("t1", "lease")
    assert len(delays) == 2


def test_a_create_is_not_repeated_once_the_request_may_have_arrived() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ReadTimeout("no answer")

    client, _ = client_for(handler)
    with pytest.raises(WardenUnavailable):
        client.create_session("Write README.md", {"kind": "scripted", "steps": [{"action": "a"}]})
    assert calls == 1


def test_a_create_is_retried_when_the_connection_was_never_made() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("refused")
        return httpx.Response(201, json={"id": "s1"})

    client, delays = client_for(handler)
    assert client.create_session("Write README.md", {"kind": "scripted", "steps": [{"action": "a"}]})["id"] == "s1"
    assert calls == 3
    assert len(delays) == 2


def test_a_5xx_on_create_is_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return problem(500, "boom")

    client, _ = client_for(handler)
    with pytest.raises(WardenError) as caught:
        client.create_session("Write README.md", {"kind": "scripted", "steps": [{"action": "a"}]})
    assert caught.value.status == 500
    assert calls == 1


def test_claim_answers_none_on_204_and_the_task_on_200() -> None:
    answers = [httpx.Response(204), httpx.Response(200, json={"task_id": "t1", "lease_token": "l"})]
    bodies: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return answers.pop(0)

    client, _ = client_for(handler)
    assert client.claim(queues=["research"], wait_ms=100, worker="w1") is None
    task = client.claim(wait_ms=100)
    assert task is not None and task["task_id"] == "t1"
    assert bodies[0] == {"queues": ["research"], "wait_ms": 100, "worker": "w1"}
    assert bodies[1] == {"wait_ms": 100}


def test_iter_sessions_follows_the_cursor() -> None:
    pages = {
        None: {"items": [{"id": "3"}, {"id": "2"}], "next_cursor": "c1"},
        "c1": {"items": [{"id": "1"}], "next_cursor": None},
    }
    cursors: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        cursor = request.url.params.get("cursor")
        cursors.append(cursor)
        assert request.url.params.get("status") == "running"
        return httpx.Response(200, json=pages[cursor])

    client, _ = client_for(handler)
    assert [s["id"] for s in client.iter_sessions(status="running", page_size=2)] == ["3", "2", "1"]
    assert cursors == [None, "c1"]


def test_iterations_send_boolean_queries_as_true_false() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"items": [], "next_after": None})

    client, _ = client_for(handler)
    client.iterations("s1", after=2, full=True)
    assert seen[0].url.params["full"] == "true"
    assert seen[0].url.params["after"] == "2"


def test_a_tree_is_read_and_the_list_can_leave_children_out() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/tree"):
            node = {"id": "p", "children": [{"id": "c", "children": []}]}
            return httpx.Response(200, json={"totals": {"sessions": 2}, "node": node})
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    client, _ = client_for(handler)
    tree = client.get_tree("p")
    assert tree["node"]["children"][0]["id"] == "c"
    assert seen[0].url.path == "/api/autonomous/p/tree"
    client.list_sessions(root_only=True)
    assert seen[1].url.params["root_only"] == "true"


def test_backoff_delay_is_capped_and_jittered() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(n, 0.5, 4.0, rng) for n in range(10)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert all(d >= 2.0 for d in delays[4:])  # at the cap: between half of it and it
    assert len(set(delays)) == len(delays)  # jitter: no two the same


def test_wait_for_goes_past_a_pause_for_children_unless_asked() -> None:
    answers = iter(
        [
            {"id": "s", "status": "running"},
            {"id": "s", "status": "paused", "reason": "waiting_for_children"},
            {"id": "s", "status": "completed", "reason": "goal_achieved"},
        ]
    )
    client, _ = client_for(lambda request: httpx.Response(200, json=next(answers)))
    assert client.wait_for("s", poll=0)["status"] == "completed"

    client, _ = client_for(lambda request: httpx.Response(200, json={"id": "s", "status": "paused", "reason": "waiting_for_children"}))
    assert client.wait_for("s", poll=0, waiting_for_children=True)["reason"] == "waiting_for_children"
    with pytest.raises(TimeoutError):
        client.wait_for("s", poll=0.01, timeout=0.05)
    # A pause for a person is an answer.
    client, _ = client_for(lambda request: httpx.Response(200, json={"id": "s", "status": "paused", "reason": "user_pause"}))
    assert client.wait_for("s", poll=0)["reason"] == "user_pause"


def test_create_sends_the_typed_executor_and_limits_and_only_the_fields_given() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "s1", "status": "queued"})

    client, _ = client_for(handler)
    client.create_session(
        "Write notes.md",
        {"kind": "worker", "queue": "research", "heartbeat_timeout_ms": 2000},
        limits={"max_iterations": 5},
        on_child_pause="fail_child",
    )
    assert seen == [
        {
            "goal": "Write notes.md",
            "executor": {"kind": "worker", "queue": "research", "heartbeat_timeout_ms": 2000},
            "limits": {"max_iterations": 5},
            "on_child_pause": "fail_child",
        }
    ]
