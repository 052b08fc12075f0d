"""The provider event store: claim each event once, record what was done with it.

The claim is one atomic ``INSERT ... ON CONFLICT (provider, provider_event_id) DO NOTHING
RETURNING id``: of two concurrent copies of one callback, the second waits on the unique
index until the first commits and then gets nothing back, so exactly one applies effects.
Callers pass the session and commit.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from suppression import service
from suppression.crypto import AddressProtector
from suppression.db import new_id, utcnow
from webhooks.events import FeedbackEvent
from webhooks.models import ProviderEvent
from webhooks.state import PARKED

# Keys of `details` that the store adds for re-applying parked events.
CHANNEL_KEY = "channel"
REF_KEY = "delivery_ref"
OUTCOME_KEY = "outcome"
RULE_KEY = "rule"


async def claim(
    session: AsyncSession,
    protector: AddressProtector,
    event: FeedbackEvent,
    *,
    recipient_hash: str | None,
    details: dict[str, Any],
    disposition: str,
    received_at: dt.datetime | None = None,
) -> uuid.UUID | None:
    """Store `event` unless already stored; its row id, or None for a duplicate.

    The raw payload (which names the recipient) is not kept for a person whose data was
    erased: a late callback must not bring the address back.
    """
    payload = None
    if event.raw is not None and not (
        recipient_hash and await service.erased_hashes(session, [(event.channel, recipient_hash)])
    ):
        payload = protector.encrypt(json.dumps(event.raw, separators=(",", ":"), default=str))
    row_id = await session.scalar(
        insert(ProviderEvent)
        .values(
            id=new_id(),
            provider=event.provider,
            provider_event_id=event.provider_event_id,
            event_type=event.event_type[:32],
            provider_message_id=event.provider_message_id,
            recipient_hash=recipient_hash,
            disposition=disposition,
            details=details,
            payload_encrypted=payload,
            occurred_at=event.occurred_at,
            received_at=received_at or utcnow(),
        )
        .on_conflict_do_nothing(constraint="uq_provider_events_provider_event")
        .returning(ProviderEvent.id)
    )
    return row_id


async def finish(
    session: AsyncSession,
    row_id: uuid.UUID,
    *,
    disposition: str,
    delivery_id: uuid.UUID | None,
    attempt_id: uuid.UUID | None,
) -> None:
    """Record the disposition and the delivery/attempt an event was correlated to."""
    await session.execute(
        update(ProviderEvent)
        .where(ProviderEvent.id == row_id)
        .values(disposition=disposition, delivery_id=delivery_id, attempt_id=attempt_id)
    )


async def parked(
    session: AsyncSession,
    *,
    provider: str | None = None,
    provider_message_id: str | None = None,
    delivery_id: uuid.UUID | None = None,
    limit: int = 500,
) -> list[ProviderEvent]:
    """Parked events for a provider message id or a delivery, oldest first, locked.

    Rows another transaction is applying right now are skipped (SKIP LOCKED), so each
    parked event is applied once.
    """
    conditions = []
    if provider_message_id is not None:
        pmid = [ProviderEvent.provider_message_id == provider_message_id]
        if provider is not None:
            pmid.append(ProviderEvent.provider == provider)
        conditions.append(and_(*pmid))
    if delivery_id is not None:
        conditions.append(ProviderEvent.delivery_id == delivery_id)
    if not conditions:
        return []
    rows = await session.scalars(
        select(ProviderEvent)
        .where(ProviderEvent.disposition == PARKED, or_(*conditions))
        .order_by(ProviderEvent.received_at, ProviderEvent.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(rows)


def rebuild(row: ProviderEvent) -> FeedbackEvent:
    """The normalized event of a stored row, without recipient and raw payload.

    Enough to apply it to a delivery later (parking): address-level effects already ran
    when it was received.
    """
    details = dict(row.details or {})
    return FeedbackEvent(
        provider=row.provider,
        provider_event_id=row.provider_event_id,
        event_type=row.event_type,
        channel=str(details.get(CHANNEL_KEY) or ("email" if row.provider == "ses" else "sms")),
        provider_message_id=row.provider_message_id,
        delivery_ref=details.get(REF_KEY),
        recipient=None,
        occurred_at=row.occurred_at,
        details=details,
    )


async def count_soft_bounces(
    session: AsyncSession, recipient_hash: str, *, since: dt.datetime
) -> int:
    """Soft bounces of one address since `since` and since its last delivery.

    Counted from the event store itself: any delivery to the address resets the count.
    """
    when = func.coalesce(ProviderEvent.occurred_at, ProviderEvent.received_at)
    last_delivery = (
        select(func.max(when))
        .where(
            ProviderEvent.recipient_hash == recipient_hash,
            ProviderEvent.details[OUTCOME_KEY].astext == "delivered",
        )
        .scalar_subquery()
    )
    count = await session.scalar(
        select(func.count())
        .select_from(ProviderEvent)
        .where(
            ProviderEvent.recipient_hash == recipient_hash,
            ProviderEvent.details[OUTCOME_KEY].astext == "soft_bounce",
            when >= since,
            or_(last_delivery.is_(None), when > last_delivery),
        )
    )
    return int(count or 0)
