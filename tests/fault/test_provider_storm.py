"""Drill: a provider storm (issue 11, "Provider storms").

Twilio (the local stub, driven through the real `twilio` client) answers 500 for a while,
then 429 with Retry-After, then hangs past the client's read timeout, then recovers. Sends
keep arriving through the API and the retry worker runs throughout. Invariants:

* the circuit breaker opens on those provider-wide failures, and never on refusals about
  one recipient (a window full of Twilio 21612/30003 answers leaves it closed);
* nothing is failed, dead-lettered or suppressed because of the storm (only the recipient
  Twilio refused ends `failed`, with that reason);
* `/healthz` and `/readyz` answer throughout (generous bound: the worker and the provider
  calls must never block the event loop that serves them);
* on recovery everything drains: every other delivery ends `sent`, and Twilio took each of
  them exactly once (a hung request was never taken, so its retry is no duplicate).

Small timeouts and settings keep it to a few seconds; the phases are time-boxed, the final
drain is bounded by a poll count (a guard against hanging, not a timed assertion).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy import func, select

from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import Services, build_services
from gateway.settings import Settings
from retry.models import DeadLetter
from retry.worker import Worker
from sender.models import Delivery
from suppression.models import Suppression
from tests.conftest import bearer, replace_settings
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub

UNREACHABLE = "+15005550002"  # Twilio 21612: not reachable from this sender
HANDSET_OFF = "+15005550010"  # Twilio 30003 on its first attempt, then fine
# Generous: /healthz does no I/O, so anything near this means the loop was blocked.
HEALTH_BOUND_SECONDS = 1.0
PHASE_SECONDS = 1.2


class StormStub(TwilioStub):
    """The Twilio stub with a provider-wide mode: `ok`, `500`, `429` or `hang`.

    Per-recipient answers (`by_recipient`, `then_to`) apply in `ok` mode only: during a
    storm the provider fails for everyone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mode = "ok"
        self.release = threading.Event()

    def _pick(self, recipient: str | None) -> Behavior:
        if self.mode == "500":
            return Behavior.error(500, 20500, "Internal Server Error")
        if self.mode == "429":
            return Behavior.error(429, 20429, "Too Many Requests", headers={"Retry-After": "1"})
        if self.mode == "hang":
            return Behavior.hang(self.release)
        return super()._pick(recipient)


@dataclass
class Observed:
    """What the health poller saw."""

    healthz: list[tuple[int, float]] = field(default_factory=list)
    readyz: list[tuple[int, float]] = field(default_factory=list)
    breaker: list[str] = field(default_factory=list)


@dataclass
class Drill:
    services: Services
    client: httpx.AsyncClient
    stub: StormStub
    headers: dict[str, str]
    sent: list[str] = field(default_factory=list)

    async def send(self, *to: str) -> None:
        response = await self.client.post(
            "/v1/messages",
            json={"channel": "sms", "to": list(to), "body": "Your code is 123456"},
            headers={**self.headers, "Idempotency-Key": uuid.uuid4().hex},
        )
        # 201 (all final) or 202 (deferred, retrying, unknown): never an error, never a 5xx.
        assert response.status_code in (201, 202), response.text
        self.sent += [d["id"] for d in response.json()["deliveries"]]

    async def traffic(self, seconds: float, number: int) -> None:
        """Sends at a steady pace for `seconds` (one new recipient each)."""
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            await self.send(f"+1415555{number:02d}{i:02d}")
            i += 1
            await asyncio.sleep(0.05)

    async def statuses(self) -> dict[str, tuple[str, str | None]]:
        async with self.services.sessions() as session:
            rows = await session.execute(select(Delivery.id, Delivery.status, Delivery.reason))
            return {str(r.id): (r.status, r.reason) for r in rows}


@pytest.fixture
async def drill(settings: Settings) -> AsyncIterator[Drill]:
    with StormStub() as stub:
        custom = replace_settings(
            settings,
            sms_provider="twilio",
            twilio_account_sid=ACCOUNT_SID,
            twilio_auth_tokens=(AUTH_TOKEN,),
            sms_from="+15005550006",
            twilio_api_base=stub.url,
            provider_connect_timeout_seconds=1.0,
            provider_read_timeout_seconds=0.3,
            retry=dataclasses.replace(
                settings.retry,
                base_seconds=0.02,
                max_seconds=0.1,
                max_attempts=40,
                worker_poll_seconds=0.02,
                worker_concurrency=20,
                defer_seconds=0.05,
                rate_limits={},
                unknown_settle_seconds=0.3,
                stale_in_progress_seconds=60.0,
                breaker_min_volume=4,
                breaker_failure_ratio=0.5,
                breaker_window_seconds=1.0,
                breaker_cooldown_seconds=0.3,
            ),
        )
        assert custom.database_url is not None
        services = build_services(custom, custom.database_url)
        try:
            async with services.sessions() as s:
                _, secret = await create_key(s, ["send", "admin"], name="drill")
                await s.commit()
            transport = httpx.ASGITransport(app=create_app(services))
            async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
                yield Drill(services, c, stub, bearer(secret))
        finally:
            stub.release.set()
            await services.close()


async def poll_health(drill: Drill, seen: Observed, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for path, into in (("/healthz", seen.healthz), ("/readyz", seen.readyz)):
            started = time.monotonic()
            response = await drill.client.get(path)
            into.append((response.status_code, time.monotonic() - started))
            if path == "/readyz":
                seen.breaker.append(response.json()["checks"]["breaker"]["twilio"])
        await asyncio.sleep(0.03)


async def test_provider_storm(drill: Drill) -> None:
    services, stub = drill.services, drill.stub
    worker = Worker(
        services.engine, services.delivery_queue, services.dispatch, services.settings.retry
    )
    seen = Observed()
    stop = asyncio.Event()
    worker_task = asyncio.create_task(worker.run())
    health_task = asyncio.create_task(poll_health(drill, seen, stop))
    try:
        # 1. Calm, but Twilio refuses single recipients: more refusals than the breaker's
        #    minimum volume, all of them about one recipient, so the circuit stays closed.
        stub.by_recipient[UNREACHABLE] = Behavior.error(
            400, 21612, "The 'To' phone number is not currently reachable via SMS."
        )
        stub.then_to(HANDSET_OFF, Behavior.error(400, 30003, "Unreachable destination handset"))
        calm = len(seen.breaker)
        for _ in range(3):
            await drill.send(UNREACHABLE)
        await drill.send(HANDSET_OFF)
        await drill.traffic(0.3, 1)
        assert set(seen.breaker[calm:]) <= {"closed"}
        assert await services.breaker.state("twilio") == "closed"
        refusals = [c for c in stub.calls if c.recipient in (UNREACHABLE, HANDSET_OFF)]
        assert len(refusals) >= services.settings.retry.breaker_min_volume

        # 2. The storm: provider-wide failures, each kind for a while.
        opened: dict[str, bool] = {}
        for mode, number in (("500", 2), ("429", 3), ("hang", 4)):
            stub.mode = mode
            before = len(seen.breaker)
            await drill.traffic(PHASE_SECONDS, number)
            states = [*seen.breaker[before:], await services.breaker.state("twilio")]
            opened[mode] = any(s != "closed" for s in states)
        assert opened == {"500": True, "429": True, "hang": True}

        # 3. Recovery: everything drains.
        stub.mode = "ok"
        stub.release.set()
        await drill.traffic(0.3, 5)
        for _ in range(1500):  # 30 s guard, not a timing assertion
            statuses = await drill.statuses()
            if all(s in ("sent", "failed") for s, _ in statuses.values()):
                break
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await health_task
        worker_task.cancel()
        try:
            await worker_task
        except asyncio.CancelledError:
            pass

    statuses = await drill.statuses()
    assert set(statuses) == set(drill.sent)
    unreachable = {
        d
        for d, (status, _) in statuses.items()
        for c in stub.calls_to(UNREACHABLE)
        if parse_qs(urlsplit(c.body["StatusCallback"]).query)["d"][0] == d
    }
    assert len(unreachable) == 3
    for delivery_id, (status, reason) in statuses.items():
        if delivery_id in unreachable:
            # the recipient's own outcome, bounded, with the reason
            assert status == "failed" and (reason or "").startswith("twilio:21612")
        else:
            assert status == "sent", (delivery_id, status, reason)
    async with services.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(DeadLetter)) == 0
        assert await session.scalar(select(func.count()).select_from(Suppression)) == 0
    # Twilio took every message exactly once: hung requests were never taken.
    taken = [parse_qs(urlsplit(m["StatusCallback"]).query)["d"][0] for m in stub.accepted]
    assert sorted(taken) == sorted(d for d in statuses if d not in unreachable)
    assert await services.breaker.state("twilio") == "closed"
    # Health answered all along, well within a generous bound.
    assert len(seen.healthz) > 20
    assert all(code == 200 for code, _ in seen.healthz + seen.readyz)
    assert max(took for _, took in seen.healthz) < HEALTH_BOUND_SECONDS
    assert max(took for _, took in seen.readyz) < HEALTH_BOUND_SECONDS * 3
