"""Asynchronous acceptance: `POST /v1/messages` with `Prefer: respond-async` (RFC 7240).

202 once the claim committed (message, deliveries `queued` due now, suppression verdicts
final at once), `Preference-Applied: respond-async`, no provider call in the request; the
idempotent replay returns the stored answer; the worker sends the queued deliveries through
the real Twilio client to the local stub. GATEWAY_MARKETING_ASYNC makes marketing requests
asynchronous without the header.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from sqlalchemy import select

from gateway.settings import Settings, SettingsError, load_settings
from gateway.worker import build_worker
from sender.api import preference_names
from sender.models import Attempt, Message
from tests.retry.helpers import run_worker_until
from tests.sender.helpers import (
    Gateway,
    count_rows,
    delivery,
    provider_settings,
    sms,
    suppress_sms,
)
from tests.stubs.twilio_stub import TwilioStub

ASYNC = {"Prefer": "respond-async"}


async def _message(gw: Gateway, message_id: str) -> Message:
    async with gw.services.sessions() as session:
        row = await session.get(Message, message_id)
        assert row is not None
        return row


async def test_respond_async_answers_202_with_queued_deliveries_and_calls_no_provider(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    await suppress_sms(gw.services, "+15005550009")
    r = await gw.send(sms(["+15005550006", "+15005550009"], priority="high"), headers=ASYNC)
    assert r.status_code == 202, r.text
    assert r.headers["Preference-Applied"] == "respond-async"
    assert "Idempotent-Replayed" not in r.headers
    answers = r.json()["deliveries"]
    assert [(a["to"], a["status"]) for a in answers] == [
        ("+15005550006", "queued"),
        ("+15005550009", "suppressed"),
    ]
    assert answers[0]["reason"] is None
    assert answers[1]["reason"] == "sms_stop"
    # Nothing went to the provider during the request, and no attempt was written.
    assert twilio_stub.count == 0
    assert (await count_rows(gw.services))["attempts"] == 0
    queued = await delivery(gw.services, answers[0]["id"])
    assert queued.status == "queued" and queued.next_attempt_at is not None
    assert queued.priority_rank == 2
    suppressed = await delivery(gw.services, answers[1]["id"])
    assert suppressed.status == "suppressed" and suppressed.next_attempt_at is None
    # The message is complete with its answer (what a replay returns).
    message = await _message(gw, r.json()["id"])
    assert message.state == "completed" and message.response_code == 202
    assert [a["status"] for a in message.first_answers or []] == ["queued", "suppressed"]


async def test_replay_returns_the_stored_202_answer_and_sends_nothing(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    body = sms(["+15005550006", "+15005550007"])
    first = await gw.send(body, key="async-replay", headers=ASYNC)
    assert first.status_code == 202
    again = await gw.send(body, key="async-replay", headers=ASYNC)
    assert again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Preference-Applied"] == "respond-async"
    # The same request without the preference gets the stored answer too (idempotency is
    # about the key and the body), without claiming a preference it did not ask for.
    plain = await gw.send(body, key="async-replay")
    assert plain.status_code == 202 and plain.json() == first.json()
    assert "Preference-Applied" not in plain.headers
    # A different body with the key is still refused.
    other = await gw.send(sms("+15005550006"), key="async-replay", headers=ASYNC)
    assert other.status_code == 422
    assert (await count_rows(gw.services))["deliveries"] == 2
    assert twilio_stub.count == 0


async def test_the_worker_sends_what_was_accepted_asynchronously(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.send(sms(["+15005550006", "+15005550007"]), headers=ASYNC)
    assert r.status_code == 202
    ids = [a["id"] for a in r.json()["deliveries"]]
    worker = build_worker(gw.services)

    async def all_sent() -> bool:
        return [(await delivery(gw.services, i)).status for i in ids] == ["sent", "sent"]

    await run_worker_until(worker, all_sent)
    assert sorted(c.recipient or "" for c in twilio_stub.calls) == ["+15005550006", "+15005550007"]
    async with gw.services.sessions() as session:
        numbers = list(await session.scalars(select(Attempt.number)))
    assert numbers == [1, 1]
    # The replay still shows the answer given at acceptance.
    replay = await gw.client.get(f"/v1/messages/{r.json()['id']}", headers=gw.headers)
    assert [d["status"] for d in replay.json()["deliveries"]] == ["sent", "sent"]


@pytest.mark.parametrize(
    "prefer",
    [
        "return=minimal",
        'foo="respond-async, wait=1"',
        "respond-asynchronously",
        "",
    ],
)
async def test_without_the_preference_the_send_is_synchronous(
    providers_gateway: Gateway, twilio_stub: TwilioStub, prefer: str
) -> None:
    gw = providers_gateway
    r = await gw.send(sms("+15005550006"), headers={"Prefer": prefer})
    assert r.status_code == 201, r.text
    assert "Preference-Applied" not in r.headers
    assert r.json()["deliveries"][0]["status"] == "sent"
    assert twilio_stub.count == 1


async def test_respond_async_among_other_preferences_and_fields(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.send(
        sms("+15005550006"),
        headers=[("Prefer", 'handling=lenient; x="a,b"'), ("Prefer", "wait=5, Respond-Async")],
    )
    assert r.status_code == 202
    assert r.headers["Preference-Applied"] == "respond-async"
    assert twilio_stub.count == 0


def test_preference_names_follow_rfc_7240() -> None:
    assert preference_names(["respond-async"]) == ["respond-async"]
    assert preference_names(["wait=10, RESPOND-ASYNC ; p=1"]) == ["wait", "respond-async"]
    assert preference_names(['foo="a, respond-async", bar']) == ["foo", "bar"]
    assert preference_names(['foo="a\\", respond-async", bar']) == ["foo", "bar"]
    assert preference_names([",, ,respond-async,"]) == ["respond-async"]
    assert preference_names(["res pond-async", "(x)"]) == []
    assert preference_names([]) == []


async def test_marketing_async_setting(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    configured = provider_settings(settings, twilio_api_base=twilio_stub.url, marketing_async=True)
    async with make_gateway(configured) as gw:
        marketing = await gw.send(sms("+15005550006", category="marketing"))
        assert marketing.status_code == 202
        # Asynchronous by configuration, not because the client asked.
        assert "Preference-Applied" not in marketing.headers
        assert marketing.json()["deliveries"][0]["status"] == "queued"
        transactional = await gw.send(sms("+15005550006"))
        assert transactional.status_code == 201
        assert twilio_stub.count == 1
        asked = await gw.send(sms("+15005550006", category="marketing"), headers=ASYNC)
        assert asked.headers["Preference-Applied"] == "respond-async"


def test_marketing_async_is_read_from_the_environment() -> None:
    assert load_settings({"GATEWAY_MARKETING_ASYNC": "true"}).marketing_async is True
    assert load_settings({}).marketing_async is False
    with pytest.raises(SettingsError, match="GATEWAY_MARKETING_ASYNC"):
        load_settings({"GATEWAY_MARKETING_ASYNC": "maybe"})
