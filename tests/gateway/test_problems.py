"""Every error response is an RFC 9457 problem document; oversized bodies get 413."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from gateway.app import create_app
from gateway.services import build_services
from gateway.settings import Settings
from tests.conftest import bearer, replace_settings


async def test_unknown_route_is_404_problem(client: httpx.AsyncClient) -> None:
    response = await client.get("/no/such/thing")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["status"] == 404


async def test_wrong_method_is_405_problem(client: httpx.AsyncClient) -> None:
    response = await client.put("/healthz")
    assert response.status_code == 405
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_malformed_json_is_400_problem(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    admin = await make_key("admin")
    response = await client.post(
        "/v1/keys",
        content=b"{not json",
        headers={**bearer(admin), "content-type": "application/json"},
    )
    assert response.status_code == 400
    body = response.json()
    assert response.headers["content-type"].startswith("application/problem+json")
    assert body["status"] == 400 and body["type"] != "urn:problem:internal"


async def test_body_over_the_limit_is_413(
    settings: Settings, make_key: Callable[..., Awaitable[str]]
) -> None:
    small = replace_settings(settings, max_body_bytes=2048)
    assert small.database_url is not None
    services = build_services(small, small.database_url)
    try:
        app = create_app(services)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            admin = await make_key("admin")
            big = b'{"scopes": ["read"], "name": "' + b"x" * 4096 + b'"}'
            response = await c.post(
                "/v1/keys",
                content=big,
                headers={**bearer(admin), "content-type": "application/json"},
            )
            assert response.status_code == 413
            assert response.headers["content-type"].startswith("application/problem+json")
            ok = await c.post("/v1/keys", json={"scopes": ["read"]}, headers=bearer(admin))
            assert ok.status_code == 201
    finally:
        await services.close()


async def test_readyz_reports_database_and_redis(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    checks = response.json()["checks"]
    assert checks["database"]["ok"] and checks["redis"]["ok"]


async def test_readyz_is_503_when_the_database_is_unreachable(settings: Settings) -> None:
    broken = replace_settings(settings)
    services = build_services(broken, "postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            response = await c.get("/readyz")
            assert response.status_code == 503
            assert response.json()["checks"]["database"]["ok"] is False
            assert (await c.get("/healthz")).status_code == 200
    finally:
        await services.close()


async def test_deeply_nested_json_is_400_not_500(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("admin")
    depth = 5000
    body = '{"scopes": ["read"], "name": ' + "[" * depth + "]" * depth + "}"
    response = await client.post(
        "/v1/keys", content=body, headers={**bearer(secret), "content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/problem+json")


def test_cli_time_arguments_reject_times_utc_cannot_hold() -> None:
    import argparse

    import pytest

    from gateway.cli import _iso_time

    assert _iso_time("2026-01-01T12:00:00+02:00").isoformat() == "2026-01-01T10:00:00+00:00"
    with pytest.raises(argparse.ArgumentTypeError):
        _iso_time("0001-01-01T00:00:00+14:00")
    with pytest.raises(argparse.ArgumentTypeError):
        _iso_time("2026-01-01T12:00:00")
