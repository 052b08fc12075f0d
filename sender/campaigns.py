"""Campaigns: one content sent to a large recipient list (every statement on `campaigns` and
`campaign_recipients`, and the expansion job).

A campaign is made in three calls (see `sender.campaigns_api`):

1. `create`: the content is validated like a message's and stored on one `messages` row
   (the campaign's deliveries hang off it, so `GET /v1/messages/{id}`, callbacks,
   suppression and retries treat them like any other); the campaign row is `draft`.
   Idempotent per (API key, Idempotency-Key) with a body fingerprint, like a send.
2. `load_recipients`: the list is read from the request body as it streams in (JSON Lines or
   CSV), each record normalized as the send path does, hashed, encrypted and given its
   derived key, and inserted in batches (one statement each; ON CONFLICT on (campaign, hash)
   counts duplicates). The whole upload is one transaction holding the campaign row: a
   second upload replaces the list atomically, a failed one leaves the old list, and `start`
   waits for an upload under way.
3. `start` makes it `expanding`; the expansion job (`expand_once`, run by every worker
   process) turns the list into deliveries `batch` list positions at a time. Each batch is
   one transaction: the campaign row is locked (SKIP LOCKED: one process per campaign at a
   time), and one statement takes the recipients of the next `batch` positions after the
   cursor (a range of the primary key: bounded work per batch whatever the table's
   statistics say; invalid and duplicate records leave gaps), their suppression verdicts
   (set-based, the suppression package's query), inserts their deliveries (`queued` and due,
   or `suppressed`) and moves the cursor. A crash loses at most the uncommitted batch, which
   the next run redoes; derived keys are unique (ON CONFLICT DO NOTHING), so nothing is ever
   created twice. The retry worker sends the queued deliveries.

`cancel` stops the expansion (it takes the campaign row, so it waits for a batch under way)
and makes every delivery still `queued` `cancelled`. A `sending` campaign becomes `done` once
no delivery is left unfinished (checked by the job and when the campaign is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from sender import log as dlog
from sender import status as st
from sender.keys import derived_key, fingerprint
from sender.schemas import (
    MAX_ADDRESS,
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    CampaignCounts,
    CampaignStateName,
    CreateCampaign,
)
from sender.service import SendProblem, SendService
from suppression import service as suppression
from suppression.crypto import AddressProtector
from suppression.db import Pg, pg_connection, utcnow
from suppression.normalize import InvalidAddress, normalize

log = logging.getLogger("gateway.campaigns")

DRAFT = "draft"
EXPANDING = "expanding"
SENDING = "sending"
DONE = "done"
CANCELLED = "cancelled"
STATES: tuple[str, ...] = (DRAFT, EXPANDING, SENDING, DONE, CANCELLED)

MAX_RECIPIENTS = 1_000_000
# Records inserted per statement while a list is uploaded.
LOAD_BATCH = 5000
# A record (line) longer than this is invalid; it bounds what one line may buffer.
MAX_RECORD_BYTES = 16 * 1024
CANCEL_REASON = "campaign cancelled"

# JSON Lines and CSV, by the request's Content-Type.
FORMATS: dict[str, str] = {
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/json-lines": "jsonl",
    "text/csv": "csv",
}

# Which delivery statuses each count of `counts` sums up.
_COUNTED: dict[str, tuple[str, ...]] = {
    "suppressed": (st.SUPPRESSED,),
    "queued": (st.QUEUED, st.SENDING, st.UNKNOWN, st.RETRYING),
    "sent": (st.SENT, st.DELAYED),
    "delivered": (st.DELIVERED, st.READ),
    "bounced": (st.BOUNCED,),
    "complained": (st.COMPLAINED,),
    "failed": (st.FAILED, st.DEAD),
    "cancelled": (st.CANCELLED,),
}

_BAD_TEXT = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def message_key(campaign_id: uuid.UUID) -> str:
    """The Idempotency-Key of a campaign's `messages` row and of its derived keys.

    It holds a line break, which no Idempotency-Key header can (printable ASCII only), so it
    never meets a key of `POST /v1/messages`: a campaign and a send that share an upstream key
    and a recipient get two different deliveries."""
    return f"campaign\n{campaign_id}"


# -- rows -------------------------------------------------------------------------------------

_C = (
    "c.id, c.client_id, c.idempotency_key, c.fingerprint, c.message_id, c.state, c.read_count, "
    "c.invalid_count, c.duplicate_count, c.expanded_position, c.created_at, c.updated_at, "
    "c.started_at, c.finished_at"
)


@dataclass(frozen=True, slots=True)
class CampaignRow:
    """One row of `campaigns` (columns in `_C` order)."""

    id: uuid.UUID
    client_id: uuid.UUID
    idempotency_key: str
    fingerprint: str
    message_id: uuid.UUID
    state: str
    read_count: int
    invalid_count: int
    duplicate_count: int
    expanded_position: int
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @property
    def recipients(self) -> int:
        """Distinct valid recipients of the uploaded list."""
        return self.read_count - self.invalid_count - self.duplicate_count


async def campaign(conn: Pg, campaign_id: uuid.UUID, *, lock: bool = False) -> CampaignRow | None:
    """One campaign by id (`lock`: FOR UPDATE, inside the caller's transaction)."""
    row = await conn.fetchrow(
        f"SELECT {_C} FROM campaigns c WHERE c.id = $1" + (" FOR UPDATE" if lock else ""),
        campaign_id,
    )
    return CampaignRow(*row) if row is not None else None


async def campaign_by_key(conn: Pg, client_id: uuid.UUID, key: str) -> CampaignRow | None:
    """The campaign of an (API key, Idempotency-Key) pair."""
    row = await conn.fetchrow(
        f"SELECT {_C} FROM campaigns c WHERE c.client_id = $1 AND c.idempotency_key = $2",
        client_id,
        key,
    )
    return CampaignRow(*row) if row is not None else None


async def page(
    conn: Pg,
    *,
    client_id: uuid.UUID | None,
    after: tuple[dt.datetime, uuid.UUID] | None,
    limit: int,
) -> list[CampaignRow]:
    """Campaigns newest first, after the keyset `after`; `client_id` None: every client's."""
    rows = await conn.fetch(
        f"SELECT {_C} FROM campaigns c WHERE ($1::uuid IS NULL OR c.client_id = $1) "
        "AND ($2::timestamptz IS NULL OR (c.created_at, c.id) < ($2, $3)) "
        "ORDER BY c.created_at DESC, c.id DESC LIMIT $4",
        client_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )
    return [CampaignRow(*r) for r in rows]


# -- problems ---------------------------------------------------------------------------------


class NotFound(LookupError):
    """No such campaign (for this API key)."""


def _conflict(row: CampaignRow, action: str) -> SendProblem:
    return SendProblem(
        409,
        "urn:problem:campaign-state",
        f"The campaign is {row.state}: {action}.",
        {"state": row.state},
    )


# -- parsing an uploaded list -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One recipient record of an upload (`None` address: the record is invalid)."""

    to: str | None
    metadata: dict[str, str] | None = None


INVALID = Record(None)


class _Line(msgspec.Struct):
    to: str
    metadata: dict[str, str] | None = None


_LINE = msgspec.json.Decoder(_Line)
_ENCODER = msgspec.json.Encoder()


def _json(value: dict[str, str]) -> str:
    return _ENCODER.encode(value).decode()


def _metadata_ok(metadata: dict[str, str]) -> bool:
    if len(metadata) > MAX_METADATA_KEYS:
        return False
    for key, value in metadata.items():
        if not key or len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            return False
        if _BAD_TEXT.search(key) or _BAD_TEXT.search(value):
            return False
    return True


async def _lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes | None]:
    """Physical lines without their line break (None: a line over `MAX_RECORD_BYTES`,
    skipped without buffering it). Holds one chunk and one partial line at a time."""
    buf = bytearray()
    skipping = False
    first = True
    async for chunk in chunks:
        if not chunk:
            continue
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:end])
            start = end + 1
            if skipping:
                skipping = False
                continue
            if first:
                first = False
                line = line.removeprefix(b"\xef\xbb\xbf")
            yield None if len(line) > MAX_RECORD_BYTES else line.rstrip(b"\r")
        del buf[:start]
        if len(buf) > MAX_RECORD_BYTES:
            if not skipping:
                yield None
                skipping = True
            buf.clear()
    if buf and not skipping:
        line = bytes(buf)
        yield (line.removeprefix(b"\xef\xbb\xbf") if first else line).rstrip(b"\r")


async def _jsonl(chunks: AsyncIterable[bytes]) -> AsyncIterator[Record]:
    async for line in _lines(chunks):
        if line is None:
            yield INVALID
            continue
        if not line.strip():
            continue
        try:
            parsed = _LINE.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError):
            yield INVALID
            continue
        if parsed.metadata is not None and not _metadata_ok(parsed.metadata):
            yield INVALID
            continue
        yield Record(parsed.to, parsed.metadata or None)


class BadList(ValueError):
    """The list cannot be read at all (e.g. a CSV without a `to` column): 400."""


async def _csv(chunks: AsyncIterable[bytes]) -> AsyncIterator[Record]:
    """CSV with a header line naming a `to` column; every other column is metadata (empty
    values left out). A quoted field may span lines."""
    header: list[str] | None = None
    to_index = 0
    pending: list[bytes] = []
    size = 0
    async for line in _lines(chunks):
        if line is None:
            if header is None:
                raise BadList("the CSV header line is too long")
            pending, size = [], 0
            yield INVALID
            continue
        if not pending and not line.strip():
            continue
        pending.append(line)
        size += len(line)
        if b"".join(pending).count(b'"') % 2:
            if size > MAX_RECORD_BYTES:
                pending, size = [], 0
                yield INVALID
            continue
        raw, pending, size = b"\n".join(pending), [], 0
        try:
            fields = [f.strip() for f in next(csv.reader([raw.decode("utf-8")], strict=True))]
        except (UnicodeDecodeError, csv.Error, StopIteration):
            if header is None:
                raise BadList("the CSV header line is not readable") from None
            yield INVALID
            continue
        if header is None:
            header = fields
            names = [h.lower() for h in header]
            if "to" not in names:
                raise BadList("the CSV header has no `to` column")
            to_index = names.index("to")
            others = [h for i, h in enumerate(header) if i != to_index]
            if len(others) > MAX_METADATA_KEYS or any(
                not h or len(h) > MAX_METADATA_KEY or _BAD_TEXT.search(h) for h in others
            ):
                raise BadList(
                    f"at most {MAX_METADATA_KEYS} columns besides `to`, each named with 1-"
                    f"{MAX_METADATA_KEY} characters"
                )
            continue
        if len(fields) != len(header):
            yield INVALID
            continue
        pairs = enumerate(zip(header, fields, strict=True))
        metadata = {h: v for i, (h, v) in pairs if i != to_index and v}
        if metadata and not _metadata_ok(metadata):
            yield INVALID
            continue
        yield Record(fields[to_index], metadata or None)
    if pending:
        yield INVALID


def records(chunks: AsyncIterable[bytes], fmt: str) -> AsyncIterator[Record]:
    """The records of an uploaded list in format `fmt` (`jsonl` or `csv`)."""
    return _jsonl(chunks) if fmt == "jsonl" else _csv(chunks)


# -- statements -------------------------------------------------------------------------------

_LOAD = """
WITH i AS (
    INSERT INTO campaign_recipients (campaign_id, position, recipient_hash,
        recipient_encrypted, derived_key, metadata)
    SELECT $1, u.position, u.hash, u.enc, u.key, u.metadata::jsonb
    FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::text[])
        AS u(position, hash, enc, key, metadata)
    ON CONFLICT ON CONSTRAINT uq_campaign_recipients_campaign_id DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM i
"""

_HITS = suppression.verdicts_sql(
    channel="$4::text",
    hashes="(SELECT coalesce(array_agg(hash), '{}'::text[]) FROM r)",
    scopes="$5::text[]",
    now="$6::timestamptz",
)

_EXPAND = f"""
WITH r AS (
    SELECT position, recipient_hash AS hash, recipient_encrypted AS enc, derived_key AS key
    FROM campaign_recipients
    WHERE campaign_id = $1 AND position > $2 AND position <= $2 + $3
), hits AS ({_HITS}), d AS ({
    dlog.campaign_deliveries_sql(
        source="r",
        hits="hits",
        message_id="$7::uuid",
        channel="$4::text",
        category="$8::text",
        topic="$9::text",
        priority_rank="$10::int2",
        expires_at="$11::timestamptz",
        now="$6::timestamptz",
    )
}), c AS (
    UPDATE campaigns SET
        expanded_position = $2 + $3,
        state = CASE WHEN $2 + $3 >= read_count - 1 THEN 'sending' ELSE state END,
        updated_at = $6
    WHERE id = $1
    RETURNING state
)
SELECT (SELECT count(*) FROM r) AS n, (SELECT state FROM c) AS state,
    (SELECT count(*) FROM d WHERE status = 'suppressed') AS suppressed
"""


@dataclass
class Expanded:
    """What one expansion batch did."""

    campaign_id: uuid.UUID | None = None
    recipients: int = 0
    suppressed: int = 0
    state: str | None = None


@dataclass
class _Batch:
    position: list[int] = field(default_factory=list)
    hash: list[str] = field(default_factory=list)
    enc: list[str] = field(default_factory=list)
    key: list[str] = field(default_factory=list)
    metadata: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.position)


@dataclass(frozen=True)
class Loaded:
    """The answer to an upload."""

    recipients_read: int
    invalid: int
    duplicates: int


class _Rollback(Exception):
    """Undo the transaction (a replayed creation)."""


class CampaignService:
    """The campaigns API's service and the expansion job: one instance per process."""

    def __init__(self, sender: SendService, *, batch: int = 5000) -> None:
        self.sender = sender
        self.engine: AsyncEngine = sender.dispatcher.engine
        self.protector: AddressProtector = sender.protector
        self.default_region: str = sender.config.default_region
        self.batch = batch
        # Records an upload may hold (the API's documented limit; tests lower it).
        self.max_recipients = MAX_RECIPIENTS

    # -- POST /v1/campaigns -----------------------------------------------------------------

    async def create(
        self,
        *,
        client_id: uuid.UUID,
        idempotency_key: str,
        request: CreateCampaign,
        raw_body: Any,
    ) -> tuple[CampaignRow, bool]:
        """Create a `draft` campaign (validated like a message); returns it and whether it
        is a replay of the same key. Same key, other body: 422."""
        now = utcnow()
        content = self.sender.content_of(request)
        request = self.sender.checked_options(request, now)
        topic = request.topic or ("marketing" if request.category == "marketing" else None)
        campaign_id = uuid.uuid4()
        message = dlog.NewMessage(
            id=uuid.uuid4(),
            client_id=client_id,
            idempotency_key=message_key(campaign_id),
            fingerprint=fingerprint(raw_body),
            channel=request.channel,
            category=request.category,
            topic=topic,
            priority=request.priority,
            expires_at=request.expires_at,
            content_encrypted=self.protector.encrypt(json.dumps(content)),
            metadata=request.metadata or {},
        )
        async with pg_connection(self.engine) as conn:
            try:
                async with conn.transaction():
                    await dlog.insert_campaign_message(conn, message, now=now)
                    inserted = await conn.fetchval(
                        "INSERT INTO campaigns (id, client_id, idempotency_key, fingerprint, "
                        "message_id, state, read_count, invalid_count, duplicate_count, "
                        "expanded_position, created_at, updated_at) "
                        "VALUES ($1, $2, $3, $4, $5, 'draft', 0, 0, 0, -1, $6, $6) "
                        "ON CONFLICT ON CONSTRAINT uq_campaigns_client_idempotency_key "
                        "DO NOTHING RETURNING 1",
                        campaign_id,
                        client_id,
                        idempotency_key,
                        message.fingerprint,
                        message.id,
                        now,
                    )
                    if inserted is None:
                        raise _Rollback
            except _Rollback:
                existing = await campaign_by_key(conn, client_id, idempotency_key)
                if existing is None:  # pragma: no cover - rows are never deleted
                    raise SendProblem(
                        409, "urn:problem:idempotency-in-flight", "Please retry."
                    ) from None
                if existing.fingerprint != message.fingerprint:
                    raise SendProblem(
                        422,
                        "urn:problem:idempotency-key-reused",
                        "This Idempotency-Key was already used with a different request body.",
                    ) from None
                return existing, True
            created = await campaign(conn, campaign_id)
        assert created is not None
        return created, False

    async def _visible(
        self, conn: Pg, campaign_id: uuid.UUID, client_id: uuid.UUID, see_all: bool, lock: bool
    ) -> CampaignRow:
        row = await campaign(conn, campaign_id, lock=lock)
        if row is None or (row.client_id != client_id and not see_all):
            raise NotFound(campaign_id)
        return row

    # -- PUT /v1/campaigns/{id}/recipients --------------------------------------------------

    async def load_recipients(
        self,
        campaign_id: uuid.UUID,
        *,
        client_id: uuid.UUID,
        see_all: bool,
        fmt: str,
        chunks: AsyncIterable[bytes],
    ) -> Loaded:
        """Replace the list of a `draft` campaign with the records of `chunks` (see the
        module docstring). Raises NotFound, SendProblem (409 not a draft, 413 too many
        records) or BadList; nothing changes then."""
        async with pg_connection(self.engine) as conn, conn.transaction():
            row = await self._visible(conn, campaign_id, client_id, see_all, lock=True)
            if row.state != DRAFT:
                raise _conflict(row, "its recipients can only be replaced while it is a draft")
            message = await dlog.message(conn, row.message_id)
            assert message is not None
            await conn.execute("DELETE FROM campaign_recipients WHERE campaign_id = $1", row.id)
            loaded = await self._load(conn, row, message.channel, records(chunks, fmt))
            await conn.execute(
                "UPDATE campaigns SET read_count = $2, invalid_count = $3, duplicate_count = $4, "
                "updated_at = $5 WHERE id = $1",
                row.id,
                loaded.recipients_read,
                loaded.invalid,
                loaded.duplicates,
                utcnow(),
            )
        return loaded

    async def _load(
        self, conn: Pg, row: CampaignRow, channel: str, source: AsyncIterator[Record]
    ) -> Loaded:
        """Normalize, hash, encrypt and insert every record, a batch per statement.

        The CPU work of a batch (about 0.1 ms a record: normalization, two keyed hashes, a
        Fernet encryption) runs in a thread, so the event loop keeps serving other requests
        (sends, callbacks) during a long upload; meanwhile PostgreSQL inserts the previous
        batch."""
        read = invalid = stored = 0
        pending: asyncio.Task[int] | None = None
        raws: list[tuple[int, Record]] = []

        async def insert(b: _Batch) -> int:
            count = await conn.fetchval(_LOAD, row.id, b.position, b.hash, b.enc, b.key, b.metadata)
            return int(count)

        async def flush() -> None:
            nonlocal pending, invalid, stored, raws
            batch, refused = await asyncio.to_thread(self._prepare, row, channel, raws)
            raws = []
            invalid += refused
            if pending is not None:
                task, pending = pending, None
                stored += await task
            if len(batch):
                pending = asyncio.create_task(insert(batch))
                # Let the task send its statement now; it is awaited with the next batch.
                await asyncio.sleep(0)

        try:
            async for record in source:
                if read >= self.max_recipients:
                    raise SendProblem(
                        413,
                        "urn:problem:too-many-recipients",
                        f"A campaign takes at most {self.max_recipients} recipients.",
                    )
                raws.append((read, record))
                read += 1
                if len(raws) >= LOAD_BATCH:
                    await flush()
            await flush()
            if pending is not None:
                task, pending = pending, None
                stored += await task
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
        return Loaded(read, invalid, read - invalid - stored)

    def _prepare(
        self, row: CampaignRow, channel: str, raws: list[tuple[int, Record]]
    ) -> tuple[_Batch, int]:
        """The rows of a batch of records, and how many of them are invalid."""
        protector = self.protector
        key_base = message_key(row.id)
        batch = _Batch()
        invalid = 0
        for position, record in raws:
            to = record.to
            if to is None or len(to) > MAX_ADDRESS:
                invalid += 1
                continue
            try:
                address = normalize(channel, to, self.default_region, strict=True)
            except InvalidAddress:
                invalid += 1
                continue
            batch.position.append(position)
            batch.hash.append(protector.hash(channel, address.key))
            batch.enc.append(protector.encrypt(address.display))
            batch.key.append(derived_key(protector, row.client_id, key_base, channel, address.key))
            batch.metadata.append(_json(record.metadata) if record.metadata else None)
        return batch, invalid

    # -- POST /v1/campaigns/{id}/start, /cancel ---------------------------------------------

    async def start(
        self, campaign_id: uuid.UUID, *, client_id: uuid.UUID, see_all: bool
    ) -> CampaignRow:
        """`draft` -> `expanding` (the job picks it up). 409 when it is not a draft or its
        list is empty."""
        async with pg_connection(self.engine) as conn, conn.transaction():
            row = await self._visible(conn, campaign_id, client_id, see_all, lock=True)
            if row.state != DRAFT:
                raise _conflict(row, "only a draft can be started")
            if row.recipients <= 0:
                raise SendProblem(
                    409,
                    "urn:problem:campaign-empty",
                    "The campaign has no recipients: upload them first "
                    "(PUT /v1/campaigns/{id}/recipients).",
                    {"state": row.state},
                )
            now = utcnow()
            await conn.execute(
                "UPDATE campaigns SET state = 'expanding', started_at = $2, updated_at = $2 "
                "WHERE id = $1",
                row.id,
                now,
            )
            started = await campaign(conn, row.id)
        assert started is not None
        return started

    async def cancel(
        self, campaign_id: uuid.UUID, *, client_id: uuid.UUID, see_all: bool
    ) -> CampaignRow:
        """Stop the campaign: no further expansion, every delivery still `queued` becomes
        `cancelled` (one transaction). Cancelling a cancelled campaign changes nothing; a
        `done` one is 409."""
        async with pg_connection(self.engine) as conn, conn.transaction():
            # The row lock waits for an expansion batch under way (it holds the row).
            row = await self._visible(conn, campaign_id, client_id, see_all, lock=True)
            if row.state == DONE:
                raise _conflict(row, "every delivery is final already")
            if row.state != CANCELLED:
                now = utcnow()
                await conn.execute(
                    "UPDATE campaigns SET state = 'cancelled', finished_at = $2, updated_at = $2 "
                    "WHERE id = $1",
                    row.id,
                    now,
                )
                await dlog.cancel_queued(conn, row.message_id, reason=CANCEL_REASON, now=now)
            cancelled = await campaign(conn, row.id)
        assert cancelled is not None
        return cancelled

    # -- GET --------------------------------------------------------------------------------

    async def show(
        self, campaign_id: uuid.UUID, *, client_id: uuid.UUID, see_all: bool
    ) -> tuple[CampaignRow, dlog.MessageRow, CampaignCounts]:
        """The campaign, its message and its counts (a `sending` campaign with nothing left
        to send becomes `done` here)."""
        async with pg_connection(self.engine) as conn:
            row = await self._visible(conn, campaign_id, client_id, see_all, lock=False)
            message = await dlog.message(conn, row.message_id)
            assert message is not None
            by_status = await dlog.message_status_counts(conn, row.message_id)
            if row.state == SENDING and not any(by_status.get(s) for s in _COUNTED["queued"]):
                await self._finish(conn, row.id)
                row = await campaign(conn, row.id) or row
        counts = {name: sum(by_status.get(s, 0) for s in group) for name, group in _COUNTED.items()}
        return (
            row,
            message,
            CampaignCounts(
                read=row.read_count,
                invalid=row.invalid_count,
                duplicate=row.duplicate_count,
                **counts,
            ),
        )

    async def list(
        self,
        *,
        client_id: uuid.UUID,
        see_all: bool,
        after: tuple[dt.datetime, uuid.UUID] | None,
        limit: int,
    ) -> tuple[list[tuple[CampaignRow, dlog.MessageRow]], bool]:
        """A page of campaigns (the key's own; admin: all) and whether more follow."""
        async with pg_connection(self.engine) as conn:
            rows = await page(
                conn, client_id=None if see_all else client_id, after=after, limit=limit + 1
            )
            out = []
            for row in rows[:limit]:
                message = await dlog.message(conn, row.message_id)
                assert message is not None
                out.append((row, message))
        return out, len(rows) > limit

    # -- the expansion job ------------------------------------------------------------------

    async def expand_once(self, *, batch: int | None = None) -> Expanded:
        """Expand the next batch of one `expanding` campaign (one transaction); an Expanded
        without campaign when none has work (or every one is being expanded elsewhere)."""
        size = batch or self.batch
        async with pg_connection(self.engine) as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {_C} FROM campaigns c WHERE c.state = 'expanding' "
                "ORDER BY c.started_at LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            if row is None:
                return Expanded()
            found = CampaignRow(*row)
            message = await dlog.message(conn, found.message_id)
            assert message is not None
            now = utcnow()
            result = await conn.fetchrow(
                _EXPAND,
                found.id,
                found.expanded_position,
                size,
                message.channel,
                suppression.scopes_for(message.category, message.topic),
                now,
                message.id,
                message.category,
                message.topic,
                st.PRIORITY_RANK.get(message.priority, 1),
                message.expires_at,
            )
        return Expanded(found.id, int(result["n"]), int(result["suppressed"]), result["state"])

    async def finish_sent(self) -> int:
        """Mark `done` every `sending` campaign without an unfinished delivery; how many."""
        done = 0
        async with pg_connection(self.engine) as conn:
            ids = [
                r[0]
                for r in await conn.fetch(
                    "SELECT id FROM campaigns WHERE state = 'sending' ORDER BY started_at"
                )
            ]
            for campaign_id in ids:
                row = await campaign(conn, campaign_id)
                if row is None or row.state != SENDING:
                    continue
                if not await dlog.any_unfinished(conn, row.message_id):
                    done += await self._finish(conn, row.id)
        return done

    async def _finish(self, conn: Pg, campaign_id: uuid.UUID) -> int:
        result = await conn.execute(
            "UPDATE campaigns SET state = 'done', finished_at = $2, updated_at = $2 "
            "WHERE id = $1 AND state = 'sending'",
            campaign_id,
            utcnow(),
        )
        return int(result.rsplit(" ", 1)[-1])

    async def run(self, *, poll_seconds: float = 1.0, done_check_seconds: float = 5.0) -> None:
        """The expansion job: expand batches while there is work, look for work every
        `poll_seconds` otherwise, and mark finished campaigns `done`. Runs until cancelled;
        a failure is logged and retried after a pause."""
        last_check = 0.0
        while True:
            try:
                expanded = await self.expand_once()
                if expanded.campaign_id is not None:
                    if expanded.state == SENDING:
                        log.info("campaign %s expanded", expanded.campaign_id)
                    continue
                if time.monotonic() - last_check >= done_check_seconds:
                    last_check = time.monotonic()
                    await self.finish_sent()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("campaign expansion failed; retrying")
            await asyncio.sleep(poll_seconds)


def state_name(row: CampaignRow) -> CampaignStateName:
    """The campaign's state as the API's type."""
    return cast(CampaignStateName, row.state)


def counted_statuses() -> dict[str, tuple[str, ...]]:
    """Which delivery statuses each delivery count of a campaign sums up (for the docs)."""
    return dict(_COUNTED)
