"""Helpers of the push tests: endpoints made through the API, events queued for them."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import httpx

from gateway.services import Services
from suppression.db import pg_connection
from tests.conftest import bearer
from tests.webhooks.outbound.receiver import Receiver
from webhooks.outbound import store


async def create_endpoint(
    client: httpx.AsyncClient,
    admin: str,
    receiver: Receiver,
    *,
    events: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An endpoint for `receiver` made through the API; the receiver learns its secret."""
    answer = await client.post(
        "/v1/webhook-endpoints",
        json={"url": receiver.url(), "events": events or ["*"], **extra},
        headers=bearer(admin),
    )
    assert answer.status_code == 201, answer.text
    endpoint: dict[str, Any] = answer.json()
    receiver.secrets.append(endpoint["secret"])
    return endpoint


async def queue_event(
    services: Services,
    endpoint_id: str,
    event_type: str = "delivery.sent",
    *,
    occurred_at: dt.datetime | None = None,
) -> str:
    """Put one event in the endpoint's deliveries as the fan-out would (with its body held
    in the row); returns the event id."""
    event_id = f"evt_{uuid.uuid4().hex}"
    at = occurred_at or dt.datetime.now(dt.UTC)
    body = json.dumps(
        {"id": event_id, "type": event_type, "occurred_at": at.isoformat(), "data": {}}
    )
    async with pg_connection(services.engine) as conn:
        added = await store.add_deliveries(
            conn,
            uuid.UUID(endpoint_id),
            [store.NewDelivery(event_id, event_type, at, body)],
            now=dt.datetime.now(dt.UTC),
        )
    assert added == 1
    return event_id
