"""Streaming export of the suppression list with each entry's history, in constant memory.

Entries are read through a server-side cursor on one asyncpg connection, in a read-only
REPEATABLE READ transaction (one consistent snapshot for the whole export), a batch at a
time; each batch's history comes from one more query on the same connection, and the batch
is written out before the next is fetched, so nothing holds more than one batch. Rows are
plain asyncpg records turned into output text directly (no ORM objects, one CSV writer per
batch).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from suppression.crypto import AddressProtector
from suppression.db import Pg, pg_connection
from suppression.formats import EXPORT_COLUMNS, EXPORT_FORMATS, export_header
from suppression.listing import Filters
from suppression.views import display_address

EXPORT_BATCH = 1000

_ENTRIES = (
    "SELECT id, channel, address_hash, address_encrypted, scope, reason, source_type,"
    " source_id, evidence::text, created_at, expires_at FROM suppressions"
)
# Both columns of the (channel, address_hash) index are constrained, so this is one index
# probe per hash (a condition on the hash alone could not use that index).
_HISTORY = """
SELECT id, suppression_id, channel, address_hash, scope, action, reason, actor, source_type,
    source_id, details::text, at
FROM suppression_history
WHERE channel = ANY($1::text[]) AND address_hash = ANY($2::text[])
ORDER BY id
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _entries_query(filters: Filters) -> tuple[str, list[Any]]:
    conditions: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("channel", filters.channel),
        ("reason", filters.reason),
        ("scope", filters.scope),
    ):
        if value:
            params.append(value)
            conditions.append(f"{column} = ${len(params)}")
    if filters.since:
        params.append(filters.since)
        conditions.append(f"created_at >= ${len(params)}")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f"{_ENTRIES}{where} ORDER BY created_at, id", params


async def export_chunks(
    sessions: async_sessionmaker[AsyncSession],
    protector: AddressProtector,
    *,
    fmt: str,
    filters: Filters | None = None,
    batch_size: int = EXPORT_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> AsyncIterator[bytes]:
    """The export as byte chunks (header first, then one chunk per batch of entries).

    Every entry carries its history: the rows of the same (channel, address, scope), including
    those of earlier incarnations that were removed and added again. The fields are those of
    `suppression.formats.EXPORT_COLUMNS` (the API's entry view plus `history`).
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}")
    query, params = _entries_query(filters or Filters())
    header = export_header(fmt)
    if header:
        yield header
    engine = sessions.kw["bind"]
    async with (
        pg_connection(engine) as conn,
        conn.transaction(isolation="repeatable_read", readonly=True),
    ):
        cursor = await conn.cursor(query, *params)
        while True:
            rows = await cursor.fetch(batch_size)
            if not rows:
                break
            history = await _history(conn, rows)
            chunk = _format(fmt, protector, rows, history, dt.datetime.now(dt.UTC))
            count = len(rows)
            del rows, history
            yield chunk
            if on_batch is not None:
                on_batch(count)
            if count < batch_size:
                break


def _format(
    fmt: str,
    protector: AddressProtector,
    rows: list[Any],
    history: dict[tuple[str, str, str], list[dict[str, Any]]],
    now: dt.datetime,
) -> bytes:
    """One batch as CSV or JSON Lines (the values `formats.export_line` would write)."""
    items = (
        {
            "id": str(entry_id),
            "channel": channel,
            "address": display_address(protector, ciphertext),
            "scope": scope,
            "reason": reason,
            "active": expires_at is None or expires_at > now,
            "source_type": source_type,
            "source_id": source_id,
            "evidence": json.loads(evidence) if evidence else {},
            "created_at": created_at.isoformat(),
            "expires_at": expires_at.isoformat() if expires_at else None,
            "history": history.get((channel, address_hash, scope), []),
        }
        for (
            entry_id,
            channel,
            address_hash,
            ciphertext,
            scope,
            reason,
            source_type,
            source_id,
            evidence,
            created_at,
            expires_at,
        ) in rows
    )
    if fmt == "jsonl":
        return "".join(_dumps(item) + "\n" for item in items).encode()
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([_csv_value(item[column]) for column in EXPORT_COLUMNS] for item in items)
    return out.getvalue().encode()


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return _dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def _history(conn: Pg, rows: list[Any]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    result: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    channels = list({row[1] for row in rows})
    hashes = list({row[2] for row in rows})
    for (
        history_id,
        suppression_id,
        channel,
        address_hash,
        scope,
        action,
        reason,
        actor,
        source_type,
        source_id,
        details,
        at,
    ) in await conn.fetch(_HISTORY, channels, hashes):
        result[(channel, address_hash, scope)].append(
            {
                "id": history_id,
                "suppression_id": str(suppression_id) if suppression_id else None,
                "scope": scope,
                "action": action,
                "reason": reason,
                "actor": actor,
                "source_type": source_type,
                "source_id": source_id,
                "details": json.loads(details) if details else {},
                "at": at.isoformat(),
            }
        )
    return result
