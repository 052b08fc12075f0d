"""Outbound events: the transactional outbox (`events`) and its commit-ordered feed.

This module is the one owner of the `events` table: every statement that reads or prunes it
is here. Rows are written by PostgreSQL triggers that migration 0009 creates, never by Python:

* `deliveries` AFTER INSERT (a delivery claimed `suppressed`) and AFTER UPDATE OF status, when
  the status changed to one of `DELIVERY_STATUSES`: `delivery.<status>`, with the old status
  as `previous_status`. The send claim, `record`, feedback, the worker's `schedule`,
  `mark_dead`, `finish_unsent`, redrive... all change `deliveries.status`, and none of them
  can forget its event: the trigger writes it inside the same transaction, so an event
  exists if and only if its change committed. The delivery log's advance-only rules decide
  which changes happen; a duplicate or a regression changes nothing, so it writes nothing.
* `suppression_history` AFTER INSERT of an `add` row: `suppression.added`; `suppressions`
  AFTER DELETE (only `suppression.service.remove` deletes entries): `suppression.removed`,
  with the removal's source read from the history row the same statement wrote.

Cost on the hot path: no extra round trip. A `sending`/`queued` insert does not even call the
trigger function (its WHEN clause filters it); a reported change costs one primary-key look-up
of the message's owner and one insert, inside the statement that made the change.

Personal data: the event keeps the address only as the Fernet ciphertext copied from the
delivery or entry (erasure destroys it with the others; key rotation re-encrypts it), and
reads the message's `metadata` from `messages` when it is read. `to`/`address` are decrypted
by `read_feed` with the protector handed in.

Commit order: each row stores its transaction id (`pg_current_xact_id()`). A reader serves
only rows whose transaction id is below a horizon, the snapshot's xmin restricted to this
database (`HORIZON_SQL`: every transaction below it has finished, so no row can still appear
there), in (xid, id) order, and its cursor is the (xid, id) of the last row served. A
transaction that commits late always has an xid at or above the horizon the reader saw,
hence above its cursor: a polling reader never skips an event. The price: while a
transaction that may write here stays open, events of later transactions wait for it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from sender import status as st
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import Pg, pg_connection

# Delivery statuses that are reported, each as `delivery.<status>`.
DELIVERY_STATUSES: tuple[str, ...] = (
    st.SENT,
    st.DELAYED,
    st.DELIVERED,
    st.READ,
    st.BOUNCED,
    st.COMPLAINED,
    st.FAILED,
    st.SUPPRESSED,
    st.RETRYING,
    st.DEAD,
)
SUPPRESSION_ADDED = "suppression.added"
SUPPRESSION_REMOVED = "suppression.removed"
EVENT_TYPES: tuple[str, ...] = (
    *(f"delivery.{s}" for s in DELIVERY_STATUSES),
    SUPPRESSION_ADDED,
    SUPPRESSION_REMOVED,
)
EventType = Literal[
    "delivery.sent",
    "delivery.delayed",
    "delivery.delivered",
    "delivery.read",
    "delivery.bounced",
    "delivery.complained",
    "delivery.failed",
    "delivery.suppressed",
    "delivery.retrying",
    "delivery.dead",
    "suppression.added",
    "suppression.removed",
]

MAX_LIMIT = 1000
ID_PREFIX = "evt_"
# A cursor: "<xid>.<id>" (both decimal); opaque to clients.
CURSOR_PATTERN = "^[0-9]{1,19}[.][0-9]{1,19}$"
_CURSOR_RE = re.compile(CURSOR_PATTERN[1:-1])
_MAX_BIGINT = 2**63 - 1


class InvalidCursor(ValueError):
    """The `after` cursor is not one this feed handed out."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event as upstream services see it.

    `id` is the stable event id (`evt_...`, the Standard Webhooks `webhook-id`); `data` holds
    the decrypted `to`/`address`; `message_owner` is the API key that sent the message (None
    for suppression events, which every key with scope `read` may see); `cursor` is the feed
    position just after this event.
    """

    id: str
    type: str
    occurred_at: dt.datetime
    data: dict[str, Any]
    message_owner: uuid.UUID | None
    cursor: str

    def payload(self) -> dict[str, Any]:
        """The event as JSON-ready `{"id", "type", "occurred_at", "data"}`."""
        return {
            "id": self.id,
            "type": self.type,
            "occurred_at": self.occurred_at.isoformat(),
            "data": self.data,
        }

    def body(self) -> bytes:
        """The payload as compact JSON bytes (what a webhook push sends and signs)."""
        return json.dumps(self.payload(), separators=(",", ":"), default=str).encode()


def event_id(seq: int) -> str:
    """The public id of the event row `seq`."""
    return f"{ID_PREFIX}{seq}"


def parse_event_id(value: str) -> int | None:
    """The row id of a public event id, None when it is not one."""
    if not value.startswith(ID_PREFIX) or not value[len(ID_PREFIX) :].isdigit():
        return None
    seq = int(value[len(ID_PREFIX) :])
    return seq if 0 < seq <= _MAX_BIGINT else None


def encode_cursor(xid: int, seq: int) -> str:
    """The cursor for feed position (xid, id)."""
    return f"{xid}.{seq}"


def decode_cursor(cursor: str | None) -> tuple[int, int]:
    """The (xid, id) of a cursor; (0, 0) for None (the start). Raises `InvalidCursor`."""
    if cursor is None:
        return 0, 0
    if not _CURSOR_RE.fullmatch(cursor):
        raise InvalidCursor("cursor must be a next_cursor value returned by this feed")
    xid, seq = (int(part) for part in cursor.split("."))
    if xid > _MAX_BIGINT or seq > _MAX_BIGINT:
        raise InvalidCursor("cursor must be a next_cursor value returned by this feed")
    return xid, seq


def check_types(types: Collection[str] | None) -> frozenset[str] | None:
    """The requested event types as a set; raises ValueError naming an unknown one."""
    if types is None:
        return None
    unknown = sorted(set(types) - set(EVENT_TYPES))
    if unknown:
        raise ValueError(f"unknown event type {unknown[0]!r}; choose from {', '.join(EVENT_TYPES)}")
    return frozenset(types)


_COLUMNS = (
    "e.id, e.xid, e.type, e.occurred_at, e.message_owner, e.message_id, e.delivery_id, "
    "e.channel, e.address_encrypted, e.data::text AS data, m.metadata::text AS metadata"
)

# The horizon: the lowest transaction id that may still write events into this database.
# The snapshot's xmin would do, but it counts every database of the server, so a long
# transaction elsewhere would hold this feed back; a running transaction that
# pg_stat_activity shows in another database cannot write here (an xid belongs to one
# database for good), so it is left out. Anything not proven foreign counts, which is
# always safe: a transaction that finished after the snapshot, a prepared one, or every one
# when the role may not see other sessions' xids (grant it pg_read_all_stats to avoid that).
# backend_xid is a 32-bit xid: it is compared with the low half of the 64-bit ids.
HORIZON_SQL = """
WITH snap AS (SELECT pg_current_snapshot() AS s),
foreign_xids AS (
    SELECT backend_xid::text::bigint AS x FROM pg_stat_activity
    WHERE backend_xid IS NOT NULL
      AND datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT LEAST(
    (SELECT pg_snapshot_xmax(s)::text::bigint FROM snap),
    (SELECT min(x::text::bigint) FROM snap, pg_snapshot_xip(s) AS x
     WHERE x::text::bigint % 4294967296 NOT IN (SELECT x FROM foreign_xids)))
"""

# The horizon row always comes back (so the reader learns the horizon even with no events);
# `LEFT JOIN LATERAL` keeps it when the page is empty.
_FEED = f"""
WITH horizon AS ({HORIZON_SQL} AS xmin)
SELECT h.xmin, {_COLUMNS}
FROM horizon h
LEFT JOIN LATERAL (
    SELECT * FROM events e
    WHERE (e.xid, e.id) > ($1::bigint, $2::bigint) AND e.xid < h.xmin
      AND ($3::uuid IS NULL OR e.message_owner = $3::uuid OR e.message_owner IS NULL)
      AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
    ORDER BY e.xid, e.id
    LIMIT $5
) e ON true
LEFT JOIN messages m ON m.id = e.message_id
ORDER BY e.xid, e.id
"""  # noqa: S608  (only the column list constant is interpolated)


def _decrypt(protector: AddressProtector, token: str | None) -> str | None:
    if token is None:
        return None
    try:
        return protector.decrypt(token)
    except InvalidToken:
        return None


def _event(row: Any, protector: AddressProtector) -> Event:
    stored: dict[str, Any] = json.loads(row["data"])
    address = _decrypt(protector, row["address_encrypted"])
    kind: str = row["type"]
    if kind.startswith("delivery."):
        data: dict[str, Any] = {
            "message_id": str(row["message_id"]) if row["message_id"] else None,
            "delivery_id": str(row["delivery_id"]) if row["delivery_id"] else None,
            "channel": row["channel"],
            "to": address,
            "status": stored.get("status"),
            "previous_status": stored.get("previous_status"),
            "reason": stored.get("reason"),
            "provider": stored.get("provider"),
            "provider_message_id": stored.get("provider_message_id"),
            "category": stored.get("category"),
            "topic": stored.get("topic"),
            "metadata": json.loads(row["metadata"]) if row["metadata"] else {},
        }
    else:
        data = {
            "channel": row["channel"],
            "address": address,
            "scope": stored.get("scope"),
            "reason": stored.get("reason"),
            "source": stored.get("source"),
        }
    return Event(
        id=event_id(row["id"]),
        type=kind,
        occurred_at=row["occurred_at"],
        data=data,
        message_owner=row["message_owner"],
        cursor=encode_cursor(row["xid"], row["id"]),
    )


async def read_feed(
    conn: Pg,
    *,
    after: str | None,
    limit: int,
    client_id: uuid.UUID | None,
    types: Collection[str] | None,
    protector: AddressProtector,
) -> tuple[list[Event], str]:
    """The next events after cursor `after` (None: from the oldest kept), in commit order.

    `client_id` None reads every event (admin); otherwise the events of that key's messages
    and every suppression event. `types` None means all. Returns (events, next_cursor); pass
    `next_cursor` as `after` to continue (with the same `types` and key: a cursor past a
    filtered range does not revisit it). Raises `InvalidCursor` for a malformed cursor and
    ValueError for an unknown type or a limit outside 1-1000. One statement.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    wanted = check_types(types)
    xid, seq = decode_cursor(after)
    rows = await conn.fetch(
        _FEED,
        xid,
        seq,
        client_id,
        sorted(wanted) if wanted is not None else None,
        limit,
    )
    horizon = int(rows[0]["xmin"])
    events = [_event(r, protector) for r in rows if r["id"] is not None]
    if len(events) == limit:
        return events, events[-1].cursor
    # Fewer than asked: every finished transaction's rows up to the horizon were seen, so the
    # next read may start at the horizon (never behind the cursor it was given).
    return events, encode_cursor(*max((xid, seq), (horizon, 0)))


async def current_cursor(conn: Pg) -> str:
    """A cursor at the feed's present end: reading from it yields only events of
    transactions that had not finished yet, or that start later."""
    horizon = await conn.fetchval(HORIZON_SQL)
    return encode_cursor(int(horizon), 0)


async def tail(
    engine: AsyncEngine,
    protector: AddressProtector,
    *,
    after: str | None,
    types: Collection[str] | None,
    out: TextIO,
    follow: bool = True,
    poll_seconds: float = 1.0,
    page_size: int = 500,
) -> str:
    """Write every event from cursor `after` on to `out`, one JSON line each (all keys'
    events), following the feed while `follow`; returns the cursor after the last one read."""
    cursor = after
    while True:
        async with pg_connection(engine) as conn:
            page, cursor = await read_feed(
                conn,
                after=cursor,
                limit=page_size,
                client_id=None,
                types=types,
                protector=protector,
            )
        for event in page:
            out.write(json.dumps(event.payload(), separators=(",", ":"), default=str) + "\n")
        out.flush()
        if len(page) == page_size:
            continue
        if not follow:
            return cursor
        await asyncio.sleep(poll_seconds)


_SINCE = f"""
SELECT NULL::bigint AS xmin, {_COLUMNS}
FROM events e LEFT JOIN messages m ON m.id = e.message_id
WHERE e.occurred_at >= $1 AND e.id > $2
  AND ($3::uuid IS NULL OR e.message_owner = $3::uuid OR e.message_owner IS NULL)
  AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
ORDER BY e.id
LIMIT $5
"""  # noqa: S608  (only the column list constant is interpolated)


async def events_since(
    conn: Pg,
    *,
    since: dt.datetime,
    after_id: int = 0,
    limit: int,
    client_id: uuid.UUID | None,
    types: Collection[str] | None,
    protector: AddressProtector,
) -> list[Event]:
    """Events that occurred at or after `since` (for a replay), in id order, after row id
    `after_id` (page with the last event's `parse_event_id`). Visibility as in `read_feed`;
    not commit-ordered (a replay is a one-off sweep of what is committed now)."""
    wanted = check_types(types)
    rows = await conn.fetch(
        _SINCE, since, after_id, client_id, sorted(wanted) if wanted is not None else None, limit
    )
    return [_event(r, protector) for r in rows]


async def events_by_ids(
    conn: Pg, ids: Collection[str], *, protector: AddressProtector
) -> list[Event]:
    """The events with these public ids that still exist, in id order (unknown ids skipped)."""
    seqs = sorted({seq for seq in (parse_event_id(i) for i in ids) if seq is not None})
    rows = await conn.fetch(
        f"SELECT NULL::bigint AS xmin, {_COLUMNS} FROM events e "  # noqa: S608
        "LEFT JOIN messages m ON m.id = e.message_id WHERE e.id = ANY($1::bigint[]) ORDER BY e.id",
        seqs,
    )
    return [_event(r, protector) for r in rows]


PRUNE_BATCH = 10_000


async def prune(conn: Pg, *, before: dt.datetime, batch: int = PRUNE_BATCH) -> int:
    """Delete up to `batch` events that occurred before `before` (retention); how many."""
    deleted: int = await conn.fetchval(
        "WITH gone AS (DELETE FROM events WHERE id IN (SELECT id FROM events "
        "WHERE occurred_at < $1 ORDER BY occurred_at LIMIT $2) RETURNING 1) "
        "SELECT count(*) FROM gone",
        before,
        batch,
    )
    return int(deleted)
