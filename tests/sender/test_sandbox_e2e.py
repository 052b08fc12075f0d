"""End to end on the embedded default (sandbox providers + the webhooks' feedback path).

The "done when" of the send path: a send to `bounce@simulator.amazonses.com` ends `bounced`
and suppressed, a second send to it ends `suppressed` without a provider call, and a send to
`success@simulator.amazonses.com` ends `delivered`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.services import Services
from gateway.settings import Settings
from suppression import service as suppression
from tests.conftest import bearer, replace_settings
from tests.sender.helpers import attempts_of, email, sms


async def _send(client: httpx.AsyncClient, secret: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(
        "/v1/messages",
        json=body,
        headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _settled(
    client: httpx.AsyncClient, services: Services, secret: str, message_id: str
) -> dict[str, Any]:
    await services.sandbox_feedback.drain()
    r = await client.get(f"/v1/messages/{message_id}", headers=bearer(secret))
    assert r.status_code == 200
    view: dict[str, Any] = r.json()
    return view


async def _suppressed_for(services: Services, channel: str, key: str) -> str | None:
    async with services.sessions() as session:
        hit = await suppression.check(
            session, channel, services.protector.hash(channel, key), category="transactional"
        )
    return hit.reason if hit else None


async def test_bounce_suppresses_and_success_is_delivered(
    client: httpx.AsyncClient, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("send", "read")
    assert services.settings.email_provider == "sandbox"

    first = await _send(client, secret, email("bounce@simulator.amazonses.com"))
    assert first["deliveries"][0]["status"] == "sent"
    view = await _settled(client, services, secret, first["id"])
    [d] = view["deliveries"]
    assert d["status"] == "bounced"
    # The simulated Send and Bounce events went through the webhooks' path: stored, linked
    # to the delivery, the bounce applied.
    assert [e["event_type"] for e in d["events"]] == ["send", "bounce"]
    assert d["events"][1]["disposition"] == "applied"
    assert {e["provider_message_id"] for e in d["events"]} == {d["provider_message_id"]}
    assert (
        await _suppressed_for(services, "email", "bounce@simulator.amazonses.com") == "hard_bounce"
    )

    second = await _send(client, secret, email("bounce@simulator.amazonses.com"))
    [again] = second["deliveries"]
    assert (again["status"], again["reason"]) == ("suppressed", "hard_bounce")
    assert await attempts_of(services, again["id"]) == []  # the provider was never called
    view = await _settled(client, services, secret, second["id"])
    assert view["deliveries"][0]["suppression"]["reason"] == "hard_bounce"
    assert view["deliveries"][0]["events"] == []

    ok = await _send(client, secret, email("success@simulator.amazonses.com"))
    view = await _settled(client, services, secret, ok["id"])
    [d] = view["deliveries"]
    assert d["status"] == "delivered"
    assert [a["status"] for a in d["attempts"]] == ["accepted"]
    assert await _suppressed_for(services, "email", "success@simulator.amazonses.com") is None


async def test_complaint_and_sms(
    client: httpx.AsyncClient, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("send", "read")
    complaint = await _send(client, secret, email("complaint@simulator.amazonses.com"))
    view = await _settled(client, services, secret, complaint["id"])
    assert view["deliveries"][0]["status"] == "complained"
    assert (
        await _suppressed_for(services, "email", "complaint@simulator.amazonses.com") == "complaint"
    )

    texts = await _send(client, secret, sms(["+15005550006", "+15005550001", "+15005550004"]))
    assert [d["status"] for d in texts["deliveries"]] == ["sent", "failed", "failed"]
    assert [d["reason"] for d in texts["deliveries"][1:]] == ["invalid_address", "sms_stop"]
    view = await _settled(client, services, secret, texts["id"])
    assert view["deliveries"][0]["status"] == "delivered"
    assert await _suppressed_for(services, "sms", "+15005550001") == "invalid_address"
    assert await _suppressed_for(services, "sms", "+15005550004") == "sms_stop"


async def test_magic_numbers_cannot_wedge_the_sandbox(
    settings: Settings, make_gateway: Callable[..., Any]
) -> None:
    # +15005550002 (21612) and +15005550003 (21408) used to open the Twilio circuit, so the
    # sandbox deferred every SMS after them ("deferred: twilio circuit open"), also after a
    # restart, when their retries came due and opened it again.
    unlimited = replace_settings(
        settings, retry=dataclasses.replace(settings.retry, rate_limits={})
    )
    async with make_gateway(unlimited) as gw:
        assert gw.services.settings.sms_provider == "sandbox"
        for _ in range(3):
            r = await gw.send(sms(["+15005550002", "+15005550003"]))
            unreachable, region = r.json()["deliveries"]
            assert unreachable["status"] == "retrying"
            assert unreachable["reason"].startswith("twilio:21612")
            assert region["status"] == "failed"
            assert "not enabled for this account" in region["reason"]
            ok = await gw.send(sms("+15005550006"))
            assert ok.status_code == 201
            assert ok.json()["deliveries"][0]["status"] == "sent"
        assert await gw.services.breaker.state("twilio") == "closed"
