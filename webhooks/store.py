"""The provider event store: every statement on `provider_events` (its one owner).

Plain SQL on an asyncpg connection (`suppression.db.pg_connection`), like the delivery log:
the feedback path is a budget of round trips (DESIGN "Hot paths are budgets").

How the feedback path uses it (see `webhooks.ingest`):

* `seen` (autocommit, one statement for a whole callback): which events are stored already
  (an exact duplicate costs this one round trip and nothing else) and which have events
  parked for the same message or delivery (only those look them up);
* `insert`, inside the callback's transaction after the event was applied: one
  ``INSERT ... ON CONFLICT (provider, provider_event_id) DO NOTHING RETURNING id``. Of two
  concurrent copies of one callback that both passed `seen`, the second waits on the unique
  index until the first commits and then gets nothing back: its caller rolls back what it did
  and answers ``duplicate``, so exactly one copy has effects.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from suppression.crypto import AddressProtector
from suppression.db import Pg, jsonb, new_id
from webhooks.events import FeedbackEvent
from webhooks.state import PARKED

# Keys of `details` that the store adds for re-applying parked events.
CHANNEL_KEY = "channel"
REF_KEY = "delivery_ref"
OUTCOME_KEY = "outcome"
RULE_KEY = "rule"

_COLUMNS = (
    "id, provider, provider_event_id, event_type, provider_message_id, delivery_id, "
    "recipient_hash, disposition, details, occurred_at, received_at"
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A stored event as the parked-event paths need it (columns in `_COLUMNS` order)."""

    id: uuid.UUID
    provider: str
    provider_event_id: str
    event_type: str
    provider_message_id: str | None
    delivery_id: uuid.UUID | None
    recipient_hash: str | None
    disposition: str
    details: dict[str, Any]
    occurred_at: dt.datetime | None
    received_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Seen:
    """What `seen` knows of one incoming event before its transaction."""

    stored: bool
    # Events are parked for its provider message id or its delivery (when the ref is an id).
    parked_waiting: bool


_SEEN = f"""
SELECT k.i,
    EXISTS (SELECT 1 FROM provider_events e
            WHERE e.provider = k.provider AND e.provider_event_id = k.eid) AS stored,
    -- Two probes (the partial index of parked events by message id; the delivery index)
    -- rather than one OR, which the planner may answer with a scan of the whole table.
    EXISTS (SELECT 1 FROM provider_events e
            WHERE e.disposition = '{PARKED}' AND e.provider_message_id = k.pmid
              AND e.provider = k.provider)
    OR EXISTS (SELECT 1 FROM provider_events e
               WHERE e.delivery_id = k.did AND e.disposition = '{PARKED}') AS parked
FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[])
    WITH ORDINALITY AS k(provider, eid, pmid, did, i)
ORDER BY k.i
"""


async def seen(conn: Pg, events: Sequence[FeedbackEvent]) -> list[Seen]:
    """For each event: stored already? events parked for its message/delivery? (one
    statement, no locks)."""
    rows = await conn.fetch(
        _SEEN,
        [e.provider for e in events],
        [e.provider_event_id for e in events],
        [e.provider_message_id for e in events],
        [_ref_id(e.delivery_ref) for e in events],
    )
    return [Seen(bool(r["stored"]), bool(r["parked"])) for r in rows]


def _ref_id(ref: str | None) -> uuid.UUID | None:
    """The delivery id a payload's reference names, when it is one (Twilio ``d``, SES tag)."""
    if not ref:
        return None
    try:
        return uuid.UUID(ref)
    except ValueError:
        return None


def encrypted_payload(protector: AddressProtector, event: FeedbackEvent) -> str | None:
    """The raw payload as stored (Fernet ciphertext), None when the event has none."""
    if event.raw is None:
        return None
    return protector.encrypt(json.dumps(event.raw, separators=(",", ":"), default=str))


_INSERT = """
INSERT INTO provider_events (id, provider, provider_event_id, event_type, provider_message_id,
    recipient_hash, disposition, details, payload_encrypted, occurred_at, received_at,
    delivery_id, attempt_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13)
ON CONFLICT ON CONSTRAINT uq_provider_events_provider_event DO NOTHING
RETURNING id
"""


async def insert(
    conn: Pg,
    event: FeedbackEvent,
    *,
    recipient_hash: str | None,
    details: dict[str, Any],
    disposition: str,
    payload_encrypted: str | None,
    received_at: dt.datetime,
    delivery_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
) -> uuid.UUID | None:
    """Store `event` with what was done with it unless it is stored already; its row id, or
    None for a duplicate (see the module docstring for concurrent copies).

    The caller decides `payload_encrypted`: None for a person whose data was erased (a late
    callback must not bring the address back).
    """
    row_id: uuid.UUID | None = await conn.fetchval(
        _INSERT,
        new_id(),
        event.provider,
        event.provider_event_id,
        event.event_type[:32],
        event.provider_message_id,
        recipient_hash,
        disposition,
        jsonb(details),
        payload_encrypted,
        event.occurred_at,
        received_at,
        delivery_id,
        attempt_id,
    )
    return row_id


async def finish(
    conn: Pg,
    row_id: uuid.UUID,
    *,
    disposition: str,
    delivery_id: uuid.UUID | None,
    attempt_id: uuid.UUID | None,
) -> None:
    """Record the disposition and the delivery/attempt a stored (parked) event got."""
    await conn.execute(
        "UPDATE provider_events SET disposition = $2, delivery_id = $3, attempt_id = $4 "
        "WHERE id = $1",
        row_id,
        disposition,
        delivery_id,
        attempt_id,
    )


def _parked_where(
    provider: str | None, provider_message_id: str | None, delivery_id: uuid.UUID | None
) -> tuple[str, list[Any]] | None:
    conditions: list[str] = []
    args: list[Any] = []
    if provider_message_id is not None:
        args.append(provider_message_id)
        condition = f"provider_message_id = ${len(args)}"
        if provider is not None:
            args.append(provider)
            condition += f" AND provider = ${len(args)}"
        conditions.append(f"({condition})")
    if delivery_id is not None:
        args.append(delivery_id)
        conditions.append(f"delivery_id = ${len(args)}")
    if not conditions:
        return None
    return f"disposition = '{PARKED}' AND ({' OR '.join(conditions)})", args


async def any_parked(
    conn: Pg,
    *,
    provider: str | None = None,
    provider_message_id: str | None = None,
    delivery_id: uuid.UUID | None = None,
) -> bool:
    """Whether events are parked for a provider message id or a delivery (no lock)."""
    where = _parked_where(provider, provider_message_id, delivery_id)
    if where is None:
        return False
    found = await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM provider_events WHERE {where[0]})", *where[1]
    )
    return bool(found)


async def parked(
    conn: Pg,
    *,
    provider: str | None = None,
    provider_message_id: str | None = None,
    delivery_id: uuid.UUID | None = None,
    ids: Sequence[uuid.UUID] | None = None,
    limit: int = 500,
) -> list[StoredEvent]:
    """Parked events for a provider message id or a delivery (or these `ids`), oldest first,
    locked. Run inside a transaction.

    Rows another transaction is applying right now are skipped (SKIP LOCKED), so each
    parked event is applied once.
    """
    if ids is not None:
        where: tuple[str, list[Any]] | None = (
            f"disposition = '{PARKED}' AND id = ANY($1::uuid[])",
            [list(ids)],
        )
    else:
        where = _parked_where(provider, provider_message_id, delivery_id)
    if where is None:
        return []
    sql, args = where
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM provider_events WHERE {sql} "
        f"ORDER BY received_at, id LIMIT ${len(args) + 1} FOR UPDATE SKIP LOCKED",
        *args,
        limit,
    )
    return [StoredEvent(*r) for r in rows]


@dataclass(frozen=True, slots=True)
class ParkedRef:
    """What the sweeper needs to decide whether a parked event can be applied now."""

    id: uuid.UUID
    provider_message_id: str | None
    delivery_id: uuid.UUID | None


async def parked_since(conn: Pg, since: dt.datetime, *, limit: int) -> list[ParkedRef]:
    """Parked events received since `since`, oldest first (no lock)."""
    rows = await conn.fetch(
        "SELECT id, provider_message_id, delivery_id FROM provider_events "
        f"WHERE disposition = '{PARKED}' AND received_at >= $1 ORDER BY received_at, id LIMIT $2",
        since,
        limit,
    )
    return [ParkedRef(*r) for r in rows]


def rebuild(row: StoredEvent) -> FeedbackEvent:
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


async def lock_address(conn: Pg, recipient_hash: str) -> None:
    """Serialize soft-bounce counting for one address until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", recipient_hash)


_SOFT_BOUNCES = f"""
WITH last AS (
    SELECT max(COALESCE(occurred_at, received_at)) AS at FROM provider_events
    WHERE recipient_hash = $1 AND details ->> '{OUTCOME_KEY}' = 'delivered'
)
SELECT (SELECT count(*) FROM provider_events, last
        WHERE recipient_hash = $1 AND details ->> '{OUTCOME_KEY}' = 'soft_bounce'
          AND COALESCE(occurred_at, received_at) >= $2
          AND (last.at IS NULL OR COALESCE(occurred_at, received_at) > last.at))
    + CASE WHEN $3::timestamptz IS NOT NULL AND $3 >= $2
           AND ((SELECT at FROM last) IS NULL OR $3 > (SELECT at FROM last)) THEN 1 ELSE 0 END
"""


async def count_soft_bounces(
    conn: Pg, recipient_hash: str, *, since: dt.datetime, pending: dt.datetime | None = None
) -> int:
    """Soft bounces of one address since `since` and since its last delivery.

    Counted from the event store itself: any delivery to the address resets the count.
    `pending` is the time of a soft bounce being applied that is not stored yet (the feedback
    path stores an event after applying it): it counts like a stored one.
    """
    count = await conn.fetchval(_SOFT_BOUNCES, recipient_hash, since, pending)
    return int(count or 0)


@dataclass(frozen=True, slots=True)
class StaleGroup:
    """Parked events of one provider and event type older than the cutoff."""

    provider: str
    event_type: str
    count: int
    oldest_received_at: dt.datetime


@dataclass(frozen=True, slots=True)
class StaleParked:
    """A parked event as the stale report shows it (no recipient, no payload)."""

    id: uuid.UUID
    provider: str
    event_type: str
    provider_message_id: str | None
    delivery_id: uuid.UUID | None
    occurred_at: dt.datetime | None
    received_at: dt.datetime


async def stale_parked(
    conn: Pg, *, before: dt.datetime, limit: int
) -> tuple[list[StaleGroup], list[StaleParked]]:
    """Events still parked (never matched to a delivery, or never applied) that arrived
    before `before`: counts per (provider, event type) with the oldest arrival, and the
    `limit` oldest events (an operator report: the partial index of parked events serves
    both statements)."""
    groups = await conn.fetch(
        "SELECT provider, event_type, count(*), min(received_at) FROM provider_events "
        "WHERE disposition = $1 AND received_at < $2 GROUP BY provider, event_type "
        "ORDER BY provider, event_type",
        PARKED,
        before,
    )
    rows = await conn.fetch(
        "SELECT id, provider, event_type, provider_message_id, delivery_id, occurred_at, "
        "received_at FROM provider_events WHERE disposition = $1 AND received_at < $2 "
        "ORDER BY received_at, id LIMIT $3",
        PARKED,
        before,
        limit,
    )
    return [StaleGroup(*g) for g in groups], [StaleParked(*r) for r in rows]
