"""The suppression list's service API: check, add and remove, each change written to history.

Scope rules: `all` covers the whole channel; any other scope is a topic. Transactional
messages ignore topic entries but never `all` entries. Expired entries no longer suppress.
Callers pass the session and commit; nothing here commits.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import phonenumbers
from sqlalchemy import or_, select, tuple_
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
# Reasons that are about the address itself, so they always cover the whole channel.
CHANNEL_WIDE_REASONS = ("hard_bounce", "complaint", "sms_stop", "invalid_address")
# History action written when a person's data is erased; later adds for that hash store no
# ciphertext (see `add`), so an import cannot bring the erased address back.
ERASE_ACTION = "erase"
# Evidence keys that are personal data of the recipient; erasure removes them.
PERSONAL_EVIDENCE_KEYS = ("user_agent", "client_ip")

_SCOPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


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
    if not _SCOPE_RE.match(scope):
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
        (
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
        )
        .scalars()
        .first()
    )
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
        result[row.address_hash] = Hit(
            row.id, row.reason, row.scope, row.created_at, row.expires_at
        )
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
    record_existing: bool = True,
) -> tuple[Suppression, bool]:
    """Suppress `address` for `scope`; returns (entry, created).

    An existing active entry for the same scope is kept as it is (first reason wins, the new
    evidence is still written to history unless `record_existing` is false), except that a
    protected reason (complaint, sms_stop) replaces an unprotected one (`upgrade` in history),
    so that a complaint can never hide behind, say, a bounce that an operator may lift without
    `force`. An expired entry is renewed in place. For an address whose data was erased, the
    entry is stored without ciphertext (hash only).
    """
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    address_hash = protector.hash(address.channel, address.key)
    now = utcnow()
    erased = bool(await erased_hashes(session, [(address.channel, address_hash)]))
    values = {
        "channel": address.channel,
        "address_hash": address_hash,
        "address_encrypted": None if erased else protector.encrypt(address.key),
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
    action = "add" if created else "add_existing"
    details: dict[str, Any] = {
        "evidence": source.evidence,
        "expires_at": expires_at.isoformat() if expires_at else None,
    }
    if not created and entry.expires_at is not None and entry.expires_at <= now:
        # An expired entry is renewed with the new reason and source.
        for key in ("reason", "source_type", "source_id", "evidence", "created_at", "expires_at"):
            setattr(entry, key, values[key])
        created, action = True, "add"
    elif not created and _upgrades(entry.reason, reason):
        details["previous_reason"] = entry.reason
        for key in ("reason", "source_type", "source_id", "evidence", "expires_at"):
            setattr(entry, key, values[key])
        action = "upgrade"
    if action == "add_existing" and not record_existing:
        return entry, False
    session.add(
        SuppressionHistory(
            suppression_id=entry.id,
            channel=address.channel,
            address_hash=address_hash,
            scope=scope,
            action=action,
            reason=reason,
            actor=source.actor,
            source_type=source.type,
            source_id=source.id,
            details=details,
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


async def erased_hashes(
    session: AsyncSession, keys: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The (channel, address hash) pairs among `keys` whose data was erased."""
    wanted = list(set(keys))
    if not wanted:
        return set()
    rows = await session.execute(
        select(SuppressionHistory.channel, SuppressionHistory.address_hash)
        .where(
            SuppressionHistory.action == ERASE_ACTION,
            tuple_(SuppressionHistory.channel, SuppressionHistory.address_hash).in_(wanted),
        )
        .distinct()
    )
    return {(c, h) for c, h in rows.all()}


@dataclass(frozen=True)
class NewEntry:
    """One entry for `add_many`."""

    address: Address
    reason: str
    scope: str = SCOPE_ALL
    expires_at: dt.datetime | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


async def add_many(
    session: AsyncSession,
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
    now = utcnow()
    keyed = [
        (e.address.channel, protector.hash(e.address.channel, e.address.key), e.scope)
        for e in entries
    ]
    for entry in entries:
        if entry.reason not in REASONS:
            raise ValueError(f"unknown reason {entry.reason!r}")
    erased = await erased_hashes(session, [(c, h) for c, h, _ in keyed])
    first: dict[tuple[str, str, str], int] = {}
    for index, key in enumerate(keyed):
        chosen = first.get(key)
        if chosen is None or _upgrades(entries[chosen].reason, entries[index].reason):
            first[key] = index
    if not first:
        return []
    rows = []
    for key, index in first.items():
        entry = entries[index]
        rows.append(
            {
                "id": new_id(),
                "channel": key[0],
                "address_hash": key[1],
                "address_encrypted": None
                if (key[0], key[1]) in erased
                else protector.encrypt(entry.address.key),
                "scope": key[2],
                "reason": entry.reason,
                "source_type": source_type,
                "source_id": source_id,
                "evidence": entry.evidence,
                "created_at": now,
                "expires_at": entry.expires_at,
            }
        )
    inserted = await session.execute(
        insert(Suppression)
        .values(rows)
        .on_conflict_do_nothing(constraint="uq_suppressions_address_scope")
        .returning(Suppression.id, Suppression.channel, Suppression.address_hash, Suppression.scope)
    )
    added: dict[tuple[str, str, str], Any] = {(c, h, s): i for i, c, h, s in inserted.all()}
    conflicting = [key for key in first if key not in added]
    # key -> (suppression id, action, reason it replaced)
    changed: dict[tuple[str, str, str], tuple[Any, str, str | None]] = {
        key: (suppression_id, "add", None) for key, suppression_id in added.items()
    }
    if conflicting:
        existing = (
            await session.execute(
                select(Suppression)
                .where(
                    tuple_(Suppression.channel, Suppression.address_hash, Suppression.scope).in_(
                        conflicting
                    ),
                )
                .with_for_update()
            )
        ).scalars()
        for row in existing:
            key = (row.channel, row.address_hash, row.scope)
            entry = entries[first[key]]
            expired = row.expires_at is not None and row.expires_at <= now
            if not expired and not _upgrades(row.reason, entry.reason):
                continue
            previous = None if expired else row.reason
            row.reason = entry.reason
            row.source_type = source_type
            row.source_id = source_id
            row.evidence = entry.evidence
            row.expires_at = entry.expires_at
            if expired:
                row.created_at = now
                added[key] = row.id
            changed[key] = (row.id, "add" if expired else "upgrade", previous)
    history = []
    for key, (suppression_id, action, previous) in changed.items():
        entry = entries[first[key]]
        details: dict[str, Any] = {
            "evidence": entry.evidence,
            "expires_at": entry.expires_at.isoformat() if entry.expires_at else None,
        }
        if previous is not None:
            details["previous_reason"] = previous
        history.append(
            {
                "suppression_id": suppression_id,
                "channel": key[0],
                "address_hash": key[1],
                "scope": key[2],
                "action": action,
                "reason": entry.reason,
                "actor": actor,
                "source_type": source_type,
                "source_id": source_id,
                "details": details,
                "at": now,
            }
        )
    if history:
        await session.execute(insert(SuppressionHistory).values(history))
    await session.flush()
    return [first[key] == index and key in added for index, key in enumerate(keyed)]


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
    session: AsyncSession,
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
    query = select(Suppression.reason).where(
        Suppression.channel == channel, Suppression.address_hash == address_hash
    )
    if scope is not None:
        query = query.where(Suppression.scope == scope)
    reasons = set((await session.execute(query)).scalars())
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
