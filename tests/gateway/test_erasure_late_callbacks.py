"""A provider callback that arrives after an erasure does not bring the address back."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from gateway.services import Services
from tests.conftest import bearer
from tests.webhooks.feedback import make_delivery, status_params
from webhooks.models import ProviderEvent

PHONE = "+14155550123"


async def test_callback_after_erasure_stores_no_payload(
    client: httpx.AsyncClient, services: Services, make_key: object
) -> None:
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMe")])
    ingestor = services.ingestor
    before = status_params("SMe", "sent", to=PHONE)
    assert await ingestor.twilio_status(before, query={}, idempotency_token="t1") != []

    admin = bearer(await make_key("admin"))  # type: ignore[operator]
    erased = await client.delete(f"/v1/subjects/sms/{PHONE}", headers=admin)
    assert erased.status_code == 200, erased.text

    after = status_params("SMe", "delivered", to=PHONE)
    assert await ingestor.twilio_status(after, query={}, idempotency_token="t2") == ["applied"]
    async with services.sessions() as session:
        rows = {
            r.provider_event_id: r
            for r in await session.scalars(
                select(ProviderEvent).where(ProviderEvent.delivery_id == made.delivery_id)
            )
        }
    # the earlier payload was destroyed by the erasure, the late one never stored
    assert rows["t1"].payload_encrypted is None
    assert rows["t2"].payload_encrypted is None
    assert rows["t2"].recipient_hash == made.recipient_hash


async def test_callbacks_for_other_people_keep_their_payload(services: Services) -> None:
    await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMk")])
    ingestor = services.ingestor
    params = status_params("SMk", "delivered", to=PHONE)
    assert await ingestor.twilio_status(params, query={}, idempotency_token="k1") == ["applied"]
    async with services.sessions() as session:
        row = (await session.scalars(select(ProviderEvent))).one()
    assert row.payload_encrypted is not None
    assert PHONE in services.protector.decrypt(row.payload_encrypted)
