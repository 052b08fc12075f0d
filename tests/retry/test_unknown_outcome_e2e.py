"""DESIGN "Unknown outcome", end to end through the real pieces.

`POST /v1/messages` on the app, the real dispatch (`services.dispatch`), the real
`twilio` client against the local Twilio stub, the worker from `gateway.worker.build_worker`
(its `sweep()` and `run_once()`/`drain()`) and, for the callback, the signed Twilio status
webhook.

The "process died mid-call" state is made the way it happens: the stub takes the message and
holds its answer, and the request that is waiting for it is cancelled, so the attempt row the
dispatch committed before the call stays `in_progress` and nothing records an outcome. The
sweeper (small `stale_in_progress_seconds`) then turns it `unknown`, and the settle window
(small `unknown_settle_seconds`) decides: transactional retries, marketing is dead-lettered,
and a callback carrying the delivery id during the window counts as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from sqlalchemy import select

from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import Services, build_services
from gateway.settings import Settings
from gateway.worker import build_worker
from retry.models import DeadLetter
from retry.worker import Worker
from sender.models import Attempt, Delivery
from suppression.db import utcnow
from tests.conftest import bearer, replace_settings
from tests.sender.helpers import attempts_of, delivery
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub
from tests.webhooks.feedback import status_params
from tests.webhooks.signing import twilio_signature
from webhooks.models import ProviderEvent

PUBLIC_URL = "https://gateway.test"
STALE_SECONDS = 0.2
SETTLE_SECONDS = 0.6
# Polling guards against hanging; they are not timing assertions.
POLL_SECONDS = 0.02
POLLS = 1500


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(POLLS):
        if await check():
            return
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"never happened: {what}")


@dataclass
class Rig:
    services: Services
    client: httpx.AsyncClient
    stub: TwilioStub
    headers: dict[str, str]
    worker: Worker
    releases: list[threading.Event]

    def calls(self, to: str) -> list[dict[str, Any]]:
        """The Messages.create parameters the stub received for `to`, in order."""
        return [c.body for c in self.stub.calls_to(to)]

    async def send_and_die_mid_call(self, to: str, **extra: object) -> uuid.UUID:
        """POST a message whose provider call never returns to the gateway.

        The stub takes the message and holds its answer; the request waiting for it is then
        cancelled (the process "died"). Returns the delivery id (from the status callback URL
        the stub received, as Twilio would know it).
        """
        release = threading.Event()
        self.releases.append(release)
        self.stub.then_to(to, Behavior.accept(hold=release))
        body = {"channel": "sms", "to": [to], "body": "Your code is 123456", **extra}
        request = asyncio.create_task(
            self.client.post(
                "/v1/messages",
                json=body,
                headers={**self.headers, "Idempotency-Key": uuid.uuid4().hex},
            )
        )

        async def reached_provider() -> bool:
            assert not request.done(), "the request finished although the stub holds its answer"
            return len(self.stub.calls_to(to)) == 1

        await _eventually(reached_provider, "the message reached the stub")
        [call] = self.calls(to)
        delivery_id = uuid.UUID(parse_qs(urlsplit(call["StatusCallback"]).query)["d"][0])
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        # Let the stub answer now: the dispatch that waited for it is gone, so nobody records it.
        release.set()
        return delivery_id

    async def run_worker_until_settled(self, delivery_id: uuid.UUID) -> None:
        """Run worker rounds until the delivery leaves `unknown` (the policy was applied)."""

        async def settled() -> bool:
            await self.worker.run_once()
            return (await delivery(self.services, delivery_id)).status != "unknown"

        await _eventually(settled, "the worker applied the unknown-outcome policy")

    async def sweep_until_unknown(self, delivery_id: uuid.UUID) -> dt.datetime:
        """Run the worker's sweeper until the stale attempt is resolved; the settle deadline."""

        async def resolved() -> bool:
            await self.worker.sweep()
            return [a.status for a in await attempts_of(self.services, delivery_id)] != [
                "in_progress"
            ]

        await _eventually(resolved, "the sweeper resolved the stale attempt")
        row = await delivery(self.services, delivery_id)
        assert row.status == "unknown"
        [attempt] = await attempts_of(self.services, delivery_id)
        assert attempt.status == "unknown" and attempt.provider_message_id is None
        assert row.next_attempt_at is not None and attempt.finished_at is not None
        # due again after the settle window, counted from when the sweeper found it
        assert row.next_attempt_at == attempt.finished_at + dt.timedelta(seconds=SETTLE_SECONDS)
        return row.next_attempt_at

    async def wait_past(self, at: dt.datetime) -> None:
        """Wait until the clock the worker uses has passed `at`."""

        async def passed() -> bool:
            return utcnow() > at

        await _eventually(passed, f"the clock passed {at.isoformat()}")

    async def status_callback(self, sid: str, status: str, to: str, delivery_id: uuid.UUID) -> int:
        """Twilio's signed status callback to the URL the message carried (with `d`)."""
        params = {**status_params(sid, status, to=to), "AccountSid": ACCOUNT_SID}
        query = urlencode({"d": str(delivery_id)})
        url = f"{PUBLIC_URL}/webhooks/twilio/status?{query}"
        response = await self.client.post(
            f"/webhooks/twilio/status?{query}",
            content=urlencode(params).encode(),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Twilio-Signature": twilio_signature(url, params, AUTH_TOKEN),
            },
        )
        return response.status_code


@pytest.fixture
async def rig(settings: Settings) -> AsyncIterator[Rig]:
    """A gateway on the Twilio adapter pointed at the stub, with small stale/settle windows."""
    releases: list[threading.Event] = []
    with TwilioStub() as stub:
        custom = replace_settings(
            settings,
            public_url=PUBLIC_URL,
            sms_provider="twilio",
            twilio_account_sid=ACCOUNT_SID,
            twilio_auth_tokens=(AUTH_TOKEN,),
            sms_from="+15005550006",
            twilio_api_base=stub.url,
            provider_read_timeout_seconds=30.0,
            retry=dataclasses.replace(
                settings.retry,
                rate_limits={},
                stale_in_progress_seconds=STALE_SECONDS,
                unknown_settle_seconds=SETTLE_SECONDS,
                unknown_outcome_marketing="dead_letter",
            ),
        )
        assert custom.database_url is not None
        services = build_services(custom, custom.database_url)
        try:
            worker = build_worker(services)
            assert worker is not None
            async with services.sessions() as s:
                _, secret = await create_key(s, ["send"], name="unknown-e2e")
                await s.commit()
            transport = httpx.ASGITransport(app=create_app(services))
            async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as c:
                yield Rig(services, c, stub, bearer(secret), worker, releases)
        finally:
            for release in releases:
                release.set()
            await services.close()


async def _attempt_states(services: Services, delivery_id: uuid.UUID) -> list[tuple[int, str]]:
    return [(a.number, a.status) for a in await attempts_of(services, delivery_id)]


async def test_died_mid_call_transactional_is_resent_after_the_settle_window(rig: Rig) -> None:
    to = "+14155550101"
    delivery_id = await rig.send_and_die_mid_call(to)
    # what the dead process left behind: the attempt committed before the call, in progress
    assert await _attempt_states(rig.services, delivery_id) == [(1, "in_progress")]
    assert (await delivery(rig.services, delivery_id)).status == "sending"

    settle_at = await rig.sweep_until_unknown(delivery_id)

    # no callback arrives; the worker picks it up once the window has passed
    await rig.run_worker_until_settled(delivery_id)

    row = await delivery(rig.services, delivery_id)
    assert row.status == "sent" and row.next_attempt_at is None
    first, second = rig.calls(to)
    # the same delivery (its id in the signed callback URL), sent a second time
    assert second["StatusCallback"] == first["StatusCallback"]
    assert second["To"] == to and second["Body"] == "Your code is 123456"
    old, new = await attempts_of(rig.services, delivery_id)
    assert (old.number, old.status) == (1, "unknown")
    assert (new.number, new.status) == (2, "accepted")
    assert new.provider_message_id == rig.stub.accepted[1]["sid"] == row.provider_message_id
    # not before the settle window was over
    assert new.started_at >= settle_at
    # settled for good: further rounds and sweeps send nothing
    await rig.worker.sweep()
    await rig.worker.drain()
    assert len(rig.calls(to)) == 2


async def test_died_mid_call_marketing_is_dead_lettered_not_resent(rig: Rig) -> None:
    to = "+14155550102"
    delivery_id = await rig.send_and_die_mid_call(to, category="marketing", priority="low")
    assert await _attempt_states(rig.services, delivery_id) == [(1, "in_progress")]

    settle_at = await rig.sweep_until_unknown(delivery_id)

    await rig.run_worker_until_settled(delivery_id)

    row = await delivery(rig.services, delivery_id)
    assert row.status == "dead" and row.next_attempt_at is None
    async with rig.services.sessions() as s:
        [entry] = (
            await s.scalars(select(DeadLetter).where(DeadLetter.delivery_id == delivery_id))
        ).all()
    assert entry.reason == "unknown_outcome" and entry.channel == "sms"
    assert entry.created_at >= settle_at
    assert [(h["number"], h["status"]) for h in entry.attempt_history] == [(1, "unknown")]
    # no second marketing SMS, then or later
    await rig.worker.sweep()
    await rig.worker.drain()
    assert len(rig.calls(to)) == 1
    assert await _attempt_states(rig.services, delivery_id) == [(1, "unknown")]


async def test_a_callback_during_the_settle_window_counts_as_sent(rig: Rig) -> None:
    to = "+14155550103"
    delivery_id = await rig.send_and_die_mid_call(to)
    settle_at = await rig.sweep_until_unknown(delivery_id)
    # Twilio did create the message (the stub answered, too late for anyone to hear) and
    # reports on it to the callback URL that carries the delivery id.
    sid = rig.stub.accepted[0]["sid"]
    assert (await delivery(rig.services, delivery_id)).status == "unknown"
    assert await rig.status_callback(sid, "delivered", to, delivery_id) == 200

    row = await delivery(rig.services, delivery_id)
    assert row.status == "delivered"
    assert row.provider_message_id == sid
    assert row.next_attempt_at is None  # the pending settle-window re-check is cancelled
    [attempt] = await attempts_of(rig.services, delivery_id)
    assert (attempt.status, attempt.provider_message_id) == ("accepted", sid)
    async with rig.services.sessions() as s:
        [event] = (await s.scalars(select(ProviderEvent))).all()
    assert (event.disposition, event.delivery_id, event.attempt_id) == (
        "applied",
        delivery_id,
        attempt.id,
    )

    # after the window: nothing is due, nothing is sent again
    await rig.wait_past(settle_at)
    await rig.worker.sweep()
    result = await rig.worker.drain()
    assert result.dispatched == 0
    assert len(rig.calls(to)) == 1
    assert (await delivery(rig.services, delivery_id)).status == "delivered"
    assert await _attempt_states(rig.services, delivery_id) == [(1, "accepted")]
    async with rig.services.sessions() as s:
        assert (await s.scalars(select(DeadLetter))).all() == []
        assert (await s.scalar(select(Delivery.attempts).where(Delivery.id == delivery_id))) == 1
        assert len((await s.scalars(select(Attempt))).all()) == 1
