"""GET /v1/messages/{id}: deliveries, attempts, provider events, suppressions, visibility."""

from __future__ import annotations

import uuid

from sqlalchemy import delete

from suppression.models import Suppression
from tests.conftest import bearer
from tests.sender.helpers import Gateway, delivery, sms, suppress_sms
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import TwilioStub
from webhooks.models import ProviderEvent


async def test_the_whole_story_of_a_message(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    entry = await suppress_sms(gw.services, "+14155552673")
    twilio_stub.by_recipient["+14155552672"] = Behavior.error(503, None, "unavailable")
    r = await gw.send(
        sms(
            ["+14155552671", "+14155552672", "+14155552673"],
            priority="high",
            metadata={"order": "7"},
        ),
        key="story",
    )
    assert r.status_code == 202
    sent, retrying, suppressed = (d["id"] for d in r.json()["deliveries"])
    sent_row = await delivery(gw.services, sent)
    async with gw.services.sessions() as session:
        session.add(
            ProviderEvent(
                provider="twilio",
                provider_event_id="evt-1",
                event_type="delivered",
                provider_message_id=sent_row.provider_message_id,
                delivery_id=sent_row.id,
                disposition="applied",
                details={"status": "delivered"},
            )
        )
        await session.commit()

    view = await gw.client.get(f"/v1/messages/{r.json()['id']}", headers=gw.headers)
    assert view.status_code == 200
    doc = view.json()
    assert (doc["channel"], doc["priority"], doc["state"], doc["response_code"]) == (
        "sms",
        "high",
        "completed",
        202,
    )
    assert doc["metadata"] == {"order": "7"}
    by_id = {d["id"]: d for d in doc["deliveries"]}
    assert [d["to"] for d in doc["deliveries"]] == ["+14155552671", "+14155552672", "+14155552673"]

    ok = by_id[sent]
    assert ok["status"] == "sent" and ok["provider"] == "twilio"
    assert [(a["number"], a["status"]) for a in ok["attempts"]] == [(1, "accepted")]
    assert ok["attempts"][0]["provider_message_id"] == sent_row.provider_message_id
    assert [(e["event_type"], e["disposition"]) for e in ok["events"]] == [("delivered", "applied")]
    assert ok["suppression"] is None

    later = by_id[retrying]
    assert later["status"] == "retrying" and later["next_attempt_at"] is not None
    [attempt] = later["attempts"]
    assert (attempt["status"], attempt["error_code"]) == ("transient", "http_503")
    assert later["last_error"].startswith("twilio:http_5xx")

    stopped = by_id[suppressed]
    assert (stopped["status"], stopped["reason"], stopped["attempts"]) == (
        "suppressed",
        "sms_stop",
        [],
    )
    assert stopped["suppression"] | {"created_at": None} == {
        "id": str(entry.id),
        "active": True,
        "reason": "sms_stop",
        "scope": "all",
        "created_at": None,
        "expires_at": None,
    }
    # Removed later: the view still names it, as no longer active.
    async with gw.services.sessions() as session:
        await session.execute(delete(Suppression))
        await session.commit()
    doc = (await gw.client.get(f"/v1/messages/{r.json()['id']}", headers=gw.headers)).json()
    assert {d["id"]: d for d in doc["deliveries"]}[suppressed]["suppression"] == {
        "id": str(entry.id),
        "active": False,
        "reason": None,
        "scope": None,
        "created_at": None,
        "expires_at": None,
    }


async def test_visibility(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    message_id = (await gw.send(sms("+14155552671"))).json()["id"]
    other = await gw.make_key("send", "read")
    admin = await gw.make_key("admin")
    sender_only = await gw.make_key("send")
    assert (
        await gw.client.get(f"/v1/messages/{message_id}", headers=bearer(other))
    ).status_code == 404
    assert (
        await gw.client.get(f"/v1/messages/{message_id}", headers=bearer(admin))
    ).status_code == 200
    assert (
        await gw.client.get(f"/v1/messages/{message_id}", headers=bearer(sender_only))
    ).status_code == 403
    assert (
        await gw.client.get(f"/v1/messages/{uuid.uuid4()}", headers=gw.headers)
    ).status_code == 404
    assert (await gw.client.get("/v1/messages/not-a-uuid", headers=gw.headers)).status_code in (
        400,
        404,
    )
