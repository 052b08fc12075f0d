"""The stale report: `GET /v1/reports/stale` and `gateway report stale`, on real sends
through the Twilio adapter to the local stub and real signed callbacks."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

import gateway.cli
from gateway.app import create_app
from gateway.cli import main
from gateway.services import build_services
from gateway.settings import Settings
from suppression.db import pg_connection
from tests.conftest import gateway_env
from tests.sender.helpers import Gateway, provider_settings, sms
from tests.stubs.twilio_stub import AUTH_TOKEN, TwilioStub
from tests.webhooks.feedback import status_params
from tests.webhooks.signing import twilio_signature

PHONE = "+15005550006"
NEVER_SID = "SM" + "f" * 32
STATUS_PATH = "/webhooks/twilio/status"


@pytest.fixture
def twilio_stub() -> Iterator[TwilioStub]:
    stub = TwilioStub().start()
    yield stub
    stub.stop()


@pytest.fixture
async def gw(settings: Settings, twilio_stub: TwilioStub) -> AsyncIterator[Gateway]:
    configured = provider_settings(settings, twilio_api_base=twilio_stub.url)
    assert configured.database_url is not None
    services = build_services(configured, configured.database_url)
    transport = httpx.ASGITransport(app=create_app(services), client=("203.0.113.7", 4711))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            gateway = Gateway(services, c, "")
            gateway.secret = await gateway.make_key("send", "read")
            yield gateway
    finally:
        await services.close()


async def _callback(gw: Gateway, params: dict[str, str]) -> httpx.Response:
    url = f"https://gateway.test{STATUS_PATH}"
    return await gw.client.post(
        STATUS_PATH,
        content=urlencode(params).encode(),
        headers={
            "X-Twilio-Signature": twilio_signature(url, params, AUTH_TOKEN),
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )


async def _sent(gw: Gateway) -> dict[str, Any]:
    r = await gw.send(sms(PHONE))
    assert r.status_code == 201, r.text
    (answer,) = r.json()["deliveries"]
    assert answer["status"] == "sent"
    view = await gw.client.get(r.headers["Location"], headers=gw.headers)
    delivery: dict[str, Any] = view.json()["deliveries"][0]
    return delivery


async def _scenario(gw: Gateway) -> tuple[dict[str, Any], dict[str, Any]]:
    """A delivery whose callback never came and one whose did (both 73 h old), a parked
    callback for a message nobody sent (73 h old), and a recent delivery still `sent`."""
    never = await _sent(gw)
    answered = await _sent(gw)
    r = await _callback(gw, status_params(answered["provider_message_id"], "delivered", to=PHONE))
    assert r.status_code == 200, r.text
    r = await _callback(gw, status_params(NEVER_SID, "delivered", to=PHONE))
    assert r.status_code == 200, r.text
    async with pg_connection(gw.services.engine) as conn:
        assert (
            await conn.fetchval(
                "SELECT disposition FROM provider_events WHERE provider_message_id = $1", NEVER_SID
            )
            == "parked"
        )
        await conn.execute(
            "UPDATE deliveries SET created_at = now() - interval '73 hours', "
            "updated_at = now() - interval '73 hours'"
        )
        await conn.execute("UPDATE provider_events SET received_at = now() - interval '73 hours'")
    await _sent(gw)  # recent: not stale
    return never, answered


async def test_stale_report_lists_the_delivery_without_callback_and_the_parked_event(
    gw: Gateway,
) -> None:
    never, answered = await _scenario(gw)
    r = await gw.client.get("/v1/reports/stale", headers=gw.headers)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["hours"] == 72
    deliveries = report["deliveries"]
    assert deliveries["total"] == 1
    (group,) = deliveries["groups"]
    assert (group["provider"], group["status"], group["count"]) == ("twilio", "sent", 1)
    (example,) = deliveries["examples"]
    assert example["id"] == never["id"] and example["status"] == "sent"
    assert example["provider_message_id"] == never["provider_message_id"]
    assert answered["id"] not in r.text  # its callback came
    parked = report["parked_events"]
    assert parked["total"] == 1
    assert [(g["provider"], g["event_type"], g["count"]) for g in parked["groups"]] == [
        ("twilio", "delivered", 1)
    ]
    assert parked["examples"][0]["provider_message_id"] == NEVER_SID
    # No address anywhere in the report (the read key sees ids and times only).
    assert PHONE not in r.text and "5550006" not in r.text

    # `hours` moves the cutoff: 1 h still finds them (the recent one is not an hour old),
    # 100 h finds nothing.
    shorter = (await gw.client.get("/v1/reports/stale?hours=1", headers=gw.headers)).json()
    assert shorter["deliveries"]["total"] == 1 and shorter["parked_events"]["total"] == 1
    longer = (await gw.client.get("/v1/reports/stale?hours=100", headers=gw.headers)).json()
    assert longer["deliveries"]["total"] == 0 and longer["parked_events"]["total"] == 0


async def test_stale_report_scope_and_bad_input(gw: Gateway) -> None:
    assert (await gw.client.get("/v1/reports/stale")).status_code == 401
    send_only = {"Authorization": f"Bearer {await gw.make_key('send')}"}
    assert (await gw.client.get("/v1/reports/stale", headers=send_only)).status_code == 403
    for query in (
        "hours=0",
        "hours=null",
        "hours=-1",
        "hours=abc",
        "hours=100000",
        "limit=0",
        "limit=101",
    ):
        r = await gw.client.get(f"/v1/reports/stale?{query}", headers=gw.headers)
        assert r.status_code == 400, (query, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_gateway_report_stale_prints_the_same_report(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    never, _ = await _scenario(gw)
    settings = gw.services.settings
    assert settings.database_url is not None
    for name in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    for name, value in gateway_env(settings.database_url, settings.redis_url).items():
        monkeypatch.setenv(name, value)
    # The command would configure the process's logging (levels, handlers) for good: not
    # what is tested here, and it would change what later tests' log capture sees.
    monkeypatch.setattr(gateway.cli, "_logging", lambda settings: None)

    async def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["report", "stale", *args])
        out, _ = capsys.readouterr()
        return code, out

    code, out = await run("--json")
    assert code == 0
    printed = json.loads(out)
    api = (await gw.client.get("/v1/reports/stale", headers=gw.headers)).json()
    for part in ("deliveries", "parked_events"):
        assert printed[part]["total"] == api[part]["total"] == 1
        assert [str(x["id"]) for x in printed[part]["examples"]] == [
            x["id"] for x in api[part]["examples"]
        ]
    code, out = await run()
    assert code == 0
    assert "deliveries without a final callback: 1" in out
    assert f"{never['id']}\t" in out and NEVER_SID in out
    assert PHONE not in out
    with pytest.raises(SystemExit) as refused:
        main(["report", "stale", "--hours", "0"])
    assert refused.value.code == 2
