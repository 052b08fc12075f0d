"""The delivery log: every statement on `messages`, `deliveries` and `attempts`.

This module is the tables' one owner. The send path, the retry worker (through the
`retry.queue.DeliveryQueue` protocol that `DeliveryLog` implements), the feedback path and
the dead-letter queue read and write the log only through the functions here; nobody else
declares these tables or their status strings.

Statements are plain SQL on an asyncpg connection (`suppression.db.pg_connection`), not ORM
sessions: the hot paths are budgets of round trips (see DESIGN "Hot paths are budgets").
Most operations are one statement and so atomic without BEGIN/COMMIT; functions that take a
`conn` run inside whatever transaction the caller opened on it.

The send path in round trips: `claim_many` (message, deliveries with their suppression
verdicts and first attempts `in_progress`, one statement shared with the concurrent
requests of the process, committed before any provider call), the provider calls, then
`record` (attempts, deliveries and the message's completion, one statement).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retry import dlq
from retry.queue import Due
from sender import status as st
from suppression import service as suppression
from suppression.db import Pg, jsonb

# -- rows -------------------------------------------------------------------------------------

_D = (
    "d.id, d.message_id, d.position, d.channel, d.recipient_hash, d.recipient_encrypted, "
    "d.derived_key, d.status, d.reason, d.provider, d.provider_message_id, d.category, "
    "d.topic, d.priority_rank, d.expires_at, d.attempts, d.next_attempt_at, d.last_error, "
    "d.suppression_id, d.created_at, d.updated_at, d.deferred_since"
)
_A = (
    "a.id, a.delivery_id, a.number, a.status, a.provider, a.provider_message_id, "
    "a.provider_status, a.error_code, a.error_message, a.started_at, a.finished_at"
)
_M = (
    "m.id, m.client_id, m.idempotency_key, m.fingerprint, m.state, m.channel, m.category, "
    "m.topic, m.priority, m.expires_at, m.content_encrypted, m.metadata, m.response_code, "
    "m.first_answers, m.created_at, m.completed_at"
)
_D_WIDTH = _D.count(",") + 1
_A_WIDTH = _A.count(",") + 1


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """One row of `deliveries` (columns in `_D` order)."""

    id: uuid.UUID
    message_id: uuid.UUID
    position: int
    channel: str
    recipient_hash: str
    recipient_encrypted: str | None
    derived_key: str
    status: str
    reason: str | None
    provider: str | None
    provider_message_id: str | None
    category: str
    topic: str | None
    priority_rank: int
    expires_at: dt.datetime | None
    attempts: int
    next_attempt_at: dt.datetime | None
    last_error: str | None
    suppression_id: uuid.UUID | None
    created_at: dt.datetime
    updated_at: dt.datetime
    deferred_since: dt.datetime | None

    @property
    def priority(self) -> str:
        """The priority's name (`high`, `normal`, `low`)."""
        return st.RANK_PRIORITY.get(self.priority_rank, "normal")


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One row of `attempts` (columns in `_A` order)."""

    id: uuid.UUID
    delivery_id: uuid.UUID
    number: int
    status: str
    provider: str
    provider_message_id: str | None
    provider_status: str | None
    error_code: str | None
    error_message: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One row of `messages` (columns in `_M` order)."""

    id: uuid.UUID
    client_id: uuid.UUID
    idempotency_key: str
    fingerprint: str
    state: str
    channel: str
    category: str
    topic: str | None
    priority: str
    expires_at: dt.datetime | None
    content_encrypted: str | None
    metadata: dict[str, Any]
    response_code: int | None
    first_answers: list[dict[str, Any]] | None
    created_at: dt.datetime
    completed_at: dt.datetime | None


def _delivery(record: Any, offset: int = 0) -> DeliveryRow:
    return DeliveryRow(*tuple(record)[offset : offset + _D_WIDTH])


def _attempt(record: Any, offset: int = 0) -> AttemptRow:
    return AttemptRow(*tuple(record)[offset : offset + _A_WIDTH])


# -- the send claim ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewMessage:
    """The `messages` row a send request claims."""

    id: uuid.UUID
    client_id: uuid.UUID
    idempotency_key: str
    fingerprint: str
    channel: str
    category: str
    topic: str | None
    priority: str
    expires_at: dt.datetime | None
    content_encrypted: str
    metadata: dict[str, Any]
    # Stored on each delivery: what the reputation guard counts it under.
    sender_identity: str | None = None


@dataclass(frozen=True, slots=True)
class NewDelivery:
    """A delivery of a message being claimed.

    `status` is `sending` (the first attempt `attempt_id` is written `in_progress` with it)
    or `queued` (not called yet: `reason` says why, `next_attempt_at` when the worker takes
    it). The claim makes it `suppressed` instead when an entry stops its recipient.
    """

    id: uuid.UUID
    position: int
    recipient_hash: str
    recipient_encrypted: str
    derived_key: str
    status: str
    reason: str | None = None
    provider: str | None = None
    attempt_id: uuid.UUID | None = None
    next_attempt_at: dt.datetime | None = None


# (status, reason, suppression scope) of each delivery a claim wrote, by delivery id.
Verdicts = dict[uuid.UUID, tuple[str, str | None, str | None]]


@dataclass(frozen=True, slots=True)
class Claim:
    """One send request's claim for `claim_many`: its message and deliveries.

    `complete` (asynchronous acceptance, every delivery `queued`): the message is stored
    `completed` at once with status code 202 and its first answers (each delivery `queued`
    or `suppressed`), so a replay returns the same answer and nothing else has to be written
    before it is given. Otherwise the message is `in_progress` until `record` completes it.
    """

    message: NewMessage
    deliveries: Sequence[NewDelivery]
    priority_rank: int
    now: dt.datetime
    request_id: str | None = None
    complete: bool = False


_VERDICT = suppression.verdict_sql(
    channel="mu.channel",
    address_hash="u.hash",
    scopes=f"ARRAY['{suppression.SCOPE_ALL}', mu.topic_scope]",
    now="mu.at",
)

# Several send requests' claims in one statement. A message whose (client, Idempotency-Key)
# exists already (or repeats an earlier one of the same statement) inserts nothing, and
# neither its deliveries nor their attempts are written. Messages are inserted in key order,
# so two statements waiting on each other's keys cannot deadlock.
_CLAIM_MANY = f"""
WITH mu AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[],
        $6::text[], $7::text[], $8::text[], $9::timestamptz[], $10::text[], $11::text[],
        $12::timestamptz[], $13::int2[], $14::text[], $15::text[], $16::text[], $17::bool[])
        WITH ORDINALITY AS mu(id, client_id, idempotency_key, fingerprint, channel, category,
            topic, priority, expires_at, content, metadata, at, rank, request_id, identity,
            topic_scope, complete, ord)
), du AS (
    SELECT u.*, mu.id AS message_id, s.id AS sid, s.reason AS sreason, s.scope AS sscope
    FROM unnest($18::int8[], $19::uuid[], $20::int2[], $21::text[], $22::text[], $23::text[],
        $24::text[], $25::text[], $26::text[], $27::uuid[], $28::timestamptz[])
        AS u(ord, id, position, hash, enc, key, status, reason, provider, aid, next_at)
    JOIN mu ON mu.ord = u.ord
    LEFT JOIN LATERAL ({_VERDICT}) AS s ON true
), m AS (
    INSERT INTO messages (id, client_id, idempotency_key, fingerprint, state, channel,
        category, topic, priority, expires_at, content_encrypted, metadata, created_at,
        request_id, response_code, completed_at, first_answers)
    SELECT mu.id, mu.client_id, mu.idempotency_key, mu.fingerprint,
        CASE WHEN mu.complete THEN 'completed' ELSE 'in_progress' END, mu.channel,
        mu.category, mu.topic, mu.priority, mu.expires_at, mu.content, mu.metadata::jsonb,
        mu.at, mu.request_id,
        CASE WHEN mu.complete THEN 202 END,
        CASE WHEN mu.complete THEN mu.at END,
        CASE WHEN mu.complete THEN (SELECT jsonb_agg(jsonb_build_object('id', du.id,
            'status', CASE WHEN du.sid IS NULL THEN du.status ELSE 'suppressed' END,
            'reason', CASE WHEN du.sid IS NULL THEN du.reason ELSE du.sreason END)
            ORDER BY du.position) FROM du WHERE du.ord = mu.ord) END
    FROM mu ORDER BY mu.client_id, mu.idempotency_key
    ON CONFLICT ON CONSTRAINT uq_messages_client_idempotency_key DO NOTHING
    RETURNING id
), d AS (
    INSERT INTO deliveries (id, message_id, position, channel, recipient_hash,
        recipient_encrypted, derived_key, status, reason, suppression_id, provider,
        category, topic, priority_rank, expires_at, attempts, next_attempt_at,
        created_at, updated_at, deferred_since, sender_identity)
    SELECT du.id, du.message_id, du.position, mu.channel, du.hash, du.enc, du.key,
        CASE WHEN du.sid IS NULL THEN du.status ELSE 'suppressed' END,
        CASE WHEN du.sid IS NULL THEN du.reason ELSE du.sreason END,
        du.sid,
        CASE WHEN du.sid IS NULL THEN du.provider END,
        mu.category, mu.topic, mu.rank, mu.expires_at,
        CASE WHEN du.sid IS NULL AND du.aid IS NOT NULL THEN 1 ELSE 0 END,
        CASE WHEN du.sid IS NULL THEN du.next_at END,
        mu.at, mu.at,
        CASE WHEN du.sid IS NULL AND du.status = 'queued' THEN mu.at END,
        mu.identity
    FROM du JOIN mu ON mu.ord = du.ord JOIN m ON m.id = du.message_id
    RETURNING id, status, reason
), a AS (
    INSERT INTO attempts (id, delivery_id, number, status, provider, started_at, request_id)
    SELECT du.aid, du.id, 1, 'in_progress', du.provider, mu.at, mu.request_id
    FROM du JOIN mu ON mu.ord = du.ord JOIN m ON m.id = du.message_id
    WHERE du.aid IS NOT NULL AND du.sid IS NULL
    RETURNING 1
)
SELECT du.ord, d.id, d.status, d.reason, du.sscope, (SELECT count(*) FROM a)
FROM d JOIN du ON du.id = d.id
"""


async def claim_many(conn: Pg, claims: Sequence[Claim]) -> list[Verdicts | None]:
    """Check the suppression list and insert several send requests' messages, their
    deliveries and their first attempts, in one statement (one snapshot: an entry committed
    before it counts; one round trip and one commit for all of them).

    A delivery is `sending` with its first attempt `in_progress` (`attempt_id` set), or
    `queued` (not called yet); the claim makes it `suppressed` instead, with no attempt, when
    an entry stops its recipient. Returns, in the order of `claims`, each one's verdicts
    (status, reason, suppression scope per delivery), or None when its (client,
    Idempotency-Key) existed already (or an earlier claim of the same call had it): nothing
    of it was written. `request_id` (the HTTP request's id) is stored on the message and its
    first attempts.
    """
    messages = [c.message for c in claims]
    news = [d for c in claims for d in c.deliveries]
    rows = await conn.fetch(
        _CLAIM_MANY,
        [m.id for m in messages],
        [m.client_id for m in messages],
        [m.idempotency_key for m in messages],
        [m.fingerprint for m in messages],
        [m.channel for m in messages],
        [m.category for m in messages],
        [m.topic for m in messages],
        [m.priority for m in messages],
        [m.expires_at for m in messages],
        [m.content_encrypted for m in messages],
        [jsonb(m.metadata) for m in messages],
        [c.now for c in claims],
        [c.priority_rank for c in claims],
        [c.request_id for c in claims],
        [m.sender_identity for m in messages],
        [suppression.topic_scope(m.category, m.topic) for m in messages],
        [c.complete for c in claims],
        [i for i, c in enumerate(claims, 1) for _ in c.deliveries],
        [d.id for d in news],
        [d.position for d in news],
        [d.recipient_hash for d in news],
        [d.recipient_encrypted for d in news],
        [d.derived_key for d in news],
        [d.status for d in news],
        [d.reason for d in news],
        [d.provider for d in news],
        [d.attempt_id for d in news],
        [d.next_attempt_at for d in news],
    )
    found: list[Verdicts | None] = [None] * len(claims)
    for r in rows:
        verdicts = found[r[0] - 1]
        if verdicts is None:
            verdicts = found[r[0] - 1] = {}
        verdicts[r[1]] = (r[2], r[3], r[4])
    return found


async def message_by_key(conn: Pg, client_id: uuid.UUID, key: str) -> MessageRow | None:
    """The message of an (API key, Idempotency-Key) pair."""
    row = await conn.fetchrow(
        f"SELECT {_M} FROM messages m WHERE m.client_id = $1 AND m.idempotency_key = $2",
        client_id,
        key,
    )
    return MessageRow(*row) if row is not None else None


async def message(conn: Pg, message_id: uuid.UUID) -> MessageRow | None:
    """One message by id."""
    row = await conn.fetchrow(f"SELECT {_M} FROM messages m WHERE m.id = $1", message_id)
    return MessageRow(*row) if row is not None else None


async def deliveries_of(
    conn: Pg, message_id: uuid.UUID, *, limit: int | None = None
) -> list[DeliveryRow]:
    """The deliveries of a message in request order (the first `limit` of them)."""
    rows = await conn.fetch(
        f"SELECT {_D} FROM deliveries d WHERE d.message_id = $1 ORDER BY d.position, d.created_at "
        "LIMIT $2",
        message_id,
        limit,
    )
    return [_delivery(r) for r in rows]


async def attempts_of(conn: Pg, delivery_ids: Sequence[uuid.UUID]) -> list[AttemptRow]:
    """Every attempt of these deliveries, oldest first."""
    rows = await conn.fetch(
        f"SELECT {_A} FROM attempts a WHERE a.delivery_id = ANY($1::uuid[]) "
        "ORDER BY a.started_at, a.number",
        list(delivery_ids),
    )
    return [_attempt(r) for r in rows]


# -- recording outcomes -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one provider call did, and what it makes of its delivery.

    The attempt always gets `attempt_status` and the provider fields (a callback that
    settled the attempt first keeps its provider id and status). The delivery gets
    `status`, `reason`, `last_error` (None keeps the old one) and `next_attempt_at` only
    while this is its latest attempt and it is still in one of our own in-flight states
    (`sending`, `unknown`): a provider callback that got there first is the truth.
    """

    attempt_id: uuid.UUID
    delivery_id: uuid.UUID
    number: int
    attempt_status: str
    provider_message_id: str | None
    provider_status: str | None
    error_code: str | None
    error_message: str | None
    status: str
    reason: str | None
    last_error: str | None
    next_attempt_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What `record` changed and what the message's deliveries look like now."""

    # The status this record set on each delivery whose status it set (the others had
    # moved on already).
    settled: Mapping[uuid.UUID, str]
    # Deliveries that have feedback parked for them (`note_parked`), to be applied now.
    parked: frozenset[uuid.UUID]
    # Every delivery of the message (id, status, reason) in request order, when completing.
    answers: list[tuple[uuid.UUID, str, str | None]]
    # The status code stored on the message by this record; None when another request had
    # completed it first (or no message was completed).
    response_code: int | None
    # Of the deliveries `begin_first_attempts` was asked to start in the same transaction,
    # those whose attempt it wrote (filled in by the caller).
    begun: frozenset[uuid.UUID] = frozenset()


_DEFERRED_SQL = "'" + "','".join(sorted(st.DEFERRED)) + "'"

_RECORD = f"""
WITH r AS (
    SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::int[], $5::text[], $6::text[],
        $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
        $13::timestamptz[])
        AS r(aid, did, number, astatus, pmid, pstatus, ecode, emsg, status, reason,
             last_error, next_at)
), a AS (
    UPDATE attempts x SET
        status = r.astatus,
        finished_at = $1,
        provider_message_id = COALESCE(NULLIF(x.provider_message_id, ''), r.pmid),
        provider_status = CASE WHEN r.pstatus IS NULL THEN x.provider_status
            ELSE COALESCE(NULLIF(x.provider_status, ''), r.pstatus) END,
        error_code = r.ecode,
        error_message = r.emsg
    FROM r WHERE x.id = r.aid
    RETURNING x.id
), d AS (
    UPDATE deliveries x SET
        status = r.status,
        reason = r.reason,
        last_error = COALESCE(r.last_error, x.last_error),
        next_attempt_at = r.next_at,
        provider_message_id = COALESCE(x.provider_message_id, r.pmid),
        parked_feedback = false,
        deferred_since = CASE WHEN r.status = 'queued' THEN COALESCE(x.deferred_since, $1) END,
        updated_at = $1
    FROM r
    WHERE x.id = r.did AND x.status IN ('sending', 'unknown')
      AND r.number = (SELECT max(number) FROM attempts WHERE delivery_id = x.id)
    RETURNING x.id, x.position, x.created_at, x.status, x.reason,
        (SELECT parked_feedback FROM deliveries p WHERE p.id = x.id) AS parked
), cur AS (
    SELECT x.id, x.position, x.created_at,
        COALESCE(d.status, x.status) AS status,
        CASE WHEN d.id IS NULL THEN x.reason ELSE d.reason END AS reason
    FROM deliveries x LEFT JOIN d ON d.id = x.id
    WHERE x.message_id = $14
), m AS (
    UPDATE messages SET
        state = 'completed',
        completed_at = $1,
        response_code = (SELECT CASE WHEN bool_or(status IN ({_DEFERRED_SQL}))
            THEN 202 ELSE 201 END FROM cur),
        first_answers = (SELECT jsonb_agg(jsonb_build_object(
            'id', id, 'status', status, 'reason', reason) ORDER BY position, created_at)
            FROM cur)
    WHERE id = $14 AND state <> 'completed'
    RETURNING response_code
)
SELECT 'd' AS kind, d.id, d.status, d.reason, d.parked, NULL::int AS code,
    d.position, d.created_at FROM d
UNION ALL
SELECT 'c', cur.id, cur.status, cur.reason, NULL, NULL, cur.position, cur.created_at FROM cur
UNION ALL
SELECT 'm', NULL, NULL, NULL, NULL, m.response_code, NULL, NULL FROM m
UNION ALL
SELECT 'a', NULL, NULL, NULL, NULL, (SELECT count(*) FROM a)::int, NULL, NULL
ORDER BY 1, 7, 8
"""


async def record(
    conn: Pg,
    outcomes: Sequence[Outcome],
    *,
    now: dt.datetime,
    complete: uuid.UUID | None = None,
) -> Recorded:
    """Record provider outcomes, and complete message `complete` with the first answers.

    One statement: the attempts, the deliveries (see `Outcome`), and the message's state,
    status code (202 when any delivery is still deferred, else 201) and first answers.
    """
    o = outcomes
    rows = await conn.fetch(
        _RECORD,
        now,
        [x.attempt_id for x in o],
        [x.delivery_id for x in o],
        [x.number for x in o],
        [x.attempt_status for x in o],
        [x.provider_message_id for x in o],
        [x.provider_status for x in o],
        [x.error_code for x in o],
        [x.error_message for x in o],
        [x.status for x in o],
        [x.reason for x in o],
        [x.last_error for x in o],
        [x.next_attempt_at for x in o],
        complete,
    )
    parked: set[uuid.UUID] = set()
    answers: list[tuple[uuid.UUID, str, str | None]] = []
    settled: dict[uuid.UUID, str] = {}
    code: int | None = None
    for row in rows:
        kind = row["kind"]
        if kind == "d":
            settled[row["id"]] = row["status"]
            if row["parked"]:
                parked.add(row["id"])
        elif kind == "c":
            answers.append((row["id"], row["status"], row["reason"]))
        elif kind == "m":
            code = row["code"]
    return Recorded(settled, frozenset(parked), answers, code)


# -- the worker's dispatch --------------------------------------------------------------------


async def for_dispatch(
    conn: Pg, delivery_id: uuid.UUID
) -> tuple[DeliveryRow, str | None, str | None] | None:
    """A delivery, its message's encrypted content and the id of the request that created
    it (no lock)."""
    row = await conn.fetchrow(
        f"SELECT {_D}, m.content_encrypted, m.request_id FROM deliveries d "
        "JOIN messages m ON m.id = d.message_id WHERE d.id = $1",
        delivery_id,
    )
    if row is None:
        return None
    return _delivery(row), row["content_encrypted"], row["request_id"]


_DISPATCH_VERDICT = suppression.verdict_sql(
    channel="d.channel",
    address_hash="d.recipient_hash",
    scopes=suppression.scopes_sql(category="d.category", topic="d.topic"),
    now="$2",
)


@dataclass(frozen=True, slots=True)
class Dispatchable:
    """What a dispatch reads before it calls: the delivery, its message's encrypted content,
    the id of the request that created it, and the suppression entry that stops it now
    (id, reason, scope), if any."""

    delivery: DeliveryRow
    content_encrypted: str | None
    request_id: str | None
    hit: tuple[uuid.UUID, str, str] | None


async def dispatchable(conn: Pg, delivery_id: uuid.UUID, now: dt.datetime) -> Dispatchable | None:
    """`for_dispatch` with the suppression check as of `now` taken in the same statement
    (one round trip instead of two; no lock)."""
    row = await conn.fetchrow(
        f"SELECT {_D}, m.content_encrypted, m.request_id, s.id, s.reason, s.scope "
        "FROM deliveries d JOIN messages m ON m.id = d.message_id "
        f"LEFT JOIN LATERAL ({_DISPATCH_VERDICT}) AS s ON true WHERE d.id = $1",
        delivery_id,
        now,
    )
    if row is None:
        return None
    hit = (row[_D_WIDTH + 2], row[_D_WIDTH + 3], row[_D_WIDTH + 4])
    return Dispatchable(
        _delivery(row), row[_D_WIDTH], row[_D_WIDTH + 1], hit if hit[0] is not None else None
    )


_BEGIN_ATTEMPT = """
WITH d AS (
    UPDATE deliveries SET status = 'sending', attempts = attempts + 1, provider = $3,
        next_attempt_at = NULL, updated_at = $4
    WHERE id = $1 AND status = $5 AND attempts = $6
      AND NOT EXISTS (SELECT 1 FROM attempts WHERE delivery_id = $1 AND status = 'in_progress')
    RETURNING id
)
INSERT INTO attempts (id, delivery_id, number, status, provider, started_at, request_id)
SELECT $2, d.id,
    (SELECT coalesce(max(number), 0) + 1 FROM attempts WHERE delivery_id = $1),
    'in_progress', $3, $4, $7
FROM d
RETURNING number
"""


async def begin_attempt(
    conn: Pg,
    delivery: DeliveryRow,
    *,
    attempt_id: uuid.UUID,
    provider: str,
    now: dt.datetime,
    request_id: str | None = None,
) -> int | None:
    """Write the attempt `in_progress` and the delivery `sending`, if nobody changed it.

    The delivery must still have the status and attempt count it was read with, and no call
    in flight (the partial unique index backs this up). Returns the attempt number, or None
    when another dispatcher or a callback got there first. `request_id`: the id of the
    request that created the delivery, kept on the attempt.
    """
    number: int | None = await conn.fetchval(
        _BEGIN_ATTEMPT,
        delivery.id,
        attempt_id,
        provider,
        now,
        delivery.status,
        delivery.attempts,
        request_id,
    )
    return number


_BEGIN_FIRST = """
WITH d AS (
    UPDATE deliveries x SET status = 'sending', attempts = 1, provider = u.provider,
        next_attempt_at = NULL, updated_at = $4
    FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS u(id, aid, provider)
    WHERE x.id = u.id AND x.status = 'queued' AND x.attempts = 0
      AND x.next_attempt_at IS NOT NULL
    RETURNING x.id, u.aid, u.provider
)
INSERT INTO attempts (id, delivery_id, number, status, provider, started_at, request_id)
SELECT d.aid, d.id,
    (SELECT coalesce(max(number), 0) + 1 FROM attempts WHERE delivery_id = d.id),
    'in_progress', d.provider, $4, $5
FROM d
RETURNING delivery_id
"""


async def begin_first_attempts(
    conn: Pg,
    items: Sequence[tuple[uuid.UUID, uuid.UUID, str]],
    *,
    now: dt.datetime,
    request_id: str | None = None,
) -> list[uuid.UUID]:
    """Write the first attempts `in_progress` of deliveries a send request claimed `queued`
    (later waves of one request): (delivery id, attempt id, provider) each. Only those still
    untouched (`queued`, no attempt, not claimed by a worker) are started; their ids are
    returned."""
    rows = await conn.fetch(
        _BEGIN_FIRST,
        [i[0] for i in items],
        [i[1] for i in items],
        [i[2] for i in items],
        now,
        request_id,
    )
    return [r[0] for r in rows]


async def status_of(conn: Pg, delivery_id: uuid.UUID) -> str | None:
    """A delivery's current status."""
    value: str | None = await conn.fetchval(
        "SELECT status FROM deliveries WHERE id = $1", delivery_id
    )
    return value


async def statuses(conn: Pg, delivery_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Current statuses of several deliveries (missing ones are left out)."""
    rows = await conn.fetch(
        "SELECT id, status FROM deliveries WHERE id = ANY($1::uuid[])", list(delivery_ids)
    )
    return {r["id"]: r["status"] for r in rows}


async def finish_unsent(
    conn: Pg,
    delivery_id: uuid.UUID,
    *,
    expected: str,
    status: str,
    reason: str | None,
    now: dt.datetime,
    suppression_id: uuid.UUID | None = None,
) -> bool:
    """Give a delivery that will not be sent a final status (suppressed, failed), if it
    still has status `expected`; False when it changed meanwhile."""
    done = await conn.fetchval(
        "UPDATE deliveries SET status = $3, reason = $4, suppression_id = $5, "
        "next_attempt_at = NULL, updated_at = $6 WHERE id = $1 AND status = $2 RETURNING 1",
        delivery_id,
        expected,
        status,
        reason,
        suppression_id,
        now,
    )
    return bool(done)


async def defer(
    conn: Pg, delivery_id: uuid.UUID, *, at: dt.datetime, reason: str, now: dt.datetime
) -> str | None:
    """Put a dispatchable delivery back as `queued` until `at` without counting an attempt.

    Returns the resulting status (the current one when it was not dispatchable anymore).
    """
    row = await conn.fetchrow(
        "WITH u AS (UPDATE deliveries SET status = 'queued', next_attempt_at = $2, "
        "reason = $3, updated_at = $4, deferred_since = COALESCE(deferred_since, $4) "
        "WHERE id = $1 AND status = ANY($5::text[]) "
        "RETURNING status) "
        "SELECT (SELECT status FROM u) AS new, (SELECT status FROM deliveries WHERE id = $1) "
        "AS old",
        delivery_id,
        at,
        reason,
        now,
        sorted(st.DISPATCHABLE),
    )
    value: str | None = row["new"] or row["old"]
    return value


# -- the retry queue (retry.queue.DeliveryQueue) --------------------------------------------


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A delivery the worker claimed (satisfies `retry.queue.Due`)."""

    id: uuid.UUID
    token: str
    due_at: dt.datetime
    priority_rank: int
    priority: str
    channel: str
    transactional: bool
    expires_at: dt.datetime | None
    attempts: int
    outcome_unknown: bool
    held_to_budget: bool
    deferred_since: dt.datetime | None = None


_CLAIMABLE = sorted(st.DISPATCHABLE)

_CLAIM_DUE = """
WITH due AS (
    SELECT id, status, next_attempt_at FROM deliveries
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= $1
      AND status = ANY($3::text[]) AND priority_rank BETWEEN $4 AND $5
    ORDER BY priority_rank DESC, next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE deliveries d SET next_attempt_at = NULL, updated_at = $1
FROM due WHERE d.id = due.id
RETURNING d.id, due.status, due.next_attempt_at, d.priority_rank, d.channel, d.category,
    d.expires_at, d.attempts, d.deferred_since
"""


def _due(row: Any) -> DueDelivery:
    status = row["status"]
    return DueDelivery(
        id=row["id"],
        token=status,
        due_at=row["next_attempt_at"],
        priority_rank=row["priority_rank"],
        priority=st.RANK_PRIORITY.get(row["priority_rank"], "normal"),
        channel=row["channel"],
        transactional=row["category"] == "transactional",
        expires_at=row["expires_at"],
        attempts=row["attempts"],
        outcome_unknown=status == st.UNKNOWN,
        # New, redriven, deferred (no token, open circuit) or paused by an account-level
        # error: `queued`, not held to the attempt budget (only to the deadline).
        held_to_budget=status != st.QUEUED,
        deferred_since=row["deferred_since"],
    )


async def claim_due(
    conn: Pg, *, limit: int, now: dt.datetime, min_rank: int = 0, max_rank: int = 2
) -> list[DueDelivery]:
    """Take up to `limit` due deliveries with a priority rank in [`min_rank`, `max_rank`]
    off the queue (highest priority, oldest due first; the worker's lanes choose the ranks).

    `FOR UPDATE SKIP LOCKED`: concurrent workers never claim the same row. The status stays,
    so the dispatch still sees a dispatchable delivery. The range scan of `ix_deliveries_due`
    (priority_rank DESC, next_attempt_at) starts at the highest rank asked for and stops after
    `limit` rows, whatever the backlog of lower ranks.
    """
    rows = await conn.fetch(_CLAIM_DUE, now, limit, _CLAIMABLE, min_rank, max_rank)
    return sorted((_due(r) for r in rows), key=lambda d: (-d.priority_rank, d.due_at))


_QUEUE_STATS = """
SELECT channel, status, count(*) AS depth,
    min(next_attempt_at) FILTER (WHERE next_attempt_at <= $1) AS oldest_due
FROM deliveries
WHERE next_attempt_at IS NOT NULL AND status = ANY($2::text[])
GROUP BY channel, status
"""


async def queue_stats(
    conn: Pg, *, now: dt.datetime
) -> list[tuple[str, str, int, dt.datetime | None]]:
    """The retry queue as `/metrics` reports it: (channel, status, deliveries waiting, the
    oldest due time among them or None) per channel and status. One statement over the
    partial index of scheduled deliveries."""
    rows = await conn.fetch(_QUEUE_STATS, now, _CLAIMABLE)
    return [(r["channel"], r["status"], r["depth"], r["oldest_due"]) for r in rows]


async def release(conn: Pg, items: Sequence[Due]) -> None:
    """Put claimed, never-dispatched deliveries back exactly as they were."""
    await conn.execute(
        "UPDATE deliveries d SET next_attempt_at = u.due FROM unnest($1::uuid[], $2::text[], "
        "$3::timestamptz[]) AS u(id, status, due) WHERE d.id = u.id AND d.status = u.status "
        "AND d.next_attempt_at IS NULL",
        [i.id for i in items],
        [i.token for i in items],
        [i.due_at for i in items],
    )


async def requeue_undispatched(
    conn: Pg, item: Due, *, at: dt.datetime, error: str, now: dt.datetime
) -> None:
    """A claimed delivery whose dispatch raised before any attempt: due again at `at`."""
    await conn.execute(
        "UPDATE deliveries SET next_attempt_at = $3, last_error = $4, updated_at = $5 "
        "WHERE id = $1 AND status = $2 AND next_attempt_at IS NULL",
        item.id,
        item.token,
        at,
        error,
        now,
    )


async def schedule(
    conn: Pg,
    delivery_id: uuid.UUID,
    *,
    at: dt.datetime,
    status: str = st.RETRYING,
    reason: str | None = None,
    last_error: str | None = None,
    now: dt.datetime,
) -> None:
    """Put a delivery on the queue with `status`; the worker picks it up at `at`."""
    await conn.execute(
        "UPDATE deliveries SET status = $2, next_attempt_at = $3, reason = COALESCE($4, reason), "
        "last_error = COALESCE($5, last_error), updated_at = $6 WHERE id = $1",
        delivery_id,
        status,
        at,
        reason,
        last_error,
        now,
    )


async def unschedule(conn: Pg, delivery_id: uuid.UUID) -> None:
    """Take a delivery off the queue (a late provider callback showed it was sent)."""
    await conn.execute("UPDATE deliveries SET next_attempt_at = NULL WHERE id = $1", delivery_id)


_OWN = sorted(st.DEFERRED)

_SWEEP_ATTEMPTS = """
WITH stale AS (
    UPDATE attempts SET status = 'unknown', finished_at = $1,
        error_message = 'no outcome recorded (process stopped during the call?)'
    WHERE status = 'in_progress' AND started_at < $2
    RETURNING delivery_id
), d AS (
    UPDATE deliveries SET status = 'unknown', next_attempt_at = $3,
        last_error = 'outcome unknown: the attempt was left in progress', updated_at = $1
    WHERE id IN (SELECT delivery_id FROM stale) AND status = ANY($4::text[])
    RETURNING id
)
SELECT (SELECT count(*) FROM stale) + 0 * (SELECT count(*) FROM d)
"""

_SWEEP_CLAIMS = """
WITH untouched AS (
    UPDATE deliveries d SET next_attempt_at = $1, updated_at = $1
    WHERE d.status = ANY($4::text[]) AND d.next_attempt_at IS NULL AND d.updated_at < $2
      AND NOT EXISTS (SELECT 1 FROM attempts a
                      WHERE a.delivery_id = d.id AND a.status = 'in_progress')
    RETURNING d.id
), unrecorded AS (
    UPDATE deliveries d SET status = 'unknown', next_attempt_at = $3,
        last_error = 'outcome unknown: an attempt finished but was never recorded',
        updated_at = $1
    WHERE d.status = 'sending' AND d.updated_at < $2
      AND NOT EXISTS (SELECT 1 FROM attempts a
                      WHERE a.delivery_id = d.id AND a.status = 'in_progress')
    RETURNING d.id
)
SELECT (SELECT count(*) FROM untouched), (SELECT count(*) FROM unrecorded)
"""


async def sweep_stale(
    conn: Pg, *, cutoff: dt.datetime, now: dt.datetime, settle_at: dt.datetime
) -> tuple[int, int, int]:
    """Resolve work left half-done by a process that died (see `retry.sweeper`).

    Returns (stale attempts made `unknown`, abandoned claims requeued, deliveries left
    `sending` without a call in flight made `unknown`).
    """
    async with conn.transaction():
        stale = await conn.fetchval(_SWEEP_ATTEMPTS, now, cutoff, settle_at, _OWN)
        row = await conn.fetchrow(_SWEEP_CLAIMS, now, cutoff, settle_at, _CLAIMABLE)
    return int(stale), int(row[0]), int(row[1])


# -- dead letters -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dead:
    """A delivery just marked `dead`: what its dead-letter entry copies."""

    delivery_id: uuid.UUID
    channel: str
    last_error: str | None
    history: list[dict[str, Any]]


async def mark_dead(
    conn: Pg,
    delivery_id: uuid.UUID,
    *,
    reason: str,
    last_error: str | None,
    now: dt.datetime,
) -> Dead | None:
    """Mark a delivery `dead` (off the queue) and return what its dead-letter entry keeps.

    None when there is no such delivery. `last_error` None keeps the delivery's own.
    """
    row = await conn.fetchrow(
        "UPDATE deliveries SET status = 'dead', reason = $2, next_attempt_at = NULL, "
        "last_error = COALESCE($3, last_error), updated_at = $4 WHERE id = $1 "
        "RETURNING channel, last_error",
        delivery_id,
        reason,
        last_error,
        now,
    )
    if row is None:
        return None
    history = [attempt_json(a) for a in await attempts_of(conn, [delivery_id])]
    return Dead(delivery_id, row["channel"], row["last_error"], history)


def attempt_json(a: AttemptRow) -> dict[str, Any]:
    """An attempt as a JSON-ready dict (the dead-letter entry's history format)."""
    return {
        "number": a.number,
        "status": a.status,
        "provider": a.provider,
        "provider_message_id": a.provider_message_id,
        "provider_status": a.provider_status,
        "error_code": a.error_code,
        "error": a.error_message,
        "started_at": a.started_at.isoformat() if a.started_at else None,
        "finished_at": a.finished_at.isoformat() if a.finished_at else None,
    }


async def requeue_dead(
    conn: Pg, delivery_ids: Sequence[uuid.UUID], *, now: dt.datetime
) -> list[uuid.UUID]:
    """Redrive: put `dead` deliveries back as `queued`, due now, with a fresh attempt
    budget (the attempt rows stay as history). Returns the ids that were requeued: dead ones
    whose deadline has not passed (an expired one would only expire again at once)."""
    rows = await conn.fetch(
        "UPDATE deliveries SET status = 'queued', attempts = 0, next_attempt_at = $2, "
        "reason = NULL, updated_at = $2, deferred_since = NULL "
        "WHERE id = ANY($1::uuid[]) AND status = 'dead' "
        "AND (expires_at IS NULL OR expires_at > $2) RETURNING id",
        list(delivery_ids),
        now,
    )
    return [r["id"] for r in rows]


async def dead_ids(conn: Pg, delivery_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these deliveries are `dead` (may be redriven)."""
    rows = await conn.fetch(
        "SELECT id FROM deliveries WHERE id = ANY($1::uuid[]) AND status = 'dead'",
        list(delivery_ids),
    )
    return {r["id"] for r in rows}


# -- feedback ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Located:
    """A delivery found for a provider event, with the attempt it is about (if known).

    `attempts` is filled when the look-up went by delivery reference (every attempt, oldest
    first); `latest_number` is the delivery's highest attempt number (None: no attempt).
    """

    delivery: DeliveryRow
    attempt: AttemptRow | None
    latest_number: int | None
    attempts: tuple[AttemptRow, ...] = ()


_BY_PMID = f"""
SELECT {_D}, {_A}, (SELECT max(number) FROM attempts WHERE delivery_id = d.id) AS latest
FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
WHERE a.provider_message_id = $1
"""

_DELIVERY_BY_PMID = f"""
SELECT {_D}, (SELECT max(number) FROM attempts WHERE delivery_id = d.id) AS latest
FROM deliveries d WHERE d.provider_message_id = $1
"""


async def by_provider_id(conn: Pg, pmid: str, *, lock: bool) -> Located | None:
    """The attempt (and its delivery) with this provider message id, else a delivery that
    recorded it. `lock`: FOR UPDATE of both rows (for applying an event)."""
    row = await conn.fetchrow(_BY_PMID + (" FOR UPDATE OF d, a" if lock else ""), pmid)
    if row is not None:
        return Located(_delivery(row), _attempt(row, _D_WIDTH), row["latest"])
    row = await conn.fetchrow(_DELIVERY_BY_PMID + (" FOR UPDATE OF d" if lock else ""), pmid)
    if row is not None:
        return Located(_delivery(row), None, row["latest"])
    return None


def _ref_args(ref: str) -> tuple[uuid.UUID | None, str]:
    try:
        return uuid.UUID(ref), ref[:64]
    except ValueError:
        return None, ref[:64]


async def by_ref(conn: Pg, ref: str, *, lock: bool) -> Located | None:
    """The delivery a payload's reference names (its id: Twilio `d`, the SES tag; or its
    derived key: the SES header) with every attempt. `lock`: FOR UPDATE of all of them."""
    delivery_id, key = _ref_args(ref)
    suffix = " FOR UPDATE" if lock else ""
    row = await conn.fetchrow(
        f"SELECT {_D} FROM deliveries d WHERE d.id = $1 OR d.derived_key = $2 LIMIT 1{suffix}",
        delivery_id,
        key,
    )
    if row is None:
        return None
    delivery = _delivery(row)
    rows = await conn.fetch(
        f"SELECT {_A} FROM attempts a WHERE a.delivery_id = $1 ORDER BY a.number{suffix}",
        delivery.id,
    )
    attempts = tuple(_attempt(r) for r in rows)
    latest = attempts[-1].number if attempts else None
    return Located(delivery, attempts[-1] if attempts else None, latest, attempts)


async def settle_attempt(
    conn: Pg, attempt_id: uuid.UUID, delivery_id: uuid.UUID, pmid: str
) -> None:
    """A callback carrying our key proved an `unknown` attempt went out: `accepted` with the
    provider's id (also on the delivery when it has none yet)."""
    await conn.execute(
        "WITH a AS (UPDATE attempts SET status = 'accepted', provider_message_id = $3 "
        "WHERE id = $1 RETURNING 1) "
        "UPDATE deliveries SET provider_message_id = COALESCE(provider_message_id, $3) "
        "WHERE id = $2",
        attempt_id,
        delivery_id,
        pmid,
    )


@dataclass(frozen=True, slots=True)
class Advance:
    """What an applied provider event changes (see `apply_feedback`)."""

    delivery_id: uuid.UUID
    attempt_id: uuid.UUID | None = None
    # The attempt's provider-side state and, for failures, its error code.
    attempt_state: str | None = None
    error_code: str | None = None
    # The delivery's new status (None: unchanged) with reason and last error; `queued`
    # (an account-level failure reported by feedback) starts the deferral clock.
    status: str | None = None
    reason: str | None = None
    set_reason: bool = False
    last_error: str | None = None
    # Due again at this time (retry), or taken off the queue (`unschedule`).
    next_attempt_at: dt.datetime | None = None
    unschedule: bool = False


_APPLY = """
WITH a AS (
    UPDATE attempts SET provider_status = $3, error_code = COALESCE($4, error_code)
    WHERE id = $2 RETURNING 1
)
UPDATE deliveries SET
    status = COALESCE($5, status),
    reason = CASE WHEN $6 THEN $7 ELSE reason END,
    last_error = COALESCE($8, last_error),
    next_attempt_at = CASE WHEN $9::timestamptz IS NOT NULL THEN $9
        WHEN $10 THEN NULL ELSE next_attempt_at END,
    deferred_since = CASE WHEN $5::text = 'queued' THEN COALESCE(deferred_since, $11)
        WHEN $5::text IS NOT NULL THEN NULL ELSE deferred_since END,
    updated_at = $11
WHERE id = $1 AND ($5::text IS NOT NULL OR $9::timestamptz IS NOT NULL OR $10)
"""


async def apply_feedback(conn: Pg, change: Advance, *, now: dt.datetime) -> None:
    """Apply the state change of a provider event to its attempt and delivery (one
    statement). The caller holds the row locks (`by_provider_id`/`by_ref` with `lock`)."""
    await conn.execute(
        _APPLY,
        change.delivery_id,
        change.attempt_id,
        change.attempt_state,
        change.error_code,
        change.status,
        change.set_reason,
        change.reason,
        change.last_error,
        change.next_attempt_at,
        change.unschedule,
        now,
    )


async def note_parked(conn: Pg, delivery_id: uuid.UUID) -> None:
    """Feedback for this delivery was parked while its call was in flight: the send path's
    `record` reports it so the parked events are applied right after (no look-up otherwise)."""
    await conn.execute("UPDATE deliveries SET parked_feedback = true WHERE id = $1", delivery_id)


async def known_provider_ids(conn: Pg, pmids: Sequence[str]) -> set[str]:
    """Which of these provider message ids an attempt or a delivery has recorded."""
    rows = await conn.fetch(
        "SELECT provider_message_id FROM attempts WHERE provider_message_id = ANY($1::text[]) "
        "UNION SELECT provider_message_id FROM deliveries "
        "WHERE provider_message_id = ANY($1::text[])",
        list(pmids),
    )
    return {r[0] for r in rows}


async def without_call_in_flight(conn: Pg, delivery_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these deliveries have no attempt `in_progress`."""
    rows = await conn.fetch(
        "SELECT d.id FROM unnest($1::uuid[]) AS d(id) WHERE NOT EXISTS ("
        "SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.status = 'in_progress')",
        list(delivery_ids),
    )
    return {r[0] for r in rows}


def content_of(plaintext: str | None) -> dict[str, Any]:
    """A message's content from its decrypted JSON (empty when there is none)."""
    return json.loads(plaintext) if plaintext else {}


async def dead_letter(
    conn: Pg,
    delivery_id: uuid.UUID,
    *,
    reason: str,
    last_error: str | None,
    now: dt.datetime,
) -> uuid.UUID | None:
    """Mark the delivery `dead` and file its dead-letter entry (with the attempt history).

    Two statements; run it inside the caller's transaction when it goes with other changes.
    Returns the entry id, None when there is no such delivery.
    """
    dead = await mark_dead(conn, delivery_id, reason=reason, last_error=last_error, now=now)
    if dead is None:
        return None
    return await dlq.file_entry(
        conn,
        delivery_id=delivery_id,
        channel=dead.channel,
        reason=reason,
        last_error=dead.last_error,
        history=dead.history,
        now=now,
    )


# -- campaigns (sender.campaigns) -------------------------------------------------------------


async def insert_campaign_message(conn: Pg, message: NewMessage, *, now: dt.datetime) -> None:
    """The `messages` row holding a campaign's content (its deliveries come by expansion).

    Written `completed`: nothing waits on it the way a send request's row does. Its
    Idempotency-Key is the campaign's own name for it (see `sender.campaigns`)."""
    await conn.execute(
        "INSERT INTO messages (id, client_id, idempotency_key, fingerprint, state, channel, "
        "category, topic, priority, expires_at, content_encrypted, metadata, created_at, "
        "completed_at) VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, $10, $11, $12, "
        "$12)",
        message.id,
        message.client_id,
        message.idempotency_key,
        message.fingerprint,
        message.channel,
        message.category,
        message.topic,
        message.priority,
        message.expires_at,
        message.content_encrypted,
        jsonb(message.metadata),
        now,
    )


def campaign_deliveries_sql(
    *,
    source: str,
    hits: str,
    message_id: str,
    channel: str,
    category: str,
    topic: str,
    priority_rank: str,
    expires_at: str,
    now: str,
) -> str:
    """The INSERT of a batch of campaign deliveries, as a CTE body another statement embeds
    (the expansion in `sender.campaigns`, which takes its recipients and the suppression
    verdicts in the same statement).

    `source` names a relation of (position, hash, enc, key) rows; `hits` one of suppression
    verdicts (address_hash, id, reason). Suppressed recipients get a final `suppressed`
    delivery, the others a `queued` one that is due now, which the retry worker sends. A
    derived key that exists already (a batch expanded twice) inserts nothing. Yields the
    inserted rows' `status`.
    """
    return (
        "INSERT INTO deliveries (id, message_id, position, channel, recipient_hash, "
        "recipient_encrypted, derived_key, status, reason, suppression_id, category, topic, "
        "priority_rank, expires_at, attempts, next_attempt_at, created_at, updated_at) "
        f"SELECT gen_random_uuid(), {message_id}, r.position, {channel}, r.hash, r.enc, r.key, "
        "CASE WHEN h.id IS NULL THEN 'queued' ELSE 'suppressed' END, h.reason, h.id, "
        f"{category}, {topic}, {priority_rank}, {expires_at}, 0, "
        f"CASE WHEN h.id IS NULL THEN {now} END, {now}, {now} "
        f"FROM {source} r LEFT JOIN {hits} h ON h.address_hash = r.hash "
        "ON CONFLICT (derived_key) DO NOTHING RETURNING status"
    )


async def cancel_queued(conn: Pg, message_id: uuid.UUID, *, reason: str, now: dt.datetime) -> int:
    """Make every delivery of the message still `queued` `cancelled` (final, never sent).

    A worker that claimed one already finds it changed when it writes its attempt
    (`begin_attempt` wants the status it read) and sends nothing. Returns how many."""
    result = await conn.execute(
        "UPDATE deliveries SET status = 'cancelled', reason = $2, next_attempt_at = NULL, "
        "updated_at = $3 WHERE message_id = $1 AND status = 'queued'",
        message_id,
        reason,
        now,
    )
    return int(result.rsplit(" ", 1)[-1])


async def message_status_counts(conn: Pg, message_id: uuid.UUID) -> dict[str, int]:
    """How many deliveries of the message are in each status."""
    rows = await conn.fetch(
        "SELECT status, count(*) FROM deliveries WHERE message_id = $1 GROUP BY status",
        message_id,
    )
    return {r[0]: int(r[1]) for r in rows}


_UNFINISHED = sorted(st.DEFERRED)


async def any_unfinished(conn: Pg, message_id: uuid.UUID) -> bool:
    """Whether a delivery of the message is not final yet (queued, sending, unknown,
    retrying)."""
    found = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM deliveries WHERE message_id = $1 "
        "AND status = ANY($2::text[]))",
        message_id,
        _UNFINISHED,
    )
    return bool(found)


# -- the stale report (an operator's reconciliation) -----------------------------------------

# Waiting for a provider's final word: accepted (`sent`), outcome unknown, or a call that
# never recorded its outcome.
STALE_STATUSES: tuple[str, ...] = (st.SENT, st.UNKNOWN, st.SENDING)


@dataclass(frozen=True, slots=True)
class StaleGroup:
    """Deliveries of one provider and status unchanged since before the cutoff."""

    provider: str | None
    status: str
    count: int
    oldest_updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class StaleDelivery:
    """A stale delivery as the report shows it (ids and times; no recipient)."""

    id: uuid.UUID
    message_id: uuid.UUID
    channel: str
    provider: str | None
    status: str
    provider_message_id: str | None
    attempts: int
    created_at: dt.datetime
    updated_at: dt.datetime


async def stale_deliveries(
    conn: Pg, *, before: dt.datetime, limit: int
) -> tuple[list[StaleGroup], list[StaleDelivery]]:
    """Deliveries still `sent`, `unknown` or `sending` whose last change is older than
    `before` (no final callback came): counts per (provider, status) with the oldest, and the
    `limit` oldest deliveries. An operator report, not a hot path: it reads every delivery
    created before the cutoff (the status filter has no index on purpose: one on the send
    path's most updated column would cost every status change)."""
    statuses = list(STALE_STATUSES)
    groups = await conn.fetch(
        "SELECT provider, status, count(*), min(updated_at) FROM deliveries "
        "WHERE status = ANY($1::text[]) AND updated_at < $2 AND created_at < $2 "
        "GROUP BY provider, status ORDER BY provider NULLS LAST, status",
        statuses,
        before,
    )
    rows = await conn.fetch(
        "SELECT id, message_id, channel, provider, status, provider_message_id, attempts, "
        "created_at, updated_at FROM deliveries "
        "WHERE status = ANY($1::text[]) AND updated_at < $2 AND created_at < $2 "
        "ORDER BY updated_at, id LIMIT $3",
        statuses,
        before,
        limit,
    )
    return [StaleGroup(*g) for g in groups], [StaleDelivery(*r) for r in rows]


# -- the reputation guard's counts (sender.reputation decides with them) ----------------------

# One pass over the window's deliveries (BRIN on created_at), grouped per sending identity.
# The attempts of a delivery are looked at only when it ended bounced/complained/failed (the
# LATERAL's condition is a one-time filter per row): their error codes tell SES's own
# suppressions ($2) and Twilio opt-outs ($3) apart. See sender.reputation for what counts.
_IDENTITY_COUNTS = """
SELECT d.sender_identity AS identity, min(d.channel) AS channel,
    count(*) FILTER (WHERE d.provider_message_id IS NOT NULL OR f.opt_out) AS sends,
    count(*) FILTER (WHERE d.channel = 'email' AND d.status = 'bounced'
                      AND NOT f.ses_suppressed)
  + count(*) FILTER (WHERE d.channel = 'sms' AND d.status = 'failed'
                      AND d.provider_message_id IS NOT NULL AND NOT f.opt_out) AS bounces,
    count(*) FILTER (WHERE d.channel = 'email' AND d.status = 'complained'
                      AND NOT f.ses_suppressed)
  + count(*) FILTER (WHERE d.channel = 'sms' AND f.opt_out) AS complaints
FROM deliveries d
CROSS JOIN LATERAL (
    SELECT COALESCE(bool_or(a.error_code = $2), false) AS ses_suppressed,
           COALESCE(bool_or(a.error_code = $3), false) AS opt_out
    FROM attempts a
    WHERE a.delivery_id = d.id AND d.status IN ('bounced', 'complained', 'failed')
) f
WHERE d.created_at >= $1 AND d.sender_identity IS NOT NULL
  AND NOT (d.recipient_hash = ANY($4::text[]))
GROUP BY d.sender_identity
"""


async def identity_counts(
    conn: Pg, *, since: dt.datetime, ses_suppressed: str, opt_out: str, uncounted: Sequence[str]
) -> list[Any]:
    """Per sending identity, over the deliveries created since `since`: `identity`,
    `channel`, `sends`, `bounces` (SMS: failures) and `complaints` (SMS: opt-outs), leaving
    out bounces and complaints whose attempt carries the error code `ses_suppressed`, and
    counting attempts with `opt_out` as SMS opt-outs, and leaving out deliveries to the
    recipient hashes `uncounted` (see sender.reputation)."""
    rows: list[Any] = await conn.fetch(
        _IDENTITY_COUNTS, since, ses_suppressed, opt_out, list(uncounted)
    )
    return rows


# -- operator console reads (gateway.console) ---------------------------------------------------


async def recent_for_recipient(
    conn: Pg,
    channel: str,
    recipient_hash: str,
    *,
    limit: int = 50,
    client_id: uuid.UUID | None = None,
) -> list[DeliveryRow]:
    """The newest deliveries to one recipient (by address hash), newest first; with
    `client_id`, only those of that API key's messages (what a non-admin may see)."""
    rows = await conn.fetch(
        f"SELECT {_D} FROM deliveries d JOIN messages m ON m.id = d.message_id "
        "WHERE d.channel = $1 AND d.recipient_hash = $2 "
        "AND ($3::uuid IS NULL OR m.client_id = $3::uuid) "
        "ORDER BY d.created_at DESC LIMIT $4",
        channel,
        recipient_hash,
        client_id,
        limit,
    )
    return [_delivery(r) for r in rows]


@dataclass(frozen=True, slots=True)
class StatusCount:
    """Deliveries of one channel in one status: created in the short window, in the long one."""

    channel: str
    status: str
    short: int
    long: int


async def status_counts(
    conn: Pg, *, short_since: dt.datetime, long_since: dt.datetime
) -> list[StatusCount]:
    """Deliveries created since `long_since` by channel and current status, with the count of
    those created since `short_since` (one scan for both windows)."""
    rows = await conn.fetch(
        "SELECT channel, status, count(*) FILTER (WHERE created_at >= $1) AS short, "
        "count(*) AS long FROM deliveries WHERE created_at >= $2 GROUP BY channel, status",
        short_since,
        long_since,
    )
    return [StatusCount(r["channel"], r["status"], r["short"], r["long"]) for r in rows]


async def daily_status_counts(
    conn: Pg, *, since: dt.datetime
) -> list[tuple[dt.date, str, str, int]]:
    """(UTC day, channel, status, deliveries created) since `since`, for the overview's charts."""
    rows = await conn.fetch(
        "SELECT (created_at AT TIME ZONE 'UTC')::date AS day, channel, status, count(*) AS n "
        "FROM deliveries WHERE created_at >= $1 GROUP BY 1, 2, 3 ORDER BY 1",
        since,
    )
    return [(r["day"], r["channel"], r["status"], r["n"]) for r in rows]


async def deferral_counts(
    conn: Pg, *, short_since: dt.datetime, long_since: dt.datetime
) -> dict[str, tuple[int, int]]:
    """Provider calls that ended deferred (transient, unknown outcome, deferred) per channel:
    (since `short_since`, since `long_since`)."""
    rows = await conn.fetch(
        "SELECT d.channel, count(*) FILTER (WHERE a.started_at >= $1) AS short, "
        "count(*) AS long FROM attempts a JOIN deliveries d ON d.id = a.delivery_id "
        "WHERE a.started_at >= $2 AND a.status IN ('transient', 'unknown', 'deferred') "
        "GROUP BY d.channel",
        short_since,
        long_since,
    )
    return {r["channel"]: (r["short"], r["long"]) for r in rows}


async def oldest_due(conn: Pg, *, now: dt.datetime) -> dict[str, dt.datetime]:
    """Per channel, the earliest `next_attempt_at` of a queued delivery that is due now (the
    retry backlog's age)."""
    rows = await conn.fetch(
        "SELECT channel, min(next_attempt_at) AS due FROM deliveries "
        "WHERE status = ANY($1::text[]) AND next_attempt_at <= $2 GROUP BY channel",
        _CLAIMABLE,
        now,
    )
    return {r["channel"]: r["due"] for r in rows}


# -- message search (GET /v1/messages) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """What `search` looks for; None fields do not filter.

    `client_id` None: every client's messages (admin). `recipient` is (channel, address hash)
    of one normalized recipient; `metadata` must be contained in the message's metadata.
    `before` is the keyset position (created_at, id) of the last message of the previous page.
    """

    client_id: uuid.UUID | None = None
    recipient: tuple[str, str] | None = None
    status: str | None = None
    channel: str | None = None
    category: str | None = None
    topic: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    metadata: dict[str, str] | None = None
    before: tuple[dt.datetime, uuid.UUID] | None = None


async def search(conn: Pg, where: MessageFilter, *, limit: int) -> list[MessageRow]:
    """Messages matching `where`, newest first (created_at, id descending), at most `limit`.

    The statement names only the filters that are set, so each combination gets a plan of its
    own (a recipient search starts from the deliveries' (channel, recipient hash) index, a
    key's listing from `ix_messages_client_created`).
    """
    clauses: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if where.client_id is not None:
        clauses.append(f"m.client_id = {arg(where.client_id)}")
    if where.recipient is not None:
        # With `status` too, the same delivery (that recipient's) must have that status.
        channel, address_hash = where.recipient
        status = f" AND d.status = {arg(where.status)}" if where.status is not None else ""
        clauses.append(
            "m.id IN (SELECT d.message_id FROM deliveries d "
            f"WHERE d.channel = {arg(channel)} AND d.recipient_hash = {arg(address_hash)}{status})"
        )
    elif where.status is not None:
        clauses.append(
            "EXISTS (SELECT 1 FROM deliveries s "
            f"WHERE s.message_id = m.id AND s.status = {arg(where.status)})"
        )
    if where.channel is not None:
        clauses.append(f"m.channel = {arg(where.channel)}")
    if where.category is not None:
        clauses.append(f"m.category = {arg(where.category)}")
    if where.topic is not None:
        clauses.append(f"m.topic = {arg(where.topic)}")
    if where.since is not None:
        clauses.append(f"m.created_at >= {arg(where.since)}")
    if where.until is not None:
        clauses.append(f"m.created_at < {arg(where.until)}")
    if where.metadata:
        clauses.append(f"m.metadata @> {arg(jsonb(where.metadata))}::jsonb")
    if where.before is not None:
        at, last_id = where.before
        clauses.append(f"(m.created_at, m.id) < ({arg(at)}::timestamptz, {arg(last_id)}::uuid)")
    sql = (
        f"SELECT {_M} FROM messages m"
        + (" WHERE " + " AND ".join(clauses) if clauses else "")
        + f" ORDER BY m.created_at DESC, m.id DESC LIMIT {arg(limit)}"
    )
    return [MessageRow(*r) for r in await conn.fetch(sql, *args)]


async def deliveries_of_messages(
    conn: Pg, message_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[DeliveryRow]]:
    """The deliveries of several messages, each list in request order."""
    rows = await conn.fetch(
        f"SELECT {_D} FROM deliveries d WHERE d.message_id = ANY($1::uuid[]) "
        "ORDER BY d.message_id, d.position, d.created_at",
        list(message_ids),
    )
    out: dict[uuid.UUID, list[DeliveryRow]] = {i: [] for i in message_ids}
    for r in rows:
        delivery = _delivery(r)
        out[delivery.message_id].append(delivery)
    return out
