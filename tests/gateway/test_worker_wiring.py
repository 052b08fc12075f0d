"""The worker the composition root builds also applies parked provider events."""

from __future__ import annotations

from sqlalchemy import update

from gateway.services import Services
from gateway.worker import build_worker
from sender.models import Attempt, Delivery
from tests.webhooks.feedback import delivery_state, make_delivery, status_params, stored_events

PHONE = "+15005550006"


async def test_worker_sweep_applies_events_parked_before_the_send_recorded_its_id(
    services: Services,
) -> None:
    made = await make_delivery(
        services, channel="sms", to=PHONE, status="sending", attempts=[("in_progress", None)]
    )
    ingestor = services.ingestor
    got = await ingestor.twilio_status(
        status_params("SMw", "delivered", to=PHONE),
        query={"d": str(made.delivery_id)},
        idempotency_token=None,
    )
    assert got == ["parked"]
    # The send recorded the provider id, but its process died before calling the hook.
    async with services.sessions() as session:
        await session.execute(
            update(Attempt)
            .where(Attempt.id == made.attempt_ids[0])
            .values(status="accepted", provider_message_id="SMw", provider_status="sent")
        )
        await session.execute(
            update(Delivery)
            .where(Delivery.id == made.delivery_id)
            .values(status="sent", provider_message_id="SMw")
        )
        await session.commit()

    worker = build_worker(services)
    assert worker is not None
    assert await worker.sweep() >= 1
    delivery, _ = await delivery_state(services, made.delivery_id)
    assert delivery.status == "delivered"
    (row,) = await stored_events(services)
    assert row.disposition == "applied"
    # nothing left to do on the next sweep
    assert await worker.sweep() == 0
