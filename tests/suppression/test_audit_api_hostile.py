"""Audit: odd input to the authenticated suppression and subject routes is a 4xx, never a 500.

Two kinds of value used to reach the database and fail there (a 500): text with U+0000
(PostgreSQL text and jsonb cannot hold it) and times at the calendar's edge with an offset
(``0001-01-01T00:00:00+14:00`` parses but has no UTC equivalent). Each is refused as a
problem document now, or (import rows) reported as an invalid row.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from gateway.services import Services
from suppression.models import Suppression
from tests.conftest import bearer

EDGE = "0001-01-01T00:00:00%2B14:00"
# A cursor as the API encodes it, holding that time.
EDGE_CURSOR = (
    "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzE0OjAwIiwiMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAiXQ"
)
ADD = {"channel": "email", "address": "c@example.com", "reason": "manual"}

CASES: list[tuple[str, str, dict[str, Any], int]] = [
    ("GET", "/v1/suppressions?reason=%00", {}, 400),
    ("GET", "/v1/suppressions?reason=nonsense", {}, 400),
    ("GET", "/v1/suppressions?scope=%00", {}, 400),
    ("GET", f"/v1/suppressions?since={EDGE}", {}, 400),
    ("GET", f"/v1/suppressions?cursor={EDGE_CURSOR}", {}, 400),
    ("GET", f"/v1/suppressions/export?since={EDGE}", {}, 400),
    ("POST", "/v1/suppressions", {"json": {**ADD, "expires_at": "9999-12-31T23:59:59-14:00"}}, 422),
    ("POST", "/v1/suppressions", {"json": {**ADD, "scope": "\x00"}}, 422),
    (
        "POST",
        "/v1/suppressions/check",
        {"json": {"channel": "email", "addresses": ["a@example.com"], "topic": "\x00"}},
        422,
    ),
    ("DELETE", "/v1/suppressions/email/a@example.com?reason=x&scope=%00", {}, 400),
    ("DELETE", "/v1/suppressions/email/a@example.com?reason=x%00y", {}, 400),
    # NUL in the path: refused by the input gate before the address is read.
    ("GET", "/v1/suppressions/email/a%00@example.com", {}, 400),
    ("DELETE", "/v1/subjects/email/a%00@example.com", {}, 400),
    ("POST", "/v1/suppressions/import?unsubscribe_scope=%00", {"content": b"x"}, 400),
]


@pytest.mark.parametrize(("method", "url", "kwargs", "status"), CASES)
async def test_odd_values_are_refused_with_a_problem_document(
    client: httpx.AsyncClient,
    make_key: Any,
    services: Services,
    method: str,
    url: str,
    kwargs: dict[str, Any],
    status: int,
) -> None:
    headers = bearer(await make_key("read", "admin", "export"))
    response = await client.request(method, url, headers=headers, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    async with services.sessions() as s:
        assert await s.scalar(select(func.count()).select_from(Suppression)) == 0


async def test_import_reports_rows_with_nul_or_edge_times_and_keeps_the_rest(
    client: httpx.AsyncClient, make_key: Any
) -> None:
    headers = bearer(await make_key("admin"))
    jsonl = (
        b'{"channel":"email","address":"e@example.com","reason":"manual",'
        b'"expires_at":"9999-12-31T23:59:59-14:00"}\n'
        b'{"channel":"email","address":"f@example.com","reason":"manual","scope":"a\\u0000"}\n'
        b'{"channel":"email","address":"g@example.com","reason":"manual",'
        b'"source_id":"evt\\u0000-1"}\n'
    )
    response = await client.post("/v1/suppressions/import", content=jsonl, headers=headers)
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["added"], report["invalid_count"]) == (0, 3)
    assert [row["line"] for row in report["invalid"]] == [1, 2, 3]
    # ... and a clean row after them is still imported.
    clean = b'{"channel":"email","address":"h@example.com","reason":"manual"}\n'
    response = await client.post("/v1/suppressions/import", content=jsonl + clean, headers=headers)
    assert (response.json()["added"], response.json()["invalid_count"]) == (1, 3)


async def test_erasure_with_a_nul_in_the_address_spelling_is_refused(
    client: httpx.AsyncClient, make_key: Any
) -> None:
    # phonenumbers ignores the trailing NUL, which once reached SQL (a 500); the input gate
    # now refuses any NUL in the path before the address is read.
    headers = bearer(await make_key("admin"))
    response = await client.delete("/v1/subjects/sms/%2B12025550143%00", headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "urn:problem:invalid-text"
