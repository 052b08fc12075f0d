"""Streaming export of the suppression list with each entry's history, in constant memory.

Entries are read in keyset-paginated batches, each in its own short transaction, and written
out batch by batch; nothing holds more than one batch at a time. This is the one bulk path,
so rows are read as plain tuples (no ORM objects) and turned into JSON values directly.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import String, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from suppression.crypto import AddressProtector
from suppression.formats import EXPORT_FORMATS, export_header, export_line
from suppression.listing import Filters, apply_filters, keyset_after
from suppression.models import Suppression, SuppressionHistory
from suppression.views import display_address

EXPORT_BATCH = 1000

_ENTRY_COLUMNS = (
    Suppression.id,
    Suppression.channel,
    Suppression.address_hash,
    Suppression.address_encrypted,
    Suppression.scope,
    Suppression.reason,
    Suppression.source_type,
    Suppression.source_id,
    Suppression.evidence,
    Suppression.created_at,
    Suppression.expires_at,
)
_HISTORY_COLUMNS = (
    SuppressionHistory.id,
    SuppressionHistory.suppression_id,
    SuppressionHistory.channel,
    SuppressionHistory.address_hash,
    SuppressionHistory.scope,
    SuppressionHistory.action,
    SuppressionHistory.reason,
    SuppressionHistory.actor,
    SuppressionHistory.source_type,
    SuppressionHistory.source_id,
    SuppressionHistory.details,
    SuppressionHistory.at,
)


async def export_chunks(
    sessions: async_sessionmaker[AsyncSession],
    protector: AddressProtector,
    *,
    fmt: str,
    filters: Filters | None = None,
    batch_size: int = EXPORT_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> AsyncIterator[bytes]:
    """The export as byte chunks (header first, then one chunk per batch of entries).

    Every entry carries its history: the rows of the same (channel, address, scope), including
    those of earlier incarnations that were removed and added again. The fields are those of
    `suppression.formats.EXPORT_COLUMNS` (the API's entry view plus `history`).
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}")
    base = apply_filters(select(*_ENTRY_COLUMNS), filters or Filters())
    header = export_header(fmt)
    if header:
        yield header
    after: tuple[dt.datetime, uuid.UUID] | None = None
    while True:
        now = dt.datetime.now(dt.UTC)
        query = base if after is None else base.where(keyset_after(*after))
        query = query.order_by(Suppression.created_at, Suppression.id).limit(batch_size)
        async with sessions() as session:
            connection = await session.connection()
            rows = (await connection.execute(query)).all()
            history = await _history(session, {row.address_hash for row in rows})
        if not rows:
            break
        chunk = bytearray()
        for row in rows:
            item = {
                "id": str(row.id),
                "channel": row.channel,
                "address": display_address(protector, row.address_encrypted),
                "scope": row.scope,
                "reason": row.reason,
                "active": row.expires_at is None or row.expires_at > now,
                "source_type": row.source_type,
                "source_id": row.source_id,
                "evidence": row.evidence or {},
                "created_at": row.created_at.isoformat(),
                "expires_at": row.expires_at.isoformat() if row.expires_at else None,
                "history": history.get((row.channel, row.address_hash, row.scope), []),
            }
            chunk += export_line(fmt, item)
        count = len(rows)
        last = rows[-1]
        after = (last.created_at, last.id)
        del rows, history
        yield bytes(chunk)
        if on_batch is not None:
            on_batch(count)
        if count < batch_size:
            break


async def _history(
    session: AsyncSession, hashes: set[str]
) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    result: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    if not hashes:
        return result
    # One array parameter rather than an IN list: the statement is compiled once.
    wanted = bindparam("hashes", list(hashes), type_=ARRAY(String))
    rows = await session.execute(
        select(*_HISTORY_COLUMNS)
        .where(SuppressionHistory.address_hash == any_(wanted))
        .order_by(SuppressionHistory.id)
    )
    for row in rows:
        result[(row.channel, row.address_hash, row.scope)].append(
            {
                "id": row.id,
                "suppression_id": str(row.suppression_id) if row.suppression_id else None,
                "scope": row.scope,
                "action": row.action,
                "reason": row.reason,
                "actor": row.actor,
                "source_type": row.source_type,
                "source_id": row.source_id,
                "details": row.details or {},
                "at": row.at.isoformat(),
            }
        )
    return result
