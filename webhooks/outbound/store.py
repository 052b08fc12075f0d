"""Every statement on `webhook_endpoints`, `webhook_deliveries` and `webhook_attempts`.

This module is the tables' one owner (the routes, the fan-out, the delivery worker and the
CLI all come through it). Statements are plain SQL on an asyncpg connection
(`suppression.db.pg_connection` or `pg_of`); functions that take a `conn` run inside whatever
transaction the caller opened on it.

A delivery is `pending` until a try gets a 2xx (`delivered`) or the retry schedule ends
(`failed`). While a worker pushes it, `leased_until` holds it: no other worker claims it until
then, and any worker may after it (the first one died between claim and record), which is
what makes the push at-least-once whatever process dies when.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from suppression.db import Pg

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
DELIVERY_STATUSES = (PENDING, DELIVERED, FAILED)

# Why an endpoint is disabled: by an operator, or because every try failed for the window.
OPERATOR = "operator"
FAILING = "failing"
DISABLED_REASONS = (OPERATOR, FAILING)

PING = "ping"

_E = (
    "e.id, e.url, e.description, e.events, e.api_key_id, e.secret_encrypted, "
    "e.previous_secret_encrypted, e.previous_secret_expires_at, e.enabled, e.disabled_reason, "
    "e.disabled_at, e.failing_since, e.feed_cursor, e.created_at, e.updated_at"
)


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One row of `webhook_endpoints` (columns in `_E` order)."""

    id: uuid.UUID
    url: str
    description: str
    events: list[str]
    api_key_id: uuid.UUID
    secret_encrypted: str
    previous_secret_encrypted: str | None
    previous_secret_expires_at: dt.datetime | None
    enabled: bool
    disabled_reason: str | None
    disabled_at: dt.datetime | None
    failing_since: dt.datetime | None
    feed_cursor: str | None
    created_at: dt.datetime
    updated_at: dt.datetime


def _endpoint(row: Any) -> EndpointRow:
    values = list(row.values())
    # asyncpg answers its own UUID type; the rest of the code compares uuid.UUID values.
    values[0] = uuid.UUID(str(values[0]))
    values[4] = uuid.UUID(str(values[4]))
    values[3] = list(values[3])
    return EndpointRow(*values)


@dataclass(frozen=True, slots=True)
class NewDelivery:
    """An event to push to an endpoint (`body` only for events not in the feed: `ping`)."""

    event_id: str
    event_type: str
    occurred_at: dt.datetime
    body: str | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery a worker holds (leased) and pushes, with what the push needs of its
    endpoint."""

    id: uuid.UUID
    endpoint_id: uuid.UUID
    event_id: str
    event_type: str
    occurred_at: dt.datetime
    body: str | None
    attempts: int
    url: str
    api_key_id: uuid.UUID
    secret_encrypted: str
    previous_secret_encrypted: str | None
    previous_secret_expires_at: dt.datetime | None


_C = (
    "d.id, d.endpoint_id, d.event_id, d.event_type, d.occurred_at, d.body, d.attempts, "
    "e.url, e.api_key_id, e.secret_encrypted, e.previous_secret_encrypted, "
    "e.previous_secret_expires_at"
)


def _claimed(row: Any) -> Claimed:
    values = list(row.values())[: len(_C.split(","))]
    values[0] = uuid.UUID(str(values[0]))
    values[1] = uuid.UUID(str(values[1]))
    values[8] = uuid.UUID(str(values[8]))
    return Claimed(*values)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One row of `webhook_attempts`, as the attempts list shows it."""

    id: uuid.UUID
    event_id: str
    event_type: str
    attempted_at: dt.datetime
    status_code: int | None
    latency_ms: int
    error: str | None
    delivery_status: str


# -- endpoints --------------------------------------------------------------------------------


async def create_endpoint(
    conn: Pg,
    *,
    url: str,
    description: str,
    events: Sequence[str],
    api_key_id: uuid.UUID,
    secret_encrypted: str,
    feed_cursor: str | None,
    now: dt.datetime,
) -> EndpointRow:
    """Store a new, enabled endpoint that starts at `feed_cursor` (events after it)."""
    row = await conn.fetchrow(
        "INSERT INTO webhook_endpoints AS e (id, url, description, events, api_key_id, "
        "secret_encrypted, enabled, feed_cursor, created_at, updated_at) "
        f"VALUES ($1, $2, $3, $4, $5, $6, true, $7, $8, $8) RETURNING {_E}",
        uuid.uuid4(),
        url,
        description,
        list(events),
        api_key_id,
        secret_encrypted,
        feed_cursor,
        now,
    )
    return _endpoint(row)


async def list_endpoints(conn: Pg) -> list[EndpointRow]:
    """Every endpoint, oldest first."""
    rows = await conn.fetch(f"SELECT {_E} FROM webhook_endpoints e ORDER BY e.created_at, e.id")
    return [_endpoint(r) for r in rows]


async def get_endpoint(conn: Pg, endpoint_id: uuid.UUID) -> EndpointRow | None:
    """One endpoint, or None."""
    row = await conn.fetchrow(f"SELECT {_E} FROM webhook_endpoints e WHERE e.id = $1", endpoint_id)
    return _endpoint(row) if row is not None else None


async def update_endpoint(
    conn: Pg,
    endpoint_id: uuid.UUID,
    *,
    url: str | None = None,
    description: str | None = None,
    events: Sequence[str] | None = None,
    enabled: bool | None = None,
    cursor_on_enable: str | None = None,
    now: dt.datetime,
) -> EndpointRow | None:
    """Change what is given (None: unchanged). Disabling records reason `operator`; enabling
    a disabled endpoint clears its failure state and starts it at `cursor_on_enable` (the
    feed's end: what happened while it was disabled is sent again only by a replay)."""
    row = await conn.fetchrow(
        "UPDATE webhook_endpoints AS e SET url = COALESCE($2, e.url), "
        "description = COALESCE($3, e.description), events = COALESCE($4, e.events), "
        "enabled = COALESCE($5, e.enabled), "
        "disabled_reason = CASE WHEN $5 IS NULL THEN e.disabled_reason WHEN $5 THEN NULL "
        f"  WHEN e.enabled THEN '{OPERATOR}' ELSE e.disabled_reason END, "
        "disabled_at = CASE WHEN $5 IS NULL THEN e.disabled_at WHEN $5 THEN NULL "
        "  WHEN e.enabled THEN $6 ELSE e.disabled_at END, "
        "failing_since = CASE WHEN $5 AND NOT e.enabled THEN NULL ELSE e.failing_since END, "
        "feed_cursor = CASE WHEN $5 AND NOT e.enabled THEN $7 ELSE e.feed_cursor END, "
        f"updated_at = $6 WHERE e.id = $1 RETURNING {_E}",
        endpoint_id,
        url,
        description,
        list(events) if events is not None else None,
        enabled,
        now,
        cursor_on_enable,
    )
    return _endpoint(row) if row is not None else None


async def delete_endpoint(conn: Pg, endpoint_id: uuid.UUID) -> bool:
    """Delete an endpoint with its deliveries and attempts; False when there is none."""
    result: str = await conn.execute("DELETE FROM webhook_endpoints WHERE id = $1", endpoint_id)
    return result != "DELETE 0"


async def rotate_secret(
    conn: Pg,
    endpoint_id: uuid.UUID,
    *,
    secret_encrypted: str,
    previous_expires_at: dt.datetime,
    now: dt.datetime,
) -> EndpointRow | None:
    """Make `secret_encrypted` the signing secret; the current one keeps signing beside it
    until `previous_expires_at` (an older previous one is dropped: two at most)."""
    row = await conn.fetchrow(
        "UPDATE webhook_endpoints AS e SET previous_secret_encrypted = e.secret_encrypted, "
        "previous_secret_expires_at = $3, secret_encrypted = $2, updated_at = $4 "
        f"WHERE e.id = $1 RETURNING {_E}",
        endpoint_id,
        secret_encrypted,
        previous_expires_at,
        now,
    )
    return _endpoint(row) if row is not None else None


async def enabled_endpoint_ids(conn: Pg) -> list[uuid.UUID]:
    """The ids of every enabled endpoint (the fan-out visits each)."""
    rows = await conn.fetch("SELECT id FROM webhook_endpoints WHERE enabled ORDER BY id")
    return [uuid.UUID(str(r["id"])) for r in rows]


async def lock_for_fanout(conn: Pg, endpoint_id: uuid.UUID) -> EndpointRow | None:
    """The enabled endpoint, locked for this transaction; None when it is gone, disabled, or
    another worker is fanning out to it right now (SKIP LOCKED)."""
    row = await conn.fetchrow(
        f"SELECT {_E} FROM webhook_endpoints e WHERE e.id = $1 AND e.enabled "
        "FOR UPDATE SKIP LOCKED",
        endpoint_id,
    )
    return _endpoint(row) if row is not None else None


async def set_cursor(conn: Pg, endpoint_id: uuid.UUID, cursor: str | None) -> None:
    """Advance the endpoint's feed position (in the transaction that added its deliveries)."""
    await conn.execute(
        "UPDATE webhook_endpoints SET feed_cursor = $2 WHERE id = $1", endpoint_id, cursor
    )


# -- deliveries -------------------------------------------------------------------------------


async def add_deliveries(
    conn: Pg, endpoint_id: uuid.UUID, events: Sequence[NewDelivery], *, now: dt.datetime
) -> int:
    """One pending delivery per event, due now (an event the endpoint already has is skipped);
    returns how many were added."""
    if not events:
        return 0
    result: str = await conn.execute(
        "INSERT INTO webhook_deliveries (id, endpoint_id, event_id, event_type, occurred_at, "
        "body, status, attempts, next_attempt_at, created_at) "
        "SELECT gen_random_uuid(), $1, u.event_id, u.event_type, u.occurred_at, u.body, "
        f"'{PENDING}', 0, $6, $6 FROM unnest($2::text[], $3::text[], $4::timestamptz[], "
        "$5::text[]) AS u(event_id, event_type, occurred_at, body) "
        "ON CONFLICT (endpoint_id, event_id) DO NOTHING",
        endpoint_id,
        [e.event_id for e in events],
        [e.event_type for e in events],
        [e.occurred_at for e in events],
        [e.body for e in events],
        now,
    )
    return int(result.rsplit(" ", 1)[-1])


# Oldest due first; among equals, in event order (ids of one transaction's events grow:
# `evt_9` before `evt_10`). Best effort only: tries run concurrently and ordering is not
# promised to receivers.
_ORDER = "d.next_attempt_at, d.occurred_at, length(d.event_id), d.event_id"

_CLAIM_DUE = f"""
WITH picked AS (
    SELECT d.id, d.next_attempt_at AS due
    FROM webhook_endpoints e
    CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at, d.occurred_at, d.event_id FROM webhook_deliveries d
        WHERE d.endpoint_id = e.id AND d.status = '{PENDING}' AND d.next_attempt_at <= $1
        ORDER BY {_ORDER}
        LIMIT $3
        FOR UPDATE OF d SKIP LOCKED
    ) d
    WHERE e.enabled AND NOT (e.id = ANY($5::uuid[]))
    ORDER BY {_ORDER}
    LIMIT $4
)
UPDATE webhook_deliveries d SET next_attempt_at = $2, leased_until = $2
FROM picked, webhook_endpoints e
WHERE d.id = picked.id AND e.id = d.endpoint_id
RETURNING {_C}, picked.due
"""


async def claim_due(
    conn: Pg,
    *,
    now: dt.datetime,
    lease_until: dt.datetime,
    per_endpoint: int,
    limit: int,
    exclude: Sequence[uuid.UUID] = (),
) -> list[Claimed]:
    """Lease up to `limit` due deliveries of enabled endpoints, at most `per_endpoint` of any
    one and none of `exclude` (endpoints this worker has enough under way for): a backlog
    towards one endpoint never fills the batch. `FOR UPDATE SKIP LOCKED`: concurrent workers
    never claim the same row; the lease is committed with the claim. Oldest due first."""
    rows = await conn.fetch(_CLAIM_DUE, now, lease_until, per_endpoint, limit, list(exclude))
    rows = sorted(
        rows, key=lambda r: (r["due"], r["occurred_at"], len(r["event_id"]), r["event_id"])
    )
    return [_claimed(r) for r in rows]


async def add_leased(
    conn: Pg,
    endpoint_id: uuid.UUID,
    event: NewDelivery,
    *,
    now: dt.datetime,
    lease_until: dt.datetime,
) -> Claimed | None:
    """A delivery that this caller pushes itself at once (the `ping` of a test), already
    leased; None when the endpoint does not exist."""
    row = await conn.fetchrow(
        "WITH d AS (INSERT INTO webhook_deliveries (id, endpoint_id, event_id, event_type, "
        "occurred_at, body, status, attempts, next_attempt_at, leased_until, created_at) "
        f"SELECT gen_random_uuid(), e.id, $2, $3, $4, $5, '{PENDING}', 0, $6, $6, $7 "
        "FROM webhook_endpoints e WHERE e.id = $1 RETURNING *) "
        f"SELECT {_C} FROM d JOIN webhook_endpoints e ON e.id = d.endpoint_id",
        endpoint_id,
        event.event_id,
        event.event_type,
        event.occurred_at,
        event.body,
        lease_until,
        now,
    )
    return _claimed(row) if row is not None else None


async def record_try(
    conn: Pg,
    item: Claimed,
    *,
    attempted_at: dt.datetime,
    status_code: int | None,
    latency_ms: int,
    error: str | None,
    next_attempt_at: dt.datetime | None,
    now: dt.datetime,
) -> str:
    """Record one try: the attempt row, and the delivery `delivered` (no error), `pending`
    again at `next_attempt_at`, or `failed` (an error and no next time). A delivery that is
    no longer pending (a worker whose lease had run out delivered it meanwhile) keeps its
    status. Returns the delivery's status."""
    if error is None:
        status = DELIVERED
    else:
        status = PENDING if next_attempt_at is not None else FAILED
    row = await conn.fetchrow(
        "WITH a AS (INSERT INTO webhook_attempts (id, delivery_id, endpoint_id, event_id, "
        "event_type, attempted_at, status_code, latency_ms, error) "
        "VALUES (gen_random_uuid(), $1, $2, $3, $4, $5, $6, $7, $8)) "
        "UPDATE webhook_deliveries SET status = $9::text, attempts = attempts + 1, "
        "next_attempt_at = $10, leased_until = NULL, last_attempt_at = $5, "
        "last_status_code = $6, last_error = $8, "
        f"delivered_at = CASE WHEN $9::text = '{DELIVERED}' THEN $11 ELSE delivered_at END "
        f"WHERE id = $1 AND status = '{PENDING}' RETURNING status",
        item.id,
        item.endpoint_id,
        item.event_id,
        item.event_type,
        attempted_at,
        status_code,
        latency_ms,
        error,
        status,
        next_attempt_at,
        now,
    )
    return str(row["status"]) if row is not None else DELIVERED


async def note_success(conn: Pg, endpoint_id: uuid.UUID) -> None:
    """A try reached the endpoint: it is not failing (any more)."""
    await conn.execute(
        "UPDATE webhook_endpoints SET failing_since = NULL "
        "WHERE id = $1 AND failing_since IS NOT NULL",
        endpoint_id,
    )


async def note_failure(
    conn: Pg, endpoint_id: uuid.UUID, *, now: dt.datetime
) -> tuple[dt.datetime, bool] | None:
    """A try failed: the endpoint is failing since its first failure after the last success.
    Returns (failing since, enabled), or None when the endpoint is gone."""
    row = await conn.fetchrow(
        "UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, $2) "
        "WHERE id = $1 RETURNING failing_since, enabled",
        endpoint_id,
        now,
    )
    return (row["failing_since"], bool(row["enabled"])) if row is not None else None


async def disable_failing(conn: Pg, endpoint_id: uuid.UUID, *, now: dt.datetime) -> bool:
    """Disable an endpoint (reason `failing`); False when it was not enabled."""
    result: str = await conn.execute(
        f"UPDATE webhook_endpoints SET enabled = false, disabled_reason = '{FAILING}', "
        "disabled_at = $2, updated_at = $2 WHERE id = $1 AND enabled",
        endpoint_id,
        now,
    )
    return result != "UPDATE 0"


async def list_attempts(
    conn: Pg, endpoint_id: uuid.UUID, *, limit: int, before: dt.datetime | None = None
) -> list[AttemptRow]:
    """An endpoint's most recent tries, newest first (older than `before` when given), with
    the current status of each try's delivery."""
    rows = await conn.fetch(
        "SELECT a.id, a.event_id, a.event_type, a.attempted_at, a.status_code, a.latency_ms, "
        "a.error, d.status FROM webhook_attempts a JOIN webhook_deliveries d "
        "ON d.id = a.delivery_id WHERE a.endpoint_id = $1 "
        "AND ($2::timestamptz IS NULL OR a.attempted_at < $2) "
        "ORDER BY a.attempted_at DESC, a.id DESC LIMIT $3",
        endpoint_id,
        before,
        limit,
    )
    return [
        AttemptRow(uuid.UUID(str(r[0])), r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows
    ]


async def replay(
    conn: Pg,
    endpoint_id: uuid.UUID,
    *,
    since: dt.datetime,
    until: dt.datetime | None = None,
    now: dt.datetime,
) -> int:
    """Send again every event of the endpoint that occurred at or after `since` (and before
    `until`, when given): delivered, failed or waiting for a retry, but not one being pushed
    right now, nor a `ping`. Each becomes pending, due now, with a fresh retry schedule.
    Returns how many."""
    result: str = await conn.execute(
        f"UPDATE webhook_deliveries SET status = '{PENDING}', attempts = 0, "
        "next_attempt_at = $4, delivered_at = NULL "
        "WHERE endpoint_id = $1 AND occurred_at >= $2 "
        f"AND ($3::timestamptz IS NULL OR occurred_at < $3) AND event_type <> '{PING}' "
        "AND (leased_until IS NULL OR leased_until <= $4)",
        endpoint_id,
        since,
        until,
        now,
    )
    return int(result.rsplit(" ", 1)[-1])


async def prune(conn: Pg, *, before: dt.datetime) -> int:
    """Delete tries older than `before`, and finished deliveries last tried before it."""
    await conn.execute("DELETE FROM webhook_attempts WHERE attempted_at < $1", before)
    result: str = await conn.execute(
        f"DELETE FROM webhook_deliveries WHERE status <> '{PENDING}' "
        "AND COALESCE(last_attempt_at, created_at) < $1",
        before,
    )
    return int(result.rsplit(" ", 1)[-1])


async def pending_count(conn: Pg) -> int:
    """Deliveries to subscribers not yet delivered nor given up (the outbound backlog that
    `/metrics` reports as `gateway_outbound_event_backlog`)."""
    count: int = await conn.fetchval(
        f"SELECT count(*) FROM webhook_deliveries WHERE status = '{PENDING}'"
    )
    return count
