"""The retry queue's contract with the delivery log.

`retry` never imports `sender`; what it needs of the `deliveries` table is only its
scheduling columns, declared here as a lightweight table clause: the contract between the
two packages. Scheduling a delivery = setting its `status` and `next_attempt_at`; the worker
claims rows whose `next_attempt_at` is due, served by the partial index `ix_deliveries_due`.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    SmallInteger,
    String,
    Text,
    Uuid,
    column,
    table,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from suppression.db import utcnow

deliveries = table(
    "deliveries",
    Column("id", Uuid),
    Column("channel", String),
    Column("status", String),
    Column("category", String),
    Column("priority_rank", SmallInteger),
    Column("expires_at", DateTime(timezone=True)),
    Column("attempts", Integer),
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("reason", Text),
    Column("updated_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True)),
)

# The provider-call history of a delivery (owned by `sender`): the dead-letter queue copies it
# and the sweeper resolves rows left `in_progress` by a process that died mid-call.
attempts = table(
    "attempts",
    Column("id", Uuid),
    Column("delivery_id", Uuid),
    Column("number", Integer),
    Column("status", String),
    Column("provider", String),
    Column("provider_message_id", Text),
    Column("provider_status", String),
    Column("error_code", String),
    Column("error_message", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
)

# Statuses the worker claims when due: new (queued), backing off (retrying) and those whose
# outcome stayed unknown until their settle window ended.
CLAIMABLE_STATUSES = ("queued", "retrying", "unknown")
# The gateway's own pre-provider states; a provider callback always wins over them.
GATEWAY_STATES = ("queued", "sending", "unknown", "retrying", "dead")
PRIORITY_RANKS = {"high": 2, "normal": 1, "low": 0}
PRIORITY_NAMES = {rank: name for name, rank in PRIORITY_RANKS.items()}

__all__ = [
    "CLAIMABLE_STATUSES",
    "GATEWAY_STATES",
    "PRIORITY_NAMES",
    "PRIORITY_RANKS",
    "attempts",
    "column",
    "deliveries",
    "schedule",
    "unschedule",
]


async def schedule(
    session: AsyncSession,
    delivery_id: uuid.UUID,
    *,
    at: dt.datetime,
    status: str = "retrying",
    reason: str | None = None,
    last_error: str | None = None,
) -> None:
    """Put a delivery on the queue: the worker picks it up at `at`."""
    values: dict[str, object] = {"status": status, "next_attempt_at": at, "updated_at": utcnow()}
    if reason is not None:
        values["reason"] = reason
    if last_error is not None:
        values["last_error"] = last_error
    await session.execute(update(deliveries).where(deliveries.c.id == delivery_id).values(**values))


async def unschedule(session: AsyncSession, delivery_id: uuid.UUID) -> None:
    """Take a delivery off the queue (e.g. a late provider callback showed it was sent)."""
    await session.execute(
        update(deliveries).where(deliveries.c.id == delivery_id).values(next_attempt_at=None)
    )
