"""The suppression list API: listing, look-up, manual add/remove, bulk check."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import func, select

from gateway.services import Services
from suppression import service
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import normalize
from tests.conftest import bearer

MakeKey = Callable[..., Awaitable[str]]


async def _seed(services: Services, channel: str, raw: str, reason: str, **kw: Any) -> None:
    async with services.sessions() as s:
        await service.add(
            s,
            services.protector,
            normalize(channel, raw),
            reason=reason,
            source=service.Source("provider_event", "evt-1"),
            **kw,
        )
        await s.commit()


async def _history(services: Services) -> list[tuple[str, str, str]]:
    async with services.sessions() as s:
        rows = await s.execute(
            select(
                SuppressionHistory.action, SuppressionHistory.reason, SuppressionHistory.scope
            ).order_by(SuppressionHistory.id)
        )
        return [(a, r, s) for a, r, s in rows.all()]


async def test_manual_add_then_lookup_shows_entries_and_history(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    admin = bearer(await make_key("admin"))
    body = {"channel": "email", "address": "  Jane.Doe@Example.COM ", "reason": "manual"}
    r = await client.post("/v1/suppressions", json=body, headers=admin)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["created"] is True
    assert created["entry"]["address"] == "jane.doe@example.com"
    assert created["entry"]["scope"] == "all" and created["entry"]["source_type"] == "operator"
    # the same address in another spelling is the same entry: 200, nothing new
    r = await client.post(
        "/v1/suppressions", json={**body, "address": "JANE.DOE@example.com"}, headers=admin
    )
    assert r.status_code == 200 and r.json()["created"] is False

    reader = bearer(await make_key("read"))
    r = await client.get("/v1/suppressions/email/jane.doe@EXAMPLE.com", headers=reader)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["suppressed"] is True and data["address"] == "jane.doe@example.com"
    assert [e["reason"] for e in data["entries"]] == ["manual"]
    assert [h["action"] for h in data["history"]] == ["add", "add_existing"]
    assert all(h["actor"].startswith("api_key:") for h in data["history"])


async def test_add_validation(client: httpx.AsyncClient, make_key: MakeKey) -> None:
    admin = bearer(await make_key("admin"))
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).isoformat()
    cases = [
        ({"channel": "email", "address": "not-an-address", "reason": "manual"}, 422),
        ({"channel": "email", "address": "a@example.com", "reason": "bogus"}, 422),
        (
            {
                "channel": "email",
                "address": "a@example.com",
                "reason": "complaint",
                "scope": "news",
            },
            422,
        ),
        ({"channel": "email", "address": "a@example.com", "reason": "sms_stop"}, 422),
        (
            {
                "channel": "email",
                "address": "a@example.com",
                "reason": "manual",
                "expires_at": past,
            },
            422,
        ),
        ({"channel": "fax", "address": "a@example.com", "reason": "manual"}, 400),
        ({"channel": "email", "reason": "manual"}, 400),
    ]
    for body, status in cases:
        r = await client.post("/v1/suppressions", json=body, headers=admin)
        assert r.status_code == status, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    ok = {"channel": "sms", "address": "(202) 555-0143", "reason": "sms_stop", "expires_at": future}
    r = await client.post("/v1/suppressions", json=ok, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["entry"]["address"] == "+12025550143"
    # read keys cannot add
    r = await client.post("/v1/suppressions", json=ok, headers=bearer(await make_key("read")))
    assert r.status_code == 403


async def test_scope_rules_through_check(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed(services, "email", "unsub@example.com", "unsubscribe", scope="marketing")
    await _seed(services, "email", "bounced@example.com", "hard_bounce")
    await _seed(services, "email", "news@example.com", "unsubscribe", scope="newsletter")
    reader = bearer(await make_key("read"))
    addresses = ["unsub@example.com", "bounced@example.com", "news@example.com", "ok@example.com"]

    async def check(**extra: Any) -> dict[str, str]:
        body = {"channel": "email", "addresses": addresses, **extra}
        r = await client.post("/v1/suppressions/check", json=body, headers=reader)
        assert r.status_code == 200, r.text
        return {hit["address"]: hit["reason"] for hit in r.json()["suppressed"]}

    # a marketing unsubscribe never blocks transactional mail; a hard bounce blocks everything
    assert await check(category="transactional") == {"bounced@example.com": "hard_bounce"}
    assert await check() == {
        "unsub@example.com": "unsubscribe",
        "bounced@example.com": "hard_bounce",
    }
    assert await check(topic="newsletter") == {
        "news@example.com": "unsubscribe",
        "bounced@example.com": "hard_bounce",
    }


async def test_expired_entries_are_listed_inactive_and_do_not_suppress(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    await _seed(services, "email", "soft@example.com", "soft_bounce", expires_at=past)
    reader = bearer(await make_key("read"))
    r = await client.post(
        "/v1/suppressions/check",
        json={"channel": "email", "addresses": ["soft@example.com"], "category": "transactional"},
        headers=reader,
    )
    assert r.json()["suppressed"] == []
    r = await client.get("/v1/suppressions/email/soft@example.com", headers=reader)
    assert r.json()["suppressed"] is False
    assert [e["active"] for e in r.json()["entries"]] == [False]


async def test_check_many_addresses_in_one_request(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    for i in range(0, 10_000, 1000):
        await _seed(services, "email", f"user{i}@example.com", "complaint")
    reader = bearer(await make_key("read"))
    addresses = [f"user{i}@example.com" for i in range(10_000)]
    addresses[5] = "broken@@example"
    r = await client.post(
        "/v1/suppressions/check", json={"channel": "email", "addresses": addresses}, headers=reader
    )
    assert r.status_code == 200, r.text
    hits = r.json()["suppressed"]
    assert sorted(h["address"] for h in hits) == sorted(
        f"user{i}@example.com" for i in range(0, 10_000, 1000)
    )
    assert {h["reason"] for h in hits} == {"complaint"}
    assert [i["address"] for i in r.json()["invalid"]] == ["broken@@example"]
    r = await client.post(
        "/v1/suppressions/check",
        json={"channel": "email", "addresses": [*addresses, "one-too-many@example.com"]},
        headers=reader,
    )
    assert r.status_code == 400


async def test_removal_needs_reason_and_force_for_protected(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed(services, "email", "c@example.com", "complaint")
    await _seed(services, "email", "c@example.com", "unsubscribe", scope="marketing")
    await _seed(services, "sms", "+12025550143", "sms_stop")
    admin = bearer(await make_key("admin"))
    url = "/v1/suppressions/email/c@example.com"

    r = await client.delete(url, headers=admin)
    assert r.status_code == 400 and r.json()["type"] == "urn:problem:removal-reason-required"
    # the unsubscribe alone is not protected
    r = await client.delete(
        url, params={"reason": "resubscribed", "scope": "marketing"}, headers=admin
    )
    assert r.status_code == 200, r.text
    assert [e["reason"] for e in r.json()["removed"]] == ["unsubscribe"]
    # the complaint is
    r = await client.delete(url, params={"reason": "customer asked"}, headers=admin)
    assert r.status_code == 409 and r.json()["protected_reasons"] == ["complaint"]
    r = await client.delete(
        "/v1/suppressions/sms/+12025550143", params={"reason": "x"}, headers=admin
    )
    assert r.status_code == 409 and r.json()["protected_reasons"] == ["sms_stop"]
    async with services.sessions() as s:
        assert (await s.execute(select(func.count()).select_from(Suppression))).scalar_one() == 2
    r = await client.delete(
        url, params={"reason": "customer asked", "force": "true"}, headers=admin
    )
    assert r.status_code == 200 and [e["reason"] for e in r.json()["removed"]] == ["complaint"]
    r = await client.delete(url, params={"reason": "again"}, headers=admin)
    assert r.status_code == 404
    # every change is in history, the forced one marked as such
    history = await _history(services)
    assert history == [
        ("add", "complaint", "all"),
        ("add", "unsubscribe", "marketing"),
        ("add", "sms_stop", "all"),
        ("remove", "unsubscribe", "marketing"),
        ("remove", "complaint", "all"),
    ]
    r = await client.get(url, headers=admin)
    removal = r.json()["history"][-1]
    assert removal["details"] == {"removal_reason": "customer asked", "evidence": {"forced": True}}
    assert r.json()["suppressed"] is False


async def test_listing_filters_and_cursor_pagination(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    for i in range(7):
        await _seed(services, "email", f"p{i}@example.com", "hard_bounce")
    await _seed(services, "sms", "+12025550143", "sms_stop")
    await _seed(services, "email", "m@example.com", "unsubscribe", scope="marketing")
    reader = bearer(await make_key("read"))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"channel": "email", "reason": "hard_bounce", "limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/v1/suppressions", params=params, headers=reader)
        assert r.status_code == 200, r.text
        pages += 1
        seen += [item["address"] for item in r.json()["items"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [f"p{i}@example.com" for i in range(7)]
    r = await client.get("/v1/suppressions", params={"scope": "marketing"}, headers=reader)
    assert [i["address"] for i in r.json()["items"]] == ["m@example.com"]
    r = await client.get("/v1/suppressions", params={"channel": "sms"}, headers=reader)
    assert [i["reason"] for i in r.json()["items"]] == ["sms_stop"]
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
    r = await client.get("/v1/suppressions", params={"since": later}, headers=reader)
    assert r.json() == {"items": [], "next_cursor": None}
    for bad in ({"cursor": "nope"}, {"limit": 0}, {"limit": 1001}):
        r = await client.get("/v1/suppressions", params=bad, headers=reader)
        assert r.status_code == 400, bad


async def test_removal_reason_never_stores_the_address(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed(services, "sms", "+12025550143", "manual")
    await _seed(services, "email", "Kim@example.com", "manual")
    admin = bearer(await make_key("admin"))
    reasons = {
        "/v1/suppressions/sms/+12025550143": "owner of +1 (202) 555-0143 aka 2025550143 asked",
        "/v1/suppressions/email/kim@example.com": "KIM@EXAMPLE.COM wrote from kim@other.example",
    }
    for url, reason in reasons.items():
        r = await client.delete(url, params={"reason": reason}, headers=admin)
        assert r.status_code == 200, r.text
    async with services.sessions() as s:
        details = (
            (
                await s.execute(
                    select(SuppressionHistory.details).where(SuppressionHistory.action == "remove")
                )
            )
            .scalars()
            .all()
        )
    assert sorted(d["removal_reason"] for d in details) == [
        "[address] wrote from [address]",
        "owner of [address] aka [address] asked",
    ]
