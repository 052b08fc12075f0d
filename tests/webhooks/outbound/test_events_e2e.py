"""End to end: a send through the sandbox, its callbacks, the outbox, the fan-out and the
signed pushes, as the receiving service sees them."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.services import Services
from tests.conftest import bearer
from tests.sender.helpers import email
from tests.webhooks.outbound.receiver import Receiver

from .conftest import pushing
from .helpers import create_endpoint

MakeKey = Callable[..., Awaitable[str]]


async def _send(client: httpx.AsyncClient, secret: str, to: str) -> dict[str, Any]:
    answer = await client.post(
        "/v1/messages",
        json={**email(to), "metadata": {"user": "u-42"}},
        headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def _key_id(services: Services, secret: str) -> str:
    principal = await services.api_keys.principal(secret)
    assert principal is not None
    return str(principal.key_id)


async def test_a_bounce_reaches_the_receiver_as_sent_bounced_suppression_added(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    sender = await make_key("send", "read")
    endpoint = await create_endpoint(
        client, admin, receiver, api_key_id=await _key_id(services, sender)
    )
    one_at_a_time = dataclasses.replace(services.settings.outbound, endpoint_concurrency=1)
    async with pushing(services, settings=one_at_a_time) as worker:
        message = await _send(client, sender, "bounce@simulator.amazonses.com")
        await worker.drain()
        await services.sandbox_feedback.drain()
        await worker.drain()
    got = receiver.requests
    assert [r.event["type"] for r in got] == [
        "delivery.sent",
        "delivery.bounced",
        "suppression.added",
    ]
    assert all(r.verified_by == [endpoint["secret"]] for r in got)
    assert all(r.webhook_id == r.event["id"] for r in got)
    sent, bounced, added = (r.event["data"] for r in got)
    assert sent["message_id"] == bounced["message_id"] == message["id"]
    assert bounced["status"] == "bounced" and bounced["previous_status"] == "sent"
    assert bounced["to"] == "bounce@simulator.amazonses.com"
    assert bounced["metadata"] == {"user": "u-42"}
    assert added["address"] == "bounce@simulator.amazonses.com"
    assert added["channel"] == "email"


async def test_an_endpoint_receives_only_what_its_key_may_see_and_subscribed_to(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    mine = await make_key("send", "read")
    other = await make_key("send", "read")
    send_only = await make_key("send")
    # my key's endpoint, for bounces only; a send-only key's endpoint (no suppression events)
    await create_endpoint(
        client,
        admin,
        receiver,
        events=["delivery.bounced", "suppression.added"],
        api_key_id=await _key_id(services, mine),
        description="mine",
    )
    answer = await client.post(
        "/v1/webhook-endpoints",
        json={
            "url": receiver.url("/send-only"),
            "events": ["*"],
            "api_key_id": await _key_id(services, send_only),
        },
        headers=bearer(admin),
    )
    receiver.secrets.append(answer.json()["secret"])
    async with pushing(services) as worker:
        await _send(client, other, "bounce@simulator.amazonses.com")  # not mine
        own = await _send(client, send_only, "success@simulator.amazonses.com")
        await services.sandbox_feedback.drain()
        await worker.drain()
    hook = [r.event for r in receiver.requests if r.path == "/hook"]
    # the other key's bounce is not mine; a suppression event is for every key with `read`
    assert [e["type"] for e in hook] == ["suppression.added"]
    send_only_got = [r.event for r in receiver.requests if r.path == "/send-only"]
    # its own messages' events, and no suppression event (the key lacks `read`)
    assert sorted(e["type"] for e in send_only_got) == ["delivery.delivered", "delivery.sent"]
    assert {e["data"]["message_id"] for e in send_only_got} == {own["id"]}


async def test_a_new_endpoint_starts_at_the_feed_end_and_replay_reaches_back(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    sender = await make_key("send", "read")
    before = await _send(client, sender, "success@simulator.amazonses.com")
    await services.sandbox_feedback.drain()
    endpoint = await create_endpoint(client, admin, receiver)
    async with pushing(services) as worker:
        await worker.drain()
        assert receiver.requests == []
        answer = await client.post(
            f"/v1/webhook-endpoints/{endpoint['id']}/replay",
            json={"since": "2000-01-01T00:00:00Z"},
            headers=bearer(admin),
        )
        assert answer.status_code == 200 and answer.json()["replayed"] == 2
        await worker.drain()
    assert sorted(r.event["type"] for r in receiver.requests) == [
        "delivery.delivered",
        "delivery.sent",
    ]
    assert {r.event["data"]["message_id"] for r in receiver.requests} == {before["id"]}


async def test_workers_fanning_out_and_pushing_side_by_side_send_each_event_once(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    sender = await make_key("send", "read")
    await create_endpoint(client, admin, receiver, api_key_id=await _key_id(services, sender))
    for _ in range(5):
        await _send(client, sender, "success@simulator.amazonses.com")
    await services.sandbox_feedback.drain()
    async with pushing(services) as one, pushing(services) as two, pushing(services) as three:
        await asyncio.gather(one.drain(), two.drain(), three.drain())
    ids = [r.webhook_id for r in receiver.requests]
    assert len(ids) == len(set(ids)) == 10  # sent + delivered of five messages, once each
    assert sorted(r.event["type"] for r in receiver.requests) == sorted(
        ["delivery.sent", "delivery.delivered"] * 5
    )
