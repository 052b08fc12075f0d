"""Retry end to end: the send API, the real dispatch and Twilio client, a local Twilio stub.

The first attempt happens in `POST /v1/messages`; the retry worker (with the dispatch wired by
the composition root) makes the later ones.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy import select

from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import Services, build_services
from gateway.settings import Settings
from retry import dlq
from retry.models import DeadLetter
from retry.settings import RateSpec
from retry.worker import Worker
from suppression import service as suppression
from suppression.db import utcnow
from suppression.normalize import normalize_phone
from tests.conftest import bearer, replace_settings
from tests.retry.helpers import attempt_rows, delivery_status, run_worker_until
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub
from tests.support.tables import deliveries

MAX_ATTEMPTS = 4


@dataclass
class Rig:
    services: Services
    client: httpx.AsyncClient
    stub: TwilioStub
    headers: dict[str, str]

    async def send(self, to: str, **extra: object) -> uuid.UUID:
        body = {"channel": "sms", "to": [to], "body": "Your code is 123456", **extra}
        response = await self.client.post(
            "/v1/messages",
            json=body,
            headers={**self.headers, "Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code in (201, 202), response.text
        ident: uuid.UUID = uuid.UUID(response.json()["deliveries"][0]["id"])
        return ident

    async def status(self, delivery_id: uuid.UUID) -> str:
        return await delivery_status(self.services.sessions, delivery_id)

    async def run_worker_until(self, done: Callable[[], Awaitable[bool]]) -> None:
        worker = Worker(
            self.services.engine,
            self.services.delivery_queue,
            self.services.dispatch,
            self.services.settings.retry,
        )
        try:
            await run_worker_until(worker, done)
        except AssertionError as exc:
            # Say where the deliveries stand, so a failure tells what held them.
            async with self.services.sessions() as s:
                rows = (
                    await s.execute(
                        select(
                            deliveries.c.status,
                            deliveries.c.reason,
                            deliveries.c.next_attempt_at,
                            deliveries.c.attempts,
                            deliveries.c.last_error,
                        )
                    )
                ).all()
            breaker = await self.services.breaker.state("twilio")
            raise AssertionError(f"{exc}: deliveries {rows}, twilio breaker {breaker}") from exc

    def fail(self, to: str, times: int) -> None:
        """The provider answers the next `times` messages to `to` with a 500."""
        self.stub.then_to(to, *[Behavior.error(500, 20500, "Internal Server Error")] * times)

    def calls(self, to: str) -> int:
        """How many messages to `to` reached the provider."""
        return len(self.stub.calls_to(to))

    def delivery_ids(self, to: str) -> set[str]:
        """The delivery ids the messages to `to` carried (in the StatusCallback's `d`)."""
        return {
            parse_qs(urlsplit(c.body["StatusCallback"]).query)["d"][0]
            for c in self.stub.calls_to(to)
        }


@pytest.fixture
async def rig(settings: Settings, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """Services with the Twilio adapter pointed at a local stub; `indirect` params override
    retry settings."""
    overrides: dict[str, object] = getattr(request, "param", {})
    with TwilioStub() as stub:
        custom = replace_settings(
            settings,
            sms_provider="twilio",
            twilio_account_sid=ACCOUNT_SID,
            twilio_auth_tokens=(AUTH_TOKEN,),
            sms_from="+15005550006",
            twilio_api_base=stub.url,
            retry=dataclasses.replace(
                settings.retry,
                **{
                    "base_seconds": 0.02,
                    "max_seconds": 0.2,
                    "max_attempts": MAX_ATTEMPTS,
                    "worker_poll_seconds": 0.01,
                    "defer_seconds": 0.02,
                    "rate_limits": {},
                    **overrides,
                },
            ),
        )
        assert custom.database_url is not None
        services = build_services(custom, custom.database_url)
        try:
            async with services.sessions() as s:
                _, secret = await create_key(s, ["send", "admin"], name="e2e")
                await s.commit()
            transport = httpx.ASGITransport(app=create_app(services))
            async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
                yield Rig(services, c, stub, bearer(secret))
        finally:
            await services.close()


async def test_provider_500_n_times_then_200(rig: Rig) -> None:
    to, n = "+14155552671", 3
    rig.fail(to, n)
    delivery_id = await rig.send(to)
    assert await rig.status(delivery_id) == "retrying"

    async def sent() -> bool:
        return await rig.status(delivery_id) == "sent"

    await rig.run_worker_until(sent)
    assert rig.calls(to) == n + 1
    assert rig.delivery_ids(to) == {str(delivery_id)}
    assert await attempt_rows(rig.services.sessions, delivery_id) == [
        (1, "transient"),
        (2, "transient"),
        (3, "transient"),
        (4, "accepted"),
    ]
    times = [c.at for c in rig.stub.calls_to(to)]
    assert all(b > a for a, b in itertools.pairwise(times))


async def test_always_failing_ends_in_the_dlq_and_a_redrive_succeeds(rig: Rig) -> None:
    to = "+14155552672"
    rig.fail(to, 100)
    delivery_id = await rig.send(to)

    async def dead() -> bool:
        return await rig.status(delivery_id) == "dead"

    await rig.run_worker_until(dead)
    assert rig.calls(to) == MAX_ATTEMPTS
    async with rig.services.sessions() as s:
        entry = (
            await s.execute(select(DeadLetter).where(DeadLetter.delivery_id == delivery_id))
        ).scalar_one()
    assert entry.reason == "max_attempts" and entry.channel == "sms"
    assert entry.last_error
    assert [(h["number"], h["status"]) for h in entry.attempt_history] == [
        (n, "transient") for n in range(1, MAX_ATTEMPTS + 1)
    ]

    # the provider recovers; an operator redrives: a fresh budget, and it goes out
    rig.fail(to, 0)
    response = await rig.client.post(f"/v1/dlq/{entry.id}/redrive", headers=rig.headers)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "redriven"

    async def sent() -> bool:
        return await rig.status(delivery_id) == "sent"

    await rig.run_worker_until(sent)
    assert rig.calls(to) == MAX_ATTEMPTS + 1
    rows = await attempt_rows(rig.services.sessions, delivery_id)
    # the history is kept; the new attempt is recorded after it
    assert [status for _, status in rows] == ["transient"] * MAX_ATTEMPTS + ["accepted"]


async def test_a_suppression_added_while_a_retry_waits(rig: Rig) -> None:
    to = "+14155552673"
    rig.fail(to, 1)
    delivery_id = await rig.send(to)
    assert await rig.status(delivery_id) == "retrying"
    # meanwhile the recipient texts STOP (or a bounce arrives) ...
    async with rig.services.sessions() as s:
        await suppression.add(
            s,
            rig.services.protector,
            normalize_phone(to),
            reason="sms_stop",
            source=suppression.Source("provider_event", "stop-1"),
        )
        await s.commit()

    async def settled() -> bool:
        return await rig.status(delivery_id) == "suppressed"

    await rig.run_worker_until(settled)
    # ... so the retry ends `suppressed` without another provider call
    assert rig.calls(to) == 1
    assert await attempt_rows(rig.services.sessions, delivery_id) == [(1, "transient")]


async def test_an_expired_otp_is_not_retried(rig: Rig) -> None:
    to = "+14155552674"
    rig.fail(to, 1)
    delivery_id = await rig.send(to, priority="high")
    assert await rig.status(delivery_id) == "retrying"
    async with rig.services.sessions() as s, s.begin():
        await s.execute(
            deliveries.update()
            .where(deliveries.c.id == delivery_id)
            .values(expires_at=utcnow() - dt.timedelta(seconds=1))
        )

    async def dead() -> bool:
        return await rig.status(delivery_id) == "dead"

    await rig.run_worker_until(dead)
    assert rig.calls(to) == 1
    async with rig.services.sessions() as s:
        entries, _ = await dlq.list_entries(
            s, rig.services.delivery_queue, dlq.DeadLetterFilter(reason="expired")
        )
    assert [e.row.delivery_id for e in entries] == [delivery_id]


@pytest.mark.parametrize(
    "rig",
    [{"rate_limits": {"twilio:*": RateSpec(0.001, 10.0)}, "defer_seconds": 60.0}],
    indirect=True,
)
async def test_a_campaign_never_delays_an_otp(rig: Rig) -> None:
    # The sender number's bucket holds 10 tokens and refills (practically) never; a campaign
    # may use 60 % of it.
    campaign = [await rig.send(f"+1415555{2700 + i}", priority="low") for i in range(10)]
    statuses = [await rig.status(d) for d in campaign]
    assert statuses.count("sent") == 6
    # the rest are deferred: not sent, no provider call, no attempt counted
    assert statuses.count("queued") == 4
    assert rig.stub.count == 6
    async with rig.services.sessions() as s:
        counted = (
            (
                await s.execute(
                    select(deliveries.c.attempts).where(
                        deliveries.c.id.in_(
                            [d for d, st in zip(campaign, statuses, strict=True) if st == "queued"]
                        )
                    )
                )
            )
            .scalars()
            .all()
        )
    assert counted == [0, 0, 0, 0]
    # the OTP still gets a token at once
    otp = await rig.send("+14155552799", priority="high")
    assert await rig.status(otp) == "sent"


# -- one recipient never stops every SMS (issue 11, defect 2) ---------------------------------


async def test_a_recipient_twilio_cannot_reach_fails_it_alone(rig: Rig) -> None:
    # Twilio 21612: this number is not reachable by SMS from this sender. Before, it opened
    # the Twilio circuit for the account cool-down and every other SMS was deferred.
    unreachable, other = "+15005550002", "+14155552675"
    rig.stub.by_recipient[unreachable] = Behavior.error(
        400, 21612, "The 'To' phone number is not currently reachable via SMS."
    )
    delivery_id = await rig.send(unreachable)
    assert await rig.status(delivery_id) == "retrying"
    assert await rig.services.breaker.state("twilio") == "closed"
    other_id = await rig.send(other)
    assert await rig.status(other_id) == "sent"

    async def failed() -> bool:
        return await rig.status(delivery_id) == "failed"

    await rig.run_worker_until(failed)
    # a bounded retry, then the recipient's own outcome: failed with the reason, no dead
    # letter, no suppression (the number may be fine from another sender)
    assert rig.calls(unreachable) == MAX_ATTEMPTS
    async with rig.services.sessions() as s:
        row = (await s.execute(select(deliveries).where(deliveries.c.id == delivery_id))).one()
        assert (await s.execute(select(DeadLetter))).first() is None
        hit = await suppression.check(
            s, "sms", rig.services.protector.hash("sms", unreachable), category="transactional"
        )
    assert row.reason.startswith("twilio:21612") and "not reachable" in row.reason
    assert hit is None
    assert await rig.services.breaker.state("twilio") == "closed"
    assert rig.calls(other) == 1


async def test_a_region_not_enabled_fails_at_once_and_flags_the_account(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    from sender.dispatch import SEND_FLAGS
    from tests.support.metrics import value

    # Twilio 21408: SMS to the number's region is not enabled for the account.
    blocked, other = "+15005550003", "+14155552676"
    rig.stub.by_recipient[blocked] = Behavior.error(
        400, 21408, "Permission to send an SMS has not been enabled for the region"
    )
    before = value(SEND_FLAGS, provider="twilio", rule="twilio:21408")
    caplog.set_level("WARNING", logger="gateway.sender")
    response = await rig.client.post(
        "/v1/messages",
        json={"channel": "sms", "to": [blocked, other], "body": "Your code is 123456"},
        headers={**rig.headers, "Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    answers = {d["to"]: d for d in response.json()["deliveries"]}
    assert answers[blocked]["status"] == "failed"
    assert "not enabled for this account" in answers[blocked]["reason"]
    assert answers[other]["status"] == "sent"
    assert value(SEND_FLAGS, provider="twilio", rule="twilio:21408") == before + 1
    assert any("configuration" in r.getMessage() for r in caplog.records)
    assert await rig.services.breaker.state("twilio") == "closed"
    # the next SMS still goes out
    later = await rig.send("+14155552677")
    assert await rig.status(later) == "sent"
    assert rig.calls(blocked) == 1


@pytest.mark.parametrize("rig", [{"breaker_min_volume": 2}], indirect=True)
async def test_per_message_carrier_errors_do_not_count_against_the_circuit(rig: Rig) -> None:
    # 30003 (unreachable handset) retries, but says nothing about Twilio itself: even a
    # window full of them leaves the circuit closed.
    for n in range(4):
        to = f"+1415555268{n}"
        rig.stub.then_to(to, Behavior.error(400, 30003, "Unreachable destination handset"))
        assert await rig.status(await rig.send(to)) == "retrying"
    assert await rig.services.breaker.state("twilio") == "closed"


@pytest.mark.parametrize("rig", [{"max_deferral_seconds": 1.0}], indirect=True)
async def test_a_deferral_without_an_attempt_is_bounded_by_the_maximum_deferral_age(
    rig: Rig,
) -> None:
    # The account is in trouble (the circuit is open for the long account cool-down) and the
    # message has no deadline: it is deferred again and again without an attempt, but not
    # for ever.
    await rig.services.breaker.record_failure("twilio", account_level=True)
    to = "+14155552690"
    delivery_id = await rig.send(to)
    assert await rig.status(delivery_id) == "queued"

    async def dead() -> bool:
        return await rig.status(delivery_id) == "dead"

    await rig.run_worker_until(dead)
    assert rig.calls(to) == 0
    async with rig.services.sessions() as s:
        entries, _ = await dlq.list_entries(
            s, rig.services.delivery_queue, dlq.DeadLetterFilter(reason="max_deferral")
        )
    assert [e.row.delivery_id for e in entries] == [delivery_id]
