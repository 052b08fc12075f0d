"""The dead-letter queue: deliveries that ran out of attempts or time, for an operator.

`dead_letter` is what the send path and the worker call; the rest is the operator's side
(list, show, redrive, discard) used by the API and the CLI. Entries are never deleted:
discarding or redriving one resolves it and keeps it as history. Callers commit.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from retry.models import DeadLetter
from retry.queue import attempts, deliveries
from suppression.db import Pg, jsonb, utcnow

# Reasons written by this package; the send path may use others (e.g. "rejected").
REASONS = ("max_attempts", "expired", "unknown_outcome")
STATES = ("open", "redriven", "discarded", "all")


class DeadLetterNotFound(LookupError):
    """No dead-letter entry (or delivery) with that id."""


class DeadLetterConflict(Exception):
    """The entry cannot be changed: already resolved, or its delivery is no longer dead."""


class BadCursor(ValueError):
    """A pagination cursor that this server did not issue."""


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which entries to list or redrive in bulk. `state` defaults to unresolved ones."""

    reason: str | None = None
    channel: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    state: str = "open"


@dataclass(frozen=True)
class Entry:
    """A dead-letter entry with its delivery's current status."""

    row: DeadLetter
    delivery_status: str | None


async def dead_letter(
    session: AsyncSession,
    delivery_id: uuid.UUID,
    *,
    reason: str,
    last_error: str | None,
) -> uuid.UUID:
    """Mark the delivery `dead` and file a dead-letter entry with its attempt history.

    Sets the delivery's status, reason and (when given) last error and takes it off the
    queue; the entry copies the channel, the last error (the delivery's when none is given)
    and every attempt so far. Returns the entry id. The caller commits.
    """
    values: dict[str, Any] = {
        "status": "dead",
        "reason": reason,
        "next_attempt_at": None,
        "updated_at": utcnow(),
    }
    if last_error is not None:
        values["last_error"] = last_error
    row = (
        await session.execute(
            update(deliveries)
            .where(deliveries.c.id == delivery_id)
            .values(**values)
            .returning(deliveries.c.channel, deliveries.c.last_error)
        )
    ).first()
    if row is None:
        raise DeadLetterNotFound(f"no delivery {delivery_id}")
    history = await attempt_history(session, delivery_id)
    entry = DeadLetter(
        id=uuid.uuid4(),
        delivery_id=delivery_id,
        channel=row.channel,
        reason=reason,
        last_error=last_error if last_error is not None else row.last_error,
        attempt_history=history,
        created_at=utcnow(),
    )
    session.add(entry)
    await session.flush()
    return entry.id


async def attempt_history(session: AsyncSession, delivery_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every provider attempt of a delivery, oldest first, as JSON-ready dicts."""
    rows = await session.execute(
        select(
            attempts.c.number,
            attempts.c.status,
            attempts.c.provider,
            attempts.c.provider_message_id,
            attempts.c.provider_status,
            attempts.c.error_code,
            attempts.c.error_message,
            attempts.c.started_at,
            attempts.c.finished_at,
        )
        .where(attempts.c.delivery_id == delivery_id)
        .order_by(attempts.c.started_at, attempts.c.number)
    )
    return [
        {
            "number": r.number,
            "status": r.status,
            "provider": r.provider,
            "provider_message_id": r.provider_message_id,
            "provider_status": r.provider_status,
            "error_code": r.error_code,
            "error": r.error_message,
            "started_at": _iso(r.started_at),
            "finished_at": _iso(r.finished_at),
        }
        for r in rows
    ]


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _conditions(f: DeadLetterFilter) -> list[Any]:
    conds: list[Any] = []
    if f.reason:
        conds.append(DeadLetter.reason == f.reason)
    if f.channel:
        conds.append(DeadLetter.channel == f.channel)
    if f.since is not None:
        conds.append(DeadLetter.created_at >= f.since)
    if f.until is not None:
        conds.append(DeadLetter.created_at < f.until)
    if f.state == "open":
        conds.append(DeadLetter.resolved_at.is_(None))
    elif f.state in ("redriven", "discarded"):
        conds.append(DeadLetter.resolution == f.state)
    elif f.state != "all":
        raise ValueError(f"state must be one of {', '.join(STATES)}")
    return conds


def utc_time(value: dt.datetime) -> dt.datetime:
    """`value` in UTC (a naive time is taken as UTC).

    Raises `ValueError` when UTC cannot represent it (e.g. `0001-01-01T00:00:00+14:00`), which
    the database driver would otherwise reject with an error of its own.
    """
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"time out of range: {value.isoformat()}") from None


def encode_cursor(created_at: dt.datetime, entry_id: uuid.UUID) -> str:
    """An opaque keyset cursor for the position after this entry."""
    raw = f"{created_at.isoformat()}|{entry_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """The (created_at, id) a cursor stands for; `BadCursor` when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, ident = raw.partition("|")
        at = dt.datetime.fromisoformat(stamp)
        if at.tzinfo is None:
            raise ValueError("naive time")
        return utc_time(at), uuid.UUID(ident)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor("invalid cursor") from None


async def list_entries(
    session: AsyncSession,
    f: DeadLetterFilter,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Entry], str | None]:
    """A page of entries, newest first, and the cursor of the next page (None at the end)."""
    query = (
        select(DeadLetter, deliveries.c.status)
        .join(deliveries, deliveries.c.id == DeadLetter.delivery_id, isouter=True)
        .where(*_conditions(f))
        .order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc())
        .limit(limit + 1)
    )
    if cursor:
        at, ident = decode_cursor(cursor)
        query = query.where(tuple_(DeadLetter.created_at, DeadLetter.id) < tuple_(at, ident))
    rows = (await session.execute(query)).all()
    entries = [Entry(r[0], r[1]) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = entries[-1].row
        next_cursor = encode_cursor(last.created_at, last.id)
    return entries, next_cursor


async def get_entry(session: AsyncSession, entry_id: uuid.UUID) -> Entry:
    """One entry with its delivery's current status; `DeadLetterNotFound` if there is none."""
    row = (
        await session.execute(
            select(DeadLetter, deliveries.c.status)
            .join(deliveries, deliveries.c.id == DeadLetter.delivery_id, isouter=True)
            .where(DeadLetter.id == entry_id)
        )
    ).first()
    if row is None:
        raise DeadLetterNotFound(f"no dead-letter entry {entry_id}")
    return Entry(row[0], row[1])


async def _lock_open(session: AsyncSession, entry_id: uuid.UUID) -> DeadLetter:
    entry = await session.scalar(
        select(DeadLetter).where(DeadLetter.id == entry_id).with_for_update()
    )
    if entry is None:
        raise DeadLetterNotFound(f"no dead-letter entry {entry_id}")
    if entry.resolved_at is not None:
        raise DeadLetterConflict(f"entry {entry_id} is already {entry.resolution}")
    return entry


async def _requeue(session: AsyncSession, delivery_ids: list[uuid.UUID], now: dt.datetime) -> None:
    # A fresh attempt budget; the attempt rows stay as history. The dispatch checks the
    # suppression list again before any provider call.
    await session.execute(
        update(deliveries)
        .where(deliveries.c.id.in_(delivery_ids), deliveries.c.status == "dead")
        .values(status="queued", attempts=0, next_attempt_at=now, reason=None, updated_at=now)
    )


async def redrive(
    session: AsyncSession,
    entry_id: uuid.UUID,
    *,
    actor: str,
    note: str | None = None,
    now: dt.datetime | None = None,
) -> Entry:
    """Put the entry's delivery back on the queue with a fresh attempt budget.

    Refused (`DeadLetterConflict`) when the entry is resolved already or its delivery is no
    longer `dead` (a late provider callback showed it went out after all).
    """
    now = now or utcnow()
    entry = await _lock_open(session, entry_id)
    status = await session.scalar(
        select(deliveries.c.status).where(deliveries.c.id == entry.delivery_id).with_for_update()
    )
    if status != "dead":
        raise DeadLetterConflict(
            f"delivery {entry.delivery_id} is no longer dead (status {status}); not redriven"
        )
    await _requeue(session, [entry.delivery_id], now)
    _resolve(entry, "redriven", note, actor, now)
    await session.flush()
    return Entry(entry, "queued")


def _resolve(
    entry: DeadLetter, resolution: str, reason: str | None, actor: str, at: dt.datetime
) -> None:
    entry.resolution = resolution
    entry.resolution_reason = reason
    entry.resolved_by = actor
    entry.resolved_at = at


async def redrive_batch(
    session: AsyncSession,
    f: DeadLetterFilter,
    *,
    actor: str,
    note: str | None = None,
    batch: int = 500,
    now: dt.datetime | None = None,
) -> int:
    """Redrive up to `batch` open entries matching `f` whose delivery is still dead.

    Returns how many; call again (after committing) until it returns 0. Entries locked by a
    concurrent redrive are skipped, so several operators cannot redrive one entry twice.
    """
    now = now or utcnow()
    conds = [*_conditions(DeadLetterFilter(f.reason, f.channel, f.since, f.until, "open"))]
    picked = (
        await session.execute(
            select(DeadLetter.id, DeadLetter.delivery_id)
            .join(deliveries, deliveries.c.id == DeadLetter.delivery_id)
            .where(*conds, deliveries.c.status == "dead")
            .order_by(DeadLetter.created_at, DeadLetter.id)
            .limit(batch)
            .with_for_update(of=DeadLetter, skip_locked=True)
        )
    ).all()
    if not picked:
        return 0
    await _requeue(session, [p.delivery_id for p in picked], now)
    await session.execute(
        update(DeadLetter)
        .where(DeadLetter.id.in_([p.id for p in picked]))
        .values(resolution="redriven", resolution_reason=note, resolved_by=actor, resolved_at=now)
    )
    return len(picked)


async def count_redrivable(session: AsyncSession, f: DeadLetterFilter) -> int:
    """How many open entries matching `f` a bulk redrive would take."""
    conds = _conditions(DeadLetterFilter(f.reason, f.channel, f.since, f.until, "open"))
    count = await session.scalar(
        select(func.count())
        .select_from(DeadLetter)
        .join(deliveries, deliveries.c.id == DeadLetter.delivery_id)
        .where(*conds, deliveries.c.status == "dead")
    )
    return int(count or 0)


async def discard(
    session: AsyncSession,
    entry_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    now: dt.datetime | None = None,
) -> Entry:
    """Resolve an entry as discarded (kept as history); its delivery stays `dead`."""
    if not reason.strip():
        raise ValueError("a reason is required to discard a dead-letter entry")
    now = now or utcnow()
    entry = await _lock_open(session, entry_id)
    _resolve(entry, "discarded", reason.strip(), actor, now)
    await session.flush()
    status = await session.scalar(
        select(deliveries.c.status).where(deliveries.c.id == entry.delivery_id)
    )
    return Entry(entry, status)


__all__ = [
    "REASONS",
    "STATES",
    "BadCursor",
    "DeadLetterConflict",
    "DeadLetterFilter",
    "DeadLetterNotFound",
    "Entry",
    "attempt_history",
    "count_redrivable",
    "dead_letter",
    "decode_cursor",
    "discard",
    "encode_cursor",
    "get_entry",
    "list_entries",
    "redrive",
    "redrive_batch",
    "utc_time",
]


# -- filing an entry on an asyncpg connection (the feedback path) ---------------------------


async def file_entry(
    conn: Pg,
    delivery_id: uuid.UUID,
    *,
    channel: str,
    reason: str,
    last_error: str | None,
    history: list[dict[str, Any]],
    now: dt.datetime,
) -> uuid.UUID:
    """File the dead-letter entry of a delivery already marked `dead` (e.g. by
    `sender.log.mark_dead`), in the caller's transaction; one statement. Returns its id."""
    entry_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dead_letters (id, delivery_id, channel, reason, last_error, "
        "attempt_history, created_at) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)",
        entry_id,
        delivery_id,
        channel,
        reason,
        last_error,
        jsonb(history),
        now,
    )
    return entry_id
