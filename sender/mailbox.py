"""The sandbox mailbox: every statement on `sandbox_messages` (model in `sender.models`).

The sandbox providers (`sender.providers.sandbox`) never touch the database: their
`FeedbackRunner` hands records and callback progress to a `Mailbox` (its `MailboxStore`),
which the composition root builds. Writes come in batches from the runner's background
writer, one statement per batch (new records inserted, progress of earlier ones updated,
in the same statement), so a sandbox send costs no round trip of its own.

Addresses and content are personal data, as everywhere in the gateway: the recipient is
stored as a keyed hash of its normalized form (the `to` filter); the recipient, content and
the planned callbacks' payloads as one Fernet ciphertext (erasure sets it to NULL: the row
is then no longer shown). The callback schedule and the results (event names, times,
dispositions) are stored in the clear.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from sender.providers.sandbox import SandboxRecord, SimulatedCallback
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import jsonb, pg_connection
from suppression.normalize import InvalidAddress, normalize

log = logging.getLogger("gateway.sender.mailbox")

_WRITE = """
WITH new AS (
    INSERT INTO sandbox_messages (
        id, channel, provider, provider_message_id, delivery_id, to_hash, content_encrypted,
        callbacks, results, next_callback_at, created_at
    )
    SELECT * FROM unnest(
        $1::uuid[], $2::varchar[], $3::varchar[], $4::text[], $5::uuid[], $6::varchar[],
        $7::text[], $8::jsonb[], $9::jsonb[], $10::timestamptz[], $11::timestamptz[]
    )
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
), progress AS (
    UPDATE sandbox_messages AS m
    SET results = p.results, next_callback_at = p.next_at
    FROM unnest($12::uuid[], $13::jsonb[], $14::timestamptz[]) AS p (id, results, next_at)
    WHERE m.id = p.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM new) AS inserted, (SELECT count(*) FROM progress) AS updated
"""

_COLUMNS = (
    "id, channel, provider, provider_message_id, delivery_id, content_encrypted, callbacks, "
    "results, next_callback_at, created_at"
)

_PENDING = f"""
SELECT {_COLUMNS} FROM sandbox_messages
WHERE next_callback_at IS NOT NULL
ORDER BY next_callback_at
"""  # noqa: S608  (only the column list constant is interpolated)

# Newest first, optionally one recipient ($2 channel, $3 hash), after a cursor ($4, $5).
_PAGE = f"""
SELECT {_COLUMNS} FROM sandbox_messages
WHERE channel = ANY($1::varchar[])
  AND ($2::varchar IS NULL OR (channel = $2 AND to_hash = $3))
  AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $6
"""  # noqa: S608  (only the column list constant is interpolated)

_GET = f"""
SELECT {_COLUMNS} FROM sandbox_messages WHERE id = $1 AND channel = ANY($2::varchar[])
"""  # noqa: S608  (only the column list constant is interpolated)


class BadCursor(ValueError):
    """A pagination cursor this server did not issue."""


@dataclass(frozen=True)
class Filter:
    """Which messages to list: channels (those with a sandbox provider), optionally one
    recipient (any spelling: it is normalized and hashed)."""

    channels: tuple[str, ...]
    to: str | None = None


class Mailbox:
    """Stores and reads sandbox records (`MailboxStore` for the sandbox's `FeedbackRunner`)."""

    def __init__(
        self, engine: AsyncEngine, protector: AddressProtector, *, default_region: str = "US"
    ) -> None:
        self.engine = engine
        self.protector = protector
        self.default_region = default_region

    # -- the runner's side --------------------------------------------------------------------

    async def write(
        self, new: Sequence[SandboxRecord], progressed: Sequence[SandboxRecord]
    ) -> None:
        """Insert `new` records and store the callback progress of `progressed` ones, in one
        statement."""
        if not new and not progressed:
            return
        encrypt = self.protector.encrypt
        async with pg_connection(self.engine) as conn:
            await conn.fetchrow(
                _WRITE,
                [r.id for r in new],
                [r.channel for r in new],
                [r.provider for r in new],
                [r.provider_message_id for r in new],
                [r.delivery_id for r in new],
                [self.protector.hash(r.channel, _key(r)) for r in new],
                [encrypt(json.dumps(_private(r), separators=(",", ":"))) for r in new],
                [jsonb(_schedule(r)) for r in new],
                [jsonb(_results(r)) for r in new],
                [r.next_callback_at for r in new],
                [r.created_at for r in new],
                [r.id for r in progressed],
                [jsonb(_results(r)) for r in progressed],
                [r.next_callback_at for r in progressed],
            )

    async def pending(self) -> list[SandboxRecord]:
        """Every record with callbacks not delivered yet (undecryptable ones are skipped)."""
        async with pg_connection(self.engine) as conn:
            rows = await conn.fetch(_PENDING)
        records = []
        for row in rows:
            record = self._record(row)
            if record is not None:
                records.append(record)
        return records

    # -- the API's side -----------------------------------------------------------------------

    def to_hash(self, channel: str, address: str) -> str:
        """The keyed hash of an address as the `to` filter matches it (normalized when it
        can be; a sandbox number normalization refuses is taken as written)."""
        try:
            key = normalize(channel, address, self.default_region).key
        except InvalidAddress:
            key = address.strip()
        return self.protector.hash(channel, key)

    async def page(
        self, f: Filter, *, limit: int, cursor: str | None = None
    ) -> tuple[list[SandboxRecord], str | None]:
        """A page of records, newest first, and the cursor of the next page (None at the
        end). Raises `BadCursor` for a cursor that is not one of ours."""
        channel = to_hash = None
        if f.to is not None:
            channel = "email" if "@" in f.to else "sms"
            to_hash = self.to_hash(channel, f.to)
        at, ident = decode_cursor(cursor) if cursor else (None, None)
        async with pg_connection(self.engine) as conn:
            rows = await conn.fetch(_PAGE, list(f.channels), channel, to_hash, at, ident, limit + 1)
        records = [r for r in map(self._record, rows[:limit]) if r is not None]
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = encode_cursor(last["created_at"], last["id"])
        return records, next_cursor

    async def get(self, record_id: uuid.UUID, channels: Sequence[str]) -> SandboxRecord | None:
        """One record of these channels, or None."""
        async with pg_connection(self.engine) as conn:
            row = await conn.fetchrow(_GET, record_id, list(channels))
        return None if row is None else self._record(row)

    def _record(self, row: Any) -> SandboxRecord | None:
        """A stored row as a record; None when no configured key decrypts it (or the
        recipient was erased)."""
        if row["content_encrypted"] is None:
            return None
        try:
            private = json.loads(self.protector.decrypt(row["content_encrypted"]))
        except InvalidToken:
            log.warning("sandbox message %s: no configured key decrypts it", row["id"])
            return None
        schedule = _json(row["callbacks"])
        results = {r["seq"]: r for r in _json(row["results"])}
        callbacks = []
        for planned, plan in zip(schedule, private["callbacks"], strict=True):
            seq = planned["seq"]
            done = results.get(seq)
            callbacks.append(
                SimulatedCallback(
                    seq=seq,
                    kind=plan["kind"],
                    event=planned["event"],
                    due_at=dt.datetime.fromisoformat(planned["due_at"]),
                    payload=plan["payload"],
                    event_id=plan["event_id"],
                    query=plan.get("query") or {},
                    delivered_at=dt.datetime.fromisoformat(done["at"]) if done else None,
                    result=done["result"] if done else None,
                )
            )
        return SandboxRecord(
            id=row["id"],
            channel=row["channel"],
            provider=row["provider"],
            provider_message_id=row["provider_message_id"],
            delivery_id=row["delivery_id"],
            to=private["to"],
            created_at=row["created_at"],
            content=private["content"],
            callbacks=callbacks,
        )


def _key(record: SandboxRecord) -> str:
    # A sandbox adapter gets the display form of a normalized address (`sender.dispatch`),
    # which differs from the key only by the case of an email's local part: no need to
    # normalize again on the writer's path.
    return record.to.lower() if record.channel == "email" else record.to


def _private(record: SandboxRecord) -> dict[str, Any]:
    # Everything that may hold personal data: content, and the payloads of the callbacks.
    return {
        "to": record.to,
        "content": record.content,
        "callbacks": [
            {"kind": c.kind, "payload": c.payload, "event_id": c.event_id, "query": c.query}
            for c in record.callbacks
        ],
    }


def _schedule(record: SandboxRecord) -> list[dict[str, Any]]:
    return [
        {"seq": c.seq, "event": c.event, "due_at": c.due_at.isoformat()} for c in record.callbacks
    ]


def _results(record: SandboxRecord) -> list[dict[str, Any]]:
    return [
        {"seq": c.seq, "at": c.delivered_at.isoformat(), "result": c.result}
        for c in record.callbacks
        if c.delivered_at is not None
    ]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def encode_cursor(created_at: dt.datetime, record_id: uuid.UUID) -> str:
    """An opaque keyset cursor for the position after this record."""
    raw = f"{created_at.isoformat()}|{record_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """The (created_at, id) a cursor stands for; `BadCursor` when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, ident = raw.split("|")
        moment = dt.datetime.fromisoformat(at)
        if moment.tzinfo is None:
            raise ValueError("naive time")
        return moment, uuid.UUID(ident)
    except (ValueError, UnicodeDecodeError):
        raise BadCursor("invalid cursor") from None
