"""openapi.yaml is generated from the app; this fails when they drift."""

from __future__ import annotations

from pathlib import Path

from gateway.app import openapi_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_yaml_matches_the_app() -> None:
    committed = (ROOT / "openapi.yaml").read_text()
    generated = openapi_yaml()
    assert committed == generated, "openapi.yaml is stale: run `gateway openapi > openapi.yaml`"
