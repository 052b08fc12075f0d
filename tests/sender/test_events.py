"""Outbound events: the outbox triggers and the commit-ordered feed (`sender.events`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from gateway.app import create_app
from gateway.services import Services, build_services
from gateway.settings import Settings
from gateway.worker import event_pruner
from sender import events
from sender import log as dlog
from suppression import service as suppression
from suppression.db import pg_connection
from suppression.normalize import normalize
from tests.conftest import bearer, replace_settings
from tests.sender.helpers import email
from tests.webhooks.feedback import PHONE, make_delivery, status_params
from tests.webhooks.signing import twilio_signature

TOKEN = "events-test-auth-token"


async def _send(client: httpx.AsyncClient, secret: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(
        "/v1/messages",
        json=body,
        headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert r.status_code in (201, 202), r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _feed(services: Services, *, limit: int = 100, **kw: Any) -> list[events.Event]:
    """Every event visible now, read page by page."""
    out: list[events.Event] = []
    after = kw.pop("after", None)
    async with pg_connection(services.engine) as conn:
        while True:
            page, after = await events.read_feed(
                conn,
                after=after,
                limit=limit,
                client_id=kw.get("client_id"),
                types=kw.get("types"),
                protector=services.protector,
            )
            out.extend(page)
            if len(page) < limit:
                return out


async def test_bounce_yields_sent_bounced_then_suppression_added(
    client: httpx.AsyncClient, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("send", "read")
    sent = await _send(
        client, secret, {**email("bounce@simulator.amazonses.com"), "metadata": {"user": "42"}}
    )
    await services.sandbox_feedback.drain()
    feed = await _feed(services)
    assert [e.type for e in feed] == ["delivery.sent", "delivery.bounced", "suppression.added"]
    first, bounced, added = feed
    assert first.data == {
        "message_id": sent["id"],
        "delivery_id": sent["deliveries"][0]["id"],
        "channel": "email",
        "to": "bounce@simulator.amazonses.com",
        "status": "sent",
        "previous_status": "sending",
        "reason": None,
        "provider": first.data["provider"],
        "provider_message_id": first.data["provider_message_id"],
        "category": "transactional",
        "topic": None,
        "metadata": {"user": "42"},
    }
    assert first.data["provider_message_id"]
    assert (bounced.data["status"], bounced.data["previous_status"]) == ("bounced", "sent")
    assert bounced.data["reason"] == "hard_bounce"
    assert added.data == {
        "channel": "email",
        "address": "bounce@simulator.amazonses.com",
        "scope": "all",
        "reason": "hard_bounce",
        "source": "provider_event",
    }
    assert added.message_owner is None and first.message_owner is not None
    assert len({e.id for e in feed}) == 3 and all(e.id.startswith("evt_") for e in feed)
    payload = bounced.payload()
    assert set(payload) == {"id", "type", "occurred_at", "data"}
    assert payload["type"] == "delivery.bounced"

    # A second send to the suppressed address is claimed `suppressed` (an insert, not an
    # update): its event says so, with no previous status.
    again = await _send(client, secret, email("bounce@simulator.amazonses.com"))
    [suppressed] = await _feed(services, after=added.cursor)
    assert suppressed.type == "delivery.suppressed"
    assert suppressed.data["delivery_id"] == again["deliveries"][0]["id"]
    assert suppressed.data["previous_status"] is None
    # the claim's message row (same statement) is seen by the trigger: the owner is known
    assert suppressed.message_owner == first.message_owner


async def test_suppression_removed_says_who_removed_it(services: Services) -> None:
    address = normalize("email", "gone@example.com")
    address_hash = services.protector.hash("email", address.key)
    source = suppression.Source(type="operator", id="ops", actor="ops")
    async with pg_connection(services.engine) as conn:
        await suppression.add(conn, services.protector, address, reason="manual", source=source)
        # an existing entry again: no change, no event
        await suppression.add(conn, services.protector, address, reason="manual", source=source)
        await suppression.remove(
            conn,
            "email",
            address_hash,
            reason="asked",
            source=suppression.Source(type="unsubscribe", id=None, actor="web"),
        )
    feed = await _feed(services)
    assert [(e.type, e.data["source"]) for e in feed] == [
        ("suppression.added", "operator"),
        ("suppression.removed", "unsubscribe"),
    ]
    assert {e.data["address"] for e in feed} == {"gone@example.com"}


async def test_rolled_back_changes_leave_no_event(services: Services) -> None:
    made = await make_delivery(services, status="queued", attempts=[])
    now = dt.datetime.now(dt.UTC)
    address = normalize("email", "rollback@example.com")
    source = suppression.Source(type="operator", id=None, actor="test")

    class Abort(Exception):
        pass

    async with pg_connection(services.engine) as conn:
        with pytest.raises(Abort):
            async with conn.transaction():
                await dlog.schedule(conn, made.delivery_id, at=now, now=now)
                await suppression.add(
                    conn, services.protector, address, reason="manual", source=source
                )
                assert await conn.fetchval("SELECT count(*) FROM events") == 2
                raise Abort
    assert await _feed(services) == []
    async with pg_connection(services.engine) as conn:
        await dlog.schedule(conn, made.delivery_id, at=now, now=now)
    assert [e.type for e in await _feed(services)] == ["delivery.retrying"]


@pytest.fixture
async def twilio_gateway(settings: Settings) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    """A gateway that verifies Twilio callbacks with TOKEN."""
    configured = replace_settings(settings, twilio_auth_tokens=(TOKEN,))
    assert configured.database_url is not None
    services = build_services(configured, configured.database_url)
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
        try:
            yield services, c
        finally:
            await services.close()


async def test_no_event_for_a_duplicate_or_a_regression(
    twilio_gateway: tuple[Services, httpx.AsyncClient],
) -> None:
    services, client = twilio_gateway
    made = await make_delivery(
        services, channel="sms", to=PHONE, status="sent", attempts=[("accepted", "SMev1")]
    )

    async def callback(status: str, token: str) -> list[str]:
        path = "/webhooks/twilio/status"
        params = status_params("SMev1", status, to=PHONE)
        r = await client.post(
            path,
            content=urlencode(params).encode(),
            headers={
                "X-Twilio-Signature": twilio_signature(
                    f"https://gateway.test{path}", params, TOKEN
                ),
                "Content-Type": "application/x-www-form-urlencoded",
                "I-Twilio-Idempotency-Token": token,
            },
        )
        assert r.status_code == 200, r.text
        dispositions: list[str] = r.json()["dispositions"]
        return dispositions

    assert await callback("delivered", "t1") == ["applied"]
    assert await callback("delivered", "t1") == ["duplicate"]  # Twilio's retry of it
    assert await callback("delivered", "t2") == ["duplicate"]  # the same state again
    assert await callback("sent", "t3") == ["regression"]
    feed = await _feed(services)
    # The delivery was created `sent` (one event), then delivered (one event): nothing else.
    assert [(e.type, e.data["previous_status"]) for e in feed] == [
        ("delivery.sent", None),
        ("delivery.delivered", "sent"),
    ]
    assert {e.data["delivery_id"] for e in feed} == {str(made.delivery_id)}


async def test_feed_filters_by_type_and_key(services: Services) -> None:
    mine = await make_delivery(
        services, status="sent", to="a@example.com", attempts=[("accepted", "pm-a")]
    )
    theirs = await make_delivery(
        services, status="sent", to="b@example.com", attempts=[("accepted", "pm-b")]
    )
    async with pg_connection(services.engine) as conn:
        await suppression.add(
            conn,
            services.protector,
            normalize("email", "c@example.com"),
            reason="manual",
            source=suppression.Source(type="operator", id=None, actor="t"),
        )
        owner = await conn.fetchval(
            "SELECT m.client_id FROM messages m JOIN deliveries d ON d.message_id = m.id "
            "WHERE d.id = $1",
            mine.delivery_id,
        )
    everything = await _feed(services)
    assert len(everything) == 3
    own = await _feed(services, client_id=owner)
    assert [e.type for e in own] == ["delivery.sent", "suppression.added"]
    assert own[0].data["delivery_id"] == str(mine.delivery_id)
    assert str(theirs.delivery_id) not in {e.data.get("delivery_id") for e in own}
    only = await _feed(services, types=["suppression.added"])
    assert [e.type for e in only] == ["suppression.added"]
    # one event per page: the same events, same order
    assert [e.id for e in await _feed(services, limit=1)] == [e.id for e in everything]
    with pytest.raises(ValueError, match="unknown event type"):
        await _feed(services, types=["delivery.opened"])
    for bad in ("", "1", "1.2.3", "x.1", "99999999999999999999.1"):
        with pytest.raises(events.InvalidCursor):
            await _feed(services, after=bad)
    for limit in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            await _feed(services, limit=limit)


async def test_retention_prunes_old_events(services: Services) -> None:
    await make_delivery(services, status="sent", attempts=[("accepted", "pm-old")])
    await make_delivery(services, status="sent", attempts=[("accepted", "pm-new")])
    async with pg_connection(services.engine) as conn:
        await conn.execute(
            "UPDATE events SET occurred_at = now() - interval '31 days' "
            "WHERE id = (SELECT min(id) FROM events)"
        )
    assert services.settings.event_retention_days == 30
    assert await event_pruner(services)() == 1
    assert len(await _feed(services)) == 1
    assert await event_pruner(services)() == 0


async def _writer(
    services: Services,
    delivery_id: uuid.UUID,
    started: asyncio.Event,
    release: asyncio.Event,
    commit: bool,
) -> None:
    """One transaction: change a delivery's status (its event gets this transaction's id),
    then wait for `release` and commit or roll back."""

    class Rollback(Exception):
        pass

    async with pg_connection(services.engine) as conn:
        try:
            async with conn.transaction():
                await conn.execute(
                    "UPDATE deliveries SET status = 'retrying' WHERE id = $1", delivery_id
                )
                started.set()
                await release.wait()
                if not commit:
                    raise Rollback
        except Rollback:
            pass


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_feed_never_skips_events_committed_out_of_order(
    services: Services, seed: int
) -> None:
    """Many transactions take their ids in one order and commit (or roll back) in a random
    other, while a reader polls with small pages: it sees every committed event exactly
    once and nothing else."""
    rng = random.Random(seed)
    count = 16
    made = [await make_delivery(services, status="queued", attempts=[]) for _ in range(count)]
    commits = [rng.random() < 0.8 for _ in range(count)]
    releases = [asyncio.Event() for _ in range(count)]
    tasks = []
    for i, m in enumerate(made):
        started = asyncio.Event()
        tasks.append(
            asyncio.create_task(_writer(services, m.delivery_id, started, releases[i], commits[i]))
        )
        await started.wait()  # transaction i holds its xid before i + 1 starts
    seen: list[str] = []
    cursor: str | None = None

    async def poll() -> None:
        nonlocal cursor
        async with pg_connection(services.engine) as conn:
            while True:
                page, cursor = await events.read_feed(
                    conn,
                    after=cursor,
                    limit=rng.randint(1, 3),
                    client_id=None,
                    types=None,
                    protector=services.protector,
                )
                seen.extend(e.id for e in page)
                if not page:
                    return

    order = list(range(count))
    rng.shuffle(order)
    for i in order:
        releases[i].set()
        await tasks[i]
        await poll()
    await asyncio.gather(*tasks)
    async with pg_connection(services.engine) as conn:
        stored = [events.event_id(r[0]) for r in await conn.fetch("SELECT id FROM events")]
    expected = {events.event_id(int(s.removeprefix("evt_"))) for s in stored}
    assert len(stored) == sum(commits)
    # Transactions of other test sessions on this server may hold the horizon back for a
    # moment; the reader only has to catch up, never to skip.
    for _ in range(600):
        if len(seen) >= len(expected):
            break
        await asyncio.sleep(0.05)
        await poll()
    assert len(seen) == len(set(seen)), "an event was served twice"
    assert set(seen) == expected
