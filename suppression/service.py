"""The suppression list's service API: check, add and remove, each change written to history.

Scope rules: `all` covers the whole channel; any other scope is a topic. Transactional
messages ignore topic entries but never `all` entries. Expired entries no longer suppress.
Callers pass an ORM session or an asyncpg connection and commit; nothing here commits. The
list's own operations are plain SQL on the asyncpg connection (one statement each, history
rows written by the same statement), so they cost one round trip inside the caller's
transaction; the admin read paths (`entries_for`, `history_for`) stay on the ORM.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import phonenumbers
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from suppression.crypto import AddressProtector
from suppression.db import Pg, jsonb, new_id, pg_of, utcnow
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import Address

SCOPE_ALL = "all"
REASONS = (
    "hard_bounce",
    "complaint",
    "unsubscribe",
    "sms_stop",
    "invalid_address",
    "soft_bounce",
    "manual",
)
# Removing these has legal weight (re-mailing a complainer, texting someone who said STOP).
PROTECTED_REASONS = ("complaint", "sms_stop")
# Reasons that are about the address itself, so they always cover the whole channel.
CHANNEL_WIDE_REASONS = ("hard_bounce", "complaint", "sms_stop", "invalid_address")
# History action written when a person's data is erased; later adds for that hash store no
# ciphertext (see `add`), so an import cannot bring the erased address back.
ERASE_ACTION = "erase"
# Where an entry or a history row came from (`source_type`): a provider callback, a one-click
# unsubscribe, an operator (API or CLI), an import, or a send-time refusal of the address
# (e.g. Twilio 21211/21610 answered to a send).
SOURCE_TYPES = ("provider_event", "unsubscribe", "operator", "import", "send_error")
# Every `action` of suppression history.
HISTORY_ACTIONS = ("add", "add_existing", "upgrade", "remove", ERASE_ACTION)
# Evidence keys that are personal data of the recipient; erasure removes them.
PERSONAL_EVIDENCE_KEYS = ("user_agent", "client_ip")

# A scope (`all` or a topic), as the OpenAPI document states it (an ECMA-262 pattern) and as
# checked here with `fullmatch` (Python's `$` would also accept a trailing newline).
SCOPE_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_SCOPE_RE = re.compile(SCOPE_PATTERN[1:-1])


_EMAIL_LIKE = re.compile(r"[^\s<>()\[\]\"',;:]+@[^\s<>()\[\]\"',;:]+")
_MAX_TEXT = 500


def address_patterns(address: Address) -> list[str]:
    """Regular expressions (valid in Python and in PostgreSQL) matching how an address is
    written in free text: an email in its normalized and display forms (match them
    case-insensitively); a phone number's digits, international or national, in any common
    formatting (`+1 (202) 555-0143`, `2025550143`, `020 7183 8750`)."""
    if address.channel == "sms":
        digits = address.key.lstrip("+")
        national = str(phonenumbers.parse(address.key).national_number)
        return [
            r"(?<![0-9])\+?" + r"[\s().-]*".join(digits) + r"(?![0-9])",
            # the national form, with the trunk prefix many countries write (0...)
            r"(?<![0-9])(?:0[\s().-]*)?" + r"[\s().-]*".join(national) + r"(?![0-9])",
        ]
    return [re.escape(form) for form in sorted({address.key, address.display}, key=len)]


def redact_text(text: str, address: Address | None = None) -> str:
    """Free text fit for history/evidence: email-like tokens and `address` become `[address]`."""
    text = _EMAIL_LIKE.sub("[address]", text)
    if address is not None:
        for pattern in address_patterns(address):
            text = re.sub(pattern, "[address]", text, flags=re.IGNORECASE)
    return text[:_MAX_TEXT]


def _upgrades(existing: str, new: str) -> bool:
    """Whether a new reason replaces the reason of an existing active entry."""
    return new in PROTECTED_REASONS and existing not in PROTECTED_REASONS


def validate_entry(channel: str, reason: str, scope: str) -> None:
    """Check a (channel, reason, scope) combination; raises ValueError explaining the problem."""
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}; choose from {', '.join(REASONS)}")
    if not _SCOPE_RE.fullmatch(scope):
        raise ValueError(
            "scope must be 'all' or a topic of 1-128 letters, digits, '_', '.', ':' or '-'"
        )
    if reason in CHANNEL_WIDE_REASONS and scope != SCOPE_ALL:
        raise ValueError(f"reason {reason!r} always covers the whole channel (scope 'all')")
    if reason == "sms_stop" and channel != "sms":
        raise ValueError("reason 'sms_stop' applies to the sms channel only")


@dataclass(frozen=True)
class Hit:
    """The suppression that stops a send."""

    id: Any
    reason: str
    scope: str
    created_at: dt.datetime
    expires_at: dt.datetime | None


@dataclass(frozen=True)
class Source:
    """Where a change came from: a provider event, an unsubscribe request, an operator, ..."""

    type: str
    id: str | None = None
    actor: str = "system"
    evidence: dict[str, Any] = field(default_factory=dict)


_ENTRY_COLUMNS = (
    "id, channel, address_hash, address_encrypted, scope, reason, source_type, source_id,"
    " evidence::text AS evidence, created_at, expires_at"
)


async def _pg(db: AsyncSession | Pg) -> Pg:
    """The asyncpg connection of `db`, inside its transaction.

    An ORM session used to flush pending changes before every query (autoflush); statements
    sent to the driver directly would not see them, so they are flushed here first.
    """
    if isinstance(db, AsyncSession) and (db.new or db.dirty or db.deleted):
        await db.flush()
    return await pg_of(db)


def _entry(row: Any) -> Suppression:
    """A (detached) entry from a row selected with `_ENTRY_COLUMNS`."""
    return Suppression(
        id=row["id"],
        channel=row["channel"],
        address_hash=row["address_hash"],
        address_encrypted=row["address_encrypted"],
        scope=row["scope"],
        reason=row["reason"],
        source_type=row["source_type"],
        source_id=row["source_id"],
        evidence=json.loads(row["evidence"]) if row["evidence"] is not None else {},
        created_at=row["created_at"],
        expires_at=row["expires_at"],
    )


def topic_scope(category: str, topic: str | None) -> str | None:
    """The topic whose entries stop a message of this category and topic besides the
    channel-wide ones (`all`): None for transactional messages and messages without one."""
    if category == "transactional" or not topic:
        return None
    return topic


def scopes_sql(*, category: str, topic: str) -> str:
    """`scopes_for` as an SQL expression over a row's category and topic columns (a text
    array, for `verdict_sql`'s `scopes`)."""
    return (
        f"ARRAY['{SCOPE_ALL}', CASE WHEN {category} <> 'transactional' "
        f"THEN NULLIF({topic}, '') END]"
    )


def scopes_for(category: str, topic: str | None) -> list[str]:
    """The scopes whose entries stop a message of this category and topic."""
    scope = topic_scope(category, topic)
    return [SCOPE_ALL] if scope is None else [SCOPE_ALL, scope]


def verdict_sql(*, channel: str, address_hash: str, scopes: str, now: str) -> str:
    """One address's suppression check as a subquery another package's statement joins
    LATERAL (`... LEFT JOIN LATERAL (<this>) AS s ON true`), for statements whose rows
    differ in channel or scopes: the arguments are that statement's column expressions
    (`scopes` a text array, e.g. `ARRAY['all', m.topic_scope]`). It yields at most one row
    (id, reason, scope), the entry that stops the address, the channel-wide one first; one
    probe of the unique (channel, address_hash, scope) index."""
    return (
        "SELECT id, reason, scope FROM suppressions "  # noqa: S608
        f"WHERE channel = {channel} AND address_hash = {address_hash} "
        f"AND scope = ANY({scopes}) AND (expires_at IS NULL OR expires_at > {now}) "
        "ORDER BY scope = 'all' DESC, created_at LIMIT 1"
    )


def verdicts_sql(*, channel: str, hashes: str, scopes: str, now: str) -> str:
    """The suppression check as a query another package's statement embeds (a CTE), so the
    verdicts are taken in the same statement (and snapshot) as what it writes.

    The arguments are the embedding statement's placeholders (e.g. `$5::text`); it yields
    (address_hash, id, reason, scope): for each suppressed hash the entry that stops it, the
    channel-wide one first (`scopes` from `scopes_for`). One index probe per hash, whatever
    the table's statistics say (see `_CHECK_MANY`).
    """
    one = verdict_sql(channel=channel, address_hash="h.address_hash", scopes=scopes, now=now)
    return (
        "SELECT h.address_hash, s.id, s.reason, s.scope "  # noqa: S608
        f"FROM unnest({hashes}) AS h(address_hash) CROSS JOIN LATERAL ({one}) AS s"
    )


_CHECK = """
SELECT id, reason, scope, created_at, expires_at FROM suppressions
WHERE channel = $1 AND address_hash = $2 AND scope = ANY($3::text[])
  AND (expires_at IS NULL OR expires_at > $4)
ORDER BY scope = 'all' DESC, created_at
LIMIT 1
"""


async def check(
    db: AsyncSession | Pg,
    channel: str,
    address_hash: str,
    *,
    category: str = "transactional",
    topic: str | None = None,
    now: dt.datetime | None = None,
) -> Hit | None:
    """The active suppression that stops a message of this category/topic, if any.

    Channel-wide entries (`all`) win over topic entries when both exist. `db` is an ORM
    session or an asyncpg connection; the query runs inside its transaction.
    """
    conn = await _pg(db)
    row = await conn.fetchrow(
        _CHECK, channel, address_hash, scopes_for(category, topic), now or utcnow()
    )
    if row is None:
        return None
    return Hit(row[0], row[1], row[2], row[3], row[4])


# One probe of the unique (channel, address_hash, scope) index per hash (a LATERAL subquery
# with a LIMIT is not flattened into a join), one statement and one parameter whatever the
# number of addresses: written as a plain join or `address_hash = ANY($2)`, the planner
# scans the whole table once the array is long. At most one row per scope, and `scopes_for`
# gives at most two.
_CHECK_MANY = """
SELECT h.address_hash, s.id, s.reason, s.scope, s.created_at, s.expires_at
FROM unnest($2::text[]) AS h(address_hash)
CROSS JOIN LATERAL (
    SELECT id, reason, scope, created_at, expires_at FROM suppressions
    WHERE channel = $1 AND address_hash = h.address_hash AND scope = ANY($3::text[])
      AND (expires_at IS NULL OR expires_at > $4)
    LIMIT 2
) AS s
"""


async def check_many(
    db: AsyncSession | Pg,
    channel: str,
    address_hashes: Iterable[str],
    *,
    category: str = "marketing",
    topic: str | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Hit]:
    """Batch form of `check`: hash -> hit, for the suppressed ones only, in one query."""
    hashes = list(set(address_hashes))
    if not hashes:
        return {}
    conn = await _pg(db)
    rows = await conn.fetch(
        _CHECK_MANY, channel, hashes, scopes_for(category, topic), now or utcnow()
    )
    result: dict[str, Hit] = {}
    for address_hash, entry_id, reason, scope, created_at, expires_at in rows:
        # At most two rows per hash (`all` and the topic); the channel-wide one wins.
        known = result.get(address_hash)
        if known is None or (scope == SCOPE_ALL and known.scope != SCOPE_ALL):
            result[address_hash] = Hit(entry_id, reason, scope, created_at, expires_at)
    return result


# One statement: lock the existing entry (if any), insert or renew/upgrade it, and write the
# history row. An erased address (an `erase` row in history) gets no ciphertext.
_ADD = f"""
WITH existing AS (
    SELECT id, reason, expires_at FROM suppressions
    WHERE channel = $1::text AND address_hash = $2::text AND scope = $3::text
    FOR UPDATE
),
ins AS (
    INSERT INTO suppressions AS s (id, channel, address_hash, address_encrypted, scope, reason,
        source_type, source_id, evidence, created_at, expires_at)
    SELECT $4::uuid, $1::text, $2::text,
        CASE WHEN EXISTS (
            SELECT 1 FROM suppression_history h
            WHERE h.channel = $1::text AND h.address_hash = $2::text AND h.action = 'erase'
        ) THEN NULL ELSE $5::text END,
        $3::text, $6::text, $7::text, $8::text, $9::text::jsonb, $10::timestamptz,
        $11::timestamptz
    WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT ON CONSTRAINT uq_suppressions_address_scope DO NOTHING
    RETURNING {_ENTRY_COLUMNS},
        'add'::text AS action, NULL::text AS previous_reason
),
upd AS (
    UPDATE suppressions s
    SET reason = $6::text, source_type = $7::text, source_id = $8::text,
        evidence = $9::text::jsonb, expires_at = $11::timestamptz,
        created_at = CASE WHEN e.expires_at <= $10::timestamptz THEN $10::timestamptz
                          ELSE s.created_at END
    FROM existing e
    WHERE s.id = e.id AND (
        e.expires_at <= $10::timestamptz
        OR ($6::text = ANY($12::text[]) AND NOT e.reason = ANY($12::text[]))
    )
    RETURNING s.id, s.channel, s.address_hash, s.address_encrypted, s.scope, s.reason,
        s.source_type, s.source_id, s.evidence::text AS evidence, s.created_at, s.expires_at,
        CASE WHEN e.expires_at <= $10::timestamptz THEN 'add' ELSE 'upgrade' END AS action,
        CASE WHEN e.expires_at <= $10::timestamptz THEN NULL ELSE e.reason END
            AS previous_reason
),
result AS (
    SELECT * FROM ins
    UNION ALL
    SELECT * FROM upd
    UNION ALL
    SELECT {_ENTRY_COLUMNS}, 'add_existing'::text, NULL::text FROM suppressions
    WHERE id = (SELECT id FROM existing) AND NOT EXISTS (SELECT 1 FROM upd)
),
history AS (
    INSERT INTO suppression_history (suppression_id, channel, address_hash, scope, action,
        reason, actor, source_type, source_id, details, at)
    SELECT r.id, $1::text, $2::text, $3::text, r.action, $6::text, $13::text, $7::text,
        $8::text,
        jsonb_build_object('evidence', $9::text::jsonb, 'expires_at', $14::text)
            || CASE WHEN r.previous_reason IS NULL THEN '{{}}'::jsonb
                    ELSE jsonb_build_object('previous_reason', r.previous_reason) END,
        $10::timestamptz
    FROM result r
    WHERE r.action <> 'add_existing' OR $15::bool
)
SELECT * FROM result
"""  # noqa: S608  (only the column list constant is interpolated)


async def add(
    db: AsyncSession | Pg,
    protector: AddressProtector,
    address: Address,
    *,
    reason: str,
    source: Source,
    scope: str = SCOPE_ALL,
    expires_at: dt.datetime | None = None,
    record_existing: bool = True,
) -> tuple[Suppression, bool]:
    """Suppress `address` for `scope`; returns (entry, created).

    An existing active entry for the same scope is kept as it is (first reason wins, the new
    evidence is still written to history unless `record_existing` is false), except that a
    protected reason (complaint, sms_stop) replaces an unprotected one (`upgrade` in history),
    so that a complaint can never hide behind, say, a bounce that an operator may lift without
    `force`. An expired entry is renewed in place. For an address whose data was erased, the
    entry is stored without ciphertext (hash only).

    One statement on the asyncpg connection of `db` (an ORM session or an asyncpg
    connection), inside its transaction; the returned entry is a detached copy.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    conn = await _pg(db)
    address_hash = protector.hash(address.channel, address.key)
    ciphertext = protector.encrypt(address.key)
    evidence = jsonb(source.evidence)
    expiry = expires_at.isoformat() if expires_at else None
    for _ in range(3):
        row = await conn.fetchrow(
            _ADD,
            address.channel,
            address_hash,
            scope,
            new_id(),
            ciphertext,
            reason,
            source.type,
            source.id,
            evidence,
            utcnow(),
            expires_at,
            list(PROTECTED_REASONS),
            source.actor,
            expiry,
            record_existing,
        )
        if row is not None:
            return _entry(row), row["action"] == "add"
        # A concurrent transaction inserted the same entry after this statement's snapshot
        # (ON CONFLICT DO NOTHING waited for it): the next statement sees and locks it.
    raise RuntimeError("suppression entry vanished while being added")  # pragma: no cover


_REMOVE = f"""
WITH removed AS (
    DELETE FROM suppressions
    WHERE channel = $1::text AND address_hash = $2::text
      AND ($3::text IS NULL OR scope = $3::text)
      AND ($4::text[] IS NULL OR reason = ANY($4::text[]))
    RETURNING {_ENTRY_COLUMNS}
),
history AS (
    INSERT INTO suppression_history (suppression_id, channel, address_hash, scope, action,
        reason, actor, source_type, source_id, details, at)
    SELECT id, channel, address_hash, scope, 'remove', reason, $5::text, $6::text, $7::text,
        $8::text::jsonb, $9::timestamptz
    FROM removed
    ORDER BY created_at, id
)
SELECT * FROM removed ORDER BY created_at, id
"""  # noqa: S608  (only the column list constant is interpolated)


async def remove(
    db: AsyncSession | Pg,
    channel: str,
    address_hash: str,
    *,
    reason: str,
    source: Source,
    scope: str | None = None,
    only_reasons: Iterable[str] | None = None,
) -> list[Suppression]:
    """Remove entries (one scope, or every scope) and write each removal to history.

    `reason` is the reason for the removal (free text, required); `only_reasons` limits the
    removal to entries with those suppression reasons (e.g. START lifts only `sms_stop`).
    One statement inside the transaction of `db` (ORM session or asyncpg connection); the
    removed entries are returned as detached copies, oldest first.
    """
    conn = await _pg(db)
    rows = await conn.fetch(
        _REMOVE,
        channel,
        address_hash,
        scope,
        list(only_reasons) if only_reasons is not None else None,
        source.actor,
        source.type,
        source.id,
        jsonb({"removal_reason": reason, "evidence": source.evidence}),
        utcnow(),
    )
    return [_entry(row) for row in rows]


_ERASED = """
SELECT DISTINCT channel, address_hash FROM suppression_history
WHERE action = 'erase'
  AND (channel, address_hash) IN (SELECT * FROM unnest($1::text[], $2::text[]))
"""


async def erased_hashes(
    db: AsyncSession | Pg, keys: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The (channel, address hash) pairs among `keys` whose data was erased."""
    wanted = list(set(keys))
    if not wanted:
        return set()
    conn = await _pg(db)
    rows = await conn.fetch(_ERASED, [c for c, _ in wanted], [h for _, h in wanted])
    return {(c, h) for c, h in rows}


@dataclass(frozen=True)
class NewEntry:
    """One entry for `add_many`."""

    address: Address
    reason: str
    scope: str = SCOPE_ALL
    expires_at: dt.datetime | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class StagedEntries:
    """Entries ready for `merge_entries`, column by column (hashed, encrypted, JSON text).

    `line` numbers the entries (any increasing numbers); within one merge, the first entry of
    a (channel, address, scope) wins unless a later one has a protected reason.
    """

    line: list[int] = field(default_factory=list)
    channel: list[str] = field(default_factory=list)
    address_hash: list[str] = field(default_factory=list)
    address_encrypted: list[str] = field(default_factory=list)
    scope: list[str] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    expires_at: list[dt.datetime | None] = field(default_factory=list)
    # `expires_at` as Python writes it into history details (isoformat).
    expires_text: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.line)


# Set-based form of `_ADD` for a whole batch, from column arrays (one parameter each):
# duplicates inside the batch resolved (first wins, a protected reason beats an unprotected
# one), existing entries locked, new ones inserted, expired ones renewed, weaker ones
# upgraded, one history row per change. Returns the lines that were added.
_MERGE = """
WITH input AS (
    SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::text[],
        $6::text[], $7::text[], $8::timestamptz[], $9::text[])
        AS t(line, channel, address_hash, address_encrypted, scope, reason, evidence,
             expires_at, expires_text)
),
chosen AS (
    SELECT DISTINCT ON (channel, address_hash, scope) *
    FROM input
    ORDER BY channel, address_hash, scope, (reason = ANY($10::text[])) DESC, line
),
existing AS (
    SELECT s.id, s.reason, s.expires_at, c.line
    FROM suppressions s JOIN chosen c USING (channel, address_hash, scope)
    FOR UPDATE OF s
),
ins AS (
    INSERT INTO suppressions AS s (id, channel, address_hash, address_encrypted, scope, reason,
        source_type, source_id, evidence, created_at, expires_at)
    SELECT gen_random_uuid(), c.channel, c.address_hash,
        CASE WHEN EXISTS (
            SELECT 1 FROM suppression_history h
            WHERE h.channel = c.channel AND h.address_hash = c.address_hash
              AND h.action = 'erase'
        ) THEN NULL ELSE c.address_encrypted END,
        c.scope, c.reason, $11::text, $12::text, c.evidence::jsonb, $13::timestamptz,
        c.expires_at
    FROM chosen c
    WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.line = c.line)
    ON CONFLICT ON CONSTRAINT uq_suppressions_address_scope DO NOTHING
    RETURNING s.id, s.channel, s.address_hash, s.scope
),
upd AS (
    UPDATE suppressions s
    SET reason = c.reason, source_type = $11::text, source_id = $12::text,
        evidence = c.evidence::jsonb, expires_at = c.expires_at,
        created_at = CASE WHEN e.expires_at <= $13::timestamptz THEN $13::timestamptz
                          ELSE s.created_at END
    FROM existing e JOIN chosen c ON c.line = e.line
    WHERE s.id = e.id AND (
        e.expires_at <= $13::timestamptz
        OR (c.reason = ANY($10::text[]) AND NOT e.reason = ANY($10::text[]))
    )
    RETURNING s.id, c.line,
        CASE WHEN e.expires_at <= $13::timestamptz THEN 'add' ELSE 'upgrade' END AS action,
        CASE WHEN e.expires_at <= $13::timestamptz THEN NULL ELSE e.reason END
            AS previous_reason
),
changed AS (
    SELECT i.id, c.line, 'add'::text AS action, NULL::text AS previous_reason
    FROM ins i JOIN chosen c USING (channel, address_hash, scope)
    UNION ALL
    SELECT id, line, action, previous_reason FROM upd
),
history AS (
    INSERT INTO suppression_history (suppression_id, channel, address_hash, scope, action,
        reason, actor, source_type, source_id, details, at)
    SELECT ch.id, c.channel, c.address_hash, c.scope, ch.action, c.reason, $14::text,
        $11::text, $12::text,
        jsonb_build_object('evidence', c.evidence::jsonb, 'expires_at', c.expires_text)
            || CASE WHEN ch.previous_reason IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('previous_reason', ch.previous_reason) END,
        $13::timestamptz
    FROM changed ch JOIN chosen c ON c.line = ch.line
    ORDER BY ch.line
)
SELECT coalesce(array_agg(line) FILTER (WHERE action = 'add'), '{}') FROM changed
"""


async def merge_entries(
    db: AsyncSession | Pg,
    staged: StagedEntries,
    *,
    source_type: str,
    source_id: str | None,
    actor: str,
    now: dt.datetime | None = None,
) -> set[int]:
    """Merge a batch of staged entries into the list in one statement; the lines added.

    The rules of `add`, set-based: an existing active entry stays as it is (nothing written
    for it) unless a protected reason upgrades it (`upgrade` in history, not counted as
    added); an expired one is renewed (counted as added); erased addresses are stored
    without ciphertext; a repeat of a (channel, address, scope) inside the batch is not added.
    """
    if not len(staged):
        return set()
    conn = await _pg(db)
    added = await conn.fetchval(
        _MERGE,
        staged.line,
        staged.channel,
        staged.address_hash,
        staged.address_encrypted,
        staged.scope,
        staged.reason,
        staged.evidence,
        staged.expires_at,
        staged.expires_text,
        list(PROTECTED_REASONS),
        source_type,
        source_id,
        now or utcnow(),
        actor,
    )
    return set(added)


async def add_many(
    db: AsyncSession | Pg,
    protector: AddressProtector,
    entries: Sequence[NewEntry],
    *,
    source_type: str,
    source_id: str | None,
    actor: str,
) -> list[bool]:
    """Batch form of `add` (used by imports): one flag per input, True when it was added.

    Same rules as `add`: an existing active entry stays as it is (and nothing is written for
    it) unless a protected reason upgrades it (counted as already present, written to history
    as `upgrade`), an expired one is renewed, erased addresses are stored without ciphertext.
    A repeat of the same (channel, address, scope) inside the batch counts as already present.
    """
    for entry in entries:
        if entry.reason not in REASONS:
            raise ValueError(f"unknown reason {entry.reason!r}")
    staged = StagedEntries()
    for index, entry in enumerate(entries):
        staged.line.append(index)
        staged.channel.append(entry.address.channel)
        staged.address_hash.append(protector.hash(entry.address.channel, entry.address.key))
        staged.address_encrypted.append(protector.encrypt(entry.address.key))
        staged.scope.append(entry.scope)
        staged.reason.append(entry.reason)
        staged.evidence.append(jsonb(entry.evidence))
        staged.expires_at.append(entry.expires_at)
        staged.expires_text.append(entry.expires_at.isoformat() if entry.expires_at else None)
    added = await merge_entries(
        db, staged, source_type=source_type, source_id=source_id, actor=actor
    )
    return [index in added for index in range(len(entries))]


async def entries_for(session: AsyncSession, channel: str, address_hash: str) -> list[Suppression]:
    """Every entry (active or expired) of one address, oldest first."""
    rows = await session.execute(
        select(Suppression)
        .where(Suppression.channel == channel, Suppression.address_hash == address_hash)
        .order_by(Suppression.created_at, Suppression.id)
    )
    return list(rows.scalars())


async def history_for(
    session: AsyncSession, channel: str, address_hash: str
) -> list[SuppressionHistory]:
    """The whole history of one address, in order."""
    rows = await session.execute(
        select(SuppressionHistory)
        .where(
            SuppressionHistory.channel == channel,
            SuppressionHistory.address_hash == address_hash,
        )
        .order_by(SuppressionHistory.id)
    )
    return list(rows.scalars())


class NothingToRemove(LookupError):
    """No entry matches the address (and scope) given."""


class ProtectedSuppression(PermissionError):
    """Removing these entries needs an explicit force (complaint, sms_stop)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__(f"removing {', '.join(reasons)} entries needs force")
        self.reasons = reasons


async def remove_by_operator(
    session: AsyncSession | Pg,
    channel: str,
    address_hash: str,
    *,
    reason: str,
    actor: str,
    scope: str | None = None,
    force: bool = False,
    address: Address | None = None,
) -> list[Suppression]:
    """An operator's removal: a reason is required, protected reasons need `force`.

    Raises `ValueError` (no reason), `NothingToRemove` or `ProtectedSuppression`; nothing is
    changed in those cases. A forced removal is marked as such in history. The free-text
    reason goes to history with email-like tokens and the given `address` redacted, since
    history must never hold an address in plaintext.
    """
    if not reason.strip():
        raise ValueError("a removal reason is required")
    conn = await _pg(session)
    rows = await conn.fetch(
        "SELECT DISTINCT reason FROM suppressions"
        " WHERE channel = $1 AND address_hash = $2 AND ($3::text IS NULL OR scope = $3::text)",
        channel,
        address_hash,
        scope,
    )
    reasons = {row[0] for row in rows}
    if not reasons:
        raise NothingToRemove("no suppression matches this address and scope")
    protected = sorted(reasons & set(PROTECTED_REASONS))
    if protected and not force:
        raise ProtectedSuppression(protected)
    return await remove(
        session,
        channel,
        address_hash,
        reason=redact_text(reason.strip(), address),
        scope=scope,
        source=Source(
            "operator", actor, actor=actor, evidence={"forced": True} if protected else {}
        ),
    )
