"""The callback path's budget of round trips (DESIGN "Hot paths are budgets").

Round trips are counted on the asyncpg connections (statements, BEGIN/COMMIT and prepares),
after one warm-up call that fills the per-connection statement caches.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from asyncpg.prepared_stmt import PreparedStatement

from gateway.services import Services
from tests.webhooks.feedback import PHONE, make_delivery, status_params


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Counts round trips to PostgreSQL by kind, while the test runs."""
    counts: collections.Counter[str] = collections.Counter()
    conn = asyncpg.connection.Connection

    def counting(kind: str, original: Any, when: Any = None) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if when is None or when(args, kwargs):
                counts[kind] += 1
            return await original(*args, **kwargs)

        return wrapper

    # `execute` without arguments is a simple query (BEGIN, COMMIT, ...); with arguments it
    # goes through `_execute`, like fetch/fetchrow/fetchval.
    monkeypatch.setattr(
        conn, "execute", counting("simple", conn.execute, lambda a, kw: len(a) == 2)
    )
    monkeypatch.setattr(conn, "_execute", counting("statement", conn._execute))
    monkeypatch.setattr(conn, "prepare", counting("prepare", conn.prepare))
    for name in ("fetch", "fetchrow", "fetchval"):
        monkeypatch.setattr(
            PreparedStatement, name, counting("statement", getattr(PreparedStatement, name))
        )
    yield counts


async def _callback(services: Services, sid: str, status: str, token: str) -> list[str]:
    ingestor = services.ingestor
    params = status_params(sid, status, to=PHONE)
    got: list[str] = await ingestor.twilio_status(params, query={}, idempotency_token=token)
    return got


async def test_twilio_delivered_and_its_duplicate_stay_in_budget(
    services: Services, round_trips: collections.Counter[str]
) -> None:
    # Warm-up: the same statements once, so that the caches hold them.
    await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMwarm")])
    assert await _callback(services, "SMwarm", "delivered", "warm") == ["applied"]
    assert await _callback(services, "SMwarm", "delivered", "warm") == ["duplicate"]
    await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMb")])

    round_trips.clear()
    assert await _callback(services, "SMb", "delivered", "new") == ["applied"]
    # duplicate check, BEGIN, locked look-up, update, insert, COMMIT
    assert sum(round_trips.values()) <= 6, round_trips

    round_trips.clear()
    assert await _callback(services, "SMb", "delivered", "new") == ["duplicate"]
    assert sum(round_trips.values()) == 1, round_trips
