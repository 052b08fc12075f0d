"""The suppression list's service API: check, add and remove, each change written to history.

Scope rules: `all` covers the whole channel; any other scope is a topic. Transactional
messages ignore topic entries but never `all` entries. Expired entries no longer suppress.
Callers pass the session and commit; nothing here commits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from suppression.crypto import AddressProtector
from suppression.db import new_id, utcnow
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


def _active(now: dt.datetime) -> Any:
    return or_(Suppression.expires_at.is_(None), Suppression.expires_at > now)


def _scopes_for(category: str, topic: str | None) -> list[str]:
    if category == "transactional" or not topic:
        return [SCOPE_ALL]
    return [SCOPE_ALL, topic]


async def check(
    session: AsyncSession,
    channel: str,
    address_hash: str,
    *,
    category: str = "transactional",
    topic: str | None = None,
    now: dt.datetime | None = None,
) -> Hit | None:
    """The active suppression that stops a message of this category/topic, if any.

    Channel-wide entries (`all`) win over topic entries when both exist.
    """
    now = now or utcnow()
    rows = (
        await session.execute(
            select(Suppression)
            .where(
                Suppression.channel == channel,
                Suppression.address_hash == address_hash,
                Suppression.scope.in_(_scopes_for(category, topic)),
                _active(now),
            )
            .order_by((Suppression.scope == SCOPE_ALL).desc(), Suppression.created_at)
            .limit(1)
        )
    ).scalars().first()
    if rows is None:
        return None
    return Hit(rows.id, rows.reason, rows.scope, rows.created_at, rows.expires_at)


async def check_many(
    session: AsyncSession,
    channel: str,
    address_hashes: Iterable[str],
    *,
    category: str = "marketing",
    topic: str | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Hit]:
    """Batch form of `check`: hash -> hit, for the suppressed ones only, in one query."""
    now = now or utcnow()
    hashes = list(set(address_hashes))
    if not hashes:
        return {}
    rows = (
        await session.execute(
            select(Suppression)
            .where(
                Suppression.channel == channel,
                Suppression.address_hash.in_(hashes),
                Suppression.scope.in_(_scopes_for(category, topic)),
                _active(now),
            )
            .order_by((Suppression.scope == SCOPE_ALL).asc(), Suppression.created_at.desc())
        )
    ).scalars()
    result: dict[str, Hit] = {}
    # Ordered so that channel-wide entries come last and overwrite topic entries.
    for row in rows:
        result[row.address_hash] = Hit(row.id, row.reason, row.scope, row.created_at, row.expires_at)
    return result


async def add(
    session: AsyncSession,
    protector: AddressProtector,
    address: Address,
    *,
    reason: str,
    source: Source,
    scope: str = SCOPE_ALL,
    expires_at: dt.datetime | None = None,
) -> tuple[Suppression, bool]:
    """Suppress `address` for `scope`; returns (entry, created).

    An existing active entry for the same scope is kept as it is (first reason wins, the new
    evidence is still written to history). An expired entry is renewed in place.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    address_hash = protector.hash(address.channel, address.key)
    now = utcnow()
    values = {
        "channel": address.channel,
        "address_hash": address_hash,
        "address_encrypted": protector.encrypt(address.key),
        "scope": scope,
        "reason": reason,
        "source_type": source.type,
        "source_id": source.id,
        "evidence": source.evidence,
        "created_at": now,
        "expires_at": expires_at,
    }
    inserted = await session.execute(
        insert(Suppression)
        .values(id=new_id(), **values)
        .on_conflict_do_nothing(constraint="uq_suppressions_address_scope")
        .returning(Suppression.id)
    )
    created = inserted.scalar() is not None
    entry = (
        await session.execute(
            select(Suppression).where(
                Suppression.channel == address.channel,
                Suppression.address_hash == address_hash,
                Suppression.scope == scope,
            )
        )
    ).scalar_one()
    if not created and entry.expires_at is not None and entry.expires_at <= now:
        # An expired entry is renewed with the new reason and source.
        for key in ("reason", "source_type", "source_id", "evidence", "created_at", "expires_at"):
            setattr(entry, key, values[key])
        created = True
    session.add(
        SuppressionHistory(
            suppression_id=entry.id,
            channel=address.channel,
            address_hash=address_hash,
            scope=scope,
            action="add" if created else "add_existing",
            reason=reason,
            actor=source.actor,
            source_type=source.type,
            source_id=source.id,
            details={"evidence": source.evidence, "expires_at": expires_at.isoformat() if expires_at else None},
            at=now,
        )
    )
    await session.flush()
    return entry, created


async def remove(
    session: AsyncSession,
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
    """
    query = select(Suppression).where(
        Suppression.channel == channel, Suppression.address_hash == address_hash
    )
    if scope is not None:
        query = query.where(Suppression.scope == scope)
    if only_reasons is not None:
        query = query.where(Suppression.reason.in_(list(only_reasons)))
    entries = list((await session.execute(query.with_for_update())).scalars())
    now = utcnow()
    for entry in entries:
        session.add(
            SuppressionHistory(
                suppression_id=entry.id,
                channel=entry.channel,
                address_hash=entry.address_hash,
                scope=entry.scope,
                action="remove",
                reason=entry.reason,
                actor=source.actor,
                source_type=source.type,
                source_id=source.id,
                details={"removal_reason": reason, "evidence": source.evidence},
                at=now,
            )
        )
        await session.delete(entry)
    await session.flush()
    return entries
