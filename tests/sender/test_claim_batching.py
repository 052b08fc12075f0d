"""Group commit of asynchronous acceptances (`sender.batching.ClaimBatcher` over
`sender.log.claim_many`): concurrent `respond-async` requests share statements, and each
still gets exactly its own answer, its own idempotency and its own errors."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from sender import log as dlog
from sender.batching import ClaimBatcher
from suppression import service as suppression
from suppression.db import pg_connection, utcnow
from suppression.normalize import normalize
from tests.sender.helpers import Gateway, delivery, sms, suppress_sms
from tests.stubs.twilio_stub import TwilioStub

ASYNC = {"Prefer": "respond-async"}


def _claim(
    gw: Gateway,
    number: str,
    *,
    client_id: uuid.UUID,
    key: str | None = None,
    category: str = "transactional",
    topic: str | None = None,
    fingerprint: str = "f" * 64,
) -> dlog.Claim:
    protector = gw.services.protector
    now = utcnow()
    message = dlog.NewMessage(
        id=uuid.uuid4(),
        client_id=client_id,
        idempotency_key=key or str(uuid.uuid4()),
        fingerprint=fingerprint,
        channel="sms",
        category=category,
        topic=topic,
        priority="normal",
        expires_at=None,
        content_encrypted=protector.encrypt('{"body": "hi"}'),
        metadata={"n": number},
    )
    new = dlog.NewDelivery(
        id=uuid.uuid4(),
        position=0,
        recipient_hash=protector.hash("sms", normalize("sms", number).key),
        recipient_encrypted=protector.encrypt(number),
        derived_key=uuid.uuid4().hex,
        status="queued",
        next_attempt_at=now,
    )
    return dlog.Claim(message, [new], priority_rank=1, now=now, complete=True)


async def _xmins(gw: Gateway, ids: list[Any]) -> int:
    """How many transactions wrote these messages."""
    async with gw.services.engine.connect() as conn:
        found = await conn.scalar(
            text("SELECT count(DISTINCT xmin::text) FROM messages WHERE id = ANY(:ids)"),
            {"ids": [uuid.UUID(str(i)) for i in ids]},
        )
    return int(found or 0)


async def test_concurrent_async_sends_share_statements_and_each_gets_its_own_answer(
    providers_gateway: Gateway,
) -> None:
    gw = providers_gateway
    await suppress_sms(gw.services, "+15005550009")
    numbers = [f"+1415555{i:04d}" for i in range(23)] + ["+15005550009"]
    answers = await asyncio.gather(
        *(gw.send(sms([n], metadata={"i": str(i)}), headers=ASYNC) for i, n in enumerate(numbers))
    )
    assert [a.status_code for a in answers] == [202] * len(numbers)
    for number, answer in zip(numbers, answers, strict=True):
        (one,) = answer.json()["deliveries"]
        assert one["to"] == number
        stored = await delivery(gw.services, one["id"])
        expected = "suppressed" if number == "+15005550009" else "queued"
        assert one["status"] == stored.status == expected
        assert one["reason"] == stored.reason == ("sms_stop" if expected == "suppressed" else None)
    # Fewer transactions than requests: they were grouped.
    assert await _xmins(gw, [a.json()["id"] for a in answers]) < len(numbers)


async def test_the_same_key_twice_in_one_batch_is_stored_once_and_replayed(
    providers_gateway: Gateway,
) -> None:
    gw = providers_gateway
    body = sms(["+14155550100"])
    first, second = await asyncio.gather(
        gw.send(body, key="twice", headers=ASYNC), gw.send(body, key="twice", headers=ASYNC)
    )
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert sorted(r.headers.get("Idempotent-Replayed", "") for r in (first, second)) == [
        "",
        "true",
    ]
    # Another body under the same key in the same batch: 422, nothing written for it.
    third, fourth = await asyncio.gather(
        gw.send(body, key="other", headers=ASYNC),
        gw.send(sms(["+14155550101"]), key="other", headers=ASYNC),
    )
    assert sorted((third.status_code, fourth.status_code)) == [202, 422]


async def test_a_failing_claim_fails_alone_and_the_rest_of_its_batch_is_stored(
    providers_gateway: Gateway,
) -> None:
    gw = providers_gateway
    client = uuid.uuid4()
    # One statement at a time: the three claims go together in one batch, which fails on
    # the bad fingerprint (longer than its column); each is then claimed alone.
    batcher = ClaimBatcher(gw.services.engine, max_batches=1)
    good = _claim(gw, "+14155550200", client_id=client)
    bad = _claim(gw, "+14155550201", client_id=client, fingerprint="x" * 65)
    other = _claim(gw, "+14155550202", client_id=client)
    results = await asyncio.gather(
        *(batcher.claim(c) for c in (good, bad, other)), return_exceptions=True
    )
    assert isinstance(results[1], asyncpg.StringDataRightTruncationError)
    for claim, found in ((good, results[0]), (other, results[2])):
        assert found == {claim.deliveries[0].id: ("queued", None, None)}
        assert (await delivery(gw.services, claim.deliveries[0].id)).status == "queued"
    async with pg_connection(gw.services.engine) as conn:
        assert await dlog.message(conn, bad.message.id) is None


async def test_duplicate_keys_within_one_statement(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    client = uuid.uuid4()
    first = _claim(gw, "+14155550300", client_id=client, key="k")
    again = _claim(gw, "+14155550301", client_id=client, key="k")
    elsewhere = _claim(gw, "+14155550302", client_id=uuid.uuid4(), key="k")
    async with pg_connection(gw.services.engine) as conn:
        found = await dlog.claim_many(conn, [first, again, elsewhere])
        assert found[0] == {first.deliveries[0].id: ("queued", None, None)}
        assert found[1] is None
        assert found[2] == {elsewhere.deliveries[0].id: ("queued", None, None)}
        assert await dlog.message(conn, again.message.id) is None
        # The claim that lost wrote no delivery.
        assert await dlog.deliveries_of(conn, again.message.id) == []


@pytest.mark.parametrize(
    ("category", "topic", "entry_scope", "stopped"),
    [
        ("marketing", "news", "news", True),
        ("marketing", "deals", "news", False),
        ("transactional", "news", "news", False),
        ("transactional", None, "all", True),
        ("marketing", "news", "all", True),
    ],
)
async def test_verdicts_per_message_follow_category_and_topic(
    providers_gateway: Gateway, category: str, topic: str | None, entry_scope: str, stopped: bool
) -> None:
    gw = providers_gateway
    number = "+14155550400"
    async with gw.services.sessions() as session:
        await suppression.add(
            session,
            gw.services.protector,
            normalize("sms", number),
            reason="manual",
            scope=entry_scope,
            source=suppression.Source(type="test"),
        )
        await session.commit()
    client = uuid.uuid4()
    # The message under test shares its statement with one for another number.
    claim = _claim(gw, number, client_id=client, category=category, topic=topic)
    neighbour = _claim(gw, "+14155550401", client_id=client, category="marketing", topic="news")
    async with pg_connection(gw.services.engine) as conn:
        found = await dlog.claim_many(conn, [neighbour, claim])
    verdict = found[1]
    assert verdict is not None
    status, reason, scope = verdict[claim.deliveries[0].id]
    assert status == ("suppressed" if stopped else "queued")
    assert (reason, scope) == (("manual", entry_scope) if stopped else (None, None))
    assert found[0] == {neighbour.deliveries[0].id: ("queued", None, None)}
    stored = await delivery(gw.services, claim.deliveries[0].id)
    assert stored.status == status
    assert (stored.next_attempt_at is None) == stopped
    assert stored.created_at - claim.now < dt.timedelta(seconds=1)


async def test_a_request_cancelled_while_waiting_still_has_its_claim_stored(
    providers_gateway: Gateway,
) -> None:
    gw = providers_gateway
    batcher = ClaimBatcher(gw.services.engine)
    claim = _claim(gw, "+14155550500", client_id=uuid.uuid4())
    waiting = asyncio.create_task(batcher.claim(claim))
    await asyncio.sleep(0)  # queued, its batch about to start
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(250):
        async with pg_connection(gw.services.engine) as conn:
            if await dlog.message(conn, claim.message.id) is not None:
                break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the claim of the cancelled request was not stored")
    assert (await delivery(gw.services, claim.deliveries[0].id)).status == "queued"


async def test_synchronous_and_asynchronous_claims_in_one_statement(
    providers_gateway: Gateway,
) -> None:
    """A synchronous send's claim (first attempt `in_progress`, message `in_progress`) and
    an asynchronous one (message completed with its 202 answer) written together; a
    suppressed recipient gets no attempt."""
    gw = providers_gateway
    await suppress_sms(gw.services, "+15005550009")
    client = uuid.uuid4()
    asynchronous = _claim(gw, "+14155550700", client_id=client)
    base = _claim(gw, "+14155550701", client_id=client)
    stopped = _claim(gw, "+15005550009", client_id=client)
    sending = dataclasses.replace(
        base.deliveries[0], status="sending", provider="twilio", attempt_id=uuid.uuid4()
    )
    synchronous = dataclasses.replace(
        base,
        deliveries=[sending, dataclasses.replace(stopped.deliveries[0], position=1)],
        complete=False,
    )
    async with pg_connection(gw.services.engine) as conn:
        found = await dlog.claim_many(conn, [asynchronous, synchronous])
        assert found[0] == {asynchronous.deliveries[0].id: ("queued", None, None)}
        assert found[1] == {
            sending.id: ("sending", None, None),
            stopped.deliveries[0].id: ("suppressed", "sms_stop", "all"),
        }
        done = await dlog.message(conn, asynchronous.message.id)
        assert done is not None and (done.state, done.response_code) == ("completed", 202)
        assert [a["status"] for a in done.first_answers or []] == ["queued"]
        open_ = await dlog.message(conn, synchronous.message.id)
        assert open_ is not None and (open_.state, open_.response_code) == ("in_progress", None)
        assert open_.first_answers is None
        attempts = await dlog.attempts_of(conn, [sending.id, stopped.deliveries[0].id])
    assert [(a.delivery_id, a.number, a.status) for a in attempts] == [
        (sending.id, 1, "in_progress")
    ]
    assert attempts[0].id == sending.attempt_id
    assert (await delivery(gw.services, sending.id)).attempts == 1


async def test_concurrent_synchronous_sends_each_get_their_own_answer(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    await suppress_sms(gw.services, "+15005550009")
    numbers = [f"+1415555{i:04d}" for i in range(11)] + ["+15005550009"]
    answers = await asyncio.gather(
        *(gw.send(sms([n]), key=f"sync-{i}") for i, n in enumerate(numbers)),
        gw.send(sms([numbers[0]]), key="sync-0"),  # the same key again, at the same time
    )
    *firsts, repeat = answers
    assert [a.status_code for a in firsts] == [201] * len(numbers)
    # The repeat came while the first was in flight (409) or after it (its stored answer).
    assert repeat.status_code == 409 or (
        repeat.status_code == 201 and repeat.json() == firsts[0].json()
    )
    for number, answer in zip(numbers, firsts, strict=True):
        (one,) = answer.json()["deliveries"]
        expected = "suppressed" if number == "+15005550009" else "sent"
        assert (one["to"], one["status"]) == (number, expected)
    # One provider call per recipient that was not suppressed, whatever the repeat did.
    assert twilio_stub.count == len(numbers) - 1
