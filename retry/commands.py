"""The work behind `gateway dlq list|show|redrive|discard`.

`gateway.cli` parses the arguments and opens the services; these functions do the work,
writing data to `out` (stdout) and progress and messages to `err` (stderr).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry import dlq
from retry.api import entry_detail, entry_view
from retry.queue import DeliveryQueue
from suppression.progress import ProgressBar


class CommandError(Exception):
    """A problem to report on stderr with exit status 1."""


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(value), default=str))


async def list_entries(
    sessions: async_sessionmaker[AsyncSession],
    queue: DeliveryQueue,
    f: dlq.DeadLetterFilter,
    *,
    limit: int,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """Print up to `limit` entries, newest first (tab-separated, or JSON Lines)."""
    printed = 0
    cursor: str | None = None
    async with sessions() as session:
        while printed < limit:
            page, cursor = await dlq.list_entries(
                session, queue, f, limit=min(500, limit - printed), cursor=cursor
            )
            for entry in page:
                view = entry_view(entry)
                if as_json:
                    out.write(json.dumps(_jsonable(view)) + "\n")
                else:
                    out.write(
                        "\t".join(
                            [
                                str(view.id),
                                view.created_at.isoformat(),
                                view.channel,
                                view.reason,
                                view.state,
                                view.delivery_status or "-",
                                str(view.delivery_id),
                                (view.last_error or "").replace("\t", " ").replace("\n", " "),
                            ]
                        )
                        + "\n"
                    )
                printed += 1
            if cursor is None:
                break
    if cursor is not None:
        err.write("(more entries; raise --limit to see them)\n")
    return printed


async def show_entry(
    sessions: async_sessionmaker[AsyncSession],
    queue: DeliveryQueue,
    entry_id: uuid.UUID,
    *,
    out: TextIO,
) -> None:
    """Print one entry with its attempt history as a JSON document."""
    async with sessions() as session:
        try:
            entry = await dlq.get_entry(session, queue, entry_id)
        except dlq.DeadLetterNotFound:
            raise CommandError(f"no dead-letter entry {entry_id}") from None
    out.write(json.dumps(_jsonable(entry_detail(entry)), indent=2) + "\n")


async def redrive_one(
    sessions: async_sessionmaker[AsyncSession],
    queue: DeliveryQueue,
    entry_id: uuid.UUID,
    *,
    actor: str,
    note: str | None,
    err: TextIO,
) -> None:
    """Redrive one entry (fresh attempt budget; suppression is checked again on dispatch)."""
    async with sessions() as session:
        try:
            entry = await dlq.redrive(session, queue, entry_id, actor=actor, note=note)
        except dlq.DeadLetterNotFound:
            raise CommandError(f"no dead-letter entry {entry_id}") from None
        except dlq.DeadLetterConflict as exc:
            raise CommandError(str(exc)) from None
        await session.commit()
    err.write(f"redriven {entry_id} (delivery {entry.row.delivery_id})\n")


async def redrive_many(
    sessions: async_sessionmaker[AsyncSession],
    queue: DeliveryQueue,
    f: dlq.DeadLetterFilter,
    *,
    actor: str,
    note: str | None,
    err: TextIO,
    batch: int = 500,
) -> int:
    """Redrive every open entry matching `f`, in committed batches, with a progress bar."""
    async with sessions() as session:
        total = await dlq.count_redrivable(session, queue, f)
        bar = ProgressBar("redrive", total, stream=err)
        done = 0
        expired: set[uuid.UUID] = set()
        while True:
            n = await dlq.redrive_batch(
                session, queue, f, actor=actor, note=note, batch=batch, expired=expired
            )
            await session.commit()
            if n == 0:
                break
            done += n
            # Entries dead-lettered meanwhile may push the count past the first estimate.
            bar.update(done, max(total, done))
        bar.finish()
    err.write(f"redriven {done} entries\n")
    if expired:
        err.write(
            f"left {len(expired)} entries open: their message's deadline has passed, so a "
            "redrive would expire again at once (discard them)\n"
        )
    return done


async def discard_entry(
    sessions: async_sessionmaker[AsyncSession],
    queue: DeliveryQueue,
    entry_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    err: TextIO,
) -> None:
    """Discard one entry with a reason (kept as history; the delivery stays dead)."""
    async with sessions() as session:
        try:
            await dlq.discard(session, queue, entry_id, actor=actor, reason=reason)
        except dlq.DeadLetterNotFound:
            raise CommandError(f"no dead-letter entry {entry_id}") from None
        except dlq.DeadLetterConflict as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        await session.commit()
    err.write(f"discarded {entry_id}\n")


__all__ = [
    "CommandError",
    "discard_entry",
    "list_entries",
    "redrive_many",
    "redrive_one",
    "show_entry",
]
