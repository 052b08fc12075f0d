"""How entries and history rows are shown to operators (API, exports, subject access)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any, Literal, cast

from suppression.crypto import AddressProtector, InvalidToken
from suppression.models import Suppression, SuppressionHistory

# The values these fields can take, as types, so that the OpenAPI document lists them
# (tests/test_enums.py checks them against suppression.service's constants and the README).
ChannelName = Literal["email", "sms"]
ReasonName = Literal[
    "hard_bounce",
    "complaint",
    "unsubscribe",
    "sms_stop",
    "invalid_address",
    "soft_bounce",
    "manual",
]
SourceTypeName = Literal["provider_event", "unsubscribe", "operator", "import", "send_error"]
HistoryActionName = Literal["add", "add_existing", "upgrade", "remove", "erase"]


@dataclass
class EntryView:
    """A suppression entry; `address` is null after erasure (the hash stays and suppresses)."""

    id: uuid.UUID
    channel: ChannelName
    address: str | None
    scope: str
    reason: ReasonName
    active: bool
    source_type: SourceTypeName
    source_id: str | None
    evidence: dict[str, Any]
    created_at: dt.datetime
    expires_at: dt.datetime | None


@dataclass
class HistoryView:
    """One history row (add, add_existing, upgrade, remove, erase)."""

    id: int
    suppression_id: uuid.UUID | None
    scope: str
    action: HistoryActionName
    reason: str
    actor: str
    source_type: SourceTypeName | None
    source_id: str | None
    details: dict[str, Any]
    at: dt.datetime


def display_address(protector: AddressProtector, ciphertext: str | None) -> str | None:
    """The decrypted address, or None after erasure (or when no configured key fits)."""
    if ciphertext is None:
        return None
    try:
        return protector.decrypt(ciphertext)
    except InvalidToken:
        return None


def entry_view(
    protector: AddressProtector, row: Suppression, now: dt.datetime | None = None
) -> EntryView:
    """The operator's view of an entry (decrypts the address)."""
    now = now or dt.datetime.now(dt.UTC)
    return EntryView(
        id=row.id,
        channel=cast(ChannelName, row.channel),
        address=display_address(protector, row.address_encrypted),
        scope=row.scope,
        reason=cast(ReasonName, row.reason),
        active=row.expires_at is None or row.expires_at > now,
        source_type=cast(SourceTypeName, row.source_type),
        source_id=row.source_id,
        evidence=row.evidence or {},
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


def history_view(row: SuppressionHistory) -> HistoryView:
    """The operator's view of a history row."""
    return HistoryView(
        id=row.id,
        suppression_id=row.suppression_id,
        scope=row.scope,
        action=cast(HistoryActionName, row.action),
        reason=row.reason,
        actor=row.actor,
        source_type=cast(SourceTypeName | None, row.source_type),
        source_id=row.source_id,
        details=row.details or {},
        at=row.at,
    )


def jsonable(value: Any) -> Any:
    """Views (and containers of them) as plain JSON values: times ISO 8601, ids as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value
