"""Filtered, cursor-paginated listing of the suppression list (keyset on (created_at, id))."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from suppression.models import Suppression

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class InvalidCursor(ValueError):
    """The cursor was not produced by this API."""


@dataclass(frozen=True)
class Filters:
    """Optional filters of the listing; `since` is inclusive on the creation time."""

    channel: str | None = None
    reason: str | None = None
    scope: str | None = None
    since: dt.datetime | None = None


def encode_cursor(created_at: dt.datetime, entry_id: uuid.UUID) -> str:
    """Opaque cursor pointing after the given entry."""
    raw = json.dumps([created_at.isoformat(), entry_id.hex], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """Inverse of `encode_cursor`; raises `InvalidCursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, entry = json.loads(raw)
        when = dt.datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("naive time")
        # Year 1 or 9999 with an offset has no UTC equivalent (the driver would overflow).
        return when.astimezone(dt.UTC), uuid.UUID(hex=entry)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, OverflowError):
        raise InvalidCursor("the cursor is not valid") from None


def keyset_after(created_at: dt.datetime, entry_id: uuid.UUID) -> ColumnElement[bool]:
    """Entries after (created_at, id) in listing order."""
    return tuple_(Suppression.created_at, Suppression.id) > tuple_(created_at, entry_id)


def apply_filters(query: Select[Any], filters: Filters) -> Select[Any]:
    """Add the filters' conditions to a query on the suppressions table."""
    if filters.channel:
        query = query.where(Suppression.channel == filters.channel)
    if filters.reason:
        query = query.where(Suppression.reason == filters.reason)
    if filters.scope:
        query = query.where(Suppression.scope == filters.scope)
    if filters.since:
        query = query.where(Suppression.created_at >= filters.since)
    return query


def _filtered(filters: Filters) -> Select[Suppression]:
    return apply_filters(select(Suppression), filters)


async def page(
    session: AsyncSession,
    filters: Filters,
    *,
    after: tuple[dt.datetime, uuid.UUID] | None = None,
    limit: int = DEFAULT_LIMIT,
) -> tuple[list[Suppression], tuple[dt.datetime, uuid.UUID] | None]:
    """One page of entries, oldest first, and the key to continue after (None at the end)."""
    query = _filtered(filters)
    if after is not None:
        created, entry_id = after
        # A row comparison, so that PostgreSQL turns it into an index range on created_at.
        query = query.where(keyset_after(created, entry_id))
    rows = list(
        (
            await session.execute(
                query.order_by(Suppression.created_at, Suppression.id).limit(limit + 1)
            )
        ).scalars()
    )
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        return rows, (last.created_at, last.id)
    return rows, None
