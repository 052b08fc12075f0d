"""Campaigns (bulk sends) through the HTTP API on real PostgreSQL, with the real Twilio
adapter pointed at the local stub: upload formats, counts, replacement, state errors,
cancellation, and the campaign's deliveries behaving like any other."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from gateway.worker import build_worker
from sender import campaigns as cp
from suppression.db import pg_connection
from tests.sender.helpers import Gateway, provider_settings, suppress_sms
from tests.stubs.twilio_stub import TwilioStub

# Valid US numbers (the 415 area code), distinct.
NUMBERS = [f"+1415555{n:04d}" for n in range(2671, 2671 + 50)]


@pytest.fixture
async def gw(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> AsyncIterator[Gateway]:
    """A gateway on the real Twilio adapter (the stub); the worker is driven by the tests."""
    async with make_gateway(
        provider_settings(settings, twilio_api_base=twilio_stub.url), "send", "read"
    ) as g:
        yield g


def sms_campaign(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"channel": "sms", "body": "Sale: 20% off", "category": "marketing"}
    body.update(extra)
    return body


async def create(gw: Gateway, body: dict[str, Any] | None = None, key: str | None = None) -> str:
    r = await gw.client.post(
        "/v1/campaigns",
        json=body or sms_campaign(),
        headers={**gw.headers, "Idempotency-Key": f'"{key or uuid.uuid4()}"'},
    )
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "draft"
    campaign_id: str = r.json()["id"]
    return campaign_id


def jsonl(*records: dict[str, Any] | str) -> bytes:
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in records)


async def upload(
    gw: Gateway, campaign_id: str, content: bytes, media: str = "application/x-ndjson"
) -> httpx.Response:
    return await gw.client.put(
        f"/v1/campaigns/{campaign_id}/recipients",
        content=content,
        headers={**gw.headers, "Content-Type": media},
    )


async def expand_all(gw: Gateway, batch: int = 3) -> int:
    """Run the expansion job's batches until no campaign has work; how many batches."""
    batches = 0
    while (await gw.services.campaigns.expand_once(batch=batch)).campaign_id is not None:
        batches += 1
    return batches


async def drain(gw: Gateway) -> None:
    """Run retry-worker rounds until nothing is claimed."""
    worker = build_worker(gw.services)
    while (await worker.run_once()).claimed:
        pass


async def show(gw: Gateway, campaign_id: str) -> dict[str, Any]:
    r = await gw.client.get(f"/v1/campaigns/{campaign_id}", headers=gw.headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_campaign_counts_invalid_duplicate_suppressed_and_sends_each_once(
    gw: Gateway, twilio_stub: TwilioStub
) -> None:
    await suppress_sms(gw.services, NUMBERS[4])
    campaign_id = await create(gw)
    r = await upload(
        gw,
        campaign_id,
        jsonl(
            {"to": NUMBERS[0], "metadata": {"name": "Ann"}},
            {"to": NUMBERS[1]},
            {"to": NUMBERS[2]},
            "",
            {"to": NUMBERS[3]},
            {"to": NUMBERS[4]},
            {"to": "not a number"},
            "{broken json",
            # The same number written another way: a duplicate after normalization.
            {"to": "(415) 555-2671"},
        ),
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"recipients_read": 8, "invalid": 2, "duplicates": 1}

    r = await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "expanding"
    assert (await show(gw, campaign_id))["state"] == "expanding"
    assert await expand_all(gw, batch=2) == 4  # 8 list positions
    view = await show(gw, campaign_id)
    assert view["state"] == "sending"
    assert view["counts"] == {
        "read": 8,
        "invalid": 2,
        "duplicate": 1,
        "suppressed": 1,
        "queued": 4,
        "sent": 0,
        "delivered": 0,
        "bounced": 0,
        "complained": 0,
        "failed": 0,
        "cancelled": 0,
    }
    await drain(gw)
    sent_to = sorted(call.body["To"] for call in twilio_stub.calls)
    assert sent_to == sorted(NUMBERS[:4])
    view = await show(gw, campaign_id)
    assert view["state"] == "done"
    assert view["counts"]["sent"] == 4
    assert view["counts"]["queued"] == 0

    # The campaign's message shows its deliveries like any other message's.
    r = await gw.client.get(f"/v1/messages/{view['message_id']}", headers=gw.headers)
    assert r.status_code == 200
    statuses = sorted(d["status"] for d in r.json()["deliveries"])
    assert statuses == ["sent", "sent", "sent", "sent", "suppressed"]
    # The delivery of the first record keeps its position in the list.
    first = r.json()["deliveries"][0]
    assert first["to"] == NUMBERS[0]


async def test_csv_upload_with_metadata_columns(gw: Gateway) -> None:
    campaign_id = await create(gw)
    body = (
        "name,TO,city\r\n"
        f"Ann,{NUMBERS[0]},Paris\r\n"
        f'"Bob, Jr.",{NUMBERS[1]},\r\n'
        # A quoted field may span lines (then the record ends further down), but metadata
        # is single-line text: the record is invalid and the next one is read as usual.
        f'"Multi\nline",{NUMBERS[2]},Rome\r\n'
        f"Cy,{NUMBERS[3]},Rome\r\n"
        "Eve,nonsense,Oslo\r\n"
        "short\r\n"
        f"Dup,{NUMBERS[0]},Nice\r\n"
    ).encode()
    r = await upload(gw, campaign_id, body, "text/csv; charset=utf-8")
    assert r.status_code == 200, r.text
    assert r.json() == {"recipients_read": 7, "invalid": 3, "duplicates": 1}
    async with pg_connection(gw.services.engine) as conn:
        rows = await conn.fetch(
            "SELECT position, metadata FROM campaign_recipients WHERE campaign_id = $1 "
            "ORDER BY position",
            uuid.UUID(campaign_id),
        )
    assert [(r["position"], r["metadata"]) for r in rows] == [
        (0, {"name": "Ann", "city": "Paris"}),
        (1, {"name": "Bob, Jr."}),
        (3, {"name": "Cy", "city": "Rome"}),
    ]


async def test_csv_without_to_column_is_400_and_changes_nothing(gw: Gateway) -> None:
    campaign_id = await create(gw)
    assert (await upload(gw, campaign_id, jsonl({"to": NUMBERS[0]}))).status_code == 200
    r = await upload(gw, campaign_id, b"phone,name\n+14155552671,Ann\n", "text/csv")
    assert r.status_code == 400
    assert r.json()["type"] == "urn:problem:invalid-list"
    async with pg_connection(gw.services.engine) as conn:
        count = await conn.fetchval(
            "SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1",
            uuid.UUID(campaign_id),
        )
    assert count == 1


async def test_other_media_types_are_415(gw: Gateway) -> None:
    campaign_id = await create(gw)
    r = await upload(gw, campaign_id, b'{"to": "x"}', "application/json")
    assert r.status_code == 415
    assert r.headers["content-type"] == "application/problem+json"


async def test_second_upload_replaces_the_list(gw: Gateway) -> None:
    campaign_id = await create(gw)
    first = await upload(gw, campaign_id, jsonl(*({"to": n} for n in NUMBERS[:5])))
    assert first.json() == {"recipients_read": 5, "invalid": 0, "duplicates": 0}
    second = await upload(
        gw, campaign_id, jsonl({"to": NUMBERS[10]}, {"to": NUMBERS[11]}), "application/jsonl"
    )
    assert second.json() == {"recipients_read": 2, "invalid": 0, "duplicates": 0}
    r = await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    assert r.status_code == 202
    await expand_all(gw)
    view = await show(gw, campaign_id)
    assert view["counts"]["read"] == 2
    assert view["counts"]["queued"] == 2
    r = await gw.client.get(f"/v1/messages/{view['message_id']}", headers=gw.headers)
    assert sorted(d["to"] for d in r.json()["deliveries"]) == NUMBERS[10:12]


async def test_state_errors_are_409(gw: Gateway) -> None:
    campaign_id = await create(gw)
    start = f"/v1/campaigns/{campaign_id}/start"
    # Nothing to send yet.
    r = await gw.client.post(start, headers=gw.headers)
    assert r.status_code == 409
    assert r.json()["type"] == "urn:problem:campaign-empty"
    await upload(gw, campaign_id, jsonl({"to": NUMBERS[0]}))
    assert (await gw.client.post(start, headers=gw.headers)).status_code == 202
    r = await gw.client.post(start, headers=gw.headers)
    assert r.status_code == 409
    assert r.json()["type"] == "urn:problem:campaign-state"
    assert r.json()["state"] == "expanding"
    r = await upload(gw, campaign_id, jsonl({"to": NUMBERS[1]}))
    assert r.status_code == 409
    assert r.json()["type"] == "urn:problem:campaign-state"
    await expand_all(gw)
    await drain(gw)
    assert (await show(gw, campaign_id))["state"] == "done"
    r = await gw.client.post(f"/v1/campaigns/{campaign_id}/cancel", headers=gw.headers)
    assert r.status_code == 409
    assert r.json()["state"] == "done"


async def test_cancel_stops_expansion_and_cancels_queued_deliveries(
    gw: Gateway, twilio_stub: TwilioStub
) -> None:
    campaign_id = await create(gw)
    await upload(gw, campaign_id, jsonl(*({"to": n} for n in NUMBERS[:10])))
    await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    # Two batches of three expanded, four recipients left.
    for _ in range(2):
        await gw.services.campaigns.expand_once(batch=3)
    r = await gw.client.post(f"/v1/campaigns/{campaign_id}/cancel", headers=gw.headers)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["state"] == "cancelled"
    assert view["counts"]["cancelled"] == 6
    assert view["counts"]["queued"] == 0
    # No more expansion, and the worker sends nothing.
    assert (await gw.services.campaigns.expand_once(batch=3)).campaign_id is None
    await drain(gw)
    assert twilio_stub.calls == []
    again = await gw.client.post(f"/v1/campaigns/{campaign_id}/cancel", headers=gw.headers)
    assert again.status_code == 200
    assert again.json()["counts"]["cancelled"] == 6
    r = await gw.client.get(f"/v1/messages/{view['message_id']}", headers=gw.headers)
    assert {d["status"] for d in r.json()["deliveries"]} == {"cancelled"}
    assert {d["reason"] for d in r.json()["deliveries"]} == {cp.CANCEL_REASON}
    # Upstream hears of it like of any status change (outbound events).
    async with pg_connection(gw.services.engine) as conn:
        types = await conn.fetch(
            "SELECT type, count(*) FROM events WHERE message_id = $1 GROUP BY type",
            uuid.UUID(view["message_id"]),
        )
    assert {(t["type"], t["count"]) for t in types} == {("delivery.cancelled", 6)}


async def test_create_is_idempotent_per_key(gw: Gateway) -> None:
    key = str(uuid.uuid4())
    first = await create(gw, key=key)
    headers = {**gw.headers, "Idempotency-Key": f'"{key}"'}
    again = await gw.client.post("/v1/campaigns", json=sms_campaign(), headers=headers)
    assert again.status_code == 201
    assert again.json()["id"] == first
    assert again.headers["Idempotent-Replayed"] == "true"
    other = await gw.client.post(
        "/v1/campaigns", json=sms_campaign(body="Other text"), headers=headers
    )
    assert other.status_code == 422
    assert other.json()["type"] == "urn:problem:idempotency-key-reused"
    # The same key on POST /v1/messages is another request entirely.
    r = await gw.send({"channel": "sms", "to": [NUMBERS[0]], "body": "hi"}, key=key)
    assert r.status_code == 201


async def test_invalid_content_is_422_and_stores_nothing(gw: Gateway) -> None:
    headers = {**gw.headers, "Idempotency-Key": '"k1"'}
    r = await gw.client.post(
        "/v1/campaigns", json={"channel": "email", "text": "no subject"}, headers=headers
    )
    assert r.status_code == 422
    r = await gw.client.post(
        "/v1/campaigns", json={**sms_campaign(), "to": [NUMBERS[0]]}, headers=headers
    )
    assert r.status_code == 400
    async with pg_connection(gw.services.engine) as conn:
        assert await conn.fetchval("SELECT count(*) FROM campaigns") == 0
        assert await conn.fetchval("SELECT count(*) FROM messages") == 0


async def test_list_and_visibility(gw: Gateway) -> None:
    ids = [await create(gw) for _ in range(3)]
    r = await gw.client.get("/v1/campaigns", params={"limit": 2}, headers=gw.headers)
    assert r.status_code == 200
    page = r.json()
    assert [c["id"] for c in page["items"]] == ids[::-1][:2]
    r = await gw.client.get(
        "/v1/campaigns", params={"limit": 2, "cursor": page["next_cursor"]}, headers=gw.headers
    )
    assert [c["id"] for c in r.json()["items"]] == ids[:1]
    assert r.json()["next_cursor"] is None
    other = await gw.make_key("send", "read")
    headers = {"Authorization": f"Bearer {other}"}
    assert (await gw.client.get(f"/v1/campaigns/{ids[0]}", headers=headers)).status_code == 404
    assert (await gw.client.get("/v1/campaigns", headers=headers)).json()["items"] == []
    r = await upload(Gateway(gw.services, gw.client, other), ids[0], jsonl({"to": NUMBERS[0]}))
    assert r.status_code == 404
    admin = {"Authorization": f"Bearer {await gw.make_key('admin')}"}
    assert len((await gw.client.get("/v1/campaigns", headers=admin)).json()["items"]) == 3
    r = await gw.client.get("/v1/campaigns", params={"cursor": "nope"}, headers=gw.headers)
    assert r.status_code == 400


async def test_too_many_records_is_413_and_keeps_the_old_list(gw: Gateway) -> None:
    campaign_id = await create(gw)
    assert (await upload(gw, campaign_id, jsonl({"to": NUMBERS[0]}))).status_code == 200
    gw.services.campaigns.max_recipients = 5
    r = await upload(gw, campaign_id, jsonl(*({"to": n} for n in NUMBERS[:6])))
    assert r.status_code == 413
    assert r.json()["type"] == "urn:problem:too-many-recipients"
    r = await upload(gw, campaign_id, jsonl(*({"to": n} for n in NUMBERS[:5])))
    assert r.json() == {"recipients_read": 5, "invalid": 0, "duplicates": 0}
    assert (await show(gw, campaign_id))["counts"]["read"] == 5


async def test_erasure_reaches_a_campaign_list(gw: Gateway, twilio_stub: TwilioStub) -> None:
    campaign_id = await create(gw)
    await upload(
        gw,
        campaign_id,
        jsonl({"to": NUMBERS[0], "metadata": {"name": "Ann"}}, {"to": NUMBERS[1]}),
    )
    admin = {"Authorization": f"Bearer {await gw.make_key('admin')}"}
    r = await gw.client.delete(f"/v1/subjects/sms/{NUMBERS[0]}", headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["ciphertexts_destroyed"]["campaign_recipients"] == 1
    async with pg_connection(gw.services.engine) as conn:
        rows = await conn.fetch(
            "SELECT position, recipient_encrypted, metadata FROM campaign_recipients "
            "WHERE campaign_id = $1 ORDER BY position",
            uuid.UUID(campaign_id),
        )
    assert (rows[0]["position"], rows[0]["recipient_encrypted"], rows[0]["metadata"]) == (
        0,
        None,
        None,
    )
    assert rows[1]["recipient_encrypted"] is not None
    await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    await expand_all(gw)
    await drain(gw)
    assert [call.body["To"] for call in twilio_stub.calls] == [NUMBERS[1]]
    view = await show(gw, campaign_id)
    assert (view["counts"]["sent"], view["counts"]["failed"]) == (1, 1)
    assert view["state"] == "done"


async def test_the_message_view_of_a_large_campaign_shows_the_first_1000_deliveries(
    gw: Gateway,
) -> None:
    body = {"channel": "email", "subject": "Sale", "text": "20% off", "category": "marketing"}
    campaign_id = await create(gw, body)
    await upload(gw, campaign_id, jsonl(*({"to": f"user{i}@example.com"} for i in range(1001))))
    await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    await expand_all(gw, batch=500)
    view = await show(gw, campaign_id)
    assert view["counts"]["queued"] == 1001
    r = await gw.client.get(f"/v1/messages/{view['message_id']}", headers=gw.headers)
    assert r.status_code == 200
    assert r.json()["deliveries_truncated"] is True
    deliveries = r.json()["deliveries"]
    assert len(deliveries) == 1000
    assert deliveries[0]["to"] == "user0@example.com"
    assert deliveries[-1]["to"] == "user999@example.com"
