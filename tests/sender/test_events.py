"""Outbound events: the outbox triggers and the commit-ordered feed (`sender.events`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.services import Services
from sender import events
from suppression.db import pg_connection
from tests.conftest import bearer
from tests.sender.helpers import email


async def _send(client: httpx.AsyncClient, secret: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(
        "/v1/messages",
        json=body,
        headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert r.status_code in (201, 202), r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _feed(services: Services, **kw: Any) -> list[events.Event]:
    out: list[events.Event] = []
    after = kw.pop("after", None)
    async with pg_connection(services.engine) as conn:
        while True:
            page, after = await events.read_feed(
                conn,
                after=after,
                limit=kw.get("limit", 100),
                client_id=kw.get("client_id"),
                types=kw.get("types"),
                protector=services.protector,
            )
            out.extend(page)
            if not page:
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
    assert [e.type for e in feed] == [
        "delivery.sent",
        "delivery.bounced",
        "suppression.added",
    ]
    first, bounced, added = feed
    assert first.data["message_id"] == sent["id"]
    assert first.data["to"] == "bounce@simulator.amazonses.com"
    assert first.data["metadata"] == {"user": "42"}
    assert first.data["previous_status"] == "sending"
    assert bounced.data["previous_status"] == "sent"
    assert bounced.data["status"] == "bounced"
    assert added.data == {
        "channel": "email",
        "address": "bounce@simulator.amazonses.com",
        "scope": "all",
        "reason": "hard_bounce",
        "source": "provider_event",
    }
    assert added.message_owner is None
    assert first.message_owner is not None
