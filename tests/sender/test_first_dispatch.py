"""The first dispatch of a send reuses what the claim just wrote instead of reading it back
before the rate limiter; everything is still checked under the row lock before the call."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from sender.dispatch import Dispatcher
from tests.sender.helpers import Gateway, attempts_of, delivery, sms, suppress_sms
from tests.stubs.twilio_stub import TwilioStub


class _Limiter:
    """A limiter that records what it was asked, runs a hook, and answers `grant`."""

    def __init__(self, grant: bool, hook: Callable[[], Awaitable[object]] | None = None) -> None:
        self.grant = grant
        self.hook = hook
        self.calls: list[tuple[str, str]] = []

    async def acquire_many(self, key: str, priority: str, n: int) -> int:
        self.calls.append((key, priority))
        if self.hook is not None:
            await self.hook()
        return n if self.grant else 0


def _dispatcher(gw: Gateway) -> Dispatcher:
    dispatcher: Dispatcher = gw.services.sender.dispatcher
    return dispatcher


async def test_a_suppression_added_after_the_claim_still_stops_the_first_send(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    number = "+14155552671"
    # The limiter runs between the claim (which found no suppression) and the attempt.
    limiter = _Limiter(True, lambda: suppress_sms(gw.services, number))
    _dispatcher(gw).limiter = limiter

    response = await gw.send(sms(number))

    assert response.status_code == 201, response.text
    answer = response.json()["deliveries"][0]
    assert answer["status"] == "suppressed" and answer["reason"] == "sms_stop"
    assert len(limiter.calls) == 1
    row = await delivery(gw.services, answer["id"])
    assert row.status == "suppressed" and row.suppression_id is not None
    assert await attempts_of(gw.services, answer["id"]) == []
    assert twilio_stub.count == 0


async def test_the_first_send_asks_the_limiter_what_a_later_dispatch_asks(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    limiter = _Limiter(False)
    _dispatcher(gw).limiter = limiter

    response = await gw.send(sms("+14155552671", priority="high"))

    assert response.status_code == 202, response.text
    answer = response.json()["deliveries"][0]
    assert answer["status"] == "queued"
    assert await attempts_of(gw.services, answer["id"]) == []
    # The retry worker's path reads the delivery back from the database.
    status = await _dispatcher(gw).dispatch(uuid.UUID(answer["id"]))
    assert status == "queued"
    assert len(limiter.calls) == 2
    assert limiter.calls[0] == limiter.calls[1]
    assert limiter.calls[0][1] == "high"
    assert twilio_stub.count == 0

    limiter.grant = True
    assert await _dispatcher(gw).dispatch(uuid.UUID(answer["id"])) == "sent"
    assert [(a.number, a.status) for a in await attempts_of(gw.services, answer["id"])] == [
        (1, "accepted")
    ]
    assert twilio_stub.count == 1
