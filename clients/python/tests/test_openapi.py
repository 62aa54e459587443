"""The client cannot drift from openapi/openapi.json: every operation it performs is in the document,
and the request types have the document's keys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NotRequired, get_args, get_origin, get_type_hints

import pytest

from warden_client import (
    ROUTES,
    ApprovalPolicy,
    ApprovalRule,
    ChildPausePolicy,
    Executor,
    Limits,
    ConfirmIfOver,
    LimitsPatch,
    LlmExecutor,
    Mode,
    Outcome,
    ScriptedDelegation,
    ScriptedExecutor,
    ScriptedStep,
    StepContext,
    SubgoalTask,
    WebhookExecutor,
    WorkerExecutor,
)
from warden_client.types import Status

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "openapi" / "openapi.json"
SOURCES = Path(__file__).resolve().parents[1] / "src" / "warden_client"


def document_operations() -> set[tuple[str, str]]:
    document = json.loads(DOCUMENT.read_text())
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }


def test_every_route_the_client_uses_is_an_operation_of_the_document() -> None:
    operations = document_operations()
    missing = sorted(f"{method} {path} ({name})" for name, (method, path) in ROUTES.items() if (method, path) not in operations)
    assert not missing, f"not in {DOCUMENT.relative_to(ROOT)}: {missing}"


def test_the_client_names_no_path_outside_its_route_table() -> None:
    # Any '/api/…' or '/readyz'-like literal in the package must be one of ROUTES'
    # templates, so a path cannot slip past the check above.
    templates = {path for _method, path in ROUTES.values()}
    literal = re.compile(r"""["'](/(?:api|healthz|readyz|metrics)[^"']*)["']""")
    stray = [
        f"{source.name}: {match}"
        for source in sorted(SOURCES.glob("*.py"))
        for match in literal.findall(source.read_text())
        if match not in templates
    ]
    assert not stray, stray


def test_the_worker_protocol_operations_are_all_covered() -> None:
    # Every operation under /api/workers in the document has a client method.
    ours = set(ROUTES.values())
    theirs = {op for op in document_operations() if op[1].startswith("/api/workers/")}
    assert theirs, "the document has no /api/workers operations"
    assert theirs <= ours, sorted(theirs - ours)


def schemas() -> dict[str, Any]:
    return json.loads(DOCUMENT.read_text())["components"]["schemas"]  # type: ignore[no-any-return]


def keys_of(typed: Any) -> tuple[set[str], set[str]]:
    """A TypedDict's keys, and those it requires (read from the hints: the module's
    ``from __future__ import annotations`` leaves ``__required_keys__`` unreliable)."""
    hints = get_type_hints(typed, include_extras=True)
    optional = {name for name, hint in hints.items() if get_origin(hint) is NotRequired}
    required = set(hints) - optional if typed.__total__ else set()
    return set(hints), required


def test_the_executor_types_are_the_documents_executor_spec() -> None:
    variants = {variant["properties"]["kind"]["enum"][0]: variant for variant in schemas()["ExecutorSpec"]["oneOf"]}
    ours = {"worker": WorkerExecutor, "webhook": WebhookExecutor, "llm": LlmExecutor, "scripted": ScriptedExecutor}
    assert set(variants) == set(ours)
    assert set(get_args(Executor)) == set(ours.values())
    for kind, typed in ours.items():
        assert keys_of(typed) == (set(variants[kind]["properties"]), set(variants[kind]["required"])), kind


@pytest.mark.parametrize(
    ("typed", "schema"),
    [
        (LimitsPatch, "LimitsPatch"),
        (ApprovalPolicy, "ApprovalPolicy"),
        (ScriptedStep, "ScriptedStep"),
        (ScriptedDelegation, "ScriptedDelegation"),
        (SubgoalTask, "SubgoalTask"),
        (ConfirmIfOver, "ConfirmIfOver"),
        (StepContext, "WebhookRequest"),
        (Outcome, "WebhookResponse"),
    ],
)
def test_each_request_type_has_the_documents_keys(typed: Any, schema: str) -> None:
    documented = schemas()[schema]
    names, required = keys_of(typed)
    assert names == set(documented["properties"]), schema
    if schema not in ("WebhookRequest", "WebhookResponse"):
        # (Answers are read leniently, total=False; requests require what the document requires.)
        assert required == set(documented.get("required", [])), schema


def test_the_resolved_limits_are_the_documents_limits() -> None:
    assert set(Limits.__annotations__) == set(schemas()["Limits"]["properties"])


def test_the_literal_types_are_the_documents_enums() -> None:
    for literal, schema in ((Mode, "Mode"), (ApprovalRule, "ApprovalRule"), (ChildPausePolicy, "ChildPausePolicy"), (Status, "Status")):
        assert set(get_args(literal)) == set(schemas()[schema]["enum"]), schema
