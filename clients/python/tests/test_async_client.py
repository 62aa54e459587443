"""AsyncClient: the same operations as Client, awaited, with the same retries and errors."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import httpx
import pytest

from warden_client import AsyncClient, Client, WardenError, WardenUnavailable

from .fake_warden import TRACEPARENT, problem


def client_for(handler: Any, **kwargs: Any) -> tuple[AsyncClient, list[float]]:
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)

    kwargs.setdefault("max_attempts", 4)
    client = AsyncClient("http://warden.test/", "sk_test", transport=httpx.MockTransport(handler), sleep=sleep, **kwargs)
    return client, delays


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_every_operation_of_client_is_a_coroutine_of_async_client_with_the_same_parameters() -> None:
    sync, aio = public_methods(Client), public_methods(AsyncClient)
    renamed = {"close": "aclose"}
    for name, signature in sync.items():
        counterpart = renamed.get(name, name)
        assert counterpart in aio, f"AsyncClient has no {counterpart}"
        method = getattr(AsyncClient, counterpart)
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
        assert list(aio[counterpart].parameters) == list(signature.parameters), name
        for parameter in signature.parameters.values():
            assert aio[counterpart].parameters[parameter.name].default == parameter.default, (name, parameter.name)


def test_requests_errors_and_retries_match_the_sync_client() -> None:
    seen: list[httpx.Request] = []
    answers = iter([httpx.Response(503), httpx.Response(200, json={"id": "s", "status": "running"})])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/resume"):
            return problem(409, "the session is completed", code="illegal_transition")
        return next(answers)

    async def main() -> None:
        client, delays = client_for(handler)
        async with client:
            assert (await client.get_session("a/b"))["status"] == "running"
            assert len(delays) == 1
            with pytest.raises(WardenError) as caught:
                await client.resume_session("s")
            assert caught.value.code == "illegal_transition"

    asyncio.run(main())
    assert seen[0].url.raw_path == b"/api/autonomous/a%2Fb"
    assert seen[0].headers["authorization"] == "Bearer sk_test"


def test_persistent_network_errors_end_in_warden_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def main() -> None:
        client, delays = client_for(handler)
        with pytest.raises(WardenUnavailable):
            await client.get_session("s")
        assert len(delays) == 3

    asyncio.run(main())


def test_worker_calls_carry_the_traceparent_and_claim_answers_none_on_204() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/claim"):
            return httpx.Response(204)
        return httpx.Response(200, json={"accepted": True, "cancel": False})

    async def main() -> None:
        client, _ = client_for(handler)
        assert await client.claim(queues=["q"], wait_ms=10) is None
        await client.heartbeat("t", "lease", "half way", traceparent=TRACEPARENT)
        await client.complete("t", "lease", {"action": "a"}, traceparent=TRACEPARENT)
        await client.fail("t", "lease", "boom", tokens=3, traceparent=TRACEPARENT)
        await client.release("t", "lease", traceparent=TRACEPARENT)

    asyncio.run(main())
    assert "traceparent" not in seen[0].headers
    assert [r.headers["traceparent"] for r in seen[1:]] == [TRACEPARENT] * 4
    assert json.loads(seen[3].content) == {"lease_token": "lease", "error": "boom", "retryable": True, "tokens": 3}


def test_iter_sessions_and_wait_for() -> None:
    pages = {
        None: {"items": [{"id": "a"}], "next_cursor": "c1"},
        "c1": {"items": [{"id": "b"}], "next_cursor": None},
    }
    statuses = iter(["running", "paused", "completed"])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/autonomous":
            return httpx.Response(200, json=pages[request.url.params.get("cursor")])
        status = next(statuses)
        reason = "waiting_for_children" if status == "paused" else None
        return httpx.Response(200, json={"id": "s", "status": status, "reason": reason})

    async def main() -> None:
        client, _ = client_for(handler)
        assert [s["id"] async for s in client.iter_sessions()] == ["a", "b"]
        assert (await client.wait_for("s", poll=0))["status"] == "completed"

    asyncio.run(main())
