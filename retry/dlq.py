"""The dead-letter queue: deliveries that ran out of attempts or time, for an operator.

`file_entry` is what the delivery log's `dead_letter` calls (the log marks the delivery
dead; this package owns the entry); the rest is the operator's side (list, show, redrive,
discard) used by the API and the CLI, which reach the deliveries through the
`DeliveryQueue` they are handed. Entries are never deleted: discarding or redriving one
resolves it and keeps it as history. Callers commit.
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
from retry.queue import DeliveryQueue
from suppression.db import Pg, jsonb, pg_of, utcnow

# Reasons written by this package; the send path may use others (e.g. "rejected").
REASONS = ("max_attempts", "expired", "unknown_outcome", "max_deferral")
STATES = ("open", "redriven", "discarded", "all")


class DeadLetterNotFound(LookupError):
    """No dead-letter entry (or delivery) with that id."""


class DeadLetterConflict(Exception):
    """The entry cannot be changed: already resolved, or its delivery is no longer dead."""


class DeadLetterExpired(DeadLetterConflict):
    """The entry's delivery is still dead but its message's deadline has passed: redriven, it
    would expire again at once (and file a new entry), so it is not redriven."""


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


async def file_entry(
    conn: Pg,
    *,
    delivery_id: uuid.UUID,
    channel: str,
    reason: str,
    last_error: str | None,
    history: list[dict[str, Any]],
    now: dt.datetime,
) -> uuid.UUID:
    """File a dead-letter entry for a delivery the log just marked dead (one INSERT).

    The delivery log's `dead_letter` calls this with what it copied from the delivery and its
    attempts; the caller's transaction covers both.
    """
    entry_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dead_letters (id, delivery_id, channel, reason, last_error, "
        "attempt_history, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        entry_id,
        delivery_id,
        channel,
        reason,
        last_error,
        jsonb(history),
        now,
    )
    return entry_id


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
    queue: DeliveryQueue,
    f: DeadLetterFilter,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Entry], str | None]:
    """A page of entries, newest first, and the cursor of the next page (None at the end)."""
    query = (
        select(DeadLetter)
        .where(*_conditions(f))
        .order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc())
        .limit(limit + 1)
    )
    if cursor:
        at, ident = decode_cursor(cursor)
        query = query.where(tuple_(DeadLetter.created_at, DeadLetter.id) < tuple_(at, ident))
    rows = list((await session.scalars(query)).all())
    found = await queue.statuses(await pg_of(session), [r.delivery_id for r in rows[:limit]])
    entries = [Entry(r, found.get(r.delivery_id)) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = entries[-1].row
        next_cursor = encode_cursor(last.created_at, last.id)
    return entries, next_cursor


async def get_entry(session: AsyncSession, queue: DeliveryQueue, entry_id: uuid.UUID) -> Entry:
    """One entry with its delivery's current status; `DeadLetterNotFound` if there is none."""
    row = await session.get(DeadLetter, entry_id)
    if row is None:
        raise DeadLetterNotFound(f"no dead-letter entry {entry_id}")
    found = await queue.statuses(await pg_of(session), [row.delivery_id])
    return Entry(row, found.get(row.delivery_id))


async def _lock_open(session: AsyncSession, entry_id: uuid.UUID) -> DeadLetter:
    entry = await session.scalar(
        select(DeadLetter).where(DeadLetter.id == entry_id).with_for_update()
    )
    if entry is None:
        raise DeadLetterNotFound(f"no dead-letter entry {entry_id}")
    if entry.resolved_at is not None:
        raise DeadLetterConflict(f"entry {entry_id} is already {entry.resolution}")
    return entry


async def redrive(
    session: AsyncSession,
    queue: DeliveryQueue,
    entry_id: uuid.UUID,
    *,
    actor: str,
    note: str | None = None,
    now: dt.datetime | None = None,
) -> Entry:
    """Put the entry's delivery back on the queue with a fresh attempt budget.

    Refused (`DeadLetterConflict`) when the entry is resolved already or its delivery is no
    longer `dead` (a late provider callback showed it went out after all), and
    (`DeadLetterExpired`) when its message's deadline has passed.
    """
    now = now or utcnow()
    entry = await _lock_open(session, entry_id)
    conn = await pg_of(session)
    # A fresh attempt budget; the attempt rows stay as history. The dispatch checks the
    # suppression list again before any provider call.
    if not await queue.requeue_dead(conn, [entry.delivery_id], now=now):
        status = (await queue.statuses(conn, [entry.delivery_id])).get(entry.delivery_id)
        if status == "dead":
            raise DeadLetterExpired(
                f"delivery {entry.delivery_id} is past its message's deadline (expires_at): "
                "redriven, it would expire again at once; not redriven (discard the entry)"
            )
        raise DeadLetterConflict(
            f"delivery {entry.delivery_id} is no longer dead (status {status}); not redriven"
        )
    _resolve(entry, "redriven", note, actor, now)
    await session.flush()
    entry_status = (await queue.statuses(conn, [entry.delivery_id])).get(entry.delivery_id)
    return Entry(entry, entry_status)


def _resolve(
    entry: DeadLetter, resolution: str, reason: str | None, actor: str, at: dt.datetime
) -> None:
    entry.resolution = resolution
    entry.resolution_reason = reason
    entry.resolved_by = actor
    entry.resolved_at = at


async def redrive_batch(
    session: AsyncSession,
    queue: DeliveryQueue,
    f: DeadLetterFilter,
    *,
    actor: str,
    note: str | None = None,
    batch: int = 500,
    now: dt.datetime | None = None,
    expired: set[uuid.UUID] | None = None,
) -> int:
    """Redrive up to `batch` open entries matching `f` whose delivery is still dead.

    Returns how many; call again (after committing) until it returns 0. Entries locked by a
    concurrent redrive are skipped, so several operators cannot redrive one entry twice.
    Entries whose message's deadline has passed stay open (a redrive would expire again at
    once); their ids are added to `expired` when given.
    """
    now = now or utcnow()
    conds = [*_conditions(DeadLetterFilter(f.reason, f.channel, f.since, f.until, "open"))]
    conn = await pg_of(session)
    after: tuple[dt.datetime, uuid.UUID] | None = None
    while True:
        # Entries whose delivery is no longer dead (a late callback showed it went out) stay
        # open and are skipped; page on until a batch of redrivable ones is found.
        query = (
            select(DeadLetter.id, DeadLetter.delivery_id, DeadLetter.created_at)
            .where(*conds)
            .order_by(DeadLetter.created_at, DeadLetter.id)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        if after is not None:
            query = query.where(tuple_(DeadLetter.created_at, DeadLetter.id) > tuple_(*after))
        picked = (await session.execute(query)).all()
        if not picked:
            return 0
        requeued = set(await queue.requeue_dead(conn, [p.delivery_id for p in picked], now=now))
        done = [p.id for p in picked if p.delivery_id in requeued]
        if expired is not None and len(done) < len(picked):
            still_dead = await queue.dead_ids(
                conn, [p.delivery_id for p in picked if p.delivery_id not in requeued]
            )
            expired.update(p.id for p in picked if p.delivery_id in still_dead)
        if done:
            await session.execute(
                update(DeadLetter)
                .where(DeadLetter.id.in_(done))
                .values(
                    resolution="redriven",
                    resolution_reason=note,
                    resolved_by=actor,
                    resolved_at=now,
                )
            )
            return len(done)
        after = (picked[-1].created_at, picked[-1].id)


async def count_redrivable(session: AsyncSession, queue: DeliveryQueue, f: DeadLetterFilter) -> int:
    """How many open entries matching `f` a bulk redrive would take."""
    conds = _conditions(DeadLetterFilter(f.reason, f.channel, f.since, f.until, "open"))
    ids = list((await session.scalars(select(DeadLetter.delivery_id).where(*conds))).all())
    total = 0
    conn = await pg_of(session)
    for start in range(0, len(ids), 10_000):
        total += len(await queue.dead_ids(conn, ids[start : start + 10_000]))
    return total


async def discard(
    session: AsyncSession,
    queue: DeliveryQueue,
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
    found = await queue.statuses(await pg_of(session), [entry.delivery_id])
    return Entry(entry, found.get(entry.delivery_id))


# -- operator console reads (gateway.console) -------------------------------------------------


async def list_for_console(
    session: AsyncSession,
    queue: DeliveryQueue,
    f: DeadLetterFilter,
    *,
    provider: str | None = None,
    limit: int = 100,
) -> list[Entry]:
    """The newest `limit` entries matching `f` and, with `provider`, whose attempt history
    names that provider (the entry keeps each attempt's provider; the table has no column)."""
    query = select(DeadLetter).where(*_conditions(f))
    if provider:
        query = query.where(DeadLetter.attempt_history.contains([{"provider": provider}]))
    query = query.order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc()).limit(limit)
    rows = list((await session.scalars(query)).all())
    found = await queue.statuses(await pg_of(session), [r.delivery_id for r in rows])
    return [Entry(r, found.get(r.delivery_id)) for r in rows]


async def open_depth(session: AsyncSession) -> dict[str, tuple[int, dt.datetime | None]]:
    """Per channel: how many entries are open, and when the oldest open one was filed."""
    rows = (
        await session.execute(
            select(DeadLetter.channel, func.count(), func.min(DeadLetter.created_at))
            .where(DeadLetter.resolved_at.is_(None))
            .group_by(DeadLetter.channel)
        )
    ).all()
    return {channel: (n, oldest) for channel, n, oldest in rows}


async def entries_for_deliveries(
    session: AsyncSession, delivery_ids: list[uuid.UUID]
) -> list[DeadLetter]:
    """Every entry (open or resolved) of these deliveries, oldest first."""
    if not delivery_ids:
        return []
    query = (
        select(DeadLetter)
        .where(DeadLetter.delivery_id.in_(delivery_ids))
        .order_by(DeadLetter.created_at, DeadLetter.id)
    )
    return list((await session.scalars(query)).all())


__all__ = [
    "REASONS",
    "STATES",
    "BadCursor",
    "DeadLetterConflict",
    "DeadLetterExpired",
    "DeadLetterFilter",
    "DeadLetterNotFound",
    "Entry",
    "count_redrivable",
    "decode_cursor",
    "discard",
    "encode_cursor",
    "entries_for_deliveries",
    "file_entry",
    "get_entry",
    "list_entries",
    "list_for_console",
    "open_depth",
    "redrive",
    "redrive_batch",
    "utc_time",
]


async def open_depth_by_reason(conn: Pg) -> dict[str, int]:
    """Unresolved entries by reason (every reason of `REASONS`, 0 when none), for `/metrics`:
    one statement over the partial index of open entries."""
    rows = await conn.fetch(
        "SELECT reason, count(*) AS n FROM dead_letters WHERE resolved_at IS NULL GROUP BY reason"
    )
    depth = dict.fromkeys(REASONS, 0)
    depth.update({r["reason"]: r["n"] for r in rows})
    return depth
