"""Every send-time status path of SMS, through the real `twilio` client against the local stub."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select

from gateway.services import Services
from gateway.settings import Settings
from retry.models import DeadLetter
from suppression import service as suppression
from suppression.db import utcnow
from tests.sender.helpers import (
    SMS_FROM,
    Gateway,
    attempts_of,
    delivery,
    provider_settings,
    sms,
)
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, TwilioStub
from tests.support.process import free_port


async def _suppression_reason(services: Services, number: str) -> str | None:
    async with services.sessions() as session:
        hit = await suppression.check(
            session, "sms", services.protector.hash("sms", number), category="transactional"
        )
    return hit.reason if hit else None


async def test_accepted_message_is_sent_with_the_correlating_status_callback(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.send(sms("+14155552671", body="Your code is 123456"))
    assert r.status_code == 201
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "sent" and answer["reason"] is None
    [call] = twilio_stub.calls
    assert call.path == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    assert call.body["To"] == "+14155552671"
    assert call.body["From"] == SMS_FROM
    assert call.body["Body"] == "Your code is 123456"
    callback = urlsplit(call.body["StatusCallback"])
    assert f"{callback.scheme}://{callback.netloc}{callback.path}" == (
        "https://gateway.test/webhooks/twilio/status"
    )
    assert parse_qs(callback.query) == {"d": [answer["id"]]}
    row = await delivery(gw.services, answer["id"])
    assert row.provider_message_id == twilio_stub.accepted[0]["sid"]


async def test_messaging_service_is_used_without_a_sender_number(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(
        settings,
        twilio_api_base=twilio_stub.url,
        sms_from=None,
        twilio_messaging_service_sid="MG" + "2" * 32,
    )
    async with make_gateway(changed) as gw:
        assert (await gw.send(sms("+14155552671"))).status_code == 201
    [call] = twilio_stub.calls
    assert call.body["MessagingServiceSid"] == "MG" + "2" * 32
    assert "From" not in call.body


async def test_request_from_overrides_the_configured_sender(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    assert (
        await providers_gateway.send(sms("+14155552671", **{"from": "+15005550006"}))
    ).status_code == 201
    assert twilio_stub.calls[0].body["From"] == "+15005550006"


@pytest.mark.parametrize(
    ("code", "reason"),
    [(21211, "invalid_address"), (21614, "invalid_address"), (21610, "sms_stop")],
)
async def test_address_errors_fail_and_suppress_the_address(
    providers_gateway: Gateway, twilio_stub: TwilioStub, code: int, reason: str
) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(400, code, "The 'To' number +14155552671 is not valid."))
    r = await gw.send(sms("+14155552671"))
    assert r.status_code == 201  # a final answer
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "failed" and answer["reason"] == reason
    [attempt] = await attempts_of(gw.services, answer["id"])
    assert attempt.status == "failed" and attempt.error_code == str(code)
    assert "4155552671" not in (attempt.error_message or "")
    assert await _suppression_reason(gw.services, "+14155552671") == reason
    # The next message to that number never reaches Twilio.
    again = await gw.send(sms("+14155552671"))
    assert again.json()["deliveries"][0]["status"] == "suppressed"
    assert twilio_stub.count == 1


async def test_message_errors_fail_without_suppressing(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(400, 21617, "The concatenated message body exceeds the limit"))
    r = await gw.send(sms("+14155552671"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (201, "failed")
    assert answer["reason"].startswith("twilio:21617")
    assert await _suppression_reason(gw.services, "+14155552671") is None


async def test_account_problems_defer_without_suppressing_and_open_the_circuit(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(401, 20003, "Authenticate"))
    r = await gw.send(sms("+14155552671"))
    assert r.status_code == 202
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "queued" and answer["reason"].startswith("twilio:20003")
    row = await delivery(gw.services, answer["id"])
    assert row.next_attempt_at is not None
    [attempt] = await attempts_of(gw.services, answer["id"])
    assert attempt.status == "deferred"
    assert await _suppression_reason(gw.services, "+14155552671") is None
    assert await gw.services.breaker.state("twilio") == "open"
    # With the circuit open the next send is deferred without a provider call or attempt.
    second = await gw.send(sms("+14155552672"))
    assert second.status_code == 202
    assert second.json()["deliveries"][0]["status"] == "queued"
    assert twilio_stub.count == 1
    assert await attempts_of(gw.services, second.json()["deliveries"][0]["id"]) == []


async def test_throttling_retries_no_earlier_than_retry_after(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(
        Behavior.error(429, 20429, "Too Many Requests", headers={"Retry-After": "120"})
    )
    before = utcnow()
    r = await gw.send(sms("+14155552671"))
    assert r.status_code == 202
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "retrying"
    row = await delivery(gw.services, answer["id"])
    assert row.next_attempt_at is not None
    assert row.next_attempt_at >= before + dt.timedelta(seconds=120)
    assert row.attempts == 1


async def test_server_errors_are_transient(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(500, None, "Internal Server Error"))
    r = await gw.send(sms("+14155552671"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (202, "retrying")
    [attempt] = await attempts_of(gw.services, answer["id"])
    assert attempt.status == "transient"


@pytest.mark.parametrize("kind", ["drop", "timeout"])
async def test_no_answer_after_sending_is_an_unknown_outcome(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any], kind: str
) -> None:
    # "timeout": Twilio takes the message and answers only after the client gave up.
    late = threading.Event()
    twilio_stub.then(Behavior.drop() if kind == "drop" else Behavior.accept(hold=late))
    changed = provider_settings(
        settings, twilio_api_base=twilio_stub.url, provider_read_timeout_seconds=0.3
    )
    try:
        async with make_gateway(changed) as gw:
            before = utcnow()
            r = await gw.send(sms("+14155552671"))
            assert r.status_code == 202
            answer = r.json()["deliveries"][0]
            assert answer["status"] == "unknown"
            row = await delivery(gw.services, answer["id"])
            settle = gw.services.settings.retry.unknown_settle_seconds
            assert row.next_attempt_at is not None
            assert row.next_attempt_at >= before + dt.timedelta(seconds=settle)
            [attempt] = await attempts_of(gw.services, answer["id"])
            assert attempt.status == "unknown" and attempt.provider_message_id is None
            assert attempt.error_code == "connection_after_send"
    finally:
        late.set()
    # Twilio did create the message: exactly one call, no blind retry.
    assert twilio_stub.count == 1 and len(twilio_stub.accepted) == 1


async def test_refused_connection_is_transient(
    settings: Settings, make_gateway: Callable[..., Any]
) -> None:
    port = free_port()  # nothing listens there: the connection is refused
    async with make_gateway(
        provider_settings(settings, twilio_api_base=f"http://127.0.0.1:{port}")
    ) as gw:
        r = await gw.send(sms("+14155552671"))
        answer = r.json()["deliveries"][0]
        assert (r.status_code, answer["status"]) == (202, "retrying")
        [attempt] = await attempts_of(gw.services, answer["id"])
        assert attempt.error_code == "connection_not_sent"


async def test_out_of_attempts_goes_to_the_dead_letter_queue(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(settings, twilio_api_base=twilio_stub.url)
    changed = provider_settings(changed, retry=dataclasses.replace(changed.retry, max_attempts=1))
    twilio_stub.then(Behavior.error(503, 30001, "Queue overflow"))
    async with make_gateway(changed) as gw:
        r = await gw.send(sms("+14155552671"))
        answer = r.json()["deliveries"][0]
        assert (r.status_code, answer["status"]) == (201, "dead")
        assert answer["reason"] == "max_attempts"
        async with gw.services.sessions() as session:
            [entry] = (await session.scalars(select(DeadLetter))).all()
        assert entry.delivery_id == uuid.UUID(answer["id"])
        assert entry.reason == "max_attempts"
        assert entry.attempt_history[0]["error_code"] == "30001"


async def test_a_retry_that_would_miss_the_deadline_dead_letters_as_expired(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(
        Behavior.error(429, 20429, "Too Many Requests", headers={"Retry-After": "600"})
    )
    expires = (utcnow() + dt.timedelta(seconds=60)).isoformat()
    r = await gw.send(sms("+14155552671", expires_at=expires))
    answer = r.json()["deliveries"][0]
    assert (answer["status"], answer["reason"]) == ("dead", "expired")


async def test_overrides_reclassify_codes(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(
        settings,
        twilio_api_base=twilio_stub.url,
        send_error_overrides={"twilio:21211": "transient", "twilio:http_500": "unknown_outcome"},
    )
    twilio_stub.then(
        Behavior.error(400, 21211, "invalid"), Behavior.error(500, None, "Internal Server Error")
    )
    async with make_gateway(changed) as gw:
        first = (await gw.send(sms("+14155552671"))).json()["deliveries"][0]
        second = (await gw.send(sms("+14155552672"))).json()["deliveries"][0]
        assert first["status"] == "retrying"
        assert await _suppression_reason(gw.services, "+14155552671") is None
        assert second["status"] == "unknown"
