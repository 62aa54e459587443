"""W3C trace context: the ``traceparent`` a worker's calls send, continuing the step's trace."""

from __future__ import annotations

import re
import secrets

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def child_traceparent(parent: str | None) -> str | None:
    """A ``traceparent`` in ``parent``'s trace naming a new span under it, or ``None``.

    Same version-00 trace id and flags, a fresh random span id: the worker's own span of the
    step, the parent of the server spans its heartbeat, complete, fail and release calls make.
    ``None`` when ``parent`` is missing or not a valid W3C traceparent (version ``ff``, an
    all-zero trace or span id, wrong lengths or upper-case hex are invalid).
    """
    if not parent:
        return None
    match = _TRACEPARENT.match(parent.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    child = secrets.token_hex(8)
    while child == "0" * 16 or child == span_id:
        child = secrets.token_hex(8)
    return f"00-{trace_id}-{child}-{flags}"
