"""Opaque one-click unsubscribe tokens (RFC 8058).

The token in `List-Unsubscribe: <https://.../unsubscribe/{token}>` is a Fernet token over a
small JSON document (channel, address, topic, delivery id, issue time). Fernet output is
URL-safe base64, so the token goes into the URL path as it is and reveals nothing about the
recipient. Because the protector uses MultiFernet, tokens made with an older key keep working
for as long as that key stays configured (after `gateway keys rotate-encryption`, keep the old
key until mail that carries old links is no longer expected to be acted upon).

Tokens do not expire: RFC 8058 sets no deadline and a recipient may act on an old message.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass

from suppression.crypto import AddressProtector, InvalidToken
from suppression.normalize import CHANNELS

__all__ = [
    "InvalidUnsubscribeToken",
    "UnsubscribeToken",
    "issue_token",
    "read_token",
    "unsubscribe_url",
]

_VERSION = 1


class InvalidUnsubscribeToken(ValueError):
    """The token cannot be decrypted with any configured key, or its content is malformed."""


@dataclass(frozen=True)
class UnsubscribeToken:
    """What an unsubscribe token carries."""

    channel: str
    address: str
    topic: str
    delivery_id: uuid.UUID | None
    issued_at: dt.datetime


def issue_token(
    protector: AddressProtector,
    *,
    channel: str,
    address: str,
    topic: str,
    delivery_id: uuid.UUID | None,
    now: dt.datetime | None = None,
) -> str:
    """Encrypt an unsubscribe request into an opaque, URL-safe token."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")
    if not address or not topic:
        raise ValueError("address and topic are required")
    issued = int((now or dt.datetime.now(dt.UTC)).timestamp())
    payload = {
        "v": _VERSION,
        "c": channel,
        "a": address,
        "t": topic,
        "d": delivery_id.hex if delivery_id else None,
        "i": issued,
    }
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return protector.encrypt_bytes(data, at=issued)


def read_token(protector: AddressProtector, token: str) -> UnsubscribeToken:
    """Decrypt and validate a token; raises `InvalidUnsubscribeToken` on any problem."""
    try:
        payload = json.loads(protector.decrypt_bytes(token))
    except (InvalidToken, ValueError):
        raise InvalidUnsubscribeToken("the unsubscribe token is not valid") from None
    try:
        if not isinstance(payload, dict) or payload.get("v") != _VERSION:
            raise ValueError("unknown token version")
        channel, address, topic = payload["c"], payload["a"], payload["t"]
        if channel not in CHANNELS:
            raise ValueError("unknown channel")
        if not isinstance(address, str) or not address or not isinstance(topic, str) or not topic:
            raise ValueError("missing address or topic")
        raw_delivery = payload.get("d")
        delivery_id = uuid.UUID(hex=raw_delivery) if raw_delivery else None
        issued = payload["i"]
        if not isinstance(issued, int):
            raise ValueError("bad issue time")
        issued_at = dt.datetime.fromtimestamp(issued, dt.UTC)
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        raise InvalidUnsubscribeToken("the unsubscribe token is malformed") from None
    return UnsubscribeToken(channel, address, topic, delivery_id, issued_at)


def unsubscribe_url(public_url: str, token: str) -> str:
    """The one-click URL for `token` under the gateway's public base URL."""
    return f"{public_url.rstrip('/')}/unsubscribe/{token}"
