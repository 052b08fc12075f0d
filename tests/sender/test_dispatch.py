"""`dispatch(delivery_id)`: the retry worker's entry into the send path."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, update

from gateway.settings import Settings
from retry import dlq
from retry.models import DeadLetter
from retry.settings import RateSpec
from sender.dispatch import DeliveryNotFound, Dispatcher
from sender.models import Delivery
from suppression.db import utcnow
from tests.sender.helpers import (
    Gateway,
    attempts_of,
    delivery,
    provider_settings,
    sms,
    suppress_sms,
)
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import TwilioStub


def _dispatcher(gw: Gateway) -> Dispatcher:
    dispatcher: Dispatcher = gw.services.sender.dispatcher
    return dispatcher


async def _deferred_sms(gw: Gateway, stub: TwilioStub, **extra: Any) -> str:
    """A delivery whose first attempt failed transiently (now `retrying`)."""
    stub.then(Behavior.error(503, None, "Service Unavailable"))
    r = await gw.send(sms("+14155552671", **extra))
    answer = r.json()["deliveries"][0]
    assert answer["status"] == "retrying"
    return str(answer["id"])


class Limiter:
    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.calls: list[tuple[str, str]] = []

    async def acquire_many(self, key: str, priority: str, n: int) -> int:
        self.calls.append((key, priority))
        return n if self.allow else 0


class Breaker:
    def __init__(self, allow: bool) -> None:
        self.allowed = allow
        self.events: list[tuple[str, str, bool]] = []

    async def allow(self, provider: str) -> bool:
        return self.allowed

    async def record_success(self, provider: str) -> None:
        self.events.append(("success", provider, False))

    async def record_failure(self, provider: str, *, account_level: bool = False) -> None:
        self.events.append(("failure", provider, account_level))


async def test_a_retry_succeeds_through_the_same_path(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    delivery_id = await _deferred_sms(gw, twilio_stub)
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "sent"
    first, second = await attempts_of(gw.services, delivery_id)
    assert (first.number, first.status) == (1, "transient")
    assert (second.number, second.status) == (2, "accepted")
    row = await delivery(gw.services, delivery_id)
    assert (row.status, row.attempts, row.next_attempt_at) == ("sent", 2, None)
    assert row.provider_message_id == second.provider_message_id
    assert twilio_stub.count == 2
    # A delivery that reached a provider state is not sent again.
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "sent"
    assert twilio_stub.count == 2


async def test_suppression_is_checked_again(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    delivery_id = await _deferred_sms(gw, twilio_stub)
    entry = await suppress_sms(gw.services, "+14155552671")
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "suppressed"
    row = await delivery(gw.services, delivery_id)
    assert (row.reason, row.suppression_id, row.next_attempt_at) == ("sms_stop", entry.id, None)
    assert twilio_stub.count == 1


async def test_past_the_deadline_it_is_dead_lettered_unsent(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    delivery_id = await _deferred_sms(gw, twilio_stub)
    async with gw.services.sessions() as session:
        await session.execute(
            update(Delivery).values(expires_at=utcnow() - dt.timedelta(seconds=1))
        )
        await session.commit()
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "dead"
    async with gw.services.sessions() as session:
        [entry] = (await session.scalars(select(DeadLetter))).all()
    assert (entry.reason, entry.delivery_id) == ("expired", uuid.UUID(delivery_id))
    assert twilio_stub.count == 1


@pytest.mark.parametrize("who", ["limiter", "breaker"])
async def test_no_token_or_open_circuit_defers_without_calling_or_counting(
    providers_gateway: Gateway, twilio_stub: TwilioStub, who: str
) -> None:
    gw = providers_gateway
    delivery_id = await _deferred_sms(gw, twilio_stub, priority="high")
    limiter, breaker = Limiter(allow=who != "limiter"), Breaker(allow=who != "breaker")
    _dispatcher(gw).limiter, _dispatcher(gw).breaker = limiter, breaker
    before = utcnow()
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "queued"
    row = await delivery(gw.services, delivery_id)
    assert row.attempts == 1 and len(await attempts_of(gw.services, delivery_id)) == 1
    defer = gw.services.settings.retry.defer_seconds
    assert row.next_attempt_at is not None
    assert before + dt.timedelta(seconds=defer) <= row.next_attempt_at
    assert row.reason is not None and row.reason.startswith("deferred")
    assert twilio_stub.count == 1
    if who == "limiter":
        assert limiter.calls == [("twilio:+15017122661", "high")]
    # Allowed again: it goes out, and the outcome is reported to the breaker.
    limiter.allow, breaker.allowed = True, True
    assert await gw.services.dispatch(uuid.UUID(delivery_id)) == "sent"
    assert breaker.events[-1] == ("success", "twilio", False)


async def test_the_real_rate_limiter_defers_the_excess(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(settings, twilio_api_base=twilio_stub.url)
    retry = dataclasses.replace(
        changed.retry, rate_limits={"twilio:*": RateSpec(0.001, 2.0)}, low_priority_share=1.0
    )
    async with make_gateway(provider_settings(changed, retry=retry, send_concurrency=1)) as gw:
        r = await gw.send(sms(["+14155552671", "+14155552672", "+14155552673"]))
        assert r.status_code == 202
        assert [d["status"] for d in r.json()["deliveries"]] == ["sent", "sent", "queued"]
        assert twilio_stub.count == 2
        assert await attempts_of(gw.services, r.json()["deliveries"][2]["id"]) == []


async def test_account_errors_are_reported_as_account_level(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    breaker = Breaker(allow=True)
    _dispatcher(gw).breaker = breaker
    twilio_stub.then(
        Behavior.error(403, 30002, "Account suspended"), Behavior.error(500, None, "x")
    )
    await gw.send(sms("+14155552671"))
    await gw.send(sms("+14155552672"))
    assert breaker.events == [("failure", "twilio", True), ("failure", "twilio", False)]


async def test_only_one_of_two_concurrent_dispatches_calls_the_provider(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    delivery_id = uuid.UUID(await _deferred_sms(gw, twilio_stub))
    release = threading.Event()
    twilio_stub.received.clear()
    twilio_stub.then(Behavior.accept(hold=release))
    dispatch = gw.services.dispatch
    first = asyncio.create_task(dispatch(delivery_id))
    try:
        await asyncio.to_thread(twilio_stub.received.wait, 10)
        assert await dispatch(delivery_id) == "sending"
    finally:
        release.set()
    assert await first == "sent"
    assert twilio_stub.count == 2
    assert len(await attempts_of(gw.services, delivery_id)) == 2


async def test_unknown_waits_for_the_settle_window_then_follows_policy(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    dispatch = gw.services.dispatch
    twilio_stub.then(Behavior.drop(), Behavior.drop())
    tx = (await gw.send(sms("+14155552671"))).json()["deliveries"][0]["id"]
    promo = (await gw.send(sms("+14155552672", category="marketing"))).json()["deliveries"][0]["id"]
    assert twilio_stub.count == 2
    # Inside the settle window nothing is sent.
    assert await dispatch(uuid.UUID(tx)) == "unknown"
    assert twilio_stub.count == 2
    # The window passed without a callback (the worker claims it: next_attempt_at cleared).
    async with gw.services.sessions() as session:
        await session.execute(update(Delivery).values(next_attempt_at=None))
        await session.commit()
    assert await dispatch(uuid.UUID(tx)) == "sent"  # transactional: a second OTP beats none
    assert await dispatch(uuid.UUID(promo)) == "dead"  # marketing: not resent
    assert twilio_stub.count == 3
    row = await delivery(gw.services, promo)
    assert row.reason == "unknown_outcome"


async def test_hooks_run_after_the_outcome_is_committed(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    seen: list[tuple[str, Any]] = []

    async def on_parked(delivery_id: uuid.UUID) -> None:
        # Only deliveries with feedback parked during their call are looked up again.
        seen.append(("parked", delivery_id))

    async def on_unknown(delivery_id: uuid.UUID) -> None:
        row = await delivery(gw.services, delivery_id)
        assert row.status == "unknown"
        seen.append(("unknown", delivery_id))

    _dispatcher(gw).on_parked = on_parked
    _dispatcher(gw).on_unknown_outcome = on_unknown
    twilio_stub.then(Behavior.accept(), Behavior.drop())
    ok = (await gw.send(sms("+14155552671"))).json()["deliveries"][0]["id"]
    lost = (await gw.send(sms("+14155552672"))).json()["deliveries"][0]["id"]
    assert (await delivery(gw.services, ok)).status == "sent"
    assert seen == [("unknown", uuid.UUID(lost))]


async def test_unknown_delivery_id(providers_gateway: Gateway) -> None:
    with pytest.raises(DeliveryNotFound):
        await providers_gateway.services.dispatch(uuid.uuid4())


async def test_a_redriven_delivery_gets_a_fresh_budget_and_keeps_its_history(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Callable[..., Any]
) -> None:
    changed = provider_settings(settings, twilio_api_base=twilio_stub.url)
    changed = provider_settings(changed, retry=dataclasses.replace(changed.retry, max_attempts=1))
    twilio_stub.then(Behavior.error(503, None, "unavailable"))
    async with make_gateway(changed) as gw:
        answer = (await gw.send(sms("+14155552671"))).json()["deliveries"][0]
        assert answer["status"] == "dead"
        async with gw.services.sessions() as session:
            entry = await session.scalar(select(DeadLetter))
            assert entry is not None
            await dlq.redrive(session, gw.services.delivery_queue, entry.id, actor="operator")
            await session.commit()
        assert await gw.services.dispatch(uuid.UUID(answer["id"])) == "sent"
        attempts = await attempts_of(gw.services, answer["id"])
        assert [(a.number, a.status) for a in attempts] == [(1, "transient"), (2, "accepted")]
        assert (await delivery(gw.services, answer["id"])).attempts == 1
