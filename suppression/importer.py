"""Streaming import into the suppression list: parse, normalize, add in batches.

Each batch is merged by one set-based statement (its own short transaction), so an import of
any size holds a batch or two in memory and no long lock. Invalid rows are counted and
reported (the first `MAX_REPORTED_INVALID` of them with line and error); they never stop the
rest. An import can be
repeated safely: rows already on the list count as `already_present`, and an erased person's
address is stored as hash only (see `service.merge_entries`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from suppression.crypto import AddressProtector
from suppression.db import Pg, jsonb, pg_connection
from suppression.formats import ImportOptions, ImportRecord, InvalidRecord, parse_import
from suppression.service import StagedEntries, merge_entries

IMPORT_BATCH = 5000
MAX_REPORTED_INVALID = 100


@dataclass
class ImportReport:
    """The outcome of one import."""

    import_id: uuid.UUID
    added: int = 0
    already_present: int = 0
    invalid_count: int = 0
    invalid: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the API response)."""
        return {
            "import_id": str(self.import_id),
            "added": self.added,
            "already_present": self.already_present,
            "invalid_count": self.invalid_count,
            "invalid": self.invalid,
        }


async def run_import(
    sessions: async_sessionmaker[AsyncSession],
    protector: AddressProtector,
    chunks: AsyncIterable[bytes],
    options: ImportOptions,
    *,
    actor: str,
    batch_size: int = IMPORT_BATCH,
    on_batch: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """Import every record of `chunks`; raises `UnrecognizedFormat` before writing anything
    when the content is not one of the supported layouts.

    Each batch is merged by one statement on an asyncpg connection in autocommit (its own
    short transaction). The merge of a batch runs in PostgreSQL while the next batch is
    parsed, hashed and encrypted here, so the two costs overlap instead of adding up.
    """
    report = ImportReport(uuid.uuid4())
    source_id = str(report.import_id)
    engine = sessions.kw["bind"]
    pending: asyncio.Task[tuple[int, int]] | None = None

    async def merge(conn: Pg, staged: StagedEntries) -> tuple[int, int]:
        added = await merge_entries(
            conn, staged, source_type="import", source_id=source_id, actor=actor
        )
        return len(staged), len(added)

    async def settle() -> None:
        nonlocal pending
        if pending is None:
            return
        task, pending = pending, None
        total, added = await task
        report.added += added
        report.already_present += total - added
        if on_batch is not None:
            on_batch(report)

    async with pg_connection(engine) as conn:
        try:
            batch = StagedEntries()
            async for record in parse_import(chunks, options):
                if isinstance(record, InvalidRecord):
                    report.invalid_count += 1
                    if len(report.invalid) < MAX_REPORTED_INVALID:
                        report.invalid.append({"line": record.line, "error": record.error})
                    continue
                _stage(batch, protector, record)
                if len(batch) >= batch_size:
                    await settle()
                    pending = asyncio.create_task(merge(conn, batch))
                    # Let the task send its statement now; it is read back at `settle`.
                    await asyncio.sleep(0)
                    batch = StagedEntries()
            await settle()
            if len(batch):
                pending = asyncio.create_task(merge(conn, batch))
                await settle()
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
    return report


def _stage(batch: StagedEntries, protector: AddressProtector, record: ImportRecord) -> None:
    address = record.address
    batch.line.append(record.line)
    batch.channel.append(address.channel)
    batch.address_hash.append(protector.hash(address.channel, address.key))
    batch.address_encrypted.append(protector.encrypt(address.key))
    batch.scope.append(record.scope)
    batch.reason.append(record.reason)
    batch.evidence.append(jsonb(record.evidence))
    batch.expires_at.append(record.expires_at)
    batch.expires_text.append(record.expires_at.isoformat() if record.expires_at else None)
