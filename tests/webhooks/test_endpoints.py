"""The webhook endpoints over HTTP: verify first, then store once and apply.

SNS messages are the genuine AWS-signed vectors (with a clock inside their certificate's
validity) or messages signed at test time by the test CA; Twilio requests are signed with the
auth token. The SubscribeURL GET goes to an httpx MockTransport (the transport seam).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from gateway.app import create_app
from gateway.services import Services, build_services
from gateway.settings import Settings
from tests.conftest import replace_settings
from tests.support.metrics import value
from tests.webhooks.feedback import (
    PHONE,
    SES_FILES,
    TWILIO_PAYLOADS,
    delivery_state,
    hash_of,
    history,
    make_delivery,
    ses_event,
    ses_payload,
    status_params,
    stored_events,
    suppressions,
    twilio_form,
)
from tests.webhooks.signing import (
    OTHER_TOPIC_ARN,
    SNS_FIXTURES,
    TEST_TOPIC_ARN,
    cert_fetcher,
    fixed_clock,
    sign_sns,
    sns_body,
    sns_message,
    twilio_signature,
)
from webhooks.api import EMPTY_TWIML
from webhooks.errors import VERIFICATION_FAILURES
from webhooks.sns import SnsVerifier

TOKEN = "gateway-test-auth-token"
STATUS_PATH = "/webhooks/twilio/status"
INBOUND_PATH = "/webhooks/twilio/inbound"
SNS_HEADERS = {
    "Content-Type": "text/plain; charset=UTF-8",
    "User-Agent": "Amazon Simple Notification Service Agent",
}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@dataclass
class SnsHost:
    """The SNS side of a SubscribeURL GET: records each request, answers `status`."""

    status: int = 200
    fail: bool = False
    requests: list[str] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        if self.fail:
            raise httpx.ConnectError("unreachable", request=request)
        body = "<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>"
        return httpx.Response(self.status, text=body + "arn</SubscriptionArn>...")


@dataclass
class Gateway:
    services: Services
    client: httpx.AsyncClient
    sns_host: SnsHost

    def use_sns(self, topics: tuple[str, ...], clock: Callable[[], datetime] | None = None) -> None:
        """Verify SNS against `topics`, with certificates from the fake SNS host."""
        kwargs: dict[str, Any] = {"clock": clock} if clock else {}
        self.services.sns_verifier = SnsVerifier(
            allowed_topic_arns=topics, certs=cert_fetcher(), **kwargs
        )

    async def sns(self, message: dict[str, Any]) -> httpx.Response:
        return await self.client.post(
            "/webhooks/ses", content=sns_body(message), headers=SNS_HEADERS
        )

    async def twilio(
        self,
        path: str,
        params: dict[str, str],
        *,
        query: str = "",
        token: str = TOKEN,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> httpx.Response:
        url = f"https://gateway.test{path}" + (f"?{query}" if query else "")
        signed = {"X-Twilio-Signature": twilio_signature(url, params, token), **FORM}
        return await self.client.post(
            path + (f"?{query}" if query else ""),
            content=body if body is not None else urlencode(params).encode(),
            headers={**signed, **(headers or {})},
        )


async def _gateway(settings: Settings, **changes: Any) -> AsyncIterator[Gateway]:
    configured = replace_settings(settings, **changes)
    assert configured.database_url is not None
    services = build_services(configured, configured.database_url)
    host = SnsHost()
    services.sns_confirm_transport = httpx.MockTransport(host)
    if configured.sns_topic_arns:
        services.sns_verifier = SnsVerifier(
            allowed_topic_arns=configured.sns_topic_arns, certs=cert_fetcher()
        )
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as client:
        try:
            yield Gateway(services, client, host)
        finally:
            await services.close()


@pytest.fixture
async def gw(settings: Settings) -> AsyncIterator[Gateway]:
    """A gateway with an SNS allow-list (the test topic) and a Twilio auth token."""
    async for gateway in _gateway(
        settings, sns_topic_arns=(TEST_TOPIC_ARN,), twilio_auth_tokens=(TOKEN,)
    ):
        yield gateway


def signed_ses(payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return sign_sns(sns_message(message=json.dumps(payload), **kwargs))


def genuine(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SNS_FIXTURES / name).read_text())
    return loaded


# ---- SNS / SES ----------------------------------------------------------------------------


async def test_every_ses_payload_signed_by_the_test_ca_is_stored(gw: Gateway) -> None:
    expected = 0
    for name, (_, count) in sorted(SES_FILES.items()):
        response = await gw.sns(signed_ses(ses_payload(name)))
        assert response.status_code == 200, (name, response.text)
        assert len(response.json()["dispositions"]) == count
        expected += count
    rows = await stored_events(gw.services)
    assert len(rows) == expected
    assert {r.event_type for r in rows} == {t for t, _ in SES_FILES.values()}


async def test_genuine_aws_signed_ses_complaint_and_bounce(gw: Gateway) -> None:
    for name, reason, address in [
        (
            "djangoses-2022-ses-event-complaint-sv1-subject.json",
            "complaint",
            "complaint@simulator.amazonses.com",
        ),
        (
            "djangoses-2022-ses-notification-bounce-sv1-nosubject.json",
            "hard_bounce",
            "bounce@simulator.amazonses.com",
        ),
    ]:
        message = genuine(name)
        gw.use_sns((message["TopicArn"],), fixed_clock(message["Timestamp"]))
        response = await gw.sns(message)
        assert response.status_code == 200, response.text
        assert response.json() == {"dispositions": ["parked"]}  # no such delivery here
        hashes = {(e.reason, e.address_hash) for e in await suppressions(gw.services)}
        assert (reason, hash_of(gw.services, "email", address)) in hashes
    rows = await stored_events(gw.services)
    assert [r.provider_event_id for r in rows] == [
        genuine("djangoses-2022-ses-event-complaint-sv1-subject.json")["MessageId"],
        genuine("djangoses-2022-ses-notification-bounce-sv1-nosubject.json")["MessageId"],
    ]


async def test_notification_updates_the_delivery(gw: Gateway) -> None:
    made = await make_delivery(gw.services, attempts=[("accepted", "ep-1")])
    delivery = ses_event("Delivery", message_id="ep-1")
    assert (await gw.sns(signed_ses(delivery))).json() == {"dispositions": ["applied"]}
    bounce = ses_event("Bounce", message_id="ep-1", shape="notification")
    assert (await gw.sns(signed_ses(bounce, subject=None))).json() == {"dispositions": ["applied"]}
    assert (await delivery_state(gw.services, made.delivery_id))[0].status == "bounced"


async def test_non_json_sns_message_is_stored_as_unknown(gw: Gateway) -> None:
    message = sign_sns(sns_message(message="Successfully validated SNS topic for Amazon SES"))
    response = await gw.sns(message)
    assert response.status_code == 200 and response.json() == {"dispositions": ["ignored"]}
    (row,) = await stored_events(gw.services)
    assert row.event_type == "unknown"


async def test_genuine_subscription_confirmation_is_confirmed_by_get(gw: Gateway) -> None:
    message = genuine("raku-2021-subscriptionconfirmation-sv1.json")
    gw.use_sns((message["TopicArn"],), fixed_clock(message["Timestamp"]))
    response = await gw.sns(message)
    assert response.status_code == 200, response.text
    assert gw.sns_host.requests == [message["SubscribeURL"]]
    (row,) = await stored_events(gw.services)
    assert (row.provider, row.event_type, row.disposition) == (
        "sns",
        "subscription_confirmation",
        "applied",
    )
    assert row.details["topic_arn"] == message["TopicArn"]
    # SNS may send it again; confirming again is harmless and the record stays single.
    assert (await gw.sns(message)).json() == {"dispositions": ["duplicate"]}
    assert len(gw.sns_host.requests) == 2


@pytest.mark.parametrize("failure", ["status", "network"])
async def test_failed_confirmation_asks_sns_to_retry(gw: Gateway, failure: str) -> None:
    if failure == "status":
        gw.sns_host.status = 500
    else:
        gw.sns_host.fail = True
    response = await gw.sns(sign_sns(sns_message("SubscriptionConfirmation")))
    assert response.status_code == 502
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["retry-after"]
    assert len(gw.sns_host.requests) == 1
    assert await stored_events(gw.services) == []


async def test_confirmation_to_a_foreign_host_is_never_fetched(gw: Gateway) -> None:
    message = sign_sns(
        sns_message(
            "SubscriptionConfirmation", subscribe_url="https://attacker.example/?Action=Confirm"
        )
    )
    response = await gw.sns(message)
    assert response.status_code == 403
    assert response.json()["reason"] == "subscribe_url_not_sns"
    assert gw.sns_host.requests == []
    assert await stored_events(gw.services) == []


async def test_unsubscribe_confirmation_is_recorded_never_resubscribed(gw: Gateway) -> None:
    response = await gw.sns(sign_sns(sns_message("UnsubscribeConfirmation")))
    assert response.status_code == 200
    assert gw.sns_host.requests == []
    (row,) = await stored_events(gw.services)
    assert (row.event_type, row.disposition) == ("unsubscribe_confirmation", "ignored")


INVALID_SNS = [
    "derived-message-tampered.json",
    "derived-ses-message-trailing-newline-stripped.json",
    "djangoses-simple-msg-unsigned.json",
    "ruby-certurl-not-aws.json",
    "ruby-signatureversion-3.json",
]


async def test_sns_verification_failures_store_nothing(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    await make_delivery(gw.services, attempts=[("accepted", "vf-1")])
    bounce = ses_event("Bounce", message_id="vf-1")
    tampered = signed_ses(bounce)
    tampered["Message"] = tampered["Message"].replace("Permanent", "Transient")
    cases: list[tuple[dict[str, Any], str]] = [
        (signed_ses(bounce, topic_arn=OTHER_TOPIC_ARN), "topic_not_allowed"),
        (tampered, "bad_signature"),
        (sns_message(message=json.dumps(bounce)), "missing_signature"),
    ]
    for name in INVALID_SNS:
        message = json.loads((SNS_FIXTURES / "invalid" / name).read_text())
        try:
            clock = fixed_clock(message["Timestamp"])
        except ValueError:  # the unsigned vector says "Yesterday"
            clock = None
        gw.use_sns((message["TopicArn"], TEST_TOPIC_ARN), clock)
        response = await gw.sns(message)
        assert response.status_code == 403, (name, response.text)
    gw.use_sns((TEST_TOPIC_ARN,))
    for message, reason in cases:
        before = value(VERIFICATION_FAILURES, provider="sns", reason=reason)
        with caplog.at_level(logging.WARNING, logger="gateway.webhooks"):
            response = await gw.sns(message)
        assert response.status_code == 403
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["reason"] == reason
        assert value(VERIFICATION_FAILURES, provider="sns", reason=reason) == before + 1
        assert any(reason in r.getMessage() for r in caplog.records)
    assert await stored_events(gw.services) == []
    assert await suppressions(gw.services) == []


async def test_malformed_sns_body_is_400(gw: Gateway) -> None:
    for body in (b"not json", b"[1, 2]", b"\xff\xfe"):
        response = await gw.client.post("/webhooks/ses", content=body, headers=SNS_HEADERS)
        assert response.status_code == 400
        assert response.json()["type"] == "urn:problem:webhook-malformed"
    assert await stored_events(gw.services) == []


async def test_concurrent_identical_sns_posts_have_one_effect(gw: Gateway) -> None:
    await make_delivery(gw.services, attempts=[("accepted", "cc-1")])
    message = signed_ses(ses_event("Bounce", message_id="cc-1"))
    first, second = await asyncio.gather(gw.sns(message), gw.sns(message))
    assert (first.status_code, second.status_code) == (200, 200)
    assert sorted(first.json()["dispositions"] + second.json()["dispositions"]) == [
        "applied",
        "duplicate",
    ]
    assert [h.action for h in await history(gw.services)] == ["add"]


# ---- Twilio -------------------------------------------------------------------------------


async def test_status_callback_with_delivery_parameter(gw: Gateway) -> None:
    made = await make_delivery(
        gw.services, channel="sms", to=PHONE, status="sending", attempts=[("in_progress", None)]
    )
    query = f"d={made.delivery_id}"
    params = status_params("SMe1", "sent", to=PHONE)
    response = await gw.twilio(
        STATUS_PATH, params, query=query, headers={"I-Twilio-Idempotency-Token": "tok-9"}
    )
    assert response.status_code == 200 and response.json() == {"dispositions": ["parked"]}
    (row,) = await stored_events(gw.services)
    assert (row.provider_event_id, row.delivery_id) == ("tok-9", made.delivery_id)
    # The same webhook again (Twilio's own retry keeps the token): a duplicate.
    again = await gw.twilio(
        STATUS_PATH, params, query=query, headers={"I-Twilio-Idempotency-Token": "tok-9"}
    )
    assert again.json() == {"dispositions": ["duplicate"]}


async def test_real_shaped_status_callback_resigned(gw: Gateway) -> None:
    body = (TWILIO_PAYLOADS / "va-status-callback-sent.form.txt").read_bytes().strip()
    params = twilio_form("va-status-callback-sent.form.txt")
    made = await make_delivery(
        gw.services, channel="sms", to="+11111111111", attempts=[("accepted", params["MessageSid"])]
    )
    response = await gw.twilio(STATUS_PATH, params, body=body)
    assert response.status_code == 200, response.text
    delivery, (attempt,) = await delivery_state(gw.services, made.delivery_id)
    assert (delivery.status, attempt.provider_status) == ("sent", "sent")


async def test_twilio_verification_failures_store_nothing(gw: Gateway) -> None:
    params = status_params("SMbad", "undelivered", to=PHONE, error_code="21610")
    before = value(VERIFICATION_FAILURES, provider="twilio", reason="bad_signature")
    wrong_token = await gw.twilio(STATUS_PATH, params, token="someone-elses-token")
    assert wrong_token.status_code == 403
    assert wrong_token.json()["reason"] == "bad_signature"
    # Signed for one query, posted with another (the `d` parameter is covered).
    url = f"https://gateway.test{STATUS_PATH}?d=a"
    moved = await gw.client.post(
        f"{STATUS_PATH}?d=b",
        content=urlencode(params).encode(),
        headers={"X-Twilio-Signature": twilio_signature(url, params, TOKEN), **FORM},
    )
    assert moved.status_code == 403
    tampered = await gw.twilio(
        INBOUND_PATH,
        {"MessageSid": "SM1", "From": PHONE, "Body": "hello"},
        body=urlencode({"MessageSid": "SM1", "From": PHONE, "Body": "STOP"}).encode(),
    )
    assert tampered.status_code == 403
    unsigned = await gw.client.post(INBOUND_PATH, content=b"MessageSid=SM1&Body=STOP", headers=FORM)
    assert unsigned.status_code == 403 and unsigned.json()["reason"] == "missing_signature"
    assert value(VERIFICATION_FAILURES, provider="twilio", reason="bad_signature") == before + 3
    assert await stored_events(gw.services) == []
    assert await suppressions(gw.services) == []


async def test_malformed_twilio_requests_are_400(gw: Gateway) -> None:
    no_sid = await gw.twilio(STATUS_PATH, {"MessageStatus": "sent"})
    assert no_sid.status_code == 400 and no_sid.json()["type"] == "urn:problem:webhook-malformed"
    not_utf8 = await gw.client.post(STATUS_PATH, content=b"Body=\xff", headers=FORM)
    assert not_utf8.status_code == 400
    assert await stored_events(gw.services) == []


@pytest.mark.parametrize(
    ("body", "opt_out_type", "suppressed"),
    [("STOP", None, True), ("arret", "STOP", True), ("HELP", None, False), ("hi", None, False)],
)
async def test_inbound_replies_with_empty_twiml(
    gw: Gateway, body: str, opt_out_type: str | None, suppressed: bool
) -> None:
    params = twilio_form("va-inbound-sms.form.txt")
    params["Body"] = body
    if opt_out_type:
        params["OptOutType"] = opt_out_type
    response = await gw.twilio(
        INBOUND_PATH, params, headers={"I-Twilio-Idempotency-Token": "09f6d617-b893"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/xml")
    assert response.text == EMPTY_TWIML
    entries = await suppressions(gw.services)
    assert [e.reason for e in entries] == (["sms_stop"] if suppressed else [])
    (row,) = await stored_events(gw.services)
    assert row.provider_event_id == "09f6d617-b893"


async def test_concurrent_identical_twilio_posts_have_one_effect(gw: Gateway) -> None:
    params = twilio_form("va-inbound-sms.form.txt")
    params["Body"] = "stop"
    first, second = await asyncio.gather(
        gw.twilio(INBOUND_PATH, params), gw.twilio(INBOUND_PATH, params)
    )
    assert (first.status_code, second.status_code) == (200, 200)
    assert len(await stored_events(gw.services)) == 1
    assert [h.action for h in await history(gw.services)] == ["add"]


# ---- configuration and failures -----------------------------------------------------------


async def test_unconfigured_endpoints_refuse_everything(settings: Settings) -> None:
    # The sandbox SMS provider is active (the default) and still nothing unsigned gets in.
    assert settings.sms_provider == "sandbox"
    async for gw in _gateway(settings):
        response = await gw.sns(signed_ses(ses_event("Bounce", message_id="x")))
        assert response.status_code == 403
        assert response.json()["reason"] == "no_topics_configured"
        params = status_params("SM1", "sent")
        response = await gw.twilio(STATUS_PATH, params)
        assert response.status_code == 403
        assert response.json()["reason"] == "no_token_configured"
        assert await stored_events(gw.services) == []
        ready = await gw.client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"]["webhooks"] == {
            "ok": True,
            "critical": False,
            "ses": "refusing: no GATEWAY_SNS_TOPIC_ARNS",
            "twilio": "refusing: no GATEWAY_TWILIO_AUTH_TOKEN",
        }


async def test_readyz_reports_configured_webhooks(gw: Gateway) -> None:
    checks = (await gw.client.get("/readyz")).json()["checks"]["webhooks"]
    assert (checks["ses"], checks["twilio"]) == ("configured", "configured")


async def test_database_down_is_503(settings: Settings) -> None:
    async for gw in _gateway(
        settings,
        database_url="postgresql://postgres@127.0.0.1:1/nowhere",
        sns_topic_arns=(TEST_TOPIC_ARN,),
        twilio_auth_tokens=(TOKEN,),
    ):
        response = await gw.sns(signed_ses(ses_event("Bounce", message_id="db-1")))
        assert response.status_code == 503
        assert response.headers["retry-after"]
        assert response.json()["type"] == "urn:problem:webhook-temporarily-unavailable"
        response = await gw.twilio(STATUS_PATH, status_params("SM1", "sent"))
        assert response.status_code == 503
        response = await gw.twilio(INBOUND_PATH, twilio_form("va-inbound-sms.form.txt"))
        assert response.status_code == 503
