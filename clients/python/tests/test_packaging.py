"""The distribution is ready to publish: one name for it and its module, the API's version, a licence, a changelog."""

from __future__ import annotations

import tomllib
from pathlib import Path

import warden_client

HERE = Path(__file__).resolve().parents[1]
ROOT = HERE.parents[1]


def project() -> dict[str, object]:
    return tomllib.loads((HERE / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_the_distribution_and_the_module_have_one_name() -> None:
    assert project()["name"] == "warden-client"
    assert warden_client.__name__.replace("_", "-") == project()["name"]


def test_the_version_is_the_api_version_and_the_changelog_has_it() -> None:
    import json

    api_version = json.loads((ROOT / "openapi" / "openapi.json").read_text())["info"]["version"]
    # A client-only fix may add a fourth part; the first three are the API's.
    assert warden_client.__version__.split(".")[:3] == api_version.split(".")
    assert f"## {warden_client.__version__}" in (HERE / "CHANGELOG.md").read_text()


def test_the_metadata_names_a_licence_and_ships_it() -> None:
    meta = project()
    assert meta["license"] == "MIT"
    assert "LICENSE" in meta["license-files"]  # type: ignore[operator]
    assert (HERE / "LICENSE").read_text().startswith("MIT License")
    assert meta["dynamic"] == ["version"]
