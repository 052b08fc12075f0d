"""Every send-time status path of email, through the real `boto3` sesv2 client.

The local SES stub (`tests/stubs/ses_stub.py`) shows the request as SES receives it (tags,
headers, configuration set) and answers with SES's errors; moto in server mode covers the
plain path against a second, independent implementation. Both are reached only through the
standard `AWS_ENDPOINT_URL_SESV2` variable.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import boto3
import httpx
import pytest

from gateway.settings import Settings
from suppression.db import utcnow
from suppression.tokens import read_token
from tests.sender.helpers import Gateway, attempts_of, delivery, email, provider_settings
from tests.stubs._server import Behavior
from tests.stubs.ses_stub import SesStub


def _headers(request: dict[str, Any]) -> dict[str, str]:
    return {h["Name"]: h["Value"] for h in request["Content"]["Simple"]["Headers"]}


async def test_accepted_email_carries_tags_header_and_configuration_set(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    body = email(
        "Someone@Example.COM",
        subject="Your receipt",
        text="plain",
        html="<p>html</p>",
        reply_to="help@example.com",
    )
    r = await gw.send(body)
    assert r.status_code == 201
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "sent"
    assert answer["to"] == "Someone@example.com"
    row = await delivery(gw.services, answer["id"])
    [request] = ses_stub.accepted
    assert request["FromEmailAddress"] == "sender@example.com"
    assert request["Destination"] == {"ToAddresses": ["Someone@example.com"]}
    assert request["ConfigurationSetName"] == "gateway-events"
    assert request["ReplyToAddresses"] == ["help@example.com"]
    simple = request["Content"]["Simple"]
    assert simple["Subject"]["Data"] == "Your receipt"
    assert simple["Body"]["Text"]["Data"] == "plain"
    assert simple["Body"]["Html"]["Data"] == "<p>html</p>"
    assert _headers(request)["X-Gateway-Delivery"] == row.derived_key
    assert "List-Unsubscribe" not in _headers(request)  # transactional
    tags = {t["Name"]: t["Value"] for t in request["EmailTags"]}
    assert tags == {"delivery_id": answer["id"], "derived_key": row.derived_key}
    assert row.provider == "ses"
    assert row.provider_message_id == request["MessageId"]


async def test_marketing_email_carries_one_click_unsubscribe(
    settings: Settings, ses_stub: SesStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(settings, unsubscribe_mailto="mailto:unsub@example.com")
    async with make_gateway(changed) as gw:
        r = await gw.send(email("Fan@example.com", category="marketing", topic="weekly"))
        answer = r.json()["deliveries"][0]
        headers = _headers(ses_stub.accepted[0])
        assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        https, mailto = (part.strip() for part in headers["List-Unsubscribe"].split(","))
        assert mailto == "<mailto:unsub@example.com>"
        assert https.startswith("<https://gateway.test/unsubscribe/") and https.endswith(">")
        token = https[len("<https://gateway.test/unsubscribe/") : -1]
        # Opaque: the address is in neither the token nor its base64-decoded bytes.
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert "fan@example.com" not in token and b"fan@example.com" not in raw.lower()
        content = read_token(gw.services.protector, token)
        assert (content.channel, content.address, content.topic) == (
            "email",
            "fan@example.com",
            "weekly",
        )
        assert content.delivery_id == uuid.UUID(answer["id"])


async def test_message_rejected_fails_without_suppressing(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    ses_stub.then(
        Behavior.error(400, "MessageRejected", "Email address is not verified: a@b.example")
    )
    r = await gw.send(email("someone@example.com"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (201, "failed")
    assert answer["reason"].startswith("ses:MessageRejected")
    [attempt] = await attempts_of(gw.services, answer["id"])
    assert attempt.error_code == "MessageRejected"
    assert "a@b.example" not in (attempt.error_message or "")
    assert (await gw.send(email("someone@example.com"))).json()["deliveries"][0]["status"] == "sent"


@pytest.mark.parametrize(
    "code",
    ["SendingPausedException", "AccountSuspendedException", "MailFromDomainNotVerifiedException"],
)
async def test_account_problems_defer_and_open_the_circuit(
    providers_gateway: Gateway, ses_stub: SesStub, code: str
) -> None:
    gw = providers_gateway
    ses_stub.then(Behavior.error(400, code, "account problem"))
    r = await gw.send(email("someone@example.com"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (202, "queued")
    assert answer["reason"].startswith(f"ses:{code}")
    assert await gw.services.breaker.state("ses") == "open"


async def test_throttling_is_transient_with_retry_after_as_floor(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    ses_stub.then(
        Behavior.error(
            429,
            "TooManyRequestsException",
            "Maximum sending rate exceeded.",
            headers={"Retry-After": "90"},
        )
    )
    before = utcnow()
    r = await gw.send(email("someone@example.com"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (202, "retrying")
    row = await delivery(gw.services, answer["id"])
    assert row.next_attempt_at is not None
    assert row.next_attempt_at >= before + dt.timedelta(seconds=90)
    assert ses_stub.count == 1  # botocore did not retry on its own


async def test_server_error_is_transient(providers_gateway: Gateway, ses_stub: SesStub) -> None:
    gw = providers_gateway
    ses_stub.then(Behavior.error(500, "InternalFailure", "internal"))
    r = await gw.send(email("someone@example.com"))
    assert r.json()["deliveries"][0]["status"] == "retrying"
    assert ses_stub.count == 1


async def test_dropped_connection_after_sending_is_unknown(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    ses_stub.then(Behavior.drop())
    r = await gw.send(email("someone@example.com"))
    answer = r.json()["deliveries"][0]
    assert (r.status_code, answer["status"]) == (202, "unknown")
    assert ses_stub.count == 1 and len(ses_stub.accepted) == 1


# -- moto -----------------------------------------------------------------------------------


async def test_send_through_moto(
    settings: Settings, moto_env: str, make_gateway: Callable[..., Any]
) -> None:
    async with make_gateway(provider_settings(settings)) as gw:
        # moto, like SES, refuses senders that are not verified identities.
        rejected = await gw.send(email("someone@example.com"))
        assert rejected.json()["deliveries"][0]["status"] == "failed"
        assert rejected.json()["deliveries"][0]["reason"].startswith("ses:MessageRejected")
        sesv2 = boto3.session.Session().client("sesv2")
        await asyncio.to_thread(sesv2.create_email_identity, EmailIdentity="example.com")
        r = await gw.send(email(["first@example.com", "second@example.com"]))
        assert r.status_code == 201
        assert [d["status"] for d in r.json()["deliveries"]] == ["sent", "sent"]
        async with httpx.AsyncClient() as client:
            data = (await client.get(f"{moto_env}/moto-api/data.json")).json()
        stored = data["ses"]["Message"]  # sesv2 shares moto's ses backend
        sent_ids = {m["id"] for m in stored}
        for answer in r.json()["deliveries"]:
            row = await delivery(gw.services, answer["id"])
            assert row.provider_message_id in sent_ids
        assert sorted(m["destinations"]["ToAddresses"][0] for m in stored) == [
            "first@example.com",
            "second@example.com",
        ]
