"""Message search (`GET /v1/messages`): filters, keyset cursor and the page it answers.

The statements live in the delivery log (`sender.log.search`); this module turns a request
into a `MessageFilter` and rows into `MessageSummary` items. A recipient is matched by its
keyed hash, computed from the address normalized exactly as the send path normalizes it,
so the search never decrypts or scans addresses.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from typing import cast

from sender import log as dlog
from sender import status as st
from sender.schemas import (
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    Category,
    Channel,
    DeliveryStatusName,
    DeliveryStatusView,
    MessagePage,
    MessageSummary,
    Priority,
)
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import Pg
from suppression.normalize import InvalidAddress, normalize

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
# "<created_at in microseconds since the epoch>_<message id as 32 hex digits>"; opaque.
CURSOR_PATTERN = "^[0-9]{1,17}_[0-9a-f]{32}$"
MAX_CURSOR = 50
_CURSOR_RE = re.compile(CURSOR_PATTERN[1:-1])
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# `metadata[key]=value` query parameters.
_METADATA_PARAM = re.compile(r"metadata\[(.*)\]", re.DOTALL)


class SearchProblem(ValueError):
    """A search request that cannot be answered: `type` is the problem type URN."""

    def __init__(self, type_: str, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.type = type_
        self.status = status


def encode_cursor(at: dt.datetime, message_id: uuid.UUID) -> str:
    """The cursor after the message (at, id)."""
    micros = (at - _EPOCH) // dt.timedelta(microseconds=1)
    return f"{micros}_{message_id.hex}"


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """The (created_at, id) a cursor names; raises `SearchProblem`."""
    if not _CURSOR_RE.fullmatch(cursor):
        raise SearchProblem(
            "urn:problem:invalid-cursor", "cursor must be a next_cursor value of this search"
        )
    micros, hex_id = cursor.split("_")
    try:
        at = _EPOCH + dt.timedelta(microseconds=int(micros))
    except OverflowError:
        raise SearchProblem(
            "urn:problem:invalid-cursor", "cursor must be a next_cursor value of this search"
        ) from None
    return at, uuid.UUID(hex_id)


def metadata_filter(params: Mapping[str, str]) -> dict[str, str] | None:
    """The `metadata[key]=value` pairs among query parameters; raises `SearchProblem`."""
    found: dict[str, str] = {}
    for name, value in params.items():
        match = _METADATA_PARAM.fullmatch(name)
        if match is None:
            if name.startswith("metadata"):
                raise SearchProblem(
                    "urn:problem:invalid-query", "filter metadata as metadata[key]=value"
                )
            continue
        key = match.group(1)
        if not 1 <= len(key) <= MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise SearchProblem(
                "urn:problem:invalid-query",
                f"metadata keys have 1-{MAX_METADATA_KEY} characters and values at most "
                f"{MAX_METADATA_VALUE}",
            )
        found[key] = value
    if len(found) > MAX_METADATA_KEYS:
        raise SearchProblem(
            "urn:problem:invalid-query", f"at most {MAX_METADATA_KEYS} metadata filters"
        )
    return found or None


def recipient_filter(
    protector: AddressProtector, to: str, channel: str | None, default_region: str
) -> tuple[str, str]:
    """(channel, keyed hash) of the address `to`, normalized as the send path does.

    Without `channel`, an address with `@` is an email address, anything else a phone number.
    Raises `SearchProblem` (422 urn:problem:invalid-address) for an invalid address.
    """
    kind = channel or ("email" if "@" in to else "sms")
    try:
        address = normalize(kind, to, default_region)
    except InvalidAddress as exc:
        raise SearchProblem(
            "urn:problem:invalid-address", f"not a valid {kind} address: {exc.problem}", 422
        ) from None
    return kind, protector.hash(kind, address.key)


def _to(protector: AddressProtector, token: str | None) -> str | None:
    if token is None:
        return None
    try:
        return protector.decrypt(token)
    except InvalidToken:
        return None


async def search(
    conn: Pg, protector: AddressProtector, where: dlog.MessageFilter, *, limit: int
) -> MessagePage:
    """One page of messages matching `where`, newest first, with their deliveries."""
    rows = await dlog.search(conn, where, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    deliveries = await dlog.deliveries_of_messages(conn, [m.id for m in rows]) if rows else {}
    items = [
        MessageSummary(
            id=m.id,
            channel=cast(Channel, m.channel),
            category=cast(Category, m.category),
            topic=m.topic,
            priority=cast(Priority, m.priority),
            metadata=m.metadata or {},
            state=m.state,
            created_at=m.created_at,
            completed_at=m.completed_at,
            deliveries=[
                DeliveryStatusView(
                    id=d.id,
                    to=_to(protector, d.recipient_encrypted),
                    status=cast(DeliveryStatusName, d.status),
                    reason=d.reason,
                )
                for d in deliveries.get(m.id, [])
            ],
        )
        for m in rows
    ]
    last = rows[-1] if more else None
    return MessagePage(
        items=items, next_cursor=encode_cursor(last.created_at, last.id) if last else None
    )


STATUSES = st.ALL
