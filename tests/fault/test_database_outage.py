"""Defect 1 of the fault drills: a database outage is a 503 with Retry-After on every route,
broken pooled connections are dropped, and the gateway recovers without a restart.

The app runs in-process on a real PostgreSQL reached through a TCP proxy that the tests cut
(connections refused, open ones dropped) and restore; backends are also terminated with
`pg_terminate_backend` while the server stays up.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from redis import exceptions as redis_exc
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import Services, build_services
from gateway.settings import Settings
from suppression.db import is_database_unavailable
from tests.conftest import replace_settings
from tests.fault.proxy import TcpProxy

SMS = {"channel": "sms", "to": ["+15005550006"], "body": "Code 123456"}

# Every kind of route that needs the database: auth-only look-ups, reads, writes, streams.
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/keys", None),
    ("POST", "/v1/messages", SMS),
    ("GET", f"/v1/messages/{uuid.uuid4()}", None),
    ("GET", "/v1/suppressions", None),
    ("POST", "/v1/suppressions/check", {"channel": "sms", "addresses": ["+15005550006"]}),
    (
        "POST",
        "/v1/suppressions",
        {"channel": "sms", "address": "+15005550009", "reason": "manual"},
    ),
    ("GET", "/v1/subjects/sms/+15005550006", None),
    ("GET", "/v1/dlq", None),
    ("POST", "/v1/keys", {"scopes": ["read"], "name": "x"}),
    ("GET", "/v1/reputation", None),
    ("POST", "/v1/reputation/example.com/resume", {"reason": "drill"}),
    ("GET", "/v1/reports/stale", None),
]


@pytest.fixture
def proxy(settings: Settings) -> Iterator[TcpProxy]:
    assert settings.database_url is not None
    with TcpProxy.for_url(settings.database_url) as p:
        yield p


@pytest.fixture
async def outage_gateway(
    settings: Settings, proxy: TcpProxy
) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    assert settings.database_url is not None
    url = proxy.proxied_url(settings.database_url)
    # No key cache: every request looks its key up, as after the cache's 5 s.
    svc = build_services(replace_settings(settings, database_url=url, api_key_cache_seconds=0), url)
    transport = httpx.ASGITransport(app=create_app(svc), client=("203.0.113.7", 4711))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            yield svc, c
    finally:
        await svc.close()


async def _admin(services: Services) -> dict[str, str]:
    async with services.sessions() as session:
        _, secret = await create_key(session, ["admin"], name="drill")
        await session.commit()
    return {"Authorization": f"Bearer {secret}"}


async def _call(
    client: httpx.AsyncClient, headers: dict[str, str], method: str, path: str, body: Any
) -> httpx.Response:
    h = {**headers, "Idempotency-Key": f'"{uuid.uuid4()}"'}
    return await client.request(method, path, json=body, headers=h)


def _assert_unavailable(r: httpx.Response, what: str) -> None:
    assert r.status_code == 503, (what, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), what
    assert int(r.headers["retry-after"]) > 0, what
    assert r.json()["type"] == "urn:problem:temporarily-unavailable", what


async def test_every_route_answers_503_while_the_database_is_unreachable_then_recovers(
    outage_gateway: tuple[Services, httpx.AsyncClient], proxy: TcpProxy
) -> None:
    services, client = outage_gateway
    admin = await _admin(services)
    for method, path, body in ROUTES:  # the pool now holds live connections
        r = await _call(client, admin, method, path, body)
        assert r.status_code < 500, (path, r.status_code, r.text)

    proxy.down()
    for method, path, body in ROUTES:
        _assert_unavailable(await _call(client, admin, method, path, body), f"{method} {path}")
    # An unknown key cannot be told from a known one while the keys cannot be read: 503, not 401.
    _assert_unavailable(
        await _call(client, {"Authorization": "Bearer gw_nope"}, "GET", "/v1/keys", None),
        "unknown key",
    )
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"]["ok"] is False

    proxy.up()
    # No restart: the stale connections were dropped and the next requests work.
    for method, path, body in ROUTES:
        r = await _call(client, admin, method, path, body)
        assert r.status_code < 500, (method, path, r.status_code, r.text)
    assert (await client.get("/readyz")).json()["checks"]["database"]["ok"] is True


def _terminate_backends(database_url: str) -> int:
    url = make_url(database_url)
    admin = create_engine(
        url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False),
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
            )
    finally:
        admin.dispose()


async def test_terminated_backends_give_no_500_and_are_replaced(
    outage_gateway: tuple[Services, httpx.AsyncClient], settings: Settings
) -> None:
    services, client = outage_gateway
    assert settings.database_url is not None
    admin = await _admin(services)
    # Fill the pool with several live connections, then kill every backend behind them.
    results = await asyncio.gather(
        *(_call(client, admin, "POST", "/v1/messages", SMS) for _ in range(8))
    )
    assert all(r.status_code < 300 for r in results), [r.text for r in results]
    assert _terminate_backends(settings.database_url) > 0

    first = await asyncio.gather(
        *(_call(client, admin, m, p, b) for m, p, b in ROUTES for _ in range(2))
    )
    for r in first:
        assert r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)
        if r.status_code == 503:
            assert "retry-after" in r.headers
    # Connections of the killed backends never come back: everything works again.
    for method, path, body in ROUTES:
        r = await _call(client, admin, method, path, body)
        assert r.status_code < 500, (method, path, r.status_code, r.text)


def _raised(outer: BaseException, inner: BaseException) -> BaseException:
    """`outer` raised while handling `inner` (implicit context, as libraries do)."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is the point
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "unavailable"),
    [
        (ConnectionRefusedError(111, "refused"), True),
        (FileNotFoundError(2, "no socket"), True),  # the embedded server died
        (asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation"), True),
        (asyncpg.InterfaceError("connection is closed"), True),
        (asyncpg.exceptions.CannotConnectNowError("starting up"), True),
        (sa_exc.TimeoutError("QueuePool limit reached"), True),
        (_raised(sa_exc.InterfaceError("s", {}, Exception("x")), OSError("reset")), True),
        (asyncpg.exceptions.UniqueViolationError("duplicate key"), False),
        (ValueError("a bug"), False),
        # Redis wraps its own connection failures around an OSError: not the database.
        (_raised(redis_exc.ConnectionError("Error 111"), ConnectionRefusedError(111, "")), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_what_counts_as_the_database_being_unavailable(
    exc: BaseException, unavailable: bool
) -> None:
    assert is_database_unavailable(exc) is unavailable
