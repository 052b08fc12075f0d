"""Audit: bad input to the dead-letter API gets a 4xx problem document, never a 500.

Times that are valid ISO 8601 but cannot be represented in UTC (`0001-01-01T00:00:00+14:00`)
used to reach the database driver and fail there.
"""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest

from retry import dlq
from tests.conftest import bearer

_LOW = "0001-01-01T00:00:00+14:00"
_HIGH = "9999-12-31T23:59:59-14:00"


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "params",
    [
        {"since": _LOW},
        {"until": _HIGH},
        {"cursor": _cursor(f"{_LOW}|{uuid.UUID(int=0)}")},
        {"cursor": _cursor("not a time|x")},
        {"since": "yesterday"},
        {"state": "closed"},
        {"limit": "0"},
    ],
)
async def test_bad_list_parameters_are_400(
    client: httpx.AsyncClient,
    make_key: Callable[..., Awaitable[str]],
    params: dict[str, str],
) -> None:
    headers = bearer(await make_key("admin"))
    response = await client.get("/v1/dlq", params=params, headers=headers)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


@pytest.mark.parametrize("body", [{"since": _LOW}, {"until": _HIGH}, {"since": "x"}, [1]])
async def test_bad_bulk_redrive_filters_are_400(
    client: httpx.AsyncClient,
    make_key: Callable[..., Awaitable[str]],
    body: object,
) -> None:
    headers = bearer(await make_key("admin"))
    response = await client.post("/v1/dlq/redrive", json=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


def test_utc_time() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert dlq.utc_time(dt.datetime(2030, 1, 1, 2, tzinfo=plus_two)) == dt.datetime(
        2030, 1, 1, tzinfo=dt.UTC
    )
    assert dlq.utc_time(dt.datetime(2030, 1, 1)).tzinfo is dt.UTC
    with pytest.raises(ValueError, match="out of range"):
        dlq.utc_time(dt.datetime.fromisoformat(_LOW))
    # A cursor keeps working across the change (round trip).
    at, ident = dt.datetime(2030, 1, 1, tzinfo=dt.UTC), uuid.uuid4()
    assert dlq.decode_cursor(dlq.encode_cursor(at, ident)) == (at, ident)
