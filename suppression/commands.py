"""The work behind `gateway suppressions import|export|check|add|remove` (I/O on files/streams).

The CLI in `gateway.cli` parses arguments and builds the context; these functions do the work
and report progress on stderr, keeping stdout for data (exports, check results, reports).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import AsyncIterator, Iterable
from typing import BinaryIO, TextIO

from sqlalchemy import func, select

from suppression import service
from suppression.api import MAX_CHECK_ADDRESSES, SuppressionContext
from suppression.exporter import export_chunks
from suppression.formats import ImportOptions
from suppression.importer import ImportReport, run_import
from suppression.listing import Filters
from suppression.models import Suppression
from suppression.normalize import InvalidAddress, normalize
from suppression.progress import ProgressBar
from suppression.views import entry_view, jsonable

_CHUNK = 64 * 1024


class CommandError(Exception):
    """A problem to report on stderr with a non-zero exit status."""


async def import_file(
    context: SuppressionContext,
    source: BinaryIO,
    options: ImportOptions,
    *,
    actor: str,
    err: TextIO,
) -> ImportReport:
    """Import a file (or stdin) in a streaming way, with a progress bar over the bytes read."""
    try:
        total: int | None = os.fstat(source.fileno()).st_size or None
    except (OSError, ValueError, AttributeError):
        total = None
    bar = ProgressBar("import", total, stream=err, unit="bytes")

    async def chunks() -> AsyncIterator[bytes]:
        done = 0
        while chunk := source.read(_CHUNK):
            done += len(chunk)
            bar.update(done)
            yield chunk

    report = await run_import(context.sessions, context.protector, chunks(), options, actor=actor)
    bar.finish()
    return report


async def export_file(
    context: SuppressionContext,
    out: BinaryIO,
    *,
    fmt: str,
    since: dt.datetime | None,
    err: TextIO,
) -> int:
    """Write the export to `out`; returns the number of entries written."""
    filters = Filters(since=since)
    async with context.sessions() as session:
        query = select(func.count()).select_from(Suppression)
        if since is not None:
            query = query.where(Suppression.created_at >= since)
        total = (await session.execute(query)).scalar_one()
    bar = ProgressBar("export", total, stream=err, unit="entries")
    written = 0

    def advance(count: int) -> None:
        nonlocal written
        written += count
        bar.update(written)

    async for chunk in export_chunks(
        context.sessions, context.protector, fmt=fmt, filters=filters, on_batch=advance
    ):
        out.write(chunk)
    out.flush()
    bar.finish()
    return written


async def check_addresses(
    context: SuppressionContext,
    channel: str,
    addresses: Iterable[str],
    *,
    category: str,
    topic: str | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Print `address<TAB>reason<TAB>scope` for each suppressed address; returns their count."""
    topic = topic or ("marketing" if category == "marketing" else None)
    suppressed = 0
    batch: list[tuple[str, str]] = []

    async def flush() -> None:
        nonlocal suppressed
        async with context.sessions() as session:
            hits = await service.check_many(
                session, channel, [h for _, h in batch], category=category, topic=topic
            )
        for raw, address_hash in batch:
            hit = hits.get(address_hash)
            if hit is not None:
                suppressed += 1
                out.write(f"{raw}\t{hit.reason}\t{hit.scope}\n")
        batch.clear()

    for raw in addresses:
        raw = raw.strip()
        if not raw:
            continue
        try:
            address = normalize(channel, raw, context.default_region)
        except InvalidAddress as exc:
            err.write(f"invalid\t{raw}\t{exc.problem}\n")
            continue
        batch.append((raw, context.protector.hash(channel, address.key)))
        if len(batch) >= MAX_CHECK_ADDRESSES:
            await flush()
    if batch:
        await flush()
    out.flush()
    return suppressed


async def add_address(
    context: SuppressionContext,
    channel: str,
    raw: str,
    *,
    reason: str,
    scope: str,
    expires_at: dt.datetime | None,
    actor: str,
) -> dict[str, object]:
    """Add one entry like `POST /v1/suppressions`; returns the entry as JSON-ready dict."""
    try:
        address = normalize(channel, raw, context.default_region)
        service.validate_entry(channel, reason, scope)
    except InvalidAddress as exc:
        raise CommandError(f"not a valid {channel} address: {exc.problem}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if expires_at is not None and expires_at.tzinfo is None:
        raise CommandError("--expires-at needs a time zone")
    async with context.sessions() as session:
        row, created = await service.add(
            session,
            context.protector,
            address,
            reason=reason,
            scope=scope,
            expires_at=expires_at,
            source=service.Source("operator", actor, actor=actor),
        )
        await session.commit()
        return {"created": created, "entry": jsonable(entry_view(context.protector, row))}


async def remove_address(
    context: SuppressionContext,
    channel: str,
    raw: str,
    *,
    reason: str,
    scope: str | None,
    force: bool,
    actor: str,
) -> list[dict[str, object]]:
    """Remove entries like `DELETE /v1/suppressions/...`, with the same protection rule."""
    try:
        address = normalize(channel, raw, context.default_region)
    except InvalidAddress as exc:
        raise CommandError(f"not a valid {channel} address: {exc.problem}") from None
    address_hash = context.protector.hash(channel, address.key)
    async with context.sessions() as session:
        try:
            removed = await service.remove_by_operator(
                session,
                channel,
                address_hash,
                reason=reason,
                actor=actor,
                scope=scope,
                force=force,
                address=address,
            )
        except service.ProtectedSuppression as exc:
            raise CommandError(
                f"refusing to remove {', '.join(exc.reasons)} entries without --force "
                "(that would contact someone who complained or said STOP)"
            ) from None
        except (ValueError, service.NothingToRemove) as exc:
            raise CommandError(str(exc)) from None
        await session.commit()
        return [jsonable(entry_view(context.protector, r)) for r in removed]


def dump(value: object, out: TextIO) -> None:
    """Write a JSON document on its own line."""
    out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
    out.flush()
