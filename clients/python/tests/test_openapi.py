"""The client cannot drift from openapi/openapi.json: every operation it performs is in the document."""

from __future__ import annotations

import json
import re
from pathlib import Path

from warden_client import ROUTES

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
