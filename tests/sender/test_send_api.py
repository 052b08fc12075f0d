"""POST /v1/messages: validation, the answer, idempotency (replay 201/202, 422, 409)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

from sqlalchemy import select, text, update

from gateway.services import Services
from gateway.settings import Settings
from sender.models import Delivery, Message
from suppression import service as suppression
from suppression.normalize import normalize
from tests.conftest import bearer
from tests.sender.helpers import (
    Gateway,
    attempts_of,
    count_rows,
    delivery,
    email,
    provider_settings,
    sms,
)
from tests.stubs._server import Behavior
from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import TwilioStub

# -- validation -----------------------------------------------------------------------------


async def test_missing_idempotency_key_is_400_and_stores_nothing(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.client.post("/v1/messages", json=sms("+15005550006"), headers=gw.headers)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == "urn:problem:idempotency-key"
    assert "required" in r.json()["detail"]
    assert await count_rows(gw.services) == {"messages": 0, "deliveries": 0, "attempts": 0}
    assert twilio_stub.count == 0


async def test_invalid_idempotency_keys_are_400(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    for bad in ['"' + "k" * 256 + '"', '"unterminated', "has space", '"a\\b"', '""']:
        r = await gw.client.post(
            "/v1/messages",
            json=sms("+15005550006"),
            headers={**gw.headers, "Idempotency-Key": bad},
        )
        assert r.status_code == 400, bad
        assert r.json()["type"] == "urn:problem:idempotency-key"
    assert (await count_rows(gw.services))["messages"] == 0


async def test_invalid_recipient_is_422_naming_it_and_nothing_is_stored(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.send(sms(["+15005550006", "not-a-number", "+1 415 555 2671"]))
    assert r.status_code == 422
    problem = r.json()
    assert problem["type"] == "urn:problem:invalid-recipient"
    assert "not-a-number" in problem["detail"]
    assert [e["index"] for e in problem["errors"]] == [1]
    assert problem["errors"][0]["to"] == "not-a-number"
    assert await count_rows(gw.services) == {"messages": 0, "deliveries": 0, "attempts": 0}
    assert twilio_stub.count == 0

    r = await gw.send(email(["ok@example.com", "nobody@", "x@@example.com"]))
    assert r.status_code == 422
    assert [e["to"] for e in r.json()["errors"]] == ["nobody@", "x@@example.com"]


async def test_duplicate_recipient_after_normalization_is_422(providers_gateway: Gateway) -> None:
    r = await providers_gateway.send(sms(["+14155552671", "(415) 555-2671"]))
    assert r.status_code == 422
    assert "duplicate" in r.json()["errors"][0]["problem"]


async def test_channel_specific_content_is_checked(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    cases: list[tuple[dict[str, Any], str]] = [
        ({"channel": "email", "to": ["a@example.com"], "text": "x"}, "subject"),
        ({"channel": "email", "to": ["a@example.com"], "subject": "s"}, "text"),
        ({"channel": "sms", "to": ["+14155552671"]}, "body"),
        ({"channel": "sms", "to": ["+14155552671"], "body": "b", "subject": "s"}, "subject"),
        (email("a@example.com", reply_to="broken@"), "reply_to"),
        (email("a@example.com", expires_at="2001-01-01T00:00:00Z"), "expires_at"),
        (email("a@example.com", expires_at="2999-01-01T00:00:00"), "expires_at"),
    ]
    for body, field in cases:
        r = await gw.send(body)
        assert r.status_code == 422, (body, r.text)
        assert field in r.text
    assert (await count_rows(gw.services))["messages"] == 0


async def test_malformed_bodies_are_400(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    for body in [
        {"channel": "fax", "to": ["x"]},
        {"channel": "sms", "to": [], "body": "b"},
        {"channel": "sms", "to": ["+14155552671"] * 101, "body": "b"},
        {"channel": "sms", "to": "+14155552671", "body": "b"},
        {"channel": "sms", "to": ["+14155552671"], "body": "b", "priority": "urgent"},
        {"channel": "sms", "to": ["+14155552671"], "body": "b", "bogus": 1},
    ]:
        r = await gw.send(body)
        assert r.status_code == 400, (body, r.text)
    r = await gw.client.post(
        "/v1/messages",
        content=b"{not json",
        headers={**gw.headers, "Idempotency-Key": '"k"', "Content-Type": "application/json"},
    )
    assert r.status_code == 400


async def test_scopes(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    r = await gw.client.post("/v1/messages", json=sms("+14155552671"))
    assert r.status_code == 401
    reader = await gw.make_key("read")
    r = await gw.client.post(
        "/v1/messages",
        json=sms("+14155552671"),
        headers={**bearer(reader), "Idempotency-Key": '"k1"'},
    )
    assert r.status_code == 403


# -- the answer -----------------------------------------------------------------------------


async def test_each_recipient_is_its_own_delivery_and_provider_call(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    r = await gw.send(sms(["+14155552671", "+14155552672", "4155552673"]))
    assert r.status_code == 201, r.text
    doc = r.json()
    assert r.headers["location"] == f"/v1/messages/{doc['id']}"
    assert [d["to"] for d in doc["deliveries"]] == ["+14155552671", "+14155552672", "+14155552673"]
    assert {d["status"] for d in doc["deliveries"]} == {"sent"}
    assert len({d["id"] for d in doc["deliveries"]}) == 3
    assert sorted(c.recipient or "" for c in twilio_stub.calls) == [
        "+14155552671",
        "+14155552672",
        "+14155552673",
    ]
    for d in doc["deliveries"]:
        row = await delivery(gw.services, d["id"])
        assert row.status == "sent"
        assert row.provider == "twilio"
        assert row.provider_message_id is not None
        assert row.attempts == 1
        assert row.next_attempt_at is None
        assert row.priority_rank == 1
        [attempt] = await attempts_of(gw.services, d["id"])
        assert attempt.status == "accepted"
        assert attempt.provider_message_id == row.provider_message_id
        assert attempt.finished_at is not None


async def test_priority_rank_and_deadline_are_stored(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    for priority, rank in (("high", 2), ("normal", 1), ("low", 0)):
        r = await gw.send(
            sms("+14155552671", priority=priority, expires_at="2999-01-01T00:00:00+02:00")
        )
        assert r.status_code == 201
        row = await delivery(gw.services, r.json()["deliveries"][0]["id"])
        assert row.priority_rank == rank
        assert row.expires_at is not None and row.expires_at.year == 2998


async def test_addresses_and_content_are_not_stored_in_plaintext(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    twilio_stub.by_recipient["+14155550199"] = Behavior.error(
        400, 21211, "The 'To' number +14155550199 is not a valid phone number."
    )
    r = await gw.send(sms(["+14155552671", "+14155550199"], body="secret-body-text"))
    assert r.status_code == 201
    async with gw.services.sessions() as session:
        dump = ""
        for table in ("messages", "deliveries", "attempts"):
            rows = await session.execute(text(f"SELECT row_to_json(t)::text FROM {table} t"))
            dump += "".join(row[0] for row in rows)
    for secret in ("4155552671", "4155550199", "secret-body-text"):
        assert secret not in dump


# -- idempotency ----------------------------------------------------------------------------


async def test_same_key_same_body_replays_the_stored_answer_and_sends_nothing(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    body = sms(["+14155552671", "+14155552672"], metadata={"order": "42"})
    first = await gw.send(body, key="order-42")
    assert first.status_code == 201
    # The delivery moves on afterwards (e.g. a callback): the replay still shows the first
    # answer, and the original status code.
    async with gw.services.sessions() as session:
        await session.execute(update(Delivery).values(status="delivered"))
        await session.commit()
    # Same body with keys in another order and the key in bare-token form: same request.
    replay = await gw.client.post(
        "/v1/messages",
        json=dict(reversed(list(body.items()))),
        headers={**gw.headers, "Idempotency-Key": "order-42"},
    )
    assert replay.status_code == 201
    assert replay.json() == first.json()
    assert replay.headers["idempotent-replayed"] == "true"
    assert twilio_stub.count == 2
    assert await count_rows(gw.services) == {"messages": 1, "deliveries": 2, "attempts": 2}


async def test_replay_keeps_a_202(providers_gateway: Gateway, twilio_stub: TwilioStub) -> None:
    gw = providers_gateway
    twilio_stub.then(Behavior.error(503, 503, "Service Unavailable"))
    first = await gw.send(sms("+14155552671"), key="k-202")
    assert first.status_code == 202
    assert first.json()["deliveries"][0]["status"] == "retrying"
    replay = await gw.send(sms("+14155552671"), key="k-202")
    assert replay.status_code == 202
    assert replay.json() == first.json()
    assert twilio_stub.count == 1


async def test_same_key_different_body_is_422(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    assert (await gw.send(sms("+14155552671"), key="k")).status_code == 201
    r = await gw.send(sms("+14155552671", body="other text"), key="k")
    assert r.status_code == 422
    assert r.json()["type"] == "urn:problem:idempotency-key-reused"
    assert twilio_stub.count == 1
    assert (await count_rows(gw.services))["messages"] == 1


async def test_keys_are_scoped_per_api_key(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    other = await gw.make_key("send")
    assert (await gw.send(sms("+14155552671"), key="shared")).status_code == 201
    r = await gw.client.post(
        "/v1/messages",
        json=sms("+14155552671"),
        headers={**bearer(other), "Idempotency-Key": '"shared"'},
    )
    assert r.status_code == 201
    assert twilio_stub.count == 2
    async with gw.services.sessions() as session:
        keys = (await session.scalars(select(Delivery.derived_key))).all()
    assert len(set(keys)) == 2


async def test_duplicate_while_first_is_in_flight_is_409(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    release = threading.Event()
    twilio_stub.then(Behavior.accept(hold=release))
    first = asyncio.create_task(gw.send(sms("+14155552671"), key="in-flight"))
    try:
        await asyncio.to_thread(twilio_stub.received.wait, 10)
        assert twilio_stub.count == 1  # the first request is inside the provider call
        dup = await gw.send(sms("+14155552671"), key="in-flight")
        assert dup.status_code == 409
        assert dup.json()["type"] == "urn:problem:idempotency-in-flight"
        # A different body is refused as such even while the first is in flight.
        other = await gw.send(sms("+14155552671", body="x"), key="in-flight")
        assert other.status_code == 422
    finally:
        release.set()
    assert (await first).status_code == 201
    again = await gw.send(sms("+14155552671"), key="in-flight")
    assert again.status_code == 201
    assert twilio_stub.count == 1


async def test_a_stale_in_progress_message_is_completed_by_a_retry(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    first = await gw.send(sms("+14155552671"), key="stale")
    message_id = first.json()["id"]
    # Simulate a first request whose process died before it answered.
    async with gw.services.sessions() as session:
        await session.execute(
            update(Message)
            .where(Message.id == uuid.UUID(message_id))
            .values(
                state="in_progress",
                response_code=None,
                first_answers=None,
                created_at=Message.created_at - text("interval '1 hour'"),
            )
        )
        await session.commit()
    r = await gw.send(sms("+14155552671"), key="stale")
    assert r.status_code == 201
    assert r.json()["id"] == message_id
    assert r.json()["deliveries"][0]["status"] == "sent"
    assert twilio_stub.count == 1


# -- suppression ----------------------------------------------------------------------------


async def _suppress(
    services: Services, channel: str, raw: str, reason: str, scope: str = "all"
) -> None:
    async with services.sessions() as session:
        await suppression.add(
            session,
            services.protector,
            normalize(channel, raw),
            reason=reason,
            source=suppression.Source(type="test"),
            scope=scope,
        )
        await session.commit()


async def test_suppressed_recipient_never_reaches_the_provider(
    providers_gateway: Gateway, twilio_stub: TwilioStub, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    await _suppress(gw.services, "sms", "+14155552671", "sms_stop")
    await _suppress(gw.services, "email", "Bounced@Example.com", "hard_bounce")
    r = await gw.send(sms(["+14155552671", "+14155552672"]))
    assert r.status_code == 201
    first, second = r.json()["deliveries"]
    assert first["status"] == "suppressed" and first["reason"] == "sms_stop"
    assert second["status"] == "sent"
    assert [c.recipient for c in twilio_stub.calls] == ["+14155552672"]
    row = await delivery(gw.services, first["id"])
    assert row.suppression_id is not None and row.attempts == 0 and row.next_attempt_at is None
    assert await attempts_of(gw.services, first["id"]) == []

    r = await gw.send(email("bounced@example.com"))
    assert r.status_code == 201
    assert r.json()["deliveries"][0] | {"id": None} == {
        "id": None,
        "to": "bounced@example.com",
        "status": "suppressed",
        "reason": "hard_bounce",
    }
    assert ses_stub.count == 0


async def test_transactional_ignores_topic_unsubscribes_marketing_does_not(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    await _suppress(gw.services, "email", "reader@example.com", "unsubscribe", scope="newsletter")
    await _suppress(gw.services, "email", "fan@example.com", "unsubscribe", scope="marketing")
    tx = await gw.send(email(["reader@example.com", "fan@example.com"]))
    assert [d["status"] for d in tx.json()["deliveries"]] == ["sent", "sent"]
    news = await gw.send(
        email(["reader@example.com", "fan@example.com"], category="marketing", topic="newsletter")
    )
    assert [d["status"] for d in news.json()["deliveries"]] == ["suppressed", "sent"]
    promo = await gw.send(email(["reader@example.com", "fan@example.com"], category="marketing"))
    assert [d["status"] for d in promo.json()["deliveries"]] == ["sent", "suppressed"]
    assert ses_stub.count == 4


async def test_transactional_never_ignores_channel_wide_suppressions(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    addresses = []
    for reason in ("hard_bounce", "complaint", "invalid_address"):
        address = f"{reason}@example.com"
        addresses.append(address)
        await _suppress(gw.services, "email", address, reason)
    r = await gw.send(email(addresses, category="transactional"))
    assert [d["reason"] for d in r.json()["deliveries"]] == [
        "hard_bounce",
        "complaint",
        "invalid_address",
    ]
    assert ses_stub.count == 0


async def test_waiting_deliveries_are_due_for_the_worker_if_the_request_dies(
    settings: Settings, twilio_stub: TwilioStub, make_gateway: Any
) -> None:
    # Deliveries not yet dispatched are `queued` with a due time (the stale window), so the
    # retry worker sends them if this process dies; the one in flight is off the queue.
    release = threading.Event()
    twilio_stub.then(Behavior.accept(hold=release))
    changed = provider_settings(settings, twilio_api_base=twilio_stub.url, send_concurrency=1)
    async with make_gateway(changed) as gw:
        task = asyncio.create_task(gw.send(sms(["+14155552671", "+14155552672"])))
        try:
            await asyncio.to_thread(twilio_stub.received.wait, 10)
            async with gw.services.sessions() as session:
                rows = {d.position: d for d in await session.scalars(select(Delivery))}
            assert rows[0].status == "sending" and rows[0].next_attempt_at is None
            assert rows[1].status == "queued" and rows[1].next_attempt_at is not None
            assert rows[1].next_attempt_at > rows[1].created_at
        finally:
            release.set()
        r = await task
        assert r.status_code == 201
        assert [d["status"] for d in r.json()["deliveries"]] == ["sent", "sent"]
