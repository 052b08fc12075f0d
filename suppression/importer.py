"""Streaming import into the suppression list: parse, normalize, add in batches.

Each batch is written in its own short transaction, so an import of any size holds one batch
in memory and no long lock. Invalid rows are counted and reported (the first
`MAX_REPORTED_INVALID` of them with line and error); they never stop the rest. An import can be
repeated safely: rows already on the list count as `already_present`, and an erased person's
address is stored as hash only (see `service.add_many`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from suppression.crypto import AddressProtector
from suppression.formats import ImportOptions, ImportRecord, InvalidRecord, parse_import
from suppression.service import NewEntry, add_many

IMPORT_BATCH = 500
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
    when the content is not one of the supported layouts."""
    report = ImportReport(uuid.uuid4())
    batch: list[ImportRecord] = []

    async def flush() -> None:
        async with sessions() as session:
            flags = await add_many(
                session,
                protector,
                [NewEntry(r.address, r.reason, r.scope, r.expires_at, r.evidence) for r in batch],
                source_type="import",
                source_id=str(report.import_id),
                actor=actor,
            )
            await session.commit()
        added = sum(flags)
        report.added += added
        report.already_present += len(flags) - added
        batch.clear()
        if on_batch is not None:
            on_batch(report)

    async for record in parse_import(chunks, options):
        if isinstance(record, InvalidRecord):
            report.invalid_count += 1
            if len(report.invalid) < MAX_REPORTED_INVALID:
                report.invalid.append({"line": record.line, "error": record.error})
            continue
        batch.append(record)
        if len(batch) >= batch_size:
            await flush()
    if batch:
        await flush()
    return report
