"""openapi.yaml is generated from the app; this fails when they drift."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from litestar.testing import TestClient

from gateway.app import create_app, openapi_yaml
from tests.conftest import bearer

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_yaml_matches_the_app() -> None:
    committed = (ROOT / "openapi.yaml").read_text()
    generated = openapi_yaml()
    assert committed == generated, "openapi.yaml is stale: run `gateway openapi > openapi.yaml`"


def test_served_schema_is_the_committed_one() -> None:
    """/schema/openapi.json (completed at startup) says what openapi.yaml says."""
    with TestClient(create_app()) as client:
        served = client.get("/schema/openapi.json").json()
    assert served == yaml.safe_load((ROOT / "openapi.yaml").read_text())


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def test_every_error_is_a_problem_document_and_guarded_routes_say_so() -> None:
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert document["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status"]
    for path, method, operation in _operations(document):
        for status, response in operation["responses"].items():
            if int(status) < 400 or (path, status) == ("/readyz", "503"):
                continue
            assert set(response["content"]) == {"application/problem+json"}, (path, method)
        if path.startswith("/v1/"):
            assert operation["security"], (path, method)
            assert {"401", "403"} <= set(operation["responses"]), (path, method)
        else:
            assert "security" not in operation, (path, method)


def test_channels_are_enums_and_the_removal_reason_is_required() -> None:
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    for path in ("/v1/suppressions/{channel}/{address}", "/v1/subjects/{channel}/{address}"):
        for operation in document["paths"][path].values():
            channel = next(p for p in operation["parameters"] if p["name"] == "channel")
            assert channel["schema"]["enum"] == ["email", "sms"]
    removal = document["paths"]["/v1/suppressions/{channel}/{address}"]["delete"]
    reason = next(p for p in removal["parameters"] if p["name"] == "reason")
    assert reason["required"] is True and reason["schema"]["type"] == "string"
    send = document["paths"]["/v1/messages"]["post"]
    key = next(p for p in send["parameters"] if p["name"] == "Idempotency-Key")
    assert key["required"] is True


async def test_options_lists_every_method_of_a_path(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    # Litestar 2 listed only the first handler's method for a path with several handlers.
    admin = bearer(await make_key("admin"))
    cases = {
        "/v1/suppressions/email/a@example.com": "DELETE, GET, OPTIONS",
        "/v1/subjects/sms/+15005550006": "DELETE, GET, OPTIONS",
        "/v1/dlq/7b7e2a5e-8f55-4a52-9d0b-2b6b3a0e6d11": "DELETE, GET, OPTIONS",
        "/unsubscribe/some-token": "GET, OPTIONS, POST",
        "/v1/keys": "GET, OPTIONS, POST",
    }
    for path, allow in cases.items():
        response = await client.options(path, headers=admin)
        assert response.status_code == 204
        assert response.headers["allow"] == allow, path


async def test_metrics_is_prometheus_text_with_one_charset(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


async def test_scopes_are_matched_whole_and_key_scopes_exactly(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    """What the document's patterns and enums say is what the handlers check: a scope with a
    trailing newline is no scope (Python's `$` matched before it), and the API takes scope
    names exactly."""
    admin = bearer(await make_key("admin"))
    entry = {"channel": "email", "address": "a@example.com", "reason": "unsubscribe"}
    response = await client.post(
        "/v1/suppressions", json={**entry, "scope": "news\n"}, headers=admin
    )
    assert response.status_code == 422, response.text
    listed = await client.get("/v1/suppressions", params={"scope": "news\n"}, headers=admin)
    assert listed.status_code == 400
    created = await client.post("/v1/keys", json={"scopes": [" send"]}, headers=admin)
    assert created.status_code == 422
    assert created.headers["content-type"].startswith("application/problem+json")
