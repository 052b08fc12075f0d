"""Provider events as the message view shows them (the event store's read side for others).

The send side shows each delivery's callbacks in `GET /v1/messages/{id}`; it cannot read
`provider_events` itself (this package owns the table), so the composition root hands it
`events_for_deliveries`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import Pg


async def events_for_deliveries(
    conn: Pg, delivery_ids: Sequence[uuid.UUID]
) -> list[Mapping[str, Any]]:
    """The events correlated to these deliveries, in the order they were received."""
    rows = await conn.fetch(
        "SELECT id, delivery_id, provider, provider_event_id, event_type, provider_message_id, "
        "disposition, details, occurred_at, received_at FROM provider_events "
        "WHERE delivery_id = ANY($1::uuid[]) ORDER BY received_at, id",
        list(delivery_ids),
    )
    return [dict(r) for r in rows]


async def events_with_payloads(
    conn: Pg, protector: AddressProtector, delivery_ids: Sequence[uuid.UUID]
) -> list[dict[str, Any]]:
    """Like `events_for_deliveries`, with each event's raw payload decrypted (`payload`, None
    when none was kept, it was erased, or no configured key opens it), for the console."""
    rows = await conn.fetch(
        "SELECT id, delivery_id, attempt_id, provider, provider_event_id, event_type, "
        "provider_message_id, disposition, details, payload_encrypted, occurred_at, "
        "received_at FROM provider_events WHERE delivery_id = ANY($1::uuid[]) "
        "ORDER BY received_at, id",
        list(delivery_ids),
    )
    events = []
    for row in rows:
        event = dict(row)
        ciphertext = event.pop("payload_encrypted")
        payload: Any = None
        if ciphertext is not None:
            try:
                payload = json.loads(protector.decrypt(ciphertext))
            except (InvalidToken, ValueError):
                payload = None
        if isinstance(event["details"], str):
            event["details"] = json.loads(event["details"])
        event["payload"] = payload
        events.append(event)
    return events
