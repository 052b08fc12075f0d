"""Every delivery of a send answer that is not final says why: a client that gets
`202 queued` must learn what holds it (rate limit, open circuit, account pause, retry,
unknown outcome, limiter unavailable), never `"reason": null`."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import httpx

from gateway.settings import Settings
from retry.settings import RateSpec
from tests.sender.helpers import Gateway, provider_settings, sms
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import TwilioStub

FINAL = {"sent", "delivered", "failed", "suppressed", "dead", "bounced", "complained", "read"}


def _non_final(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code in (201, 202), response.text
    deliveries: list[dict[str, Any]] = response.json()["deliveries"]
    for d in deliveries:
        if d["status"] not in FINAL:
            assert isinstance(d["reason"], str) and d["reason"], d
    return [d for d in deliveries if d["status"] not in FINAL]


async def test_rate_limited_deliveries_say_so(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    base = provider_settings(settings, twilio_api_base=twilio_stub.url)
    retry = dataclasses.replace(base.retry, rate_limits={"twilio:*": RateSpec(0.001, 2.0)})
    async with make_gateway(dataclasses.replace(base, retry=retry)) as gw:
        # The bucket holds 3 tokens (enlarged for the priority reservation) and barely refills.
        r = await gw.send(sms([f"+1415555267{i}" for i in range(5)]))
        assert r.status_code == 202
        held = _non_final(r)
        assert len(held) == 2
        for d in held:
            assert d["status"] == "queued"
            assert d["reason"].startswith("deferred: rate limit twilio:")


async def test_account_pause_open_circuit_and_retry_say_so(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(500, None, "upstream down"))
    [retrying] = _non_final(await gw.send(sms("+14155552670")))
    assert retrying["status"] == "retrying"

    # 21212 (invalid From number) is about the whole account: the send pauses, held with
    # the provider's reason.
    twilio_stub.then(Behavior.error(400, 21212, "invalid From number"))
    [paused] = _non_final(await gw.send(sms("+14155552671")))
    assert paused["status"] == "queued" and paused["reason"].startswith("twilio:21212")

    [deferred] = _non_final(await gw.send(sms("+14155552672")))
    assert (deferred["status"], deferred["reason"]) == ("queued", "deferred: twilio circuit open")
