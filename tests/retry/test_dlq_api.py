"""The dead-letter queue API: list/filter/paginate, show, redrive (one and bulk), discard."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable

import httpx
from sqlalchemy import select, update

from gateway.services import Services
from retry.models import DeadLetter
from sender import log as dlog
from suppression.db import pg_of, utcnow
from tests.conftest import bearer
from tests.retry.helpers import insert_deliveries
from tests.support.tables import attempts, deliveries

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


async def _dead(
    services: Services, n: int, *, reason: str, channel: str = "sms", at: dt.datetime = T0
) -> list[uuid.UUID]:
    """n dead-lettered deliveries (entries dated `at`, one second apart); returns entry ids."""
    ids = []
    async with services.sessions() as s, s.begin():
        delivery_ids = await insert_deliveries(s, n, channel=channel, attempts_made=1)
        for i, delivery_id in enumerate(delivery_ids):
            await s.execute(
                attempts.insert().values(
                    id=uuid.uuid4(),
                    delivery_id=delivery_id,
                    number=1,
                    status="transient",
                    provider="twilio",
                    error_code="30003",
                    error_message="unreachable",
                    started_at=at,
                    finished_at=at,
                )
            )
            entry = await dlog.dead_letter(
                await pg_of(s),
                delivery_id,
                reason=reason,
                last_error="30003 unreachable",
                now=utcnow(),
            )
            await s.execute(
                update(DeadLetter)
                .where(DeadLetter.id == entry)
                .values(created_at=at + dt.timedelta(seconds=i))
            )
            ids.append(entry)
    return ids


async def _admin(make_key: Callable[..., Awaitable[str]]) -> dict[str, str]:
    return bearer(await make_key("admin"))


async def test_scope_admin_is_required(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    assert (await client.get("/v1/dlq")).status_code == 401
    read = bearer(await make_key("send", "read", "export"))
    assert (await client.get("/v1/dlq", headers=read)).status_code == 403
    assert (await client.post("/v1/dlq/redrive", headers=read)).status_code == 403


async def test_list_filters_and_cursor_pagination(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    headers = await _admin(make_key)
    expired = await _dead(services, 3, reason="expired", at=T0)
    exhausted = await _dead(
        services, 4, reason="max_attempts", channel="email", at=T0 + dt.timedelta(hours=1)
    )

    page = (await client.get("/v1/dlq", headers=headers)).json()
    assert [i["id"] for i in page["items"]] == [str(e) for e in reversed(expired + exhausted)]
    assert page["next_cursor"] is None
    item = page["items"][0]
    assert item["state"] == "open" and item["delivery_status"] == "dead"
    assert item["channel"] == "email" and item["last_error"] == "30003 unreachable"
    assert "attempt_history" not in item

    by_reason = (await client.get("/v1/dlq", params={"reason": "expired"}, headers=headers)).json()
    assert {i["id"] for i in by_reason["items"]} == {str(e) for e in expired}
    by_channel = (await client.get("/v1/dlq", params={"channel": "email"}, headers=headers)).json()
    assert {i["id"] for i in by_channel["items"]} == {str(e) for e in exhausted}
    window = {
        "since": (T0 + dt.timedelta(seconds=1)).isoformat(),
        "until": (T0 + dt.timedelta(hours=1, seconds=2)).isoformat(),
    }
    by_time = (await client.get("/v1/dlq", params=window, headers=headers)).json()
    assert {i["id"] for i in by_time["items"]} == {str(e) for e in expired[1:] + exhausted[:2]}

    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/v1/dlq", params=params, headers=headers)
        assert response.status_code == 200
        body = response.json()
        assert len(body["items"]) <= 3
        seen += [i["id"] for i in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(e) for e in reversed(expired + exhausted)]

    bad = await client.get("/v1/dlq", params={"cursor": "not-a-cursor"}, headers=headers)
    assert bad.status_code == 400
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert (
        await client.get("/v1/dlq", params={"state": "lost"}, headers=headers)
    ).status_code == 400
    assert (await client.get("/v1/dlq", params={"limit": 0}, headers=headers)).status_code == 400


async def test_show_has_the_attempt_history(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    headers = await _admin(make_key)
    (entry,) = await _dead(services, 1, reason="max_attempts")
    body = (await client.get(f"/v1/dlq/{entry}", headers=headers)).json()
    assert body["reason"] == "max_attempts"
    (attempt,) = body["attempt_history"]
    assert attempt["number"] == 1 and attempt["status"] == "transient"
    assert attempt["error_code"] == "30003" and attempt["error"] == "unreachable"
    missing = await client.get(f"/v1/dlq/{uuid.uuid4()}", headers=headers)
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")


async def test_redrive_one(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    headers = await _admin(make_key)
    entry, moved_on = await _dead(services, 2, reason="max_attempts")
    before = utcnow()
    response = await client.post(
        f"/v1/dlq/{entry}/redrive", json={"note": "provider fixed"}, headers=headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "redriven" and body["resolution_reason"] == "provider fixed"
    assert body["resolved_by"].startswith("api_key:") and body["delivery_status"] == "queued"
    async with services.sessions() as s:
        row = (
            await s.execute(
                select(
                    deliveries.c.status, deliveries.c.attempts, deliveries.c.next_attempt_at
                ).where(deliveries.c.id == uuid.UUID(body["delivery_id"]))
            )
        ).one()
        kept = await s.scalar(
            select(attempts.c.number).where(
                attempts.c.delivery_id == uuid.UUID(body["delivery_id"])
            )
        )
    assert row.status == "queued" and row.attempts == 0 and row.next_attempt_at >= before
    assert kept == 1  # the attempt history stays

    again = await client.post(f"/v1/dlq/{entry}/redrive", headers=headers)
    assert again.status_code == 409
    # a late provider callback showed the other one was delivered after all: no redrive
    async with services.sessions() as s, s.begin():
        other = await s.scalar(select(DeadLetter.delivery_id).where(DeadLetter.id == moved_on))
        await s.execute(
            deliveries.update().where(deliveries.c.id == other).values(status="delivered")
        )
    refused = await client.post(f"/v1/dlq/{moved_on}/redrive", headers=headers)
    assert refused.status_code == 409 and "delivered" in refused.json()["detail"]
    assert (
        await client.post(f"/v1/dlq/{uuid.uuid4()}/redrive", headers=headers)
    ).status_code == 404


async def test_bulk_redrive_by_filters(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    headers = await _admin(make_key)
    expired = await _dead(services, 5, reason="expired")
    other = await _dead(services, 2, reason="max_attempts")
    response = await client.post("/v1/dlq/redrive", json={"reason": "expired"}, headers=headers)
    assert response.status_code == 200
    assert response.json() == {"redriven": 5, "skipped_expired": 0}
    open_now = (await client.get("/v1/dlq", headers=headers)).json()["items"]
    assert {i["id"] for i in open_now} == {str(e) for e in other}
    redriven = (await client.get("/v1/dlq", params={"state": "redriven"}, headers=headers)).json()
    assert {i["id"] for i in redriven["items"]} == {str(e) for e in expired}
    # nothing left to take for the same filter
    again = await client.post("/v1/dlq/redrive", json={"reason": "expired"}, headers=headers)
    assert again.json() == {"redriven": 0, "skipped_expired": 0}
    everything = await client.post("/v1/dlq/redrive", json={"all": True}, headers=headers)
    assert everything.json() == {"redriven": 2, "skipped_expired": 0}


async def test_bulk_redrive_needs_a_filter_or_all(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    # Without a body (or with an empty one) every open entry used to be redriven.
    headers = await _admin(make_key)
    entries = await _dead(services, 2, reason="max_attempts")
    for body in (None, {}, {"note": "go"}, {"all": False}):
        response = await client.post("/v1/dlq/redrive", json=body, headers=headers)
        assert response.status_code == 422, (body, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["type"] == "urn:problem:redrive-filter-required"
    open_now = (await client.get("/v1/dlq", headers=headers)).json()["items"]
    assert {i["id"] for i in open_now} == {str(e) for e in entries}
    unknown = await client.post("/v1/dlq/redrive", json={"everything": True}, headers=headers)
    assert unknown.status_code == 400
    response = await client.post("/v1/dlq/redrive", json={"all": True}, headers=headers)
    assert response.json() == {"redriven": 2, "skipped_expired": 0}


async def _expire(services: Services, entry: uuid.UUID) -> None:
    """Move the deadline of the entry's delivery into the past."""
    async with services.sessions() as s, s.begin():
        delivery_id = (
            await s.execute(select(DeadLetter.delivery_id).where(DeadLetter.id == entry))
        ).scalar_one()
        await s.execute(
            update(deliveries)
            .where(deliveries.c.id == delivery_id)
            .values(expires_at=utcnow() - dt.timedelta(minutes=1))
        )


async def test_redriving_an_expired_entry_is_refused_not_refiled(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    # Redriven, a delivery past its deadline would be dead-lettered again at once (a new
    # entry each time): one redrive says so with 409; a bulk one leaves it open and counts it.
    headers = await _admin(make_key)
    expired_entry, live_entry = await _dead(services, 2, reason="expired")
    await _expire(services, expired_entry)
    response = await client.post(f"/v1/dlq/{expired_entry}/redrive", headers=headers)
    assert response.status_code == 409, response.text
    assert response.json()["type"] == "urn:problem:dlq-expired"
    assert "deadline" in response.json()["detail"]
    bulk = await client.post("/v1/dlq/redrive", json={"reason": "expired"}, headers=headers)
    assert bulk.json() == {"redriven": 1, "skipped_expired": 1}
    shown = (await client.get(f"/v1/dlq/{expired_entry}", headers=headers)).json()
    assert (shown["state"], shown["delivery_status"]) == ("open", "dead")
    assert (await client.get(f"/v1/dlq/{live_entry}", headers=headers)).json()["state"] == (
        "redriven"
    )
    async with services.sessions() as s:
        assert len((await s.execute(select(DeadLetter.id))).all()) == 2


async def test_discard_needs_a_reason_and_keeps_history(
    services: Services, client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    headers = await _admin(make_key)
    (entry,) = await _dead(services, 1, reason="unknown_outcome")
    assert (await client.delete(f"/v1/dlq/{entry}", headers=headers)).status_code == 400
    response = await client.delete(
        f"/v1/dlq/{entry}", params={"reason": "customer asked to drop it"}, headers=headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "discarded" and body["resolution_reason"] == "customer asked to drop it"
    assert body["delivery_status"] == "dead"
    assert (await client.get("/v1/dlq", headers=headers)).json()["items"] == []
    history = (await client.get("/v1/dlq", params={"state": "all"}, headers=headers)).json()
    assert [i["id"] for i in history["items"]] == [str(entry)]
    assert (await client.get(f"/v1/dlq/{entry}", headers=headers)).json()["state"] == "discarded"
    again = await client.delete(f"/v1/dlq/{entry}", params={"reason": "x"}, headers=headers)
    assert again.status_code == 409
    assert (await client.post(f"/v1/dlq/{entry}/redrive", headers=headers)).status_code == 409
