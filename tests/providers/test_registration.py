"""A new provider is a send module, a feedback module and one registration line.

The example provider (tests/providers/example_sms.py) is registered through the public
registration (`gateway.providers.Registration`, handed to `build_services` the way
gateway/providers.py lists the built-in ones); no other file knows it. Sends go out through
its adapter, classified by its error table; its signed callbacks come in on its own route,
verified by its verifier and classified by its keys, and both directions agree on its codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app, openapi_document
from gateway.keys import create_key
from gateway.providers import PROVIDERS, Registration
from gateway.services import Services, build_services
from gateway.settings import Settings, SettingsError, load_settings
from sender.classify import SendOutcome
from sender.classify import classify as classify_send
from suppression import service as suppression
from tests.conftest import bearer, replace_settings
from tests.providers import example_sms as ex
from tests.support.metrics import value
from webhooks.classify import classify as classify_feedback
from webhooks.errors import VERIFICATION_FAILURES
from webhooks.events import FeedbackEvent
from webhooks.ingest import PROVIDER_FLAGS

SECRET = "example-secret"
REGISTRATION = Registration(ex.SEND, ex.FEEDBACK)


@pytest.fixture
async def example(settings: Settings) -> AsyncIterator[Services]:
    custom = replace_settings(
        settings, sms_provider=ex.NAME, provider_env={ex.SECRET_SETTING: SECRET}
    )
    assert custom.database_url is not None
    services = build_services(custom, custom.database_url, providers=(*PROVIDERS, REGISTRATION))
    try:
        yield services
    finally:
        await services.close()


@pytest.fixture
async def http(example: Services) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(example), client=("203.0.113.7", 4711))
    async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
        yield c


async def _key(services: Services) -> str:
    async with services.sessions() as session:
        _, secret = await create_key(session, ["send", "read"], name="example")
        await session.commit()
    return secret


async def _send(http: httpx.AsyncClient, key: str, to: str) -> dict[str, Any]:
    r = await http.post(
        "/v1/messages",
        json={"channel": "sms", "to": [to], "body": "Code 123456"},
        headers={**bearer(key), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert r.status_code == 201, r.text
    (delivery,) = r.json()["deliveries"]
    answer: dict[str, Any] = {**delivery, "message_id": r.json()["id"]}
    return answer


async def _view(http: httpx.AsyncClient, key: str, delivery: dict[str, Any]) -> dict[str, Any]:
    r = await http.get(f"/v1/messages/{delivery['message_id']}", headers=bearer(key))
    assert r.status_code == 200, r.text
    (view,) = r.json()["deliveries"]
    answer: dict[str, Any] = view
    return answer


def _callback(payload: dict[str, Any], secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    return body, {"Content-Type": "application/json", "X-Example-Signature": ex.sign(secret, body)}


async def test_send_and_feedback_work_through_the_registration(
    example: Services, http: httpx.AsyncClient
) -> None:
    key = await _key(example)
    to = "+15005550006"
    sent = await _send(http, key, to)
    assert sent["status"] == "sent"
    assert [m.to for m in ex.OUTBOX][-1] == to
    pmid = f"ex-{sent['id']}"

    # A forged callback is refused by the provider's verifier and changes nothing.
    body, headers = _callback({"id": "ev0", "message_id": pmid, "status": "delivered"}, "x")
    before = value(VERIFICATION_FAILURES, provider=ex.NAME, reason="bad_signature")
    r = await http.post(f"/webhooks/{ex.NAME}", content=body, headers=headers)
    assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem")
    assert value(VERIFICATION_FAILURES, provider=ex.NAME, reason="bad_signature") == before + 1
    assert (await _view(http, key, sent))["status"] == "sent"

    # Malformed input: 400 problem document.
    body, headers = _callback({"id": "ev1"})
    r = await http.post(f"/webhooks/{ex.NAME}", content=body, headers=headers)
    assert r.status_code == 400

    # The signed callback is stored, correlated and applied.
    body, headers = _callback({"id": "ev2", "message_id": pmid, "status": "delivered"})
    r = await http.post(f"/webhooks/{ex.NAME}", content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"dispositions": ["applied"]}
    r = await http.post(f"/webhooks/{ex.NAME}", content=body, headers=headers)
    assert r.json() == {"dispositions": ["duplicate"]}
    view = await _view(http, key, sent)
    assert view["status"] == "delivered" and view["provider"] == ex.NAME
    assert [e["provider"] for e in view["events"]] == [ex.NAME]


async def test_the_providers_error_table_drives_both_directions(
    example: Services, http: httpx.AsyncClient
) -> None:
    key = await _key(example)
    # Send side: a bad number fails and is suppressed, by the provider's own table.
    refused = await _send(http, key, "+15005550100")
    assert (refused["status"], refused["reason"]) == ("failed", "invalid_address")
    async with example.sessions() as session:
        hit = await suppression.check(
            session, "sms", example.protector.hash("sms", "+15005550100"), category="marketing"
        )
    assert hit is not None and hit.reason == "invalid_address"

    # Feedback side: an account-level code in a callback flags the provider and pauses the
    # delivery; the recipient is not suppressed.
    sent = await _send(http, key, "+15005550007")
    flags = value(PROVIDER_FLAGS, provider=ex.NAME, rule=f"{ex.NAME}:E900")
    payload = {"id": "ev3", "message_id": f"ex-{sent['id']}", "status": "failed", "code": "E900"}
    body, headers = _callback(payload)
    r = await http.post(f"/webhooks/{ex.NAME}", content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"dispositions": ["applied"]}
    assert value(PROVIDER_FLAGS, provider=ex.NAME, rule=f"{ex.NAME}:E900") == flags + 1
    view = await _view(http, key, sent)
    assert (view["status"], view["reason"]) == ("queued", "account")


@pytest.mark.parametrize("code", sorted(ex.ERRORS.codes))
def test_both_classifiers_agree_on_every_code(code: str) -> None:
    from gateway.providers import activate
    from tests.webhooks.test_one_table import CLASS_OF_OUTCOME

    activate([REGISTRATION])
    sent = classify_send(SendOutcome(ex.NAME, error_code=code, http_status=400))
    event = FeedbackEvent(
        provider=ex.NAME,
        provider_event_id="e",
        event_type="failed",
        channel="sms",
        details={"error_code": code},
    )
    fed = classify_feedback(event)
    assert (sent.key, fed.rule) == (f"{ex.NAME}:{code}", f"{ex.NAME}:{code}")
    assert CLASS_OF_OUTCOME[fed.outcome.name] == sent.kind


async def test_the_registration_is_scoped_to_the_services_that_got_it(example: Services) -> None:
    ours = openapi_document(create_app(example)).paths or {}
    default = openapi_document(create_app()).paths or {}
    assert f"/webhooks/{ex.NAME}" in ours and f"/webhooks/{ex.NAME}" not in default
    ready, details = await example.readiness["webhooks"]()
    assert ready and details[ex.NAME] == "configured"


def test_the_providers_settings_and_defaults_live_with_it() -> None:
    providers = (*PROVIDERS, REGISTRATION)
    with pytest.raises(SettingsError) as info:
        load_settings({"GATEWAY_SMS_PROVIDER": ex.NAME}, providers=providers)
    assert info.value.name == ex.SECRET_SETTING
    env = {"GATEWAY_SMS_PROVIDER": ex.NAME, ex.SECRET_SETTING: SECRET}
    loaded = load_settings(env, providers=providers)
    assert loaded.sms_provider == ex.NAME
    assert loaded.provider_env == {ex.SECRET_SETTING: SECRET}
    assert loaded.retry.rate_limits[f"{ex.NAME}:*"] == ex.SEND.rate_limits[f"{ex.NAME}:*"]
    # Without the registration the name is refused, as before.
    with pytest.raises(SettingsError):
        load_settings({"GATEWAY_SMS_PROVIDER": ex.NAME})


def test_the_registry_is_light() -> None:
    # The settings read the registry at every start (`gateway keys list` too): declaring the
    # providers must not import an SDK or the web framework; adapters and routes are built
    # on demand.
    code = (
        "import sys, gateway.settings, gateway.providers; "
        "heavy = {'twilio.rest', 'boto3', 'litestar'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
